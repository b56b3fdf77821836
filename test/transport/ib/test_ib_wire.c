/* SPDX-License-Identifier: Apache-2.0 */
/* The checks of what an ib peer sends (transport/ib/ib_wire.c): its address, its handshake
 * messages, its immediates, and how messages are cut into stripes and keys. */
#include "transport/ib/ib_int.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <string.h>

static struct ib_wire_addr good_addr(void)
{
    struct ib_wire_addr a = {.magic = ADDR_MAGIC,
                             .index = -1,
                             .link_layer = IBV_LINK_LAYER_ETHERNET,
                             .mtu = IBV_MTU_1024,
                             .nqp = 2};
    a.tcp.in.sin_family = AF_INET;
    a.tcp.in.sin_port = htons(4242);
    a.tcp.in.sin_addr.s_addr = htonl(0x0a000001);
    return a;
}

Test(ib_wire, a_well_formed_address_is_taken_whole)
{
    struct ib_wire_addr a = good_addr(), out;
    char why[96] = "";
    cr_assert_eq(ib_addr_check(&a, sizeof(a), &out, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(memcmp(&a, &out, sizeof(a)), 0);
}

/* The attack: an address that would make this side connect anywhere, or ask the device for
 * a path it cannot take. Each is refused, saying which field. */
Test(ib_wire, a_malformed_address_is_refused_naming_its_field)
{
    struct ib_wire_addr a = good_addr(), out;
    char why[96];
    cr_assert_eq(ib_addr_check(&a, sizeof(a) - 1, &out, why, sizeof(why)), -1);
    cr_assert(strstr(why, "not an ib address"), "%s", why);
    a = good_addr(), a.magic = 0;
    cr_assert_eq(ib_addr_check(&a, sizeof(a), &out, why, sizeof(why)), -1);
    cr_assert(strstr(why, "magic 0x0"), "%s", why);
    a = good_addr(), a.index = -2;
    cr_assert_eq(ib_addr_check(&a, sizeof(a), &out, why, sizeof(why)), -1);
    cr_assert(strstr(why, "peer number -2"), "%s", why);
    a = good_addr(), a.link_layer = 7;
    cr_assert_eq(ib_addr_check(&a, sizeof(a), &out, why, sizeof(why)), -1);
    cr_assert(strstr(why, "link layer 7"), "%s", why);
    a = good_addr(), a.mtu = 9;
    cr_assert_eq(ib_addr_check(&a, sizeof(a), &out, why, sizeof(why)), -1);
    cr_assert(strstr(why, "MTU code 9"), "%s", why);
    a = good_addr(), a.nqp = 9;
    cr_assert_eq(ib_addr_check(&a, sizeof(a), &out, why, sizeof(why)), -1);
    cr_assert(strstr(why, "9 queue pairs"), "%s", why);
    a = good_addr(), a.tcp.in.sin_port = 0;
    cr_assert_eq(ib_addr_check(&a, sizeof(a), &out, why, sizeof(why)), -1);
    cr_assert(strstr(why, "no TCP listener"), "%s", why);
    a = good_addr(), a.tcp.sa.sa_family = AF_UNIX;
    cr_assert_eq(ib_addr_check(&a, sizeof(a), &out, why, sizeof(why)), -1);
    cr_assert(strstr(why, "no TCP listener"), "%s", why);
}

static struct ib_hs good_hs(enum ib_hs_kind kind)
{
    struct ib_hs h = {.magic = HS_MAGIC,
                      .kind = kind,
                      .from = 1,
                      .to = 2,
                      .from_index = 0,
                      .to_index = 1,
                      .qpn = {0x11, 0x12},
                      .psn = 0xabcdef,
                      .nqp = 2};
    if (kind == HS_CROSSED) {
        memset(h.qpn, 0, sizeof(h.qpn));
        h.psn = h.nqp = 0;
    }
    return h;
}

Test(ib_wire, well_formed_handshakes_pass)
{
    char why[96] = "";
    for (int k = HS_HELLO; k <= HS_CROSSED; k++) {
        struct ib_hs h = good_hs((enum ib_hs_kind)k);
        cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), 0, "kind %d: %s", k, why);
    }
}

