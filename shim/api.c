/* The exported C API (transit_api.h). */
#define _GNU_SOURCE /* strdup */
#include <stdlib.h>
#include <string.h>

#include "transit.h"
#include "transit_api.h"

EXPORT int transit_api_version(void) { return TRANSIT_API_VERSION; }

EXPORT int transit_active(void)
{
    tr_init_once();
    return tr_cfg.policy != TR_OFF && !tr_s.passthrough;
}

EXPORT const char *transit_policy(void)
{
    tr_init_once();
    return tr_s.passthrough ? "off" : tr_policy_name(tr_cfg.policy);
}

/* Called with tr_lock held. */
static void attach_locked(void)
{
    if (!tr_s.adapter && tr_count.boundary_source == 2)
        tr_adapter_takeover(); /* boundaries guessed from kernels before: start over */
    tr_s.adapter = 1;
}

EXPORT void transit_adapter_attach(void)
{
    tr_init_once();
    pthread_mutex_lock(&tr_lock);
    attach_locked();
    if (!tr_s.t_attach && !tr_count.iterations) /* the first step's clock: warm-up in run's summary */
        tr_s.t_attach = tr_now_ms();
    pthread_mutex_unlock(&tr_lock);
}

EXPORT int transit_iteration(void)
{
    tr_init_once();
    pthread_mutex_lock(&tr_lock);
    attach_locked();
    tr_iteration_boundary(1);
    int n = tr_count.iterations;
    pthread_mutex_unlock(&tr_lock);
    return n;
}

EXPORT int transit_hint(uintptr_t ptr, size_t size, int kind)
{
    static const enum tr_kind of[] = {[TRANSIT_HINT_HOT] = TR_HOT, [TRANSIT_HINT_MASTER] = TR_COLD_MASTER,
                                      [TRANSIT_HINT_OPTIMIZER] = TR_COLD_OPT, [TRANSIT_HINT_SPARSE] = TR_COLD_SPARSE};
    if (!transit_active() || kind < TRANSIT_HINT_HOT || kind > TRANSIT_HINT_SPARSE)
        return -1;
    pthread_mutex_lock(&tr_lock);
    int r = tr_hint(ptr, size, of[kind]);
    if (r != 0 && kind == TRANSIT_HINT_OPTIMIZER && tr_hoststate_holds(ptr, size))
        r = 0; /* state the shim made in pinned host memory: already where cold state goes */
    if (r == 0 && kind == TRANSIT_HINT_OPTIMIZER)
        tr_s.cold_reported = 1; /* advise needs no access probe to find it (state.c) */
    pthread_mutex_unlock(&tr_lock);
    return r;
}

EXPORT void transit_apply(void)
{
    if (!transit_active())
        return;
    pthread_mutex_lock(&tr_lock);
    tr_rebalance();
    pthread_mutex_unlock(&tr_lock);
}

EXPORT int transit_write_stats(const char *path)
{
    tr_init_once();
    if (!path || !*path)
        path = tr_cfg.stats_path;
    if (!*path)
        return -1;
    return tr_write_stats(path);
}

EXPORT uintptr_t transit_device_alloc(size_t size)
{
    tr_runtime_once(); /* the real cudaMalloc, also when this comes before any CUDA call */
    if (!transit_active())
        return 0;
    pthread_mutex_lock(&tr_lock);
    uintptr_t p = tr_devbuf_alloc(size);
    pthread_mutex_unlock(&tr_lock);
    return p;
}

EXPORT int transit_device_free(uintptr_t ptr)
{
    if (!transit_active())
        return -1;
    pthread_mutex_lock(&tr_lock);
    int r = tr_devbuf_free(ptr);
    pthread_mutex_unlock(&tr_lock);
    return r;
}

/* Retired (TRANSIT_STAGE, docs/retired-experiments.md): the staging calls of API versions 1-5,
 * kept as exported no-ops so that an adapter of those versions still runs against this shim
 * (its bindings resolve them unconditionally; a missing symbol would end its hooks, or under
 * ctypes its import). They answer what a shim with staging off always answered: not
 * enabled, nothing staged, nothing waited for. Not in transit_api.h: nothing new calls them. */
EXPORT int transit_stage_enabled(void) { return 0; }
EXPORT size_t transit_stage_in(uintptr_t stream) { (void)stream; return 0; }
EXPORT int transit_stage_wait(uintptr_t stream) { (void)stream; return 0; }
EXPORT size_t transit_stage_out(uintptr_t stream) { (void)stream; return 0; }

EXPORT void transit_state_alloc(int on)
{
    if (transit_active())
        tr_hoststate_mark(on); /* the calling thread's own mark: no lock */
}

EXPORT void transit_state_segments(const size_t *sizes, size_t n)
{
    if (transit_active())
        tr_prefill_segments(sizes, n); /* its own lock, not tr_lock: it maps and starts a thread */
}

/* Retired with version 8 (a total says nothing of the segments each registration must match):
 * an adapter of version 7 still ends the first step with 0; any other figure is ignored, and
 * its state is pinned when made. Not in transit_api.h. */
EXPORT void transit_state_expect(size_t bytes)
{
    if (!bytes && transit_active())
        tr_prefill_end();
}

EXPORT void transit_state_on_host(void)
{
    if (!transit_active())
        return;
    pthread_mutex_lock(&tr_lock);
    tr_s.cold_reported = 1; /* as an optimizer hint does: no access probe (state.c) */
    pthread_mutex_unlock(&tr_lock);
}

EXPORT int transit_adapter_stats(const char *json)
{
    tr_init_once();
    if (!tr_json_object(json, TR_REPORT_OBJECT_MAX))
        return -1;
    char *copy = strdup(json);
    if (!copy)
        return -1;
    pthread_mutex_lock(&tr_lock);
    free(tr_s.adapter_stats);
    tr_s.adapter_stats = copy;
    pthread_mutex_unlock(&tr_lock);
    return 0;
}

EXPORT int transit_host_state(uintptr_t ptr, size_t size)
{
    if (!transit_active())
        return 0;
    pthread_mutex_lock(&tr_lock);
    int r = tr_hoststate_holds(ptr, size);
    pthread_mutex_unlock(&tr_lock);
    return r;
}
