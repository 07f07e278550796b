/* Optimizer state born in pinned host memory (transit_state_alloc, API version 5).
 *
 * An allocation the adapter marks as optimizer state (its first step, on the calling thread)
 * that the budget cannot hold is made under advise as pinned host memory instead of managed
 * memory (tr_hoststate_wanted): anonymous memory whose pages up to 16 threads write first,
 * then registered with the runtime (mapped for the device at the same address, UVA): several
 * times faster than cudaHostAlloc, which pins
 * slowly in threads too (bench/LOG.md, "The optimizer state made in pinned host
 * memory"). An allocation of a huge page or more is mapped at a huge page's boundary and
 * advised MADV_HUGEPAGE (the kernel's default is 4 KiB pages for anonymous memory unless
 * advised): 512 times fewer faults to fill and pages to pin, the path's rate 2.4 times the
 * small pages' (LOG.md, "Pinning with huge pages"). Kernels read it zero-copy as advise's
 * host placement does, the copy engines move it at full speed, and nothing in the table (ranking,
 * replay) migrates it. The adapter marks the state only where its step streams the state
 * from host homes (TRANSIT_OVERLAP_STEP=stream, advise's default, or host, for what it
 * streams); the state the budget holds is stepped where it is. When the host
 * refuses the memory or its registration, the allocation takes the managed path.
 * Where the adapter predicted the state's segments (transit_state_segments, version 8), the
 * memory is a region of prefill.c's pool instead, mostly written and registered in the
 * background before the step; a region is given back as its own memory is.
 * TRANSIT_HOST_STATE=0 turns it off. The list is kept under tr_lock; the memory is made and
 * given back outside it. */
#define _GNU_SOURCE /* MAP_ANONYMOUS */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transit.h"
#include "transit_rules.h"

#define FILL_THREADS 16           /* the probe's count: pinning's cost is the page population */
#define FILL_SPLIT (64ull << 20)  /* smaller allocations are written by the calling thread alone */

static struct { uintptr_t ptr; size_t size, mapped; } *held;
static int n, cap;
static uint64_t bytes;

static _Thread_local int marked; /* the calling thread allocates optimizer state now */
static int began;               /* a marked allocation came (the state is being made); under tr_lock */

void tr_hoststate_mark(int on) { marked = on ? marked + 1 : (marked > 0 ? marked - 1 : 0); }

/* The room the budget leaves for state on the device now: the budget less the most the device
 * has held so far (the step's activations, made before the state), the adapter's staging ring,
 * and the share by which PyTorch's cache grows after the first step
 * (TR_STATE_ROOM_SPARE_PERCENT of the budget: state kept in that room pushed hot data to the
 * host). Under tr_lock. */
static uint64_t state_room(void)
{
    uint64_t buf = tr_devbuf_bytes(), peak = tr_count.dev_placed_peak > buf ? tr_count.dev_placed_peak - buf : 0;
    uint64_t room = tr_budget();
    uint64_t spare = tr_budget_total() / 100 * TR_STATE_ROOM_SPARE_PERCENT + (buf ? 0 : tr_cfg.ring_bytes);
    uint64_t placed = tr_tab.dev_bytes > peak ? tr_tab.dev_bytes : peak;
    room = room > spare ? room - spare : 0;
    return placed <= room ? room - placed : 0;
}

/* Whether this thread's allocation of size bytes is state that goes to pinned host memory:
 * marked, and more than state_room leaves. What fits stays managed on the device, where the
 * application's step reads it at full speed: only the overflow crosses PCIe. */
int tr_hoststate_wanted(size_t size)
{
    if (!(marked && tr_cfg.policy == TR_ADVISE && tr_cfg.host_state && tr_real.host_register &&
          tr_real.host_unregister))
        return 0;
    pthread_mutex_lock(&tr_lock);
    uint64_t room = state_room();
    if (!began) { /* the first state: the room it finds is the room all of it shares */
        began = 1;
        tr_count.host_state_first_room = room; /* (the rule's own, also reported) */
    }
    int fits = size <= room;
    if (fits)
        tr_count.host_state_kept += size;
    pthread_mutex_unlock(&tr_lock);
    return !fits;
}

/* The bytes of state that would stay on the device were it made now (tr_hoststate_wanted's
 * rule): prefill.c makes no region that lies within them. The device's peak only grows
 * through the step, so this only shrinks until the state is made; from then on it is the room
 * the first state found (the state kept since fills that room, it is not a sign of less). */
uint64_t tr_hoststate_kept_now(void)
{
    pthread_mutex_lock(&tr_lock);
    uint64_t kept = began ? tr_count.host_state_first_room : state_room();
    pthread_mutex_unlock(&tr_lock);
    return kept;
}

struct fill { char *p; size_t len; };

static void *fill_part(void *arg)
{
    struct fill *f = arg;
    memset(f->p, 0, f->len); /* writes allocate the pages (reads would map the shared zero page) */
    return NULL;
}

/* Every page of [p, p + len) given its memory, by up to `threads` threads (prefill.c's
 * background fill uses fewer than an allocation's own). */
