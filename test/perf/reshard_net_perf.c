/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard_net_perf: isend/irecv streaming through the plugin's exported ncclNetPlugin_v12
 * table, as NCCL's proxy drives it (a window of messages in flight, test() polled), in
 * nccl-tests style columns, to compare the plugin's path with ucx_perftest -t tag_bw.
 *
 *   reshard_net_perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]
 *                    [-W WINDOW] [-d DEV] [--role recv|send|env --handle FILE] [-v] [-h]
 *
 * Without --role it forks: the parent receives, the child sends, the handle goes over a pipe.
 * With --role the two sides are separate processes (two emulated nodes, two hosts) and the
 * handle goes through FILE; "env" takes the role from $RANK (0 receives). The receiver prints
 * the table: time per message and bandwidth between its first and last completion.
 *
 * A failed plugin call is one line: the plugin's own WARN for it (held while the call runs)
 * after the call's name. The forked sender starts the plugin only once the receiver has
 * handed it a handle, so a plugin that cannot start is reported once, by the receiver.
 */
#include "plugin/net/nccl/net_v12.h"
#include "plugin/reshard.h"

#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern const ncclNet_v12_t ncclNetPlugin_v12;
static const ncclNet_v12_t *net = &ncclNetPlugin_v12;

#define MAX_WINDOW  64
#define PEER_WAIT_S 60                  /* how long a side waits for the other to appear */
#define SLOT_BUDGET ((size_t)512 << 20) /* bytes of buffers per side at most */

struct opts {
    size_t min_bytes, max_bytes;
    int factor, iters, warmup, window, dev, verbose;
    const char *role, *handle_file;
};

/* The first WARN the plugin logs during a call, held until the call returns: the reason of a
 * failure, printed with the call's name, or printed alone when the call succeeds anyway. */
static pthread_mutex_t held_lock = PTHREAD_MUTEX_INITIALIZER;
static char held[1024];
static int holding, verbose;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "reshard_net_perf: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* Fork mode: the sending child, watched while the receiver waits, so that a sender that died
 * (having said why) ends the receiver instead of leaving it waiting. */
static pid_t sender = -1;

/* finished: the stream is over, waiting for the sender to exit is what is left. */
static void sender_reap(int finished)
{
    int st;
    if (sender <= 0 || waitpid(sender, &st, finished ? 0 : WNOHANG) != sender)
        return;
    sender = -1;
    if (WIFSIGNALED(st))
        die("the sending process was killed by signal %d", WTERMSIG(st));
    if (WEXITSTATUS(st) == 0 && !finished)
        die("the sending process exited before the stream ended");
    if (WEXITSTATUS(st) != 0)
        exit(1); /* it printed its reason */
}

static void sender_check(void)
{
    sender_reap(0);
}

static const char *result_name(ncclResult_t r)
{
    static const char *const names[] = {
        "ncclSuccess",         "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
        "ncclInvalidArgument", "ncclInvalidUsage",       "ncclRemoteError", "ncclInProgress"};
    return (unsigned)r < sizeof(names) / sizeof(names[0]) ? names[r] : "an unknown result";
}

static void hold_begin(void)
{
    pthread_mutex_lock(&held_lock);
    holding = 1;
    held[0] = '\0';
    pthread_mutex_unlock(&held_lock);
}

/* Ends holding; on failure dies with one line naming the call and the plugin's reason. On
 * success the held line goes into keep when given, else to stderr. */
static void hold_end_keep(const char *name, ncclResult_t r, char *keep, size_t n)
{
    char msg[sizeof(held)];
    pthread_mutex_lock(&held_lock);
    holding = 0;
    snprintf(msg, sizeof(msg), "%s", held);
    pthread_mutex_unlock(&held_lock);
    if (r != ncclSuccess && !strncmp(msg, name, strlen(name)))
        die("%s", msg); /* the plugin's line names the call already */
    if (r != ncclSuccess)
        die("%s: %s", name, msg[0] ? msg : result_name(r));
    if (keep)
        snprintf(keep, n, "%s", msg);
    else if (msg[0])
        fprintf(stderr, "reshard_net_perf: %s\n", msg);
}

