/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Joining a bootstrap under attack (transport/boot/boot_admit.c, boot_join.c, boot_env.c): idle
 * connections that crowd rank 0's door, hellos with a wrong MAC or replayed from a capture, a
 * rank 0 that cannot prove the secret, a port held by another program, a missing libcrypto, and
 * the secrets of environment launches. Each test is named for the attack it survives.
 */
#include "boot_ranks.h"
#include "base/param.h"
#include "transport/boot/boot_int.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

TestSuite(boot_join, .init = clear_boot_params, .timeout = 60);

/* ---- a raw peer, speaking the protocol by hand ---- */

/* A listening socket on 127.0.0.1 at a port of the kernel's pick (written to *port). */
static int raw_listen(int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0, "%m");
    cr_assert_eq(listen(fd, 128), 0, "%m");
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static int raw_accept(int lfd)
{
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    cr_assert_eq(poll(&p, 1, 10000), 1, "nobody connected");
    int fd = accept(lfd, NULL, NULL);
    cr_assert_geq(fd, 0, "%m");
    return fd;
}

/* Reads n bytes within ms: 0, or -1 at the end of the stream or the deadline. */
static int read_full(int fd, void *buf, size_t n, int ms)
{
    size_t got = 0;
    int64_t until = now_ms() + ms;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int64_t left = until - now_ms();
        if (left <= 0 || poll(&p, 1, (int)left) != 1)
            return -1;
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

/* One frame: its header into h and up to cap payload bytes into p; 0, or -1. */
static int read_frame(int fd, struct sock_frame_hdr *h, unsigned char *p, size_t cap, int ms)
{
    unsigned char w[SOCK_FRAME_HDR_BYTES];
    if (read_full(fd, w, sizeof(w), ms) || sock_frame_get_hdr(w, h) || h->len > cap)
        return -1;
    return read_full(fd, p, h->len, ms);
}

static void write_frame(int fd, unsigned type, const void *p, size_t n)
{
    unsigned char w[SOCK_FRAME_HDR_BYTES];
    struct sock_frame_hdr h = {.type = (uint16_t)type, .len = n};
    sock_frame_put_hdr(w, &h);
    cr_assert_eq(write(fd, w, sizeof(w)), (ssize_t)sizeof(w));
    if (n)
        cr_assert_eq(write(fd, p, n), (ssize_t)n);
}

/* What a joiner says first. */
static void open_frame(int fd)
{
    unsigned char w[BOOT_OPEN_BYTES] = {0};
    sock_wire_put(w, BOOT_VERSION, 4);
    write_frame(fd, SOCK_FRAME_OPEN, w, sizeof(w));
}

/* A joiner's opening, heard by a listener played by hand. */
static void take_open(int fd)
{
    struct sock_frame_hdr h;
    unsigned char p[BOOT_OPEN_BYTES];
    cr_assert_eq(read_frame(fd, &h, p, sizeof(p), 5000), 0, "no opening");
    cr_assert_eq(h.type, SOCK_FRAME_OPEN);
}

/* Speaks first, as a joiner does, and takes the listener's challenge: its nonce. */
static void take_challenge(int fd, unsigned char *nonce)
{
    struct sock_frame_hdr h;
    unsigned char p[BOOT_CHALLENGE_BYTES];
    open_frame(fd);
    cr_assert_eq(read_frame(fd, &h, p, sizeof(p), 5000), 0, "no challenge");
    cr_assert_eq(h.type, SOCK_FRAME_CHALLENGE);
    cr_assert_eq(h.len, BOOT_CHALLENGE_BYTES);
    memcpy(nonce, p + 8, BOOT_NONCE_BYTES);
}

/* The text of the REFUSE that answers on fd ("" when something else came). */
static void take_refusal(int fd, char *text, size_t cap)
{
    struct sock_frame_hdr h;
    unsigned char p[SOCK_FRAME_TEXT_MAX + 1] = {0};
    text[0] = '\0';
    if (read_frame(fd, &h, p, SOCK_FRAME_TEXT_MAX, 5000) == 0 && h.type == SOCK_FRAME_REFUSE)
        snprintf(text, cap, "%.*s", (int)h.len, (char *)p);
}

/* ---- crowding the door ---- */

static int64_t slowest(const struct rank_run *r, int n)
{
    int64_t ms = 0;
    for (int i = 0; i < n; i++)
        ms = r[i].init_ms > ms ? r[i].init_ms : ms;
    return ms;
}

Test(boot_join, sixty_five_idle_connections_before_the_ranks_arrive_do_not_lock_them_out)
{
    enum { IDLE = 65, N = 4 };
    struct boot_id id;
    struct rank_run r[N];
    int idle[IDLE];
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    rs_param_reload();
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    for (int i = 0; i < IDLE; i++)
        idle[i] = raw_connect(&id); /* in the backlog before rank 0 looks */
    for (int i = 0; i < N; i++)
        start(&r[i], &id, i, N, 20000, WORK_COLLECTIVES);
    finish_all(r, N);
    assert_all_ok(r, N);
    fprintf(stderr, "boot_join: %d idle connections first: the job formed in %lld ms\n", IDLE,
            (long long)slowest(r, N));
    cr_assert_lt(slowest(r, N), 10000, "the ranks were held up for %lld ms",
                 (long long)slowest(r, N));
    for (int i = 0; i < IDLE; i++)
        close(idle[i]);
    close_all(r, N);
}

Test(boot_join, sixty_five_idle_connections_while_rank_0_waits_make_way_for_the_ranks)
{
    enum { IDLE = 65, N = 4 };
    struct boot_id id;
    struct rank_run r[N];
    int idle[IDLE];
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    setenv("RESHARD_BOOT_HELLO_MS", "2000", 1);
    rs_param_reload();
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    start(&r[0], &id, 0, N, 20000, WORK_COLLECTIVES);
    usleep(200 * 1000); /* rank 0 serves its door: each idle one is challenged and kept */
    for (int i = 0; i < IDLE; i++)
        idle[i] = raw_connect(&id);
    for (int i = 1; i < N; i++)
        start(&r[i], &id, i, N, 20000, WORK_COLLECTIVES);
    finish_all(r, N);
    assert_all_ok(r, N);
    fprintf(stderr, "boot_join: %d idle connections at a served door: formed in %lld ms\n", IDLE,
            (long long)slowest(r, N));
    /* The full table answers BUSY until its oldest have had 250 ms, then lets them go. */
    cr_assert_lt(slowest(r, N), 10000);
    for (int i = 0; i < IDLE; i++)
        close(idle[i]);
    close_all(r, N);
}

Test(boot_join, a_connection_that_never_speaks_is_dropped_at_an_eighth_of_the_deadline)
{
    struct boot_id id;
    struct rank_run r[2];
    unsigned char byte;
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    setenv("RESHARD_BOOT_HELLO_MS", "2000", 1);
    rs_param_reload();
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    start(&r[0], &id, 0, 2, 20000, WORK_COLLECTIVES);
    int fd = raw_connect(&id);
    int64_t t0 = now_ms();
    cr_assert_eq(read_full(fd, &byte, 1, 10000), -1, "the door spoke to a silent connection");
    int64_t waited = now_ms() - t0;
    cr_assert_geq(waited, 200, "dropped after %lld ms", (long long)waited);
    cr_assert_lt(waited, 3000, "dropped after %lld ms", (long long)waited);
    close(fd);
    start(&r[1], &id, 1, 2, 20000, WORK_COLLECTIVES);
    finish_all(r, 2);
    assert_all_ok(r, 2);
    close_all(r, 2);
}

Test(boot_join, an_idle_connection_is_dropped_at_its_hello_deadline)
{
    struct boot_id id;
    struct rank_run r[2];
    unsigned char nonce[BOOT_NONCE_BYTES], byte;
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    setenv("RESHARD_BOOT_HELLO_MS", "300", 1);
    rs_param_reload();
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    start(&r[0], &id, 0, 2, 20000, WORK_COLLECTIVES);
    int fd = raw_connect(&id);
    take_challenge(fd, nonce);
    int64_t t0 = now_ms();
    cr_assert_eq(read_full(fd, &byte, 1, 10000), -1, "the door said more than its challenge");
    int64_t waited = now_ms() - t0;
    cr_assert_geq(waited, 250, "dropped after %lld ms", (long long)waited);
    cr_assert_lt(waited, 5000, "dropped after %lld ms", (long long)waited);
    close(fd);
    start(&r[1], &id, 1, 2, 20000, WORK_COLLECTIVES);
    finish_all(r, 2);
    assert_all_ok(r, 2);
    close_all(r, 2);
}

/* ---- hellos that do not prove the secret ---- */

Test(boot_join, a_hello_with_a_wrong_mac_is_refused_and_the_job_completes)
{
    struct boot_id id;
    struct rank_run r[2];
    unsigned char nonce[BOOT_NONCE_BYTES], w[BOOT_HELLO_BYTES];
    char text[SOCK_FRAME_TEXT_MAX];
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    rs_param_reload();
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    start(&r[0], &id, 0, 2, 20000, WORK_COLLECTIVES);
    int fd = raw_connect(&id);
    take_challenge(fd, nonce);
    struct boot_hello h = {.version = BOOT_VERSION, .kind = BOOT_JOIN, .rank = 1, .size = 2};
    union sock_addr a = {.in = {.sin_family = AF_INET, .sin_port = htons(9)}};
    boot_addr_put(h.addr, &a);
    memset(h.mac, 0x5a, sizeof(h.mac)); /* a MAC made without the secret */
    boot_hello_put(w, &h);
    write_frame(fd, SOCK_FRAME_HELLO, w, sizeof(w));
    take_refusal(fd, text, sizeof(text));
    cr_assert(strstr(text, "wrong secret"), "refusal: '%s'", text);
    close(fd);
    start(&r[1], &id, 1, 2, 20000, WORK_COLLECTIVES);
    finish_all(r, 2);
    assert_all_ok(r, 2);
    cr_assert(strstr(boot_refusal(r[0].b), "claiming rank 1 of 2: wrong secret"), "%s",
              boot_refusal(r[0].b));
    close_all(r, 2);
}

/* Whether n bytes of needle appear in the m bytes of hay. */
static int contains(const unsigned char *hay, size_t m, const void *needle, size_t n)
{
    for (size_t i = 0; i + n <= m; i++)
        if (!memcmp(hay + i, needle, n))
            return 1;
    return 0;
}

Test(boot_join, a_recorded_hello_neither_shows_the_secret_nor_admits_a_replay)
{
    struct boot_id trap_id, id;
    struct rank_run joiner, r[2];
    unsigned char nonce[BOOT_NONCE_BYTES] = {1, 2, 3}, w[BOOT_CHALLENGE_BYTES] = {0};
    unsigned char heard[SOCK_FRAME_HDR_BYTES + BOOT_HELLO_BYTES];
    char text[SOCK_FRAME_TEXT_MAX];
    int trap_port;
    int trap = raw_listen(&trap_port);
    union sock_addr at;
    unsigned char secret[BOOT_SECRET_BYTES];
    listening_id(&id);
    /* The trap listens elsewhere for an id of the same secret. */
    cr_assert_eq(boot_id_decode(&id, &at, secret, NULL), 0);
    sock_addr_set_port(&at, trap_port);
    boot_id_encode(&at, secret, 0, &trap_id);
    /* A rank of the job dials a listener that records what it says. */
    start(&joiner, &trap_id, 1, 2, 1500, WORK_NONE);
    int fd = raw_accept(trap);
    take_open(fd);
    sock_wire_put(w, BOOT_VERSION, 4);
    memcpy(w + 8, nonce, sizeof(nonce));
    write_frame(fd, SOCK_FRAME_CHALLENGE, w, sizeof(w));
    cr_assert_eq(read_full(fd, heard, sizeof(heard), 5000), 0, "no hello");
    close(fd);
    close(trap);
    finish(&joiner);
    cr_assert_neq(joiner.st, RESHARD_OK);
    /* What crossed the wire holds neither the secret nor what it was made from. */
    cr_assert(!contains(heard, sizeof(heard), id.bytes + 28, BOOT_SECRET_BYTES));
    cr_assert(!contains(heard, sizeof(heard), id.bytes + 28, 8), "8 bytes of the secret went out");
    /* Played back to the job's rank 0, which challenges with a fresh nonce, it is refused. */
    start(&r[0], &id, 0, 2, 20000, WORK_COLLECTIVES);
    usleep(100 * 1000);
    fd = raw_connect(&id);
    take_challenge(fd, nonce);
    cr_assert_eq(write(fd, heard, sizeof(heard)), (ssize_t)sizeof(heard));
    take_refusal(fd, text, sizeof(text));
    cr_assert(strstr(text, "wrong secret"), "refusal: '%s'", text);
    close(fd);
    /* The rank it claimed to be still joins. */
    start(&r[1], &id, 1, 2, 20000, WORK_COLLECTIVES);
    finish_all(r, 2);
    assert_all_ok(r, 2);
    close_all(r, 2);
}

Test(boot_join, a_rank_0_that_cannot_prove_the_secret_is_not_joined)
{
    struct boot_id id;
    struct rank_run joiner;
    unsigned char w[BOOT_CHALLENGE_BYTES] = {0}, hello[BOOT_HELLO_BYTES], a[BOOT_ADMIT_BYTES];
    struct sock_frame_hdr h;
    int port, lfd = raw_listen(&port);
    loopback_id(port, SECRET, &id);
    start(&joiner, &id, 1, 2, 10000, WORK_NONE);
    int fd = raw_accept(lfd);
    take_open(fd);
    sock_wire_put(w, BOOT_VERSION, 4);
    write_frame(fd, SOCK_FRAME_CHALLENGE, w, sizeof(w));
    cr_assert_eq(read_frame(fd, &h, hello, sizeof(hello), 5000), 0);
    /* An impostor admits it, as rank 0 would, but cannot MAC the admission. */
    struct boot_admit ad = {.slot = 1, .fanout = 8, .parent = 0};
    memset(ad.mac, 0xa5, sizeof(ad.mac));
    boot_admit_put(a, &ad);
    write_frame(fd, SOCK_FRAME_ADMIT, a, sizeof(a));
    finish(&joiner);
    cr_assert_eq(joiner.st, RESHARD_ERR_REFUSED, "%s", joiner.msg);
    cr_assert(strstr(joiner.msg, "could not prove that it holds the job's secret"), "%s",
              joiner.msg);
    cr_assert_lt(joiner.ms, 5000, "it took %lld ms", (long long)joiner.ms);
    cr_assert_null(joiner.b);
    close(fd);
    close(lfd);
}

Test(boot_join, without_libcrypto_a_join_says_what_is_missing)
{
    struct boot_id id;
    struct rank_run r[2];
    setenv("RESHARD_CRYPTO_LIB", "/nonexistent/libcrypto.so.3", 1);
    rs_param_reload();
    cr_assert_eq(boot_id_from_addr("127.0.0.1", 9, SECRET, &id), RESHARD_ERR_UNAVAILABLE);
    cr_assert(strstr(rs_error_message(), "crypto:") &&
                  strstr(rs_error_message(), "RESHARD_CRYPTO_LIB"),
              "%s", rs_error_message());
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message()); /* random secret */
    start(&r[0], &id, 0, 2, 2000, WORK_NONE);
    start(&r[1], &id, 1, 2, 2000, WORK_NONE);
    finish_all(r, 2);
    cr_assert_eq(r[1].st, RESHARD_ERR_UNAVAILABLE, "%s", r[1].msg);
    cr_assert(strstr(r[1].msg, "/nonexistent/libcrypto.so.3"), "%s", r[1].msg);
    cr_assert_lt(r[1].ms, 3000, "rank 1 took %lld ms to say so", (long long)r[1].ms);
    cr_assert_eq(r[0].st, RESHARD_ERR_TIMEOUT, "%s", r[0].msg);
    /* One rank alone needs nobody's MAC. */
    struct rank_run alone;
    cr_assert_eq(boot_id_create(&id), RESHARD_OK, "%s", rs_error_message());
    start(&alone, &id, 0, 1, 2000, WORK_COLLECTIVES);
    finish(&alone);
    assert_all_ok(&alone, 1);
    close_all(&alone, 1);
}

