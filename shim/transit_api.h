/* The C API of libtransit.so, for framework adapters (transit_launch's cffi bindings).
 * Every call is safe when the shim is off or passing through (they do nothing). */
#ifndef TRANSIT_API_H
#define TRANSIT_API_H
#include <stddef.h>
#include <stdint.h>

#define TRANSIT_API_VERSION 1
enum { TRANSIT_HINT_HOT = 0, TRANSIT_HINT_MASTER = 1, TRANSIT_HINT_OPTIMIZER = 2 };

int transit_api_version(void);
/* 1 when allocations are managed by a policy, 0 when off or passing through. */
int transit_active(void);
const char *transit_policy(void);
/* An iteration ended (after the optimizer step); returns iterations seen. */
int transit_iteration(void);
/* [ptr, ptr + size) holds data of the given kind; -1 if it is not shim-managed memory. */
int transit_hint(uintptr_t ptr, size_t size, int kind);
/* Apply placement for the hints given so far. */
void transit_apply(void);
/* Write the stats JSON now (NULL: the TRANSIT_STATS path); 0 on success. */
int transit_write_stats(const char *path);
#endif
