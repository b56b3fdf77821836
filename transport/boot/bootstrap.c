/* SPDX-License-Identifier: Apache-2.0 */
#include "bootstrap.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "transport/sock/sock.h"
#include "transport/sock/sock_frame.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define BOOT_ID_MAGIC   0x52534944u /* "RSID" */
#define BOOT_VERSION    1
#define SECRET_BYTES    32
#define HELLO_BYTES     (4 + SECRET_BYTES + 4 + 4) /* version, secret, rank, size */
#define ABORT_MAX_MS    1000                       /* how long telling the others may take */
#define PEER_GRACE_MAX  5000 /* the most a peer waits past its deadline for rank 0's verdict */
#define MISSING_LISTED  32   /* ranks named in a timeout message, the rest counted */
#define PENDING_EXTRA   64   /* connections that may wait to say hello, beyond the job's own */
#define PEER_NAME_BYTES (SOCK_ADDR_STR + 24)

/* ---- configuration ---- */

/* RESHARD_BOOT_PORT, checked to be a port (0: any). */
static reshard_status_t param_port(int *port)
{
    int64_t p = rs_param_int(RS_PARAM_BOOT_PORT);
    if (p < 0 || p > 65535)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: RESHARD_BOOT_PORT=%lld is not a port",
                        (long long)p);
    *port = (int)p;
    return RESHARD_OK;
}

/* ---- ids ---- */

/* Layout: magic 0-3, version 4, family 5 (4 or 6), port 6-7, address 8-23, IPv6 scope 24-27,
 * secret 28-59, zeros after. */
static void id_encode(const union sock_addr *a, const unsigned char *secret, struct boot_id *id)
{
    memset(id, 0, sizeof(*id));
    sock_wire_put(id->bytes, BOOT_ID_MAGIC, 4);
    id->bytes[4] = BOOT_VERSION;
    id->bytes[5] = a->sa.sa_family == AF_INET6 ? 6 : 4;
    sock_wire_put(id->bytes + 6, (uint64_t)sock_addr_port(a), 2);
    if (a->sa.sa_family == AF_INET6) {
        memcpy(id->bytes + 8, &a->in6.sin6_addr, 16);
        sock_wire_put(id->bytes + 24, a->in6.sin6_scope_id, 4);
    } else {
        memcpy(id->bytes + 8, &a->in.sin_addr, 4);
    }
    memcpy(id->bytes + 28, secret, SECRET_BYTES);
}

/* 0, or -1 when id is not one of ours. */
static int id_decode(const struct boot_id *id, union sock_addr *a, unsigned char *secret)
{
    const unsigned char *b = id->bytes;
    if (sock_wire_get(b, 4) != BOOT_ID_MAGIC || b[4] != BOOT_VERSION || (b[5] != 4 && b[5] != 6))
        return -1;
    memset(a, 0, sizeof(*a));
    if (b[5] == 6) {
        a->in6.sin6_family = AF_INET6;
        memcpy(&a->in6.sin6_addr, b + 8, 16);
        a->in6.sin6_scope_id = (uint32_t)sock_wire_get(b + 24, 4);
    } else {
        a->in.sin_family = AF_INET;
        memcpy(&a->in.sin_addr, b + 8, 4);
    }
    sock_addr_set_port(a, (int)sock_wire_get(b + 6, 2));
    if (secret)
        memcpy(secret, b + 28, SECRET_BYTES);
    return 0;
}

const char *boot_id_addr(const struct boot_id *id, char *buf, size_t n)
{
    union sock_addr a;
    if (id_decode(id, &a, NULL) != 0) {
        snprintf(buf, n, "(not a bootstrap id)");
        return buf;
    }
    return sock_addr_str(&a, buf, n);
}

/* Not cryptographic, and need not be: the secret tells one job's ranks from another's and
 * from stray processes, and crosses the network in clear anyway. Four FNV-1a lanes with
 * distinct seeds, each finished by a 64-bit mixer. */
static void secret_hash(const char *s, unsigned char *out)
{
    for (int lane = 0; lane < SECRET_BYTES / 8; lane++) {
        uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)(lane + 1) * 0x9e3779b97f4a7c15ull;
        for (const unsigned char *p = (const unsigned char *)s; *p; p++)
            h = (h ^ *p) * 0x100000001b3ull;
        h = (h ^ h >> 33) * 0xff51afd7ed558ccdull;
        h = (h ^ h >> 33) * 0xc4ceb9fe1a85ec53ull;
        sock_wire_put(out + 8 * lane, h ^ h >> 33, 8);
    }
}

static reshard_status_t random_bytes(unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: getrandom: %m");
        p += k;
        n -= (size_t)k;
    }
    return RESHARD_OK;
}

/* The registry: listening sockets of the ids this process made, for its rank 0 to take. */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct registered {
    struct boot_id id;
    int fd;
} * registry;
static size_t registry_len, registry_cap;

static reshard_status_t registry_add(const struct boot_id *id, int fd)
{
    reshard_status_t st = RESHARD_OK;
    pthread_mutex_lock(&registry_lock);
    struct registered *r =
        rs_grow(registry, &registry_cap, registry_len + 1, sizeof(*r), "bootstrap registry");
    if (r) {
        registry = r;
        registry[registry_len++] = (struct registered){*id, fd};
    } else {
        st = RESHARD_ERR_NO_MEMORY;
    }
    pthread_mutex_unlock(&registry_lock);
    return st;
}

