/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The registry of live objects (net_live.h): one table of slots under one mutex, a leaf lock
 * that callers may take while holding a device's. Free slots form a list; a slot's generation
 * is the handle's, and comes from one counter, so a handle issued before the table was freed
 * and made again still finds another generation in its slot.
 */
#include "net_live.h"

#include "base/clock.h"
#include "base/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/random.h>
#include <unistd.h>

#define MARK      0xAull
#define GEN_BITS  36
#define SLOT_BITS 20
#define GEN_MASK  ((1ull << GEN_BITS) - 1)
#define SLOT_MASK ((1ull << SLOT_BITS) - 1)
#define NO_SLOT   UINT32_MAX

_Static_assert(NET_LIVE_MAX <= (1u << SLOT_BITS), "a slot number fits its field");
_Static_assert(NET_KIND_COUNT <= 16, "a kind fits its field");

struct live_slot {
    void *obj;          /* NULL when free */
    uint64_t gen;       /* the live handle's generation */
    uint32_t next;      /* the next free slot, when free */
    enum net_kind kind; /* 0 when free */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct live_slot *slots;
static size_t cap, used; /* slots allocated; slots ever handed out (the rest were never used) */
static unsigned live;
static uint32_t free_head = NO_SLOT;
static uint64_t next_gen;
static int seeded;

static const char *const kind_names[NET_KIND_COUNT] = {
    [NET_KIND_CTX] = "context",
    [NET_KIND_LISTEN] = "listen comm",
    [NET_KIND_SEND] = "send comm",
    [NET_KIND_RECV] = "receive comm",
    [NET_KIND_REQ] = "request",
    [NET_KIND_MR] = "registration",
    [NET_KIND_STAGE] = "connection in progress",
};

const char *net_kind_name(enum net_kind kind)
{
    return kind > 0 && kind < NET_KIND_COUNT ? kind_names[kind] : "object";
}

/* Generations start at a random point per process: another process's handle, or one from
 * before the library was loaded again, matches a live slot only by a 2^-36 chance. */
static void seed(void)
{
    uint64_t r = 0;
    if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r))
        r = (uint64_t)rs_now_ms() << 16 ^ (uint64_t)getpid(); /* entropy not ready yet */
    next_gen = r & GEN_MASK;
    seeded = 1;
}

static uint64_t handle_of(uint32_t slot, const struct live_slot *s)
{
    return MARK << 60 | (uint64_t)s->kind << 56 | (s->gen & GEN_MASK) << SLOT_BITS | slot;
}

/* A free slot, growing the table when none is; NO_SLOT when full or out of memory. */
static uint32_t take_slot(void)
{
    if (free_head != NO_SLOT) {
        uint32_t i = free_head;
        free_head = slots[i].next;
        return i;
    }
    if (used == NET_LIVE_MAX) {
        rs_error(RESHARD_ERR_NO_MEMORY,
                 "NET/Reshard: %u objects are live, the most this plugin keeps track of",
                 NET_LIVE_MAX);
        return NO_SLOT;
    }
    if (used == cap) {
        size_t c = cap;
        struct live_slot *grown = rs_grow(slots, &c, used + 1, sizeof(*slots),
                                          "NET/Reshard "
                                          "handles");
        if (!grown)
            return NO_SLOT;
        slots = grown;
        cap = c > NET_LIVE_MAX ? NET_LIVE_MAX : c;
    }
    return (uint32_t)used++;
}

void *net_live_add(void *obj, enum net_kind kind)
{
    pthread_mutex_lock(&lock);
    if (!seeded)
        seed();
    uint32_t i = take_slot();
    void *h = NULL;
    if (i != NO_SLOT) {
        struct live_slot *s = &slots[i];
        s->obj = obj;
        s->kind = kind;
        s->gen = next_gen++ & GEN_MASK;
        s->next = NO_SLOT;
        live++;
        h = (void *)(uintptr_t)handle_of(i, s);
    }
    pthread_mutex_unlock(&lock);
    return h;
}

/* The slot of a handle that is live and of one of the kinds, else NULL; lock held. */
static struct live_slot *find(uint64_t h, unsigned kinds, int *stale)
{
    uint64_t slot = h & SLOT_MASK, gen = h >> SLOT_BITS & GEN_MASK;
    enum net_kind kind = (enum net_kind)(h >> 56 & 0xf);
    int ours = h >> 60 == MARK && kind > 0 && kind < NET_KIND_COUNT && slot < used;
    if (stale)
        *stale = 0;
    if (!ours)
        return NULL;
    struct live_slot *s = &slots[slot];
    if (s->obj && s->kind == kind && s->gen == gen)
        return kinds & NET_KINDS(kind) ? s : NULL;
    if (stale)
        *stale = 1;
    return NULL;
}

void *net_live_get(const void *h, unsigned kinds, int *stale)
{
    pthread_mutex_lock(&lock);
    struct live_slot *s = find((uint64_t)(uintptr_t)h, kinds, stale);
    void *obj = s ? s->obj : NULL;
    pthread_mutex_unlock(&lock);
    return obj;
}

void net_live_drop(const void *h)
{
    pthread_mutex_lock(&lock);
    struct live_slot *s = find((uint64_t)(uintptr_t)h, ~0u, NULL);
    if (s) {
        s->obj = NULL;
        s->kind = 0;
        s->next = free_head;
        free_head = (uint32_t)(s - slots);
        live--;
    }
    pthread_mutex_unlock(&lock);
}

reshard_status_t net_live_each(unsigned kinds,
                               void (*fn)(void *h, void *obj, enum net_kind kind, void *arg),
                               void *arg)
{
    pthread_mutex_lock(&lock);
    size_t n = 0;
    uint64_t *hs = live ? rs_calloc(live, sizeof(*hs), "NET/Reshard handles") : NULL;
    if (live && !hs) {
        pthread_mutex_unlock(&lock);
        return RESHARD_ERR_NO_MEMORY;
    }
    for (size_t i = 0; hs && i < used; i++)
        if (slots[i].obj && (kinds & NET_KINDS(slots[i].kind)))
            hs[n++] = handle_of((uint32_t)i, &slots[i]);
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < n; i++) {
        void *h = (void *)(uintptr_t)hs[i];
        void *obj = net_live_get(h, kinds, NULL);
        if (obj)
            fn(h, obj, (enum net_kind)(hs[i] >> 56 & 0xf), arg);
    }
    free(hs);
    return RESHARD_OK;
}

unsigned net_live_count(void)
{
    pthread_mutex_lock(&lock);
    unsigned n = live;
    pthread_mutex_unlock(&lock);
    return n;
}

/* The tables of the processes this one was forked from, kept (reachable, so that a leak
 * checker does not report what was left to the parent on purpose). */
static struct live_slot *inherited[8];

void net_live_fork_child(void (*forget)(void *obj, enum net_kind kind))
{
    pthread_mutex_init(&lock, NULL); /* another thread of the parent may have held it */
    for (size_t i = 0; i < used; i++)
        if (slots[i].obj)
            forget(slots[i].obj, slots[i].kind);
    for (size_t i = 0; slots && i < sizeof(inherited) / sizeof(inherited[0]); i++)
        if (!inherited[i]) {
            inherited[i] = slots;
            break;
        }
    slots = NULL;
    cap = used = 0;
    live = 0;
    free_head = NO_SLOT;
}

void net_live_release(void)
{
    pthread_mutex_lock(&lock);
    if (!live) {
        free(slots);
        slots = NULL;
        cap = used = 0;
        free_head = NO_SLOT;
    }
    pthread_mutex_unlock(&lock);
}
