/* How the test program (app.c) tells the fake runtime (fake_cudart.c) what a "kernel"
 * touches: a launch whose args[0] points to a `const struct fake_touch *`, a list of byte
 * ranges ended by one of length 0, is a kernel that reads and writes those ranges on the
 * device. A launch with args NULL touches nothing (what every other launch of app.c does). */
#ifndef FAKE_TOUCH_H
#define FAKE_TOUCH_H
#include <stdint.h>

struct fake_touch {
    uint64_t ptr, len;
};

/* fake_cudart_residency's fields, in order */
enum {
    FAKE_RES_DEV,          /* managed bytes resident on the device now */
    FAKE_RES_DEV_PEAK,     /* ... at their peak */
    FAKE_RES_DEVICE_PEAK,  /* managed on the device + plain cudaMalloc bytes, at their peak */
    FAKE_RES_HOST,         /* managed bytes resident on the host now */
    FAKE_RES_ZERO_COPY,    /* bytes kernels touched on the host through a mapping (no migration) */
    FAKE_RES_MIGRATED,     /* bytes kernels' faults migrated from the host to the device */
    FAKE_RES_FIRST_TOUCH,  /* bytes populated on the device by a kernel's first touch */
    FAKE_RES_TO_DEV,       /* bytes prefetches moved or populated onto the device */
    FAKE_RES_TO_HOST,      /* bytes prefetches moved or populated onto the host */
    FAKE_RES_DEVICE_FULL,  /* bytes that found the device full and stayed on (or went to) the host */
    FAKE_RES_RETAINED,     /* bytes of managed pages that have been on the device (cudaMemGetInfo counts them) */
    FAKE_RES_HOST_WRITTEN, /* bytes the CPU wrote (fake_cudart_host_write) */
    FAKE_RES_PINNED,       /* bytes of host memory registered (pinned) now */
    FAKE_RES_N
};
#endif
