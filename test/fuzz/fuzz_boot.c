/* SPDX-License-Identifier: Apache-2.0 */
/* libFuzzer target: the bootstrap's frame decoder. The input is what a peer sends on a socket
 * while this rank waits for a 64-byte allgather frame; the decoder must take it, refuse it
 * with a message, or wait for more, never read or write out of bounds. */
#include "transport/sock/sock_frame.h"

#include <fcntl.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 8192)
        return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return 0;
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    if (size)
        (void)!write(sv[1], data, size); /* fits the socket buffer: no reader needed */
    close(sv[1]);
    unsigned char payload[64];
    struct sock_xfer x;
    sock_xfer_init(&x, sv[0], "fuzz peer", 0,
                   (struct sock_frame_hdr){
                       .type = SOCK_FRAME_DATA, .op = SOCK_OP_ALLGATHER, .seq = 3, .len = 64},
                   payload);
    struct sock_frame_error err;
    for (int i = 0; i < 64 && !x.finished; i++)
        if (sock_xfer_step(&x, &err) != RESHARD_OK)
            break;
    close(sv[0]);
    return 0;
}
