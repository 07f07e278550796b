/* A stand-in libcudart.so.13 for tests on machines without a GPU: it exports the runtime
 * entry points the shim uses, simulates a device of FAKE_GPU_MEM bytes with fake
 * addresses (never dereferenced), and appends every call to $FAKE_CUDART_LOG.
 * Knobs: FAKE_GPU_MEM, FAKE_HOST_MEM (managed bytes that fit, 2 TiB), FAKE_RUNTIME_VERSION
 * (13000), FAKE_NO_MANAGED=1, FAKE_MANAGED_FAIL=1 (cudaMallocManaged returns
 * cudaErrorNotSupported), FAKE_MANAGED_OOM_EVERY=N (every Nth cudaMallocManaged runs out
 * of memory), FAKE_PREFETCH_FAIL=1, FAKE_HOST_REGISTER_FAIL=1 (cudaHostRegister runs out of memory),
 * FAKE_CUDART_RESIDENCY=PATH (the residency account as JSON at exit; %p: the pid).
 *
 * Where each answer comes from. "probe": bench/probes/cuda_error_probe.c on the H200, its
 * 2026-11-30 cases (bench/results/2026-11-30/cuda_error_probe_2026-11-30.json) and those added by
 * issue 33 (cuda_error_probe_2026-12-01.json; the case's name follows); "gpu-lab":
 * the team's GPU lab notes, not in this repository (measured CUDA behaviour); "docs": CUDA 13's cuda_runtime_api.h, the header the shim
 * builds against; "ASSUMPTION": neither.
 *   cudaMalloc/cudaMallocManaged with a NULL devPtr: cudaErrorInvalidValue (probe)
 *   an allocation that does not fit: cudaErrorMemoryAllocation, *devPtr = NULL (probe)
 *   cudaFree of a pointer it did not allocate: cudaErrorInvalidValue (probe)
 *   a failure is the calling thread's last error until cudaGetLastError reads it;
 *     cudaPeekAtLastError leaves it (probe)
 *   cudaMalloc and cudaMallocManaged of 0 bytes: cudaSuccess with NULL (probe: malloc_zero,
 *     managed_zero; the docs say cudaErrorInvalidValue for managed, the H200 did not)
 *   advice or a prefetch over memory that is not one live managed allocation (device
 *     memory, host memory, a range past an allocation's end): cudaErrorInvalidValue
 *     (probe: advise_device, advise_host, prefetch_device, prefetch_host,
 *     prefetch_past_end; the H200 has no pageable memory access, attr_pageable 0)
 *   cudaMemGetInfo: free = total - cudaMalloc bytes - the managed pages that have been on
 *     the device since their allocation was made: a prefetch to the device takes their
 *     bytes, a prefetch back to the host does not return them, cudaFree does (probe:
 *     memgetinfo_managed_resident; the UVM driver keeps the chunks, bench/RESULTS.md);
 *     that the driver hands them back under pressure is not modelled (ASSUMPTION)
 *   managed memory and concurrent managed access supported (probe: attr_managed,
 *     attr_concurrent), runtime 13000 (the H200's CUDA 13, gpu-lab)
 *   cudaHostRegister of NULL or of 0 bytes: cudaErrorInvalidValue; of a range already
 *     registered: cudaErrorHostMemoryAlreadyRegistered; registering takes no device bytes
 *     in cudaMemGetInfo (probe, bench/results/2026-12-02/shapes/cuda_error_probe.json:
 *     host_register_null, host_register_zero, host_register_twice, host_register_free_before,
 *     host_register_free_after)
 *   cudaFree of registered memory: cudaErrorInvalidValue (probe: host_register_cudafree);
 *     cudaHostUnregister: cudaSuccess, then cudaErrorHostMemoryNotRegistered for the same
 *     pointer (probe: host_unregister, host_unregister_again)
 *   cudaHostRegister refused as out of memory when the host's memory would run short
 *     (FAKE_HOST_MEM less managed and registered bytes): ASSUMPTION (the probe cannot make
 *     the H200's host run short; the shim's answer to the refusal is what the tests check)
 *
 * Residency (issue 33): which 4 KiB page of every managed allocation is on the device,
 * on the host or nowhere yet, driven by prefetches, advice and the "kernels" the test
 * program launches (fake_touch.h), answered from this state alone (fake_cudart_residency,
 * and FAKE_CUDART_RESIDENCY at exit), never from what the shim says it placed:
 *   cudaMallocManaged populates nothing (docs, cudaMemPrefetchAsync: "If no physical
 *     memory has been allocated for this region, then this memory region will be
 *     populated and mapped on the destination device")
 *   a prefetch moves (or populates) its pages at the destination, whatever the advice
 *     (docs; both directions measured, gpu-lab's bandwidth table); ranges are rounded
 *     out to 4 KiB (docs); it completes at the call (ASSUMPTION: the fake has no time,
 *     the real one completes in stream order)
 *   advice moves nothing (docs, cudaMemAdviseSetPreferredLocation)
 *   a kernel's touch of a page on the host whose preferred location is the host maps it
 *     (zero-copy, no migration): docs ("If the data is already in its preferred location
 *     and the faulting processor can establish a mapping ... migration will be
 *     avoided"), measured with accessed-by set (gpu-lab: zero-copy read 51.2 GB/s; probe:
 *     touch_host_resident_preferred_host, a device-side cudaMemset took no device
 *     memory); without accessed-by the same (ASSUMPTION: that the H200 maps it then too)
 *   a kernel's touch of a page on the host with no preferred location (or the device's)
 *     migrates it to the device (docs; gpu-lab: fault-driven migration 12.2 GB/s; probe:
 *     touch_host_resident_no_advice, 256 MiB of device memory taken)
 *   a kernel's first touch of a page populated nowhere: on the host, mapped, when its
 *     preferred location is the host (probe: first_touch_preferred_host, with accessed-by
 *     set; without it, ASSUMPTION), else on the device (ASSUMPTION: first touch)
 *   the CPU's writes (fake_cudart_host_write: the fake's memory is not mapped, so a
 *     caller that would write managed memory from the CPU, such as the shim's populate.c
 *     in its test build, reports the range instead): pages populated nowhere are
 *     populated on the host, pages on the device migrate to the host (docs: a CPU access
 *     migrates without hardware coherence, which the H200 over PCIe has not; ASSUMPTION
 *     otherwise); logged as "hostWrite PTR N"
 *   a page that would go to a full device (plain memory and retained chunks at the
 *     card's size) stays on (or goes to) the host and is counted (ASSUMPTION: the driver
 *     would evict other managed pages instead; the shim's guard keeps tests away from it)
 *
 * Its own tally, independent of the shim's (fake_cudart_tally): live pointers, managed
 * bytes now and at their peak, rejected frees, advice and prefetches over memory that is
 * not one live managed allocation. */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include <cuda_runtime_api.h>

