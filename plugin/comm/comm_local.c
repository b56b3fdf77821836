/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Verifying local peers (comm_local.h). Each rank listens on an abstract Unix socket named
 * after its uid, pid and spare id, opened before the hello so that a connection refused means
 * "not here", never "not yet". After the hello every rank connects to every rank of its
 * domain, both ways at once, and on each connection (messages in docs/protocols.md):
 *
 *   connector: checks the listener's credentials (the kernel's: the pid announced, this
 *              uid, these namespaces), then sends its proof (its rank and token);
 *   listener:  checks the connector's credentials and proof, answers with its own proof,
 *              lets the connector write it if the ptrace rules allow (cma_admit), and says so;
 *   connector: checks the proof; may write the listener if it said so.
 *
 * A rank waits only for peers whose listener the kernel showed it, so a rank that claims this
 * host from elsewhere costs no wait; it keeps answering until every peer it verified has
 * connected (or RESHARD_TIMEOUT), and drops every other connection at once.
 */
#include "comm_local.h"

#include "base/clock.h"
#include "base/error.h"
#include "base/log.h"
#include "base/text.h"
#include "transport/boot/bootstrap.h"
#include "transport/cma.h"
#include "transport/sock/sock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

/* ---- messages: 128 bytes, one per SOCK_SEQPACKET record ---- */

#define LOCAL_MSG      128
#define LOCAL_WHY      96
#define LOCAL_RETRY_MS 10 /* a full queue is tried again after this */

enum { LOCAL_PROOF = 1, LOCAL_GRANT = 2 };

static const unsigned char local_magic[4] = {'R', 'S', 'L', '1'};

struct local_msg {
    int kind, allowed;
    int from, to;
    unsigned char token[COMM_LOCAL_TOKEN];
    char why[LOCAL_WHY];
};

static void local_encode(const struct local_msg *m, unsigned char *w)
{
    memset(w, 0, LOCAL_MSG);
    memcpy(w, local_magic, sizeof(local_magic));
    w[4] = (unsigned char)m->kind;
    w[5] = (unsigned char)m->allowed;
    sock_wire_put(w + 8, (uint64_t)m->from, 4);
    sock_wire_put(w + 12, (uint64_t)m->to, 4);
    memcpy(w + 16, m->token, COMM_LOCAL_TOKEN);
    snprintf((char *)w + 32, LOCAL_WHY, "%s", m->why);
}

/* 1 when w (n bytes as received) is a message of `kind` from rank `from` to rank `to`. The
 * reason a peer gives is its own text: it reaches the log cleaned (base/text.h). */
static int local_decode(const unsigned char *w, long n, int kind, int from, int to,
                        struct local_msg *m)
{
    if (n != LOCAL_MSG || memcmp(w, local_magic, sizeof(local_magic)) || w[4] != kind || w[5] > 1 ||
        sock_wire_get(w + 8, 4) != (uint64_t)from || sock_wire_get(w + 12, 4) != (uint64_t)to)
        return 0;
    m->kind = kind;
    m->allowed = w[5];
    m->from = from;
    m->to = to;
    memcpy(m->token, w + 16, COMM_LOCAL_TOKEN);
    memcpy(m->why, w + 32, LOCAL_WHY);
    m->why[LOCAL_WHY - 1] = 0;
    rs_text_clean(m->why);
    return 1;
}

