/* SPDX-License-Identifier: Apache-2.0 */
/* Bootstrap ids (bootstrap.h): their codec, their secrets, and the registry of the listeners
 * this process opened for them, which its rank 0 takes over. */
#include "boot_int.h"

#include "base/param.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#define BOOT_ID_MAGIC 0x52534944u /* "RSID" */

/* ---- the codec ---- */

void boot_id_encode(const union sock_addr *a, const unsigned char *secret, struct boot_id *id)
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
}

int boot_id_decode(const struct boot_id *id, union sock_addr *a, unsigned char *secret)
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
    return 0;
}

const char *boot_id_addr(const struct boot_id *id, char *buf, size_t n)
{
    union sock_addr a;
    if (boot_id_decode(id, &a, NULL) != 0) {
        snprintf(buf, n, "(not a bootstrap id)");
        return buf;
    }
    return sock_addr_str(&a, buf, n);
}

/* ---- secrets ---- */

/* Not cryptographic, and need not be: the secret tells one job's ranks from another's and
 * from stray processes, and crosses the network in clear anyway. Four FNV-1a lanes with
 * distinct seeds, each finished by a 64-bit mixer. */
static uint64_t boot_lane_seed(int lane)
{
    return 0xcbf29ce484222325ull ^ (uint64_t)(lane + 1) * 0x9e3779b97f4a7c15ull;
}

static uint64_t boot_lane_byte(uint64_t h, unsigned char c)
{
    return (h ^ c) * 0x100000001b3ull;
}

static uint64_t boot_lane_finish(uint64_t h)
{
    h = (h ^ h >> 33) * 0xff51afd7ed558ccdull;
    h = (h ^ h >> 33) * 0xc4ceb9fe1a85ec53ull;
    return h ^ h >> 33;
}

void boot_secret_hash(const char *s, unsigned char *out)
{
    for (int lane = 0; lane < BOOT_SECRET_BYTES / 8; lane++) {
        uint64_t h = boot_lane_seed(lane);
        for (const unsigned char *p = (const unsigned char *)s; *p; p++)
            h = boot_lane_byte(h, *p);
        sock_wire_put(out + 8 * lane, boot_lane_finish(h), 8);
    }
}

/* The same lanes over a secret and then a salt. */
static void boot_secret_mix(const unsigned char *secret, const void *salt, size_t n,
                            unsigned char *out)
{
    unsigned char mixed[BOOT_SECRET_BYTES];
    for (int lane = 0; lane < BOOT_SECRET_BYTES / 8; lane++) {
        uint64_t h = boot_lane_seed(lane);
        for (int i = 0; i < BOOT_SECRET_BYTES; i++)
            h = boot_lane_byte(h, secret[i]);
        for (size_t i = 0; i < n; i++)
            h = boot_lane_byte(h, ((const unsigned char *)salt)[i]);
        sock_wire_put(mixed + 8 * lane, boot_lane_finish(h), 8);
    }
    memcpy(out, mixed, BOOT_SECRET_BYTES);
}

static reshard_status_t boot_random_bytes(unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t k = getrandom(p, n, 0);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return rs_error(RESHARD_ERR_NETWORK, "bootstrap: getrandom: %m");
        p += k;
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
    RS_CHECK(boot_random_bytes(secret, sizeof(secret)));
    RS_CHECK(sock_listen(a, &fd));
    boot_id_encode(a, secret, &made);
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
    unsigned char hashed[BOOT_SECRET_BYTES];
    if (!host || !*host || !secret || !id)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: boot_id_from_addr needs a host, a "
                                                 "secret and an id to fill");
    if (port < 1 || port > 65535)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: port %d is not in 1..65535", port);
    RS_CHECK(sock_resolve(host, port, &a));
    boot_secret_hash(secret, hashed);
    boot_id_encode(&a, hashed, id);
    return RESHARD_OK;
}

reshard_status_t boot_id_derive(const struct boot_id *id, const void *salt, size_t n,
                                struct boot_id *out)
{
    union sock_addr a;
    unsigned char secret[BOOT_SECRET_BYTES];
    if (boot_id_decode(id, &a, secret) != 0)
        return rs_error(RESHARD_ERR_INVALID_ARG, "bootstrap: not a bootstrap id of this version");
    boot_secret_mix(secret, salt, n, secret);
    struct boot_id made;
    boot_id_encode(&a, secret, &made);
    pthread_mutex_lock(&boot_registry_lock); /* a listener made here now answers to the new id */
    for (size_t i = 0; i < boot_registry_len; i++)
        if (memcmp(boot_registry[i].id.bytes, id->bytes, BOOT_ID_BYTES) == 0)
            boot_registry[i].id = made;
    pthread_mutex_unlock(&boot_registry_lock);
    *out = made;
    return RESHARD_OK;
}

reshard_status_t boot_spare_id(const struct boot *b, struct boot_id *id)
{
    union sock_addr a;
    int via = b->rank == 0 ? (b->size > 1 ? 1 : -1) : 0;
    if (via < 0 || sock_local_addr(b->conns[via].fd, &a) != 0) {
        memset(&a, 0, sizeof(a));
        a.in.sin_family = AF_INET; /* alone: nobody will dial it but this process */
        a.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    }
    sock_addr_set_port(&a, 0);
    return boot_id_listen(&a, id);
}
