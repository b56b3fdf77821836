/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The open-addressing index (base/hindex.c): every item found again across growths, absent
 * keys reported with a free slot, colliding hashes told apart by the caller's equality, and a
 * failed growth leaving the index as it was.
 */
#include "base/hindex.h"

#include "base/error.h"

#include <criterion/criterion.h>
#include <stdint.h>

#define NKEYS 5000

struct items {
    uint64_t key[NKEYS];
    size_t n;
    int collide; /* every hash the same: only eq tells items apart */
};

static uint64_t hash_key(const struct items *it, uint64_t k)
{
    return it->collide ? 7 : k * UINT64_C(0x9e3779b97f4a7c15);
}

static uint64_t hash_of(void *arg, size_t i)
{
    struct items *it = arg;
    return hash_key(it, it->key[i]);
}

struct probe {
    const struct items *it;
    uint64_t k;
};

static int eq(void *arg, size_t i)
{
    const struct probe *q = arg;
    return q->it->key[i] == q->k;
}

static long find(struct rs_hindex *x, struct items *it, uint64_t k, size_t *at)
{
    struct probe q = {it, k};
    return rs_hindex_find(x, hash_key(it, k), eq, &q, at);
}

static void fill_and_check(struct items *it, size_t n)
{
    struct rs_hindex x = {0};
    for (size_t i = 0; i < n; i++) {
        uint64_t k = 3 * i + 1;
        cr_assert_eq(rs_hindex_fit(&x, hash_of, it), RESHARD_OK);
        cr_assert_geq(x.cap, 2 * (x.count + 1), "more than half full at %zu", i);
        size_t at;
        cr_assert_eq(find(&x, it, k, &at), -1, "key %llu found before it was put",
                     (unsigned long long)k);
        it->key[it->n] = k;
        rs_hindex_put(&x, at, it->n++);
    }
    cr_assert_eq(x.count, n);
    for (size_t i = 0; i < n; i++) {
        size_t at;
        cr_assert_eq(find(&x, it, 3 * i + 1, &at), (long)i);
        cr_assert_eq(find(&x, it, 3 * i + 2, &at), -1);
    }
    rs_hindex_free(&x);
    cr_assert_eq(x.cap, 0);
    cr_assert_null(x.slot);
}

Test(hindex, every_item_found_across_growths)
{
    static struct items it;
    fill_and_check(&it, NKEYS);
}

Test(hindex, equal_hashes_told_apart_by_eq)
{
    static struct items it = {.collide = 1};
    fill_and_check(&it, 300);
}

Test(hindex, failed_growth_keeps_the_index)
{
    static struct items it;
    struct rs_hindex x = {0};
    for (size_t i = 0; i < 32; i++) { /* 64 slots take 32 items: the 33rd grows */
        cr_assert_eq(rs_hindex_fit(&x, hash_of, &it), RESHARD_OK);
        size_t at;
        it.key[it.n] = i;
        cr_assert_eq(find(&x, &it, i, &at), -1);
        rs_hindex_put(&x, at, it.n++);
    }
    size_t cap = x.cap;
    rs_test_fail_alloc(1);
    cr_assert_eq(rs_hindex_fit(&x, hash_of, &it), RESHARD_ERR_NO_MEMORY);
    rs_test_fail_alloc(0);
    cr_assert_eq(x.cap, cap);
    for (size_t i = 0; i < it.n; i++) {
        size_t at;
        cr_assert_eq(find(&x, &it, i, &at), (long)i);
    }
    rs_hindex_free(&x);
}
