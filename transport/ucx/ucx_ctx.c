/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The UCX transport: one UCP context and worker per communicator, restricted to network
 * transports (RESHARD_NET_TLS, never shared memory) so that traffic between domains really
 * crosses the network. Endpoints are made before a plan first runs; UCX's peer error mode (a
 * dead peer fails its requests at once) is on request, since it costs bandwidth. Waiting arms
 * the worker and sleeps on its event fd, so many ranks can share a core.
 *
 * UCX matches a receive by tag alone, from whichever endpoint. So that a message from one
 * peer never fills a receive posted for another, the tag on the wire carries the sender in its
 * high UCX_ID_BITS bits (the caller's tag in the low TP_TAG_BITS), and a receive from peer p
 * matches p's number in them: the number the receiver gives the sender, which the receiver's
 * address (for that peer) tells the sender. This stops a confused or misconfigured rank; a rank
 * that forges another's number is beyond what UCX's tags can tell apart. A tag that uses the
 * transport's bits itself is matched whole, without the sender: the NCCL plugin's, whose tags
 * are receive comm id << 32 | NCCL's tag, once a device has made 4,096 receive comms.
 */
#include "ucx_lib.h"
#include "transport/tp.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define UCX_ID_BITS  (64 - TP_TAG_BITS)
#define UCX_ID_MAX   ((UINT32_C(1) << UCX_ID_BITS) - 1)
#define UCX_ID_MAGIC 0x55435849u /* "IXCU": the trailer of this transport's addresses */

/* A UCX worker address starts with its format's version in the low 4 bits of its first byte:
 * 0 (V1) or 1 (V2) in every UCX to date; the worker's 64-bit uuid follows the header. */
#define UCX_ADDR_VERSION_MASK 0xfu
#define UCX_ADDR_VERSION_MAX  1u
#define UCX_ADDR_MIN          10

struct ucx_id_trailer { /* after the worker address: the number its context gives the peer */
    uint32_t magic;
    int32_t index; /* -1: peers are numbered by rank */
};

struct ucx_peer {
    ucp_ep_h ep;
    void *addr;
    size_t addr_len;
    uint32_t id_there; /* the number the peer gives this context: the high bits of what it sends */
};

/* tp_req.state */
enum { REQ_POSTING, REQ_POSTED, REQ_DEFERRED };

struct ucx_ctx {
    struct tp_ctx super;
    struct tp_deferred deferred; /* completed inside their posting call */
    const struct ucx_fns *f;
    ucp_context_h context;
    ucp_worker_h worker;
    int efd;
    int rank, size;
    int peer_errors; /* UCX's peer error mode, on request (it costs bandwidth) */
    struct ucx_peer *peers;
    size_t peers_cap;
    void **closing; /* endpoint closes still in flight (close_peer) */
    size_t n_closing, closing_cap;
};

static struct ucx_ctx *to_ucx(struct tp_ctx *c)
{
    return container_of(c, struct ucx_ctx, super);
}

static reshard_status_t ucx_fail(const struct ucx_ctx *u, const char *call, ucs_status_t st)
{
    return rs_error(ucx_status(st), "UCX %s: %s", call, u->f->ucs_status_string(st));
}

static reshard_status_t make_context(struct ucx_ctx *u, const struct tp_config *cfg)
{
    ucp_config_t *config;
    ucs_status_t st = u->f->ucp_config_read(NULL, NULL, &config);
    if (st != UCS_OK)
        return ucx_fail(u, "ucp_config_read", st);
    /* UCX's TCP transport connects blocking by default, inside ucp_ep_create: to a peer whose
     * link went down that waits out the kernel's SYN retries (about 2 minutes), past any
     * timeout of ours, and the emulated cluster's link-down test saw ranks hang there. Connects
     * are made non-blocking unless the user chose (UCX_TCP_CONN_NB); a peer that cannot be
     * reached then fails its requests, or our timeout ends the wait. (UCX_TCP_SYN_CNT would
     * bound the retries, but any value of it fails worker creation in UCX 1.13.) The key is
     * the tcp transport's own name, without its TCP_ prefix. */
    if (!getenv("UCX_TCP_CONN_NB") && u->f->ucp_config_modify(config, "CONN_NB", "y") != UCS_OK)
        rs_log(RS_LOG_TRACE, "UCX: TCP_CONN_NB not settable: connects may outlast RESHARD_TIMEOUT");
    const char *tls = cfg->tls, *devs = cfg->devices;
    if (tls && *tls && (st = u->f->ucp_config_modify(config, "TLS", tls)) != UCS_OK) {
        u->f->ucp_config_release(config);
        return rs_error(ucx_status(st), "UCX: RESHARD_NET_TLS=%s rejected: %s", tls,
                        u->f->ucs_status_string(st));
    }
    if (devs && *devs && (st = u->f->ucp_config_modify(config, "NET_DEVICES", devs)) != UCS_OK) {
        u->f->ucp_config_release(config);
        return rs_error(ucx_status(st), "UCX: network devices '%s' rejected: %s", devs,
                        u->f->ucs_status_string(st));
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
    };
    st = u->f->ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, &params, config, &u->context);
    u->f->ucp_config_release(config);
    if (st != UCS_OK)
        return ucx_fail(u, "ucp_init", st);
    ucp_context_attr_t attr = {.field_mask = UCP_ATTR_FIELD_MEMORY_TYPES};
    if (u->f->ucp_context_query(u->context, &attr) == UCS_OK &&
        (attr.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA)))
        u->super.device_mem = 1;
    else
        snprintf(u->super.device_mem_why, sizeof(u->super.device_mem_why),
                 "this UCX has no CUDA memory support (built without CUDA, or no cuda "
                 "transport loaded)");
    return RESHARD_OK;
}

