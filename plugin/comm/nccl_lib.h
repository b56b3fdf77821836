/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The few NCCL calls reshard makes as a client of NCCL (not as its plugin): the NCCL executor
 * (grouped send/receive on the user's communicator) and communicators made from an NCCL one.
 * Declared here from NCCL's public API; resolved from the libnccl already in the process, else
 * from dlopen("libnccl.so.2") (RESHARD_NCCL_LIB names another file). Everything goes through
 * this table, so tests can put a recorder in its place.
 */
#ifndef RS_NCCL_LIB_H
#define RS_NCCL_LIB_H

#include "base/reshard_status.h"

#include <stddef.h>

typedef int nccl_result; /* ncclResult_t: 0 is ncclSuccess */
#define NCCL_UINT8 1     /* ncclUint8: every transfer moves bytes */

struct nccl_fns {
    nccl_result (*group_start)(void);
    nccl_result (*group_end)(void);
    nccl_result (*send)(const void *buf, size_t count, int datatype, int peer, void *comm,
                        void *stream);
    nccl_result (*recv)(void *buf, size_t count, int datatype, int peer, void *comm, void *stream);
    nccl_result (*comm_user_rank)(void *comm, int *rank);
    nccl_result (*comm_count)(void *comm, int *count);
    nccl_result (*all_gather)(const void *sendbuf, void *recvbuf, size_t count, int datatype,
                              void *comm, void *stream);
    const char *(*get_error_string)(nccl_result r);
};

/* NULL, with RESHARD_ERR_UNAVAILABLE and why, when no NCCL can be found. */
const struct nccl_fns *nccl_lib(void);
/* A failed NCCL call as a status and message: "ncclSend to rank 3: unhandled cuda error". */
reshard_status_t nccl_error(const struct nccl_fns *f, nccl_result r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
