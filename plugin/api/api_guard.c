/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The guard around every public entry point (reshard.h): entering clears the last error,
 * leaving logs a failure once, at the level its cause deserves, and leaves the message to
 * reshard_last_error(). The list of live handles, which calls on plans and communicators
 * take their reference through. Also the entries that only read the library's own state:
 * status strings, the last error, the configuration.
 */
#include "plugin/reshard.h"

#include "api.h"
#include "base/error.h"
#include "base/log.h"
#include "base/param.h"

#include <pthread.h>

/* The plans and communicators the caller holds. A handle is looked for by address, and only
 * linked nodes are ever read, so a destroyed handle passed again is refused, not read (unless
 * a new plan or communicator took its address since). */
static pthread_mutex_t live_lock = PTHREAD_MUTEX_INITIALIZER;
static struct live_handle *live_head;

void api_live_add(struct live_handle *h, atomic_int *refs)
{
    pthread_mutex_lock(&live_lock);
    h->refs = refs;
    h->prev = NULL;
    h->next = live_head;
    if (live_head)
        live_head->prev = h;
    live_head = h;
    pthread_mutex_unlock(&live_lock);
}

static int linked(const struct live_handle *h)
{
    for (const struct live_handle *n = live_head; n; n = n->next)
        if (n == h)
            return 1;
    return 0;
}

int api_live_take(const struct live_handle *h)
{
    pthread_mutex_lock(&live_lock);
    int found = linked(h);
    if (found)
        atomic_fetch_add(h->refs, 1);
    pthread_mutex_unlock(&live_lock);
    return found;
}

int api_live_remove(struct live_handle *h)
{
    pthread_mutex_lock(&live_lock);
    int found = linked(h);
    if (found) {
        *(h->prev ? &h->prev->next : &live_head) = h->next;
        if (h->next)
            h->next->prev = h->prev;
        h->prev = h->next = NULL;
    }
    pthread_mutex_unlock(&live_lock);
    return found;
}

/* 0 after reshard_log_set_failures(0): the caller shows every failure itself. */
static _Atomic int warn_failures = 1;

/* Entry of every call that can fail: start the logger (so breadcrumbs reach it) and forget
 * the previous error. */
void api_enter(void)
{
    rs_log_enabled(RS_LOG_WARN);
    rs_error_clear();
}

/* Misuse and bad input are the caller's to report: logged at INFO. Failures of the system,
 * the network or a peer at WARN. */
reshard_status_t api_leave(const char *fn, reshard_status_t st)
{
    if (st != RESHARD_OK) {
        int system =
            st == RESHARD_ERR_NO_MEMORY || st == RESHARD_ERR_INTERNAL || st >= RESHARD_ERR_TIMEOUT;
        int caller = !system || st == RESHARD_ERR_BUSY || st == RESHARD_ERR_BUFFER ||
                     st == RESHARD_ERR_PLAN_MISMATCH;
        rs_log(caller || !warn_failures ? RS_LOG_INFO : RS_LOG_WARN, "%s: %s", fn,
               rs_error_message());
    }
    return st;
}

reshard_status_t api_null_arg(const char *fn, const char *what)
{
    return api_leave(fn, rs_error(RESHARD_ERR_INVALID_ARG, "%s: %s is NULL", fn, what));
}

const char *reshard_strerror(reshard_status_t status)
{
    return rs_status_string(status);
}

const char *reshard_last_error(void)
{
    return rs_error_message();
}

void reshard_config_print(FILE *out)
{
    rs_log_enabled(RS_LOG_WARN); /* the logger reports rejected values once */
    rs_param_print(out ? out : stdout);
}

void reshard_log_set_failures(int warn)
{
    warn_failures = warn != 0;
}
