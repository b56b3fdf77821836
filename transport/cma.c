/* SPDX-License-Identifier: Apache-2.0 */
#include "cma.h"

#include "base/error.h"

#include <errno.h>
#include <limits.h>
#include <string.h>
#include <sys/prctl.h>

#ifndef PR_SET_PTRACER_ANY
#define PR_SET_PTRACER_ANY ((unsigned long)-1)
#endif

void cma_allow_peers(void)
{
    /* Fails harmlessly where Yama is absent. */
    (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

static reshard_status_t cma_fail(pid_t pid, int peer, int err)
{
    if (err == EPERM)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "process_vm_writev to rank %d (pid %d): %s; cross-memory attach needs the "
                        "same user and kernel.yama.ptrace_scope <= 1",
                        peer, (int)pid, strerror(err));
    return rs_error(RESHARD_ERR_NETWORK, "process_vm_writev to rank %d (pid %d): %s", peer,
                    (int)pid, strerror(err));
}

reshard_status_t cma_write(pid_t pid, int peer, const struct iovec *local,
                           const struct iovec *remote, size_t n)
{
    /* The same lengths on both sides, so a batch of pieces moves whole pieces; a short write
     * (the kernel may stop at a page it cannot fault) resumes inside a piece. */
    size_t i = 0, done = 0; /* done: bytes of piece i already written */
    while (i < n) {
        struct iovec l[IOV_MAX > 1024 ? 1024 : IOV_MAX], r[IOV_MAX > 1024 ? 1024 : IOV_MAX];
        size_t k = 0, want = 0;
        for (; k < sizeof(l) / sizeof(l[0]) && i + k < n; k++) {
            size_t skip = k == 0 ? done : 0;
            l[k] =
                (struct iovec){(char *)local[i + k].iov_base + skip, local[i + k].iov_len - skip};
            r[k] =
                (struct iovec){(char *)remote[i + k].iov_base + skip, remote[i + k].iov_len - skip};
            want += l[k].iov_len;
        }
        ssize_t got = process_vm_writev(pid, l, (unsigned long)k, r, (unsigned long)k, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return cma_fail(pid, peer, errno);
        }
        if (got == 0 && want)
            return cma_fail(pid, peer, EFAULT);
        /* Skip the pieces written in full. */
        size_t left = (size_t)got;
        while (left && i < n) {
            size_t rest = local[i].iov_len - done;
            if (left < rest) {
                done += left;
                left = 0;
            } else {
                left -= rest;
                done = 0;
                i++;
            }
        }
        while (i < n && local[i].iov_len == 0)
            i++;
    }
    return RESHARD_OK;
}
