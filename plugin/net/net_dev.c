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

#include "cuda/cuda_lib.h"
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
#define NET_MAX_VDEVS          64 /* virtual NICs, after the physical devices */
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
    if (n > NET_MAX_DEVS)
        n = NET_MAX_DEVS;
    struct net_dev *found =
        rs_calloc(NET_MAX_DEVS + NET_MAX_VDEVS, sizeof(*found), "network devices");
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
    struct net_dev *found =
        rs_calloc(NET_MAX_DEVS + NET_MAX_VDEVS, sizeof(*found), "network devices");
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

int net_device_as_host(void)
{
    return rs_param_int(RS_PARAM_TEST_DEVICE_AS_HOST) == 1;
}

/* What memory NCCL may hand device d (its transport context made): host memory always; device
 * memory (NCCL_PTR_CUDA) where the CUDA driver is present and the transport registers it for
 * the NIC to reach directly (GPUDirect RDMA), and as dma-bufs (NCCL_PTR_DMABUF) where it takes
 * those. Said once at INFO, with the reason when device memory is off: NCCL then stages every
 * byte through host memory. */
static void gdr_probe(struct net_dev *d)
{
    struct rs_saved_error saved;
    rs_error_save(&saved);
    char why[RS_ERROR_MAX] = "", dmabuf_why[RS_ERROR_MAX] = "";
    const struct cuda_fns *cu = rs_param_int(RS_PARAM_GPUDIRECT) ? cuda_lib() : NULL;
    d->ptr_support = NET_PTR_HOST;
    if (!rs_param_int(RS_PARAM_GPUDIRECT))
        snprintf(why, sizeof(why), "RESHARD_GPUDIRECT=0");
    else if (!cu)
        snprintf(why, sizeof(why), "no CUDA driver (%s)", rs_error_message());
    else if (net_device_as_host()) /* the stand-in's device memory is host memory */
        d->ptr_support |= NET_PTR_CUDA | NET_PTR_DMABUF;
    else if (!d->tp->device_mem)
        snprintf(why, sizeof(why), "%s", d->tp->device_mem_why);
    else if (d->tp->dmabuf && d->tp->ops->mem_reg_dmabuf)
        d->ptr_support |= NET_PTR_CUDA | NET_PTR_DMABUF;
    else {
        d->ptr_support |= NET_PTR_CUDA;
        snprintf(dmabuf_why, sizeof(dmabuf_why), "; no dma-bufs: %s",
                 d->tp->ops->mem_reg_dmabuf ? "peer memory only" : "the transport takes none");
    }
    rs_error_restore(&saved);
    if (why[0])
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: %s takes host memory only (no GPUDirect RDMA): %s", d->name, why);
    else
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: %s takes device memory (GPUDirect RDMA%s%s)%s", d->name,
                   d->ptr_support & NET_PTR_DMABUF ? ", dma-buf" : "",
                   net_device_as_host() ? ", registered as host memory: "
                                          "RESHARD_TEST_DEVICE_AS_HOST=1"
                                        : "",
                   dmabuf_why);
}

/* No device: NCCL then uses another network. why is the whole reason. */
static void offer_none(const char *why)
{
    const char *prefix = "NET/Reshard: ";
    rs_log_sub(RS_LOG_WARN, RS_LOGF_INIT | RS_LOGF_NET,
               "%s%s; the plugin offers no device, so NCCL uses another network",
               strncmp(why, prefix, strlen(prefix)) ? prefix : "", why);
}

/* v12's rail and plane of each physical device. RDMA ports: the rail is the HCA's place in
 * the order the ports were found (RESHARD_IB_HCA's, else the devices', which follows their PCI
 * order), the plane the port's place among its HCA's ports. Interfaces: the rail is the place
 * among those with a PCI device, one plane each; without a PCI device both stay unknown. */