static void hold_end(const char *name, ncclResult_t r)
{
    hold_end_keep(name, r, NULL, 0);
}

#define NET(name, call)                                                                            \
    do {                                                                                           \
        hold_begin();                                                                              \
        hold_end(name, (call));                                                                    \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void logger(ncclDebugLogLevel level, unsigned long flags, const char *file, int line,
                   const char *fmt, ...)
{
    (void)flags, (void)file, (void)line;
    if (level > NCCL_LOG_WARN && !verbose)
        return;
    char msg[sizeof(held)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&held_lock);
    int keep = level <= NCCL_LOG_WARN && holding && !held[0];
    if (keep)
        snprintf(held, sizeof(held), "%s", msg);
    pthread_mutex_unlock(&held_lock);
    if (!keep)
        fprintf(stderr, "reshard_net_perf: %s\n", msg);
}

/* "4M": bytes (K, M, G are powers of 1024); 0 when malformed. */
static size_t parse_size(const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10;
    else if (*end == 'M' || *end == 'm')
        shift = 20;
    else if (*end == 'G' || *end == 'g')
        shift = 30;
    if (end == s || *s == '-' || errno || end[shift ? 1 : 0] || v > ((size_t)1 << 40) >> shift)
        return 0;
    return (size_t)v << shift;
}

/* A decimal integer in [lo, hi], or lo - 1 when malformed. */
static int parse_int(const char *s, int lo, int hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return end == s || *end || errno || v < lo || v > hi ? lo - 1 : (int)v;
}

static void wait_req(void *req, int *size)
{
    int done = 0;
    for (unsigned spins = 1; !done; spins++) {
        NET("test", net->test(req, &done, size));
        if (!(spins & 0xffff))
            sender_check();
    }
}

/* The byte the sender puts at offset i of a message of n bytes from slot k. */
static unsigned char pattern(size_t n, int k, size_t i)
{
    return (unsigned char)(n * 7 + (size_t)k * 31 + i * 13 + (i >> 9));
}

/* The number of timed messages, nccl-tests style: enough for ~1 GiB or at least 20. */
static int iters_for(const struct opts *o, size_t bytes)
{
    if (o->iters)
        return o->iters;
    size_t n = ((size_t)1 << 30) / bytes;
    return n < 20 ? 20 : n > 2000 ? 2000 : (int)n;
}

static int slots_for(const struct opts *o, size_t bytes)
{
    int w = o->window;
    while (w > 1 && (size_t)w * bytes > SLOT_BUDGET)
        w--;
    return w;
}

/* Room for the window's messages at the largest size (within SLOT_BUDGET), registered. */
static unsigned char *slots_alloc(const struct opts *o, void *comm, void **mh)
{
    size_t cap = (size_t)o->window * o->max_bytes;
    if (cap > SLOT_BUDGET)
        cap = SLOT_BUDGET > o->max_bytes ? SLOT_BUDGET : o->max_bytes;
    unsigned char *buf = malloc(cap ? cap : 1);
    if (!buf)
        die("no memory for %zu bytes", cap);
    NET("regMr", net->regMr(comm, buf, cap, NCCL_PTR_HOST, mh));
    return buf;
}

static void send_side(const struct opts *o, void *sc)
{
    void *mh, *req[MAX_WINDOW];
    unsigned char *buf = slots_alloc(o, sc, &mh);
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= (size_t)o->factor) {
        int w = slots_for(o, bytes);
        for (int k = 0; k < w; k++)
            for (size_t i = 0; i < bytes; i++)
                buf[(size_t)k * bytes + i] = pattern(bytes, k, i);
        int total = o->warmup + iters_for(o, bytes);
        for (int m = 0; m < total; m++) {
            int k = m % w;
            if (m >= w)
                wait_req(req[k], NULL);
            req[k] = NULL;
            while (!req[k]) /* NULL means "retry" to NCCL; keep trying */
                NET("isend", net->isend(sc, buf + (size_t)k * bytes, bytes, k, mh, NULL, &req[k]));
        }
        for (int m = total > w ? total - w : 0; m < total; m++)
            wait_req(req[m % w], NULL);
        if (o->factor < 2 || bytes > o->max_bytes / (size_t)o->factor)
            break;
    }
    NET("deregMr", net->deregMr(sc, mh));
    free(buf);
}

