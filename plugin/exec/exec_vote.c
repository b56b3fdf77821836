/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plan vote and the start vote (exec_vote.h): folds of a few hundred bytes a rank, combined
 * by the bootstrap in any order, so min, max, sums and "the lowest rank's" only.
 */
#include "exec_vote.h"

#include "base/error.h"

#include <stdio.h>
#include <string.h>

void exec_vote_text(const char *in, size_t n, char *out)
{
    size_t i = 0;
    for (; i < n && in[i]; i++) {
        unsigned char ch = (unsigned char)in[i];
        out[i] = ch < 0x20 || ch == 0x7f ? '?' : (char)ch;
    }
    out[i] = '\0';
}

static int valid_rank(const struct reshard_comm *c, int32_t r)
{
    return r >= 0 && r < c->size && comm_has(c, r);
}

static int valid_failure(reshard_status_t st)
{
    return st > RESHARD_OK && st <= RESHARD_ERR_DATA_LOST;
}

/* ---- the plan vote ---- */

struct fold_key { /* (hash, algo): rank EXEC_VOTE_NONE when the voter has none */
    uint64_t hash;
    int32_t algo, rank;
};

struct fold_val {
    int64_t v;
    int32_t rank, pad;
};

struct plan_fold {
    int32_t fail_rank, fail_status;
    char fail_why[EXEC_VOTE_WHY];
    struct fold_key klo, khi;
    struct fold_val chunk_lo, chunk_hi, coal_lo, coal_hi;
    uint64_t local_fp;
    uint64_t net, local, self, in_domain, lb, ops[4];
    uint64_t quant, quant_at_src;
    uint64_t nic;
    int32_t nic_rank, pad;
    double plan_ms;
};

static int key_cmp(const struct fold_key *a, const struct fold_key *b)
{
    if (a->hash != b->hash)
        return a->hash < b->hash ? -1 : 1;
    return a->algo < b->algo ? -1 : a->algo > b->algo;
}

/* Keeps the smaller (lo) or larger key of the two; equal ones keep the lower rank. */
static void key_keep(struct fold_key *acc, const struct fold_key *in, int lo)
{
    if (in->rank == EXEC_VOTE_NONE)
        return;
    int c = acc->rank == EXEC_VOTE_NONE ? (lo ? 1 : -1) : key_cmp(acc, in);
    if ((lo ? c > 0 : c < 0) || (c == 0 && in->rank < acc->rank))
        *acc = *in;
}

static void val_keep(struct fold_val *acc, const struct fold_val *in, int lo)
{
    if (in->rank == EXEC_VOTE_NONE)
        return;
    int take = acc->rank == EXEC_VOTE_NONE || (lo ? in->v < acc->v : in->v > acc->v) ||
               (in->v == acc->v && in->rank < acc->rank);
    if (take)
        *acc = *in;
}

static void plan_combine(void *acc_, const void *in_, void *arg)
{
    (void)arg;
    struct plan_fold *a = acc_;
    const struct plan_fold *b = in_;
    if (b->fail_rank < a->fail_rank) {
        a->fail_rank = b->fail_rank;
        a->fail_status = b->fail_status;
        memcpy(a->fail_why, b->fail_why, sizeof(a->fail_why));
    }
    key_keep(&a->klo, &b->klo, 1);
    key_keep(&a->khi, &b->khi, 0);
    val_keep(&a->chunk_lo, &b->chunk_lo, 1);
    val_keep(&a->chunk_hi, &b->chunk_hi, 0);
    val_keep(&a->coal_lo, &b->coal_lo, 1);
    val_keep(&a->coal_hi, &b->coal_hi, 0);
    a->local_fp ^= b->local_fp;
    a->net += b->net;
    a->local += b->local;
    a->self += b->self;
    a->in_domain += b->in_domain;
    a->quant += b->quant;
    a->quant_at_src += b->quant_at_src;
    for (int k = 0; k < 4; k++)
        a->ops[k] += b->ops[k];
    if (b->lb > a->lb)
        a->lb = b->lb;
    if (b->nic > a->nic || (b->nic == a->nic && b->nic && b->nic_rank < a->nic_rank)) {
        a->nic = b->nic;
        a->nic_rank = b->nic_rank;
    }
    if (b->plan_ms > a->plan_ms)
        a->plan_ms = b->plan_ms;
}