#include "fake_touch.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_addr = 0x7f0000000000ull, used, total, host_mem;
static uint64_t managed_live, managed_peak, managed_calls, oom_every, bad_frees, bad_ranges;
static FILE *logf;

/* pg: a managed allocation's pages (PAGE bytes each, the last one partial), each a
 * location (LOC_*) | preferred location << 2 (LOC_*) | ACC (accessed-by the device) */
struct blk { uint64_t p, n; int managed, pinned; uint8_t *pg; };
static struct blk *blks;
static size_t nblk, cblk;

#define PAGE 4096ull
enum { LOC_NONE = 0, LOC_DEV = 1, LOC_HOST = 2 };
#define ACC 0x10
#define WAS_DEV 0x20 /* has been on the device: its chunk stays taken until cudaFree (probe) */
static uint64_t res[FAKE_RES_N], retained; /* retained: bytes of WAS_DEV pages of live allocations */

/* like the runtime: a failed call leaves its error for cudaGetLastError (which resets it)
 * and cudaPeekAtLastError (which does not), per host thread */
static _Thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t fail(cudaError_t e) { return last_error = e; }
static _Thread_local int current_device; /* cudaSetDevice's, per thread as the runtime's */

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 10) : dflt;
}

static void init(void)
{
    if (total)
        return;
    total = env_u64("FAKE_GPU_MEM", 80000000000ull);
    host_mem = env_u64("FAKE_HOST_MEM", 2ull << 40);
    oom_every = env_u64("FAKE_MANAGED_OOM_EVERY", 0);
    const char *l = getenv("FAKE_CUDART_LOG");
    if (l)
        logf = fopen(l, "a");
}

