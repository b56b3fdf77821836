/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Local peers are verified, not believed (plugin/comm/comm_local.c), attack by attack.
 *
 * The harness runs forked ranks of one domain through comm_local_open and comm_local_verify,
 * their hellos passed through shared memory where the bootstrap would carry them, so that a
 * rank can lie in its hello, hide in another namespace, keep silent, or be squatted and
 * flooded by a process that is no rank. Then whole communicators through the public API: a
 * rank's lie must leave its victim untouched, and no join may open ptrace to every process.
 */
#include "ranks.h"
#include "side.h"
#include "base/error.h"
#include "plugin/comm/comm.h"
#include "plugin/comm/comm_int.h"
#include "plugin/comm/comm_local.h"
#include "plugin/reshard.h"
#include "transport/boot/bootstrap.h"
#include "transport/cma.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define NR        4
#define MAX_CALLS 8

/* What each harness rank plays. */
enum role {
    HONEST,
    LIAR,        /* announces the victim's pid */
    REMOTE,      /* claims the domain from another host: no socket here, never connects */
    SILENT,      /* opens its socket, never answers */
    WRONG_TOKEN, /* its hello carries another token than the one it proves with */
    OTHER_NETNS, /* moves to a network namespace of its own after opening its socket */
    OTHER_PIDNS, /* runs in a PID namespace of its own (its outer pid announced) */
    OTHER_USER,  /* listens where a peer looks for it, as another user */
    SQUATTED,    /* another process took its socket name first */
};

struct slot {
    struct comm_local_hello hello;
    pid_t outer_pid; /* OTHER_PIDNS: its pid as the others see it */
    pid_t forked;    /* the process run_harness forked for it */
    atomic_int hold; /* it waits before opening while this is set */
    pid_t pid[NR];   /* c->pid after verify */
    unsigned char verdict[NR];
    int status, finished;
    int ncalls; /* PR_SET_PTRACER calls recorded (with a fake Yama) */
    pid_t calls[MAX_CALLS];
};

struct table {
    atomic_int opened, finished;
    int n, fake_scope; /* -2: the kernel's */
    int gate;          /* the ranks verify only once this many floods have reached them */
    int late;          /* this rank verifies only once the others are done (-1: none) */
    atomic_int floods;
    pid_t victim;
    struct boot_id spare[NR];
    struct slot s[NR];
    atomic_int stray_got; /* bytes a squatter or flooder received */
    atomic_int stray_sent;
};

static struct table *t;
static int me; /* this harness rank */

static void harness_env(void)
{
    setenv("RESHARD_TIMEOUT", "2", 1);
}

