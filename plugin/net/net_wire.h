/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The handshake's messages on the wire (docs/protocols.md section 2), big-endian: what the
 * connector sends (hello, its transport address, an acknowledgement of the reply), and what the
 * listener answers. Every decoder takes the length of what it reads and checks every field
 * before anything is used or allocated.
 */
#ifndef RS_NET_WIRE_H
#define RS_NET_WIRE_H

#include "base/reshard_status.h"

#include <stddef.h>
#include <stdint.h>

#define NET_WIRE_VERSION 3
#define NET_HELLO_MAGIC  0x52534c4fu /* RSLO */
#define NET_REPLY_MAGIC  0x52535250u /* RSRP */
#define NET_HELLO_BYTES  20
#define NET_REPLY_BYTES  16
#define NET_MAX_ADDR     4096 /* a transport address longer than this is refused */
/* The connector's last byte: it has the reply and made its comm, so the listener may hand
 * its own to NCCL. A connector that gave up closes instead, and the listener drops it. */
#define NET_ACK 'A'

enum net_reply_status {
    NET_REPLY_OK = 0,
    NET_REPLY_UNKNOWN_NONCE = 1, /* a handle from another job, or from a closed listen comm */
    NET_REPLY_VERSION = 2,       /* another magic or version */
    NET_REPLY_FAILED = 3,        /* the listener could not make the connection (its log says) */
};

/* What a listener makes of a hello's header. */
enum net_hello_verdict {
    NET_HELLO_OK,
    NET_HELLO_FOREIGN,     /* not a Reshard connector of this version */
    NET_HELLO_NONCE,       /* a handle this listener did not issue */
    NET_HELLO_BAD_ADDRESS, /* an address length of 0 or past NET_MAX_ADDR */
};

/* The hello's header for a handle's nonce and an address of addr_len bytes (w: 20 bytes). */
void net_wire_hello(unsigned char *w, uint64_t nonce, size_t addr_len);
/* Checks the n bytes of a header at w (n < 20 is NET_HELLO_FOREIGN) against the listener's
 * nonce; *addr_len is the address that follows, set only for NET_HELLO_OK. */
enum net_hello_verdict net_wire_hello_check(const unsigned char *w, size_t n, uint64_t nonce,
                                            size_t *addr_len);

/* The reply's header (w: 16 bytes). */
void net_wire_reply(unsigned char *w, enum net_reply_status st, uint32_t id, size_t addr_len);
/* Checks the n bytes of a reply's header at w from the listener `peer`: RESHARD_OK with the
 * receive comm's id and the length of the address that follows, or an error saying what the
 * listener answered or sent instead. */
reshard_status_t net_wire_reply_check(const unsigned char *w, size_t n, const char *peer,
                                      uint32_t *id, size_t *addr_len);

#endif
