/* SPDX-License-Identifier: Apache-2.0 */
/* The TCP bootstrap (transport/boot/): ranks are threads, or forked processes, of the test
 * process, meeting on loopback with ports the kernel picks, so that tests may run in parallel. */
#include "boot_ranks.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"
#include "transport/boot/bootstrap.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(bootstrap, .init = clear_boot_params);

Test(bootstrap, four_ranks_agree_on_allgather_bcast_and_barrier, .timeout = 30)
{
    struct boot_id id;
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    run_job_ok(&id, 4);
}

Test(bootstrap, one_rank_alone_needs_nobody, .timeout = 30)
{
    struct boot_id id;
    struct rank_run r;
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    start(&r, &id, 0, 1, 1000, WORK_COLLECTIVES);
    finish(&r);
    assert_all_ok(&r, 1);
    close_all(&r, 1);
}

Test(bootstrap, sixty_four_ranks_allgather_64_kib_each, .timeout = 60)
{
    enum { N = 64 };
    struct boot_id id;
    struct rank_run *r = calloc(N, sizeof(*r));
    cr_assert_not_null(r);
    listening_id(&id);
    for (int i = 0; i < N; i++) {
        prep(&r[i], &id, i, N, 20000, WORK_NONE);
        r[i].bytes = 64 * 1024;
        launch(&r[i]);
    }
    finish_all(r, N);
    assert_all_ok(r, N);
    /* The rendezvous is done: now every rank gathers 64 x 64 KiB at once. */
    work_all(r, N, WORK_ALLGATHER);
    finish_all(r, N);
    assert_all_ok(r, N);
    close_all(r, N);
    free(r);
}

Test(bootstrap, out_of_memory_at_any_allocation_of_init_or_a_collective_fails_cleanly,
     .timeout = 30)
{
    int failed = 0;
    long n;
    for (n = 1; n < 64; n++) {
        struct boot_id id;
        struct boot *b = NULL;
        unsigned char slot[8] = {1, 2, 3};
        cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
        rs_test_fail_alloc(n);
        reshard_status_t st = boot_init(&id, 0, 1, 1000, &b);
        if (st == RESHARD_OK)
            st = boot_allgather(b, slot, sizeof(slot));
        rs_test_fail_alloc(0);
        boot_id_release(&id);
        if (st == RESHARD_OK) {
            cr_assert_eq(slot[2], 3);
            boot_close(b);
            break;
        }
        cr_assert_eq(st, RESHARD_ERR_NO_MEMORY, "allocation %ld: %s", n, rs_error_message());
        cr_assert(strstr(rs_error_message(), "out of memory"), "allocation %ld: %s", n,
                  rs_error_message());
        boot_close(b); /* NULL when init failed: its output is written on success only */
        failed++;
    }
    cr_assert_lt(n, 64, "the run never got through");
    cr_assert_geq(failed, 5, "only %d allocations were tried", failed);
}

/* A forked child: rank `rank` of `size` at id; exits 0 when the allgather came out right. */
static void child_rank(const struct boot_id *id, int rank, int size)
{
    struct rank_run r = {
        .id = *id, .rank = rank, .size = size, .timeout_ms = 10000, .work = WORK_COLLECTIVES};
    rank_main(&r);
    if (r.st != RESHARD_OK)
        fprintf(stderr, "child rank %d: %s\n", rank, r.msg);
    boot_close(r.b);
    _exit(r.st == RESHARD_OK && r.data_ok ? 0 : 1);
}

Test(bootstrap, forked_ranks_meet_at_the_id_their_parent_made, .timeout = 30)
{
    enum { N = 4 };
    struct boot_id id;
    pid_t pid[N];
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    for (int i = 0; i < N; i++) {
        pid[i] = fork();
        cr_assert_geq(pid[i], 0);
        if (pid[i] == 0)
            child_rank(&id, i, N);
    }
    /* The children hold the listening socket now. */
    boot_id_release(&id);
    for (int i = 0; i < N; i++) {
        int status = -1;
        cr_assert_eq(waitpid(pid[i], &status, 0), pid[i]);
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d: status %#x", i, status);
    }
}

