/* A program linked against libcudart (the fake in tests) the way PyTorch's libraries
 * are: its cudaMalloc/cudaFree/cudaLaunchKernel references resolve through the global
 * scope, so an LD_PRELOADed shim intercepts them. Prints results as key=value lines.
 *
 *   app alloc SIZE [SIZE...]      allocate each, print error codes and cudaMemGetInfo, free
 *   app threads N ITERS SIZE      N threads allocate and free concurrently
 *   app loop ITERS LAUNCHES SIZE [adapter]   training-like loop over fake kernels
 *   app hint SIZE OFF LEN KIND    allocate, hint a sub-range, apply, print
 *   app fork SIZE                 allocate, fork a child that allocates too, wait
 *   app stage STEPS STATS         steps of a training loop with staging calls (TRANSIT_STAGE=1)
 *   app place SIZE EXTRA STATS OFF:LEN:KIND... [late:SIZE]   allocate SIZE then EXTRA (0:
 *                                 none), hint ranges of the first, apply, allocate the late
 *                                 SIZE (the next step's new segment), apply, write stats
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

static void kern0(void) {}
static void kern1(void) {}
static void kern2(void) {}
static void kern3(void) {}
static void (*kerns[])(void) = {kern0, kern1, kern2, kern3};

/* what CUDA 13 nvcc stubs call (crt/device_functions.h, C++ only there) */
cudaError_t __cudaLaunchKernel(const void *kernel, dim3 grid, dim3 block, void **args, size_t shmem,
                               cudaStream_t stream);

static void *api(const char *name) { return dlsym(RTLD_DEFAULT, name); }

static int threads_iters;
static size_t threads_size;
static void *worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < threads_iters; i++) {
        void *p;
        if (cudaMalloc(&p, threads_size + (size_t)i % 7 * 4096) == cudaSuccess)
            cudaFree(p);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    if (!strcmp(argv[1], "alloc")) {
        void *ptrs[64];
        int n = 0;
        for (int i = 2; i < argc && n < 64; i++) {
            cudaError_t e = cudaMalloc(&ptrs[n], strtoull(argv[i], NULL, 10));
            printf("alloc%d=%d\n", i - 2, (int)e);
            if (e == cudaSuccess)
                n++;
        }
        size_t f, t;
        cudaMemGetInfo(&f, &t);
        printf("free=%zu\ntotal=%zu\n", f, t);
        for (int i = 0; i < n; i++)
            cudaFree(ptrs[i]);
        return 0;
    }
    if (!strcmp(argv[1], "threads")) {
        int n = atoi(argv[2]);
        threads_iters = atoi(argv[3]);
        threads_size = strtoull(argv[4], NULL, 10);
        pthread_t th[64];
        for (int i = 0; i < n; i++)
            pthread_create(&th[i], NULL, worker, NULL);
        for (int i = 0; i < n; i++)
            pthread_join(th[i], NULL);
        printf("done=1\n");
        return 0;
    }
    if (!strcmp(argv[1], "loop")) {
        int iters = atoi(argv[2]), launches = atoi(argv[3]);
        size_t size = strtoull(argv[4], NULL, 10);
        int adapter = 0, replay = 0, straddle = 0;
        for (int i = 5; i < argc; i++) {
            adapter |= !strcmp(argv[i], "adapter");
            replay |= !strcmp(argv[i], "replay");
            straddle |= !strcmp(argv[i], "straddle");
        }
        int (*iteration)(void) = (int (*)(void))api("transit_iteration");
        void *p, *q;
        cudaMalloc(&p, size);
        cudaMalloc(&q, size);
        printf("p=0x%llx\nq=0x%llx\n", (unsigned long long)(uintptr_t)p, (unsigned long long)(uintptr_t)q);
        if (replay) { /* q is on the host: replay 768 MB of it before launch 5, 512 MB before 10 */
            void (*add)(uint64_t, uintptr_t, uint64_t) = (void (*)(uint64_t, uintptr_t, uint64_t))api("transit_test_replay_add");
            void (*finish)(void) = (void (*)(void))api("transit_test_replay_finish");
            add(5, (uintptr_t)q, 768u << 20);
            add(10, (uintptr_t)q + (1u << 30), 256u << 20);
            add(10, (uintptr_t)q + (1u << 30) + (256u << 20) + 4096, 256u << 20); /* merged: gap < 128 KB */
            if (straddle) { /* the last MB of p and the first of q, which follows it: not one range */
                add(7, (uintptr_t)p + size - (1u << 20), 1u << 20);
                add(7, (uintptr_t)q, 1u << 20);
            }
            finish();
        }
        for (int it = 0; it < iters; it++) {
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
            if (adapter && iteration)
                iteration();
        }
        printf("last_error=%d\n", (int)cudaGetLastError()); /* what PyTorch checks after launches */
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
        printf("stats=%d\n", write_stats(argv[4]));
        if (q)
            cudaFree(q);
        if (late)
            cudaFree(late);
        cudaFree(p);
        return 0;
    }
    if (!strcmp(argv[1], "stage") && argc >= 4) {
        /* STEPS STATS: a 4 GiB hot allocation, 2 GiB of optimizer state in two hinted
         * halves; each step allocates 1 GiB of activations, frees them (the framework's
         * cache given back at the start of backward), stages, allocates 0.5 GiB of
         * gradients, waits, runs the optimizer, ends the iteration, stages out, frees.
         * A 4th argument "grow": from step 3 the gradients take 1 GiB, more than learned. */
        const size_t GiB = 1ull << 30;
        int steps = atoi(argv[2]), grow = argc > 4 && !strcmp(argv[4], "grow");
        size_t (*in)(uintptr_t) = (size_t(*)(uintptr_t))api("transit_stage_in");
        size_t (*out)(uintptr_t) = (size_t(*)(uintptr_t))api("transit_stage_out");
        int (*wait)(uintptr_t) = (int (*)(uintptr_t))api("transit_stage_wait");
        int (*hint)(uintptr_t, size_t, int) = (int (*)(uintptr_t, size_t, int))api("transit_hint");
        int (*iteration)(void) = (int (*)(void))api("transit_iteration");
        int (*write_stats)(const char *) = (int (*)(const char *))api("transit_write_stats");
        if (!in || !out || !wait || !hint || !iteration)
            return 1;
        cudaStream_t app = (cudaStream_t)0x77;
        void *a, *o, *t, *g;
        cudaMalloc(&a, 4 * GiB);
        cudaMalloc(&o, 2 * GiB);
        hint((uintptr_t)o, GiB, 2);
        hint((uintptr_t)o + GiB, GiB, 2);
        printf("o=0x%llx\n", (unsigned long long)(uintptr_t)o);
        for (int i = 1; i <= steps; i++) {
            cudaMalloc(&t, GiB);
            cudaLaunchKernel((const void *)kern0, (dim3){1, 1, 1}, (dim3){1, 1, 1}, NULL, 0, app);
            cudaFree(t);
            printf("staged%d=%zu\n", i, in((uintptr_t)app));
            cudaMalloc(&g, grow && i >= 3 ? GiB : GiB / 2);
            printf("waited%d=%d\n", i, wait((uintptr_t)app));
            cudaLaunchKernel((const void *)kern1, (dim3){1, 1, 1}, (dim3){1, 1, 1}, NULL, 0, app);
            iteration();
            printf("out%d=%zu\n", i, out((uintptr_t)app));
            cudaFree(g);
        }
        printf("stats=%d\n", write_stats(argv[3]));
        printf("last_error=%d\n", (int)cudaPeekAtLastError());
        cudaFree(o);
        cudaFree(a);
        return 0;
    }
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
