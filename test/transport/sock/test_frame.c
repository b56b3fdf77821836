/* SPDX-License-Identifier: Apache-2.0 */
/* The bootstrap's frames (transport/sock/sock_frame.c): the header and ERROR codecs, and
 * transfers over a socket pair, fed by hand where a test needs a malformed or cut stream. */
#include "base/clock.h"
#include "base/error.h"
#include "transport/sock/sock.h"
#include "transport/sock/sock_frame.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Both ends of a stream socket pair, non-blocking as the bootstrap's sockets are. */
static int sv[2] = {-1, -1};

static void open_pair(void)
{
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
}

static void close_pair(void)
{
    sock_close(&sv[0]);
    sock_close(&sv[1]);
}

TestSuite(sock_frame, .init = open_pair, .fini = close_pair, .timeout = 10);

/* What a rank in allgather #3 expects from its peer: 64 bytes. */
static const struct sock_frame_hdr gather3 = {
    .type = SOCK_FRAME_DATA, .op = SOCK_OP_ALLGATHER, .seq = 3, .len = 64};

/* Writes a header and n payload bytes to the far end, as a peer would. */
static void peer_sends(const struct sock_frame_hdr *h, const void *payload, size_t n)
{
    unsigned char w[SOCK_FRAME_HDR_BYTES];
    sock_frame_put_hdr(w, h);
    cr_assert_eq(write(sv[1], w, sizeof(w)), (ssize_t)sizeof(w));
    if (n)
        cr_assert_eq(write(sv[1], payload, n), (ssize_t)n);
}

/* Receives the frame `want` on sv[0] within 2 s; returns the status. */
static reshard_status_t receive(struct sock_frame_hdr want, void *data,
                                struct sock_frame_error *err)
{
    struct sock_xfer x;
    int failed = -2;
    sock_xfer_init(&x, sv[0], "rank 1 (test)", 0, want, data);
    reshard_status_t st = sock_xfer_run(&x, 1, rs_now_ms() + 2000, 2000, "allgather", &failed, err);
    cr_assert_eq(failed, st == RESHARD_OK ? -1 : 0);
    return st;
}

static void assert_message_has(const char *part)
{
    cr_assert(strstr(rs_error_message(), part), "message '%s' lacks '%s'", rs_error_message(),
              part);
}

/* ---- codecs ---- */

Test(sock_frame, wire_integers_are_big_endian_and_round_trip)
{
    unsigned char w[8];
    sock_wire_put(w, 0x0102030405060708ull, 8);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(w[i], i + 1);
    for (int bytes = 1; bytes <= 8; bytes++) {
        uint64_t v = 0xF1E2D3C4B5A69788ull >> (64 - 8 * bytes);
        sock_wire_put(w, v, bytes);
        cr_assert_eq(sock_wire_get(w, bytes), v, "%d bytes", bytes);
    }
}

Test(sock_frame, header_round_trips_through_its_24_bytes)
{
    const struct sock_frame_hdr in[] = {
        {.type = SOCK_FRAME_HELLO, .op = SOCK_OP_NONE, .seq = 0, .len = 44},
        {.type = SOCK_FRAME_DATA, .op = SOCK_OP_BCAST, .seq = 0xFFFFFFFFu, .len = UINT64_MAX},
        {.type = SOCK_FRAME_ERROR, .op = SOCK_OP_BARRIER, .seq = 7, .len = 0},
    };
    for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); i++) {
        unsigned char w[SOCK_FRAME_HDR_BYTES];
        struct sock_frame_hdr out;
        sock_frame_put_hdr(w, &in[i]);
        cr_assert_eq(memcmp(w, "RSB1", 4), 0, "the magic leads");
        cr_assert_eq(sock_frame_get_hdr(w, &out), 0);
        cr_assert_eq(out.type, in[i].type);
        cr_assert_eq(out.op, in[i].op);
        cr_assert_eq(out.seq, in[i].seq);
        cr_assert_eq(out.len, in[i].len);
    }
}

