/* A stand-in libcudart.so.13 for tests on machines without a GPU: it exports the runtime
 * entry points the shim uses, simulates a device of FAKE_GPU_MEM bytes with fake
 * addresses (never dereferenced), and appends every call to $FAKE_CUDART_LOG.
 * Knobs: FAKE_GPU_MEM, FAKE_HOST_MEM (managed bytes that fit, 2 TiB), FAKE_RUNTIME_VERSION
 * (13000), FAKE_NO_MANAGED=1, FAKE_MANAGED_FAIL=1 (cudaMallocManaged returns
 * cudaErrorNotSupported), FAKE_MANAGED_OOM_EVERY=N (every Nth cudaMallocManaged runs out
 * of memory).
 *
 * Errors as the CUDA 13 runtime gives them (checked on an H200): a NULL devPtr is
 * cudaErrorInvalidValue, an allocation that does not fit cudaErrorMemoryAllocation with
 * *devPtr = NULL, cudaMalloc of 0 bytes succeeds with NULL, cudaFree of a pointer it did
 * not allocate cudaErrorInvalidValue; every failure is also the calling thread's last
 * error, kept until cudaGetLastError reads it.
 *
 * Its own tally, independent of the shim's (fake_cudart_tally): live pointers, managed
 * bytes now and at their peak, rejected frees, advice and prefetches over memory that is
 * not one live managed allocation (the runtime refuses them with cudaErrorInvalidValue). */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_addr = 0x7f0000000000ull, used, total, host_mem;
static uint64_t managed_live, managed_peak, managed_calls, oom_every, bad_frees, bad_ranges;
static FILE *logf;

struct blk { uint64_t p, n; int managed; };
static struct blk *blks;
static size_t nblk, cblk;

/* like the runtime: a failed call leaves its error for cudaGetLastError (which resets it)
 * and cudaPeekAtLastError (which does not), per host thread */
static _Thread_local cudaError_t last_error = cudaSuccess;
static cudaError_t fail(cudaError_t e) { return last_error = e; }

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
    if (n == 0 && !managed) {
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
    }
    if (nblk == cblk) {
        size_t c = cblk ? cblk * 2 : 64;
        struct blk *b = realloc(blks, c * sizeof *b);
        if (!b)
            abort();
        blks = b;
        cblk = c;
    }
    blks[nblk++] = (struct blk){a, n, managed};
    *p = (void *)a;
    logcall("%s %zu 0x%llx", what, n, (unsigned long long)a);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) { return alloc(p, n, 0); }

cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    if (getenv("FAKE_MANAGED_FAIL"))
        return fail(cudaErrorNotSupported);
    return alloc(p, n, 1);
}

cudaError_t cudaFree(void *p)
{
    cudaError_t err = p ? cudaErrorInvalidValue : cudaSuccess;
    pthread_mutex_lock(&mu);
    init();
    for (size_t i = 0; p && i < nblk; i++)
        if (blks[i].p == (uint64_t)(uintptr_t)p) {
            if (blks[i].managed)
                managed_live -= blks[i].n;
            else
                used -= blks[i].n;
            blks[i] = blks[--nblk];
            err = cudaSuccess;
            break;
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

/* [p, p + n) lies in one live managed allocation; under mu. Counts the ranges that do not. */
static int managed_range(const void *p, size_t n)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    for (size_t i = 0; i < nblk; i++)
        if (blks[i].managed && a >= blks[i].p && n <= blks[i].n && a - blks[i].p <= blks[i].n - n)
            return 1;
    bad_ranges++;
    return 0;
}

cudaError_t cudaMemGetInfo(size_t *f, size_t *t)
{
    pthread_mutex_lock(&mu);
    init();
    *f = total - used;
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

cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
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
    int ok = managed_range(p, n);
    pthread_mutex_unlock(&mu);
    return ok ? cudaSuccess : fail(cudaErrorInvalidValue);
}

cudaError_t cudaMemPrefetchAsync(const void *p, size_t n, struct cudaMemLocation loc, unsigned int flags,
                                 cudaStream_t s)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    logcall("cudaMemPrefetchAsync 0x%llx %zu %d %d %p", (unsigned long long)(uintptr_t)p, n, (int)loc.type, loc.id,
            (void *)s);
    int ok = managed_range(p, n);
    pthread_mutex_unlock(&mu);
    if (!ok || getenv("FAKE_PREFETCH_FAIL")) /* FAKE_PREFETCH_FAIL: every prefetch fails */
        return fail(cudaErrorInvalidValue);
    return cudaSuccess;
}

/* Streams and events: handles are small numbers, every call is logged. cudaEventQuery
 * says not-ready while FAKE_EVENT_BUSY is set (a copy still running). */
static uintptr_t next_handle = 0x100;

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    pthread_mutex_lock(&mu);
    *s = (cudaStream_t)next_handle++;
    logcall("cudaStreamCreateWithFlags %p %u", (void *)*s, flags);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags)
{
    pthread_mutex_lock(&mu);
    *e = (cudaEvent_t)next_handle++;
    logcall("cudaEventCreateWithFlags %p %u", (void *)*e, flags);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

#define LOG2(fmt, a, b)                  \
    do {                                 \
        pthread_mutex_lock(&mu);         \
        logcall(fmt, (void *)(a), (void *)(b)); \
        pthread_mutex_unlock(&mu);       \
    } while (0)

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    LOG2("cudaEventRecord %p %p", e, s);
    if (getenv("FAKE_EVENT_FAIL")) /* e.g. an event of another context */
        return fail(cudaErrorInvalidResourceHandle);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags)
{
    (void)flags;
    LOG2("cudaStreamWaitEvent %p %p", s, e);
    return cudaSuccess;
}

static void log1(const char *what, cudaEvent_t e)
{
    pthread_mutex_lock(&mu);
    logcall("%s %p", what, (void *)e);
    pthread_mutex_unlock(&mu);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) { log1("cudaEventSynchronize", e); return cudaSuccess; }

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    log1("cudaEventQuery", e);
    return getenv("FAKE_EVENT_BUSY") ? cudaErrorNotReady : cudaSuccess;
}

/* Both launch entry points share this; like the real runtime, no internal call goes back
 * through the exported (interposable) names. */
static cudaError_t launch(const void *f, dim3 g, dim3 b, void **args, size_t shm, cudaStream_t s)
{
    (void)g; (void)b; (void)args; (void)shm;
    pthread_mutex_lock(&mu);
    logcall("cudaLaunchKernel %p %p", f, (void *)s);
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
