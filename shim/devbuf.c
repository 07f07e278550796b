/* Plain device memory for an adapter's staging buffers (transit_device_alloc).
 *
 * Copies between pinned host memory and plain device memory run on the copy engines beside
 * compute; copies into managed memory, even memory placed on the device, are served by the
 * SMs and slow the kernels beside them (bench/LOG.md, "The state's paths across PCIe,
 * beside compute"). So a staging buffer must not be managed. Its bytes come out of the GPU
 * budget: tr_budget() is the room left for managed data, and managed data on the device is
 * demoted to make room, so the budget still bounds everything the shim holds on the GPU at
 * every instant. Under tr_lock. */
#include "transit.h"

#define MAX_BUFS 64 /* an adapter holds a ring per device, not a pool per tensor */

static struct { uintptr_t ptr; size_t size; } bufs[MAX_BUFS];
static int nbufs; /* their bytes: the ledger's (tr_devbuf_bytes) */

/* Demote managed data until what is placed fits the room the buffers leave: cold data
 * first, and within a kind from the end of the table, which advise's ranking gives room
 * last (so its next boundary moves nothing back); of the last region only what is needed.
 * Before the runtime is asked, so that
 * what is on the device never exceeds the budget. Marks what it demoted. */
static void fit(void)
{
    for (int kind = TR_COLD_OPT; kind >= TR_HOT; kind--)
        for (int i = tr_tab.n - 1; i >= 0 && tr_tab.dev_bytes > tr_budget(); i--)
            for (int j = tr_tab.a[i].nreg - 1; j >= 0 && tr_tab.dev_bytes > tr_budget(); j--) {
                struct tr_alloc *a = &tr_tab.a[i];
                struct tr_region *r = &a->reg[j];
                if (r->kind != kind || r->place != TR_DEV)
                    continue;
                /* only the bytes the buffer needs leave: the region's tail, to the grain */
                uint64_t keep = tr_place_keep(tr_region_bytes(r), tr_tab.dev_bytes - tr_budget());
                if (keep && tr_region_cut_at(a, j, r->start + keep) == 0)
                    r = &a->reg[j + 1];
                tr_place_demote(r);
                r->for_buffer = 1;
            }
}

/* What fit() demoted and fits the room after all goes back, last demoted first: demoting
 * whole regions from the end can free more than the buffer needs, and under base and
 * prefetch nothing would bring it back later. */
static void refit(void)
{
    for (int kind = TR_HOT; kind <= TR_COLD_OPT; kind++)
        for (int i = 0; i < tr_tab.n; i++)
            for (int j = 0; j < tr_tab.a[i].nreg; j++) {
                struct tr_region *r = &tr_tab.a[i].reg[j];
                if (r->kind != kind || !r->for_buffer)
                    continue;
                r->for_buffer = 0;
                if (tr_tab.dev_bytes + tr_region_bytes(r) <= tr_budget())
                    tr_move_to_device(r);
            }
}

uintptr_t tr_devbuf_alloc(size_t size)
{
    if (!tr_real.malloc || !size || nbufs == MAX_BUFS || size > tr_budget_total() ||
        tr_devbuf_bytes() > tr_budget_total() - size ||
        tr_tab.dev_inflight > tr_budget_total() - tr_devbuf_bytes() - size)
        return 0; /* no runtime yet, or no room in the budget (what is being freed cannot be demoted) */
    if (!tr_cfg.allow_oversubscribe && (size > tr_guard_room() || tr_tab.managed_bytes > tr_guard_room() - size))
        return 0; /* physically: the guard's limit (what was free at start-up) holds managed memory and buffers */
    void *p = NULL;
    tr_ledger_buffers_add(size);
    fit();
    tr_replay_yield(0); /* the budget shrank: prefetch's window gives way too */
    cudaError_t pending = tr_pending_error();
    cudaError_t err = tr_real.malloc(&p, size);
    if (err != cudaSuccess) {
        tr_ledger_buffers_sub(size);
        tr_own_error(pending, err);
        refit();
        return 0;
    }
    refit();
    bufs[nbufs].ptr = (uintptr_t)p;
    bufs[nbufs++].size = size;
    tr_place_peaks();
    tr_log(TR_INFO, "device buffer %p (%zu bytes) for the adapter: %llu bytes of the budget left for managed data",
           p, size, (unsigned long long)tr_budget());
    return (uintptr_t)p;
}

int tr_devbuf_free(uintptr_t ptr)
{
    for (int i = 0; i < nbufs && tr_real.free; i++) {
        if (bufs[i].ptr != ptr)
            continue;
        cudaError_t pending = tr_pending_error();
        cudaError_t err = tr_real.free((void *)ptr);
        if (err != cudaSuccess)
            tr_own_error(pending, err);
        tr_ledger_buffers_sub(bufs[i].size); /* room for managed data again at the next boundary */
        bufs[i] = bufs[--nbufs];
        return 0;
    }
    return -1;
}
