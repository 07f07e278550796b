/* A program linked against libcudart (the fake in tests) the way PyTorch's libraries
 * are: its cudaMalloc/cudaFree/cudaLaunchKernel references resolve through the global
 * scope, so an LD_PRELOADed shim intercepts them. Prints results as key=value lines.
 *
 *   app alloc SIZE [SIZE...]      allocate each (null:SIZE: with a NULL devPtr), print error
 *                                 codes, cudaGetLastError after each and cudaMemGetInfo, free
 *   app threads N ITERS SIZE [HOLD]   N threads allocate and free concurrently, each holding
 *                                 up to HOLD allocations; prints the fake runtime's tally
 *   app loop ITERS LAUNCHES SIZE [adapter]   training-like loop over fake kernels; accum=N: the
 *                                 adapter's boundary every N loops (gradient accumulation), after
 *                                 a hint of q as optimizer state; attach: transit_adapter_attach
 *                                 first (an optimizer was made)
 *   app hint SIZE OFF LEN KIND    allocate, hint a sub-range, apply, print
 *   app fork SIZE                 allocate, fork a child that allocates too, wait
 *   app place SIZE EXTRA STATS OFF:LEN:KIND... [late:SIZE]   allocate SIZE then EXTRA (0:
 *                                 none), hint ranges of the first, apply, allocate the late
 *                                 SIZE (the next step's new segment), apply, write stats
 *   app uvm SIZE OP...            the runtime alone (no shim): cudaMallocManaged(SIZE), then each
 *                                 OP, printing the fake's residency after it (stepK_*): advise:OFF:LEN:ADV:LOC,
 *                                 prefetch:OFF:LEN:LOC (LOC 1 device, 2 host), touch:OFF:LEN, plain:N
 *                                 (cudaMalloc), info (cudaMemGetInfo), zero (cudaMallocManaged(0)),
 *                                 advise-plain, prefetch-plain, advise-stack, prefetch-stack (unmanaged memory),
 *                                 hostwrite:OFF:LEN (the CPU writes the range: fake_cudart_host_write)
 *   app state HOT STATE PARTS STATS [step|step-nohint|segs:LIST]   HOT bytes, PARTS allocations
 *                                 of STATE bytes marked as optimizer state (transit_state_alloc), one
 *                                 unmarked; a kernel touches all; stats; segs:LIST: the adapter's
 *                                 transit_state_segments(LIST) before them, the empty list after
 *                                 (segs_opt says the variants: -exit, -idle, -ready, -twice);
 *                                 APP_HOT_FREED_FIRST: HOT freed before the state, made again after
 *   app state-threads HOT STATE THREADS STATS [segs[-exit]:LIST]   as state, the marked allocations made
 *                                 by THREADS threads at once, each marked on its own
 *   app stress SEED THREADS OPS STATS [replay]   THREADS threads of OPS seeded random calls
 *                                 each (below), then the tallies; replay: a random replay table first
 * Kernels that touch memory (fake_touch.h) are what the fake runtime's residency follows:
 * alloc ... touch, place (the step after the last boundary), loop ... touch and stress
 * launch them; print_tally prints the fake's own residency account (fake_*).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "fake_touch.h"

static void kern0(void) {}
static void kern1(void) {}
static void kern2(void) {}
static void kern3(void) {}
static void (*kerns[])(void) = {kern0, kern1, kern2, kern3};

/* what CUDA 13 nvcc stubs call (crt/device_functions.h, C++ only there) */
cudaError_t __cudaLaunchKernel(const void *kernel, dim3 grid, dim3 block, void **args, size_t shmem,
                               cudaStream_t stream);

static void *api(const char *name) { return dlsym(RTLD_DEFAULT, name); }

/* adapter-stats: a thread that replaces the shim's copy of the adapter's counters 200 times. */
static int (*adapter_send)(const char *);
static void *adapter_sender(void *arg)
{
    char json[64];
    for (int i = 0; i < 200; i++) {
        snprintf(json, sizeof json, "{\"thread\": %d, \"i\": %d}", (int)(uintptr_t)arg, i);
        adapter_send(json);
    }
    return NULL;
}

/* The fake runtime's own account (fake_cudart.c), then the shim's table check when the
 * shim is a test build. */
/* A kernel that reads and writes the ranges of t (ended by a zero length) on stream s. */
static cudaError_t touch_kernel(const struct fake_touch *t, cudaStream_t s)
{
    void *args[] = {&t};
    return cudaLaunchKernel((const void *)kern3, (dim3){1, 1, 1}, (dim3){1, 1, 1}, args, 0, s);
}

static void print_tally(void)
{
    static const char *const names[FAKE_RES_N] = {"dev_resident", "dev_resident_peak", "device_used_peak",
        "host_resident", "zero_copy", "migrated", "first_touch", "to_dev", "to_host", "device_full", "retained",
        "host_written", "pinned"};
    void (*residency)(unsigned long long *) = (void (*)(unsigned long long *))api("fake_cudart_residency");
    if (residency) {
        unsigned long long r[FAKE_RES_N];
        residency(r);
        for (int i = 0; i < FAKE_RES_N; i++)
            printf("fake_%s=%llu\n", names[i], r[i]);
    }
    void (*tally)(unsigned long long *) = (void (*)(unsigned long long *))api("fake_cudart_tally");
    int (*check)(char *, size_t) = (int (*)(char *, size_t))api("transit_test_check");
    unsigned long long t[5];
    if (tally) {
        tally(t);
        printf("fake_managed_live=%llu\nfake_managed_peak=%llu\nfake_live_ptrs=%llu\nfake_bad_frees=%llu\n"
               "fake_bad_ranges=%llu\n", t[0], t[1], t[2], t[3], t[4]);
    }
    if (check) {
        char why[256] = "";
        printf("table_check=%d %s\n", check(why, sizeof why), why);
    }
}