/* fork: a child must not inherit mu held by another thread */
static void fork_prepare(void) { pthread_mutex_lock(&mu); }
static void fork_parent(void) { pthread_mutex_unlock(&mu); }
static void fork_child(void) { pthread_mutex_init(&mu, NULL); }
__attribute__((constructor)) static void at_load(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

static void logcall(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logcall(const char *fmt, ...)
{
    if (!logf)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(logf, fmt, ap);
    va_end(ap);
    fputc('\n', logf);
    fflush(logf);
}

/* Whether an allocation of n fits; under mu. Managed memory, as with real UVM, takes no
 * device memory until touched: only cudaMalloc counts against FAKE_GPU_MEM, managed
 * memory against FAKE_HOST_MEM. */
static int fits(uint64_t n, int managed)
{
    if (!managed)
        return n <= total - used;
    managed_calls++;
    if (oom_every && managed_calls % oom_every == 0)
        return 0;
    return n <= host_mem - managed_live;
}

/* The block list; under mu. */
static void add_blk(struct blk b)
{
    if (nblk == cblk) {
        size_t c = cblk ? cblk * 2 : 64;
        struct blk *g = realloc(blks, c * sizeof *g);
        if (!g)
            abort();
        blks = g;
        cblk = c;
    }
    blks[nblk++] = b;
}

/* Takes the block that starts at p out of the list into *out: 1, or 0 when none (of the
 * pinned kind asked for) starts there; under mu. */
static int take_blk(const void *p, int pinned, struct blk *out)
{
    for (size_t i = 0; p && i < nblk; i++)
        if (blks[i].p == (uint64_t)(uintptr_t)p && blks[i].pinned == pinned) {
            *out = blks[i];
            blks[i] = blks[--nblk];
            return 1;
        }
    return 0;
}

static cudaError_t alloc(void **p, size_t n, int managed)
{
    const char *what = managed ? "cudaMallocManaged" : "cudaMalloc";
    if (!p)
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&mu);
    init();
    if (!fits(n, managed)) {
        logcall("%s %zu -> oom", what, n);
        pthread_mutex_unlock(&mu);
        *p = NULL;
        return fail(cudaErrorMemoryAllocation);
    }
    if (n == 0) { /* both: success with NULL (probe: malloc_zero, managed_zero) */
        pthread_mutex_unlock(&mu);
        *p = NULL;
        return cudaSuccess;
    }
    uint64_t a = next_addr;
    next_addr += (n + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
    if (managed) {
        managed_live += n;
        if (managed_live > managed_peak)
            managed_peak = managed_live;
    } else {
        used += n;
        if (used + res[FAKE_RES_DEV] > res[FAKE_RES_DEVICE_PEAK])
            res[FAKE_RES_DEVICE_PEAK] = used + res[FAKE_RES_DEV];
    }
    uint8_t *pg = managed ? calloc((n + PAGE - 1) / PAGE, 1) : NULL; /* every page LOC_NONE */
    if (managed && !pg)
        abort();
    add_blk((struct blk){a, n, managed, 0, pg});
    *p = (void *)a;
    logcall("%s %zu 0x%llx", what, n, (unsigned long long)a);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

/* ---- residency; everything under mu ---- */

static uint64_t page_bytes(const struct blk *b, uint64_t i) { return i * PAGE + PAGE <= b->n ? PAGE : b->n - i * PAGE; }

static void account(int loc, int64_t d)
{
    if (loc == LOC_DEV)
        res[FAKE_RES_DEV] += (uint64_t)d;
    else if (loc == LOC_HOST)
        res[FAKE_RES_HOST] += (uint64_t)d;
}

/* Page i of b to `to` (LOC_DEV or LOC_HOST); a full device keeps it off. Returns where it is. */
static int move_page(struct blk *b, uint64_t i, int to)
{
    int from = b->pg[i] & 3;
    uint64_t nb = page_bytes(b, i);
    if (from == to)
        return to;
    if (to == LOC_DEV && !(b->pg[i] & WAS_DEV) && retained + used + nb > total) {
        res[FAKE_RES_DEVICE_FULL] += nb;
        to = LOC_HOST;
        if (from == to)
            return to;
    }
    account(from, -(int64_t)nb);
    account(to, (int64_t)nb);
    if (to == LOC_DEV && !(b->pg[i] & WAS_DEV)) {
        b->pg[i] |= WAS_DEV;
        retained += nb;
    }
    b->pg[i] = (uint8_t)((b->pg[i] & ~3) | to);
    if (res[FAKE_RES_DEV] > res[FAKE_RES_DEV_PEAK])
        res[FAKE_RES_DEV_PEAK] = res[FAKE_RES_DEV];
    if (res[FAKE_RES_DEV] + used > res[FAKE_RES_DEVICE_PEAK])
        res[FAKE_RES_DEVICE_PEAK] = res[FAKE_RES_DEV] + used;
    return to;
}

/* The live managed allocation holding [a, a + n), or NULL. */
static struct blk *managed_blk(uint64_t a, uint64_t n)
{
    for (size_t i = 0; i < nblk; i++)
        if (blks[i].managed && a >= blks[i].p && n <= blks[i].n && a - blks[i].p <= blks[i].n - n)
            return &blks[i];
    return NULL;
}

/* The pages [*i0, *i1) of b that [a, a + n) covers, rounded out to PAGE (docs). */
static void page_span(const struct blk *b, uint64_t a, uint64_t n, uint64_t *i0, uint64_t *i1)
{
    uint64_t last = (b->n + PAGE - 1) / PAGE;
    *i0 = (a - b->p) / PAGE;
    *i1 = (a - b->p + n + PAGE - 1) / PAGE;
    if (*i1 > last)
        *i1 = last;
}

static void prefetch_pages(struct blk *b, uint64_t a, uint64_t n, int to)
{
    uint64_t i0, i1;
    page_span(b, a, n, &i0, &i1);
    for (uint64_t i = i0; i < i1; i++) {
        int was = b->pg[i] & 3;
        if (move_page(b, i, to) != was)
            res[to == LOC_DEV ? FAKE_RES_TO_DEV : FAKE_RES_TO_HOST] += page_bytes(b, i);
    }
}

static void advise_pages(struct blk *b, uint64_t a, uint64_t n, enum cudaMemoryAdvise adv, struct cudaMemLocation loc)
{
    uint64_t i0, i1;
    int where = loc.type == cudaMemLocationTypeHost ? LOC_HOST : loc.type == cudaMemLocationTypeDevice ? LOC_DEV : 0;
    page_span(b, a, n, &i0, &i1);
    for (uint64_t i = i0; i < i1; i++) {
        uint8_t v = b->pg[i];
        if (adv == cudaMemAdviseSetPreferredLocation)
            v = (uint8_t)((v & ~0x0c) | where << 2);
        else if (adv == cudaMemAdviseUnsetPreferredLocation)
            v &= (uint8_t)~0x0c;
        else if (adv == cudaMemAdviseSetAccessedBy && where == LOC_DEV)
            v |= ACC;
        else if (adv == cudaMemAdviseUnsetAccessedBy && where == LOC_DEV)
            v &= (uint8_t)~ACC;
        b->pg[i] = v;
    }
}

/* A kernel reads and writes [a, a + n) on the device: the rules in the header. Ranges
 * outside managed memory (plain device memory) change nothing. */
static void touch(uint64_t a, uint64_t n)
{
    for (size_t k = 0; k < nblk; k++) {
        struct blk *b = &blks[k];
        if (a >= b->p + b->n || a + n <= b->p)
            continue;
        if (b->pinned) { /* mapped host memory: read where it is */
            res[FAKE_RES_ZERO_COPY] += (a + n < b->p + b->n ? a + n : b->p + b->n) - (a > b->p ? a : b->p);
            continue;
        }
        if (!b->managed)
            continue;
        uint64_t s = a > b->p ? a : b->p, e = a + n < b->p + b->n ? a + n : b->p + b->n;
        uint64_t i0, i1;
        page_span(b, s, e - s, &i0, &i1);
        for (uint64_t i = i0; i < i1; i++) {
            int loc = b->pg[i] & 3, pref = b->pg[i] >> 2 & 3;
            uint64_t nb = page_bytes(b, i);
            if (loc == LOC_DEV)
                continue;
            if (pref == LOC_HOST) { /* mapped where it is (or populated there first) */
                move_page(b, i, LOC_HOST);
                res[FAKE_RES_ZERO_COPY] += nb;
            } else if (move_page(b, i, LOC_DEV) == LOC_DEV) {
                res[loc == LOC_HOST ? FAKE_RES_MIGRATED : FAKE_RES_FIRST_TOUCH] += nb;
            }
        }
    }
}

/* The CPU writes [p, p + n) (see the header); ranges outside managed memory are counted
 * as bad ranges (on a GPU they would be the caller's own memory, or a crash). */
void fake_cudart_host_write(void *p, size_t n)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    pthread_mutex_lock(&mu);
    init();
    logcall("hostWrite 0x%llx %zu", (unsigned long long)a, n);
    struct blk *b = managed_blk(a, n);
    bad_ranges += !b;
    if (b) {
        uint64_t i0, i1;
        page_span(b, a, n, &i0, &i1);
        for (uint64_t i = i0; i < i1; i++)
            move_page(b, i, LOC_HOST);
        res[FAKE_RES_HOST_WRITTEN] += n;
    }
    pthread_mutex_unlock(&mu);
}

static void drop_pages(struct blk *b)
{
    for (uint64_t i = 0; i < (b->n + PAGE - 1) / PAGE; i++) {
        account(b->pg[i] & 3, -(int64_t)page_bytes(b, i));
        if (b->pg[i] & WAS_DEV)
            retained -= page_bytes(b, i);
    }
    free(b->pg);
    b->pg = NULL;
}

/* The fake's own residency account (fake_touch.h's FAKE_RES_* order). */
void fake_cudart_residency(unsigned long long out[FAKE_RES_N])
{
    pthread_mutex_lock(&mu);
    for (int i = 0; i < FAKE_RES_N; i++)
        out[i] = res[i];
    out[FAKE_RES_RETAINED] = retained;
    pthread_mutex_unlock(&mu);
}

/* Peaks from now on (a test's steady state after its warm-up). */
void fake_cudart_residency_peak_reset(void)
{
    pthread_mutex_lock(&mu);
    res[FAKE_RES_DEV_PEAK] = res[FAKE_RES_DEV];
    res[FAKE_RES_DEVICE_PEAK] = res[FAKE_RES_DEV] + used;
    pthread_mutex_unlock(&mu);
}

static const char *const res_names[FAKE_RES_N] = {
    "device_resident_bytes", "device_resident_peak_bytes", "device_used_peak_bytes", "host_resident_bytes",
    "zero_copy_touch_bytes", "fault_migrated_bytes", "first_touch_device_bytes", "prefetched_to_device_bytes",
    "prefetched_to_host_bytes", "device_full_bytes", "device_retained_bytes", "host_written_bytes",
    "host_pinned_bytes"};

__attribute__((destructor)) static void write_residency(void)
{
    const char *path = getenv("FAKE_CUDART_RESIDENCY");
    if (!path || !*path)
        return;
    char name[4096];
    const char *pp = strstr(path, "%p");
    if (pp)
        snprintf(name, sizeof name, "%.*s%d%s", (int)(pp - path), path, (int)getpid(), pp + 2);
    else
        snprintf(name, sizeof name, "%s", path);
    FILE *f = fopen(name, "w");
    if (!f)
        return;
    pthread_mutex_lock(&mu);
    fprintf(f, "{\"total_bytes\": %llu", (unsigned long long)total);
    res[FAKE_RES_RETAINED] = retained;
    for (int i = 0; i < FAKE_RES_N; i++)
        fprintf(f, ", \"%s\": %llu", res_names[i], (unsigned long long)res[i]);
    fprintf(f, "}\n");
    pthread_mutex_unlock(&mu);
    fclose(f);
}

cudaError_t cudaMalloc(void **p, size_t n) { return alloc(p, n, 0); }

cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    if (getenv("FAKE_MANAGED_FAIL"))
        return fail(cudaErrorNotSupported);
    return alloc(p, n, 1);
}

/* Registered (pinned) host memory: the caller's own pages, never on the device (probe:
 * host_register_free_before/after, cudaMemGetInfo unchanged by 256 MiB registered), counted
 * against FAKE_HOST_MEM; NULL or 0 bytes cudaErrorInvalidValue (probe: host_register_null,
 * host_register_zero); a range that overlaps a registered one
 * cudaErrorHostMemoryAlreadyRegistered (probe: host_register_twice, 712); cudaFree of it
 * cudaErrorInvalidValue (probe: host_register_cudafree); cudaHostUnregister of memory not
 * registered cudaErrorHostMemoryNotRegistered (probe: host_unregister_again, 713; all in
 * bench/results/2026-12-02/shapes/cuda_error_probe.json); FAKE_HOST_REGISTER_FAIL=1 refuses
 * with cudaErrorMemoryAllocation (docs list it; not probed: it needs the host to run short). */
/* The kernel's own account of what the caller asked for: mappings advised MADV_HUGEPAGE ("hg"
 * in their VmFlags, proc(5)). With a != 0 whether the one holding a is (0/1), and its size and
 * resident bytes (Rss: the pages written) where size and rss are given; with a == 0 the bytes
 * of them all (fake_cudart_huge_bytes: tests/fakecuda/app.c's prefilled pool). -1: no smaps. */
static long long smaps_huge(uint64_t a, unsigned long long *size, unsigned long long *rss)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    unsigned long long lo = 0, hi = 0, l, h, kb; /* l, h: a line that is no mapping's ("AnonHugePages:") may set l */
    long long sum = 0, hg = 0;
    int in = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%llx-%llx ", &l, &h) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            lo = l, hi = h;
            in = a ? a >= lo && a < hi : 1;
            if (in && a && size)
                *size = hi - lo;
        } else if (in && a && rss && sscanf(line, "Rss: %llu kB", &kb) == 1) {
            *rss = kb * 1024; /* before VmFlags, a mapping's last field */
        } else if (in && !strncmp(line, "VmFlags:", 8)) {
            hg = strstr(line, " hg") != NULL;
            if (a)
                break;
            sum += hg ? (long long)(hi - lo) : 0;
        }
    }
    fclose(f);
    return a ? hg : sum;
}

