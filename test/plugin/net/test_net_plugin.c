/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The NCCL net plugin, as NCCL sees it: net_driver (test/plugin/net/net_driver.c) loads
 * libnccl-net-reshard.so with dlopen through LD_LIBRARY_PATH and drives one ncclNetPlugin_vN.
 *
 * net_conformance: the whole life cycle between two processes for every exported version, on
 *                  two emulated nodes when this host can make them (root), else over loopback.
 * net_faults:      bad input and faults (garbage and foreign handles, a request tested after
 *                  it completed, too many outstanding requests, unsupported registrations,
 *                  contexts), and a peer killed in the middle of a stream, on either side.
 *
 * The hostile cases (test_net_hostile.c) and the NCCL-facing ones (test_net_nccl.c) run the
 * same driver.
 */
#include "net_run.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A fresh path for the handle, the out-of-band channel between the two roles. */
static void handle_path(char *path, size_t n)
{
    char dir[] = "/tmp/reshard-net-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    snprintf(path, n, "%s/handle", dir);
}

static void handle_cleanup(const char *path)
{
    char dir[256], done[300];
    snprintf(dir, sizeof(dir), "%s", path);
    snprintf(done, sizeof(done), "%s.done", path); /* the receiver's end of the life cycle */
    unlink(done);
    unlink(path);
    *strrchr(dir, '/') = '\0';
    rmdir(dir);
}

/* cluster.sh copies rank 0's stdout as it is and prefixes the other ranks' lines: prefix rank
 * 0's too, so both runs read alike. */
static void prefix_rank0(void)
{
    static char copy[NET_OUT_MAX];
    size_t n = 0;
    for (const char *p = net_out; *p && n + 16 < sizeof(copy);) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p + 1) : strlen(p);
        if (strncmp(p, "[rank ", 6))
            n += (size_t)snprintf(copy + n, sizeof(copy) - n, "[rank 0] ");
        if (n + len >= sizeof(copy))
            break;
        memcpy(copy + n, p, len);
        n += len;
        p += len;
    }
    copy[n] = '\0';
    memcpy(net_out, copy, n + 1);
}

/* Both roles of version v, each printing its lines with a prefix; returns the exit status of
 * the pair (0 when both passed). `extra` goes to both (--die ...), and so do the variables of
 * `env` (device-memory runs). */
static int two_processes_env(int v, const char *env, const char *extra, int cluster)
{
    char handle[256];
    handle_path(handle, sizeof(handle));
    const char *b = build_dir();
    int rc;
    if (cluster)
        rc =
            net_run("scripts/cluster.sh run --nodes 2 --ranks-per-node 1 --rate none --timeout 120 "
                    "-- sh -c '" NET_DRIVER_ENV " %s LD_LIBRARY_PATH=%s exec %s/test/net_driver "
                    "--version %d --role env "
                    "--handle %s %s 2>&1' 2>&1", /* cluster.sh prefixes "[rank N] " */
                    env, b, b, v, handle, extra);
    else
        rc = net_run("export LD_LIBRARY_PATH=%s " NET_LOOPBACK " %s; "
                     "(%s/test/net_driver --version %d --role recv --handle %s %s 2>&1; "
                     "echo \"exit $?\") | sed -u 's/^/[rank 0] /' & "
                     "(%s/test/net_driver --version %d --role send --handle %s %s 2>&1; "
                     "echo \"exit $?\") | sed -u 's/^/[rank 1] /'; wait",
                     b, env, b, v, handle, extra, b, v, handle, extra);
    handle_cleanup(handle);
    if (cluster)
        prefix_rank0();
    return rc;
}

static int two_processes(int v, const char *extra, int cluster)
{
    return two_processes_env(v, "", extra, cluster);
}

static int have_cluster(void)
{
    static int cached = -1;
    if (cached < 0)
        cached = net_run("scripts/cluster.sh check") == 0;
    return cached;
}

/* MiB the life cycle streams: 1 GiB, unless RESHARD_TEST_STREAM_MIB says less (soft-RoCE
 * under qemu moves ~40 MB/s). */
