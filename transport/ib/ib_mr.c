/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory registrations of the ibverbs transport: what the caller registers (host memory, or
 * device memory as a dma-buf), the transient registrations a transfer that came without one
 * gets for its life, and the bounce buffers a receive into a scatter list lands in.
 */
#include "ib_int.h"

#include "base/error.h"
#include "cuda/cuda_lib.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* writable: the range receives (RDMA writes land in it); sends register it read-only, so that
 * read-only mappings can be sent from. */
struct ibv_mr *ib_tmr_get(struct ib_ctx *x, const void *addr, size_t len, int writable)
{
    const char *a = addr;
    for (struct ib_tmr *t = x->tmrs; t; t = t->next)
        if (a >= t->base && a + len <= t->base + t->len && t->writable >= writable) {
            t->refs++;
            return t->mr;
        }
    struct ib_tmr *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    uintptr_t page = 4096, b = (uintptr_t)a & ~(page - 1),
              e = ((uintptr_t)a + len + page - 1) & ~(page - 1);
    t->mr = x->f->reg_mr(x->pd, (void *)b, e - b,
                         writable ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : 0);
    t->writable = writable;
    if (!t->mr) {
        rs_error(RESHARD_ERR_NETWORK, "ib: registering %zu bytes at %p: %m", len, addr);
        free(t);
        return NULL;
    }
    t->base = (char *)b;
    t->len = e - b;
    t->refs = 1;
    t->next = x->tmrs;
    x->tmrs = t;
    return t->mr;
}

/* Idle registrations are dropped, not cached: without memory hooks a freed and reused
 * address would be sent from the old, still pinned pages. */
void ib_tmr_put(struct ib_ctx *x, struct ibv_mr *mr)
{
    for (struct ib_tmr **p = &x->tmrs; *p; p = &(*p)->next)
        if ((*p)->mr == mr) {
            struct ib_tmr *t = *p;
            if (--t->refs == 0) {
                *p = t->next;
                x->f->dereg_mr(t->mr);
                free(t);
            }
            return;
        }
}

void ib_tmr_drop_all(struct ib_ctx *x)
{
    while (x->tmrs) {
        struct ib_tmr *t = x->tmrs;
        x->tmrs = t->next;
        x->f->dereg_mr(t->mr);
        free(t);
    }
}

/* Device memory: a dma-buf of the pages holding it (cuMemGetHandleForAddressRange), registered
 * at its own address (iova) so that peers write to it as to host memory. */
static reshard_status_t reg_device(struct ib_ctx *x, void *addr, size_t len, void **mh)
{
    const struct cuda_fns *cu = cuda_lib();
    if (!cu)
        return RESHARD_ERR_UNAVAILABLE;
    if (!cu->get_handle_for_address_range)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "ib: the CUDA driver has no cuMemGetHandleForAddressRange (CUDA 11.7 or "
                        "later exports dma-bufs)");
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), a = (uint64_t)(uintptr_t)addr;
    uint64_t base = a & ~(page - 1), end = (a + len + page - 1) & ~(page - 1);
    int fd = -1;
    cu_result r = cu->get_handle_for_address_range(&fd, base, end - base,
                                                   CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (r != CU_SUCCESS)
        return cuda_error("cuMemGetHandleForAddressRange (dma-buf) for ib", r);
    struct ibv_mr *mr = x->f->reg_dmabuf_mr(x->pd, a - base, len, a, fd,
                                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    int e = errno;
    close(fd);
    errno = e;
    if (!mr)
        return rs_error(RESHARD_ERR_NETWORK,
                        "ib: ibv_reg_dmabuf_mr of %zu device bytes at %p on %s: %m", len, addr,
                        x->port.name);
    *mh = mr;
    return RESHARD_OK;
}

/* Can this device register dma-bufs? A registration of fd -1 tells: EBADF when the kernel
 * and the provider could (NCCL probes the same way), EOPNOTSUPP when not. */
void ib_mr_probe_dmabuf(struct ib_ctx *x)
{
    struct tp_ctx *c = &x->super;
    if (!x->f->reg_dmabuf_mr) {
        snprintf(c->device_mem_why, sizeof(c->device_mem_why),
                 "ib: rdma-core has no ibv_reg_dmabuf_mr (it came in rdma-core 34)");
        return;
    }
    errno = 0;
    struct ibv_mr *mr = x->f->reg_dmabuf_mr(x->pd, 0, 0, 0, -1, IBV_ACCESS_LOCAL_WRITE);
    if (mr)
        x->f->dereg_mr(mr);
    if (!mr && (errno == EOPNOTSUPP || errno == EPROTONOSUPPORT || errno == ENOSYS))
        snprintf(c->device_mem_why, sizeof(c->device_mem_why),
                 "ib: %s cannot register dma-bufs (%s)", x->port.dev, strerror(errno));
    else
        c->device_mem = 1;
}

reshard_status_t ib_mem_reg(struct tp_ctx *c, void *addr, size_t len, enum tp_mem mem, void **mh)
{
    struct ib_ctx *x = to_ib(c);
    if (mem == TP_MEM_CUDA)
        return reg_device(x, addr, len, mh);
    struct ibv_mr *mr =
        x->f->reg_mr(x->pd, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr && (errno == EFAULT || errno == EACCES || errno == EPERM))
        mr = x->f->reg_mr(x->pd, addr, len, 0); /* read-only memory: a source to send from */
    if (!mr)
        return rs_error(RESHARD_ERR_NETWORK, "ib: ibv_reg_mr of %zu bytes at %p on %s: %m", len,
                        addr, x->port.name);
    *mh = mr;
    return RESHARD_OK;
}

void ib_mem_dereg(struct tp_ctx *c, void *mh)
{
    if (mh)
        to_ib(c)->f->dereg_mr(mh);
}

char *ib_bounce_alloc(size_t len)
{
    char *buf = malloc(len);
    if (!buf)
        rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a %zu-byte bounce buffer", len);
    return buf;
}

/* The first got bytes of buf, out to the scatter list in order. */
void ib_bounce_scatter(const struct iovec *iov, size_t niov, const char *buf, size_t got)
{
    size_t off = 0;
    for (size_t i = 0; i < niov && off < got; i++) {
        size_t n = got - off < iov[i].iov_len ? got - off : iov[i].iov_len;
        memcpy(iov[i].iov_base, buf + off, n);
        off += n;
    }
}
