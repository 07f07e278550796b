/* The pinned optimizer state made ready before the first step (transit_state_segments, API
 * version 8).
 *
 * Pinned state (hoststate.c) is made during the first optimizer step: its pages written, then
 * registered with the runtime. The runtime refuses a copy that spans two registrations
 * (bench/LOG.md, "Registering the pool in pieces"), so each of PyTorch's segments needs a
 * registration of its own, and only its size says which. The adapter predicts, before the
 * first forward, the segments the first step's state will be allocated in: their sizes in the
 * order they will be made (transit_state_pool.allocator_segments, from the caching allocator's
 * rules). One pool is mapped (huge pages, as hoststate.c maps) with a region for each, in that
 * order, and two background threads make regions ready from the last region back (the budget
 * keeps on the GPU what fits first, so the state made last is the state pinned): one has each
 * region's pages written by 8 writers, the other registers each region written, so that the
 * next region is written while one registers (bench/LOG.md, "The fill's writes and
 * registrations in a pipeline"). The writer makes no region that the budget would keep on the
 * device (hoststate.c's rule, under the room now until the state begins, then under the room
 * the first state found; the room only shrinks as the step's activations grow): it waits for
 * the room to go. A marked allocation
 * takes a region of its exact size: a ready one; else one written (hoststate.c only registers
 * it); else one being written or registered (it waits); else one nobody began (hoststate.c
 * writes and registers it, as its own memory); with none it makes its own memory. A wrong
 * prediction costs only the time it would have saved. Once a region is taken the fill works
 * only from the first taken allocation's place in the order on (below it lies what the GPU
 * kept), and makes of each size only as many regions as the rule pins (a state may have taken
 * a kept state's region of its size). The pool takes at most half the host memory available (host_room), its last regions
 * first. When the adapter says the first step is over (an empty list), and at exit (before the
 * runtime's own exit handler), the fill stops; what no allocation took is given back:
 * unregistered where ready (not at exit), unmapped. Once per process; every failure leaves hoststate.c's own
 * path. */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "transit.h"
#include "transit_rules.h"

/* The background fill's writers at most: with 8 threads writing pages the training thread's
 * small kernel launches kept their latency, with 16 they did not (bench/LOG.md, "Pinning
 * with huge pages"); one core is left to the training thread. */
#define PREFILL_THREADS 8 /* hoststate.c's FILL_THREADS caps it */
#define MAX_SEGMENTS (1 << 20) /* a longer list is not the adapter's: no pool */

/* FREE -> WRITING -> WRITTEN -> REGISTERING -> READY, each -> TAKEN but WRITING and REGISTERING;
 * GONE: its registration failed, unmapped */
enum { R_FREE, R_WRITING, R_WRITTEN, R_REGISTERING, R_READY, R_TAKEN, R_GONE };

/* size: the segment's own (len: in huge pages); cls: the first region of its len (an allocation
 * takes any of them); pinned, made: next_to_write's counts, kept in each class's first region */
struct region { size_t at, len, size; int st, cls, pinned, made, keeps; };

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t moved = PTHREAD_COND_INITIALIZER; /* a region was made (or failed), or the fill ended */
static pthread_cond_t looked;  /* the writer's hold: on CLOCK_MONOTONIC (init_looked), woken by a take or an end */
static struct {
    int tried;            /* a list came: once per process */
    int ended;            /* an end came (the pool, were it still being made, is not published) */
    int ending;           /* tr_prefill_end is releasing it */
    char *base;           /* the pool's mapping [base, base + size); NULL: none (any more) */
    size_t size;
    struct region *reg;   /* in the predicted order, laid out from base */
    int n;
    int taken;            /* an allocation took a region: the state is being made */
    int floor;            /* the fill makes only the regions above it (below lies the state the GPU kept) */
    size_t ready;         /* bytes of regions made ready by the fill so far */
    int device;           /* the expecting thread's device: the fill registers there */
    double since;         /* tr_now_ms() at the list */
    int stop, running;    /* running: the fill's threads still at work (each counts itself out) */
    int written_all;      /* the writer has begun every region it will (or stopped) */
    int holding;          /* the writer waits: the budget would keep its next region on the device */
    unsigned asked, held_for; /* a test's settle asks anew (asked); held_for: the ask the hold answers */
    size_t before;        /* the bytes of the segments the host's room left out, before the first region */
    unsigned hold_regions; /* regions made before any was taken, */
    uint64_t hold_room;    /* and the least room the hold made one under */
    pthread_t tid, reg_tid;
    pid_t pid;            /* the process that made it (a forked child has no fill thread) */
} pool = {.floor = -1};

static int looked_made; /* under mu after init_looked */

