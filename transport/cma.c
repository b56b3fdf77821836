/* SPDX-License-Identifier: Apache-2.0 */
#include "cma.h"

#include "base/error.h"
#include "base/log.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

/* ---- writes ---- */

static reshard_status_t cma_fail(pid_t pid, int peer, int err)
{
    if (err == EPERM)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "process_vm_writev to rank %d (pid %d): %s; cross-memory attach needs the "
                        "same user and kernel.yama.ptrace_scope <= 1",
                        peer, (int)pid, strerror(err));
    return rs_error(RESHARD_ERR_NETWORK, "process_vm_writev to rank %d (pid %d): %s", peer,
                    (int)pid, strerror(err));
}

int cma_hold(pid_t pid)
{
    return pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1; /* close-on-exec by default */
}

/* A pidfd reads as readable once its process has exited (a zombie included). */
static int cma_exited(int pidfd)
{
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL));
}

reshard_status_t cma_write(pid_t pid, int pidfd, int peer, const struct iovec *local,
                           const struct iovec *remote, size_t n)
{
    if (pid <= 0)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "cross-memory write to rank %d refused: the kernel has not confirmed which "
                        "process it is (it is no verified local peer)",
                        peer);
    /* A process alive now keeps its number until it has exited and been reaped; a number
     * handed out again in the instant between this check and the write would need the whole
     * pid space to wrap around in it. */
    if (n && pidfd >= 0 && cma_exited(pidfd))
        return rs_error(RESHARD_ERR_NETWORK,
                        "cross-memory write to rank %d refused: its process (pid %d) has exited, "
                        "and the number may name another process now",
                        peer, (int)pid);
    /* The same lengths on both sides, so a batch of pieces moves whole pieces; a short write
     * (the kernel may stop at a page it cannot fault) resumes inside a piece. */
    size_t i = 0, done = 0; /* done: bytes of piece i already written */
    while (i < n) {
        struct iovec l[IOV_MAX > 1024 ? 1024 : IOV_MAX], r[IOV_MAX > 1024 ? 1024 : IOV_MAX];
        size_t k = 0, want = 0;
        for (; k < sizeof(l) / sizeof(l[0]) && i + k < n; k++) {
            size_t skip = k == 0 ? done : 0;
            l[k] =
                (struct iovec){(char *)local[i + k].iov_base + skip, local[i + k].iov_len - skip};
            r[k] =
                (struct iovec){(char *)remote[i + k].iov_base + skip, remote[i + k].iov_len - skip};
            want += l[k].iov_len;
        }
        ssize_t got = process_vm_writev(pid, l, (unsigned long)k, r, (unsigned long)k, 0);
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return cma_fail(pid, peer, errno);
        }
        if (got == 0 && want)
            return cma_fail(pid, peer, EFAULT);
        /* Skip the pieces written in full. */
        size_t left = (size_t)got;
        while (left && i < n) {
            size_t rest = local[i].iov_len - done;
            if (left < rest) {
                done += left;
                left = 0;
            } else {
                left -= rest;
                done = 0;
                i++;
            }
        }
        while (i < n && local[i].iov_len == 0)
            i++;
    }
    return RESHARD_OK;
}

/* ---- local sockets ---- */

static reshard_status_t cma_name(const char *name, struct sockaddr_un *sa, socklen_t *len)
{
    size_t n = strlen(name);
    if (n == 0 || n > CMA_NAME_MAX)
        return rs_error(RESHARD_ERR_INTERNAL, "local: socket name '%s' is empty or too long", name);
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path + 1, name, n); /* sun_path[0] = 0: the abstract namespace */
    *len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    return RESHARD_OK;
}

static reshard_status_t cma_socket(int *fd)
{
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return rs_error(RESHARD_ERR_NETWORK, "local: socket(AF_UNIX): %m");
    *fd = s;
    return RESHARD_OK;
}

