/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator's life: made from a bootstrap id or from an NCCL communicator, formed by one
 * exchange of hellos and network addresses (comm_hello.c), held one collective at a time,
 * aborted, and destroyed. Its shrink is comm_shrink.c.
 */
#include "comm.h"
#include "comm_int.h"
#include "comm_local.h"

#include "nccl_lib.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "cuda/ipc.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int comm_timeout_ms(void)
{
    int64_t s = rs_param_int(RS_PARAM_TIMEOUT);
    return s > INT32_MAX / 1000 ? INT32_MAX : (int)(s * 1000);
}

/* Dense ids, in order of first appearance, for the hosts of the members (-1: absent). */
static void number_hosts(const struct reshard_comm *c, const struct comm_hello *h, int *node)
{
    int next = 0;
    for (int r = 0; r < c->size; r++) {
        node[r] = -1;
        if (!comm_has(c, r))
            continue;
        for (int q = 0; q < r && node[r] < 0; q++)
            if (node[q] >= 0 && h[q].host == h[r].host)
                node[r] = node[q];
        if (node[r] < 0)
            node[r] = next++;
    }
}

reshard_status_t comm_allgather(struct reshard_comm *c, void *buf, size_t bytes)
{
    if (c->nmembers == c->size)
        return boot_allgather(c->boot, buf, bytes);
    char *dense = rs_calloc((size_t)c->nmembers, bytes, "allgather");
    if (!dense) { /* cannot take part: tell the others rather than let them time out */
        boot_abort(c->boot, RESHARD_ERR_NO_MEMORY, "out of memory in an allgather");
        return RESHARD_ERR_NO_MEMORY;
    }
    memcpy(dense + (size_t)c->boot_of[c->rank] * bytes, (char *)buf + (size_t)c->rank * bytes,
           bytes);
    reshard_status_t st = boot_allgather(c->boot, dense, bytes);
    if (st == RESHARD_OK) {
        memset(buf, 0, (size_t)c->size * bytes);
        for (int k = 0; k < c->nmembers; k++)
            memcpy((char *)buf + (size_t)c->member[k] * bytes, dense + (size_t)k * bytes, bytes);
    }
    free(dense);
    return st;
}

/* Absent ranks (numbers a grown communicator skipped) are marked so in the topology. */
static reshard_status_t mark_absent(struct reshard_comm *c)
{
    for (int r = 0; r < c->size; r++)
        if (!comm_has(c, r))
            RS_CHECK(topo_set_absent(&c->topo.t, &r, 1));
    return RESHARD_OK;
}

static reshard_status_t make_topo(struct reshard_comm *c, const struct comm_hello *h)
{
    int64_t block = rs_param_int(RS_PARAM_DOMAIN_SIZE);
    if (block > 0) {
        RS_CHECK(topo_create(c->size, (int)(block > c->size ? c->size : block), NULL, &c->topo.t));
        return mark_absent(c);
    }
    int set = 0;
    for (int r = 0; r < c->size; r++)
        set += comm_has(c, r) && h[r].domain >= 0;
    if (set && set != c->nmembers)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "RESHARD_DOMAIN is set on %d of %d ranks: set it on all or none", set,
                        c->nmembers);
    int *dom = rs_calloc((size_t)c->size, sizeof(int), "domains");
    if (!dom)
        return RESHARD_ERR_NO_MEMORY;
    for (int r = 0; r < c->size; r++)
        dom[r] = !comm_has(c, r) ? 0 : set ? h[r].domain : c->node[r];
    reshard_status_t st = topo_create(c->size, 0, dom, &c->topo.t);
    free(dom);
    return st == RESHARD_OK ? mark_absent(c) : st;
}

/* A shrunk communicator keeps its parent's domains, with the ranks it left out absent. */
static reshard_status_t inherit_topo(struct reshard_comm *c, const struct rs_topo *parent)
{
    RS_CHECK(topo_copy(parent, &c->topo.t));
    return mark_absent(c);
}

