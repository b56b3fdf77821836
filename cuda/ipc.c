/* SPDX-License-Identifier: Apache-2.0 */
#include "ipc.h"

#include "base/error.h"
#include "base/log.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The POSIX descriptors this process exports, one per allocation (keyed by its base and id),
 * counted by the exports that hold them. */
static struct fd_export {
    cu_deviceptr base;
    uint64_t id, serial;
    int fd, refs;
} * fds;
static size_t nfds, fds_cap;
static uint64_t fd_serial;
static pthread_mutex_t fds_lock = PTHREAD_MUTEX_INITIALIZER;

static cu_result export_fd(const struct cuda_fns *f, cu_mem_handle h, cu_deviceptr base,
                           struct cuda_ipc_fd *out)
{
    uint64_t id = 0;
    if (f->pointer_get_attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, base) != CU_SUCCESS)
        id = 0; /* unknown: no sharing */
    pthread_mutex_lock(&fds_lock);
    for (size_t i = 0; id && i < nfds; i++)
        if (fds[i].base == base && fds[i].id == id) {
            fds[i].refs++;
            *out = (struct cuda_ipc_fd){(int32_t)getpid(), fds[i].fd, fds[i].serial};
            pthread_mutex_unlock(&fds_lock);
            return CU_SUCCESS;
        }
    int fd = -1;
    cu_result r = f->mem_export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    struct fd_export *n =
        r == CU_SUCCESS ? rs_grow(fds, &fds_cap, nfds + 1, sizeof(*n), "fds") : NULL;
    if (r == CU_SUCCESS && !n) {
        close(fd);
        r = 2; /* out of memory */
    }
    if (r == CU_SUCCESS) {
        (void)fcntl(fd, F_SETFD, FD_CLOEXEC); /* not into the caller's children */
        fds = n;
        fds[nfds++] = (struct fd_export){base, id, ++fd_serial, fd, 1};
        *out = (struct cuda_ipc_fd){(int32_t)getpid(), fd, fd_serial};
    }
    pthread_mutex_unlock(&fds_lock);
    return r;
}

static void unexport_fd(const struct cuda_ipc_fd *fd)
{
    pthread_mutex_lock(&fds_lock);
    for (size_t i = 0; i < nfds; i++)
        if (fds[i].fd == fd->fd && fds[i].serial == fd->serial) {
            if (--fds[i].refs == 0) {
                close(fds[i].fd);
                fds[i] = fds[--nfds];
            }
            break;
        }
    pthread_mutex_unlock(&fds_lock);
}

/* A cuMemCreate allocation (cuIpcGetMemHandle refuses those): shared as a fabric handle or a
 * POSIX descriptor, whichever its creator asked for (requestedHandleTypes). */
static reshard_status_t export_vmm(const struct cuda_fns *f, cu_deviceptr base,
                                   struct cuda_ipc_export *e, cu_result legacy)
{
    cu_mem_handle h;
    cu_mem_prop prop;
    if (!f->has_vmm || f->mem_retain_allocation_handle(&h, (void *)(uintptr_t)base) != CU_SUCCESS)
        return cuda_error("cuIpcGetMemHandle on a device destination buffer", legacy);
    cu_result r = f->mem_get_allocation_properties(&prop, h);
    int types = r == CU_SUCCESS ? prop.requested_handle_types : 0;
    if (types & CU_MEM_HANDLE_TYPE_FABRIC) {
        e->kind = CUDA_IPC_FABRIC;
        r = f->mem_export(&e->handle, h, CU_MEM_HANDLE_TYPE_FABRIC, 0);
    } else if (types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) {
        struct cuda_ipc_fd fd = {.pid = (int32_t)getpid(), .fd = -1};
        if ((r = export_fd(f, h, base, &fd)) == CU_SUCCESS)
            e->kind = CUDA_IPC_POSIX_FD; /* it holds the descriptor now */
        memcpy(&e->handle, &fd, sizeof(fd));
    }
    (void)f->mem_release(h); /* the retain's reference */
    if (!(types & (CU_MEM_HANDLE_TYPE_FABRIC | CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)))
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "cuda: a cuMemCreate allocation made without a shareable handle type "
                        "(POSIX descriptor or fabric) cannot be mapped by peers");
    return r == CU_SUCCESS ? RESHARD_OK
                           : cuda_error("cuMemExportToShareableHandle of a destination buffer", r);
}

reshard_status_t cuda_ipc_export(const void *dev, size_t len, uint32_t tensor,
                                 struct cuda_ipc_export *e)
{
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    RS_CHECK(cuda_current_context());
    cu_deviceptr p = (cu_deviceptr)(uintptr_t)dev, base = 0;
    size_t bytes = 0;
    *e = (struct cuda_ipc_export){.tensor = tensor, .kind = CUDA_IPC_LEGACY};
    cu_result r = f->mem_get_address_range(&base, &bytes, p);
    if (r != CU_SUCCESS)
        return cuda_error("cuMemGetAddressRange on a device destination buffer", r);
    if (p - base + len > bytes) /* mapped from several allocations: one handle cannot cover it */
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "cuda: a %zu-byte destination buffer spans more than its %zu-byte "
                        "allocation (several cuMemCreate allocations mapped side by side)",
                        len, bytes);
    if ((r = f->ipc_get_mem_handle(&e->handle, base)) != CU_SUCCESS)
        RS_CHECK(export_vmm(f, base, e, r));
    e->offset = p - base;
    e->bytes = bytes;
    return RESHARD_OK;
}