reshard_status_t cma_listen(const char *name, int *fd)
{
    struct sockaddr_un sa;
    socklen_t len;
    int s = -1;
    RS_CHECK(cma_name(name, &sa, &len));
    RS_CHECK(cma_socket(&s));
    reshard_status_t st = RESHARD_OK;
    if (bind(s, (struct sockaddr *)&sa, len) != 0)
        st = errno == EADDRINUSE
                 ? rs_error(RESHARD_ERR_UNAVAILABLE,
                            "local: another process holds the socket name @%s", name)
                 : rs_error(RESHARD_ERR_NETWORK, "local: bind(@%s): %m", name);
    else if (listen(s, SOMAXCONN) != 0)
        st = rs_error(RESHARD_ERR_NETWORK, "local: listen(@%s): %m", name);
    if (st != RESHARD_OK) {
        close(s);
        return st;
    }
    *fd = s;
    return RESHARD_OK;
}

reshard_status_t cma_connect(const char *name, int *fd)
{
    struct sockaddr_un sa;
    socklen_t len;
    int s = -1;
    RS_CHECK(cma_name(name, &sa, &len));
    RS_CHECK(cma_socket(&s));
    int rc;
    do
        rc = connect(s, (struct sockaddr *)&sa, len);
    while (rc != 0 && errno == EINTR);
    if (rc == 0) {
        *fd = s;
        return RESHARD_OK;
    }
    int e = errno;
    close(s);
    errno = e;
    if (e == ECONNREFUSED || e == ENOENT)
        return rs_error(RESHARD_ERR_UNAVAILABLE, "local: nobody listens on @%s here", name);
    if (e == EAGAIN)
        return rs_error(RESHARD_ERR_BUSY, "local: the queue of @%s is full", name);
    return rs_error(RESHARD_ERR_NETWORK, "local: connect(@%s): %m", name);
}

reshard_status_t cma_accept(int lfd, int *fd)
{
    int s = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s >= 0) {
        *fd = s;
        return RESHARD_OK;
    }
    *fd = -1;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_NETWORK, "local: accept: %m");
}

reshard_status_t cma_send(int fd, const void *msg, size_t n)
{
    ssize_t k;
    do
        k = send(fd, msg, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (k < 0 && errno == EINTR);
    if (k == (ssize_t)n)
        return RESHARD_OK;
    if (k >= 0)
        return rs_error(RESHARD_ERR_NETWORK, "local: send: %zd of %zu bytes", k, n);
    return rs_error(RESHARD_ERR_NETWORK, "local: send: %m");
}

reshard_status_t cma_recv(int fd, void *buf, size_t n, long *got)
{
    ssize_t k;
    do
        k = recv(fd, buf, n, MSG_DONTWAIT | MSG_TRUNC);
    while (k < 0 && errno == EINTR);
    if (k >= 0) {
        *got = (long)k;
        return RESHARD_OK;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *got = -1;
        return RESHARD_OK;
    }
    if (errno == ECONNRESET) { /* it closed with our messages unread: the same as closing */
        *got = 0;
        return RESHARD_OK;
    }
    return rs_error(RESHARD_ERR_NETWORK, "local: recv: %m");
}

reshard_status_t cma_peer_cred(int fd, pid_t *pid, uid_t *uid)
{
    struct ucred cr;
    socklen_t len = sizeof(cr);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0)
        return rs_error(RESHARD_ERR_NETWORK, "local: getsockopt(SO_PEERCRED): %m");
    *pid = cr.pid;
    *uid = cr.uid;
    return RESHARD_OK;
}

