/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The plugin's devices and contexts. Devices are found by the first init, from the interfaces
 * that are up, have an address (the ones UCX's TCP transport can use) and are not virtual
 * (RESHARD_NET_DEVICES, in NCCL_SOCKET_IFNAME's syntax, says otherwise), or from the active RDMA
 * ports. The transport is tried on the first device then: when it cannot run here (UCX or
 * verbs missing) the plugin offers no device, so that NCCL falls back to another network
 * instead of failing at the first connect. The last finalize releases everything, so that NCCL
 * may unload the plugin and load it again.
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
#include <unistd.h>

#define NET_MAX_DEVS           64
#define NET_DEFAULT_SPEED_MBPS 10000

struct net_ctx {
    void *handle; /* NCCL's (net_live.h) */
    uint64_t comm_id;
};

/* Bridges and the ends of container and VM links: a handle carrying one of their addresses
 * would send the peer to its own bridge. NCCL's socket transport leaves out docker and virbr
 * (and lo); loopback is left out by its flag unless RESHARD_NET_ALLOW_LO=1. */
static const char *const virtual_prefixes[] = {"docker", "virbr", "veth", "cni", "flannel"};

static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static struct net_dev *devs;
static int ndevs = -1; /* -1: not looked for yet */
static int contexts;
static const struct tp_ops *transport; /* RESHARD_TRANSPORT's choice, made with the devices */

/* Whether name is one of a comma-separated list of name prefixes and =exact names. */
static int in_list(const char *list, const char *name)
{
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        const char *e = p;
        size_t len = n;
        int exact = len && *e == '=';
        if (exact)
            e++, len--;
        if (len && !strncmp(name, e, len) && (!exact || name[len] == '\0'))
            return 1;
        p += n + (p[n] == ',');
    }
    return 0;
}

int net_if_virtual(const char *name)
{
    for (size_t i = 0; i < sizeof(virtual_prefixes) / sizeof(virtual_prefixes[0]); i++)
        if (!strncmp(name, virtual_prefixes[i], strlen(virtual_prefixes[i])))
            return 1;
    return 0;
}

int net_if_selected(const char *list, const char *name)
{
    if (*list == '^')
        return !net_if_virtual(name) && !in_list(list + 1, name);
    return *list ? in_list(list, name) : !net_if_virtual(name);
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
static reshard_status_t discover_ib(struct net_dev **out, int *count)
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
    }
    if (!n)
        rs_log_sub(RS_LOG_WARN, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: no active RDMA port; the plugin offers no device");
    *out = found;
    *count = n;
    return RESHARD_OK;
}

static reshard_status_t discover_ifs(struct net_dev **out, int *count)
{
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
        if (!usable(ifa) || !net_if_selected(rs_param_str(RS_PARAM_NET_DEVICES), ifa->ifa_name))
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
    for (int i = 0; i < n; i++)
        describe(&found[i]);
    if (!n)
        rs_log_sub(RS_LOG_WARN, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: no network interface is up%s%s%s; the plugin offers no device",
                   *rs_param_str(RS_PARAM_NET_DEVICES) ? " matching RESHARD_NET_DEVICES=" : "",
                   rs_param_str(RS_PARAM_NET_DEVICES),
                   rs_param_int(RS_PARAM_NET_ALLOW_LO)
                       ? ""
                       : " (virtual interfaces, and loopback unless RESHARD_NET_ALLOW_LO=1, are "
                         "left out)");
    *out = found;
    *count = n;
    return RESHARD_OK;
}

/* Frees a table of n devices whose transport contexts are closed (their locks made when
 * locked is set). */
static void devs_free(struct net_dev *t, int n, int locked)
{
    for (int i = 0; i < n; i++) {
        free(t[i].pci_path);
        free(t[i].free_peers);
        if (locked)
            pthread_mutex_destroy(&t[i].lock);
    }
    free(t);
}

/* No device: NCCL then uses another network. why is the whole reason. */
static void offer_none(const char *why)
{
    const char *prefix = "NET/Reshard: ";
    rs_log_sub(RS_LOG_WARN, RS_LOGF_INIT | RS_LOGF_NET,
               "%s%s; the plugin offers no device, so NCCL uses another network",
               strncmp(why, prefix, strlen(prefix)) ? prefix : "", why);
}

/* The transport is tried on every device found (each context stays for the device's first
 * connection), so that a missing library, or a device the transport cannot use, is found now
 * and not at NCCL's first connect: those devices are left out, and with none left NCCL falls
 * back to another network. Then the devices are published. No other thread sees them yet. */
static void probe_and_publish(struct net_dev *found, int n)
{
    int kept = 0;
    char why[RS_ERROR_MAX] = "";
    for (int i = 0; i < n; i++) {
        reshard_status_t st = net_dev_tp(&found[i]); /* no lock: not published yet */
        if (st == RESHARD_OK) {
            if (kept != i)
                found[kept] = found[i];
            kept++;
            continue;
        }
        snprintf(why, sizeof(why), "%s", rs_error_message());
        free(found[i].pci_path);
        if (st == RESHARD_ERR_UNAVAILABLE) { /* the library is missing: no device can work */
            for (int j = i + 1; j < n; j++)
                free(found[j].pci_path);
            n = i + 1;
            break;
        }
        rs_log_sub(RS_LOG_WARN, RS_LOGF_INIT | RS_LOGF_NET, "%s; %s is left out", why,
                   found[i].name);
    }
    if (n && !kept)
        offer_none(why);
    for (int i = 0; i < kept; i++) {
        struct net_dev *d = &found[i];
        pthread_mutex_init(&d->lock, NULL);
        char as[SOCK_ADDR_STR];
        if (transport == &tp_ib_ops)
            rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                       "NET/Reshard: device %d %s port %d (ib), %d Mbps", i, d->name, d->port,
                       d->speed_mbps);
        else
            rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                       "NET/Reshard: device %d %s %s, %d Mbps%s%s", i, d->name,
                       sock_addr_str(&d->addr, as, sizeof(as)), d->speed_mbps,
                       d->pci_path ? ", " : "", d->pci_path ? d->pci_path : "");
    }
    devs = found;
    ndevs = kept;
}

