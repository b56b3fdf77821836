/* SPDX-License-Identifier: Apache-2.0 */
/* Fingerprints: one replica of every shard adds up to the whole tensor's, whatever the layout
 * (uneven, strided, 3-D, views), and a flipped bit or two swapped elements change it. */
#include "base/error.h"
#include "planner/fingerprint.h"
#include "planner/spec.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define MAXN 4096

static uint64_t whole_sum(const uint16_t *t, int64_t n)
{
    uint64_t s = 0;
    for (int64_t i = 0; i < n; i++)
        s += fp_mix((uint64_t)i, t[i]);
    return s;
}

/* Copies rank position pos's shard of the global tensor t (row-major, 2-byte elements) into buf
 * as the view lays it out, from the per-dim global indices (computed apart from the code under
 * test: each dim's segments in local order). */
static void extract(const struct rs_shardmap *m, int pos, const uint16_t *t, uint16_t *buf)
{
    const struct rs_layout *l = m->layout;
    int nd = l->ndim;
    int64_t len[RS_MAX_DIMS], idx[RS_MAX_DIMS][64], numel = 1;
    for (int j = 0; j < nd; j++) {
        const struct rs_dimmap *d = &m->dim[j];
        int g = shardmap_group(m, pos, j), n = 0;
        for (int s = d->first[g]; s < d->first[g + 1]; s++)
            for (int64_t i = 0; i < d->segs[s].len; i++)
                idx[j][n++] = d->segs[s].start + i;
        len[j] = n;
        numel *= n;
    }
    const struct rs_view *v = &l->view;
    int vd = v->ndim ? v->ndim : nd;
    const int64_t *vs = v->ndim ? v->shape : len;
    for (int64_t e = 0; e < numel; e++) {
        int64_t rem = e, g = 0, stride = 1;
        for (int j = nd - 1; j >= 0; j--) { /* local multi-index of e, then its global index */
            g += idx[j][rem % len[j]] * stride;
            rem /= len[j];
            stride *= l->shape[j];
        }
        int64_t at = v->offset, r2 = e, st = 1;
        for (int k = vd - 1; k >= 0; k--) {
            int64_t s = v->nstrides ? v->strides[k] : st;
            at += r2 % vs[k] * s;
            r2 /= vs[k];
            st *= vs[k];
        }
        buf[at] = t[g];
    }
}

static uint64_t side_sum(const char *spec, const uint16_t *t, int flip_rank)
{
    struct rs_layout l;
    struct rs_shardmap m;
    cr_assert_eq(spec_parse(spec, NULL, &l), RESHARD_OK, "%s: %s", spec, rs_error_message());
    cr_assert_eq(shardmap_build(&l, &m, NULL), RESHARD_OK, "%s", rs_error_message());
    uint64_t sum = 0;
    uint16_t *buf = calloc(2 * MAXN, sizeof(uint16_t));
    for (int pos = 0; pos < l.nranks; pos++) {
        if (!fingerprint_counts(&m, pos, NULL))
            continue;
        memset(buf, 0, 2 * MAXN * sizeof(uint16_t));
        extract(&m, pos, t, buf);
        if (l.ranks[pos] == flip_rank && shardmap_local_numel(&m, pos))
            buf[l.view.offset] ^= 0x40; /* the shard's first element */
        uint64_t f;
        cr_assert_eq(fingerprint_shard(&m, pos, buf, 2 * MAXN * sizeof(uint16_t), &f), RESHARD_OK,
                     "%s", rs_error_message());
        sum += f;
    }
    free(buf);
    shardmap_free(&m);
    layout_free(&l);
    return sum;
}

static const char *const specs[] = {
    "shape=37x5 ranks=0-3 place=S(0)",
    "shape=37x5 ranks=0-5 mesh=2x3 place=R,S(0)",
    "shape=37x5 ranks=0-3 mesh=2x2 place=S(1),S(0)",
    "shape=12x10 ranks=0-3 mesh=2x2 place=SS(0,2),S(1)",
    "shape=4x6x5 ranks=0-7 mesh=2x4 place=S(2),S(0)",
    "shape=12x10 ranks=0-1 place=S(1) buffer=b offset=3 view=12x5 strides=7x1",
    "shape=12x10 ranks=0-2 place=S(0) view=2x4x5 strides=1x2x8",
    /* whole rows, one or several segments of dim 0: summed as runs of the tensor */
    "shape=12x10 ranks=0-3 mesh=2x2 place=SS(0,2),R",
    "shape=7x3x5 ranks=0-2 place=SS(0,2)",
    "shape=37 ranks=0-3 place=S(0)",
    "shape=9x4 ranks=0-1 place=S(0) buffer=b offset=5",
};

