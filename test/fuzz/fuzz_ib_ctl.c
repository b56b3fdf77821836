/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target: what a peer causes on the ib transport's queue pairs (transport/ib/
 * ib_cq.c, ib_post.c, ib_key.c, ib_wire.c): control messages (CTS, CANCEL, anything), writes
 * with immediates, and the device's completions of what this side posted, in any order, on a
 * context with receives and sends outstanding. The device is a stand-in (test/transport/ib/
 * fake_verbs.c) that completes each work request at most once, as a real one does. Nothing
 * may read or write out of bounds, leak, complete a request twice, or hang.
 */
#include "test/transport/ib/fake_verbs.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NREQ 8

static _Alignas(4096) char mem[1 << 20];
static struct tp_req reqs[NREQ];
static int done[NREQ];

static void on_done(struct tp_req *req, reshard_status_t st, size_t got)
{
    (void)st, (void)got;
    if (++done[req - reqs] > 1)
        abort(); /* completed twice */
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    setenv("RESHARD_DEBUG", "NONE", 1); /* a warning per bad input would drown the fuzzer */
    return 0;
}

/* Takes n bytes of input (zeros past its end). */
static void take(const uint8_t **d, size_t *left, void *out, size_t n)
{
    size_t k = n < *left ? n : *left;
    memset(out, 0, n);
    memcpy(out, *d, k);
    *d += k;
    *left -= k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 4096)
        return 0;
    memset(done, 0, sizeof(done));
    for (int i = 0; i < NREQ; i++)
        reqs[i] = (struct tp_req){.done = on_done};
    if (!fake_up()) {
        fake_down();
        return 0;
    }
    struct tp_ctx *c = &fake.x.super;
    fake.x.windows = size && data[0] & 1; /* both ways of keying receives */
    void *mh = NULL;
    static struct iovec iov[2] = {{mem + 900000, 1000}, {mem + 950000, 2000}};
    int posted = 0;
    if (ib_mem_reg(c, mem, sizeof(mem), TP_MEM_HOST, &mh) == RESHARD_OK) {
        posted += ib_recv(c, 0, 1, mem, 256 << 10, mh, &reqs[0]) == RESHARD_OK;
        posted += ib_recv(c, 0, 2, mem + (256 << 10), 4096, mh, &reqs[1]) == RESHARD_OK;
        posted += ib_recv_iov(c, 0, 3, iov, 2, &reqs[2]) == RESHARD_OK;
        posted += ib_send(c, 0, 1, mem + (512 << 10), 256 << 10, mh, 0, &reqs[3]) == RESHARD_OK;
        posted += ib_send(c, 0, 4, mem + (800 << 10), 100, NULL, 0, &reqs[4]) == RESHARD_OK;
    }
    (void)posted;
    unsigned char completed[FAKE_MAX_WR] = {0};
    const uint8_t *d = data + (size > 0);
    size_t left = size - (size > 0);
    while (left && fake.peer->state == P_UP) {
        uint8_t kind;
        take(&d, &left, &kind, 1);
        if (kind % 4 == 0) { /* a control message of got bytes */
            struct ib_ctl ctl;
            uint8_t got;
            take(&d, &left, &got, 1);
            take(&d, &left, &ctl, sizeof(ctl));
            fake_peer_says(&ctl, got % (sizeof(ctl) + 8));
        } else if (kind % 4 == 1) { /* a write with an immediate */
            uint32_t imm, bytes;
            take(&d, &left, &imm, sizeof(imm));
            take(&d, &left, &bytes, sizeof(bytes));
            fake_peer_writes(imm, bytes);
        } else if (kind % 4 == 2 && fake.nwr) { /* the device completes one request */
            uint8_t i, ok;
            take(&d, &left, &i, 1);
            take(&d, &left, &ok, 1);
            int w = i % fake.nwr;
            if (completed[w])
                continue;
            completed[w] = 1;
            fake_complete(w, ok & 1 ? IBV_WC_SUCCESS : IBV_WC_REM_ACCESS_ERR);
        } else if (kind % 4 == 3) { /* the caller cancels one */
            uint8_t i;
            take(&d, &left, &i, 1);
            if (reqs[i % NREQ].handle)
                ib_cancel(c, &reqs[i % NREQ]);
        }
        fake_run();
    }
    fake_down();
    if (mh)
        ib_mem_dereg(c, mh);
    for (int i = 0; i < 5; i++)
        if (done[i] > 1)
            abort();
    return 0;
}
