/* SPDX-License-Identifier: Apache-2.0 */
/*
 * RDMA port discovery. A port is usable when it is ACTIVE; on Ethernet (RoCE) it is addressed
 * by a GID whose type is RoCE v2 and whose value maps an IPv4 address (routable, and the one
 * every RoCE fabric configures), or by RESHARD_IB_GID_INDEX; on InfiniBand by its LID.
 */
#include "ib_dev.h"
#include "ib_lib.h"

#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <arpa/inet.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define IB_MAX_PORTS 64
#define GID_SCAN_MAX 128 /* entries of the GID table looked at */

static struct ib_port found[IB_MAX_PORTS];
static int nfound;
static reshard_status_t found_status = RESHARD_ERR_UNAVAILABLE;
static char found_error[256];
static pthread_once_t found_once = PTHREAD_ONCE_INIT;

int ib_hca_selects(const char *list, const char *dev, int port)
{
    if (!list || !*list)
        return 1;
    int exclude = *list == '^', exact = 0;
    list += exclude;
    exact = *list == '=';
    list += exact;
    int hit = 0;
    for (const char *p = list; *p && !hit;) {
        size_t n = strcspn(p, ","), name_len = strcspn(p, ":,");
        int want_port = name_len < n ? atoi(p + name_len + 1) : 0;
        if (name_len && (exact ? strlen(dev) == name_len : 1) && !strncmp(dev, p, name_len) &&
            (!want_port || want_port == port))
            hit = 1;
        p += n + (p[n] == ',');
    }
    return exclude ? !hit : hit;
}

const char *ib_gid_str(const uint8_t gid[16], char *buf, size_t n)
{
    if (!inet_ntop(AF_INET6, gid, buf, (socklen_t)n))
        snprintf(buf, n, "?");
    return buf;
}

/* Gb/s of one lane for ibv_port_attr.active_speed, and the lanes of active_width. */
static int lane_mbps(int speed)
{
    switch (speed) {
    case 1:
        return 2500; /* SDR */
    case 2:
        return 5000; /* DDR */
    case 4:
    case 8:
        return 10000; /* QDR, FDR10 */
    case 16:
        return 14000; /* FDR */
    case 32:
        return 25000; /* EDR */
    case 64:
        return 50000; /* HDR */
    case 128:
        return 100000; /* NDR */
    case 256:
        return 200000; /* XDR */
    }
    return 10000;
}

static int lanes(int width)
{
    switch (width) {
    case 2:
        return 4;
    case 4:
        return 8;
    case 8:
        return 12;
    case 16:
        return 2;
    }
    return 1;
}

static int read_line(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    int ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (ok)
        buf[strcspn(buf, "\n")] = '\0';
    return ok ? 0 : -1;
}

/* A RoCE v2 entry, by sysfs (where it is missing, any type is taken). */
static int roce_v2(const char *dev, int port, int index)
{
    char path[PATH_MAX], type[64];
    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", dev, port,
             index);
    if (read_line(path, type, sizeof(type)) != 0)
        return 1;
    return !strcmp(type, "RoCE v2");
}

static int ipv4_mapped(const uint8_t g[16])
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return !memcmp(g, prefix, sizeof(prefix));
}

int ib_port_ipv4(const struct ib_port *p, void *in4)
{
    if (p->link_layer != IBV_LINK_LAYER_ETHERNET || !ipv4_mapped(p->gid))
        return 0;
    memcpy(in4, p->gid + 12, 4);
    return 1;
}