static reshard_status_t make_worker(struct ucx_ctx *u, int serialized)
{
    ucp_worker_params_t wp = {
        .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = serialized ? UCS_THREAD_MODE_SERIALIZED : UCS_THREAD_MODE_SINGLE,
    };
    ucs_status_t st = u->f->ucp_worker_create(u->context, &wp, &u->worker);
    if (st != UCS_OK)
        return ucx_fail(u, "ucp_worker_create", st);
    if ((st = u->f->ucp_worker_get_efd(u->worker, &u->efd)) != UCS_OK)
        return ucx_fail(u, "ucp_worker_get_efd", st);
    return RESHARD_OK;
}

static void ucx_close(struct tp_ctx *c);

static reshard_status_t ucx_init(const struct tp_config *cfg, struct tp_ctx **out)
{
    const struct ucx_fns *f = ucx_lib();
    if (!f)
        return RESHARD_ERR_UNAVAILABLE;
    struct ucx_ctx *u = rs_calloc(1, sizeof(*u), "UCX context");
    if (!u)
        return RESHARD_ERR_NO_MEMORY;
    u->super.ops = &tp_ucx_ops;
    u->super.failed_peer = -1;
    tp_deferred_init(&u->deferred);
    u->f = f;
    u->rank = cfg->rank;
    u->size = cfg->size;
    u->peer_errors = cfg->peer_errors;
    u->efd = -1;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    u->peers_cap = cfg->size > 0 ? (size_t)cfg->size : 1;
    u->peers = rs_calloc(u->peers_cap, sizeof(*u->peers), "UCX peers");
    if (!u->peers)
        goto err_close;
    RS_CHECK_GOTO(make_context(u, cfg), st, err_close);
    RS_CHECK_GOTO(make_worker(u, cfg->serialized), st, err_close);
    *out = &u->super;
    return RESHARD_OK;
err_close: /* ucx_close undoes whatever part was made */
    ucx_close(&u->super);
    return st;
}

/* The worker's address, then the number this context gives the peer it is for. */
static reshard_status_t ucx_address(struct tp_ctx *c, int peer, void *buf, size_t *len)
{
    struct ucx_ctx *u = to_ucx(c);
    if (peer > (int)UCX_ID_MAX)
        return rs_error(RESHARD_ERR_TOO_LARGE, "UCX: peer number %d does not fit %d tag bits", peer,
                        UCX_ID_BITS);
    ucp_address_t *addr;
    size_t n;
    ucs_status_t st = u->f->ucp_worker_get_address(u->worker, &addr, &n);
    if (st != UCS_OK)
        return ucx_fail(u, "ucp_worker_get_address", st);
    reshard_status_t ret = RESHARD_OK;
    struct ucx_id_trailer t = {.magic = UCX_ID_MAGIC, .index = peer < 0 ? -1 : peer};
    if (n + sizeof(t) > *len) {
        ret = rs_error(RESHARD_ERR_TOO_LARGE, "UCX worker address is %zu bytes, room for %zu",
                       n + sizeof(t), *len);
    } else {
        memcpy(buf, addr, n);
        memcpy((char *)buf + n, &t, sizeof(t));
    }
    *len = n + sizeof(t);
    u->f->ucp_worker_release_address(u->worker, addr);
    return ret;
}

