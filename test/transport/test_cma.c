/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Cross-memory writes (transport/cma.c) between forked processes. A forked child has the
 * parent's address space layout, so the parent knows where the child's copy of `target` is:
 * the parent writes into it, then the child checks what landed and says so in its exit code.
 * Then the kernel's side of the local path: who is at the other end of a local socket, and
 * which processes the ptrace rules let write this one (Yama's declarations recorded).
 */
#include "base/error.h"
#include "transport/cma.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define TARGET_BYTES (1 << 20)

static unsigned char target[TARGET_BYTES];
static unsigned char source[TARGET_BYTES];

static unsigned char pattern(size_t i)
{
    return (unsigned char)(i * 7 + 3);
}

struct child {
    pid_t pid;
    int go; /* write end: a byte tells the child to check */
};

/* Forks a child that waits for the go byte, then exits 0 when check() finds target right. */
static struct child start_child(int (*check)(void))
{
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fd[1]);
        char b;
        _exit(read(fd[0], &b, 1) == 1 ? check() : 3);
    }
    close(fd[0]);
    return (struct child){pid, fd[1]};
}

/* Tells the child to check and returns its exit code. */
static int finish_child(struct child c)
{
    char b = 1;
    cr_assert_eq(write(c.go, &b, 1), 1);
    close(c.go);
    int ws;
    cr_assert_eq(waitpid(c.pid, &ws, 0), c.pid);
    cr_assert(WIFEXITED(ws), "the child died");
    return WEXITSTATUS(ws);
}

static int check_whole(void)
{
    for (size_t i = 0; i < TARGET_BYTES; i++)
        if (target[i] != pattern(i))
            return 1;
    return 0;
}

Test(cma, a_write_lands_in_the_other_process, .timeout = 10)
{
    for (size_t i = 0; i < TARGET_BYTES; i++)
        source[i] = pattern(i);
    struct child c = start_child(check_whole);
    struct iovec l = {source, TARGET_BYTES}, r = {target, TARGET_BYTES};
    cr_assert_eq(cma_write(c.pid, -1, 1, &l, &r, 1), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(finish_child(c), 0, "the child's copy holds what was written");
    cr_assert_eq(target[5], 0, "the writer's own copy is untouched");
}

/* 3000 pieces, more than one call takes (1024), with empty ones between and at the end:
 * piece k is written to an offset of its own, reversed in order. */
#define PIECES 3000

static size_t piece_len(size_t k)
{
    return k % 5 == 0 ? 0 : 1 + k % 97;
}

static int check_pieces(void)
{
    size_t at = 0;
    for (size_t k = 0; k < PIECES; k++) {
        size_t off = TARGET_BYTES - 256 * (k + 1);
        for (size_t j = 0; j < piece_len(k); j++)
            if (target[off + j] != pattern(at + j))
                return 1;
        at += piece_len(k);
        if (target[off + piece_len(k)] != 0)
            return 2; /* nothing past the piece */
    }
    return 0;
}

Test(cma, a_scatter_list_longer_than_one_call_lands_piece_by_piece, .timeout = 10)
{
    static struct iovec l[PIECES + 2], r[PIECES + 2];
    for (size_t i = 0; i < TARGET_BYTES; i++)
        source[i] = pattern(i);
    size_t at = 0;
    for (size_t k = 0; k < PIECES; k++) {
        l[k] = (struct iovec){source + at, piece_len(k)};
        r[k] = (struct iovec){target + TARGET_BYTES - 256 * (k + 1), piece_len(k)};
        at += piece_len(k);
    }
    l[PIECES] = r[PIECES] = (struct iovec){NULL, 0};
    l[PIECES + 1] = r[PIECES + 1] = (struct iovec){NULL, 0};
    struct child c = start_child(check_pieces);
    cr_assert_eq(cma_write(c.pid, -1, 1, l, r, PIECES + 2), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(finish_child(c), 0);
}

/* The kernel's own rules: a child admitted by its parent writes into it (where Yama's
 * ptrace_scope 1 lets only ancestors and declared processes in, the admission declares it). */
Test(cma, a_writer_admitted_by_the_kernel_rules_writes_into_its_parent, .timeout = 10)
{
    cma_test_yama(-2, NULL);
    int scope = cma_ptrace_scope();
    if (scope >= 2)
        cr_skip_test("kernel.yama.ptrace_scope is %d here: no process may be admitted", scope);
    int go[2];
    cr_assert_eq(pipe(go), 0);
    pid_t parent = getpid(), pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        static const char msg[] = "from the child";
        char b;
        close(go[1]);
        struct iovec l = {(void *)msg, sizeof(msg)}, r = {target, sizeof(msg)};
        _exit(read(go[0], &b, 1) == 1 && cma_write(parent, -1, 0, &l, &r, 1) == RESHARD_OK ? 0 : 1);
    }
    close(go[0]);
    int allowed = 0;
    char why[256];
    cr_assert_eq(cma_admit(pid, &allowed, why, sizeof(why)), RESHARD_OK);
    cr_assert_eq(allowed, 1, "%s", why);
    char b = 1;
    cr_assert_eq(write(go[1], &b, 1), 1);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cma_dismiss(pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the child's write failed");
    cr_assert_str_eq((const char *)target, "from the child");
}

static int check_nothing(void)
{
    return 0;
}

static int check_nothing_written(void)
{
    for (size_t i = 0; i < TARGET_BYTES; i++)
        if (target[i])
            return 1;
    return 0;
}

Test(cma, a_bad_address_fails_with_a_clear_status, .timeout = 10)
{
    struct child c = start_child(check_nothing);
    char buf[64] = "x";
    struct iovec l = {buf, sizeof(buf)}, r = {(void *)8, sizeof(buf)}; /* never mapped */
    cr_assert_eq(cma_write(c.pid, -1, 3, &l, &r, 1), RESHARD_ERR_NETWORK);
    char want[128];
    snprintf(want, sizeof(want), "process_vm_writev to rank 3 (pid %d): %s", (int)c.pid,
             strerror(EFAULT));
    cr_assert_str_eq(rs_error_message(), want);
    cr_assert_eq(finish_child(c), 0);
}

Test(cma, a_process_that_is_gone_fails_with_a_clear_status, .timeout = 10)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0)
        _exit(0);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid); /* reaped: the pid names no process now */
    char buf[64] = "x";
    struct iovec l = {buf, sizeof(buf)}, r = {target, sizeof(buf)};
    cr_assert_eq(cma_write(pid, -1, 2, &l, &r, 1), RESHARD_ERR_NETWORK);
    char want[128];
    snprintf(want, sizeof(want), "process_vm_writev to rank 2 (pid %d): %s", (int)pid,
             strerror(ESRCH));
    cr_assert_str_eq(rs_error_message(), want);
}

