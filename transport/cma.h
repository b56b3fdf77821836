/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host-memory local path: cross-memory attach (process_vm_writev) into another process of
 * the same host, the way NVLink peers write each other's memory with CUDA IPC.
 */
#ifndef RS_CMA_H
#define RS_CMA_H

#include "base/reshard_status.h"

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Lets processes of this user write this one (Yama's ptrace_scope 1 allows only ancestors
 * otherwise). Called once per process before peers write. */
void cma_allow_peers(void);

/* Writes n pieces: local[i] of this process into remote[i] of process pid (the same lengths).
 * Errors name the peer and say what to change when the kernel forbids it. */
reshard_status_t cma_write(pid_t pid, int peer, const struct iovec *local,
                           const struct iovec *remote, size_t n);

#endif
