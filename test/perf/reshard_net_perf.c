/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard_net_perf: isend/irecv streaming through the plugin's exported ncclNetPlugin_v12
 * table, as NCCL's proxy drives it (a window of messages in flight, test() polled), in
 * nccl-tests style columns, to compare the plugin's path with ucx_perftest -t tag_bw.
 *
 *   reshard_net_perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] [-w WARMUP]
 *                    [-W WINDOW] [-d DEV] [--role recv|send|env --handle FILE]
 *
 * Without --role it forks: the parent receives, the child sends, the handle goes over a pipe.
 * With --role the two sides are separate processes (two emulated nodes, two hosts) and the
 * handle goes through FILE; "env" takes the role from $RANK (0 receives). The receiver prints
 * the table: time per message and bandwidth between its first and last completion.
 */
#include "plugin/net/nccl/net_v12.h"

#include <errno.h>
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
#define SLOT_BUDGET ((size_t)512 << 20) /* bytes of buffers per side at most */

struct opts {
    size_t min_bytes, max_bytes;
    int factor, iters, warmup, window, dev;
    const char *role, *handle_file;
};

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

#define NET(call)                                                                                  \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        if (r_ != ncclSuccess)                                                                     \
            die("%s failed: %d", #call, (int)r_);                                                  \
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
    if (level > NCCL_LOG_WARN && !getenv("RESHARD_NET_PERF_VERBOSE"))
        return;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "reshard_net_perf: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K':
    case 'k':
        v *= 1024;
        break;
    case 'M':
    case 'm':
        v *= 1024 * 1024;
        break;
    case 'G':
    case 'g':
        v *= 1024.0 * 1024 * 1024;
        break;
    case '\0':
        break;
    default:
        die("bad size '%s'", s);
    }
    return (size_t)v;
}

static void wait_req(void *req, int *size)
{
    int done = 0;
    while (!done)
        NET(net->test(req, &done, size));
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
    NET(net->regMr(comm, buf, cap, NCCL_PTR_HOST, mh));
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
                NET(net->isend(sc, buf + (size_t)k * bytes, bytes, k, mh, NULL, &req[k]));
        }
        for (int m = total > w ? total - w : 0; m < total; m++)
            wait_req(req[m % w], NULL);
        if (o->factor < 2 || bytes > o->max_bytes / (size_t)o->factor)
            break;
    }
    NET(net->deregMr(sc, mh));
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
                NET(net->irecv(rc, 1, &data, &size, &tag, &mh, NULL, &req[k]));
            }
            int got = -1;
            wait_req(req[m % w], &got);
            if (m == o->warmup)
                t_first = now_s();
            t_last = now_s();
            if (got != (int)bytes)
                wrong += (long)bytes;
            else if (m >= total - w) /* the last window's contents are checked, untimed */
                for (size_t i = 0; i < bytes; i++)
                    wrong += buf[(size_t)(m % w) * bytes + i] != pattern(bytes, m % w, i);
        }
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
    NET(net->deregMr(rc, mh));
    free(buf);
    if (wrong_all)
        exit(1);
}

static void usage(void)
{
    fprintf(stderr, "usage: reshard_net_perf [-b MINBYTES] [-e MAXBYTES] [-f FACTOR] [-n ITERS] "
                    "[-w WARMUP] [-W WINDOW] [-d DEV] [--role recv|send|env --handle FILE]\n");
    exit(2);
}

static void parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){
        .min_bytes = 8, .max_bytes = 64 << 20, .factor = 2, .iters = 0, .warmup = 5, .window = 8};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "-b"))
            o->min_bytes = parse_size(v);
        else if (!strcmp(a, "-e"))
            o->max_bytes = parse_size(v);
        else if (!strcmp(a, "-f"))
            o->factor = atoi(v);
        else if (!strcmp(a, "-n"))
            o->iters = atoi(v);
        else if (!strcmp(a, "-w"))
            o->warmup = atoi(v);
        else if (!strcmp(a, "-W"))
            o->window = atoi(v);
        else if (!strcmp(a, "-d"))
            o->dev = atoi(v);
        else if (!strcmp(a, "--role"))
            o->role = v;
        else if (!strcmp(a, "--handle"))
            o->handle_file = v;
        else
            usage();
    }
    if (!o->min_bytes || o->max_bytes < o->min_bytes || o->factor < 1 || o->iters < 0 ||
        o->warmup < 0 || o->window < 1 || o->window > MAX_WINDOW)
        die("bad arguments (sizes > 0, -W 1..%d)", MAX_WINDOW);
    if (o->role && !o->handle_file)
        die("--role needs --handle FILE");
    if (o->role && !strcmp(o->role, "env"))
        o->role = getenv("RANK") && atoi(getenv("RANK")) > 0 ? "send" : "recv";
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
        if (read(fd, h, NCCL_NET_HANDLE_MAXSIZE) != NCCL_NET_HANDLE_MAXSIZE)
            die("handle pipe: %s", strerror(errno));
        return;
    }
    for (double end = now_s() + 60;; usleep(10000)) {
        FILE *f = fopen(o->handle_file, "rb");
        if (f) {
            size_t n = fread(h, 1, NCCL_NET_HANDLE_MAXSIZE, f);
            fclose(f);
            if (n != NCCL_NET_HANDLE_MAXSIZE)
                die("%s holds %zu bytes", o->handle_file, n);
            return;
        }
        if (now_s() > end)
            die("%s did not appear within 60 s", o->handle_file);
    }
}

static int run(struct opts *o, int is_recv, int fd)
{
    void *ctx;
    int ndev;
    NET(net->init(&ctx, 1, NULL, logger, NULL));
    NET(net->devices(&ndev));
    if (o->dev >= ndev)
        die("device %d asked, the plugin has %d (RESHARD_NET_ALLOW_LO=1 offers loopback)", o->dev,
            ndev);
    ncclNetProperties_v12_t props;
    NET(net->getProperties(o->dev, &props));
    unsigned char handle[NCCL_NET_HANDLE_MAXSIZE] = {0};
    void *comm = NULL, *lc = NULL;
    ncclNetDeviceHandle_t *dh;
    if (is_recv) {
        NET(net->listen(ctx, o->dev, handle, &lc));
        put_handle(o, fd, handle);
        while (!comm)
            NET(net->accept(lc, &comm, &dh));
    } else {
        get_handle(o, fd, handle);
        while (!comm)
            NET(net->connect(ctx, o->dev, handle, &comm, &dh));
    }
    if (is_recv)
        recv_side(o, comm, props.name, props.speed);
    else
        send_side(o, comm);
    NET(is_recv ? net->closeRecv(comm) : net->closeSend(comm));
    if (lc)
        NET(net->closeListen(lc));
    NET(net->finalize(ctx));
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    parse(argc, argv, &o);
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
    int rc = run(&o, 1, p[1]);
    int status;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
        die("the sending process failed (status %#x)", status);
    return rc;
}
