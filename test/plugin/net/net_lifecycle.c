/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The conformance driver's cases for the plugin's life around a process (issue 27, findings 2,
 * 4 and 5, and the truncated receive): a fork while contexts and connections are live, a
 * finalize while a connect is still under way, a connector that knows the nonce but sends a
 * transport address that is garbage, and a message larger than the receive posted for it.
 * Each prints "ok <step>" lines, or FAIL.
 */
#include "net_driver.h"

#include <dirent.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define FORK_MSG (1 << 20)

/* n bytes from sc to rc with pattern seed, checked. */
static int message(const char *step, void *sc, void *rc, size_t n, int tag, uint64_t seed)
{
    unsigned char *s = malloc(n), *r = calloc(1, n);
    CHECK(step, s && r, "no memory");
    fill(s, n, seed);
    void *sreq = NULL, *rreq = NULL, *data = r;
    int got[MAX_RECVS_WANTED] = {-1};
    int res = -1;
    if (d_irecv(rc, 1, &data, &n, &tag, NULL, &rreq) == ncclSuccess &&
        d_isend(sc, s, n, tag, NULL, &sreq) == ncclSuccess &&
        wait_req(sreq, NULL, 60) == ncclSuccess && wait_req(rreq, got, 60) == ncclSuccess &&
        got[0] == (int)n && !mismatch(r, n, seed))
        res = 0;
    else
        fail(step, "%zu bytes did not arrive intact (last WARN: %s)", n, last_warn);
    free(s);
    free(r);
    return res;
}

/* ---- fork ---- */

/* What the child found, as its exit status. */
enum { CHILD_CONNECTED = 0, CHILD_NO_DEVICE = 10, CHILD_FAILED = 1 };

/* The child of a fork: the parent's comms (ics) are refused, never used; its own init either
 * offers no device, saying why (UCX cannot start again in a child forked after it started, so
 * NCCL would use another network), or (a transport that can) connects to the parent's
 * listener (handle h) and sends FORK_MSG bytes. */
static void fork_child(unsigned char *h, void *const *ics, int nics)
{
    void *ctx = NULL, *sc = NULL, *mh = NULL, *req = NULL;
    unsigned char *buf = malloc(FORK_MSG);
    int rc = CHILD_FAILED, ndev = -1;
    if (!buf)
        goto out;
    fill(buf, FORK_MSG, 77);
    if (nics && (d_close_send(ics[0]) == ncclSuccess || d_close_recv(ics[1]) == ncclSuccess)) {
        fail("fork child", "closing the parent's comms succeeded in the child");
        goto out;
    }
    if (nics)
        ok("the child's closeSend and closeRecv of the parent's comms are refused");
    if (d_init(&ctx) != ncclSuccess || d_devices(&ndev) != ncclSuccess) {
        fail("fork child", "init failed (last WARN: %s)", last_warn);
        goto out;
    }
    if (ndev == 0) {
        if (!strstr(last_warn, "cannot start again in a forked child")) {
            fail("fork child", "no device, and the WARN does not say why: %s", last_warn);
            goto out;
        }
        printf("ok the forked child offers no device and says why: %s\n", last_warn);
        rc = d_finalize(ctx) == ncclSuccess ? CHILD_NO_DEVICE : CHILD_FAILED;
        goto out;
    }
    double end = now_s() + 60;
    while (!sc && now_s() < end)
        if (d_connect(ctx, 0, h, &sc) != ncclSuccess) {
            fail("fork child", "connect failed (last WARN: %s)", last_warn);
            goto out;
        }
    if (!sc) {
        fail("fork child", "no connection to the parent's listener within 60 s");
        goto out;
    }
    if (d_reg(sc, buf, FORK_MSG, NCCL_PTR_HOST, &mh) != ncclSuccess ||
        d_isend(sc, buf, FORK_MSG, 9, mh, &req) != ncclSuccess ||
        wait_req(req, NULL, 60) != ncclSuccess) {
        fail("fork child", "isend of %d bytes failed (last WARN: %s)", FORK_MSG, last_warn);
        goto out;
    }
    if (d_dereg(sc, mh) != ncclSuccess || d_close_send(sc) != ncclSuccess ||
        d_finalize(ctx) != ncclSuccess) {
        fail("fork child", "close failed (last WARN: %s)", last_warn);
        goto out;
    }
    rc = CHILD_CONNECTED;
out:
    free(buf);
    fflush(stdout);
    exit(failures ? CHILD_FAILED : rc); /* exit: the plugin's atexit hooks run in the child */
}