/* The peer verified as some pid has exited, and the number now names another process (here
 * a live child stands for the process that got it): the write is refused on the handle held
 * since verification, and the other process is left as it was. */
Test(cma, a_peer_that_exited_is_not_written_though_its_number_names_a_process, .timeout = 10)
{
    pid_t gone = fork();
    cr_assert_geq(gone, 0);
    if (gone == 0) {
        pause();
        _exit(0);
    }
    int pidfd = cma_hold(gone);
    if (pidfd < 0) {
        kill(gone, SIGKILL);
        waitpid(gone, NULL, 0);
        cr_skip_test("pidfd_open refused here: %s", strerror(errno));
    }
    cr_assert_eq(kill(gone, SIGKILL), 0);
    cr_assert_eq(waitpid(gone, NULL, 0), gone);
    memset(target, 0, TARGET_BYTES);
    struct child c = start_child(check_nothing_written);
    char buf[64];
    memset(buf, 0x5a, sizeof(buf));
    struct iovec l = {buf, sizeof(buf)}, r = {target, sizeof(buf)};
    cr_assert_eq(cma_write(c.pid, pidfd, 4, &l, &r, 1), RESHARD_ERR_NETWORK);
    char want[160];
    snprintf(want, sizeof(want),
             "cross-memory write to rank 4 refused: its process (pid %d) has exited, and the "
             "number may name another process now",
             (int)c.pid);
    cr_assert_str_eq(rs_error_message(), want);
    cr_assert_eq(finish_child(c), 0, "the other process's memory is untouched");
    int live = cma_hold(getpid());
    cr_assert_geq(live, 0);
    cr_assert_eq(cma_write(getpid(), live, 0, &l, &r, 1), RESHARD_OK, "a live one is written: %s",
                 rs_error_message());
    cr_assert_eq(target[0], 0x5a);
    close(live);
    close(pidfd);
}