static void init_looked(void)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC); /* a wall clock stepped back must not lengthen a hold */
    pthread_cond_init(&looked, &a);
    pthread_condattr_destroy(&a);
    looked_made = 1;
}

static pthread_once_t looked_once = PTHREAD_ONCE_INIT;
static void make_looked(void) { pthread_once(&looked_once, init_looked); }

#ifdef TRANSIT_TESTING
/* transit_test_prefill_gate: GATE_WRITER, GATE_REGISTRAR: that thread begins nothing;
 * GATE_AFTER_ONE: the writer closes its gate after its next region */
static int gate;
enum { GATE_WRITER = 1, GATE_REGISTRAR = 2, GATE_AFTER_ONE = 4 };
#define GATE_WAIT(who) while ((gate & (who)) && !pool.stop) pthread_cond_wait(&moved, &mu)
/* TRANSIT_TEST_PREFILL_THREAD_FAIL=N: the fill's Nth pthread_create fails (1: the registrar's,
 * 2: the writer's), as one does where the process's thread limit is reached */
static int start_thread(pthread_t *t, void *(*fn)(void *))
{
    static int made;
    const char *f = getenv("TRANSIT_TEST_PREFILL_THREAD_FAIL");
    if (f && atoi(f) == ++made)
        return EAGAIN;
    return pthread_create(t, NULL, fn, NULL);
}
#else
#define GATE_WAIT(who) ((void)0)
#define start_thread(t, fn) pthread_create((t), NULL, (fn), NULL)
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

/* The region the writer makes next: the last one nobody began above the floor that the budget
 * would not keep on the device, while its size has fewer regions begun or taken than the rule
 * pins; -1: none (*held: the rest are kept, or their sizes have their count).
 * hoststate.c's rule decides, before the first take and after it: it keeps each allocation, in
 * order, that fits the room left beside the ones kept before it (tr_hoststate_wanted), here
 * over the predicted sizes (the segments the host's room left out counted as one) and the room
 * tr_hoststate_kept_now gives (from the first state on, the room it found). The floor alone
 * would not do after a take: a kept state takes no region, so the first pinned state's place
 * among same-size regions can lie below the kept ones'. Under mu, which it leaves for tr_lock's
 * sake (the two are never held together). */
static int next_to_write(int *held)
{
    *held = 0;
    pthread_mutex_unlock(&mu);
    uint64_t room = tr_hoststate_kept_now();
    pthread_mutex_lock(&mu);
    if (pool.stop)
        return -1;
    uint64_t kept = pool.before && pool.before <= room ? pool.before : 0;
    /* per class (one len): the regions the rule pins, and those begun or taken; a state may
     * take a region the rule gives a kept state (the first free one of its size), so a class
     * is made only up to the count the rule pins, from the last region it pins back */
    for (int i = 0; i < pool.n; i++)
        pool.reg[pool.reg[i].cls].pinned = pool.reg[pool.reg[i].cls].made = 0;
    for (int i = 0; i < pool.n; i++) {
        struct region *r = &pool.reg[i], *c = &pool.reg[r->cls];
        r->keeps = r->size <= room - kept;
        if (r->keeps)
            kept += r->size;
        else
            c->pinned++;
        c->made += r->st != R_FREE && r->st != R_GONE;
    }
    int pick = -1;
    for (int i = pool.n - 1; i > pool.floor && pick < 0; i--) {
        struct region *r = &pool.reg[i], *c = &pool.reg[r->cls];
        if (r->st != R_FREE)
            continue;
        if (!r->keeps && c->made < c->pinned)
            pick = i;
        else
            *held = 1;
    }
    if (pick >= 0 && !pool.taken && (!pool.hold_regions++ || room < pool.hold_room))
        pool.hold_room = room; /* (the stats: did the room the state found exceed it?) */
    return pick;
}

/* CLOCK_MONOTONIC's time us microseconds from now (looked's clock: a deadline for its waits). */
static struct timespec monotonic_in(long us)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += us / 1000000;
    t.tv_nsec += us % 1000000 * 1000L;
    t.tv_sec += t.tv_nsec / 1000000000L;
    t.tv_nsec %= 1000000000L;
    return t;
}

/* The writer: each region's pages, from the last back; a region the budget would keep on the
 * device is made only once the step's activations leave it no room, looked at every HOLD_MS
 * (from the first state on the room is fixed: only a take, which wakes it, changes the answer). */
