/* TRANSIT_* environment variables, read once at start-up. A value the shim cannot honour
 * gets one warning line: the variable, the value, why, and what is used instead. */
#include <ctype.h>
#include <stdio.h>
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

static void not_honoured(const char *name, const char *v, const char *why, const char *used)
{
    tr_log(TR_WARN, "%s=%.100s%s %s: using %s", name, v, strlen(v) > 100 ? "..." : "", why, used);
}

/* The variable's value, NULL when unset or empty (the default, silently). */
static const char *env(const char *name)
{
    const char *v = getenv(name);
    return v && *v ? v : NULL;
}

/* A size in the grammar of transit_size.h. A value outside it, a bare number included
 * (TRANSIT_GPU_BUDGET=70 is not 70 bytes), gets the warning and the default: the job runs. */
static uint64_t env_size(const char *name, uint64_t dflt, const char *dflt_text)
{
    const char *v = env(name);
    uint64_t out;
    int rc = v ? tr_size_parse(v, &out) : TR_SIZE_BAD;
    if (rc == TR_SIZE_OK)
        return out;
    if (v)
        not_honoured(name, v, tr_size_reason(rc), dflt_text);
    return dflt;
}

/* 0 or 1; unset or anything else: dflt (said) */
static int env_flag_or(const char *name, int dflt)
{
    const char *v = env(name);
    if (v && strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        not_honoured(name, v, "is not 0 or 1", dflt ? "1" : "0");
    return v && (!strcmp(v, "0") || !strcmp(v, "1")) ? v[0] == '1' : dflt;
}

static int env_flag(const char *name) { return env_flag_or(name, 0); }

/* Up to `digits` decimal digits and nothing else; -1 otherwise. */
static long digits_value(const char *s, int digits)
{
    long n = 0;
    int i = 0;
    for (; isdigit((unsigned char)s[i]); i++) {
        if (i == digits)
            return -1;
        n = n * 10 + (s[i] - '0');
    }
    return i > 0 && !s[i] ? n : -1;
}

/* The adapter's staging ring (TRANSIT_OVERLAP_INFLIGHT, bytes, as transit_staging._limit reads
 * it: a positive integer, else the default; the adapter says a bad value): hoststate.c leaves
 * its room before the ring exists. */
static uint64_t env_ring(void)
{
    const char *v = getenv(TR_ENV_OVERLAP_INFLIGHT);
    long n = v ? digits_value(v, 15) : -1;
    return n > 0 ? (uint64_t)n : TR_STAGE_RING_BYTES;
}

static int env_warmup(void)
{
    const char *v = env(TR_ENV_WARMUP_ITERS);
    long n = v ? digits_value(v, 7) : 2;
    if (n < 1 || n > 1000000) {
        not_honoured(TR_ENV_WARMUP_ITERS, v, "is not a whole number from 1 to 1000000", "2");
        n = 2;
    }
    return (int)n;
}

/* A fraction of the iteration's launches, 0.000001 to 0.999999, in millionths: no float
 * parse, no float-to-integer cast. */
static uint32_t env_cold_tail(void)
{
    const char *v = env(TR_ENV_COLD_TAIL);
    const char *frac = v && v[0] == '0' && v[1] == '.' ? v + 2 : v && v[0] == '.' ? v + 1 : NULL;
    long ppm = frac ? digits_value(frac, 6) : -1;
    for (size_t n = frac ? strlen(frac) : 0; ppm > 0 && n < 6; n++)
        ppm *= 10;
    if (v && ppm <= 0)
        not_honoured(TR_ENV_COLD_TAIL, v, "is not a fraction between 0 and 1 (such as 0.02)", "0.02");
    return v && ppm > 0 ? (uint32_t)ppm : 20000;
}

static int env_log_level(void)
{
    static const char *lv[] = TR_LOG_LEVEL_NAMES;
    const char *v = env(TR_ENV_LOG);
    char why[80] = "is not one of";
    for (int i = 0; v && i < TR_N_LOG_LEVELS; i++) {
        if (strcasecmp(v, lv[i]) == 0)
            return i;
        size_t n = strlen(why);
        snprintf(why + n, sizeof why - n, "%s %s", i ? "," : "", lv[i]);
    }
    if (v)
        not_honoured(TR_ENV_LOG, v, why, lv[TR_WARN]);
    return TR_WARN;
}

static enum tr_policy env_policy(void)
{
    const char *v = env(TR_ENV_POLICY);
    for (int p = TR_OFF; v && p <= TR_ADVISE; p++)
        if (strcasecmp(v, tr_policy_name(p)) == 0)
            return p;
    if (!v)
        return TR_BASE;
    tr_log(TR_ERROR, "%s=%.100s is not one of off, base, prefetch, advise: passing through", TR_ENV_POLICY, v);
    return TR_OFF;
}

/* A retired experiment's variable (docs/retired-experiments.md), still set: said once (the
 * configuration is read once a process), then ignored; the job runs on. */
static void retired(const char *name, const char *instead)
{
    const char *v = env(name);
    if (v)
        tr_log(TR_WARN, "%s=%.100s%s is retired and ignored (docs/retired-experiments.md): %s", name, v,
               strlen(v) > 100 ? "..." : "", instead);
}

int tr_json_object(const char *s, size_t max)
{
    size_t n = 0;
    while (s && n <= max && s[n]) /* strnlen, which C11 lacks */
        n++;
    if (n < 2 || n > max || s[0] != '{' || s[n - 1] != '}')
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            return 0;
    return 1;
}

void tr_config_load(void)
{
    tr_cfg.log_level = TR_WARN; /* until TRANSIT_LOG is read: its own warning shows */
    tr_cfg.log_level = env_log_level();
    tr_cfg.policy = env_policy();
    tr_cfg.budget = env_size(TR_ENV_GPU_BUDGET, 0, "no budget");
    if (tr_cfg.budget > TR_GPU_BUDGET_MAX) { /* the bound of the CLI and the plugin's option, also for a set variable */
        not_honoured(TR_ENV_GPU_BUDGET, env(TR_ENV_GPU_BUDGET), "is above " TR_GPU_BUDGET_MAX_TEXT, "no budget");
        tr_cfg.budget = 0;
    }
    tr_cfg.allow_oversubscribe = env_flag(TR_ENV_ALLOW_OVERSUBSCRIBE);
    /* The guard keeps 1 GiB of the start-up free memory for what does not go through
     * cudaMalloc: context growth, cuBLAS/cuDNN handles, NCCL's cuMem buffers. */
    tr_cfg.reserve = env_size(TR_ENV_RESERVE, 1ull << 30, "1GiB");
    tr_cfg.warmup_iters = env_warmup();
    tr_cfg.merge_gap = env_size(TR_ENV_MERGE_GAP, 128 * 1024, "128KiB");
    tr_cfg.host_state = env_flag_or(TR_ENV_HOST_STATE, 1);
    tr_cfg.ring_bytes = env_ring();
    tr_cfg.cold_tail_ppm = env_cold_tail();
    retired(TR_RETIRED_ENV_STAGE,
            TR_ENV_OVERLAP_STEP "=stream (advise's default) or host moves the optimizer state instead");
    tr_cfg.plan = env(TR_ENV_PLAN); /* the environment's own string: it outlives the process's reports */
    if (tr_cfg.plan && !tr_json_object(tr_cfg.plan, TR_REPORT_OBJECT_MAX)) {
        not_honoured(TR_ENV_PLAN, tr_cfg.plan, "is not one JSON object of printable ASCII up to 64 KiB",
                     "no prediction in the stats");
        tr_cfg.plan = NULL;
    }
    const char *v = env(TR_ENV_STATS);
    tr_cfg.stats_path[0] = 0;
    if (v && strlen(v) >= sizeof tr_cfg.stats_path)
        not_honoured(TR_ENV_STATS, v, "is longer than 4095 bytes", "no stats");
    else if (v)
        strcpy(tr_cfg.stats_path, v);
}