Test(cma, an_empty_list_writes_nothing_and_succeeds)
{
    rs_error_clear();
    cr_assert_eq(cma_write(getpid(), -1, 0, NULL, NULL, 0), RESHARD_OK);
    cr_assert_str_eq(rs_error_message(), "");
}

Test(cma, a_write_to_a_peer_the_kernel_has_not_named_is_refused)
{
    char buf[8] = "x";
    struct iovec l = {buf, sizeof(buf)}, r = {target, sizeof(buf)};
    cr_assert_eq(cma_write(0, -1, 5, &l, &r, 1), RESHARD_ERR_UNAVAILABLE);
    cr_assert_str_eq(rs_error_message(),
                     "cross-memory write to rank 5 refused: the kernel has not confirmed which "
                     "process it is (it is no verified local peer)");
}

/* ---- local sockets ---- */

/* A name no other test process uses. */
static void unique_name(char *buf, size_t n, const char *what)
{
    static int seq;
    snprintf(buf, n, "reshard-test/%d/%s/%d", (int)getpid(), what, seq++);
}

/* Waits up to ~10 s for fd to be readable. */
static int wait_readable(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, 10000) == 1;
}

Test(cma, the_kernel_names_the_process_at_either_end_of_a_local_socket, .timeout = 10)
{
    char name[CMA_NAME_MAX + 1];
    unique_name(name, sizeof(name), "cred");
    int lfd = -1;
    cr_assert_eq(cma_listen(name, &lfd), RESHARD_OK, "%s", rs_error_message());
    pid_t parent = getpid(), pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* the connector: sees the listener's pid, tells it what it saw */
        int fd = -1;
        pid_t seen = 0;
        uid_t uid = 1;
        if (cma_connect(name, &fd) != RESHARD_OK || cma_peer_cred(fd, &seen, &uid) != RESHARD_OK)
            _exit(2);
        int32_t said = (int32_t)seen;
        _exit(cma_send(fd, &said, sizeof(said)) == RESHARD_OK && seen == parent && uid == geteuid()
                  ? 0
                  : 1);
    }
    cr_assert(wait_readable(lfd));
    int fd = -1;
    cr_assert_eq(cma_accept(lfd, &fd), RESHARD_OK);
    cr_assert_geq(fd, 0);
    pid_t seen = 0;
    uid_t uid = 1;
    cr_assert_eq(cma_peer_cred(fd, &seen, &uid), RESHARD_OK);
    cr_assert_eq(seen, pid, "the connector's pid as the kernel recorded it");
    cr_assert_eq(uid, geteuid());
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the connector saw pid %s",
              WIFEXITED(ws) && WEXITSTATUS(ws) == 1 ? "another" : "nothing");
    int32_t said = 0;
    long got = 0;
    cr_assert_eq(cma_recv(fd, &said, sizeof(said), &got), RESHARD_OK);
    cr_assert_eq(got, (long)sizeof(said));
    cr_assert_eq(said, (int32_t)parent);
    cr_assert_eq(cma_recv(fd, &said, sizeof(said), &got), RESHARD_OK);
    cr_assert_eq(got, 0, "the connector closed: end of stream");
    close(fd);
    close(lfd);
}

Test(cma, nobody_listening_on_a_name_is_told_apart_from_a_failure)
{
    char name[CMA_NAME_MAX + 1], want[256];
    unique_name(name, sizeof(name), "nobody");
    int fd = -1;
    cr_assert_eq(cma_connect(name, &fd), RESHARD_ERR_UNAVAILABLE);
    cr_assert_eq(fd, -1);
    snprintf(want, sizeof(want), "local: nobody listens on @%s here", name);
    cr_assert_str_eq(rs_error_message(), want);
}

Test(cma, a_name_another_socket_holds_cannot_be_taken)
{
    char name[CMA_NAME_MAX + 1], want[256];
    unique_name(name, sizeof(name), "taken");
    int a = -1, b = -1;
    cr_assert_eq(cma_listen(name, &a), RESHARD_OK);
    cr_assert_eq(cma_listen(name, &b), RESHARD_ERR_UNAVAILABLE);
    cr_assert_eq(b, -1);
    snprintf(want, sizeof(want), "local: another process holds the socket name @%s", name);
    cr_assert_str_eq(rs_error_message(), want);
    close(a);
}

