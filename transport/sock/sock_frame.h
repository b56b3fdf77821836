/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bootstrap's framed messages: a 24-byte header {magic, type, op, seq, length} and a
 * payload, their codec, and their transfer (struct sock_xfer), moved over many non-blocking
 * sockets at once with poll() until a deadline. A receive that meets a failure report or a
 * refusal instead of the frame it waits for ends with that peer's message.
 */
#ifndef RS_SOCK_FRAME_H
#define RS_SOCK_FRAME_H

#include "base/reshard_status.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define SOCK_FRAME_HDR_BYTES 24
#define SOCK_FRAME_TEXT_MAX  1024 /* longest text (refusal or error) a frame may carry */

enum sock_frame_type {
    SOCK_FRAME_HELLO = 1, /* joiner -> listener: who it is, a nonce, and its MAC (boot_admit.c) */
    SOCK_FRAME_WELCOME,   /* parent -> child: the tree is whole; every rank's listener */
    SOCK_FRAME_REFUSE,    /* listener -> joiner: why it is not admitted (text) */
    SOCK_FRAME_DATA,      /* a collective's payload */
    SOCK_FRAME_ERROR,     /* a rank failed: origin rank, status, text */
    SOCK_FRAME_CHALLENGE, /* listener -> joiner, answering OPEN: its version, a nonce */
    SOCK_FRAME_ADMIT,     /* listener -> joiner: its place in the tree, and the listener's MAC */
    SOCK_FRAME_READY,     /* child -> parent: the ranks of its subtree, all joined */
    SOCK_FRAME_BUSY,      /* listener -> joiner: no room now, try again (text) */
    SOCK_FRAME_OPEN,      /* joiner -> listener, first thing on a connection: its version */
};

/* Which collective a data frame belongs to, so that ranks calling different ones in the same
 * turn are told so instead of exchanging misread bytes. */
enum sock_frame_op {
    SOCK_OP_NONE,
    SOCK_OP_ALLGATHER,
    SOCK_OP_BCAST,
    SOCK_OP_BARRIER,
    SOCK_OP_ALLREDUCE,
    SOCK_OP_PUSH /* boot_push_joiners: the members' data down to the joiners */
};

/* "allgather", "bcast", ...: for messages. */
const char *sock_frame_op_name(unsigned op);

struct sock_frame_hdr {
    uint16_t type, op;
    uint32_t seq;
    uint64_t len;
};

/* What an ERROR frame said. */
struct sock_frame_error {
    int origin;
    reshard_status_t status;
    char text[SOCK_FRAME_TEXT_MAX];
};

/* Header and ERROR payload codecs, for the few places that build frames by hand. */
void sock_frame_put_hdr(unsigned char *w, const struct sock_frame_hdr *h);
int sock_frame_get_hdr(const unsigned char *w, struct sock_frame_hdr *h); /* -1: bad magic */
/* An ERROR payload: origin (4), status (4), text. Returns its length; buf holds 8+TEXT_MAX. */
size_t sock_frame_put_error(unsigned char *buf, int origin, reshard_status_t st, const char *text);

/* One frame to send or to receive on one socket. A receive expects hdr (type, op, seq and
 * length); an ERROR, REFUSE or BUSY arriving instead ends it with RESHARD_ERR_REMOTE,
 * RESHARD_ERR_REFUSED or RESHARD_ERR_BUSY. A stream whose first bytes are not a frame's magic
 * fails as soon as they differ. */
struct sock_xfer {
    int fd;
    const char *peer; /* "rank 3 (10.0.0.1:4242)", for messages */
    int send;
    int listen; /* a send hears a failure report coming the other way (set by sock_xfer_init);
                 * clear it where the stream in may hold unread bytes */
    struct sock_frame_hdr hdr;
    void *data; /* payload of hdr.len bytes */
    /* progress */
    unsigned char wire[SOCK_FRAME_HDR_BYTES];
    size_t hdr_done, done;
    int finished;
    struct sock_frame_hdr got; /* a receive: the header that came, once it is in */
    int eof;                   /* a receive: the peer closed the stream (a failure) */
    int foreign;               /* a receive: bytes came that are not a frame (a failure) */
    unsigned char text[8 + SOCK_FRAME_TEXT_MAX]; /* a received ERROR or REFUSE payload */
};

void sock_xfer_init(struct sock_xfer *x, int fd, const char *peer, int send,
                    struct sock_frame_hdr hdr, void *data);
/* True when the stream is left in the middle of a frame, so nothing more may go on it. */
int sock_xfer_torn(const struct sock_xfer *x);
/* Moves x forward as far as the socket allows now, without waiting. On RESHARD_ERR_REMOTE,
 * err (if not NULL) holds what the peer reported. */
reshard_status_t sock_xfer_step(struct sock_xfer *x, struct sock_frame_error *err);
/* Moves all n transfers until they finish, one fails (*failed = its index) or deadline_ms
 * passes (*failed = the first unfinished one; the message names every unfinished peer and
 * says timeout_ms). what ("allgather") goes into messages. */
reshard_status_t sock_xfer_run(struct sock_xfer *x, int n, int64_t deadline_ms, int timeout_ms,
                               const char *what, int *failed, struct sock_frame_error *err);
/* The same, ending with RESHARD_ERR_ABORTED within SOCK_CANCEL_POLL_MS once *cancel is
 * non-zero. */
#define SOCK_CANCEL_POLL_MS 20
reshard_status_t sock_xfer_run_cancel(struct sock_xfer *x, int n, int64_t deadline_ms,
                                      int timeout_ms, const char *what, const atomic_int *cancel,
                                      int *failed, struct sock_frame_error *err);

#endif
