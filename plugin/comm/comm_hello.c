/* SPDX-License-Identifier: Apache-2.0 */
/* The hello every rank sends when a communicator forms (comm_int.h): its codec, and the checks
 * every record passes before anything of it is used. */
#include "comm_int.h"

#include "base/error.h"
#include "transport/sock/sock.h"

#include <string.h>

uint64_t comm_host_key(const char *name)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

void comm_hello_put(unsigned char *w, const struct comm_hello *h)
{
    sock_wire_put(w, h->host, 8);
    sock_wire_put(w + 8, (uint32_t)h->domain, 4);
    sock_wire_put(w + 12, (uint32_t)h->local.pid, 4);
    sock_wire_put(w + 16, h->addr_len, 4);
    memcpy(w + 20, h->transport, sizeof(h->transport));
    memcpy(w + 28, h->local.token, COMM_LOCAL_TOKEN);
    sock_wire_put(w + 44, 0, 4);
}

static void comm_hello_get(const unsigned char *w, struct comm_hello *h)
{
    h->host = sock_wire_get(w, 8);
    h->domain = (int32_t)(uint32_t)sock_wire_get(w + 8, 4);
    h->local.pid = (int32_t)(uint32_t)sock_wire_get(w + 12, 4);
    h->addr_len = (uint32_t)sock_wire_get(w + 16, 4);
    memcpy(h->transport, w + 20, sizeof(h->transport));
    memcpy(h->local.token, w + 28, COMM_LOCAL_TOKEN);
}

/* A transport name: a few printable characters, NUL-terminated within its field. */
static int comm_hello_name_ok(const char *s, size_t n)
{
    size_t len = strnlen(s, n);
    if (len == 0 || len == n)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (s[i] < '!' || s[i] > '~')
            return 0;
    return 1;
}

reshard_status_t comm_hello_decode(const unsigned char *all, size_t rec, int size,
                                   const unsigned char *present, struct comm_hello *h,
                                   const unsigned char **addr)
{
    if (rec < COMM_HELLO_BYTES)
        return rs_error(RESHARD_ERR_INTERNAL, "hello records of %zu bytes (at least %d)", rec,
                        COMM_HELLO_BYTES);
    size_t slot = rec - COMM_HELLO_BYTES;
    int first = -1;
    for (int r = 0; r < size; r++) {
        if (!present[r])
            continue;
        const unsigned char *w = all + (size_t)r * rec;
        comm_hello_get(w, &h[r]);
        addr[r] = w + COMM_HELLO_BYTES;
        if (h[r].addr_len == 0 || h[r].addr_len > slot)
            return rs_error(RESHARD_ERR_INTERNAL,
                            "rank %d announced a %u-byte address in a %zu-byte slot", r,
                            h[r].addr_len, slot);
        if (!comm_hello_name_ok(h[r].transport, sizeof(h[r].transport)))
            return rs_error(RESHARD_ERR_INTERNAL, "rank %d announced no transport name", r);
        if (h[r].domain < -1)
            return rs_error(RESHARD_ERR_INVALID_ARG, "rank %d has RESHARD_DOMAIN=%d", r,
                            h[r].domain);
        if (first < 0) {
            first = r;
        } else if (strcmp(h[r].transport, h[first].transport)) {
            return rs_error(RESHARD_ERR_UNAVAILABLE,
                            "rank %d runs the %s transport, rank %d %s: set RESHARD_TRANSPORT "
                            "to the same value everywhere (auto takes ib only where an RDMA "
                            "port is active)",
                            r, h[r].transport, first, h[first].transport);
        }
    }
    return RESHARD_OK;
}
