/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The start of an execution: every rank checks its buffers against its shards and says so in a
 * hello, with the plan it runs and where its destinations are; one all-gather of the hellos
 * gives every rank the same verdict before any byte moves, and the addresses that local writes
 * go to. Ranks with device buffers also say what they export through CUDA IPC, and the
 * exports themselves are gathered again only when some rank's changed.
 */
#include "exec_run.h"

#include "base/error.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"

#include <stdlib.h>
#include <string.h>

#define SIDE_STAGING 2 /* hello.side: device buffers could not be staged */

struct hello {
    uint64_t hash;
    uint32_t seq;
    int32_t status; /* RESHARD_OK, or why this rank cannot run */
    int32_t tensor, side;
    uint64_t need, have;
    int32_t cuda;     /* this rank has device buffers and IPC on: it writes peers through IPC */
    uint32_t nexp;    /* device destinations it exports for local peers to write */
    uint64_t exp_sum; /* their checksum */
    uint64_t held;    /* the export table this rank holds for the plan (0: none) */
    char why[128];    /* status != OK: this rank's own message, for the others to repeat */
};

/* A hello and, after it, the rank's destination and whole-tensor buffer of each tensor. */
static size_t hello_bytes(const struct exec *x)
{
    return sizeof(struct hello) + 2 * sizeof(uint64_t) * (size_t)x->plan->ntensors;
}

static const struct hello *hello_of(const char *all, size_t hb, int q)
{
    return (const struct hello *)(all + (size_t)q * hb);
}

/* This rank's buffers against its shards. */
static void check_buffers(const struct exec *x, const reshard_buffers_t *bufs, int on_nccl,
                          struct hello *h)
{
    int me = x->comm->rank;
    for (int t = 0; t < x->plan->ntensors; t++) {
        const struct plan_tensor *pt = &x->plan->tensors[t];
        for (int side = 0; side < 2; side++) {
            const struct rs_shardmap *m = side ? &pt->dst_map : &pt->src_map;
            int pos = shardmap_position(m, me);
            if (pos < 0)
                continue;
            int64_t shape[RS_MAX_DIMS];
            for (int j = 0; j < pt->dst.ndim; j++)
                shape[j] = dimmap_group_len(&m->dim[j], shardmap_group(m, pos, j));
            uint64_t need = region_span_bytes(m->layout, shape);
            const void *p = side ? bufs[t].dst : bufs[t].src;
            size_t have = side ? bufs[t].dst_bytes : bufs[t].src_bytes;
            if (need && (!p || have < need)) {
                h->status = RESHARD_ERR_BUFFER;
                h->tensor = t;
                h->side = side;
                h->need = need;
                h->have = p ? have : 0;
                return;
            }
            if (on_nccl && bufs[t].mem != RESHARD_MEM_CUDA) {
                h->status = RESHARD_ERR_INVALID_ARG;
                h->tensor = t;
                h->side = side;
                return;
            }
            if (on_nccl)
                continue;
            enum cuda_mem_kind kind = cuda_mem_kind(p); /* staged device buffers are host */
            if (bufs[t].mem != RESHARD_MEM_HOST || kind == CUDA_MEM_DEVICE) {
                h->status = RESHARD_ERR_UNAVAILABLE;
                h->tensor = t;
                h->side = side;
                h->need = bufs[t].mem != RESHARD_MEM_HOST; /* declared, or found by the driver */
                return;
            }
        }
    }
}

/* Why rank could not run, as its hello says. */
static reshard_status_t refuse(const struct exec *x, int rank, const struct hello *h)
{
    const char *name = x->plan->tensors[h->tensor].name;
    const char *side = h->side ? "destination" : "source";
    if (h->status == RESHARD_ERR_BUFFER)
        return rs_error(RESHARD_ERR_BUFFER,
                        "rank %d: %s buffer of tensor %s holds %llu bytes, its shard needs %llu",
                        rank, side, name, (unsigned long long)h->have, (unsigned long long)h->need);
    if (h->status == RESHARD_ERR_UNAVAILABLE && h->side == SIDE_STAGING)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d has device buffers and no CUDA driver to stage them with", rank);
    if (h->status == RESHARD_ERR_UNAVAILABLE)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d: %s buffer of tensor %s is device memory (%s): the executor moves "
                        "host memory only so far",
                        rank, side, name,
                        h->need ? "declared RESHARD_MEM_CUDA"
                                : "declared host, but the CUDA "
                                  "driver says device");
    if (h->status == RESHARD_ERR_INVALID_ARG)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "rank %d: %s buffer of tensor %s is host memory: the NCCL executor moves "
                        "device memory (RESHARD_MEM_CUDA)",
                        rank, side, name);
    return rs_error(RESHARD_ERR_REMOTE, "rank %d could not start the execution: %s", rank,
                    h->why[0] ? h->why : rs_status_string((reshard_status_t)h->status));
}