static void plan_fold_init(struct plan_fold *f, int rank, const struct exec_plan_ballot *m)
{
    int ok = m->status == RESHARD_OK;
    *f = (struct plan_fold){.fail_rank = ok ? EXEC_VOTE_NONE : rank,
                            .fail_status = (int32_t)m->status,
                            .klo = {m->hash, m->algo, ok ? rank : EXEC_VOTE_NONE},
                            .chunk_lo = {m->chunk_bytes, ok ? rank : EXEC_VOTE_NONE, 0},
                            .coal_lo = {m->coalesce_bytes, ok ? rank : EXEC_VOTE_NONE, 0},
                            .local_fp = ok ? m->local_fp : 0,
                            .nic_rank = EXEC_VOTE_NONE};
    if (!ok && m->why)
        snprintf(f->fail_why, sizeof(f->fail_why), "%s", m->why);
    f->khi = f->klo;
    f->chunk_hi = f->chunk_lo;
    f->coal_hi = f->coal_lo;
    if (!ok)
        return;
    f->net = m->net_out;
    f->local = m->local_out;
    f->self = m->self;
    f->in_domain = m->in_domain;
    f->lb = m->lb_part;
    f->quant = m->quant;
    f->quant_at_src = m->quant_at_src;
    memcpy(f->ops, m->ops, sizeof(f->ops));
    f->nic = m->net_out > m->net_in ? m->net_out : m->net_in;
    f->nic_rank = f->nic ? rank : EXEC_VOTE_NONE;
    f->plan_ms = m->plan_ms;
}

/* Up to NAMES ranks each way, the lowest, and how many in all: who planned like the lowest key
 * (same) and who did not (other), and the range of the others' keys. */
#define NAMES 8

struct plan_names {
    int32_t same[NAMES], other[NAMES];
    int32_t nsame, nother;
    struct fold_key olo, ohi;
};

static void names_merge(int32_t *a, int32_t *na, const int32_t *b, int32_t nb)
{
    int32_t out[NAMES];
    int i = 0, j = 0, k = 0, la = *na < NAMES ? *na : NAMES, lb = nb < NAMES ? nb : NAMES;
    while (k < NAMES && (i < la || j < lb))
        out[k++] = j >= lb || (i < la && a[i] < b[j]) ? a[i++] : b[j++];
    memcpy(a, out, (size_t)k * sizeof(*a));
    *na += nb;
}

static void names_combine(void *acc_, const void *in_, void *arg)
{
    (void)arg;
    struct plan_names *a = acc_;
    const struct plan_names *b = in_;
    names_merge(a->same, &a->nsame, b->same, b->nsame);
    names_merge(a->other, &a->nother, b->other, b->nother);
    key_keep(&a->olo, &b->olo, 1);
    key_keep(&a->ohi, &b->ohi, 0);
}

static void list_names(const int32_t *r, int32_t n, char *buf, size_t size)
{
    size_t used = 0;
    for (int i = 0; i < n && i < NAMES && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%d", i ? ", " : "", r[i]);
        used += w > 0 ? (size_t)w : 0;
    }
    if (n > NAMES && used < size)
        snprintf(buf + used, size - used, " and %d more", n - NAMES);
}

/* The second round, when plans differ: every rank learns which ranks planned like whom. */
static reshard_status_t name_mismatch(struct reshard_comm *c, const struct plan_fold *f,
                                      const struct fold_key *mine)
{
    int same = !key_cmp(mine, &f->klo);
    struct plan_names n = {.olo = {0, 0, EXEC_VOTE_NONE}, .ohi = {0, 0, EXEC_VOTE_NONE}};
    if (same) {
        n.same[0] = c->rank;
        n.nsame = 1;
    } else {
        n.other[0] = c->rank;
        n.nother = 1;
        n.olo = n.ohi = *mine;
    }
    reshard_status_t st = boot_allreduce(c->boot, &n, sizeof(n), names_combine, NULL);
    if (st != RESHARD_OK)
        return st;
    char list[160];
    const char *tail = "";
    if (same) {
        list_names(n.other, n.nother, list, sizeof(list));
    } else {
        list_names(n.same, n.nsame, list, sizeof(list));
        if (key_cmp(&n.olo, &n.ohi))
            tail = ", and others with yet other plans,";
    }
    return rs_error(RESHARD_ERR_PLAN_MISMATCH,
                    "rank %d: ranks %s%s passed other layouts or algorithm than this rank (plan "
                    "hash %016llx here)",
                    c->rank, list, tail, (unsigned long long)mine->hash);
}