/* transit_state_segments(list) where the option is segs:LIST, LIST the predicted segments'
 * sizes, comma-separated, in bytes or "s" for STATE; then what the kernel says of the mappings
 * advised huge pages (the fake reads smaps): the pool's bytes. segs-exit: the shim's exit ends
 * the pool (no empty list); segs-idle: the end waits until the fill has ended; segs-ready: the
 * marked allocations wait until then (every region made first); segs-twice: a second list,
 * each size twice; segs-fork: 300 children forked while the fill runs each end the pool they
 * inherited (forks_ok: how many exited cleanly). With APP_PREFILL_GATE set (a test build) the fill begins nothing until the
 * allocations are made (segs_end opens it). expect:N: the retired transit_state_expect(N), then (0) after. Returns 1
 * where the caller ends it (segs_end), 2 for segs-exit:, 0 for no such option, -1 for no such call. */
static int segs_idle, segs_expect;

static int segs_opt(const char *opt, size_t state)
{
    void (*segments)(const size_t *, size_t) = (void (*)(const size_t *, size_t))api("transit_state_segments");
    void (*expect)(size_t) = (void (*)(size_t))api("transit_state_expect");
    void (*settle)(void) = (void (*)(void))api("transit_test_prefill_settle");
    long long (*huge)(void) = (long long (*)(void))api("fake_cudart_huge_bytes");
    const char *colon = opt ? strchr(opt, ':') : NULL;
    if (!colon)
        return 0;
    size_t kind_len = (size_t)(colon - opt);
#define KIND_IS(k) (kind_len == strlen(k) && !strncmp(opt, k, kind_len))
    if (KIND_IS("expect")) {
        if (!expect || !huge)
            return -1;
        segs_expect = 1;
        printf("huge_before=%lld\n", huge());
        expect(strtoull(colon + 1, NULL, 10));
        printf("huge_expected=%lld\n", huge());
        return 1;
    }
    int settled = KIND_IS("segs-settled"); /* as segs-ready before the allocations, then as segs-idle */
    int exit_ends = KIND_IS("segs-exit"), ready = KIND_IS("segs-ready") || settled, twice = KIND_IS("segs-twice");
    int forks = KIND_IS("segs-fork");
    segs_idle = KIND_IS("segs-idle") || settled;
    if (!(exit_ends || ready || twice || segs_idle || forks || KIND_IS("segs")))
        return 0;
#undef KIND_IS
    if (!segments || !huge)
        return -1;
    void (*gate)(int) = (void (*)(int))api("transit_test_prefill_gate");
    /* APP_PREFILL_GATE=1: the fill waits until segs_end opens it; =2: only its registrations do;
     * =4: the fill makes one region, then waits (APP_PREFILL_OPEN_AFTER_FIRST: until the first
     * marked allocation is made) */
    int gated = getenv("APP_PREFILL_GATE") && gate;
    if (gated)
        gate(atoi(getenv("APP_PREFILL_GATE")));
    size_t list[64], n = 0;
    for (const char *q = colon + 1; *q && n < 64; q += strcspn(q, ","), q += *q == ',') {
        list[n++] = *q == 's' ? state : strtoull(q, NULL, 10);
    }
    printf("huge_before=%lld\n", huge());
    segments(list, n);
    if (twice) {
        for (size_t i = 0; i < n; i++)
            list[i] *= 2;
        segments(list, n);
    }
    if (forks) { /* children forked while the fill runs end their (inherited, not theirs) pool */
        void (*hold)(int) = (void (*)(int))api("transit_test_prefill_hold_lock");
        int ok = 0;
        for (int i = 0; i < 300; i++) {
            if (hold && i % 30 == 0)
                hold(50); /* every 30th fork while the fill's lock is held (a test build) */
            pid_t c = fork();
            if (c == 0) {
                alarm(2); /* a child stuck on a lock the fill held at the fork: killed, not counted */
                segments(NULL, 0);
                /* the kernel's exit, not _exit: TSan's would call the parent's fill threads, finished
                 * and not yet joined (the parent joins them), leaked by this child */
                syscall(SYS_exit_group, 0);
            }
            int st;
            if (c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0)
                ok++;
            else
                break; /* one stuck child fails the scenario: the rest would each wait out its alarm */
        }
        printf("forks_ok=%d\n", ok);
    }
    if (ready && settle)
        settle(); /* every region the fill makes, made before the allocations */
    if (gated)
        printf("gated=1\n");
    printf("huge_expected=%lld\n", huge());
    return exit_ends ? 2 : 1;
}

/* The test's gate opened and the fill settled again (the test build's hooks). */
static void prefill_open(void)
{
    void (*gate)(int) = (void (*)(int))api("transit_test_prefill_gate");
    void (*settle)(void) = (void (*)(void))api("transit_test_prefill_settle");
    if (gate && settle) {
        gate(0);
        settle();
    }
}

/* After the marked allocations (segs-idle: once the fill has ended, by the test build's hook):
 * the first allocation's mapping (the pool) and its pages written, by the kernel's account
 * (the fake reads smaps); the empty list (the first step is over), then that account again,
 * and whether the page after each allocation is still mapped (msync says ENOMEM where not). */
static void segs_end(void *const *s, int parts, size_t state)
{
    void (*segments)(const size_t *, size_t) = (void (*)(const size_t *, size_t))api("transit_state_segments");
    void (*expect)(size_t) = (void (*)(size_t))api("transit_state_expect");
    long long (*huge)(void) = (long long (*)(void))api("fake_cudart_huge_bytes");
    void (*settle)(void) = (void (*)(void))api("transit_test_prefill_settle");
    void (*gate)(int) = (void (*)(int))api("transit_test_prefill_gate");
    if (gate && getenv("APP_PREFILL_GATE"))
        gate(0); /* the allocations are made: the fill may begin */
    if (segs_idle) {
        if (settle)
            settle();
        printf("settled=%d\n", settle != NULL);
    }
    void (*mapping)(uintptr_t, unsigned long long *, unsigned long long *) =
        (void (*)(uintptr_t, unsigned long long *, unsigned long long *))api("fake_cudart_mapping");
    unsigned long long size = 0, rss = 0;
    if (mapping)
        mapping((uintptr_t)s[0], &size, &rss);
    printf("pool_mapping=%llu\npool_written=%llu\n", size, rss);
    if (segs_expect)
        expect(0);
    else
        segments(NULL, 0);
    printf("huge_released=%lld\n", huge());
    for (int i = 0; i < parts; i++) {
        uintptr_t next = (uintptr_t)s[i] + ((state + 4095) & ~(size_t)4095);
        printf("state%d_next_mapped=%d\n", i, msync((void *)next, 4096, MS_ASYNC) == 0);
    }
}