static int stream_mib(void)
{
    const char *e = getenv("RESHARD_TEST_STREAM_MIB");
    int mib = e ? atoi(e) : 0;
    return mib >= 4 ? mib : 1024;
}

/* The whole life cycle of one version; the stream is in 4 MiB messages. */
static void life_cycle(int v)
{
    int cluster = have_cluster();
    char extra[64], stream[64];
    snprintf(extra, sizeof(extra), "--stream-mib %d", stream_mib());
    snprintf(stream, sizeof(stream), "ok stream %d MiB", stream_mib());
    int rc = two_processes(v, extra, cluster);
    cr_log_info("v%d over %s:\n%s", v, cluster ? "two emulated nodes" : "loopback", net_out);
    cr_assert_eq(net_count_lines("[rank 0] FAIL") + net_count_lines("[rank 1] FAIL"), 0, "%s",
                 net_out);
    const char *steps[] = {"ok init",
                           "ok getProperties",
                           "ok listen",
                           "ok accept",
                           "ok regMr",
                           "ok 5000 bytes into 5200",
                           "ok grouped irecv of maxRecvs by tag",
                           "ok 32 outstanding grouped receives",
                           "ok zero-byte message",
                           stream,
                           "ok iflush",
                           "ok deregMr",
                           "ok closeRecv with a receive in flight",
                           "ok closeListen",
                           "ok finalize"};
    char want[128];
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        snprintf(want, sizeof(want), "[rank 0] %s", steps[i]);
        int n = net_count_lines(want); /* one line of properties per device */
        cr_assert(strcmp(steps[i], "ok getProperties") ? n == 1 : n >= 1,
                  "receiver: %d '%s' lines:\n%s", n, steps[i], net_out);
    }
    const char *send_steps[] = {"ok connect",
                                "ok isend 5000",
                                "ok grouped isends",
                                "ok 32 x maxRecvs outstanding sends",
                                "ok zero-byte send",
                                "ok stream sent",
                                "ok the receiver is done",
                                "ok closeSend with a send in flight",
                                "ok finalize"};
    for (size_t i = 0; i < sizeof(send_steps) / sizeof(send_steps[0]); i++) {
        snprintf(want, sizeof(want), "[rank 1] %s", send_steps[i]);
        cr_assert_eq(net_count_lines(want), 1, "sender: no '%s' line:\n%s", send_steps[i], net_out);
    }
    snprintf(want, sizeof(want), "[rank 0] ok load libnccl-net-reshard.so ncclNetPlugin_v%d", v);
    cr_assert_eq(net_count_lines(want), 1, "the receiver did not load v%d:\n%s", v, net_out);
    if (!cluster) /* cluster.sh's status is the pair's; here each role said its own */
        cr_assert(strstr(net_out, "[rank 0] exit 0") && strstr(net_out, "[rank 1] exit 0"), "%s",
                  net_out);
    cr_assert_eq(rc, 0, "%s", net_out);
    net_no_sanitizer_reports();
}

Test(net_conformance, v8_life_cycle, .timeout = 150)
{
    life_cycle(8);
}

Test(net_conformance, v9_life_cycle, .timeout = 150)
{
    life_cycle(9);
}

Test(net_conformance, v10_life_cycle, .timeout = 150)
{
    life_cycle(10);
}

Test(net_conformance, v11_life_cycle, .timeout = 150)
{
    life_cycle(11);
}

Test(net_conformance, v12_life_cycle, .timeout = 150)
{
    life_cycle(12);
}

/* Without a version, the driver takes the newest symbol, as NCCL 2.30 does: v12. */
/* The life cycle with device buffers on the stand-in driver: the sender registers its with
 * regMr(NCCL_PTR_CUDA), the receiver its as a dma-buf (regMrDmaBuf), every receive is flushed
 * (iflush, completed) before it is read, and everything is deregistered. */