Test(sock_frame, header_with_a_bad_magic_does_not_decode)
{
    unsigned char w[SOCK_FRAME_HDR_BYTES];
    struct sock_frame_hdr out;
    sock_frame_put_hdr(w, &gather3);
    w[3] ^= 1;
    cr_assert_eq(sock_frame_get_hdr(w, &out), -1);
}

Test(sock_frame, error_payload_carries_origin_and_status_and_bounds_its_text)
{
    unsigned char buf[8 + SOCK_FRAME_TEXT_MAX];
    char *long_text = malloc(3 * SOCK_FRAME_TEXT_MAX);
    cr_assert_not_null(long_text);
    memset(long_text, 'x', 3 * SOCK_FRAME_TEXT_MAX - 1);
    long_text[3 * SOCK_FRAME_TEXT_MAX - 1] = '\0';
    cr_assert_eq(sock_frame_put_error(buf, 5, RESHARD_ERR_TIMEOUT, "late"), 8 + strlen("late"));
    cr_assert_eq(sock_wire_get(buf, 4), 5);
    cr_assert_eq(sock_wire_get(buf + 4, 4), (uint32_t)RESHARD_ERR_TIMEOUT);
    cr_assert_eq(memcmp(buf + 8, "late", 4), 0);
    cr_assert_eq(sock_frame_put_error(buf, 1, RESHARD_ERR_NETWORK, long_text),
                 8 + SOCK_FRAME_TEXT_MAX);
    free(long_text);
}

Test(sock_frame, op_names_cover_every_collective_and_unknown_ones)
{
    cr_assert_str_eq(sock_frame_op_name(SOCK_OP_NONE), "rendezvous");
    cr_assert_str_eq(sock_frame_op_name(SOCK_OP_ALLGATHER), "allgather");
    cr_assert_str_eq(sock_frame_op_name(SOCK_OP_BCAST), "bcast");
    cr_assert_str_eq(sock_frame_op_name(SOCK_OP_BARRIER), "barrier");
    cr_assert_str_eq(sock_frame_op_name(99), "an unknown collective");
}

/* ---- transfers ---- */

Test(sock_frame, data_frame_of_a_megabyte_arrives_whole)
{
    enum { N = 1 << 20 };
    unsigned char *out = malloc(N), *in = calloc(1, N);
    cr_assert(out && in);
    for (size_t i = 0; i < N; i++)
        out[i] = (unsigned char)(i * 13 + 5);
    struct sock_frame_hdr h = {.type = SOCK_FRAME_DATA, .op = SOCK_OP_BCAST, .seq = 9, .len = N};
    struct sock_xfer x[2];
    int failed = -2;
    /* More than a socket buffer holds: the two ends must take turns. */
    sock_xfer_init(&x[0], sv[1], "rank 0 (test)", 1, h, out);
    sock_xfer_init(&x[1], sv[0], "rank 1 (test)", 0, h, in);
    cr_assert_eq(sock_xfer_run(x, 2, rs_now_ms() + 5000, 5000, "bcast", &failed, NULL), RESHARD_OK,
                 "%s", rs_error_message());
    cr_assert_eq(failed, -1);
    cr_assert(x[0].finished && x[1].finished);
    cr_assert_not(sock_xfer_torn(&x[0]) || sock_xfer_torn(&x[1]));
    cr_assert_eq(x[1].got.len, N);
    cr_assert_eq(memcmp(in, out, N), 0);
    free(out);
    free(in);
}

Test(sock_frame, empty_frame_needs_no_buffer)
{
    struct sock_frame_hdr h = {.type = SOCK_FRAME_DATA, .op = SOCK_OP_BARRIER, .seq = 1, .len = 0};
    peer_sends(&h, NULL, 0);
    cr_assert_eq(receive(h, NULL, NULL), RESHARD_OK, "%s", rs_error_message());
}

Test(sock_frame, bad_magic_is_refused_as_not_a_bootstrap_peer)
{
    static const char junk[SOCK_FRAME_HDR_BYTES] = "GET / HTTP/1.0\r\n\r\n";
    unsigned char data[64] = {0};
    cr_assert_eq(write(sv[1], junk, sizeof(junk)), (ssize_t)sizeof(junk));
    cr_assert_eq(receive(gather3, data, NULL), RESHARD_ERR_NETWORK);
    assert_message_has("rank 1 (test) sent a malformed frame (bad magic)");
}