static reshard_status_t ucx_set_peer(struct tp_ctx *c, int peer, const void *addr, size_t len)
{
    struct ucx_ctx *u = to_ucx(c);
    if (peer < 0 || peer > (int)UCX_ID_MAX)
        return rs_error(RESHARD_ERR_INTERNAL, "UCX: peer %d is not a peer", peer);
    struct ucx_id_trailer t;
    if (len <= sizeof(t))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "UCX: rank %d's address is %zu bytes, not a reshard UCX address", peer,
                        len);
    memcpy(&t, (const char *)addr + len - sizeof(t), sizeof(t));
    len -= sizeof(t);
    uint32_t id = t.index < 0 ? (uint32_t)u->rank : (uint32_t)t.index;
    if (t.magic != UCX_ID_MAGIC || t.index < -1 || (t.index < 0 && u->rank < 0) || id > UCX_ID_MAX)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "UCX: rank %d's address is not a reshard UCX address of this version "
                        "(trailer 0x%08x, peer number %d)",
                        peer, t.magic, t.index);
    /* UCX parses a worker address without its length and aborts the process on a version it
     * does not know (ucp_address_unpack): the header's version (its low 4 bits, V1 or V2) is
     * checked here. What follows it only UCX can judge (see docs/nccl.md, Security). */
    unsigned version = ((const unsigned char *)addr)[0] & UCX_ADDR_VERSION_MASK;
    if (len < UCX_ADDR_MIN || version > UCX_ADDR_VERSION_MAX)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "UCX: rank %d's address is not a UCX worker address (%zu bytes, "
                        "address version %u)",
                        peer, len, version);
    if ((size_t)peer >= u->peers_cap) {
        size_t cap = u->peers_cap;
        struct ucx_peer *p = rs_grow(u->peers, &cap, (size_t)peer + 1, sizeof(*p), "UCX peers");
        if (!p)
            return RESHARD_ERR_NO_MEMORY;
        memset(p + u->peers_cap, 0, (cap - u->peers_cap) * sizeof(*p));
        u->peers = p;
        u->peers_cap = cap;
    }
    if (peer >= u->size)
        u->size = peer + 1;
    void *copy = rs_calloc(1, len, "a UCX peer address");
    if (!copy)
        return RESHARD_ERR_NO_MEMORY;
    memcpy(copy, addr, len);
    free(u->peers[peer].addr);
    u->peers[peer].addr = copy;
    u->peers[peer].addr_len = len;
    u->peers[peer].id_there = id;
    return RESHARD_OK;
}

static void on_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    struct ucx_ctx *u = arg;
    /* Which peer: the endpoint is found by a scan, on a path that only runs on failure. */
    for (int r = 0; r < u->size; r++)
        if (u->peers[r].ep == ep && u->super.failed_peer < 0) {
            u->super.failed_peer = r;
            snprintf(u->super.failed_why, sizeof(u->super.failed_why), "%s",
                     u->f->ucs_status_string(status));
        }
}

static reshard_status_t get_ep(struct ucx_ctx *u, int peer, ucp_ep_h *ep)
{
    if (peer < 0 || peer >= u->size)
        return rs_error(RESHARD_ERR_INTERNAL, "UCX: peer %d is not a peer", peer);
    struct ucx_peer *p = &u->peers[peer];
    if (p->ep) {
        *ep = p->ep;
        return RESHARD_OK;
    }
    if (!p->addr)
        return rs_error(RESHARD_ERR_INTERNAL, "UCX: no address for rank %d", peer);
    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = p->addr,
        .err_mode = u->peer_errors ? UCP_ERR_HANDLING_MODE_PEER : UCP_ERR_HANDLING_MODE_NONE,
        .err_handler = {.cb = on_ep_error, .arg = u},
    };
    ucs_status_t st = u->f->ucp_ep_create(u->worker, &ep_params, &p->ep);
    if (st != UCS_OK)
        return rs_error(ucx_status(st), "UCX ucp_ep_create to rank %d: %s", peer,
                        u->f->ucs_status_string(st));
    u->super.counters.connects++;
    *ep = p->ep;
    return RESHARD_OK;
}

