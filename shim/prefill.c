/* The pinned optimizer state made ready before the first step (transit_state_segments, API
 * version 8).
 *
 * Pinned state (hoststate.c) is made during the first optimizer step: its pages written, then
 * registered with the runtime. The runtime refuses a copy that spans two registrations
 * (bench/RESULTS.md, "Registering the pool in pieces"), so each of PyTorch's segments needs a
 * registration of its own, and only its size says which. The adapter predicts, before the
 * first forward, the segments the first step's state will be allocated in: their sizes in the
 * order they will be made (transit_state_pool.allocator_segments, from the caching allocator's
 * rules). One pool is mapped (huge pages, as hoststate.c maps) with a region for each, in that
 * order, and two background threads make regions ready from the last region back (the budget
 * keeps on the GPU what fits first, so the state made last is the state pinned): one has each
 * region's pages written by 8 writers, the other registers each region written, so that the
 * next region is written while one registers (bench/RESULTS.md, "The fill's writes and
 * registrations in a pipeline"). Until a region is taken the writer makes none that the
 * budget would keep on the device were the state made now (hoststate.c's rule; that room only
 * shrinks as the step's activations grow): it waits for the room to go. A marked allocation
 * takes a region of its exact size: a ready one; else one written (hoststate.c only registers
 * it); else one being written or registered (it waits); else one nobody began (hoststate.c
 * writes and registers it, as its own memory); with none it makes its own memory. A wrong
 * prediction costs only the time it would have saved. Once a region is taken the fill works only above
 * the lowest region taken (below it lies what the GPU kept). The pool takes at most half the
 * host memory available (host_room), its last regions first. When the adapter says the first
 * step is over (an empty list), and at exit, the fill stops; what no allocation took is given
 * back: unregistered where ready, unmapped. Once per process; every failure leaves
 * hoststate.c's own path. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "transit.h"
#include "transit_rules.h"

/* The background fill's writers at most: with 8 threads writing pages the training thread's
 * small kernel launches kept their latency, with 16 they did not (bench/RESULTS.md, "Pinning
 * with huge pages"); one core is left to the training thread. */
#define PREFILL_THREADS 8
#define MAX_SEGMENTS (1 << 20) /* a longer list is not the adapter's: no pool */

/* FREE -> WRITING -> WRITTEN -> REGISTERING -> READY, each -> TAKEN but WRITING and REGISTERING;
 * GONE: its registration failed, unmapped */
enum { R_FREE, R_WRITING, R_WRITTEN, R_REGISTERING, R_READY, R_TAKEN, R_GONE };

struct region { size_t at, len; int st; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t moved = PTHREAD_COND_INITIALIZER; /* a region was made (or failed), or the fill ended */
static struct {
    int tried;            /* a list came: once per process */
    int ending;           /* tr_prefill_end is releasing it */
    char *base;           /* the pool's mapping [base, base + size); NULL: none (any more) */
    size_t size;
    struct region *reg;   /* in the predicted order, laid out from base */
    int n;
    int floor;            /* the lowest region taken; -1: none yet */
    size_t ready;         /* bytes of regions made ready by the fill so far */
    int device;           /* the expecting thread's device: the fill registers there */
    double since;         /* tr_now_ms() at the list */
    int stop, running;    /* running: the fill's threads still at work (each counts itself out) */
    int written_all;      /* the writer has begun every region it will (or stopped) */
    int holding;          /* the writer waits: the budget would keep its next region on the device */
    unsigned asked, held_for; /* a test's settle asks anew (asked); held_for: the ask the hold answers */
    size_t before;        /* the bytes of the segments the host's room left out, before the first region */
    pthread_t tid, reg_tid;
    pid_t pid;            /* the process that made it (a forked child has no fill thread) */
} pool = {.floor = -1};

#ifdef TRANSIT_TESTING
static int gate; /* transit_test_prefill_gate: GATE_WRITER, GATE_REGISTRAR: that thread begins nothing */
enum { GATE_WRITER = 1, GATE_REGISTRAR = 2 };
#define GATE_WAIT(who) while ((gate & (who)) && !pool.stop) pthread_cond_wait(&moved, &mu)
#else
#define GATE_WAIT(who) ((void)0)
#endif

static int writers(void)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus - 1 < 1 ? 1 : (cpus - 1 < PREFILL_THREADS ? (int)(cpus - 1) : PREFILL_THREADS);
}

