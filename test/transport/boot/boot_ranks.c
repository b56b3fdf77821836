/* SPDX-License-Identifier: Apache-2.0 */
/* Ranks of a bootstrap for the tests (boot_ranks.h). */
#include "boot_ranks.h"

#include "base/param.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A port that nobody listens on, held until the test's process ends: the socket bound to it
 * never listens, so that a connect to it is refused until the bootstrap listens there too
 * (SO_REUSEADDR on both lets it). IPv4 ports are bound on every address, as rank 0 binds them:
 * one bound on 127.0.0.1 alone may be a port that a listener on another address of the host
 * uses (UCX's and the NCCL plugin's listen on the interfaces' addresses, at ports of the
 * kernel's pick), where rank 0's bind then fails. It keeps away every bind without
 * SO_REUSEADDR and the kernel's picks (bind to port 0, connect), but not a bind of that port
 * number with SO_REUSEADDR: such a socket may listen there first, and the bootstrap's bind then
 * fails (private_loopback_port says who does that). IPv6: the loopback itself, whose presence
 * is what the IPv6 test asks. */
int hold_port(int family, int port)
{
    struct sockaddr_in6 a6 = {.sin6_family = AF_INET6,
                              .sin6_port = htons((uint16_t)port),
                              .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    struct sockaddr_in a4 = {.sin_family = AF_INET,
                             .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_ANY)};
    struct sockaddr *a = family == AF_INET6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4;
    socklen_t len = family == AF_INET6 ? sizeof(a6) : sizeof(a4);
    int one = 1, fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 || bind(fd, a, len) != 0 ||
        getsockname(fd, a, &len) != 0) {
        close(fd);
        return -1;
    }
    return ntohs(family == AF_INET6 ? a6.sin6_port : a4.sin_port);
}

int held_port(int family)
{
    return hold_port(family, 0);
}

int held_loopback_port(void)
{
    int port = held_port(AF_INET);
    cr_assert_gt(port, 0, "no loopback port to hold: %m");
    return port;
}

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    close(fd);
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

int private_net(void)
{
    static int made; /* criterion runs each test in a process of its own */
    if (made)
        return 0;
    if (unshare(CLONE_NEWNET) != 0) { /* not root: a user namespace of our own first */
        char map[64];
        unsigned uid = (unsigned)getuid(), gid = (unsigned)getgid();
        if (errno != EPERM || unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0)
            return -1;
        snprintf(map, sizeof(map), "0 %u 1", uid);
        if (write_file("/proc/thread-self/uid_map", map) != 0 ||
            write_file("/proc/thread-self/setgroups", "deny") != 0)
            return -1;
        snprintf(map, sizeof(map), "0 %u 1", gid);
        if (write_file("/proc/thread-self/gid_map", map) != 0)
            return -1;
    }
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
    int ok = s >= 0 && ioctl(s, SIOCGIFFLAGS, &ifr) == 0 &&
             (ifr.ifr_flags |= IFF_UP, ioctl(s, SIOCSIFFLAGS, &ifr) == 0);
    if (s >= 0)
        close(s);
    made = ok;
    return ok ? 0 : -1;
}

int private_loopback_port(void)
{
    if (private_net() != 0)
        fprintf(stderr, "boot tests: no network namespace of our own (%m): the held port is shared "
                        "with every program on this host\n");
    return held_loopback_port();
}

/* The tunables the bootstrap reads, back to their defaults whatever the test's environment. */
void clear_boot_params(void)
{
    unsetenv("RESHARD_BOOT_ADDR");
    unsetenv("RESHARD_BOOT_PORT");
    unsetenv("RESHARD_SECRET");
    rs_param_reload();
}

void loopback_id(int port, const char *secret, struct boot_id *id)
{
    cr_assert_eq(boot_id_from_addr("127.0.0.1", port, secret, id), RESHARD_OK, "%s",
                 rs_error_message());
}

void listening_id(struct boot_id *id)
{
    setenv("RESHARD_BOOT_ADDR", "127.0.0.1", 1);
    rs_param_reload();
    cr_assert_eq(boot_id_create(id), RESHARD_OK, "%s", rs_error_message());
}

void same_place_id(const struct boot_id *id, const char *secret, struct boot_id *out)
{
    char addr[80];
    boot_id_addr(id, addr, sizeof(addr));
    loopback_id(atoi(strrchr(addr, ':') + 1), secret, out);
}