struct marked { size_t size; void *p; int err; pthread_barrier_t *go; };
static void *marked_alloc(void *arg)
{
    struct marked *m = arg;
    void (*mark)(int) = (void (*)(int))api("transit_state_alloc");
    pthread_barrier_wait(m->go);
    mark(1);
    m->err = (int)cudaMalloc(&m->p, m->size);
    mark(0);
    return NULL;
}

struct other { size_t size; void *p; };
static void *other_alloc(void *arg)
{
    struct other *o = arg;
    cudaMalloc(&o->p, o->size);
    return NULL;
}

#define MAX_HOLD 64
static int threads_iters, threads_hold;
static size_t threads_size;
static pthread_barrier_t threads_start; /* all at once, so that they overlap */
static void *worker(void *arg)
{
    (void)arg;
    void *held[MAX_HOLD] = {0};
    pthread_barrier_wait(&threads_start);
    for (int i = 0; i < threads_iters; i++) {
        void **slot = &held[i % threads_hold];
        if (*slot)
            cudaFree(*slot);
        if (cudaMalloc(slot, threads_size + (size_t)i % 7 * 4096) != cudaSuccess)
            *slot = NULL;
        sched_yield(); /* the others run while this one holds its allocations */
    }
    for (int i = 0; i < threads_hold; i++)
        if (held[i])
            cudaFree(held[i]);
    return NULL;
}

/* ---- stress: THREADS threads, each OPS seeded random calls (or until SECONDS pass):
 * allocations (some of 0 bytes, some near SIZE_MAX, some with a NULL devPtr), frees of
 * any thread's allocation, hints over live or freed memory, launches on two streams,
 * iteration boundaries, apply, cudaMemGetInfo, the adapter's device buffers (taken and
 * given back), frees of pointers never allocated, stats and table checks. Counts what the
 * runtime's contract says must not happen (`wrong`: an unexpected return code, or
 * cudaGetLastError not the failed call's error). */
#define SLOTS 64
static _Atomic uintptr_t slot[SLOTS];
static _Atomic uintptr_t dbuf[8]; /* transit_device_alloc's buffers */
static struct {
    uintptr_t (*dalloc)(size_t);
    int (*dfree)(uintptr_t);
    int (*hint)(uintptr_t, size_t, int);
    int (*iteration)(void);
    void (*apply)(void);
    int (*write_stats)(const char *);
    int (*check)(char *, size_t);
} T;
static uint64_t stress_seed, stress_ops;
static const char *stress_stats;
static _Atomic unsigned long long n_dbuf; /* device buffers taken */
static _Atomic unsigned long long n_ops, n_alloc, n_refused, n_free, n_bad_free, n_launch, n_iter, n_wrong;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t rnd(uint64_t *s) /* xorshift64* */
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void wrong(const char *what, int got)
{
    if (atomic_fetch_add(&n_wrong, 1) < 20) /* the first few say what */
        fprintf(stderr, "stress: %s: %d\n", what, got);
}

/* A failed call's error is the thread's last error, once. */
static void expect_last(cudaError_t e)
{
    cudaError_t last = cudaGetLastError();
    if (last != e)
        wrong("cudaGetLastError after a failure", (int)last);
}

static void stress_alloc(uint64_t *r)
{
    uint64_t k = rnd(r) % 100;
    size_t size = k == 0 ? SIZE_MAX - rnd(r) % (1u << 30) : k == 1 ? 0 : ((size_t)4096 << rnd(r) % 15) + rnd(r) % 4096;
    void *p = NULL;
    cudaError_t e = cudaMalloc(k == 2 ? NULL : &p, size);
    atomic_fetch_add(&n_alloc, 1);
    if (k == 2) {
        if (e != cudaErrorInvalidValue)
            wrong("cudaMalloc(NULL, n)", (int)e);
        return expect_last(e);
    }
    if (e == cudaErrorMemoryAllocation) {
        atomic_fetch_add(&n_refused, 1);
        if (p)
            wrong("a refused cudaMalloc left a pointer", 1);
        return expect_last(e);
    }
    if (e != cudaSuccess)
        return wrong("cudaMalloc", (int)e);
    if (!p)
        return; /* 0 bytes */
    for (int i = 0, at = (int)(rnd(r) % SLOTS); i < SLOTS; i++) {
        uintptr_t none = 0;
        if (atomic_compare_exchange_strong(&slot[(at + i) % SLOTS], &none, (uintptr_t)p))
            return;
    }
    if ((e = cudaFree(p)) != cudaSuccess)
        wrong("cudaFree", (int)e);
}

static void stress_free(uint64_t *r)
{
    uintptr_t p = atomic_exchange(&slot[rnd(r) % SLOTS], 0);
    cudaError_t e = p ? cudaFree((void *)p) : cudaSuccess;
    atomic_fetch_add(&n_free, p != 0);
    if (e != cudaSuccess)
        wrong("cudaFree", (int)e);
}

static void stress_launch(uint64_t *r)
{
    dim3 g = {1, 1, 1}, b = {1, 1, 1};
    const void *k = (const void *)kerns[rnd(r) % 4];
    cudaStream_t st = (cudaStream_t)(uintptr_t)(rnd(r) % 2 ? 7 : 0);
    /* a quarter of them touch the first MiB of a live (or by now freed) allocation */
    struct fake_touch t[2] = {{atomic_load(&slot[rnd(r) % SLOTS]), 1u << 20}, {0, 0}};
    const struct fake_touch *tp = t;
    void *args[] = {&tp}, **a = t[0].ptr && rnd(r) % 4 == 0 ? args : NULL;
    cudaError_t e = rnd(r) % 2 ? cudaLaunchKernel(k, g, b, a, 0, st) : __cudaLaunchKernel(k, g, b, a, 0, st);
    atomic_fetch_add(&n_launch, 1);
    if (e != cudaSuccess)
        wrong("launch", (int)e);
    if ((e = cudaGetLastError()) != cudaSuccess) /* what PyTorch checks after a launch */
        wrong("cudaGetLastError after a launch", (int)e);
}