/* The child's message on crc, once it connected. */
static int child_message(void *crc)
{
    unsigned char *buf = calloc(1, FORK_MSG);
    CHECK("fork", buf, "no memory");
    void *data = buf, *req = NULL;
    size_t size = FORK_MSG;
    int tag = 9, got[MAX_RECVS_WANTED] = {-1};
    NCCL_OK("irecv from the child", d_irecv(crc, 1, &data, &size, &tag, NULL, &req));
    NCCL_OK("the child's message", wait_req(req, got, 60));
    CHECK("the child's message", got[0] == FORK_MSG && !mismatch(buf, FORK_MSG, 77),
          "%d bytes, byte %zu differs", got[0], mismatch(buf, FORK_MSG, 77));
    free(buf);
    ok("the forked child connected to the parent's listener and its message arrived intact");
    NCCL_OK("closeRecv", d_close_recv(crc)); /* while the child lives: the close flushes */
    return 0;
}

/* The parent's side while the child runs: its connection made before the fork (sc, rc) carries
 * a message, and its listener lc2 takes the child's connection if the child makes one; then,
 * the child reaped, both still work (lc2 for a connector of the parent's own). */
static int fork_parent(void *ctx, pid_t child, void *lc2, unsigned char *h2, void *sc, void *rc)
{
    if (sc && message("message while the child runs", sc, rc, 4096, 3, 3))
        return -1;
    int status = 0, done = 0;
    double end = now_s() + 120;
    while (!done) {
        void *crc = NULL;
        NCCL_OK("accept while the child runs", d_accept(lc2, &crc));
        if (crc && child_message(crc))
            return -1;
        pid_t w = waitpid(child, &status, WNOHANG);
        CHECK("fork", w >= 0, "waitpid: %s", strerror(errno));
        done = w == child;
        CHECK("fork", done || now_s() < end, "the child did not end within 120 s");
        if (!done)
            usleep(1000);
    }
    CHECK("fork",
          WIFEXITED(status) &&
              (WEXITSTATUS(status) == CHILD_CONNECTED || WEXITSTATUS(status) == CHILD_NO_DEVICE),
          "the child ended with status %#x (signal %d)", status,
          WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    ok("the child exited cleanly");
    if (sc) {
        if (message("message after the child exited", sc, rc, FORK_MSG, 4, 4))
            return -1;
        ok("the parent's connection made before the fork still works");
        NCCL_OK("closeSend", d_close_send(sc));
        NCCL_OK("closeRecv", d_close_recv(rc));
    }
    void *psc = NULL, *prc = NULL;
    end = now_s() + 60;
    while (!psc || !prc) {
        if (!psc)
            NCCL_OK("connect to the listener after the fork", d_connect(ctx, 0, h2, &psc));
        if (!prc)
            NCCL_OK("accept after the fork", d_accept(lc2, &prc));
        CHECK("connect", now_s() < end, "no connection within 60 s");
    }
    if (message("message on a connection made after the fork", psc, prc, FORK_MSG, 5, 5))
        return -1;
    ok("the parent's listener from before the fork still takes connections");
    NCCL_OK("closeSend", d_close_send(psc));
    NCCL_OK("closeRecv", d_close_recv(prc));
    return 0;
}

/* Parent: a listener and, when live, a connection with a message on it; fork; the child inits
 * and tries to connect to the parent's listener. Before the fix both processes aborted in UCX
 * (tcp_iface.c:307, ucp_worker.c:394) or hung. */
static int fork_case(void *ctx, int live)
{
    unsigned char h1[NCCL_NET_HANDLE_MAXSIZE], h2[NCCL_NET_HANDLE_MAXSIZE];
    void *lc1 = NULL, *sc = NULL, *rc = NULL, *lc2 = NULL;
    if (live) {
        if (pair(ctx, &lc1, &sc, &rc, h1))
            return -1;
        if (message("message before the fork", sc, rc, FORK_MSG, 2, 2))
            return -1;
    }
    memset(h2, 0, sizeof(h2));
    NCCL_OK("listen", d_listen(ctx, 0, h2, &lc2));
    unsigned char child_h[NCCL_NET_HANDLE_MAXSIZE];
    memcpy(child_h, h2, sizeof(child_h)); /* the child's copy; the parent connects with h2 */
    fflush(stdout);
    void *ics[2] = {sc, rc};
    pid_t child = fork();
    CHECK("fork", child >= 0, "fork: %s", strerror(errno));
    if (child == 0)
        fork_child(child_h, ics, live ? 2 : 0);
    if (fork_parent(ctx, child, lc2, h2, sc, rc))
        return -1;
    NCCL_OK("closeListen", d_close_listen(lc2));
    if (lc1)
        NCCL_OK("closeListen", d_close_listen(lc1));
    return 0;
}

int case_fork_live(void *ctx)
{
    return fork_case(ctx, 1);
}

int case_fork_listener(void *ctx)
{
    return fork_case(ctx, 0);
}

/* ---- finalize with work in flight ---- */

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* One cycle: listen on context A, connect from context B (in progress), finalize B, accept
 * on A, close the listener, finalize A. */
static int finalize_cycle(void)
{
    void *a = NULL, *b = NULL, *lc = NULL, *sc = NULL, *rc = NULL;
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE] = {0};
    NCCL_OK("init A", d_init(&a));
    NCCL_OK("init B", d_init(&b));
    NCCL_OK("listen on A", d_listen(a, 0, h, &lc));
    NCCL_OK("connect from B", d_connect(b, 0, h, &sc));
    CHECK("connect from B", !sc, "connected at once; the cycle needs a connect under way");
    NCCL_OK("finalize B", d_finalize(b));
    for (int i = 0; i < 20 && !rc; i++) {
        NCCL_OK("accept on A", d_accept(lc, &rc));
        usleep(1000);
    }
    if (rc)
        NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    NCCL_OK("finalize A", d_finalize(a));
    return 0;
}

