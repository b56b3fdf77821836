/* SPDX-License-Identifier: Apache-2.0 */
#include "ucx_lib.h"

#include "base/error.h"

#include <dlfcn.h>
#include <pthread.h>

static struct ucx_fns fns;
static reshard_status_t load_status = RESHARD_ERR_UNAVAILABLE;
static char load_error[256];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void)
{
    /* RTLD_LOCAL keeps libucp's symbols out of the global scope; an application that already
     * loaded UCX shares its copy with us (same soname). */
    void *h = dlopen("libucp.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_error, sizeof(load_error), "UCX: %s (install libucx0)", dlerror());
        return;
    }
#define UCX_FN_LOAD_(name)                                                                         \
    if (!(*(void **)&fns.name = dlsym(h, #name))) {                                                \
        snprintf(load_error, sizeof(load_error), "UCX: libucp.so.0 lacks %s", #name);              \
        return;                                                                                    \
    }
    UCX_FN_MAP(UCX_FN_LOAD_)
#undef UCX_FN_LOAD_
    load_status = RESHARD_OK;
}

const struct ucx_fns *ucx_lib(void)
{
    pthread_once(&load_once, load);
    if (load_status != RESHARD_OK) {
        rs_error(load_status, "%s", load_error);
        return NULL;
    }
    return &fns;
}

reshard_status_t ucx_status(ucs_status_t st)
{
    switch (st) {
    case UCS_OK:
        return RESHARD_OK;
    case UCS_ERR_NO_MEMORY:
        return RESHARD_ERR_NO_MEMORY;
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