static struct table *new_table(int n)
{
    struct table *x =
        mmap(NULL, sizeof(*x), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(x, MAP_FAILED);
    memset(x, 0, sizeof(*x));
    x->n = n;
    x->fake_scope = -2;
    x->late = -1;
    for (int r = 0; r < n; r++)
        cr_assert_eq(boot_id_from_addr("127.0.0.1", 1 + r, "local-peers-test", &x->spare[r]),
                     RESHARD_OK);
    return x;
}

static int record_ptracer(pid_t pid)
{
    struct slot *s = &t->s[me];
    if (s->ncalls < MAX_CALLS)
        s->calls[s->ncalls] = pid;
    s->ncalls++;
    return 0;
}

static void wait_all_opened(void)
{
    atomic_fetch_add(&t->opened, 1);
    while (atomic_load(&t->opened) < t->n || atomic_load(&t->floods) < t->gate)
        usleep(1000);
}

/* The name peers of user uid look for rank r's socket at. */
static void name_of(int r, uid_t uid, pid_t pid, char *buf, size_t n)
{
    comm_local_name(buf, n, uid, pid, &t->spare[r]);
}

/* One harness rank: open, wait for every rank's hello, verify, report. */
static void harness_rank(int r, enum role role)
{
    me = r;
    struct slot *s = &t->s[r];
    while (atomic_load(&s->hold))
        usleep(1000);
    struct reshard_comm *c = comm_alloc(r, t->n, -1);
    if (!c || topo_create(t->n, t->n, NULL, &c->topo.t) != RESHARD_OK)
        _exit(10);
    c->spare = t->spare[r];
    for (int q = 0; q < t->n; q++)
        c->spares[q] = t->spare[q];
    if (t->fake_scope != -2)
        cma_test_yama(t->fake_scope, record_ptracer);
    if (role == REMOTE || role == OTHER_USER) {
        /* What a rank elsewhere would announce: a pid and a token, and no socket here. */
        s->hello.pid = getpid();
        if (getrandom(s->hello.token, sizeof(s->hello.token), 0) != sizeof(s->hello.token))
            _exit(11);
        int lfd = -1;
        if (role == OTHER_USER) { /* at the name a root peer looks at, bound as nobody */
            char name[CMA_NAME_MAX + 1];
            name_of(r, geteuid(), getpid(), name, sizeof(name));
            if (setresuid(65534, 65534, 65534) != 0 || cma_listen(name, &lfd) != RESHARD_OK)
                _exit(12);
        }
        wait_all_opened();
        while (atomic_load(&t->finished) < t->n - 1)
            usleep(1000);
        _exit(0);
    }
    if (role == LIAR)
        comm_local_test_announce_pid(t->victim);
    if (role == OTHER_PIDNS) {
        while (!s->outer_pid)
            usleep(1000);
        comm_local_test_announce_pid(s->outer_pid);
    }
    if (comm_local_open(c, &s->hello) != RESHARD_OK)
        _exit(13);
    if (role == WRONG_TOKEN)
        s->hello.token[0] ^= 1;
    if (role == OTHER_NETNS && unshare(CLONE_NEWNET) != 0)
        _exit(14);
    wait_all_opened();
    if (role == SILENT) {
        while (atomic_load(&t->finished) < t->n - 1)
            usleep(1000);
        _exit(0);
    }
    while (r == t->late && atomic_load(&t->finished) < t->n - 1)
        usleep(1000);
    s->status = comm_local_verify(c, &t->s[0].hello, sizeof(t->s[0]));
    for (int q = 0; q < t->n; q++) {
        s->pid[q] = c->pid[q];
        s->verdict[q] = (unsigned char)comm_local_verdict(c, q);
    }
    comm_destroy(c); /* dismisses the writers it let in */
    s->finished = 1;
    atomic_fetch_add(&t->finished, 1);
    _exit(0);
}

/* Runs ranks 0..n-1 playing role[r]; returns when every one has exited. */
static void run_harness(int n, const enum role *role)
{
    pid_t pid[NR];
    for (int r = 0; r < n; r++) {
        cr_assert_geq(pid[r] = fork(), 0);
        if (pid[r] > 0) {
            t->s[r].forked = pid[r];
            continue;
        }
        if (role[r] != OTHER_PIDNS)
            harness_rank(r, role[r]);
        /* A launcher: the rank runs as pid 1 of a PID namespace of its own. */
        if (unshare(CLONE_NEWPID) != 0)
            _exit(20);
        pid_t k = fork();
        if (k == 0)
            harness_rank(r, role[r]);
        t->s[r].outer_pid = k;
        int ws;
        waitpid(k, &ws, 0);
        _exit(WIFEXITED(ws) ? WEXITSTATUS(ws) : 21);
    }
    for (int r = 0; r < n; r++) {
        int ws;
        cr_assert_eq(waitpid(pid[r], &ws, 0), pid[r]);
        cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "harness rank %d ended with %d/%d", r,
                  WIFEXITED(ws) ? WEXITSTATUS(ws) : -1, WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
    }
}

/* Rank r's verdict on q, with a message naming both. */
static void expect_verdict(int r, int q, enum comm_local_verdict v)
{
    enum comm_local_verdict got = (enum comm_local_verdict)t->s[r].verdict[q];
    cr_assert_eq(got, v, "rank %d on rank %d: %s, expected %s", r, q, comm_local_verdict_name(got),
                 comm_local_verdict_name(v));
    if (v == COMM_LOCAL_WRITABLE)
        cr_assert_eq(t->s[r].pid[q], t->s[q].hello.pid, "rank %d holds rank %d's pid", r, q);
    else
        cr_assert_eq(t->s[r].pid[q], 0, "rank %d may not write rank %d", r, q);
}

static void expect_finished(int r)
{
    cr_assert_eq(t->s[r].finished, 1, "rank %d did not finish", r);
    cr_assert_eq(t->s[r].status, RESHARD_OK, "rank %d: %s", r,
                 rs_status_name((reshard_status_t)t->s[r].status));
}

TestSuite(local_peers, .init = harness_env, .timeout = 60);

Test(local_peers, ranks_of_one_host_verify_each_other_and_may_write_each_other)
{
    t = new_table(NR);
    enum role role[NR] = {HONEST, HONEST, HONEST, HONEST};
    run_harness(NR, role);
    for (int r = 0; r < NR; r++) {
        expect_finished(r);
        cr_assert_eq(t->s[r].pid[r], t->s[r].hello.pid, "its own pid");
        for (int q = 0; q < NR; q++)
            if (q != r)
                expect_verdict(r, q, COMM_LOCAL_WRITABLE);
    }
}

/* The attack of issue 19, row 3: before, every peer stored the announced pid and wrote into
 * it. Now the victim's pid is nobody's: no peer ever takes the liar for writable. */
Test(local_peers, a_rank_announcing_another_process_pid_is_never_written)
{
    t = new_table(3);
    pid_t victim = fork(); /* not into t: the child's copy of the result is 0 */
    cr_assert_geq(victim, 0);
    if (victim == 0) {
        pause();
        _exit(0);
    }
    t->victim = victim;
    enum role role[3] = {HONEST, LIAR, HONEST};
    run_harness(3, role);
    kill(t->victim, SIGKILL);
    waitpid(t->victim, NULL, 0);
    for (int r = 0; r < 3; r++)
        expect_finished(r);
    expect_verdict(0, 1, COMM_LOCAL_IMPOSTOR);
    expect_verdict(2, 1, COMM_LOCAL_IMPOSTOR);
    expect_verdict(0, 2, COMM_LOCAL_WRITABLE);
    expect_verdict(2, 0, COMM_LOCAL_WRITABLE);
    /* The liar's own connections are dropped by the honest ranks (which wait for it, since
     * it holds its name as this user here): nothing lets it write. */
    expect_verdict(1, 0, COMM_LOCAL_CLOSED);
    expect_verdict(1, 2, COMM_LOCAL_CLOSED);
    cr_assert_eq(t->s[1].hello.pid, t->victim, "the liar did announce the victim");
}

/* A rank elsewhere that claims this host (its domain, its hostname) has no socket here: the
 * others see it at once, without waiting (a wait would run into RESHARD_TIMEOUT = 120 s,
 * past the test's timeout). */
Test(local_peers, a_rank_claiming_this_host_from_elsewhere_is_not_here_and_costs_no_wait,
     .timeout = 60)
{
    setenv("RESHARD_TIMEOUT", "120", 1);
    t = new_table(3);
    enum role role[3] = {HONEST, REMOTE, HONEST};
    run_harness(3, role);
    for (int r = 0; r < 3; r += 2) {
        expect_finished(r);
        expect_verdict(r, 1, COMM_LOCAL_NOT_HERE);
        expect_verdict(r, 2 - r, COMM_LOCAL_WRITABLE);
    }
}

Test(local_peers, a_peer_in_another_network_namespace_is_not_verified)
{
    if (geteuid() != 0)
        cr_skip_test("unshare(CLONE_NEWNET) needs CAP_SYS_ADMIN: run as root");
    t = new_table(3);
    t->late = 1; /* it finds nobody and would be gone before they look */
    enum role role[3] = {HONEST, OTHER_NETNS, HONEST};
    run_harness(3, role);
    for (int r = 0; r < 3; r++)
        expect_finished(r);
    /* Its socket stayed in this namespace, so the check that tells is the kernel's record of
     * where the process runs. */
    expect_verdict(0, 1, COMM_LOCAL_OTHER_NS);
    expect_verdict(2, 1, COMM_LOCAL_OTHER_NS);
    /* From there, the others' names do not exist. */
    expect_verdict(1, 0, COMM_LOCAL_NOT_HERE);
    expect_verdict(1, 2, COMM_LOCAL_NOT_HERE);
    expect_verdict(0, 2, COMM_LOCAL_WRITABLE);
}

Test(local_peers, a_peer_in_another_pid_namespace_is_not_verified)
{
    if (geteuid() != 0)
        cr_skip_test("unshare(CLONE_NEWPID) needs CAP_SYS_ADMIN: run as root");
    t = new_table(3);
    enum role role[3] = {HONEST, OTHER_PIDNS, HONEST};
    run_harness(3, role);
    for (int r = 0; r < 3; r++)
        expect_finished(r);
    expect_verdict(0, 1, COMM_LOCAL_OTHER_NS);
    expect_verdict(2, 1, COMM_LOCAL_OTHER_NS);
    /* From inside, the others' pids are not visible at all: the kernel shows 0. */
    expect_verdict(1, 0, COMM_LOCAL_OTHER_NS);
    expect_verdict(1, 2, COMM_LOCAL_OTHER_NS);
    expect_verdict(0, 2, COMM_LOCAL_WRITABLE);
}

Test(local_peers, a_peer_listening_as_another_user_is_not_verified)
{
    if (geteuid() != 0)
        cr_skip_test("playing another user needs setresuid: run as root");
    t = new_table(3);
    enum role role[3] = {HONEST, OTHER_USER, HONEST};
    run_harness(3, role);
    for (int r = 0; r < 3; r += 2) {
        expect_finished(r);
        expect_verdict(r, 1, COMM_LOCAL_OTHER_USER);
        expect_verdict(r, 2 - r, COMM_LOCAL_WRITABLE);
    }
}

Test(local_peers, a_peer_proving_with_another_token_than_its_hellos_is_refused)
{
    t = new_table(3);
    enum role role[3] = {HONEST, WRONG_TOKEN, HONEST};
    run_harness(3, role);
    for (int r = 0; r < 3; r++)
        expect_finished(r);
    expect_verdict(0, 1, COMM_LOCAL_BAD_PROOF);
    expect_verdict(2, 1, COMM_LOCAL_BAD_PROOF);
    expect_verdict(1, 0, COMM_LOCAL_CLOSED);
    expect_verdict(0, 2, COMM_LOCAL_WRITABLE);
}

/* A peer that listens and never answers ends in a verdict at RESHARD_TIMEOUT (2 s), not in
 * a hang; the others are not held up beyond it. */
Test(local_peers, a_silent_local_peer_ends_in_a_clear_verdict_not_a_hang)
{
    t = new_table(3);
    enum role role[3] = {HONEST, SILENT, HONEST};
    run_harness(3, role);
    for (int r = 0; r < 3; r += 2) {
        expect_finished(r);
        expect_verdict(r, 1, COMM_LOCAL_SILENT);
        expect_verdict(r, 2 - r, COMM_LOCAL_WRITABLE);
    }
}

/* A process that is no rank binds rank 1's name before it does: rank 1 cannot listen, its
 * peers see the squatter's credentials and send it nothing. */
Test(local_peers, a_process_squatting_a_rank_socket_name_learns_nothing)
{
    t = new_table(3);
    atomic_store(&t->s[1].hold, 1);
    pid_t squatter = fork();
    cr_assert_geq(squatter, 0);
    if (squatter == 0) {
        while (!t->s[1].forked)
            usleep(1000);
        char name[CMA_NAME_MAX + 1];
        name_of(1, geteuid(), t->s[1].forked, name, sizeof(name));
        int lfd = -1;
        if (cma_listen(name, &lfd) != RESHARD_OK)
            _exit(1);
        atomic_store(&t->s[1].hold, 0); /* now rank 1 may try */
        for (int last = 0; !last;) {
            last = atomic_load(&t->finished) == 3; /* then one more pass drains the queue */
            int fd = -1;
            while (cma_accept(lfd, &fd) == RESHARD_OK && fd >= 0) {
                char buf[256];
                long got = -1;
                usleep(20000); /* whatever a peer would send has arrived */
                if (cma_recv(fd, buf, sizeof(buf), &got) == RESHARD_OK && got > 0)
                    atomic_fetch_add(&t->stray_got, (int)got);
                atomic_fetch_add(&t->stray_sent, 1); /* connections it saw */
                close(fd);
            }
            usleep(1000);
        }
        _exit(0);
    }
    enum role role[3] = {HONEST, HONEST, HONEST};
    run_harness(3, role);
    int ws;
    cr_assert_eq(waitpid(squatter, &ws, 0), squatter);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the squatter could not take the name");
    for (int r = 0; r < 3; r++)
        expect_finished(r);
    expect_verdict(0, 1, COMM_LOCAL_IMPOSTOR);
    expect_verdict(2, 1, COMM_LOCAL_IMPOSTOR);
    /* Rank 1 still verified the others (they answered its own connections). */
    expect_verdict(1, 0, COMM_LOCAL_WRITABLE);
    expect_verdict(0, 2, COMM_LOCAL_WRITABLE);
    cr_assert_eq(atomic_load(&t->stray_sent), 2, "connections the squatter saw: the two peers'");
    cr_assert_eq(atomic_load(&t->stray_got), 0, "the squatter received %d bytes",
                 atomic_load(&t->stray_got));
}

/* Processes that are no rank connect to every rank's socket again and again, sending a
 * proof-shaped message, one as this user and one as another: dropped on sight, they learn
 * nothing and the ranks still verify each other. */
static void flood(uid_t uid)
{
    if (uid != geteuid() && setresuid(uid, uid, uid) != 0)
        _exit(1);
    char name[NR][CMA_NAME_MAX + 1];
    while (atomic_load(&t->opened) < t->n)
        usleep(100);
    for (int r = 0; r < t->n; r++)
        name_of(r, 0, t->s[r].hello.pid, name[r], sizeof(name[r]));
    unsigned char msg[128] = {'R', 'S', 'L', '1', 1};
    for (int round = 0; atomic_load(&t->finished) < t->n; round++) {
        if (round == 1) /* it has reached every rank once: they may verify now */
            atomic_fetch_add(&t->floods, 1);
        for (int r = 0; r < t->n; r++) {
            int fd = -1;
            if (cma_connect(name[r], &fd) != RESHARD_OK)
                continue;
            memcpy(msg + 16, t->s[r].hello.token, 16); /* even a right token: wrong process */
            if (cma_send(fd, msg, sizeof(msg)) == RESHARD_OK)
                atomic_fetch_add(&t->stray_sent, 1);
            char buf[256];
            long got = -1;
            if (cma_recv(fd, buf, sizeof(buf), &got) == RESHARD_OK && got > 0)
                atomic_fetch_add(&t->stray_got, (int)got);
            close(fd);
        }
    }
    _exit(0);
}

Test(local_peers, connections_from_processes_that_are_no_rank_are_dropped_and_learn_nothing)
{
    if (geteuid() != 0)
        cr_skip_test("the harness names sockets for uid 0: run as root");
    t = new_table(NR);
    t->gate = 2;
    pid_t f[2];
    for (int i = 0; i < 2; i++) {
        cr_assert_geq(f[i] = fork(), 0);
        if (f[i] == 0)
            flood(i == 0 ? geteuid() : 65534);
    }
    enum role role[NR] = {HONEST, HONEST, HONEST, HONEST};
    run_harness(NR, role);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(waitpid(f[i], NULL, 0), f[i]);
    for (int r = 0; r < NR; r++) {
        expect_finished(r);
        for (int q = 0; q < NR; q++)
            if (q != r)
                expect_verdict(r, q, COMM_LOCAL_WRITABLE);
    }
    cr_assert_gt(atomic_load(&t->stray_sent), 0, "the flood reached no socket");
    cr_assert_eq(atomic_load(&t->stray_got), 0, "the flood received %d bytes",
                 atomic_load(&t->stray_got));
}

/* Out of memory at each allocation of open and verify in turn: a clean status every time,
 * never a crash, until no allocation fails and the rank verifies its peer (one that is not
 * here, so that nothing waits). */
Test(local_peers, out_of_memory_at_any_allocation_of_open_or_verify_fails_cleanly)
{
    t = new_table(2);
    int k = 1;
    for (;; k++) {
        cr_assert_lt(k, 64, "an allocation failed at every try");
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            struct reshard_comm *c = comm_alloc(0, 2, -1);
            if (!c || topo_create(2, 2, NULL, &c->topo.t) != RESHARD_OK)
                _exit(10);
            c->spare = c->spares[0] = t->spare[0];
            c->spares[1] = t->spare[1];
            t->s[1].hello.pid = 1; /* init: it listens on no name of ours */
            rs_test_fail_alloc(k);
            reshard_status_t st = comm_local_open(c, &t->s[0].hello);
            if (st == RESHARD_OK)
                st = comm_local_verify(c, &t->s[0].hello, sizeof(t->s[0]));
            rs_test_fail_alloc(0);
            int pid1 = c->pid[1], verdict = comm_local_verdict(c, 1);
            comm_destroy(c);
            if (st == RESHARD_OK)
                _exit(pid1 == 0 && verdict == COMM_LOCAL_NOT_HERE ? 0 : 3);
            _exit(st == RESHARD_ERR_NO_MEMORY ? 1 : 2);
        }
        int ws;
        cr_assert_eq(waitpid(pid, &ws, 0), pid);
        cr_assert(WIFEXITED(ws), "allocation %d: the rank crashed", k);
        if (WEXITSTATUS(ws) == 0)
            break;
        cr_assert_eq(WEXITSTATUS(ws), 1, "allocation %d: exit %d", k, WEXITSTATUS(ws));
    }
    cr_assert_gt(k, 6, "only %d allocations were tried", k - 1);
}

