/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stand-ins for libnccl.so.2 and libcuda.so.1, built as shared objects for tests that run the
 * NCCL paths across forked ranks on a host without a GPU: "device memory" is host memory, and
 * NCCL's collectives go through a shared mapping the test makes before forking, or one that
 * ncclCommInitRank maps from the file its unique id names (programs that form their own
 * communicator, such as nccl_net_check).
 */
#ifndef RS_FAKE_NCCL_H
#define RS_FAKE_NCCL_H

#include <stdatomic.h>
#include <stddef.h>

#define FAKE_RANKS 8
#define FAKE_QUEUE 4096 /* messages in flight per ordered pair (a ring) */
#define FAKE_MAX_OPS                                                                               \
    2048                       /* sends and receives in one group on one rank: NCCL 2.9-2.11's     \
                                  NCCL_MAX_OPS work entries per channel and launch */
#define FAKE_COLL    (1 << 20) /* bytes each rank may bring to a collective */
#define FAKE_REGIONS 16384     /* messages in the arena at once */

struct fake_shared {
    atomic_int arrived, sense; /* a sense-reversing barrier over size ranks */
    int size;
    atomic_int joined;     /* ranks that mapped it (ncclCommInitRank) */
    atomic_int arena_lock; /* over used and the regions */
    unsigned rhead, rtail; /* the arena's messages, oldest first (mod FAKE_REGIONS) */
    struct fake_region {
        size_t off, len;
        int taken; /* its receiver copied it out: the space may be used again */
    } regions[FAKE_REGIONS];
    unsigned char coll[FAKE_RANKS][FAKE_COLL]; /* each rank's part of a collective */
    struct fake_msg {
        size_t off, len;
        unsigned region;                     /* its entry in regions */
    } q[FAKE_RANKS][FAKE_RANKS][FAKE_QUEUE]; /* [src][dst]: what src sent dst, in order */
    int head[FAKE_RANKS][FAKE_RANKS], tail[FAKE_RANKS][FAKE_RANKS]; /* q's index mod FAKE_QUEUE */
    atomic_size_t used;     /* where the newest message in the arena ends */
    int groups[FAKE_RANKS]; /* non-empty groups each rank ended */
    int ops[FAKE_RANKS];    /* sends and receives each rank posted */
    unsigned char arena[32 << 20];
};

/* What the test passes as ncclComm_t. */
struct fake_nccl_comm {
    int rank, size;
    struct fake_shared *sh;
};

#endif
