/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The messages of a local pair (exec_link.c), and their decoders, which take nothing a peer
 * sent on trust: every count, index and length is checked against what this rank expects from
 * its own plan before anything is stored, so a peer can make the refit fail but never make
 * this rank allocate, index or map what its plan does not say.
 *
 * A receiver's announcement, to each local peer that writes into it:
 *   exec_ann_hdr, then addr[nent] (the receiver's buffer of each entry, in the pair's entry
 *   order), then nexp CUDA IPC exports (each naming its tensor), nexp <= the DST entries.
 * A writer's message, to each local peer it writes: exec_writer_msg.
 */
#ifndef RS_EXEC_LINK_H
#define RS_EXEC_LINK_H

#include "exec_int.h"

#include <stddef.h>
#include <stdint.h>

#define EXEC_ANN_MAGIC    UINT32_C(0x52534131) /* "RSA1" */
#define EXEC_WRITER_MAGIC UINT32_C(0x52535731) /* "RSW1" */

struct exec_ann_hdr {
    uint32_t magic, seq;
    uint64_t hash;
    uint32_t nent, nexp;
};

struct exec_writer_msg {
    uint32_t magic, seq;
    uint64_t hash;
    uint32_t cuda, pad; /* cuda: 1 when the writer writes device destinations through CUDA IPC */
};

/* What a writer expects of one receiver's announcement. */
struct exec_ann_want {
    int peer;    /* the receiver, for messages */
    int32_t pid; /* its process, as the communicator knows it: descriptors come from there */
    uint32_t seq;
    uint64_t hash;
    uint32_t nent;
    const struct exec_entry *ent; /* the pair's entries, ascending (tensor, buf) */
};

/* The largest announcement of nent entries (all of them exported). */
size_t exec_ann_max_bytes(uint32_t nent);
/* Checks and stores a receiver's announcement of len bytes: addr[nent]; for each entry,
 * has[i] and exp[i] when the receiver exported it. Fails naming the peer and what is wrong. */
reshard_status_t exec_ann_decode(const void *msg, size_t len, const struct exec_ann_want *w,
                                 uint64_t *addr, struct cuda_ipc_export *exp, uint8_t *has);
/* The same for a writer's message: *cuda on success. */
reshard_status_t exec_writer_decode(const void *msg, size_t len, int peer, uint32_t seq,
                                    uint64_t hash, uint8_t *cuda);

#endif
