/* plugstack.conf arguments: strict key=value, unknown keys are an error. */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "transit_spank.h"
#include "../shim/transit_size.h"

struct tr_site tr_site;
struct tr_job tr_job;

/* Is item (n bytes) one of the sep-separated entries of list? */
int tr_list_has(const char *list, char sep, const char *item, size_t n)
{
    for (const char *p = list; *p;) {
        const char *end = strchr(p, sep);
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, item, n) == 0)
            return 1;
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

static int in_list(const char *item, const char *list) { return tr_list_has(list, ',', item, strlen(item)); }

int tr_policy_known(const char *p) { return *p && in_list(p, TR_POLICIES); }
int tr_policy_allowed(const char *p) { return in_list(p, tr_site.allowed); }

/* --transit-budget: the grammar libtransit.so's TRANSIT_GPU_BUDGET reads (transit_size.h). */
int tr_size_valid(const char *s)
{
    uint64_t v;
    return tr_size_parse(s, &v) == TR_SIZE_OK;
}

static int copy(char *dst, size_t size, const char *key, const char *val)
{
    if (strlen(val) >= size || !*val) {
        slurm_error("transit: plugstack argument %s= is empty or too long", key);
        return -1;
    }
    strcpy(dst, val);
    return 0;
}

/* The string-valued arguments and where each goes. */
static const struct {
    const char *key;
    char *dst;
    size_t size;
} strings[] = {
    {"shim", tr_site.shim, sizeof tr_site.shim},
    {"adapter", tr_site.adapter, sizeof tr_site.adapter},
    {"default", tr_site.dflt, sizeof tr_site.dflt},
    {"allowed", tr_site.allowed, sizeof tr_site.allowed},
};

int tr_parse_args(int ac, char **av)
{
    strcpy(tr_site.dflt, "off");
    strcpy(tr_site.allowed, TR_POLICIES);
    tr_site.oversubscribe = 0;
    for (int i = 0; i < ac; i++) {
        char *eq = strchr(av[i], '=');
        if (!eq) {
            slurm_error("transit: plugstack argument '%s' is not key=value", av[i]);
            goto fail;
        }
        size_t klen = (size_t)(eq - av[i]);
        const char *val = eq + 1;
#define KEY(k) (klen == strlen(k) && strncmp(av[i], k, klen) == 0)
        size_t s = 0;
        while (s < sizeof strings / sizeof strings[0] && !KEY(strings[s].key))
            s++;
        if (s < sizeof strings / sizeof strings[0]) {
            if (copy(strings[s].dst, strings[s].size, strings[s].key, val))
                goto fail;
        } else if (KEY("oversubscribe")) {
            if (strcmp(val, "allow") && strcmp(val, "deny")) {
                slurm_error("transit: plugstack argument oversubscribe=%s: expected allow or deny", val);
                goto fail;
            }
            tr_site.oversubscribe = strcmp(val, "allow") == 0;
        } else {
            slurm_error("transit: unknown plugstack argument '%.*s' (known: shim, adapter, default, allowed, "
                        "oversubscribe)", (int)klen, av[i]);
            goto fail;
        }
#undef KEY
    }
    for (const char *p = tr_site.allowed; *p;) { /* every allowed entry must be a policy */
        char item[16] = "";
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len < sizeof item)
            memcpy(item, p, len);
        if (len >= sizeof item || !tr_policy_known(item)) {
            slurm_error("transit: plugstack allowed=%s: '%.*s' is not one of %s", tr_site.allowed, (int)len, p,
                        TR_POLICIES);
            goto fail;
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    if (!tr_policy_known(tr_site.dflt) || !tr_policy_allowed(tr_site.dflt)) {
        slurm_error("transit: plugstack default=%s is not an allowed policy (%s)", tr_site.dflt, tr_site.allowed);
        goto fail;
    }
    return 0;
fail:
    return -1;
}
