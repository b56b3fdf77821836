/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Data path of the network plugin: registrations, isend, grouped irecv, flush and test.
 * Requests live in a fixed pool per comm (NCCL's limit of 32 outstanding, times the receive
 * group size on the send side), so exceeding the limit is an error NCCL can report; NCCL holds
 * a registry handle for each while it is active, so a request tested again after it
 * completed, or after its comm closed, is recognised rather than read after free.
 */
#include "net_int.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "cuda/cuda_lib.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#define WATCH_PERIOD_MS 1 /* how often a test that finds nothing done reads the socket */
/* Data the peer sent just before it died may still be in the transport's socket when the
 * handshake socket's end arrives: outstanding transfers get this long to complete. */
#define DEATH_GRACE_MS 200
/* After an orderly close the peer's last sends may still be flushing; a transfer still
 * outstanding this long after the goodbye will never complete. */
#define CLOSE_GRACE_MS 10000
/* A transfer the transport failed: a dying peer's process closes its transport sockets and
 * this one in turn, and on a busy host the handshake socket's end may come a little after the
 * transport's; wait this long for it, once, so the error says the process died (the device's
 * lock is held meanwhile: once per failed comm, the other comms' tests wait too). */
#define DEATH_WAIT_MS 500

static const char *comm_kind(const struct net_comm *c)
{
    return c->kind == NET_KIND_SEND ? "send" : "receive";
}

void net_comm_fail(struct net_comm *c, reshard_status_t st, const char *fmt, ...)
{
    if (c->failed != RESHARD_OK)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof(c->why), fmt, ap);
    va_end(ap);
    c->failed = st;
    rs_log(RS_LOG_WARN, "NET/Reshard: %s comm with %s failed: %s", comm_kind(c), c->peer_name,
           c->why);
    for (int i = 0; c->dev->tp && i < c->nreqs; i++)
        if (c->reqs[i].state != REQ_FREE)
            net_req_cancel(&c->reqs[i]);
}

void net_req_cancel(struct net_req *r)
{
    const struct net_dev *d = r->comm->dev;
    for (int j = 0; j < r->nsub; j++)
        net_rail(d, j % d->nrails)->ops->cancel(net_rail(d, j % d->nrails), &r->sub[j].tp);
}

static void watch_read(struct net_comm *c, int64_t now)
{
    char buf[16];
    ssize_t n = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0 && memchr(buf, 'B', (size_t)n))
        c->goodbye_ms = c->goodbye_ms ? c->goodbye_ms : now;
    else if (n > 0)
        net_comm_fail(c, RESHARD_ERR_NETWORK, "unexpected bytes on the connection's socket");
    else if (n == 0)
        c->eof_ms = now;
    else if (errno != EAGAIN && errno != EINTR) /* reset, or keepalive gave up on the host */
        net_comm_fail(c, RESHARD_ERR_NETWORK, "connection to the peer lost: %s", strerror(errno));
}

void net_comm_watch(struct net_comm *c, int force)
{
    if (c->failed != RESHARD_OK || c->fd < 0)
        return;
    int64_t now = rs_now_ms();
    if (!force && now < c->next_check_ms)
        return;
    c->next_check_ms = now + WATCH_PERIOD_MS;
    if (!c->eof_ms && force) { /* the transport failed: give the socket's end time to come */
        struct pollfd p = {.fd = c->fd, .events = POLLIN | POLLRDHUP};
        while (poll(&p, 1, DEATH_WAIT_MS) < 0 && errno == EINTR)
            ;
    }
    if (!c->eof_ms)
        watch_read(c, now);
    if (c->eof_ms && !c->goodbye_ms && (force || now - c->eof_ms >= DEATH_GRACE_MS))
        net_comm_fail(c, RESHARD_ERR_NETWORK,
                      "the peer's end of the connection closed without closing the comm (its "
                      "process died)");
    else if (c->goodbye_ms && now - c->goodbye_ms >= CLOSE_GRACE_MS)
        net_comm_fail(c, RESHARD_ERR_NETWORK,
                      "the peer closed the comm %d s ago with this transfer outstanding",
                      CLOSE_GRACE_MS / 1000);
}

/* ---- registrations ---- */