static void say_failed(const char *what, int err)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
        tr_log(TR_WARN, "%s for the optimizer state's pool failed (error %d): the state's pages are "
                        "written and registered when it is made", what, err);
}

/* The last region in state st above the lowest one taken; -1: none. Under mu. */
static int last_region(int st)
{
    for (int i = pool.n - 1; i > pool.floor; i--)
        if (pool.reg[i].st == st)
            return i;
    return -1;
}

static void counted_out(void)
{
    pool.running--;
    pthread_cond_broadcast(&moved);
}

/* Until the first region is taken: whether the budget would keep region j on the device were
 * the state made now (it lies within the first tr_hoststate_kept_now bytes). Under mu, which
 * it leaves for tr_lock's sake (the two are never held together). */
static int kept_on_device(int j)
{
    if (pool.floor >= 0)
        return 0;
    size_t end = pool.before + pool.reg[j].at + pool.reg[j].len;
    pthread_mutex_unlock(&mu);
    uint64_t kept = tr_hoststate_kept_now();
    pthread_mutex_lock(&mu);
    return end <= kept;
}

/* The writer: each region's pages, from the last back; a region the budget would keep on the
 * device is made only once the step's activations leave it no room (checked every HOLD_MS). */
#define HOLD_MS 10
static void *write_pool(void *arg)
{
    (void)arg;
    int k = writers();
    pthread_mutex_lock(&mu);
    int j;
    GATE_WAIT(GATE_WRITER);
    while (!pool.stop && (j = last_region(R_FREE)) >= 0) {
        unsigned asked = pool.asked;
        if (kept_on_device(j)) {
            pool.holding = 1;
            pool.held_for = asked;
            pthread_cond_broadcast(&moved); /* (a test's settle) */
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += HOLD_MS * 1000000L;
            until.tv_sec += until.tv_nsec / 1000000000L;
            until.tv_nsec %= 1000000000L;
            if (!pool.stop)
                pthread_cond_timedwait(&moved, &mu, &until);
            pool.holding = 0;
            continue;
        }
        if (pool.stop || pool.reg[j].st != R_FREE || j <= pool.floor)
            continue; /* taken while it asked (or the fill was stopped) */
        struct region *r = &pool.reg[j];
        r->st = R_WRITING;
        pthread_mutex_unlock(&mu);
        tr_host_fill(pool.base + r->at, r->len, k);
        pthread_mutex_lock(&mu);
        r->st = R_WRITTEN;
        pthread_cond_broadcast(&moved);
        GATE_WAIT(GATE_WRITER);
    }
    pool.written_all = 1;
    counted_out();
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* The registrar: each written region registered, from the last back, on the job's device. */
static void *register_pool(void *arg)
{
    (void)arg;
    if (tr_real.set_device)
        tr_real.set_device(pool.device); /* this thread's registrations in the job's own context */
    pthread_mutex_lock(&mu);
    for (;;) {
        GATE_WAIT(GATE_REGISTRAR);
        int j = pool.stop ? -1 : last_region(R_WRITTEN);
        if (j < 0) {
            if (pool.stop || (pool.written_all && last_region(R_WRITING) < 0))
                break;
            pthread_cond_wait(&moved, &mu);
            continue;
        }
        struct region *r = &pool.reg[j];
        r->st = R_REGISTERING;
        char *p = pool.base + r->at;
        size_t len = r->len;
        pthread_mutex_unlock(&mu);
        double t0 = tr_now_ms();
        cudaError_t err = tr_real.host_register(p, len, cudaHostRegisterPortable | cudaHostRegisterMapped);
        double took = tr_now_ms() - t0;
        if (err != cudaSuccess) {
            if (tr_real.get_last_error)
                tr_real.get_last_error(); /* this thread's own error: nobody else reads it */
            munmap(p, len);
            say_failed("cudaHostRegister", (int)err);
        }
        pthread_mutex_lock(&tr_lock);
        tr_count.host_state_prefill_register_ms += took;
        pthread_mutex_unlock(&tr_lock);
        pthread_mutex_lock(&mu);
        r->st = err == cudaSuccess ? R_READY : R_GONE;
        if (err == cudaSuccess)
            pool.ready += len;
        else
            pool.stop = 1; /* the host pins no more: the writer stops, the allocations try their own */
        pthread_cond_broadcast(&moved);
    }
    counted_out();
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* What the pool may take: half the host memory available now (MemAvailable), shared by the
 * node's ranks (LOCAL_WORLD_SIZE, torchrun's; else 1). Regions made but not taken hold pinned
 * memory until the first step ends, so the pool must never take memory the job needs; 0 when
 * the kernel's account cannot be read. */
static size_t host_room(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[128];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f) && sscanf(line, "MemAvailable: %llu kB", &kb) != 1)
        ;
    fclose(f);
    const char *r = getenv("LOCAL_WORLD_SIZE");
    long ranks = r ? strtol(r, NULL, 10) : 1;
    if (ranks < 1)
        ranks = 1;
    return (size_t)(kb * 1024ull / 2 / (unsigned long long)ranks);
}