int cma_same_namespaces(pid_t pid, char *why, size_t n)
{
    static const char *const kind[] = {"net", "pid"}, *const what[] = {"network", "PID"};
    int same = 0;
    snprintf(why, n, "it shares this process's network and PID namespaces");
    for (int i = 1; i >= 0; i--) { /* the network namespace's reason, when both differ */
        char theirs[64], mine[64];
        struct stat a, b;
        snprintf(theirs, sizeof(theirs), "/proc/%d/ns/%s", (int)pid, kind[i]);
        snprintf(mine, sizeof(mine), "/proc/self/ns/%s", kind[i]);
        if (stat(theirs, &a) != 0 || stat(mine, &b) != 0) {
            snprintf(why, n, "its %s namespace cannot be read (%s: %s)", what[i], theirs,
                     strerror(errno));
            return -1;
        }
        if (a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            same |= i ? CMA_SAME_PID : CMA_SAME_NET;
        else
            snprintf(why, n, "it runs in another %s namespace", what[i]);
    }
    return same;
}

/* ---- who may write this process ---- */

static int cma_fake_scope = -2;
static int (*cma_fake_ptracer)(pid_t);

void cma_test_yama(int scope, int (*set_ptracer)(pid_t pid))
{
    cma_fake_scope = scope;
    cma_fake_ptracer = set_ptracer;
}

int cma_ptrace_scope(void)
{
    if (cma_fake_scope != -2)
        return cma_fake_scope;
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (!f)
        return errno == ENOENT ? -1 : 3;
    int v = 3;
    if (fscanf(f, "%d", &v) != 1 || v < 0 || v > 3)
        v = 3;
    fclose(f);
    return v;
}

static reshard_status_t cma_set_ptracer(pid_t pid)
{
    int rc = cma_fake_ptracer ? cma_fake_ptracer(pid)
                              : prctl(PR_SET_PTRACER, (unsigned long)pid, 0UL, 0UL, 0UL);
    if (rc != 0)
        return rs_error(RESHARD_ERR_UNAVAILABLE, "local: prctl(PR_SET_PTRACER, %d): %m", (int)pid);
    return RESHARD_OK;
}

/* The parent of pid from /proc/<pid>/stat, and its command (name, n bytes; may be NULL);
 * 0 when unknown, or when the parent is outside this PID namespace. */
static pid_t cma_parent(pid_t pid, char *name, size_t n)
{
    char path[48], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t k = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (k <= 0)
        return 0;
    buf[k] = 0;
    /* "pid (comm) state ppid ...": comm may hold spaces and parentheses, the last ')' ends it */
    char *l = strchr(buf, '('), *r = strrchr(buf, ')');
    int ppid = 0;
    char state;
    if (!l || !r || r < l || sscanf(r + 1, " %c %d", &state, &ppid) != 2)
        return 0;
    if (name && n)
        snprintf(name, n, "%.*s", (int)(r - l - 1), l + 1);
    return ppid;
}

/* Whether pid is a or one of a's descendants: what PR_SET_PTRACER(a) lets in. */
static int cma_under(pid_t a, pid_t pid)
{
    for (int depth = 0; pid > 0 && depth < 4096; depth++) {
        if (pid == a)
            return 1;
        pid = cma_parent(pid, NULL, 0);
    }
    return 0;
}

/* The processes running under a now (a excluded), other than this one and those admitted:
 * what a declaration of a lets in beyond the writers. -1 when /proc cannot be listed. */
static long cma_others_under(pid_t a, pid_t writer, const pid_t *admitted, size_t n)
{
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    long count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        pid_t p = (pid_t)atoi(e->d_name);
        int known = p == a || p == writer || p == getpid();
        for (size_t i = 0; i < n && !known; i++)
            known = admitted[i] == p;
        if (!known && cma_under(a, p))
            count++;
    }
    closedir(d);
    return count;
}

/* The writers admitted now (one entry per admission) and the declared ptracer, for this
 * process (a forked child inherits neither: Yama keeps the declaration per process). */
static pthread_mutex_t cma_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t cma_owner, cma_tracer;
static pid_t *cma_admitted;
static size_t cma_nadmitted, cma_cap;

static void cma_forget_if_forked(void)
{
    if (cma_owner == getpid())
        return;
    free(cma_admitted);
    cma_admitted = NULL;
    cma_nadmitted = cma_cap = 0;
    cma_tracer = 0;
    cma_owner = getpid();
}

/* Whether declaring a would let in writer and every writer admitted already. Never init (or
 * an unknown parent): that would let in every process. */
static int cma_covers(pid_t a, pid_t writer)
{
    if (a <= 1 || !cma_under(a, writer))
        return 0;
    for (size_t i = 0; i < cma_nadmitted; i++)
        if (!cma_under(a, cma_admitted[i]))
            return 0;
    return 1;
}

/* a, when it covers and lies under best (narrower), else best. */
static pid_t cma_narrower(pid_t best, pid_t a, pid_t writer)
{
    if (a == best || !cma_covers(a, writer))
        return best;
    return !best || cma_under(best, a) ? a : best;
}

/* The narrowest declaration that lets in writer and every writer admitted already: among the
 * current declaration, the writers and their parents. 0 when none does. */
