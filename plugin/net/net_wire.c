/* SPDX-License-Identifier: Apache-2.0 */
/* The handshake's messages (net_wire.h): encoders and bounds-checked decoders. */
#include "net_wire.h"

#include "base/error.h"
#include "transport/sock/sock.h"

void net_wire_hello(unsigned char *w, uint64_t nonce, size_t addr_len)
{
    sock_wire_put(w, NET_HELLO_MAGIC, 4);
    sock_wire_put(w + 4, NET_WIRE_VERSION, 4);
    sock_wire_put(w + 8, nonce, 8);
    sock_wire_put(w + 16, addr_len, 4);
}

enum net_hello_verdict net_wire_hello_check(const unsigned char *w, size_t n, uint64_t nonce,
                                            size_t *addr_len)
{
    if (n < NET_HELLO_BYTES || sock_wire_get(w, 4) != NET_HELLO_MAGIC ||
        sock_wire_get(w + 4, 4) != NET_WIRE_VERSION)
        return NET_HELLO_FOREIGN;
    if (sock_wire_get(w + 8, 8) != nonce)
        return NET_HELLO_NONCE;
    uint64_t len = sock_wire_get(w + 16, 4);
    if (!len || len > NET_MAX_ADDR)
        return NET_HELLO_BAD_ADDRESS;
    *addr_len = (size_t)len;
    return NET_HELLO_OK;
}

void net_wire_reply(unsigned char *w, enum net_reply_status st, uint32_t id, size_t addr_len)
{
    sock_wire_put(w, NET_REPLY_MAGIC, 4);
    sock_wire_put(w + 4, st, 4);
    sock_wire_put(w + 8, id, 4);
    sock_wire_put(w + 12, addr_len, 4);
}

reshard_status_t net_wire_reply_check(const unsigned char *w, size_t n, const char *peer,
                                      uint32_t *id, size_t *addr_len)
{
    if (n < NET_REPLY_BYTES || sock_wire_get(w, 4) != NET_REPLY_MAGIC)
        return rs_error(RESHARD_ERR_NETWORK,
                        "NET/Reshard: %s answered with something that is not a Reshard reply",
                        peer);
    uint64_t status = sock_wire_get(w + 4, 4);
    switch (status) {
    case NET_REPLY_OK:
        break;
    case NET_REPLY_UNKNOWN_NONCE:
        return rs_error(RESHARD_ERR_REFUSED,
                        "NET/Reshard: listener %s refused the handle: it did not issue it "
                        "(a handle from another job, or from a listen comm since closed)",
                        peer);
    case NET_REPLY_VERSION:
        return rs_error(RESHARD_ERR_REFUSED,
                        "NET/Reshard: listener %s refused the connection (another version of "
                        "the plugin's handshake)",
                        peer);
    case NET_REPLY_FAILED:
        return rs_error(RESHARD_ERR_REFUSED,
                        "NET/Reshard: listener %s could not make the connection (its log says "
                        "why)",
                        peer);
    default:
        return rs_error(RESHARD_ERR_NETWORK,
                        "NET/Reshard: %s answered with status %llu, which no Reshard listener "
                        "sends",
                        peer, (unsigned long long)status);
    }
    uint64_t len = sock_wire_get(w + 12, 4);
    if (!len || len > NET_MAX_ADDR)
        return rs_error(RESHARD_ERR_NETWORK,
                        "NET/Reshard: %s sent a transport address of %llu bytes (1 to %d allowed)",
                        peer, (unsigned long long)len, NET_MAX_ADDR);
    *id = (uint32_t)sock_wire_get(w + 8, 4);
    *addr_len = (size_t)len;
    return RESHARD_OK;
}