static size_t huge_round(size_t n) { return (n + TR_HUGE_PAGE - 1) & ~(size_t)(TR_HUGE_PAGE - 1); }

void tr_prefill_segments(const size_t *sizes, size_t count)
{
    if (!count) {
        tr_prefill_end();
        return;
    }
    /* as tr_hoststate_wanted: only where marked state can be pinned (the runtime loaded) */
    if (!(tr_cfg.policy == TR_ADVISE && tr_cfg.host_state && tr_s.runtime_ready && tr_real.host_register &&
          tr_real.host_unregister) || !sizes || count > MAX_SEGMENTS)
        return;
    pthread_mutex_lock(&mu);
    int first = !pool.tried;
    pool.tried = 1;
    pthread_mutex_unlock(&mu);
    if (!first)
        return;
    /* the last regions that fit the host's room; a size of 0 or one that overflows: no pool */
    size_t room = host_room(), total = 0, from = count;
    while (from > 0) {
        size_t len = huge_round(sizes[from - 1]);
        if (!sizes[from - 1] || len < sizes[from - 1])
            return;
        if (len > room - total) /* total <= room */
            break;
        total += len;
        from--;
    }
    if (from)
        tr_log(TR_DEBUG, "optimizer state's pool: %zu segments expected, the last %zu of them taken (half the "
                         "host's available memory, per rank)", count, count - from);
    if (!total)
        return;
    struct region *reg = calloc(count - from, sizeof *reg);
    if (!reg) {
        say_failed("malloc", 0);
        return;
    }
    size_t at = 0;
    size_t before = 0;
    for (size_t i = 0; i < from; i++)
        before += sizes[i];
    for (size_t i = from; i < count; i++) {
        reg[i - from] = (struct region){at, huge_round(sizes[i]), R_FREE};
        at += reg[i - from].len;
    }
    size_t size;
    char *p = tr_host_map(total, &size); /* whole huge pages: every region is */
    if (!p) {
        free(reg);
        say_failed("mmap", 0);
        return;
    }
    int dev = 0;
    if (tr_real.get_device && tr_real.get_device(&dev) != cudaSuccess)
        dev = 0;
    sigset_t all, old; /* the fill's threads take none of the application's signals */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_mutex_lock(&mu);
    pool.base = p;
    pool.size = size;
    pool.reg = reg;
    pool.n = (int)(count - from);
    pool.device = dev;
    pool.before = before;
    pool.pid = getpid();
    pool.since = tr_now_ms();
    int err = pthread_create(&pool.reg_tid, NULL, register_pool, NULL);
    if (!err && (err = pthread_create(&pool.tid, NULL, write_pool, NULL))) {
        pool.stop = 1; /* the registrar ends at once: nothing is written */
        pthread_cond_broadcast(&moved);
        pthread_mutex_unlock(&mu);
        pthread_join(pool.reg_tid, NULL);
        pthread_mutex_lock(&mu);
    }
    if (err) {
        pool.base = NULL;
        pool.running = 0;
    } else {
        pool.running = 2;
    }
    pthread_mutex_unlock(&mu);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        munmap(p, size);
        say_failed("pthread_create", err);
        return;
    }
    pthread_mutex_lock(&tr_lock);
    tr_count.host_state_prefill = size;
    pthread_mutex_unlock(&tr_lock);
    tr_log(TR_DEBUG, "optimizer state's pool %p (%zu bytes, %d segments) filling", (void *)p, size, pool.n);
}

