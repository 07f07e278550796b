/* The activity recorder: CUPTI, dlopen'ed and optional, only during warm-up.
 *
 * Unified-memory counter records (host-to-device bytes with addresses and times) are
 * tied to kernels by time, kernels to launch positions by external correlation IDs that
 * interpose.c pushes around every cudaLaunchKernel (kernels launched through the driver
 * API, e.g. cuBLAS, inherit the position of the runtime launch before them). Only one
 * CUPTI subscriber may exist per process, so recording ends with cuptiFinalize and
 * torch.profiler can be used afterwards. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transit.h"

#ifdef TRANSIT_NO_CUPTI
int tr_cupti_start(void)
{
    tr_log(TR_WARN, "built without CUPTI headers: no warm-up recording (%s needs it)", tr_policy_name(tr_cfg.policy));
    return -1;
}
void tr_cupti_stop(int build) { (void)build; }
int tr_cupti_push(uint64_t id) { (void)id; return 0; }
void tr_cupti_pop(void) {}
#else
#include <cupti.h>

static struct {
    CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
    CUptiResult (*enable)(CUpti_ActivityKind);
    CUptiResult (*disable)(CUpti_ActivityKind);
    CUptiResult (*configure_um)(CUpti_ActivityUnifiedMemoryCounterConfig *, uint32_t);
    CUptiResult (*flush_all)(uint32_t);
    CUptiResult (*next_record)(uint8_t *, size_t, CUpti_Activity **);
    CUptiResult (*push)(CUpti_ExternalCorrelationKind, uint64_t);
    CUptiResult (*pop)(CUpti_ExternalCorrelationKind, uint64_t *);
    CUptiResult (*finalize)(void);
    CUptiResult (*result_string)(CUptiResult, const char **);
} cu;

struct krec { uint64_t start, end; uint32_t corr; };
struct xrec { uint32_t corr; uint64_t id; };
struct urec { uint64_t start, addr, bytes; };

static pthread_mutex_t rec_lock = PTHREAD_MUTEX_INITIALIZER;
static struct krec *ks; static size_t nk, ck;
static struct xrec *xs; static size_t nx, cx;
static struct urec *us; static size_t nu, cu_cap;

/* Room for one more element in a growing array; 0 when there is. */
static int grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t c = *cap ? *cap * 2 : 4096;
    void *p = realloc(*arr, c * elem);
    if (!p)
        return -1;
    *arr = p;
    *cap = c;
    return 0;
}

#define PUSH(arr, n, cap, val) \
    do { \
        if (grow((void **)&(arr), &(cap), (n), sizeof *(arr)) == 0) \
            (arr)[(n)++] = (val); \
    } while (0)

static const CUpti_ActivityKind kinds[] = {
    CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER, CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
    CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION, CUPTI_ACTIVITY_KIND_RUNTIME,
};

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = 8 << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid)
{
    (void)ctx; (void)stream; (void)size;
    CUpti_Activity *rec = NULL;
    pthread_mutex_lock(&rec_lock);
    while (buf && cu.next_record(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)rec;
            PUSH(ks, nk, ck, ((struct krec){k->start, k->end, k->correlationId}));
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION) {
            CUpti_ActivityExternalCorrelation *x = (CUpti_ActivityExternalCorrelation *)rec;
            if (x->externalKind == CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0)
                PUSH(xs, nx, cx, ((struct xrec){x->correlationId, x->externalId}));
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER) {
            CUpti_ActivityUnifiedMemoryCounter3 *u = (CUpti_ActivityUnifiedMemoryCounter3 *)rec;
            if (u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD) {
                tr_count.um_htod_bytes += u->value;
                PUSH(us, nu, cu_cap, ((struct urec){u->start, u->address, u->value}));
            } else if (u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH) {
                tr_count.um_dtoh_bytes += u->value;
            } else if (u->counterKind == CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT) {
                tr_count.um_faults += u->value;
            }
        }
    }
    pthread_mutex_unlock(&rec_lock);
    free(buf);
}