Test(sock_frame, error_frame_longer_than_its_bound_is_refused)
{
    unsigned char data[64] = {0};
    struct sock_frame_hdr h = {.type = SOCK_FRAME_ERROR, .len = 8 + SOCK_FRAME_TEXT_MAX + 1};
    peer_sends(&h, NULL, 0);
    cr_assert_eq(receive(gather3, data, NULL), RESHARD_ERR_NETWORK);
    assert_message_has("sent a malformed error frame");
}

Test(sock_frame, error_frame_shorter_than_origin_and_status_is_refused)
{
    unsigned char data[64] = {0};
    struct sock_frame_hdr h = {.type = SOCK_FRAME_ERROR, .len = 7};
    peer_sends(&h, "1234567", 7);
    cr_assert_eq(receive(gather3, data, NULL), RESHARD_ERR_NETWORK);
    assert_message_has("sent a malformed error frame");
}

Test(sock_frame, refusal_longer_than_its_bound_is_refused)
{
    unsigned char data[64] = {0};
    struct sock_frame_hdr h = {.type = SOCK_FRAME_REFUSE, .len = 8 + SOCK_FRAME_TEXT_MAX + 1};
    peer_sends(&h, NULL, 0);
    cr_assert_eq(receive(gather3, data, NULL), RESHARD_ERR_NETWORK);
    assert_message_has("sent a malformed refusal frame");
}

Test(sock_frame, data_frame_longer_than_expected_names_both_sizes)
{
    unsigned char data[64] = {0};
    struct sock_frame_hdr h = gather3;
    h.len = 1u << 30;
    peer_sends(&h, NULL, 0);
    cr_assert_eq(receive(gather3, data, NULL), RESHARD_ERR_INVALID_ARG);
    assert_message_has("sent 1073741824 bytes where 64 were expected");
}

Test(sock_frame, rendezvous_frame_of_another_size_suggests_another_version)
{
    unsigned char hello[44];
    struct sock_frame_hdr want = {.type = SOCK_FRAME_HELLO, .len = sizeof(hello)};
    struct sock_frame_hdr h = want;
    h.len = 48;
    peer_sends(&h, NULL, 0);
    cr_assert_eq(receive(want, hello, NULL), RESHARD_ERR_NETWORK);
    assert_message_has("sent a hello of 48 bytes where 44 were expected: another version");
}

Test(sock_frame, collective_out_of_step_is_named)
{
    unsigned char data[64] = {0};
    struct sock_frame_hdr h = gather3;
    h.op = SOCK_OP_BCAST;
    h.seq = 4;
    peer_sends(&h, data, sizeof(data));
    cr_assert_eq(receive(gather3, data, NULL), RESHARD_ERR_INVALID_ARG);
    assert_message_has("is in bcast #4 while this rank is in allgather #3");
}

Test(sock_frame, frame_of_another_type_is_named)
{
    unsigned char data[64] = {0};
    struct sock_frame_hdr h = gather3;
    h.type = SOCK_FRAME_WELCOME;
    peer_sends(&h, NULL, 0);
    cr_assert_eq(receive(gather3, data, NULL), RESHARD_ERR_NETWORK);
    assert_message_has("sent a welcome frame where a data was expected");
}

Test(sock_frame, stream_cut_inside_a_header_is_a_closed_connection)
{
    unsigned char w[SOCK_FRAME_HDR_BYTES], data[64];
    struct sock_xfer x;
    sock_frame_put_hdr(w, &gather3);
    cr_assert_eq(write(sv[1], w, 10), 10);
    sock_close(&sv[1]);
    sock_xfer_init(&x, sv[0], "rank 1 (test)", 0, gather3, data);
    cr_assert_eq(sock_xfer_step(&x, NULL), RESHARD_ERR_NETWORK);
    assert_message_has("rank 1 (test) closed the connection");
    cr_assert_eq(x.hdr_done, 10);
    cr_assert(sock_xfer_torn(&x), "a half-read header leaves the stream unusable");
}