/* How good a region is for an allocation: ready, written (the allocation registers it), being
 * written or registered (it waits: the fill's threads are on it), nobody began it; 4: none. */
static int rank_of(int st)
{
    switch (st) {
    case R_READY: return 0;
    case R_WRITTEN: return 1;
    case R_WRITING: case R_REGISTERING: return 2;
    case R_FREE: return 3;
    default: return 4;
    }
}

/* The region of exactly round_up(size) bytes best for this allocation (rank_of), or -1; the
 * first of its rank in the list. Under mu. */
static int best_region(size_t len)
{
    int pick = -1, rank = 4;
    for (int i = 0; i < pool.n && rank; i++) {
        struct region *r = &pool.reg[i];
        int k = r->len != len ? 4 : rank_of(r->st);
        if (k < rank) {
            rank = k;
            pick = i;
        }
    }
    return pick;
}

/* A region of the pool for an allocation of size bytes; *ready says what the fill did of it:
 * TR_PREFILL_READY (written and registered), TR_PREFILL_WRITTEN (the caller registers it), 0
 * (the caller writes its pages and registers it). NULL when there is no pool or no region of
 * that size is left. */
void *tr_prefill_take(size_t size, size_t *len, int *ready)
{
    size_t l = tr_host_round(size);
    if (!size || l < size)
        return NULL;
    pthread_mutex_lock(&mu);
    if (!pool.base || pool.pid != getpid()) {
        pthread_mutex_unlock(&mu);
        return NULL;
    }
    int first = pool.floor < 0;
    size_t ahead = pool.ready;
    double lead = tr_now_ms() - pool.since, t0 = tr_now_ms();
    int i;
    while ((i = best_region(l)) >= 0 && rank_of(pool.reg[i].st) == 2)
        pthread_cond_wait(&moved, &mu); /* made in a moment: the fill writes it in order */
    if (i < 0) {
        pthread_mutex_unlock(&mu);
        return NULL;
    }
    struct region *r = &pool.reg[i];
    *ready = r->st == R_READY ? TR_PREFILL_READY : r->st == R_WRITTEN ? TR_PREFILL_WRITTEN : 0;
    r->st = R_TAKEN;
    if (pool.floor < 0 || i < pool.floor)
        pool.floor = i;
    char *p = pool.base + r->at;
    pthread_mutex_unlock(&mu);
    double waited = tr_now_ms() - t0;
    pthread_mutex_lock(&tr_lock); /* (after mu: the two are never held together) */
    tr_count.host_state_prefill_wait_ms += waited;
    if (*ready == TR_PREFILL_READY)
        tr_count.host_state_prefill_ready += l;
    if (first) {
        tr_count.host_state_prefill_ahead = ahead;
        tr_count.host_state_prefill_lead_ms = lead;
    }
    pthread_mutex_unlock(&tr_lock);
    *len = l;
    return p;
}

