/* The application's own CUDA runtime, found at first use.
 *
 * dlsym(RTLD_NEXT) finds the libcudart that follows us in the global scope (PyTorch's
 * wheels load theirs RTLD_GLOBAL). When the runtime was loaded RTLD_LOCAL, the loaded
 * libcudart is found with dl_iterate_phdr and reopened RTLD_NOLOAD: the same instance,
 * never a second copy. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "transit.h"

struct tr_real tr_real;

static int find_cudart(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    const char *slash = strrchr(info->dlpi_name, '/');
    const char *base = slash ? slash + 1 : info->dlpi_name;
    if (strncmp(base, "libcudart.so", 12) != 0)
        return 0;
    *(const char **)data = info->dlpi_name;
    return 1;
}

/* Path of the libcudart already loaded in this process, or NULL. */
const char *tr_cudart_path(void)
{
    const char *path = NULL;
    dl_iterate_phdr(find_cudart, &path);
    return path;
}

static void *sym(const char *name)
{
    void *p = dlsym(RTLD_NEXT, name);
    if (!p) {
        static void *handle;
        const char *path;
        if (!handle && (path = tr_cudart_path()))
            handle = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
        if (handle)
            p = dlsym(handle, name);
    }
    /* Never resolve to ourselves (a libcudart that re-exports through us). */
    Dl_info self, found;
    if (p && dladdr((void *)sym, &self) && dladdr(p, &found) && self.dli_fbase == found.dli_fbase)
        return NULL;
    return p;
}

#define RESOLVE(field, name) tr_real.field = (__typeof__(tr_real.field))sym(name)

int tr_real_resolve(void)
{
    RESOLVE(malloc, "cudaMalloc");
    RESOLVE(free, "cudaFree");
    RESOLVE(malloc_managed, "cudaMallocManaged");
    RESOLVE(mem_get_info, "cudaMemGetInfo");
    RESOLVE(launch_kernel, "cudaLaunchKernel");
    RESOLVE(launch_kernel_ex, "cudaLaunchKernelExC");
    RESOLVE(launch_kernel_internal, "__cudaLaunchKernel");
    RESOLVE(launch_kernel_internal_ptsz, "__cudaLaunchKernel_ptsz");
    RESOLVE(get_device, "cudaGetDevice");
    RESOLVE(device_get_attribute, "cudaDeviceGetAttribute");
    RESOLVE(runtime_get_version, "cudaRuntimeGetVersion");
    RESOLVE(device_synchronize, "cudaDeviceSynchronize");
    RESOLVE(get_last_error, "cudaGetLastError");
    RESOLVE(peek_last_error, "cudaPeekAtLastError");
    RESOLVE(host_register, "cudaHostRegister");
    RESOLVE(host_unregister, "cudaHostUnregister");
    RESOLVE(set_device, "cudaSetDevice");
    if (!tr_real.malloc || !tr_real.free) {
        tr_log(TR_ERROR, "no CUDA runtime (cudaMalloc/cudaFree) found in this process: passing through");
        return -1;
    }
    if (!tr_real.malloc_managed || !tr_real.mem_get_info || !tr_real.runtime_get_version ||
        !tr_real.get_device || !tr_real.device_get_attribute) {
        tr_log(TR_ERROR, "the CUDA runtime lacks managed-memory entry points: passing through");
        return -1;
    }
    int v = 0;
    if (tr_real.runtime_get_version(&v) != cudaSuccess || v < 11000) {
        tr_log(TR_ERROR, "CUDA runtime version %d is not supported (need 11.0 or newer): passing through", v);
        return -1;
    }
    tr_real.runtime_version = v;
    /* CUDA 13 takes cudaMemLocation under the plain names; 12.2-12.9 under *_v2. */
    if (v >= 13000) {
        tr_real.advise_fn = sym("cudaMemAdvise");
        tr_real.prefetch_fn = sym("cudaMemPrefetchAsync");
        tr_real.loc_api = 1;
    } else if (v >= 12020 && sym("cudaMemAdvise_v2")) {
        tr_real.advise_fn = sym("cudaMemAdvise_v2");
        tr_real.prefetch_fn = sym("cudaMemPrefetchAsync_v2");
        tr_real.loc_api = 1;
    } else {
        tr_real.advise_fn = sym("cudaMemAdvise");
        tr_real.prefetch_fn = sym("cudaMemPrefetchAsync");
        tr_real.loc_api = 0;
    }
    if (!tr_real.advise_fn || !tr_real.prefetch_fn) {
        tr_log(TR_ERROR, "the CUDA runtime lacks cudaMemAdvise/cudaMemPrefetchAsync: passing through");
        return -1;
    }
    return 0;
}

