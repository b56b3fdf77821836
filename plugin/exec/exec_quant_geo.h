/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The host quantizer's block geometry, shared by the quantizer (exec_quant.c) and the
 * fingerprints a verified refit expects (exec_quant_expect.c): where one rank's elements of a
 * shard are (qgeo), the blocks of a weight, and the fingerprint of a block's elements.
 */
#ifndef RS_EXEC_QUANT_GEO_H
#define RS_EXEC_QUANT_GEO_H

#include "exec_int.h"
#include "region.h"
#include "cuda/quant.h"

#include <string.h>

/* ---- element addresses (exec_quant_geo.c) ---- */

/* Where the elements of one rank's shard of a tensor are: global index -> local, per dim. */
struct qgeo {
    int ndim;
    int64_t *loc[RS_MAX_DIMS];
    int64_t shape[RS_MAX_DIMS];
    const struct rs_view *view;
    int last_run; /* the last dim is one run of global indices: any part of it held is a run */
    int64_t run_lo, run_hi; /* last_run: the global indices of that run, [run_lo, run_hi) */
};

/* Elements of rank's shard of m, 0 when it holds none. */
uint64_t shard_elems(const struct rs_shardmap *m, int rank);
/* Rank's shard of m (it holds one). */
reshard_status_t geo_make(const struct rs_shardmap *m, int rank, struct qgeo **out);
void geo_free(struct qgeo *g);
/* The element offset of global index gi. */
int64_t geo_at(const struct qgeo *g, const int64_t *gi);
/* The same shard, row-major without the view: the executor's FP8 and staging copies. */
struct qgeo geo_flat(const struct qgeo *g);
enum rs_fp8 fp8_of(enum rs_dtype t);

/* The local index of the first element of at's row, and of column j of that row. */
int64_t geo_row(const struct qgeo *g, const int64_t *at);
static inline int64_t geo_elem(const struct qgeo *g, int64_t row, int64_t j)
{
    int64_t lin = row + g->loc[g->ndim - 1][j];
    return g->view ? region_view_at(g->view, g->shape, g->ndim, lin) : lin;
}
/* Whether row [j0, j1) is one run of consecutive elements (no view, no gap): *first its first. */
int geo_run(const struct qgeo *g, int64_t row, int64_t j0, int64_t j1, int64_t *first);

static inline float elem_f32(const char *base, int64_t at, enum rs_dtype dt)
{
    uint16_t h;
    float v;
    if (dt == RS_DTYPE_F32) {
        memcpy(&v, base + at * 4, sizeof(v));
        return v;
    }
    memcpy(&h, base + at * 2, sizeof(h));
    return dt == RS_DTYPE_BF16 ? rs_bf16_to_f32(h) : rs_f16_to_f32(h);
}

/* ---- boxes and blocks (exec_quant_geo.c) ---- */

/* An odometer over the box [lo, hi) of ndim dims; 0 when it is done (or empty). */
int box_next(int ndim, const int64_t *lo, const int64_t *hi, int64_t *at);
int box_empty(int ndim, const int64_t *lo, const int64_t *hi);
/* The rows of the box [lo, hi): an odometer over every dim but the last. */
int row_next(int ndim, const int64_t *lo, const int64_t *hi, int64_t *at);
/* The elements of block b of weight l, clipped to [clo, chi) (either NULL: not clipped). */
void block_box(const struct rs_layout *l, const int64_t *b, const int64_t *clo, const int64_t *chi,
               int64_t *lo, int64_t *hi);
/* The blocks a box of elements touches. */
void blocks_of(const struct rs_layout *l, const int64_t *start, const int64_t *len, int64_t *lo,
               int64_t *hi);
int64_t row_major(int ndim, const int64_t *shape, const int64_t *at);
/* The largest |x| of row [j0, j1) of base. */
float row_amax(float amax, const char *base, const struct qgeo *g, int64_t row, int64_t j0,
               int64_t j1, enum rs_dtype dt);
/* A block's scale from its elements in buffer base at geometry g. */
float block_scale(const struct rs_layout *w, const int64_t *b, const char *base,
                  const struct qgeo *g, enum rs_dtype dt);

/* ---- block fingerprints (exec_quant_expect.c) ---- */

/* Per dim of weight w: whether each block index lies whole in one group of the source map,
 * so that the source shard holding a block's first element holds all of it (the planner's
 * at_src: such blocks are quantized at their senders, the others where they land). */
struct qwhole {
    int nd;
    uint8_t *whole[RS_MAX_DIMS];
    /* Along the last dim, groups of G elements of the source dtype (8 bytes; G = 1: none):
     * grp[m], elements [m G, m G + G) lie in one group of the source map, so the staged
     * elements of cut blocks are fingerprinted a group at a time wherever a source holds it
     * whole (block_fp with plain), the others one at a time, alike on both sides. */
    uint8_t *grp;
    int64_t G;
};
reshard_status_t whole_make(const struct plan_tensor *pw, struct qwhole *q);
void whole_free(struct qwhole *q);
int whole_block(const struct qwhole *q, const int64_t *b);

/* Whether weight w's codes are fingerprinted eight at a time (fingerprint_run8). */
int codes_grouped(const struct plan_tensor *pw);
/* The fingerprint of the elements of block b of weight w that g's shard holds (in base): raw
 * elements of esize bytes, or (cast, NULL here) their FP8 codes; tmp holds a row of codes
 * (8 bytes per element of a row). plain (with raw elements of the source dtype): the staged
 * elements' transit check, a group of plain->G at a time where plain->grp says so; src: g is
 * a source shard (one source group along each dim). */
struct qcast;
uint64_t block_fp(const struct rs_layout *w, const int64_t *b, const char *base,
                  const struct qgeo *g, size_t esize, const struct qcast *cast, uint8_t *tmp,
                  int group, const struct qwhole *plain, int src);

#endif
