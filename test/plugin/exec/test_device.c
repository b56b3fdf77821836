/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device buffers on the native executor, on the stand-in driver (test/fake/fake_cuda.c): its
 * device memory is shared memory the host can read, and its IPC handles open another process's
 * allocation through /proc/PID/fd, so CUDA IPC between forked ranks runs for real; its pack
 * kernels run on the host. Each rank allocates its buffers with cuMemAlloc; ranks {0,1} and
 * {2,3} form two domains.
 */
#include "base/error.h"
#include "base/param.h"
#include "cuda/cuda_lib.h"
#include "plugin/reshard.h"
#include "test/plugin/ranks.h"
#include "test/plugin/side.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Row quarters to column quarters: every rank sends a strided block to every other, one of
 * them its domain peer. */
#define ROWS "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(0)"
#define COLS "shape=48x40 dtype=i32 ranks=0-3 mesh=4 place=S(1)"
/* Row halves on ranks 0-1, wanted whole by all: each domain gets each half once over the
 * network and forwards it inside. */
#define HALVES "shape=48x40 dtype=i32 ranks=0-1 mesh=2 place=S(0)"
#define WHOLE  "shape=48x40 dtype=i32 ranks=0-3 place=R"
/* Rows to columns again, with 1 KiB rows in each block: wide enough for the copy engines. */
#define WIDE_ROWS "shape=16x1024 dtype=i32 ranks=0-3 mesh=4 place=S(0)"
#define WIDE_COLS "shape=16x1024 dtype=i32 ranks=0-3 mesh=4 place=S(1)"

static void *fake(void)
{
    static char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        fprintf(stderr, "%s: %s (build it first)\n", path, dlerror());
        abort();
    }
    return h;
}

static int fake_count(const char *name)
{
    int (*f)(void) = (int (*)(void))dlsym(fake(), name);
    return f ? f() : -1;
}

/* Moves a side's buffers to device memory (the stand-in's; the host can still read them). */
static void *device_copy(const void *host, size_t n)
{
    int (*alloc)(uint64_t *, size_t) = (int (*)(uint64_t *, size_t))dlsym(fake(), "cuMemAlloc_v2");
    uint64_t p = 0;
    if (!n)
        return NULL;
    if (alloc(&p, n))
        abort();
    memcpy((void *)(uintptr_t)p, host, n);
    return (void *)(uintptr_t)p;
}

/* Maps a new cuMemCreate allocation of n bytes, made with the given shareable handle types
 * (0: none), at p. */
static void vmm_map(uint64_t p, size_t n, int types)
{
    void *h = fake();
    cu_mem_prop prop = {.type = 1, .requested_handle_types = types, .location = {1, 0}};
    cu_mem_access rw = {{1, 0}, 3};
    cu_mem_handle m;
    if (((int (*)(cu_mem_handle *, size_t, const cu_mem_prop *, unsigned long long))dlsym(
            h, "cuMemCreate"))(&m, n, &prop, 0) ||
        ((int (*)(uint64_t, size_t, size_t, cu_mem_handle, unsigned long long))dlsym(
            h, "cuMemMap"))(p, n, 0, m, 0) ||
        ((int (*)(uint64_t, size_t, const cu_mem_access *, size_t))dlsym(h, "cuMemSetAccess"))(
            p, n, &rw, 1) ||
        ((int (*)(cu_mem_handle))dlsym(h, "cuMemRelease"))(m))
        abort();
}

static uint64_t vmm_reserve(size_t n)
{
    uint64_t p = 0;
    if (((int (*)(uint64_t *, size_t, size_t, uint64_t, unsigned long long))dlsym(
            fake(), "cuMemAddressReserve"))(&p, n, 0, 0, 0))
        abort();
    return p;
}

/* The buffer in one cuMemCreate allocation (as PyTorch's expandable segments map them). */
static void *vmm_copy(const void *host, size_t n, int types)
{
    uint64_t p = vmm_reserve(n);
    vmm_map(p, n, types);
    memcpy((void *)(uintptr_t)p, host, n);
    return (void *)(uintptr_t)p;
}