static void device_life_cycle(int v)
{
    int cluster = have_cluster();
    char env[512];
    snprintf(env, sizeof(env), NET_GDR_ENV_FMT, build_dir());
    int rc = two_processes_env(v, env, "--stream-mib 64 --mem device", cluster);
    cr_log_info("v%d with device memory over %s:\n%s", v, cluster ? "two nodes" : "loopback",
                net_out);
    cr_assert_eq(net_count_lines("[rank 0] FAIL") + net_count_lines("[rank 1] FAIL"), 0, "%s",
                 net_out);
    const char *steps[] = {
        "[rank 0] ok regMr (regMrDmaBuf of device memory)", "[rank 1] ok regMr (NCCL_PTR_CUDA)",
        "[rank 0] ok 5000 bytes into 5200", "[rank 0] ok grouped irecv of maxRecvs by tag",
        "[rank 0] ok 32 outstanding grouped receives", "[rank 0] ok zero-byte message",
        "[rank 0] ok stream 64 MiB",
        /* 1 + 1 + 32 grouped + 16 streamed; the empty one has nothing */
        "[rank 0] ok iflush: 50 receives into device memory flushed", "[rank 0] ok deregMr",
        "[rank 0] ok finalize", "[rank 1] ok stream sent", "[rank 1] ok finalize"};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++)
        cr_assert_eq(net_count_lines(steps[i]), 1, "no '%s' line:\n%s", steps[i], net_out);
    cr_assert(strstr(net_out, "ptrSupport 0x7"), "%s", net_out);
    cr_assert_eq(rc, 0, "%s", net_out);
    net_no_sanitizer_reports();
}

Test(net_conformance, v8_device_buffers_registered_flushed_and_exact, .timeout = 150)
{
    device_life_cycle(8);
}

Test(net_conformance, v9_device_buffers_registered_flushed_and_exact, .timeout = 150)
{
    device_life_cycle(9);
}

Test(net_conformance, v10_device_buffers_registered_flushed_and_exact, .timeout = 150)
{
    device_life_cycle(10);
}

Test(net_conformance, v11_device_buffers_registered_flushed_and_exact, .timeout = 150)
{
    device_life_cycle(11);
}

Test(net_conformance, v12_device_buffers_registered_flushed_and_exact, .timeout = 150)
{
    device_life_cycle(12);
}

/* Memory of the wrong kind, a descriptor that is not a dma-buf, a range past a dma-buf's end,
 * a transfer past its registration, a flush of a host receive: each ncclInvalidArgument with
 * a WARN naming the call, the pointer and the device, and nothing registered or left open. */
Test(net_faults, gpudirect_bad_input_is_refused_naming_call_pointer_and_device, .timeout = 90)
{
    char env[512];
    snprintf(env, sizeof(env), NET_GDR_ENV_FMT, build_dir());
    const char *expect[] = {"ok device memory as NCCL_PTR_HOST: 4",
                            "ok host memory as NCCL_PTR_CUDA: 4",
                            "ok host memory as a dma-buf: 4",
                            "ok a pipe as a dma-buf: 4",
                            "ok descriptor -1 as a dma-buf: 4",
                            "ok a range past the dma-buf's end: 4",
                            "ok isend past its registration: 4",
                            "ok iflush of a host receive: 4",
                            "ok no registration or descriptor left behind",
                            NULL};
    net_each_version(env, "gdr-bad-input", expect);
}

/* makeVDevice merges devices 0 and 1 into a virtual NIC (vProps, the speeds' sum; the same
 * merge again is the same device; bad merges refused), and messages over it are exact, each
 * rail carrying packets of its own. Needs two devices: make test-rdma's net-plugin-ib part
 * adds rxe1 beside rxe0; over loopback there is one. */
