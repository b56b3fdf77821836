/* SPDX-License-Identifier: Apache-2.0 */
/*
 * boot_scale: the bootstrap alone (no transport), N local processes. The parent makes an id and
 * forks N ranks; each forms the bootstrap, then runs what a communicator's forming runs over it
 * (an allreduce of 4 bytes, an allgather of --record bytes a rank: the hello and an address)
 * and a barrier. Printed: the creation time (from the first fork until the last rank is
 * formed), the most bootstrap sockets any rank holds once formed (counted in /proc/self/fd,
 * and as the bootstrap counts them), and the bytes sent and received forming the tree and in
 * the collectives at rank 0 and at the busiest rank. Exit 0 when every rank formed and every
 * allgather came out right, else 1.
 *
 *   boot_scale N [--record BYTES] [--timeout S] [--preload]
 *
 * RESHARD_BOOT_FANOUT sets the fan-out. --preload loads libcrypto in the parent before it forks,
 * as a launcher that forks its ranks from one process does; without it every rank loads it
 * itself, as ranks that a launcher execs do (here, 1,024 processes doing so on 2 cores is most
 * of the creation time).
 */
#include "base/error.h"
#include "transport/boot/bootstrap.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct scale_rank {
    int status, ok, fds, sockets, children, depth, tree_height;
    double formed_ms; /* since the first fork */
    uint64_t form_sent, form_received, coll_sent, coll_received;
    char msg[200];
};

static double mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

/* Open descriptors of this process. */
static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own */
}

static unsigned char pattern(int rank, size_t i)
{
    return (unsigned char)(rank * 131 + i * 7 + 3);
}

static void max_u32(void *acc, const void *in, void *arg)
{
    (void)arg;
    uint32_t a, b;
    memcpy(&a, acc, 4);
    memcpy(&b, in, 4);
    if (b > a)
        memcpy(acc, &b, 4);
}

/* One rank, in a child: its outcome into out. */
static void scale_rank(const struct boot_id *id, int rank, int n, size_t record, int timeout_ms,
                       double t0, struct scale_rank *out)
{
    struct boot *b = NULL;
    struct boot_stats s;
    if (rank != 0)
        boot_id_release(id);              /* the listener inherited from the parent is rank 0's */
    int base = count_fds() - (rank == 0); /* rank 0's listener is the bootstrap's own */
    reshard_status_t st = boot_init(id, rank, n, timeout_ms, &b);
    out->formed_ms = mono_ms() - t0;
    if (st == RESHARD_OK) {
        out->fds = count_fds() - base;
        boot_stats(b, &s);
        out->sockets = s.sockets;
        out->children = s.children;
        out->depth = s.depth;
        out->tree_height = s.tree_height;
        out->form_sent = s.form_sent;
        out->form_received = s.form_received;
    }
    unsigned char *all = st == RESHARD_OK ? calloc((size_t)n, record) : NULL;
    if (st == RESHARD_OK && !all)
        st = RESHARD_ERR_NO_MEMORY;
    uint32_t longest = (uint32_t)(rank % 97);
    if (st == RESHARD_OK)
        st = boot_allreduce(b, &longest, sizeof(longest), max_u32, NULL);
    for (size_t i = 0; all && i < record; i++)
        all[(size_t)rank * record + i] = pattern(rank, i);
    if (st == RESHARD_OK)
        st = boot_allgather(b, all, record);
    int ok = st == RESHARD_OK && longest == (uint32_t)(n - 1 < 96 ? n - 1 : 96);
    for (int q = 0; ok && q < n; q++)
        for (size_t i = 0; i < record; i++)
            ok &= all[(size_t)q * record + i] == pattern(q, i);
    if (st == RESHARD_OK)
        boot_bytes(b, &out->coll_sent, &out->coll_received);
    if (st == RESHARD_OK)
        st = boot_barrier(b); /* nobody leaves while another still talks to it */
    out->status = st;
    out->ok = ok;
    snprintf(out->msg, sizeof(out->msg), "%s", st == RESHARD_OK ? "" : rs_error_message());
    free(all);
    boot_close(b);
}

static int usage(const char *argv0, int rc)
{
    fprintf(rc ? stderr : stdout,
            "usage: %s N [--record BYTES] [--timeout S] [--preload]\n"
            "  forms the bootstrap on N local processes and reports its cost\n",
            argv0);
    return rc;
}

