/* SPDX-License-Identifier: Apache-2.0 */
/* libnccl.so.2's calls that reshard and nccl_net_check make, over a shared mapping (see
 * fake_nccl.h): point to point messages per ordered pair, in the order they were posted, sizes
 * checked; all-gather, and the all-reduce of float and int32 sums. A group holds at most
 * FAKE_MAX_OPS operations on a rank, the strictest NCCL's limit; a send waits (10 s at most)
 * for room while its pair's queue or the arena is full, as NCCL's sends wait for the peer. */
#define _GNU_SOURCE /* ftruncate, %m */
#include "fake_nccl.h"

#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))
enum { OK = 0, SYSTEM_ERROR = 2, INVALID_ARGUMENT = 4, INVALID_USAGE = 5 };
enum { NCCL_INT32 = 2, NCCL_FLOAT32 = 7, NCCL_SUM = 0 };

/* The bytes of an ncclDataType_t's element; 0 for one NCCL does not have. */
static size_t elt_size(int dt)
{
    static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2}; /* int8 .. bfloat16 */
    return dt >= 0 && dt < (int)(sizeof(sizes) / sizeof(sizes[0])) ? sizes[dt] : 0;
}

static struct pending {
    int send, peer;
    void *buf;
    size_t len;
    int dt;
} pending[65536];
static int npending, depth;
static struct fake_nccl_comm *group_comm;

static void barrier(struct fake_shared *sh)
{
    int sense = atomic_load(&sh->sense);
    if (atomic_fetch_add(&sh->arrived, 1) == sh->size - 1) {
        atomic_store(&sh->arrived, 0);
        atomic_store(&sh->sense, !sense);
    } else {
        while (atomic_load(&sh->sense) == sense)
            sched_yield();
    }
}

static void arena_lock(struct fake_shared *sh)
{
    int free_ = 0;
    while (!atomic_compare_exchange_weak(&sh->arena_lock, &free_, 1)) {
        free_ = 0;
        sched_yield();
    }
}

/* FAKE_NCCL_CORRUPT=<call> (ncclAllReduce, ncclAllGather or ncclRecv): the last rank's result
 * of that call has one bit of its last element flipped, so that a caller's check of every
 * element can be seen to fail (test_gpu_check.c). Never the int32 sums callers count with. */
static void corrupt(const char *call, const struct fake_nccl_comm *c, void *buf, size_t len, int dt)
{
    const char *which = getenv("FAKE_NCCL_CORRUPT");
    size_t elt = elt_size(dt);
    if (which && !strcmp(which, call) && c->rank == c->size - 1 && dt != NCCL_INT32 && len >= elt)
        ((unsigned char *)buf)[len - elt] ^= 1;
}

/* Room for len bytes in the arena, which is a ring: messages are taken out of order across
 * pairs, so the space before the oldest message not yet taken is reused. Returns the offset and
 * the message's region, or SIZE_MAX when the messages in flight fill it. */
static size_t arena_take(struct fake_shared *sh, size_t len, unsigned *region)
{
    const size_t size = sizeof(sh->arena);
    size_t off = SIZE_MAX;
    arena_lock(sh);
    while (sh->rhead != sh->rtail && sh->regions[sh->rhead % FAKE_REGIONS].taken)
        sh->rhead++;
    size_t end = atomic_load(&sh->used);
    if (sh->rhead == sh->rtail) {
        off = len <= size ? 0 : SIZE_MAX;
    } else if (sh->rtail - sh->rhead < FAKE_REGIONS) {
        size_t oldest = sh->regions[sh->rhead % FAKE_REGIONS].off;
        size_t newest = sh->regions[(sh->rtail - 1) % FAKE_REGIONS].off;
        if (newest >= oldest) /* free: from the end to the arena's end, then up to the oldest */
            off = end + len <= size ? end : len <= oldest ? 0 : SIZE_MAX;
        else /* wrapped: free between the newest's end and the oldest */
            off = end + len <= oldest ? end : SIZE_MAX;
    }
    if (off != SIZE_MAX) {
        *region = sh->rtail++;
        sh->regions[*region % FAKE_REGIONS] = (struct fake_region){off, len, 0};
        atomic_store(&sh->used, off + len);
    }
    atomic_store(&sh->arena_lock, 0);
    return off;
}

static void arena_give(struct fake_shared *sh, unsigned region)
{
    arena_lock(sh);
    sh->regions[region % FAKE_REGIONS].taken = 1;
    atomic_store(&sh->arena_lock, 0);
}

API int ncclGroupStart(void)
{
    depth++;
    return OK;
}

/* Sends go into the mapping at once; each receive then waits (10 s at most) for the message
 * its peer posted in the matching position. A lowering whose groups did not match would wait
 * here, as it would deadlock in NCCL: the timeout turns that into an error. */
