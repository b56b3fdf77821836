/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: what a stranger may send a bootstrap listener, and what a rank takes from
 * its listener and its children. The first byte picks the decoder:
 *   0: the door (boot_gate_*): the rest is sent on a TCP connection to a listener whose door
 *      is served until it has dealt with it (OPEN, then a hello, refused or dropped);
 *   1: an admission (boot_admit_get, boot_admit_valid) of a job whose size is the next byte;
 *   2: a READY (boot_ready_decode) of the rest, as 4-byte ranks, in a job of 1 + next byte.
 * None may read or write out of bounds, hang, or admit anyone (no input can MAC a hello). */
#include "base/param.h"
#include "transport/boot/boot_int.h"

#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int lfd = -1;
static union sock_addr where;

static int never_admit(void *arg, int fd, const char *addr, const struct boot_hello *h,
                       const unsigned char *nonce_l, char *why, size_t n)
{
    (void)fd, (void)addr, (void)h, (void)nonce_l;
    *(int *)arg = 1; /* reached: a hello that proved the secret */
    snprintf(why, n, "fuzz");
    return 0;
}

static void door(const uint8_t *data, size_t size)
{
    if (lfd < 0) {
        setenv("RESHARD_DEBUG", "NONE", 1);
        setenv("RESHARD_BOOT_HELLO_MS", "50", 1);
        rs_param_reload();
        where.in =
            (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (sock_listen(&where, &lfd) != RESHARD_OK)
            abort();
    }
    struct boot *b = boot_alloc(0, 4, NULL, 1000);
    struct boot_gate g;
    int admitted = 0, c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!b || c < 0 || boot_gate_open(&g, b, lfd, never_admit, &admitted) != RESHARD_OK)
        abort();
    if (connect(c, &where.sa, sock_addr_len(&where)) != 0)
        abort();
    if (size)
        (void)!write(c, data, size); /* fits the socket buffer: no reader needed */
    shutdown(c, SHUT_WR);
    struct pollfd pf[1 + BOOT_PENDING_MAX];
    /* Until the door has dealt with the connection: refused it, or dropped it. */
    for (int i = 0; i < 200 && (g.np > 0 || g.refused + g.dropped + g.busy == 0); i++) {
        int n = boot_gate_poll(&g, pf);
        poll(pf, (nfds_t)n, i ? 5 : 0);
        if (boot_gate_serve(&g, pf, n) != RESHARD_OK)
            abort();
    }
    if (admitted)
        abort();
    boot_gate_close(&g, "fuzz");
    close(c);
    boot_close(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > 4096)
        return 0;
    int size_of_job = 1 + data[1];
    switch (data[0] % 3) {
    case 0:
        door(data + 1, size - 1);
        break;
    case 1:
        if (size >= 2 + BOOT_ADMIT_BYTES) {
            struct boot_admit a;
            union sock_addr pa;
            boot_admit_get(data + 2, &a);
            (void)boot_admit_valid(&a, size_of_job, 1, &pa);
        }
        break;
    default: {
        int n = (int)(size - 2) / 4, *out = calloc((size_t)n + 1, sizeof(int));
        unsigned char *seen = calloc((size_t)size_of_job, 1);
        if (!out || !seen)
            abort();
        int first = n ? (int)(int32_t)sock_wire_get(data + 2, 4) : 1;
        (void)boot_ready_decode(data + 2, n, first, size_of_job, seen, out);
        free(out);
        free(seen);
        break;
    }
    }
    return 0;
}