/* The buffer across two allocations mapped side by side: its first 64 bytes in the first. */
static void *vmm_span_copy(const void *host, size_t n, int types)
{
    size_t page = 4096, second = (n + page - 1) / page * page;
    uint64_t p = vmm_reserve(page + second);
    vmm_map(p, page, types);
    vmm_map(p + page, second, types);
    memcpy((void *)(uintptr_t)(p + page - 64), host, n);
    return (void *)(uintptr_t)(p + page - 64);
}

static void on_device(struct side *x)
{
    x->b.src = device_copy(x->s, x->b.src_bytes);
    x->b.dst = device_copy(x->d, x->b.dst_bytes);
    x->b.mem = RESHARD_MEM_CUDA;
}

/* side_open with the buffers on the device. */
static reshard_status_t device_side(struct side *x, reshard_comm_t *comm, int rank, const char *src,
                                    const char *dst)
{
    reshard_status_t st = side_open(x, comm, rank, src, dst);
    if (st == RESHARD_OK)
        on_device(x);
    return st;
}

/* Runs the plan `iters` times into zeroed destinations and checks every element. */
static reshard_status_t refit(struct side *x, int rank, int iters)
{
    reshard_status_t st = RESHARD_OK;
    for (int it = 0; it < iters && st == RESHARD_OK; it++) {
        if (x->b.dst)
            memset(x->b.dst, 0, x->b.dst_bytes);
        st = reshard_plan_execute(x->plan, &x->b);
        if (st == RESHARD_OK && x->b.dst && count_wrong(x->dst, rank, x->b.dst))
            st = rs_error(RESHARD_ERR_INTERNAL, "rank %d: wrong data", rank);
    }
    return st;
}

static reshard_status_t expect(int ok, const char *what, long long got)
{
    return ok ? RESHARD_OK : rs_error(RESHARD_ERR_INTERNAL, "%s (got %lld)", what, got);
}

static void set_env(void)
{
    setenv("RESHARD_DOMAIN_SIZE", "2", 1);
    setenv("RESHARD_TIMEOUT", "5", 1);
    setenv("UCX_LOG_LEVEL", "error", 1);
    char path[512];
    const char *b = getenv("RESHARD_BUILD");
    snprintf(path, sizeof(path), "%s/test/fake/libcuda.so.1", b && *b ? b : "build");
    setenv("RESHARD_CUDA_LIB", path, 1);
}

TestSuite(device, .init = set_env, .timeout = 60);

/* Both plans three times: the data lands, every local byte goes through IPC, and each rank
 * opens its peer's allocation once per plan, not once per execution. A fourth execution
 * into a new destination allocation maps it and closes the old mapping. */
static reshard_status_t ipc_refits(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a, b;
    reshard_status_t st = side_open(&a, comm, rank, ROWS, COLS);
    if (st == RESHARD_OK)
        st = side_open(&b, comm, rank, HALVES, WHOLE);
    if (st != RESHARD_OK)
        return st;
    on_device(&a);
    on_device(&b);
    st = refit(&a, rank, 3);
    if (st == RESHARD_OK)
        st = refit(&b, rank, 3);
    reshard_comm_counters_t n;
    reshard_comm_counters(comm, &n);
    if (st == RESHARD_OK)
        st = expect(n.ipc_out > 0 && n.ipc_out == n.local_out, "every local byte through CUDA IPC",
                    (long long)n.ipc_out);
    if (st == RESHARD_OK) /* UCX here has no CUDA support: the network goes through staging */
        st = expect(n.gdr_out == 0 && n.gdr_in == 0, "no GPUDirect on this UCX",
                    (long long)n.gdr_out);
    size_t fatbin; /* strided chunks (plan a's) go through the kernels when there are some */
    int launches = fake_count("fake_cuda_launches");
    if (st == RESHARD_OK)
        st = expect(cuda_fatbin(&fatbin) ? launches > 0 : launches == 0,
                    "strided chunks packed by the kernels in a build with nvcc", launches);
    if (st == RESHARD_OK)
        st = expect(fake_count("fake_cuda_ipc_opens") == 2, "one mapping per peer allocation",
                    fake_count("fake_cuda_ipc_opens"));
    if (st == RESHARD_OK) { /* a new destination allocation: peers map it, drop the old one */
        b.b.dst = device_copy(b.d, b.b.dst_bytes);
        st = refit(&b, rank, 1);
    }
    if (st == RESHARD_OK)
        st = expect(
            fake_count("fake_cuda_ipc_opens") == 3 && fake_count("fake_cuda_ipc_closes") == 1,
            "the new allocation mapped, the old one closed", fake_count("fake_cuda_ipc_closes"));
    side_close(&a);
    side_close(&b);
    return st;
}

