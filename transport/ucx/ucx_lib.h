/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libucp, loaded at run time so that the library loads (and plans) on hosts without UCX. The
 * types come from UCX's headers; the functions from dlsym, once per process (RESHARD_UCX_LIB
 * names another file).
 */
#ifndef RS_UCX_LIB_H
#define RS_UCX_LIB_H

#include "base/reshard_status.h"

#include <ucp/api/ucp.h>

/* X(name): every libucp/libucs function the transport calls. */
#define UCX_FN_MAP(X)                                                                              \
    X(ucp_config_read)                                                                             \
    X(ucp_config_modify)                                                                           \
    X(ucp_config_release)                                                                          \
    X(ucp_init_version)                                                                            \
    X(ucp_cleanup)                                                                                 \
    X(ucp_worker_create)                                                                           \
    X(ucp_worker_destroy)                                                                          \
    X(ucp_worker_get_address)                                                                      \
    X(ucp_worker_release_address)                                                                  \
    X(ucp_worker_progress)                                                                         \
    X(ucp_worker_get_efd)                                                                          \
    X(ucp_worker_arm)                                                                              \
    X(ucp_ep_create)                                                                               \
    X(ucp_ep_close_nbx)                                                                            \
    X(ucp_tag_send_nbx)                                                                            \
    X(ucp_tag_recv_nbx)                                                                            \
    X(ucp_request_check_status)                                                                    \
    X(ucp_request_cancel)                                                                          \
    X(ucp_request_free)                                                                            \
    X(ucp_mem_map)                                                                                 \
    X(ucp_mem_unmap)                                                                               \
    X(ucp_context_query)                                                                           \
    X(ucs_status_string)

struct ucx_fns {
#define UCX_FN_FIELD_(name) __typeof__(&name) name;
    UCX_FN_MAP(UCX_FN_FIELD_)
#undef UCX_FN_FIELD_
};

/* The loaded table, or NULL with RESHARD_ERR_UNAVAILABLE recorded (the message says which
 * library or symbol was missing, or that this process was forked after UCX started in its
 * parent, where UCX cannot start again: ucx_lib.c). Thread-safe; loads once. */
const struct ucx_fns *ucx_lib(void);

/* UCX status to ours: a failed peer or connection is a network failure; the rest internal. */
reshard_status_t ucx_status(ucs_status_t st);

#endif
