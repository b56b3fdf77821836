/* SPDX-License-Identifier: Apache-2.0 */
/*
 * RDMA ports: the active ones, chosen by RESHARD_IB_HCA (NCCL's syntax), each with the GID
 * the transport addresses it by. Found once per process.
 */
#ifndef RS_IB_DEV_H
#define RS_IB_DEV_H

#include "base/reshard_status.h"

#include <stddef.h>
#include <stdint.h>

#define IB_NAME_MAX 64

struct ib_port {
    char dev[IB_NAME_MAX];      /* "mlx5_0" */
    char name[IB_NAME_MAX + 8]; /* "mlx5_0:1" */
    int port;
    int link_layer; /* IBV_LINK_LAYER_* */
    int gid_index;
    uint8_t gid[16];
    uint16_t lid;
    int mtu;        /* enum ibv_mtu, the port's active MTU */
    int speed_mbps; /* lanes x lane rate */
    uint64_t guid;  /* the node GUID */
    char *pci_path; /* the device's PCI path, NULL when not a PCI device (soft-RoCE) */
};

/* The active ports RESHARD_IB_HCA selects, in device then port order. RESHARD_ERR_UNAVAILABLE
 * when rdma-core is missing; *n == 0 when nothing is active. */
reshard_status_t ib_ports(const struct ib_port **ports, int *n);

/* Parses a RESHARD_IB_HCA list and says whether dev:port is selected (1) or not (0); empty
 * selects everything. Exposed for tests. */
int ib_hca_selects(const char *list, const char *dev, int port);

/* A RoCE port's IPv4 address (from its IPv4-mapped GID) into *in4: 1, else 0. */
int ib_port_ipv4(const struct ib_port *p, void *in4);

/* "::ffff:10.0.0.1" style text of a GID, for messages. */
const char *ib_gid_str(const uint8_t gid[16], char *buf, size_t n);

#endif