/* Removes the id's entry: its socket, or -1. */
static int registry_take(const struct boot_id *id)
{
    int fd = -1;
    pthread_mutex_lock(&registry_lock);
    for (size_t i = 0; i < registry_len; i++) {
        if (memcmp(registry[i].id.bytes, id->bytes, BOOT_ID_BYTES) == 0) {
            fd = registry[i].fd;
            registry[i] = registry[--registry_len];
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return fd;
}

void boot_id_release(const struct boot_id *id)
{
    int fd = registry_take(id);
    sock_close(&fd);
}

reshard_status_t boot_id_create(struct boot_id *id)
{
    union sock_addr a;
    unsigned char secret[SECRET_BYTES];
    struct boot_id made;
    const char *host = rs_param_str(RS_PARAM_BOOT_ADDR);
    int port = 0, fd;
    reshard_status_t st;
    RS_CHECK(param_port(&port));
    /* A name in RESHARD_BOOT_ADDR is looked up here, so the id carries what peers dial. */
    if (host[0])
        RS_CHECK(sock_resolve(host, port, &a));
    else
        RS_CHECK(sock_default_addr(&a));
    sock_addr_set_port(&a, port);
    RS_CHECK(random_bytes(secret, sizeof(secret)));
    RS_CHECK(sock_listen(&a, &fd));
    id_encode(&a, secret, &made);
    RS_CHECK_GOTO(registry_add(&made, fd), st, err_close);
    *id = made;
    return RESHARD_OK;
err_close:
    close(fd);
    return st;
}

reshard_status_t boot_id_from_addr(const char *host, int port, const char *secret,
                                   struct boot_id *id)
{
    union sock_addr a;
    unsigned char hashed[SECRET_BYTES];
    if (!host || !*host || !secret || !id)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: boot_id_from_addr needs a host, a "
                                                 "secret and an id to fill");
    if (port < 1 || port > 65535)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: port %d is not in 1..65535", port);
    RS_CHECK(sock_resolve(host, port, &a));
    secret_hash(secret, hashed);
    id_encode(&a, hashed, id);
    return RESHARD_OK;
}

/* FNV-1a lanes, as secret_hash, over a secret and then a salt. */
static void secret_mix(const unsigned char *secret, const void *salt, size_t n, unsigned char *out)
{
    unsigned char mixed[SECRET_BYTES];
    for (int lane = 0; lane < SECRET_BYTES / 8; lane++) {
        uint64_t h = 0xcbf29ce484222325ull ^ (uint64_t)(lane + 1) * 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < SECRET_BYTES; i++)
            h = (h ^ secret[i]) * 0x100000001b3ull;
        for (size_t i = 0; i < n; i++)
            h = (h ^ ((const unsigned char *)salt)[i]) * 0x100000001b3ull;
        h = (h ^ h >> 33) * 0xff51afd7ed558ccdull;
        h = (h ^ h >> 33) * 0xc4ceb9fe1a85ec53ull;
        sock_wire_put(mixed + 8 * lane, h ^ h >> 33, 8);
    }
    memcpy(out, mixed, SECRET_BYTES);
}

reshard_status_t boot_id_derive(const struct boot_id *id, const void *salt, size_t n,
                                struct boot_id *out)
{
    union sock_addr a;
    unsigned char secret[SECRET_BYTES];
    if (id_decode(id, &a, secret) != 0)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: not a bootstrap id of this version");
    secret_mix(secret, salt, n, secret);
    struct boot_id made;
    id_encode(&a, secret, &made);
    pthread_mutex_lock(&registry_lock); /* a listener made here now answers to the new id */
    for (size_t i = 0; i < registry_len; i++)
        if (memcmp(registry[i].id.bytes, id->bytes, BOOT_ID_BYTES) == 0)
            registry[i].id = made;
    pthread_mutex_unlock(&registry_lock);
    *out = made;
    return RESHARD_OK;
}

/* ---- launcher environment ---- */

struct launcher {
    const char *name, *rank, *size, *local_rank, *local_size;
};

static const struct launcher torchrun = {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                         "LOCAL_WORLD_SIZE"};
static const struct launcher ompi = {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                                     "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
static const struct launcher slurm = {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                                      NULL};

static const char *env(const char *name)
{
    const char *v = name ? getenv(name) : NULL;
    return v && *v ? v : NULL;
}

static const struct launcher *launcher_detect(void)
{
    if (env("RANK") || env("WORLD_SIZE"))
        return &torchrun;
    if (env("OMPI_COMM_WORLD_RANK") || env("OMPI_COMM_WORLD_SIZE"))
        return &ompi;
    if (env("SLURM_PROCID"))
        return &slurm;
    return NULL;
}

/* An integer variable in [lo, hi]; an optional one that is unset reads as -1. The value may be
 * followed by a suffix only where allow_rest says (Slurm's "4(x2),3"). */
static reshard_status_t env_int(const struct launcher *l, const char *name, int required,
                                int allow_rest, long lo, long hi, int *out)
{
    const char *v = env(name);
    char *end;
    if (!v && !required) {
        *out = -1;
        return RESHARD_OK;
    }
    if (!v)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: %s launch: %s is not set", l->name,
                        name);
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || (*end && !allow_rest) || x < lo || x > hi)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s launch: %s=%s is not an integer in [%ld, %ld]", l->name,
                        name, v, lo, hi);
    *out = (int)x;
    return RESHARD_OK;
}

