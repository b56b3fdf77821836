/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Local pairs and the control plane of a communicator plan (plugin/exec/exec_link.c,
 * exec_vote.c), across forked ranks in domains of 2: buffers are announced to the local peers
 * that write them only when they change; a peer the kernel did not vouch for is written over
 * the network on both ends, and ends that disagree are named before anything moves; the plan
 * vote's world figures are the whole plan's, and a size set differently on one rank is named.
 */
#include "base/error.h"
#include "base/param.h"
#include "plugin/comm/comm.h"
#include "test/plugin/ranks.h"
#include "test/plugin/side.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define ROWS "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(0)"
#define COLS "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(1)"

static void set_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "10", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

TestSuite(link, .init = set_env, .timeout = 60);

static uint64_t ctrl_of(const reshard_comm_counters_t *n)
{
    return n->ctrl_bytes_out + n->ctrl_bytes_in;
}

static reshard_status_t refit(struct side *x, int rank)
{
    memset(x->d, 0, x->b.dst_bytes);
    reshard_status_t st = reshard_plan_execute(x->plan, &x->b);
    if (st == RESHARD_OK && count_wrong(x->dst, rank, x->d))
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: wrong data", rank);
    return st;
}

/* The first refit tells the local writer where the destination is; the next ones exchange
 * nothing but the start vote; a new destination buffer is told again, and lands. */
static reshard_status_t announce_on_change(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, ROWS, COLS);
    reshard_comm_counters_t n[5];
    reshard_comm_counters(comm, &n[0]);
    for (int it = 0; it < 3 && st == RESHARD_OK; it++) {
        st = refit(&x, rank);
        reshard_comm_counters(comm, &n[it + 1]);
    }
    int32_t *moved = calloc(1, x.b.dst_bytes);
    int32_t *old = x.d;
    x.d = moved;
    x.b.dst = moved;
    if (st == RESHARD_OK)
        st = refit(&x, rank);
    reshard_comm_counters(comm, &n[4]);
    x.d = old;
    free(moved);
    if (st == RESHARD_OK && ctrl_of(&n[1]) == ctrl_of(&n[0]))
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: the first refit told nobody", rank);
    if (st == RESHARD_OK && ctrl_of(&n[3]) != ctrl_of(&n[1]))
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: steady refits sent %llu control bytes", rank,
                      (unsigned long long)(ctrl_of(&n[3]) - ctrl_of(&n[1])));
    uint64_t boot = n[3].boot_out + n[3].boot_in - n[2].boot_out - n[2].boot_in;
    if (st == RESHARD_OK && (boot == 0 || boot > 4096))
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: a steady refit's vote took %llu bytes", rank,
                      (unsigned long long)boot);
    if (st == RESHARD_OK && ctrl_of(&n[4]) == ctrl_of(&n[3]))
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: a new buffer was told to nobody", rank);
    if (st == RESHARD_OK && n[4].net_in - n[3].net_in != n[3].net_in - n[2].net_in)
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: control bytes counted as data", rank);
    side_close(&x);
    return st;
}

Test(link, buffers_are_told_to_local_writers_only_when_they_change)
{
    all_ok(run_ranks(4, announce_on_change), 4);
}

/* Ranks 0 and 1 (one domain) may not write each other's memory: the kernel did not vouch for
 * the peer (comm_local_ok). mode 0: both ends know it, and their local transfers go over the
 * network; mode 1: only rank 0 does, and every rank is told before anything moves. */
static int distrust_mode;

static reshard_status_t distrust(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    if (rank == 0 || (rank == 1 && distrust_mode == 0))
        comm->pid[rank ^ 1] = 0; /* what an unverified peer looks like to comm_local_ok */
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    reshard_comm_counters_t a, b;
    reshard_plan_stats_t ps;
    reshard_rank_stats_t rs[4];
    reshard_comm_counters(comm, &a);
    for (int it = 0; it < 2 && st == RESHARD_OK; it++)
        st = refit(&x, rank);
    reshard_comm_counters(comm, &b);
    if (st == RESHARD_OK)
        st = reshard_plan_stats(x.plan, &ps, rs);
    uint64_t local = b.local_out - a.local_out, net = b.net_out - a.net_out;
    if (st == RESHARD_OK && (rank < 2 ? local != 0 : local == 0))
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: %llu bytes written locally", rank,
                      (unsigned long long)local);
    if (st == RESHARD_OK && (net != 2 * rs[rank].net_out || rs[rank].local_out != local / 2))
        st = rs_error(RESHARD_ERR_INTERNAL,
                      "rank %d: %llu bytes over the network, the plan says %llu a refit", rank,
                      (unsigned long long)net, (unsigned long long)rs[rank].net_out);
    side_close(&x);
    return st;
}

Test(link, local_transfers_to_a_peer_the_kernel_did_not_vouch_for_go_over_the_network)
{
    distrust_mode = 0;
    all_ok(run_ranks(4, distrust), 4);
}

Test(link, ranks_that_disagree_on_a_peer_they_may_write_are_named_before_bytes_move)
{
    distrust_mode = 1;
    struct outcome *o = run_ranks(4, distrust);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_PLAN_MISMATCH, "rank %d: %d %s", r, o[r].status,
                     o[r].msg);
        cr_assert(strstr(o[r].msg, "disagree on which local peers they may write directly"),
                  "rank %d: %s", r, o[r].msg);
    }
}

