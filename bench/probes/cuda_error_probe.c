/* What the real CUDA runtime answers in the cases the shim must imitate (tests/fakecuda
 * models these answers; its header says which case backs which answer): cudaMalloc with
 * a NULL devPtr, cudaFree of a pointer it never gave out, an allocation that cannot fit
 * (and how long the refusal takes), and whether the last error is per thread and sticky
 * until read (measured 2026-11-30, bench/results/2026-11-30/cuda_error_probe_2026-11-30.json). Since
 * issue 33 also the cases the fake answered without a measurement:
 *   malloc_zero, managed_zero: cudaMalloc / cudaMallocManaged of 0 bytes (error, NULL?)
 *   advise_device, advise_host, prefetch_device, prefetch_host: advice and prefetches over
 *     plain device memory and over host memory that is not managed
 *   prefetch_past_end: a prefetch running past the end of a managed allocation
 *   memgetinfo_managed_resident: cudaMemGetInfo's free bytes drop by 256 MiB of managed
 *     memory prefetched to the device? (and back after a prefetch to the host)
 *   first_touch_preferred_host: a device write (cudaMemset) of never-touched managed
 *     memory advised preferred-host + accessed-by-device: free bytes unchanged means it was
 *     populated on the host and mapped; down by 256 MiB, populated on the device
 *   touch_host_resident_preferred_host: the same write after a prefetch to the host
 *   touch_host_resident_no_advice: a device write of host-resident pages without advice
 *     (the fake migrates them: free should drop)
 *   attr_managed, attr_concurrent, attr_pageable: the device attributes
 *   host_register_*: cudaHostRegister of NULL, of 0 bytes, of 256 MiB (free bytes before and
 *     after: pinned host memory takes none of the device's), of the same range twice, then
 *     cudaFree of it, cudaHostUnregister of it and of it again (issue 33, 2026-12-02)
 * Build and run on a GPU machine (the include directory the shim's build finds,
 * transit_launch/preload/build.py's find_header):
 *   cc -O1 -I/usr/local/cuda/include bench/probes/cuda_error_probe.c -L/usr/local/cuda/lib64 -lcudart -lpthread \
 *      -o /tmp/probe && /tmp/probe
 * Prints one JSON object. Allocates nothing that could succeed beyond 256 MiB of managed
 * memory and 1 MiB of device memory (never more managed memory than the card has free). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime_api.h>

#define MIB (1ull << 20)
#define MANAGED (256 * MIB)

static cudaError_t other_thread_last = cudaSuccess;

static void *peek_other(void *arg)
{
    (void)arg;
    other_thread_last = cudaGetLastError();
    return NULL;
}

static long long free_bytes(void)
{
    size_t f = 0, t = 0;
    cudaDeviceSynchronize();
    return cudaMemGetInfo(&f, &t) == cudaSuccess ? (long long)f : -1;
}

static const struct cudaMemLocation DEV = {cudaMemLocationTypeDevice, 0}, HOST = {cudaMemLocationTypeHost, 0};

/* free bytes before, then after f(p) for each phase, of a fresh MANAGED allocation */
struct residency { int err; long long before, after_a, after_b; };

static struct residency managed_case(int advise, int prefetch_first, int touch)
{
    struct residency r = {0, -1, -1, -1};
    char *p = NULL;
    if ((r.err = cudaMallocManaged((void **)&p, MANAGED, cudaMemAttachGlobal)) != cudaSuccess)
        return r;
    if (advise) {
        cudaMemAdvise(p, MANAGED, cudaMemAdviseSetPreferredLocation, HOST);
        cudaMemAdvise(p, MANAGED, cudaMemAdviseSetAccessedBy, DEV);
    }
    if (prefetch_first == 2)
        cudaMemPrefetchAsync(p, MANAGED, HOST, 0, 0);
    r.before = free_bytes();
    if (prefetch_first == 1) { /* to the device, then back to the host */
        cudaMemPrefetchAsync(p, MANAGED, DEV, 0, 0);
        r.after_a = free_bytes();
        cudaMemPrefetchAsync(p, MANAGED, HOST, 0, 0);
        r.after_b = free_bytes();
    }
    if (touch) { /* the device writes every page */
        r.err = cudaMemset(p, 1, MANAGED);
        r.after_a = free_bytes();
    }
    cudaFree(p);
    cudaGetLastError();
    return r;
}

static void print_residency(const char *name, struct residency r, int last)
{
    printf("\"%s\": {\"err\": %d, \"free_before\": %lld, \"free_after_a\": %lld, \"free_after_b\": %lld}%s", name,
           r.err, r.before, r.after_a, r.after_b, last ? "" : ", ");
}