Test(cma, a_message_longer_than_asked_for_is_reported_whole)
{
    char name[CMA_NAME_MAX + 1];
    unique_name(name, sizeof(name), "long");
    int lfd = -1, c = -1, s = -1;
    cr_assert_eq(cma_listen(name, &lfd), RESHARD_OK);
    cr_assert_eq(cma_connect(name, &c), RESHARD_OK);
    cr_assert_eq(cma_accept(lfd, &s), RESHARD_OK);
    cr_assert_geq(s, 0);
    char buf[64];
    long got = 0;
    cr_assert_eq(cma_recv(s, buf, sizeof(buf), &got), RESHARD_OK);
    cr_assert_eq(got, -1, "nothing waits yet");
    char big[200];
    memset(big, 'x', sizeof(big));
    cr_assert_eq(cma_send(c, big, sizeof(big)), RESHARD_OK);
    cr_assert_eq(cma_recv(s, buf, sizeof(buf), &got), RESHARD_OK);
    cr_assert_eq(got, 200, "its real length, so that the caller can refuse it");
    cr_assert_eq(cma_accept(lfd, &c), RESHARD_OK);
    cr_assert_eq(c, -1, "no other connection waits");
    close(s);
    close(lfd);
}

Test(cma, a_child_shares_the_namespaces_and_one_in_its_own_network_namespace_does_not,
     .timeout = 10)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        pause();
        _exit(0);
    }
    char why[160];
    int same = cma_same_namespaces(pid, why, sizeof(why));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    cr_assert_eq(same, CMA_SAME_ALL, "%s", why);
    int go[2];
    cr_assert_eq(pipe(go), 0);
    if ((pid = fork()) == 0) {
        char b = unshare(CLONE_NEWNET) == 0 ? 1 : 0;
        if (write(go[1], &b, 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char b = 0;
    cr_assert_eq(read(go[0], &b, 1), 1);
    same = b ? cma_same_namespaces(pid, why, sizeof(why)) : -2;
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    if (!b)
        cr_skip_test("unshare(CLONE_NEWNET) is not allowed here (it needs CAP_SYS_ADMIN)");
    cr_assert_eq(same, CMA_SAME_PID, "only the PID namespace is shared");
    cr_assert_str_eq(why, "it runs in another network namespace");
}

/* ---- who may write this process: Yama's rules, with the declarations recorded ---- */

#define MAX_CALLS 16

struct calls {
    int n;
    pid_t tracer[MAX_CALLS];
    int refuse; /* the next declarations fail with EPERM */
};

static struct calls *calls;

static int record_ptracer(pid_t pid)
{
    if (calls->refuse) {
        errno = EPERM;
        return -1;
    }
    if (calls->n < MAX_CALLS)
        calls->tracer[calls->n] = pid;
    calls->n++;
    return 0;
}

static void fake_yama(int scope)
{
    calls = mmap(NULL, sizeof(*calls), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(calls, MAP_FAILED);
    memset(calls, 0, sizeof(*calls));
    cma_test_yama(scope, record_ptracer);
}

/* A process that waits until killed. */
static pid_t idle_child(void)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        pause();
        _exit(0);
    }
    return pid;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

Test(cma, without_yama_every_writer_is_admitted_and_nothing_is_declared)
{
    fake_yama(-1);
    pid_t w = idle_child();
    int allowed = 0;
    char why[256];
    cr_assert_eq(cma_admit(w, &allowed, why, sizeof(why)), RESHARD_OK);
    cma_dismiss(w);
    reap(w);
    cr_assert_eq(allowed, 1, "%s", why);
    cr_assert_eq(calls->n, 0, "no PR_SET_PTRACER without Yama");
}

Test(cma, ptrace_scope_2_admits_no_writer_and_declares_nothing)
{
    fake_yama(2);
    pid_t w = idle_child();
    int allowed = 1;
    char why[256];
    cr_assert_eq(cma_admit(w, &allowed, why, sizeof(why)), RESHARD_OK);
    reap(w);
    cr_assert_eq(allowed, 0);
    cr_assert_str_eq(why, "kernel.yama.ptrace_scope is 2: the kernel lets no peer without "
                          "CAP_SYS_PTRACE write this process");
    cr_assert_eq(calls->n, 0);
}

Test(cma, ptrace_scope_1_declares_the_one_writer_then_resets)
{
    fake_yama(1);
    pid_t w = idle_child();
    int allowed = 0;
    char why[256];
    cr_assert_eq(cma_admit(w, &allowed, why, sizeof(why)), RESHARD_OK);
    cr_assert_eq(allowed, 1, "%s", why);
    cma_dismiss(w);
    reap(w);
    cr_assert_eq(calls->n, 2);
    cr_assert_eq(calls->tracer[0], w, "the writer itself: the least grant for one writer");
    cr_assert_eq(calls->tracer[1], 0, "reset by the last dismissal");
}

Test(cma, a_refused_declaration_admits_no_writer)
{
    fake_yama(1);
    calls->refuse = 1;
    pid_t w = idle_child();
    int allowed = 1;
    char why[256], want[256];
    cr_assert_eq(cma_admit(w, &allowed, why, sizeof(why)), RESHARD_OK);
    reap(w);
    cr_assert_eq(allowed, 0);
    snprintf(want, sizeof(want), "local: prctl(PR_SET_PTRACER, %d): %s", (int)w, strerror(EPERM));
    cr_assert_str_eq(why, want);
}

Test(cma, out_of_memory_when_admitting_undoes_the_declaration)
{
    fake_yama(1);
    pid_t w = idle_child();
    int allowed = 1;
    char why[256];
    rs_test_fail_alloc(1);
    reshard_status_t st = cma_admit(w, &allowed, why, sizeof(why));
    rs_test_fail_alloc(0);
    reap(w);
    cr_assert_eq(st, RESHARD_ERR_NO_MEMORY);
    cr_assert_eq(allowed, 0);
    cr_assert_eq(calls->n, 2);
    cr_assert_eq(calls->tracer[0], w);
    cr_assert_eq(calls->tracer[1], 0, "the declaration made for it is taken back");
}

/* A launcher L starts writers w[0..n) and then the rank R that admits them (all under L, or
 * each writer under a parent of its own when `cousins`); R reports its verdicts. */
struct family {
    pid_t launcher, writer[2];
    int allowed[2];
    char why[2][256];
    int done;
};

static void run_family(struct family *f, int cousins)
{
    pid_t l = fork();
    cr_assert_geq(l, 0);
    if (l == 0) {
        f->launcher = getpid();
        pid_t mid[2] = {0, 0};
        for (int i = 0; i < 2; i++) {
            if (!cousins) {
                f->writer[i] = idle_child();
                continue;
            }
            int fd[2];
            if (pipe(fd) != 0)
                _exit(1);
            if ((mid[i] = fork()) == 0) { /* an intermediate parent of its own */
                pid_t w = idle_child();
                if (write(fd[1], &w, sizeof(w)) != sizeof(w))
                    _exit(1);
                pause();
                _exit(0);
            }
            if (read(fd[0], &f->writer[i], sizeof(pid_t)) != sizeof(pid_t))
                _exit(1);
        }
        pid_t r = fork();
        if (r == 0) {
            for (int i = 0; i < 2; i++)
                if (cma_admit(f->writer[i], &f->allowed[i], f->why[i], sizeof(f->why[i])))
                    _exit(1);
            for (int i = 0; i < 2; i++)
                if (f->allowed[i])
                    cma_dismiss(f->writer[i]);
            f->done = 1;
            _exit(0);
        }
        waitpid(r, NULL, 0);
        for (int i = 0; i < 2; i++) {
            kill(f->writer[i], SIGKILL);
            if (mid[i])
                kill(mid[i], SIGKILL);
        }
        _exit(0);
    }
    cr_assert_eq(waitpid(l, NULL, 0), l);
    cr_assert_eq(f->done, 1, "the rank did not finish");
}

static struct family *shared_family(void)
{
    struct family *f =
        mmap(NULL, sizeof(*f), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(f, MAP_FAILED);
    memset(f, 0, sizeof(*f));
    return f;
}

Test(cma, ptrace_scope_1_widens_to_the_launcher_of_sibling_writers_then_resets, .timeout = 10)
{
    fake_yama(1);
    struct family *f = shared_family();
    run_family(f, 0);
    cr_assert_eq(f->allowed[0], 1, "%s", f->why[0]);
    cr_assert_eq(f->allowed[1], 1, "%s", f->why[1]);
    cr_assert_eq(calls->n, 3);
    cr_assert_eq(calls->tracer[0], f->writer[0], "the first writer alone");
    cr_assert_eq(calls->tracer[1], f->launcher, "then the parent both writers share");
    cr_assert_eq(calls->tracer[2], 0, "reset by the last dismissal");
}

Test(cma, ptrace_scope_1_leaves_out_a_writer_no_one_declaration_covers_with_the_first,
     .timeout = 10)
{
    fake_yama(1);
    struct family *f = shared_family();
    run_family(f, 1);
    cr_assert_eq(f->allowed[0], 1, "%s", f->why[0]);
    cr_assert_eq(f->allowed[1], 0, "a grandparent is never declared");
    char want[256];
    snprintf(want, sizeof(want),
             "kernel.yama.ptrace_scope is 1 and no one process holds pid %d and the 1 writer(s) "
             "allowed already among its descendants (PR_SET_PTRACER names one)",
             (int)f->writer[1]);
    cr_assert_str_eq(f->why[1], want);
    cr_assert_eq(calls->n, 2);
    cr_assert_eq(calls->tracer[0], f->writer[0]);
    cr_assert_eq(calls->tracer[1], 0);
}

Test(cma, a_forked_child_does_not_inherit_its_parents_declaration, .timeout = 10)
{
    fake_yama(1);
    pid_t w = idle_child();
    int allowed = 0;
    char why[256];
    cr_assert_eq(cma_admit(w, &allowed, why, sizeof(why)), RESHARD_OK);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) { /* Yama keeps the declaration per process: the child must make its own */
        int ok = 0;
        _exit(cma_admit(w, &ok, why, sizeof(why)) == RESHARD_OK && ok ? 0 : 1);
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cma_dismiss(w);
    reap(w);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    cr_assert_eq(calls->n, 3);
    cr_assert_eq(calls->tracer[0], w);
    cr_assert_eq(calls->tracer[1], w, "the child declared it again");
    cr_assert_eq(calls->tracer[2], 0);
}

Test(cma, a_process_that_is_not_dumpable_admits_no_writer, .timeout = 10)
{
    cma_test_yama(0, NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int allowed = 1;
        char why[256];
        if (prctl(PR_SET_DUMPABLE, 0UL, 0UL, 0UL, 0UL) != 0 ||
            cma_admit(getppid(), &allowed, why, sizeof(why)) != RESHARD_OK)
            _exit(2);
        _exit(allowed == 0 && strstr(why, "not dumpable") ? 0 : 1);
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "exit %d", WEXITSTATUS(ws));
}

/* Where the kernel has Yama at scope 1 and this user lacks CAP_SYS_PTRACE: an admitted child
 * writes its parent, one not admitted cannot. */
Test(cma, under_yama_scope_1_only_the_admitted_child_writes_its_parent, .timeout = 10)
{
    cma_test_yama(-2, NULL);
    int scope = cma_ptrace_scope();
    if (scope != 1)
        cr_skip_test("kernel.yama.ptrace_scope is %d here, not 1", scope);
    if (geteuid() == 0)
        cr_skip_test("root's CAP_SYS_PTRACE passes Yama: run as another user to see it refuse");
    pid_t parent = getpid(), kid[2];
    int go[2][2];
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(pipe(go[i]), 0);
        if ((kid[i] = fork()) == 0) {
            char b;
            static const char msg[] = "kid";
            struct iovec l = {(void *)msg, sizeof(msg)}, r = {target + 64 * i, sizeof(msg)};
            if (read(go[i][0], &b, 1) != 1)
                _exit(3);
            _exit(cma_write(parent, -1, 0, &l, &r, 1) == RESHARD_OK ? 0 : 1);
        }
    }
    int allowed = 0;
    char why[256];
    cr_assert_eq(cma_admit(kid[0], &allowed, why, sizeof(why)), RESHARD_OK);
    cr_assert_eq(allowed, 1, "%s", why);
    int ws[2];
    for (int i = 0; i < 2; i++) {
        char b = 1;
        cr_assert_eq(write(go[i][1], &b, 1), 1);
        cr_assert_eq(waitpid(kid[i], &ws[i], 0), kid[i]);
    }
    cma_dismiss(kid[0]);
    cr_assert(WIFEXITED(ws[0]) && WEXITSTATUS(ws[0]) == 0, "the admitted child could not write");
    cr_assert(WIFEXITED(ws[1]) && WEXITSTATUS(ws[1]) == 1, "the other child wrote");
    cr_assert_str_eq((const char *)target, "kid");
}