/* The comm behind handle comm, of one of the kinds; an error naming call otherwise. */
static reshard_status_t comm_get(void *comm, unsigned kinds, const char *call,
                                 struct net_comm **out)
{
    int stale;
    if ((*out = net_live_get(comm, kinds, &stale)))
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: %s on %p, which is not an open %s%s",
                    call, comm,
                    kinds == NET_KINDS(NET_KIND_SEND)   ? "send comm"
                    : kinds == NET_KINDS(NET_KIND_RECV) ? "receive comm"
                                                        : "send or receive comm",
                    stale ? " (it was closed already)" : "");
}

#define ANY_COMM (NET_KINDS(NET_KIND_SEND) | NET_KINDS(NET_KIND_RECV))

static const char *ptr_name(int type)
{
    return type == NET_PTR_HOST     ? "NCCL_PTR_HOST"
           : type == NET_PTR_CUDA   ? "NCCL_PTR_CUDA"
           : type == NET_PTR_DMABUF ? "NCCL_PTR_DMABUF"
                                    : "an unknown kind";
}

/* Whether the memory at data is what the call says it is: the CUDA driver, where there is one,
 * knows device memory. A CUDA pointer registered as host memory would make the NIC write host
 * pages that are not there; a host pointer registered as device memory fails in the driver. */
static reshard_status_t kind_check(const char *call, const struct net_dev *d, const void *data,
                                   int device)
{
    struct rs_saved_error saved;
    rs_error_save(&saved);
    enum cuda_mem_kind k = cuda_mem_kind(data);
    rs_error_restore(&saved);
    if (device && k != CUDA_MEM_DEVICE)
        return rs_error(RESHARD_ERR_BUFFER,
                        "NET/Reshard: %s of %p on %s as device memory: the CUDA driver knows it "
                        "as %s memory",
                        call, data, d->name, cuda_mem_kind_name(k));
    if (!device && k == CUDA_MEM_DEVICE)
        return rs_error(RESHARD_ERR_BUFFER,
                        "NET/Reshard: %s of %p on %s as host memory (NCCL_PTR_HOST): the CUDA "
                        "driver knows it as device memory",
                        call, data, d->name);
    return RESHARD_OK;
}

/* A registration of [data, data + size) on c's device: the transport's (mem_reg, or
 * mem_reg_dmabuf with fd >= 0), and NCCL's handle for it. */
static reshard_status_t mr_make(struct net_comm *c, void *data, size_t size, int device, int fd,
                                uint64_t offset, void **mh)
{
    struct net_dev *d = c->dev;
    struct net_mr *m = rs_calloc(1, sizeof(*m), "NET/Reshard registration");
    if (!m)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st =
        (m->handle = net_live_add(m, NET_KIND_MR)) ? RESHARD_OK : RESHARD_ERR_NO_MEMORY;
    enum tp_mem mem = device && !net_device_as_host() ? TP_MEM_CUDA : TP_MEM_HOST;
    pthread_mutex_lock(&d->lock);
    if (st == RESHARD_OK)
        st = net_dev_tp(d);
    /* A transport cannot map nothing; an empty registration covers empty messages. */
    for (int r = 0; st == RESHARD_OK && size && r < d->nrails; r++) {
        struct tp_ctx *tp = net_rail(d, r);
        if (fd >= 0 && mem == TP_MEM_CUDA)
            st = tp->ops->mem_reg_dmabuf(tp, data, size, fd, offset, &m->tp_mh[r]);
        else
            st = tp->ops->mem_reg(tp, data, size, mem, &m->tp_mh[r]);
        if (st != RESHARD_OK)
            while (r-- > 0)
                net_rail(d, r)->ops->mem_dereg(net_rail(d, r), m->tp_mh[r]);
    }
    if (st == RESHARD_OK)
        d->users++; /* the transport context stays until the registration goes */
    pthread_mutex_unlock(&d->lock);
    if (st != RESHARD_OK) {
        net_live_drop(m->handle);
        free(m);
        return st;
    }
    m->dev = d;
    m->base = data;
    m->len = size;
    m->device = device;
    *mh = m->handle;
    return RESHARD_OK;
}

