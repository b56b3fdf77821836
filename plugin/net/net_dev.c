/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin's devices and contexts. Devices are found once per process, from the interfaces
 * that are up and have an address (the ones UCX's TCP transport can use), and stay for the
 * process's life so that the names handed to NCCL stay valid. Their transport contexts are
 * made on first use and released by the last finalize.
 */
#include "net_int.h"

#include "transport/ib/ib_dev.h"

#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <ifaddrs.h>
#include <limits.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NET_MAX_DEVS           64
#define NET_DEFAULT_SPEED_MBPS 10000

struct net_ctx {
    uint32_t magic;
    uint64_t comm_id;
};

static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static struct net_dev *devs;
static int ndevs = -1; /* -1: not looked for yet */
static int contexts;
static const struct tp_ops *transport; /* RESHARD_TRANSPORT's choice, made with the devices */

/* RESHARD_NET_DEVICES: comma-separated name prefixes; empty takes every interface. */
static int wanted(const char *name)
{
    const char *list = rs_param_str(RS_PARAM_NET_DEVICES);
    if (!*list)
        return 1;
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        if (n && !strncmp(name, p, n))
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

static int read_sys(const char *ifname, const char *file, char *buf, size_t n)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "/sys/class/net/%s/%s", ifname, file);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    return ok ? 0 : -1;
}

static void describe(struct net_dev *d)
{
    char buf[128], path[PATH_MAX];
    d->speed_mbps = read_sys(d->name, "speed", buf, sizeof(buf)) == 0 ? atoi(buf) : -1;
    if (d->speed_mbps <= 0) {
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: %s reports no link speed; assuming %d Mbps", d->name,
                   NET_DEFAULT_SPEED_MBPS);
        d->speed_mbps = NET_DEFAULT_SPEED_MBPS;
    }
    snprintf(buf, sizeof(buf), "/sys/class/net/%s/device", d->name);
    if (realpath(buf, path) && !strncmp(path, "/sys/devices/pci", 16))
        d->pci_path = strdup(path);
    unsigned m[6];
    if (read_sys(d->name, "address", buf, sizeof(buf)) == 0 &&
        sscanf(buf, "%x:%x:%x:%x:%x:%x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) == 6 &&
        (m[0] | m[1] | m[2] | m[3] | m[4] | m[5])) {
        for (int i = 0; i < 6; i++)
            d->guid = d->guid << 8 | (m[i] & 0xff);
    } else { /* no hardware address (loopback): the interface index keeps guids distinct */
        d->guid = 0xffff000000000000ull | if_nametoindex(d->name);
    }
}

/* IPv4 is preferred; IPv6 link-local addresses need a scope and are left out. */
static int usable(const struct ifaddrs *ifa)
{
    if (!ifa->ifa_addr || (ifa->ifa_flags & (IFF_UP | IFF_RUNNING)) != (IFF_UP | IFF_RUNNING))
        return 0;
    if ((ifa->ifa_flags & IFF_LOOPBACK) && !rs_param_int(RS_PARAM_NET_ALLOW_LO))
        return 0;
    if (ifa->ifa_addr->sa_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)ifa->ifa_addr;
        return !IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr);
    }
    return ifa->ifa_addr->sa_family == AF_INET;
}

/* RESHARD_TRANSPORT=ib (or auto with an active port): the devices are the RDMA ports, each
 * with its real speed; the plugin's handshake listens on the port's IPv4 (RoCE) or the
 * host's default address. */