Test(device, local_peers_write_device_destinations_through_cuda_ipc)
{
    all_ok(run_ranks(4, ipc_refits), 4);
}

/* Blocks of wide rows go to the peer (and into this rank's own destination) as one 2-D copy
 * on the copy engines, narrow ones (the first test's 40-byte rows) through the kernels. */
static reshard_status_t wide_rows(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, WIDE_ROWS, WIDE_COLS);
    if (st != RESHARD_OK)
        return st;
    int launches = fake_count("fake_cuda_launches");
    st = refit(&a, rank, 2);
    if (st == RESHARD_OK) /* per refit: the block to the domain peer, and this rank's own */
        st = expect(fake_count("fake_cuda_copies_2d") == 4, "two 2-D copies per refit",
                    fake_count("fake_cuda_copies_2d"));
    if (st == RESHARD_OK)
        st = expect(fake_count("fake_cuda_launches") == launches, "no kernel",
                    fake_count("fake_cuda_launches"));
    side_close(&a);
    return st;
}

Test(device, wide_rows_go_to_peers_as_one_copy_engine_transfer)
{
    all_ok(run_ranks(4, wide_rows), 4);
}

/* Destinations in cuMemCreate allocations: shared through a POSIX descriptor (taken from the
 * exporter with pidfd_getfd) or a fabric handle, imported and mapped once per peer; without a
 * shareable handle type their writers stage. */
static int vmm_types;

static reshard_status_t vmm_refits(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    a.b.dst = vmm_copy(a.d, a.b.dst_bytes, vmm_types);
    st = refit(&a, rank, 3);
    reshard_comm_counters_t n;
    reshard_comm_counters(comm, &n);
    if (st == RESHARD_OK && vmm_types)
        st = expect(n.ipc_out > 0 && n.ipc_out == n.local_out, "every local byte through IPC",
                    (long long)n.ipc_out);
    if (st == RESHARD_OK && vmm_types)
        st = expect(fake_count("fake_cuda_vmm_imports") == 1, "the peer's allocation imported once",
                    fake_count("fake_cuda_vmm_imports"));
    if (st == RESHARD_OK && !vmm_types)
        st = expect(n.ipc_out == 0 && n.local_out > 0, "staged", (long long)n.ipc_out);
    if (st == RESHARD_OK && vmm_types) { /* a new allocation (a descriptor number reused) */
        a.b.dst = vmm_copy(a.d, a.b.dst_bytes, vmm_types);
        st = refit(&a, rank, 1);
    }
    if (st == RESHARD_OK && vmm_types)
        st = expect(fake_count("fake_cuda_vmm_imports") == 2, "the new allocation imported",
                    fake_count("fake_cuda_vmm_imports"));
    side_close(&a);
    return st;
}

Test(device, cumemcreate_destinations_are_shared_through_posix_descriptors)
{
    vmm_types = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    all_ok(run_ranks(4, vmm_refits), 4);
}

Test(device, cumemcreate_destinations_are_shared_through_fabric_handles)
{
    vmm_types = CU_MEM_HANDLE_TYPE_FABRIC;
    all_ok(run_ranks(4, vmm_refits), 4);
}

/* A destination across two allocations: no one handle covers it, so its writer stages. */
static reshard_status_t spanning_refits(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    a.b.dst = vmm_span_copy(a.d, a.b.dst_bytes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    st = refit(&a, rank, 2);
    reshard_comm_counters_t n;
    reshard_comm_counters(comm, &n);
    if (st == RESHARD_OK)
        st = expect(n.ipc_out == 0 && n.local_out > 0, "staged", (long long)n.ipc_out);
    side_close(&a);
    return st;
}

Test(device, a_destination_across_two_allocations_is_staged)
{
    all_ok(run_ranks(4, spanning_refits), 4);
}

Test(device, cumemcreate_destinations_without_a_shareable_handle_are_staged)
{
    vmm_types = 0;
    all_ok(run_ranks(4, vmm_refits), 4);
}

/* Columns to rows through staging (RESHARD_CUDA_IPC=0): every block from another rank lands
 * strided in the destination's shadow (from the network and the domain peer) and reaches the
 * device as one 2-D copy, not one copy per row; this rank's own block is copied on the device
 * (by the kernels, or run by run without them), never through the shadows. */
static reshard_status_t strided_landings(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, COLS, ROWS);
    if (st != RESHARD_OK)
        return st;
    st = refit(&a, rank, 2);
    if (st == RESHARD_OK) /* 3 blocks of 12 rows from others per refit */
        st = expect(fake_count("fake_cuda_copies_2d") == 6, "one 2-D copy per landed block",
                    fake_count("fake_cuda_copies_2d"));
    int on_device = fake_count("fake_cuda_launches") + fake_count("fake_cuda_async_copies");
    reshard_comm_counters_t n;
    reshard_comm_counters(comm, &n);
    if (st == RESHARD_OK)
        st = expect(on_device > 0 && n.self > 0, "this rank's block copied on the device",
                    on_device);
    side_close(&a);
    return st;
}