static reshard_status_t ucx_mem_reg(struct tp_ctx *c, void *addr, size_t len, enum tp_mem mem,
                                    void **mh)
{
    struct ucx_ctx *u = to_ucx(c);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE,
        .address = addr,
        .length = len,
        .memory_type = mem == TP_MEM_CUDA ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST,
    };
    ucp_mem_h memh;
    ucs_status_t st = u->f->ucp_mem_map(u->context, &mp, &memh);
    if (st != UCS_OK)
        return rs_error(ucx_status(st), "UCX ucp_mem_map of %zu bytes at %p: %s", len, addr,
                        u->f->ucs_status_string(st));
    *mh = memh;
    return RESHARD_OK;
}

static void ucx_mem_dereg(struct tp_ctx *c, void *mh)
{
    struct ucx_ctx *u = to_ucx(c);
    if (mh)
        u->f->ucp_mem_unmap(u->context, mh);
}

/* UCX 1.13 may run a callback inside the posting call even with NO_IMM_CMPL: such a
 * completion waits for the next progress(), as the ops table promises. */
static void complete(struct ucx_ctx *u, struct tp_req *req, reshard_status_t st, size_t got)
{
    req->handle = NULL;
    if (req->state == REQ_POSTING) {
        req->state = REQ_DEFERRED;
        tp_defer(&u->deferred, req, st, got);
        return;
    }
    req->done(req, st, got);
}

static void send_done(void *request, ucs_status_t status, void *user_data)
{
    struct tp_req *req = user_data;
    struct tp_ctx *c = req->ctx;
    to_ucx(c)->f->ucp_request_free(request);
    req->why = status == UCS_OK ? NULL : to_ucx(c)->f->ucs_status_string(status);
    if (status == UCS_OK) {
        if (req->ctrl)
            c->counters.ctrl_out++;
        else
            c->counters.bytes_out += req->len, c->counters.msgs_out++;
    }
    complete(to_ucx(c), req, ucx_status(status), req->len);
}

static void recv_done(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info,
                      void *user_data)
{
    struct tp_req *req = user_data;
    struct tp_ctx *c = req->ctx;
    to_ucx(c)->f->ucp_request_free(request);
    size_t got = status == UCS_OK ? info->length : 0;
    /* UCX tells a truncated receive the message's length (the sender's size). */
    if (status == UCS_ERR_MESSAGE_TRUNCATED && info)
        got = info->length;
    req->why = status == UCS_OK ? NULL : to_ucx(c)->f->ucs_status_string(status);
    if (status == UCS_OK && !req->ctrl)
        c->counters.bytes_in += got;
    complete(to_ucx(c), req, ucx_status(status), got);
}

static reshard_status_t posted(struct ucx_ctx *u, struct tp_req *req, ucs_status_ptr_t sp,
                               const char *what)
{
    if (sp == NULL && req->state == REQ_POSTING) {
        /* Done at once without a callback (NO_IMM_CMPL should prevent it): a send is
         * complete; a receive's length is unknown, so it is reported as failed. */
        int send = !strcmp(what, "tag send");
        if (send && !req->ctrl)
            req->ctx->counters.bytes_out += req->len, req->ctx->counters.msgs_out++;
        else if (send)
            req->ctx->counters.ctrl_out++;
        complete(u, req, send ? RESHARD_OK : RESHARD_ERR_INTERNAL, req->len);
        return RESHARD_OK;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        req->state = REQ_POSTED;
        ucs_status_t st = UCS_PTR_STATUS(sp);
        return rs_error(ucx_status(st), "UCX %s (rank %d): %s", what, req->peer,
                        u->f->ucs_status_string(st));
    }
    if (req->state == REQ_POSTING) { /* else it completed already and sp is freed */
        req->state = REQ_POSTED;
        req->handle = sp;
    }
    return RESHARD_OK;
}

/* The tag on the wire: the sender's number (as the receiver knows it) above the caller's. A
 * tag that uses those bits itself goes as it is (see the top of this file). */
static uint64_t wire_tag(uint64_t tag, uint32_t sender)
{
    return tag & ~TP_TAG_MASK ? tag : (uint64_t)sender << TP_TAG_BITS | tag;
}