void comm_max_u32(void *acc, const void *in, void *arg)
{
    (void)arg;
    uint32_t a, b;
    memcpy(&a, acc, sizeof(a));
    memcpy(&b, in, sizeof(b));
    if (b > a)
        memcpy(acc, &b, sizeof(b));
}

/* This rank's hello: its host's key, RESHARD_DOMAIN, its transport, and what the local path
 * claims (pid and a fresh token; comm_local_open opens its socket); its transport address into
 * addr (*len: its room, then its length). */
reshard_status_t comm_my_hello(struct reshard_comm *c, struct comm_hello *me, unsigned char *addr,
                               size_t *len)
{
    char host[COMM_HOST_MAX] = "";
    RS_CHECK(c->net->ops->address(c->net, -1, addr, len));
    gethostname(host, sizeof(host) - 1);
    *me = (struct comm_hello){.host = comm_host_key(host),
                              .domain = (int32_t)rs_param_int(RS_PARAM_DOMAIN),
                              .addr_len = (uint32_t)*len};
    snprintf(me->transport, sizeof(me->transport), "%s", c->net->ops->name);
    return comm_local_open(c, &me->local);
}

reshard_status_t comm_form(struct reshard_comm *c, const struct rs_topo *parent,
                           const struct reshard_comm *kept, unsigned char *all, size_t rec)
{
    struct comm_hello *h = rs_calloc((size_t)c->size, sizeof(*h), "hello");
    const unsigned char **addr = h ? rs_calloc((size_t)c->size, sizeof(*addr), "hello") : NULL;
    unsigned char *present = addr ? rs_calloc((size_t)c->size, 1, "hello") : NULL;
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!present)
        goto free_hellos;
    for (int r = 0; r < c->size; r++)
        present[r] = comm_has(c, r) != 0;
    RS_CHECK_GOTO(comm_hello_decode(all, rec, c->size, present, h, addr), st, free_hellos);
    for (int r = 0; r < c->size; r++) /* a kept context knows the members of its communicator */
        if (r != c->rank && comm_has(c, r) && !(kept && r < kept->size && comm_has(kept, r)))
            RS_CHECK_GOTO(c->net->ops->set_peer(c->net, r, addr[r], h[r].addr_len), st,
                          free_hellos);
    number_hosts(c, h, c->node);
    st = parent ? inherit_topo(c, parent) : make_topo(c, h);
    if (st == RESHARD_OK) /* c->pid: only the pids the kernel confirmed */
        st = comm_local_verify(c, &h->local, sizeof(*h));
    if (st == RESHARD_OK) { /* a later growth sends the joiners only the members' records */
        c->hellos = all;
        c->hello_rec = rec;
        all = NULL;
    }
free_hellos:
    free(all);
    free(present);
    free(addr);
    free(h);
    return st;
}

/* Everyone's hello and network address, in one allgather of records as long as the longest
 * address (an allreduce finds it): what crosses per rank is its address and 48 bytes; then the
 * local peers verify each other. */
static reshard_status_t comm_exchange_hellos(struct reshard_comm *c, const struct rs_topo *parent,
                                             const struct reshard_comm *kept)
{
    struct comm_hello me;
    unsigned char mine[COMM_ADDR_MAX], *all = NULL;
    size_t len = sizeof(mine);
    RS_CHECK(comm_my_hello(c, &me, mine, &len));
    uint32_t slot = (uint32_t)len;
    RS_CHECK(boot_allreduce(c->boot, &slot, sizeof(slot), comm_max_u32, NULL));
    if (slot > COMM_ADDR_MAX) /* every rank sees the same: all fail alike */
        return rs_error(RESHARD_ERR_INTERNAL, "a rank announced a %u-byte address (at most %d)",
                        slot, COMM_ADDR_MAX);
    size_t rec = COMM_HELLO_REC(slot);
    if (!(all = rs_calloc((size_t)c->size, rec, "hellos")))
        return RESHARD_ERR_NO_MEMORY;
    comm_hello_put(all + (size_t)c->rank * rec, &me);
    memcpy(all + (size_t)c->rank * rec + COMM_HELLO_BYTES, mine, len);
    reshard_status_t st = comm_allgather(c, all, rec);
    if (st != RESHARD_OK) {
        free(all);
        return st;
    }
    return comm_form(c, parent, kept, all, rec);
}

