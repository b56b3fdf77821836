/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Memory registrations of the ibverbs transport: what the caller registers (host memory, or
 * device memory as a dma-buf), the transient registrations a transfer that came without one
 * gets for its life, and the registration of exactly one receive's bytes. None but the last
 * grants remote access: receives reach memory through windows (ib_key.c).
 */
#include "ib_int.h"

#include "base/error.h"
#include "cuda/cuda_lib.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int ib_local_access(const struct ib_ctx *x)
{
    return IBV_ACCESS_LOCAL_WRITE | (x->windows ? IBV_ACCESS_MW_BIND : 0);
}

/* A send's registration is read-only and by the whole pages it touches (so that transfers out
 * of the same pages share it); a receive's is exactly its bytes and its own, so that nothing
 * next to the receive is reachable through the windows bound over it, even on a device that
 * checks only a window's registration. Neither grants remote access. */
struct ibv_mr *ib_tmr_get(struct ib_ctx *x, const void *addr, size_t len, int writable)
{
    const char *a = addr;
    for (struct ib_tmr *t = x->tmrs; t && !writable; t = t->next)
        if (!t->writable && a >= t->base && a + len <= t->base + t->len) {
            t->refs++;
            return t->mr;
        }
    struct ib_tmr *t = calloc(1, sizeof(*t));
    if (!t) {
        rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory to register %zu bytes at %p", len, addr);
        return NULL;
    }
    uintptr_t page = 4096, b = (uintptr_t)a & ~(page - 1),
              e = ((uintptr_t)a + len + page - 1) & ~(page - 1);
    if (writable) {
        b = (uintptr_t)a;
        e = (uintptr_t)a + len;
    }
    t->mr = x->f->reg_mr(x->pd, (void *)b, e - b, writable ? ib_local_access(x) : 0);
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

struct ibv_mr *ib_mr_exact(struct ib_ctx *x, const struct ib_reg *reg, char *addr, size_t len)
{
    int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    struct ibv_mr *mr;
    if (reg && reg->fd >= 0)
        mr = x->f->reg_dmabuf_mr(x->pd, (uint64_t)(uintptr_t)addr - reg->fd_base, len,
                                 (uint64_t)(uintptr_t)addr, reg->fd, access);
    else
        mr = x->f->reg_mr(x->pd, addr, len, access);
    if (!mr)
        rs_error(RESHARD_ERR_NETWORK, "ib: registering the %zu-byte receive at %p on %s: %m", len,
                 (void *)addr, x->port.name);
    return mr;
}

/* A registration of device memory may also be read through the flush queue pair (ib_flush.c),
 * which alone of this context's queue pairs allows remote reads, and only from itself. */
#define DEVICE_ACCESS(x) (ib_local_access(x) | IBV_ACCESS_REMOTE_READ)

/* fd's len bytes at offset, which the process sees at addr, registered at addr (iova) so that
 * peers write to it as to host memory, through windows bound over it. Where windows cannot be
 * bound over it, a dup of the dma-buf stays open: each receive into it registers its own bytes
 * from it. */
static reshard_status_t reg_dmabuf(struct ib_ctx *x, void *addr, size_t len, int fd,
                                   uint64_t offset, struct ib_reg *g)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    int access = DEVICE_ACCESS(x);
    struct ibv_mr *mr = x->f->reg_dmabuf_mr(x->pd, offset, len, a, fd, access);
    if (!mr && (access & IBV_ACCESS_MW_BIND)) /* no windows over device memory here */
        mr = x->f->reg_dmabuf_mr(x->pd, offset, len, a, fd,
                                 access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!mr)
        return rs_error(RESHARD_ERR_NETWORK,
                        "ib: ibv_reg_dmabuf_mr of %zu device bytes at %p (dma-buf %d, offset %llu) "
                        "on %s: %m",
                        len, addr, fd, (unsigned long long)offset, x->port.name);
    int bindable = x->windows && (access & IBV_ACCESS_MW_BIND), keep = -1;
    if (!bindable && (keep = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        int e = errno;
        x->f->dereg_mr(mr);
        errno = e;
        return rs_error(RESHARD_ERR_NETWORK, "ib: keeping dma-buf %d for its receives: %m", fd);
    }
    *g = (struct ib_reg){.mr = mr,
                         .base = addr,
                         .len = len,
                         .bindable = bindable,
                         .fd = keep,
                         .fd_base = a - offset,
                         .read_mr = mr};
    return RESHARD_OK;
}

/* Device memory: a dma-buf of the pages holding it (cuMemGetHandleForAddressRange), or where
 * the driver exports none, the device pointer itself through peer memory (nvidia-peermem). */
static reshard_status_t reg_device(struct ib_ctx *x, void *addr, size_t len, struct ib_reg *g)
{
    const struct cuda_fns *cu = cuda_lib();
    if (!cu)
        return RESHARD_ERR_UNAVAILABLE;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), a = (uint64_t)(uintptr_t)addr;
    uint64_t base = a & ~(page - 1), end = (a + len + page - 1) & ~(page - 1);
    int fd = -1;
    cu_result r = CU_SUCCESS;
    if (x->super.dmabuf && cu->get_handle_for_address_range)
        r = cu->get_handle_for_address_range(&fd, base, end - base,
                                             CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    if (fd >= 0) {
        reshard_status_t st = reg_dmabuf(x, addr, len, fd, a - base, g);
        close(fd);
        return st;
    }
    if (!x->peermem) {
        if (!cu->get_handle_for_address_range)
            return rs_error(RESHARD_ERR_UNAVAILABLE,
                            "ib: the CUDA driver has no cuMemGetHandleForAddressRange (CUDA 11.7 "
                            "or later exports dma-bufs) and nvidia-peermem is not loaded");
        return cuda_error("cuMemGetHandleForAddressRange (dma-buf) for ib", r);
    }
    int access = DEVICE_ACCESS(x);
    struct ibv_mr *mr = x->f->reg_mr(x->pd, addr, len, access);
    if (!mr && (access & IBV_ACCESS_MW_BIND))
        mr = x->f->reg_mr(x->pd, addr, len,
                          access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!mr)
        return rs_error(RESHARD_ERR_NETWORK,
                        "ib: ibv_reg_mr (peer memory) of %zu device bytes at %p on %s: %m", len,
                        addr, x->port.name);
    *g = (struct ib_reg){.mr = mr,
                         .base = addr,
                         .len = len,
                         .bindable = x->windows && (access & IBV_ACCESS_MW_BIND),
                         .fd = -1,
                         .read_mr = mr};
    return RESHARD_OK;
}

/* Can this device register device memory? A dma-buf registration of fd -1 tells: EBADF when
 * the kernel and the provider could (NCCL probes the same way), EOPNOTSUPP when not. Peer
 * memory (nvidia-peermem, or the older nv_peer_mem) registers device pointers directly. */
void ib_mr_probe_dmabuf(struct ib_ctx *x)
{
    struct tp_ctx *c = &x->super;
    char why[sizeof(c->device_mem_why)] = "";
    if (!x->f->reg_dmabuf_mr) {
        snprintf(why, sizeof(why), "rdma-core has no ibv_reg_dmabuf_mr (it came in rdma-core 34)");
    } else {
        errno = 0;
        struct ibv_mr *mr = x->f->reg_dmabuf_mr(x->pd, 0, 0, 0, -1, IBV_ACCESS_LOCAL_WRITE);
        if (mr)
            x->f->dereg_mr(mr);
        if (!mr && (errno == EOPNOTSUPP || errno == EPROTONOSUPPORT || errno == ENOSYS))
            snprintf(why, sizeof(why), "%s cannot register dma-bufs (%s)", x->port.dev,
                     strerror(errno));
        else
            c->dmabuf = 1;
    }
    x->peermem = access("/sys/kernel/mm/memory_peers/nv_mem/version", F_OK) == 0 ||
                 access("/sys/module/nvidia_peermem/version", F_OK) == 0;
    c->device_mem = c->dmabuf || x->peermem;
    if (!c->device_mem)
        snprintf(c->device_mem_why, sizeof(c->device_mem_why),
                 "ib: %s and nvidia-peermem is not "
                 "loaded",
                 why);
}

/* Host memory: local access only, and the right to bind windows where receives use them;
 * read-only memory (a source to send from) is registered without either. */
reshard_status_t ib_mem_reg(struct tp_ctx *c, void *addr, size_t len, enum tp_mem mem, void **mh)
{
    struct ib_ctx *x = to_ib(c);
    struct ib_reg *g = rs_calloc(1, sizeof(*g), "an ib registration");
    if (!g)
        return RESHARD_ERR_NO_MEMORY;
    if (mem == TP_MEM_CUDA) {
        reshard_status_t st = reg_device(x, addr, len, g);
        if (st != RESHARD_OK) {
            free(g);
            return st;
        }
        *mh = g;
        return RESHARD_OK;
    }
    int access = ib_local_access(x);
    struct ibv_mr *mr = x->f->reg_mr(x->pd, addr, len, access);
    if (!mr && (errno == EFAULT || errno == EACCES || errno == EPERM))
        mr = x->f->reg_mr(x->pd, addr, len, access = 0);
    if (!mr) {
        free(g);
        return rs_error(RESHARD_ERR_NETWORK, "ib: ibv_reg_mr of %zu bytes at %p on %s: %m", len,
                        addr, x->port.name);
    }
    *g = (struct ib_reg){
        .mr = mr, .base = addr, .len = len, .bindable = x->windows && access != 0, .fd = -1};
    *mh = g;
    return RESHARD_OK;
}

reshard_status_t ib_mem_reg_dmabuf(struct tp_ctx *c, void *addr, size_t len, int fd,
                                   uint64_t offset, void **mh)
{
    struct ib_ctx *x = to_ib(c);
    if (!c->dmabuf)
        return rs_error(RESHARD_ERR_UNAVAILABLE, "ib: %s takes no dma-bufs: %s", x->port.name,
                        c->device_mem_why);
    struct ib_reg *g = rs_calloc(1, sizeof(*g), "an ib registration");
    if (!g)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st = reg_dmabuf(x, addr, len, fd, offset, g);
    if (st != RESHARD_OK) {
        free(g);
        return st;
    }
    *mh = g;
    return RESHARD_OK;
}

void ib_mem_dereg(struct tp_ctx *c, void *mh)
{
    struct ib_reg *g = mh;
    if (!g)
        return;
    if (g->read_mr && g->read_mr != g->mr)
        to_ib(c)->f->dereg_mr(g->read_mr);
    to_ib(c)->f->dereg_mr(g->mr);
    if (g->fd >= 0)
        close(g->fd);
    free(g);
}
