/* The path lists the plugin edits in a step's environment: LD_PRELOAD (entries separated
 * by spaces or colons, as ld.so reads it) and PYTHONPATH (colons; an empty entry means the
 * current directory, so it is kept). Any length; the result joins entries with ':'. */
#include <stdlib.h>
#include <string.h>

#include "transit_spank.h"

/* out = first (if any), then every entry of old that is not item, in order. */
static char *rebuild(const char *old, const char *first, const char *item, const char *seps, int keep_empty)
{
    size_t cap = (old ? strlen(old) : 0) + (first ? strlen(first) : 0) + 2, n = 0, ilen = strlen(item);
    char *out = malloc(cap);
    if (!out)
        return NULL;
    out[0] = 0;
    if (first) {
        memcpy(out, first, strlen(first) + 1);
        n = strlen(first);
    }
    int any = 0;
    for (const char *p = old; p && *old;) {
        size_t len = strcspn(p, seps);
        if ((len || keep_empty) && !(len == ilen && strncmp(p, item, len) == 0)) {
            if (n || any)
                out[n++] = ':';
            memcpy(out + n, p, len);
            n += len;
            out[n] = 0;
            any = 1;
        }
        if (!p[len])
            break;
        p += len + 1;
    }
    return out;
}

char *tr_list_prepend(const char *old, const char *first, const char *seps, int keep_empty)
{
    return rebuild(old, first, first, seps, keep_empty);
}

char *tr_list_remove(const char *old, const char *item, const char *seps, int keep_empty)
{
    return rebuild(old, NULL, item, seps, keep_empty);
}
