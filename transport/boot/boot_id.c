/* SPDX-License-Identifier: Apache-2.0 */
/* Bootstrap ids (bootstrap.h): their codec, their secrets, listener addresses on the wire, and
 * the registry of the listeners this process opened for them, which its rank 0 takes over. */
#include "boot_int.h"

#include "base/param.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#define BOOT_ID_MAGIC 0x52534944u /* "RSID" */

/* ---- the codec ---- */

void boot_id_encode(const union sock_addr *a, const unsigned char *secret, unsigned flags,
                    struct boot_id *id)
{
    memset(id, 0, sizeof(*id));
    sock_wire_put(id->bytes, BOOT_ID_MAGIC, 4);
    id->bytes[4] = BOOT_VERSION;
    id->bytes[5] = a->sa.sa_family == AF_INET6 ? 6 : 4;
    sock_wire_put(id->bytes + 6, (uint64_t)sock_addr_port(a), 2);
    if (a->sa.sa_family == AF_INET6) {
        memcpy(id->bytes + 8, &a->in6.sin6_addr, 16);
        sock_wire_put(id->bytes + 24, a->in6.sin6_scope_id, 4);
    } else {
        memcpy(id->bytes + 8, &a->in.sin_addr, 4);
    }
    memcpy(id->bytes + 28, secret, BOOT_SECRET_BYTES);
    id->bytes[60] = (unsigned char)flags;
}

int boot_id_decode(const struct boot_id *id, union sock_addr *a, unsigned char *secret,
                   unsigned *flags)
{
    const unsigned char *b = id->bytes;
    if (sock_wire_get(b, 4) != BOOT_ID_MAGIC || b[4] != BOOT_VERSION || (b[5] != 4 && b[5] != 6))
        return -1;
    memset(a, 0, sizeof(*a));
    if (b[5] == 6) {
        a->in6.sin6_family = AF_INET6;
        memcpy(&a->in6.sin6_addr, b + 8, 16);
        a->in6.sin6_scope_id = (uint32_t)sock_wire_get(b + 24, 4);
    } else {
        a->in.sin_family = AF_INET;
        memcpy(&a->in.sin_addr, b + 8, 4);
    }
    sock_addr_set_port(a, (int)sock_wire_get(b + 6, 2));
    if (secret)
        memcpy(secret, b + 28, BOOT_SECRET_BYTES);
    if (flags)
        *flags = b[60];
    return 0;
}

void boot_addr_put(unsigned char *w, const union sock_addr *a)
{
    memset(w, 0, BOOT_ADDR_BYTES);
    w[0] = a->sa.sa_family == AF_INET6 ? 6 : 4;
    sock_wire_put(w + 2, (uint64_t)sock_addr_port(a), 2);
    if (a->sa.sa_family == AF_INET6) {
        sock_wire_put(w + 4, a->in6.sin6_scope_id, 4);
        memcpy(w + 8, &a->in6.sin6_addr, 16);
    } else {
        memcpy(w + 8, &a->in.sin_addr, 4);
    }
}

int boot_addr_get(const unsigned char *w, union sock_addr *a)
{
    memset(a, 0, sizeof(*a));
    if (w[0] == 6) {
        a->in6.sin6_family = AF_INET6;
        a->in6.sin6_scope_id = (uint32_t)sock_wire_get(w + 4, 4);
        memcpy(&a->in6.sin6_addr, w + 8, 16);
    } else if (w[0] == 4) {
        a->in.sin_family = AF_INET;
        memcpy(&a->in.sin_addr, w + 8, 4);
    } else {
        return -1;
    }
    int port = (int)sock_wire_get(w + 2, 2);
    sock_addr_set_port(a, port);
    return port > 0 ? 0 : -1;
}

const char *boot_id_addr(const struct boot_id *id, char *buf, size_t n)
{
    union sock_addr a;
    if (boot_id_decode(id, &a, NULL, NULL) != 0) {
        snprintf(buf, n, "(not a bootstrap id)");
        return buf;
    }
    return sock_addr_str(&a, buf, n);
}

/* ---- secrets ---- */

reshard_status_t boot_secret_derive(const void *material, size_t n, const char *label,
                                    unsigned char *out)
{
    /* HMAC keyed with the material: any length of it comes to 32 bytes that say nothing of it. */
    return boot_mac(material, n, label, NULL, 0, out);
}