Test(fingerprint, every_layout_adds_up_to_the_whole_tensor)
{
    uint16_t t[MAXN];
    srand(7);
    for (int i = 0; i < MAXN; i++)
        t[i] = (uint16_t)rand();
    for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++) {
        struct rs_layout l;
        cr_assert_eq(spec_parse(specs[k], NULL, &l), RESHARD_OK, "%s", rs_error_message());
        int64_t n = layout_numel(&l);
        layout_free(&l);
        cr_assert_eq(side_sum(specs[k], t, -1), whole_sum(t, n), "%s", specs[k]);
    }
}

Test(fingerprint, a_flipped_bit_or_a_swap_changes_it)
{
    uint16_t t[MAXN];
    for (int i = 0; i < MAXN; i++)
        t[i] = (uint16_t)(i * 2654435761u >> 7);
    const char *s = "shape=37x5 ranks=0-5 mesh=2x3 place=R,S(0)";
    uint64_t good = whole_sum(t, 185);
    cr_assert_neq(side_sum(s, t, 1), good, "rank 1's flipped bit");
    cr_assert_eq(side_sum(s, t, 4), good, "rank 4 is a replica of rank 1: it does not count");
    uint16_t u = t[3];
    t[3] = t[100];
    t[100] = u;
    cr_assert_neq(whole_sum(t, 185), good, "two elements swapped");
}

Test(fingerprint, a_short_buffer_is_refused)
{
    struct rs_layout l;
    struct rs_shardmap m;
    cr_assert_eq(spec_parse("shape=8x8 ranks=0-1 place=S(0)", NULL, &l), RESHARD_OK);
    cr_assert_eq(shardmap_build(&l, &m, NULL), RESHARD_OK);
    uint16_t buf[32] = {0};
    uint64_t f;
    cr_assert_eq(fingerprint_shard(&m, 0, buf, sizeof(buf) - 1, &f), RESHARD_ERR_BUFFER);
    cr_assert(strstr(rs_error_message(), "reaches byte 64 of a 63-byte buffer"), "%s",
              rs_error_message());
    shardmap_free(&m);
    layout_free(&l);
}

/* Issue 27: an offset whose span wraps to 64 bytes (the checks refuse it; planted here) is
 * refused by the fingerprint's own bound, not read before the buffer. */
Test(fingerprint, an_offset_whose_span_wraps_is_refused_not_read_before_the_buffer)
{
    struct rs_layout l;
    struct rs_shardmap m;
    cr_assert_eq(spec_parse("shape=10 dtype=f64 ranks=0 buffer=b", NULL, &l), RESHARD_OK);
    cr_assert_eq(shardmap_build(&l, &m, NULL), RESHARD_OK);
    l.view.offset = INT64_C(2305843009213693950); /* (offset + 10) x 8 = 2^64 + 64 */
    double *buf = calloc(8, sizeof(double));
    uint64_t f;
    cr_assert_eq(fingerprint_shard(&m, 0, buf, 8 * sizeof(double), &f), RESHARD_ERR_BUFFER);
    cr_assert(strstr(rs_error_message(), "reaches past byte 2^63 of a 64-byte buffer"), "%s",
              rs_error_message());
    free(buf);
    shardmap_free(&m);
    layout_free(&l);
}

/* Replicas after a shrink: mesh 2x3 R,S(0) has tuples {0,3}, {1,4}, {2,5}; with rank 4 gone
 * the middle one keeps 1 replica, the others 2, so their lcm is 2; with ranks 1 and 4 gone the
 * middle shard is on no present rank. */
Test(fingerprint, replica_counts_their_lcm_and_lost_shards_follow_the_absent_ranks)
{
    struct rs_layout l;
    struct rs_shardmap m;
    cr_assert_eq(spec_parse("shape=37x5 ranks=0-5 mesh=2x3 place=R,S(0)", NULL, &l), RESHARD_OK);
    cr_assert_eq(shardmap_build(&l, &m, NULL), RESHARD_OK);
    struct rs_topo topo;
    cr_assert_eq(topo_create(6, 3, NULL, &topo), RESHARD_OK);
    uint64_t lcm = 0;
    cr_assert_eq(fingerprint_lcm(&m, &topo, &lcm), RESHARD_OK);
    cr_assert_eq(lcm, 2);
    cr_assert_eq(fingerprint_replicas(&m, shardmap_position(&m, 1), &topo), 2);
    cr_assert_eq(fingerprint_lost(&m, &topo), -1);
    int four = 4;
    cr_assert_eq(topo_set_absent(&topo, &four, 1), RESHARD_OK);
    cr_assert_eq(fingerprint_replicas(&m, shardmap_position(&m, 1), &topo), 1);
    cr_assert_eq(fingerprint_replicas(&m, shardmap_position(&m, 0), &topo), 2);
    cr_assert_eq(fingerprint_replicas(&m, shardmap_position(&m, 4), &topo), 0);
    cr_assert_eq(fingerprint_lcm(&m, &topo, &lcm), RESHARD_OK);
    cr_assert_eq(lcm, 2);
    cr_assert_eq(fingerprint_lost(&m, &topo), -1);
    int one = 1;
    cr_assert_eq(topo_set_absent(&topo, &one, 1), RESHARD_OK);
    int lost = fingerprint_lost(&m, &topo);
    cr_assert(lost >= 0 && (l.ranks[lost] == 1 || l.ranks[lost] == 4), "position %d", lost);
    topo_free(&topo);
    shardmap_free(&m);
    layout_free(&l);
}

