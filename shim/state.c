/* Start-up, iteration boundaries and the warm-up schedule.
 *
 * Boundaries come from the framework adapter (transit_iteration, after each optimizer
 * step) or, without it, from the repeating kernel sequence (replay.c). Warm-up:
 * iteration 1 settles PyTorch's caching allocator; the next max(1, WARMUP_ITERS - 1)
 * iterations are recorded with CUPTI when the policy needs observations (prefetch
 * always; advise when no cold ranges were reported), then CUPTI is released. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "transit.h"

struct tr_state tr_s;
struct tr_stats tr_count;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pid_t init_pid;
static int record_until; /* last iteration recorded */

double tr_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void at_exit(void)
{
    if (getpid() != init_pid) /* a forked child (data loader worker): not ours to report */
        return;
    tr_prefill_exit(); /* the state's pool: its fill stopped, what nothing took unmapped */
    if (tr_s.initialized && tr_cfg.policy != TR_OFF && !tr_s.passthrough && tr_count.launches > 0 &&
        tr_count.managed_allocs == 0)
        tr_log(TR_WARN, "kernels ran but no cudaMalloc reached the shim: expandable segments or the "
                        "cudaMallocAsync backend bypass it (set PYTORCH_ALLOC_CONF=backend:native,"
                        "expandable_segments:False)");
    if (tr_cfg.stats_path[0] && tr_s.runtime_ready) /* processes that never used CUDA stay quiet */
        tr_write_stats(tr_cfg.stats_path);
}

/* fork: the child must not inherit a held lock (CUDA itself is unusable there). */
static void fork_prepare(void)
{
    tr_prefill_fork(0);
    pthread_mutex_lock(&tr_lock);
}
static void fork_parent(void)
{
    pthread_mutex_unlock(&tr_lock);
    tr_prefill_fork(1);
}
static void fork_child(void)
{
    pthread_mutex_init(&tr_lock, NULL);
    tr_prefill_fork(2);
}

/* Configuration, exit and fork handlers: safe before any CUDA library is loaded (the
 * adapter's first calls come from sitecustomize, long before torch loads libcudart). */
static void init(void)
{
    tr_config_load();
    init_pid = getpid();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    atexit(at_exit);
    tr_s.t_last_boundary = tr_now_ms();
    tr_s.defer_advice = tr_cfg.policy == TR_PREFETCH;
    tr_s.initialized = 1;
}

/* The runtime side, at the first interposed CUDA call: the application's libcudart is
 * loaded by then. */
static void init_runtime(void)
{
    tr_init_once();
    pthread_mutex_lock(&tr_lock); /* the API may read this state before the runtime is loaded */
    if (tr_real_resolve() != 0) {
        tr_s.passthrough = 1;
    } else if (tr_cfg.policy != TR_OFF) {
        int dev = 0, managed = 0, concurrent = 0;
        size_t free_b = 0, total_b = 0;
        tr_real.get_device(&dev);
        tr_real.device_get_attribute(&managed, cudaDevAttrManagedMemory, dev);
        tr_real.device_get_attribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
        if (!managed || !concurrent) {
            tr_log(TR_ERROR, "device %d has no %s: passing through", dev,
                   managed ? "concurrent managed access" : "managed memory support");
            tr_s.passthrough = 1;
        } else if (tr_real.mem_get_info(&free_b, &total_b) != cudaSuccess) {
            tr_log(TR_ERROR, "cudaMemGetInfo failed at start-up: passing through");
            tr_s.passthrough = 1;
        }
        tr_s.device = dev;
        tr_s.free_at_start = free_b;
        tr_s.total_mem = total_b;
        if (tr_cfg.budget && tr_cfg.budget > tr_guard_limit() && !tr_cfg.allow_oversubscribe)
            tr_log(TR_WARN, "TRANSIT_GPU_BUDGET is above the free device memory; the guard caps managed "
                            "memory at %llu bytes", (unsigned long long)tr_guard_limit());
    }
    tr_s.runtime_ready = 1;
    pthread_mutex_unlock(&tr_lock);
    tr_log(TR_INFO, "policy %s%s, budget %llu bytes, free at start %llu bytes, runtime %d",
           tr_policy_name(tr_cfg.policy), tr_s.passthrough ? " (passing through)" : "",
           (unsigned long long)(tr_s.passthrough ? 0 : tr_budget()), (unsigned long long)tr_s.free_at_start,
           tr_real.runtime_version);
}

