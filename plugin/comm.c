/* SPDX-License-Identifier: Apache-2.0 */
#include "comm.h"

#include "cma.h"
#include "error.h"
#include "log.h"
#include "param.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What every rank tells the others when the communicator forms. */
struct comm_hello {
    char host[COMM_HOST_MAX];
    int32_t pid;
    int32_t domain; /* RESHARD_DOMAIN, or -1 */
    uint32_t addr_len;
    char transport[8]; /* every rank must run the same one */
};

#define COMM_ADDR_MAX 4096

int comm_timeout_ms(void)
{
    int64_t s = rs_param_int(RS_PARAM_TIMEOUT);
    return s > INT32_MAX / 1000 ? INT32_MAX : (int)(s * 1000);
}

/* Dense ids, in order of first appearance, for the hostnames. */
static void number_hosts(const struct comm_hello *h, int n, int *node)
{
    int next = 0;
    for (int r = 0; r < n; r++) {
        node[r] = -1;
        for (int q = 0; q < r && node[r] < 0; q++)
            if (!strncmp(h[q].host, h[r].host, COMM_HOST_MAX))
                node[r] = node[q];
        if (node[r] < 0)
            node[r] = next++;
    }
}

static reshard_status_t make_topo(struct reshard_comm *c, const struct comm_hello *h)
{
    int64_t block = rs_param_int(RS_PARAM_DOMAIN_SIZE);
    if (block > 0)
        return topo_create(c->size, (int)(block > c->size ? c->size : block), NULL, &c->topo.t);
    int set = 0;
    for (int r = 0; r < c->size; r++)
        set += h[r].domain >= 0;
    if (set && set != c->size)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "RESHARD_DOMAIN is set on %d of %d ranks: set it on all or none", set,
                        c->size);
    int *dom = rs_calloc((size_t)c->size, sizeof(int), "domains");
    if (!dom)
        return RESHARD_ERR_NO_MEMORY;
    for (int r = 0; r < c->size; r++)
        dom[r] = set ? h[r].domain : c->node[r];
    reshard_status_t st = topo_create(c->size, 0, dom, &c->topo.t);
    free(dom);
    return st;
}

/* Everyone's hostname, pid and domain, then everyone's network address. */
static reshard_status_t exchange(struct reshard_comm *c)
{
    struct comm_hello *h = rs_calloc((size_t)c->size, sizeof(*h), "hello");
    char *addrs = NULL;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!h)
        return st;
    struct comm_hello *me = &h[c->rank];
    gethostname(me->host, sizeof(me->host) - 1);
    me->pid = (int32_t)getpid();
    me->domain = (int32_t)rs_param_int(RS_PARAM_DOMAIN);
    char addr[COMM_ADDR_MAX];
    size_t len = sizeof(addr);
    RS_CHECK_GOTO(c->net->ops->address(c->net, -1, addr, &len), st, out);
    me->addr_len = (uint32_t)len;
    snprintf(me->transport, sizeof(me->transport), "%s", c->net->ops->name);
    RS_CHECK_GOTO(boot_allgather(c->boot, h, sizeof(*h)), st, out);
    size_t slot = 0;
    for (int r = 0; r < c->size; r++) {
        if (strncmp(h[r].transport, h[0].transport, sizeof(h[r].transport))) {
            st = rs_error(RESHARD_ERR_UNAVAILABLE,
                          "rank %d runs the %.8s transport, rank 0 %.8s: set RESHARD_TRANSPORT "
                          "to the same value everywhere (auto takes ib only where an RDMA port "
                          "is active)",
                          r, h[r].transport, h[0].transport);
            goto out;
        }
        if (h[r].addr_len > COMM_ADDR_MAX) { /* every rank sees the same: all fail alike */
            st = rs_error(RESHARD_ERR_INTERNAL, "rank %d announced a %u-byte address (at most %d)",
                          r, h[r].addr_len, COMM_ADDR_MAX);
            goto out;
        }
        slot = h[r].addr_len > slot ? h[r].addr_len : slot;
    }
    if (!(addrs = rs_calloc((size_t)c->size, slot, "addresses"))) {
        st = RESHARD_ERR_NO_MEMORY;
        goto out;
    }
    memcpy(addrs + (size_t)c->rank * slot, addr, len);
    RS_CHECK_GOTO(boot_allgather(c->boot, addrs, slot), st, out);
    for (int r = 0; r < c->size; r++) {
        c->pid[r] = h[r].pid;
        if (r != c->rank)
            RS_CHECK_GOTO(c->net->ops->set_peer(c->net, r, addrs + (size_t)r * slot, h[r].addr_len),
                          st, out);
    }
    number_hosts(h, c->size, c->node);
    st = make_topo(c, h);
out:
    free(addrs);
    free(h);
    return st;
}