#define HOLD_MS 10
static void *write_pool(void *arg)
{
    (void)arg;
    int k = writers();
    pthread_mutex_lock(&mu);
    GATE_WAIT(GATE_WRITER);
    while (!pool.stop) {
        unsigned asked = pool.asked;
        int held, j = next_to_write(&held);
        if (j < 0 && held && !pool.stop) {
            pool.holding = 1;
            pool.held_for = asked;
            pthread_cond_broadcast(&moved); /* (a test's settle) */
            struct timespec until = monotonic_in(HOLD_MS * 1000L);
            pthread_cond_timedwait(&looked, &mu, &until);
            pool.holding = 0;
            continue;
        }
        if (j < 0)
            break;
        struct region *r = &pool.reg[j];
        r->st = R_WRITING;
        pthread_mutex_unlock(&mu);
        tr_host_fill(pool.base + r->at, r->len, k);
        pthread_mutex_lock(&mu);
        r->st = R_WRITTEN;
        pthread_cond_broadcast(&moved);
#ifdef TRANSIT_TESTING
        if (gate & GATE_AFTER_ONE)
            gate = (gate & ~GATE_AFTER_ONE) | GATE_WRITER;
#endif
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
            if (pool.stop || pool.written_all) /* (the writer ends with no region in its hands) */
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

/* qsort_r's order: by len, then place */
static int by_len(const void *a, const void *b, void *arg)
{
    const struct region *reg = arg;
    int i = *(const int *)a, j = *(const int *)b;
    if (reg[i].len != reg[j].len)
        return reg[i].len < reg[j].len ? -1 : 1;
    return (i > j) - (i < j);
}

/* Each region's class: the first region of its len. -1: no memory. */
static int classify(struct region *reg, int n)
{
    int *idx = malloc((size_t)n * sizeof *idx);
    if (!idx)
        return -1;
    for (int i = 0; i < n; i++)
        idx[i] = i;
    qsort_r(idx, (size_t)n, sizeof *idx, by_len, reg);
    for (int k = 0; k < n; k++)
        reg[idx[k]].cls = k && reg[idx[k - 1]].len == reg[idx[k]].len ? reg[idx[k - 1]].cls : idx[k];
    free(idx);
    return 0;
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
    size_t at = 0, before = 0;
    for (size_t i = 0; i < from; i++)
        before = sizes[i] > SIZE_MAX - before ? SIZE_MAX : before + sizes[i]; /* (only compared) */
    for (size_t i = from; i < count; i++) {
        reg[i - from] = (struct region){.at = at, .len = huge_round(sizes[i]), .size = sizes[i], .st = R_FREE};
        at += reg[i - from].len;
    }
    int n = (int)(count - from);
    if (classify(reg, n) != 0) {
        free(reg);
        say_failed("malloc", 0);
        return;
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
    make_looked();
    /* Published and both threads started under mu: no allocation sees the pool until both run,
     * and where one cannot start the pool is withdrawn before anyone could take from it. */
    pthread_mutex_lock(&mu);
    int err = pool.ended ? -1 : 0, reg_started = 0; /* an end came while it was being made */
    if (!err) {
        pool.base = p;
        pool.size = size;
        pool.reg = reg;
        pool.n = n;
        pool.device = dev;
        pool.before = before;
        pool.pid = getpid();
        pool.since = tr_now_ms();
        pool.running = 2;
        reg_started = !(err = start_thread(&pool.reg_tid, register_pool));
        if (!err)
            err = start_thread(&pool.tid, write_pool);
        if (err) {
            pool.stop = 1; /* the registrar, if it runs, ends at once: it never touches the pool */
            pool.base = NULL;
            pool.reg = NULL;
            pool.n = 0;
            pool.running = reg_started;
            pthread_cond_broadcast(&moved);
        }
    }
    pthread_mutex_unlock(&mu);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err) {
        if (reg_started)
            pthread_join(pool.reg_tid, NULL);
        munmap(p, size);
        free(reg);
        if (err > 0)
            say_failed("pthread_create", err);
        return;
    }
    /* at exit the fill stops before the runtime's own exit handler, registered before this one,
     * tears the runtime down under the registrar (the shim's at_exit runs after the runtime's) */
    atexit(tr_prefill_exit);
    pthread_mutex_lock(&tr_lock);
    tr_count.host_state_prefill = size;
    pthread_mutex_unlock(&tr_lock);
    tr_log(TR_DEBUG, "optimizer state's pool %p (%zu bytes, %d segments) filling", (void *)p, size, n);
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
    int first = !pool.taken;
    size_t ahead = pool.ready;
    double lead = tr_now_ms() - pool.since, t0 = tr_now_ms();
    int i;
    while ((i = best_region(l)) >= 0 && rank_of(pool.reg[i].st) == 2)
        pthread_cond_wait(&moved, &mu); /* made in a moment: the fill writes it in order */
    if (i < 0) {
        pthread_mutex_unlock(&mu);
        return NULL;
    }
    /* This allocation's place in the predicted order is the first region of its size not taken
     * yet (regions of one size are interchangeable, and it may take a later one that is ready):
     * the fill keeps making what lies from there on, and nothing below the first such place,
     * where the state the GPU kept lies. */
    int slot = i;
    for (int k = 0; k < i; k++)
        if (pool.reg[k].len == l && pool.reg[k].st != R_TAKEN && pool.reg[k].st != R_GONE) {
            slot = k;
            break;
        }
    if (!pool.taken || slot - 1 < pool.floor)
        pool.floor = slot - 1;
    pool.taken = 1;
    struct region *r = &pool.reg[i];
    *ready = r->st == R_READY ? TR_PREFILL_READY : r->st == R_WRITTEN ? TR_PREFILL_WRITTEN : 0;
    r->st = R_TAKEN;
    char *p = pool.base + r->at;
    pthread_cond_broadcast(&looked); /* a holding writer: the room is fixed now, and a class may be full */
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
    pool.ended = 1; /* (a pool still being made is not published) */
    int mine = pool.base && !pool.ending && pool.pid == getpid();
    if (mine) {
        pool.ending = 1;
        pool.stop = 1;
        pthread_cond_broadcast(&moved); /* (a test's closed gate) */
        pthread_cond_broadcast(&looked);
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
    tr_count.host_state_prefill_hold_regions = pool.hold_regions; /* (the threads are joined: nobody writes them) */
    tr_count.host_state_prefill_hold_room = pool.hold_room;
    tr_count.host_state_prefill_release_ms = tr_now_ms() - t0;
    pthread_mutex_unlock(&tr_lock);
    tr_log(TR_DEBUG, "optimizer state's pool: %zu bytes not taken (%zu of them made ready), given back", left, unused);
}

void tr_prefill_end(void) { end_pool(0); }

/* fork: the child must not inherit mu held by a fill thread (it has none of them; pool.pid
 * keeps it from the pool). 0: before, 1: in the parent after, 2: in the child. */
void tr_prefill_fork(int when)
{
    if (when == 0) {
        pthread_mutex_lock(&mu);
    } else if (when == 1) {
        pthread_mutex_unlock(&mu);
    } else {
        pthread_mutex_init(&mu, NULL);
        pthread_cond_init(&moved, NULL);
        if (looked_made) {
            looked_made = 0;
            init_looked();
        }
    }
}
void tr_prefill_exit(void) { end_pool(1); }

#ifdef TRANSIT_TESTING
/* Test hook (built only with -DTRANSIT_TESTING): returns once the fill has ended, having made
 * every region it would (or stopped); what it did is then the kernel's and the runtime's to tell.
 * With the registrar's gate closed: once the writer has ended; with the writer holding a region the
 * budget would keep: once the rest is made. */
EXPORT void transit_test_prefill_settle(void)
{
    make_looked();
    pthread_mutex_lock(&mu);
    unsigned ask = ++pool.asked; /* a hold counts once the writer has looked again since this call */
    pthread_cond_broadcast(&moved);
    pthread_cond_broadcast(&looked);
    for (;;) {
        int busy = 0; /* a region in the threads' hands, or one the open registrar has yet to take */
        for (int i = 0; i < pool.n; i++)
            busy |= pool.reg[i].st == R_WRITING || pool.reg[i].st == R_REGISTERING ||
                    (pool.reg[i].st == R_WRITTEN && i > pool.floor && !(gate & GATE_REGISTRAR));
        int still = pool.written_all || (pool.holding && pool.held_for == ask) || (gate & GATE_WRITER);
        if (!pool.running || (still && !busy))
            break;
        pthread_cond_wait(&moved, &mu);
    }
    pthread_mutex_unlock(&mu);
}

/* Test hook: another thread holds mu for ms milliseconds, from before this returns (a fork
 * meanwhile finds it held, as it may find it held by a fill thread). */
static pthread_mutex_t held_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t held_cv = PTHREAD_COND_INITIALIZER;
static int held_now;

static void *hold_mu(void *arg)
{
    pthread_mutex_lock(&mu);
    pthread_mutex_lock(&held_mu);
    held_now = 1;
    pthread_cond_broadcast(&held_cv);
    pthread_mutex_unlock(&held_mu);
    struct timespec t = {0, (long)(intptr_t)arg * 1000000L};
    nanosleep(&t, NULL);
    pthread_mutex_unlock(&mu);
    return NULL;
}

EXPORT void transit_test_prefill_hold_lock(int ms)
{
    pthread_t t;
    held_now = 0;
    if (pthread_create(&t, NULL, hold_mu, (void *)(intptr_t)ms))
        return;
    pthread_detach(t);
    pthread_mutex_lock(&held_mu);
    while (!held_now)
        pthread_cond_wait(&held_cv, &held_mu);
    pthread_mutex_unlock(&held_mu);
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
