/* SPDX-License-Identifier: Apache-2.0 */
/* Running a function on forked ranks of one communicator, from a Criterion test. */
#ifndef RS_TEST_RANKS_H
#define RS_TEST_RANKS_H

#include "plugin/reshard.h"

#define MAX_RANKS 8

/* What a rank reports to the test process: its status and message. */
struct outcome {
    int status;
    char msg[256];
};

typedef reshard_status_t (*rank_fn)(int rank, int size, reshard_comm_t *comm);

/* Runs fn on `size` forked ranks of one communicator (made from a fresh unique id); returns
 * each rank's outcome. Rank `stalls` (or -1) may stop itself: it is killed once the others
 * are done. Asserts that no other rank crashed. */
struct outcome *run_ranks_stalling(int size, rank_fn fn, int stalls);
/* If set, each forked rank calls it before making the communicator (per-rank environment). */
extern void (*rank_setup)(int rank);
struct outcome *run_ranks(int size, rank_fn fn);
/* Asserts that each of the n outcomes is RESHARD_OK, naming the first rank that is not. */
void all_ok(const struct outcome *o, int n);

#endif