/* The fill stopped and joined; what no allocation took given back. At exit (at_exit) the
 * runtime may already be going: the ready regions are then only unmapped, not unregistered. */
static void end_pool(int at_exit)
{
    pthread_mutex_lock(&mu);
    int mine = pool.base && !pool.ending && pool.pid == getpid();
    if (mine) {
        pool.ending = 1;
        pool.stop = 1;
        pthread_cond_broadcast(&moved); /* (a test's closed gate) */
    }
    pthread_mutex_unlock(&mu);
    if (!mine)
        return;
    pthread_join(pool.tid, NULL);
    pthread_join(pool.reg_tid, NULL);
    pthread_mutex_lock(&mu);
    char *base = pool.base;
    struct region *reg = pool.reg;
    int n = pool.n;
    pool.base = NULL; /* no allocation takes a region after this */
    pool.reg = NULL;
    pool.n = 0;
    pthread_mutex_unlock(&mu);
    double t0 = tr_now_ms();
    size_t unused = 0, left = 0;
    for (int i = 0; i < n; i++) {
        if (reg[i].st == R_READY) {
            if (!at_exit) {
                cudaError_t pending = tr_pending_error();
                tr_own_error(pending, tr_real.host_unregister(base + reg[i].at));
            }
            unused += reg[i].len;
        }
        if (reg[i].st == R_READY || reg[i].st == R_WRITTEN || reg[i].st == R_FREE) {
            munmap(base + reg[i].at, reg[i].len);
            left += reg[i].len;
        }
    }
    free(reg);
    pthread_mutex_lock(&tr_lock);
    tr_count.host_state_prefill_unused = unused;
    tr_count.host_state_prefill_release_ms = tr_now_ms() - t0;
    pthread_mutex_unlock(&tr_lock);
    tr_log(TR_DEBUG, "optimizer state's pool: %zu bytes not taken (%zu of them made ready), given back", left, unused);
}

void tr_prefill_end(void) { end_pool(0); }
void tr_prefill_exit(void) { end_pool(1); }

#ifdef TRANSIT_TESTING
/* Test hook (built only with -DTRANSIT_TESTING): returns once the fill has ended, having made
 * every region it would (or stopped); what it did is then the kernel's and the runtime's to tell.
 * With the registrar's gate closed: once the writer has ended; with the writer holding a region the
 * budget would keep: once the rest is made. */
EXPORT void transit_test_prefill_settle(void)
{
    pthread_mutex_lock(&mu);
    unsigned ask = ++pool.asked; /* a hold counts once the writer has looked again since this call */
    pthread_cond_broadcast(&moved);
    for (;;) {
        int busy = 0; /* a region in the threads' hands, or one the open registrar has yet to take */
        for (int i = 0; i < pool.n; i++)
            busy |= pool.reg[i].st == R_WRITING || pool.reg[i].st == R_REGISTERING ||
                    (pool.reg[i].st == R_WRITTEN && !(gate & GATE_REGISTRAR));
        if (!pool.running || ((pool.written_all || (pool.holding && pool.held_for == ask)) && !busy))
            break;
        pthread_cond_wait(&moved, &mu);
    }
    pthread_mutex_unlock(&mu);
}

/* Test hook: closed before the list (GATE_WRITER, 1: the fill begins no region; GATE_REGISTRAR,
 * 2: it registers none) until it is opened (0), so that a test makes its allocations first. */
EXPORT void transit_test_prefill_gate(int closed)
{
    pthread_mutex_lock(&mu);
    gate = closed;
    pthread_cond_broadcast(&moved);
    pthread_mutex_unlock(&mu);
}
#endif
