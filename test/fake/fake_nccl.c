/* SPDX-License-Identifier: Apache-2.0 */
/* libnccl.so.2's calls that reshard makes, over a shared mapping (see fake_nccl.h): point to
 * point messages per ordered pair, in the order they were posted, sizes checked. */
#include "fake_nccl.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define API __attribute__((visibility("default")))
enum { OK = 0, INVALID_USAGE = 5 };

static struct pending {
    int send, peer;
    void *buf;
    size_t len;
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
    for (int i = 0; i < npending; i++) {
        struct pending *p = &pending[i];
        if (!p->send)
            continue;
        size_t off = atomic_fetch_add(&sh->used, p->len);
        int *t = &sh->tail[c->rank][p->peer];
        if (off + p->len > sizeof(sh->arena) || *t >= FAKE_QUEUE) {
            rc = INVALID_USAGE;
            break;
        }
        memcpy(sh->arena + off, p->buf, p->len);
        sh->q[c->rank][p->peer][*t] = (struct fake_msg){off, p->len};
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
            sh->q[p->peer][c->rank][*h].len != p->len) {
            fprintf(stderr, "fake nccl: rank %d: receive of %zu bytes from %d unmatched\n", c->rank,
                    p->len, p->peer);
            rc = INVALID_USAGE;
            break;
        }
        memcpy(p->buf, sh->arena + sh->q[p->peer][c->rank][(*h)++].off, p->len);
    }
    sh->groups[c->rank]++;
    sh->ops[c->rank] += npending;
    npending = 0;
    if (c->size == 1) /* alone, everything sent was taken: the arena is free again */
        atomic_store(&sh->used, 0);
    return rc;
}

static int post(int send, void *buf, size_t count, int dt, int peer, void *comm)
{
    struct fake_nccl_comm *c = comm;
    if (dt != 1 || depth == 0 || peer < 0 || peer >= c->size || npending == 65536)
        return INVALID_USAGE;
    group_comm = c;
    pending[npending++] = (struct pending){send, peer, buf, count};
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
    if (dt != 1 || count > 4096)
        return INVALID_USAGE;
    memcpy(c->sh->gather + (size_t)c->rank * count, send, count);
    barrier(c->sh);
    memcpy(recv, c->sh->gather, (size_t)c->size * count);
    barrier(c->sh);
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

/* A communicator of one rank for tools that make their own (nccl_check). */
API int ncclGetUniqueId(void *id)
{
    memset(id, 0, 128);
    return OK;
}

struct unique_id {
    char internal[128]; /* ncclUniqueId, passed by value */
};

API int ncclCommInitRank(void **comm, int n, struct unique_id id, int rank)
{
    (void)id;
    if (n != 1 || rank != 0)
        return INVALID_USAGE; /* more ranks need the test's shared mapping */
    struct fake_nccl_comm *c = calloc(1, sizeof(*c));
    struct fake_shared *sh = calloc(1, sizeof(*sh));
    if (!c || !sh)
        return 1;
    sh->size = 1;
    *c = (struct fake_nccl_comm){0, 1, sh};
    *comm = c;
    return OK;
}

API int ncclCommDestroy(void *comm)
{
    struct fake_nccl_comm *c = comm;
    free(c->sh);
    free(c);
    return OK;
}