static reshard_status_t env_ranks(const struct launcher *l, struct boot_env *e)
{
    RS_CHECK(env_int(l, l->size, 1, 0, 1, INT_MAX, &e->size));
    RS_CHECK(env_int(l, l->rank, 1, 0, 0, e->size - 1, &e->rank));
    RS_CHECK(env_int(l, l->local_rank, 0, 0, 0, e->size - 1, &e->local_rank));
    if (l != &slurm)
        RS_CHECK(env_int(l, l->local_size, 0, 0, 1, e->size, &e->local_size));
    else if (env("SLURM_NTASKS_PER_NODE"))
        RS_CHECK(env_int(l, "SLURM_NTASKS_PER_NODE", 1, 0, 1, e->size, &e->local_size));
    else
        RS_CHECK(env_int(l, "SLURM_STEP_TASKS_PER_NODE", 0, 1, 1, e->size, &e->local_size));
    if (e->local_rank >= 0 && e->local_size >= 0 && e->local_rank >= e->local_size)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s launch: local rank %d is not below the %d ranks of its node",
                        l->name, e->local_rank, e->local_size);
    return RESHARD_OK;
}

/* The first host of a Slurm host list: "gpu[01-04,07],cpu3" gives "gpu01". */
static int nodelist_first(const char *list, char *out, size_t n)
{
    size_t k = 0;
    for (const char *p = list; *p && *p != ','; p++) {
        if (*p != '[') {
            if (k + 1 < n)
                out[k++] = *p;
            continue;
        }
        for (p++; *p && *p != ']' && *p != ',' && *p != '-'; p++)
            if (k + 1 < n)
                out[k++] = *p;
        while (*p && *p != ']')
            p++;
        if (!*p)
            break;
    }
    out[k] = '\0';
    return k > 0 ? 0 : -1;
}

/* Rank 0's host and MASTER_PORT. */
static reshard_status_t env_master(const struct launcher *l, char *host, size_t n, int *port)
{
    const char *addr = env("MASTER_ADDR");
    const char *list =
        env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_JOB_NODELIST");
    if (addr) {
        snprintf(host, n, "%s", addr);
    } else if (l == &slurm && list) {
        if (nodelist_first(list, host, n) != 0)
            return rs_error(RESHARD_ERR_INVALID_ARG,
                            "bootstrap: Slurm launch: MASTER_ADDR is not set and the node list "
                            "'%s' names no host",
                            list);
    } else {
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: %s launch: MASTER_ADDR is not set: it must name rank 0's "
                        "host%s",
                        l->name,
                        l == &slurm ? " (or SLURM_STEP_NODELIST / SLURM_JOB_NODELIST be set)" : "");
    }
    if (!env("MASTER_PORT") && l == &slurm) {
        *port = 29500;
        return RESHARD_OK;
    }
    return env_int(l, "MASTER_PORT", 1, 0, 1, 65535, port);
}

/* Every rank of one job derives the same string, and a rank of another job a different one. */
static void env_secret(const struct launcher *l, const char *host, int port, int size,
                       unsigned char *secret)
{
    const char *configured = rs_param_str(RS_PARAM_SECRET);
    char job[256] = "", s[1024];
    if (configured[0]) {
        secret_hash(configured, secret);
        return;
    }
    if (l == &torchrun && env("TORCHELASTIC_RUN_ID"))
        snprintf(job, sizeof(job), "%s", env("TORCHELASTIC_RUN_ID"));
    else if (l == &ompi && (env("OMPI_MCA_orte_ess_jobid") || env("PMIX_NAMESPACE")))
        snprintf(job, sizeof(job), "%s",
                 env("OMPI_MCA_orte_ess_jobid") ? env("OMPI_MCA_orte_ess_jobid")
                                                : env("PMIX_NAMESPACE"));
    else if (l == &slurm)
        snprintf(job, sizeof(job), "%s.%s", env("SLURM_JOB_ID") ? env("SLURM_JOB_ID") : "",
                 env("SLURM_STEP_ID") ? env("SLURM_STEP_ID") : "");
    snprintf(s, sizeof(s), "reshard|%s|%s|%s|%d|%d", l->name, job, host, port, size);
    secret_hash(s, secret);
}

reshard_status_t boot_env_read(struct boot_env *out)
{
    const struct launcher *l = launcher_detect();
    struct boot_env e;
    unsigned char secret[SECRET_BYTES];
    union sock_addr a;
    char host[256];
    int master_port = 0, port = 0;
    if (!l)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: no launcher environment: set RANK and WORLD_SIZE (as "
                        "torchrun does), or launch with mpirun or srun; MASTER_ADDR and "
                        "MASTER_PORT name rank 0's host");
    RS_CHECK(env_ranks(l, &e));
    RS_CHECK(env_master(l, host, sizeof(host), &master_port));
    RS_CHECK(param_port(&port));
    /* torchrun's own store holds MASTER_PORT. */
    port = port ? port : master_port + 1;
    if (port > 65535)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: MASTER_PORT=65535 leaves no port for rank 0 (MASTER_PORT+1): "
                        "set RESHARD_BOOT_PORT");
    env_secret(l, host, port, e.size, secret);
    reshard_status_t st = sock_resolve(host, port, &a);
    if (st != RESHARD_OK) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        return rs_error(st, "bootstrap: %s launch: rank 0's host %s (%s) does not resolve: %s",
                        l->name, host,
                        env("MASTER_ADDR") ? "MASTER_ADDR" : "first host of the node list", why);
    }
    id_encode(&a, secret, &e.id);
    *out = e;
    return RESHARD_OK;
}