long long fake_cudart_huge_bytes(void) { return smaps_huge(0, NULL, NULL); }

/* The size and resident bytes of the mapping holding p (0 and 0 where none does). */
void fake_cudart_mapping(uintptr_t p, unsigned long long *size, unsigned long long *rss)
{
    *size = *rss = 0;
    if (p)
        smaps_huge(p, size, rss);
}

cudaError_t cudaHostRegister(void *p, size_t n, unsigned int flags)
{
    if (!p || !n)
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&mu);
    init();
    if (getenv("FAKE_HOST_REGISTER_FAIL") || n > host_mem - managed_live - res[FAKE_RES_PINNED]) {
        logcall("cudaHostRegister %zu -> oom", n);
        pthread_mutex_unlock(&mu);
        return fail(cudaErrorMemoryAllocation);
    }
    uint64_t a = (uint64_t)(uintptr_t)p;
    for (size_t i = 0; i < nblk; i++)
        if (blks[i].pinned && a < blks[i].p + blks[i].n && blks[i].p < a + n) {
            logcall("cudaHostRegister %zu 0x%llx -> already registered", n, (unsigned long long)a);
            pthread_mutex_unlock(&mu);
            return fail(cudaErrorHostMemoryAlreadyRegistered);
        }
    add_blk((struct blk){a, n, 0, 1, NULL});
    res[FAKE_RES_PINNED] += n;
    logcall("cudaHostRegister %zu 0x%llx %u dev=%d hg=%d", n, (unsigned long long)(uintptr_t)p, flags, current_device,
            (int)smaps_huge(a, NULL, NULL));
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaHostUnregister(void *p)
{
    struct blk b;
    pthread_mutex_lock(&mu);
    init();
    cudaError_t err = take_blk(p, 1, &b) ? cudaSuccess : cudaErrorHostMemoryNotRegistered;
    if (!err)
        res[FAKE_RES_PINNED] -= b.n;
    bad_frees += err != cudaSuccess;
    logcall("cudaHostUnregister 0x%llx%s", (unsigned long long)(uintptr_t)p, err ? " -> not registered" : "");
    pthread_mutex_unlock(&mu);
    return err ? fail(err) : err;
}