void cuda_ipc_unexport(struct cuda_ipc_export *e)
{
    struct cuda_ipc_fd fd;
    memcpy(&fd, &e->handle, sizeof(fd));
    if (e->kind == CUDA_IPC_POSIX_FD && fd.pid == (int32_t)getpid())
        unexport_fd(&fd);
    e->kind = CUDA_IPC_LEGACY;
}

/* The exporter's descriptor, duplicated into this process (pidfd_getfd: Linux 5.6, and the
 * same permission cross-memory writes need). The process is the one the local socket showed
 * (pid); a handle that names another is refused, never followed. */
static reshard_status_t take_fd(int peer, pid_t pid, int held, const struct cuda_ipc_fd *fd,
                                int *out)
{
    *out = -1;
    if (pid <= 0 || fd->pid != (int32_t)pid)
        return rs_error(RESHARD_ERR_REMOTE,
                        "cuda: rank %d's allocation descriptor names pid %d, not the pid %d its "
                        "local socket showed",
                        peer, (int)fd->pid, (int)pid);
    int pidfd = held >= 0 ? held : (int)syscall(SYS_pidfd_open, pid, 0);
    *out = pidfd < 0 ? -1 : (int)syscall(SYS_pidfd_getfd, pidfd, fd->fd, 0);
    int e = errno;
    if (pidfd >= 0 && pidfd != held)
        close(pidfd);
    if (*out < 0)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "cuda: cannot take rank %d's allocation descriptor (pid %d, fd %d) with "
                        "pidfd_getfd: %s (RESHARD_CUDA_IPC=0 stages instead)",
                        peer, fd->pid, fd->fd, strerror(e));
    return RESHARD_OK;
}

