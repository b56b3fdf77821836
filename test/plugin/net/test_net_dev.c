/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin's devices (plugin/net/net_dev.c): which interfaces it offers, in
 * RESHARD_NET_DEVICES's syntax (NCCL_SOCKET_IFNAME's) and without virtual ones; interfaces made
 * in a network namespace to see it choose (root; skipped otherwise, saying why); and no device
 * at all when the transport's library is missing, so that NCCL falls back.
 *
 * net_devices: the rule in the test's name.
 */
#include "net_run.h"
#include "plugin/net/net_int.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

Test(net_devices, an_empty_list_takes_every_interface_but_virtual_ones)
{
    const char *real[] = {"eth0", "ens5", "enp65s0f0", "ib0", "bond0", "br0", "lo"};
    const char *virt[] = {"docker0", "docker_gwbridge", "virbr0", "virbr0-nic", "veth3fa2b1",
                          "cni0",    "flannel.1"};
    for (size_t i = 0; i < sizeof(real) / sizeof(real[0]); i++)
        cr_assert(net_if_selected("", real[i]), "%s left out", real[i]);
    for (size_t i = 0; i < sizeof(virt) / sizeof(virt[0]); i++) {
        cr_assert(net_if_virtual(virt[i]), "%s is not virtual", virt[i]);
        cr_assert(!net_if_selected("", virt[i]), "%s taken", virt[i]);
    }
}

Test(net_devices, names_are_prefixes_and_equals_makes_them_exact)
{
    cr_assert(net_if_selected("eth", "eth0"));
    cr_assert(net_if_selected("ib,eth", "eth1"));
    cr_assert(!net_if_selected("eth", "ens5"));
    cr_assert(net_if_selected("=eth0", "eth0"));
    cr_assert(!net_if_selected("=eth0", "eth01"));
    cr_assert(!net_if_selected("=eth", "eth0"));
    cr_assert(net_if_selected("ens,=eth1", "eth1"));
    cr_assert(!net_if_selected("ens,=eth1", "eth10"));
    cr_assert(net_if_selected("docker", "docker0"), "a list may name a virtual interface");
    cr_assert(!net_if_selected(",", "eth0"), "empty entries name nothing");
}

Test(net_devices, a_caret_takes_all_but_the_list_and_still_leaves_out_virtual_ones)
{
    cr_assert(!net_if_selected("^eth", "eth0"));
    cr_assert(net_if_selected("^eth", "ens5"));
    cr_assert(!net_if_selected("^=ens5", "ens5"));
    cr_assert(net_if_selected("^=ens5", "ens50"));
    cr_assert(!net_if_selected("^eth", "docker0"));
    cr_assert(net_if_selected("^", "eth0"), "an empty exclusion excludes nothing");
}

/* ---- interfaces in a network namespace ---- */

/* Pairs of veth ends renamed to look like what a host has: real-looking NICs and one of each
 * kind of virtual one, each up with an address of its own (waited for: a veth end runs a
 * moment after it is set up); /sys mounted again in a mount namespace of its own, so that UCX
 * sees the namespace's interfaces. */
#define NETNS_SETUP                                                                                \
    "mount -t sysfs none /sys && ip link set lo up && "                                            \
    "ip link add ens5 type veth peer name docker0 && "                                             \
    "ip link add eth1 type veth peer name virbr0 && "                                              \
    "ip link add veth9a1 type veth peer name cni0 && "                                             \
    "ip link add flannel.1 type veth peer name ens6 && "                                           \
    "n=0; for i in ens5 docker0 eth1 virbr0 veth9a1 cni0 flannel.1 ens6; do "                      \
    "n=$((n+1)); ip addr add 10.77.$n.1/24 dev $i && ip link set $i up || exit 1; done && "        \
    "for i in ens5 docker0 eth1 virbr0 veth9a1 cni0 flannel.1 ens6; do t=0; "                      \
    "until grep -q up /sys/class/net/$i/operstate; do "                                            \
    "t=$((t+1)); [ $t -lt 200 ] || exit 1; sleep 0.05; done; done"

static void need_netns(void)
{
    if (geteuid() != 0)
        cr_skip_test("making interfaces in a network namespace needs root");
    if (net_run("unshare -n -m sh -c '" NETNS_SETUP "' 2>&1") != 0)
        cr_skip_test("this host cannot make veth interfaces in a network namespace: %s", net_out);
}