/* The device takes memory of this kind (ptrSupport); an error naming the call otherwise. */
static reshard_status_t takes(const char *call, const struct net_dev *d, const void *data, int type)
{
    if (d->ptr_support & type)
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "NET/Reshard: %s cannot register %s at %p on %s: the device takes %s (its "
                    "ptrSupport; its INIT line says why)",
                    call, type == NET_PTR_CUDA ? "CUDA device memory" : "a dma-buf", data, d->name,
                    d->ptr_support & NET_PTR_CUDA ? "host and CUDA memory, not dma-bufs"
                                                  : "host memory only");
}

reshard_status_t net_reg_mr(void *comm, void *data, size_t size, int type, void **mh)
{
    struct net_comm *c;
    RS_CHECK(comm_get(comm, ANY_COMM, "regMr", &c));
    if (!mh)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: regMr without a handle pointer");
    if (type != NET_PTR_HOST && type != NET_PTR_CUDA)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: cannot register memory of type %d at %p on %s (regMr takes "
                        "NCCL_PTR_HOST or NCCL_PTR_CUDA)",
                        type, data, c->dev->name);
    if (size && !data)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: regMr of %zu bytes at NULL", size);
    RS_CHECK(takes("regMr", c->dev, data, type));
    if (size)
        RS_CHECK(kind_check("regMr", c->dev, data, type == NET_PTR_CUDA));
    return mr_make(c, data, size, type == NET_PTR_CUDA, -1, 0, mh);
}

/* Whether fd is a dma-buf (its file system's magic), or under RESHARD_TEST_DEVICE_AS_HOST=1
 * a memfd, which is what the stand-in driver exports; its size in *bytes. */
static int is_dmabuf(int fd, uint64_t *bytes)
{
    struct statfs fs;
    struct stat st;
    if (fstatfs(fd, &fs) != 0 || fstat(fd, &st) != 0)
        return 0;
    *bytes = (uint64_t)st.st_size;
    if (fs.f_type == DMA_BUF_MAGIC)
        return 1;
    return net_device_as_host() && fcntl(fd, F_GET_SEALS) >= 0;
}

reshard_status_t net_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                                   int fd, void **mh)
{
    struct net_comm *c;
    RS_CHECK(comm_get(comm, ANY_COMM, "regMrDmaBuf", &c));
    struct net_dev *d = c->dev;
    if (!mh)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: regMrDmaBuf without a handle pointer");
    if (type != NET_PTR_CUDA && type != NET_PTR_DMABUF)
        return rs_error(RESHARD_ERR_BUFFER,
                        "NET/Reshard: regMrDmaBuf of %p on %s as %s: a dma-buf holds device "
                        "memory (NCCL_PTR_CUDA or NCCL_PTR_DMABUF)",
                        data, d->name, ptr_name(type));
    if (!data || !size)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: regMrDmaBuf of %zu bytes at %p",
                        size, data);
    RS_CHECK(takes("regMrDmaBuf", d, data, NET_PTR_DMABUF));
    uint64_t bytes = 0;
    if (fd < 0 || !is_dmabuf(fd, &bytes))
        return rs_error(RESHARD_ERR_BUFFER,
                        "NET/Reshard: regMrDmaBuf of %zu bytes at %p on %s: file descriptor %d "
                        "is not a dma-buf",
                        size, data, d->name, fd);
    if (offset > bytes || size > bytes - offset)
        return rs_error(RESHARD_ERR_BUFFER,
                        "NET/Reshard: regMrDmaBuf of %zu bytes at %p on %s: offset %llu and size "
                        "run past the end of dma-buf %d (%llu bytes)",
                        size, data, d->name, (unsigned long long)offset, fd,
                        (unsigned long long)bytes);
    RS_CHECK(kind_check("regMrDmaBuf", d, data, 1));
    return mr_make(c, data, size, 1, fd, offset, mh);
}

/* The registration behind handle mh; an error naming call otherwise. */
static reshard_status_t mr_get(const void *mh, const char *call, struct net_mr **out)
{
    int stale;
    if ((*out = net_live_get(mh, NET_KINDS(NET_KIND_MR), &stale)))
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "NET/Reshard: %s with %p, which is not a registration of this plugin%s", call,
                    mh, stale ? " (it was deregistered already)" : "");
}

