/* prefetch replay: merged host-to-device ranges per launch position, prefetched on the
 * launch's stream just before the launch, in a window that keeps the budget (the oldest
 * prefetched ranges go back to the host first). Also: iteration detection from the
 * repeating kernel sequence, for programs without the framework adapter. */
#include <stdlib.h>
#include <string.h>

#include "transit.h"

struct range { uintptr_t start, end; };
#define PAGE 4096u /* the host's page: what a prefetch moves at least */
struct slot { struct range *r; int n, cap; };

static struct slot *slots;
static uint64_t nslots;
static uint64_t positions_with_ranges;

/* window of prefetched ranges (FIFO) */
static struct range *win;
static int win_head, win_len, win_cap;
static uint64_t win_bytes;

void tr_replay_add(uint64_t pos, uintptr_t addr, uint64_t bytes)
{
    if (pos >= (1u << 24))
        return;
    if (pos >= nslots) {
        uint64_t n = nslots ? nslots : 1024;
        while (n <= pos)
            n *= 2;
        struct slot *s = realloc(slots, n * sizeof *s);
        if (!s)
            return;
        memset(s + nslots, 0, (n - nslots) * sizeof *s);
        slots = s;
        nslots = n;
    }
    struct slot *s = &slots[pos];
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 4;
        struct range *r = realloc(s->r, (size_t)cap * sizeof *r);
        if (!r)
            return;
        s->r = r;
        s->cap = cap;
    }
    s->r[s->n++] = (struct range){addr, addr + bytes};
}

