/* libtransit.so internals: one header for the shim's modules.
 *
 * Only the interposed CUDA runtime entry points (interpose.c) and the transit_* C API
 * (api.c, transit_api.h) are exported; everything else is hidden (exports.map). */
#ifndef TRANSIT_H
#define TRANSIT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "transit_rules.h" /* TR_HUGE_PAGE */

#define HIDDEN __attribute__((visibility("hidden")))
#define EXPORT __attribute__((visibility("default")))

/* ---- configuration (config.c) ------------------------------------------- */
enum tr_policy { TR_OFF = 0, TR_BASE, TR_PREFETCH, TR_ADVISE };

struct tr_config {
    enum tr_policy policy;
    uint64_t budget;          /* managed bytes allowed on the GPU; 0 = free memory at start */
    int allow_oversubscribe;  /* TRANSIT_ALLOW_OVERSUBSCRIBE=1 */
    uint64_t reserve;         /* device memory kept out of the guard (context, NCCL, ...) */
    int warmup_iters;         /* TRANSIT_WARMUP_ITERS */
    uint64_t merge_gap;       /* TRANSIT_MERGE_GAP */
    char stats_path[4096];    /* TRANSIT_STATS ("" = none) */
    int log_level;            /* 0 error, 1 warn, 2 info, 3 debug */
    int host_state;           /* TRANSIT_HOST_STATE (default 1): state over the budget in pinned memory */
    uint32_t cold_tail_ppm;   /* TRANSIT_COLD_TAIL in millionths (observe.c) */
    uint64_t ring_bytes;      /* the adapter's staging ring (TRANSIT_OVERLAP_INFLIGHT) */
    const char *plan;         /* TRANSIT_PLAN: the plan's prediction, a JSON object (tr_json_object), or NULL */
};
HIDDEN extern struct tr_config tr_cfg;
HIDDEN void tr_config_load(void);
HIDDEN const char *tr_policy_name(enum tr_policy p);

/* ---- logging (log.c): stderr only, never stdout ----------------------------- */
enum { TR_ERROR = 0, TR_WARN = 1, TR_INFO = 2, TR_DEBUG = 3 };
HIDDEN void tr_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- the real runtime (real.c) ------------------------------------------- */
struct tr_loc { int type; int id; }; /* ABI of struct cudaMemLocation (CUDA >= 12.2) */
enum { TR_LOC_DEVICE = 1, TR_LOC_HOST = 2 };

struct tr_real {
    cudaError_t (*malloc)(void **, size_t);
    cudaError_t (*free)(void *);
    cudaError_t (*malloc_managed)(void **, size_t, unsigned int);
    cudaError_t (*mem_get_info)(size_t *, size_t *);
    cudaError_t (*launch_kernel)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
    cudaError_t (*launch_kernel_ex)(const void *, const void *, void **);
    /* CUDA 13 nvcc stubs launch through __cudaLaunchKernel(cudaKernel_t, ...) */
    cudaError_t (*launch_kernel_internal)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
    cudaError_t (*launch_kernel_internal_ptsz)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
    cudaError_t (*get_device)(int *);
    cudaError_t (*device_get_attribute)(int *, enum cudaDeviceAttr, int);
    cudaError_t (*runtime_get_version)(int *);
    cudaError_t (*device_synchronize)(void);
    cudaError_t (*get_last_error)(void);
    cudaError_t (*peek_last_error)(void);
    /* optimizer state born on the host (hoststate.c): optional */
    cudaError_t (*host_register)(void *, size_t, unsigned int);
    cudaError_t (*host_unregister)(void *);
    cudaError_t (*set_device)(int); /* optional: prefill.c's thread registers in the job's device */
    /* resolved by version: CUDA 13 names, 12.2+ *_v2 names, or the legacy int-device form */
    void *advise_fn;
    void *prefetch_fn;
    int loc_api; /* 1: cudaMemLocation arguments, 0: legacy int device */
    int runtime_version;
};
HIDDEN extern struct tr_real tr_real;
HIDDEN int tr_real_resolve(void); /* 0 ok; -1: pass through (logged) */
HIDDEN const char *tr_cudart_path(void); /* the loaded libcudart, or NULL */
HIDDEN cudaError_t tr_pending_error(void); /* the application's error, if one is pending */
HIDDEN cudaError_t tr_own_error(cudaError_t pending, cudaError_t err); /* clears and counts a failure of ours */
HIDDEN void tr_clear_error(cudaError_t pending); /* clears the last error unless one was pending */
HIDDEN cudaError_t tr_runtime_oom(void);        /* the runtime's own out-of-memory, last error included */
HIDDEN cudaError_t tr_advise(const void *p, size_t n, enum cudaMemoryAdvise a, int loc_type, int dev);
HIDDEN cudaError_t tr_prefetch(const void *p, size_t n, int loc_type, int dev, cudaStream_t s);