reshard_status_t net_dereg_mr(void *comm, void *mh)
{
    struct net_comm *c;
    struct net_mr *m;
    RS_CHECK(comm_get(comm, ANY_COMM, "deregMr", &c));
    RS_CHECK(mr_get(mh, "deregMr", &m));
    net_mr_free(m);
    return RESHARD_OK;
}

void net_mr_free(struct net_mr *m)
{
    net_live_drop(m->handle);
    pthread_mutex_lock(&m->dev->lock);
    for (int r = 0; r < m->dev->nrails; r++)
        if (m->tp_mh[r])
            net_rail(m->dev, r)->ops->mem_dereg(net_rail(m->dev, r), m->tp_mh[r]);
    m->dev->users--;
    pthread_mutex_unlock(&m->dev->lock);
    free(m);
}

/* The transport handle for [data, data + size), which must lie inside the registration. */
static reshard_status_t mr_for(const struct net_comm *c, void *mh, const void *data, size_t size,
                               struct net_mr **out)
{
    *out = NULL;
    if (size && !data)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: %s of %zu bytes at NULL",
                        c->kind == NET_KIND_SEND ? "isend" : "irecv", size);
    if (!mh)
        return RESHARD_OK;
    struct net_mr *m;
    RS_CHECK(mr_get(mh, comm_kind(c), &m));
    if (m->dev != c->dev)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: registration %p belongs to another device", mh);
    uintptr_t at = (uintptr_t)data, base = (uintptr_t)m->base; /* no pointer past the object */
    if (size && (at < base || at - base > m->len || size > m->len - (at - base)))
        return rs_error(RESHARD_ERR_BUFFER,
                        "NET/Reshard: %s of %zu bytes at %p on %s: they lie outside their "
                        "registration (%zu bytes at %p)",
                        c->kind == NET_KIND_SEND ? "isend" : "irecv", size, data, c->dev->name,
                        m->len, (void *)m->base);
    *out = m;
    return RESHARD_OK;
}

/* Rail r's handle of registration m (NULL: none). */
static void *rail_mh(const struct net_mr *m, int r)
{
    return m ? m->tp_mh[r] : NULL;
}

/* ---- requests ---- */

static void sub_done(struct tp_req *t, reshard_status_t st, size_t got)
{
    struct net_sub *s = container_of(t, struct net_sub, tp);
    struct net_req *r = s->req;
    struct net_comm *c = r->comm;
    int i = (int)(s - r->sub) / c->dev->nrails; /* the buffer, whatever the rail */
    c->in_transport--;
    r->pending--;
    if (c->kind == NET_KIND_RECV) /* a striped message's parts add up; a send's size is known */
        r->sizes[i] += got;
    /* Each rail offers the whole buffer, so a peer that sends more than its share on each
     * (every rail the whole message) brings more parts than the receive holds: its size would
     * reach NCCL larger than what it posted (and past an int on 8 rails of 1 GiB). */
    if (st == RESHARD_OK && c->kind == NET_KIND_RECV &&
        r->sizes[i] > r->sub[i * c->dev->nrails].tp.len) {
        st = RESHARD_ERR_TOO_LARGE;
        t->why = "the parts of a striped message add up to more than the receive";
    }
    if (st != RESHARD_OK && r->st == RESHARD_OK) {
        r->st = st;
        r->failed_sub = i;
        r->tp_why = t->why;
    }
    if (r->state == REQ_ABANDONED && !r->pending) { /* its handle went when it was abandoned */
        r->state = REQ_FREE;
        c->active--;
    }
}

/* dev->lock held. */
static reshard_status_t req_get(struct net_comm *c, int n, int nsub, struct net_req **out)
{
    if (c->failed != RESHARD_OK)
        return rs_error(c->failed, "NET/Reshard: %s comm with %s: %s", comm_kind(c), c->peer_name,
                        c->why);
    for (int i = 0; i < c->nreqs; i++) {
        struct net_req *r = &c->reqs[i];
        if (r->state != REQ_FREE)
            continue;
        if (!(r->handle = net_live_add(r, NET_KIND_REQ)))
            return RESHARD_ERR_NO_MEMORY;
        r->state = REQ_ACTIVE;
        r->n = n;
        r->nsub = nsub;
        r->pending = 0;
        r->st = RESHARD_OK;
        r->failed_sub = -1;
        r->tp_why = NULL;
        memset(r->sizes, 0, sizeof(r->sizes));
        for (int j = 0; j < nsub; j++) {
            r->sub[j].req = r;
            r->sub[j].tp.done = sub_done;
        }
        c->active++;
        *out = r;
        return RESHARD_OK;
    }
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "NET/Reshard: more than %d requests outstanding on the %s comm with %s "
                    "(NCCL allows %d)",
                    c->nreqs, comm_kind(c), c->peer_name, NET_MAX_REQUESTS);
}