/* A peer's cuMemCreate allocation: imported, mapped at a fresh address, made accessible. */
static reshard_status_t open_vmm(const struct cuda_fns *f, int peer, pid_t pid, int pidfd,
                                 const struct cuda_ipc_export *e, cu_deviceptr *base)
{
    if (!f->has_vmm)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "cuda: this driver lacks the virtual memory calls rank %d's allocation "
                        "needs",
                        peer);
    cu_mem_handle h;
    cu_result r;
    if (e->kind == CUDA_IPC_POSIX_FD) {
        struct cuda_ipc_fd fd;
        int mine;
        memcpy(&fd, &e->handle, sizeof(fd));
        RS_CHECK(take_fd(peer, pid, pidfd, &fd, &mine));
        r = f->mem_import(&h, (void *)(uintptr_t)mine, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        close(mine);
    } else {
        r = f->mem_import(&h, (void *)&e->handle, CU_MEM_HANDLE_TYPE_FABRIC);
    }
    if (r != CU_SUCCESS)
        return cuda_error("cuMemImportFromShareableHandle of a peer's buffer", r);
    cu_device dev = 0;
    *base = 0;
    if ((r = f->ctx_get_device(&dev)) == CU_SUCCESS)
        r = f->mem_address_reserve(base, e->bytes, 0, 0, 0);
    if (r == CU_SUCCESS && (r = f->mem_map(*base, e->bytes, 0, h, 0)) != CU_SUCCESS) {
        (void)f->mem_address_free(*base, e->bytes);
        *base = 0;
    }
    cu_mem_access rw = {{CU_MEM_LOCATION_TYPE_DEVICE, dev}, CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (r == CU_SUCCESS && (r = f->mem_set_access(*base, e->bytes, &rw, 1)) != CU_SUCCESS) {
        (void)f->mem_unmap(*base, e->bytes);
        (void)f->mem_address_free(*base, e->bytes);
    }
    (void)f->mem_release(h); /* the mapping holds it now */
    return r == CU_SUCCESS ? RESHARD_OK : cuda_error("mapping a peer's buffer (cuMemMap)", r);
}

static void close_one(const struct cuda_ipc_open *o)
{
    const struct cuda_fns *f = cuda_lib();
    if (o->kind == CUDA_IPC_LEGACY) {
        (void)f->ipc_close_mem_handle(o->base);
        return;
    }
    (void)f->mem_unmap(o->base, o->bytes);
    (void)f->mem_address_free(o->base, o->bytes);
}

reshard_status_t cuda_ipc_get(struct cuda_ipc **ipc)
{
    if (*ipc)
        return RESHARD_OK;
    const struct cuda_fns *f = cuda_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    RS_CHECK(cuda_current_context());
    struct cuda_ipc *c = rs_calloc(1, sizeof(*c), "CUDA IPC state");
    if (!c)
        return RESHARD_ERR_NO_MEMORY;
    cu_result r = f->stream_create(&c->stream, CU_STREAM_NON_BLOCKING);
    for (int i = 0; r == CU_SUCCESS && i < CUDA_IPC_EVENTS; i++)
        r = f->event_create(&c->ev[i], CU_EVENT_DISABLE_TIMING);
    if (r != CU_SUCCESS) {
        cuda_ipc_free(c);
        return cuda_error("creating the CUDA IPC stream and events", r);
    }
    *ipc = c;
    return RESHARD_OK;
}

reshard_status_t cuda_ipc_open(struct cuda_ipc_maps *ipc, int peer, pid_t pid, int pidfd,
                               const struct cuda_ipc_export *e, char **ptr)
{
    for (size_t i = 0; i < ipc->nopen; i++) {
        const struct cuda_ipc_open *o = &ipc->open[i];
        if (o->peer == peer && o->kind == e->kind &&
            !memcmp(&o->handle, &e->handle, sizeof(e->handle))) {
            *ptr = (char *)(uintptr_t)o->base + e->offset;
            return RESHARD_OK;
        }
    }
    struct cuda_ipc_open *n =
        rs_grow(ipc->open, &ipc->cap, ipc->nopen + 1, sizeof(*n), "CUDA IPC mappings");
    if (!n)
        return RESHARD_ERR_NO_MEMORY;
    ipc->open = n;
    cu_deviceptr base = 0;
    if (e->kind != CUDA_IPC_LEGACY) {
        RS_CHECK(open_vmm(cuda_lib(), peer, pid, pidfd, e, &base));
    } else {
        cu_result r =
            cuda_lib()->ipc_open_mem_handle(&base, e->handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
        if (r != CU_SUCCESS) {
            char what[96];
            snprintf(what, sizeof(what),
                     "cuIpcOpenMemHandle of rank %d's buffer (RESHARD_CUDA_IPC=0 stages instead)",
                     peer);
            return cuda_error(what, r);
        }
    }
    n[ipc->nopen++] = (struct cuda_ipc_open){peer, e->kind, e->handle, base, e->bytes};
    rs_log(RS_LOG_TRACE, "cuda ipc: opened rank %d's %llu-byte allocation", peer,
           (unsigned long long)e->bytes);
    *ptr = (char *)(uintptr_t)base + e->offset;
    return RESHARD_OK;
}

void cuda_ipc_prune(struct cuda_ipc_maps *ipc, int peer, const struct cuda_ipc_export *e, size_t n)
{
    size_t keep = 0;
    for (size_t i = 0; i < ipc->nopen; i++) {
        const struct cuda_ipc_open *o = &ipc->open[i];
        int live = o->peer != peer;
        for (size_t k = 0; !live && k < n; k++)
            live = o->kind == e[k].kind && !memcmp(&o->handle, &e[k].handle, sizeof(o->handle));
        if (live)
            ipc->open[keep++] = *o;
        else
            close_one(o);
    }
    ipc->nopen = keep;
}

reshard_status_t cuda_ipc_scratch(struct cuda_ipc *ipc, int i, uint64_t bytes, cu_deviceptr *p)
{
    const struct cuda_fns *f = cuda_lib();
    if (bytes > ipc->scratch_bytes) {
        cu_result r = f->stream_synchronize(ipc->stream);
        for (int k = 0; k < CUDA_IPC_EVENTS; k++) {
            if (ipc->scratch[k])
                (void)f->mem_free(ipc->scratch[k]);
            ipc->scratch[k] = 0;
        }
        ipc->scratch_bytes = bytes;
        if (r != CU_SUCCESS)
            return cuda_error("cuStreamSynchronize before growing the IPC scratch", r);
    }
    if (!ipc->scratch[i]) {
        cu_result r = f->mem_alloc(&ipc->scratch[i], ipc->scratch_bytes);
        if (r != CU_SUCCESS)
            return cuda_error("cuMemAlloc of a CUDA IPC scratch buffer", r);
    }
    *p = ipc->scratch[i];
    return RESHARD_OK;
}

void cuda_ipc_free(struct cuda_ipc *ipc)
{
    if (!ipc)
        return;
    const struct cuda_fns *f = cuda_lib();
    if (ipc->stream)
        (void)f->stream_synchronize(ipc->stream);
    for (int i = 0; i < CUDA_IPC_EVENTS; i++) {
        if (ipc->ev[i])
            (void)f->event_destroy(ipc->ev[i]);
        if (ipc->scratch[i])
            (void)f->mem_free(ipc->scratch[i]);
    }
    if (ipc->stream)
        (void)f->stream_destroy(ipc->stream);
    free(ipc);
}

void cuda_ipc_close_all(struct cuda_ipc_maps *m)
{
    for (size_t i = 0; i < m->nopen; i++)
        close_one(&m->open[i]);
    free(m->open);
    *m = (struct cuda_ipc_maps){0};
}