Test(device, strided_chunks_reach_the_device_as_one_2d_copy_and_own_blocks_stay_there)
{
    setenv("RESHARD_CUDA_IPC", "0", 1);
    all_ok(run_ranks(4, strided_landings), 4);
}

/* One domain of 4: every block goes through IPC or stays on the device, so no source is
 * copied to the host at all. */
static reshard_status_t one_domain(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    st = refit(&a, rank, 2);
    unsigned long long (*dtoh)(void) =
        (unsigned long long (*)(void))dlsym(fake(), "fake_cuda_dtoh_bytes");
    unsigned long long (*htod)(void) =
        (unsigned long long (*)(void))dlsym(fake(), "fake_cuda_htod_bytes");
    if (st == RESHARD_OK) /* beyond the test's own copies: its on_device uses memcpy */
        st = expect(dtoh() == 0 && htod() == 0, "no byte through the host",
                    (long long)(dtoh() + htod()));
    side_close(&a);
    return st;
}

Test(device, a_refit_inside_one_domain_never_touches_host_memory)
{
    setenv("RESHARD_DOMAIN_SIZE", "4", 1);
    all_ok(run_ranks(4, one_domain), 4);
}

/* RESHARD_CUDA_IPC=0: the same refits through host staging and cross-memory writes. */
static reshard_status_t staged_refits(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    st = refit(&a, rank, 2);
    reshard_comm_counters_t n;
    reshard_comm_counters(comm, &n);
    if (st == RESHARD_OK)
        st = expect(n.ipc_out == 0 && n.local_out > 0, "local bytes, none through IPC",
                    (long long)n.ipc_out);
    if (st == RESHARD_OK)
        st = expect(fake_count("fake_cuda_ipc_opens") == 0, "no mapping",
                    fake_count("fake_cuda_ipc_opens"));
    side_close(&a);
    return st;
}

Test(device, without_cuda_ipc_local_peers_go_through_host_staging)
{
    setenv("RESHARD_CUDA_IPC", "0", 1);
    all_ok(run_ranks(4, staged_refits), 4);
}

/* Rank 1 keeps host buffers: it writes rank 0 by cross-memory writes into rank 0's staging,
 * and rank 0 writes rank 1's host destination the same way; domain {2,3} uses IPC. */
static reshard_status_t mixed_refits(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = side_open(&a, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    if (rank != 1)
        on_device(&a);
    st = refit(&a, rank, 2);
    reshard_comm_counters_t n;
    reshard_comm_counters(comm, &n);
    if (st == RESHARD_OK)
        st = expect(rank < 2 ? n.ipc_out == 0 : n.ipc_out == n.local_out && n.ipc_out > 0,
                    "IPC only between device ranks", (long long)n.ipc_out);
    side_close(&a);
    return st;
}

Test(device, a_rank_with_host_buffers_meets_device_peers_through_host_memory)
{
    all_ok(run_ranks(4, mixed_refits), 4);
}

/* Rank 0 cannot use IPC: RESHARD_CUDA_IPC=0 there (ranks 0 and 1 then meet through staging
 * both ways), or its destination allocation does not export (rank 1 writes it through
 * staging; rank 0 still writes rank 1 through IPC). Domain {2,3} keeps IPC. */
static reshard_status_t peer_stages(int rank, int size, reshard_comm_t *comm, int ipc_off)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    st = refit(&a, rank, 2);
    reshard_comm_counters_t n;
    reshard_comm_counters(comm, &n);
    /* Rank 1 never writes through IPC; rank 0 does when only its own export failed. */
    int none = rank == 1 || (rank == 0 && ipc_off);
    if (st == RESHARD_OK)
        st = expect(none ? n.ipc_out == 0 && n.local_out > 0 : n.ipc_out == n.local_out,
                    "IPC between the ranks that can", (long long)n.ipc_out);
    side_close(&a);
    return st;
}