static uint64_t checksum(const void *p, size_t n)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const unsigned char *)p)[i]) * UINT64_C(1099511628211);
    return h;
}

/* A failure once the bootstrap may be half-way through a collective: so is the communicator. */
static reshard_status_t break_comm(struct reshard_comm *c, reshard_status_t st)
{
    c->broken = st;
    snprintf(c->broken_why, sizeof(c->broken_why), "%s", rs_error_message());
    return st;
}

/* After a good verdict: every rank's exports, gathered again only when some rank's changed,
 * and what the run makes of them. */
static reshard_status_t gather_exports(struct exec *x, struct exec_run *r, const char *all,
                                       size_t hb, uint32_t mine)
{
    struct reshard_comm *c = x->comm;
    struct exec_exports *ex = &x->exp;
    uint32_t max = 0;
    uint64_t table = UINT64_C(14695981039346656037); /* the exports now, as the hellos tell */
    for (int q = 0; q < c->size; q++) {
        const struct hello *h = hello_of(all, hb, q);
        if (h->nexp > max)
            max = h->nexp;
        uint64_t sum = h->exp_sum ^ (uint64_t)h->nexp << 32;
        table = checksum(&sum, sizeof(sum)) ^ (table * UINT64_C(1099511628211));
        if (r && r->peer_cuda)
            r->peer_cuda[q] = (uint8_t)(h->cuda != 0);
    }
    if (!max) { /* nobody exports */
        ex->table = 0;
        return RESHARD_OK;
    }
    /* Gathered again unless every rank holds this table already: decided from the hellos
     * alone, so that all ranks join the all-gather or none does. */
    int same = 1;
    for (int q = 0; q < c->size; q++)
        same = same && (!comm_has(c, q) || hello_of(all, hb, q)->held == table);
    if (!same) {
        size_t bytes = max * sizeof(struct cuda_ipc_export);
        struct cuda_ipc_export *e = rs_calloc((size_t)c->size, bytes, "CUDA IPC exports");
        if (!ex->n)
            ex->n = rs_calloc((size_t)c->size, sizeof(uint32_t), "CUDA IPC exports");
        if (!e || !ex->n) {
            free(e);
            boot_abort(c->boot, RESHARD_ERR_NO_MEMORY, "out of memory gathering CUDA IPC exports");
            return RESHARD_ERR_NO_MEMORY;
        }
        if (mine)
            memcpy(e + (size_t)c->rank * max, ex->mine, mine * sizeof(*e));
        ex->table = 0; /* until the gathering succeeded */
        reshard_status_t st = comm_allgather(c, e, bytes);
        if (st != RESHARD_OK) {
            free(e);
            return st;
        }
        free(ex->all);
        ex->all = e;
        ex->max = max;
        ex->table = table;
        for (int q = 0; q < c->size; q++) {
            ex->n[q] = hello_of(all, hb, q)->nexp;
            if (ex->maps.nopen && q != c->rank) /* buffers a peer no longer exports: unmapped */
                cuda_ipc_prune(&ex->maps, q, ex->all + (size_t)q * max, ex->n[q]);
        }
    }
    for (int q = 0; r && r->peer_exp && q < c->size; q++)
        for (uint32_t i = 0; i < ex->n[q]; i++) {
            const struct cuda_ipc_export *e = ex->all + (size_t)q * ex->max + i;
            if (e->tensor < (uint32_t)x->plan->ntensors)
                r->peer_exp[exec_slot(x, q, e->tensor)] = e;
        }
    return RESHARD_OK;
}

