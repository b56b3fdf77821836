/* SPDX-License-Identifier: Apache-2.0 */
#include "ucx_lib.h"

#include "base/dl.h"
#include "base/error.h"

#include <pthread.h>
#include <unistd.h>

static struct ucx_fns fns;

static const struct rs_dl_sym ucx_syms[] = {
#define UCX_SYM_(name) {#name, offsetof(struct ucx_fns, name), RS_DL_REQUIRED},
    UCX_FN_MAP(UCX_SYM_)
#undef UCX_SYM_
};

/* An application that already loaded UCX shares its copy with us (the same soname). */
static struct rs_dl ucx_dl = {
    .what = "UCX",
    .file = RS_PARAM_UCX_LIB,
    .fallback = "libucp.so.0",
    .open_hint = " (install libucx0)",
    .syms = ucx_syms,
    .nsyms = sizeof(ucx_syms) / sizeof(ucx_syms[0]),
    .table = &fns,
    .table_size = sizeof(fns),
};

/* UCX cannot start again in a child forked after it started in the parent (UCX issues 4325 and
 * 10748: the child hangs or aborts, and so may the parent): its async thread, which accepts the
 * transport's connections, stays with the parent while the child's copy believes it runs, and
 * the epoll set it waits on is shared with the child. A private copy of the library for the
 * child (dlmopen) was tried and is no way out: the copies' C libraries share ld.so's cache of
 * thread stacks, so the child's first thread frees the parent's thread-local blocks into the
 * wrong heap (ASan: munmap_chunk(): invalid pointer in pthread_create). So in such a child UCX
 * is unavailable, saying why; its callers offer no device or fail to form (their messages
 * carry this one), and never touch what the parent made. */
static pthread_mutex_t started_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t started_in; /* the process that went on to start UCX (0: none yet) */

const struct ucx_fns *ucx_lib(void)
{
    const struct ucx_fns *f = rs_dl_load(&ucx_dl);
    if (!f)
        return NULL;
    pid_t me = getpid(), first;
    pthread_mutex_lock(&started_lock);
    if (!started_in)
        started_in = me; /* every caller goes on to start UCX */
    first = started_in;
    pthread_mutex_unlock(&started_lock);
    if (first == me)
        return f;
    rs_error(RESHARD_ERR_UNAVAILABLE,
             "UCX: process %d was forked from process %d after UCX started there, and UCX cannot "
             "start again in a forked child (its async thread stays with the parent); start this "
             "process with exec, or fork before the first communicator or NCCL init",
             (int)me, (int)first);
    return NULL;
}

reshard_status_t ucx_status(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return RESHARD_OK;
    case UCS_ERR_NO_MEMORY:
        return RESHARD_ERR_NO_MEMORY;
    case UCS_ERR_MESSAGE_TRUNCATED: /* a receive smaller than its message */
        return RESHARD_ERR_TOO_LARGE;
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_REJECTED:
    case UCS_ERR_TIMED_OUT:
    case UCS_ERR_CANCELED:
        return RESHARD_ERR_NETWORK;
    case UCS_ERR_NO_DEVICE:
    case UCS_ERR_NO_RESOURCE:
    case UCS_ERR_UNSUPPORTED:
        return RESHARD_ERR_UNAVAILABLE;
    default:
        return RESHARD_ERR_INTERNAL;
    }
}