static reshard_status_t rank0_ipc_off(int rank, int size, reshard_comm_t *comm)
{
    return peer_stages(rank, size, comm, 1);
}

static reshard_status_t rank0_no_export(int rank, int size, reshard_comm_t *comm)
{
    return peer_stages(rank, size, comm, 0);
}

static void ipc_off_on_rank0(int rank)
{
    if (rank == 0) {
        setenv("RESHARD_CUDA_IPC", "0", 1);
        rs_param_reload(); /* read once per process: the parent read them before the fork */
    }
}

Test(device, cuda_ipc_off_on_one_rank_stages_both_ways_with_its_peer)
{
    rank_setup = ipc_off_on_rank0;
    all_ok(run_ranks(4, rank0_ipc_off), 4);
}

static void no_export_on_rank0(int rank)
{
    if (rank == 0)
        setenv("FAKE_CUDA_FAIL", "cuIpcGetMemHandle", 1);
}

Test(device, an_allocation_that_does_not_export_is_written_through_staging)
{
    rank_setup = no_export_on_rank0;
    all_ok(run_ranks(4, rank0_no_export), 4);
}

/* After a first refit every rank makes a second plan of the same tensors (the same hash), and
 * rank 2 goes on with it while the others keep the first: rank 2 holds no exports, the others
 * do, and all must still agree on gathering them again. */
static reshard_status_t remade_plan(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, ROWS, COLS);
    if (st != RESHARD_OK)
        return st;
    st = refit(&a, rank, 1);
    reshard_plan_t *second = NULL;
    reshard_tensor_t t = {"w", a.src, a.dst};
    if (st == RESHARD_OK)
        st = reshard_comm_plan_create(comm, &t, 1, NULL, &second);
    if (st == RESHARD_OK && rank == 2) {
        reshard_plan_t *first = a.plan;
        a.plan = second;
        second = first;
    }
    if (st == RESHARD_OK)
        st = refit(&a, rank, 2);
    reshard_plan_destroy(second);
    side_close(&a);
    return st;
}

Test(device, a_rank_that_remade_its_plan_still_agrees_on_the_exports)
{
    all_ok(run_ranks(4, remade_plan), 4);
}

/* GPUDirect on the stand-in (RESHARD_TEST_DEVICE_AS_HOST=1: its device memory is registered as
 * host memory): contiguous network chunks go from and into device buffers directly, strided
 * ones through the shadows, and forwarded chunks reach the shadow too when the fan-out reads
 * it (cross-memory writes, with RESHARD_CUDA_IPC=0). */
static reshard_status_t gdr_refits(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a, b;
    reshard_status_t st = side_open(&a, comm, rank, ROWS, COLS);
    if (st == RESHARD_OK)
        st = side_open(&b, comm, rank, HALVES, WHOLE);
    if (st != RESHARD_OK)
        return st;
    on_device(&a);
    on_device(&b);
    st = refit(&a, rank, 2);
    if (st == RESHARD_OK)
        st = refit(&b, rank, 2);
    reshard_comm_counters_t n;
    reshard_comm_counters(comm, &n);
    /* plan b: ranks 0 and 1 send their halves to the other domain, ranks 2 and 3 get them */
    int sends = rank < 2;
    if (st == RESHARD_OK)
        st = expect(sends ? n.gdr_out > 0 : n.gdr_in > 0,
                    "network chunks straight from / into device buffers",
                    (long long)(sends ? n.gdr_out : n.gdr_in));
    if (st == RESHARD_OK)
        st = expect(n.gdr_out <= n.net_out && n.gdr_in <= n.net_in,
                    "GPUDirect bytes within the network's", (long long)n.gdr_in);
    if (st == RESHARD_OK) /* what the NIC wrote is flushed before the GPU reads it */
        st = expect(sends || fake_count("fake_cuda_rdma_flushes") > 0, "flushed",
                    fake_count("fake_cuda_rdma_flushes"));
    side_close(&a);
    side_close(&b);
    return st;
}