/* ---- allocation table and placement (table.c, place.c) --------------------- */
/* A region is cut where only part of it fits (or must leave), at this grain, the UVM
 * driver's 2 MiB block: what moves is the bytes needed, not a whole tensor (a 2.1 GB output
 * projection zero-copy for want of 1 GB of room, bench/RESULTS.md). */
#define TR_PLACE_GRAIN (2ull << 20)
/* In advise's order of giving the GPU (and a hint only ever raises a range's kind). */
enum tr_kind { TR_HOT = 0, TR_COLD_MASTER = 1, TR_COLD_SPARSE = 2, TR_COLD_OPT = 3, TR_KINDS };
enum tr_place { TR_DEV = 0, TR_HOST = 1 };

struct tr_region {          /* page-aligned piece of one allocation */
    uintptr_t start, end;
    uint8_t kind, place, zero_copy, advised;
    uint8_t evicted;        /* host region pushed off the GPU since it was placed there */
    uint8_t want;           /* rebalance: the placement it is given (enum tr_place) */
    uint8_t for_buffer;     /* demoted for a device buffer in the call under way (devbuf.c) */
    uint32_t touches;       /* distinct launch positions seen migrating it (warm-up) */
};

struct tr_alloc {
    uintptr_t ptr;
    size_t size;
    uint64_t seq;           /* allocation order */
    int nreg, capreg;
    struct tr_region *reg;
};

struct tr_table {
    struct tr_alloc *a;     /* sorted by ptr */
    int n, cap;
    uint64_t next_seq;
    uint64_t managed_bytes; /* the table's allocations and those in flight: what the guard limits */
    uint64_t inflight;      /* reserved before the runtime allocates, held until it has freed */
    uint64_t dev_inflight;  /* of dev_bytes: freed allocations' device bytes the runtime still holds */
    uint64_t dev_bytes;     /* of the table's, placed on the device */
};

HIDDEN extern pthread_mutex_t tr_lock;
HIDDEN extern struct tr_table tr_tab;
HIDDEN int tr_table_reserve(size_t size, uint64_t limit); /* 0: counted in managed_bytes, in flight */
HIDDEN void tr_table_release(size_t size);                /* in-flight bytes the runtime does not hold */
HIDDEN struct tr_alloc *tr_table_insert(uintptr_t ptr, size_t size); /* reserved bytes enter the table */
HIDDEN struct tr_alloc *tr_table_find(uintptr_t addr); /* containing allocation or NULL */
HIDDEN void tr_table_remove(struct tr_alloc *a); /* its bytes stay in flight until released */
HIDDEN int tr_region_split(struct tr_alloc *a, uintptr_t start, uintptr_t end); /* 0 ok */
/* Every region of the table in address order, for loops that do not change the table:
 *   for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));) */
struct tr_cursor { int i, j; };
HIDDEN struct tr_region *tr_region_next(struct tr_cursor *c);
/* Cut the cursor's current region (the one tr_region_next returned last) at `at`: the first
 * piece is returned (NULL: at is not inside it, or no memory), the second is the cursor's next. */
HIDDEN struct tr_region *tr_region_cut(struct tr_cursor *c, uintptr_t at);
HIDDEN int tr_region_cut_at(struct tr_alloc *a, int j, uintptr_t at); /* region j of a at `at`; 0 ok */
HIDDEN void tr_table_coalesce(void);

HIDDEN void tr_place_new(struct tr_alloc *a);
HIDDEN uint64_t tr_place_drop(struct tr_alloc *a); /* its device bytes (the window's too), still counted: tr_place_freed */
HIDDEN void tr_place_freed(uint64_t dev);          /* ... until the runtime has freed them */
HIDDEN int tr_hint(uintptr_t ptr, size_t size, enum tr_kind kind);
HIDDEN void tr_rebalance(void);
HIDDEN void tr_place_settle(void);
HIDDEN void tr_place_unadvise(void);
HIDDEN void tr_place_evict_observed(int all);
HIDDEN void tr_place_demote(struct tr_region *r); /* to the host, evicted now */
HIDDEN struct tr_region *tr_place_leave_part(struct tr_cursor *c, struct tr_region *r, uint64_t bytes);
HIDDEN uint64_t tr_place_keep(uint64_t size, uint64_t leave); /* the head that stays when `leave` bytes go */
HIDDEN void tr_place_peaks(void);
HIDDEN void tr_move_to_device(struct tr_region *r);
HIDDEN uint64_t tr_region_bytes(const struct tr_region *r);