/* A device buffer taken (or refused: no room) or one given back, exactly once. */
static void stress_dbuf(uint64_t *r)
{
    _Atomic uintptr_t *s = &dbuf[rnd(r) % 8];
    uintptr_t p = atomic_exchange(s, 0);
    if (p) {
        if (T.dfree(p) != 0)
            wrong("transit_device_free of a live buffer", -1);
        return;
    }
    p = T.dalloc(((size_t)1 << 20) << rnd(r) % 9);
    atomic_fetch_add(&n_dbuf, p != 0);
    uintptr_t none = 0;
    if (p && !atomic_compare_exchange_strong(s, &none, p) && T.dfree(p) != 0)
        wrong("transit_device_free", -1);
}

static void stress_one(uint64_t *r)
{
    uint64_t op = rnd(r) % 1000, k = rnd(r);
    uintptr_t p = atomic_load(&slot[k % SLOTS]);
    if (op < 300) {
        stress_alloc(r);
    } else if (op < 550) {
        stress_free(r);
    } else if (op < 650) { /* a sub-range of a live (or by now freed) allocation */
        if (p)
            T.hint(p + rnd(r) % (1u << 20), (size_t)(rnd(r) % (64u << 20)), (int)(rnd(r) % 3));
    } else if (op < 840) {
        stress_launch(r);
    } else if (op < 850) {
        stress_dbuf(r);
    } else if (op < 870) {
        T.iteration();
        atomic_fetch_add(&n_iter, 1);
    } else if (op < 890) {
        T.apply();
    } else if (op < 920) {
        size_t f = 0, t = 0;
        cudaError_t e = cudaMemGetInfo(&f, &t);
        if (e != cudaSuccess || f > t)
            wrong("cudaMemGetInfo", (int)e);
    } else if (op < 930) { /* never allocated: the runtime's refusal, passed on */
        cudaError_t e = cudaFree((void *)(uintptr_t)(0x10000 + (k % 4096) * 4096));
        atomic_fetch_add(&n_bad_free, 1);
        if (e != cudaErrorInvalidValue)
            wrong("cudaFree of a foreign pointer", (int)e);
        expect_last(e);
    } else if (op < 995) {
        char why[256] = "";
        if (T.check && T.check(why, sizeof why) != 0)
            wrong(why, 0);
    } else if (op < 996 && stress_stats) {
        if (T.write_stats(stress_stats) != 0)
            wrong("transit_write_stats", -1);
    } else {
        T.hint(0x1000 + (k % 64) * 4096, 4096, (int)(k % 3)); /* not managed memory: -1 */
    }
}

static void *stress_worker(void *arg)
{
    uint64_t r = (stress_seed + 1) * 0x9e3779b97f4a7c15ull + (uintptr_t)arg * 0xbf58476d1ce4e5b9ull + 1;
    uint64_t i = 0;
    for (; i < stress_ops; i++)
        stress_one(&r);
    atomic_fetch_add(&n_ops, i);
    return NULL;
}