void tr_host_fill(char *p, size_t len, int threads)
{
    int k = len < FILL_SPLIT || threads < 2 ? 1 : (threads < FILL_THREADS ? threads : FILL_THREADS);
    struct fill parts[FILL_THREADS];
    pthread_t tids[FILL_THREADS];
    int started[FILL_THREADS] = {0};
    size_t chunk = (len / (size_t)k + 4095) & ~(size_t)4095;
    for (int i = 0; i < k; i++) {
        size_t a = (size_t)i * chunk;
        parts[i] = (struct fill){p + a, a >= len ? 0 : (len - a < chunk ? len - a : chunk)};
        if (i > 0 && parts[i].len)
            started[i] = pthread_create(&tids[i], NULL, fill_part, &parts[i]) == 0;
    }
    fill_part(&parts[0]);
    for (int i = 1; i < k; i++) {
        if (started[i])
            pthread_join(tids[i], NULL);
        else if (parts[i].len) /* no thread: this one writes it */
            fill_part(&parts[i]);
    }
}

static void say_refused(size_t size, const char *what, int err)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
        tr_log(TR_WARN, "%s for %zu bytes of optimizer state failed (error %d): it is managed memory instead, "
                        "and so is any other such allocation that fails", what, size, err);
}

/* size bytes (rounded to pages; to huge pages from one huge page up) of anonymous memory, a
 * huge-page-sized mapping starting at a huge page's boundary and advised MADV_HUGEPAGE
 * (where the kernel has no transparent huge pages the advice fails and 4 KiB pages serve). */
void *tr_host_map(size_t size, size_t *mapped)
{
    int huge = size >= TR_HUGE_PAGE;
    size_t len = tr_host_round(size);
    size_t over = huge ? len + TR_HUGE_PAGE : len; /* room to move the start to a boundary */
    char *q = mmap(NULL, over, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (q == MAP_FAILED)
        return NULL;
    char *p = q;
    if (huge) {
        p = (char *)(((uintptr_t)q + TR_HUGE_PAGE - 1) & ~(uintptr_t)(TR_HUGE_PAGE - 1));
        if (p > q)
            munmap(q, (size_t)(p - q));
        if (q + over > p + len)
            munmap(p + len, (size_t)(q + over - (p + len)));
        (void)madvise(p, len, MADV_HUGEPAGE);
    }
    *mapped = len;
    return p;
}

/* A region of prefill.c's pool where it has one of this size, made ready (written and
 * registered) in the background, or written there and registered here, or else written and
 * registered here; else memory of its own,
 * written and registered here. Either is given back the same way: unregistered, then unmapped. */
void *tr_hoststate_alloc(size_t size)
{
    double t0 = tr_now_ms();
    size_t mapped;
    int ready = 0;
    void *p = tr_prefill_take(size, &mapped, &ready);
    size_t pooled = p ? mapped : 0;
    if (!p && !(p = tr_host_map(size, &mapped))) {
        say_refused(size, "mmap", 0);
        return NULL;
    }
    double registering = 0;
    if (ready != TR_PREFILL_READY) {
        if (ready != TR_PREFILL_WRITTEN)
            tr_host_fill(p, mapped, (int)sysconf(_SC_NPROCESSORS_ONLN)); /* (at most FILL_THREADS) */
        cudaError_t pending = tr_pending_error();
        double t1 = tr_now_ms();
        cudaError_t err = tr_real.host_register(p, mapped, cudaHostRegisterPortable | cudaHostRegisterMapped);
        registering = tr_now_ms() - t1;
        if (err != cudaSuccess) {
            tr_own_error(pending, err);
            munmap(p, mapped);
            say_refused(size, "cudaHostRegister", (int)err);
            return NULL;
        }
    }
    pthread_mutex_lock(&tr_lock);
    if (n == cap) {
        int c = cap ? cap * 2 : 64;
        void *g = realloc(held, (size_t)c * sizeof *held);
        if (!g) {
            pthread_mutex_unlock(&tr_lock);
            tr_real.host_unregister(p);
            munmap(p, mapped);
            return NULL;
        }
        held = g;
        cap = c;
    }
    held[n].ptr = (uintptr_t)p;
    held[n].size = size;
    held[n++].mapped = mapped;
    bytes += size;
    tr_count.host_state_allocs++;
    tr_count.host_state_prefill_used += pooled;
    tr_count.host_state_pin_ms += tr_now_ms() - t0;
    tr_count.host_state_register_ms += registering;
    if (bytes > tr_count.host_state_peak)
        tr_count.host_state_peak = bytes;
    pthread_mutex_unlock(&tr_lock);
    tr_log(TR_DEBUG, "optimizer state %p (%zu bytes) in pinned host memory", p, size);
    return p;
}

/* 1 when ptr is one of them (then unregistered and unmapped, the runtime's error in *err). */
int tr_hoststate_free(uintptr_t ptr, cudaError_t *err)
{
    size_t mapped = 0;
    pthread_mutex_lock(&tr_lock);
    for (int i = 0; i < n && !mapped; i++)
        if (held[i].ptr == ptr) {
            mapped = held[i].mapped;
            bytes -= held[i].size;
            held[i] = held[--n];
        }
    pthread_mutex_unlock(&tr_lock);
    if (!mapped)
        return 0;
    *err = tr_real.host_unregister((void *)ptr); /* waits for the device's work on it, as cudaFree would */
    munmap((void *)ptr, mapped);
    return 1;
}

/* 1 when [ptr, ptr + size) lies inside one of them; under tr_lock. */
int tr_hoststate_holds(uintptr_t ptr, size_t size)
{
    for (int i = 0; i < n; i++)
        if (ptr >= held[i].ptr && size <= held[i].size && ptr - held[i].ptr <= held[i].size - size)
            return 1;
    return 0;
}

/* Under tr_lock. */
uint64_t tr_hoststate_bytes(void) { return bytes; }