Test(sock_frame, stream_cut_inside_a_payload_is_a_closed_connection)
{
    unsigned char data[64] = {0};
    peer_sends(&gather3, data, 20);
    sock_close(&sv[1]);
    cr_assert_eq(receive(gather3, data, NULL), RESHARD_ERR_NETWORK);
    assert_message_has("closed the connection");
}

Test(sock_frame, error_frame_ends_a_receive_with_what_the_peer_reported)
{
    unsigned char payload[8 + SOCK_FRAME_TEXT_MAX], data[64];
    struct sock_frame_error err = {.origin = -1};
    size_t n = sock_frame_put_error(payload, 2, RESHARD_ERR_BUFFER, "bootstrap: buffer too small");
    struct sock_frame_hdr h = {.type = SOCK_FRAME_ERROR, .len = n};
    peer_sends(&h, payload, n);
    cr_assert_eq(receive(gather3, data, &err), RESHARD_ERR_REMOTE);
    cr_assert_eq(err.origin, 2);
    cr_assert_eq(err.status, RESHARD_ERR_BUFFER);
    cr_assert_str_eq(err.text, "bootstrap: buffer too small");
    /* The leading "bootstrap: " of the quoted message is not said twice. */
    assert_message_has("bootstrap: rank 2 failed (RESHARD_ERR_BUFFER): buffer too small");
}

Test(sock_frame, error_text_of_the_longest_frame_is_cut_to_fit_and_terminated)
{
    unsigned char payload[8 + SOCK_FRAME_TEXT_MAX], data[64];
    char text[SOCK_FRAME_TEXT_MAX + 1];
    struct sock_frame_error err = {.origin = -1};
    memset(text, 'y', SOCK_FRAME_TEXT_MAX);
    text[SOCK_FRAME_TEXT_MAX] = '\0';
    size_t n = sock_frame_put_error(payload, 1, RESHARD_ERR_NETWORK, text);
    struct sock_frame_hdr h = {.type = SOCK_FRAME_ERROR, .len = n};
    peer_sends(&h, payload, n);
    cr_assert_eq(receive(gather3, data, &err), RESHARD_ERR_REMOTE);
    cr_assert_eq(strlen(err.text), SOCK_FRAME_TEXT_MAX - 1);
}

Test(sock_frame, refusal_ends_a_receive_with_its_reason)
{
    unsigned char hello[44];
    static const char why[] = "wrong secret: not part of this job";
    struct sock_frame_hdr want = {.type = SOCK_FRAME_WELCOME};
    struct sock_frame_hdr h = {.type = SOCK_FRAME_REFUSE, .len = sizeof(why) - 1};
    peer_sends(&h, why, sizeof(why) - 1);
    cr_assert_eq(receive(want, hello, NULL), RESHARD_ERR_REFUSED);
    assert_message_has("rank 1 (test) refused this rank: wrong secret: not part of this job");
}

Test(sock_frame, sender_hears_a_failure_report_instead_of_waiting)
{
    enum { N = 8 << 20 }; /* more than the pair buffers: the send cannot finish unread */
    unsigned char payload[8 + SOCK_FRAME_TEXT_MAX], *out = calloc(1, N);
    struct sock_frame_error err = {.origin = -1};
    struct sock_xfer x;
    int failed = -2;
    cr_assert_not_null(out);
    size_t n = sock_frame_put_error(payload, 0, RESHARD_ERR_TIMEOUT, "rank 3 did not arrive");
    struct sock_frame_hdr h = {.type = SOCK_FRAME_ERROR, .len = n};
    peer_sends(&h, payload, n);
    struct sock_frame_hdr big = gather3;
    big.len = N;
    sock_xfer_init(&x, sv[0], "rank 0 (test)", 1, big, out);
    cr_assert_eq(sock_xfer_run(&x, 1, rs_now_ms() + 2000, 2000, "allgather", &failed, &err),
                 RESHARD_ERR_REMOTE, "%s", rs_error_message());
    cr_assert_eq(failed, 0);
    cr_assert_eq(err.origin, 0);
    cr_assert_str_eq(err.text, "rank 3 did not arrive");
    free(out);
}

