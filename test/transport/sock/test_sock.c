/* SPDX-License-Identifier: Apache-2.0 */
/* TCP sockets and their deadlines (transport/sock/sock.c), on loopback: the cheap cases. */
#include "base/clock.h"
#include "base/error.h"
#include "transport/sock/sock.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

TestSuite(sock, .timeout = 10);

static void assert_message_has(const char *part)
{
    cr_assert(strstr(rs_error_message(), part), "message '%s' lacks '%s'", rs_error_message(),
              part);
}

Test(sock, durations_read_as_people_write_them)
{
    char buf[32];
    cr_assert_str_eq(sock_ms_str(250, buf, sizeof(buf)), "250 ms");
    cr_assert_str_eq(sock_ms_str(1000, buf, sizeof(buf)), "1 s");
    cr_assert_str_eq(sock_ms_str(1500, buf, sizeof(buf)), "1.5 s");
}

Test(sock, quoted_message_loses_its_bootstrap_prefix_only)
{
    cr_assert_str_eq(sock_msg_body("bootstrap: rank 3 died"), "rank 3 died");
    cr_assert_str_eq(sock_msg_body("connect to x: refused"), "connect to x: refused");
}

Test(sock, addresses_print_with_their_port_in_either_family)
{
    union sock_addr a;
    char buf[SOCK_ADDR_STR];
    cr_assert_eq(sock_resolve("127.0.0.1", 29501, &a), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(sock_addr_port(&a), 29501);
    cr_assert_str_eq(sock_addr_str(&a, buf, sizeof(buf)), "127.0.0.1:29501");
    cr_assert_eq(sock_resolve("::1", 7, &a), RESHARD_OK, "%s", rs_error_message());
    cr_assert_str_eq(sock_addr_str(&a, buf, sizeof(buf)), "[::1]:7");
    sock_addr_set_port(&a, 65535);
    cr_assert_eq(sock_addr_port(&a), 65535);
}

/* A listener on loopback at a port of the kernel's pick. */
static int listen_loopback(union sock_addr *a)
{
    int fd = -1;
    cr_assert_eq(sock_resolve("127.0.0.1", 0, a), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(sock_listen(a, &fd), RESHARD_OK, "%s", rs_error_message());
    cr_assert_gt(sock_addr_port(a), 0, "the bound port is written back");
    return fd;
}

Test(sock, connect_accept_and_peek_without_taking)
{
    union sock_addr a, peer, local;
    int lfd = listen_loopback(&a), c = -1, s = -1;
    char buf[8];
    cr_assert_eq(sock_connect(&a, "rank 0", rs_now_ms() + 2000, 2000, &c), RESHARD_OK, "%s",
                 rs_error_message());
    for (int64_t end = rs_now_ms() + 2000; s < 0 && rs_now_ms() < end;)
        cr_assert_eq(sock_accept(lfd, &s, &peer), RESHARD_OK, "%s", rs_error_message());
    cr_assert_geq(s, 0);
    cr_assert_eq(sock_local_addr(c, &local), 0);
    cr_assert_eq(sock_addr_port(&local), sock_addr_port(&peer), "both ends agree on the port");
    cr_assert_eq(sock_peek(s, buf, sizeof(buf)), -1, "nothing waits yet");
    cr_assert_eq(write(c, "hello", 5), 5);
    struct pollfd p = {.fd = s, .events = POLLIN};
    int ready = 0;
    cr_assert_eq(sock_poll(&p, 1, rs_now_ms() + 2000, &ready), RESHARD_OK);
    cr_assert_eq(ready, 1);
    cr_assert_eq(sock_peek(s, buf, sizeof(buf)), 5);
    cr_assert_eq(sock_peek(s, buf, 2), 2, "a peek takes nothing");
    cr_assert_eq(memcmp(buf, "he", 2), 0);
    sock_close(&c);
    cr_assert_eq(c, -1);
    char all[8];
    cr_assert_eq(read(s, all, sizeof(all)), 5);
    cr_assert_eq(sock_peek(s, buf, sizeof(buf)), 0, "the peer closed its end");
    sock_close(&s);
    sock_close(&lfd);
}

Test(sock, accept_with_nobody_waiting_gives_no_socket)
{
    union sock_addr a, peer;
    int lfd = listen_loopback(&a), s = 7;
    cr_assert_eq(sock_accept(lfd, &s, &peer), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(s, -1);
    sock_close(&lfd);
}

Test(sock, accept_past_the_descriptor_limit_says_which_limit_to_raise)
{
    union sock_addr a, peer;
    int lfd = listen_loopback(&a), c = -1, s = -1;
    cr_assert_eq(sock_connect(&a, "rank 0", rs_now_ms() + 2000, 2000, &c), RESHARD_OK, "%s",
                 rs_error_message());
    int next = dup(0); /* the lowest free descriptor: allow none from it on */
    cr_assert_geq(next, 0);
    close(next);
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    rl.rlim_cur = (rlim_t)next;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0, "%m");
    reshard_status_t st = RESHARD_OK;
    for (int64_t end = rs_now_ms() + 2000; st == RESHARD_OK && s < 0 && rs_now_ms() < end;)
        st = sock_accept(lfd, &s, &peer);
    cr_assert_eq(st, RESHARD_ERR_TOO_LARGE, "%s", rs_error_message());
    char want[64];
    snprintf(want, sizeof(want), "RLIMIT_NOFILE is %d", next);
    assert_message_has(want);
    assert_message_has("ulimit -n");
    sock_close(&c);
    sock_close(&lfd);
}

Test(sock, poll_with_nothing_to_say_returns_at_its_deadline)
{
    int sv[2];
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    struct pollfd p = {.fd = sv[0], .events = POLLIN};
    int ready = -1;
    int64_t t0 = rs_now_ms();
    cr_assert_eq(sock_poll(&p, 1, t0 + 50, &ready), RESHARD_OK);
    int64_t took = rs_now_ms() - t0;
    cr_assert_eq(ready, 0);
    cr_assert(took >= 45 && took < 2000, "returned after %lld ms", (long long)took);
    cr_assert_eq(sock_poll(&p, 1, t0 - 1000, &ready), RESHARD_OK, "a passed deadline polls once");
    cr_assert_eq(ready, 0);
    close(sv[0]);
    close(sv[1]);
}

Test(sock, connect_to_nobody_retries_until_its_deadline_and_names_the_address)
{
    union sock_addr a;
    char want[SOCK_ADDR_STR + 64], as[SOCK_ADDR_STR];
    int c = -1, held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* A port bound but never listened on: every connect to it is refused, and no other
     * process can take it meanwhile. */
    cr_assert_geq(held, 0);
    cr_assert_eq(sock_resolve("127.0.0.1", 0, &a), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(bind(held, &a.sa, sock_addr_len(&a)), 0);
    cr_assert_eq(sock_local_addr(held, &a), 0);
    int64_t t0 = rs_now_ms();
    cr_assert_eq(sock_connect(&a, "rank 0", t0 + 200, 200, &c), RESHARD_ERR_TIMEOUT, "%s",
                 rs_error_message());
    int64_t took = rs_now_ms() - t0;
    cr_assert_eq(c, -1);
    cr_assert(took >= 190 && took < 2000, "gave up after %lld ms", (long long)took);
    snprintf(want, sizeof(want), "could not reach rank 0 at %s within 200 ms",
             sock_addr_str(&a, as, sizeof(as)));
    assert_message_has(want);
    assert_message_has("Connection refused");
    close(held);
}

Test(sock, connect_without_waiting_reports_when_it_is_up)
{
    union sock_addr a, peer;
    int lfd = listen_loopback(&a), c = -1, s = -1, done = 0;
    cr_assert_eq(sock_connect_start(&a, &c), RESHARD_OK, "%s", rs_error_message());
    for (int64_t end = rs_now_ms() + 2000; !done && rs_now_ms() < end;)
        cr_assert_eq(sock_connect_check(c, "the listener", &done), RESHARD_OK, "%s",
                     rs_error_message());
    cr_assert_eq(done, 1);
    for (int64_t end = rs_now_ms() + 2000; s < 0 && rs_now_ms() < end;)
        cr_assert_eq(sock_accept(lfd, &s, &peer), RESHARD_OK, "%s", rs_error_message());
    cr_assert_geq(s, 0);
    sock_close(&s);
    sock_close(&c);
    sock_close(&lfd);
}