static int by_start(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Sort each position's ranges and merge those closer than TRANSIT_MERGE_GAP. */
void tr_replay_finish(void)
{
    positions_with_ranges = 0;
    for (uint64_t p = 0; p < nslots; p++) {
        struct slot *s = &slots[p];
        if (!s->n)
            continue;
        qsort(s->r, (size_t)s->n, sizeof *s->r, by_start);
        int k = 0;
        for (int i = 1; i < s->n; i++) {
            /* never across allocations: the gap between two may be unmapped, and a
             * prefetch over it fails (cudaErrorInvalidValue) */
            struct tr_alloc *a = tr_table_find(s->r[k].start);
            int same = a && s->r[i].start < a->ptr + a->size;
            if (same && s->r[i].start <= s->r[k].end + tr_cfg.merge_gap) {
                if (s->r[i].end > s->r[k].end)
                    s->r[k].end = s->r[i].end;
            } else {
                s->r[++k] = s->r[i];
            }
        }
        s->n = k + 1;
        positions_with_ranges++;
    }
    tr_s.replay_ready = tr_cfg.policy == TR_PREFETCH && positions_with_ranges > 0;
}

uint64_t tr_replay_positions(void) { return positions_with_ranges; }

static void win_evict_one(cudaStream_t stream)
{
    struct range r = win[win_head];
    win_head = (win_head + 1) % win_cap;
    win_len--;
    win_bytes -= r.end - r.start;
    tr_prefetch((void *)r.start, r.end - r.start, TR_LOC_HOST, 0, stream);
    tr_count.evict_calls++;
    tr_count.evict_bytes += r.end - r.start;
}

/* [start, end) leaves the window: freed (so that no eviction later sends a range home that
 * the runtime no longer manages, or that a new allocation at the same address now holds), or
 * placed on the device (counted there from now on). A range that reaches past it keeps its
 * outer parts, still on the device and still the window's: dropping them too left their
 * bytes counted nowhere (a region cut at the budget's line lies inside a range). Order kept;
 * with no memory for the parts a range stays whole, counted twice (over, never under).
 * Returns the window's bytes that left it. */
uint64_t tr_replay_forget(uintptr_t start, uintptr_t end)
{
    uint64_t before = win_bytes;
    int hit = 0, parts = 0;
    for (int i = 0; i < win_len; i++) {
        struct range r = win[(win_head + i) % win_cap];
        if (r.start < end && r.end > start) {
            hit++;
            parts += (r.start < start) + (r.end > end);
        }
    }
    if (!hit)
        return 0;
    if (!parts) { /* whole ranges only (a free: ranges never cross allocations): in place */
        int kept = 0;
        for (int i = 0; i < win_len; i++) {
            struct range r = win[(win_head + i) % win_cap];
            if (r.start < end && r.end > start)
                win_bytes -= r.end - r.start;
            else
                win[(win_head + kept++) % win_cap] = r;
        }
        win_len = kept;
        return before - win_bytes;
    }
    struct range *w = malloc((size_t)(win_len + parts) * sizeof *w);
    if (!w)
        return 0;
    int kept = 0;
    for (int i = 0; i < win_len; i++) {
        struct range r = win[(win_head + i) % win_cap];
        if (!(r.start < end && r.end > start)) {
            w[kept++] = r;
            continue;
        }
        win_bytes -= r.end - r.start;
        if (r.start < start) {
            w[kept++] = (struct range){r.start, start};
            win_bytes += start - r.start;
        }
        if (r.end > end) {
            w[kept++] = (struct range){end, r.end};
            win_bytes += r.end - end;
        }
    }
    free(win);
    win = w;
    win_head = 0;
    win_cap = win_len + parts;
    win_len = kept;
    return before - win_bytes;
}

/* Something is about to take `need` bytes of device room (a new allocation placed there, a
 * promotion, an adapter's buffer): the window's oldest ranges go home first, so that what
 * is placed and what the window holds stay within the budget together, on every thread. */
void tr_replay_yield(uint64_t need)
{
    uint64_t budget = tr_budget(), used = tr_tab.dev_bytes + need;
    uint64_t room = budget > used ? budget - used : 0;
    while (win_len && win_bytes > room)
        win_evict_one(0);
}

void tr_replay_before_launch(uint64_t pos, cudaStream_t stream)
{
    pthread_mutex_lock(&tr_lock);
    if (pos >= nslots || !slots[pos].n) {
        pthread_mutex_unlock(&tr_lock);
        return;
    }
    uint64_t budget = tr_budget();
    uint64_t room = budget > tr_tab.dev_bytes ? budget - tr_tab.dev_bytes : 0;
    struct slot *s = &slots[pos];
    for (int i = 0; i < s->n; i++) {
        /* the allocation may have been freed or shrunk since warm-up: prefetch only what is
         * still managed memory */
        struct tr_alloc *a = tr_table_find(s->r[i].start);
        if (!a)
            continue;
        if (s->r[i].end > a->ptr + a->size)
            s->r[i].end = a->ptr + a->size;
        /* a prefetch moves whole pages (CUDA rounds its range out to the page size): the
         * window counts those, or what it moves exceeds what it holds */
        struct range pr = {s->r[i].start & ~(uintptr_t)(PAGE - 1), (s->r[i].end + PAGE - 1) & ~(uintptr_t)(PAGE - 1)};
        if (pr.start < a->ptr)
            pr.start = a->ptr;
        if (pr.end > a->ptr + a->size)
            pr.end = a->ptr + a->size;
        uint64_t len = pr.end - pr.start;
        if (len > room)
            continue; /* larger than all the room there is: the kernel reads it remotely */
        while (win_len && win_bytes + len > room)
            win_evict_one(stream);
        if (win_len == win_cap) {
            int cap = win_cap ? win_cap * 2 : 64;
            struct range *w = malloc((size_t)cap * sizeof *w);
            if (!w)
                break;
            for (int j = 0; j < win_len; j++)
                w[j] = win[(win_head + j) % (win_cap ? win_cap : 1)];
            free(win);
            win = w;
            win_head = 0;
            win_cap = cap;
        }
        win[(win_head + win_len) % win_cap] = pr;
        win_len++;
        win_bytes += len;
        tr_prefetch((void *)pr.start, len, TR_LOC_DEVICE, tr_s.device, stream);
        tr_count.prefetch_calls++;
        tr_count.prefetch_bytes += len;
    }
    pthread_mutex_unlock(&tr_lock);
}

/* ---- iteration detection from the kernel sequence ------------------------------
 * The launch sequence of a training loop repeats once the first iteration's lazy set-up
 * is over, but so does each transformer layer's: a period must hold over a window that
 * spans iteration edges. From 16384 launches on (the framework adapter, when present,
 * has reported a boundary by then), every 1024 launches (up to 2^18) look for the
 * smallest p >= 8 such that the last n/2 launches are p-periodic (one comparison of
 * prefix hashes per p), and accept it when the next check finds the same p.
 * The boundary phase is the launch after the longest host-side pause within a period,
 * where a training loop waits for data or for loss.item(). */
#define SEQ_CAP (1u << 18)
#define SEQ_START (1u << 14)
static uint64_t *hash;   /* prefix hashes */
static uint64_t *powk;
static double *when;
static uint32_t seq_n, candidate;
static const uint64_t K = 1000003ull;

static uint64_t seg(uint32_t a, uint32_t b) { return hash[b] - hash[a] * powk[b - a]; }

static uint32_t smallest_period(uint32_t n)
{
    uint32_t w = n / 2;
    for (uint32_t p = 8; 2 * p <= w; p++)
        if (seg(n - w, n - p) == seg(n - w + p, n))
            return p;
    return 0;
}

void tr_period_observe(const void *func)
{
    pthread_mutex_lock(&tr_lock);
    if (tr_count.period || tr_s.adapter || seq_n >= SEQ_CAP) {
        pthread_mutex_unlock(&tr_lock);
        return;
    }
    if (!hash) {
        hash = calloc(SEQ_CAP + 1, sizeof *hash);
        powk = calloc(SEQ_CAP + 1, sizeof *powk);
        when = calloc(SEQ_CAP, sizeof *when);
        if (!hash || !powk || !when) {
            seq_n = SEQ_CAP;
            pthread_mutex_unlock(&tr_lock);
            return;
        }
        powk[0] = 1;
    }
    uint64_t v = (uint64_t)(uintptr_t)func * 0x9e3779b97f4a7c15ull + 1;
    hash[seq_n + 1] = hash[seq_n] * K + v;
    powk[seq_n + 1] = powk[seq_n] * K;
    when[seq_n] = tr_now_ms();
    seq_n++;
    if (seq_n >= SEQ_START && seq_n % 1024 == 0) {
        uint32_t n = seq_n, p = smallest_period(n);
        if (p && p == candidate) {
            /* phase: the launch after the longest pause, over the last two periods */
            uint32_t best = n - p;
            double gap = -1;
            for (uint32_t i = n - 2 * p + 1; i < n; i++)
                if (when[i] - when[i - 1] > gap) {
                    gap = when[i] - when[i - 1];
                    best = i;
                }
            uint64_t launches = atomic_load(&tr_count.launches);
            uint64_t next = best; /* sequence index i is launch number i */
            while (next + p <= launches)
                next += p;
            tr_count.period = p;
            tr_s.boundary_launch = next > p ? next - p : 0;
            tr_log(TR_INFO, "iteration detected: %u kernel launches repeat", p);
        }
        candidate = p;
    }
    pthread_mutex_unlock(&tr_lock);
}

#ifdef TRANSIT_TESTING
/* Test hooks (built only with -DTRANSIT_TESTING): load a replay table without CUPTI. */
EXPORT void transit_test_replay_add(uint64_t pos, uintptr_t addr, uint64_t bytes)
{
    /* like every exported entry: the configuration first. Without it the first CUDA call
     * loaded it after the table was settled, and prefetch's warm-up deferral (host data left
     * unadvised) came back with the table ready: a touch then migrated host data past the
     * budget, which the stress test took for a race */
    tr_init_once();
    pthread_mutex_lock(&tr_lock);
    tr_replay_add(pos, addr, bytes);
    pthread_mutex_unlock(&tr_lock);
}

EXPORT void transit_test_replay_finish(void)
{
    tr_init_once();
    pthread_mutex_lock(&tr_lock);
    tr_replay_finish();
    if (tr_s.replay_ready)
        tr_place_settle();
    pthread_mutex_unlock(&tr_lock);
}
#endif