/* Where a size every rank must set alike differs: names a rank whose value is not ours. */
static reshard_status_t size_mismatch(const struct reshard_comm *c, const char *name,
                                      const struct fold_val *lo, const struct fold_val *hi,
                                      int64_t mine)
{
    const struct fold_val *other = mine == lo->v ? hi : lo;
    return rs_error(RESHARD_ERR_PLAN_MISMATCH,
                    "rank %d: %s is %lld on rank %d and %lld here: set it alike on every rank",
                    c->rank, name, (long long)other->v, other->rank, (long long)mine);
}

/* A failure another rank reports: its own status where it is a verdict on the inputs every
 * rank shares, else RESHARD_ERR_REMOTE. */
static reshard_status_t remote_failure(const struct reshard_comm *c, const struct plan_fold *f)
{
    char why[EXEC_VOTE_WHY + 1];
    exec_vote_text(f->fail_why, sizeof(f->fail_why), why);
    if (!valid_rank(c, f->fail_rank) || !valid_failure((reshard_status_t)f->fail_status))
        return rs_error(RESHARD_ERR_REMOTE,
                        "rank %d: a malformed plan vote (failing rank %d, status %d): %s", c->rank,
                        f->fail_rank, f->fail_status, why);
    reshard_status_t st = (reshard_status_t)f->fail_status;
    if (st != RESHARD_ERR_DATA_LOST && st != RESHARD_ERR_TOO_LARGE)
        st = RESHARD_ERR_REMOTE;
    return rs_error(st, "rank %d could not plan: %s", f->fail_rank,
                    why[0] ? why : rs_status_string((reshard_status_t)f->fail_status));
}

reshard_status_t exec_vote_plan(struct reshard_comm *c, const struct exec_plan_ballot *mine,
                                reshard_plan_stats_t *world)
{
    struct plan_fold f;
    plan_fold_init(&f, c->rank, mine);
    reshard_status_t st = boot_allreduce(c->boot, &f, sizeof(f), plan_combine, NULL);
    if (st != RESHARD_OK)
        return st;
    if (mine->status != RESHARD_OK) /* our own failure says more than the vote */
        return mine->status;
    if (f.fail_rank != EXEC_VOTE_NONE)
        return remote_failure(c, &f);
    if (f.chunk_lo.v != f.chunk_hi.v)
        return size_mismatch(c, "RESHARD_CHUNK_BYTES", &f.chunk_lo, &f.chunk_hi, mine->chunk_bytes);
    if (f.coal_lo.v != f.coal_hi.v)
        return size_mismatch(c, "RESHARD_COALESCE_BYTES", &f.coal_lo, &f.coal_hi,
                             mine->coalesce_bytes);
    struct fold_key key = {mine->hash, mine->algo, c->rank};
    if (key_cmp(&f.klo, &f.khi))
        return name_mismatch(c, &f, &key);
    if (f.local_fp)
        return rs_error(RESHARD_ERR_PLAN_MISMATCH,
                        "rank %d: the ranks of a domain disagree on which local peers they may "
                        "write directly (the kernel vouches for a peer before cross-memory "
                        "writes): the plans would pair a write with a network receive",
                        c->rank);
    double pct = f.quant ? 100.0 * (double)f.quant_at_src / (double)f.quant : 0.0;
    *world = (reshard_plan_stats_t){.net_bytes = f.net,
                                    .min_net_bytes = f.in_domain,
                                    .local_bytes = f.local,
                                    .self_bytes = f.self,
                                    .max_nic_bytes = f.nic,
                                    .lb_nic_bytes = f.lb,
                                    .max_nic_rank = f.nic ? f.nic_rank : -1,
                                    .net_ops = f.ops[2],
                                    .local_ops = f.ops[1],
                                    .fwd_ops = f.ops[3],
                                    .self_ops = f.ops[0],
                                    .plan_ms = f.plan_ms,
                                    .quant_bytes = f.quant,
                                    .quant_at_source_pct = pct};
    return RESHARD_OK;
}

/* ---- the start vote ---- */

void exec_start_fold_init(struct exec_start_fold *f, int rank, uint64_t hash, uint32_t seq,
                          int failed, int changed)
{
    *f = (struct exec_start_fold){.lo = {hash, seq, rank},
                                  .hi = {hash, seq, rank},
                                  .fail = failed ? rank : EXEC_VOTE_NONE,
                                  .changed = changed != 0,
                                  .plain = rank};
}

void exec_start_fold_delta(struct exec_start_fold *f, int rank, int can, uint32_t version,
                           const uint64_t *stale)
{
    f->plain = can ? EXEC_VOTE_NONE : rank;
    f->ver_lo = f->ver_hi = version;
    memcpy(f->stale, stale, sizeof(f->stale));
}