/* A communicator of `size` ranks, every one a member until the caller says otherwise. */
struct reshard_comm *comm_alloc(int rank, int size, int local_rank)
{
    struct reshard_comm *c = rs_calloc(1, sizeof(*c), "communicator");
    if (!c)
        return NULL;
    atomic_init(&c->refs, 1); /* the caller's */
    c->owner = getpid();
    c->rank = rank;
    c->size = c->nmembers = size;
    c->local_rank = local_rank;
    c->pid = rs_calloc((size_t)size, sizeof(*c->pid), "pids");
    c->pidfd = rs_calloc((size_t)size, sizeof(*c->pidfd), "pid handles");
    for (int q = 0; c->pidfd && q < size; q++)
        c->pidfd[q] = -1;
    c->node = rs_calloc((size_t)size, sizeof(*c->node), "nodes");
    c->member = rs_calloc((size_t)size, sizeof(*c->member), "members");
    c->boot_of = rs_calloc((size_t)size, sizeof(*c->boot_of), "members");
    c->spares = rs_calloc((size_t)size, sizeof(*c->spares), "listener ids");
    if (!c->pid || !c->pidfd || !c->node || !c->member || !c->boot_of || !c->spares) {
        comm_destroy(c);
        return NULL;
    }
    for (int r = 0; r < size; r++)
        c->member[r] = c->boot_of[r] = r;
    return c;
}

reshard_status_t comm_net_open(struct reshard_comm *c, const struct reshard_comm *kept)
{
    if (kept) {
        c->net = kept->net;
        c->net_refs = kept->net_refs;
        atomic_fetch_add(c->net_refs, 1);
        return RESHARD_OK;
    }
    struct tp_config cfg = {.rank = c->rank,
                            .size = c->size,
                            .tls = rs_param_str(RS_PARAM_NET_TLS),
                            .peer_errors = rs_param_int(RS_PARAM_NET_PEER_ERRORS) != 0,
                            .local_rank = c->local_rank};
    const struct tp_ops *ops;
    if (!(c->net_refs = rs_calloc(1, sizeof(*c->net_refs), "network context references")))
        return RESHARD_ERR_NO_MEMORY;
    atomic_init(c->net_refs, 1);
    RS_CHECK(tp_pick(&ops));
    return ops->init(&cfg, &c->net);
}

/* Gives c's reference to its network context up: the last one closes it. */
static void comm_net_close(struct reshard_comm *c)
{
    if (!c->net_refs || atomic_fetch_sub(c->net_refs, 1) == 1) {
        if (c->net)
            c->net->ops->close(c->net);
        free(c->net_refs);
    }
    c->net = NULL;
    c->net_refs = NULL;
}

reshard_status_t comm_spares(struct reshard_comm *c)
{
    for (int r = 0; r < c->size; r++)
        if (comm_has(c, r))
            RS_CHECK(boot_listener_id(c->boot, c->boot_of[r], &c->spares[r]));
    c->spare = c->spares[c->rank];
    return RESHARD_OK;
}

/* With the bootstrap up: the network context, then the exchange that forms the communicator. */
reshard_status_t comm_join(struct reshard_comm *c, const struct rs_topo *parent,
                           const struct reshard_comm *kept)
{
    boot_set_cancel(c->boot, &c->abort_req);
    reshard_status_t st = comm_net_open(c, kept);
    /* The local path names its sockets after the bootstrap's listeners. */
    if (st == RESHARD_OK)
        st = comm_spares(c);
    if (st != RESHARD_OK) {
        /* The others would wait for our address until they time out: tell them now. */
        boot_abort(c->boot, st, rs_error_message());
        return st;
    }
    RS_CHECK(comm_exchange_hellos(c, parent, kept));
    rs_log(RS_LOG_INFO, "comm: rank %d of %d (%d present), %d domains, network transport %s",
           c->rank, c->size, c->nmembers, c->topo.t.ndomains, c->net->ops->name);
    return RESHARD_OK;
}