static void place(struct net_dev *t, int n)
{
    for (int i = 0; i < n; i++) {
        struct net_dev *d = &t[i];
        d->members[0] = i;
        d->rail_id = d->plane_id = -1;
        int rail = 0, plane = 0, first = 1;
        for (int j = 0; j < i; j++) {
            if (transport == &tp_ib_ops) {
                int same = !strcmp(t[j].name, d->name);
                plane += same;
                first &= !same;
                int seen = 0; /* a device counts once, at its first port */
                for (int k = 0; k < j && !seen; k++)
                    seen = !strcmp(t[k].name, t[j].name);
                rail += !same && !seen;
            } else {
                rail += t[j].pci_path != NULL;
            }
        }
        if (transport == &tp_ib_ops) {
            if (!first) { /* the rail of the HCA's first port */
                int j = 0;
                while (strcmp(t[j].name, d->name))
                    j++;
                rail = t[j].rail_id;
            }
            d->rail_id = rail, d->plane_id = plane;
        } else if (d->pci_path) {
            d->rail_id = rail, d->plane_id = 0;
        }
    }
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
        found[i].nmembers = found[i].nrails = 1;
        snprintf(found[i].rail_dev[0], sizeof(found[i].rail_dev[0]), "%s",
                 transport == &tp_ib_ops ? found[i].tp_dev : found[i].name);
        reshard_status_t st = net_dev_tp(&found[i]); /* no lock: not published yet */
        if (st == RESHARD_OK) {
            gdr_probe(&found[i]);
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
    place(found, kept);
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
            for (int r = d->nrails - 1; r >= 0; r--) /* completes, then drops, what the dead
                                                      * comms held */
                net_rail(d, r)->ops->close(net_rail(d, r));
            d->tp = NULL;
            memset(d->more, 0, sizeof(d->more));
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
        .ptr_support = d->ptr_support,
        .speed_mbps = d->speed_mbps,
        .port = d->port,
        .latency_us = 0,
        .max_comms = 65536,
        .max_recvs = NET_MAX_RECVS,
        .max_p2p_bytes = NET_MAX_MESSAGE,
        .max_coll_bytes = NET_MAX_MESSAGE,
        .ndevs = d->nmembers,
        .rail_id = d->rail_id,
        .plane_id = d->plane_id,
    };
    memcpy(out->devs, d->members, sizeof(int) * (size_t)d->nmembers);
    return RESHARD_OK;
}

/* Appends sep and s to the string in dst (cap bytes), cutting what does not fit. */
static void append(char *dst, size_t cap, const char *sep, const char *s)
{
    size_t at = strlen(dst);
    for (const char *p = sep; *p && at + 1 < cap; p++)
        dst[at++] = *p;
    for (const char *p = s; *p && at + 1 < cap; p++)
        dst[at++] = *p;
    dst[at] = '\0';
}

/* A virtual NIC: named for its members ("mlx5_0+mlx5_1"), as fast as all of them, on the
 * first one's PCI path, rail and node; it takes the memory every member takes. Its transport
 * contexts are its own, made at its first connection like a physical device's. */