static int start_cmp(const struct exec_start_key *a, const struct exec_start_key *b)
{
    if (a->hash != b->hash)
        return a->hash < b->hash ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

void exec_start_combine(void *acc_, const void *in_, void *arg)
{
    (void)arg;
    struct exec_start_fold *a = acc_;
    const struct exec_start_fold *b = in_;
    int c = start_cmp(&b->lo, &a->lo);
    if (c < 0 || (c == 0 && b->lo.rank < a->lo.rank))
        a->lo = b->lo;
    c = start_cmp(&b->hi, &a->hi);
    if (c > 0 || (c == 0 && b->hi.rank < a->hi.rank))
        a->hi = b->hi;
    if (b->fail < a->fail)
        a->fail = b->fail;
    a->changed |= b->changed;
    if (b->plain < a->plain)
        a->plain = b->plain;
    a->ver_lo = b->ver_lo < a->ver_lo ? b->ver_lo : a->ver_lo;
    a->ver_hi = b->ver_hi > a->ver_hi ? b->ver_hi : a->ver_hi;
    for (int i = 0; i < EXEC_STALE_WORDS; i++)
        a->stale[i] |= b->stale[i];
}

reshard_status_t exec_start_mismatch(const struct exec_start_fold *f, uint64_t hash, uint32_t seq)
{
    if (!start_cmp(&f->lo, &f->hi))
        return RESHARD_OK;
    struct exec_start_key mine = {hash, seq, 0};
    const struct exec_start_key *q = start_cmp(&mine, &f->lo) ? &f->lo : &f->hi;
    return rs_error(RESHARD_ERR_PLAN_MISMATCH,
                    "rank %d executes another plan (hash %016llx, execution %u; here %016llx, "
                    "%u): every rank must execute the same plans in the same order",
                    q->rank, (unsigned long long)q->hash, q->seq, (unsigned long long)hash, seq);
}

reshard_status_t exec_start_refuse(const struct rs_plan *plan, int rank,
                                   const struct exec_start_report *r)
{
    char why[EXEC_VOTE_WHY + 1];
    exec_vote_text(r->why, sizeof(r->why), why);
    reshard_status_t st = (reshard_status_t)r->status;
    if (!valid_failure(st))
        return rs_error(RESHARD_ERR_REMOTE,
                        "rank %d could not start the execution and sent status %d, which is "
                        "none: %s",
                        rank, r->status, why);
    if (r->side == EXEC_SIDE_NONE)
        return rs_error(RESHARD_ERR_REMOTE, "rank %d could not start the execution: %s", rank,
                        why[0] ? why : rs_status_string(st));
    if (r->side == EXEC_SIDE_STAGING && st == RESHARD_ERR_UNAVAILABLE)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d has device buffers and no CUDA driver to stage them with", rank);
    int buffer =
        st == RESHARD_ERR_BUFFER || st == RESHARD_ERR_INVALID_ARG || st == RESHARD_ERR_UNAVAILABLE;
    if (!buffer || r->side < 0 || r->side > 1 || r->tensor < 0 || r->tensor >= plan->ntensors)
        return rs_error(RESHARD_ERR_REMOTE,
                        "rank %d could not start the execution (%s) and named tensor %d of %d, "
                        "side %d: a malformed report, refused",
                        rank, rs_status_name(st), r->tensor, plan->ntensors, r->side);
    const char *name = plan->tensors[r->tensor].name;
    const char *side = r->side ? "destination" : "source";
    if (st == RESHARD_ERR_BUFFER && r->need > (uint64_t)INT64_MAX) /* region_span_bytes */
        return rs_error(RESHARD_ERR_BUFFER,
                        "rank %d: %s buffer of tensor %s holds %llu bytes, its shard's view "
                        "reaches past byte 2^63, which no buffer can hold",
                        rank, side, name, (unsigned long long)r->have);
    if (st == RESHARD_ERR_BUFFER)
        return rs_error(RESHARD_ERR_BUFFER,
                        "rank %d: %s buffer of tensor %s holds %llu bytes, its shard needs %llu",
                        rank, side, name, (unsigned long long)r->have, (unsigned long long)r->need);
    if (st == RESHARD_ERR_UNAVAILABLE)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "rank %d: %s buffer of tensor %s is device memory (%s): the executor moves "
                        "host memory only so far",
                        rank, side, name,
                        r->need ? "declared RESHARD_MEM_CUDA"
                                : "declared host, but the CUDA driver says device");
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "rank %d: %s buffer of tensor %s is host memory: the NCCL executor moves "
                    "device memory (RESHARD_MEM_CUDA)",
                    rank, side, name);
}
