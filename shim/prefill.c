/* The pinned optimizer state's pages written before the first step (transit_state_expect,
 * API version 7).
 *
 * Pinned state (hoststate.c) is made during the first optimizer step, and writing its pages
 * is most of that time. The adapter says, before the first forward, how much state that
 * step will make: one pool of that size is mapped as hoststate.c maps an allocation (huge
 * pages) and one background thread writes its pages in order, a piece at a time, while the
 * forward and backward leave the host's CPUs idle. A marked allocation then takes the next
 * slice of the pool, waits until the fill has passed the slice's end, and only registers it
 * (hoststate.c); where the pool has no room it makes its own memory as before. When the
 * adapter says the first step is over (expect(0)), and at exit, the fill stops and the part
 * no slice took is unmapped. The pool takes at most half the host memory available when it
 * is asked for, shared by the node's ranks (host_room). Once per process; every failure leaves
 * hoststate.c's own path.
 *
 * A slice waits for the background fill rather than writing its pages itself: the fill
 * writes in order, so the slice's pages are next or nearly, and a second writer would only
 * share the same cores; nor may two writers overlap, since a slice may be freed (unmapped)
 * under the other. The allocating thread writes only what a fill that stopped left.
 * From the first slice on, the state is being made: the fill then writes at most
 * TR_PREFILL_AHEAD_BYTES past the slices taken, so that the next slices' pages are written
 * while one registers, but the part no slice will take (where the budget keeps state on the
 * GPU) is not written beside the registrations, which writing slows (RESULTS.md, "The pinned
 * state's pool kept near the slices"). */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "transit.h"
#include "transit_rules.h"

/* The background fill's writers at most: with 8 threads writing pages the training thread's
 * small kernel launches kept their latency, with 16 they did not (bench/RESULTS.md, "Pinning
 * with huge pages"); one core is left to the training thread. */
#define PREFILL_THREADS 8
#define PREFILL_PIECE (64ull << 20) /* the fill says how far it is after each; a stop waits for one */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t moved = PTHREAD_COND_INITIALIZER; /* filled grew, or the fill ended */
static pthread_cond_t wanted = PTHREAD_COND_INITIALIZER; /* a slice was taken, or stop */
static struct {
    int tried;            /* an expect(bytes > 0) came: once per process */
    int ending;           /* tr_prefill_end is releasing it */
    char *base;           /* the pool's mapping [base, base + size); NULL: none (any more) */
    size_t size, cursor;  /* [base, base + cursor) taken by slices */
    size_t filled;        /* [base, base + filled) written */
    int demand;           /* a slice was taken: the fill keeps to TR_PREFILL_AHEAD_BYTES past cursor */
    int waiting;          /* the fill waits for the next slice (at its bound) */
    double since;         /* tr_now_ms() at the expectation */
    int stop, running;    /* running: the fill thread writes (it clears it when it ends) */
    pthread_t tid;
    pid_t pid;            /* the process that made it (a forked child has no fill thread) */
} pool;

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
                        "written when it is made", what, err);
}

static void *fill_pool(void *arg)
{
    (void)arg;
    int k = writers();
    pthread_mutex_lock(&mu);
    while (!pool.stop && pool.filled < pool.size) {
        size_t end = pool.size;
        if (pool.demand && pool.size - pool.cursor > TR_PREFILL_AHEAD_BYTES)
            end = pool.cursor + TR_PREFILL_AHEAD_BYTES;
        if (pool.filled >= end) { /* far enough ahead of the slices: wait for the next */
            pool.waiting = 1;
            pthread_cond_broadcast(&moved);
            pthread_cond_wait(&wanted, &mu);
            pool.waiting = 0;
            continue;
        }
        size_t at = pool.filled, len = end - at < PREFILL_PIECE ? end - at : PREFILL_PIECE;
        char *p = pool.base + at;
        pthread_mutex_unlock(&mu);
        tr_host_fill(p, len, k);
        pthread_mutex_lock(&mu);
        pool.filled = at + len;
        pthread_cond_broadcast(&moved);
    }
    pool.running = 0;
    pthread_cond_broadcast(&moved);
    pthread_mutex_unlock(&mu);
    return NULL;
}

/* What the pool may take: half the host memory available now (MemAvailable), shared by the
 * node's ranks (LOCAL_WORLD_SIZE, torchrun's; else 1). The pool is written whole, also where
 * the budget later pins less of it, so writing it must never take memory the job needs; 0
 * when the kernel's account cannot be read. */
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