static reshard_status_t discover_ib(void)
{
    const struct ib_port *ports;
    int n;
    RS_CHECK(ib_ports(&ports, &n));
    struct net_dev *found = rs_calloc(n ? (size_t)n : 1, sizeof(*found), "network devices");
    if (!found)
        return RESHARD_ERR_NO_MEMORY;
    for (int i = 0; i < n; i++) {
        struct net_dev *d = &found[i];
        const struct ib_port *p = &ports[i];
        snprintf(d->name, sizeof(d->name), "%s", p->dev);
        snprintf(d->tp_dev, sizeof(d->tp_dev), "=%s:%d", p->dev, p->port);
        d->port = p->port;
        d->speed_mbps = p->speed_mbps;
        d->guid = p->guid;
        d->pci_path = p->pci_path ? strdup(p->pci_path) : NULL;
        if (ib_port_ipv4(p, &d->addr.in.sin_addr))
            d->addr.in.sin_family = AF_INET;
        else if (sock_default_addr(&d->addr) != RESHARD_OK)
            d->addr.in = (struct sockaddr_in){.sin_family = AF_INET,
                                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        pthread_mutex_init(&d->lock, NULL);
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: device %d %s port %d (ib), %d Mbps", i, d->name, d->port,
                   d->speed_mbps);
    }
    if (!n)
        rs_log_sub(RS_LOG_WARN, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: no active RDMA port; the plugin offers no device");
    devs = found;
    ndevs = n;
    return RESHARD_OK;
}

static reshard_status_t discover(void)
{
    RS_CHECK(tp_pick(&transport));
    if (transport == &tp_ib_ops)
        return discover_ib();
    struct ifaddrs *all;
    if (getifaddrs(&all) != 0)
        return rs_error(RESHARD_ERR_NETWORK, "NET/Reshard: getifaddrs: %m");
    struct net_dev *found = rs_calloc(NET_MAX_DEVS, sizeof(*found), "network devices");
    if (!found) {
        freeifaddrs(all);
        return RESHARD_ERR_NO_MEMORY;
    }
    int n = 0;
    for (struct ifaddrs *ifa = all; ifa; ifa = ifa->ifa_next) {
        if (!usable(ifa) || !wanted(ifa->ifa_name))
            continue;
        int i = 0;
        while (i < n && strcmp(found[i].name, ifa->ifa_name))
            i++;
        if (i == n && n == NET_MAX_DEVS)
            continue;
        if (i < n &&
            !(found[i].addr.sa.sa_family == AF_INET6 && ifa->ifa_addr->sa_family == AF_INET))
            continue; /* has an address already, and not an IPv6 one an IPv4 one replaces */
        struct net_dev *d = &found[i];
        snprintf(d->name, sizeof(d->name), "%s", ifa->ifa_name);
        memcpy(&d->addr, ifa->ifa_addr,
               ifa->ifa_addr->sa_family == AF_INET ? sizeof(d->addr.in) : sizeof(d->addr.in6));
        n += i == n;
    }
    freeifaddrs(all);
    for (int i = 0; i < n; i++) {
        describe(&found[i]);
        pthread_mutex_init(&found[i].lock, NULL);
        char as[SOCK_ADDR_STR];
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: device %d %s %s, %d Mbps%s%s", i, found[i].name,
                   sock_addr_str(&found[i].addr, as, sizeof(as)), found[i].speed_mbps,
                   found[i].pci_path ? ", " : "", found[i].pci_path ? found[i].pci_path : "");
    }
    if (!n)
        rs_log_sub(RS_LOG_WARN, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: no network interface is up%s%s%s; the plugin offers no device",
                   rs_param_int(RS_PARAM_NET_ALLOW_LO) ? ""
                                                       : " (loopback is left out unless "
                                                         "RESHARD_NET_ALLOW_LO=1)",
                   *rs_param_str(RS_PARAM_NET_DEVICES) ? " matching RESHARD_NET_DEVICES=" : "",
                   rs_param_str(RS_PARAM_NET_DEVICES));
    devs = found;
    ndevs = n;
    return RESHARD_OK;
}

reshard_status_t net_init(uint64_t comm_id, struct net_ctx **out)
{
    struct net_ctx *c = rs_calloc(1, sizeof(*c), "NET/Reshard context");
    if (!c)
        return RESHARD_ERR_NO_MEMORY;
    c->magic = NET_MAGIC_CTX;
    c->comm_id = comm_id;
    pthread_mutex_lock(&global_lock);
    reshard_status_t st = ndevs < 0 ? discover() : RESHARD_OK;
    if (st == RESHARD_OK)
        contexts++;
    pthread_mutex_unlock(&global_lock);
    if (st != RESHARD_OK) {
        free(c);
        return st;
    }
    *out = c;
    return RESHARD_OK;
}

reshard_status_t net_check_ctx(const struct net_ctx *ctx)
{
    if (!ctx || ctx->magic != NET_MAGIC_CTX)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: %p is not a context that init returned (or it was "
                        "finalized)",
                        (const void *)ctx);
    return RESHARD_OK;
}