/* The error of a request of c that failed with st: what the comm's socket found of the peer
 * (its process died, it closed the comm) when it found something, else the transport's status
 * and, for a post the transport refused, its message (transport_why, or NULL). */
static reshard_status_t req_error(struct net_comm *c, reshard_status_t st,
                                  const char *transport_why)
{
    int send = c->kind == NET_KIND_SEND;
    if (c->failed != RESHARD_OK)
        return rs_error(c->failed, "NET/Reshard: %s %s %s failed: %s", send ? "isend" : "irecv",
                        send ? "to" : "from", c->peer_name, c->why);
    return rs_error(st, "NET/Reshard: %s %s %s failed in the transport: %s",
                    send ? "isend" : "irecv", send ? "to" : "from", c->peer_name,
                    transport_why ? transport_why : rs_status_string(st));
}

/* A request of r->comm that failed with st in the transport: a receive smaller than its
 * message names both sizes (the transport tells the receiver the message's), and every failure
 * the transport's own status. (A sender learns of it only where the transport tells it: UCX
 * completes the send.) */
static reshard_status_t req_failed(const struct net_req *r, reshard_status_t st)
{
    struct net_comm *c = r->comm;
    int i = r->failed_sub;
    if (c->failed == RESHARD_OK && st == RESHARD_ERR_TOO_LARGE && c->kind == NET_KIND_RECV &&
        i >= 0) {
        char sent[48] = "a message";
        if (r->sizes[i])
            snprintf(sent, sizeof(sent), "a message of %zu bytes", r->sizes[i]);
        return rs_error(st,
                        "NET/Reshard: irecv from %s failed: %s arrived for a receive of %zu bytes "
                        "(buffer %d of %d; %s: %s)",
                        c->peer_name, sent, r->sub[i * c->dev->nrails].tp.len, i, r->n,
                        c->dev->tp->ops->name, r->tp_why ? r->tp_why : "message truncated");
    }
    return req_error(c, st, c->failed == RESHARD_OK ? r->tp_why : NULL);
}

/* A post the transport refused (or a comm already failed): judged like a failed request. */
static reshard_status_t post_error(struct net_comm *c, reshard_status_t st)
{
    char why[RS_ERROR_MAX];
    snprintf(why, sizeof(why), "%s", rs_error_message());
    net_comm_watch(c, 1);
    return req_error(c, st, why);
}

/* Gives up a request some of whose transfers were posted: it frees itself when they end. */
static void req_abandon(struct net_req *r)
{
    struct net_comm *c = r->comm;
    net_live_drop(r->handle);
    if (r->pending) {
        r->state = REQ_ABANDONED;
        net_req_cancel(r);
    } else {
        r->state = REQ_FREE;
        c->active--;
    }
}

/* One message, or on a virtual NIC of k rails one part per rail (part r is bytes
 * [size * r / k, size * (r + 1) / k), placed at that offset of the receive, which each rail
 * offers whole). */