/* ---- the ledger (ledger.c): the budget's and the guard's room ------------------- */
HIDDEN uint64_t tr_budget_total(void); /* TRANSIT_GPU_BUDGET, or the guard's limit */
HIDDEN uint64_t tr_budget(void);       /* room for managed data on the device: the budget less the buffers */
HIDDEN uint64_t tr_guard_limit(void);  /* free memory at start-up less TRANSIT_RESERVE */
HIDDEN uint64_t tr_guard_room(void);   /* the guard's limit less the device buffers */
HIDDEN uint64_t tr_device_held(void);  /* managed bytes placed on the device and the device buffers */
HIDDEN void tr_guard_describe(char *buf, size_t len); /* how the limit was reached, for messages */
HIDDEN uint64_t tr_devbuf_bytes(void);              /* the adapter's device buffers' bytes, held here */
HIDDEN void tr_ledger_buffers_add(uint64_t bytes);  /* devbuf.c: a buffer made */
HIDDEN void tr_ledger_buffers_sub(uint64_t bytes);  /* devbuf.c: a buffer given back (or not made) */

/* ---- the adapter's plain device buffers (devbuf.c), under tr_lock -------------- */
HIDDEN uintptr_t tr_devbuf_alloc(size_t size); /* 0: no room, or the runtime refused */
HIDDEN int tr_devbuf_free(uintptr_t ptr);      /* -1: not one of them */

/* ---- optimizer state in pinned host memory (hoststate.c) ------------------------- */
HIDDEN void tr_hoststate_mark(int on);          /* the calling thread's next allocations are state (lock-free) */
HIDDEN int tr_hoststate_wanted(size_t size);    /* this thread's allocation goes to pinned memory */
HIDDEN uint64_t tr_hoststate_kept_now(void);    /* the state the budget would keep on the device now */
HIDDEN void *tr_hoststate_alloc(size_t size);   /* not under tr_lock; NULL: refused (the managed path then) */
HIDDEN int tr_hoststate_free(uintptr_t ptr, cudaError_t *err); /* not under tr_lock; 1: it was one */
HIDDEN int tr_hoststate_holds(uintptr_t ptr, size_t size);     /* under tr_lock */
HIDDEN uint64_t tr_hoststate_bytes(void);                      /* under tr_lock */
/* The bytes a host mapping of size takes: whole huge pages from one huge page up, else pages. */
static inline size_t tr_host_round(size_t size)
{
    size_t align = size >= TR_HUGE_PAGE ? TR_HUGE_PAGE : 4096;
    return (size + align - 1) & ~(align - 1);
}
HIDDEN void *tr_host_map(size_t size, size_t *mapped); /* huge-page aligned and advised; NULL: refused */
HIDDEN void tr_host_fill(char *p, size_t len, int threads); /* every page written */

/* ---- the state's segments made ready before the first step (prefill.c) ------------- */
HIDDEN void tr_prefill_segments(const size_t *sizes, size_t n); /* transit_state_segments; not under tr_lock */
enum { TR_PREFILL_READY = 1, TR_PREFILL_WRITTEN = 2 }; /* what tr_prefill_take's *ready says the fill did */
HIDDEN void *tr_prefill_take(size_t size, size_t *len, int *ready); /* a region of the pool, or NULL */
HIDDEN void tr_prefill_end(void);  /* stop, join, give back what was not taken (the first step's end) */
HIDDEN void tr_prefill_exit(void); /* the same at exit, without the runtime */
HIDDEN void tr_prefill_fork(int when); /* fork handlers: 0 before, 1 parent after, 2 child */

