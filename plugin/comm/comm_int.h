/* SPDX-License-Identifier: Apache-2.0 */
/* What the communicator's life (comm.c) lends its shrink (comm_shrink.c), and the hello every
 * rank sends when a communicator forms (comm_hello.c). */
#ifndef RS_COMM_INT_H
#define RS_COMM_INT_H

#include "comm.h"
#include "comm_local.h"

#include <stddef.h>
#include <stdint.h>

/* A communicator of `size` ranks, every one a member until the caller says otherwise; NULL
 * when out of memory. */
struct reshard_comm *comm_alloc(int rank, int size, int local_rank);
/* With the bootstrap up: the network context, then the exchange that forms the communicator
 * (its topology from the hellos, or parent's when not NULL). kept: the communicator whose
 * network context c shares (a growth's members), whose members are its peers already; NULL:
 * a new context. */
reshard_status_t comm_join(struct reshard_comm *c, const struct rs_topo *parent,
                           const struct reshard_comm *kept);
/* The parts of comm_join a growth (comm_grow.c) runs in its own order. */
/* A network context of c's own, or kept's, shared (one more reference). */
reshard_status_t comm_net_open(struct reshard_comm *c, const struct reshard_comm *kept);
/* Where each member's bootstrap listener is (c->spares, c->spare): the local path's names. */
reshard_status_t comm_spares(struct reshard_comm *c);
/* boot_combine_fn: the larger of two uint32_t. */
void comm_max_u32(void *acc, const void *in, void *arg);

/* ---- the hello (comm_hello.c) ---- */

#define COMM_ADDR_MAX 4096
/* On the wire (BE): host key 8, domain 4, pid 4, address length 4, transport 8, local token
 * 16, zero 4; then the transport address, in a slot as long as the longest of any rank. */
#define COMM_HELLO_BYTES 48
/* A record: the hello and an address slot of `slot` bytes, rounded up to 8. */
#define COMM_HELLO_REC(slot) (COMM_HELLO_BYTES + ((size_t)(slot) + 7) / 8 * 8)

/* What every rank tells the others when the communicator forms: what the topology needs (a key
 * of its hostname, its RESHARD_DOMAIN), what the local path needs (its pid, and a random token
 * that only the job's members see), and its transport and address. */
struct comm_hello {
    uint64_t host;  /* comm_host_key of its hostname */
    int32_t domain; /* RESHARD_DOMAIN, or -1 */
    uint32_t addr_len;
    char transport[8];             /* NUL-terminated: every rank must run the same one */
    struct comm_local_hello local; /* pid and token: believed only once verified */
};

/* A 64-bit key of a hostname (FNV-1a): ranks with equal keys share a host. */
uint64_t comm_host_key(const char *name);
void comm_hello_put(unsigned char *w, const struct comm_hello *h);
/* The allgathered records (size of them, rec bytes each: COMM_HELLO_BYTES and an address slot)
 * into h[] for every rank with present[r] set, each checked before use: an address longer than
 * its slot, a transport name that is not one, a domain below -1, or a transport other than the
 * first present rank's fail naming the rank. addr[r] then points into all. */
/* This rank's hello (comm_local_open opens its local socket) and its transport address into
 * addr (*len: its room, then its length). */
reshard_status_t comm_my_hello(struct reshard_comm *c, struct comm_hello *me, unsigned char *addr,
                               size_t *len);
/* Forms c from every member's record (all: size records of rec bytes, an absent rank's zeros),
 * each checked (comm_hello_decode): the transport's peers (but kept's members, which a kept
 * context knows), the topology (parent's, or from the hellos), the local peers' verification;
 * then c keeps all (c->hellos) for a later growth. Takes all, whatever it returns. */
reshard_status_t comm_form(struct reshard_comm *c, const struct rs_topo *parent,
                           const struct reshard_comm *kept, unsigned char *all, size_t rec);
reshard_status_t comm_hello_decode(const unsigned char *all, size_t rec, int size,
                                   const unsigned char *present, struct comm_hello *h,
                                   const unsigned char **addr);

#endif