/* Before the fix the process gained 1.2 to 1.6 descriptors a cycle. v8 to v10 have no
 * finalize, so the case is v11 and v12's. */
int case_finalize_in_flight(void *ctx)
{
    (void)ctx;
    if (version < 11) {
        ok("finalize with a connect under way: no finalize before v11");
        return 0;
    }
    const int cycles = 200;
    if (finalize_cycle() || finalize_cycle()) /* warm-up: what the first ones make stays */
        return -1;
    int before = count_fds();
    for (int i = 0; i < cycles; i++)
        if (finalize_cycle())
            return -1;
    int after = count_fds();
    printf("ok finalize with a connect under way: %d descriptors before %d cycles, %d after\n",
           before, cycles, after);
    CHECK("finalize with a connect under way", after - before <= 4,
          "%d descriptors gained over %d cycles", after - before, cycles);
    ok("no descriptor leaked by finalize with a connect under way");
    return 0;
}

/* ---- a connector that knows the nonce and sends a garbage address ---- */

/* The listener's address, at offset 16 of the handle, and its nonce at 8 (protocols.md 2). */
static socklen_t handle_addr(const unsigned char *h, struct sockaddr_storage *a)
{
    memcpy(a, h + 16, sizeof(struct sockaddr_in6));
    return a->ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
}

static void put_be(unsigned char *w, uint64_t v, int n)
{
    for (int i = n - 1; i >= 0; i--, v >>= 8)
        w[i] = (unsigned char)v;
}

/* Sends hello {magic, version, the handle's nonce, n} and n bytes of addr; returns the
 * listener's reply status (-1: none came). Accept runs on lc meanwhile and must not fail. */