int main(void)
{
    void *p = NULL;
    cudaFree(0); /* context */
    cudaError_t null_ptr = cudaMalloc(NULL, 1 << 20);
    cudaError_t after_null = cudaGetLastError();
    int local = 0;
    cudaError_t foreign_free = cudaFree(&local);
    cudaGetLastError();
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    cudaError_t huge = cudaMalloc(&p, (size_t)1 << 62);
    clock_gettime(CLOCK_MONOTONIC, &b);
    void *huge_ptr = p;
    pthread_t t;
    pthread_create(&t, NULL, peek_other, NULL);
    pthread_join(t, NULL);
    cudaError_t peek = cudaPeekAtLastError();
    cudaError_t last = cudaGetLastError();
    cudaError_t last_again = cudaGetLastError();
    printf("{\"malloc_null_devptr\": %d, \"last_after_null\": %d, \"free_foreign\": %d, \"malloc_2_62\": %d, "
           "\"malloc_2_62_ptr_null\": %s, \"malloc_2_62_ms\": %.3f, \"other_thread_last\": %d, \"peek\": %d, "
           "\"last\": %d, \"last_again\": %d, ",
           null_ptr, after_null, foreign_free, huge, huge_ptr ? "false" : "true",
           (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6, other_thread_last, peek, last, last_again);

    /* zero-byte allocations: the error, and whether the pointer came back NULL */
    void *z = (void *)1;
    cudaError_t malloc_zero = cudaMalloc(&z, 0);
    int malloc_zero_null = z == NULL;
    if (z && z != (void *)1)
        cudaFree(z);
    cudaGetLastError();
    void *mz = (void *)1;
    cudaError_t managed_zero = cudaMallocManaged(&mz, 0, cudaMemAttachGlobal);
    int managed_zero_null = mz == NULL;
    if (mz && mz != (void *)1)
        cudaFree(mz);
    cudaGetLastError();
    printf("\"malloc_zero\": %d, \"malloc_zero_ptr_null\": %s, \"managed_zero\": %d, \"managed_zero_ptr_null\": %s, ",
           malloc_zero, malloc_zero_null ? "true" : "false", managed_zero, managed_zero_null ? "true" : "false");

    /* advice and prefetches over memory that is not managed */
    void *dev = NULL;
    cudaMalloc(&dev, MIB);
    char *host = malloc(MIB);
    cudaError_t advise_device = cudaMemAdvise(dev, MIB, cudaMemAdviseSetPreferredLocation, HOST);
    cudaGetLastError();
    cudaError_t advise_host = cudaMemAdvise(host, MIB, cudaMemAdviseSetPreferredLocation, HOST);
    cudaGetLastError();
    cudaError_t prefetch_device = cudaMemPrefetchAsync(dev, MIB, HOST, 0, 0);
    cudaGetLastError();
    cudaError_t prefetch_host = cudaMemPrefetchAsync(host, MIB, DEV, 0, 0);
    cudaGetLastError();
    char *m = NULL;
    cudaError_t past_end = cudaErrorUnknown;
    if (cudaMallocManaged((void **)&m, 4 * MIB, cudaMemAttachGlobal) == cudaSuccess) {
        past_end = cudaMemPrefetchAsync(m + 2 * MIB, 4 * MIB, DEV, 0, 0);
        cudaDeviceSynchronize();
        cudaGetLastError();
        cudaFree(m);
    }
    cudaFree(dev);
    free(host);
    int attr_managed = -1, attr_concurrent = -1, attr_pageable = -1;
    cudaDeviceGetAttribute(&attr_managed, cudaDevAttrManagedMemory, 0);
    cudaDeviceGetAttribute(&attr_concurrent, cudaDevAttrConcurrentManagedAccess, 0);
    cudaDeviceGetAttribute(&attr_pageable, cudaDevAttrPageableMemoryAccess, 0);
    printf("\"advise_device\": %d, \"advise_host\": %d, \"prefetch_device\": %d, \"prefetch_host\": %d, "
           "\"prefetch_past_end\": %d, \"attr_managed\": %d, \"attr_concurrent\": %d, \"attr_pageable\": %d, ",
           advise_device, advise_host, prefetch_device, prefetch_host, past_end, attr_managed, attr_concurrent,
           attr_pageable);

    /* registered host memory (the shim's pinned optimizer state, shim/hoststate.c): what the
     * fake runtime answers without a probe until now */
    char *reg = NULL;
    cudaError_t reg_null = cudaHostRegister(NULL, MIB, cudaHostRegisterPortable | cudaHostRegisterMapped);
    cudaGetLastError();
    cudaError_t reg_zero = cudaErrorUnknown, reg_ok = cudaErrorUnknown, reg_twice = cudaErrorUnknown;
    cudaError_t reg_free = cudaErrorUnknown, unreg = cudaErrorUnknown, unreg_again = cudaErrorUnknown;
    long long reg_before = -1, reg_after = -1;
    if (posix_memalign((void **)&reg, 4096, MANAGED) == 0) {
        for (size_t i = 0; i < MANAGED; i += 4096)
            reg[i] = 1; /* its pages exist: registering pins them */
        reg_zero = cudaHostRegister(reg, 0, cudaHostRegisterPortable | cudaHostRegisterMapped);
        cudaGetLastError();
        reg_before = free_bytes();
        reg_ok = cudaHostRegister(reg, MANAGED, cudaHostRegisterPortable | cudaHostRegisterMapped);
        reg_after = free_bytes();
        reg_twice = cudaHostRegister(reg, MANAGED, cudaHostRegisterPortable | cudaHostRegisterMapped);
        cudaGetLastError();
        reg_free = cudaFree(reg); /* cudaFree of registered host memory */
        cudaGetLastError();
        unreg = cudaHostUnregister(reg);
        unreg_again = cudaHostUnregister(reg);
        cudaGetLastError();
        free(reg);
    }
    printf("\"host_register_null\": %d, \"host_register_zero\": %d, \"host_register\": %d, "
           "\"host_register_free_before\": %lld, \"host_register_free_after\": %lld, \"host_register_twice\": %d, "
           "\"host_register_cudafree\": %d, \"host_unregister\": %d, \"host_unregister_again\": %d, ",
           reg_null, reg_zero, reg_ok, reg_before, reg_after, reg_twice, reg_free, unreg, unreg_again);

    /* residency as cudaMemGetInfo sees it (free bytes; 256 MiB is the signal) */
    print_residency("memgetinfo_managed_resident", managed_case(0, 1, 0), 0);
    print_residency("first_touch_preferred_host", managed_case(1, 0, 1), 0);
    print_residency("touch_host_resident_preferred_host", managed_case(1, 2, 1), 0);
    print_residency("touch_host_resident_no_advice", managed_case(0, 2, 1), 1);
    printf("}\n");
    return 0;
}