Test(bootstrap, id_from_an_address_and_explicit_port_joins_ranks, .timeout = 30)
{
    struct boot_id id;
    char addr[80], want[32];
    int port = private_loopback_port();
    loopback_id(port, SECRET, &id);
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    cr_assert_str_eq(boot_id_addr(&id, addr, sizeof(addr)), want);
    run_job_ok(&id, 3);
}

Test(bootstrap, peers_started_before_rank_0_wait_for_it, .timeout = 30)
{
    struct boot_id id;
    struct rank_run r[3];
    loopback_id(private_loopback_port(), SECRET, &id);
    start(&r[1], &id, 1, 3, 10000, WORK_COLLECTIVES);
    start(&r[2], &id, 2, 3, 10000, WORK_COLLECTIVES);
    usleep(300 * 1000); /* their connects are refused meanwhile, and retried */
    start(&r[0], &id, 0, 3, 10000, WORK_COLLECTIVES);
    finish_all(r, 3);
    assert_all_ok(r, 3);
    close_all(r, 3);
}

/* The held port is bound, not listening, with SO_REUSEADDR: another program that binds the same
 * number with SO_REUSEADDR (every address, as a launcher's rank 0 or torch's store do) and
 * listens first used to make rank 0's bind fail with "Address already in use" (the flaky
 * failures of the two tests above under parallel load). In a network namespace of the test's
 * own, nobody else can. */
Test(bootstrap, another_programs_listener_on_the_held_port_leaves_it_to_rank_0, .timeout = 30)
{
    int one = 1, outsider = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* the host's */
    cr_assert_geq(outsider, 0);
    int port = held_loopback_port(); /* a number free on the host, kept so while it binds */
    if (private_net() != 0)
        cr_skip_test("no network namespace of the test's own can be made here (%m): a held "
                     "port is shared with every program on the host");
    struct sockaddr_in mine = {.sin_family = AF_INET,
                               .sin_port = htons((uint16_t)port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)},
                       any = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); /* the same port, held here */
    cr_assert_geq(held, 0);
    cr_assert_eq(setsockopt(held, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
    cr_assert_eq(bind(held, (struct sockaddr *)&mine, sizeof(mine)), 0, "%m");
    cr_assert_eq(setsockopt(outsider, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)), 0);
    cr_assert_eq(bind(outsider, (struct sockaddr *)&any, sizeof(any)), 0, "outsider: %m");
    cr_assert_eq(listen(outsider, 4), 0, "outsider: %m");
    struct boot_id id;
    loopback_id(port, SECRET, &id);
    run_job_ok(&id, 3);
    close(outsider);
    close(held);
}

/* A port that a listener on another address of this host uses (UCX's and the NCCL plugin's
 * listen on the interfaces' addresses, at ports of the kernel's pick) is never held for rank 0,
 * whose bind covers every address and would fail there. Before, the holder bound 127.0.0.1
 * alone, so the kernel could pick such a port for it (the same "Address already in use"). */
Test(bootstrap, a_port_a_listener_on_another_address_uses_is_never_held_for_rank_0)
{
    struct ifaddrs *all, *ifa;
    struct sockaddr_in other = {0};
    cr_assert_eq(getifaddrs(&all), 0);
    for (ifa = all; ifa; ifa = ifa->ifa_next)
        if (ifa->ifa_addr && ifa->ifa_addr->sa_family == AF_INET &&
            !(ifa->ifa_flags & IFF_LOOPBACK) && (ifa->ifa_flags & IFF_UP)) {
            memcpy(&other, ifa->ifa_addr, sizeof(other));
            break;
        }
    freeifaddrs(all);
    if (!other.sin_family)
        cr_skip_test("no IPv4 address but the loopback on this host");
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    socklen_t len = sizeof(other);
    other.sin_port = 0;
    cr_assert_geq(l, 0);
    cr_assert_eq(bind(l, (struct sockaddr *)&other, sizeof(other)), 0, "%m");
    cr_assert_eq(listen(l, 4), 0, "%m");
    cr_assert_eq(getsockname(l, (struct sockaddr *)&other, &len), 0);
    int port = ntohs(other.sin_port);
    cr_assert_eq(hold_port(AF_INET, port), -1, "port %d, on which %s listens, was held", port,
                 inet_ntoa(other.sin_addr));
    close(l);
}