/* Small chunks travel packed (RESHARD_COALESCE_BYTES), from the shadows: not here. */
Test(device, gpudirect_moves_contiguous_network_chunks_without_staging)
{
    setenv("RESHARD_TEST_DEVICE_AS_HOST", "1", 1);
    setenv("RESHARD_COALESCE_BYTES", "0", 1);
    all_ok(run_ranks(4, gdr_refits), 4);
}

Test(device, gpudirect_chunks_forwarded_from_host_memory_reach_the_shadow)
{
    setenv("RESHARD_TEST_DEVICE_AS_HOST", "1", 1);
    setenv("RESHARD_COALESCE_BYTES", "0", 1);
    setenv("RESHARD_CUDA_IPC", "0", 1);
    all_ok(run_ranks(4, gdr_refits), 4);
}

/* ---- driver failures: a clear error on every rank, never a hang ---- */

static const char *fail_src = ROWS, *fail_dst = COLS;

static reshard_status_t one_refit(int rank, int size, reshard_comm_t *comm)
{
    (void)size;
    struct side a;
    reshard_status_t st = device_side(&a, comm, rank, fail_src, fail_dst);
    if (st != RESHARD_OK)
        return st;
    st = refit(&a, rank, 1);
    side_close(&a);
    return st;
}

static int failing_rank = -1;
static const char *failing_call;

static void fail_on_one_rank(int rank)
{
    if (rank == failing_rank || failing_rank < 0)
        setenv("FAKE_CUDA_FAIL", failing_call, 1);
}

/* Runs one_refit with failing_call failing on failing_rank (-1: all); every rank must fail,
 * the failing one (or all) with `mine` in its message. */
static void check_failure(int rank, const char *call, const char *mine)
{
    failing_rank = rank;
    failing_call = call;
    rank_setup = fail_on_one_rank;
    struct outcome *o = run_ranks(4, one_refit);
    for (int r = 0; r < 4; r++) {
        cr_assert_neq(o[r].status, RESHARD_OK, "rank %d succeeded", r);
        if (r == rank || rank < 0)
            cr_assert(strstr(o[r].msg, mine), "rank %d: %s", r, o[r].msg);
        else
            cr_assert(strstr(o[r].msg, "rank"), "rank %d: %s", r, o[r].msg);
    }
}

Test(device, a_handle_that_does_not_open_fails_every_rank_with_the_reason)
{
    check_failure(-1, "cuIpcOpenMemHandle_v2",
                  "cuIpcOpenMemHandle of rank"); /* each writer names whose buffer */
}

Test(device, a_source_that_cannot_be_staged_fails_every_rank_before_bytes_move)
{
    check_failure(2, "cuMemcpyDtoH_v2", "staging a device source (cuMemcpyDtoH): fake error");
    /* the others repeat rank 2's reason */
    failing_rank = 2;
    struct outcome *o = run_ranks(4, one_refit);
    for (int r = 0; r < 4; r++)
        cr_assert(strstr(o[r].msg, r == 2 ? "cuda: staging a device source"
                                          : "rank 2 could not start the execution: cuda: "
                                            "staging a device source (cuMemcpyDtoH)"),
                  "rank %d: %s", r, o[r].msg);
}

Test(device, a_chunk_that_cannot_reach_the_device_fails_the_refit)
{
    check_failure(2, "cuMemcpyHtoD_v2", "copying a landed chunk to the device (cuMemcpyHtoD)");
}

Test(device, a_failed_pack_kernel_fails_the_refit)
{
    size_t fatbin;
    if (!cuda_fatbin(&fatbin))
        cr_skip_test("this build had no nvcc: no kernels");
    check_failure(1, "cuLaunchKernel", "cuda: cuLaunchKernel: fake error");
}

Test(device, a_failed_copy_engine_transfer_fails_the_refit)
{
    fail_src = WIDE_ROWS;
    fail_dst = WIDE_COLS;
    check_failure(0, "cuMemcpy2DAsync_v2", "(cuMemcpy2DAsync): fake error");
}

Test(device, a_failed_ipc_copy_fails_the_refit)
{
    check_failure(3, "cuEventQuery", "(cuEventQuery): fake error");
}
