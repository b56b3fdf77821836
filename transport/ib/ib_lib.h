/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libibverbs, loaded at run time so that the library loads on hosts without rdma-core. Types
 * and the inline data-path calls (ibv_post_send, ibv_poll_cq, ...: they go through the
 * device's own ops) come from the headers; the exported functions from dlsym, once per
 * process. Fields drop the ibv_ prefix: several of these names are also function-like macros.
 */
#ifndef RS_IB_LIB_H
#define RS_IB_LIB_H

#include "base/reshard_status.h"

#include <infiniband/verbs.h>
#include <string.h>

/* X(name): libibverbs' ibv_<name>, every one the transport calls. */
#define IB_FN_MAP(X)                                                                               \
    X(get_device_list)                                                                             \
    X(free_device_list)                                                                            \
    X(get_device_name)                                                                             \
    X(open_device)                                                                                 \
    X(close_device)                                                                                \
    X(query_device)                                                                                \
    X(query_port)                                                                                  \
    X(query_gid)                                                                                   \
    X(alloc_pd)                                                                                    \
    X(dealloc_pd)                                                                                  \
    X(reg_mr)                                                                                      \
    X(dereg_mr)                                                                                    \
    X(create_comp_channel)                                                                         \
    X(destroy_comp_channel)                                                                        \
    X(create_cq)                                                                                   \
    X(resize_cq)                                                                                   \
    X(destroy_cq)                                                                                  \
    X(get_cq_event)                                                                                \
    X(ack_cq_events)                                                                               \
    X(create_qp)                                                                                   \
    X(modify_qp)                                                                                   \
    X(destroy_qp)                                                                                  \
    X(wc_status_str)

struct ib_fns {
#define IB_FN_FIELD_(name) __typeof__(&ibv_##name) name;
    IB_FN_MAP(IB_FN_FIELD_)
#undef IB_FN_FIELD_
    /* rdma-core 34 and later; NULL before (device memory then goes through staging). */
    __typeof__(&ibv_reg_dmabuf_mr) reg_dmabuf_mr;
};

/* ibv_query_port as the header's inline wrapper does it: the extended call where the device
 * has it, else the exported one, which fills the older, shorter struct. */
static inline int ib_query_port(const struct ib_fns *f, struct ibv_context *ctx, uint8_t port,
                                struct ibv_port_attr *attr)
{
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (vctx)
        return vctx->query_port(ctx, port, attr, sizeof(*attr));
    memset(attr, 0, sizeof(*attr));
    return f->query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
}

/* The loaded table, or NULL with RESHARD_ERR_UNAVAILABLE recorded (the message says which
 * library or symbol was missing). Thread-safe; loads once. */
const struct ib_fns *ib_lib(void);

#endif
