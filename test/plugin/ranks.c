/* SPDX-License-Identifier: Apache-2.0 */
#include "ranks.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static struct outcome *shared_outcomes(void)
{
    static struct outcome *o;
    if (!o) {
        o = mmap(NULL, sizeof(*o) * MAX_RANKS, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                 -1, 0);
        cr_assert_neq(o, MAP_FAILED);
    }
    memset(o, 0, sizeof(*o) * MAX_RANKS);
    return o;
}

void (*rank_setup)(int rank);

/* Runs fn on `size` forked ranks of one communicator; returns each rank's outcome. Rank
 * `stalls` may stop itself: it is killed once the others are done. */
struct outcome *run_ranks_stalling(int size, rank_fn fn, int stalls)
{
    cr_assert(size >= 1 && size <= MAX_RANKS);
    struct outcome *out = shared_outcomes();
    reshard_unique_id_t id;
    cr_assert_eq(reshard_get_unique_id(&id), RESHARD_OK, "%s", reshard_last_error());
    pid_t pid[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        if ((pid[r] = fork()) == 0) {
            if (rank_setup)
                rank_setup(r);
            reshard_comm_t *comm = NULL;
            reshard_status_t st = reshard_comm_init_rank(&id, r, size, &comm);
            if (st == RESHARD_OK)
                st = fn(r, size, comm);
            out[r].status = st;
            snprintf(out[r].msg, sizeof(out[r].msg), "%s", reshard_last_error());
            if (comm && st == RESHARD_OK)
                reshard_comm_destroy(comm);
            _exit(0);
        }
    }
    int crashed = -1, sig = 0;
    for (int r = 0; r < size; r++) {
        int ws;
        if (r == stalls)
            continue;
        waitpid(pid[r], &ws, 0);
        /* A rank ends with _exit(0): anything else crashed it (ASan exits with 1, and its
         * outcome would otherwise read as RESHARD_OK). */
        if ((!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) && crashed < 0) {
            crashed = r;
            sig = WIFSIGNALED(ws) ? WTERMSIG(ws) : -WEXITSTATUS(ws);
        }
    }
    if (stalls >= 0) { /* before any assertion: a stopped rank must not outlive the test */
        kill(pid[stalls], SIGKILL);
        waitpid(pid[stalls], NULL, 0);
    }
    cr_assert_eq(crashed, -1, "rank %d crashed (%s %d)", crashed,
                 sig > 0 ? "signal" : "exit status", sig > 0 ? sig : -sig);
    return out;
}

struct outcome *run_ranks(int size, rank_fn fn)
{
    return run_ranks_stalling(size, fn, -1);
}

void all_ok(const struct outcome *o, int n)
{
    for (int r = 0; r < n; r++)
        cr_assert_eq(o[r].status, RESHARD_OK, "rank %d: %s", r, o[r].msg);
}
