/* What the real CUDA runtime answers in the cases the shim must imitate (tests/fakecuda
 * models these answers): cudaMalloc with a NULL devPtr, cudaFree of a pointer it never
 * gave out, an allocation that cannot fit (and how long the refusal takes), and whether
 * the last error is per thread and sticky until read. Build and run on a GPU machine:
 *   cc -O1 -I/usr/local/cuda/include bench/cuda_error_probe.c -L/usr/local/cuda/lib64 -lcudart -lpthread \
 *      -o /tmp/probe && /tmp/probe
 * Prints one JSON object. Allocates nothing that could succeed beyond 1 MiB. */
#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include <cuda_runtime_api.h>

static cudaError_t other_thread_last = cudaSuccess;

static void *peek_other(void *arg)
{
    (void)arg;
    other_thread_last = cudaGetLastError();
    return NULL;
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
           "\"last\": %d, \"last_again\": %d}\n",
           null_ptr, after_null, foreign_free, huge, huge_ptr ? "false" : "true",
           (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6, other_thread_last, peek, last, last_again);
    return 0;
}