typedef cudaError_t (*advise_loc_t)(const void *, size_t, enum cudaMemoryAdvise, struct tr_loc);
typedef cudaError_t (*advise_dev_t)(const void *, size_t, enum cudaMemoryAdvise, int);
typedef cudaError_t (*prefetch_loc_t)(const void *, size_t, struct tr_loc, unsigned int, cudaStream_t);
typedef cudaError_t (*prefetch_dev_t)(const void *, size_t, int, cudaStream_t);

/* A failed runtime call of the shim's own (advice, prefetch, a device buffer's cudaMalloc,
 * the host state's registration) also sets the runtime's last error, which the application would then read
 * after its next kernel launch (PyTorch checks cudaGetLastError there) as its own
 * failure. Clear what the shim caused, unless an error of the application's was already
 * pending (`pending`: tr_pending_error() before the call), and count it. */
cudaError_t tr_own_error(cudaError_t pending, cudaError_t err)
{
    if (err == cudaSuccess)
        return err;
    tr_count.hint_errors++;
    tr_clear_error(pending);
    return err;
}

void tr_clear_error(cudaError_t pending)
{
    if (pending == cudaSuccess && tr_real.get_last_error)
        tr_real.get_last_error();
}

/* A refusal of the shim's must look like the runtime's own out-of-memory: the same code,
 * and the same last error for cudaGetLastError (PyTorch reads it back), which only the
 * runtime's own failures set. No device has 2^62 bytes: the runtime refuses that at once
 * (measured on the H200 with CUDA 13.0: cudaErrorMemoryAllocation in 0.02 ms). */
cudaError_t tr_runtime_oom(void)
{
    void *p = NULL;
    if (tr_real.malloc(&p, (size_t)1 << 62) == cudaSuccess)
        tr_real.free(p);
    return cudaErrorMemoryAllocation;
}

cudaError_t tr_pending_error(void)
{
    return tr_real.peek_last_error ? tr_real.peek_last_error() : cudaSuccess;
}

static cudaError_t own_call(cudaError_t pending, cudaError_t err, const char *what, const void *p, size_t n)
{
    if (tr_own_error(pending, err) != cudaSuccess)
        tr_log(TR_DEBUG, "%s(%p, %zu) failed (%d); the job goes on without it", what, p, n, (int)err);
    return err;
}

cudaError_t tr_advise(const void *p, size_t n, enum cudaMemoryAdvise a, int loc_type, int dev)
{
    tr_count.advise_calls++;
    cudaError_t pending = tr_pending_error(), err;
    if (tr_real.loc_api) {
        struct tr_loc loc = {loc_type, loc_type == TR_LOC_HOST ? 0 : dev};
        err = ((advise_loc_t)tr_real.advise_fn)(p, n, a, loc);
    } else {
        err = ((advise_dev_t)tr_real.advise_fn)(p, n, a, loc_type == TR_LOC_HOST ? cudaCpuDeviceId : dev);
    }
    return own_call(pending, err, "cudaMemAdvise", p, n);
}

cudaError_t tr_prefetch(const void *p, size_t n, int loc_type, int dev, cudaStream_t s)
{
    cudaError_t pending = tr_pending_error(), err;
    if (tr_real.loc_api) {
        struct tr_loc loc = {loc_type, loc_type == TR_LOC_HOST ? 0 : dev};
        err = ((prefetch_loc_t)tr_real.prefetch_fn)(p, n, loc, 0, s);
    } else {
        err = ((prefetch_dev_t)tr_real.prefetch_fn)(p, n, loc_type == TR_LOC_HOST ? cudaCpuDeviceId : dev, s);
    }
    return own_call(pending, err, "cudaMemPrefetchAsync", p, n);
}
