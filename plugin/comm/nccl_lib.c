/* SPDX-License-Identifier: Apache-2.0 */
#include "nccl_lib.h"

#include "base/dl.h"
#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

static struct nccl_fns fns;

static const struct rs_dl_sym nccl_syms[] = {
    {"ncclGroupStart", offsetof(struct nccl_fns, group_start), RS_DL_REQUIRED},
    {"ncclGroupEnd", offsetof(struct nccl_fns, group_end), RS_DL_REQUIRED},
    {"ncclSend", offsetof(struct nccl_fns, send), RS_DL_REQUIRED},
    {"ncclRecv", offsetof(struct nccl_fns, recv), RS_DL_REQUIRED},
    {"ncclCommUserRank", offsetof(struct nccl_fns, comm_user_rank), RS_DL_REQUIRED},
    {"ncclCommCount", offsetof(struct nccl_fns, comm_count), RS_DL_REQUIRED},
    {"ncclAllGather", offsetof(struct nccl_fns, all_gather), RS_DL_REQUIRED},
    {"ncclGetErrorString", offsetof(struct nccl_fns, get_error_string), RS_DL_REQUIRED},
};

/* The process's own NCCL first (PyTorch and vLLM load one): its communicators are the ones
 * the user hands us. */
static struct rs_dl nccl_dl = {
    .what = "nccl",
    .file = RS_PARAM_NCCL_LIB,
    .fallback = "libnccl.so.2",
    .probe = "ncclSend",
    .syms = nccl_syms,
    .nsyms = sizeof(nccl_syms) / sizeof(nccl_syms[0]),
    .table = &fns,
    .table_size = sizeof(fns),
};

const struct nccl_fns *nccl_lib(void)
{
    return rs_dl_load(&nccl_dl);
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
