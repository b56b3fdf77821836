/* SPDX-License-Identifier: Apache-2.0 */
#include "base/error.h"
#include "planner/topo.h"

#include <criterion/criterion.h>

Test(topo, blocks_of_domain_size_with_a_short_last_one)
{
    struct rs_topo t;
    cr_assert_eq(topo_create(10, 4, NULL, &t), RESHARD_OK);
    cr_assert_eq(t.ndomains, 3);
    cr_assert_eq(t.domain[3], 0);
    cr_assert_eq(t.domain[4], 1);
    cr_assert_eq(t.domain[9], 2);
    cr_assert_eq(t.local_index[9], 1);
    cr_assert_eq(t.domain_size[2], 2);
    topo_free(&t);
}

Test(topo, explicit_ids_are_renumbered_by_lowest_rank)
{
    int ids[] = {7, 3, 7, 3, 42, 7};
    struct rs_topo t;
    cr_assert_eq(topo_create(6, 0, ids, &t), RESHARD_OK);
    cr_assert_eq(t.ndomains, 3);
    int want_domain[] = {0, 1, 0, 1, 2, 0};
    int want_index[] = {0, 0, 1, 1, 0, 2};
    for (int r = 0; r < 6; r++) {
        cr_assert_eq(t.domain[r], want_domain[r], "rank %d", r);
        cr_assert_eq(t.local_index[r], want_index[r], "rank %d", r);
    }
    cr_assert_eq(t.domain_size[0], 3);
    struct rs_topo c;
    cr_assert_eq(topo_copy(&t, &c), RESHARD_OK);
    cr_assert_eq(c.domain[5], 0);
    cr_assert_eq(c.domain_size[2], 1);
    topo_free(&c);
    topo_free(&t);
}

Test(topo, bad_arguments)
{
    struct rs_topo t;
    int ids[] = {0, -1};
    cr_assert_eq(topo_create(0, 8, NULL, &t), RESHARD_ERR_INVALID_ARG);
    cr_assert_str_eq(rs_error_message(), "topology: world size 0 is outside 1..1048576");
    cr_assert_eq(topo_create(4, 0, NULL, &t), RESHARD_ERR_INVALID_ARG);
    cr_assert_str_eq(rs_error_message(), "topology: domain size 0 is not positive");
    cr_assert_eq(topo_create(2, 0, ids, &t), RESHARD_ERR_INVALID_ARG);
    cr_assert_str_eq(rs_error_message(), "topology: rank 1 has domain id -1");
}

Test(topo, worlds_past_2_20_ranks_are_refused)
{
    struct rs_topo t;
    cr_assert_eq(topo_create((1 << 20) + 1, 8, NULL, &t), RESHARD_ERR_INVALID_ARG);
    cr_assert_str_eq(rs_error_message(), "topology: world size 1048577 is outside 1..1048576");
}