reshard_status_t boot_random(void *p, size_t n)
{
    unsigned char *at = p;
    while (n > 0) {
        ssize_t k = getrandom(at, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: getrandom: %m");
        at += k;
        n -= (size_t)k;
    }
    return RESHARD_OK;
}

/* ---- the registry ---- */

/* Listening sockets of the ids this process made, for its rank 0 to take. */
static pthread_mutex_t boot_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct boot_registered {
    struct boot_id id;
    int fd;
} * boot_registry;
static size_t boot_registry_len, boot_registry_cap;

static reshard_status_t boot_registry_add(const struct boot_id *id, int fd)
{
    reshard_status_t st = RESHARD_OK;
    pthread_mutex_lock(&boot_registry_lock);
    struct boot_registered *r = rs_grow(boot_registry, &boot_registry_cap, boot_registry_len + 1,
                                        sizeof(*r), "bootstrap registry");
    if (r) {
        boot_registry = r;
        boot_registry[boot_registry_len++] = (struct boot_registered){*id, fd};
    } else {
        st = RESHARD_ERR_NO_MEMORY;
    }
    pthread_mutex_unlock(&boot_registry_lock);
    return st;
}

int boot_registry_take(const struct boot_id *id)
{
    int fd = -1;
    pthread_mutex_lock(&boot_registry_lock);
    for (size_t i = 0; i < boot_registry_len; i++) {
        if (memcmp(boot_registry[i].id.bytes, id->bytes, BOOT_ID_BYTES) == 0) {
            fd = boot_registry[i].fd;
            boot_registry[i] = boot_registry[--boot_registry_len];
            break;
        }
    }
    pthread_mutex_unlock(&boot_registry_lock);
    return fd;
}

void boot_id_release(const struct boot_id *id)
{
    int fd = boot_registry_take(id);
    sock_close(&fd);
}

/* ---- making ids ---- */

reshard_status_t boot_param_port(int *port)
{
    int64_t p = rs_param_int(RS_PARAM_BOOT_PORT);
    if (p < 0 || p > 65535)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: RESHARD_BOOT_PORT=%lld is not a port",
                        (long long)p);
    *port = (int)p;
    return RESHARD_OK;
}

/* A fresh secret for a listener at a (its port written back), registered for rank 0 here. */
static reshard_status_t boot_id_listen(union sock_addr *a, struct boot_id *out)
{
    unsigned char secret[BOOT_SECRET_BYTES];
    struct boot_id made;
    reshard_status_t st;
    int fd;
    RS_CHECK(boot_random(secret, sizeof(secret)));
    RS_CHECK(sock_listen(a, &fd));
    boot_id_encode(a, secret, 0, &made);
    RS_CHECK_GOTO(boot_registry_add(&made, fd), st, err_close);
    *out = made;
    return RESHARD_OK;
err_close:
    sock_close(&fd);
    return st;
}

reshard_status_t boot_id_create(struct boot_id *id)
{
    const char *host = rs_param_str(RS_PARAM_BOOT_ADDR);
    union sock_addr a;
    int port = 0;
    RS_CHECK(boot_param_port(&port));
    /* A name in RESHARD_BOOT_ADDR is looked up here, so the id carries what peers dial. */
    if (host[0])
        RS_CHECK(sock_resolve(host, port, &a));
    else
        RS_CHECK(sock_default_addr(&a));
    sock_addr_set_port(&a, port);
    return boot_id_listen(&a, id);
}

reshard_status_t boot_id_from_addr(const char *host, int port, const char *secret,
                                   struct boot_id *id)
{
    union sock_addr a;
    unsigned char derived[BOOT_SECRET_BYTES];
    if (!host || !*host || !secret || !id)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: boot_id_from_addr needs a host, a "
                                                 "secret and an id to fill");
    if (port < 1 || port > 65535)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: port %d is not in 1..65535", port);
    RS_CHECK(sock_resolve(host, port, &a));
    RS_CHECK(boot_secret_derive(secret, strlen(secret), "reshard job secret", derived));
    boot_id_encode(&a, derived, 0, id);
    return RESHARD_OK;
}

reshard_status_t boot_listener_id(const struct boot *b, int rank, struct boot_id *out)
{
    static const unsigned char none[BOOT_SECRET_BYTES];
    union sock_addr a;
    if (!b || rank < 0 || rank >= b->size || !b->addrs ||
        boot_addr_get(b->addrs + (size_t)rank * BOOT_ADDR_BYTES, &a))
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: no listener of rank %d is known",
                        rank);
    boot_id_encode(&a, none, 0, out);
    return RESHARD_OK;
}

reshard_status_t boot_group_id(const struct boot *b, int root, const void *salt, size_t n,
                               struct boot_id *out)
{
    union sock_addr a;
    unsigned char secret[BOOT_SECRET_BYTES];
    struct boot_id made;
    if (!b || root < 0 || root >= b->size || !b->addrs ||
        boot_addr_get(b->addrs + (size_t)root * BOOT_ADDR_BYTES, &a))
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "bootstrap: no listener of rank %d to meet at (a bootstrap of %d ranks)",
                        root, b ? b->size : 0);
    const struct boot_mac_part part = {salt, n};
    RS_CHECK(boot_mac(b->secret, BOOT_SECRET_BYTES, "reshard group secret", &part, 1, secret));
    boot_id_encode(&a, secret, 0, &made);
    if (root == b->rank) { /* this rank serves it: its own listener, as boot_id_create does */
        int fd = fcntl(b->lfd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: dup of the listener: %m");
        reshard_status_t st = boot_registry_add(&made, fd);
        if (st != RESHARD_OK) {
            close(fd);
            return st;
        }
    }
    *out = made;
    return RESHARD_OK;
}