cudaError_t cudaFree(void *p)
{
    struct blk b;
    pthread_mutex_lock(&mu);
    init();
    cudaError_t err = !p ? cudaSuccess : take_blk(p, 0, &b) ? cudaSuccess : cudaErrorInvalidValue;
    if (p && !err) {
        if (b.managed) {
            managed_live -= b.n;
            drop_pages(&b);
        } else
            used -= b.n;
    }
    bad_frees += err != cudaSuccess;
    logcall("cudaFree 0x%llx%s", (unsigned long long)(uintptr_t)p, err ? " -> invalid" : "");
    pthread_mutex_unlock(&mu);
    return err ? fail(err) : err;
}

/* The fake's own account, for tests: managed bytes live and at their peak, live
 * pointers, rejected frees, rejected advice and prefetch ranges. */
void fake_cudart_tally(unsigned long long out[5])
{
    pthread_mutex_lock(&mu);
    out[0] = managed_live;
    out[1] = managed_peak;
    out[2] = nblk;
    out[3] = bad_frees;
    out[4] = bad_ranges;
    pthread_mutex_unlock(&mu);
}

/* For the fake CUPTI: a line in the same log. */
void fake_cudart_log(const char *line)
{
    pthread_mutex_lock(&mu);
    init();
    logcall("%s", line);
    pthread_mutex_unlock(&mu);
}