/* ---- the bootstrap ---- */

struct conn {
    int fd;
    int send_torn;              /* a frame went out cut short: nothing more may follow it */
    char name[PEER_NAME_BYTES]; /* "rank 3 (10.0.0.1:4242)" */
};

struct boot {
    int rank, size, timeout_ms;
    uint32_t seq;             /* collectives so far, to tell ranks out of step */
    struct conn *conns;       /* by rank: rank 0 holds 1..size-1, a peer holds [0] */
    int *label;               /* [size]: the number each rank goes by in messages and reports */
    const atomic_int *cancel; /* collectives end when it turns non-zero (NULL: never) */
    reshard_status_t failed;  /* RESHARD_OK while usable */
    char fail_msg[RS_ERROR_MAX];
    char refusal[RS_ERROR_MAX];
};

/* One exchange in progress: the frame header its frames carry and when it must end. */
struct coll {
    struct boot *b;
    struct sock_frame_hdr hdr;
    int64_t deadline;
    char what[64];               /* "allgather #3 on rank 2", for messages */
    struct sock_frame_error err; /* what a failed rank reported (origin -1: nothing) */
};

static int min_int(int a, int b)
{
    return a < b ? a : b;
}

static int peer_grace(const struct boot *b)
{
    return min_int(b->timeout_ms / 4, PEER_GRACE_MAX);
}

/* One frame with rank `only`, or (only < 0) with every peer of rank 0 but `skip`: sent from,
 * or received into, base + rank * stride. */
static reshard_status_t exchange(struct coll *c, int only, int skip, int send, uint64_t len,
                                 unsigned char *base, size_t stride)
{
    struct boot *b = c->b;
    int first = only >= 0 ? only : 1, last = only >= 0 ? only : b->size - 1, n = 0, failed;
    struct sock_xfer *x = rs_calloc((size_t)(last - first + 1), sizeof(*x), "bootstrap transfers");
    if (!x)
        return RESHARD_ERR_NO_MEMORY;
    struct sock_frame_hdr hdr = c->hdr;
    /* A peer waiting on rank 0 waits a little longer than rank 0 waits on anyone, so that it
     * hears which rank rank 0 gave up on, rather than timing out on its own. */
    int64_t deadline = c->deadline + (b->rank != 0 && !send ? peer_grace(b) : 0);
    hdr.len = len;
    for (int r = first; r <= last; r++)
        if (r != skip)
            sock_xfer_init(&x[n++], b->conns[r].fd, b->conns[r].name, send, hdr,
                           base + (size_t)r * stride);
    reshard_status_t st =
        sock_xfer_run_cancel(x, n, deadline, b->timeout_ms, c->what, b->cancel, &failed, &c->err);
    /* The same walk as above, to find each transfer's connection again. */
    for (int r = first, i = 0; r <= last; r++)
        if (r != skip && sock_xfer_torn(&x[i++]) && send)
            b->conns[r].send_torn = 1;
    free(x);
    return st;
}

/* Whether rank r hears of a failure of `origin` (a label) from this rank. */
static int told(const struct boot *b, int r, int origin)
{
    return b->conns[r].fd >= 0 && !b->conns[r].send_torn && b->label[r] != origin && r != b->rank;
}

/* Tells the ranks this one talks to that `origin` (by its label) failed, so that they fail now
 * rather than at their timeout: rank 0 tells every peer but the origin, a peer tells rank 0 (which
 * forwards it). Best effort, within ABORT_MAX_MS; the thread's message is left alone. */
static void tell_others(struct boot *b, int origin, reshard_status_t st, const char *text)
{
    unsigned char payload[8 + SOCK_FRAME_TEXT_MAX];
    struct sock_frame_hdr hdr = {.type = SOCK_FRAME_ERROR,
                                 .len = sock_frame_put_error(payload, origin, st, text)};
    struct sock_xfer *x = calloc((size_t)b->size, sizeof(*x));
    int64_t deadline = rs_now_ms() + min_int(b->timeout_ms, ABORT_MAX_MS);
    struct rs_saved_error saved;
    int n = 0, failed;
    if (!x)
        return;
    rs_error_save(&saved); /* best-effort sends must not replace the error being reported */
    for (int r = 0; r < b->size; r++) {
        struct conn *c = &b->conns[r];
        if (told(b, r, origin)) {
            /* What the peer sent may lie unread after a failure: do not take it for a reply. */
            sock_xfer_init(&x[n], c->fd, c->name, 1, hdr, payload);
            x[n++].listen = 0;
        }
    }
    /* One peer failing to take it must not keep the others from hearing. */
    while (sock_xfer_run(x, n, deadline, ABORT_MAX_MS, "abort", &failed, NULL) != RESHARD_OK &&
           failed >= 0 && rs_now_ms() < deadline)
        x[failed].finished = 1;
    for (int r = 0, i = 0; r < b->size; r++)
        if (told(b, r, origin) && sock_xfer_torn(&x[i++]))
            b->conns[r].send_torn = 1;
    free(x);
    rs_error_restore(&saved);
}

/* An exchange failed on this rank: the bootstrap is unusable from now on, and the others are
 * told. A failure another rank reported (err->origin >= 0) is forwarded by rank 0 and kept
 * quiet by a peer, which heard it from rank 0. */