Test(bootstrap, ipv6_loopback_works, .timeout = 30)
{
    struct boot_id id;
    char got[80], want[32];
    if (held_port(AF_INET6) < 0)
        cr_skip_test("no IPv6 loopback on this host");
    cr_assert_eq(boot_id_from_addr("::1", 4242, SECRET, &id), RESHARD_OK, "%s", rs_error_message());
    cr_assert_str_eq(boot_id_addr(&id, got, sizeof(got)), "[::1]:4242");
    /* A listener of the kernel's pick (a port chosen ahead could be taken meanwhile). */
    setenv("RESHARD_BOOT_ADDR", "::1", 1);
    rs_param_reload();
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    snprintf(want, sizeof(want), "[::1]:");
    cr_assert(strstr(boot_id_addr(&id, got, sizeof(got)), want) == got, "%s", got);
    run_job_ok(&id, 3);
}

Test(bootstrap, configured_address_and_port_are_where_the_id_listens, .timeout = 30)
{
    struct boot_id id;
    char got[80], want[32];
    char port_str[16];
    int port = private_loopback_port();
    snprintf(port_str, sizeof(port_str), "%d", port);
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    setenv("RESHARD_BOOT_PORT", port_str, 1);
    rs_param_reload();
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    snprintf(want, sizeof(want), "127.0.0.1:%d", port);
    cr_assert_str_eq(boot_id_addr(&id, got, sizeof(got)), want);
    run_job_ok(&id, 2);
}