Test(net_conformance, virtual_nic_of_two_ports_stripes_each_message_over_both, .timeout = 150)
{
    int ran = 0;
    for (int i = 1; i < NET_NVERSIONS; i++) { /* v9 on: v8 has no makeVDevice */
        int rc = net_case(net_versions[i], "", "vnic");
        cr_assert_eq(rc, 0, "v%d vnic:\n%s", net_versions[i], net_out);
        cr_assert_null(strstr(net_out, "FAIL"), "%s", net_out);
        if (strstr(net_out, "ok vNIC skipped: one device"))
            continue;
        ran++;
        const char *expect[] = {"ok makeVDevice: device", "ok makeVDevice of one device: 3",
                                "ok makeVDevice of a device twice: 3",
                                "ok vNIC messages of 8388611, 101, 1 and 0 bytes exact"};
        for (size_t e = 0; e < sizeof(expect) / sizeof(expect[0]); e++)
            cr_assert(strstr(net_out, expect[e]), "v%d: no '%s':\n%s", net_versions[i], expect[e],
                      net_out);
        if (getenv("RESHARD_TRANSPORT") && !strcmp(getenv("RESHARD_TRANSPORT"), "ib"))
            cr_assert(strstr(net_out, "ok vNIC striped:"), "v%d: no striping measured:\n%s",
                      net_versions[i], net_out);
        cr_log_info("v%d:\n%s", net_versions[i], net_out);
        net_no_sanitizer_reports();
    }
    if (!ran)
        cr_skip_test("one network device here: a virtual NIC needs two (make test-rdma runs it "
                     "on rxe0 and rxe1)");
}

Test(net_conformance, newest_symbol_first, .timeout = 60)
{
    int rc = net_run("LD_LIBRARY_PATH=%s " NET_LOOPBACK " %s/test/net_driver --version auto --case "
                     "contexts 2>&1",
                     build_dir(), build_dir());
    cr_assert_eq(rc, 0, "%s", net_out);
    cr_assert(strstr(net_out, "ok load libnccl-net-reshard.so ncclNetPlugin_v12\n"), "%s", net_out);
}

/* NCCL_NET_PLUGIN may hold a full path instead of a name found through LD_LIBRARY_PATH. */
Test(net_conformance, loads_from_a_full_path, .timeout = 60)
{
    char path[1024];
    cr_assert_not_null(realpath(build_dir(), path));
    int rc = net_run("NCCL_NET_PLUGIN=%s/libnccl-net-reshard.so " NET_LOOPBACK
                     " %s/test/net_driver --version 8 --case contexts 2>&1",
                     path, build_dir());
    cr_assert_eq(rc, 0, "%s", net_out);
    cr_assert(strstr(net_out, "ok load /"), "%s", net_out);
}

/* ---- bad input and faults ---- */

Test(net_faults, garbage_handle_is_an_internal_error, .timeout = 60)
{
    const char *expect[] = {"ok garbage handle: 3, WARN: connect failed",
                            "ok copy of a handle used after its connection: 3", NULL};
    net_each_version("", "garbage-handle", expect);
}

Test(net_faults, handle_from_another_job_is_refused, .timeout = 60)
{
    const char *expect[] = {
        "ok handle from another job: 2, WARN: connect failed: NET/Reshard: listener", NULL};
    net_each_version("", "foreign-handle", expect);
}

Test(net_faults, request_tested_after_completion_is_an_error, .timeout = 60)
{
    const char *expect[] = {"ok request tested after completion: 3", NULL};
    net_each_version("", "test-after-done", expect);
}

Test(net_faults, more_outstanding_requests_than_allowed_is_an_error, .timeout = 60)
{
    const char *expect[] = {"ok 33rd outstanding receive: 3", "ok 257th outstanding send: 3", NULL};
    net_each_version("", "too-many-requests", expect);
}

Test(net_faults, arguments_out_of_range_are_refused, .timeout = 60)
{
    const char *expect[] = {"ok getProperties of device 99: 3",
                            "ok irecv of 0 buffers: 3",
                            "ok irecv of maxRecvs + 1 buffers: 3",
                            "ok iflush of 0 buffers: 3",
                            "ok isend on a receive comm: 3",
                            "ok irecv on a send comm: 3",
                            "ok closeSend of something else: 3",
                            "ok closeRecv of a send comm: 3",
                            NULL};
    net_each_version("", "bad-args", expect);
    cr_assert(strstr(net_out, "ok isend above maxP2pBytes: 3"), "v12:\n%s", net_out);
}