static reshard_status_t boot_fail(struct boot *b, reshard_status_t st,
                                  const struct sock_frame_error *err)
{
    struct rs_saved_error msg;
    rs_error_save(&msg);
    if (st == RESHARD_ERR_REMOTE && err && err->origin >= 0) {
        if (b->rank == 0)
            tell_others(b, err->origin, err->status, err->text);
    } else {
        tell_others(b, b->label[b->rank], st, msg.msg);
    }
    b->failed = st;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "%s", msg.msg);
    return rs_error(st, "%s", msg.msg);
}

/* Checks the arguments (before the turn counts, so that a caller's mistake leaves the ranks in
 * step) and starts the turn's clock. `slots` buffers of `bytes` each must fit in memory. */
static reshard_status_t coll_begin(struct boot *b, enum sock_frame_op op, const void *buf,
                                   size_t bytes, int slots, struct coll *c)
{
    if (!b)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: %s on a NULL bootstrap",
                        sock_frame_op_name(op));
    if (b->failed)
        return rs_error(b->failed, "bootstrap: unusable after an earlier failure (%s)",
                        b->fail_msg);
    if (bytes && !buf)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: %s of %zu bytes from a NULL buffer",
                        sock_frame_op_name(op), bytes);
    if (bytes > SIZE_MAX / (size_t)slots)
        return rs_error(RESHARD_ERR_TOO_LARGE, "bootstrap: %s of %d x %zu bytes overflows",
                        sock_frame_op_name(op), slots, bytes);
    b->seq++;
    *c = (struct coll){.b = b,
                       .hdr = {.type = SOCK_FRAME_DATA, .op = (uint16_t)op, .seq = b->seq},
                       .deadline = rs_now_ms() + b->timeout_ms,
                       .err = {.origin = -1}};
    snprintf(c->what, sizeof(c->what), "%s #%u on rank %d", sock_frame_op_name(op), b->seq,
             b->label[b->rank]);
    return RESHARD_OK;
}

/* Star through rank 0: it collects every slot, then sends the whole array to each peer. */
static reshard_status_t gather_all(struct boot *b, void *buf, size_t bytes, enum sock_frame_op op)
{
    static unsigned char none;
    unsigned char *base = buf ? buf : &none;
    struct coll c;
    reshard_status_t st;
    RS_CHECK(coll_begin(b, op, buf, bytes, b ? b->size : 1, &c));
    size_t all = bytes * (size_t)b->size;
    if (b->rank == 0) {
        RS_CHECK_GOTO(exchange(&c, -1, -1, 0, bytes, base, bytes), st, err_fail);
        RS_CHECK_GOTO(exchange(&c, -1, -1, 1, all, base, 0), st, err_fail);
    } else {
        RS_CHECK_GOTO(exchange(&c, 0, -1, 1, bytes, base + (size_t)b->rank * bytes, 0), st,
                      err_fail);
        RS_CHECK_GOTO(exchange(&c, 0, -1, 0, all, base, 0), st, err_fail);
    }
    return RESHARD_OK;
err_fail:
    return boot_fail(b, st, &c.err);
}

reshard_status_t boot_allgather(struct boot *b, void *buf, size_t bytes)
{
    return gather_all(b, buf, bytes, SOCK_OP_ALLGATHER);
}

reshard_status_t boot_barrier(struct boot *b)
{
    return gather_all(b, NULL, 0, SOCK_OP_BARRIER);
}

reshard_status_t boot_bcast(struct boot *b, void *buf, size_t bytes, int root)
{
    static unsigned char none;
    unsigned char *base = buf ? buf : &none;
    struct coll c;
    reshard_status_t st;
    if (b && (root < 0 || root >= b->size))
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: bcast root %d is not a rank of %d",
                        root, b->size);
    RS_CHECK(coll_begin(b, SOCK_OP_BCAST, buf, bytes, 1, &c));
    if (b->rank == 0) {
        /* A root other than 0 hands its buffer to rank 0, which passes it on. */
        if (root != 0)
            RS_CHECK_GOTO(exchange(&c, root, -1, 0, bytes, base, 0), st, err_fail);
        RS_CHECK_GOTO(exchange(&c, -1, root, 1, bytes, base, 0), st, err_fail);
    } else {
        RS_CHECK_GOTO(exchange(&c, 0, -1, b->rank == root, bytes, base, 0), st, err_fail);
    }
    return RESHARD_OK;
err_fail:
    return boot_fail(b, st, &c.err);
}

void boot_abort(struct boot *b, reshard_status_t st, const char *msg)
{
    if (!b || b->failed)
        return;
    if (!msg)
        msg = rs_status_string(st);
    tell_others(b, b->label[b->rank], st, msg);
    b->failed = st != RESHARD_OK ? st : RESHARD_ERR_INTERNAL;
    snprintf(b->fail_msg, sizeof(b->fail_msg), "aborted here: %s", msg);
}