static void *open_cupti(void)
{
    const char *names[] = {"libcupti.so", "libcupti.so.13", "libcupti.so.12"};
    for (size_t i = 0; i < 3; i++) {
        void *h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    const char *cudart = tr_cudart_path(); /* wheels keep libcupti beside libcudart */
    const char *slash = cudart ? strrchr(cudart, '/') : NULL;
    char path[4200];
    for (size_t i = 0; slash && i < 3; i++) {
        snprintf(path, sizeof path, "%.*s/%s", (int)(slash - cudart), cudart, names[i]);
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (h)
            return h;
    }
    return NULL;
}

/* A CUPTI error for the user: its number and name, and a cause only where the code names
 * one (999, CUPTI_ERROR_UNKNOWN, does not: it is what a driver without a GPU says). */
static void refused(const char *what, CUptiResult r)
{
    const char *name = NULL, *cause = "";
    if (!cu.result_string || cu.result_string(r, &name) != CUPTI_SUCCESS || !name)
        name = "no name";
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        cause = "; another profiler or debugger holds CUPTI (Nsight Systems/Compute, cuda-gdb, torch.profiler)";
    else if (r == CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)
        cause = "; the driver restricts profiling to administrators";
    tr_log(TR_WARN, "CUPTI refused %s (error %d, %s%s): %s runs without warm-up recording", what, (int)r, name, cause,
           tr_policy_name(tr_cfg.policy));
}

int tr_cupti_start(void)
{
    static void *h;
    if (!h && !(h = open_cupti())) {
        tr_log(TR_WARN, "libcupti not found: %s runs without warm-up recording", tr_policy_name(tr_cfg.policy));
        return -1;
    }
#define L(f, n) cu.f = (__typeof__(cu.f))dlsym(h, n)
    L(register_callbacks, "cuptiActivityRegisterCallbacks");
    L(enable, "cuptiActivityEnable");
    L(disable, "cuptiActivityDisable");
    L(configure_um, "cuptiActivityConfigureUnifiedMemoryCounter");
    L(flush_all, "cuptiActivityFlushAll");
    L(next_record, "cuptiActivityGetNextRecord");
    L(push, "cuptiActivityPushExternalCorrelationId");
    L(pop, "cuptiActivityPopExternalCorrelationId");
    L(finalize, "cuptiFinalize");
    L(result_string, "cuptiGetResultString");
#undef L
    if (!cu.register_callbacks || !cu.enable || !cu.disable || !cu.configure_um || !cu.flush_all ||
        !cu.next_record || !cu.push || !cu.pop || !cu.finalize) {
        tr_log(TR_WARN, "libcupti lacks the activity API: no warm-up recording");
        return -1;
    }
    CUpti_ActivityUnifiedMemoryCounterConfig cfg[3] = {
        {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE,
         CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD, (uint32_t)tr_s.device, 1},
        {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE,
         CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_DTOH, (uint32_t)tr_s.device, 1},
        {CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_SCOPE_PROCESS_SINGLE_DEVICE,
         CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_GPU_PAGE_FAULT, (uint32_t)tr_s.device, 1},
    };
    CUptiResult r;
    if ((r = cu.register_callbacks(buf_requested, buf_completed)) != CUPTI_SUCCESS ||
        (r = cu.configure_um(cfg, 3)) != CUPTI_SUCCESS) {
        refused("to record", r);
        return -1;
    }
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        if ((r = cu.enable(kinds[i])) != CUPTI_SUCCESS) {
            refused("an activity kind", r);
            for (size_t j = 0; j < i; j++)
                cu.disable(kinds[j]);
            return -1;
        }
    }
    tr_s.cupti = 1;
    tr_log(TR_INFO, "CUPTI recording started at iteration %d", tr_count.iterations);
    return 0;
}

/* Launches hold it shared from their push to their pop; the end of recording takes it
 * alone, so that no thread pushes or pops once CUPTI is finalized (a call then would
 * start CUPTI again and keep the subscriber slot from other profilers). */
static pthread_rwlock_t launch_rw = PTHREAD_RWLOCK_INITIALIZER;

int tr_cupti_push(uint64_t id)
{
    pthread_rwlock_rdlock(&launch_rw);
    if (tr_s.cupti && cu.push(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, id) == CUPTI_SUCCESS)
        return 1;
    pthread_rwlock_unlock(&launch_rw);
    return 0;
}

void tr_cupti_pop(void)
{
    uint64_t id;
    cu.pop(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, &id);
    pthread_rwlock_unlock(&launch_rw);
}

static int krec_by_start(const void *a, const void *b)
{
    const struct krec *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

static int xrec_by_corr(const void *a, const void *b)
{
    const struct xrec *x = a, *y = b;
    return x->corr < y->corr ? -1 : x->corr > y->corr;
}

/* launch position of the runtime call with correlation id `corr`: its own external id,
 * else that of the last runtime launch before it (driver-API kernels in between). */
static int position_of(uint32_t corr, uint64_t *pos)
{
    size_t lo = 0, hi = nx;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (xs[mid].corr <= corr)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    *pos = xs[lo - 1].id & 0xffffffffu;
    return 0;
}

void tr_cupti_stop(int build)
{
    if (!tr_s.cupti)
        return;
    if (tr_real.device_synchronize)
        tr_real.device_synchronize();
    cu.flush_all(1);
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        cu.disable(kinds[i]);
    cu.flush_all(1);
    pthread_rwlock_wrlock(&launch_rw); /* launches between push and pop finish first */
    tr_s.cupti = 0;
    pthread_rwlock_unlock(&launch_rw);
    pthread_mutex_lock(&rec_lock);
    if (nk) /* qsort of NULL is undefined, even for no elements */
        qsort(ks, nk, sizeof *ks, krec_by_start);
    if (nx)
        qsort(xs, nx, sizeof *xs, xrec_by_corr);
    size_t tied = 0;
    /* first-touch position per 2 MiB block, for advise's access classification */
    for (size_t i = 0; i < nu; i++) {
        size_t lo = 0, hi = nk; /* last kernel starting at or before the migration */
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            if (ks[mid].start <= us[i].start)
                lo = mid + 1;
            else
                hi = mid;
        }
        uint64_t pos;
        if (!build || lo == 0 || position_of(ks[lo - 1].corr, &pos) != 0)
            continue;
        tied++;
        if (tr_cfg.policy == TR_PREFETCH)
            tr_replay_add(pos, (uintptr_t)us[i].addr, us[i].bytes);
        else
            tr_observe_touch((uintptr_t)us[i].addr, us[i].bytes, pos);
    }
    tr_log(TR_INFO, "CUPTI: %zu kernels, %zu host-to-device migrations (%zu tied to launches), %llu bytes",
           nk, nu, tied, (unsigned long long)tr_count.um_htod_bytes);
    free(ks); free(xs); free(us);
    ks = NULL; xs = NULL; us = NULL;
    nk = ck = nx = cx = nu = cu_cap = 0;
    pthread_mutex_unlock(&rec_lock);
    if (!build)
        tr_observe_discard();
    else if (tr_cfg.policy == TR_PREFETCH)
        tr_replay_finish();
    else
        tr_observe_classify();
    CUptiResult r = cu.finalize(); /* release the single subscriber slot for other profilers */
    if (r != CUPTI_SUCCESS)
        tr_log(TR_DEBUG, "cuptiFinalize: error %d", (int)r);
}
#endif
