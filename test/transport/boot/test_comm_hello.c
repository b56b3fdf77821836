/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The communicator hello (plugin/comm/comm_hello.c) that crosses the bootstrap when a
 * communicator forms: its decoder's checks, and what forming costs a rank on the bootstrap,
 * measured on forked ranks.
 */
#include "boot_ranks.h"
#include "base/param.h"
#include "plugin/comm/comm_int.h"
#include "test/plugin/ranks.h"
#include "transport/sock/sock_frame.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(comm_hello, .timeout = 60);

#define REC (COMM_HELLO_BYTES + 16)

static void put(unsigned char *all, int r, int32_t domain, uint32_t len, const char *tp)
{
    struct comm_hello h = {.host = 7, .domain = domain, .addr_len = len, .local = {.pid = 100 + r}};
    snprintf(h.transport, sizeof(h.transport), "%s", tp);
    comm_hello_put(all + (size_t)r * REC, &h);
}

static reshard_status_t decode(const unsigned char *all, int n, const unsigned char *present,
                               struct comm_hello *h)
{
    const unsigned char *addr[4];
    return comm_hello_decode(all, REC, n, present, h, addr);
}

Test(comm_hello, records_decode_and_bad_ones_are_refused_naming_the_rank)
{
    unsigned char all[3 * REC] = {0}, present[3] = {1, 1, 1};
    struct comm_hello h[3];
    put(all, 0, -1, 16, "ucx");
    put(all, 1, -1, 5, "ucx");
    put(all, 2, -1, 9, "ucx");
    cr_assert_eq(decode(all, 3, present, h), RESHARD_OK, "%s", rs_error_message());
    cr_assert(h[1].addr_len == 5 && h[2].local.pid == 102 && h[0].host == 7 && h[1].domain == -1);
    put(all, 1, -1, 17, "ucx"); /* longer than its slot */
    cr_assert_eq(decode(all, 3, present, h), RESHARD_ERR_INTERNAL);
    cr_assert(strstr(rs_error_message(), "rank 1 announced a 17-byte address in a 16-byte slot"),
              "%s", rs_error_message());
    put(all, 1, -1, 0, "ucx");
    cr_assert_eq(decode(all, 3, present, h), RESHARD_ERR_INTERNAL);
    put(all, 1, -1, 5, "");
    cr_assert_eq(decode(all, 3, present, h), RESHARD_ERR_INTERNAL);
    cr_assert(strstr(rs_error_message(), "rank 1 announced no transport name"), "%s",
              rs_error_message());
    memcpy(all + REC + 20, "ucxucxuc", 8); /* no terminator in its field */
    cr_assert_eq(decode(all, 3, present, h), RESHARD_ERR_INTERNAL);
    put(all, 1, -1, 5, "u\x01x");
    cr_assert_eq(decode(all, 3, present, h), RESHARD_ERR_INTERNAL);
    put(all, 1, -7, 5, "ucx");
    cr_assert_eq(decode(all, 3, present, h), RESHARD_ERR_INVALID_ARG);
    cr_assert(strstr(rs_error_message(), "rank 1 has RESHARD_DOMAIN=-7"), "%s", rs_error_message());
    put(all, 1, -1, 5, "ucx");
    put(all, 2, -1, 9, "ib");
    cr_assert_eq(decode(all, 3, present, h), RESHARD_ERR_UNAVAILABLE);
    cr_assert(strstr(rs_error_message(), "rank 2 runs the ib transport, rank 0 ucx"), "%s",
              rs_error_message());
    /* an absent rank's record is not read */
    present[2] = 0;
    cr_assert_eq(decode(all, 3, present, h), RESHARD_OK, "%s", rs_error_message());
    cr_assert_eq(decode(all, 3, present, h) == RESHARD_OK && h[1].addr_len == 5, 1);
    cr_assert_eq(
        comm_hello_decode(all, COMM_HELLO_BYTES - 1, 3, present, h, (const unsigned char *[3]){0}),
        RESHARD_ERR_INTERNAL);
}

Test(comm_hello, hostnames_have_keys_that_tell_them_apart)
{
    cr_assert_eq(comm_host_key("gpu-node-01"), comm_host_key("gpu-node-01"));
    cr_assert_neq(comm_host_key("gpu-node-01"), comm_host_key("gpu-node-10"));
    cr_assert_neq(comm_host_key(""), comm_host_key("a"));
}

/* What forming moved on this rank's bootstrap, against what the hello's design says: an
 * allreduce of 4 bytes and one allgather of 48 bytes plus the longest address (to 8) a rank. */
static reshard_status_t forming_bytes(int rank, int size, reshard_comm_t *comm)
{
    unsigned char addr[COMM_ADDR_MAX];
    size_t len = sizeof(addr);
    uint64_t sent, received;
    boot_bytes(comm->boot, &sent, &received);
    RS_CHECK(comm->net->ops->address(comm->net, -1, addr, &len));
    fprintf(stderr,
            "comm_hello: rank %d of %d: address %zu bytes; forming sent %llu, received %llu\n",
            rank, size, len, (unsigned long long)sent, (unsigned long long)received);
    /* Every rank but 0 is a leaf of rank 0 here (fan-out 8): one frame up, one down, per
     * collective; the addresses may differ in length by a few bytes, so the slot is bounded. */
    if (rank == 0)
        return RESHARD_OK;
    uint64_t hdr = SOCK_FRAME_HDR_BYTES;
    uint64_t up = hdr + 4 + hdr, down = hdr + 4 + hdr;
    uint64_t lo = COMM_HELLO_BYTES + (len + 7) / 8 * 8, hi = lo + 64;
    if (sent < up + lo || sent > up + hi || received < down + size * lo ||
        received > down + size * hi)
        return rs_error(RESHARD_ERR_INTERNAL, "rank %d moved %llu / %llu bytes forming", rank,
                        (unsigned long long)sent, (unsigned long long)received);
    return RESHARD_OK;
}

static void forming_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "20", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    rs_param_reload();
}

Test(comm_hello, forming_a_communicator_moves_48_bytes_and_an_address_per_rank, .init = forming_env)
{
    all_ok(run_ranks(8, forming_bytes), 8);
}
