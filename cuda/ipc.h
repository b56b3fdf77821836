/* SPDX-License-Identifier: Apache-2.0 */
/*
 * CUDA IPC for the local path: a rank exports the allocations holding its device destination
 * buffers (cuIpcGetMemHandle on the allocation's base, with the buffer's offset in it), and
 * the ranks writing into them open each handle once per plan (cuIpcOpenMemHandle) and keep it
 * open across executions, per peer, until the peer stops exporting it for that plan or the
 * plan goes (the driver counts a handle opened by several plans). Copies into peers run on
 * one stream per communicator, each chunk's followed by an event the executor polls before it
 * tells the receiver the chunk is there.
 */
#ifndef RS_CUDA_IPC_H
#define RS_CUDA_IPC_H

#include "cuda_lib.h"

#include <stdint.h>
#include <sys/types.h>

#define CUDA_IPC_EVENTS 16 /* chunk copies in flight on the stream */

/* How an allocation is shared: cuIpcGetMemHandle (cuMemAlloc memory), or for cuMemCreate
 * memory a POSIX file descriptor (which the importer takes from the exporter with
 * pidfd_getfd, as it may for cross-memory writes) or a fabric handle. */
enum cuda_ipc_kind { CUDA_IPC_LEGACY, CUDA_IPC_POSIX_FD, CUDA_IPC_FABRIC };

/* What a rank publishes for one destination buffer (the same bytes on every host). */
struct cuda_ipc_export {
    uint32_t tensor;
    uint32_t kind;   /* enum cuda_ipc_kind */
    uint64_t offset; /* of the buffer in its allocation */
    uint64_t bytes;  /* of the allocation */
    /* LEGACY: the IPC handle; FABRIC: the fabric handle; POSIX_FD: struct cuda_ipc_fd. */
    cu_ipc_mem_handle handle;
};

struct cuda_ipc_fd {
    int32_t pid, fd; /* the exporter's descriptor, open while it exports */
    uint64_t serial; /* which export: descriptor numbers are reused */
};

/* A plan's mappings of its peers' allocations. */
struct cuda_ipc_maps {
    struct cuda_ipc_open {
        int peer;
        uint32_t kind;
        cu_ipc_mem_handle handle;
        cu_deviceptr base;
        uint64_t bytes;
    } * open;
    size_t nopen, cap;
};

/* A communicator's stream and events for the copies, and a scratch buffer per event for
 * strided chunks (packed on this GPU, unpacked into the peer's). */
struct cuda_ipc {
    cu_stream stream;
    cu_event ev[CUDA_IPC_EVENTS];
    cu_deviceptr scratch[CUDA_IPC_EVENTS];
    uint64_t scratch_bytes;
};

/* The handle of the allocation holding the len bytes at dev, and dev's place in it; refused
 * when they span several allocations (as a cuMemCreate range may). A POSIX_FD export holds a
 * descriptor, shared by the buffers of one allocation, until cuda_ipc_unexport. */
reshard_status_t cuda_ipc_export(const void *dev, size_t len, uint32_t tensor,
                                 struct cuda_ipc_export *e);
void cuda_ipc_unexport(struct cuda_ipc_export *e);

/* The communicator's IPC state, made on first use (*ipc NULL before). */
reshard_status_t cuda_ipc_get(struct cuda_ipc **ipc);
/* Scratch buffer i, of at least `bytes` (made on first use; the stream is idle when they
 * grow). */
reshard_status_t cuda_ipc_scratch(struct cuda_ipc *ipc, int i, uint64_t bytes, cu_deviceptr *p);
/* Waits for the stream, frees ipc. */
void cuda_ipc_free(struct cuda_ipc *ipc);

/* Where e's buffer is mapped here (opened now, or earlier for the same allocation). pid: the
 * peer's process as its local socket showed it, and pidfd a pidfd on it taken then (or -1): a
 * POSIX descriptor is taken from that process only, through pidfd when there is one, so a
 * number handed to another process since is never followed. */
reshard_status_t cuda_ipc_open(struct cuda_ipc_maps *m, int peer, pid_t pid, int pidfd,
                               const struct cuda_ipc_export *e, char **ptr);
/* Closes the peer's mappings that are not among its exports now (n of them at e). */
void cuda_ipc_prune(struct cuda_ipc_maps *m, int peer, const struct cuda_ipc_export *e, size_t n);
/* Closes every mapping. */
void cuda_ipc_close_all(struct cuda_ipc_maps *m);

#endif