API int ncclGroupEnd(void)
{
    if (depth == 0)
        return INVALID_USAGE;
    if (--depth > 0)
        return OK;
    struct fake_nccl_comm *c = group_comm;
    group_comm = NULL;
    if (!c) /* an empty group */
        return OK;
    struct fake_shared *sh = c->sh;
    int rc = OK;
    if (npending > FAKE_MAX_OPS) {
        fprintf(stderr,
                "fake nccl: rank %d: %d operations in one group, more than NCCL_MAX_OPS (%d)\n",
                c->rank, npending, FAKE_MAX_OPS);
        rc = INVALID_USAGE;
    }
    for (int i = 0; i < npending && rc == OK; i++) {
        struct pending *p = &pending[i];
        if (!p->send)
            continue;
        unsigned region = 0;
        int *t = &sh->tail[c->rank][p->peer];
        const int *h = &sh->head[c->rank][p->peer];
        size_t off = SIZE_MAX;
        time_t until = time(NULL) + 10;
        while ((*t - __atomic_load_n(h, __ATOMIC_ACQUIRE) >= FAKE_QUEUE ||
                (off = arena_take(sh, p->len, &region)) == SIZE_MAX) &&
               time(NULL) < until)
            sched_yield();
        if (off == SIZE_MAX) {
            fprintf(stderr, "fake nccl: rank %d: no room for %zu bytes to %d in 10 s\n", c->rank,
                    p->len, p->peer);
            rc = INVALID_USAGE;
            break;
        }
        memcpy(sh->arena + off, p->buf, p->len);
        sh->q[c->rank][p->peer][*t % FAKE_QUEUE] = (struct fake_msg){off, p->len, region};
        __atomic_store_n(t, *t + 1, __ATOMIC_RELEASE);
    }
    for (int i = 0; i < npending && rc == OK; i++) {
        struct pending *p = &pending[i];
        if (p->send)
            continue;
        int *h = &sh->head[p->peer][c->rank];
        time_t until = time(NULL) + 10;
        while (__atomic_load_n(&sh->tail[p->peer][c->rank], __ATOMIC_ACQUIRE) <= *h &&
               time(NULL) < until)
            sched_yield();
        if (__atomic_load_n(&sh->tail[p->peer][c->rank], __ATOMIC_ACQUIRE) <= *h ||
            sh->q[p->peer][c->rank][*h % FAKE_QUEUE].len != p->len) {
            fprintf(stderr, "fake nccl: rank %d: receive of %zu bytes from %d unmatched\n", c->rank,
                    p->len, p->peer);
            rc = INVALID_USAGE;
            break;
        }
        const struct fake_msg *m = &sh->q[p->peer][c->rank][*h % FAKE_QUEUE];
        memcpy(p->buf, sh->arena + m->off, p->len);
        arena_give(sh, m->region);
        __atomic_store_n(h, *h + 1, __ATOMIC_RELEASE); /* the slot may be used again */
        corrupt("ncclRecv", c, p->buf, p->len, p->dt);
    }
    sh->groups[c->rank]++;
    sh->ops[c->rank] += npending;
    npending = 0;
    return rc;
}

static int post(int send, void *buf, size_t count, int dt, int peer, void *comm)
{
    struct fake_nccl_comm *c = comm;
    if (!elt_size(dt) || depth == 0 || peer < 0 || peer >= c->size || npending == 65536)
        return INVALID_USAGE;
    group_comm = c;
    pending[npending++] = (struct pending){send, peer, buf, count * elt_size(dt), dt};
    return OK;
}

API int ncclSend(const void *buf, size_t count, int dt, int peer, void *comm, void *stream)
{
    (void)stream;
    return post(1, (void *)buf, count, dt, peer, comm);
}

API int ncclRecv(void *buf, size_t count, int dt, int peer, void *comm, void *stream)
{
    (void)stream;
    return post(0, buf, count, dt, peer, comm);
}

API int ncclCommUserRank(void *comm, int *rank)
{
    *rank = ((struct fake_nccl_comm *)comm)->rank;
    return OK;
}

API int ncclCommCount(void *comm, int *count)
{
    *count = ((struct fake_nccl_comm *)comm)->size;
    return OK;
}

API int ncclAllGather(const void *send, void *recv, size_t count, int dt, void *comm, void *stream)
{
    (void)stream;
    struct fake_nccl_comm *c = comm;
    size_t len = count * elt_size(dt);
    if (!elt_size(dt) || len > FAKE_COLL)
        return INVALID_USAGE;
    memcpy(c->sh->coll[c->rank], send, len);
    barrier(c->sh);
    for (int r = 0; r < c->size; r++)
        memcpy((char *)recv + (size_t)r * len, c->sh->coll[r], len);
    barrier(c->sh); /* nobody writes its part again before everyone has read it */
    corrupt("ncclAllGather", c, recv, (size_t)c->size * len, dt);
    return OK;
}

