/* The ledger: what the GPU budget and the guard allow, and what the shim holds against them.
 *
 * The budget (TRANSIT_GPU_BUDGET, else the guard's limit) bounds every byte the shim holds
 * on the device: managed data placed there (table.c's dev_bytes) and the adapter's plain
 * device buffers (devbuf.c). The guard bounds managed allocations by the memory free at
 * start-up less TRANSIT_RESERVE, so that managed memory never oversubscribes a shared GPU.
 * Placement (place.c), the buffers, the replay window and cudaMemGetInfo read their room
 * here. Under tr_lock where the table is read. */
#include <stdio.h>

#include "transit.h"

uint64_t tr_budget_total(void)
{
    if (tr_cfg.budget)
        return tr_cfg.budget;
    return tr_guard_limit();
}

/* Bytes of the adapter's plain device buffers (devbuf.c takes and gives them here, so the
 * ledger reads no other module's count). */
static uint64_t buffers;

uint64_t tr_devbuf_bytes(void) { return buffers; }
void tr_ledger_buffers_add(uint64_t bytes) { buffers += bytes; }
void tr_ledger_buffers_sub(uint64_t bytes) { buffers -= bytes; }

static uint64_t less_buffers(uint64_t bytes)
{
    return bytes > buffers ? bytes - buffers : 0;
}

/* The room for managed data: the budget less the adapter's device buffers (devbuf.c). */
uint64_t tr_budget(void) { return less_buffers(tr_budget_total()); }

/* The guard's limit for managed allocations, likewise. */
uint64_t tr_guard_room(void) { return less_buffers(tr_guard_limit()); }

uint64_t tr_guard_limit(void)
{
    return tr_s.free_at_start > tr_cfg.reserve ? tr_s.free_at_start - tr_cfg.reserve : tr_s.free_at_start;
}

void tr_guard_describe(char *buf, size_t len)
{
    unsigned long long fr = tr_s.free_at_start, res = tr_cfg.reserve;
    if (fr > res)
        snprintf(buf, len, "the %llu bytes free at start-up less the %llu-byte reserve (TRANSIT_RESERVE)", fr, res);
    else
        snprintf(buf, len, "the %llu bytes free at start-up, none kept for TRANSIT_RESERVE (%llu bytes): less than "
                           "that was free", fr, res);
}

/* Bytes the shim holds on the device: managed data placed there and the device buffers. */
uint64_t tr_device_held(void) { return tr_tab.dev_bytes + buffers; }