/* The attack: a handshake whose numbers the queue pairs would be brought up with. */
Test(ib_wire, a_malformed_handshake_is_refused_naming_its_field)
{
    char why[96];
    struct ib_hs h = good_hs(HS_HELLO);
    h.magic = 1;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1);
    cr_assert(strstr(why, "not a reshard handshake"), "%s", why);
    h = good_hs(HS_HELLO), h.kind = 5;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1);
    cr_assert(strstr(why, "unknown kind 5"), "%s", why);
    h = good_hs(HS_HELLO), h.to_index = -1;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1);
    cr_assert(strstr(why, "peer number -1"), "%s", why);
    h = good_hs(HS_REPLY), h.nqp = 9;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1);
    cr_assert(strstr(why, "9 queue pairs"), "%s", why);
    h = good_hs(HS_READY), h.nqp = 0;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1);
    h = good_hs(HS_HELLO), h.psn = 1u << 24;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1);
    cr_assert(strstr(why, "sequence number 0x1000000"), "%s", why);
    h = good_hs(HS_HELLO), h.qpn[1] = 1u << 24;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1);
    cr_assert(strstr(why, "queue pair number 0x1000000"), "%s", why);
    h = good_hs(HS_HELLO), h.qpn[0] = 0;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1, "a zero queue pair number");
    h = good_hs(HS_HELLO), h.qpn[5] = 7;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1, "a number past nqp");
    h = good_hs(HS_CROSSED), h.nqp = 1;
    cr_assert_eq(ib_hs_check(&h, why, sizeof(why)), -1, "CROSSED names no queue pairs");
}

Test(ib_wire, immediates_name_a_receive_and_a_stripe_count)
{
    uint32_t id, code;
    cr_assert_eq(ib_imm_check(5u << 8 | 3, &id, &code), 0);
    cr_assert_eq(id, 5);
    cr_assert_eq(code, 3);
    cr_assert_eq(ib_imm_check(5u << 8 | CODE_REFUSED, &id, &code), 0);
    cr_assert_eq(code, CODE_REFUSED);
    cr_assert_eq(ib_imm_check(5u << 8 | 0, &id, &code), -1, "no stripes");
    cr_assert_eq(ib_imm_check(0u << 8 | 1, &id, &code), -1, "no receive has id 0");
    cr_assert_eq(ib_imm_check(5u << 8 | 254, &id, &code), 0);
}

Test(ib_wire, messages_are_striped_over_the_queue_pairs_and_keyed_per_queue_pair)
{
    cr_assert_eq(ib_stripes(0, 2), 1);
    cr_assert_eq(ib_stripes(128 << 10, 2), 2, "two stripes of 64 KiB");
    cr_assert_eq(ib_stripes((128 << 10) - 1, 2), 1);
    cr_assert_eq(ib_stripes(8 << 20, 4), 4, "at most one per queue pair");
    cr_assert_eq(ib_stripes((size_t)3 << 30, 2), 4, "no stripe past 1 GiB");
    cr_assert_eq(ib_stripes(SIZE_MAX, 8), IB_MAX_STRIPES + 1, "more than an immediate counts");
    cr_assert_eq(ib_keys_for(0, 2), 0, "an empty receive needs no key");
    cr_assert_eq(ib_keys_for(100, 2), 1);
    cr_assert_eq(ib_keys_for((size_t)3 << 30, 2), 2, "a key per queue pair, not per stripe");
    for (size_t len = 1; len < ((size_t)4 << 30); len = len * 3 + 1) /* never more than the cap */
        for (int q = 1; q <= IB_MAX_QPS; q++) {
            int used = ib_stripes(len, q) < q ? ib_stripes(len, q) : q;
            cr_assert_leq(used, ib_keys_for(len * 2, q), "len %zu, %d QPs", len, q);
        }
}