unsigned char pattern(int rank, size_t i)
{
    return (unsigned char)(rank * 31 + i * 7 + 1);
}

/* An allreduce's fold: [0] summed, [1] the largest. */
static void sum_and_max(void *acc, const void *in, void *arg)
{
    (void)arg;
    uint64_t a[2], x[2];
    memcpy(a, acc, sizeof(a));
    memcpy(x, in, sizeof(x));
    a[0] += x[0];
    a[1] = x[1] > a[1] ? x[1] : a[1];
    memcpy(acc, a, sizeof(a));
}

int collectives(struct rank_run *r)
{
    enum { SLOT = 16 };
    unsigned char all[64 * SLOT], word[8];
    for (size_t i = 0; i < SLOT; i++)
        all[r->rank * SLOT + i] = pattern(r->rank, i);
    if ((r->st = boot_allgather(r->b, all, SLOT)) != RESHARD_OK)
        return 0;
    int ok = 1;
    for (int q = 0; q < r->size; q++)
        for (size_t i = 0; i < SLOT; i++)
            ok &= all[q * SLOT + i] == pattern(q, i);
    for (int root = r->size - 1; root >= 0; root--) {
        memset(word, r->rank == root ? 0xA0 + root : 0, sizeof(word));
        if ((r->st = boot_bcast(r->b, word, sizeof(word), root)) != RESHARD_OK)
            return 0;
        for (size_t i = 0; i < sizeof(word); i++)
            ok &= word[i] == 0xA0 + root;
    }
    /* Every rank's rank summed, and the largest, folded by the tree. */
    uint64_t acc[2] = {(uint64_t)r->rank, (uint64_t)r->rank};
    if ((r->st = boot_allreduce(r->b, acc, sizeof(acc), sum_and_max, NULL)) != RESHARD_OK)
        return 0;
    ok &= acc[0] == (uint64_t)r->size * (uint64_t)(r->size - 1) / 2 &&
          acc[1] == (uint64_t)r->size - 1;
    if ((r->st = boot_barrier(r->b)) != RESHARD_OK)
        return 0;
    return ok && boot_rank(r->b) == r->rank && boot_size(r->b) == r->size;
}

int allgather_slots(struct rank_run *r)
{
    unsigned char *all = malloc(r->bytes * (size_t)r->size);
    if (!all)
        return 0;
    for (size_t i = 0; i < r->bytes; i++)
        all[(size_t)r->rank * r->bytes + i] = pattern(r->rank, i);
    int ok = (r->st = boot_allgather(r->b, all, r->bytes)) == RESHARD_OK;
    for (int q = 0; ok && q < r->size; q++)
        for (size_t i = 0; i < r->bytes; i++)
            ok &= all[(size_t)q * r->bytes + i] == pattern(q, i);
    free(all);
    return ok;
}

void do_work(struct rank_run *r)
{
    int64_t t0 = now_ms();
    switch (r->work) {
    case WORK_NONE:
        r->data_ok = 1;
        break;
    case WORK_COLLECTIVES:
        r->data_ok = collectives(r);
        break;
    case WORK_ALLGATHER:
        r->data_ok = allgather_slots(r);
        break;
    case WORK_ABORT:
        boot_abort(r->b, RESHARD_ERR_BUFFER, "buffer too small");
        break;
    case WORK_LEAVE:
        boot_close(r->b);
        r->b = NULL;
        break;
    }
    r->ms = now_ms() - t0;
}

void *rank_main(void *arg)
{
    struct rank_run *r = arg;
    int64_t t0 = now_ms();
    rs_error_clear();
    r->st = boot_init(&r->id, r->rank, r->size, r->timeout_ms, &r->b);
    r->ms = r->init_ms = now_ms() - t0;
    if (r->st == RESHARD_OK)
        do_work(r);
    snprintf(r->msg, sizeof(r->msg), "%s", rs_error_message());
    if (r->done)
        sem_post(r->done);
    return NULL;
}

void prep(struct rank_run *r, const struct boot_id *id, int rank, int size, int timeout_ms,
          enum work work)
{
    memset(r, 0, sizeof(*r));
    r->id = *id;
    r->rank = rank;
    r->size = size;
    r->timeout_ms = timeout_ms;
    r->work = work;
}

