/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Issue 27, finding 1: a view offset near 2^63 bytes. `offset=2305843009213693950` (2^61 - 2)
 * on an f64 shard of 10 elements spans (2^61 + 8) * 8 bytes, which wraps to 64 in 64 bits; the
 * executor then wrote 16 bytes in front of a 64-byte buffer. The layout checks refuse such a
 * layout now (test/planner/test_layout.c), so none reaches the executor through the API; these
 * tests plant the offset in a planned layout to show that the executor's own buffer check
 * computes the bytes it needs without wrapping, and refuses instead of writing (or reading)
 * outside the buffer. The buffers sit between guard bytes, so that a stray write shows with or
 * without ASan.
 */
#include "base/error.h"
#include "planner/plan.h"
#include "plugin/handles.h"
#include "test/plugin/ranks.h"
#include "test/plugin/side.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define WRAPS  INT64_C(2305843009213693950) /* (2^61 - 2 + 10) * 8 = 2^64 + 64 */
#define GUARD  128
#define SHARD  64 /* 10 f64 elements would need 80; the wrapped span says 64 */
#define SRC    "shape=10 dtype=f64 ranks=0"
#define DST    "shape=10 dtype=f64 ranks=0 buffer=b"
#define POISON 0xa5
#define DATA   0x11

static void set_env(void)
{
    setenv("RESHARD_TIMEOUT", "30", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

TestSuite(exec_overflow, .init = set_env, .timeout = 120);

/* Puts the offset into the planned layout of one side, as if the checks had let it through. */
static void plant_offset(reshard_plan_t *plan, int side, int64_t offset)
{
    struct plan_tensor *pt = &plan->p->tensors[0];
    struct rs_layout *l = (struct rs_layout *)(side ? pt->dst_map.layout : pt->src_map.layout);
    l->view.offset = offset;
    (side ? &pt->dst : &pt->src)->view.offset = offset;
}

/* A buffer of n bytes between two guards, everything poisoned. */
static char *guarded(size_t n)
{
    char *g = malloc(GUARD + n + GUARD);
    cr_assert_not_null(g);
    memset(g, POISON, GUARD + n + GUARD);
    return g + GUARD;
}

static int guards_hold(const char *p, size_t n)
{
    for (size_t i = 0; i < GUARD; i++)
        if ((unsigned char)p[-1 - (long)i] != POISON || (unsigned char)p[n + i] != POISON)
            return 0;
    return 1;
}

/* Executes with the offset planted on `side`; the executor must refuse with
 * RESHARD_ERR_BUFFER and leave the guards alone. */
static reshard_status_t execute_planted(reshard_comm_t *comm, int side)
{
    reshard_layout_t *src = parse(SRC), *dst = parse(DST);
    reshard_tensor_t t = {"w", src, dst};
    reshard_plan_t *plan = NULL;
    reshard_status_t st = reshard_comm_plan_create(comm, &t, 1, NULL, &plan);
    if (st != RESHARD_OK)
        return st;
    plant_offset(plan, side, WRAPS);
    char *s = guarded(side ? 80 : SHARD), *d = guarded(side ? SHARD : 80);
    reshard_buffers_t b = {
        .src = s, .src_bytes = side ? 80 : SHARD, .dst = d, .dst_bytes = side ? SHARD : 80};
    memset(s, DATA, b.src_bytes);
    st = reshard_plan_execute(plan, &b);
    int intact = guards_hold(s, b.src_bytes) && guards_hold(d, b.dst_bytes);
    int read_guard = 0; /* guard bytes copied into the destination */
    for (size_t i = 0; i < b.dst_bytes; i++)
        read_guard |= (unsigned char)d[i] == POISON && st == RESHARD_OK;
    reshard_plan_destroy(plan);
    free(s - GUARD);
    free(d - GUARD);
    reshard_layout_destroy(src);
    reshard_layout_destroy(dst);
    if (!intact)
        return rs_error(RESHARD_ERR_INTERNAL, "the execution wrote outside the buffer (%s)",
                        reshard_strerror(st));
    if (st == RESHARD_OK)
        return rs_error(RESHARD_ERR_INTERNAL, "the execution succeeded%s",
                        read_guard ? ", reading outside the source buffer" : "");
    return st;
}

static reshard_status_t planted_destination(int rank, int size, reshard_comm_t *comm)
{
    (void)rank;
    (void)size;
    return execute_planted(comm, 1);
}

static reshard_status_t planted_source(int rank, int size, reshard_comm_t *comm)
{
    (void)rank;
    (void)size;
    return execute_planted(comm, 0);
}

Test(exec_overflow, a_destination_offset_whose_span_wraps_is_refused_not_written_before_the_buffer)
{
    struct outcome *o = run_ranks(1, planted_destination);
    cr_assert_eq(o[0].status, RESHARD_ERR_BUFFER, "%s", o[0].msg);
    cr_assert(strstr(o[0].msg, "destination buffer of tensor w holds 64 bytes"), "%s", o[0].msg);
}

Test(exec_overflow, a_source_offset_whose_span_wraps_is_refused_not_read_before_the_buffer)
{
    struct outcome *o = run_ranks(1, planted_source);
    cr_assert_eq(o[0].status, RESHARD_ERR_BUFFER, "%s", o[0].msg);
    cr_assert(strstr(o[0].msg, "source buffer of tensor w holds 64 bytes"), "%s", o[0].msg);
}

/* Through the API, the layout never gets that far: the parser refuses it, naming the column. */
Test(exec_overflow, a_destination_offset_near_2_63_bytes_never_reaches_a_plan)
{
    reshard_layout_t *l = NULL;
    cr_assert_eq(reshard_layout_parse(DST " offset=2305843009213693950", 0, &l),
                 RESHARD_ERR_TOO_LARGE);
    cr_assert_null(l);
    cr_assert(strstr(reshard_last_error(), "offset: the view of rank 0 reaches past byte 2^63"),
              "%s", reshard_last_error());
    cr_assert(strstr(reshard_last_error(), "at column 44"), "%s", reshard_last_error());
}
