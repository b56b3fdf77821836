/* SPDX-License-Identifier: Apache-2.0 */
#include "ib_lib.h"

#include "base/dl.h"

static struct ib_fns fns;

static const struct rs_dl_sym ib_syms[] = {
    /* rdma-core 34 and later; device memory goes through staging without it */
    {"ibv_reg_dmabuf_mr", offsetof(struct ib_fns, reg_dmabuf_mr), RS_DL_OPTIONAL},
#define IB_SYM_(name) {"ibv_" #name, offsetof(struct ib_fns, name), RS_DL_REQUIRED},
    IB_FN_MAP(IB_SYM_)
#undef IB_SYM_
};

/* RESHARD_IB_LIB names another file (tests use it to hide rdma-core). */
static struct rs_dl ib_dl = {
    .what = "ibverbs",
    .file = RS_PARAM_IB_LIB,
    .fallback = "libibverbs.so.1",
    .open_hint = " (install libibverbs1)",
    .syms = ib_syms,
    .nsyms = sizeof(ib_syms) / sizeof(ib_syms[0]),
    .table = &fns,
    .table_size = sizeof(fns),
};

const struct ib_fns *ib_lib(void)
{
    return rs_dl_load(&ib_dl);
}