/* For the fake CUPTI: a live managed allocation (the k-th, cyclically), or 0 if none. */
unsigned long long fake_cudart_pick(unsigned long long k)
{
    uint64_t a = 0;
    pthread_mutex_lock(&mu);
    for (size_t i = 0; i < nblk && !a; i++)
        if (blks[(k + i) % nblk].managed)
            a = blks[(k + i) % nblk].p;
    pthread_mutex_unlock(&mu);
    return a;
}

/* The live managed allocation [p, p + n) lies in; under mu. Counts the ranges in none. */
static struct blk *managed_range(const void *p, size_t n)
{
    struct blk *b = managed_blk((uint64_t)(uintptr_t)p, n);
    bad_ranges += !b;
    return b;
}

cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
    pthread_mutex_lock(&mu);
    init();
    *f = total - used - retained; /* probe: memgetinfo_managed_resident */
    *t = total;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int *v)
{
    const char *e = getenv("FAKE_RUNTIME_VERSION");
    *v = e ? atoi(e) : 13000;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *d) { *d = current_device; return cudaSuccess; }
cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d > 7)
        return fail(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void)
{
    pthread_mutex_lock(&mu);
    logcall("cudaDeviceSynchronize");
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d)
{
    (void)d;
    *v = (a == cudaDevAttrManagedMemory || a == cudaDevAttrConcurrentManagedAccess) && !getenv("FAKE_NO_MANAGED");
    return cudaSuccess;
}

