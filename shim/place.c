/* Placement: the shim, not the driver, decides which managed bytes may live on the GPU,
 * so that a GPU budget holds without relying on driver eviction (which would need real
 * oversubscription, forbidden on shared GPUs).
 *
 * Invariant: bytes of regions placed TR_DEV <= budget. A new allocation goes to the
 * device while it fits, else to the host (allocation order, the only thing known then).
 * On the host a region is
 *   base:     preferred location host; the GPU maps it on first touch (faults, then remote reads)
 *   prefetch: as base after warm-up; replay prefetches its recorded ranges in a window
 *   advise:   preferred location host + accessed-by GPU: zero-copy with no faults
 * advise ranks data at every iteration boundary: hot data, then fp32 master weights (read
 * in every forward and backward), then embedding tables the forward reads only in part
 * (the SPARSE hint), then optimizer states (touched once a step), and keeps on the device
 * what fits the budget in that order, the region at the line cut to the grain; the rest is
 * served zero-copy. So
 * cold data leaves only when the budget needs its room, as transit_launch/planning/plan.py
 * assumes (only what does not fit crosses PCIe). */
#include <stdio.h>

#include "transit.h"

#define HINT_ALIGN (64u * 1024u) /* hints are aligned inwards to 64 KiB */

static uint64_t rsize(const struct tr_region *r) { return r->end - r->start; }

/* The device peak counts the adapter's device buffers too: what the budget bounds. */
static void peaks(void)
{
    if (tr_device_held() > tr_count.dev_placed_peak)
        tr_count.dev_placed_peak = tr_device_held();
    if (tr_count.host_placed_bytes > tr_count.host_placed_peak)
        tr_count.host_placed_peak = tr_count.host_placed_bytes;
    if (tr_count.zero_copy_bytes > tr_count.zero_copy_peak)
        tr_count.zero_copy_peak = tr_count.zero_copy_bytes;
}

/* Until warm-up ends (tr_s.defer_advice) host regions carry no advice, so that GPU
 * touches migrate and CUPTI sees them; afterwards they follow the policy. */
static void advise_host(struct tr_region *r)
{
    void *p = (void *)r->start;
    if (tr_s.defer_advice)
        return;
    r->advised = 1;
    tr_advise(p, rsize(r), cudaMemAdviseSetPreferredLocation, TR_LOC_HOST, tr_s.device);
    if (tr_cfg.policy == TR_ADVISE) {
        tr_advise(p, rsize(r), cudaMemAdviseSetAccessedBy, TR_LOC_DEVICE, tr_s.device);
        r->zero_copy = 1;
        tr_count.zero_copy_bytes += rsize(r);
    }
}

static void evict_region(struct tr_region *r)
{
    tr_prefetch((void *)r->start, rsize(r), TR_LOC_HOST, 0, 0);
    tr_count.evict_calls++;
    tr_count.evict_bytes += rsize(r);
    r->evicted = 1;
}

static void to_host(struct tr_region *r, int evict)
{
    r->place = TR_HOST;
    tr_tab.dev_bytes -= rsize(r);
    tr_count.host_placed_bytes += rsize(r);
    advise_host(r);
    r->evicted = 0;
    if (evict) /* move what is already resident now, so the budget holds physically */
        evict_region(r);
}

/* Counted on the device from the moment the prefetch is enqueued (on the legacy stream). */
void tr_move_to_device(struct tr_region *r)
{
    void *p = (void *)r->start;
    tr_replay_forget(r->start, r->end); /* placed on the device now: no longer the window's to send home */
    tr_replay_yield(rsize(r));
    if (r->zero_copy) {
        tr_advise(p, rsize(r), cudaMemAdviseUnsetAccessedBy, TR_LOC_DEVICE, tr_s.device);
        r->zero_copy = 0;
        tr_count.zero_copy_bytes -= rsize(r);
    }
    tr_advise(p, rsize(r), cudaMemAdviseSetPreferredLocation, TR_LOC_DEVICE, tr_s.device);
    tr_prefetch(p, rsize(r), TR_LOC_DEVICE, tr_s.device, 0);
    tr_count.prefetch_calls++;
    tr_count.prefetch_bytes += rsize(r);
    r->place = TR_DEV;
    tr_tab.dev_bytes += rsize(r);
    tr_count.host_placed_bytes -= rsize(r);
}

void tr_place_demote(struct tr_region *r) { to_host(r, 1); }

void tr_place_peaks(void) { peaks(); }

uint64_t tr_region_bytes(const struct tr_region *r) { return rsize(r); }

