/* The CUDA runtime entry points the shim replaces. PyTorch's caching allocator calls
 * cudaMalloc/cudaFree; kernels from <<<>>> launches arrive as cudaLaunchKernel. The
 * driver API (cuMem*, NCCL's buffers, cuLaunchKernel from Triton/cuBLAS) is left alone. */
#include <string.h>

#include "transit.h"

static int active(void)
{
    tr_runtime_once();
    return tr_cfg.policy != TR_OFF && !tr_s.passthrough;
}

/* The guard refused: fail as the runtime's own out-of-memory would. */
static cudaError_t refuse(void **devPtr, size_t size, uint64_t have, uint64_t room)
{
    char limit[200];
    atomic_fetch_add(&tr_count.guard_refusals, 1);
    tr_guard_describe(limit, sizeof limit);
    tr_log(TR_WARN, "refusing cudaMalloc(%zu): %llu bytes are managed already and the guard allows %llu, %s "
                    "(TRANSIT_ALLOW_OVERSUBSCRIBE=1 lifts it)",
           size, (unsigned long long)have, (unsigned long long)room, limit);
    *devPtr = NULL;
    return tr_runtime_oom();
}

/* Managed memory the shim cannot have (not supported here, or no memory for its table):
 * the job goes on with plain device memory. Said once, then counted. */
static cudaError_t plain(void **devPtr, size_t size, const char *why, int err)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    atomic_fetch_add(&tr_count.managed_fallbacks, 1);
    if (!atomic_flag_test_and_set(&said))
        tr_log(TR_WARN, "%s (%zu bytes, error %d): using cudaMalloc for it and for any other such allocation "
                        "(counted as managed_fallbacks in the stats)", why, size, err);
    return tr_real.malloc(devPtr, size);
}

/* Into the table and placed; -1 when the table has no memory to grow. */
static int track(void *p, size_t size)
{
    pthread_mutex_lock(&tr_lock);
    struct tr_alloc *a = tr_table_insert((uintptr_t)p, size);
    if (a)
        tr_place_new(a);
    pthread_mutex_unlock(&tr_lock);
    return a ? 0 : -1;
}

/* Out of the table; the bytes the allocation held, still counted (in flight: by the
 * guard, and its device-placed part *dev by the budget), or 0 if it is not the shim's. */
static size_t untrack(void *p, uint64_t *dev)
{
    size_t held = 0;
    pthread_mutex_lock(&tr_lock);
    struct tr_alloc *a = tr_table_find((uintptr_t)p);
    if (a && a->ptr == (uintptr_t)p) {
        held = a->size;
        *dev = tr_place_drop(a);
        tr_table_remove(a);
    }
    pthread_mutex_unlock(&tr_lock);
    return held;
}

static void release(size_t size, uint64_t dev)
{
    pthread_mutex_lock(&tr_lock);
    tr_table_release(size);
    tr_place_freed(dev);
    pthread_mutex_unlock(&tr_lock);
}

EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    int on = active();
    atomic_fetch_add(&tr_count.mallocs, 1);
    if (!tr_real.malloc)
        return cudaErrorInitializationError;
    if (!on || size == 0 || !devPtr) /* the runtime's own answers (a NULL devPtr: cudaErrorInvalidValue) */
        return tr_real.malloc(devPtr, size);

    /* optimizer state the adapter marked that the budget cannot hold: pinned host memory (hoststate.c) */
    void *host = tr_hoststate_wanted(size) ? tr_hoststate_alloc(size) : NULL;
    if (host) {
        *devPtr = host;
        return cudaSuccess;
    }
    /* reserved under the lock before the runtime is asked: the guard holds at every instant */
    pthread_mutex_lock(&tr_lock);
    uint64_t have = tr_tab.managed_bytes, room = tr_guard_room(); /* the adapter's buffers change the room */
    int refused = tr_table_reserve(size, tr_cfg.allow_oversubscribe ? UINT64_MAX : room);
    pthread_mutex_unlock(&tr_lock);
    if (refused)
        return refuse(devPtr, size, have, room);
    cudaError_t pending = tr_pending_error();
    cudaError_t err = tr_real.malloc_managed(devPtr, size, cudaMemAttachGlobal);
    if (err == cudaSuccess && track(*devPtr, size) == 0) {
        atomic_fetch_add(&tr_count.managed_allocs, 1);
        return cudaSuccess;
    }
    if (err == cudaSuccess) /* no memory for the table: the allocation cannot be placed */
        tr_real.free(*devPtr);
    release(size, 0);
    if (err == cudaErrorMemoryAllocation) { /* the runtime's own refusal, its last error set */
        atomic_fetch_add(&tr_count.failed_allocs, 1);
        return err;
    }
    tr_clear_error(pending);
    return plain(devPtr, size, err ? "cudaMallocManaged failed" : "no memory for the allocation table", (int)err);
}