static int stranger_hello(void *lc, const unsigned char *h, const unsigned char *addr, size_t n)
{
    struct sockaddr_storage a;
    socklen_t len = handle_addr(h, &a);
    int fd = socket(a.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK("stranger", fd >= 0 && connect(fd, (struct sockaddr *)&a, len) == 0, "connect: %s",
          strerror(errno));
    unsigned char hello[20];
    uint64_t nonce;
    memcpy(&nonce, h + 8, sizeof(nonce));
    put_be(hello, 0x52534c4fu, 4);
    put_be(hello + 4, 3, 4);
    put_be(hello + 8, nonce, 8);
    put_be(hello + 16, n, 4);
    CHECK("stranger", send(fd, hello, sizeof(hello), MSG_NOSIGNAL) == (ssize_t)sizeof(hello),
          "send: %s", strerror(errno));
    CHECK("stranger", send(fd, addr, n, MSG_NOSIGNAL) == (ssize_t)n, "send: %s", strerror(errno));
    unsigned char reply[16];
    size_t got = 0;
    double end = now_s() + 30;
    while (got < sizeof(reply) && now_s() < end) {
        void *rc = NULL;
        NCCL_OK("accept while a stranger sends a garbage address", d_accept(lc, &rc));
        CHECK("accept", !rc, "accept handed out a receive comm for the stranger");
        ssize_t r = recv(fd, reply + got, sizeof(reply) - got, MSG_DONTWAIT);
        if (r > 0)
            got += (size_t)r;
        else if (r == 0)
            break;
    }
    close(fd);
    if (got < sizeof(reply))
        return -1;
    return (int)((uint32_t)reply[4] << 24 | (uint32_t)reply[5] << 16 | (uint32_t)reply[6] << 8 |
                 reply[7]);
}

/* Before: accept returned "UCX: rank 0's address is not a reshard UCX address of this
 * version", which NCCL takes as fatal. Now the connection is refused and dropped, and the
 * listener goes on: the real connector gets through. */
int case_garbage_address(void *ctx)
{
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE] = {0}, addr[4096];
    void *lc = NULL, *sc = NULL, *rc = NULL;
    NCCL_OK("listen", d_listen(ctx, 0, h, &lc));
    CHECK("random", getrandom(addr, sizeof(addr), 0) == (ssize_t)sizeof(addr), "getrandom");
    int st = stranger_hello(lc, h, addr, sizeof(addr));
    if (failures)
        return -1;
    CHECK("garbage address", st > 0, "the listener answered status %d (0: accepted, -1: none)", st);
    printf("ok a hello with the nonce and a 4096-byte random address is refused (status %d)\n", st);
    /* The same garbage behind this version's trailer (magic, peer number 0), its first byte
     * naming an address version UCX does not know: UCX aborted the process on it. */
    const uint32_t trailer[2] = {0x55435849u, 0};
    memcpy(addr + sizeof(addr) - sizeof(trailer), trailer, sizeof(trailer));
    addr[0] = 0x0e;
    st = stranger_hello(lc, h, addr, sizeof(addr));
    if (failures)
        return -1;
    CHECK("forged trailer", st > 0, "the listener answered status %d", st);
    printf("ok a random address behind a valid trailer is refused (status %d)\n", st);
    double end = now_s() + 60;
    while (!sc || !rc) {
        if (!sc)
            NCCL_OK("connect", d_connect(ctx, 0, h, &sc));
        if (!rc)
            NCCL_OK("accept", d_accept(lc, &rc));
        CHECK("connect", now_s() < end, "no connection within 60 s");
    }
    if (message("message after the stranger", sc, rc, 65536, 5, 5))
        return -1;
    ok("the listener goes on: the real connector gets through after the garbage address");
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

/* ---- a message larger than its receive ---- */

/* Before: the receiver's test failed with "internal error", without UCX's truncation status
 * or the sizes. Now it names both sizes and the transport's status; nothing is overwritten
 * past the receive. */
int case_truncated(void *ctx)
{
    const size_t big = 1 << 20, small = 1000;
    unsigned char h[NCCL_NET_HANDLE_MAXSIZE];
    void *lc, *sc, *rc, *sreq = NULL, *rreq = NULL;
    if (pair(ctx, &lc, &sc, &rc, h))
        return -1;
    unsigned char *s = malloc(big), *r = calloc(1, small + 64);
    CHECK("truncated", s && r, "no memory");
    fill(s, big, 6);
    memset(r + small, 0xab, 64);
    void *data = r;
    size_t size = small;
    int tag = 6, got[MAX_RECVS_WANTED] = {-1};
    NCCL_OK("irecv of 1000 bytes", d_irecv(rc, 1, &data, &size, &tag, NULL, &rreq));
    NCCL_OK("isend of 1 MiB", d_isend(sc, s, big, tag, NULL, &sreq));
    ncclResult_t rr = wait_req(rreq, got, 60);
    char recv_warn[sizeof(last_warn)];
    snprintf(recv_warn, sizeof(recv_warn), "%s", last_warn);
    ncclResult_t sr = wait_req(sreq, NULL, 60);
    printf("ok a 1 MiB message into a 1000-byte receive: receiver %d (%s), sender %d\n", (int)rr,
           recv_warn, (int)sr);
    CHECK("truncated", rr != ncclSuccess && rr != ncclInProgress, "the receive returned %d",
          (int)rr);
    /* UCX tells the receiver the message's size; verbs tell the sender instead. */
    CHECK("truncated",
          strstr(recv_warn, "1000 bytes") &&
              (strstr(recv_warn, "1048576 bytes") || !strstr(recv_warn, "ucx:")),
          "the receiver's error does not name both sizes: %s", recv_warn);
    CHECK("truncated", strstr(recv_warn, "truncated"),
          "the receiver's error does not name the truncation: %s", recv_warn);
    for (size_t i = small; i < small + 64; i++)
        CHECK("truncated", r[i] == 0xab, "byte %zu past the receive was written", i);
    ok("the truncated receive names both sizes and the transport's status");
    free(s);
    free(r);
    NCCL_OK("closeSend", d_close_send(sc));
    NCCL_OK("closeRecv", d_close_recv(rc));
    NCCL_OK("closeListen", d_close_listen(lc));
    return 0;
}

/* ---- a fork while init holds the plugin's locks ---- */

/* NCCL's init runs in one thread while another may fork (a data loader's worker): the child
 * then holds copies of whatever locks the init held, locked for good, and its own init must not
 * wait on them. The logger stands in for that moment: at init's first device line (the device
 * table's lock held, and on v8-v10 the process-wide context's too) it lets another thread fork
 * and waits until it has; the child inits the plugin at once, under an alarm. */
static sem_t fork_go, fork_done;
static pid_t init_child = -1;
static int fork_fired;

static void fork_while_logging(const char *msg)
{
    if (fork_fired || !strstr(msg, "NET/Reshard: device 0"))
        return;
    fork_fired = 1;
    sem_post(&fork_go);
    while (sem_wait(&fork_done) != 0)
        ;
}

static void *forker(void *arg)
{
    (void)arg;
    while (sem_wait(&fork_go) != 0)
        ;
    pid_t pid = fork();
    if (pid == 0) {
        log_hook = NULL;
        alarm(60); /* a child that waits on a lock nobody will release dies of SIGALRM */
        void *ctx = NULL;
        ncclResult_t r = d_init(&ctx);
        if (r != ncclSuccess) {
            printf("FAIL child init: returned %d (last WARN: %s)\n", (int)r, last_warn);
            fflush(stdout);
            _exit(1);
        }
        printf("ok the child forked during init made its own init\n");
        fflush(stdout);
        d_finalize(ctx);
        _exit(0);
    }
    init_child = pid;
    sem_post(&fork_done);
    return NULL;
}

int case_fork_in_init(void)
{
    pthread_t t;
    CHECK("fork in init", sem_init(&fork_go, 0, 0) == 0 && sem_init(&fork_done, 0, 0) == 0,
          "sem_init: %s", strerror(errno));
    CHECK("fork in init", pthread_create(&t, NULL, forker, NULL) == 0, "pthread_create failed");
    log_hook = fork_while_logging;
    void *ctx = NULL;
    ncclResult_t r = d_init(&ctx);
    log_hook = NULL;
    if (!fork_fired) { /* no device line: let the thread go, and say so */
        init_child = 0;
        sem_post(&fork_go);
    }
    pthread_join(t, NULL);
    NCCL_OK("init", r);
    CHECK("fork in init", fork_fired, "init logged no device line to fork at");
    CHECK("fork in init", init_child > 0, "fork failed");
    int status = 0;
    CHECK("fork in init", waitpid(init_child, &status, 0) == init_child, "waitpid: %s",
          strerror(errno));
    CHECK("fork in init", WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child %s",
          WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM
              ? "hung in its init (on a lock the parent's init held at the fork)"
              : "failed");
    ok("the child forked while init held the plugin's locks exited cleanly");
    NCCL_OK("finalize", d_finalize(ctx));
    return 0;
}