/* The world's figures from the plan vote are those of the whole plan, made on every rank alone
 * from the same inputs; every rank's own row is its row of the whole plan. */
static reshard_status_t world_figures(int rank, int size, reshard_comm_t *comm)
{
    reshard_layout_t *s = parse("shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)");
    reshard_layout_t *d = parse("shape=48x40 dtype=i32 ranks=2-5 place=R");
    reshard_layout_t *s2 = parse("shape=30x64 dtype=f32 ranks=0-5 mesh=2x3 place=R,S(1)");
    reshard_layout_t *d2 = parse("shape=30x64 dtype=f32 ranks=0-5 mesh=6 place=S(0)");
    reshard_tensor_t t[2] = {{"w", s, d}, {"v", s2, d2}};
    reshard_plan_t *mine = NULL, *whole = NULL;
    reshard_plan_stats_t a, b;
    reshard_rank_stats_t ra[6], rb[6];
    reshard_status_t st = reshard_comm_plan_create(comm, t, 2, NULL, &mine);
    if (st == RESHARD_OK)
        st = reshard_plan_create(t, 2, reshard_comm_topo(comm), NULL, &whole);
    if (st == RESHARD_OK)
        st = reshard_plan_stats(mine, &a, ra);
    if (st == RESHARD_OK)
        st = reshard_plan_stats(whole, &b, rb);
    for (int r = 0; st == RESHARD_OK && r < size; r++)
        if (r != rank && (ra[r].net_out || ra[r].local_in))
            st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: rank %d's row is not zero", rank, r);
    if (st == RESHARD_OK)
        st = reshard_comm_allgather(comm, ra, sizeof(ra[0]));
    int same = a.net_bytes == b.net_bytes && a.min_net_bytes == b.min_net_bytes &&
               a.local_bytes == b.local_bytes && a.self_bytes == b.self_bytes &&
               a.max_nic_bytes == b.max_nic_bytes && a.max_nic_rank == b.max_nic_rank &&
               a.lb_nic_bytes == b.lb_nic_bytes && a.net_ops == b.net_ops &&
               a.local_ops == b.local_ops && a.fwd_ops == b.fwd_ops && a.self_ops == b.self_ops &&
               a.ntensors == 2 && a.world_size == 6 && a.ndomains == 3 && a.net_bytes > 0 &&
               a.fwd_ops > 0;
    if (st == RESHARD_OK && !same)
        st = rs_error(RESHARD_ERR_INTERNAL,
                      "rank %d: net %llu/%llu, min %llu/%llu, nic %llu@%d/%llu@%d, lb %llu/%llu, "
                      "fwd %llu/%llu",
                      rank, (unsigned long long)a.net_bytes, (unsigned long long)b.net_bytes,
                      (unsigned long long)a.min_net_bytes, (unsigned long long)b.min_net_bytes,
                      (unsigned long long)a.max_nic_bytes, a.max_nic_rank,
                      (unsigned long long)b.max_nic_bytes, b.max_nic_rank,
                      (unsigned long long)a.lb_nic_bytes, (unsigned long long)b.lb_nic_bytes,
                      (unsigned long long)a.fwd_ops, (unsigned long long)b.fwd_ops);
    for (int r = 0; st == RESHARD_OK && r < size; r++)
        if (ra[r].net_out != rb[r].net_out || ra[r].net_in != rb[r].net_in ||
            ra[r].local_out != rb[r].local_out || ra[r].local_in != rb[r].local_in ||
            ra[r].self != rb[r].self || ra[r].net_msgs != rb[r].net_msgs ||
            ra[r].domain != rb[r].domain)
            st = rs_error(RESHARD_ERR_INTERNAL, "rank %d's row differs from the whole plan's", r);
    reshard_plan_destroy(mine);
    reshard_plan_destroy(whole);
    reshard_layout_destroy(s);
    reshard_layout_destroy(d);
    reshard_layout_destroy(s2);
    reshard_layout_destroy(d2);
    return st;
}

Test(link, a_communicator_plans_world_figures_are_the_whole_plans)
{
    all_ok(run_ranks(6, world_figures), 6);
}

/* Rank 3 cuts chunks of another size: every rank is told which rank, and both values. */
static void other_chunks_on_rank3(int rank)
{
    if (rank == 3) {
        setenv("RESHARD_CHUNK_BYTES", "65536", 1);
        rs_param_reload();
    }
}

static reshard_status_t just_plan(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, ROWS, COLS);
    side_close(&x);
    return st;
}

Test(link, a_chunk_size_set_differently_on_one_rank_is_named_on_every_rank)
{
    rank_setup = other_chunks_on_rank3;
    struct outcome *o = run_ranks(4, just_plan);
    rank_setup = NULL;
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(o[r].status, RESHARD_ERR_PLAN_MISMATCH, "rank %d: %d %s", r, o[r].status,
                     o[r].msg);
        cr_assert(strstr(o[r].msg, r == 3 ? "RESHARD_CHUNK_BYTES is 4194304 on rank 0 and 65536 "
                                            "here"
                                          : "RESHARD_CHUNK_BYTES is 65536 on rank 3 and 4194304 "
                                            "here"),
                  "rank %d: %s", r, o[r].msg);
    }
}