static void recv_side(const struct opts *o, void *rc, const char *dev_name, int speed)
{
    void *mh, *req[MAX_WINDOW];
    unsigned char *buf = slots_alloc(o, rc, &mh);
    printf("# reshard_net_perf: ncclNetPlugin_v12 \"%s\", device %d %s (%d Mbps), window %d, "
           "%d warmup messages per size\n",
           net->name, o->dev, dev_name, speed, o->window, o->warmup);
    printf("#\n#%12s %12s %8s %10s %10s %10s %8s\n", "size", "count", "type", "time", "algbw",
           "busbw", "#wrong");
    printf("#%12s %12s %8s %10s %10s %10s %8s\n", "(B)", "(messages)", "", "(us)", "(GB/s)",
           "(GB/s)", "");
    double sum_bw = 0;
    int rows = 0;
    long wrong_all = 0;
    for (size_t bytes = o->min_bytes; bytes <= o->max_bytes; bytes *= (size_t)o->factor) {
        int w = slots_for(o, bytes), iters = iters_for(o, bytes);
        int total = o->warmup + iters;
        double t_first = 0, t_last = 0;
        long wrong = 0;
        for (int m = 0, posted = 0; m < total; m++) {
            for (; posted < total && posted < m + w; posted++) {
                int k = posted % w, tag = k;
                void *data = buf + (size_t)k * bytes;
                size_t size = bytes;
                NET("irecv", net->irecv(rc, 1, &data, &size, &tag, &mh, NULL, &req[k]));
            }
            int got = -1;
            wait_req(req[m % w], &got);
            if (m == o->warmup)
                t_first = now_s();
            t_last = now_s();
            if (got != (int)bytes)
                wrong += (long)bytes;
        }
        /* The last window's contents, once the last message is timed: checking a message as
         * it lands would hold the timing loop while later messages arrive unwatched, and with
         * a window as long as the run (a few large messages) the spacing measured would be the
         * check's, not the network's. Slot k holds the last message m with m % w == k. */
        for (int k = 0; k < w && k < total; k++)
            for (size_t i = 0; i < bytes; i++)
                wrong += buf[(size_t)k * bytes + i] != pattern(bytes, k, i);
        /* Bandwidth over the messages after the first timed one: their arrival spacing. */
        double dt = t_last - t_first;
        int timed = iters > 1 ? iters - 1 : 1;
        double us = dt > 0 ? dt / timed * 1e6 : 0;
        double bw = dt > 0 ? (double)bytes * timed / dt / 1e9 : 0;
        printf(" %12zu %12d %8s %10.2f %10.2f %10.2f %8ld\n", bytes, iters, "uint8", us, bw, bw,
               wrong);
        fflush(stdout);
        sum_bw += bw;
        rows++;
        wrong_all += wrong;
        if (o->factor < 2 || bytes > o->max_bytes / (size_t)o->factor)
            break;
    }
    printf("# Out of bounds values : %ld %s\n", wrong_all, wrong_all ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g\n", rows ? sum_bw / rows : 0);
    NET("deregMr", net->deregMr(rc, mh));
    free(buf);
    if (wrong_all)
        exit(1);
}

static const char usage_text[] =
    "usage: reshard_net_perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]\n"
    "                        [-W WINDOW] [-d DEV] [--role recv|send|env --handle FILE] [-v]\n"
    "       reshard_net_perf --dump-config | -h | --help\n"
    "\n"
    "Streams isend/irecv through the plugin's ncclNetPlugin_v12 table as NCCL's proxy does (a\n"
    "window of messages in flight, test() polled) and prints nccl-tests style rows.\n"
    "  -b, -e SIZE     smallest and largest message (K, M, G: powers of 1024; default 8, 64M)\n"
    "  -f FACTOR       size multiplier between rows (default 2; 1: one row)\n"
    "  -n ITERS        timed messages per size (default: ~1 GiB worth, 20 to 2000)\n"
    "  -w WARMUP       untimed messages first (default 5)\n"
    "  -W WINDOW       messages in flight, 1 to 64 (default 8)\n"
    "  -d DEV          the plugin's device (default 0; RESHARD_NET_ALLOW_LO=1 offers loopback)\n"
    "  --role ROLE     recv, send, or env ($RANK 0 receives): one side per process, the handle\n"
    "                  through --handle FILE (default: fork, the parent receives)\n"
    "  -v, --verbose   the plugin's INFO lines too\n"
    "  --dump-config   print every RESHARD_* setting and exit\n"
    "Exit status: 0 every message arrived intact, 1 a failure, 2 bad arguments.\n";

static void bad_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void bad_usage(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "reshard_net_perf: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static const struct option long_opts[] = {
    {"role", required_argument, NULL, 'R'}, {"handle", required_argument, NULL, 'H'},
    {"verbose", no_argument, NULL, 'v'},    {"dump-config", no_argument, NULL, 'C'},
    {"help", no_argument, NULL, 'h'},       {NULL, 0, NULL, 0},
};

/* The option as typed: "-b", "--role". */
static const char *typed(int ch, char *buf, size_t n)
{
    for (const struct option *o = long_opts; o->name; o++)
        if (o->val == ch) {
            snprintf(buf, n, "--%s", o->name);
            return buf;
        }
    snprintf(buf, n, "-%c", ch);
    return buf;
}

/* 0 to run, 1 when -h or --dump-config was served; exits 2 on bad arguments. */
static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){
        .min_bytes = 8, .max_bytes = 64 << 20, .factor = 2, .iters = 0, .warmup = 5, .window = 8};
    char name[32];
    int ch;
    opterr = 0;
    while ((ch = getopt_long(argc, argv, ":b:e:f:n:w:W:d:vh", long_opts, NULL)) != -1) {
        int bad = 0;
        switch (ch) {
        case 'b':
            bad = !(o->min_bytes = parse_size(optarg));
            break;
        case 'e':
            bad = !(o->max_bytes = parse_size(optarg));
            break;
        case 'f':
            bad = (o->factor = parse_int(optarg, 1, 1 << 20)) < 1;
            break;
        case 'n':
            bad = (o->iters = parse_int(optarg, 1, 1 << 24)) < 1;
            break;
        case 'w':
            bad = (o->warmup = parse_int(optarg, 0, 1 << 24)) < 0;
            break;
        case 'W':
            bad = (o->window = parse_int(optarg, 1, MAX_WINDOW)) < 1;
            break;
        case 'd':
            bad = (o->dev = parse_int(optarg, 0, 1 << 16)) < 0;
            break;
        case 'R':
            bad = strcmp(optarg, "recv") && strcmp(optarg, "send") && strcmp(optarg, "env");
            o->role = optarg;
            break;
        case 'H':
            o->handle_file = optarg;
            break;
        case 'v':
            o->verbose = verbose = 1;
            break;
        case 'h':
            fputs(usage_text, stdout);
            return 1;
        case 'C':
            reshard_config_print(stdout);
            return 1;
        case ':':
            bad_usage("%s needs a value", typed(optopt, name, sizeof(name)));
        default:
            bad_usage("unknown option '%s' (--help lists them)",
                      optopt ? typed(optopt, name, sizeof(name)) : argv[optind - 1]);
        }
        if (bad)
            bad_usage("bad value '%s' for %s", optarg, typed(ch, name, sizeof(name)));
    }
    if (optind < argc)
        bad_usage("unexpected argument '%s'", argv[optind]);
    if (o->max_bytes < o->min_bytes)
        bad_usage("-e must not be below -b");
    if (o->role && !o->handle_file)
        bad_usage("--role needs --handle FILE");
    if (o->role && !strcmp(o->role, "env"))
        o->role = getenv("RANK") && atoi(getenv("RANK")) > 0 ? "send" : "recv";
    return 0;
}