static reshard_status_t pick_gid(const struct ib_fns *f, struct ibv_context *ctx,
                                 const struct ibv_port_attr *pa, struct ib_port *p)
{
    union ibv_gid gid;
    int forced = (int)rs_param_int(RS_PARAM_IB_GID_INDEX);
    if (forced >= 0) {
        if (forced >= pa->gid_tbl_len || f->query_gid(ctx, (uint8_t)p->port, forced, &gid))
            return rs_error(RESHARD_ERR_INVALID_ARG,
                            "ib: RESHARD_IB_GID_INDEX=%d: %s has no such GID (table of %d)", forced,
                            p->name, pa->gid_tbl_len);
        p->gid_index = forced;
        memcpy(p->gid, gid.raw, 16);
        return RESHARD_OK;
    }
    if (pa->link_layer != IBV_LINK_LAYER_ETHERNET) {
        p->gid_index = 0; /* InfiniBand routes by LID; GID 0 is the port GID */
        if (f->query_gid(ctx, (uint8_t)p->port, 0, &gid) == 0)
            memcpy(p->gid, gid.raw, 16);
        return RESHARD_OK;
    }
    int fallback = -1;
    for (int i = 0; i < pa->gid_tbl_len && i < GID_SCAN_MAX; i++) {
        if (f->query_gid(ctx, (uint8_t)p->port, i, &gid) != 0)
            continue;
        static const uint8_t zero[16];
        if (!memcmp(gid.raw, zero, 16) || !roce_v2(p->dev, p->port, i))
            continue;
        if (ipv4_mapped(gid.raw)) {
            p->gid_index = i;
            memcpy(p->gid, gid.raw, 16);
            return RESHARD_OK;
        }
        if (fallback < 0)
            fallback = i;
    }
    if (fallback < 0)
        return rs_error(RESHARD_ERR_UNAVAILABLE,
                        "ib: %s has no RoCE v2 GID (give its netdev an address, or set "
                        "RESHARD_IB_GID_INDEX)",
                        p->name);
    f->query_gid(ctx, (uint8_t)p->port, fallback, &gid);
    p->gid_index = fallback;
    memcpy(p->gid, gid.raw, 16);
    return RESHARD_OK;
}

static void describe(const struct ibv_device_attr *da, const struct ibv_port_attr *pa,
                     struct ib_port *p)
{
    p->link_layer = pa->link_layer;
    p->lid = pa->lid;
    p->mtu = pa->active_mtu;
    p->speed_mbps = lane_mbps(pa->active_speed) * lanes(pa->active_width);
    p->guid = be64toh(da->node_guid);
    char link[PATH_MAX], path[PATH_MAX];
    snprintf(link, sizeof(link), "/sys/class/infiniband/%s/device", p->dev);
    if (realpath(link, path) && !strncmp(path, "/sys/devices/pci", 16))
        p->pci_path = strdup(path);
}

static void scan_device(const struct ib_fns *f, struct ibv_device *d, const char *hca)
{
    struct ibv_context *ctx = f->open_device(d);
    const char *dev = f->get_device_name(d);
    if (!ctx) {
        rs_log(RS_LOG_INFO, "ib: cannot open %s: %m", dev);
        return;
    }
    struct ibv_device_attr da;
    if (f->query_device(ctx, &da) == 0) {
        for (int port = 1; port <= da.phys_port_cnt && nfound < IB_MAX_PORTS; port++) {
            struct ibv_port_attr pa;
            if (!ib_hca_selects(hca, dev, port) || ib_query_port(f, ctx, (uint8_t)port, &pa) != 0)
                continue;
            if (pa.state != IBV_PORT_ACTIVE) {
                rs_log(RS_LOG_INFO, "ib: %s:%d is not active (state %d)", dev, port, pa.state);
                continue;
            }
            struct ib_port *p = &found[nfound];
            memset(p, 0, sizeof(*p));
            snprintf(p->dev, sizeof(p->dev), "%s", dev);
            snprintf(p->name, sizeof(p->name), "%s:%d", dev, port);
            p->port = port;
            if (pick_gid(f, ctx, &pa, p) != RESHARD_OK) {
                rs_log(RS_LOG_WARN, "%s", rs_error_message());
                continue;
            }
            describe(&da, &pa, p);
            char g[64];
            rs_log(RS_LOG_INFO, "ib: %s %s, %d Mb/s, GID %d %s, LID %u", p->name,
                   p->link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", p->speed_mbps,
                   p->gid_index, ib_gid_str(p->gid, g, sizeof(g)), p->lid);
            nfound++;
        }
    }
    f->close_device(ctx);
}

static void scan(void)
{
    const struct ib_fns *f = ib_lib();
    if (!f) {
        snprintf(found_error, sizeof(found_error), "%s", rs_error_message());
        return;
    }
    int n = 0;
    struct ibv_device **list = f->get_device_list(&n);
    const char *hca = rs_param_str(RS_PARAM_IB_HCA);
    for (int i = 0; list && i < n; i++)
        scan_device(f, list[i], hca);
    if (list)
        f->free_device_list(list);
    found_status = RESHARD_OK;
}

reshard_status_t ib_ports(const struct ib_port **ports, int *n)
{
    pthread_once(&found_once, scan);
    *ports = found;
    *n = nfound;
    if (found_status != RESHARD_OK)
        return rs_error(found_status, "%s", found_error);
    return RESHARD_OK;
}