void launch(struct rank_run *r)
{
    cr_assert_eq(pthread_create(&r->thread, NULL, rank_main, r), 0);
}

void start(struct rank_run *r, const struct boot_id *id, int rank, int size, int timeout_ms,
           enum work work)
{
    prep(r, id, rank, size, timeout_ms, work);
    launch(r);
}

void *work_main(void *arg)
{
    struct rank_run *r = arg;
    do_work(r);
    snprintf(r->msg, sizeof(r->msg), "%s", rs_error_message());
    return NULL;
}

/* Every rank of r (already joined) runs `work` on its open bootstrap, in its own thread. */
void work_all(struct rank_run *r, int n, enum work work)
{
    for (int i = 0; i < n; i++) {
        r[i].work = work;
        cr_assert_eq(pthread_create(&r[i].thread, NULL, work_main, &r[i]), 0);
    }
}

void finish(struct rank_run *r)
{
    pthread_join(r->thread, NULL);
}

void finish_all(struct rank_run *r, int n)
{
    for (int i = 0; i < n; i++)
        finish(&r[i]);
}

void close_all(struct rank_run *r, int n)
{
    for (int i = 0; i < n; i++)
        boot_close(r[i].b);
}

void assert_all_ok(struct rank_run *r, int n)
{
    for (int i = 0; i < n; i++) {
        cr_assert_eq(r[i].st, RESHARD_OK, "rank %d: %s: %s", r[i].rank, rs_status_name(r[i].st),
                     r[i].msg);
        cr_assert(r[i].data_ok, "rank %d saw wrong data", r[i].rank);
    }
}

/* n ranks of id run the collectives together; every one must succeed with the right data. */
void run_job_ok(const struct boot_id *id, int n)
{
    struct rank_run *r = calloc((size_t)n, sizeof(*r));
    cr_assert_not_null(r);
    for (int i = 0; i < n; i++)
        start(&r[i], id, i, n, 20000, WORK_COLLECTIVES);
    finish_all(r, n);
    assert_all_ok(r, n);
    close_all(r, n);
    free(r);
}

/* Every warning logged (base/log's sink), one a line. */
static pthread_mutex_t warned_lock = PTHREAD_MUTEX_INITIALIZER;
char warned[4 * RS_ERROR_MAX];

void capture_warning(enum rs_log_level level, unsigned long flags, const char *msg)
{
    (void)flags;
    if (level != RS_LOG_WARN)
        return;
    pthread_mutex_lock(&warned_lock);
    size_t used = strlen(warned);
    snprintf(warned + used, sizeof(warned) - used, "%s\n", msg);
    pthread_mutex_unlock(&warned_lock);
}

/* A plain TCP connection to where id's rank 0 listens (127.0.0.1 here). */
int raw_connect(const struct boot_id *id)
{
    char addr[80];
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    boot_id_addr(id, addr, sizeof(addr));
    a.sin_port = htons((uint16_t)atoi(strrchr(addr, ':') + 1));
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    return fd;
}

void clear_launcher_env(void)
{
    static const char *const names[] = {"MASTER_ADDR",
                                        "MASTER_PORT",
                                        "RANK",
                                        "WORLD_SIZE",
                                        "LOCAL_RANK",
                                        "LOCAL_WORLD_SIZE",
                                        "TORCHELASTIC_RUN_ID",
                                        "OMPI_COMM_WORLD_RANK",
                                        "OMPI_COMM_WORLD_SIZE",
                                        "OMPI_COMM_WORLD_LOCAL_RANK",
                                        "OMPI_COMM_WORLD_LOCAL_SIZE",
                                        "OMPI_MCA_orte_ess_jobid",
                                        "PMIX_NAMESPACE",
                                        "SLURM_PROCID",
                                        "SLURM_NTASKS",
                                        "SLURM_LOCALID",
                                        "SLURM_NTASKS_PER_NODE",
                                        "SLURM_STEP_TASKS_PER_NODE",
                                        "SLURM_STEP_NODELIST",
                                        "SLURM_JOB_NODELIST",
                                        "SLURM_JOB_ID",
                                        "SLURM_STEP_ID"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        unsetenv(names[i]);
}

void set_torchrun(const char *run_id)
{
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29400", 1);
    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "4", 1);
    setenv("TORCHELASTIC_RUN_ID", run_id, 1);
}