/* The driver in a fresh namespace with those interfaces, RESHARD_NET_DEVICES=list; returns its
 * status, its output in net_out. */
static int devices_in_netns(const char *list, const char *dcase)
{
    return net_run("unshare -n -m sh -c '" NETNS_SETUP " && LD_LIBRARY_PATH=%s " NET_DRIVER_ENV
                   " RESHARD_NET_DEVICES=%s %s/test/net_driver --version 12 --case %s' 2>&1",
                   build_dir(), list, build_dir(), dcase);
}

/* Whether the driver offered interface name, as "dev N name" in its properties line. */
static int offered(const char *name)
{
    char want[64];
    for (int d = 0; d < 16; d++) {
        snprintf(want, sizeof(want), "ok getProperties v12 dev %d %s ", d, name);
        if (strstr(net_out, want))
            return 1;
    }
    return 0;
}

static void expect_offered(const char *list, const char *const *yes, const char *const *no)
{
    cr_assert_eq(devices_in_netns(list, "devices"), 0, "RESHARD_NET_DEVICES='%s':\n%s", list,
                 net_out);
    for (const char *const *y = yes; *y; y++)
        cr_assert(offered(*y), "RESHARD_NET_DEVICES='%s': %s not offered:\n%s", list, *y, net_out);
    for (const char *const *n = no; *n; n++)
        cr_assert(!offered(*n), "RESHARD_NET_DEVICES='%s': %s offered:\n%s", list, *n, net_out);
}

Test(net_devices, virtual_interfaces_in_a_namespace_are_left_out, .timeout = 90)
{
    need_netns();
    const char *yes[] = {"ens5", "eth1", "ens6", NULL};
    const char *no[] = {"docker0", "virbr0", "veth9a1", "cni0", "flannel.1", "lo", NULL};
    expect_offered("", yes, no);
}

Test(net_devices, nccl_socket_ifname_syntax_in_a_namespace, .timeout = 90)
{
    need_netns();
    const char *caret_yes[] = {"eth1", "ens6", NULL}, *caret_no[] = {"ens5", "docker0", NULL};
    expect_offered("^=ens5", caret_yes, caret_no);
    const char *prefix_yes[] = {"ens5", "ens6", NULL}, *prefix_no[] = {"eth1", NULL};
    expect_offered("ens", prefix_yes, prefix_no);
    const char *named_yes[] = {"ens5", "docker0", NULL}, *named_no[] = {"ens6", "eth1", NULL};
    expect_offered("=ens5,docker", named_yes, named_no);
    cr_assert_eq(devices_in_netns("=ens", "no-devices"), 0, "'=ens' matches no interface:\n%s",
                 net_out);
    cr_assert(strstr(net_out, "matching RESHARD_NET_DEVICES==ens"), "%s", net_out);
}

/* ---- no transport, no device ---- */

static void no_devices(const char *env, const char *says)
{
    for (int i = 0; i < NET_NVERSIONS; i++) {
        int rc = net_case(net_versions[i], env, "no-devices");
        cr_assert_eq(rc, 0, "v%d with %s:\n%s", net_versions[i], env, net_out);
        cr_assert(strstr(net_out, "ok no device: WARN: "), "%s", net_out);
        cr_assert(strstr(net_out, says), "v%d: the WARN does not say '%s':\n%s", net_versions[i],
                  says, net_out);
        net_no_sanitizer_reports();
    }
}

Test(net_devices, no_device_when_ucx_cannot_be_loaded, .timeout = 90)
{
    no_devices("RESHARD_TRANSPORT=ucx RESHARD_UCX_LIB=/nonexistent/libucp.so.0",
               "UCX: /nonexistent/libucp.so.0: cannot open shared object file");
}

Test(net_devices, no_device_when_ib_is_asked_for_and_verbs_cannot_be_loaded, .timeout = 90)
{
    no_devices("RESHARD_TRANSPORT=ib RESHARD_IB_LIB=/nonexistent/libibverbs.so.1",
               "/nonexistent/libibverbs.so.1");
}

Test(net_devices, no_device_when_neither_verbs_nor_ucx_can_be_loaded, .timeout = 90)
{
    no_devices("RESHARD_IB_LIB=/nonexistent/libibverbs.so.1 "
               "RESHARD_UCX_LIB=/nonexistent/libucp.so.0",
               "the plugin offers no device, so NCCL uses another network");
}