static void put_handle(const struct opts *o, int fd, const unsigned char *h)
{
    if (fd >= 0) {
        if (write(fd, h, NCCL_NET_HANDLE_MAXSIZE) != NCCL_NET_HANDLE_MAXSIZE)
            die("handle pipe: %s", strerror(errno));
        return;
    }
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", o->handle_file);
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(h, 1, NCCL_NET_HANDLE_MAXSIZE, f) != NCCL_NET_HANDLE_MAXSIZE ||
        fclose(f) != 0 || rename(tmp, o->handle_file) != 0)
        die("writing %s: %s", o->handle_file, strerror(errno));
}

static void get_handle(const struct opts *o, int fd, unsigned char *h)
{
    if (fd >= 0) {
        ssize_t n = read(fd, h, NCCL_NET_HANDLE_MAXSIZE);
        if (n == 0)
            exit(1); /* the receiver failed first and said why */
        if (n != NCCL_NET_HANDLE_MAXSIZE)
            die("handle pipe: %s", n < 0 ? strerror(errno) : "short read");
        return;
    }
    for (double end = now_s() + PEER_WAIT_S;; usleep(10000)) {
        FILE *f = fopen(o->handle_file, "rb");
        if (f) {
            size_t n = fread(h, 1, NCCL_NET_HANDLE_MAXSIZE, f);
            fclose(f);
            if (n != NCCL_NET_HANDLE_MAXSIZE)
                die("%s holds %zu bytes", o->handle_file, n);
            return;
        }
        if (now_s() > end)
            die("%s did not appear within %d s", o->handle_file, PEER_WAIT_S);
    }
}

