/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The run-time loader (base/dl.c) on libraries every host has: libm for a table of symbols,
 * the C library already in the process for the look in the process first. The file comes from
 * a string parameter, as the real tables' do (RESHARD_UCX_LIB here, set per test process).
 */
#include "base/dl.h"
#include "base/error.h"
#include "base/param.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct m_fns {
    double (*cos)(double);
    double (*sin)(double);
    double (*missing)(double);
    size_t (*strlen)(const char *);
};

static struct m_fns fns;
static int ready_calls;

static const struct rs_dl_sym with_optional[] = {
    {"cos", offsetof(struct m_fns, cos), RS_DL_REQUIRED},
    {"sin", offsetof(struct m_fns, sin), RS_DL_REQUIRED},
    {"rs_test_no_such_symbol", offsetof(struct m_fns, missing), RS_DL_OPTIONAL},
};

static const struct rs_dl_sym with_required_missing[] = {
    {"cos", offsetof(struct m_fns, cos), RS_DL_REQUIRED},
    {"rs_test_no_such_symbol", offsetof(struct m_fns, missing), RS_DL_REQUIRED},
    {"sin", offsetof(struct m_fns, sin), RS_DL_REQUIRED},
};

static const struct rs_dl_sym libc_only[] = {
    {"strlen", offsetof(struct m_fns, strlen), RS_DL_REQUIRED},
};

#define NSYMS(a) (sizeof(a) / sizeof((a)[0]))

static struct rs_dl make_dl(const struct rs_dl_sym *syms, size_t n)
{
    return (struct rs_dl){
        .what = "test",
        .file = RS_PARAM_UCX_LIB,
        .fallback = "libm.so.6",
        .open_prefix = "no library: ",
        .open_hint = " (install it)",
        .syms = syms,
        .nsyms = n,
        .table = &fns,
        .table_size = sizeof(fns),
    };
}

static void use_file(const char *file)
{
    setenv("RESHARD_UCX_LIB", file, 1);
    rs_param_reload();
}

static int count_ready(void *table, char *why, size_t cap)
{
    (void)table, (void)why, (void)cap;
    ready_calls++;
    return 0;
}

static int refuse(void *table, char *why, size_t cap)
{
    struct m_fns *f = table;
    snprintf(why, cap, "test: cos(0) is %g, and still no", f->cos(0.0));
    return -1;
}

Test(dl, a_missing_library_is_named_with_dlerror_and_the_hint)
{
    use_file("librs-not-here.so.9");
    struct rs_dl dl = make_dl(with_optional, NSYMS(with_optional));
    cr_assert_null(rs_dl_load(&dl));
    const char *msg = rs_error_message();
    cr_assert(!strncmp(msg, "test: no library: librs-not-here.so.9: cannot open", 50), "%s", msg);
    cr_assert(strstr(msg, " (install it)") == msg + strlen(msg) - 13, "%s", msg);
    cr_assert_eq(dl.status, RESHARD_ERR_UNAVAILABLE);
}

Test(dl, a_missing_required_symbol_is_named_and_the_table_cleared)
{
    use_file("libm.so.6");
    struct rs_dl dl = make_dl(with_required_missing, NSYMS(with_required_missing));
    cr_assert_null(rs_dl_load(&dl));
    cr_assert_str_eq(rs_error_message(), "test: libm.so.6 lacks rs_test_no_such_symbol");
    cr_assert_null(fns.cos, "no pointer of a failed load stays behind");
    cr_assert_null(fns.sin);
}

Test(dl, an_absent_optional_symbol_stays_null_and_the_rest_serve)
{
    use_file("libm.so.6");
    struct rs_dl dl = make_dl(with_optional, NSYMS(with_optional));
    struct m_fns *f = rs_dl_load(&dl);
    cr_assert_eq(f, &fns, "%s", rs_error_message());
    cr_assert_null(f->missing);
    cr_assert_float_eq(f->cos(0.0), 1.0, 1e-12);
    cr_assert_float_eq(f->sin(0.0), 0.0, 1e-12);
}

Test(dl, an_empty_parameter_opens_the_fallback)
{
    use_file("");
    struct rs_dl dl = make_dl(with_optional, NSYMS(with_optional));
    cr_assert_not_null(rs_dl_load(&dl), "%s", rs_error_message());
    cr_assert_float_eq(fns.cos(0.0), 1.0, 1e-12);
}