reshard_status_t comm_create(const struct boot_id *id, int rank, int size, int local_rank,
                             struct reshard_comm **out)
{
    if (size < 1 || rank < 0 || rank >= size)
        return rs_error(RESHARD_ERR_INVALID_ARG, "rank %d of %d: expected 0 <= rank < size", rank,
                        size);
    struct reshard_comm *c = comm_alloc(rank, size, local_rank);
    if (!c)
        return RESHARD_ERR_NO_MEMORY;
    reshard_status_t st;
    RS_CHECK_GOTO(boot_init(id, rank, size, comm_timeout_ms(), &c->boot), st, err_destroy_comm);
    RS_CHECK_GOTO(comm_join(c, NULL, NULL), st, err_destroy_comm);
    *out = c;
    return RESHARD_OK;
err_destroy_comm:
    comm_destroy(c);
    return st;
}

/* Every rank's slot of one ncclAllGather of BOOT_ID_BYTES: rank 0's id reaches everyone. */
static reshard_status_t gather_id(const struct nccl_fns *f, const struct cuda_fns *cu, void *nc,
                                  int rank, int size, struct boot_id *id)
{
    cu_deviceptr d = 0;
    cu_result r = cu->mem_alloc(&d, (size_t)size * BOOT_ID_BYTES);
    if (r != CU_SUCCESS)
        return cuda_error("cuMemAlloc for the all-gather", r);
    reshard_status_t st = RESHARD_OK;
    cu_deviceptr mine = d + (cu_deviceptr)rank * BOOT_ID_BYTES;
    if ((r = cu->memcpy_htod(mine, id->bytes, BOOT_ID_BYTES)) != CU_SUCCESS)
        st = cuda_error("cuMemcpyHtoD", r);
    nccl_result nr = 0;
    if (st == RESHARD_OK && (nr = f->all_gather((void *)(uintptr_t)mine, (void *)(uintptr_t)d,
                                                BOOT_ID_BYTES, NCCL_UINT8, nc, NULL)) != 0)
        st = nccl_error(f, nr, "ncclAllGather of the rendezvous id");
    if (st == RESHARD_OK && (r = cu->stream_synchronize(NULL)) != CU_SUCCESS)
        st = cuda_error("cuStreamSynchronize", r);
    if (st == RESHARD_OK && (r = cu->memcpy_dtoh(id->bytes, d, BOOT_ID_BYTES)) != CU_SUCCESS)
        st = cuda_error("cuMemcpyDtoH", r);
    cu->mem_free(d);
    return st;
}

reshard_status_t comm_create_nccl(void *nc, struct reshard_comm **out)
{
    char why[RS_ERROR_MAX] = "";
    const struct nccl_fns *f = nccl_lib();
    if (!f) {
        snprintf(why, sizeof(why), "%s", rs_error_message()); /* not passed as its own source */
        return rs_error(RESHARD_ERR_UNAVAILABLE, "reshard_comm_init_nccl: %s", why);
    }
    int rank = -1, size = 0;
    nccl_result nr = f->comm_user_rank(nc, &rank);
    if (nr || (nr = f->comm_count(nc, &size)))
        return nccl_error(f, nr, "the rank and size of the NCCL communicator");
    const struct cuda_fns *cu = cuda_lib();
    if (!cu) {
        snprintf(why, sizeof(why), "%s", rs_error_message());
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "reshard_comm_init_nccl: the all-gather needs a CUDA device: %s", why);
    }
    RS_CHECK(cuda_current_context());
    /* Rank 0 listens; a rank 0 that cannot still joins the all-gather (with zeros), so that
     * nobody waits in NCCL for it, and every rank fails alike below. */
    struct boot_id id, mine;
    memset(&id, 0, sizeof(id));
    why[0] = 0;
    if (rank == 0 && boot_id_create(&id) != RESHARD_OK)
        snprintf(why, sizeof(why), "%s", rs_error_message());
    mine = id;
    reshard_status_t st = gather_id(f, cu, nc, rank, size, &id);
    if (st != RESHARD_OK) {
        boot_id_release(&mine); /* rank 0's listener (a no-op elsewhere) */
        return st;
    }
    static const struct boot_id zero;
    if (!memcmp(&id, &zero, sizeof(id)))
        return rs_error(RESHARD_ERR_NETWORK, "reshard_comm_init_nccl: rank 0 could not listen%s%s",
                        why[0] ? ": " : "", why);
    const char *lr = getenv("LOCAL_RANK");
    st = comm_create(&id, rank, size, lr && *lr ? atoi(lr) : -1, out);
    if (rank == 0)
        boot_id_release(&mine); /* taken by rank 0's rendezvous, unless it failed first */
    if (st == RESHARD_OK)
        (*out)->nccl = nc;
    return st;
}

