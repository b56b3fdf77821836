/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator in a process forked from its rank (issue 27, finding 2, the collective's
 * side): the child may not use it (its UCX context, connections and bootstrap are the
 * parent's), says so, and destroying it there leaves the parent's job untouched.
 */
#include "ranks.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The child's findings, as its exit status: 0 when every use was refused with the message. */
static int child_uses(reshard_comm_t *comm)
{
    if (reshard_comm_barrier(comm) == RESHARD_OK)
        return 1;
    if (!strstr(reshard_last_error(), "was forked from it"))
        return 2;
    char buf[8 * MAX_RANKS] = {0};
    if (reshard_comm_allgather(comm, buf, 8) == RESHARD_OK)
        return 3;
    reshard_comm_abort(comm); /* must not reach the parent's peers */
    reshard_comm_destroy(comm);
    return 0;
}

/* Each rank forks a child that tries its communicator; then the ranks go on with theirs. */
static reshard_status_t fork_then_go_on(int rank, int size, reshard_comm_t *comm)
{
    (void)rank;
    pid_t child = fork();
    if (child < 0)
        return RESHARD_ERR_INTERNAL;
    if (child == 0)
        _exit(child_uses(comm));
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status))
        return RESHARD_ERR_INTERNAL;
    reshard_status_t st = reshard_comm_barrier(comm);
    unsigned char buf[8 * MAX_RANKS] = {0};
    memset(buf + 8 * rank, rank + 1, 8);
    if (st == RESHARD_OK)
        st = reshard_comm_allgather(comm, buf, 8);
    for (int r = 0; st == RESHARD_OK && r < size; r++)
        if (buf[8 * r] != r + 1)
            st = RESHARD_ERR_INTERNAL;
    return st;
}

static void set_env(void)
{
    setenv("RESHARD_TIMEOUT", "20", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

/* Before: the child's barrier and allgather talked to the parent's peers over the parent's
 * bootstrap sockets (and its destroy closed the parent's UCX worker), so the job went wrong
 * for everyone. Now each use is refused naming both processes, and the ranks go on. */
Test(comm_fork, a_child_forked_from_a_rank_cannot_use_its_communicator_and_the_job_goes_on,
     .init = set_env, .timeout = 120)
{
    struct outcome *o = run_ranks(2, fork_then_go_on);
    all_ok(o, 2);
}