static reshard_status_t discover(void)
{
    reshard_status_t st = tp_pick(&transport);
    if (st == RESHARD_ERR_UNAVAILABLE) { /* RESHARD_TRANSPORT=ib without verbs or a port */
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        offer_none(why);
        devs = NULL;
        ndevs = 0;
        return RESHARD_OK;
    }
    RS_CHECK(st);
    struct net_dev *found = NULL;
    int n = 0;
    RS_CHECK(transport == &tp_ib_ops ? discover_ib(&found, &n) : discover_ifs(&found, &n));
    probe_and_publish(found, n);
    return RESHARD_OK;
}

/* ---- fork ---- */

/* A child forked while the plugin is in use shares the parent's UCX worker and verbs objects
 * (their sockets, epoll set and queue pairs): using or destroying them from the child breaks
 * the parent's connections, and UCX aborts in both. So the child forgets all of it at the fork
 * (pthread_atfork): the parent's devices and transport contexts are left allocated and never
 * touched again (in particular never closed: ucp_worker_destroy would take the parent's
 * sockets out of the epoll set they share), every handle the parent issued is refused, and
 * the child's next init finds the devices and makes its own transport state. */
static pid_t forked_from;            /* the parent, when the fork left it the plugin's state */
static struct net_dev *inherited[8]; /* the parents' device tables: kept, never used */
static pthread_once_t fork_hook_once = PTHREAD_ONCE_INIT;