Test(net_faults, connect_to_a_listener_that_never_accepts_times_out, .timeout = 90)
{
    const char *expect[] = {"ok listener that never accepts: 2, WARN: connect failed: "
                            "NET/Reshard: no handshake with",
                            NULL};
    net_each_version("RESHARD_TIMEOUT=1", "connect-timeout", expect);
}

Test(net_faults, connect_to_a_closed_listener_fails, .timeout = 60)
{
    const char *expect[] = {"ok handle of a closed listener: 2", NULL};
    net_each_version("", "listener-gone", expect);
}

Test(net_faults, unsupported_registrations_are_refused, .timeout = 60)
{
    const char *expect[] = {
        "ok regMr of CUDA memory: 3", "ok regMr of an unknown kind: 3",       "ok regMrDmaBuf: 3",
        "ok deregMr of garbage: 3",   "ok isend outside its registration: 4", NULL};
    net_each_version("", "bad-mr", expect);
}

Test(net_conformance, connections_made_and_closed_while_another_thread_streams, .timeout = 120)
{
    const char *expect[] = {"messages streamed while another thread made and closed 30 "
                            "connections",
                            NULL};
    net_each_version("", "threads", expect);
}

/* v11+ contexts: a second one works and finalizes apart, finalize(NULL), a garbage context;
 * v8-v10: a repeated init is harmless. */
Test(net_faults, contexts_init_twice_finalize_null_and_garbage, .timeout = 60)
{
    const char *expect[] = {"ok finalize\n", NULL};
    net_each_version("", "contexts", expect);
    const char *v12[] = {"ok a second context works and finalizes apart", "ok finalize(NULL)",
                         "ok listen on a garbage context: 3", NULL};
    for (const char *const *e = v12; *e; e++) /* out holds the last run: v12 */
        cr_assert(strstr(net_out, *e), "v12: no '%s':\n%s", *e, net_out);
}

/* A peer killed in the middle of the stream: the survivor's test fails with ncclSystemError and
 * a WARN naming the peer, promptly (the driver gives up on a test after 60 s, the test here
 * after 90). */
static void peer_dies(int v, const char *side)
{
    char extra[32];
    snprintf(extra, sizeof(extra), "--stream-mib 256 --die %s", side);
    two_processes(v, extra, 0);
    int survivor = !strcmp(side, "send") ? 0 : 1;
    char want[64];
    /* the failure comes from test, or from the next irecv/isend when the plugin already knew */
    int died = 0;
    for (int k = 0; k < 3; k++) {
        snprintf(want, sizeof(want), "[rank %d] ok peer died: %s returned ncclSystemError",
                 survivor,
                 k == 0   ? "test"
                 : k == 1 ? "irecv"
                          : "isend");
        died += net_count_lines(want);
    }
    cr_assert_eq(died, 1, "%s", net_out);
    cr_assert(strstr(net_out, "closed without closing the comm"), "%s", net_out);
    snprintf(want, sizeof(want), "[rank %d] ok closed after failure", survivor);
    cr_assert_eq(net_count_lines(want), 1, "the survivor did not close its failed comm:\n%s",
                 net_out);
    snprintf(want, sizeof(want), "[rank %d] ok finalize", survivor);
    cr_assert_eq(net_count_lines(want), 1, "the survivor did not finalize cleanly:\n%s", net_out);
    snprintf(want, sizeof(want), "[rank %d] exit 0", survivor);
    cr_assert_eq(net_count_lines(want), 1, "%s", net_out);
    net_no_sanitizer_reports();
}

Test(net_faults, sender_dies_mid_stream_v12, .timeout = 120)
{
    peer_dies(12, "send");
}

Test(net_faults, receiver_dies_mid_stream_v12, .timeout = 120)
{
    peer_dies(12, "recv");
}

Test(net_faults, sender_dies_mid_stream_v8, .timeout = 120)
{
    peer_dies(8, "send");
}