reshard_status_t comm_create(const struct boot_id *id, int rank, int size, int local_rank,
                             struct reshard_comm **out)
{
    if (size < 1 || rank < 0 || rank >= size)
        return rs_error(RESHARD_ERR_INVALID_ARG, "rank %d of %d: expected 0 <= rank < size", rank,
                        size);
    struct reshard_comm *c = rs_calloc(1, sizeof(*c), "communicator");
    if (!c)
        return RESHARD_ERR_NO_MEMORY;
    c->rank = rank;
    c->size = size;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    c->pid = rs_calloc((size_t)size, sizeof(*c->pid), "pids");
    c->node = rs_calloc((size_t)size, sizeof(*c->node), "nodes");
    if (!c->pid || !c->node)
        goto err;
    RS_CHECK_GOTO(boot_init(id, rank, size, comm_timeout_ms(), &c->boot), st, err);
    struct tp_config cfg = {.rank = rank,
                            .size = size,
                            .tls = rs_param_str(RS_PARAM_NET_TLS),
                            .peer_errors = rs_param_int(RS_PARAM_NET_PEER_ERRORS) != 0,
                            .local_rank = local_rank};
    const struct tp_ops *ops;
    st = tp_pick(&ops);
    if (st == RESHARD_OK)
        st = ops->init(&cfg, &c->net);
    if (st != RESHARD_OK) {
        /* The others would wait for our address until they time out: tell them now. */
        boot_abort(c->boot, st, rs_error_message());
        goto err;
    }
    RS_CHECK_GOTO(exchange(c), st, err);
    cma_allow_peers();
    rs_log(RS_LOG_INFO, "comm: rank %d of %d, %d domains, network transport %s", rank, size,
           c->topo.t.ndomains, c->net->ops->name);
    *out = c;
    return RESHARD_OK;
err:
    comm_destroy(c);
    return st;
}

void comm_abort_now(struct reshard_comm *c)
{
    if (c->broken != RESHARD_OK)
        return;
    c->broken = RESHARD_ERR_ABORTED;
    snprintf(c->broken_why, sizeof(c->broken_why),
             "rank %d aborted the communicator (reshard_comm_abort)", c->rank);
    boot_abort(c->boot, c->broken, c->broken_why);
}

reshard_status_t comm_usable(const struct reshard_comm *c)
{
    if (c->broken == RESHARD_OK)
        return RESHARD_OK;
    return rs_error(c->broken, "the communicator failed earlier and must be destroyed: %s",
                    c->broken_why);
}

int comm_keep(struct reshard_comm *c, void (*free_fn)(void *), void *p)
{
    struct comm_kept *k = realloc(c->kept, ((size_t)c->nkept + 1) * sizeof(*k));
    if (!k)
        return 0;
    c->kept = k;
    c->kept[c->nkept++] = (struct comm_kept){free_fn, p};
    return 1;
}

int comm_keep_mh(struct reshard_comm *c, void *mh)
{
    void **k = realloc(c->kept_mh, ((size_t)c->nkept_mh + 1) * sizeof(*k));
    if (!k)
        return 0;
    c->kept_mh = k;
    c->kept_mh[c->nkept_mh++] = mh;
    return 1;
}

reshard_status_t comm_staging(struct reshard_comm *c, int64_t slot_bytes, int nslots)
{
    if (c->staging)
        return RESHARD_OK;
    size_t bytes = (size_t)slot_bytes * (size_t)nslots;
    char *base = malloc(bytes);
    int *slots = calloc((size_t)nslots, sizeof(int));
    void *mh = NULL;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!base || !slots) {
        rs_error(st, "no memory for %d staging slots of %lld bytes", nslots, (long long)slot_bytes);
        goto err;
    }
    RS_CHECK_GOTO(c->net->ops->mem_reg(c->net, base, bytes, TP_MEM_HOST, &mh), st, err);
    for (int i = 0; i < nslots; i++)
        slots[i] = i;
    c->staging = base;
    c->staging_mh = mh;
    c->free_slots = slots;
    c->nslots = c->nfree = nslots;
    c->slot_bytes = slot_bytes;
    return RESHARD_OK;
err:
    free(slots);
    free(base);
    return st;
}

void comm_destroy(struct reshard_comm *c)
{
    if (!c)
        return;
    /* Nobody closes connections a peer may still be using (a broken communicator does not
     * wait: its peers may be gone). */
    if (c->boot && c->net && c->broken == RESHARD_OK)
        (void)boot_barrier(c->boot);
    if (c->net) {
        /* After a failed execution requests may still use registered memory: closing the
         * connections ends them, and only then do the registrations go. */
        if (c->broken != RESHARD_OK)
            c->net->ops->disconnect(c->net);
        for (int i = 0; i < c->nkept_mh; i++)
            c->net->ops->mem_dereg(c->net, c->kept_mh[i]);
        c->net->ops->mem_dereg(c->net, c->staging_mh);
        c->net->ops->close(c->net);
    }
    free(c->kept_mh);
    for (int i = 0; i < c->nkept; i++) /* their requests completed as the context closed */
        c->kept[i].free(c->kept[i].p);
    free(c->kept);
    free(c->staging);
    free(c->free_slots);
    boot_close(c->boot);
    topo_free(&c->topo.t);
    free(c->pid);
    free(c->node);
    free(c);
}
