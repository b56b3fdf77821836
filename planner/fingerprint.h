/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Fingerprints of a tensor in global index space, so that two sides holding the same weights
 * in different layouts can show it without moving them. An element contributes
 * fp_mix(global linear index, its bits); a shard's fingerprint is the sum (mod 2^64) of its
 * elements' contributions, so shards combine by addition in any order, and the tensor's is the
 * sum over one replica of every shard (fingerprint_counts says which). A value in the wrong
 * place, a flipped bit or two elements swapped change the sum (unless 64-bit hashes collide).
 */
#ifndef RS_FINGERPRINT_H
#define RS_FINGERPRINT_H

#include "layout.h"
#include "topo.h"

#include <stddef.h>
#include <stdint.h>

/* Two multiplies and two shifts: non-linear in the bits (a sum of linear terms would miss
 * swaps), and cheap enough to run at memory speed when vectorized. */
#define FP_INDEX_MUL UINT64_C(0x9e3779b97f4a7c15)

/* fp_mix of an index already multiplied by FP_INDEX_MUL: a shard's loops keep its indices
 * that way (products of sums are sums of products mod 2^64), one multiply per element. */
static inline uint64_t fp_mix_scaled(uint64_t index_mul, uint64_t bits)
{
    uint64_t x = index_mul ^ bits;
    x ^= x >> 29;
    x *= UINT64_C(0xd6e8feb86659fd93);
    return x ^ (x >> 32);
}

static inline uint64_t fp_mix(uint64_t index, uint64_t bits)
{
    return fp_mix_scaled(index * FP_INDEX_MUL, bits);
}

/* The fingerprint of the shard held at position pos of map, in buf (bytes long, laid out as
 * the layout's view says). RESHARD_ERR_BUFFER when buf is shorter than the view reaches. */
reshard_status_t fingerprint_shard(const struct rs_shardmap *map, int pos, const void *buf,
                                   size_t bytes, uint64_t *out);
/* The fingerprint of n consecutive elements (esize bytes each, 1, 2, 4 or 8) whose global
 * linear indices run from first: what they add to the fingerprint of any shard holding them.
 * For those who fingerprint values as they make them (quantized blocks, exec_quant.c). */
uint64_t fingerprint_run(const void *row, size_t esize, uint64_t first, int64_t n);
/* The same for one-byte codes eight at a time (a group: its first element's index, its eight
 * bytes little-endian as the bits), a partial group at the end zero-padded: an eighth of the
 * work per element. Both sides of a check must cut every row into the same groups: runs that
 * start on a multiple of 8 along the row (FP8 blocks whose extent is), and end on one or at the
 * row's end. */
uint64_t fingerprint_run8(const uint8_t *row, uint64_t first, int64_t n);
/* Whether the shard at position pos is the one of its replicas that counts: the lowest rank of
 * its tuple present as a source (TOPO_SRC). */
int fingerprint_counts(const struct rs_shardmap *map, int pos, const struct rs_topo *topo);

/* A destination side, where every replica counts (so that a bad replica is caught): the
 * tensor's check is sum over present destination shards of f * (lcm / replicas) ==
 * lcm * (the sources' fingerprint), replicas being the present ranks of the shard's tuple and
 * lcm their least common multiple over the map's tuples; present: as a destination (TOPO_DST).
 * fingerprint_replicas counts them for position pos (0 when pos itself is absent). */
int fingerprint_replicas(const struct rs_shardmap *map, int pos, const struct rs_topo *topo);
/* lcm over the tuples with a present rank (it depends on the ranks and the topology only, not
 * the shape). RESHARD_ERR_TOO_LARGE past 2^32 (replica counts that cannot all divide one
 * weight), which a mesh layout never reaches. */
reshard_status_t fingerprint_lcm(const struct rs_shardmap *map, const struct rs_topo *topo,
                                 uint64_t *lcm);
/* The first position of a tuple that holds elements but no present rank (a shrink took all of
 * its replicas: nobody receives that box, so the destination side cannot add up to the
 * source's), or -1. */
int fingerprint_lost(const struct rs_shardmap *map, const struct rs_topo *topo);

#endif
