/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What the conformance driver's files share (net_table.c: loading, the table, reporting;
 * net_stream.c: the two-process life cycle; net_driver.c: the bad-input cases and main;
 * net_hostile.c: what a hostile neighbour or a careless caller does): one interface over
 * every ncclNet_vN table, and the reporting every step uses.
 */
#ifndef RS_TEST_NET_DRIVER_H
#define RS_TEST_NET_DRIVER_H

#include "plugin/net/nccl/net_v12.h"
#include "plugin/net/nccl/net_v8.h"

#include <stddef.h>
#include <stdint.h>

#define MIB              (1024 * 1024)
#define MAX_RECVS_WANTED 8

extern int version;          /* of the table loaded */
extern const void *table;    /* ncclNetPlugin_vN */
extern void *plugin_lib;     /* dlopen's handle of the plugin */
extern int failures;         /* steps that failed */
extern char last_warn[1024]; /* the last WARN NCCL's logger got */
extern int warns;
extern void *driver_ctx; /* the context main finalizes at the end (a case may replace it) */
/* Called with each line NCCL's logger gets, in the thread that logs it, when set. */
extern void (*log_hook)(const char *msg);

#define T(v) ((const ncclNet_v##v##_t *)table)

/* ---- reporting: "ok <step>" or "FAIL <step>: why" ---- */

void ok(const char *step);
void fail(const char *step, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Expects call to fail with `want` and a WARN containing `says`; 0 when it did. */
int expect(const char *step, ncclResult_t got, ncclResult_t want, const char *says);

#define CHECK(step, cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fail(step, __VA_ARGS__);                                                               \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

#define NCCL_OK(step, call)                                                                        \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        CHECK(step, r_ == ncclSuccess, "%s returned %d (last WARN: %s)", #call, (int)r_,           \
              last_warn);                                                                          \
    } while (0)

double now_s(void);

/* ---- loading ---- */

/* The file NCCL would open: $NCCL_NET_PLUGIN when it holds a path, else by name. */
const char *plugin_path(void);
/* dlopen and the newest table `want` allows ("auto" or a version); quiet: no "ok load" line. */
int load(const char *want, int quiet);
/* init, devices (at least one) and every device's properties checked. */
int start(void **ctx, int *ndev);

/* ---- the table, whatever its version ---- */

ncclResult_t d_init(void **ctx);
ncclResult_t d_finalize(void *ctx);
ncclResult_t d_devices(int *n);
ncclResult_t d_listen(void *ctx, int dev, void *handle, void **lc);
ncclResult_t d_connect(void *ctx, int dev, void *handle, void **sc);
ncclResult_t d_accept(void *lc, void **rc);
ncclResult_t d_reg(void *comm, void *data, size_t size, int type, void **mh);
ncclResult_t d_reg_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset, int fd,
                          void **mh);
ncclResult_t d_dereg(void *comm, void *mh);
ncclResult_t d_isend(void *sc, void *data, size_t size, int tag, void *mh, void **req);
ncclResult_t d_irecv(void *rc, int n, void **data, size_t *sizes, int *tags, void **mhs,
                     void **req);
ncclResult_t d_iflush(void *rc, int n, void **data, int *sizes, void **mhs, void **req);
ncclResult_t d_test(void *req, int *done, int *sizes);
ncclResult_t d_close_send(void *c);
ncclResult_t d_close_recv(void *c);
ncclResult_t d_close_listen(void *c);

/* Device memory of the CUDA driver $RESHARD_CUDA_LIB names (the stand-in in tests). */
void *dev_alloc(size_t n);
void dev_free(void *p);
/* The dma-buf of [p, p + n) (cuMemGetHandleForAddressRange); -1 on failure. */
int dev_dmabuf(void *p, size_t n);
/* regMrDmaBuf of device memory as NCCL calls it (the fd closed once registered). */
ncclResult_t d_reg_device_dmabuf(void *comm, void *data, size_t size, void **mh);
/* iflush of a receive of n buffers that got got[i] bytes, waited for; counts it. */
int flush_recv(void *rc, int n, void **data, const int *got, void **mhs, int *flushes);

/* Tests until done or timeout_s; ncclInProgress is the driver's own "hung". */
ncclResult_t wait_req(void *req, int *sizes, double timeout_s);
/* Listener and connector in this process: a listen comm and a connected pair. */
int pair(void *ctx, void **lc, void **sc, void **rc, unsigned char *handle);
/* A pattern per seed, and the first byte (1-based) that differs from it (0: none). */
void fill(unsigned char *p, size_t n, uint64_t seed);
size_t mismatch(const unsigned char *p, size_t n, uint64_t seed);

/* ---- net_stream.c: the two-process life cycle ---- */

#define MSG  (4 * MIB)               /* one message of the stream */
#define MANY (32 * MAX_RECVS_WANTED) /* small messages in flight at once */

enum die { DIE_NONE, DIE_SEND, DIE_RECV };

struct run {
    const char *handle_file;
    enum die die;
    size_t stream_mib;
    int device; /* --mem device */
};

/* One side of the life cycle (the receiver writes the handle to run->handle_file, the sender
 * reads it); 0 when every step passed. */
int recv_side(void *ctx, const struct run *run);
int send_side(void *ctx, const struct run *run);

/* ---- net_hostile.c: each returns 0 when the plugin held ---- */

int case_null_data(void *ctx);
int case_stale_handles(void *ctx);
int case_idle_connection(void *ctx);
int case_connector_gave_up(void *ctx);
int case_flood(void *ctx);
int case_no_devices(void);   /* before start: expects no device at all */
int case_fork_in_init(void); /* before start: a fork while init holds the plugin's locks */
int case_devices(void *ctx);
int case_reload(void *ctx);

/* ---- net_lifecycle.c ---- */

int case_fork_live(void *ctx);
int case_fork_listener(void *ctx);
int case_finalize_in_flight(void *ctx);
int case_garbage_address(void *ctx);
int case_truncated(void *ctx);

#endif