reshard_status_t net_make_vdevice(const int *list, int n, int max, int *out)
{
    RS_CHECK(check_init());
    if (!list || !out || n < 2 || n > max || n > NET_MAX_RAILS)
        return rs_error(RESHARD_ERR_INVALID_ARG,
                        "NET/Reshard: makeVDevice of %d devices (2 to %d, with a list)", n,
                        max < NET_MAX_RAILS ? max : NET_MAX_RAILS);
    pthread_mutex_lock(&global_lock);
    reshard_status_t st = RESHARD_OK;
    int phys = 0;
    while (phys < ndevs && devs[phys].nmembers == 1)
        phys++;
    for (int i = 0; i < n && st == RESHARD_OK; i++) {
        if (list[i] < 0 || list[i] >= phys || devs[list[i]].nmembers != 1)
            st = rs_error(RESHARD_ERR_INVALID_ARG,
                          "NET/Reshard: makeVDevice: device %d is not one of the %d physical "
                          "devices",
                          list[i], phys);
        for (int j = 0; j < i && st == RESHARD_OK; j++)
            if (list[j] == list[i])
                st = rs_error(RESHARD_ERR_INVALID_ARG,
                              "NET/Reshard: makeVDevice: device %d is listed twice", list[i]);
    }
    for (int v = phys; v < ndevs && st == RESHARD_OK; v++) /* made already: the same one */
        if (devs[v].nmembers == n && !memcmp(devs[v].members, list, sizeof(int) * (size_t)n)) {
            *out = v;
            pthread_mutex_unlock(&global_lock);
            return RESHARD_OK;
        }
    if (st == RESHARD_OK && ndevs >= NET_MAX_DEVS + NET_MAX_VDEVS)
        st = rs_error(RESHARD_ERR_TOO_LARGE, "NET/Reshard: makeVDevice: %d devices already", ndevs);
    if (st != RESHARD_OK) {
        pthread_mutex_unlock(&global_lock);
        return st;
    }
    struct net_dev *v = &devs[ndevs];
    const struct net_dev *m0 = &devs[list[0]];
    *v = (struct net_dev){.addr = m0->addr,
                          .port = m0->port,
                          .guid = m0->guid,
                          .pci_path = m0->pci_path ? strdup(m0->pci_path) : NULL,
                          .ptr_support = m0->ptr_support,
                          .rail_id = m0->rail_id,
                          .plane_id = m0->plane_id,
                          .nmembers = n,
                          .nrails = transport->send_part ? n : 1};
    char name[sizeof(v->name)] = "", joined[sizeof(v->rail_dev[0])] = "";
    for (int i = 0; i < n; i++) {
        const struct net_dev *m = &devs[list[i]];
        v->members[i] = list[i];
        v->speed_mbps += m->speed_mbps;
        v->ptr_support &= m->ptr_support;
        if (m->plane_id != v->plane_id)
            v->plane_id = -1; /* it spans planes */
        append(name, sizeof(name), i ? "+" : "", m->name);
        memcpy(v->rail_dev[i], m->rail_dev[0], sizeof(v->rail_dev[i]));
        append(joined, sizeof(joined), i ? "," : "", m->name);
    }
    memcpy(v->name, name, sizeof(v->name));
    if (v->nrails == 1) /* UCX: one context on every member's interface */
        snprintf(v->rail_dev[0], sizeof(v->rail_dev[0]), "%s", joined);
    pthread_mutex_init(&v->lock, NULL);
    *out = ndevs++;
    pthread_mutex_unlock(&global_lock);
    rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
               "NET/Reshard: device %d is a virtual NIC of %s, %d Mbps: %s", *out, v->name,
               v->speed_mbps,
               v->nrails > 1 ? "each message striped over its ports' queue pairs"
                             : "one UCX context over its interfaces (UCX spreads over its lanes)");
    return RESHARD_OK;
}

static reshard_status_t rail_init(struct net_dev *d, int r, struct tp_ctx **out)
{
    struct tp_config cfg = {
        .rank = 0,
        .size = 0,
        .tls = rs_param_str(RS_PARAM_NET_TLS),
        .devices = d->rail_dev[r],
        .peer_errors = (int)rs_param_int(RS_PARAM_NET_PEER_ERRORS),
        .serialized = 1, /* NCCL's service and progress threads, under d->lock */
        .local_rank = -1,
    };
    reshard_status_t st = transport->init(&cfg, out);
    if (st != RESHARD_OK) { /* the transport said what; say whose */
        char why[RS_ERROR_MAX];
        snprintf(why, sizeof(why), "%s", rs_error_message());
        return rs_error(st, "NET/Reshard: the %s transport cannot run on %s: %s", transport->name,
                        d->rail_dev[r], *why ? why : rs_status_string(st));
    }
    if (transport == &tp_ib_ops)
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: %s uses verbs (RC, RDMA write)", d->rail_dev[r]);
    else
        rs_log_sub(RS_LOG_INFO, RS_LOGF_INIT | RS_LOGF_NET,
                   "NET/Reshard: %s uses UCX transports '%s'", d->rail_dev[r], cfg.tls);
    return RESHARD_OK;
}