static reshard_status_t ucx_send(struct tp_ctx *c, int peer, uint64_t tag, const void *buf,
                                 size_t len, void *mh, int ctrl, struct tp_req *req)
{
    struct ucx_ctx *u = to_ucx(c);
    ucp_ep_h ep = NULL;
    RS_CHECK(get_ep(u, peer, &ep));
    tp_req_start(c, req, peer, len, ctrl, REQ_POSTING);
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL | (mh ? UCP_OP_ATTR_FIELD_MEMH : 0),
        .cb.send = send_done,
        .user_data = req,
        .memh = mh,
    };
    uint64_t wire = wire_tag(tag, u->peers[peer].id_there);
    return posted(u, req, u->f->ucp_tag_send_nbx(ep, buf, len, wire, &p), "tag send");
}

static reshard_status_t ucx_recv(struct tp_ctx *c, int peer, uint64_t tag, void *buf, size_t len,
                                 void *mh, struct tp_req *req)
{
    struct ucx_ctx *u = to_ucx(c);
    if (peer < 0 || peer > (int)UCX_ID_MAX)
        return rs_error(RESHARD_ERR_INTERNAL, "UCX: receive from peer %d, not a peer", peer);
    tp_req_start(c, req, peer, len, 0, REQ_POSTING);
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL | (mh ? UCP_OP_ATTR_FIELD_MEMH : 0),
        .cb.recv = recv_done,
        .user_data = req,
        .memh = mh,
    };
    uint64_t wire = wire_tag(tag, (uint32_t)peer);
    return posted(u, req, u->f->ucp_tag_recv_nbx(u->worker, buf, len, wire, UINT64_MAX, &p),
                  "tag recv");
}

static reshard_status_t ucx_recv_iov(struct tp_ctx *c, int peer, uint64_t tag,
                                     const struct iovec *iov, size_t n, struct tp_req *req)
{
    _Static_assert(sizeof(ucp_dt_iov_t) == sizeof(struct iovec) &&
                       offsetof(ucp_dt_iov_t, length) == offsetof(struct iovec, iov_len),
                   "ucp_dt_iov_t and struct iovec differ");
    struct ucx_ctx *u = to_ucx(c);
    if (peer < 0 || peer > (int)UCX_ID_MAX)
        return rs_error(RESHARD_ERR_INTERNAL, "UCX: receive from peer %d, not a peer", peer);
    tp_req_start(c, req, peer, 0, 0, REQ_POSTING);
    ucp_request_param_t p = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv = recv_done,
        .user_data = req,
        .datatype = ucp_dt_make_iov(),
    };
    uint64_t wire = wire_tag(tag, (uint32_t)peer);
    return posted(u, req, u->f->ucp_tag_recv_nbx(u->worker, (void *)iov, n, wire, UINT64_MAX, &p),
                  "tag recv");
}

static void ucx_cancel(struct tp_ctx *c, struct tp_req *req)
{
    struct ucx_ctx *u = to_ucx(c);
    if (!req->handle)
        return;
    /* UCX completes a cancelled receive inside ucp_request_cancel: marked as posting, the
     * request's completion waits for the next progress(), as the ops table promises. (UCX
     * cancels posted receives only; a send ends when its peer or its endpoint does.) */
    req->state = REQ_POSTING;
    u->f->ucp_request_cancel(u->worker, req->handle);
    if (req->state == REQ_POSTING)
        req->state = REQ_POSTED;
}

static void reap_closing(struct ucx_ctx *u, int all);

static int ucx_progress(struct tp_ctx *c)
{
    struct ucx_ctx *u = to_ucx(c);
    int n = tp_deliver(&u->deferred) + (int)u->f->ucp_worker_progress(u->worker);
    if (u->n_closing)
        reap_closing(u, 0);
    return n;
}

static reshard_status_t ucx_wait(struct tp_ctx *c, int timeout_ms)
{
    struct ucx_ctx *u = to_ucx(c);
    if (u->deferred.head || u->f->ucp_worker_progress(u->worker))
        return RESHARD_OK;
    ucs_status_t st = u->f->ucp_worker_arm(u->worker);
    if (st == UCS_ERR_BUSY)
        return RESHARD_OK; /* events arrived between progress and arm */
    if (st != UCS_OK)
        return ucx_fail(u, "ucp_worker_arm", st);
    struct pollfd pfd = {.fd = u->efd, .events = POLLIN};
    if (poll(&pfd, 1, timeout_ms) < 0 && errno != EINTR)
        return rs_error(RESHARD_ERR_NETWORK, "poll on the UCX event fd: %m");
    return RESHARD_OK;
}

