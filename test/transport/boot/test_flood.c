/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A flood at the bootstrap's listeners of a 4-rank job (forked ranks, test/plugin/ranks.h):
 * 100 idle connections and 100 that send a byte a second, each opened again as soon as it is
 * dropped, at rank 0's listener (which is also the shrink's, the survivors meeting at rank 0),
 * from before the job forms until it has refit, shrunk and refit again: the job forms, refits
 * with 0 wrong and shrinks. And 70 idle connections at the shrink listener alone.
 */
#include "boot_ranks.h"
#include "base/param.h"
#include "plugin/reshard.h"
#include "test/plugin/ranks.h"
#include "test/plugin/side.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SRC     "shape=48x40 dtype=i32 ranks=0-3 mesh=2x2 place=S(0),R"
#define DST     "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(1)"
#define REP_SRC "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=R"
#define REP_DST "shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)"

static int port; /* rank 0's listener: RESHARD_BOOT_PORT, held by this process until it binds */

static void flood_env(void)
{
    char s[16];
    clear_boot_params();
    port = private_loopback_port();
    snprintf(s, sizeof(s), "%d", port);
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    setenv("RESHARD_BOOT_PORT", s, 1);
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "30", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    rs_param_reload();
}

TestSuite(flood, .init = flood_env, .timeout = 120);

/* ---- the attacker: a process of its own, killed at the end ---- */

enum { IDLE = 100, SLOW = 100 };

/* What the attacker did, in memory shared with the test: connections that a listener answered
 * (a challenge or a BUSY), those it dropped, and the bytes it sent them. */
static struct attack_counts {
    long answered, dropped, bytes;
} * counts;

static int attack_dial(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 && errno != EINPROGRESS) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* Keeps IDLE silent and SLOW byte-a-second connections open, each dialled again once it is
 * dropped (or refused: rank 0 is not listening yet); slow ones dribble a frame's magic. */