Test(sock_frame, send_cut_short_leaves_the_stream_torn)
{
    enum { N = 8 << 20 };
    unsigned char *out = calloc(1, N);
    struct sock_xfer x;
    cr_assert_not_null(out);
    struct sock_frame_hdr big = gather3;
    big.len = N;
    sock_xfer_init(&x, sv[0], "rank 0 (test)", 1, big, out);
    cr_assert_eq(sock_xfer_step(&x, NULL), RESHARD_OK, "%s", rs_error_message());
    cr_assert_not(x.finished, "nobody reads: the socket buffer must fill");
    cr_assert_gt(x.hdr_done + x.done, 0);
    cr_assert(sock_xfer_torn(&x));
    free(out);
}

Test(sock_frame, silent_peer_times_out_naming_it_and_the_timeout)
{
    unsigned char data[64] = {0};
    struct sock_xfer x;
    int failed = -2;
    sock_xfer_init(&x, sv[0], "rank 4 (10.0.0.4:1234)", 0, gather3, data);
    int64_t t0 = rs_now_ms();
    cr_assert_eq(sock_xfer_run(&x, 1, t0 + 100, 100, "allgather #3 on rank 0", &failed, NULL),
                 RESHARD_ERR_TIMEOUT);
    int64_t took = rs_now_ms() - t0;
    cr_assert_eq(failed, 0);
    cr_assert(took >= 90 && took < 2000, "gave up after %lld ms", (long long)took);
    assert_message_has(
        "allgather #3 on rank 0: rank 4 (10.0.0.4:1234) did not answer within 100 ms");
}

Test(sock_frame, cancel_flag_ends_a_wait_within_its_poll_interval)
{
    unsigned char data[64] = {0};
    struct sock_xfer x;
    atomic_int cancel = 1;
    int failed = -2;
    sock_xfer_init(&x, sv[0], "rank 1 (test)", 0, gather3, data);
    int64_t t0 = rs_now_ms();
    cr_assert_eq(sock_xfer_run_cancel(&x, 1, t0 + 5000, 5000, "allgather", &cancel, &failed, NULL),
                 RESHARD_ERR_ABORTED);
    cr_assert_lt(rs_now_ms() - t0, 1000);
    cr_assert_eq(failed, 0);
    assert_message_has("allgather: aborted");
}

Test(sock_frame, a_stream_that_is_not_ours_is_refused_at_its_first_wrong_byte)
{
    unsigned char data[64];
    struct sock_xfer x;
    cr_assert_eq(write(sv[1], "R", 1), 1); /* a right first byte: more is awaited */
    sock_xfer_init(&x, sv[0], "rank 1 (test)", 0, gather3, data);
    cr_assert_eq(sock_xfer_step(&x, NULL), RESHARD_OK);
    cr_assert(!x.finished && !x.foreign && x.hdr_done == 1);
    cr_assert_eq(write(sv[1], "X", 1), 1); /* "RX" is no frame's start */
    cr_assert_eq(sock_xfer_step(&x, NULL), RESHARD_ERR_NETWORK);
    cr_assert(x.foreign, "the stream was not taken for a foreign one");
    assert_message_has("bad magic");
}

Test(sock_frame, a_busy_answer_ends_a_receive_with_busy_and_its_text)
{
    static const char text[] = "no room; try again";
    unsigned char data[64];
    struct sock_frame_error err;
    struct sock_frame_hdr busy = {.type = SOCK_FRAME_BUSY, .len = sizeof(text) - 1};
    peer_sends(&busy, text, sizeof(text) - 1);
    cr_assert_eq(receive(gather3, data, &err), RESHARD_ERR_BUSY);
    assert_message_has("rank 1 (test) is busy: no room; try again");
}

Test(sock_frame, a_close_before_any_byte_is_told_from_a_malformed_stream)
{
    unsigned char data[64];
    struct sock_xfer x;
    sock_close(&sv[1]);
    sock_xfer_init(&x, sv[0], "rank 1 (test)", 0, gather3, data);
    cr_assert_eq(sock_xfer_step(&x, NULL), RESHARD_ERR_NETWORK);
    cr_assert(x.eof && !x.foreign && x.hdr_done == 0);
    assert_message_has("closed the connection");
}