/* advise keeps optimizer state on the GPU at a boundary while it fits; the next step's
 * new segments (the caching allocator grows after the first optimizer step has taken
 * blocks it used for activations) then need that room. Measured on the H200 at 12
 * microbatches: served zero-copy instead, they made that step 20x slower. So a new
 * allocation that does not fit takes the room of optimizer state first, then of master
 * weights (advise's own ranking, hot data above both): in the first step, before any
 * boundary has ranked, the last activations of a working set a little larger than the
 * budget otherwise ran zero-copy to the step's end (the adapter reports the master
 * weights when the optimizer is made, so they are known by then). */
static void make_room(uint64_t need)
{
    struct tr_region *r;
    if (tr_cfg.policy != TR_ADVISE)
        return;
    for (int kind = TR_COLD_OPT; kind >= TR_COLD_MASTER; kind--)
        for (struct tr_cursor c = {0, 0}; tr_tab.dev_bytes + need > tr_budget() && (r = tr_region_next(&c));)
            if (r->kind == kind && r->place == TR_DEV) {
                r = tr_place_leave_part(&c, r, tr_tab.dev_bytes + need - tr_budget());
                to_host(r, 1);
                tr_count.room_demotions++;
            }
}

/* Of a region of `size` bytes that must give `leave` of them: the head that stays, whole
 * grains (0: all of it goes); the tail that goes is `leave` rounded up to the grain. */
uint64_t tr_place_keep(uint64_t size, uint64_t leave)
{
    return size > leave ? (size - leave) & ~(TR_PLACE_GRAIN - 1) : 0;
}

/* Of the cursor's region r, which must give `bytes` of the device: the piece that leaves. A
 * region larger than that by a grain or more is cut, its head staying (tr_place_keep); the
 * cursor then stands on the tail. */
struct tr_region *tr_place_leave_part(struct tr_cursor *c, struct tr_region *r, uint64_t bytes)
{
    uint64_t keep = tr_place_keep(rsize(r), bytes);
    struct tr_region *head = keep ? tr_region_cut(c, r->start + keep) : NULL;
    if (!head)
        return r;
    return tr_region_next(c); /* the tail */
}

void tr_place_new(struct tr_alloc *a)
{
    struct tr_region *r = &a->reg[0];
    if (tr_tab.dev_bytes + a->size > tr_budget())
        make_room(a->size);
    if (tr_tab.dev_bytes + a->size <= tr_budget()) {
        tr_replay_yield(a->size); /* prefetch's window holds device room too */
        tr_tab.dev_bytes += a->size;
        /* Populate the new pages on the device now rather than by a storm of first-touch
         * faults: the caching allocator grows through the first step. Not during prefetch's
         * warm-up, whose faults must be observable. */
        if (!tr_s.defer_advice)
            tr_prefetch((void *)a->ptr, a->size, TR_LOC_DEVICE, tr_s.device, 0);
    } else {
        r->place = TR_HOST;
        tr_count.host_placed_bytes += a->size;
        advise_host(r);
        tr_log(TR_DEBUG, "allocation %p (%zu bytes) placed on the host: budget %llu, on device %llu",
               (void *)a->ptr, a->size, (unsigned long long)tr_budget(), (unsigned long long)tr_tab.dev_bytes);
    }
    peaks();
}

/* An allocation leaves the table. Its device bytes stay counted until the runtime has
 * freed them (tr_place_freed after cudaFree returns): another thread's allocation placed
 * in that room first would be populated on the device while these pages still are. */
uint64_t tr_place_drop(struct tr_alloc *a)
{
    /* what prefetch's window moved of it is on the device until then too, as its
     * device-placed bytes are: it leaves the window and is counted with them */
    uint64_t win = tr_replay_forget(a->ptr, a->ptr + a->size), dev = win;
    tr_tab.dev_bytes += win;
    for (int i = 0; i < a->nreg; i++) {
        struct tr_region *r = &a->reg[i];
        if (r->place == TR_DEV)
            dev += rsize(r);
        else
            tr_count.host_placed_bytes -= rsize(r);
        if (r->zero_copy)
            tr_count.zero_copy_bytes -= rsize(r);
        if (r->kind != TR_HOT)
            tr_count.hint_bytes[r->kind] -= rsize(r);
    }
    tr_tab.dev_inflight += dev;
    return dev;
}

void tr_place_freed(uint64_t dev)
{
    tr_tab.dev_bytes -= dev;
    tr_tab.dev_inflight -= dev;
}

