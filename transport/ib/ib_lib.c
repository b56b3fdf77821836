/* SPDX-License-Identifier: Apache-2.0 */
#include "ib_lib.h"

#include "base/error.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static struct ib_fns fns;
static reshard_status_t load_status = RESHARD_ERR_UNAVAILABLE;
static char load_error[256];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load(void)
{
    /* RESHARD_IB_LIB names another file (tests use it to hide rdma-core). */
    const char *file = getenv("RESHARD_IB_LIB");
    if (!file || !*file)
        file = "libibverbs.so.1";
    void *h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(load_error, sizeof(load_error), "ibverbs: %s (install libibverbs1)", dlerror());
        return;
    }
#define IB_FN_LOAD_(name)                                                                          \
    if (!(*(void **)&fns.name = dlsym(h, "ibv_" #name))) {                                         \
        snprintf(load_error, sizeof(load_error), "ibverbs: %s lacks ibv_%s", file, #name);         \
        return;                                                                                    \
    }
    IB_FN_MAP(IB_FN_LOAD_)
#undef IB_FN_LOAD_
    *(void **)&fns.reg_dmabuf_mr = dlsym(h, "ibv_reg_dmabuf_mr");
    load_status = RESHARD_OK;
}

const struct ib_fns *ib_lib(void)
{
    pthread_once(&load_once, load);
    if (load_status != RESHARD_OK) {
        rs_error(load_status, "%s", load_error);
        return NULL;
    }
    return &fns;
}