Test(bootstrap, stray_connections_neither_stall_nor_join_the_rendezvous, .timeout = 30)
{
    struct boot_id id;
    struct rank_run r[2];
    static const char junk[32] = "GET / HTTP/1.0\r\n\r\n";
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    rs_param_reload();
    rs_log_set_sink(capture_warning);
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    /* One says nothing at all; one speaks another protocol. Both reach the listener first. */
    int silent = raw_connect(&id), noisy = raw_connect(&id);
    cr_assert_eq(write(noisy, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    start(&r[0], &id, 0, 2, 10000, WORK_COLLECTIVES);
    start(&r[1], &id, 1, 2, 10000, WORK_COLLECTIVES);
    finish_all(r, 2);
    assert_all_ok(r, 2);
    /* The junk was refused at once; the silent one when the job no longer needed anyone. */
    cr_assert(strstr(warned, "no valid opening (the peer sent a malformed frame (bad magic)"), "%s",
              warned);
    cr_assert(strstr(boot_refusal(r[0].b), "every rank has arrived"), "%s", boot_refusal(r[0].b));
    close(silent);
    close(noisy);
    close_all(r, 2);
}

Test(bootstrap, wrong_secret_is_refused_and_the_job_still_completes, .timeout = 30)
{
    struct boot_id id, bad;
    struct rank_run r[2];
    struct boot *intruder = NULL;
    rs_log_set_sink(capture_warning);
    listening_id(&id);
    same_place_id(&id, "another job", &bad);
    start(&r[0], &id, 0, 2, 10000, WORK_COLLECTIVES);
    reshard_status_t st = boot_init(&bad, 1, 2, 10000, &intruder);
    if (st != RESHARD_ERR_REFUSED) {
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        finish(&r[0]);
        cr_assert_fail("intruder: %s; rank 0: %s", why, r[0].msg);
    }
    cr_assert_null(intruder);
    cr_assert(strstr(rs_error_message(), "wrong secret"), "%s", rs_error_message());
    start(&r[1], &id, 1, 2, 10000, WORK_COLLECTIVES);
    finish_all(r, 2);
    assert_all_ok(r, 2);
    cr_assert(strstr(boot_refusal(r[0].b), "wrong secret"), "%s", boot_refusal(r[0].b));
    cr_assert(strstr(boot_refusal(r[0].b), "127.0.0.1:"), "%s", boot_refusal(r[0].b));
    cr_assert(strstr(warned, boot_refusal(r[0].b)), "%s", warned);
    close_all(r, 2);
}

Test(bootstrap, duplicate_rank_is_refused_and_the_job_still_completes, .timeout = 30)
{
    struct boot_id id;
    struct rank_run r[4]; /* rank 0, two claiming rank 1, rank 2 */
    sem_t done;
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    sem_init(&done, 0, 0);
    start(&r[0], &id, 0, 3, 10000, WORK_COLLECTIVES);
    for (int i = 1; i <= 2; i++) {
        prep(&r[i], &id, 1, 3, 10000, WORK_COLLECTIVES);
        r[i].done = &done;
        launch(&r[i]);
    }
    /* Nobody admitted can return before rank 2 arrives: the first back was refused. */
    sem_wait(&done);
    start(&r[3], &id, 2, 3, 10000, WORK_COLLECTIVES);
    finish_all(r, 4);
    int refused = r[1].st == RESHARD_ERR_REFUSED ? 1 : 2, admitted = 3 - refused;
    cr_assert_eq(r[refused].st, RESHARD_ERR_REFUSED, "%s", r[refused].msg);
    cr_assert(strstr(r[refused].msg, "duplicate rank"), "%s", r[refused].msg);
    struct rank_run ok[3] = {r[0], r[admitted], r[3]};
    assert_all_ok(ok, 3);
    close_all(ok, 3);
    sem_destroy(&done);
}

Test(bootstrap, peer_of_another_size_is_refused, .timeout = 30)
{
    struct boot_id id;
    struct rank_run r[2];
    struct boot *stray = NULL;
    listening_id(&id);
    start(&r[0], &id, 0, 2, 10000, WORK_COLLECTIVES);
    cr_assert_eq(boot_init(&id, 1, 3, 10000, &stray), RESHARD_ERR_REFUSED, "%s",
                 rs_error_message());
    cr_assert(strstr(rs_error_message(), "the job has 2 ranks, not 3"), "%s", rs_error_message());
    start(&r[1], &id, 1, 2, 10000, WORK_COLLECTIVES);
    finish_all(r, 2);
    assert_all_ok(r, 2);
    close_all(r, 2);
}

Test(bootstrap, missing_rank_is_named_by_rank_0_and_its_peers_hear_why, .timeout = 30)
{
    struct boot_id id;
    struct rank_run r[3]; /* rank 3 of 4 never comes */
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    for (int i = 0; i < 3; i++)
        start(&r[i], &id, i, 4, 1000, WORK_NONE);
    finish_all(r, 3);
    cr_assert_eq(r[0].st, RESHARD_ERR_TIMEOUT, "%s", r[0].msg);
    cr_assert(strstr(r[0].msg, "rank 3 of 4 did not arrive within 1 s"), "%s", r[0].msg);
    cr_assert(r[0].ms >= 900 && r[0].ms < 2500, "rank 0 gave up after %lld ms", (long long)r[0].ms);
    for (int i = 1; i < 3; i++) {
        /* Peers wait a little past rank 0's deadline, so they hear its verdict. */
        cr_assert_eq(r[i].st, RESHARD_ERR_REMOTE, "rank %d: %s", i, r[i].msg);
        cr_assert(strstr(r[i].msg, "rank 0 failed (RESHARD_ERR_TIMEOUT): rank 3 of 4 did not "
                                   "arrive within 1 s"),
                  "%s", r[i].msg);
        cr_assert_lt(r[i].ms, 2500, "rank %d waited %lld ms", i, (long long)r[i].ms);
        cr_assert_null(r[i].b);
    }
}

Test(bootstrap, absent_rank_0_makes_a_peer_time_out_naming_its_address, .timeout = 30)
{
    struct boot_id id;
    struct rank_run r;
    char want[32];
    int port = private_loopback_port();
    loopback_id(port, SECRET, &id);
    start(&r, &id, 1, 2, 500, WORK_NONE);
    finish(&r);
    snprintf(want, sizeof(want), "rank 0 at 127.0.0.1:%d", port);
    cr_assert_eq(r.st, RESHARD_ERR_TIMEOUT, "%s", r.msg);
    cr_assert(strstr(r.msg, want), "%s", r.msg);
    cr_assert(r.ms >= 450 && r.ms < 1500, "gave up after %lld ms", (long long)r.ms);
}

/* Three ranks join; then rank 2 does `last` while ranks 0 and 1 allgather. */
static void two_gather_while_rank_2(enum work last, int timeout_ms, struct rank_run *r)
{
    struct boot_id id;
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    for (int i = 0; i < 3; i++) {
        prep(&r[i], &id, i, 3, timeout_ms, WORK_NONE);
        r[i].bytes = 8;
        launch(&r[i]);
    }
    finish_all(r, 3);
    assert_all_ok(r, 3);
    work_all(r, 2, WORK_ALLGATHER);
    work_all(r + 2, 1, last);
    finish_all(r, 3);
}

Test(bootstrap, abort_on_one_rank_fails_the_others_fast_with_remote, .timeout = 30)
{
    struct rank_run r[3];
    two_gather_while_rank_2(WORK_ABORT, 10000, r);
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(r[i].st, RESHARD_ERR_REMOTE, "rank %d: %s", i, r[i].msg);
        cr_assert(strstr(r[i].msg, "rank 2 failed (RESHARD_ERR_BUFFER): buffer too small"), "%s",
                  r[i].msg);
        cr_assert_lt(r[i].ms, 5000, "rank %d took %lld ms to hear", i, (long long)r[i].ms);
    }
    /* Once failed, a bootstrap says so at once. */
    cr_assert_eq(boot_barrier(r[1].b), RESHARD_ERR_REMOTE);
    cr_assert(strstr(rs_error_message(), "unusable"), "%s", rs_error_message());
    close_all(r, 3);
}

Test(bootstrap, rank_that_leaves_is_named_as_a_network_failure, .timeout = 30)
{
    struct rank_run r[3];
    two_gather_while_rank_2(WORK_LEAVE, 10000, r);
    cr_assert_eq(r[0].st, RESHARD_ERR_NETWORK, "%s", r[0].msg);
    cr_assert(strstr(r[0].msg, "rank 2 (") && strstr(r[0].msg, "closed the connection"), "%s",
              r[0].msg);
    cr_assert_eq(r[1].st, RESHARD_ERR_REMOTE, "%s", r[1].msg);
    cr_assert(strstr(r[1].msg, "rank 0 failed (RESHARD_ERR_NETWORK)"), "%s", r[1].msg);
    close_all(r, 3);
}

Test(bootstrap, rank_that_stalls_in_a_collective_is_named_to_every_rank, .timeout = 30)
{
    struct rank_run r[3];
    two_gather_while_rank_2(WORK_NONE, 1000, r); /* rank 2 never calls the allgather */
    cr_assert_eq(r[0].st, RESHARD_ERR_TIMEOUT, "%s", r[0].msg);
    cr_assert(strstr(r[0].msg, "allgather #1 on rank 0: rank 2 (") &&
                  strstr(r[0].msg, ") did not answer within 1 s"),
              "%s", r[0].msg);
    cr_assert(r[0].ms >= 900 && r[0].ms < 2500, "rank 0 gave up after %lld ms", (long long)r[0].ms);
    cr_assert_eq(r[1].st, RESHARD_ERR_REMOTE, "%s", r[1].msg);
    cr_assert(strstr(r[1].msg, "rank 0 failed (RESHARD_ERR_TIMEOUT): allgather #1 on rank 0: "
                               "rank 2 ("),
              "%s", r[1].msg);
    close_all(r, 3);
}

Test(bootstrap, ranks_passing_different_sizes_are_told, .timeout = 30)
{
    struct boot_id id;
    struct rank_run r[3];
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    for (int i = 0; i < 3; i++) {
        prep(&r[i], &id, i, 3, 10000, WORK_ALLGATHER);
        r[i].bytes = i == 1 ? 8 : 16;
        launch(&r[i]);
    }
    finish_all(r, 3);
    cr_assert_eq(r[0].st, RESHARD_ERR_INVALID_ARG, "%s", r[0].msg);
    cr_assert(strstr(r[0].msg, "rank 1 (") && strstr(r[0].msg, "sent 8 bytes where 16"), "%s",
              r[0].msg);
    for (int i = 1; i < 3; i++)
        cr_assert_eq(r[i].st, RESHARD_ERR_REMOTE, "rank %d: %s", i, r[i].msg);
    close_all(r, 3);
}

/* ---- launcher environment ---- */

static void read_env(struct boot_env *e)
{
    cr_assert_eq(boot_env_read(e), RESHARD_OK, "%s", rs_error_message());
}

static void assert_env(const struct boot_env *e, int rank, int size, int lrank, int lsize,
                       const char *addr)
{
    char got[80];
    cr_assert_eq(e->rank, rank);
    cr_assert_eq(e->size, size);
    cr_assert_eq(e->local_rank, lrank);
    cr_assert_eq(e->local_size, lsize);
    cr_assert_str_eq(boot_id_addr(&e->id, got, sizeof(got)), addr);
}

static void clear_env(void)
{
    clear_launcher_env();
    clear_boot_params();
}

TestSuite(bootstrap_env, .init = clear_env);

Test(bootstrap_env, torchrun_variables_give_rank_and_master_port_plus_one)
{
    struct boot_env a, b, c;
    set_torchrun("job-a");
    read_env(&a);
    assert_env(&a, 3, 8, 1, 4, "127.0.0.1:29401");
    read_env(&b);
    set_torchrun("job-b");
    read_env(&c);
    cr_assert_eq(memcmp(&a.id, &b.id, sizeof(a.id)), 0, "one job, one id");
    cr_assert_neq(memcmp(&a.id, &c.id, sizeof(a.id)), 0, "another run, another secret");
}

Test(bootstrap_env, configured_port_and_secret_win)
{
    struct boot_env a, b;
    setenv("RESHARD_BOOT_PORT", "4242", 1);
    setenv("RESHARD_SECRET", "s3cret", 1);
    rs_param_reload();
    set_torchrun("job-a");
    read_env(&a);
    assert_env(&a, 3, 8, 1, 4, "127.0.0.1:4242");
    set_torchrun("job-b");
    read_env(&b);
    cr_assert_eq(memcmp(&a.id, &b.id, sizeof(a.id)), 0, "the configured secret is the secret");
}

Test(bootstrap_env, open_mpi_variables_are_read)
{
    struct boot_env e;
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "1234", 1);
    read_env(&e);
    assert_env(&e, 2, 4, 0, 2, "127.0.0.1:1235");
}

