/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The loader for libraries reshard opens at run time (the CUDA driver, libibverbs, libucp,
 * libnccl), so that it builds and loads on hosts without them. One struct rs_dl describes a
 * library: the parameter naming its file, a table of symbols (required or optional) and where
 * each address goes. It is loaded once per process, on first use; a failed load is kept as one
 * line ("cuda: no driver: <dlerror>", "ibverbs: <file> lacks ibv_x") and reported again to
 * every caller.
 */
#ifndef RS_DL_H
#define RS_DL_H

#include "param.h"
#include "reshard_status.h"

#include <stdatomic.h>
#include <stddef.h>

/* Whether the library serves without a symbol (its pointer then stays NULL). */
enum rs_dl_need { RS_DL_REQUIRED, RS_DL_OPTIONAL };

/* One entry of a table: the symbol and the offset of its pointer in the table. */
struct rs_dl_sym {
    const char *name;
    size_t offset;
    enum rs_dl_need need;
};

#define RS_DL_ERROR_MAX 256

struct rs_dl {
    /* ---- the description, filled by the user with designated initializers ---- */
    const char *what;     /* starts every message: "cuda", "ibverbs", "UCX", "nccl" */
    enum rs_param file;   /* the parameter naming the file to open */
    const char *fallback; /* the file when that parameter is empty */
    /* When the parameter is empty, a symbol to look for in the process first (RTLD_DEFAULT):
     * found, the process's own copy serves (NCCL: the one PyTorch loaded). NULL: never. */
    const char *probe;
    const char *open_prefix; /* before dlerror() when the file does not open: "no driver: " */
    const char *open_hint;   /* after it: " (install libucx0)" */
    const struct rs_dl_sym *syms;
    size_t nsyms;
    void *table; /* the addresses go here; cleared again when the load fails */
    size_t table_size;
    /* After the symbols: whether the library works (cuInit finds a device). Returns 0, or
     * non-zero with the reason written to why (a whole message: "cuda: no CUDA device"). It
     * must not load another rs_dl. NULL: no check. */
    int (*ready)(void *table, char *why, size_t cap);

    /* ---- the loader's own state ---- */
    atomic_int done;
    reshard_status_t status;
    char error[RS_DL_ERROR_MAX];
};

/* The loaded table, or NULL with RESHARD_ERR_UNAVAILABLE and the saved message recorded as the
 * calling thread's error (rs_error). Thread-safe; loads once per process. */
void *rs_dl_load(struct rs_dl *dl);

#endif