EXPORT cudaError_t cudaFree(void *devPtr)
{
    int on = active();
    atomic_fetch_add(&tr_count.frees, 1);
    if (!tr_real.free)
        return cudaErrorInitializationError;
    uint64_t dev = 0;
    cudaError_t herr = cudaSuccess;
    if (on && devPtr && tr_hoststate_free((uintptr_t)devPtr, &herr))
        return herr;
    size_t held = on && devPtr ? untrack(devPtr, &dev) : 0;
    cudaError_t err = tr_real.free(devPtr);
    if (held) /* counted by the guard and the budget until the runtime has the memory back */
        release(held, dev);
    return err;
}

/* With a budget the program sees a GPU of that size; what is placed on the device, and
 * the adapter's device buffers, is what is used. */
EXPORT cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    int on = active();
    if (!tr_real.mem_get_info)
        return cudaErrorInitializationError;
    cudaError_t err = tr_real.mem_get_info(free_b, total_b);
    if (err != cudaSuccess || !on || !tr_cfg.budget)
        return err;
    pthread_mutex_lock(&tr_lock);
    uint64_t used = tr_device_held();
    pthread_mutex_unlock(&tr_lock);
    *total_b = tr_cfg.budget;
    *free_b = tr_cfg.budget > used ? tr_cfg.budget - used : 0;
    return cudaSuccess;
}

/* Whether launch n opens an iteration of the detected kernel-sequence period: read
 * without the lock, decided under it. */
static int period_boundary(uint64_t n)
{
    uint64_t p = tr_count.period, b = tr_s.boundary_launch;
    return p && !tr_s.adapter && n > b && (n - b) % p == 0;
}

/* Position of this launch within the iteration, and what the warm-up/replay needs;
 * 1 when a CUPTI correlation id was pushed (tr_cupti_pop after the launch). */
static int before_launch(const void *func, cudaStream_t stream)
{
    uint64_t n = atomic_fetch_add(&tr_count.launches, 1);
    if (!tr_s.adapter && !tr_count.period)
        tr_period_observe(func);
    if (period_boundary(n)) {
        pthread_mutex_lock(&tr_lock);
        if (period_boundary(n)) {
            tr_iteration_boundary(2);
            tr_s.boundary_launch = n; /* this launch opens the new iteration */
        }
        pthread_mutex_unlock(&tr_lock);
    }
    if (tr_s.defer_advice && !tr_count.iterations && n == (1u << 18)) {
        /* no iteration boundary in sight: stop waiting for a warm-up, hold the budget */
        pthread_mutex_lock(&tr_lock);
        tr_log(TR_WARN, "no iteration boundary after %llu launches: %s runs without recording",
               (unsigned long long)n, tr_policy_name(tr_cfg.policy));
        tr_place_settle();
        pthread_mutex_unlock(&tr_lock);
    }
    uint64_t b = tr_s.boundary_launch, pos = n > b ? n - b : 0; /* b > n: another thread's boundary */
    if (tr_s.cupti)
        return tr_cupti_push(((uint64_t)tr_count.iterations << 32) | (pos & 0xffffffffu));
    if (tr_s.replay_ready)
        tr_replay_before_launch(pos, stream);
    return 0;
}

/* The three ways a runtime kernel launch arrives: cudaLaunchKernel (CUDA <= 12 stubs and
 * explicit calls), __cudaLaunchKernel(_ptsz) (CUDA 13 nvcc stubs: PyTorch's kernels). */
#define LAUNCH_WRAPPER(name, field)                                                              \
    EXPORT cudaError_t name(const void *func, dim3 grid, dim3 block, void **args, size_t shmem,  \
                            cudaStream_t stream)                                                 \
    {                                                                                            \
        tr_runtime_once();                                                                       \
        if (!tr_real.field)                                                                      \
            return cudaErrorInitializationError;                                                 \
        if (tr_cfg.policy == TR_OFF || tr_s.passthrough)                                         \
            return tr_real.field(func, grid, block, args, shmem, stream);                        \
        int pushed = before_launch(func, stream);                                                \
        cudaError_t err = tr_real.field(func, grid, block, args, shmem, stream);                 \
        if (pushed)                                                                              \
            tr_cupti_pop();                                                                      \
        return err;                                                                              \
    }

LAUNCH_WRAPPER(cudaLaunchKernel, launch_kernel)
LAUNCH_WRAPPER(__cudaLaunchKernel, launch_kernel_internal)
LAUNCH_WRAPPER(__cudaLaunchKernel_ptsz, launch_kernel_internal_ptsz)

EXPORT cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args)
{
    tr_runtime_once();
    if (!tr_real.launch_kernel_ex)
        return cudaErrorInitializationError;
    if (tr_cfg.policy == TR_OFF || tr_s.passthrough)
        return tr_real.launch_kernel_ex(config, func, args);
    int pushed = before_launch(func, config ? config->stream : 0);
    cudaError_t err = tr_real.launch_kernel_ex(config, func, args);
    if (pushed)
        tr_cupti_pop();
    return err;
}