Test(bootstrap_env, slurm_defaults_to_the_first_host_of_the_node_list_and_port_29500)
{
    struct boot_env e;
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_STEP_TASKS_PER_NODE", "4(x2)", 1);
    setenv("SLURM_JOB_NODELIST", "10.9.9.[1-2]", 1);
    setenv("SLURM_STEP_NODELIST", "127.0.0.[1-4,7],10.0.0.9", 1);
    read_env(&e);
    assert_env(&e, 5, 8, 1, 4, "127.0.0.1:29501");
    /* Zero-padded ranges and several bracket groups: "127.0.[0-1].[01-02]" is 127.0.0.01. */
    unsetenv("SLURM_STEP_NODELIST");
    setenv("SLURM_JOB_NODELIST", "127.0.[0-1].[01-02],10.0.0.9", 1);
    setenv("SLURM_NTASKS_PER_NODE", "2", 1);
    setenv("MASTER_PORT", "5000", 1);
    read_env(&e);
    assert_env(&e, 5, 8, 1, 2, "127.0.0.1:5001");
}

Test(bootstrap_env, missing_master_addr_is_named)
{
    struct boot_env e;
    set_torchrun("job");
    unsetenv("MASTER_ADDR");
    cr_assert_eq(boot_env_read(&e), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "MASTER_ADDR is not set"), "%s", rs_error_message());
}

