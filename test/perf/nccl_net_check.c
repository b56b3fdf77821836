/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nccl_net_check: NCCL's collectives over a network, between two processes on one GPU that NCCL
 * takes for two hosts (scripts/gpu-check.sh's net-plugin step). Each rank sets its own
 * NCCL_HOSTID, so NCCL finds two nodes of one GPU each and connects them only through its
 * network: the one NCCL_NET names (Reshard, through NCCL_NET_PLUGIN, or NCCL's own Socket).
 * all_reduce (float sum), all_gather and sendrecv (each rank sends to the next) run from 8 B
 * to MAX, four times larger each size, with the last size MAX itself; every element of every
 * result is checked on both ranks, and the ranks add up what they found wrong with an
 * all_reduce, as nccl-tests does. Rank 0 prints nccl-tests' columns, busbw with its factors
 * (all_reduce 2(n-1)/n, all_gather (n-1)/n, sendrecv 1), and a last line; exit 0 only when
 * nothing was wrong, 77 when libcuda or libnccl is missing.
 *
 *   nccl_net_check [MAX_MIB]        (default 256)
 * libcuda and libnccl are loaded at run time, never linked (RESHARD_CUDA_LIB and
 * RESHARD_NCCL_LIB name them; make test runs it on the stand-ins of test/fake). Device memory
 * is cuMemAlloc's, the stream cuStreamCreate's (a CUstream is a cudaStream_t).
 */
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RANKS      2
#define ITER_BYTES (256ull << 20) /* each size runs about this many bytes, 2 to 20 times */
#define ID_WAIT_MS 120000         /* rank 1's wait for rank 0's unique id */
#define EXIT_WRONG 3              /* a rank ran to the end and elements were wrong */

enum { NCCL_INT32 = 2, NCCL_FLOAT32 = 7, NCCL_SUM = 0 };
enum op { ALL_REDUCE, ALL_GATHER, SENDRECV, NOPS };
static const char *const op_names[NOPS] = {"all_reduce", "all_gather", "sendrecv"};

struct unique_id {
    char internal[128]; /* ncclUniqueId: ncclCommInitRank takes it by value */
};

typedef uint64_t dptr;

static struct {
    int (*cu_init)(unsigned);
    int (*cu_device_get)(int *, int);
    int (*cu_retain)(void **, int);
    int (*cu_set)(void *);
    int (*cu_stream_create)(void **, unsigned);
    int (*cu_stream_destroy)(void *);
    int (*cu_alloc)(dptr *, size_t);
    int (*cu_free)(dptr);
    int (*cu_htod)(dptr, const void *, size_t);
    int (*cu_dtoh)(void *, dptr, size_t);
    int (*cu_sync)(void *);
    int (*get_id)(struct unique_id *);
    int (*init_rank)(void **, int, struct unique_id, int);
    int (*all_reduce)(const void *, void *, size_t, int, int, void *, void *);
    int (*all_gather)(const void *, void *, size_t, int, void *, void *);
    int (*send)(const void *, size_t, int, int, void *, void *);
    int (*recv)(void *, size_t, int, int, void *, void *);
    int (*group_start)(void);
    int (*group_end)(void);
    int (*finalize)(void *); /* optional: NCCL 2.14 and later */
    int (*destroy)(void *);
    const char *(*error_string)(int);
    int (*version)(int *); /* optional */
} L;

static int rank = -1;

static void *sym(void *h, const char *name, int required)
{
    void *p = dlsym(h, name);
    if (!p && required) {
        fprintf(stderr, "nccl_net_check: rank %d: %s is missing\n", rank, name);
        exit(2);
    }
    return p;
}

static void *open_lib(const char *env, const char *dflt)
{
    const char *file = getenv(env) && *getenv(env) ? getenv(env) : dflt;
    void *h = dlopen(file, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "nccl_net_check: %s\n", dlerror());
        exit(77); /* no GPU stack here: skipped */
    }
    return h;
}

static void load(void)
{
    void *cu = open_lib("RESHARD_CUDA_LIB", "libcuda.so.1");
    void *nc = open_lib("RESHARD_NCCL_LIB", "libnccl.so.2");
    *(void **)&L.cu_init = sym(cu, "cuInit", 1);
    *(void **)&L.cu_device_get = sym(cu, "cuDeviceGet", 1);
    *(void **)&L.cu_retain = sym(cu, "cuDevicePrimaryCtxRetain", 1);
    *(void **)&L.cu_set = sym(cu, "cuCtxSetCurrent", 1);
    *(void **)&L.cu_stream_create = sym(cu, "cuStreamCreate", 1);
    *(void **)&L.cu_stream_destroy = sym(cu, "cuStreamDestroy_v2", 1);
    *(void **)&L.cu_alloc = sym(cu, "cuMemAlloc_v2", 1);
    *(void **)&L.cu_free = sym(cu, "cuMemFree_v2", 1);
    *(void **)&L.cu_htod = sym(cu, "cuMemcpyHtoD_v2", 1);
    *(void **)&L.cu_dtoh = sym(cu, "cuMemcpyDtoH_v2", 1);
    *(void **)&L.cu_sync = sym(cu, "cuStreamSynchronize", 1);
    *(void **)&L.get_id = sym(nc, "ncclGetUniqueId", 1);
    *(void **)&L.init_rank = sym(nc, "ncclCommInitRank", 1);
    *(void **)&L.all_reduce = sym(nc, "ncclAllReduce", 1);
    *(void **)&L.all_gather = sym(nc, "ncclAllGather", 1);
    *(void **)&L.send = sym(nc, "ncclSend", 1);
    *(void **)&L.recv = sym(nc, "ncclRecv", 1);
    *(void **)&L.group_start = sym(nc, "ncclGroupStart", 1);
    *(void **)&L.group_end = sym(nc, "ncclGroupEnd", 1);
    *(void **)&L.finalize = sym(nc, "ncclCommFinalize", 0);
    *(void **)&L.destroy = sym(nc, "ncclCommDestroy", 1);
    *(void **)&L.error_string = sym(nc, "ncclGetErrorString", 1);
    *(void **)&L.version = sym(nc, "ncclGetVersion", 0);
}

static int cu_failed(int rc, const char *what)
{
    if (rc)
        fprintf(stderr, "nccl_net_check: rank %d: %s failed (CUDA error %d)\n", rank, what, rc);
    return rc;
}

static int nccl_failed(int rc, const char *what, size_t bytes)
{
    if (rc)
        fprintf(stderr, "nccl_net_check: rank %d: %s of %zu bytes failed: %s (%d)\n", rank, what,
                bytes, L.error_string(rc), rc);
    return rc;
}

/* Rank r's element i of the test with this seed: a small integer (13 bits), so float sums of
 * two ranks are exact, different from rank to rank and from one test to the next. */
static float pattern(int r, size_t i, unsigned seed)
{
    return (float)((((uint32_t)i * 2654435761u) + (uint32_t)r * 40503u + seed * 977u) >> 19);
}

struct bufs {
    dptr send, recv, word_in, word_out;
    float *host;
    void *comm, *stream;
};

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* One operation on size bytes (nccl-tests' size: the all_reduce buffer, the whole all_gather
 * result, what each rank sends in sendrecv). */
static int launch(const struct bufs *b, enum op op, size_t size)
{
    const void *s = (const void *)(uintptr_t)b->send;
    void *r = (void *)(uintptr_t)b->recv;
    size_t count = size / sizeof(float);
    switch (op) {
    case ALL_REDUCE:
        return nccl_failed(L.all_reduce(s, r, count, NCCL_FLOAT32, NCCL_SUM, b->comm, b->stream),
                           "ncclAllReduce", size);
    case ALL_GATHER:
        return nccl_failed(L.all_gather(s, r, count / RANKS, NCCL_FLOAT32, b->comm, b->stream),
                           "ncclAllGather", size);
    default: {
        int rc = nccl_failed(L.group_start(), "ncclGroupStart", size);
        rc =
            rc ? rc
               : nccl_failed(L.send(s, count, NCCL_FLOAT32, (rank + 1) % RANKS, b->comm, b->stream),
                             "ncclSend", size);
        rc = rc ? rc
                : nccl_failed(L.recv(r, count, NCCL_FLOAT32, (rank + RANKS - 1) % RANKS, b->comm,
                                     b->stream),
                              "ncclRecv", size);
        int end = nccl_failed(L.group_end(), "ncclGroupEnd", size);
        return rc ? rc : end;
    }
    }
}

/* The element i of the result, as it must be. */
static float expected(enum op op, size_t i, size_t count, unsigned seed)
{
    switch (op) {
    case ALL_REDUCE: {
        float sum = 0;
        for (int r = 0; r < RANKS; r++)
            sum += pattern(r, i, seed);
        return sum;
    }
    case ALL_GATHER: {
        size_t part = count / RANKS;
        return pattern((int)(i / part), i % part, seed);
    }
    default:
        return pattern((rank + RANKS - 1) % RANKS, i, seed);
    }
}

/* Runs op on size bytes: fills, warms up once, times the iterations, checks every element of
 * the result. *wrong: the elements that differ; returns nonzero when a call failed. */
static int run_one(const struct bufs *b, enum op op, size_t size, unsigned seed, double *us,
                   long *wrong)
{
    size_t count = size / sizeof(float);
    size_t sent = op == ALL_GATHER ? count / RANKS : count;
    for (size_t i = 0; i < sent; i++)
        b->host[i] = pattern(rank, i, seed);
    if (cu_failed(L.cu_htod(b->send, b->host, sent * sizeof(float)), "cuMemcpyHtoD"))
        return 1;
    for (size_t i = 0; i < count; i++)
        b->host[i] = -1.0f; /* no pattern value: a result never written is wrong */
    if (cu_failed(L.cu_htod(b->recv, b->host, size), "cuMemcpyHtoD"))
        return 1;
    int iters = (int)(ITER_BYTES / size);
    iters = iters < 2 ? 2 : iters > 20 ? 20 : iters;
    if (launch(b, op, size) || cu_failed(L.cu_sync(b->stream), "cuStreamSynchronize"))
        return 1;
    double t0 = now_us();
    for (int it = 0; it < iters; it++)
        if (launch(b, op, size))
            return 1;
    if (cu_failed(L.cu_sync(b->stream), "cuStreamSynchronize"))
        return 1;
    *us = (now_us() - t0) / iters;
    if (cu_failed(L.cu_dtoh(b->host, b->recv, size), "cuMemcpyDtoH"))
        return 1;
    long bad = 0;
    for (size_t i = 0; i < count; i++) {
        float want = expected(op, i, count, seed);
        if (b->host[i] != want && bad++ < 3)
            fprintf(stderr,
                    "nccl_net_check: rank %d: %s of %zu bytes: element %zu is %.9g, not %.9g\n",
                    rank, op_names[op], size, i, (double)b->host[i], (double)want);
    }
    *wrong = bad;
    return 0;
}

/* The sum over the ranks of a count, through NCCL itself (as nccl-tests sums its errors). */
static int sum_ranks(const struct bufs *b, long mine, long *total)
{
    int32_t v = mine > INT32_MAX / RANKS ? INT32_MAX / RANKS : (int32_t)mine;
    if (cu_failed(L.cu_htod(b->word_in, &v, sizeof(v)), "cuMemcpyHtoD") ||
        nccl_failed(L.all_reduce((void *)(uintptr_t)b->word_in, (void *)(uintptr_t)b->word_out, 1,
                                 NCCL_INT32, NCCL_SUM, b->comm, b->stream),
                    "ncclAllReduce of the error count", sizeof(v)) ||
        cu_failed(L.cu_sync(b->stream), "cuStreamSynchronize") ||
        cu_failed(L.cu_dtoh(&v, b->word_out, sizeof(v)), "cuMemcpyDtoH"))
        return 1;
    *total = v;
    return 0;
}

/* The unique id from rank 0 to rank 1, through the pipe their parent made. */
static int exchange_id(struct unique_id *id, const int fds[2])
{
    if (rank == 0) {
        close(fds[0]);
        int rc = nccl_failed(L.get_id(id), "ncclGetUniqueId", sizeof(*id));
        if (!rc && write(fds[1], id, sizeof(*id)) != (ssize_t)sizeof(*id)) {
            fprintf(stderr, "nccl_net_check: rank 0: writing the unique id: %s\n", strerror(errno));
            rc = 1;
        }
        close(fds[1]);
        return rc;
    }
    close(fds[1]);
    size_t got = 0;
    while (got < sizeof(*id)) {
        struct pollfd p = {.fd = fds[0], .events = POLLIN};
        int n = poll(&p, 1, ID_WAIT_MS);
        ssize_t r = n > 0 ? read(fds[0], (char *)id + got, sizeof(*id) - got) : -1;
        if (r <= 0) {
            fprintf(stderr, "nccl_net_check: rank 1: no unique id from rank 0 (%s)\n",
                    n == 0   ? "none in 120 s"
                    : r == 0 ? "it exited"
                             : strerror(errno));
            close(fds[0]);
            return 1;
        }
        got += (size_t)r;
    }
    close(fds[0]);
    return 0;
}

static const double bus_factor[NOPS] = {2.0 * (RANKS - 1) / RANKS, (double)(RANKS - 1) / RANKS,
                                        1.0};

static int run_rank(size_t max, const int fds[2])
{
    char host[64];
    snprintf(host, sizeof(host), "reshard-net-check-host%d", rank);
    setenv("NCCL_HOSTID", host, 1); /* before NCCL reads it: two hosts to NCCL */
    setvbuf(stdout, NULL, _IOLBF, 0);
    load();

    struct bufs b = {0};
    struct unique_id id;
    void *ctx;
    int dev;
    if (cu_failed(L.cu_init(0), "cuInit") || cu_failed(L.cu_device_get(&dev, 0), "cuDeviceGet") ||
        cu_failed(L.cu_retain(&ctx, dev), "cuDevicePrimaryCtxRetain") ||
        cu_failed(L.cu_set(ctx), "cuCtxSetCurrent") ||
        cu_failed(L.cu_stream_create(&b.stream, 1 /* non-blocking */), "cuStreamCreate") ||
        cu_failed(L.cu_alloc(&b.send, max), "cuMemAlloc") ||
        cu_failed(L.cu_alloc(&b.recv, max), "cuMemAlloc") ||
        cu_failed(L.cu_alloc(&b.word_in, sizeof(int32_t)), "cuMemAlloc") ||
        cu_failed(L.cu_alloc(&b.word_out, sizeof(int32_t)), "cuMemAlloc"))
        return 1;
    if (!(b.host = malloc(max))) {
        fprintf(stderr, "nccl_net_check: rank %d: no memory for %zu bytes\n", rank, max);
        return 1;
    }
    if (exchange_id(&id, fds))
        return 1;
    double t0 = now_us();
    if (nccl_failed(L.init_rank(&b.comm, RANKS, id, rank), "ncclCommInitRank", 0))
        return 1;
    int version = 0;
    if (L.version)
        L.version(&version);
    const char *net = getenv("NCCL_NET");
    if (rank == 0) {
        printf("nccl_net_check: NCCL %d, %d ranks on device %d as hosts reshard-net-check-host0 "
               "and -host1 (NCCL_HOSTID), NCCL_NET=%s, communicator made in %.2f s\n",
               version, RANKS, dev, net ? net : "(unset)", (now_us() - t0) / 1e6);
        printf("%-10s %12s %10s %6s %10s %11s %11s %7s\n", "# op", "size(B)", "count", "type",
               "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    long wrong_all = 0;
    double last_busbw[NOPS] = {0};
    unsigned seed = 0;
    for (int op = 0; op < NOPS; op++) {
        for (size_t size = 8; size <= max; size = size * 4 > max && size < max ? max : size * 4) {
            double us = 0;
            long wrong = 0, total = 0;
            if (run_one(&b, (enum op)op, size, ++seed, &us, &wrong) || sum_ranks(&b, wrong, &total))
                return 1;
            wrong_all += total;
            double algbw = (double)size / us / 1e3; /* bytes per us / 1e3: GB/s */
            last_busbw[op] = algbw * bus_factor[op];
            if (rank == 0)
                printf("%-10s %12zu %10zu %6s %10.1f %11.3f %11.3f %7ld\n", op_names[op], size,
                       size / sizeof(float), "float", us, algbw, last_busbw[op], total);
        }
    }
    if (rank == 0)
        printf("nccl_net_check: %s, %s, %s from 8 B to %zu MiB over NCCL_NET=%s, every element "
               "checked on both ranks: #wrong %ld; busbw at %zu MiB: %s %.2f, %s %.2f, %s %.2f "
               "GB/s\n",
               op_names[0], op_names[1], op_names[2], max >> 20, net ? net : "(unset)", wrong_all,
               max >> 20, op_names[0], last_busbw[0], op_names[1], last_busbw[1], op_names[2],
               last_busbw[2]);
    if (L.finalize)
        nccl_failed(L.finalize(b.comm), "ncclCommFinalize", 0);
    nccl_failed(L.destroy(b.comm), "ncclCommDestroy", 0);
    L.cu_free(b.send);
    L.cu_free(b.recv);
    L.cu_free(b.word_in);
    L.cu_free(b.word_out);
    L.cu_stream_destroy(b.stream);
    free(b.host);
    return wrong_all ? EXIT_WRONG : 0;
}

int main(int argc, char **argv)
{
    long mib = argc > 1 ? atol(argv[1]) : 256;
    if (argc > 2 || mib < 1 || mib > 4096) {
        fprintf(stderr, "usage: nccl_net_check [MAX_MIB, 1..4096]\n");
        return 2;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        perror("nccl_net_check: pipe");
        return 1;
    }
    fflush(stdout);
    pid_t pids[RANKS];
    for (int r = 0; r < RANKS; r++) {
        /* fork before anything touches CUDA: each rank makes its own context */
        if ((pids[r] = fork()) == 0) {
            rank = r;
            _exit(run_rank((size_t)mib << 20, fds));
        }
        if (pids[r] < 0) {
            perror("nccl_net_check: fork");
            if (r > 0)
                kill(pids[0], SIGTERM);
            return 1;
        }
    }
    close(fds[0]);
    close(fds[1]);
    /* A rank that fails leaves the other waiting in NCCL for it: end that one too (not when
     * it ran to the end, having found wrong elements: the other is ending, and rank 0 prints). */
    int worst = 0, left = RANKS;
    while (left > 0) {
        int status;
        pid_t pid = wait(&status);
        if (pid < 0)
            break;
        left--;
        int r = pid == pids[0] ? 0 : 1;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        if (code && code != EXIT_WRONG && worst == 0) {
            fprintf(stderr, "nccl_net_check: rank %d %s %d%s\n", r,
                    WIFEXITED(status) ? "exited with" : "was killed by signal",
                    WIFEXITED(status) ? code : WTERMSIG(status),
                    left ? "; ending the other rank" : "");
            if (left)
                kill(pids[1 - r], SIGTERM);
        }
        if (code && worst == 0)
            worst = code;
    }
    return worst == 0 ? 0 : worst == 77 ? 77 : 1;
}