int tr_hint(uintptr_t ptr, size_t size, enum tr_kind kind)
{
    struct tr_alloc *a = tr_table_find(ptr);
    if (!a)
        return -1;
    uintptr_t start = (ptr + HINT_ALIGN - 1) & ~(uintptr_t)(HINT_ALIGN - 1);
    uintptr_t end = (ptr + size) & ~(uintptr_t)(HINT_ALIGN - 1);
    if (end > a->ptr + a->size)
        end = a->ptr + a->size;
    if (end <= start)
        return 0; /* smaller than a hint page: stays with its neighbours */
    if (tr_region_split(a, start, end))
        return -1;
    for (int i = 0; i < a->nreg; i++) {
        struct tr_region *r = &a->reg[i];
        if (r->start >= start && r->end <= end && r->kind < kind) {
            if (r->kind != TR_HOT)
                tr_count.hint_bytes[r->kind] -= rsize(r);
            r->kind = (uint8_t)kind;
            tr_count.hint_bytes[kind] += rsize(r);
        }
    }
    return 0;
}

/* Gives every region of `kind` on `place` the device while it fits in *room. */
static void rank_kind(enum tr_kind kind, enum tr_place place, uint64_t *room)
{
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));) {
        if (r->kind != kind || r->place != place)
            continue;
        uint64_t fit = *room & ~(TR_PLACE_GRAIN - 1);
        if (rsize(r) > *room && fit) { /* the head that fits gets the room; the tail comes next */
            struct tr_region *head = tr_region_cut(&c, r->start + fit);
            if (head) /* (the array may have moved; a cut that failed moved nothing) */
                r = head;
        }
        if (rsize(r) <= *room) {
            r->want = TR_DEV;
            *room -= rsize(r);
        } else {
            r->want = TR_HOST;
        }
    }
}

/* advise: rank (hot, master, sparse, optimizer; within a kind what is on the device already
 * comes first, so that a steady state moves nothing). */
static void rank(void)
{
    uint64_t budget = tr_budget(), held = tr_tab.dev_inflight; /* freed, not yet given back: not in the table */
    uint64_t room = budget > held ? budget - held : 0;
    for (int k = TR_HOT; k <= TR_COLD_OPT; k++) {
        rank_kind((enum tr_kind)k, TR_DEV, &room);
        rank_kind((enum tr_kind)k, TR_HOST, &room);
    }
}

/* Demote before promoting, so that placement never exceeds the budget. */
static void place_ranked(void)
{
    struct tr_region *r;
    for (int pass = 0; pass < 2; pass++) {
        for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));) {
            if (pass == 0 && r->place == TR_DEV && r->want == TR_HOST)
                to_host(r, 1);
            else if (pass == 1 && r->place == TR_HOST && r->want == TR_DEV)
                tr_move_to_device(r);
        }
    }
}

/* A GPU's first touch can populate host-preferred pages in device memory: every host
 * region is pushed to the host once after it was placed there (at the next boundary),
 * unless advise is about to bring it to the device anyway (ranked: want == TR_DEV). */
static void evict_new_host_regions(int ranked)
{
    if (tr_s.defer_advice)
        return;
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));)
        if (r->place == TR_HOST && !r->evicted && !(ranked && r->want == TR_DEV))
            evict_region(r);
}

void tr_rebalance(void)
{
    int advise = tr_cfg.policy == TR_ADVISE;
    if (advise)
        rank();
    evict_new_host_regions(advise);
    if (advise)
        place_ranked();
    tr_table_coalesce();
    peaks();
}

/* Start of an observation: host regions lose their advice so that GPU touches migrate. */
void tr_place_unadvise(void)
{
    tr_s.defer_advice = 1;
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));) {
        if (!r->advised)
            continue;
        tr_advise((void *)r->start, rsize(r), cudaMemAdviseUnsetPreferredLocation, TR_LOC_HOST, 0);
        if (r->zero_copy) {
            tr_advise((void *)r->start, rsize(r), cudaMemAdviseUnsetAccessedBy, TR_LOC_DEVICE, tr_s.device);
            r->zero_copy = 0;
            tr_count.zero_copy_bytes -= rsize(r);
        }
        r->advised = 0;
    }
}

/* End of warm-up: host regions left unadvised for observation get their policy's advice
 * and are evicted, so the budget holds from here on. */
void tr_place_settle(void)
{
    tr_s.defer_advice = 0;
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));) {
        if (r->place == TR_HOST && !r->advised) {
            advise_host(r);
            evict_region(r);
        }
    }
}

/* Warm-up observation: send the observed set back to the host so that the next
 * iteration migrates it again, in front of CUPTI. all: every region (advise's
 * access probe), else only host-placed regions (prefetch's recording). */
void tr_place_evict_observed(int all)
{
    struct tr_region *r;
    for (struct tr_cursor c = {0, 0}; (r = tr_region_next(&c));)
        if (all || r->place == TR_HOST)
            evict_region(r);
}