reshard_status_t boot_check(struct boot *b)
{
    if (!b)
        return RESHARD_OK;
    if (b->failed)
        return rs_error(b->failed, "bootstrap: %s", b->fail_msg);
    for (int r = 0; r < b->size; r++) {
        struct conn *c = &b->conns[r];
        unsigned char w[SOCK_FRAME_HDR_BYTES];
        struct sock_frame_hdr h;
        int n = sock_peek(c->fd, w, sizeof(w));
        if (n == 0) { /* a rank leaves only through a barrier, or after a failure: it died */
            reshard_status_t st = rs_error(
                RESHARD_ERR_NETWORK, "bootstrap: %s closed the connection (did it die?)", c->name);
            char why[RS_ERROR_MAX];
            snprintf(why, sizeof(why), "%s", rs_error_message());
            if (b->rank == 0)
                tell_others(b, b->label[r], st, why);
            b->failed = st;
            snprintf(b->fail_msg, sizeof(b->fail_msg), "%s", sock_msg_body(why));
            return rs_error(st, "%s", why);
        }
        if (n != (int)sizeof(w) || sock_frame_get_hdr(w, &h) != 0 || h.type != SOCK_FRAME_ERROR)
            continue;
        struct sock_xfer x;
        struct sock_frame_error err = {.origin = -1};
        int failed;
        sock_xfer_init(&x, c->fd, c->name, 0, (struct sock_frame_hdr){0}, NULL);
        reshard_status_t st = sock_xfer_run(&x, 1, rs_now_ms() + ABORT_MAX_MS, ABORT_MAX_MS,
                                            "failure report", &failed, &err);
        if (st == RESHARD_OK) /* (cannot be: an ERROR frame ends as a failure) */
            continue;
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        if (b->rank == 0 && err.origin >= 0)
            tell_others(b, err.origin, err.status, err.text);
        b->failed = st;
        snprintf(b->fail_msg, sizeof(b->fail_msg), "%s", sock_msg_body(why));
        return rs_error(st, "%s", why);
    }
    return RESHARD_OK;
}

reshard_status_t boot_spare_id(const struct boot *b, struct boot_id *id)
{
    union sock_addr a;
    int via = b->rank == 0 ? (b->size > 1 ? 1 : -1) : 0;
    if (via < 0 || sock_local_addr(b->conns[via].fd, &a) != 0) {
        memset(&a, 0, sizeof(a));
        a.in.sin_family = AF_INET; /* alone: nobody will dial it but this process */
        a.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    sock_addr_set_port(&a, 0);
    unsigned char secret[SECRET_BYTES];
    struct boot_id made;
    int fd;
    RS_CHECK(random_bytes(secret, sizeof(secret)));
    RS_CHECK(sock_listen(&a, &fd));
    id_encode(&a, secret, &made);
    reshard_status_t st = registry_add(&made, fd);
    if (st != RESHARD_OK) {
        close(fd);
        return st;
    }
    *id = made;
    return RESHARD_OK;
}

void boot_set_cancel(struct boot *b, const atomic_int *flag)
{
    b->cancel = flag;
}

int boot_rank(const struct boot *b)
{
    return b ? b->rank : -1;
}

int boot_size(const struct boot *b)
{
    return b ? b->size : -1;
}

const char *boot_refusal(const struct boot *b)
{
    return b ? b->refusal : "";
}

void boot_close(struct boot *b)
{
    if (!b)
        return;
    for (int r = 0; r < b->size; r++)
        sock_close(&b->conns[r].fd);
    free(b->conns);
    free(b->label);
    free(b);
}

static struct boot *boot_alloc(int rank, int size, const int *label, int timeout_ms)
{
    struct boot *b = rs_calloc(1, sizeof(*b), "bootstrap");
    if (!b)
        return NULL;
    b->conns = rs_calloc((size_t)size, sizeof(*b->conns), "bootstrap connections");
    b->label = rs_calloc((size_t)size, sizeof(*b->label), "bootstrap connections");
    if (!b->conns || !b->label) {
        free(b->conns);
        free(b->label);
        free(b);
        return NULL;
    }
    for (int r = 0; r < size; r++) {
        b->conns[r].fd = -1;
        b->label[r] = label ? label[r] : r;
    }
    b->rank = rank;
    b->size = size;
    b->timeout_ms = timeout_ms;
    return b;
}

/* ---- rendezvous ---- */

/* A connection that has not said hello yet. */
struct pending {
    int fd;
    char addr[SOCK_ADDR_STR];
    unsigned char hello[HELLO_BYTES];
    struct sock_xfer x;
};

/* Rank 0's state while the ranks arrive. */
struct rendezvous {
    struct boot *b;
    const unsigned char *secret;
    int64_t deadline;
    int lfd, arrived, np, cap;
    struct pending *p;
    struct pollfd *pf;
};

/* Answers a refusal (best effort), closes, and says so: in b->refusal and as a warning. */
static void rv_refuse(struct rendezvous *rv, int *fd, const char *addr, const char *claim,
                      const char *reason)
{
    struct boot *b = rv->b;
    char text[SOCK_FRAME_TEXT_MAX];
    struct rs_saved_error saved;
    struct sock_xfer x;
    int failed, n = snprintf(text, sizeof(text), "%s", reason);
    rs_error_save(&saved);
    sock_xfer_init(&x, *fd, addr, 1,
                   (struct sock_frame_hdr){.type = SOCK_FRAME_REFUSE, .len = (uint64_t)n}, text);
    x.listen = 0;
    sock_xfer_run(&x, 1, rs_now_ms() + 200, 200, "refusal", &failed, NULL);
    rs_error_restore(&saved);
    sock_close(fd);
    snprintf(b->refusal, sizeof(b->refusal), "bootstrap: rank 0 refused a peer at %s%s: %s", addr,
             claim, reason);
    rs_log(RS_LOG_WARN, "%s", b->refusal);
}

static void rv_remove(struct rendezvous *rv, int i)
{
    struct pending *p = &rv->p[i];
    *p = rv->p[--rv->np];
    p->x.data = p->hello; /* the moved transfer pointed into its old slot */
}

static int secret_equal(const unsigned char *a, const unsigned char *b)
{
    unsigned char d = 0;
    for (int i = 0; i < SECRET_BYTES; i++)
        d |= a[i] ^ b[i];
    return d == 0;
}

/* A whole hello is in: admit the peer as its rank, or refuse it. */
static void rv_hello(struct rendezvous *rv, int i)
{
    struct boot *b = rv->b;
    struct pending *p = &rv->p[i];
    unsigned version = (unsigned)sock_wire_get(p->hello, 4);
    int rank = (int)(int32_t)sock_wire_get(p->hello + 4 + SECRET_BYTES, 4);
    int size = (int)(int32_t)sock_wire_get(p->hello + 8 + SECRET_BYTES, 4);
    char claim[64], why[160] = "";
    snprintf(claim, sizeof(claim), " claiming rank %d of %d", rank, size);
    if (version != BOOT_VERSION)
        snprintf(why, sizeof(why), "bootstrap version %u, rank 0 speaks %u", version, BOOT_VERSION);
    else if (!secret_equal(p->hello + 4, rv->secret))
        snprintf(why, sizeof(why), "wrong secret: not part of this job");
    else if (size != b->size)
        snprintf(why, sizeof(why), "the job has %d ranks, not %d", b->size, size);
    else if (rank < 1 || rank >= size)
        snprintf(why, sizeof(why), "rank %d is out of range 1..%d", rank, size - 1);
    else if (b->conns[rank].fd >= 0)
        snprintf(why, sizeof(why), "duplicate rank: %s has already arrived", b->conns[rank].name);
    if (why[0]) {
        rv_refuse(rv, &p->fd, p->addr, claim, why);
    } else {
        b->conns[rank].fd = p->fd;
        snprintf(b->conns[rank].name, sizeof(b->conns[rank].name), "rank %d (%s)", b->label[rank],
                 p->addr);
        rv->arrived++;
    }
    rv_remove(rv, i);
}

static void rv_step(struct rendezvous *rv, int i)
{
    struct pending *p = &rv->p[i];
    if (sock_xfer_step(&p->x, NULL) != RESHARD_OK) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "no valid hello (%s)", sock_msg_body(rs_error_message()));
        rv_refuse(rv, &p->fd, p->addr, "", why);
        rv_remove(rv, i);
    } else if (p->x.finished) {
        rv_hello(rv, i);
    }
}

