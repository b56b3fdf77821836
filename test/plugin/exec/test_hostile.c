/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hostile execution hellos (issue 19, rows 4 and 5): what a peer puts in its start report and
 * in its announcement of its buffers is checked before anything is indexed, printed or
 * allocated from it. Each attack twice: against the decoder, and from a forked rank that
 * hand-rolls its side of the start (the vote, then the report or the announcement) while the
 * others execute: every honest rank fails with a message naming the attacker, none crashes, and
 * memory stays flat.
 */
#include "base/error.h"
#include "plugin/comm/comm.h"
#include "plugin/exec/exec_link.h"
#include "plugin/exec/exec_tag.h"
#include "plugin/exec/exec_vote.h"
#include "test/plugin/ranks.h"
#include "test/plugin/side.h"

#include <criterion/criterion.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define ROWS "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(0)"
#define COLS "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(1)"

static void set_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "10", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
}

TestSuite(hostile, .init = set_env, .timeout = 60);

/* ---- row 4: a start report naming tensor 0x10000000, its text without a NUL ---- */

Test(hostile, a_start_report_naming_tensor_0x10000000_is_refused_not_followed)
{
    struct plan_tensor t = {.name = "w"};
    struct rs_plan plan = {.ntensors = 1, .tensors = &t};
    struct exec_start_report r = {.status = RESHARD_ERR_BUFFER, .tensor = 0x10000000, .side = 1};
    memset(r.why, 'A', sizeof(r.why)); /* no NUL anywhere */
    cr_assert_eq(exec_start_refuse(&plan, 2, &r), RESHARD_ERR_REMOTE);
    cr_assert(strstr(reshard_last_error(), "rank 2 could not start the execution "
                                           "(RESHARD_ERR_BUFFER) and named tensor 268435456 of 1, "
                                           "side 1: a malformed report, refused"),
              "%s", reshard_last_error());
    r.tensor = 0; /* in range now: named, with its sizes */
    r.need = 64;
    cr_assert_eq(exec_start_refuse(&plan, 2, &r), RESHARD_ERR_BUFFER);
    cr_assert(strstr(reshard_last_error(), "rank 2: destination buffer of tensor w holds 0 bytes"),
              "%s", reshard_last_error());
    r.tensor = -1;
    cr_assert_eq(exec_start_refuse(&plan, 2, &r), RESHARD_ERR_REMOTE, "a negative tensor too");
}

Test(hostile, a_start_report_text_without_a_nul_or_with_control_bytes_is_cut_and_cleaned)
{
    struct plan_tensor t = {.name = "w"};
    struct rs_plan plan = {.ntensors = 1, .tensors = &t};
    struct exec_start_report r = {.status = RESHARD_ERR_INTERNAL, .side = EXEC_SIDE_NONE};
    memset(r.why, 'B', sizeof(r.why));
    r.why[3] = '\n';
    r.why[4] = '\033';
    cr_assert_eq(exec_start_refuse(&plan, 1, &r), RESHARD_ERR_REMOTE);
    const char *m = reshard_last_error(), *at = strstr(m, "BBB??BBB");
    cr_assert_not_null(at, "%s", m);
    cr_assert_eq(strlen(at), sizeof(r.why), "the text stops at its size: %zu", strlen(at));
    r.status = 12345; /* no such status */
    cr_assert_eq(exec_start_refuse(&plan, 1, &r), RESHARD_ERR_REMOTE);
    cr_assert(strstr(reshard_last_error(), "sent status 12345, which is none"), "%s",
              reshard_last_error());
}

/* The start vote folds alike in any order: the lowest failure, a change anywhere, and the two
 * ends of the (hash, execution) range with a rank holding each. */
Test(hostile, the_start_vote_folds_alike_in_any_order)
{
    struct exec_start_fold f[4], a, b;
    for (int r = 0; r < 4; r++)
        exec_start_fold_init(&f[r], r, r == 3 ? 0x99 : 0x42, 5, r >= 2, r == 1);
    a = f[0];
    for (int r = 1; r < 4; r++)
        exec_start_combine(&a, &f[r], NULL);
    b = f[3];
    for (int r = 2; r >= 0; r--)
        exec_start_combine(&b, &f[r], NULL);
    cr_assert_eq(memcmp(&a, &b, sizeof(a)), 0, "the order does not matter");
    cr_assert_eq(a.fail, 2);
    cr_assert_eq(a.changed, 1);
    cr_assert(a.lo.hash == 0x42 && a.lo.rank == 0 && a.hi.hash == 0x99 && a.hi.rank == 3);
    cr_assert_eq(exec_start_mismatch(&a, 0x42, 5), RESHARD_ERR_PLAN_MISMATCH);
    cr_assert(strstr(reshard_last_error(), "rank 3 executes another plan (hash 0000000000000099"),
              "%s", reshard_last_error());
    cr_assert_eq(exec_start_mismatch(&a, 0x99, 5), RESHARD_ERR_PLAN_MISMATCH);
    cr_assert(strstr(reshard_last_error(), "rank 0 executes another plan"), "%s",
              reshard_last_error());
}

