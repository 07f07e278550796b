/* The allocation table: live managed allocations sorted by address, each cut into
 * page-aligned regions that carry a kind (hot, cold) and a placement (device, host).
 * All functions expect tr_lock held. A few hundred segments is typical for PyTorch's
 * caching allocator, so a sorted array with binary search is enough. */
#include <stdlib.h>
#include <string.h>

#include "transit.h"

pthread_mutex_t tr_lock = PTHREAD_MUTEX_INITIALIZER;
struct tr_table tr_tab;

static int lower_bound(uintptr_t ptr)
{
    int lo = 0, hi = tr_tab.n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (tr_tab.a[mid].ptr < ptr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The guard's reservation: managed bytes count from before the runtime is asked for them
 * until after it has freed them, so that what the runtime holds never exceeds the limit,
 * at any instant, whatever the threads do. No wrap-around: size may be near SIZE_MAX. */
int tr_table_reserve(size_t size, uint64_t limit)
{
    if (size > limit || tr_tab.managed_bytes > limit - size)
        return -1;
    tr_tab.managed_bytes += size;
    tr_tab.inflight += size;
    if (tr_tab.managed_bytes > tr_count.managed_peak)
        tr_count.managed_peak = tr_tab.managed_bytes;
    return 0;
}

void tr_table_release(size_t size)
{
    tr_tab.managed_bytes -= size;
    tr_tab.inflight -= size;
}

struct tr_alloc *tr_table_insert(uintptr_t ptr, size_t size)
{
    if (tr_tab.n == tr_tab.cap) {
        int cap = tr_tab.cap ? tr_tab.cap * 2 : 256;
        struct tr_alloc *a = realloc(tr_tab.a, (size_t)cap * sizeof *a);
        if (!a)
            return NULL;
        tr_tab.a = a;
        tr_tab.cap = cap;
    }
    struct tr_region *r = malloc(4 * sizeof *r);
    if (!r)
        return NULL;
    int i = lower_bound(ptr);
    memmove(&tr_tab.a[i + 1], &tr_tab.a[i], (size_t)(tr_tab.n - i) * sizeof tr_tab.a[0]);
    tr_tab.n++;
    struct tr_alloc *a = &tr_tab.a[i];
    *a = (struct tr_alloc){.ptr = ptr, .size = size, .seq = tr_tab.next_seq++, .nreg = 1, .capreg = 4, .reg = r};
    r[0] = (struct tr_region){.start = ptr, .end = ptr + size, .kind = TR_HOT, .place = TR_DEV};
    tr_tab.inflight -= size;
    return a;
}

struct tr_alloc *tr_table_find(uintptr_t addr)
{
    int i = lower_bound(addr + 1) - 1; /* last allocation starting at or before addr */
    if (i >= 0 && addr < tr_tab.a[i].ptr + tr_tab.a[i].size)
        return &tr_tab.a[i];
    return NULL;
}

void tr_table_remove(struct tr_alloc *a)
{
    int i = (int)(a - tr_tab.a);
    tr_tab.inflight += a->size;
    free(a->reg);
    memmove(&tr_tab.a[i], &tr_tab.a[i + 1], (size_t)(tr_tab.n - i - 1) * sizeof tr_tab.a[0]);
    tr_tab.n--;
}

/* Cut a so that [start, end) is covered by whole regions (new pieces inherit their
 * parent's kind and placement). */
static int cut(struct tr_alloc *a, uintptr_t at)
{
    for (int i = 0; i < a->nreg; i++) {
        struct tr_region *r = &a->reg[i];
        if (at <= r->start || at >= r->end)
            continue;
        if (a->nreg == a->capreg) {
            struct tr_region *n = realloc(a->reg, (size_t)a->capreg * 2 * sizeof *n);
            if (!n)
                return -1;
            a->reg = n;
            a->capreg *= 2;
            r = &a->reg[i];
        }
        memmove(&a->reg[i + 1], &a->reg[i], (size_t)(a->nreg - i) * sizeof *r);
        a->nreg++;
        a->reg[i].end = at;
        a->reg[i + 1].start = at;
        return 0;
    }
    return 0;
}

int tr_region_split(struct tr_alloc *a, uintptr_t start, uintptr_t end)
{
    return cut(a, start) || cut(a, end) ? -1 : 0;
}

int tr_region_cut_at(struct tr_alloc *a, int j, uintptr_t at)
{
    if (j < 0 || j >= a->nreg || at <= a->reg[j].start || at >= a->reg[j].end)
        return -1;
    return cut(a, at);
}

struct tr_region *tr_region_cut(struct tr_cursor *c, uintptr_t at)
{
    struct tr_alloc *a = &tr_tab.a[c->i];
    if (c->j < 1 || tr_region_cut_at(a, c->j - 1, at))
        return NULL;
    return &a->reg[c->j - 1]; /* the array may have moved; the second piece is the cursor's next */
}

/* Neighbours that agree in everything become one region again, so that the cuts of
 * partial placements (place.c) do not pile up over a long job. */
void tr_table_coalesce(void)
{
    for (int i = 0; i < tr_tab.n; i++) {
        struct tr_alloc *a = &tr_tab.a[i];
        int k = 0;
        for (int j = 1; j < a->nreg; j++) {
            struct tr_region *x = &a->reg[k], *y = &a->reg[j];
            if (x->kind == y->kind && x->place == y->place && x->zero_copy == y->zero_copy &&
                x->advised == y->advised && x->evicted == y->evicted && x->for_buffer == y->for_buffer &&
                x->touches == y->touches)
                x->end = y->end;
            else
                a->reg[++k] = *y;
        }
        a->nreg = k + 1;
    }
}

struct tr_region *tr_region_next(struct tr_cursor *c)
{
    while (c->i < tr_tab.n) {
        struct tr_alloc *a = &tr_tab.a[c->i];
        if (c->j < a->nreg)
            return &a->reg[c->j++];
        c->i++;
        c->j = 0;
    }
    return NULL;
}

#ifdef TRANSIT_TESTING
#include <stdio.h>

/* The table agrees with itself and with the counters kept beside it; NULL when it does. */
static const char *inconsistency(void)
{
    uint64_t sizes = 0, dev = 0, host = 0, zc = 0, hinted[TR_KINDS] = {0};
    for (int i = 0; i < tr_tab.n; i++) {
        const struct tr_alloc *a = &tr_tab.a[i];
        if (i + 1 < tr_tab.n && a->ptr + a->size > tr_tab.a[i + 1].ptr)
            return "allocations overlap or are out of order";
        if (a->nreg < 1 || a->nreg > a->capreg || a->reg[0].start != a->ptr || a->reg[a->nreg - 1].end != a->ptr + a->size)
            return "regions do not cover their allocation";
        for (int j = 0; j < a->nreg; j++) {
            const struct tr_region *r = &a->reg[j];
            uint64_t n = r->end - r->start;
            if (r->start >= r->end || (j + 1 < a->nreg && r->end != a->reg[j + 1].start))
                return "regions are not contiguous";
            *(r->place == TR_DEV ? &dev : &host) += n;
            zc += r->zero_copy ? n : 0;
            hinted[r->kind] += n;
        }
        sizes += a->size;
    }
    if (sizes + tr_tab.inflight != tr_tab.managed_bytes)
        return "managed_bytes is not the table's bytes and those in flight";
    if (dev + tr_tab.dev_inflight != tr_tab.dev_bytes || host != tr_count.host_placed_bytes || zc != tr_count.zero_copy_bytes)
        return "placement counters are not the sum of the regions";
    for (int k = TR_COLD_MASTER; k < TR_KINDS; k++)
        if (hinted[k] != tr_count.hint_bytes[k])
            return "hint counters are not the sum of the regions";
    if (tr_tab.dev_bytes > tr_budget())
        return "placed above the budget";
    if (!tr_cfg.allow_oversubscribe && tr_tab.managed_bytes > tr_guard_room())
        return "managed memory above the guard";
    return NULL;
}

/* Test hook (built only with -DTRANSIT_TESTING): 0 when the table is consistent, else -1
 * and the reason in why. */
EXPORT int transit_test_check(char *why, size_t len)
{
    tr_init_once(); /* like every exported entry: the configuration is written once, before */
    pthread_mutex_lock(&tr_lock);
    const char *bad = inconsistency();
    pthread_mutex_unlock(&tr_lock);
    if (bad && why && len)
        snprintf(why, len, "%s", bad);
    return bad ? -1 : 0;
}
#endif