static reshard_status_t rv_accept(struct rendezvous *rv)
{
    for (;;) {
        union sock_addr a;
        char addr[SOCK_ADDR_STR];
        int fd;
        RS_CHECK(sock_accept(rv->lfd, &fd, &a));
        if (fd < 0)
            return RESHARD_OK;
        sock_addr_str(&a, addr, sizeof(addr));
        /* Stray connections may not crowd out the job's ranks, nor grow memory without end. */
        if (rv->np == rv->cap) {
            rv_refuse(rv, &fd, addr, "", "too many connections are waiting to say hello");
            continue;
        }
        struct pending *p = &rv->p[rv->np++];
        p->fd = fd;
        memcpy(p->addr, addr, sizeof(addr));
        sock_xfer_init(&p->x, fd, "the peer", 0,
                       (struct sock_frame_hdr){.type = SOCK_FRAME_HELLO, .len = HELLO_BYTES},
                       p->hello);
    }
}

/* "bootstrap: ranks 3, 5 of 6 did not arrive within 2 s". */
static reshard_status_t rv_timeout(struct rendezvous *rv)
{
    struct boot *b = rv->b;
    char list[RS_ERROR_MAX] = "", ms[32];
    size_t used = 0;
    int missing = 0;
    for (int r = 1; r < b->size; r++) {
        if (b->conns[r].fd >= 0 || missing++ >= MISSING_LISTED)
            continue;
        int k = snprintf(list + used, sizeof(list) - used, "%s%d", used ? ", " : "", b->label[r]);
        used += k > 0 && (size_t)k < sizeof(list) - used ? (size_t)k : 0;
    }
    if (missing > MISSING_LISTED)
        snprintf(list + used, sizeof(list) - used, " and %d more", missing - MISSING_LISTED);
    return rs_error(RESHARD_ERR_TIMEOUT, "bootstrap: %s %s of %d did not arrive within %s%s%s",
                    missing == 1 ? "rank" : "ranks", list, b->size,
                    sock_ms_str(b->timeout_ms, ms, sizeof(ms)), b->refusal[0] ? "; " : "",
                    sock_msg_body(b->refusal));
}

static reshard_status_t rv_run(struct rendezvous *rv)
{
    while (rv->arrived < rv->b->size - 1) {
        int n = 0, ready;
        rv->pf[n++] = (struct pollfd){.fd = rv->lfd, .events = POLLIN};
        for (int i = 0; i < rv->np; i++)
            rv->pf[n++] = (struct pollfd){.fd = rv->p[i].fd, .events = POLLIN};
        RS_CHECK(sock_poll(rv->pf, n, rv->deadline, &ready));
        if (ready == 0)
            return rv_timeout(rv);
        /* Downwards, so that removing entry i moves one already seen into its place. */
        for (int i = rv->np - 1; i >= 0; i--)
            if (rv->pf[1 + i].revents)
                rv_step(rv, i);
        if (rv->pf[0].revents)
            RS_CHECK(rv_accept(rv));
    }
    return RESHARD_OK;
}

