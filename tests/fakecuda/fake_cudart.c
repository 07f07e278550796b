/* A stand-in libcudart.so.13 for tests on machines without a GPU: it exports the runtime
 * entry points the shim uses, simulates a device of FAKE_GPU_MEM bytes with fake
 * addresses (never dereferenced), and appends every call to $FAKE_CUDART_LOG.
 * Knobs: FAKE_GPU_MEM, FAKE_RUNTIME_VERSION (13000), FAKE_NO_MANAGED=1,
 * FAKE_MANAGED_FAIL=1 (cudaMallocManaged returns cudaErrorNotSupported). */
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t next_addr = 0x7f0000000000ull, used, total;
static FILE *logf;

struct blk { uint64_t p, n; };
static struct blk *blks;
static size_t nblk, cblk;

static void init(void)
{
    if (total)
        return;
    const char *m = getenv("FAKE_GPU_MEM");
    total = m ? strtoull(m, NULL, 10) : 80000000000ull;
    const char *l = getenv("FAKE_CUDART_LOG");
    if (l)
        logf = fopen(l, "a");
}

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

/* Managed memory, as with real UVM, takes no device memory until touched: only
 * cudaMalloc counts against FAKE_GPU_MEM. */
static cudaError_t alloc(void **p, size_t n, const char *what)
{
    int managed = what[10] == 'M';
    pthread_mutex_lock(&mu);
    init();
    if (!managed && used + n > total) {
        logcall("%s %zu -> oom", what, n);
        pthread_mutex_unlock(&mu);
        return cudaErrorMemoryAllocation;
    }
    uint64_t a = next_addr;
    next_addr += (n + (2u << 20) - 1) & ~(uint64_t)((2u << 20) - 1);
    if (!managed)
        used += n;
    if (nblk == cblk) {
        cblk = cblk ? cblk * 2 : 64;
        blks = realloc(blks, cblk * sizeof *blks);
    }
    blks[nblk++] = (struct blk){a, managed ? 0 : n};
    *p = (void *)a;
    logcall("%s %zu 0x%llx", what, n, (unsigned long long)a);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n) { return alloc(p, n, "cudaMalloc"); }

cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags)
{
    (void)flags;
    if (getenv("FAKE_MANAGED_FAIL"))
        return cudaErrorNotSupported;
    return alloc(p, n, "cudaMallocManaged");
}

cudaError_t cudaFree(void *p)
{
    pthread_mutex_lock(&mu);
    init();
    for (size_t i = 0; i < nblk; i++)
        if (blks[i].p == (uint64_t)p) {
            used -= blks[i].n;
            blks[i] = blks[--nblk];
            break;
        }
    logcall("cudaFree 0x%llx", (unsigned long long)(uintptr_t)p);
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
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
/* like the runtime: a failed call leaves its error for cudaGetLastError (which resets it)
 * and cudaPeekAtLastError (which does not) */
static cudaError_t last_error = cudaSuccess;
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
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

cudaError_t cudaMemPrefetchAsync(const void *p, size_t n, struct cudaMemLocation loc, unsigned int flags,
                                 cudaStream_t s)
{
    (void)flags;
    pthread_mutex_lock(&mu);
    logcall("cudaMemPrefetchAsync 0x%llx %zu %d %d %p", (unsigned long long)(uintptr_t)p, n, (int)loc.type, loc.id,
            (void *)s);
    pthread_mutex_unlock(&mu);
    if (getenv("FAKE_PREFETCH_FAIL")) /* e.g. a range over unmapped memory */
        return last_error = cudaErrorInvalidValue;
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
        return last_error = cudaErrorInvalidResourceHandle;
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