void tr_prefill_expect(size_t bytes)
{
    if (!bytes) {
        tr_prefill_end();
        return;
    }
    /* as tr_hoststate_wanted: only where marked state can be pinned (the runtime loaded) */
    if (!(tr_cfg.policy == TR_ADVISE && tr_cfg.host_state && tr_s.runtime_ready && tr_real.host_register &&
          tr_real.host_unregister) || bytes > SIZE_MAX - TR_HUGE_PAGE)
        return;
    pthread_mutex_lock(&mu);
    int first = !pool.tried;
    pool.tried = 1;
    pthread_mutex_unlock(&mu);
    if (!first)
        return;
    size_t room = host_room();
    if (bytes > room) {
        tr_log(TR_DEBUG, "optimizer state's pool: %zu bytes expected, %zu of them taken (half the host's "
                         "available memory, per rank)", bytes, room);
        bytes = room;
    }
    if (bytes < TR_HUGE_PAGE)
        return;
    size_t size;
    char *p = tr_host_map(bytes, &size); /* whole huge pages: bytes is at least one */
    if (!p) {
        say_failed("mmap", 0);
        return;
    }
    sigset_t all, old; /* the fill's threads take none of the application's signals */
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_mutex_lock(&mu);
    pool.base = p;
    pool.size = size;
    pool.running = 1;
    pool.pid = getpid();
    pool.since = tr_now_ms();
    int err = pthread_create(&pool.tid, NULL, fill_pool, NULL);
    if (err) {
        pool.base = NULL;
        pool.running = 0;
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
    tr_log(TR_DEBUG, "optimizer state's pool %p (%zu bytes) filling", (void *)p, size);
}

/* The next round_up(size) bytes of the pool (from a huge page's boundary when size is one or
 * more), every page written; NULL when there is no pool or it has no room. */
void *tr_prefill_take(size_t size, size_t *len)
{
    size_t l = tr_host_round(size);
    if (!size || l < size)
        return NULL;
    pthread_mutex_lock(&mu);
    size_t from = pool.cursor, at = size >= TR_HUGE_PAGE ? (from + TR_HUGE_PAGE - 1) & ~(size_t)(TR_HUGE_PAGE - 1) : from;
    char *base = pool.base;
    if (!base || pool.pid != getpid() || at > pool.size || pool.size - at < l) {
        pthread_mutex_unlock(&mu);
        return NULL;
    }
    pool.cursor = at + l;
    int first = !pool.demand; /* the first slice: how far the fill got before the state was made */
    size_t ahead = pool.filled;
    double lead = tr_now_ms() - pool.since;
    pool.demand = 1;
    pthread_cond_signal(&wanted);
    double t0 = tr_now_ms();
    while (pool.running && pool.filled < at + l)
        pthread_cond_wait(&moved, &mu);
    size_t filled = pool.filled;
    pthread_mutex_unlock(&mu);
    double waited = tr_now_ms() - t0;
    /* the fill has passed the slice, or stopped (no other writer now): what it left is written here */
    if (filled < at + l) {
        size_t a = filled > at ? filled : at;
        tr_host_fill(base + a, at + l - a, (int)sysconf(_SC_NPROCESSORS_ONLN));
    }
    if (at > from) /* skipped to a huge page's boundary: no slice's, and no writer's any more */
        munmap(base + from, at - from);
    pthread_mutex_lock(&tr_lock); /* (after mu: the two are never held together) */
    tr_count.host_state_prefill_wait_ms += waited;
    if (first) {
        tr_count.host_state_prefill_ahead = ahead;
        tr_count.host_state_prefill_lead_ms = lead;
    }
    pthread_mutex_unlock(&tr_lock);
    *len = l;
    return base + at;
}

void tr_prefill_end(void)
{
    pthread_mutex_lock(&mu);
    int mine = pool.base && !pool.ending && pool.pid == getpid();
    if (mine) {
        pool.ending = 1;
        pool.stop = 1;
        pthread_cond_signal(&wanted); /* a fill waiting for a slice ends now */
    }
    pthread_mutex_unlock(&mu);
    if (!mine)
        return;
    pthread_join(pool.tid, NULL);
    pthread_mutex_lock(&mu);
    char *rest = pool.base + pool.cursor;
    size_t left = pool.size - pool.cursor;
    pool.base = NULL; /* no slice after this */
    pthread_mutex_unlock(&mu);
    if (left)
        munmap(rest, left);
    tr_log(TR_DEBUG, "optimizer state's pool: %zu bytes not taken, unmapped", left);
}

#ifdef TRANSIT_TESTING
/* Test hook (built only with -DTRANSIT_TESTING): returns once the fill has stopped writing,
 * waiting at its bound past the slices or ended; what it wrote is then the kernel's to tell. */
EXPORT void transit_test_prefill_settle(void)
{
    pthread_mutex_lock(&mu);
    while (pool.running && !pool.waiting)
        pthread_cond_wait(&moved, &mu);
    pthread_mutex_unlock(&mu);
}
#endif
