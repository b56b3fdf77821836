/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Cross-memory writes (transport/cma.c) between forked processes. A forked child has the
 * parent's address space layout, so the parent knows where the child's copy of `target` is:
 * the parent writes into it, then the child checks what landed and says so in its exit code.
 */
#include "base/error.h"
#include "transport/cma.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
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
    cr_assert_eq(cma_write(c.pid, 1, &l, &r, 1), RESHARD_OK, "%s", rs_error_message());
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
    cr_assert_eq(cma_write(c.pid, 1, l, r, PIECES + 2), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(finish_child(c), 0);
}

Test(cma, a_peer_allowed_in_writes_into_its_parent, .timeout = 10)
{
    cma_allow_peers(); /* where Yama allows only ancestors, a child needs this */
    pid_t parent = getpid(), pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        static const char msg[] = "from the child";
        struct iovec l = {(void *)msg, sizeof(msg)}, r = {target, sizeof(msg)};
        _exit(cma_write(parent, 0, &l, &r, 1) == RESHARD_OK ? 0 : 1);
    }
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "the child's write failed");
    cr_assert_str_eq((const char *)target, "from the child");
}

static int check_nothing(void)
{
    return 0;
}

Test(cma, a_bad_address_fails_with_a_clear_status, .timeout = 10)
{
    struct child c = start_child(check_nothing);
    char buf[64] = "x";
    struct iovec l = {buf, sizeof(buf)}, r = {(void *)8, sizeof(buf)}; /* never mapped */
    cr_assert_eq(cma_write(c.pid, 3, &l, &r, 1), RESHARD_ERR_NETWORK);
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
    cr_assert_eq(cma_write(pid, 2, &l, &r, 1), RESHARD_ERR_NETWORK);
    char want[128];
    snprintf(want, sizeof(want), "process_vm_writev to rank 2 (pid %d): %s", (int)pid,
             strerror(ESRCH));
    cr_assert_str_eq(rs_error_message(), want);
}

Test(cma, an_empty_list_writes_nothing_and_succeeds)
{
    rs_error_clear();
    cr_assert_eq(cma_write(getpid(), 0, NULL, NULL, 0), RESHARD_OK);
    cr_assert_str_eq(rs_error_message(), "");
}