Test(bootstrap_env, malformed_rank_is_named)
{
    struct boot_env e;
    set_torchrun("job");
    setenv("RANK", "3x", 1);
    cr_assert_eq(boot_env_read(&e), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "RANK=3x"), "%s", rs_error_message());
    setenv("RANK", "8", 1);
    cr_assert_eq(boot_env_read(&e), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "RANK=8 is not an integer in [0, 7]"), "%s",
              rs_error_message());
}

Test(bootstrap_env, no_launcher_says_what_to_set)
{
    struct boot_env e;
    cr_assert_eq(boot_env_read(&e), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "no launcher environment"), "%s", rs_error_message());
}

/* reshard_get_unique_id, and reshard_comm_init_nccl through it: each id a secret of its own. */
Test(bootstrap, every_id_made_here_carries_a_fresh_random_secret)
{
    struct boot_id a, b;
    static const unsigned char zero[32];
    cr_assert_eq(boot_id_create(&a), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(boot_id_create(&b), RESHARD_OK, "%s", rs_error_message());
    cr_assert_neq(memcmp(a.bytes + 28, b.bytes + 28, 32), 0);
    cr_assert_neq(memcmp(a.bytes + 28, zero, 32), 0);
    boot_id_release(&a);
    boot_id_release(&b);
}

/* Rank `rank` of 2 (a forked child) whose n-th allocation fails: exit 0 when it formed and
 * gathered, 2 when it failed as out of memory, saying so, else 1. */
static void oom_rank(const struct boot_id *id, int rank, long n)
{
    struct boot *b = NULL;
    unsigned char all[2 * 8] = {0};
    rs_test_fail_alloc(n);
    reshard_status_t st = boot_init(id, rank, 2, 3000, &b);
    if (st == RESHARD_OK)
        st = boot_allgather(b, all, 8);
    rs_test_fail_alloc(0);
    boot_close(b);
    if (st == RESHARD_OK)
        _exit(0);
    _exit(st == RESHARD_ERR_NO_MEMORY && strstr(rs_error_message(), "out of memory") ? 2 : 1);
}

/* Every allocation of rank `rank` of a 2-rank job, made to fail one at a time: that rank fails
 * cleanly, and the other never hangs on it. */
static void oom_each_allocation_of(int rank)
{
    int failed = 0, other = 1 - rank;
    long n;
    char name[16];
    snprintf(name, sizeof(name), "rank %d", rank);
    for (n = 1; n < 200; n++) {
        struct boot_id id;
        struct rank_run r;
        cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0)
            oom_rank(&id, rank, n);
        prep(&r, &id, other, 2, 1500, WORK_ALLGATHER);
        r.bytes = 8;
        launch(&r);
        int ws = -1;
        cr_assert_eq(waitpid(pid, &ws, 0), pid);
        finish(&r);
        boot_id_release(&id);
        cr_assert(WIFEXITED(ws), "allocation %ld: %s crashed (%#x)", n, name, ws);
        int rc = WEXITSTATUS(ws);
        cr_assert_neq(rc, 1, "allocation %ld: %s failed otherwise", n, name);
        boot_close(r.b);
        if (rc == 0) {
            cr_assert_eq(r.st, RESHARD_OK, "%s", r.msg);
            break;
        }
        /* The other fails naming it (or was done: it failed taking the allgather's last
         * frame), within its timeout. */
        cr_assert(r.st == RESHARD_OK || strstr(r.msg, name), "allocation %ld: %s", n, r.msg);
        cr_assert_lt(r.init_ms + r.ms, 1500 + 3000 + 2000, "allocation %ld: %lld ms", n,
                     (long long)(r.init_ms + r.ms));
        failed++;
    }
    cr_assert_lt(n, 200, "%s never got through", name);
    cr_assert_geq(failed, 10, "only %d allocations were tried", failed);
    fprintf(stderr, "bootstrap: %d allocations of %s each failed cleanly\n", failed, name);
}

Test(bootstrap, out_of_memory_anywhere_in_a_joiner_fails_it_cleanly, .timeout = 120)
{
    oom_each_allocation_of(1);
}

Test(bootstrap, out_of_memory_anywhere_in_rank_0_with_a_peer_fails_it_cleanly, .timeout = 120)
{
    oom_each_allocation_of(0);
}