int main(int argc, char **argv)
{
    int n = 0, timeout_s = 120, preload = 0;
    size_t record = 48 + 256; /* a communicator hello: 48 bytes and a transport address */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return usage(argv[0], 0);
        if (!strcmp(argv[i], "--record") && i + 1 < argc)
            record = (size_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--timeout") && i + 1 < argc)
            timeout_s = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--preload"))
            preload = 1;
        else if (!n)
            n = atoi(argv[i]);
        else
            return usage(argv[0], 2);
    }
    if (n < 1 || n > 65536 || record < 1 || timeout_s < 1)
        return usage(argv[0], 2);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max; /* rank 0's door and children; nothing near N */
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    struct scale_rank *r = mmap(NULL, sizeof(*r) * (size_t)n, PROT_READ | PROT_WRITE,
                                MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    pid_t *pid = calloc((size_t)n, sizeof(*pid));
    struct boot_id id;
    if (r == MAP_FAILED || !pid) {
        fprintf(stderr, "boot_scale: out of memory for %d ranks\n", n);
        return 1;
    }
    if (boot_id_create(&id) != RESHARD_OK) {
        fprintf(stderr, "boot_scale: %s\n", rs_error_message());
        return 1;
    }
    struct boot_id warm; /* any MAC loads libcrypto: deriving a secret makes one */
    if (preload && boot_id_from_addr("127.0.0.1", 9, "preload", &warm) != RESHARD_OK) {
        fprintf(stderr, "boot_scale: %s\n", rs_error_message());
        return 1;
    }
    double t0 = mono_ms();
    int forked = 0;
    for (; forked < n; forked++) {
        if ((pid[forked] = fork()) < 0) {
            fprintf(stderr, "boot_scale: fork of rank %d: %s\n", forked, strerror(errno));
            break;
        }
        if (pid[forked] == 0) {
            scale_rank(&id, forked, n, record, timeout_s * 1000, t0, &r[forked]);
            _exit(0);
        }
    }
    boot_id_release(&id);
    int crashed = 0;
    for (int i = 0; i < forked; i++) {
        int ws = 0;
        waitpid(pid[i], &ws, 0);
        crashed += !WIFEXITED(ws);
    }
    if (forked < n) {
        fprintf(stderr, "boot_scale: only %d of %d ranks started\n", forked, n);
        return 1;
    }
    double created = 0;
    int failed = 0, most_fds = 0, most_sockets = 0, busiest = 0, height = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].status != RESHARD_OK || !r[i].ok) {
            if (failed++ < 5)
                fprintf(stderr, "boot_scale: rank %d: %s%s\n", i, r[i].msg,
                        r[i].ok ? "" : " (wrong data)");
            continue;
        }
        created = r[i].formed_ms > created ? r[i].formed_ms : created;
        most_fds = r[i].fds > most_fds ? r[i].fds : most_fds;
        most_sockets = r[i].sockets > most_sockets ? r[i].sockets : most_sockets;
        height = r[i].tree_height;
        uint64_t mine = r[i].form_sent + r[i].form_received + r[i].coll_sent + r[i].coll_received;
        uint64_t top = r[busiest].form_sent + r[busiest].form_received + r[busiest].coll_sent +
                       r[busiest].coll_received;
        busiest = mine > top ? i : busiest;
    }
    printf("ranks                %d\n", n);
    printf("rank0_children       %d (tree height %d)\n", r[0].children, height);
    printf("creation_s           %.2f\n", created / 1e3);
    printf("max_sockets_formed   %d (as the bootstrap counts them: %d)\n", most_fds, most_sockets);
    printf("record_bytes         %zu\n", record);
    for (int k = 0; k < 2; k++) {
        const struct scale_rank *x = &r[k ? busiest : 0];
        printf("rank %-5d %s  forming: sent %llu received %llu; allreduce + allgather: sent %llu "
               "received %llu\n",
               k ? busiest : 0, k ? "(busiest)" : "         ", (unsigned long long)x->form_sent,
               (unsigned long long)x->form_received, (unsigned long long)x->coll_sent,
               (unsigned long long)x->coll_received);
    }
    const struct scale_rank *z = &r[0], *y = &r[busiest];
    printf("bytes_rank0          %llu %llu\n", (unsigned long long)(z->form_sent + z->coll_sent),
           (unsigned long long)(z->form_received + z->coll_received));
    printf("bytes_busiest        %d %llu %llu\n", busiest,
           (unsigned long long)(y->form_sent + y->coll_sent),
           (unsigned long long)(y->form_received + y->coll_received));
    printf("result               %s\n", failed || crashed ? "FAILED" : "ok");
    if (crashed)
        fprintf(stderr, "boot_scale: %d ranks crashed\n", crashed);
    return failed || crashed ? 1 : 0;
}