/* 3 replicas beside 2 need a weight of 6: a replicated shard of 3 ranks and, after a shrink, one
 * of 2 (mesh 2x3 S(0),R: tuples {0,1,2}, {3,4,5}; rank 5 gone). */
Test(fingerprint, uneven_replica_counts_take_their_least_common_multiple)
{
    struct rs_layout l;
    struct rs_shardmap m;
    cr_assert_eq(spec_parse("shape=8x5 ranks=0-5 mesh=2x3 place=S(0),R", NULL, &l), RESHARD_OK);
    cr_assert_eq(shardmap_build(&l, &m, NULL), RESHARD_OK);
    struct rs_topo topo;
    cr_assert_eq(topo_create(6, 3, NULL, &topo), RESHARD_OK);
    int five = 5;
    cr_assert_eq(topo_set_absent(&topo, &five, 1), RESHARD_OK);
    uint64_t lcm = 0;
    cr_assert_eq(fingerprint_lcm(&m, &topo, &lcm), RESHARD_OK);
    cr_assert_eq(lcm, 6);
    topo_free(&topo);
    shardmap_free(&m);
    layout_free(&l);
}

/* Replica counts with no common multiple below 2^32 are refused, not wrapped: 8 tuples of 32
 * (mesh 8x32 S(0),R over 256 ranks) left with 32, 31, 29, 27, 25, 23, 19 and 17 present. */
Test(fingerprint, replica_counts_without_a_small_common_multiple_are_refused)
{
    struct rs_layout l;
    struct rs_shardmap m;
    cr_assert_eq(spec_parse("shape=64x4 ranks=0-255 mesh=8x32 place=S(0),R", NULL, &l), RESHARD_OK);
    cr_assert_eq(shardmap_build(&l, &m, NULL), RESHARD_OK);
    struct rs_topo topo;
    cr_assert_eq(topo_create(256, 8, NULL, &topo), RESHARD_OK);
    const int present[8] = {32, 31, 29, 27, 25, 23, 19, 17};
    int gone[256], n = 0;
    for (int t = 0; t < 8; t++)
        for (int k = present[t]; k < 32; k++)
            gone[n++] = 32 * t + k;
    cr_assert_eq(topo_set_absent(&topo, gone, n), RESHARD_OK);
    uint64_t lcm = 0;
    cr_assert_eq(fingerprint_lcm(&m, &topo, &lcm), RESHARD_ERR_TOO_LARGE);
    cr_assert(strstr(rs_error_message(), "no common multiple below 2^32"), "%s",
              rs_error_message());
    cr_assert_eq(lcm, 0);
    topo_free(&topo);
    shardmap_free(&m);
    layout_free(&l);
}

/* FP8 codes eight at a time: a row cut on a multiple of 8 adds up from its parts, the partial
 * group at the row's end counts, and a flipped bit or two codes swapped inside a group change
 * the sum. */
Test(fingerprint, codes_eight_at_a_time_add_up_by_parts_and_see_flips_and_swaps)
{
    uint8_t row[203];
    for (size_t i = 0; i < sizeof(row); i++)
        row[i] = (uint8_t)(i * 37 + 11);
    uint64_t first = 5000, whole = fingerprint_run8(row, first, 203);
    cr_assert_eq(whole,
                 fingerprint_run8(row, first, 128) + fingerprint_run8(row + 128, first + 128, 75));
    cr_assert_neq(whole, fingerprint_run8(row, first, 200), "the last 3 codes count");
    row[201] ^= 0x40;
    cr_assert_neq(whole, fingerprint_run8(row, first, 203), "a flip in the partial group");
    row[201] ^= 0x40;
    row[17] ^= 1;
    cr_assert_neq(whole, fingerprint_run8(row, first, 203), "a flip inside a group");
    row[17] ^= 1;
    uint8_t t = row[40];
    row[40] = row[41];
    row[41] = t;
    cr_assert_neq(whole, fingerprint_run8(row, first, 203), "two codes of a group swapped");
    cr_assert_neq(whole, fingerprint_run8(row, first + 8, 203), "the same codes elsewhere");
}