Test(dl, the_outcome_is_kept_and_said_again_to_every_caller)
{
    use_file("librs-not-here.so.9");
    struct rs_dl dl = make_dl(with_optional, NSYMS(with_optional));
    dl.ready = count_ready;
    cr_assert_null(rs_dl_load(&dl));
    char first[RS_ERROR_MAX];
    snprintf(first, sizeof(first), "%s", rs_error_message());
    rs_error_clear();
    use_file("libm.so.6"); /* too late: the load happened once */
    cr_assert_null(rs_dl_load(&dl));
    cr_assert_str_eq(rs_error_message(), first);
    cr_assert_eq(ready_calls, 0, "a library that did not open is not checked");
}

Test(dl, a_failed_check_fails_the_load_with_its_reason)
{
    use_file("libm.so.6");
    struct rs_dl dl = make_dl(with_optional, NSYMS(with_optional));
    dl.ready = refuse;
    cr_assert_null(rs_dl_load(&dl));
    cr_assert_str_eq(rs_error_message(), "test: cos(0) is 1, and still no");
    cr_assert_null(fns.cos);
}

Test(dl, the_process_own_copy_serves_before_any_file)
{
    use_file(""); /* the probe is looked for only when no file is named */
    struct rs_dl dl = make_dl(libc_only, NSYMS(libc_only));
    dl.fallback = "librs-not-here.so.9";
    dl.probe = "strlen";
    struct m_fns *f = rs_dl_load(&dl);
    cr_assert_not_null(f, "%s", rs_error_message());
    cr_assert_eq(f->strlen("seven!!"), 7);
}

Test(dl, a_probe_not_in_the_process_falls_back_and_says_so)
{
    use_file("");
    struct rs_dl dl = make_dl(libc_only, NSYMS(libc_only));
    dl.fallback = "librs-not-here.so.9";
    dl.probe = "rs_test_no_such_symbol";
    cr_assert_null(rs_dl_load(&dl));
    cr_assert(!strncmp(rs_error_message(),
                       "test: none loaded in this process, and no library: librs-not-here.so.9",
                       70),
              "%s", rs_error_message());
}

Test(dl, a_named_file_is_opened_even_when_the_process_has_a_copy)
{
    use_file("librs-not-here.so.9");
    struct rs_dl dl = make_dl(libc_only, NSYMS(libc_only));
    dl.probe = "strlen";
    cr_assert_null(rs_dl_load(&dl));
    cr_assert(strstr(rs_error_message(), "librs-not-here.so.9"), "%s", rs_error_message());
}

static struct rs_dl shared_dl;
static void *seen[8];

static void *load_from_thread(void *arg)
{
    seen[(long)arg] = rs_dl_load(&shared_dl);
    return NULL;
}

Test(dl, threads_racing_the_first_use_load_once)
{
    use_file("libm.so.6");
    shared_dl = make_dl(with_optional, NSYMS(with_optional));
    shared_dl.ready = count_ready;
    pthread_t t[8];
    for (long i = 0; i < 8; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, load_from_thread, (void *)i), 0);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(ready_calls, 1);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(seen[i], &fns, "thread %d", i);
}

/* ---- a fork while another thread loads a library ---- */

static sem_t loading, forked;

static int wait_for_the_fork(void *table, char *why, size_t cap)
{
    (void)table, (void)why, (void)cap;
    sem_post(&loading); /* the loader's lock is held now */
    while (sem_wait(&forked) != 0)
        ;
    return 0;
}

static void *load_slowly(void *arg)
{
    return rs_dl_load(arg);
}

/* A library's load (dlopen, its check: cuInit may take seconds) holds the loader's lock; a
 * child forked meanwhile by another thread has a copy of it that nobody will release. Before,
 * the child's first load of any other library waited for ever (here: its alarm). */
Test(dl, a_child_forked_while_another_thread_loads_a_library_can_load_one, .timeout = 60)
{
    use_file("libm.so.6");
    struct rs_dl slow = make_dl(with_optional, NSYMS(with_optional));
    slow.ready = wait_for_the_fork;
    cr_assert_eq(sem_init(&loading, 0, 0), 0);
    cr_assert_eq(sem_init(&forked, 0, 0), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, load_slowly, &slow), 0);
    while (sem_wait(&loading) != 0)
        ;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(10);
        static struct m_fns mine;
        struct rs_dl other = make_dl(libc_only, NSYMS(libc_only));
        other.fallback = "libc.so.6";
        other.table = &mine;
        other.table_size = sizeof(mine);
        use_file("libc.so.6");
        struct m_fns *f = rs_dl_load(&other);
        _exit(f && f->strlen("four") == 4 ? 0 : 1);
    }
    sem_post(&forked);
    cr_assert_not_null(pthread_join(t, NULL) == 0 ? slow.table : NULL);
    int status = 0;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(!WIFSIGNALED(status),
              "the child died of signal %d (SIGALRM: it waited for the "
              "loader's lock)",
              WTERMSIG(status));
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %#x", status);
}