static pid_t cma_choose(pid_t writer)
{
    pid_t best = cma_narrower(0, cma_tracer, writer);
    best = cma_narrower(best, writer, writer);
    best = cma_narrower(best, cma_parent(writer, NULL, 0), writer);
    for (size_t i = 0; i < cma_nadmitted; i++) {
        best = cma_narrower(best, cma_admitted[i], writer);
        best = cma_narrower(best, cma_parent(cma_admitted[i], NULL, 0), writer);
    }
    return best;
}

/* Under ptrace_scope 1: declares the narrowest process that lets writer in, with the others
 * admitted. *allowed = 0 with why when none does or the kernel refuses. */
static void cma_declare(pid_t writer, int *allowed, char *why, size_t n)
{
    pid_t a = cma_choose(writer);
    if (!a) {
        snprintf(why, n,
                 "kernel.yama.ptrace_scope is 1 and no one process holds pid %d and the %zu "
                 "writer(s) allowed already among its descendants (PR_SET_PTRACER names one)",
                 (int)writer, cma_nadmitted);
        return;
    }
    if (a != cma_tracer) {
        if (cma_set_ptracer(a) != RESHARD_OK) {
            snprintf(why, n, "%s", rs_error_message());
            return;
        }
        cma_tracer = a;
        char name[64] = "?";
        cma_parent(a, name, sizeof(name));
        long others = cma_others_under(a, writer, cma_admitted, cma_nadmitted);
        rs_log(RS_LOG_INFO,
               "local: kernel.yama.ptrace_scope is 1: declared pid %d (%s) with PR_SET_PTRACER: "
               "it and every process it starts may ptrace this one: %zu local peer(s) and, "
               "beyond them, %ld other process(es) under it now",
               (int)a, name, cma_nadmitted + 1, others);
    }
    *allowed = 1;
}

reshard_status_t cma_admit(pid_t writer, int *allowed, char *why, size_t n)
{
    *allowed = 0;
    snprintf(why, n, "allowed");
    pthread_mutex_lock(&cma_lock);
    cma_forget_if_forked();
    pid_t was = cma_tracer;
    int scope = cma_ptrace_scope();
    if (prctl(PR_GET_DUMPABLE, 0UL, 0UL, 0UL, 0UL) != 1)
        snprintf(why, n,
                 "this process is not dumpable (PR_SET_DUMPABLE 0, or it changed credentials): "
                 "the kernel lets no peer without CAP_SYS_PTRACE write it");
    else if (scope >= 2)
        snprintf(why, n,
                 "kernel.yama.ptrace_scope is %d: the kernel lets no peer without "
                 "CAP_SYS_PTRACE write this process",
                 scope);
    else if (scope == 1)
        cma_declare(writer, allowed, why, n);
    else
        *allowed = 1;
    reshard_status_t st = RESHARD_OK;
    if (*allowed) {
        pid_t *grown =
            rs_grow(cma_admitted, &cma_cap, cma_nadmitted + 1, sizeof(pid_t), "admitted");
        if (grown) {
            cma_admitted = grown;
            cma_admitted[cma_nadmitted++] = writer;
        } else {
            st = RESHARD_ERR_NO_MEMORY;
            *allowed = 0;
            if (cma_tracer != was && cma_set_ptracer(was) == RESHARD_OK)
                cma_tracer = was;
        }
    }
    pthread_mutex_unlock(&cma_lock);
    return st;
}

void cma_dismiss(pid_t writer)
{
    pthread_mutex_lock(&cma_lock);
    cma_forget_if_forked();
    for (size_t i = 0; i < cma_nadmitted; i++)
        if (cma_admitted[i] == writer) {
            cma_admitted[i] = cma_admitted[--cma_nadmitted];
            break;
        }
    if (cma_nadmitted == 0 && cma_tracer) {
        struct rs_saved_error saved;
        rs_error_save(&saved);
        if (cma_set_ptracer(0) == RESHARD_OK)
            rs_log(RS_LOG_INFO, "local: PR_SET_PTRACER reset: no local peer needs it any more");
        else
            rs_log(RS_LOG_WARN, "%s: pid %d may still ptrace this process", rs_error_message(),
                   (int)cma_tracer);
        rs_error_restore(&saved);
        cma_tracer = 0;
    }
    pthread_mutex_unlock(&cma_lock);
}
