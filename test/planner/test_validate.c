/* SPDX-License-Identifier: Apache-2.0 */
/* The validator rejects every kind of broken plan, naming what is wrong. */
#include "plan_util.h"
#include "base/error.h"
#include "planner/validate.h"

#include <criterion/criterion.h>
#include <string.h>

/* Domains {0,1,2} and {3,4,5}: sources 0 and 1 split 8 elements, replicas 3 and 4 want all of
 * them, ranks 2 and 5 idle. The plan has NET and FWD ops. */
static struct rs_plan *fresh(void)
{
    struct rs_plan *p = plan_one("shape=8 ranks=0-1 place=S(0)", "shape=8 ranks=3-4 place=R", 6, 3);
    cr_assert_eq(plan_validate(p), RESHARD_OK, "%s", rs_error_message());
    return p;
}

static size_t first(const struct rs_plan *p, enum plan_op_kind kind)
{
    for (size_t i = 0; i < p->nops; i++)
        if (p->ops[i].kind == kind)
            return i;
    cr_assert_fail("no %s op", plan_op_kind_name(kind));
    return 0;
}

/* Appends a copy of op, as a builder gone wrong would. */
static void push_copy(struct rs_plan *p, struct plan_op op)
{
    struct plan_op *v = realloc(p->ops, (p->nops + 1) * sizeof(*v));
    cr_assert_not_null(v);
    p->ops = v;
    p->ops_cap = p->nops + 1;
    p->ops[p->nops++] = op;
}

static void expect_invalid(struct rs_plan *p, const char *fragment)
{
    cr_assert_eq(plan_validate(p), RESHARD_ERR_INVALID_PLAN);
    cr_assert(strstr(rs_error_message(), fragment), "'%s' lacks '%s'", rs_error_message(),
              fragment);
    plan_free(p);
}

Test(validate, element_written_twice)
{
    struct rs_plan *p = fresh();
    push_copy(p, p->ops[first(p, PLAN_OP_NET)]);
    expect_invalid(p, "both write the same element");
}

Test(validate, element_missing)
{
    struct rs_plan *p = fresh();
    p->nops--;
    expect_invalid(p, "receives 6 of its 8 elements");
}

Test(validate, sender_lacks_the_box)
{
    struct rs_plan *p = fresh();
    struct plan_op *op = &p->ops[first(p, PLAN_OP_NET)];
    op->src = op->src == 0 ? 1 : 0;
    expect_invalid(p, "the sender does not hold the box in its source shard");
}

Test(validate, receiver_does_not_need_the_box)
{
    struct rs_plan *p = fresh();
    p->ops[first(p, PLAN_OP_NET)].dst = 5;
    expect_invalid(p, "the box is not part of the receiver's destination shard");
}

Test(validate, local_path_across_domains)
{
    struct rs_plan *p = fresh();
    p->ops[first(p, PLAN_OP_NET)].kind = PLAN_OP_LOCAL;
    expect_invalid(p, "a local-path op must join two ranks of one domain");
}

Test(validate, network_inside_a_domain)
{
    struct rs_plan *p = fresh();
    p->ops[first(p, PLAN_OP_FWD)].kind = PLAN_OP_NET;
    expect_invalid(p, "a network op inside one domain");
}

Test(validate, self_copy_between_ranks)
{
    struct rs_plan *p = fresh();
    p->ops[first(p, PLAN_OP_FWD)].kind = PLAN_OP_SELF;
    expect_invalid(p, "a self copy between two ranks");
}

Test(validate, forward_without_delivery)
{
    struct rs_plan *p = fresh();
    size_t f = first(p, PLAN_OP_FWD);
    p->ops[f].parent = (uint32_t)f;
    expect_invalid(p, "forwards a box that no earlier network op delivered");
}

Test(validate, forward_of_what_another_rank_received)
{
    struct rs_plan *p = fresh();
    size_t f = first(p, PLAN_OP_FWD);
    struct plan_op *op = &p->ops[f];
    int from = op->src;
    op->src = op->dst; /* the receiver of the forward claims to send it */
    op->dst = from;
    expect_invalid(p, "forwards a box its network op did not deliver to the sender");
}

Test(validate, box_outside_the_tensor)
{
    struct rs_plan *p = fresh();
    p->boxes.coords[p->ops[0].box] = 7; /* start 7, len >= 2 */
    expect_invalid(p, "box empty or outside the tensor");
}

Test(validate, bad_ranks_and_tensors)
{
    struct rs_plan *p = fresh();
    p->ops[0].dst = 6;
    expect_invalid(p, "rank outside the communicator");
    p = fresh();
    p->ops[0].tensor = 1;
    expect_invalid(p, "no such tensor");
}

Test(validate, an_element_enters_a_domain_twice)
{
    /* Turn one forward into a second network send of the same slice from its source: each
     * replica still gets every element once, but the slice now crosses into domain 1 twice. */
    struct rs_plan *p = fresh();
    size_t f = first(p, PLAN_OP_FWD);
    struct plan_op *op = &p->ops[f];
    op->kind = PLAN_OP_NET;
    op->src = p->ops[op->parent].src;
    op->parent = PLAN_NO_PARENT;
    expect_invalid(p, "carry the same element into a domain");
}
