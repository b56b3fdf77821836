/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host-memory local path: cross-memory attach (process_vm_writev) into another process of
 * the same host, the way NVLink peers write each other's memory with CUDA IPC; and what the
 * kernel says around it: who the process at the other end of a Unix socket is, whether it
 * shares this one's namespaces, and which processes the ptrace rules let write this one.
 *
 * Nothing here believes what a peer says about itself: the caller (plugin/comm/comm_local.c)
 * writes only into processes the kernel has named.
 */
#ifndef RS_CMA_H
#define RS_CMA_H

#include "base/reshard_status.h"

#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

/* Writes n pieces: local[i] of this process into remote[i] of process pid (the same lengths).
 * pid 0 (a peer the kernel has not named) is refused. pidfd, when not -1, is cma_hold's handle
 * on the process verified as pid: once that process has exited the write is refused, since its
 * number may name another process by now. Errors name the peer and say what to change when the
 * kernel forbids it. */
reshard_status_t cma_write(pid_t pid, int pidfd, int peer, const struct iovec *local,
                           const struct iovec *remote, size_t n);
/* A handle on process pid that, unlike its number, can never name another process
 * (pidfd_open, Linux 5.3, close-on-exec), or -1 where the kernel or a sandbox refuses one. */
int cma_hold(pid_t pid);

/* ---- local sockets: abstract Unix names, scoped to the network namespace ---- */

/* The longest name (without the leading NUL of the abstract namespace). */
#define CMA_NAME_MAX 100

/* A non-blocking SOCK_SEQPACKET listener bound to the abstract name. A name another process
 * holds fails with RESHARD_ERR_UNAVAILABLE. */
reshard_status_t cma_listen(const char *name, int *fd);
/* Connects without waiting: RESHARD_OK with *fd; RESHARD_ERR_UNAVAILABLE when nobody listens on
 * that name in this network namespace; RESHARD_ERR_BUSY when the listener's queue is full. */
reshard_status_t cma_connect(const char *name, int *fd);
/* One waiting connection, or *fd = -1 when none is waiting. */
reshard_status_t cma_accept(int lfd, int *fd);
/* One message of n bytes, never waiting; a peer that cannot take it now fails the send. */
reshard_status_t cma_send(int fd, const void *msg, size_t n);
/* One message, never waiting: *got is its real length (a longer one is cut to n bytes but
 * reported whole, so the caller can refuse it), 0 when the peer closed, -1 when none waits. */
reshard_status_t cma_recv(int fd, void *buf, size_t n, long *got);
/* The process at the other end, as the kernel recorded it when that end connected (or
 * listened): its pid in this PID namespace (0 when it is not visible here) and effective uid. */
reshard_status_t cma_peer_cred(int fd, pid_t *pid, uid_t *uid);
/* Which of this process's namespaces process pid shares: CMA_SAME_NET | CMA_SAME_PID (both:
 * CMA_SAME_ALL), or -1 when its namespaces cannot be read; why (n bytes) says which one it
 * does not share (the network namespace when neither), or why they cannot be read. */
enum { CMA_SAME_NET = 1, CMA_SAME_PID = 2, CMA_SAME_ALL = 3 };
int cma_same_namespaces(pid_t pid, char *why, size_t n);

/* ---- who may write this process ---- */

/* kernel.yama.ptrace_scope: 0 to 3, or -1 when Yama is absent. An unreadable value counts as
 * 3, the strictest. */
int cma_ptrace_scope(void);
/* Lets process `writer` (a verified local peer) write this one when the kernel's ptrace rules
 * allow it: with no Yama or ptrace_scope 0, always; with 1, by declaring (PR_SET_PTRACER) the
 * narrowest one process whose descendants hold the writer and every writer admitted before
 * (the writer itself, or the launcher that started them all), narrowing or widening the
 * declaration as needed; with 2 or 3, or when this process is not dumpable, never. *allowed
 * says which; when 0, why (n bytes) says why. Fails only when out of memory. Each admission
 * is undone by cma_dismiss. */
reshard_status_t cma_admit(pid_t writer, int *allowed, char *why, size_t n);
/* Undoes one admission of writer; the last one resets the declaration (PR_SET_PTRACER 0). */
void cma_dismiss(pid_t writer);

/* Tests only: pretend that Yama's ptrace_scope is `scope` (-2: read the kernel's again) and
 * declare ptracers through set_ptracer instead of prctl (NULL: prctl), which returns 0 or -1
 * with errno set. */
void cma_test_yama(int scope, int (*set_ptracer)(pid_t pid));

#endif