/* ---- Yama ---- */

/* Under ptrace_scope 1 each rank declares first the one writer it met, then the parent all
 * its writers share (the test process, their launcher), and resets when it is destroyed;
 * PR_SET_PTRACER_ANY never. */
Test(local_peers, under_ptrace_scope_1_the_writers_common_launcher_is_declared_then_reset)
{
    t = new_table(3);
    t->fake_scope = 1;
    enum role role[3] = {HONEST, HONEST, HONEST};
    run_harness(3, role);
    for (int r = 0; r < 3; r++) {
        struct slot *s = &t->s[r];
        expect_finished(r);
        for (int q = 0; q < 3; q++)
            if (q != r)
                expect_verdict(r, q, COMM_LOCAL_WRITABLE);
        cr_assert_eq(s->ncalls, 3, "rank %d: %d PR_SET_PTRACER calls", r, s->ncalls);
        cr_assert(s->calls[0] == t->s[(r + 1) % 3].hello.pid ||
                      s->calls[0] == t->s[(r + 2) % 3].hello.pid,
                  "rank %d: first the one writer (%d)", r, (int)s->calls[0]);
        cr_assert_eq(s->calls[1], getpid(), "rank %d: then the launcher", r);
        cr_assert_eq(s->calls[2], 0, "rank %d: reset on destroy", r);
    }
}