/* Equal tokens, in time that does not depend on where they differ. */
static int local_same_token(const unsigned char *a, const unsigned char *b)
{
    unsigned char d = 0;
    for (int i = 0; i < COMM_LOCAL_TOKEN; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

/* ---- the communicator's state ---- */

struct comm_local {
    int lfd; /* open from the hello to the end of verify */
    unsigned char token[COMM_LOCAL_TOKEN];
    unsigned char *verdict; /* [size] */
    /* [size] or NULL: ranks whose verdict a growth's member carried from its communicator
     * (comm_local_carry), not verified again. */
    unsigned char *known;
    pid_t *admitted; /* writers cma_admit let in, dismissed on close */
    int nadmitted;
    int reserve; /* room kept in admitted for the writers comm_local_adopt takes over */
};

static pid_t local_fake_pid;

void comm_local_test_announce_pid(pid_t pid)
{
    local_fake_pid = pid;
}

void comm_local_name(char *buf, size_t n, uid_t uid, pid_t pid, const struct boot_id *spare)
{
    char addr[SOCK_ADDR_STR];
    snprintf(buf, n, "reshard-local/%u/%d/%s", (unsigned)uid, (int)pid,
             boot_id_addr(spare, addr, sizeof(addr)));
}

static reshard_status_t local_random(unsigned char *p, size_t n)
{
    while (n) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return rs_error(RESHARD_ERR_INTERNAL, "comm: getrandom for the local token: %m");
        p += k;
        n -= (size_t)k;
    }
    return RESHARD_OK;
}

static struct comm_local *local_alloc(struct reshard_comm *c)
{
    struct comm_local *l = rs_calloc(1, sizeof(*l), "local peers");
    if (!l)
        return NULL;
    l->lfd = -1;
    if (!(l->verdict = rs_calloc((size_t)c->size, 1, "local verdicts"))) {
        free(l);
        return NULL;
    }
    c->local = l;
    return l;
}

/* This rank's local socket, named after pid and c's spare id; one that cannot be opened costs
 * only the local path. */
static void local_listen(struct reshard_comm *c, pid_t pid)
{
    char name[CMA_NAME_MAX + 1];
    comm_local_name(name, sizeof(name), geteuid(), pid, &c->spare);
    struct rs_saved_error saved;
    rs_error_save(&saved);
    if (cma_listen(name, &c->local->lfd) != RESHARD_OK)
        rs_log(RS_LOG_WARN, "comm: rank %d: %s: its local peers will write it over the network",
               c->rank, rs_error_message());
    rs_error_restore(&saved);
}

reshard_status_t comm_local_open(struct reshard_comm *c, struct comm_local_hello *mine)
{
    struct comm_local *l = local_alloc(c);
    if (!l)
        return RESHARD_ERR_NO_MEMORY;
    RS_CHECK(local_random(l->token, sizeof(l->token)));
    memset(mine, 0, sizeof(*mine));
    mine->pid = (int32_t)(local_fake_pid ? local_fake_pid : getpid());
    memcpy(mine->token, l->token, sizeof(l->token));
    local_listen(c, mine->pid);
    return RESHARD_OK;
}

reshard_status_t comm_local_carry(struct reshard_comm *c, const struct reshard_comm *old,
                                  pid_t announced)
{
    struct comm_local *l = local_alloc(c);
    if (!l || !(l->known = rs_calloc((size_t)c->size, 1, "local verdicts carried")))
        return RESHARD_ERR_NO_MEMORY;
    if (!old->local) /* its exchange never got that far: nothing to carry, nothing to prove */
        return rs_error(RESHARD_ERR_INTERNAL,
                        "comm: rank %d: the communicator grown from has no local state", c->rank);
    memcpy(l->token, old->local->token, sizeof(l->token));
    l->reserve = old->local->nadmitted;
    for (int q = 0; q < old->size && q < c->size; q++) {
        if (q == c->rank || !comm_has(old, q))
            continue;
        l->known[q] = 1;
        l->verdict[q] = old->local->verdict[q];
        c->pid[q] = old->pid[q];
        /* The old communicator closes its own when it goes; this one holds the process too. */
        if (old->pidfd[q] >= 0 && (c->pidfd[q] = fcntl(old->pidfd[q], F_DUPFD_CLOEXEC, 0)) < 0)
            rs_log(RS_LOG_INFO,
                   "comm: rank %d: no copy of the handle on rank %d's process (%m): "
                   "a write to it no longer checks that it is alive",
                   c->rank, q);
    }
    local_listen(c, announced);
    return RESHARD_OK;
}

void comm_local_adopt(struct reshard_comm *c, struct reshard_comm *old)
{
    struct comm_local *l = c->local, *o = old->local;
    if (!l || !o || !l->admitted)
        return;
    for (int i = 0; i < o->nadmitted && l->reserve > 0; i++, l->reserve--)
        l->admitted[l->nadmitted++] = o->admitted[i];
    o->nadmitted = 0;
}

/* ---- one verification ---- */

enum { OUT_CONNECT, OUT_PROOF, OUT_GRANT, OUT_DONE };

/* A rank of this rank's domain. */
struct local_peer {
    int rank;
    pid_t pid;                  /* as announced */
    const unsigned char *token; /* as announced */
    char name[CMA_NAME_MAX + 1];
    int out_fd, out_state; /* this rank's connection to its listener */
    int64_t retry_at;      /* OUT_CONNECT: when to try again after a full queue */
    pid_t holder;          /* the process the kernel says holds its socket name (0: none) */
    /* Whether it will connect to this rank's listener: the holder of its name runs as this
     * user in this network namespace (whatever it announced), so it can, and does unless it
     * fails first. Until it has (served or dropped), this rank keeps listening. */
    int expected, answered;
    enum comm_local_verdict verdict;
    char why[192];
};

/* A connection to this rank's listener from a process that announced a peer or holds a
 * peer's socket name, before its proof says which peer it is. */
struct local_in {
    int fd;
    pid_t pid;
};

struct local_run {
    struct reshard_comm *c;
    struct comm_local *l;
    struct local_peer *p;
    int n;
    struct local_in *in;
    int nin, in_cap;
    uid_t uid;
    int64_t deadline;
    int dropped; /* connections from processes that announced no rank of this domain */
    pid_t dropped_pid;
    uid_t dropped_uid;
};

static void local_close(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void local_end(struct local_peer *p, enum comm_local_verdict v, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void local_end(struct local_peer *p, enum comm_local_verdict v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof(p->why), fmt, ap);
    va_end(ap);
    p->verdict = v;
    p->out_state = OUT_DONE;
    local_close(&p->out_fd);
}

/* Whether the process holding p's name (fd connected to it) is what p announced: the
 * kernel's word for its pid, its user and its namespaces. On 0, *v and why say what it is
 * instead. Records the holder, and whether to expect p's own connection. */
static int local_is(const struct local_run *r, struct local_peer *p, int fd,
                    enum comm_local_verdict *v, char *why, size_t n)
{
    pid_t pid, want = p->pid;
    uid_t uid;
    if (cma_peer_cred(fd, &pid, &uid) != RESHARD_OK) {
        *v = COMM_LOCAL_FAILED;
        snprintf(why, n, "%s", rs_error_message());
        return 0;
    }
    char ns[160];
    int same = pid > 0 ? cma_same_namespaces(pid, ns, sizeof(ns)) : -1;
    p->holder = pid;
    /* A holder this PID namespace cannot see (pid 0) may still connect: its socket is in this
     * network namespace. */
    p->expected = uid == r->uid && (pid == 0 || (same >= 0 && (same & CMA_SAME_NET)));
    if (pid <= 0) { /* the kernel shows 0 for a process this PID namespace cannot see */
        *v = COMM_LOCAL_OTHER_NS;
        snprintf(why, n, "its socket is held by a process outside this PID namespace");
        return 0;
    }
    if (pid != want) {
        *v = COMM_LOCAL_IMPOSTOR;
        snprintf(why, n, "its local socket is held by pid %d, not by the pid %d it announced",
                 (int)pid, (int)want);
        return 0;
    }
    if (uid != r->uid) {
        *v = COMM_LOCAL_OTHER_USER;
        snprintf(why, n, "pid %d runs as uid %u, this rank as uid %u", (int)pid, (unsigned)uid,
                 (unsigned)r->uid);
        return 0;
    }
    if (same != CMA_SAME_ALL) {
        *v = COMM_LOCAL_OTHER_NS;
        snprintf(why, n, "pid %d: %s", (int)pid, ns);
        return 0;
    }
    return 1;
}

static reshard_status_t local_send(int fd, int kind, int from, int to, const unsigned char *token,
                                   int allowed, const char *why)
{
    struct local_msg m = {.kind = kind, .allowed = allowed, .from = from, .to = to};
    if (token)
        memcpy(m.token, token, COMM_LOCAL_TOKEN);
    snprintf(m.why, sizeof(m.why), "%s", why ? why : "");
    unsigned char w[LOCAL_MSG];
    local_encode(&m, w);
    return cma_send(fd, w, sizeof(w));
}

/* Connects to p's listener, checks who holds it and sends this rank's proof. */
static void local_connect(struct local_run *r, struct local_peer *p)
{
    reshard_status_t st = cma_connect(p->name, &p->out_fd);
    if (st == RESHARD_ERR_BUSY) {
        p->retry_at = rs_now_ms() + LOCAL_RETRY_MS;
        return;
    }
    if (st == RESHARD_ERR_UNAVAILABLE) {
        local_end(p, COMM_LOCAL_NOT_HERE,
                  "nobody listens on its socket name here (another host, or another network "
                  "namespace)");
        return;
    }
    if (st != RESHARD_OK) {
        local_end(p, COMM_LOCAL_FAILED, "%s", rs_error_message());
        return;
    }
    enum comm_local_verdict v;
    char why[192];
    if (!local_is(r, p, p->out_fd, &v, why, sizeof(why))) {
        local_end(p, v, "%s", why);
        return;
    }
    if (local_send(p->out_fd, LOCAL_PROOF, r->c->rank, p->rank, r->l->token, 0, NULL) !=
        RESHARD_OK) {
        local_end(p, COMM_LOCAL_CLOSED, "%s", rs_error_message());
        return;
    }
    p->out_state = OUT_PROOF;
}

/* The peer's answer on this rank's connection: its proof, then whether this rank may write it. */
static void local_read_answer(struct local_run *r, struct local_peer *p)
{
    unsigned char w[LOCAL_MSG];
    long got;
    struct local_msg m;
    if (cma_recv(p->out_fd, w, sizeof(w), &got) != RESHARD_OK) {
        local_end(p, COMM_LOCAL_FAILED, "%s", rs_error_message());
        return;
    }
    if (got < 0)
        return;
    if (got == 0) {
        local_end(p, COMM_LOCAL_CLOSED,
                  "it closed the connection without answering: it did not take this rank for "
                  "its peer");
        return;
    }
    int kind = p->out_state == OUT_PROOF ? LOCAL_PROOF : LOCAL_GRANT;
    if (!local_decode(w, got, kind, p->rank, r->c->rank, &m)) {
        local_end(p, COMM_LOCAL_BAD_PROOF, "its answer is no %s from rank %d to rank %d",
                  kind == LOCAL_PROOF ? "proof" : "grant", p->rank, r->c->rank);
        return;
    }
    if (kind == LOCAL_PROOF) {
        if (!local_same_token(m.token, p->token))
            local_end(p, COMM_LOCAL_BAD_PROOF,
                      "pid %d answered with another token than its hello's", (int)p->pid);
        else
            p->out_state = OUT_GRANT;
        return;
    }
    if (m.allowed)
        local_end(p, COMM_LOCAL_WRITABLE, "verified: pid %d", (int)p->pid);
    else
        local_end(p, COMM_LOCAL_REFUSED, "it does not let this rank write it: %s", m.why);
}

/* Whether a connection from pid speaks for peer p: p announced pid, or pid holds p's name
 * (pid 0: a process this PID namespace cannot see, for a peer whose holder is one). */
static int local_speaks_for(const struct local_peer *p, pid_t pid)
{
    if (pid == 0)
        return p->expected && p->holder == 0;
    return p->pid == pid || p->holder == pid;
}

/* Drops connection i; the peers it spoke for have come (they are not waited for again). A
 * connection from a process this PID namespace cannot see counts for one of them. */
static void local_drop_in(struct local_run *r, int i)
{
    for (int k = 0, once = 0; k < r->n && !once; k++)
        if (local_speaks_for(&r->p[k], r->in[i].pid) && !r->p[k].answered) {
            r->p[k].answered = 1;
            once = r->in[i].pid == 0;
        }
    local_close(&r->in[i].fd);
    r->in[i] = r->in[--r->nin];
}

/* A connection to this rank's listener: kept until its proof when the kernel says it comes
 * from a process that speaks for some peer, in this user and these namespaces; else dropped
 * at once, unanswered. */
static void local_take(struct local_run *r, int fd)
{
    pid_t pid = 0;
    uid_t uid = 0;
    int known = 0;
    if (cma_peer_cred(fd, &pid, &uid) == RESHARD_OK)
        for (int k = 0; k < r->n && !known; k++)
            known = local_speaks_for(&r->p[k], pid);
    if (!known) {
        r->dropped++;
        r->dropped_pid = pid;
        r->dropped_uid = uid;
        close(fd);
        return;
    }
    if (r->nin == r->in_cap) /* the oldest waits longest for a proof: it goes */
        local_drop_in(r, 0);
    r->in[r->nin++] = (struct local_in){fd, pid};
    char why[160];
    if (uid != r->uid || cma_same_namespaces(pid, why, sizeof(why)) != CMA_SAME_ALL)
        local_drop_in(r, r->nin - 1);
}

/* The proof on connection i of this rank's listener: answered with this rank's own and a
 * grant, and the connection closed (the peer reads what was sent before the close). */
static reshard_status_t local_answer(struct local_run *r, int i)
{
    unsigned char w[LOCAL_MSG];
    long got;
    if (cma_recv(r->in[i].fd, w, sizeof(w), &got) != RESHARD_OK || got == 0) {
        local_drop_in(r, i);
        return RESHARD_OK;
    }
    if (got < 0)
        return RESHARD_OK;
    struct local_peer *p = NULL;
    struct local_msg m;
    int from = got == LOCAL_MSG ? (int)sock_wire_get(w + 8, 4) : -1;
    for (int k = 0; k < r->n && !p; k++)
        if (r->p[k].rank == from)
            p = &r->p[k];
    if (!p || p->pid != r->in[i].pid || p->answered ||
        !local_decode(w, got, LOCAL_PROOF, from, r->c->rank, &m) ||
        !local_same_token(m.token, p->token)) {
        rs_log(RS_LOG_WARN,
               "comm: rank %d: pid %d sent a proof that is not its rank's: no answer, nothing "
               "allowed",
               r->c->rank, (int)r->in[i].pid);
        local_drop_in(r, i);
        return RESHARD_OK;
    }
    int allowed = 0;
    char why[LOCAL_WHY];
    RS_CHECK(cma_admit(p->pid, &allowed, why, sizeof(why)));
    if (allowed)
        r->l->admitted[r->l->nadmitted++] = p->pid;
    if (local_send(r->in[i].fd, LOCAL_PROOF, r->c->rank, p->rank, r->l->token, 0, NULL) ==
        RESHARD_OK)
        (void)local_send(r->in[i].fd, LOCAL_GRANT, r->c->rank, p->rank, NULL, allowed, why);
    local_drop_in(r, i);
    return RESHARD_OK;
}

/* Done when every connection of this rank's has its answer and every peer expected to
 * connect to this rank has. */
static int local_done(const struct local_run *r)
{
    for (int k = 0; k < r->n; k++) {
        const struct local_peer *p = &r->p[k];
        if (p->out_state != OUT_DONE || (p->expected && !p->answered && r->l->lfd >= 0))
            return 0;
    }
    return 1;
}

static reshard_status_t local_poll(struct pollfd *fds, int n, int ms, int *ready)
{
    int rc;
    do
        rc = poll(fds, (nfds_t)n, ms);
    while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return rs_error(RESHARD_ERR_INTERNAL, "comm: local peers: poll: %m");
    *ready = rc;
    return RESHARD_OK;
}

/* One round: waits for any socket (or the next retry, or the deadline), then serves all. */
static reshard_status_t local_round(struct local_run *r, struct pollfd *fds)
{
    int64_t now = rs_now_ms(), wake = r->deadline;
    int n = 0, lpos = -1;
    if (r->l->lfd >= 0) {
        lpos = n;
        fds[n++] = (struct pollfd){.fd = r->l->lfd, .events = POLLIN};
    }
    for (int k = 0; k < r->n; k++) {
        struct local_peer *p = &r->p[k];
        if (p->out_state == OUT_CONNECT && p->retry_at < wake)
            wake = p->retry_at;
        fds[n++] = (struct pollfd){
            .fd = p->out_state == OUT_PROOF || p->out_state == OUT_GRANT ? p->out_fd : -1,
            .events = POLLIN};
    }
    int ipos = n;
    for (int i = 0; i < r->nin; i++)
        fds[n++] = (struct pollfd){.fd = r->in[i].fd, .events = POLLIN};
    int64_t left = wake - now;
    int ready;
    RS_CHECK(local_poll(fds, n, left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left, &ready));
    /* Proofs first, from the connections polled (taking new ones may reorder r->in). */
    for (int i = r->nin - 1; i >= 0; i--)
        if (i < n - ipos && fds[ipos + i].revents)
            RS_CHECK(local_answer(r, i));
    for (int k = 0; k < r->n; k++) {
        struct local_peer *p = &r->p[k];
        if (fds[(lpos >= 0) + k].revents && p->out_fd >= 0)
            local_read_answer(r, p);
        if (p->out_state == OUT_CONNECT && p->retry_at <= rs_now_ms())
            local_connect(r, p);
    }
    if (lpos >= 0 && fds[lpos].revents) {
        for (int fd = -1, tries = 0; tries < 64; tries++) {
            if (cma_accept(r->l->lfd, &fd) != RESHARD_OK) {
                rs_log(RS_LOG_WARN, "comm: rank %d: %s: its local peers cannot reach it now",
                       r->c->rank, rs_error_message());
                local_close(&r->l->lfd);
                break;
            }
            if (fd < 0)
                break;
            local_take(r, fd);
        }
    }
    return RESHARD_OK;
}

/* One line for the ranks with verdict v ("1, 2, 5"), with the first one's reason. */
static void local_report(const struct local_run *r, enum comm_local_verdict v,
                         enum rs_log_level level, const char *what)
{
    char ranks[256] = "";
    size_t len = 0;
    int count = 0;
    const char *why = "";
    for (int k = 0; k < r->n; k++) {
        if (r->p[k].verdict != v)
            continue;
        if (!count++)
            why = r->p[k].why;
        if (len < sizeof(ranks) - 16)
            len += (size_t)snprintf(ranks + len, sizeof(ranks) - len, "%s%d", count > 1 ? ", " : "",
                                    r->p[k].rank);
        else if (len < sizeof(ranks) - 5)
            len += (size_t)snprintf(ranks + len, sizeof(ranks) - len, ", ...");
    }
    if (!count)
        return;
    const char *s = count > 1 ? "s" : "";
    if (v == COMM_LOCAL_WRITABLE)
        rs_log(level, "comm: rank %d: writes rank%s %s by cross-memory attach (%s)", r->c->rank, s,
               ranks, what);
    else
        rs_log(level, "comm: rank %d: rank%s %s: %s: %s%s; written over the network", r->c->rank, s,
               ranks, what, why, count > 1 ? " (the first)" : "");
}

static void local_summary(const struct local_run *r)
{
    static const struct {
        enum comm_local_verdict v;
        enum rs_log_level level;
        const char *what;
    } lines[] = {
        {COMM_LOCAL_WRITABLE, RS_LOG_INFO, "verified by the kernel"},
        {COMM_LOCAL_NOT_HERE, RS_LOG_INFO, "not on this host"},
        {COMM_LOCAL_OTHER_NS, RS_LOG_INFO, "in another namespace"},
        {COMM_LOCAL_REFUSED, RS_LOG_INFO, "verified, not writable"},
        {COMM_LOCAL_CLOSED, RS_LOG_INFO, "no answer"},
        {COMM_LOCAL_IMPOSTOR, RS_LOG_WARN, "not verified"},
        {COMM_LOCAL_OTHER_USER, RS_LOG_WARN, "not verified"},
        {COMM_LOCAL_BAD_PROOF, RS_LOG_WARN, "not verified"},
        {COMM_LOCAL_SILENT, RS_LOG_WARN, "not verified"},
        {COMM_LOCAL_BUSY, RS_LOG_WARN, "not verified"},
        {COMM_LOCAL_FAILED, RS_LOG_WARN, "not verified"},
    };
    for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
        local_report(r, lines[i].v, lines[i].level, lines[i].what);
    if (r->dropped)
        rs_log(RS_LOG_WARN,
               "comm: rank %d: dropped %d connection(s) to its local socket from processes that "
               "are no rank of its domain (the last: pid %d, uid %u)",
               r->c->rank, r->dropped, (int)r->dropped_pid, (unsigned)r->dropped_uid);
    for (int k = 0; k < r->n; k++) {
        const struct local_peer *p = &r->p[k];
        if (p->expected && !p->answered && r->l->lfd >= 0)
            rs_log(RS_LOG_WARN,
                   "comm: rank %d: rank %d did not connect to it before RESHARD_TIMEOUT: it "
                   "writes this rank over the network",
                   r->c->rank, p->rank);
    }
}

/* Whether this rank verifies rank q now: one of its domain, unless its verdict was carried. */
static int local_to_verify(const struct local_run *r, int q)
{
    const struct reshard_comm *c = r->c;
    const int *dom = c->topo.t.domain;
    return q != c->rank && comm_has(c, q) && dom[q] == dom[c->rank] &&
           !(r->l->known && r->l->known[q]);
}

static reshard_status_t local_run(struct local_run *r, const struct comm_local_hello *first,
                                  size_t stride)
{
    struct reshard_comm *c = r->c;
    int n = 0;
    for (int q = 0; q < c->size; q++)
        n += local_to_verify(r, q);
    r->p = rs_calloc((size_t)n + 1, sizeof(*r->p), "local peers");
    r->in_cap = 2 * n + 4;
    r->in = rs_calloc((size_t)r->in_cap, sizeof(*r->in), "local connections");
    r->l->admitted =
        rs_calloc((size_t)n + 1 + (size_t)r->l->reserve, sizeof(pid_t), "local writers");
    struct pollfd *fds = rs_calloc((size_t)(1 + n + r->in_cap), sizeof(*fds), "local poll");
    reshard_status_t st = RESHARD_ERR_NO_MEMORY;
    if (!r->p || !r->in || !r->l->admitted || !fds)
        goto free_poll;
    for (int q = 0; q < c->size; q++) {
        if (!local_to_verify(r, q))
            continue;
        const struct comm_local_hello *h =
            (const struct comm_local_hello *)((const char *)first + (size_t)q * stride);
        struct local_peer *p = &r->p[r->n++];
        *p = (struct local_peer){.rank = q, .pid = h->pid, .token = h->token, .out_fd = -1};
        comm_local_name(p->name, sizeof(p->name), r->uid, p->pid, &c->spares[q]);
        if (p->pid <= 0)
            local_end(p, COMM_LOCAL_IMPOSTOR, "it announced pid %d", (int)p->pid);
    }
    st = RESHARD_OK;
    for (int k = 0; k < r->n; k++)
        if (r->p[k].out_state == OUT_CONNECT)
            local_connect(r, &r->p[k]);
    while (st == RESHARD_OK && !local_done(r) && rs_now_ms() < r->deadline)
        st = local_round(r, fds);
    for (int k = 0; k < r->n; k++) {
        struct local_peer *p = &r->p[k];
        if (p->out_state == OUT_CONNECT)
            local_end(p, COMM_LOCAL_BUSY, "its socket's queue stayed full for %d s",
                      comm_timeout_ms() / 1000);
        else if (p->out_state != OUT_DONE)
            local_end(p, COMM_LOCAL_SILENT, "pid %d did not answer within %d s", (int)p->pid,
                      comm_timeout_ms() / 1000);
    }
free_poll:
    free(fds);
    return st;
}

reshard_status_t comm_local_verify(struct reshard_comm *c, const struct comm_local_hello *first,
                                   size_t stride)
{
    struct comm_local *l = c->local;
    for (int q = 0; q < c->size; q++)
        if (!(l && l->known && l->known[q]))
            c->pid[q] = 0;
    c->pid[c->rank] = getpid();
    if (!l)
        return RESHARD_OK;
    struct local_run r = {.c = c, .l = l, .uid = geteuid()};
    r.deadline = rs_now_ms() + comm_timeout_ms();
    struct rs_saved_error saved;
    rs_error_save(&saved);
    reshard_status_t st = local_run(&r, first, stride);
    if (st == RESHARD_OK) {
        rs_error_restore(&saved);
        local_summary(&r);
    }
    for (int k = 0; k < r.n; k++) {
        struct local_peer *p = &r.p[k];
        local_close(&p->out_fd);
        l->verdict[p->rank] = (unsigned char)p->verdict;
        if (p->verdict == COMM_LOCAL_WRITABLE) {
            c->pid[p->rank] = p->pid;
            c->pidfd[p->rank] = cma_hold(p->pid); /* while its socket still names it */
        }
    }
    for (int i = 0; i < r.nin; i++)
        local_close(&r.in[i].fd);
    local_close(&l->lfd); /* a peer that comes later finds nobody: it writes over the network */
    free(r.in);
    free(r.p);
    return st;
}

void comm_local_close(struct reshard_comm *c)
{
    struct comm_local *l = c->local;
    if (!l)
        return;
    for (int i = 0; i < l->nadmitted; i++)
        cma_dismiss(l->admitted[i]);
    local_close(&l->lfd);
    free(l->admitted);
    free(l->verdict);
    free(l->known);
    free(l);
    c->local = NULL;
}

enum comm_local_verdict comm_local_verdict(const struct reshard_comm *c, int q)
{
    if (!c->local || q < 0 || q >= c->size)
        return COMM_LOCAL_NOT_PEER;
    return (enum comm_local_verdict)c->local->verdict[q];
}

const char *comm_local_verdict_name(enum comm_local_verdict v)
{
    static const char *const names[] = {
        [COMM_LOCAL_NOT_PEER] = "not a peer",   [COMM_LOCAL_WRITABLE] = "writable",
        [COMM_LOCAL_NOT_HERE] = "not here",     [COMM_LOCAL_IMPOSTOR] = "impostor",
        [COMM_LOCAL_OTHER_USER] = "other user", [COMM_LOCAL_OTHER_NS] = "other namespace",
        [COMM_LOCAL_BAD_PROOF] = "bad proof",   [COMM_LOCAL_CLOSED] = "closed",
        [COMM_LOCAL_SILENT] = "silent",         [COMM_LOCAL_BUSY] = "busy",
        [COMM_LOCAL_REFUSED] = "refused",       [COMM_LOCAL_FAILED] = "failed",
    };
    return (unsigned)v < sizeof(names) / sizeof(names[0]) ? names[v] : "?";
}