static int comm_inherited(const struct reshard_comm *c)
{
    return c->owner != getpid();
}

void comm_abort_now(struct reshard_comm *c)
{
    if (c->broken != RESHARD_OK || comm_inherited(c)) /* the parent's peers are not ours */
        return;
    c->broken = RESHARD_ERR_ABORTED;
    snprintf(c->broken_why, sizeof(c->broken_why),
             "rank %d aborted the communicator (reshard_comm_abort)", c->rank);
    boot_abort(c->boot, c->broken, c->broken_why);
}

void comm_depart(struct reshard_comm *c)
{
    if (c->broken == RESHARD_OK) { /* nor does its destroy wait for the others in a barrier */
        c->broken = RESHARD_ERR_LEFT;
        snprintf(c->broken_why, sizeof(c->broken_why),
                 "rank %d left the communicator (reshard_comm_leave)", c->rank);
    }
    boot_leave(c->boot);
}

int comm_left(struct reshard_comm *c)
{
    struct rs_saved_error saved;
    rs_error_save(&saved); /* what the look hears is the next call's to report */
    (void)boot_check(c->boot);
    rs_error_restore(&saved);
    return boot_left(c->boot);
}

reshard_status_t comm_enter(struct reshard_comm *c)
{
    int idle = 0;
    if (!atomic_compare_exchange_strong(&c->busy, &idle, 1))
        return rs_error(RESHARD_ERR_BUSY, "the communicator is in use (an execution or a "
                                          "collective, from another thread)");
    if (atomic_load(&c->abort_req))
        comm_abort_now(c);
    reshard_status_t st = comm_usable(c);
    if (st != RESHARD_OK)
        atomic_store(&c->busy, 0);
    return st;
}

reshard_status_t comm_leave(struct reshard_comm *c, reshard_status_t st)
{
    if (st == RESHARD_ERR_ABORTED && c->broken == RESHARD_OK) { /* an abort ended it */
        c->broken = st;
        snprintf(c->broken_why, sizeof(c->broken_why),
                 "rank %d aborted the communicator (reshard_comm_abort)", c->rank);
    }
    atomic_store(&c->busy, 0);
    return st;
}

reshard_status_t comm_owned(const struct reshard_comm *c)
{
    if (!comm_inherited(c))
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "the communicator was made by process %d and this process (%d) was forked "
                    "from it: its connections and transport state are the parent's, so it cannot "
                    "be used here (make a new communicator in this process)",
                    (int)c->owner, (int)getpid());
}