reshard_status_t net_isend(void *send_comm, void *data, size_t size, int tag, void *mh, void **req)
{
    struct net_comm *c;
    RS_CHECK(comm_get(send_comm, NET_KINDS(NET_KIND_SEND), "isend", &c));
    if (!req)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: isend without a request pointer");
    if (size > NET_MAX_MESSAGE)
        return rs_error(RESHARD_ERR_TOO_LARGE,
                        "NET/Reshard: isend of %zu bytes exceeds maxP2pBytes (%zu)", size,
                        NET_MAX_MESSAGE);
    struct net_mr *m;
    RS_CHECK(mr_for(c, mh, data, size, &m));
    struct net_dev *d = c->dev;
    int k = d->nrails;
    struct net_req *r = NULL;
    pthread_mutex_lock(&d->lock);
    reshard_status_t st =
        c->failed != RESHARD_OK ? req_error(c, c->failed, NULL) : req_get(c, 1, k, &r);
    if (st == RESHARD_OK) {
        uint64_t t = (uint64_t)c->id << 32 | (uint32_t)tag;
        r->sizes[0] = size;
        for (int rr = 0; st == RESHARD_OK && rr < k; rr++) {
            struct tp_ctx *tp = net_rail(d, rr);
            size_t off = size / (size_t)k * (size_t)rr,
                   end = rr + 1 < k ? off + size / (size_t)k : size;
            st = k == 1
                     ? tp->ops->send(tp, c->peer, t, data, size, rail_mh(m, rr), 0, &r->sub[rr].tp)
                     : tp->ops->send_part(tp, c->peer, t, (char *)data + off, end - off,
                                          rail_mh(m, rr), off, &r->sub[rr].tp);
            if (st == RESHARD_OK) {
                r->pending++;
                c->in_transport++;
            }
        }
        if (st != RESHARD_OK) {
            st = post_error(c, st);
            req_abandon(r);
        }
    }
    pthread_mutex_unlock(&d->lock);
    RS_CHECK(st);
    *req = r->handle;
    return RESHARD_OK;
}

reshard_status_t net_irecv(void *recv_comm, int n, void **data, const size_t *sizes,
                           const int *tags, void **mhs, void **req)
{
    struct net_comm *c;
    RS_CHECK(comm_get(recv_comm, NET_KINDS(NET_KIND_RECV), "irecv", &c));
    if (!req || n < 1 || n > NET_MAX_RECVS || !data || !sizes || !tags)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: irecv of %d buffers (1 to maxRecvs=%d, with data, sizes and "
                        "tags)",
                        n, NET_MAX_RECVS);
    struct net_mr *m[NET_MAX_RECVS];
    for (int i = 0; i < n; i++) {
        if (sizes[i] > NET_MAX_MESSAGE)
            return rs_error(RESHARD_ERR_TOO_LARGE,
                            "NET/Reshard: irecv of %zu bytes exceeds maxP2pBytes (%zu)", sizes[i],
                            NET_MAX_MESSAGE);
        RS_CHECK(mr_for(c, mhs ? mhs[i] : NULL, data[i], sizes[i], &m[i]));
    }
    struct net_dev *d = c->dev;
    int k = d->nrails; /* each rail offers the whole buffer; its part lands where it belongs */
    struct net_req *r = NULL;
    pthread_mutex_lock(&d->lock);
    reshard_status_t st =
        c->failed != RESHARD_OK ? req_error(c, c->failed, NULL) : req_get(c, n, n * k, &r);
    for (int j = 0; st == RESHARD_OK && j < n * k; j++) {
        int i = j / k, rr = j % k;
        uint64_t t = (uint64_t)c->id << 32 | (uint32_t)tags[i];
        struct tp_ctx *tp = net_rail(d, rr);
        st = tp->ops->recv(tp, c->peer, t, data[i], sizes[i], rail_mh(m[i], rr), &r->sub[j].tp);
        if (st == RESHARD_OK) {
            r->pending++;
            c->in_transport++;
        } else {
            st = post_error(c, st);
        }
    }
    if (st != RESHARD_OK && r)
        req_abandon(r);
    pthread_mutex_unlock(&d->lock);
    RS_CHECK(st);
    *req = r->handle;
    return RESHARD_OK;
}

/* NCCL flushes a receive into device memory before its kernel reads it (GPUDirect RDMA): the
 * last buffer that got bytes is read back through the transport (ib: an RDMA read through a
 * queue pair connected to itself, as NCCL's own IB network does), which completes after the
 * network's writes are visible; a transport without a flush of its own asks the CUDA driver
 * (cuFlushGPUDirectRDMAWrites) and the flush is done at once (*req NULL). Only device
 * registrations are flushed: NCCL flushes nothing else, so host memory here is a caller's
 * mistake. */