/* ---- run-time state and stats (state.c, stats.c) ----------------------------- */
struct tr_stats {
    _Atomic uint64_t mallocs, frees, managed_allocs, failed_allocs, guard_refusals;
    _Atomic uint64_t managed_fallbacks; /* allocations given plain memory (managed refused) */
    _Atomic uint64_t launches;
    _Atomic int iterations;          /* read by launches without the lock */
    _Atomic uint64_t period;         /* detected launches per iteration; likewise */
    _Atomic uint64_t um_htod_bytes, um_dtoh_bytes, um_faults; /* CUPTI's thread, during recording */
    uint64_t managed_peak, dev_placed_peak, host_placed_bytes, host_placed_peak;
    uint64_t zero_copy_bytes, zero_copy_peak;
    uint64_t prefetch_calls, prefetch_bytes, evict_calls, evict_bytes;
    uint64_t advise_calls;
    uint64_t room_demotions; /* optimizer regions demoted for a new allocation (place.c) */
    _Atomic uint64_t hint_errors; /* the shim's own calls that failed (cleared): from any thread, unlocked */
    uint64_t resident_peak, resident_peak_steady;      /* measured with cudaMemGetInfo */
    uint64_t hint_bytes[TR_KINDS];
    uint64_t host_state_allocs, host_state_peak, host_state_kept; /* hoststate.c; kept: marked, held by the budget */
    uint64_t host_state_first_room;    /* hoststate.c: the room for state the first marked allocation found */
    uint64_t host_state_prefill_hold_regions, host_state_prefill_hold_room; /* prefill.c: the regions the fill
        * made before any was taken, and the least room the hold made one under (more than first_room: the
        * state found more room than the hold had, and regions it made were kept instead) */
    double host_state_pin_ms; /* hoststate.c: the wall time of making it (map, fill, register), summed */
    uint64_t host_state_prefill, host_state_prefill_used; /* prefill.c's pool; the slices given from it */
    uint64_t host_state_prefill_ahead; /* the pool's bytes made ready when its first region was taken */
    double host_state_prefill_lead_ms; /* from the list to the first region taken */
    double host_state_prefill_wait_ms; /* allocations waiting for a region being made, summed */
    uint64_t host_state_prefill_ready;  /* bytes of regions taken already registered */
    uint64_t host_state_prefill_unused; /* bytes made ready that no allocation took (given back) */
    double host_state_prefill_register_ms; /* the fill's own cudaHostRegister time, summed */
    double host_state_prefill_release_ms;  /* giving back what was not taken */
    double host_state_register_ms;     /* hoststate.c: cudaHostRegister's wall time, summed */
    int boundary_source;    /* 0 none, 1 adapter, 2 kernel-sequence period */
    double iter_ms[4096];
    int n_iter_ms;
    double first_iter_ms; /* the adapter's attach (the first optimizer made) to the first boundary; 0: unknown */
};
HIDDEN extern struct tr_stats tr_count; /* the stats' counters (tr_s below is the run-time state) */

/* Written under tr_lock (or once, at start-up); the _Atomic fields are also read without
 * it: by kernel launches, and by API calls that may come before the runtime is loaded. */
struct tr_state {
    int initialized;
    _Atomic int runtime_ready;
    _Atomic int passthrough;  /* something needed is missing: behave like TRANSIT_POLICY=off */
    int device;
    uint64_t free_at_start, total_mem;
    _Atomic int adapter;      /* the framework adapter attached or reported a boundary */
    _Atomic int cupti;        /* recorder active */
    _Atomic int replay_ready; /* prefetch table built */
    _Atomic int defer_advice; /* warm-up: host regions stay unadvised (observable) */
    _Atomic uint64_t boundary_launch; /* launch count at the last iteration boundary */
    double t_last_boundary;
    double t_attach;          /* when the adapter attached (transit_adapter_attach); 0: not yet */
    int cold_reported;        /* the adapter named optimizer state (managed or pinned): under tr_lock */
    char *adapter_stats;      /* the adapter's counters, a JSON object (transit_adapter_stats): under tr_lock */
};
#define TR_REPORT_OBJECT_MAX (64 << 10)
/* 1 when s is text the stats report may carry as a JSON object's value: braces first and
 * last, printable ASCII only (nothing ends the report's line early), at most max bytes.
 * The adapter's counters and TRANSIT_PLAN (config.c). */
HIDDEN int tr_json_object(const char *s, size_t max);
HIDDEN extern struct tr_state tr_s;
HIDDEN void tr_init_once(void);    /* configuration */
HIDDEN void tr_runtime_once(void); /* + the CUDA runtime: from interposed calls only */
HIDDEN void tr_sample_residency(void);
HIDDEN void tr_iteration_boundary(int source);
HIDDEN void tr_adapter_takeover(void);
HIDDEN double tr_now_ms(void);
HIDDEN int tr_write_stats(const char *path);

/* ---- recorder and replay (cupti.c, replay.c) --------------------------------- */
HIDDEN int tr_cupti_start(void);     /* 0 ok */
HIDDEN void tr_cupti_stop(int build); /* flush, build the replay table (build=1), release CUPTI */
HIDDEN int tr_cupti_push(uint64_t id); /* 1: pushed; then tr_cupti_pop after the launch */
HIDDEN void tr_cupti_pop(void);
HIDDEN void tr_replay_add(uint64_t pos, uintptr_t addr, uint64_t bytes);
HIDDEN void tr_replay_finish(void);  /* merge ranges per position */
HIDDEN void tr_replay_before_launch(uint64_t pos, cudaStream_t stream);
HIDDEN uint64_t tr_replay_forget(uintptr_t start, uintptr_t end); /* out of the window: the bytes that left */
HIDDEN void tr_replay_yield(uint64_t need); /* room for need device bytes: the window gives way */
HIDDEN uint64_t tr_replay_positions(void);
HIDDEN void tr_period_observe(const void *func);
HIDDEN void tr_observe_touch(uintptr_t addr, uint64_t bytes, uint64_t pos);
HIDDEN void tr_observe_classify(void);
HIDDEN void tr_observe_discard(void);

#endif