reshard_status_t comm_usable(const struct reshard_comm *c)
{
    if (atomic_load(&c->destroyed))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "the communicator was destroyed (reshard_comm_destroy): its plans can "
                        "only be destroyed, which closes its connections once the last is gone");
    RS_CHECK(comm_owned(c));
    if (c->grown_into)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "the communicator grew into the one of epoch %u (reshard_comm_grow), "
                        "which its network context now serves: use that one (a plan made on "
                        "this one cannot run there: make it again), and destroy this one",
                        c->grown_into);
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
        goto err_free_staging;
    }
    RS_CHECK_GOTO(c->net->ops->mem_reg(c->net, base, bytes, TP_MEM_HOST, &mh), st,
                  err_free_staging);
    for (int i = 0; i < nslots; i++)
        slots[i] = i;
    c->staging = base;
    c->staging_mh = mh;
    c->free_slots = slots;
    c->nslots = c->nfree = nslots;
    c->slot_bytes = slot_bytes;
    return RESHARD_OK;
err_free_staging:
    free(slots);
    free(base);
    return st;
}

void comm_hold(struct reshard_comm *c)
{
    atomic_fetch_add(&c->refs, 1);
}

void comm_release(struct reshard_comm *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        comm_destroy(c);
}

void comm_close(struct reshard_comm *c)
{
    if (atomic_exchange(&c->destroyed, 1)) {
        rs_log(RS_LOG_INFO,
               "reshard_comm_destroy: rank %d's communicator was already destroyed "
               "(its plans still hold it)",
               c->rank);
        return;
    }
    int held = atomic_load(&c->refs) - 1;
    if (held > 0)
        rs_log(RS_LOG_INFO,
               "reshard_comm_destroy: rank %d's communicator is still held by %d plan(s) or "
               "call(s) in flight: its connections close when the last is gone",
               c->rank, held);
    comm_release(c);
}
/* Communicators a forked child destroyed: kept, never touched (their transport context and
 * bootstrap are the parent's: closing them would close the parent's connections). */
static struct reshard_comm *left_to_parent[16];

void comm_destroy(struct reshard_comm *c)
{
    if (!c)
        return;
    if (comm_inherited(c)) {
        rs_log(RS_LOG_INFO,
               "reshard_comm_destroy in process %d of a communicator made by process %d, which "
               "it was forked from: its connections are left to that process",
               (int)getpid(), (int)c->owner);
        for (size_t i = 0; i < sizeof(left_to_parent) / sizeof(left_to_parent[0]); i++)
            if (!left_to_parent[i]) {
                left_to_parent[i] = c;
                break;
            }
        return;
    }
    /* Nobody closes connections a peer may still be using (a broken communicator does not
     * wait: its peers may be gone; one that grew closes nothing the grown one uses, and the
     * joiners would never meet it). The barrier's failure is not the caller's last error. */
    if (c->boot && c->net && c->broken == RESHARD_OK && !c->grown_into) {
        struct rs_saved_error saved;
        rs_error_save(&saved);
        (void)boot_barrier(c->boot);
        rs_error_restore(&saved);
    }
    cuda_ipc_free(c->ipc); /* every rank is done writing through its mappings */
    comm_local_close(c);   /* after the barrier: no peer writes this rank any more */
    if (c->net) {
        /* After a failed execution requests may still use registered memory: closing the
         * connections ends them, and only then do the registrations go. */
        if (c->broken != RESHARD_OK)
            c->net->ops->disconnect(c->net);
        for (int i = 0; i < c->nkept_mh; i++)
            c->net->ops->mem_dereg(c->net, c->kept_mh[i]);
        c->net->ops->mem_dereg(c->net, c->staging_mh);
    }
    comm_net_close(c);
    free(c->kept_mh);
    for (int i = 0; i < c->nkept; i++) /* their requests completed as the context closed */
        c->kept[i].free(c->kept[i].p);
    free(c->kept);
    free(c->staging);
    free(c->free_slots);
    boot_close(c->boot);
    topo_free(&c->topo.t);
    free(c->pid);
    for (int q = 0; c->pidfd && q < c->size; q++)
        if (c->pidfd[q] >= 0)
            close(c->pidfd[q]);
    free(c->pidfd);
    free(c->node);
    free(c->member);
    free(c->boot_of);
    free(c->spares);
    free(c->hellos);
    free(c);
}