/* ---- row 5: an announcement claiming 5,000,000 exports ---- */

static const struct exec_entry ENT[3] = {
    {0, XBUF_DST, 4096}, {0, XBUF_TMP, 8192}, {1, XBUF_DST, 64}};

static const struct exec_ann_want WANT = {
    .peer = 1, .pid = 4242, .seq = 7, .hash = 0x1234, .nent = 3, .ent = ENT};

/* An announcement: header, three addresses, then exports. */
static size_t ann(char *buf, uint32_t nexp_claimed, const struct cuda_ipc_export *e, int n)
{
    struct exec_ann_hdr h = {EXEC_ANN_MAGIC, 7, 0x1234, 3, nexp_claimed};
    uint64_t addr[3] = {0x1000, 0x2000, 0x3000};
    memcpy(buf, &h, sizeof(h));
    memcpy(buf + sizeof(h), addr, sizeof(addr));
    if (n)
        memcpy(buf + sizeof(h) + sizeof(addr), e, (size_t)n * sizeof(*e));
    return sizeof(h) + sizeof(addr) + (size_t)n * sizeof(*e);
}

static reshard_status_t decode(const char *buf, size_t len, uint8_t *has)
{
    uint64_t addr[3];
    struct cuda_ipc_export exp[3];
    return exec_ann_decode(buf, len, &WANT, addr, exp, has);
}

Test(hostile, an_announcement_claiming_5000000_exports_is_refused_before_any_allocation)
{
    char buf[1024];
    uint8_t has[3];
    size_t len = ann(buf, 5000000, NULL, 0);
    rs_test_fail_alloc(1); /* the decoder must not even try to allocate */
    reshard_status_t st = decode(buf, len, has);
    rs_test_fail_alloc(0);
    cr_assert_eq(st, RESHARD_ERR_REMOTE);
    cr_assert(strstr(reshard_last_error(), "rank 1 sent a malformed announcement of its buffers: "
                                           "3 entries and 5000000 exports in 48 bytes (this rank "
                                           "writes 3 entries, 2 of them exportable)"),
              "%s", reshard_last_error());
}

