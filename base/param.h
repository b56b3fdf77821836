/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every tunable, declared once: its name (environment variable RESHARD_<NAME>), default and
 * meaning. Values are read once per process; an override is logged once at INFO.
 */
#ifndef RS_PARAM_H
#define RS_PARAM_H

#include <stdint.h>
#include <stdio.h>

enum rs_param_type { RS_PARAM_INT, RS_PARAM_STR };

/* X(id, type, default, smallest integer accepted, meaning) */
#define RS_PARAM_MAP(X)                                                                            \
    X(DEBUG, RS_PARAM_STR, "WARN", 0, "log level: NONE, WARN, INFO or TRACE")                      \
    X(PLAN_SPLIT_MIN_BYTES, RS_PARAM_INT, "1048576", 1,                                            \
      "split a network slice among source replicas when each part keeps this many bytes")          \
    X(PLAN_MAX_OPS, RS_PARAM_INT, "134217728", 1,                                                  \
      "refuse a plan needing more transfers than this (20 bytes each), before building it")        \
    X(TIMEOUT, RS_PARAM_INT, "300", 1,                                                             \
      "seconds any wait for a peer may last (bootstrap and execute) before failing")               \
    X(BOOT_ADDR, RS_PARAM_STR, "", 0,                                                              \
      "address reshard_get_unique_id listens on (default: first non-loopback IPv4)")               \
    X(BOOT_PORT, RS_PARAM_INT, "0", 0,                                                             \
      "bootstrap port: for reshard_get_unique_id (0: any); from the environment, MASTER_PORT+1")   \
    X(SECRET, RS_PARAM_STR, "", 0,                                                                 \
      "job secret for environment launches (default: derived from public values, with a WARN)")    \
    X(SECRET_FILE, RS_PARAM_STR, "", 0,                                                            \
      "file holding the job secret for environment launches (instead of RESHARD_SECRET)")          \
    X(BOOT_FANOUT, RS_PARAM_INT, "8", 1,                                                           \
      "children per rank in the bootstrap's tree (rank 0's value rules; at most 64)")              \
    X(BOOT_HELLO_MS, RS_PARAM_INT, "2000", 50,                                                     \
      "ms a connection to a bootstrap listener may take to prove it belongs to the job")           \
    X(CRYPTO_LIB, RS_PARAM_STR, "libcrypto.so.3", 0,                                               \
      "OpenSSL's libcrypto, for the bootstrap's HMAC-SHA256 (libcrypto.so.1.1 on older systems)")  \
    X(DOMAIN_SIZE, RS_PARAM_INT, "0", 0,                                                           \
      "NVLink domains are consecutive blocks of this many ranks (0: one per hostname)")            \
    X(DOMAIN, RS_PARAM_INT, "-1", -1, "this rank's domain id (-1: by hostname or DOMAIN_SIZE)")    \
    X(CHUNK_BYTES, RS_PARAM_INT, "4194304", 4096,                                                  \
      "pipeline unit: a slice is sent and fanned out in chunks of at most this many bytes")        \
    X(STAGING_BYTES, RS_PARAM_INT, "268435456", 1048576,                                           \
      "per-rank cap on packing memory for strided slices")                                         \
    X(COALESCE_BYTES, RS_PARAM_INT, "65536", 0,                                                    \
      "network chunks up to this size travel to their peer packed together (0: never)")            \
    X(NET_TLS, RS_PARAM_STR, "^sm,self", 0,                                                        \
      "UCX transports of the inter-domain context (UCX_TLS syntax; never shared memory)")          \
    X(NET_PEER_ERRORS, RS_PARAM_INT, "0", 0,                                                       \
      "1: UCX peer error mode, a dead peer fails its transfers at once (costs ~30% of TCP "        \
      "bandwidth here); 0: such waits end at RESHARD_TIMEOUT")                                     \
    X(NET_DEVICES, RS_PARAM_STR, "", 0,                                                            \
      "NCCL plugin: interfaces it offers, NCCL_SOCKET_IFNAME syntax (eth,ib prefixes; =eth0 "      \
      "exact; ^docker0 all but; empty: every interface that is up and not virtual)")               \
    X(NET_ALLOW_LO, RS_PARAM_INT, "0", 0,                                                          \
      "NCCL plugin: 1 offers loopback interfaces too (tests on one host)")                         \
    X(NET_HELLO_MS, RS_PARAM_INT, "2000", 1,                                                       \
      "NCCL plugin: ms a connection to a listener has to show its handle before it is dropped "    \
      "(when 64 wait, the oldest that has not goes first)")                                        \
    X(TRANSPORT, RS_PARAM_STR, "auto", 0,                                                          \
      "network transport: ib, ucx, or auto (ib when an RDMA port is active, else ucx)")            \
    X(IB_HCA, RS_PARAM_STR, "", 0,                                                                 \
      "RDMA ports to use, NCCL syntax: mlx5_0:1,mlx5_1 (prefixes), =exact, ^excluded")             \
    X(IB_GID_INDEX, RS_PARAM_INT, "-1", -1,                                                        \
      "RoCE GID index (-1: the port's IPv4-mapped RoCE v2 GID)")                                   \
    X(IB_QPS_PER_PEER, RS_PARAM_INT, "2", 1,                                                       \
      "RC queue pairs per peer; large writes are striped across them (at most 8)")                 \
    X(IB_MEM_WINDOWS, RS_PARAM_INT, "1", 0,                                                        \
      "1: a receive's keys are memory windows bound to its peer's queue pairs (where the device "  \
      "has them); 0: each receive registers its own bytes")                                        \
    X(EXECUTOR, RS_PARAM_STR, "native", 0,                                                         \
      "native (reshard's transports), or nccl: grouped ncclSend/ncclRecv on the communicator "     \
      "given to reshard_comm_init_nccl")                                                           \
    X(CUDA_IPC, RS_PARAM_INT, "1", 0,                                                              \
      "1: local peers write device destinations through CUDA IPC; 0: through host staging")        \
    X(GPUDIRECT, RS_PARAM_INT, "1", 0,                                                             \
      "1: contiguous network chunks of device buffers move between the wire and the device "       \
      "directly when the transport can (GPUDirect RDMA); 0: through host staging")                 \
    X(CUDA_LIB, RS_PARAM_STR, "libcuda.so.1", 0,                                                   \
      "the CUDA driver to load (tests point it elsewhere to hide it)")                             \
    X(NCCL_LIB, RS_PARAM_STR, "", 0,                                                               \
      "the NCCL to load (empty: the one already in the process, else libnccl.so.2)")               \
    X(IB_LIB, RS_PARAM_STR, "libibverbs.so.1", 0,                                                  \
      "the verbs library to load (tests point it elsewhere to hide rdma-core)")                    \
    X(UCX_LIB, RS_PARAM_STR, "libucp.so.0", 0,                                                     \
      "the UCX library to load (tests point it elsewhere to hide UCX)")                            \
    X(JANSSON_LIB, RS_PARAM_STR, "libjansson.so.4", 0,                                             \
      "the JSON library manifests are read with (loaded on the first manifest)")                   \
    X(VERIFY, RS_PARAM_INT, "0", 0,                                                                \
      "1: every communicator plan checks each refit (fingerprints of every destination against "   \
      "the sources, one small reduction) and fails naming the tensors that differ")                \
    X(DELTA, RS_PARAM_INT, "0", 0,                                                                 \
      "1: every communicator plan refits in deltas: each sender keeps what it last sent and a "    \
      "chunk travels as nothing, its changed elements or dense, whichever is smallest")            \
    X(TEST_DEVICE_AS_HOST, RS_PARAM_INT, "0", 0,                                                   \
      "tests only: 1 registers device buffers as host memory (the stand-in driver's device "       \
      "memory is host memory), to run the GPUDirect path without a GPU")                           \
    X(TEST_CORRUPT, RS_PARAM_INT, "0", 0,                                                          \
      "tests only: N > 0 makes rank N - 1 flip one bit of the first element that landed in its "   \
      "first host destination, as a fault on the way would, before any check")                     \
    X(TEST_FLIP, RS_PARAM_STR, "", 0,                                                              \
      "tests only: RANK:TENSOR[:BYTE] makes rank RANK flip the lowest bit of byte BYTE of its "    \
      "destination buffer of TENSOR (host or device memory) once a verified refit landed, "        \
      "before the check")                                                                          \
    X(TEST_DELTA_FORGE, RS_PARAM_INT, "0", 0,                                                      \
      "tests only: N > 0 makes rank N - 1 claim one changed element more than its first encoded "  \
      "chunk of a delta refit carries, as a hostile peer would")

enum rs_param {
#define RS_PARAM_ENUM_(id, type, def, min, meaning) RS_PARAM_##id,
    RS_PARAM_MAP(RS_PARAM_ENUM_)
#undef RS_PARAM_ENUM_
        RS_PARAM_COUNT
};

int64_t rs_param_int(enum rs_param p);
/* Reads the environment again: for tests whose forked children set their own (not
 * thread-safe; nothing may be reading parameters meanwhile). */
void rs_param_reload(void);
const char *rs_param_str(enum rs_param p);
void rs_param_print(FILE *out);
/* Calls fn for each value the environment set, or set wrongly (why says how, and that the
 * default stays), and for each RESHARD_ name in the environment that is no setting (why names
 * the nearest one). The logger reports them once; nothing here logs, since the logger reads
 * DEBUG here. */
void rs_param_overrides(void (*fn)(const char *env, const char *value, const char *why));

#endif