Test(local_peers, under_ptrace_scope_2_verified_peers_are_still_not_writable)
{
    t = new_table(3);
    t->fake_scope = 2;
    enum role role[3] = {HONEST, HONEST, HONEST};
    run_harness(3, role);
    for (int r = 0; r < 3; r++) {
        expect_finished(r);
        for (int q = 0; q < 3; q++)
            if (q != r)
                expect_verdict(r, q, COMM_LOCAL_REFUSED);
        cr_assert_eq(t->s[r].ncalls, 0, "rank %d declared a ptracer", r);
    }
}

/* ---- whole communicators ---- */

/* Rows by rank, columns by rank, two domains of two: rank 0 writes a piece of rank 1's shard
 * by cross-memory attach, and rank 1 one of rank 0's (besides the network pieces). */
#define SRC      "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(0)"
#define DST      "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(1)"
#define REGION   (1 << 16)
#define SENTINEL 0xA5

static void comm_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "5", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

struct e2e {
    int victim_changed; /* bytes of the victim's copy that changed; -1 until it looked */
    uint64_t local_out[MAX_RANKS];
    int wrong[MAX_RANKS];
};

static struct e2e *e;
static unsigned char *region; /* rank 1's destination, mapped before its victim is forked */
static pid_t victim;
static int victim_go = -1;