reshard_status_t net_dev_tp(struct net_dev *d)
{
    if (d->tp)
        return RESHARD_OK;
    struct tp_ctx *made[NET_MAX_RAILS] = {0};
    for (int r = 0; r < d->nrails; r++) {
        reshard_status_t st = rail_init(d, r, &made[r]);
        if (st != RESHARD_OK) {
            while (r-- > 0)
                made[r]->ops->close(made[r]);
            return st;
        }
    }
    d->tp = made[0];
    for (int r = 1; r < d->nrails; r++)
        d->more[r - 1] = made[r];
    return RESHARD_OK;
}

void net_dev_progress(struct net_dev *d)
{
    for (int r = 0; r < d->nrails; r++)
        if (net_rail(d, r))
            net_rail(d, r)->ops->progress(net_rail(d, r));
}

#define VNIC_ADDR_MAGIC 0x52535641u /* RSVA: a virtual NIC's framed addresses */

/* One rail: the address as it is. Several: magic, count, then each length (4 bytes) and
 * address, so that the peer gives each of its rails the matching one. */
reshard_status_t net_dev_address(struct net_dev *d, int peer, void *buf, size_t *len)
{
    if (d->nrails == 1)
        return d->tp->ops->address(d->tp, peer, buf, len);
    unsigned char *w = buf;
    size_t cap = *len, at = 8;
    if (cap < at)
        return rs_error(RESHARD_ERR_TOO_LARGE, "NET/Reshard: no room for %s's addresses", d->name);
    uint32_t head[2] = {VNIC_ADDR_MAGIC, (uint32_t)d->nrails};
    memcpy(w, head, sizeof(head));
    for (int r = 0; r < d->nrails; r++) {
        if (cap < at + 4)
            return rs_error(RESHARD_ERR_TOO_LARGE, "NET/Reshard: no room for %s's addresses",
                            d->name);
        size_t n = cap - at - 4;
        RS_CHECK(net_rail(d, r)->ops->address(net_rail(d, r), peer, w + at + 4, &n));
        uint32_t l = (uint32_t)n;
        memcpy(w + at, &l, 4);
        at += 4 + n;
    }
    *len = at;
    return RESHARD_OK;
}

reshard_status_t net_dev_set_peer(struct net_dev *d, int peer, const void *addr, size_t len)
{
    if (d->nrails == 1) {
        RS_CHECK(d->tp->ops->set_peer(d->tp, peer, addr, len));
        return d->tp->ops->connect(d->tp, peer);
    }
    const unsigned char *a = addr;
    uint32_t head[2] = {0, 0};
    if (len >= sizeof(head))
        memcpy(head, a, sizeof(head));
    if (head[0] != VNIC_ADDR_MAGIC || head[1] != (uint32_t)d->nrails)
        return rs_error(RESHARD_ERR_MISMATCH,
                        "NET/Reshard: the peer of %s is not a virtual NIC of %d rails (NCCL must "
                        "merge the same ports on every node)",
                        d->name, d->nrails);
    size_t at = sizeof(head);
    for (int r = 0; r < d->nrails; r++) {
        uint32_t l = 0;
        if (len - at >= 4)
            memcpy(&l, a + at, 4);
        if (len - at < 4 || l > len - at - 4)
            return rs_error(RESHARD_ERR_NETWORK,
                            "NET/Reshard: the peer's addresses for %s are "
                            "cut short",
                            d->name);
        RS_CHECK(net_rail(d, r)->ops->set_peer(net_rail(d, r), peer, a + at + 4, l));
        RS_CHECK(net_rail(d, r)->ops->connect(net_rail(d, r), peer));
        at += 4 + l;
    }
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
