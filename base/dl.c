/* SPDX-License-Identifier: Apache-2.0 */
/* The run-time loader (dl.h): dlopen, a table of dlsym, and the load's outcome kept once. */
#include "dl.h"

#include "error.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* One lock for every table: loads are rare and short, and a table's own check (ready) may not
 * load another, so nothing waits on itself. */
static pthread_mutex_t dl_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* A child forked while another thread of its parent loaded a library (dlopen and a check such
 * as cuInit take long) has a copy of the lock that nobody will release: it starts free. A load
 * that was under way stays not done in the child, which loads it again if it needs it. */
static void dl_fork_child(void)
{
    pthread_mutex_init(&dl_lock, NULL);
}

static void dl_hook_fork(void)
{
    (void)pthread_atfork(NULL, NULL, dl_fork_child); /* fails only when memory is out */
}

/* The handle to resolve symbols in (RTLD_DEFAULT, which is NULL in glibc, for the process's
 * own copy) and the file it names; -1 with dl->error set when none opens. */
static int dl_open(struct rs_dl *dl, void **h, const char **file)
{
    const char *named = rs_param_str(dl->file);
    *file = *named ? named : dl->fallback;
    if (!*named && dl->probe && dlsym(RTLD_DEFAULT, dl->probe)) {
        *h = RTLD_DEFAULT;
        return 0;
    }
    /* RTLD_LOCAL keeps the library's symbols out of the global scope; a copy the process
     * already loaded (the same soname) is shared rather than loaded twice. */
    if ((*h = dlopen(*file, RTLD_NOW | RTLD_LOCAL)))
        return 0;
    snprintf(dl->error, sizeof(dl->error), "%s: %s%s%s%s", dl->what,
             !*named && dl->probe ? "none loaded in this process, and " : "",
             dl->open_prefix ? dl->open_prefix : "", dlerror(), dl->open_hint ? dl->open_hint : "");
    return -1;
}

/* Fills the table from h; the first required symbol missing ends it, named in dl->error. */
static int dl_resolve(struct rs_dl *dl, void *h, const char *file)
{
    for (size_t i = 0; i < dl->nsyms; i++) {
        const struct rs_dl_sym *s = &dl->syms[i];
        void *p = dlsym(h, s->name);
        if (!p && s->need == RS_DL_REQUIRED) {
            snprintf(dl->error, sizeof(dl->error), "%s: %s lacks %s", dl->what, file, s->name);
            return -1;
        }
        /* POSIX makes function and object pointers alike, so the address copies as bytes. */
        memcpy((char *)dl->table + s->offset, &p, sizeof(p));
    }
    return 0;
}

static void dl_load_locked(struct rs_dl *dl)
{
    const char *file;
    void *h;
    dl->status = RESHARD_ERR_UNAVAILABLE;
    if (dl_open(dl, &h, &file) != 0)
        return;
    if (dl_resolve(dl, h, file) != 0) {
        if (h != RTLD_DEFAULT)
            dlclose(h); /* nothing of it ran: it can go */
        memset(dl->table, 0, dl->table_size);
        return;
    }
    /* A library whose check fails stays open: its initialization (cuInit) may have started
     * threads that unloading would pull the code from under. */
    if (dl->ready && dl->ready(dl->table, dl->error, sizeof(dl->error)) != 0) {
        memset(dl->table, 0, dl->table_size);
        return;
    }
    dl->status = RESHARD_OK;
}

void *rs_dl_load(struct rs_dl *dl)
{
    if (!atomic_load_explicit(&dl->done, memory_order_acquire)) {
        pthread_once(&fork_once, dl_hook_fork);
        pthread_mutex_lock(&dl_lock);
        if (!atomic_load_explicit(&dl->done, memory_order_relaxed)) {
            dl_load_locked(dl);
            atomic_store_explicit(&dl->done, 1, memory_order_release);
        }
        pthread_mutex_unlock(&dl_lock);
    }
    if (dl->status != RESHARD_OK) {
        rs_error(dl->status, "%s", dl->error);
        return NULL;
    }
    return dl->table;
}
