/* SPDX-License-Identifier: Apache-2.0 */
#include "ucx_lib.h"

#include "base/dl.h"
#include "base/error.h"
#include "base/log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
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

/* UCX cannot run again in a child forked after it started in the parent (UCX issues 4325 and
 * 10748: the child hangs or aborts): its async thread, which accepts the transport's
 * connections, stays with the parent, and the epoll set it waits on is shared with the child,
 * so the child's new worker never hears of its own connections, or the parent's thread hears
 * of them instead. A child that needs UCX therefore loads a private copy into a namespace of
 * its own (dlmopen), whose state starts fresh; the copy the parent used is never called again
 * from the child (its objects are the parent's, net_dev.c). */
static pthread_mutex_t private_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t shared_user; /* the process that started the shared copy */
static pid_t private_for; /* the process private_fns was loaded for */
static struct ucx_fns private_fns;

/* The private copy for a forked child; NULL with the reason recorded. private_lock held. */
static const struct ucx_fns *load_private(void)
{
    const char *file = rs_param_str(RS_PARAM_UCX_LIB);
    void *h = dlmopen(LM_ID_NEWLM, *file ? file : "libucp.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        rs_error(RESHARD_ERR_UNAVAILABLE,
                 "UCX: process %d was forked from one that had started UCX, and a private copy "
                 "for it would not load: %s",
                 (int)getpid(), dlerror());
        return NULL;
    }
    struct ucx_fns t;
    for (size_t i = 0; i < sizeof(ucx_syms) / sizeof(ucx_syms[0]); i++) {
        void *p = dlsym(h, ucx_syms[i].name);
        if (!p) {
            rs_error(RESHARD_ERR_UNAVAILABLE, "UCX: the private copy for a forked child lacks %s",
                     ucx_syms[i].name);
            return NULL; /* left loaded: unloading a namespace is not worth the risk */
        }
        memcpy((char *)&t + ucx_syms[i].offset, &p, sizeof(p));
    }
    private_fns = t;
    private_for = getpid();
    rs_log(RS_LOG_INFO,
           "UCX: process %d was forked from one that had started UCX, which cannot run twice "
           "in one copy across a fork: it uses a private copy of the library (dlmopen)",
           (int)getpid());
    return &private_fns;
}

const struct ucx_fns *ucx_lib(void)
{
    const struct ucx_fns *f = rs_dl_load(&ucx_dl);
    if (!f)
        return NULL;
    pid_t me = getpid();
    pthread_mutex_lock(&private_lock);
    if (!shared_user)
        shared_user = me; /* every caller goes on to start UCX */
    if (shared_user != me)
        f = private_for == me ? &private_fns : load_private();
    pthread_mutex_unlock(&private_lock);
    return f;
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
