/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reshard status codes: one list, from which the enum and reshard_strerror() are both
 * generated, so the two can never drift apart. Installed beside reshard.h.
 */
#ifndef RESHARD_STATUS_H
#define RESHARD_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* X(name, value, message) */
#define RESHARD_STATUS_MAP(X)                                                                      \
    X(OK, 0, "success")                                                                            \
    X(ERR_INVALID_ARG, 1, "invalid argument")                                                      \
    X(ERR_NO_MEMORY, 2, "out of memory")                                                           \
    X(ERR_SPEC_SYNTAX, 3, "malformed layout spec")                                                 \
    X(ERR_MESH_SIZE, 4, "mesh size differs from the number of ranks")                              \
    X(ERR_SHARD_DIM, 5, "shard dimension out of range")                                            \
    X(ERR_NOT_DIVISIBLE, 6, "strided shard does not divide the dimension")                         \
    X(ERR_MISMATCH, 7, "source and destination differ in shape or dtype")                          \
    X(ERR_RANK_RANGE, 8, "rank outside the communicator")                                          \
    X(ERR_VIEW, 9, "local view does not fit the shard")                                            \
    X(ERR_TOO_LARGE, 10, "size exceeds a supported limit")                                         \
    X(ERR_INVALID_PLAN, 11, "plan failed validation")                                              \
    X(ERR_INTERNAL, 12, "internal error")                                                          \
    X(ERR_TIMEOUT, 13, "timed out waiting for a peer")                                             \
    X(ERR_REFUSED, 14, "peer refused: not part of this job (wrong secret)")                        \
    X(ERR_NETWORK, 15, "network or system failure")                                                \
    X(ERR_BUSY, 16, "plan is already executing")                                                   \
    X(ERR_BUFFER, 17, "buffer smaller than its shard")                                             \
    X(ERR_PLAN_MISMATCH, 18, "ranks passed different layouts (plan hashes differ)")                \
    X(ERR_UNAVAILABLE, 19, "transport or library not available on this host")                      \
    X(ERR_REMOTE, 20, "another rank failed")                                                       \
    X(ERR_ABORTED, 21, "aborted by reshard_comm_abort")                                            \
    X(ERR_DATA_LOST, 22, "data was held only by ranks that left (no replica remains)")             \
    X(ERR_VERIFY, 23, "destination and source fingerprints differ")                                \
    X(ERR_LEFT, 24, "a rank left the communicator (reshard_comm_leave)")

typedef enum reshard_status {
#define RESHARD_STATUS_ENUM_(name, value, msg) RESHARD_##name = value,
    RESHARD_STATUS_MAP(RESHARD_STATUS_ENUM_)
#undef RESHARD_STATUS_ENUM_
} reshard_status_t;

#ifdef __cplusplus
}
#endif
#endif