/* Rank 1 maps its destination, then forks a victim that shares the layout (so every write
 * meant for rank 1 would land in the victim's copy at the same address), and announces it. */
static void liar_setup(int rank)
{
    if (rank != 1)
        return;
    region = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED)
        _exit(30);
    memset(region, SENTINEL, REGION);
    int fd[2];
    if (pipe(fd) != 0)
        _exit(31);
    if ((victim = fork()) == 0) {
        char b;
        close(fd[1]);
        if (read(fd[0], &b, 1) != 1)
            _exit(32);
        int changed = 0;
        for (int i = 0; i < REGION; i++)
            changed += region[i] != SENTINEL;
        e->victim_changed = changed;
        _exit(0);
    }
    close(fd[0]);
    victim_go = fd[1];
    comm_local_test_announce_pid(victim);
}

/* One refit; rank 1's destination is its pre-mapped region. */
static reshard_status_t refit(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    reshard_layout_t *src = parse(SRC), *dst = parse(DST);
    reshard_tensor_t tensor = {"w", src, dst};
    reshard_buffers_t b = {0};
    reshard_layout_shard_bytes(src, rank, &b.src_bytes);
    reshard_layout_shard_bytes(dst, rank, &b.dst_bytes);
    int32_t *s = calloc(1, (size_t)b.src_bytes + 1);
    int32_t *d = rank == 1 && region ? (int32_t *)region : calloc(1, (size_t)b.dst_bytes + 1);
    fill(src, rank, s);
    memset(d, 0, (size_t)b.dst_bytes);
    b.src = s;
    b.dst = d;
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &tensor, 1, NULL, &plan);
    if (st == RESHARD_OK)
        st = reshard_plan_execute(plan, &b);
    char msg[256]; /* before the calls below reset it */
    snprintf(msg, sizeof(msg), "%s", reshard_last_error());
    if (st == RESHARD_OK)
        e->wrong[rank] = count_wrong(dst, rank, d);
    reshard_comm_counters_t k;
    if (reshard_comm_counters(comm, &k) == RESHARD_OK)
        e->local_out[rank] = k.local_out;
    reshard_plan_destroy(plan);
    if (rank == 1 && victim_go >= 0) { /* the victim looks at its copy now */
        char go = 1;
        if (write(victim_go, &go, 1) != 1 || waitpid(victim, NULL, 0) != victim)
            e->victim_changed = -2;
    }
    if (d != (int32_t *)region)
        free(d);
    free(s);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    if (st != RESHARD_OK) /* the message of the failure, not of a later call */
        rs_error(st, "%s", msg);
    return st;
}