Test(hostile, an_announcement_is_taken_only_as_the_plan_says)
{
    char buf[1024];
    uint8_t has[3];
    struct cuda_ipc_export e[3] = {{.tensor = 1, .kind = CUDA_IPC_LEGACY, .bytes = 64}};
    size_t len = ann(buf, 1, e, 1);
    cr_assert_eq(decode(buf, len, has), RESHARD_OK, "%s", reshard_last_error());
    cr_assert(has[2] && !has[0] && !has[1], "the export lands on its entry");
    struct {
        const char *attack, *says;
        struct cuda_ipc_export e[2];
        int n;
        long cut;
    } cases[] = {
        {"a tensor it is not written",
         "an export of tensor 5, which this rank does not write",
         {{.tensor = 5, .bytes = 64}},
         1,
         0},
        {"a whole-tensor buffer exported", "an export of tensor 1, which", {{.tensor = 1}}, 0, 0},
        {"twice the same tensor",
         "tensor 1 exported twice",
         {{.tensor = 1, .bytes = 64}, {.tensor = 1, .bytes = 64}},
         2,
         0},
        {"a mapping smaller than the shard",
         "for a shard of 64",
         {{.tensor = 1, .bytes = 100, .offset = 40}},
         1,
         0},
        {"an unknown kind", "exported as kind 9", {{.tensor = 1, .kind = 9, .bytes = 64}}, 1, 0},
        {"a message cut short", "in 56 bytes", {{.tensor = 1, .bytes = 64}}, 1, 80},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int n = cases[i].n ? cases[i].n : 1;
        if (i == 1) /* tensor 0's entry of the pair is a whole-tensor buffer only at index 1 */
            cases[i].e[0] = (struct cuda_ipc_export){.tensor = 2, .bytes = 64};
        len = ann(buf, (uint32_t)n, cases[i].e, n) - (size_t)cases[i].cut;
        cr_assert_eq(decode(buf, len, has), RESHARD_ERR_REMOTE, "%s accepted", cases[i].attack);
        if (i != 1)
            cr_assert(strstr(reshard_last_error(), cases[i].says), "%s: %s", cases[i].attack,
                      reshard_last_error());
    }
    /* a descriptor in another process than the announcer's own */
    struct cuda_ipc_export fd = {.tensor = 0, .kind = CUDA_IPC_POSIX_FD, .bytes = 4096};
    struct cuda_ipc_fd other = {.pid = 1, .fd = 3};
    memcpy(&fd.handle, &other, sizeof(other));
    len = ann(buf, 1, &fd, 1);
    cr_assert_eq(decode(buf, len, has), RESHARD_ERR_REMOTE);
    cr_assert(
        strstr(reshard_last_error(), "descriptor 3 in process 1, not in its own process 4242"),
        "%s", reshard_last_error());
    /* no address, another execution, another plan, garbage */
    len = ann(buf, 0, NULL, 0);
    memset(buf + sizeof(struct exec_ann_hdr) + 8, 0, 8);
    cr_assert_eq(decode(buf, len, has), RESHARD_ERR_REMOTE);
    cr_assert(strstr(reshard_last_error(), "no buffer for tensor 0"), "%s", reshard_last_error());
    struct exec_ann_hdr h = {EXEC_ANN_MAGIC, 8, 0x1234, 3, 0};
    memcpy(buf, &h, sizeof(h));
    cr_assert_eq(decode(buf, len, has), RESHARD_ERR_REMOTE, "another execution's");
    cr_assert_eq(decode(buf, 3, has), RESHARD_ERR_REMOTE, "shorter than a header");
    uint8_t cuda = 9;
    struct exec_writer_msg w = {EXEC_WRITER_MAGIC, 7, 0x1234, 2, 0};
    cr_assert_eq(exec_writer_decode(&w, sizeof(w), 1, 7, 0x1234, &cuda), RESHARD_ERR_REMOTE);
    cr_assert_eq(cuda, 9, "nothing stored from a refused message");
    w.cuda = 1;
    cr_assert_eq(exec_writer_decode(&w, sizeof(w), 1, 7, 0x1234, &cuda), RESHARD_OK);
    cr_assert_eq(cuda, 1);
}

/* ---- the same attacks from a forked rank ---- */

static int attacker, attack_row;

struct sent {
    struct tp_req req;
    int done;
    reshard_status_t st;
};

static void sent_done(struct tp_req *req, reshard_status_t st, size_t bytes)
{
    (void)bytes;
    struct sent *s = container_of(req, struct sent, req);
    s->done = 1;
    s->st = st;
}

/* A control message from the attacker, driven to completion by hand. */
static void send_raw(reshard_comm_t *c, int peer, uint64_t tag, const void *buf, size_t len)
{
    struct sent s = {.req.done = sent_done};
    struct tp_ctx *net = c->net;
    if (net->ops->send(net, peer, tag, buf, len, NULL, 1, &s.req) != RESHARD_OK)
        return;
    for (int i = 0; i < 20000 && !s.done; i++)
        if (!net->ops->progress(net))
            (void)net->ops->wait(net, 1);
}

/* The attacker's start: it votes like anyone, then sends what its row says. */
static reshard_status_t attack(reshard_comm_t *c, const struct side *x)
{
    uint32_t seq = c->seq++;
    uint64_t hash = reshard_plan_hash(x->plan);
    struct exec_start_fold f;
    exec_start_fold_init(&f, c->rank, hash, seq, attack_row == 4, attack_row == 5);
    RS_CHECK(boot_allreduce(c->boot, &f, sizeof(f), exec_start_combine, NULL));
    if (attack_row == 4) {
        struct exec_start_report r = {
            .status = RESHARD_ERR_BUFFER, .tensor = 0x10000000, .side = 1};
        memset(r.why, 'A', sizeof(r.why));
        return boot_bcast(c->boot, &r, sizeof(r), c->boot_of[c->rank]);
    }
    /* row 5: to its domain peer (it writes there, and is written), a writer's message and an
     * announcement claiming five million exports */
    int peer = c->rank ^ 1;
    struct exec_writer_msg w = {EXEC_WRITER_MAGIC, seq, hash, 0, 0};
    send_raw(c, peer, exec_tag(EXEC_TAG_RUN, seq, EXEC_RUN_WRITER, 0), &w, sizeof(w));
    char buf[256] = {0};
    struct exec_ann_hdr h = {EXEC_ANN_MAGIC, seq, hash, 1, 5000000};
    memcpy(buf, &h, sizeof(h));
    send_raw(c, peer, exec_tag(EXEC_TAG_RUN, seq, EXEC_RUN_ANNOUNCE, 0), buf, sizeof(h) + 8);
    return RESHARD_OK;
}

