/* Staging (TRANSIT_STAGE=1 with advise; experimental, docs/lifetime-policy.md): cold data
 * whose home is the host is lent to the device for the part of a step that has room for
 * it, so that the optimizer reads it from HBM instead of over PCIe, and the copies run on
 * a side stream behind compute. The framework adapter drives it:
 *   stage_in  at the start of the last backward, after PyTorch gave its free cache back:
 *             optimizer ranges move in while they fit the budget less what the application
 *             placed between this point and the step's end last time (learned, the first
 *             step only measures);
 *   stage_wait before the optimizer step: the application's stream waits for the copies;
 *   stage_out after the optimizer step: the ranges go home after the step's kernels.
 * The budget holds at every instant: staged bytes count on the device from the moment
 * their copy is enqueued, and leaving bytes until their copy is known done; an allocation
 * that needs their room waits for it (tr_place_new). */
#include "transit.h"

static cudaStream_t side;
static cudaEvent_t ev_app, ev_in, ev_out;
static int ready = -1; /* -1 not tried, 0 failed (staging off), 1 ready */
static int in_pending, out_pending;
static int measuring;                 /* between stage_in and the next boundary */
static int64_t since, since_peak;     /* the application's placement change since stage_in */
static int have_need;
static uint64_t need;                 /* learned: the most it grew from stage_in to the boundary */

static int broken; /* a runtime call of staging's failed, or it overflowed: no new staging */

/* A runtime call of staging's own: a failure is cleared (tr_own_error) and stops new
 * staging; the job goes on. */
static int own(cudaError_t pending, cudaError_t err, const char *what)
{
    if (tr_own_error(pending, err) == cudaSuccess)
        return 1;
    if (!broken)
        tr_log(TR_WARN, "staging: %s failed (%d): no more staging", what, (int)err);
    broken = 1;
    return 0;
}

int tr_stage_enabled(void)
{
    return tr_cfg.stage && !broken && tr_cfg.policy == TR_ADVISE && !tr_s.passthrough && tr_s.runtime_ready &&
           tr_real.stream_create && tr_real.event_create && tr_real.event_record && tr_real.stream_wait_event &&
           tr_real.event_synchronize && tr_real.event_query && tr_real.device_synchronize;
}

static int setup(void)
{
    if (ready >= 0)
        return ready;
    cudaError_t p = tr_pending_error();
    ready = own(p, tr_real.stream_create(&side, cudaStreamNonBlocking), "cudaStreamCreateWithFlags") &&
            own(p, tr_real.event_create(&ev_app, cudaEventDisableTiming), "cudaEventCreateWithFlags") &&
            own(p, tr_real.event_create(&ev_in, cudaEventDisableTiming), "cudaEventCreateWithFlags") &&
            own(p, tr_real.event_create(&ev_out, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    return ready;
}

uint64_t tr_stage_lent_bytes(void)
{
    uint64_t n = 0;
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));)
        if (r->stage != TR_HOME && r->place == TR_DEV)
            n += tr_region_bytes(r);
    return n;
}

uint64_t tr_stage_in(cudaStream_t app)
{
    (void)app; /* the room was made by cudaFree, which synchronized: nothing to order after */
    if (!tr_stage_enabled() || !setup() || tr_s.defer_advice)
        return 0;
    tr_stage_settle(0);
    measuring = 1;
    since = since_peak = 0;
    if (!have_need)
        return 0; /* the first step learns what the rest of a step allocates */
    uint64_t budget = tr_budget(), used = tr_tab.dev_bytes + need;
    uint64_t room = budget > used ? budget - used : 0, moved = 0;
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));) {
        uint64_t n = tr_region_bytes(r);
        if (r->kind != TR_COLD_OPT || r->place != TR_HOST || r->stage != TR_HOME || n > room - moved)
            continue;
        tr_move_to_device(r, side);
        r->stage = TR_STAGED;
        moved += n;
    }
    if (moved) {
        cudaError_t p = tr_pending_error(); /* before the call: C leaves argument order open */
        in_pending = own(p, tr_real.event_record(ev_in, side), "cudaEventRecord");
        tr_count.stage_in_bytes += moved;
    }
    tr_log(TR_DEBUG, "staging in %llu bytes (room %llu, learned need %llu)", (unsigned long long)moved,
           (unsigned long long)room, (unsigned long long)need);
    return moved;
}

int tr_stage_wait(cudaStream_t app)
{
    if (!in_pending)
        return 0;
    in_pending = 0;
    cudaError_t p = tr_pending_error();
    return own(p, tr_real.stream_wait_event(app, ev_in, 0), "cudaStreamWaitEvent");
}

uint64_t tr_stage_out(cudaStream_t app)
{
    if (ready != 1)
        return 0;
    uint64_t moved = 0;
    if (!tr_stage_lent_bytes())
        return 0;
    /* after the kernels the application enqueued so far (the optimizer step); if that
     * cannot be ordered, synchronizing is the safe way home */
    cudaError_t p = tr_pending_error();
    if (!own(p, tr_real.event_record(ev_app, app), "cudaEventRecord") ||
        !own(p, tr_real.stream_wait_event(side, ev_app, 0), "cudaStreamWaitEvent"))
        tr_real.device_synchronize();
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));) {
        if (r->stage == TR_STAGED) {
            tr_move_to_host(r, side);
            r->stage = TR_LEAVING;
            moved += tr_region_bytes(r);
        }
    }
    if (moved) {
        p = tr_pending_error();
        if (!own(p, tr_real.event_record(ev_out, side), "cudaEventRecord"))
            tr_real.device_synchronize(); /* then the copies are done when settled below */
        out_pending = 1;
        tr_count.stage_out_bytes += moved;
        tr_count.stage_steps++;
    }
    return moved;
}

void tr_stage_settle(int block)
{
    if (!out_pending)
        return;
    if (block || broken) {
        cudaError_t p = tr_pending_error();
        if (!own(p, tr_real.event_synchronize(ev_out), "cudaEventSynchronize"))
            tr_real.device_synchronize();
        tr_count.stage_syncs++;
    } else {
        cudaError_t pending = tr_pending_error();
        cudaError_t q = tr_real.event_query(ev_out);
        if (q != cudaSuccess) {
            tr_clear_error(pending); /* not the application's error */
            return;
        }
    }
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));) {
        if (r->stage == TR_LEAVING) {
            r->stage = TR_HOME;
            tr_move_settled(r);
        }
    }
    out_pending = 0;
}

/* An allocation did not fit while optimizer state was lent: the step grew beyond what
 * was learned (on the H200: the caching allocator growing again after empty_cache), and
 * hot data would be served zero-copy, far slower than the optimizer's own PCIe reads
 * (a 76.9 s step against 4.7 s). Staging stops for good; what is lent goes home. */
void tr_stage_overflowed(void)
{
    if (broken || !tr_stage_enabled() || !tr_stage_lent_bytes())
        return;
    tr_log(TR_WARN, "staging: an allocation overflowed the budget while optimizer state was lent: no more staging");
    broken = 1;
    tr_count.stage_overflows++;
}

void tr_stage_placed(int64_t delta)
{
    if (!measuring)
        return;
    since += delta;
    if (since > since_peak)
        since_peak = since;
}

void tr_stage_boundary(void)
{
    if (measuring) {
        uint64_t n = since_peak > 0 ? (uint64_t)since_peak : 0;
        if (!have_need || n > need)
            need = n;
        have_need = 1;
        measuring = 0;
        tr_count.stage_need = need;
    }
    tr_stage_settle(0);
}
