/* SPDX-License-Identifier: Apache-2.0 */
#include "ucx_lib.h"

#include "base/dl.h"

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

const struct ucx_fns *ucx_lib(void)
{
    return rs_dl_load(&ucx_dl);
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
