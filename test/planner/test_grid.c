/* SPDX-License-Identifier: Apache-2.0 */
/* The overlap grid, a tuple's sub-grid, and tuples by domain and by rail, on hand-worked
 * layouts. */
#include "base/error.h"
#include "planner/grid.h"
#include "planner/spec.h"

#include <criterion/criterion.h>

struct side {
    struct rs_layout l;
    struct rs_shardmap m;
};

static void side_make(struct side *s, const char *spec)
{
    cr_assert_eq(spec_parse(spec, NULL, &s->l), RESHARD_OK, "%s: %s", spec, rs_error_message());
    cr_assert_eq(shardmap_build(&s->l, &s->m, NULL), RESHARD_OK, "%s", rs_error_message());
}

static void side_free(struct side *s)
{
    shardmap_free(&s->m);
    layout_free(&s->l);
}

Test(grid, a_sweep_cuts_at_every_boundary_of_either_side)
{
    struct side a, b; /* 10 rows in 4 chunks of 3 (3,3,3,1) against 2 of 5 */
    side_make(&a, "shape=10 ranks=0-3 place=S(0)");
    side_make(&b, "shape=10 ranks=4-5 place=S(0)");
    struct rs_grid g;
    cr_assert_eq(grid_build(&a.m, &b.m, &g), RESHARD_OK);
    cr_assert_eq(g.n[0], 5); /* [0,3) [3,5) [5,6) [6,9) [9,10) */
    int64_t start[] = {0, 3, 5, 6, 9}, len[] = {3, 2, 1, 3, 1};
    int sg[] = {0, 1, 1, 2, 3}, dg[] = {0, 0, 1, 1, 1};
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(g.iv[0][i].start, start[i], "interval %d", i);
        cr_assert_eq(g.iv[0][i].len, len[i], "interval %d", i);
        cr_assert_eq(g.iv[0][i].sg, sg[i], "interval %d", i);
        cr_assert_eq(g.iv[0][i].dg, dg[i], "interval %d", i);
    }
    cr_assert_eq(g.ncells, 5);
    grid_free(&g);
    side_free(&a);
    side_free(&b);
}

Test(grid, cells_name_their_tuples_and_volumes_row_major)
{
    struct side a, b;
    side_make(&a, "shape=4x6 ranks=0-1 place=S(0)");
    side_make(&b, "shape=4x6 ranks=2-4 place=S(1)");
    struct rs_grid g;
    cr_assert_eq(grid_build(&a.m, &b.m, &g), RESHARD_OK);
    cr_assert_eq(g.ncells, 6);
    struct grid_cursor c;
    grid_first(&g, &c);
    int k = 0;
    do {
        cr_assert_eq(c.cell, k);
        cr_assert_eq(c.src_tuple, k / 3, "cell %d", k);
        cr_assert_eq(c.dst_tuple, k % 3, "cell %d", k);
        cr_assert_eq(c.volume, 4, "cell %d: 2 rows x 2 columns", k);
        k++;
    } while (grid_next(&g, &c));
    cr_assert_eq(k, 6);
    grid_free(&g);
    side_free(&a);
    side_free(&b);
}

Test(grid, a_tuples_sub_grid_holds_exactly_its_cells)
{
    struct side a, b;
    side_make(&a, "shape=8x9 ranks=0-3 mesh=2x2 place=S(0),S(1)");
    side_make(&b, "shape=8x9 ranks=4-9 mesh=2x3 place=S(1),S(0)");
    struct rs_grid g;
    cr_assert_eq(grid_build(&a.m, &b.m, &g), RESHARD_OK);
    for (int side = 0; side < 2; side++) {
        const struct rs_shardmap *m = side ? &b.m : &a.m;
        for (int t = 0; t < m->ntuples; t++) {
            struct grid_sub sub;
            cr_assert_eq(grid_sub_build(&g, m, side ? GRID_DST : GRID_SRC, t, &sub), RESHARD_OK);
            int64_t seen = 0, prev = -1;
            struct grid_cursor all;
            grid_first(&g, &all);
            do
                seen += (side ? all.dst_tuple : all.src_tuple) == t;
            while (grid_next(&g, &all));
            cr_assert_eq(sub.ncells, seen, "side %d tuple %d", side, t);
            for (int64_t k = 0; k < sub.ncells; k++) {
                struct grid_cursor c;
                grid_sub_cell(&g, &sub, k, &c);
                cr_assert_eq(side ? c.dst_tuple : c.src_tuple, t);
                cr_assert_gt(c.cell, prev, "row-major order");
                prev = c.cell;
            }
            grid_sub_free(&sub);
        }
    }
    grid_free(&g);
    side_free(&a);
    side_free(&b);
}

Test(grid, tuples_group_by_domain_and_by_rail)
{
    struct side a; /* 4 replicas of one shard pair: tuple 0 on ranks 0,2,4,6; tuple 1 on 1,3,5,7 */
    side_make(&a, "shape=8 ranks=0-7 mesh=4x2 place=R,S(0)");
    struct rs_topo topo;
    cr_assert_eq(topo_create(8, 4, NULL, &topo), RESHARD_OK); /* domains {0-3}, {4-7} */
    struct tuple_domains td;
    cr_assert_eq(tdom_build(&a.m, &topo, TOPO_SRC, &td), RESHARD_OK);
    int n;
    const int *r = tdom_ranks(&td, 0, &n);
    cr_assert_eq(n, 4);
    cr_assert(r[0] == 0 && r[1] == 2 && r[2] == 4 && r[3] == 6);
    cr_assert_eq(tdom_find(&td, 1, 1), td.run_first[1] + 1, "tuple 1's second run is domain 1");
    const int *rail = tdom_rail(&td, 1, 3, &n); /* rail 3: local index 3, ranks 3 and 7 */
    cr_assert_eq(n, 2);
    cr_assert(rail[0] == 3 && rail[1] == 7);
    cr_assert_null(tdom_rail(&td, 0, 1, &n), "tuple 0 has no rank on rail 1");
    cr_assert_eq(n, 0);
    int gone = 2;
    cr_assert_eq(topo_set_absent(&topo, &gone, 1), RESHARD_OK);
    tdom_free(&td);
    cr_assert_eq(tdom_build(&a.m, &topo, TOPO_SRC, &td), RESHARD_OK);
    tdom_ranks(&td, 0, &n);
    cr_assert_eq(n, 3, "an absent rank holds nothing");
    tdom_rail(&td, 0, 2, &n);
    cr_assert_eq(n, 1, "rail 2 keeps rank 6 only");
    tdom_free(&td);
    topo_free(&topo);
    side_free(&a);
}

Test(grid, overlap_pairs_count_cells_times_the_domains_needing_them)
{
    struct side a, b; /* 4 cells; each destination tuple lives in 2 domains */
    side_make(&a, "shape=8 ranks=0-3 place=S(0)");
    side_make(&b, "shape=8 ranks=4-11 mesh=2x4 place=R,S(0)");
    struct rs_topo topo;
    cr_assert_eq(topo_create(12, 4, NULL, &topo), RESHARD_OK);
    struct overlap o;
    cr_assert_eq(overlap_build(&a.m, &b.m, &topo, &o), RESHARD_OK);
    cr_assert_eq(overlap_pairs(&o, &b.m), 8);
    overlap_free(&o);
    topo_free(&topo);
    side_free(&a);
    side_free(&b);
}
