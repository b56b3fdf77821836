/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stand-ins for libnccl.so.2 and libcuda.so.1, built as shared objects for tests that run the
 * NCCL paths across forked ranks on a host without a GPU: "device memory" is host memory, and
 * NCCL's collectives go through a shared mapping the test makes before forking.
 */
#ifndef RS_FAKE_NCCL_H
#define RS_FAKE_NCCL_H

#include <stdatomic.h>
#include <stddef.h>

#define FAKE_RANKS 8
#define FAKE_QUEUE 4096

struct fake_shared {
    atomic_int arrived, sense; /* a sense-reversing barrier over size ranks */
    int size;
    unsigned char gather[FAKE_RANKS * 4096];
    struct fake_msg {
        size_t off, len;
    } q[FAKE_RANKS][FAKE_RANKS][FAKE_QUEUE]; /* [src][dst]: what src sent dst, in order */
    int head[FAKE_RANKS][FAKE_RANKS], tail[FAKE_RANKS][FAKE_RANKS];
    atomic_size_t used;
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