static pthread_once_t once_runtime = PTHREAD_ONCE_INIT;
void tr_runtime_once(void) { pthread_once(&once_runtime, init_runtime); }

void tr_init_once(void) { pthread_once(&once, init); }

void tr_sample_residency(void)
{
    size_t f = 0, t = 0;
    if (!tr_real.mem_get_info || tr_real.mem_get_info(&f, &t) != cudaSuccess)
        return;
    uint64_t used = tr_s.free_at_start > f ? tr_s.free_at_start - f : 0;
    if (used > tr_count.resident_peak)
        tr_count.resident_peak = used;
    /* steady state: a full iteration after warm-up and after the first placement pass */
    int settled_after = record_until > 1 ? record_until : 1;
    if (!tr_s.cupti && tr_count.iterations > settled_after && used > tr_count.resident_peak_steady)
        tr_count.resident_peak_steady = used;
}

static int needs_observation(void)
{
    if (tr_cfg.policy == TR_PREFETCH)
        return 1;
    /* advise probes access only when no optimizer state was named: state all in pinned host
     * memory is named too, though none of it is in the table (its hints find no managed range) */
    return tr_cfg.policy == TR_ADVISE && tr_count.hint_bytes[TR_COLD_OPT] == 0 && !tr_s.cold_reported;
}

/* Called with tr_lock held. */
void tr_iteration_boundary(int source)
{
    double now = tr_now_ms();
    if (tr_count.iterations > 0 && tr_count.n_iter_ms < (int)(sizeof tr_count.iter_ms / sizeof tr_count.iter_ms[0]))
        tr_count.iter_ms[tr_count.n_iter_ms++] = now - tr_s.t_last_boundary;
    else if (tr_count.iterations == 0 && tr_s.t_attach)
        tr_count.first_iter_ms = now - tr_s.t_attach; /* the first step, from its optimizer's creation */
    tr_s.t_last_boundary = now;
    tr_count.iterations++;
    if (!tr_count.boundary_source || source == 1)
        tr_count.boundary_source = source;
    tr_s.boundary_launch = atomic_load(&tr_count.launches);
    int it = tr_count.iterations; /* iterations completed */

    if (tr_cfg.policy == TR_OFF || tr_s.passthrough || !tr_s.runtime_ready)
        return;
    tr_sample_residency();
    if (tr_s.cupti && it >= record_until) {
        tr_cupti_stop(1); /* builds replay ranges / cold hints from the records */
        tr_place_settle();
        tr_rebalance();
        tr_log(TR_INFO, "warm-up done after iteration %d: %llu replay positions", it,
               (unsigned long long)tr_replay_positions());
    } else if (tr_s.cupti) {
        tr_place_evict_observed(tr_cfg.policy == TR_ADVISE);
    } else if (it == 1 && needs_observation() && !tr_s.replay_ready) {
        record_until = 1 + (tr_cfg.warmup_iters > 1 ? tr_cfg.warmup_iters - 1 : 1);
        if (tr_cupti_start() == 0) {
            if (tr_cfg.policy == TR_ADVISE)
                tr_place_unadvise();
            tr_place_evict_observed(tr_cfg.policy == TR_ADVISE);
        } else {
            record_until = 0;
            tr_place_settle();
        }
    } else {
        if (tr_s.defer_advice)
            tr_place_settle();
        tr_rebalance();
    }
}

/* The adapter's first boundary after kernel-sequence guesses: its boundaries win, the
 * warm-up starts over (a recording in progress is dropped). Called with tr_lock held. */
void tr_adapter_takeover(void)
{
    if (tr_s.cupti)
        tr_cupti_stop(0);
    tr_log(TR_INFO, "the framework adapter reports iterations: dropping %d guessed boundaries", tr_count.iterations);
    tr_count.iterations = 0;
    tr_count.n_iter_ms = 0;
    tr_count.period = 0;
    tr_count.resident_peak_steady = 0;
    record_until = 0;
    if (tr_s.defer_advice)
        tr_place_settle();
}