/* Accepts or connects until the plugin hands back a comm, for at most PEER_WAIT_S. */
static void *pair_up(void *ctx_or_listener, const struct opts *o, unsigned char *handle,
                     int is_recv)
{
    void *comm = NULL;
    ncclNetDeviceHandle_t *dh;
    for (double end = now_s() + PEER_WAIT_S; !comm; sender_check()) {
        if (is_recv)
            NET("accept", net->accept(ctx_or_listener, &comm, &dh));
        else
            NET("connect", net->connect(ctx_or_listener, o->dev, handle, &comm, &dh));
        if (!comm && now_s() > end)
            die("%s: no peer within %d s", is_recv ? "accept" : "connect", PEER_WAIT_S);
        if (!comm)
            usleep(1000);
    }
    return comm;
}

static int run(struct opts *o, int is_recv, int fd)
{
    void *ctx;
    int ndev;
    unsigned char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
    if (!is_recv) /* the receiver's handle first: it has started the plugin then */
        get_handle(o, fd, handle);
    /* A plugin without devices says why, in init or devices: that is the line to print. */
    char why[sizeof(held)];
    hold_begin();
    ncclResult_t r = net->init(&ctx, 1, NULL, logger, NULL);
    if (r != ncclSuccess)
        hold_end("init", r);
    hold_end_keep("devices", net->devices(&ndev), why, sizeof(why));
    if (o->dev >= ndev)
        die("device %d asked, the plugin has %d: %s", o->dev, ndev,
            why[0] ? why : "RESHARD_NET_ALLOW_LO=1 offers loopback");
    if (why[0])
        fprintf(stderr, "reshard_net_perf: %s\n", why);
    ncclNetProperties_v12_t props;
    NET("getProperties", net->getProperties(o->dev, &props));
    void *comm, *lc = NULL;
    if (is_recv) {
        NET("listen", net->listen(ctx, o->dev, handle, &lc));
        put_handle(o, fd, handle);
        comm = pair_up(lc, o, handle, 1);
        recv_side(o, comm, props.name, props.speed);
        NET("closeRecv", net->closeRecv(comm));
        NET("closeListen", net->closeListen(lc));
    } else {
        comm = pair_up(ctx, o, handle, 0);
        send_side(o, comm);
        NET("closeSend", net->closeSend(comm));
    }
    NET("finalize", net->finalize(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse(argc, argv, &o))
        return 0;
    if (o.role)
        return run(&o, !strcmp(o.role, "recv"), -1);
    int p[2];
    if (pipe(p) != 0)
        die("pipe: %s", strerror(errno));
    fflush(stdout);
    pid_t child = fork();
    if (child < 0)
        die("fork: %s", strerror(errno));
    if (child == 0) {
        close(p[1]);
        _exit(run(&o, 0, p[0]));
    }
    close(p[0]);
    sender = child;
    int rc = run(&o, 1, p[1]);
    close(p[1]);
    sender_reap(1);
    return rc;
}