/* The last context out releases the transport contexts of devices no comm uses any more. */
static void release_devices(void)
{
    for (int i = 0; i < ndevs; i++) {
        struct net_dev *d = &devs[i];
        pthread_mutex_lock(&d->lock);
        if (d->tp && !d->users) {
            d->tp->ops->close(d->tp); /* completes, then drops, what the dead comms held */
            d->tp = NULL;
            d->next_peer = 0;
            d->n_free = 0;
            while (d->dead) {
                struct net_comm *c = d->dead;
                d->dead = c->next_dead;
                net_comm_free(c);
            }
        }
        pthread_mutex_unlock(&d->lock);
    }
}

reshard_status_t net_finalize(struct net_ctx *ctx)
{
    if (!ctx)
        return RESHARD_OK;
    RS_CHECK(net_check_ctx(ctx));
    ctx->magic = NET_MAGIC_DEAD;
    free(ctx);
    pthread_mutex_lock(&global_lock);
    if (--contexts == 0)
        release_devices();
    pthread_mutex_unlock(&global_lock);
    return RESHARD_OK;
}

static reshard_status_t check_init(void)
{
    if (ndevs < 0)
        return rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: called before init");
    return RESHARD_OK;
}

reshard_status_t net_devices(int *ndev)
{
    RS_CHECK(check_init());
    *ndev = ndevs;
    return RESHARD_OK;
}

int net_dev_count(void)
{
    return ndevs < 0 ? 0 : ndevs;
}

struct net_dev *net_dev_get(int dev)
{
    if (ndevs < 0 || dev < 0 || dev >= ndevs) {
        rs_error(RESHARD_ERR_INVALID_ARG, "NET/Reshard: device %d does not exist (%d devices)", dev,
                 ndevs < 0 ? 0 : ndevs);
        return NULL;
    }
    return &devs[dev];
}

reshard_status_t net_properties(int dev, struct net_props *out)
{
    RS_CHECK(check_init());
    const struct net_dev *d = net_dev_get(dev);
    if (!d)
        return RESHARD_ERR_INVALID_ARG;
    *out = (struct net_props){
        .name = d->name,
        .pci_path = d->pci_path,
        .guid = d->guid,
        .ptr_support = NET_PTR_HOST,
        .speed_mbps = d->speed_mbps,
        .port = d->port,
        .latency_us = 0,
        .max_comms = 65536,
        .max_recvs = NET_MAX_RECVS,
        .max_p2p_bytes = NET_MAX_MESSAGE,
        .max_coll_bytes = NET_MAX_MESSAGE,
    };
    return RESHARD_OK;
}

reshard_status_t net_dev_tp(struct net_dev *d)
{
    if (d->tp)
        return RESHARD_OK;
    struct tp_config cfg = {
        .rank = 0,
        .size = 0,
        .tls = rs_param_str(RS_PARAM_NET_TLS),
        .devices = transport == &tp_ib_ops ? d->tp_dev : d->name,
        .peer_errors = (int)rs_param_int(RS_PARAM_NET_PEER_ERRORS),
        .serialized = 1, /* NCCL's service and progress threads, under d->lock */
        .local_rank = -1,
    };
    reshard_status_t st = transport->init(&cfg, &d->tp);
    if (st == RESHARD_ERR_UNAVAILABLE && transport == &tp_ucx_ops)
        return rs_error(st, "NET/Reshard: UCX (libucp.so.0) cannot be loaded: install libucx0");
    RS_CHECK(st);
    if (transport == &tp_ib_ops)
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: %s port %d uses verbs (RC, RDMA write)", d->name, d->port);
    else
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: %s uses UCX transports '%s'", d->name, cfg.tls);
    return RESHARD_OK;
}

void net_dev_reap(struct net_dev *d)
{
    for (struct net_comm **p = &d->dead; *p;) {
        struct net_comm *c = *p;
        if (c->in_transport) {
            p = &c->next_dead;
            continue;
        }
        *p = c->next_dead;
        net_comm_free(c);
    }
}

/* dev->lock held. Transport peer numbers: a closed comm's number serves the next one. */
int net_dev_peer_take(struct net_dev *d)
{
    return d->n_free ? d->free_peers[--d->n_free] : d->next_peer++;
}

void net_dev_peer_give(struct net_dev *d, int peer)
{
    int *grown = rs_grow(d->free_peers, &d->free_cap, d->n_free + 1, sizeof(int),
                         "NET/Reshard peer indices");
    if (grown) { /* else the index is not reused, which only costs a table entry */
        d->free_peers = grown;
        d->free_peers[d->n_free++] = peer;
    }
}
