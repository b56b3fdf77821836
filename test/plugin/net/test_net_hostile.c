/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What a careless caller or a stranger on the network does to the plugin (issue 19, rows 7-9
 * and 13 of the findings, and the flood), each through the NCCL tables of every version, run by
 * the conformance driver's hostile cases (net_hostile.c). Each test failed on the plugin before
 * the registry of live objects, the listener's table of connections and the acknowledged
 * handshake; under ASAN=1 each must also leave no sanitizer report.
 *
 * net_hostile: the attack in the test's name, and what must still work after it.
 */
#include "net_run.h"

#include <criterion/criterion.h>
#include <string.h>

/* Row 7: isend(comm, NULL, 10) was accepted, then UCX read address 0. */
Test(net_hostile, isend_and_irecv_of_null_data_with_a_size_are_refused, .timeout = 90)
{
    const char *expect[] = {"ok isend of 10 bytes at NULL: 3, WARN: isend failed: NET/Reshard: "
                            "isend of 10 bytes at NULL",
                            "ok irecv of 10 bytes into NULL: 3",
                            "ok an empty message at NULL still passes", NULL};
    net_each_version("", "null-data", expect);
}

/* Row 8: the magic check read freed memory, and a stale close could act on a new object. */
Test(net_hostile, double_close_calls_after_close_and_double_dereg_are_refused, .timeout = 90)
{
    const char *expect[] = {"ok deregMr twice: 3",
                            "ok closeSend twice: 3",
                            "ok isend after closeSend: 3",
                            "ok regMr after closeSend: 3",
                            "ok closeRecv twice: 3",
                            "ok irecv after closeRecv: 3",
                            "ok test of a request whose comm was closed: 3",
                            "ok closeListen twice: 3",
                            "ok accept after closeListen: 3",
                            "ok closeSend of the closed send comm, with a new one open: 3",
                            "ok stale handles left the new comms working",
                            NULL};
    net_each_version("", "stale-handles", expect);
    cr_assert(strstr(net_out, "ok finalize twice: 3"), "v12:\n%s", net_out);
}

/* Row 9: one idle connection held the listener until RESHARD_TIMEOUT, round after round. */
Test(net_hostile, an_idle_connection_does_not_hold_up_real_connectors, .timeout = 150)
{
    const char *expect[] = {"ok connected past an idle connection in", NULL};
    net_each_version("RESHARD_TIMEOUT=10", "idle-connection", expect);
}

/* Row 9: the listener later handed back a receive comm for a connector that had given up. */
Test(net_hostile, a_connector_that_gave_up_gets_no_receive_comm, .timeout = 150)
{
    const char *expect[] = {"ok the connector gave up: connect failed: NET/Reshard: no handshake",
                            "ok no receive comm for a connector that gave up",
                            "ok the next connector gets through", NULL};
    net_each_version("RESHARD_TIMEOUT=1", "connector-gave-up", expect);
}

/* The flood: 100 idle and 100 byte-a-second connections, opened again whenever the listener
 * drops them, while real connectors come and go and 64 MiB stream on a comm of the listener. */
static void flood(int v)
{
    int rc = net_case(v, "RESHARD_TIMEOUT=60", "flood");
    const char *line = strstr(net_out, "ok flood: ");
    cr_log_info("v%d: %.300s", v, line ? line : "no flood line");
    cr_assert_eq(rc, 0, "%s", net_out);
    cr_assert_eq(net_count_lines("ok flood: "), 1, "%s", net_out);
    cr_assert_null(strstr(net_out, "FAIL"), "%s", net_out);
    net_no_sanitizer_reports();
}

Test(net_hostile, flood_of_idle_and_trickling_connections_while_connecting_and_streaming_v12,
     .timeout = 150)
{
    flood(12);
}

Test(net_hostile, flood_of_idle_and_trickling_connections_while_connecting_and_streaming_v8,
     .timeout = 150)
{
    flood(8);
}
