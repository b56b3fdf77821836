/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the NCCL plugin's handshake decoders. The input's first 8 bytes are the
 * listener's nonce, the rest what a connector (or anyone who reaches the port) sends: the
 * listener's per-connection reader (net_pending_step) must take it, refuse it, or drop it,
 * never read or write out of bounds or allocate more than NET_MAX_ADDR for it; the same bytes
 * go through the connector's reply decoder and the hello decoder directly. */
#include "plugin/net/net_listen.h"

#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 8 || size > 8192)
        return 0;
    uint64_t nonce;
    memcpy(&nonce, data, sizeof(nonce));
    data += 8;
    size -= 8;
    uint32_t id;
    size_t len;
    (void)net_wire_reply_check(data, size < NET_REPLY_BYTES ? size : NET_REPLY_BYTES, "fuzz peer",
                               &id, &len);
    (void)net_wire_hello_check(data, size < NET_HELLO_BYTES ? size : NET_HELLO_BYTES, nonce, &len);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0)
        return 0;
    if (size)
        (void)!write(sv[1], data, size); /* fits the socket buffer: no reader needed */
    shutdown(sv[1], SHUT_WR);            /* the connector's end: no more bytes, still reading */
    struct net_pending p = {.state = NET_PEND_HELLO, .fd = sv[0]};
    const char *why;
    for (int i = 0; i < 64; i++) {
        enum net_pend_step step = net_pending_step(&p, nonce, &why);
        if (step == NET_PEND_ANSWER) {
            unsigned char reply[NET_REPLY_BYTES + 8] = {0};
            net_wire_reply(reply, NET_REPLY_OK, 7, 8);
            if (net_pending_answer(&p, reply, sizeof(reply)) != RESHARD_OK)
                break;
            continue;
        }
        if (step != NET_PEND_WAIT || p.state == NET_PEND_READY)
            break;
    }
    net_pending_clear(&p); /* closes sv[0] */
    close(sv[1]);
    return 0;
}