/* The child of a fork; nothing here allocates, locks or logs. */
static void fork_child(void)
{
    pthread_mutex_init(&global_lock, NULL); /* another thread of the parent may have held it */
    net_live_fork_child(net_forget_object);
    if (ndevs < 0)
        return;
    for (size_t i = 0; devs && i < sizeof(inherited) / sizeof(inherited[0]); i++)
        if (!inherited[i]) {
            inherited[i] = devs;
            break;
        }
    forked_from = getppid();
    devs = NULL;
    ndevs = -1;
    contexts = 0;
    transport = NULL;
}

static void hook_fork(void)
{
    if (pthread_atfork(NULL, NULL, fork_child) != 0)
        rs_log(RS_LOG_WARN, "NET/Reshard: pthread_atfork failed: a child forked while the plugin "
                            "is in use would share the parent's transport state");
}

reshard_status_t net_init(uint64_t comm_id, void **out)
{
    pthread_once(&fork_hook_once, hook_fork);
    struct net_ctx *c = rs_calloc(1, sizeof(*c), "NET/Reshard context");
    if (!c)
        return RESHARD_ERR_NO_MEMORY;
    c->comm_id = comm_id;
    if (!(c->handle = net_live_add(c, NET_KIND_CTX))) {
        free(c);
        return RESHARD_ERR_NO_MEMORY;
    }
    pthread_mutex_lock(&global_lock);
    if (forked_from) {
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: process %d was forked from %d while the plugin was in use: the "
                   "parent's contexts, comms and transport state are left to it (never used "
                   "here), and this process makes its own",
                   (int)getpid(), (int)forked_from);
        forked_from = 0;
    }
    reshard_status_t st = ndevs < 0 ? discover() : RESHARD_OK;
    if (st == RESHARD_OK)
        contexts++;
    pthread_mutex_unlock(&global_lock);
    if (st != RESHARD_OK) {
        net_live_drop(c->handle);
        free(c);
        return st;
    }
    *out = c->handle;
    return RESHARD_OK;
}

reshard_status_t net_ctx_check(const void *ctx)
{
    int stale;
    if (net_live_get(ctx, NET_KINDS(NET_KIND_CTX), &stale))
        return RESHARD_OK;
    return rs_error(RESHARD_ERR_INVALID_ARG,
                    "NET/Reshard: %p is not a context that init returned%s", ctx,
                    stale ? " (it was finalized)" : "");
}

/* The last context out closes the transport contexts no comm uses any more and, when no comm
 * or registration is left at all, frees the devices and the registry: a later init finds
 * them again (NCCL unloads the plugin when its last communicator goes). */
static void release_devices(void)
{
    int busy = 0;
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
        busy |= d->users || d->tp;
        pthread_mutex_unlock(&d->lock);
    }
    if (busy || ndevs < 0)
        return;
    devs_free(devs, ndevs, 1);
    devs = NULL;
    ndevs = -1;
    transport = NULL;
    net_live_release();
}

static reshard_status_t finalize(void *ctx, int sweep)
{
    if (!ctx)
        return RESHARD_OK;
    struct net_ctx *c = net_live_get(ctx, NET_KINDS(NET_KIND_CTX), NULL);
    if (!c)
        return net_ctx_check(ctx);
    net_live_drop(c->handle);
    free(c);
    int comms = sweep ? net_close_owned(ctx) : 0, mrs = 0;
    pthread_mutex_lock(&global_lock);
    if (--contexts == 0) {
        if (sweep)
            mrs = net_free_mrs();
        release_devices();
    }
    pthread_mutex_unlock(&global_lock);
    if (comms || mrs)
        rs_log(RS_LOG_INFO,
               "NET/Reshard: finalize closed %d comm(s) and %d registration(s) left open", comms,
               mrs);
    return RESHARD_OK;
}

reshard_status_t net_finalize(void *ctx)
{
    return finalize(ctx, 1);
}

reshard_status_t net_finalize_idle(void *ctx)
{
    return finalize(ctx, 0);
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
    if (st != RESHARD_OK) { /* the transport said what; say whose */
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        return rs_error(st, "NET/Reshard: the %s transport cannot run on %s: %s", transport->name,
                        d->name, *why ? why : rs_status_string(st));
    }
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
