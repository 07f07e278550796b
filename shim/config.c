/* TRANSIT_* environment variables, read once at start-up. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "transit.h"
#include "transit_size.h"

struct tr_config tr_cfg;

const char *tr_policy_name(enum tr_policy p)
{
    static const char *names[] = TR_POLICY_NAMES;
    return names[p];
}

/* The size grammar shared with Python and the SPANK plugin (transit_size.h). */
int tr_parse_size(const char *s, uint64_t *out) { return tr_size_parse(s, out) == TR_SIZE_OK ? 0 : -1; }

static uint64_t env_size(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    uint64_t out;
    if (!v || !*v)
        return dflt;
    if (tr_parse_size(v, &out) == 0)
        return out;
    tr_log(TR_WARN, "%s=%s is not a size; using the default", name, v);
    return dflt;
}

void tr_config_load(void)
{
    const char *v = getenv("TRANSIT_LOG");
    tr_cfg.log_level = TR_WARN;
    if (v) {
        static const char *lv[] = TR_LOG_LEVEL_NAMES;
        for (int i = 0; i < TR_N_LOG_LEVELS; i++)
            if (strcasecmp(v, lv[i]) == 0)
                tr_cfg.log_level = i;
    }
    v = getenv("TRANSIT_POLICY");
    tr_cfg.policy = TR_BASE;
    if (v && *v) {
        int found = 0;
        for (int p = TR_OFF; p <= TR_ADVISE; p++)
            if (strcasecmp(v, tr_policy_name(p)) == 0) {
                tr_cfg.policy = p;
                found = 1;
            }
        if (!found) {
            tr_log(TR_ERROR, "TRANSIT_POLICY=%s is not one of off, base, prefetch, advise: passing through", v);
            tr_cfg.policy = TR_OFF;
        }
    }
    tr_cfg.budget = env_size("TRANSIT_GPU_BUDGET", 0);
    v = getenv("TRANSIT_ALLOW_OVERSUBSCRIBE");
    tr_cfg.allow_oversubscribe = v && strcmp(v, "1") == 0;
    /* The guard keeps 1 GiB of the start-up free memory for what does not go through
     * cudaMalloc: context growth, cuBLAS/cuDNN handles, NCCL's cuMem buffers. */
    tr_cfg.reserve = env_size("TRANSIT_RESERVE", 1ull << 30);
    v = getenv("TRANSIT_WARMUP_ITERS");
    tr_cfg.warmup_iters = v ? atoi(v) : 2;
    if (tr_cfg.warmup_iters < 1)
        tr_cfg.warmup_iters = 1;
    tr_cfg.merge_gap = env_size("TRANSIT_MERGE_GAP", 128 * 1024);
    v = getenv("TRANSIT_STAGE");
    tr_cfg.stage = v && strcmp(v, "1") == 0;
    v = getenv("TRANSIT_STATS");
    tr_cfg.stats_path[0] = 0;
    if (v && *v) {
        strncpy(tr_cfg.stats_path, v, sizeof tr_cfg.stats_path - 1);
        tr_cfg.stats_path[sizeof tr_cfg.stats_path - 1] = 0;
    }
}