/* Rank 0 without a socket from boot_id_create here: the id's port, on every address. */
static reshard_status_t listen_any(const union sock_addr *a, int *fd)
{
    union sock_addr any;
    memset(&any, 0, sizeof(any));
    any.sa.sa_family = a->sa.sa_family;
    if (a->sa.sa_family == AF_INET6)
        any.in6.sin6_addr = in6addr_any;
    else
        any.in.sin_addr.s_addr = htonl(INADDR_ANY);
    sock_addr_set_port(&any, sock_addr_port(a));
    return sock_listen(&any, fd);
}

static reshard_status_t rank0_rendezvous(struct boot *b, const struct boot_id *id,
                                         const union sock_addr *a, const unsigned char *secret,
                                         int64_t deadline)
{
    struct rendezvous rv = {.b = b,
                            .secret = secret,
                            .deadline = deadline,
                            .lfd = registry_take(id),
                            .cap = b->size - 1 + PENDING_EXTRA};
    struct coll c = {.b = b,
                     .hdr = {.type = SOCK_FRAME_WELCOME},
                     .deadline = deadline,
                     .what = "rendezvous on rank 0",
                     .err = {.origin = -1}};
    reshard_status_t st = RESHARD_OK;
    if (rv.lfd < 0)
        RS_CHECK(listen_any(a, &rv.lfd));
    rv.p = rs_calloc((size_t)rv.cap, sizeof(*rv.p), "bootstrap pending connections");
    rv.pf = rv.p ? rs_calloc((size_t)rv.cap + 1, sizeof(*rv.pf), "bootstrap poll set") : NULL;
    if (!rv.pf)
        st = RESHARD_ERR_NO_MEMORY;
    if (st == RESHARD_OK)
        st = rv_run(&rv);
    if (st == RESHARD_OK)
        st = exchange(&c, -1, -1, 1, 0, (unsigned char *)"", 0);
    for (int i = rv.np - 1; i >= 0; i--) {
        rv_refuse(&rv, &rv.p[i].fd, rv.p[i].addr, "",
                  st == RESHARD_OK ? "every rank has arrived" : "the rendezvous failed");
        rv_remove(&rv, i);
    }
    free(rv.pf);
    free(rv.p);
    sock_close(&rv.lfd);
    return st == RESHARD_OK ? st : boot_fail(b, st, NULL);
}

static reshard_status_t peer_join(struct boot *b, const union sock_addr *a,
                                  const unsigned char *secret, int64_t deadline)
{
    struct conn *c0 = &b->conns[0];
    unsigned char hello[HELLO_BYTES];
    char addr[SOCK_ADDR_STR];
    struct coll c = {
        .b = b, .hdr = {.type = SOCK_FRAME_HELLO}, .deadline = deadline, .err = {.origin = -1}};
    snprintf(c0->name, sizeof(c0->name), "rank %d (%s)", b->label[0],
             sock_addr_str(a, addr, sizeof(addr)));
    snprintf(c.what, sizeof(c.what), "rendezvous on rank %d", b->label[b->rank]);
    RS_CHECK(sock_connect(a, "rank 0", deadline, b->timeout_ms, &c0->fd));
    sock_wire_put(hello, BOOT_VERSION, 4);
    memcpy(hello + 4, secret, SECRET_BYTES);
    sock_wire_put(hello + 4 + SECRET_BYTES, (uint32_t)b->rank, 4);
    sock_wire_put(hello + 8 + SECRET_BYTES, (uint32_t)b->size, 4);
    RS_CHECK(exchange(&c, 0, -1, 1, HELLO_BYTES, hello, 0));
    c.hdr.type = SOCK_FRAME_WELCOME;
    return exchange(&c, 0, -1, 0, 0, hello, 0);
}

reshard_status_t boot_init(const struct boot_id *id, int rank, int size, int timeout_ms,
                           struct boot **out)
{
    return boot_init_labeled(id, rank, size, NULL, timeout_ms, out);
}

reshard_status_t boot_init_labeled(const struct boot_id *id, int rank, int size, const int *label,
                                   int timeout_ms, struct boot **out)
{
    union sock_addr a;
    unsigned char secret[SECRET_BYTES];
    struct boot *b;
    reshard_status_t st;
    if (!id || !out || size < 1 || rank < 0 || rank >= size || timeout_ms <= 0)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: init of rank %d of %d with a %d ms timeout: needs an id, "
                        "0 <= rank < size and a positive timeout",
                        rank, size, timeout_ms);
    if (id_decode(id, &a, secret) != 0)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: rank %d was given something that is "
                        "not a bootstrap id of this version",
                        rank);
    if (!(b = boot_alloc(rank, size, label, timeout_ms)))
        return RESHARD_ERR_NO_MEMORY;
    int64_t deadline = rs_now_ms() + timeout_ms;
    if (rank == 0)
        RS_CHECK_GOTO(rank0_rendezvous(b, id, &a, secret, deadline), st, err_close);
    else
        RS_CHECK_GOTO(peer_join(b, &a, secret, deadline), st, err_close);
    *out = b;
    return RESHARD_OK;
err_close:
    boot_close(b);
    return st;
}
