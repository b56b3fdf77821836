/* SPDX-License-Identifier: Apache-2.0 */
#include "nccl_lib.h"

#include "base/error.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct nccl_fns fns;
static reshard_status_t load_status = RESHARD_ERR_UNAVAILABLE;
static char load_error[256];
static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static const struct {
    const char *symbol;
    size_t offset;
} symbols[] = {
    {"ncclGroupStart", offsetof(struct nccl_fns, group_start)},
    {"ncclGroupEnd", offsetof(struct nccl_fns, group_end)},
    {"ncclSend", offsetof(struct nccl_fns, send)},
    {"ncclRecv", offsetof(struct nccl_fns, recv)},
    {"ncclCommUserRank", offsetof(struct nccl_fns, comm_user_rank)},
    {"ncclCommCount", offsetof(struct nccl_fns, comm_count)},
    {"ncclAllGather", offsetof(struct nccl_fns, all_gather)},
    {"ncclGetErrorString", offsetof(struct nccl_fns, get_error_string)},
};

static void load(void)
{
    /* The process's own NCCL first (PyTorch and vLLM load one): its communicators are the
     * ones the user hands us. */
    const char *file = getenv("RESHARD_NCCL_LIB");
    void *h = NULL;
    if (!file || !*file) {
        if (dlsym(RTLD_DEFAULT, "ncclSend"))
            h = RTLD_DEFAULT;
        file = "libnccl.so.2";
    }
    if (!h && !(h = dlopen(file, RTLD_NOW | RTLD_LOCAL))) {
        snprintf(load_error, sizeof(load_error), "nccl: %s%s",
                 getenv("RESHARD_NCCL_LIB") ? "" : "none loaded in this process, and ", dlerror());
        return;
    }
    for (size_t i = 0; i < sizeof(symbols) / sizeof(symbols[0]); i++) {
        void *p = dlsym(h, symbols[i].symbol);
        if (!p) {
            snprintf(load_error, sizeof(load_error), "nccl: %s lacks %s", file, symbols[i].symbol);
            return;
        }
        memcpy((char *)&fns + symbols[i].offset, &p, sizeof(p));
    }
    load_status = RESHARD_OK;
}

const struct nccl_fns *nccl_lib(void)
{
    pthread_once(&load_once, load);
    if (load_status != RESHARD_OK) {
        rs_error(load_status, "%s", load_error);
        return NULL;
    }
    return &fns;
}

reshard_status_t nccl_error(const struct nccl_fns *f, nccl_result r, const char *fmt, ...)
{
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    const char *s = f && f->get_error_string ? f->get_error_string(r) : NULL;
    return rs_error(RESHARD_ERR_NETWORK, "nccl: %s: %s (%d)", what, s ? s : "error", r);
}
