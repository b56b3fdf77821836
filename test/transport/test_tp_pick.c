/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Picking the network transport (transport/tp_pick.c) from RESHARD_TRANSPORT: a named one that
 * cannot run here says why, auto falls back to UCX without an RDMA port, and anything else is
 * refused. rdma-core is hidden through RESHARD_IB_LIB, so these run on any host.
 */
#include "base/error.h"
#include "transport/tp.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(tp_pick, ucx_is_taken_when_named_without_asking_for_ports)
{
    setenv("RESHARD_IB_LIB", "libibverbs-not-here.so.1", 1);
    setenv("RESHARD_TRANSPORT", "ucx", 1);
    const struct tp_ops *ops = NULL;
    cr_assert_eq(tp_pick(&ops), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(ops, &tp_ucx_ops);
}

Test(tp_pick, without_rdma_core_the_transport_says_so)
{
    setenv("RESHARD_IB_LIB", "libibverbs-not-here.so.1", 1);
    setenv("RESHARD_TRANSPORT", "ib", 1);
    const struct tp_ops *ops = NULL;
    cr_assert_eq(tp_pick(&ops), RESHARD_ERR_UNAVAILABLE);
    cr_assert(strstr(rs_error_message(), "libibverbs-not-here.so.1"), "%s", rs_error_message());
}

Test(tp_pick, auto_falls_back_to_ucx_without_rdma_core)
{
    setenv("RESHARD_IB_LIB", "libibverbs-not-here.so.1", 1);
    setenv("RESHARD_TRANSPORT", "auto", 1);
    const struct tp_ops *ops = NULL;
    cr_assert_eq(tp_pick(&ops), RESHARD_OK);
    cr_assert_str_eq(ops->name, "ucx");
}

Test(tp_pick, an_unknown_transport_is_refused)
{
    setenv("RESHARD_TRANSPORT", "verbs", 1);
    const struct tp_ops *ops = NULL;
    cr_assert_eq(tp_pick(&ops), RESHARD_ERR_INVALID_ARG);
    cr_assert_str_eq(rs_error_message(), "RESHARD_TRANSPORT=verbs: expected ib, ucx or auto");
}

Test(tp_pick, ib_named_without_a_matching_port_is_unavailable)
{
    setenv("RESHARD_TRANSPORT", "ib", 1);
    setenv("RESHARD_IB_HCA", "=rs_no_such_hca", 1);
    const struct tp_ops *ops = NULL;
    cr_assert_eq(tp_pick(&ops), RESHARD_ERR_UNAVAILABLE);
    /* with rdma-core: no port is selected; without it: the library is missing */
    cr_assert(strstr(rs_error_message(),
                     "RESHARD_TRANSPORT=ib: no active RDMA port matches RESHARD_IB_HCA") ||
                  strstr(rs_error_message(), "ibverbs: "),
              "%s", rs_error_message());
    cr_assert_null(ops, "the output is written only on success");
}