reshard_status_t net_iflush(void *recv_comm, int n, void **data, const int *sizes, void **mhs,
                            void **req)
{
    struct net_comm *c;
    RS_CHECK(comm_get(recv_comm, NET_KINDS(NET_KIND_RECV), "iflush", &c));
    if (!req || n < 1 || n > NET_MAX_RECVS || !data || !sizes || !mhs)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: iflush of %d buffers (1 to maxRecvs=%d, with data, sizes "
                        "and registrations)",
                        n, NET_MAX_RECVS);
    struct net_dev *d = c->dev;
    int last = -1, k = d->nrails;
    struct net_mr *lm = NULL;
    for (int i = 0; i < n; i++) {
        struct net_mr *m;
        if (sizes[i] < 0)
            return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: iflush of %d bytes at %p",
                            sizes[i], data[i]);
        if (!sizes[i])
            continue;
        RS_CHECK(mr_get(mhs[i], "iflush", &m));
        struct net_mr *in;
        if (!m->device)
            return rs_error(RESHARD_ERR_BUFFER,
                            "NET/Reshard: iflush of %d bytes at %p on %s: a receive into host "
                            "memory needs no flush (NCCL flushes GPUDirect receives only)",
                            sizes[i], data[i], d->name);
        RS_CHECK(mr_for(c, mhs[i], data[i], (size_t)sizes[i], &in));
        last = i;
        lm = m;
    }
    *req = NULL;
    if (last < 0)
        return RESHARD_OK; /* nothing arrived: nothing to flush */
    if (!d->tp->ops->flush) {
        reshard_status_t st = cuda_flush_rdma_writes();
        if (st != RESHARD_OK)
            return rs_error(st, "NET/Reshard: iflush of %p on %s: %s", data[last], d->name,
                            rs_error_message());
        return RESHARD_OK;
    }
    struct net_req *r = NULL; /* one read per rail: each NIC's writes are flushed by its own */
    pthread_mutex_lock(&d->lock);
    reshard_status_t st =
        c->failed != RESHARD_OK ? req_error(c, c->failed, NULL) : req_get(c, 1, k, &r);
    for (int rr = 0; st == RESHARD_OK && rr < k; rr++) {
        struct tp_ctx *tp = net_rail(d, rr);
        st = tp->ops->flush(tp, lm->tp_mh[rr], data[last], (size_t)sizes[last], &r->sub[rr].tp);
        if (st == RESHARD_OK) {
            r->pending++;
            c->in_transport++;
        } else {
            st = rs_error(st, "NET/Reshard: iflush of %p on %s: %s", data[last], d->name,
                          rs_error_message());
            req_abandon(r);
        }
    }
    pthread_mutex_unlock(&d->lock);
    RS_CHECK(st);
    *req = r->handle;
    return RESHARD_OK;
}

reshard_status_t net_test(void *request, int *done, int *sizes)
{
    if (done)
        *done = 0; /* on every error path too: a failed test never reads as done */
    int stale;
    struct net_req *r = net_live_get(request, NET_KINDS(NET_KIND_REQ), &stale);
    if (!done)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: test without a done pointer");
    if (stale)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: test of request %p, which already completed or failed, or "
                        "whose comm was closed (a request is gone once test reports it done)",
                        request);
    if (!r)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: test of %p, which is not a request of an open comm", request);
    struct net_comm *c = r->comm;
    struct net_dev *d = c->dev;
    pthread_mutex_lock(&d->lock);
    if (r->pending)
        net_dev_progress(d);
    /* Still waiting, or failed by the transport: the socket says whether the peer is gone.
     * A transfer that completed is reported done whatever became of the comm since. */
    if (r->pending || r->st != RESHARD_OK)
        net_comm_watch(c, r->st != RESHARD_OK);
    reshard_status_t st = RESHARD_OK;
    if (r->pending)
        st = c->failed;
    else if (r->st != RESHARD_OK)
        st = c->failed != RESHARD_OK ? c->failed : r->st;
    if (st != RESHARD_OK) {
        st = req_failed(r, st);
        req_abandon(r);
    } else if (!r->pending) {
        if (sizes)
            for (int i = 0; i < r->n; i++)
                sizes[i] = (int)r->sizes[i]; /* at most NET_MAX_MESSAGE */
        net_live_drop(r->handle);
        r->state = REQ_FREE;
        c->active--;
    }
    *done = st == RESHARD_OK && r->state == REQ_FREE;
    pthread_mutex_unlock(&d->lock);
    return st;
}
