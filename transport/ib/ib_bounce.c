/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The bounce buffers of the ibverbs transport: a receive into a scatter list lands in one of
 * them and is copied out when complete. They live in an arena of their own: each is an
 * anonymous mapping that holds nothing else, registered once (without remote access: windows
 * give a receive its bytes) and kept for the next receive of its size class, up to
 * IB_BOUNCE_KEEP bytes, so that receives neither register nor map memory each time and no
 * registration ever covers the process's heap.
 */
#include "ib_int.h"

#include "base/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BOUNCE_MIN  4096
#define BOUNCE_KEEP (64u << 20) /* bytes of idle bounce buffers kept for reuse */

static int class_of(size_t len)
{
    int c = 0;
    while (c < IB_BOUNCE_CLASSES && ((size_t)BOUNCE_MIN << c) < len)
        c++;
    return c < IB_BOUNCE_CLASSES ? c : -1;
}

static void bounce_free(struct ib_ctx *x, struct ib_bounce *b)
{
    if (b->mr)
        x->f->dereg_mr(b->mr);
    munmap(b->buf, b->cap);
    free(b);
}

struct ib_bounce *ib_bounce_get(struct ib_ctx *x, size_t len)
{
    int cls = class_of(len);
    if (cls >= 0 && x->bounce_free[cls]) {
        struct ib_bounce *b = x->bounce_free[cls];
        x->bounce_free[cls] = b->next;
        x->bounce_kept -= b->cap;
        b->next = NULL;
        return b;
    }
    size_t cap = cls >= 0 ? (size_t)BOUNCE_MIN << cls : (len + BOUNCE_MIN - 1) & ~(size_t)4095;
    struct ib_bounce *b = calloc(1, sizeof(*b));
    if (!b) {
        rs_error(RESHARD_ERR_NO_MEMORY, "ib: no memory for a %zu-byte bounce buffer", len);
        return NULL;
    }
    b->cap = cap;
    b->cls = cls;
    b->buf = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (b->buf == MAP_FAILED) {
        rs_error(RESHARD_ERR_NO_MEMORY, "ib: mapping a %zu-byte bounce buffer: %m", cap);
        free(b);
        return NULL;
    }
    if (x->windows && !(b->mr = x->f->reg_mr(x->pd, b->buf, cap, ib_local_access(x)))) {
        rs_error(RESHARD_ERR_NETWORK, "ib: registering a %zu-byte bounce buffer on %s: %m", cap,
                 x->port.name);
        munmap(b->buf, cap);
        free(b);
        return NULL;
    }
    return b;
}

void ib_bounce_put(struct ib_ctx *x, struct ib_bounce *b)
{
    if (!b)
        return;
    if (b->cls < 0 || x->bounce_kept + b->cap > BOUNCE_KEEP) {
        bounce_free(x, b);
        return;
    }
    b->next = x->bounce_free[b->cls];
    x->bounce_free[b->cls] = b;
    x->bounce_kept += b->cap;
}

void ib_bounce_drop_all(struct ib_ctx *x)
{
    for (int c = 0; c < IB_BOUNCE_CLASSES; c++)
        while (x->bounce_free[c]) {
            struct ib_bounce *b = x->bounce_free[c];
            x->bounce_free[c] = b->next;
            bounce_free(x, b);
        }
    x->bounce_kept = 0;
}

/* The first got bytes of buf, out to the scatter list in order. */
void ib_bounce_scatter(const struct iovec *iov, size_t niov, const char *buf, size_t got)
{
    size_t off = 0;
    for (size_t i = 0; i < niov && off < got; i++) {
        size_t n = got - off < iov[i].iov_len ? got - off : iov[i].iov_len;
        memcpy(iov[i].iov_base, buf + off, n);
        off += n;
    }
}
