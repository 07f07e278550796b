/* The C API of libtransit.so, for framework adapters (transit_launch's cffi bindings).
 * Every call is safe when the shim is off or passing through (they do nothing). */
#ifndef TRANSIT_API_H
#define TRANSIT_API_H
#include <stddef.h>
#include <stdint.h>

#include "transit_rules.h"

#define TRANSIT_API_VERSION 10
/* SPARSE (version 6): master weights the forward reads only in part, an nn.Embedding's table
 * outside FSDP (a gather of the step's rows): advise gives them the GPU after the dense
 * master weights and before the optimizer state. */
enum { /* the values: transit_launch/rules.py's HINT_KINDS */
    TRANSIT_HINT_HOT = TR_HINT_HOT,
    TRANSIT_HINT_MASTER = TR_HINT_MASTER,
    TRANSIT_HINT_OPTIMIZER = TR_HINT_OPTIMIZER,
    TRANSIT_HINT_SPARSE = TR_HINT_SPARSE
};

int transit_api_version(void);
/* 1 when allocations are managed by a policy, 0 when off or passing through. */
int transit_active(void);
const char *transit_policy(void);
/* An iteration ended (after the optimizer step); returns iterations seen. */
int transit_iteration(void);
/* The adapter will report iterations (an optimizer was made; version 4): from here the shim
 * guesses no boundaries from kernel sequences. With gradient accumulation it guessed one
 * before the first step and started a warm-up recording, which kept CUPTI's one subscriber
 * slot from torch.profiler for the rest of the job. Boundaries guessed before are dropped. */
void transit_adapter_attach(void);
/* [ptr, ptr + size) holds data of the given kind; -1 if it is not shim-managed memory (nor,
 * for optimizer state, state the shim made in pinned host memory). */
int transit_hint(uintptr_t ptr, size_t size, int kind);
/* Apply placement for the hints given so far. */
void transit_apply(void);
/* Write the stats JSON now (NULL: the TRANSIT_STATS path); 0 on success. */
int transit_write_stats(const char *path);
/* Plain device memory (cudaMalloc, not managed) for an adapter's staging buffers: copies
 * between it and pinned host memory run on the copy engines, those of managed memory do not.
 * Its bytes come out of the GPU budget (managed data is demoted to make room). 0 when the
 * shim is not active or the budget or the guard has no room for size. */
uintptr_t transit_device_alloc(size_t size);
/* Gives it back: 0, or -1 when ptr is not from transit_device_alloc. */
int transit_device_free(uintptr_t ptr);
/* (transit_stage_enabled/in/wait/out, the retired staging of versions 1-5, are still exported
 * as no-ops for adapters of those versions: api.c. Not for new callers.) */
/* The calling thread's next allocations are optimizer state (on = 1) until on = 0; calls
 * nest (version 5). Under advise they are made in pinned host memory, mapped at the same
 * address for the device: read zero-copy by the step, moved by the copy engines, never
 * migrated (hoststate.c says when the adapter marks). */
void transit_state_alloc(int on);
/* 1 when [ptr, ptr + size) is optimizer state in the shim's pinned host memory (version 5). */
int transit_host_state(uintptr_t ptr, size_t size);
/* The segments (cudaMalloc sizes, in the order they will be made) the calling adapter
 * predicts its first step's optimizer state will be allocated in (version 8): under advise,
 * where state is pinned (transit_state_alloc), host memory for them is written and registered
 * in the background from here, the last segments first, and a marked allocation of a
 * predicted size takes it ready. Once per process (later lists are ignored); n = 0: the first
 * step is over, what it did not take is given back (prefill.c). Version 7's
 * transit_state_expect(bytes) is retired (api.c). */
void transit_state_segments(const size_t *sizes, size_t n);
/* The optimizer state the GPU budget cannot hold lives in the application's host memory (the
 * adapter's host step, version 9): advise has its state named, as a hint of it would, and
 * probes no access (a probe moves every managed byte to the host for its first recording). */
void transit_state_on_host(void);
/* The adapter's counters (version 10): a JSON object of printable ASCII, at most 64 KiB,
 * written as "adapter" in every later stats report (a later call replaces it; null until
 * one). 0, or -1 when refused (not an object's text, too long): the report keeps the last. */
int transit_adapter_stats(const char *json);
#endif