cudaError_t cudaMemAdvise(const void *p, size_t n, enum cudaMemoryAdvise a, struct cudaMemLocation loc)
{
    pthread_mutex_lock(&mu);
    logcall("cudaMemAdvise 0x%llx %zu %d %d %d", (unsigned long long)(uintptr_t)p, n, (int)a, (int)loc.type, loc.id);
    struct blk *b = managed_range(p, n);
    if (b)
        advise_pages(b, (uint64_t)(uintptr_t)p, n, a, loc);
    pthread_mutex_unlock(&mu);
    return b ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemPrefetchAsync(const void *p, size_t n, struct cudaMemLocation loc, unsigned int flags,
                                 cudaStream_t s)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    logcall("cudaMemPrefetchAsync 0x%llx %zu %d %d %p", (unsigned long long)(uintptr_t)p, n, (int)loc.type, loc.id,
            (void *)s);
    struct blk *b = managed_range(p, n);
    int ok = b && !getenv("FAKE_PREFETCH_FAIL"); /* FAKE_PREFETCH_FAIL: every prefetch fails */
    if (ok)
        prefetch_pages(b, (uint64_t)(uintptr_t)p, n, loc.type == cudaMemLocationTypeDevice ? LOC_DEV : LOC_HOST);
    pthread_mutex_unlock(&mu);
    return ok ? cudaSuccess : fail(cudaErrorInvalidValue);
}

/* Both launch entry points share this; like the real runtime, no internal call goes back
 * through the exported (interposable) names. */
static cudaError_t launch(const void *f, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s)
{
    (void)g; (void)b; (void)shm;
    pthread_mutex_lock(&mu);
    logcall("cudaLaunchKernel %p %p", f, (void *)s);
    const struct fake_touch *t = args && args[0] ? *(const struct fake_touch *const *)args[0] : NULL;
    for (; t && t->len; t++) /* fake_touch.h: the ranges this kernel touches */
        touch(t->ptr, t->len);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaLaunchKernel(const void *f, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s)
{
    return launch(f, g, b, args, shm, s);
}

/* CUDA 13's nvcc stubs launch through this one (cudaKernel_t handle). */
cudaError_t __cudaLaunchKernel(const void *k, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s)
{
    return launch(k, g, b, args, shm, s);
}