static void attack(void)
{
    static const char magic[] = "RSB1\0\0\0\1";
    int fd[IDLE + SLOW], sent[IDLE + SLOW] = {0}, heard[IDLE + SLOW] = {0};
    for (int i = 0; i < IDLE + SLOW; i++)
        fd[i] = -1;
    for (int64_t tick = now_ms();;) {
        struct pollfd p[IDLE + SLOW];
        for (int i = 0; i < IDLE + SLOW; i++) {
            if (fd[i] < 0 && (fd[i] = attack_dial()) >= 0)
                sent[i] = heard[i] = 0;
            p[i] = (struct pollfd){.fd = fd[i], .events = POLLIN};
        }
        poll(p, IDLE + SLOW, 20);
        for (int i = 0; i < IDLE + SLOW; i++) {
            char junk[256];
            ssize_t k = 0;
            if (fd[i] < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            while ((k = recv(fd[i], junk, sizeof(junk), MSG_DONTWAIT)) > 0) {
                counts->bytes += k; /* a challenge, or a BUSY answer */
                counts->answered += !heard[i];
                heard[i] = 1;
            }
            if (k == 0 || (k < 0 && errno != EAGAIN)) {
                counts->dropped += k == 0 || errno == ECONNRESET;
                close(fd[i]); /* dropped, or refused: dial again */
                fd[i] = -1;
            }
        }
        if (now_ms() - tick >= 1000) {
            tick = now_ms();
            for (int i = IDLE; i < IDLE + SLOW; i++)
                if (fd[i] >= 0 && send(fd[i], magic + sent[i] % 8, 1, MSG_NOSIGNAL) == 1)
                    sent[i]++;
        }
    }
}

static pid_t start_attack(void)
{
    counts = mmap(NULL, sizeof(*counts), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(counts, MAP_FAILED);
    memset(counts, 0, sizeof(*counts));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        attack();
        _exit(0);
    }
    usleep(200 * 1000); /* its first connections are refused and dialled again meanwhile */
    return pid;
}

static void stop_attack(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* ---- the job ---- */

static reshard_status_t refit(reshard_comm_t *c, int rank, const char *src, const char *dst)
{
    struct side x;
    reshard_status_t st = side_open(&x, c, rank, src, dst);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(x.plan, &x.b);
    if (st == RESHARD_OK && count_wrong(x.dst, rank, x.d))
        st = RESHARD_ERR_INTERNAL;
    side_close(&x);
    return st;
}

/* Refit, shrink rank 3 away (the survivors meet at rank 0's listener), refit again. Rank 3
 * leaves at once: its destroy waits in a barrier of the first communicator for the others. */
static reshard_status_t refit_shrink_refit(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    int64_t t0 = now_ms();
    reshard_status_t st = RESHARD_OK;
    for (int i = 0; i < 10 && st == RESHARD_OK; i++) /* a second or so: the backlog fills */
        st = refit(comm, rank, SRC, DST);
    int64_t t1 = now_ms();
    if (st != RESHARD_OK || rank == 3)
        return st;
    reshard_comm_t *c1 = NULL;
    int three = 3;
    if (rank != 0)
        usleep(500 * 1000); /* rank 0's door, the shrink's, serves the flood alone a while */
    st = reshard_comm_shrink(comm, &three, 1, &c1);
    int64_t t2 = now_ms();
    if (st == RESHARD_OK)
        st = refit(c1, rank, REP_SRC, REP_DST);
    fprintf(stderr, "flood: rank %d: refit %lld ms, shrink %lld ms, refit after %lld ms: %s\n",
            rank, (long long)(t1 - t0), (long long)(t2 - t1), (long long)(now_ms() - t2),
            st == RESHARD_OK ? "0 wrong" : reshard_last_error());
    if (st == RESHARD_OK)
        reshard_comm_destroy(c1);
    return st;
}

/* Rank 0 starts once the flood is at its door, the others a second later. */
static void late_peers(int rank)
{
    usleep(rank == 0 ? 300 * 1000 : 1300 * 1000);
}

Test(flood, a_job_forms_refits_and_shrinks_under_a_flood_of_idle_and_slow_connections)
{
    pid_t attacker = start_attack();
    rank_setup = late_peers;
    int64_t t0 = now_ms();
    struct outcome *o = run_ranks(4, refit_shrink_refit);
    int64_t took = now_ms() - t0;
    stop_attack(attacker);
    rank_setup = NULL;
    fprintf(stderr,
            "flood: the whole job took %lld ms; the attacker's connections: %ld answered, %ld "
            "dropped\n",
            (long long)took, counts->answered, counts->dropped);
    all_ok(o, 4);
    /* The flood was real: the door answered twice as many connections as it has places. */
    cr_assert_gt(counts->answered, 128, "only %ld attacking connections were answered",
                 counts->answered);
}

/* Rank 0 opens 70 idle connections to its own listener, the shrink's, before the shrink. */
static reshard_status_t crowd_then_shrink(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    enum { CROWD = 70 };
    int fd[CROWD];
    if (rank == 3)
        return RESHARD_OK;
    for (int i = 0; rank == 0 && i < CROWD; i++)
        fd[i] = attack_dial();
    reshard_status_t st = reshard_comm_barrier(comm); /* the crowd is there before anyone shrinks */
    reshard_comm_t *c1 = NULL;
    int three = 3;
    int64_t t0 = now_ms();
    if (st == RESHARD_OK)
        st = reshard_comm_shrink(comm, &three, 1, &c1);
    fprintf(stderr, "flood: rank %d: shrink past %d idle connections: %lld ms\n", rank, CROWD,
            (long long)(now_ms() - t0));
    if (st == RESHARD_OK)
        st = refit(c1, rank, REP_SRC, REP_DST);
    if (st == RESHARD_OK)
        reshard_comm_destroy(c1);
    for (int i = 0; rank == 0 && i < CROWD; i++)
        if (fd[i] >= 0)
            close(fd[i]);
    return st;
}

Test(flood, seventy_idle_connections_at_the_shrink_listener_do_not_stop_the_shrink)
{
    all_ok(run_ranks(4, crowd_then_shrink), 4);
}