/* The verdict every rank reaches from the same hellos. */
static reshard_status_t verdict(struct exec *x, const char *all, size_t hb, uint32_t seq,
                                reshard_status_t local)
{
    struct reshard_comm *c = x->comm;
    for (int q = 0; q < c->size; q++) {
        const struct hello *h = hello_of(all, hb, q);
        if (!comm_has(c, q))
            continue;
        if (h->status != RESHARD_OK && q == c->rank && local != RESHARD_OK)
            return local; /* our own failure: its message is already recorded */
        if (h->status != RESHARD_OK)
            return refuse(x, q, h);
        if (h->hash != x->plan->hash || h->seq != seq)
            return rs_error(RESHARD_ERR_PLAN_MISMATCH,
                            "rank %d executes another plan (hash %016llx, execution %u; here "
                            "%016llx, %u): every rank must execute the same plans in the same "
                            "order",
                            q, (unsigned long long)h->hash, h->seq,
                            (unsigned long long)x->plan->hash, seq);
    }
    return RESHARD_OK;
}

reshard_status_t exec_hello_exchange(struct exec *x, const reshard_buffers_t *bufs, uint32_t seq,
                                     reshard_status_t local, struct exec_run *r, int on_nccl)
{
    struct reshard_comm *c = x->comm;
    size_t hb = hello_bytes(x);
    uint32_t nexp = 0;
    /* The exports first: a failure to make them is one more reason this rank cannot run. */
    if (local == RESHARD_OK)
        local = exec_exports_make(x, r ? r->dev : NULL, &nexp);
    char *all = rs_calloc((size_t)c->size, hb, "hello");
    if (!all)
        local = RESHARD_ERR_NO_MEMORY; /* still join, with a zero-sized view of our own */
    char mine[sizeof(struct hello)];
    struct hello *me = all ? (struct hello *)(all + (size_t)c->rank * hb) : (struct hello *)mine;
    *me = (struct hello){.hash = x->plan->hash,
                         .seq = seq,
                         .status = local,
                         .cuda = r && r->dev && rs_param_int(RS_PARAM_CUDA_IPC),
                         .nexp = nexp,
                         .exp_sum = nexp ? checksum(x->exp.mine, nexp * sizeof(*x->exp.mine)) : 0,
                         .held = x->exp.table};
    if (local == RESHARD_ERR_UNAVAILABLE) /* only staging fails so before the exchange */
        me->side = SIDE_STAGING;
    if (local != RESHARD_OK)
        snprintf(me->why, sizeof(me->why), "%s", rs_error_message());
    if (local == RESHARD_OK)
        check_buffers(x, bufs, on_nccl, me);
    if (!all) { /* cannot take part: tell the others rather than let them time out */
        boot_abort(c->boot, local, "out of memory starting an execution");
        c->broken = local;
        snprintf(c->broken_why, sizeof(c->broken_why), "out of memory starting an execution");
        return local;
    }
    uint64_t *addr = (uint64_t *)(me + 1);
    for (int t = 0; t < x->plan->ntensors; t++) {
        addr[2 * t] = (uint64_t)(uintptr_t)bufs[t].dst;
        addr[2 * t + 1] = (uint64_t)(uintptr_t)(x->tmp.buf ? x->tmp.buf[t] : NULL);
    }
    reshard_status_t st = comm_allgather(c, all, hb);
    if (st != RESHARD_OK) /* the bootstrap is unusable now */
        break_comm(c, st);
    if (st == RESHARD_OK)
        st = verdict(x, all, hb, seq, local);
    if (st == RESHARD_OK && (st = gather_exports(x, r, all, hb, nexp)) != RESHARD_OK)
        break_comm(c, st);
    for (int q = 0; r && st == RESHARD_OK && q < c->size; q++) {
        const uint64_t *a = (const uint64_t *)(hello_of(all, hb, q) + 1);
        for (int t = 0; t < x->plan->ntensors; t++) {
            size_t slot = exec_slot(x, q, (uint32_t)t);
            r->peer_dst[slot] = (char *)(uintptr_t)a[2 * t];
            r->peer_tmp[slot] = (char *)(uintptr_t)a[2 * t + 1];
        }
    }
    free(all);
    return st;
}