static struct e2e *new_e2e(void)
{
    struct e2e *x =
        mmap(NULL, sizeof(*x), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(x, MAP_FAILED);
    memset(x, 0, sizeof(*x));
    x->victim_changed = -1;
    return x;
}

TestSuite(local_refit, .init = comm_env, .timeout = 60);

/* Issue 19, row 3, end to end: rank 1 announces its victim's pid; before, rank 0 wrote rank
 * 1's share into the victim and every rank reported success. Now the victim is untouched, and
 * the refit lands right or fails cleanly, naming the rank it could not write. */
Test(local_refit, a_rank_announcing_a_victim_pid_leaves_the_victim_untouched)
{
    e = new_e2e();
    rank_setup = liar_setup;
    struct outcome *o = run_ranks(4, refit);
    rank_setup = NULL;
    cr_assert_eq(e->victim_changed, 0, "%d bytes of the victim changed", e->victim_changed);
    for (int r = 0; r < 4; r++) {
        if (o[r].status == RESHARD_OK)
            cr_assert_eq(e->wrong[r], 0, "rank %d: %d wrong elements", r, e->wrong[r]);
        else
            cr_assert_neq(o[r].msg[0], 0, "rank %d failed without a message", r);
    }
    if (o[0].status != RESHARD_OK)
        cr_assert(strstr(o[0].msg, "rank 1"), "rank 0: %s", o[0].msg);
    cr_assert_eq(e->local_out[0], 0, "rank 0 wrote rank 1 by cross-memory attach");
}

/* Issue 19, row 10: a join used to declare PR_SET_PTRACER_ANY, letting any process of the
 * user ptrace the rank. A seccomp filter kills any rank that asks for it; every rank refits
 * right, and the verified local peers still write each other. */
static void forbid_ptracer_any(int rank)
{
    (void)rank;
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
#if defined(__x86_64__)
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 8),
#elif defined(__aarch64__)
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_AARCH64, 0, 8),
#else
#error "add this architecture's AUDIT_ARCH"
#endif
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_prctl, 0, 6),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PR_SET_PTRACER, 0, 4),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffffu, 0, 2), /* both halves of -1 */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffffu, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
    };
    struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1UL, 0UL, 0UL, 0UL) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0UL, 0UL) != 0)
        _exit(40);
}

Test(local_refit, pr_set_ptracer_any_is_never_set_and_verified_peers_still_write_locally)
{
    e = new_e2e();
    rank_setup = forbid_ptracer_any;
    struct outcome *o = run_ranks(4, refit); /* asserts that no rank was killed */
    rank_setup = NULL;
    all_ok(o, 4);
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(e->wrong[r], 0, "rank %d: %d wrong elements", r, e->wrong[r]);
        /* the write the liar of the test above must not receive, among them */
        cr_assert_gt(e->local_out[r], 0, "rank %d wrote no local peer by cross-memory attach", r);
    }
}