static reshard_status_t ucx_connect(struct tp_ctx *c, int peer)
{
    ucp_ep_h ep = NULL;
    return get_ep(to_ucx(c), peer, &ep);
}

/* Starts closing peer's endpoint; the close request joins u->closing, reaped by progress. A
 * forced close needs peer error mode on both sides; without it the close flushes, and the
 * waits on it are bounded by whoever waits (close_eps). */
static void start_close(struct ucx_ctx *u, int peer)
{
    ucp_request_param_t p = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                             .flags = u->peer_errors ? UCP_EP_CLOSE_FLAG_FORCE : 0};
    void *sp = u->f->ucp_ep_close_nbx(u->peers[peer].ep, &p);
    u->peers[peer].ep = NULL;
    if (!UCS_PTR_IS_PTR(sp))
        return;
    void **grown = rs_grow(u->closing, &u->closing_cap, u->n_closing + 1, sizeof(*grown),
                           "UCX endpoint closes");
    if (!grown) { /* UCX releases a freed request when it completes */
        u->f->ucp_request_free(sp);
        return;
    }
    u->closing = grown;
    u->closing[u->n_closing++] = sp;
}

/* Releases the closes that finished; with `all`, the others too (they are not waited for). */
static void reap_closing(struct ucx_ctx *u, int all)
{
    size_t kept = 0;
    for (size_t i = 0; i < u->n_closing; i++) {
        if (!all && u->f->ucp_request_check_status(u->closing[i]) == UCS_INPROGRESS)
            u->closing[kept++] = u->closing[i];
        else
            u->f->ucp_request_free(u->closing[i]);
    }
    u->n_closing = kept;
}

/* At teardown, after the communicator's last barrier (or after a failure): closes every
 * endpoint, waiting at most 5 s for peers that may be gone, and releases what is left. */
static void close_eps(struct ucx_ctx *u)
{
    for (int r = 0; r < u->size; r++)
        if (u->peers[r].ep)
            start_close(u, r);
    int64_t start = rs_now_ms();
    for (;;) {
        u->f->ucp_worker_progress(u->worker);
        reap_closing(u, 0);
        if (!u->n_closing || rs_now_ms() - start > 5000)
            break;
        if (u->f->ucp_worker_arm(u->worker) == UCS_OK) { /* sleep, do not spin, meanwhile */
            struct pollfd pfd = {.fd = u->efd, .events = POLLIN};
            poll(&pfd, 1, 10);
        }
    }
    reap_closing(u, 1);
}

static void ucx_close_peer(struct tp_ctx *c, int peer)
{
    struct ucx_ctx *u = to_ucx(c);
    if (peer < 0 || peer >= u->size)
        return;
    if (u->peers[peer].ep)
        start_close(u, peer);
    free(u->peers[peer].addr); /* the index may serve another peer next */
    u->peers[peer].addr = NULL;
}

static void ucx_disconnect(struct tp_ctx *c)
{
    struct ucx_ctx *u = to_ucx(c);
    close_eps(u);
    tp_deliver(&u->deferred);
}

static void ucx_close(struct tp_ctx *c)
{
    if (!c)
        return;
    struct ucx_ctx *u = to_ucx(c);
    if (u->peers) {
        if (u->worker)
            close_eps(u);
        for (int r = 0; r < u->size; r++)
            free(u->peers[r].addr);
    }
    if (u->worker)
        u->f->ucp_worker_destroy(u->worker);
    if (u->context)
        u->f->ucp_cleanup(u->context);
    free(u->peers);
    free(u->closing);
    free(u);
}

const struct tp_ops tp_ucx_ops = {
    .size = sizeof(struct tp_ops),
    .name = "ucx",
    .init = ucx_init,
    .address = ucx_address,
    .set_peer = ucx_set_peer,
    .connect = ucx_connect,
    .mem_reg = ucx_mem_reg,
    .mem_dereg = ucx_mem_dereg,
    .send = ucx_send,
    .recv = ucx_recv,
    .recv_iov = ucx_recv_iov,
    .cancel = ucx_cancel,
    .progress = ucx_progress,
    .wait = ucx_wait,
    .disconnect = ucx_disconnect,
    .close_peer = ucx_close_peer,
    .close = ucx_close,
};
