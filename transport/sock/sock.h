/* SPDX-License-Identifier: Apache-2.0 */
/*
 * TCP sockets: wrappers that turn errno into a status and a message naming the call and the
 * peer, addresses (IPv4 and IPv6), a connect that retries until a deadline, and poll() bounded
 * by a deadline. Every socket here is non-blocking and close-on-exec; every wait ends at a
 * deadline. The framed messages the bootstrap moves over them are in sock_frame.h.
 */
#ifndef RS_SOCK_H
#define RS_SOCK_H

#include "base/reshard_status.h"

#include <netinet/in.h>
#include <poll.h>
#include <stddef.h>
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

/* socket + bind + listen (SO_REUSEADDR for a given port, not for 0: any); the port actually
 * bound is written back into a. */
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
/* The address fd is bound to: 0, or -1 with errno. */
int sock_local_addr(int fd, union sock_addr *a);
/* Looks at what waits on fd without taking it or waiting: the bytes copied (at most n), 0 when
 * the peer closed its end, -1 when nothing waits (or the socket failed: the next read says). */
int sock_peek(int fd, void *buf, size_t n);

/* ---- deadlines ---- */

/* poll() until an event or deadline_ms (*ready = 0 then), polling again after EINTR. */
reshard_status_t sock_poll(struct pollfd *p, int n, int64_t deadline_ms, int *ready);

/* ---- integers on the wire ---- */

/* Big-endian integers of 1 to 8 bytes, for everything that goes on the wire or in an id. */
void sock_wire_put(unsigned char *w, uint64_t v, int bytes);
uint64_t sock_wire_get(const unsigned char *w, int bytes);

#endif
