/* SPDX-License-Identifier: Apache-2.0 */
/*
 * join_bench: what a join costs the first member (rank 0). W local processes form a
 * communicator; J more join it past the size (reshard_comm_grow on the members,
 * reshard_comm_join on the joiners, the joiners waiting for the join id before the members
 * start). Rank 0 prints how long its reshard_comm_grow took and the bytes it sent and received
 * for it: over the old bootstrap (the members' vote on the list), forming the new bootstrap (the
 * rendezvous it hosts), and in the new bootstrap's collectives (the membership and the hellos
 * with the transport addresses). Connections of the transport and the local peers'
 * verification are not counted. Exit 0 when every process joined and a barrier on the grown
 * communicator passed.
 *
 *   join_bench W [J]        (J: 2 by default; RESHARD_DOMAIN_SIZE=4 unless set)
 */
#include "plugin/comm/comm.h"
#include "plugin/reshard.h"
#include "transport/boot/bootstrap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define JOIN_MAX 1024

struct shared {
    volatile int ready;
    reshard_unique_id_t jid;
    double grow_ms;
    uint64_t vote, form, coll; /* rank 0's bytes, sent and received */
    int failed;
    char msg[256];
};

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static void failed(struct shared *sh, const char *who, int rank)
{
    if (!__sync_lock_test_and_set(&sh->failed, 1))
        snprintf(sh->msg, sizeof(sh->msg), "%s %d: %s", who, rank, reshard_last_error());
}

static uint64_t boot_total(const struct boot *b)
{
    uint64_t out = 0, in = 0;
    boot_bytes(b, &out, &in);
    return out + in;
}

static void member(struct shared *sh, const reshard_unique_id_t *id, int rank, int w,
                   const int *joiners, int j)
{
    reshard_comm_t *c = NULL, *g = NULL;
    if (reshard_comm_init_rank(id, rank, w, &c) != RESHARD_OK)
        return failed(sh, "member", rank);
    if (rank == 0) {
        if (reshard_comm_grow_id(c, joiners, j, &sh->jid) != RESHARD_OK)
            return failed(sh, "grow id on member", rank);
        __sync_synchronize();
        sh->ready = 1;
    }
    if (reshard_comm_barrier(c) != RESHARD_OK) /* every member is ready */
        return failed(sh, "barrier on member", rank);
    uint64_t vote0 = boot_total(c->boot);
    double t0 = now_ms();
    if (reshard_comm_grow(c, joiners, j, &g) != RESHARD_OK)
        return failed(sh, "grow on member", rank);
    if (rank == 0) {
        struct boot_stats s;
        boot_stats(g->boot, &s);
        sh->grow_ms = now_ms() - t0;
        sh->vote = boot_total(c->boot) - vote0;
        sh->form = s.form_sent + s.form_received;
        sh->coll = boot_total(g->boot);
    }
    if (reshard_comm_barrier(g) != RESHARD_OK)
        return failed(sh, "barrier on the grown comm, member", rank);
    reshard_comm_destroy(c);
    reshard_comm_destroy(g);
}

static void joiner(struct shared *sh, int rank, const int *joiners, int j)
{
    reshard_comm_t *g = NULL;
    while (!sh->ready)
        usleep(1000);
    if (reshard_comm_join(&sh->jid, rank, joiners, j, &g) != RESHARD_OK)
        return failed(sh, "joiner", rank);
    if (reshard_comm_barrier(g) != RESHARD_OK)
        return failed(sh, "barrier on the grown comm, joiner", rank);
    reshard_comm_destroy(g);
}

int main(int argc, char **argv)
{
    int w = argc > 1 ? atoi(argv[1]) : 0, j = argc > 2 ? atoi(argv[2]) : 2;
    if (w < 1 || j < 1 || w + j > JOIN_MAX) {
        fprintf(stderr, "usage: join_bench W [J]   (W >= 1, J >= 1, W + J <= %d)\n", JOIN_MAX);
        return 2;
    }
    setenv("RESHARD_DOMAIN_SIZE",
           getenv("RESHARD_DOMAIN_SIZE") ? getenv("RESHARD_DOMAIN_SIZE") : "4", 1);
    setenv("UCX_LOG_LEVEL", getenv("UCX_LOG_LEVEL") ? getenv("UCX_LOG_LEVEL") : "error", 1);
    struct shared *sh =
        mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    memset(sh, 0, sizeof(*sh));
    int joiners[JOIN_MAX];
    for (int i = 0; i < j; i++)
        joiners[i] = w + i;
    reshard_unique_id_t id;
    if (reshard_get_unique_id(&id) != RESHARD_OK) {
        fprintf(stderr, "join_bench: %s\n", reshard_last_error());
        return 1;
    }
    pid_t *pid = calloc((size_t)(w + j), sizeof(pid_t));
    if (!pid)
        return 1;
    for (int r = 0; r < w + j; r++)
        if ((pid[r] = fork()) == 0) {
            if (r < w)
                member(sh, &id, r, w, joiners, j);
            else
                joiner(sh, r, joiners, j);
            _exit(0);
        }
    int crashed = 0;
    for (int r = 0; r < w + j; r++) {
        int ws;
        waitpid(pid[r], &ws, 0);
        crashed += !WIFEXITED(ws) || WEXITSTATUS(ws) != 0;
    }
    free(pid);
    if (sh->failed || crashed) {
        fprintf(stderr, "join_bench: %s (%d processes crashed)\n", sh->msg, crashed);
        return 1;
    }
    printf("world %d joiners %d rank0_grow_ms %.1f rank0_vote_bytes %llu rank0_form_bytes %llu "
           "rank0_coll_bytes %llu rank0_total_bytes %llu\n",
           w, j, sh->grow_ms, (unsigned long long)sh->vote, (unsigned long long)sh->form,
           (unsigned long long)sh->coll, (unsigned long long)(sh->vote + sh->form + sh->coll));
    return 0;
}