static int stress(int argc, char **argv)
{
    if (argc < 6)
        return 2;
    stress_seed = strtoull(argv[2], NULL, 10);
    int n = atoi(argv[3]);
    stress_ops = strtoull(argv[4], NULL, 10);
    double t0 = now_s();
    stress_stats = argv[5];
#define L(f, name) T.f = (__typeof__(T.f))api(name)
    L(hint, "transit_hint"); L(iteration, "transit_iteration"); L(apply, "transit_apply");
    L(write_stats, "transit_write_stats"); L(check, "transit_test_check");
    L(dalloc, "transit_device_alloc"); L(dfree, "transit_device_free");
#undef L
    if (!T.hint || !T.iteration || !T.apply || !T.write_stats || !T.dalloc || !T.dfree || n < 1 || n > 64)
        return 2;
    if (argc > 6 && !strcmp(argv[6], "replay")) { /* ranges over the first 64 GiB of the fake's addresses */
        void (*add)(uint64_t, uintptr_t, uint64_t) = (void (*)(uint64_t, uintptr_t, uint64_t))api("transit_test_replay_add");
        void (*finish)(void) = (void (*)(void))api("transit_test_replay_finish");
        uint64_t r = stress_seed + 7;
        for (int i = 0; add && i < 4096; i++)
            add(rnd(&r) % 64, 0x7f0000000000ull + rnd(&r) % (64ull << 30), rnd(&r) % (256u << 20) + 1);
        if (finish)
            finish();
    }
    pthread_t th[64];
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, stress_worker, (void *)(uintptr_t)i);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < SLOTS; i++)
        if (slot[i] && cudaFree((void *)slot[i]) != cudaSuccess)
            wrong("cudaFree", -1);
    for (int i = 0; i < 8; i++)
        if (dbuf[i] && T.dfree(dbuf[i]) != 0)
            wrong("transit_device_free", -1);
    printf("device_buffers=%llu\n", n_dbuf);
    printf("ops=%llu\nallocs=%llu\nrefused=%llu\nfrees=%llu\nbad_frees=%llu\nlaunches=%llu\niterations=%llu\n"
           "wrong=%llu\nseconds=%.3f\n", n_ops, n_alloc, n_refused, n_free, n_bad_free, n_launch, n_iter,
           n_wrong, now_s() - t0);
    printf("stats=%d\n", T.write_stats(stress_stats));
    print_tally();
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (!strcmp(argv[1], "alloc")) {
        void *ptrs[64];
        size_t sizes[64];
        int n = 0, touch = 0;
        for (int i = 2; i < argc && n < 64; i++) {
            if (!strcmp(argv[i], "touch")) { /* a kernel touching every allocation, before the frees */
                touch = 1;
                continue;
            }
            int null = !strncmp(argv[i], "null:", 5);
            sizes[n] = strtoull(argv[i] + (null ? 5 : 0), NULL, 10);
            cudaError_t e = cudaMalloc(null ? NULL : &ptrs[n], strtoull(argv[i] + (null ? 5 : 0), NULL, 10));
            printf("alloc%d=%d\nlast%d=%d\n", i - 2, (int)e, i - 2, (int)cudaGetLastError());
            if (e == cudaSuccess && !null)
                n++;
        }
        size_t f, t;
        cudaMemGetInfo(&f, &t);
        printf("free=%zu\ntotal=%zu\n", f, t);
        if (touch) {
            struct fake_touch r[65] = {{0, 0}};
            for (int i = 0; i < n; i++)
                r[i] = (struct fake_touch){(uintptr_t)ptrs[i], sizes[i]};
            touch_kernel(r, 0);
        }
        print_tally();
        for (int i = 0; i < n; i++)
            cudaFree(ptrs[i]);
        return 0;
    }
    if (!strcmp(argv[1], "adapter-stats") && argc >= 4) { /* THREADS PATH: counters sent while reports are written */
        int n = atoi(argv[2]);
        if (n < 1 || n > 64)
            return 2;
        int (*write_stats)(const char *) = (int (*)(const char *))api("transit_write_stats");
        int (*send)(const char *) = (int (*)(const char *))api("transit_adapter_stats");
        if (!write_stats || !send)
            return 3;
        adapter_send = send;
        pthread_t th[64];
        for (int i = 0; i < n; i++)
            pthread_create(&th[i], NULL, adapter_sender, (void *)(uintptr_t)i);
        int bad = 0;
        for (int i = 0; i < 50; i++)
            bad |= write_stats(argv[3]) != 0;
        for (int i = 0; i < n; i++)
            pthread_join(th[i], NULL);
        printf("written=%d\n", !bad);
        return 0;
    }
    if (!strcmp(argv[1], "threads")) {
        int n = atoi(argv[2]);
        threads_iters = atoi(argv[3]);
        threads_size = strtoull(argv[4], NULL, 10);
        threads_hold = argc > 5 ? atoi(argv[5]) : 1;
        if (n < 1 || n > 64 || threads_hold < 1 || threads_hold > MAX_HOLD)
            return 2;
        pthread_t th[64];
        pthread_barrier_init(&threads_start, NULL, (unsigned)n);
        for (int i = 0; i < n; i++)
            pthread_create(&th[i], NULL, worker, NULL);
        for (int i = 0; i < n; i++)
            pthread_join(th[i], NULL);
        printf("done=1\n");
        print_tally();
        return 0;
    }
    if (!strcmp(argv[1], "loop")) {
        int iters = atoi(argv[2]), launches = atoi(argv[3]);
        size_t size = strtoull(argv[4], NULL, 10);
        int adapter = 0, replay = 0, straddle = 0, refree = 0, accum = 1, attach = 0, touch = 0, unaligned = 0;
        int onhost = 0;
        for (int i = 5; i < argc; i++) {
            adapter |= !strcmp(argv[i], "adapter");
            touch |= !strcmp(argv[i], "touch"); /* every iteration's first kernel touches p and q */
            attach |= !strcmp(argv[i], "attach");
            onhost |= !strcmp(argv[i], "onhost"); /* transit_state_on_host before the first boundary */
            if (!strncmp(argv[i], "accum=", 6))
                accum = atoi(argv[i] + 6);
            replay |= !strcmp(argv[i], "replay");
            straddle |= !strcmp(argv[i], "straddle");
            refree |= !strcmp(argv[i], "refree");
            unaligned |= !strcmp(argv[i], "unaligned"); /* one range of 8 MiB of q, 100 bytes in */
        }
        int (*iteration)(void) = (int (*)(void))api("transit_iteration");
        void *p, *q, *r = NULL;
        cudaMalloc(&p, size);
        cudaMalloc(&q, size);
        if (refree) /* a third allocation, freed after the first iteration (a segment given back) */
            cudaMalloc(&r, size);
        printf("p=0x%llx\nq=0x%llx\nr=0x%llx\n", (unsigned long long)(uintptr_t)p, (unsigned long long)(uintptr_t)q,
               (unsigned long long)(uintptr_t)r);
        if (replay) {
            void (*add)(uint64_t, uintptr_t, uint64_t) = (void (*)(uint64_t, uintptr_t, uint64_t))api("transit_test_replay_add");
            void (*finish)(void) = (void (*)(void))api("transit_test_replay_finish");
            if (unaligned) {
                add(5, (uintptr_t)q + 100, 8u << 20);
            } else if (refree) { /* half of q before launch 5, half of r before launch 10 */
                add(5, (uintptr_t)q, size / 2);
                add(10, (uintptr_t)r, size / 2);
            } else { /* q is on the host: replay 768 MB of it before launch 5, 512 MB before 10 */
                add(5, (uintptr_t)q, 768u << 20);
                add(10, (uintptr_t)q + (1u << 30), 256u << 20);
                add(10, (uintptr_t)q + (1u << 30) + (256u << 20) + 4096, 256u << 20); /* merged: gap < 128 KB */
            }
            if (straddle) { /* the last MB of p and the first of q, which follows it: not one range */
                add(7, (uintptr_t)p + size - (1u << 20), 1u << 20);
                add(7, (uintptr_t)q, 1u << 20);
            }
            finish();
        }
        void (*attach_fn)(void) = (void (*)(void))api("transit_adapter_attach");
        int (*hint_fn)(uintptr_t, size_t, int) = (int (*)(uintptr_t, size_t, int))api("transit_hint");
        if (attach && attach_fn)
            attach_fn();
        void (*onhost_fn)(void) = (void (*)(void))api("transit_state_on_host");
        if (onhost && onhost_fn)
            onhost_fn();
        struct fake_touch pq[3] = {{(uintptr_t)p, size}, {(uintptr_t)q, size}, {0, 0}};
        for (int it = 0; it < iters; it++) {
            if (touch)
                touch_kernel(pq, 0);
            for (int k = 0; k < launches; k++) {
                dim3 g = {1, 1, 1}, b = {1, 1, 1};
                /* a sequence with no period shorter than the iteration */
                unsigned idx = ((unsigned)k * 2654435761u >> 13) % 4;
                cudaStream_t st = (cudaStream_t)(uintptr_t)(k == 10 ? 7 : 0);
                if (k % 2) /* both entry points: cudaLaunchKernel and CUDA 13's __cudaLaunchKernel */
                    __cudaLaunchKernel((const void *)kerns[idx], g, b, NULL, 0, st);
                else
                    cudaLaunchKernel((const void *)kerns[idx], g, b, NULL, 0, st);
            }
            if (adapter && iteration && (it + 1) % accum == 0) {
                if (accum > 1 && hint_fn) /* what the adapter does after a step: the state's hint, then the boundary */
                    hint_fn((uintptr_t)q, size, 2);
                iteration();
            }
            if (r && it == 0) {
                cudaFree(r);
                r = NULL;
            }
        }
        printf("last_error=%d\n", (int)cudaGetLastError()); /* what PyTorch checks after launches */
        print_tally();
        cudaFree(p);
        cudaFree(q);
        printf("iterations=%d\n", iters);
        return 0;
    }
    if (!strcmp(argv[1], "layers")) { /* ITERS LAYERS: a layer pattern repeated, then a tail */
        int iters = atoi(argv[2]), layers = atoi(argv[3]);
        static const int layer[8] = {0, 1, 2, 3, 1, 2, 0, 3}, tail[5] = {3, 3, 2, 0, 1};
        dim3 g = {1, 1, 1}, b = {1, 1, 1};
        for (int it = 0; it < iters; it++) {
            for (int l = 0; l < layers; l++)
                for (int k = 0; k < 8; k++)
                    cudaLaunchKernel((const void *)kerns[layer[k]], g, b, NULL, 0, 0);
            for (int k = 0; k < 5; k++)
                cudaLaunchKernel((const void *)kerns[tail[k]], g, b, NULL, 0, 0);
        }
        printf("iterations=%d\n", iters);
        return 0;
    }
    if (!strcmp(argv[1], "hint")) {
        size_t size = strtoull(argv[2], NULL, 10), off = strtoull(argv[3], NULL, 10);
        size_t len = strtoull(argv[4], NULL, 10);
        int kind = atoi(argv[5]);
        int (*hint)(uintptr_t, size_t, int) = (int (*)(uintptr_t, size_t, int))api("transit_hint");
        void (*apply)(void) = (void (*)(void))api("transit_apply");
        int (*write_stats)(const char *) = (int (*)(const char *))api("transit_write_stats");
        void *p;
        cudaMalloc(&p, size);
        printf("ptr=0x%llx\n", (unsigned long long)(uintptr_t)p);
        if (hint) {
            printf("hint=%d\n", hint((uintptr_t)p + off, len, kind));
            printf("hint_foreign=%d\n", hint((uintptr_t)0x1000, 4096, kind));
            apply();
            if (argc > 6)
                printf("stats=%d\n", write_stats(argv[6]));
        }
        cudaFree(p);
        return 0;
    }
    if (!strcmp(argv[1], "devbuf-first") && argc >= 3) {
        /* SIZE: a device buffer asked for before any CUDA call (the runtime not yet resolved) */
        uintptr_t (*dalloc)(size_t) = (uintptr_t(*)(size_t))api("transit_device_alloc");
        int (*dfree)(uintptr_t) = (int (*)(uintptr_t))api("transit_device_free");
        if (!dalloc || !dfree)
            return 1;
        uintptr_t buf = dalloc(strtoull(argv[2], NULL, 10));
        printf("buf=0x%llx\n", (unsigned long long)buf);
        printf("freed=%d\n", buf ? dfree(buf) : -1);
        return 0;
    }
    if (!strcmp(argv[1], "devbuf") && argc >= 6) {
        /* HOT EXTRA BUF STATS: two allocations, then a plain device buffer of BUF bytes for
         * the adapter (transit_device_alloc), taken out of the budget; one too large for
         * it; the stats and the table's check while it is held; then it is given back. */
        size_t hot = strtoull(argv[2], NULL, 10), extra = strtoull(argv[3], NULL, 10);
        size_t size = strtoull(argv[4], NULL, 10);
        uintptr_t (*dalloc)(size_t) = (uintptr_t(*)(size_t))api("transit_device_alloc");
        int (*dfree)(uintptr_t) = (int (*)(uintptr_t))api("transit_device_free");
        int (*write_stats)(const char *) = (int (*)(const char *))api("transit_write_stats");
        void *p, *q;
        cudaMalloc(&p, hot);
        cudaMalloc(&q, extra);
        printf("p=0x%llx\nq=0x%llx\n", (unsigned long long)(uintptr_t)p, (unsigned long long)(uintptr_t)q);
        if (!dalloc)
            return 1;
        uintptr_t buf = dalloc(size);
        printf("buf=0x%llx\n", (unsigned long long)buf);
        printf("last_error=%d\n", (int)cudaGetLastError()); /* a refusal of the runtime's is the shim's own */
        printf("too_large=0x%llx\n", (unsigned long long)dalloc((size_t)1 << 62));
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        printf("free=%zu\ntotal=%zu\n", fr, tot);
        print_tally();
        printf("stats=%d\n", write_stats(argv[5]));
        printf("freed=%d\n", dfree(buf));
        printf("freed_again=%d\n", dfree(buf));
        cudaFree(q);
        cudaFree(p);
        return 0;
    }
    if (!strcmp(argv[1], "state") && argc >= 6) {
        /* HOT STATE PARTS STATS [step|step-nohint]: HOT bytes of the application's, then PARTS
         * allocations of STATE bytes marked as optimizer state (transit_state_alloc), then one
         * unmarked allocation of STATE bytes; a kernel touches everything; (with step: the
         * adapter's hints and two boundaries); stats; all freed. */
        size_t hot = strtoull(argv[2], NULL, 10), state = strtoull(argv[3], NULL, 10);
        int parts = atoi(argv[4]);
        void (*mark)(int) = (void (*)(int))api("transit_state_alloc");
        int (*is_host)(uintptr_t, size_t) = (int (*)(uintptr_t, size_t))api("transit_host_state");
        int (*write_stats)(const char *) = (int (*)(const char *))api("transit_write_stats");
        if (!mark || !is_host || parts < 1 || parts > 8)
            return 1;
        void *h, *s[8], *after;
        if (getenv("APP_DEVICE"))
            cudaSetDevice(atoi(getenv("APP_DEVICE"))); /* the job's device: the shim's fill registers there */
        cudaMalloc(&h, hot);
        /* APP_HOT_FREED_FIRST: training's order: the step's activations are freed before the
         * optimizer makes its state, and the next step makes them again after it */
        int hot_freed = getenv("APP_HOT_FREED_FIRST") != NULL;
        if (hot_freed)
            cudaFree(h);
        int expecting = segs_opt(argc >= 7 ? argv[6] : NULL, state);
        if (expecting < 0)
            return 1;
        mark(1);
        for (int i = 0; i < parts; i++) {
            printf("state%d_err=%d\n", i, (int)cudaMalloc(&s[i], state));
            if (i == 0 && getenv("APP_PREFILL_OPEN_AFTER_FIRST"))
                prefill_open(); /* the fill may go on now that the first state took its region */
        }
        if (hot_freed) { /* unmarked: the activations are not state */
            mark(0);
            cudaMalloc(&h, hot);
            mark(1);
        }
        struct other o = {state, NULL};
        pthread_t t; /* another thread's allocation meanwhile is not state: the mark is the caller's */
        if (pthread_create(&t, NULL, other_alloc, &o) || pthread_join(t, NULL))
            return 1;
        mark(0);
        if (expecting == 1)
            segs_end(s, parts, state);
        printf("last_error=%d\n", (int)cudaGetLastError());
        printf("after_err=%d\n", (int)cudaMalloc(&after, state));
        struct fake_touch all[11] = {{(uintptr_t)h, hot}};
        for (int i = 0; i < parts; i++) {
            printf("state%d_host=%d\n", i, is_host((uintptr_t)s[i], state));
            all[1 + i] = (struct fake_touch){(uintptr_t)s[i], state};
        }
        printf("inside_host=%d\n", is_host((uintptr_t)s[parts - 1] + 8, state - 8));
        printf("past_end_host=%d\n", is_host((uintptr_t)s[parts - 1] + 8, state));
        printf("after_host=%d\nhot_host=%d\nother_host=%d\n", is_host((uintptr_t)after, state),
               is_host((uintptr_t)h, hot), is_host((uintptr_t)o.p, state));
        all[1 + parts] = (struct fake_touch){(uintptr_t)after, state};
        touch_kernel(all, 0);
        if (argc >= 7 && strncmp(argv[6], "step", 4) == 0) {
            /* what the adapter does after the first optimizer step: the state's hints
             * ("step"; "step-nohint": none), then two iteration boundaries */
            int (*hint)(uintptr_t, size_t, int) = (int (*)(uintptr_t, size_t, int))api("transit_hint");
            int (*iteration)(void) = (int (*)(void))api("transit_iteration");
            if (!hint || !iteration)
                return 1;
            for (int i = 0; i < parts && strcmp(argv[6], "step") == 0; i++)
                printf("hint%d=%d\n", i, hint((uintptr_t)s[i], state, 2));
            for (int it = 0; it < 2; it++) {
                iteration();
                touch_kernel(all, 0);
            }
        }
        printf("stats=%d\n", write_stats(argv[5]));
        print_tally();
        for (int i = 0; i < parts; i++)
            printf("free%d=%d\n", i, (int)cudaFree(s[i]));
        printf("free_after=%d\n", (int)cudaFree(after));
        cudaFree(o.p);
        cudaFree(h);
        print_tally();
        return 0;
    }
    if (!strcmp(argv[1], "state-threads") && argc >= 6) {
        /* HOT STATE THREADS STATS [expect:SLACK]: HOT bytes, then THREADS threads at once each
         * make one allocation of STATE bytes marked as optimizer state on its own thread */
        size_t hot = strtoull(argv[2], NULL, 10), state = strtoull(argv[3], NULL, 10);
        int k = atoi(argv[4]);
        int (*is_host)(uintptr_t, size_t) = (int (*)(uintptr_t, size_t))api("transit_host_state");
        int (*write_stats)(const char *) = (int (*)(const char *))api("transit_write_stats");
        if (!api("transit_state_alloc") || !is_host || k < 1 || k > 16)
            return 1;
        void *h, *s[16];
        struct marked m[16];
        pthread_t t[16];
        pthread_barrier_t go;
        pthread_barrier_init(&go, NULL, (unsigned)k);
        cudaMalloc(&h, hot);
        int expecting = segs_opt(argc >= 7 ? argv[6] : NULL, state);
        if (expecting < 0)
            return 1;
        for (int i = 0; i < k; i++) {
            m[i] = (struct marked){state, NULL, -1, &go};
            if (pthread_create(&t[i], NULL, marked_alloc, &m[i]))
                return 1;
        }
        for (int i = 0; i < k; i++) {
            pthread_join(t[i], NULL);
            s[i] = m[i].p;
            printf("state%d_err=%d\nstate%d_host=%d\n", i, m[i].err, i, is_host((uintptr_t)s[i], state));
        }
        pthread_barrier_destroy(&go);
        if (expecting == 1)
            segs_end(s, k, state);
        printf("stats=%d\n", write_stats(argv[5]));
        print_tally();
        for (int i = 0; i < k; i++)
            printf("free%d=%d\n", i, (int)cudaFree(s[i]));
        cudaFree(h);
        printf("freed=1\n");
        print_tally();
        return 0;
    }
    if (!strcmp(argv[1], "place") && argc >= 5) {
        size_t size = strtoull(argv[2], NULL, 10), extra = strtoull(argv[3], NULL, 10);
        int (*hint)(uintptr_t, size_t, int) = (int (*)(uintptr_t, size_t, int))api("transit_hint");
        void (*apply)(void) = (void (*)(void))api("transit_apply");
        int (*write_stats)(const char *) = (int (*)(const char *))api("transit_write_stats");
        void *p, *q = NULL, *late = NULL;
        unsigned long long late_size = 0;
        cudaMalloc(&p, size);
        if (extra)
            cudaMalloc(&q, extra);
        printf("ptr=0x%llx\nq=0x%llx\n", (unsigned long long)(uintptr_t)p, (unsigned long long)(uintptr_t)q);
        if (!hint)
            return 1;
        for (int i = 5; i < argc; i++) {
            unsigned long long off, len;
            int kind;
            if (sscanf(argv[i], "late:%llu", &late_size) == 1)
                continue;
            if (sscanf(argv[i], "%llu:%llu:%d", &off, &len, &kind) == 3)
                printf("hint%d=%d\n", i - 5, hint((uintptr_t)p + off, len, kind));
        }
        apply();
        if (late_size) {
            cudaMalloc(&late, late_size);
            printf("late=0x%llx\n", (unsigned long long)(uintptr_t)late);
        }
        apply(); /* a steady state: the second boundary must move nothing */
        /* the next step's kernels read and write everything (hot data and cold state alike) */
        struct fake_touch all[4] = {{(uintptr_t)p, size}, {(uintptr_t)q, q ? extra : 0}, {0, 0}, {0, 0}};
        if (late)
            all[q ? 2 : 1] = (struct fake_touch){(uintptr_t)late, late_size};
        touch_kernel(all, 0);
        printf("stats=%d\n", write_stats(argv[4]));
        print_tally();
        if (q)
            cudaFree(q);
        if (late)
            cudaFree(late);
        cudaFree(p);
        return 0;
    }
    if (!strcmp(argv[1], "hostreg")) {
        /* bench/probes/cuda_error_probe.c's registered-memory cases, in its order */
        unsigned fl = cudaHostRegisterPortable | cudaHostRegisterMapped;
        size_t n = 256u << 20, f0 = 0, f1 = 0, t = 0;
        char *reg = NULL;
        printf("host_register_null=%d\n", (int)cudaHostRegister(NULL, 1u << 20, fl));
        cudaGetLastError();
        if (posix_memalign((void **)&reg, 4096, n))
            return 1;
        printf("host_register_zero=%d\n", (int)cudaHostRegister(reg, 0, fl));
        cudaGetLastError();
        cudaMemGetInfo(&f0, &t);
        printf("host_register=%d\n", (int)cudaHostRegister(reg, n, fl));
        cudaMemGetInfo(&f1, &t);
        printf("host_register_free_change=%lld\n", (long long)f0 - (long long)f1);
        printf("host_register_twice=%d\n", (int)cudaHostRegister(reg, n, fl));
        cudaGetLastError();
        printf("host_register_cudafree=%d\n", (int)cudaFree(reg));
        cudaGetLastError();
        printf("host_unregister=%d\n", (int)cudaHostUnregister(reg));
        printf("host_unregister_again=%d\n", (int)cudaHostUnregister(reg));
        free(reg);
        return 0;
    }
    if (!strcmp(argv[1], "uvm") && argc >= 3) {
        void (*residency)(unsigned long long *) = (void (*)(unsigned long long *))api("fake_cudart_residency");
        char *base;
        cudaError_t e = cudaMallocManaged((void **)&base, strtoull(argv[2], NULL, 10), cudaMemAttachGlobal);
        printf("managed=%d\n", (int)e);
        for (int i = 3; i < argc && residency; i++) {
            unsigned long long off, len, r[FAKE_RES_N];
            int adv, loc;
            if (sscanf(argv[i], "advise:%llu:%llu:%d:%d", &off, &len, &adv, &loc) == 4) {
                struct cudaMemLocation l = {loc == 1 ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost, 0};
                e = cudaMemAdvise(base + off, len, (enum cudaMemoryAdvise)adv, l);
            } else if (sscanf(argv[i], "prefetch:%llu:%llu:%d", &off, &len, &loc) == 3) {
                struct cudaMemLocation l = {loc == 1 ? cudaMemLocationTypeDevice : cudaMemLocationTypeHost, 0};
                e = cudaMemPrefetchAsync(base + off, len, l, 0, 0);
            } else if (sscanf(argv[i], "touch:%llu:%llu", &off, &len) == 2) {
                struct fake_touch t[2] = {{(uintptr_t)base + off, len}, {0, 0}};
                e = touch_kernel(t, 0);
            } else if (sscanf(argv[i], "plain:%llu", &len) == 1) {
                void *q;
                e = cudaMalloc(&q, len);
            } else if (!strcmp(argv[i], "advise-plain") || !strcmp(argv[i], "prefetch-plain") ||
                       !strcmp(argv[i], "advise-stack") || !strcmp(argv[i], "prefetch-stack")) {
                /* over memory that is not managed: 1 MiB of cudaMalloc, or this stack's bytes */
                static char stack_bytes[1 << 20];
                void *q = stack_bytes;
                if (strstr(argv[i], "plain"))
                    cudaMalloc(&q, 1u << 20);
                struct cudaMemLocation h = {cudaMemLocationTypeHost, 0};
                e = argv[i][0] == 'a' ? cudaMemAdvise(q, 1u << 20, cudaMemAdviseSetPreferredLocation, h)
                                      : cudaMemPrefetchAsync(q, 1u << 20, h, 0, 0);
            } else if (sscanf(argv[i], "hostwrite:%llu:%llu", &off, &len) == 2) {
                void (*hw)(void *, size_t) = (void (*)(void *, size_t))api("fake_cudart_host_write");
                hw(base + off, len);
                e = cudaSuccess;
            } else if (!strcmp(argv[i], "info")) {
                size_t f = 0, t = 0;
                e = cudaMemGetInfo(&f, &t);
                printf("step%d_free=%zu\n", i - 3, f);
            } else if (!strcmp(argv[i], "zero")) {
                void *z = (void *)1;
                e = cudaMallocManaged(&z, 0, cudaMemAttachGlobal);
                printf("step%d_ptr_null=%d\n", i - 3, z == NULL);
            } else {
                return 2;
            }
            residency(r);
            printf("step%d_err=%d\nstep%d_dev=%llu\nstep%d_host=%llu\nstep%d_zero_copy=%llu\nstep%d_migrated=%llu\n"
                   "step%d_first_touch=%llu\nstep%d_device_peak=%llu\n", i - 3, (int)e, i - 3, r[FAKE_RES_DEV],
                   i - 3, r[FAKE_RES_HOST], i - 3, r[FAKE_RES_ZERO_COPY], i - 3, r[FAKE_RES_MIGRATED], i - 3,
                   r[FAKE_RES_FIRST_TOUCH], i - 3, r[FAKE_RES_DEVICE_PEAK]);
            cudaGetLastError();
        }
        return 0;
    }
    if (!strcmp(argv[1], "stress"))
        return stress(argc, argv);
    if (!strcmp(argv[1], "fork")) {
        size_t size = strtoull(argv[2], NULL, 10);
        void *p;
        cudaMalloc(&p, size);
        pid_t c = fork();
        if (c == 0) {
            void *q;
            int e = cudaMalloc(&q, 4096);
            printf("child=%d\n", e);
            fflush(stdout);
            _exit(0);
        }
        int st;
        waitpid(c, &st, 0);
        printf("parent=%d\n", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        cudaFree(p);
        return 0;
    }
    return 2;
}
