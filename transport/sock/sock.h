/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP for the bootstrap: wrappers that turn errno into a status and a message naming the call
 * and the peer, addresses (IPv4 and IPv6), a connect that retries until a deadline, and the
 * framed messages the bootstrap exchanges, moved over many sockets at once with poll().
 * Every socket here is non-blocking and close-on-exec; every wait ends at a deadline.
 */
#ifndef RS_SOCK_H
#define RS_SOCK_H

#include "base/reshard_status.h"

#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/socket.h>

/* "[ffff:...:ffff%scope]:65535" fits. */
#define SOCK_ADDR_STR 80

union sock_addr {
    struct sockaddr sa;
    struct sockaddr_in in;
    struct sockaddr_in6 in6;
};

/* "1 s", "1.5 s" or "250 ms": for messages about timeouts. */
const char *sock_ms_str(int ms, char *buf, size_t n);

/* msg without its leading "bootstrap: ", to quote one message inside another. */
const char *sock_msg_body(const char *msg);

socklen_t sock_addr_len(const union sock_addr *a);
int sock_addr_port(const union sock_addr *a);
void sock_addr_set_port(union sock_addr *a, int port);
/* "10.0.0.1:29500" or "[fd00::2]:29500". */
const char *sock_addr_str(const union sock_addr *a, char *buf, size_t n);
/* host is a name or a numeric address; an IPv4 result is preferred when the name has both,
 * so that every rank resolving the same name lands on the same family. */
reshard_status_t sock_resolve(const char *host, int port, union sock_addr *out);
/* The first non-loopback IPv4 address of an interface that is up, else 127.0.0.1. */
reshard_status_t sock_default_addr(union sock_addr *out);

/* socket + SO_REUSEADDR + bind + listen; the port actually bound is written back into a. */
reshard_status_t sock_listen(union sock_addr *a, int *fd);
/* One pending connection, or *fd = -1 when none is waiting. */
reshard_status_t sock_accept(int lfd, int *fd, union sock_addr *peer);
/* Connects to who ("rank 0") at a, retrying with backoff while its listener is not up yet,
 * until deadline_ms. One that never answers fails with RESHARD_ERR_TIMEOUT naming the
 * address and timeout_ms. */
reshard_status_t sock_connect(const union sock_addr *a, const char *who, int64_t deadline_ms,
                              int timeout_ms, int *fd);
/* The same without waiting, for callers that must never block (the NCCL plugin): starts a
 * connection, then sock_connect_check says whether it is up (*done), failed, or still on. */
reshard_status_t sock_connect_start(const union sock_addr *a, int *fd);
reshard_status_t sock_connect_check(int fd, const char *who, int *done);
void sock_close(int *fd);
/* poll() until an event or deadline_ms (*ready = 0 then), polling again after EINTR. */
reshard_status_t sock_poll(struct pollfd *p, int n, int64_t deadline_ms, int *ready);

/* ---- frames: a 24-byte header {magic, type, op, seq, length} and a payload ---- */

#define FRAME_HDR_BYTES 24
#define FRAME_TEXT_MAX  1024 /* longest text (refusal or error) a frame may carry */

enum frame_type {
    FRAME_HELLO = 1, /* peer -> rank 0: version, secret, rank, size */
    FRAME_WELCOME,   /* rank 0 -> peer: every rank arrived */
    FRAME_REFUSE,    /* rank 0 -> peer: why it is not admitted (text) */
    FRAME_DATA,      /* a collective's payload */
    FRAME_ERROR,     /* a rank failed: origin rank, status, text */
};

/* Which collective a data frame belongs to, so that ranks calling different ones in the same
 * turn are told so instead of exchanging misread bytes. */
enum frame_op { OP_NONE, OP_ALLGATHER, OP_BCAST, OP_BARRIER };

/* "allgather", "bcast", ...: for messages. */
const char *frame_op_name(unsigned op);

struct frame_hdr {
    uint16_t type, op;
    uint32_t seq;
    uint64_t len;
};

/* What an ERROR frame said. */
struct frame_error {
    int origin;
    reshard_status_t status;
    char text[FRAME_TEXT_MAX];
};

/* One frame to send or to receive on one socket. A receive expects hdr (type, op, seq and
 * length); an ERROR or REFUSE arriving instead ends it with RESHARD_ERR_REMOTE or
 * RESHARD_ERR_REFUSED. */
struct xfer {
    int fd;
    const char *peer; /* "rank 3 (10.0.0.1:4242)", for messages */
    int send;
    int listen; /* a send hears a failure report coming the other way (set by xfer_init);
                 * clear it where the stream in may hold unread bytes */
    struct frame_hdr hdr;
    void *data; /* payload of hdr.len bytes */
    /* progress */
    unsigned char wire[FRAME_HDR_BYTES];
    size_t hdr_done, done;
    int finished;
    struct frame_hdr got;                   /* a receive: the header that came, once it is in */
    unsigned char text[8 + FRAME_TEXT_MAX]; /* a received ERROR or REFUSE payload */
};

void xfer_init(struct xfer *x, int fd, const char *peer, int send, struct frame_hdr hdr,
               void *data);
/* True when the stream is left in the middle of a frame, so nothing more may go on it. */
int xfer_torn(const struct xfer *x);
/* Moves x forward as far as the socket allows now, without waiting. On RESHARD_ERR_REMOTE,
 * err (if not NULL) holds what the peer reported. */
reshard_status_t xfer_step(struct xfer *x, struct frame_error *err);
/* Moves all n transfers until they finish, one fails (*failed = its index) or deadline_ms
 * passes (*failed = the first unfinished one; the message names every unfinished peer and
 * says timeout_ms). what ("allgather") goes into messages. */
reshard_status_t xfer_run(struct xfer *x, int n, int64_t deadline_ms, int timeout_ms,
                          const char *what, int *failed, struct frame_error *err);
/* The same, ending with RESHARD_ERR_ABORTED within CANCEL_POLL_MS once *cancel is non-zero. */
#define CANCEL_POLL_MS 20
reshard_status_t xfer_run_cancel(struct xfer *x, int n, int64_t deadline_ms, int timeout_ms,
                                 const char *what, const atomic_int *cancel, int *failed,
                                 struct frame_error *err);

/* Big-endian integers of 1 to 8 bytes, for everything that goes on the wire or in an id. */
void wire_put(unsigned char *w, uint64_t v, int bytes);
uint64_t wire_get(const unsigned char *w, int bytes);
/* Header and ERROR payload codecs, for the few places that build frames by hand. */
void frame_put_hdr(unsigned char *w, const struct frame_hdr *h);
int frame_get_hdr(const unsigned char *w, struct frame_hdr *h); /* -1: bad magic */
/* An ERROR payload: origin (4), status (4), text. Returns its length; buf holds 8+TEXT_MAX. */
size_t frame_put_error(unsigned char *buf, int origin, reshard_status_t st, const char *text);

#endif