/* ---- a port that another program holds ---- */

enum squat { SQUAT_SILENT, SQUAT_HTTP, SQUAT_CLOSE };

struct squatter {
    int lfd;
    enum squat how;
    atomic_int stop;
    pthread_t thread;
};

/* Another program on the port: it never accepts (the kernel does), answers HTTP, or hangs up. */
static void *squat_main(void *arg)
{
    struct squatter *s = arg;
    static const char http[] = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    while (!atomic_load(&s->stop)) {
        struct pollfd p = {.fd = s->lfd, .events = POLLIN};
        if (s->how == SQUAT_SILENT || poll(&p, 1, 50) != 1)
            continue;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        if (s->how == SQUAT_HTTP)
            (void)!write(fd, http, sizeof(http) - 1);
        close(fd);
    }
    return NULL;
}

/* An environment launch of 4 ranks whose MASTER_PORT+1 another program holds: rank 0 fails at
 * once, and ranks 1-3 within seconds rather than at their 20 s timeout, each saying why. */
static void squatted(enum squat how, const char *phrase)
{
    enum { N = 4 };
    struct squatter s = {.how = how};
    struct boot_env env;
    struct rank_run r[N];
    char port_s[16];
    int port;
    s.lfd = raw_listen(&port);
    cr_assert_eq(pthread_create(&s.thread, NULL, squat_main, &s), 0);
    clear_launcher_env();
    snprintf(port_s, sizeof(port_s), "%d", port - 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", port_s, 1);
    setenv("WORLD_SIZE", "4", 1);
    setenv("RANK", "1", 1);
    setenv("RESHARD_SECRET", SECRET, 1);
    rs_param_reload();
    cr_assert_eq(boot_env_read(&env), RESHARD_OK, "%s", rs_error_message());
    for (int i = 0; i < N; i++)
        start(&r[i], &env.id, i, N, 20000, WORK_NONE);
    finish_all(r, N);
    atomic_store(&s.stop, 1);
    pthread_join(s.thread, NULL);
    close(s.lfd);
    cr_assert_eq(r[0].st, RESHARD_ERR_NETWORK, "rank 0: %s", r[0].msg);
    cr_assert(strstr(r[0].msg, "is taken on rank 0's host") &&
                  strstr(r[0].msg, "RESHARD_BOOT_PORT"),
              "rank 0: %s", r[0].msg);
    cr_assert_lt(r[0].ms, 2000, "rank 0 took %lld ms", (long long)r[0].ms);
    for (int i = 1; i < N; i++) {
        fprintf(stderr, "boot_join: squatter %d: rank %d failed after %lld ms\n", how, i,
                (long long)r[i].ms);
        cr_assert_eq(r[i].st, RESHARD_ERR_NETWORK, "rank %d: %s", i, r[i].msg);
        cr_assert(strstr(r[i].msg, "is not reshard's rank 0") && strstr(r[i].msg, phrase),
                  "rank %d: %s", i, r[i].msg);
        cr_assert_lt(r[i].ms, 6000, "rank %d took %lld ms: %s", i, (long long)r[i].ms, r[i].msg);
    }
}

Test(boot_join, a_silent_program_on_master_port_plus_1_fails_every_rank_within_seconds)
{
    squatted(SQUAT_SILENT, "said nothing for 1 s");
}

Test(boot_join, a_program_speaking_http_on_master_port_plus_1_fails_every_rank_at_once)
{
    squatted(SQUAT_HTTP, "sent bytes that are not a reshard bootstrap frame");
}

Test(boot_join, a_program_hanging_up_on_master_port_plus_1_fails_every_rank_at_once)
{
    squatted(SQUAT_CLOSE, "closed it without a word");
}

/* ---- the secrets of environment launches ---- */

static void clear_all(void)
{
    clear_launcher_env();
    clear_boot_params();
    unsetenv("RESHARD_SECRET_FILE");
    rs_param_reload();
}

TestSuite(boot_secret, .init = clear_all, .timeout = 60);

/* torchrun's variables for rank `rank` of 2 whose MASTER_PORT+1 is `port`. */
static void torchrun_at(int port, int rank)
{
    char s[16];
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(s, sizeof(s), "%d", port - 1);
    setenv("MASTER_PORT", s, 1);
    snprintf(s, sizeof(s), "%d", rank);
    setenv("RANK", s, 1);
    setenv("WORLD_SIZE", "2", 1);
    setenv("TORCHELASTIC_RUN_ID", "job-a", 1);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

Test(boot_secret, without_a_secret_one_warning_says_anyone_who_reaches_the_port_can_join)
{
    struct boot_env e;
    rs_log_set_sink(capture_warning);
    torchrun_at(29501, 1);
    cr_assert_eq(boot_env_read(&e), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(boot_env_read(&e), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(count(warned, "anyone who can reach rank 0's port (127.0.0.1:29501) can join"), 1,
                 "%s", warned);
    /* With a secret, nothing to warn of. */
    warned[0] = '\0';
    setenv("RESHARD_SECRET", "s3cret", 1);
    rs_param_reload();
    cr_assert_eq(boot_env_read(&e), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(count(warned, "anyone who can reach"), 0, "%s", warned);
}

/* A job of 2 from the environment at a held port; an outsider who computes the secret from
 * the public values tries to join first. Returns whether it was admitted. */
static int outsider_joins(void)
{
    struct boot_env e;
    struct boot_id outsider;
    struct rank_run r[2];
    char public[256];
    int port = private_loopback_port();
    torchrun_at(port, 1);
    cr_assert_eq(boot_env_read(&e), RESHARD_OK, "%s", rs_error_message());
    snprintf(public, sizeof(public), "reshard|torchrun|job-a|127.0.0.1|%d|2", port);
    cr_assert_eq(boot_id_from_addr("127.0.0.1", port, public, &outsider), RESHARD_OK);
    start(&r[0], &e.id, 0, 2, 10000, WORK_COLLECTIVES);
    struct boot *b = NULL;
    reshard_status_t st = boot_init(&outsider, 1, 2, 5000, &b);
    if (st == RESHARD_OK) { /* it took rank 1's place */
        finish(&r[0]);
        boot_close(b);
        boot_close(r[0].b);
        return 1;
    }
    cr_assert_eq(st, RESHARD_ERR_REFUSED, "%s", rs_error_message());
    cr_assert(strstr(rs_error_message(), "wrong secret"), "%s", rs_error_message());
    start(&r[1], &e.id, 1, 2, 10000, WORK_COLLECTIVES);
    finish_all(r, 2);
    assert_all_ok(r, 2);
    close_all(r, 2);
    return 0;
}

Test(boot_secret, an_outsider_computing_the_public_secret_is_refused_given_RESHARD_SECRET)
{
    setenv("RESHARD_SECRET", "s3cret", 1);
    rs_param_reload();
    cr_assert_eq(outsider_joins(), 0);
}

static void write_secret_file(const char *text, mode_t mode, char *path, size_t n)
{
    snprintf(path, n, "/tmp/reshard-secret-%d", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    cr_assert_eq(chmod(path, mode), 0);
    setenv("RESHARD_SECRET_FILE", path, 1);
    rs_param_reload();
}

Test(boot_secret, an_outsider_computing_the_public_secret_is_refused_given_RESHARD_SECRET_FILE)
{
    char path[64];
    write_secret_file("a secret from the launcher\n", 0600, path, sizeof(path));
    int admitted = outsider_joins();
    unlink(path);
    cr_assert_eq(admitted, 0);
}

Test(boot_secret, without_a_secret_the_outsider_is_admitted_as_the_warning_says)
{
    cr_assert_eq(outsider_joins(), 1);
}

Test(boot_secret, the_same_secret_file_gives_the_same_id_and_another_file_another)
{
    struct boot_env a, b, c;
    char path[64];
    torchrun_at(29501, 1);
    write_secret_file("first\n", 0600, path, sizeof(path));
    cr_assert_eq(boot_env_read(&a), RESHARD_OK, "%s", rs_error_message());
    write_secret_file("first", 0600, path, sizeof(path)); /* a trailing newline is dropped */
    cr_assert_eq(boot_env_read(&b), RESHARD_OK, "%s", rs_error_message());
    write_secret_file("second\n", 0600, path, sizeof(path));
    cr_assert_eq(boot_env_read(&c), RESHARD_OK, "%s", rs_error_message());
    unlink(path);
    cr_assert_eq(memcmp(&a.id, &b.id, sizeof(a.id)), 0);
    cr_assert_neq(memcmp(&a.id, &c.id, sizeof(a.id)), 0);
}

Test(boot_secret, a_secret_file_others_can_read_is_warned_about)
{
    struct boot_env e;
    char path[64];
    rs_log_set_sink(capture_warning);
    torchrun_at(29501, 1);
    write_secret_file("shared\n", 0644, path, sizeof(path));
    cr_assert_eq(boot_env_read(&e), RESHARD_OK, "%s", rs_error_message());
    unlink(path);
    cr_assert(strstr(warned, "can be read by other users (mode 644)"), "%s", warned);
}

Test(boot_secret, bad_secret_settings_are_refused_by_name)
{
    struct boot_env e;
    char path[64];
    torchrun_at(29501, 1);
    write_secret_file("", 0600, path, sizeof(path));
    cr_assert_eq(boot_env_read(&e), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "is empty"), "%s", rs_error_message());
    unlink(path);
    cr_assert_eq(boot_env_read(&e), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "RESHARD_SECRET_FILE=/tmp/reshard-secret-") &&
                  strstr(rs_error_message(), "No such file"),
              "%s", rs_error_message());
    setenv("RESHARD_SECRET", "s3cret", 1);
    rs_param_reload();
    cr_assert_eq(boot_env_read(&e), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "both set"), "%s", rs_error_message());
}