/* Sums of float (exact while the values are small integers, as the callers' are) and int32. */
API int ncclAllReduce(const void *send, void *recv, size_t count, int dt, int op, void *comm,
                      void *stream)
{
    (void)stream;
    struct fake_nccl_comm *c = comm;
    size_t len = count * elt_size(dt);
    if ((dt != NCCL_FLOAT32 && dt != NCCL_INT32) || op != NCCL_SUM || len > FAKE_COLL)
        return INVALID_USAGE;
    memcpy(c->sh->coll[c->rank], send, len);
    barrier(c->sh);
    for (size_t i = 0; i < count; i++) {
        if (dt == NCCL_FLOAT32) {
            float sum = 0;
            for (int r = 0; r < c->size; r++)
                sum += ((const float *)(const void *)c->sh->coll[r])[i];
            ((float *)recv)[i] = sum;
        } else {
            int32_t sum = 0;
            for (int r = 0; r < c->size; r++)
                sum += ((const int32_t *)(const void *)c->sh->coll[r])[i];
            ((int32_t *)recv)[i] = sum;
        }
    }
    barrier(c->sh);
    corrupt("ncclAllReduce", c, recv, len, dt);
    return OK;
}

API const char *ncclGetErrorString(int r)
{
    return r == INVALID_USAGE ? "invalid usage" : "unknown";
}

/* For tests that make the shared mapping from another language (Python's mmap). */
API size_t fake_nccl_shared_bytes(void)
{
    return sizeof(struct fake_shared);
}

API int ncclGetVersion(int *version)
{
    *version = 0; /* no NCCL release: callers print it as the stand-in */
    return OK;
}

/* The id names the file that the communicator's ranks map (made by the first to come, removed
 * by rank 0 once all have it), so that tools which make their own communicator (nccl_check,
 * nccl_net_check) run on the stand-in as on NCCL. */
API int ncclGetUniqueId(void *id)
{
    static int made;
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    memset(id, 0, 128);
    snprintf(id, 128, "%s/fake-nccl-%d-%d", dir, (int)getpid(), made++);
    return OK;
}

struct unique_id {
    char internal[128]; /* ncclUniqueId, passed by value */
};

/* The communicators ncclCommInitRank mapped (the tests' own are theirs to free). */
static struct fake_nccl_comm *mapped[64];

static int init_alone(void **comm)
{
    struct fake_nccl_comm *c = calloc(1, sizeof(*c));
    struct fake_shared *sh = calloc(1, sizeof(*sh));
    if (!c || !sh) {
        free(c);
        free(sh);
        return SYSTEM_ERROR;
    }
    sh->size = 1;
    *c = (struct fake_nccl_comm){0, 1, sh};
    *comm = c;
    return OK;
}

API int ncclCommInitRank(void **comm, int n, struct unique_id id, int rank)
{
    if (n < 1 || n > FAKE_RANKS || rank < 0 || rank >= n || !memchr(id.internal, 0, 128))
        return INVALID_ARGUMENT;
    if (n == 1)
        return init_alone(comm);
    int fd = open(id.internal, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, sizeof(struct fake_shared)) != 0) {
        fprintf(stderr, "fake nccl: rank %d: %s: %m\n", rank, id.internal);
        if (fd >= 0)
            close(fd);
        return SYSTEM_ERROR;
    }
    struct fake_shared *sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    struct fake_nccl_comm *c = calloc(1, sizeof(*c));
    if (sh == MAP_FAILED || !c) {
        if (sh != MAP_FAILED)
            munmap(sh, sizeof(*sh));
        free(c);
        return SYSTEM_ERROR;
    }
    sh->size = n; /* every rank writes the same */
    atomic_fetch_add(&sh->joined, 1);
    time_t until = time(NULL) + 60;
    while (atomic_load(&sh->joined) < n && time(NULL) < until)
        sched_yield();
    if (atomic_load(&sh->joined) < n) {
        fprintf(stderr, "fake nccl: rank %d: %d of %d ranks came to %s in 60 s\n", rank,
                atomic_load(&sh->joined), n, id.internal);
        munmap(sh, sizeof(*sh));
        free(c);
        return SYSTEM_ERROR;
    }
    if (rank == 0)
        unlink(id.internal); /* everyone has it mapped */
    *c = (struct fake_nccl_comm){rank, n, sh};
    for (size_t i = 0; i < sizeof(mapped) / sizeof(mapped[0]); i++)
        if (!mapped[i]) {
            mapped[i] = c;
            break;
        }
    *comm = c;
    return OK;
}

API int ncclCommFinalize(void *comm)
{
    (void)comm;
    return OK;
}

API int ncclCommDestroy(void *comm)
{
    struct fake_nccl_comm *c = comm;
    size_t i = 0, n = sizeof(mapped) / sizeof(mapped[0]);
    while (i < n && mapped[i] != c)
        i++;
    if (i < n) {
        mapped[i] = NULL;
        munmap(c->sh, sizeof(*c->sh));
    } else {
        free(c->sh);
    }
    free(c);
    return OK;
}