static long rss_kib(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_maxrss;
}

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static reshard_status_t hostile_rank(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side x;
    reshard_status_t st = side_open(&x, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    long rss = rss_kib();
    int64_t t0 = mono_ms();
    if (rank == attacker) {
        st = attack(comm, &x);
        if (st == RESHARD_OK && attack_row == 4) /* nothing moved: the next refit is whole */
            st = reshard_plan_execute(x.plan, &x.b);
        if (st == RESHARD_OK && attack_row == 4)
            st = reshard_comm_barrier(comm); /* leave together */
        /* row 5: stay until rank 0 has judged the announcement (its failure ends this barrier;
         * RESHARD_TIMEOUT bounds it): gone at once, it could be seen leaving first */
        if (st == RESHARD_OK && attack_row == 5)
            reshard_comm_barrier(comm);
        side_close(&x);
        return st == RESHARD_OK ? RESHARD_ERR_INTERNAL : st; /* not asserted on */
    }
    st = reshard_plan_execute(x.plan, &x.b);
    char why[RS_ERROR_MAX];
    snprintf(why, sizeof(why), "%s", reshard_last_error());
    long grew = rss_kib() - rss;
    int64_t took = mono_ms() - t0;
    fprintf(stderr, "hostile row %d: rank %d: %s in %lld ms, +%ld KiB: %s\n", attack_row, rank,
            reshard_strerror(st), (long long)took, grew, why);
    reshard_status_t next = RESHARD_OK;
    if (attack_row == 4 && st != RESHARD_OK) { /* refused before bytes moved: usable still */
        memset(x.d, 0, x.b.dst_bytes);
        next = reshard_plan_execute(x.plan, &x.b);
        if (next == RESHARD_OK && count_wrong(x.dst, rank, x.d))
            next = rs_error(RESHARD_ERR_INTERNAL, "rank %d: wrong data after the refusal", rank);
        if (next == RESHARD_OK)
            next = reshard_comm_barrier(comm);
    }
    if (st == RESHARD_OK)
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: the attack went unnoticed", rank);
    else if (grew > 64 * 1024)
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: memory grew by %ld KiB: %s", rank, grew, why);
    else if (next != RESHARD_OK)
        st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: after the refusal: %s", rank,
                      reshard_last_error());
    else
        st = rs_error(st, "%s", why);
    side_close(&x);
    return st;
}

Test(hostile, a_rank_sending_tensor_0x10000000_in_its_start_report_is_named_on_every_rank)
{
    attacker = 2;
    attack_row = 4;
    struct outcome *o = run_ranks(4, hostile_rank);
    for (int r = 0; r < 4; r++) {
        if (r == attacker)
            continue;
        cr_assert_eq(o[r].status, RESHARD_ERR_REMOTE, "rank %d: %d %s", r, o[r].status, o[r].msg);
        cr_assert(strstr(o[r].msg, "rank 2 could not start the execution (RESHARD_ERR_BUFFER) and "
                                   "named tensor 268435456 of 1"),
                  "rank %d: %s", r, o[r].msg);
    }
}

Test(hostile, a_rank_announcing_5000000_exports_is_refused_by_its_writer_at_once)
{
    attacker = 1;
    attack_row = 5;
    struct outcome *o = run_ranks(4, hostile_rank);
    cr_assert_eq(o[0].status, RESHARD_ERR_REMOTE, "rank 0: %d %s", o[0].status, o[0].msg);
    cr_assert(strstr(o[0].msg, "rank 1 sent a malformed announcement of its buffers: 1 entries and "
                               "5000000 exports"),
              "rank 0: %s", o[0].msg);
    for (int r = 2; r < 4; r++) /* told by rank 0, or by the bootstrap seeing the attacker go */
        cr_assert(o[r].status != RESHARD_OK && strstr(o[r].msg, "rank "), "rank %d: %d %s", r,
                  o[r].status, o[r].msg);
}
