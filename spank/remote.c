/* Remote context (slurmstepd, every step on every node): build the environment that
 * loads libtransit.so into the tasks.
 *
 * What counts is only what went through the option checks (args.c): the options Slurm
 * hands the plugin on the node, else the job-control environment the submit host set
 * (SLURM_SPANK_TRANSIT_*, which survives --export=NONE), checked again here. A policy of
 * off (asked for, or the site's default) injects nothing. Under oversubscribe=deny no
 * step keeps a TRANSIT_ALLOW_OVERSUBSCRIBE, whoever set it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "transit_spank.h"

#define LD_SEPS " :" /* ld.so splits LD_PRELOAD at spaces and colons */
#define ENV_MAX (8u << 20)

/* The value of var in the step's environment, any length (malloc'd), or NULL. */
static char *get(spank_t sp, const char *var)
{
    for (unsigned len = 4096; len <= ENV_MAX; len *= 4) {
        char *buf = malloc(len);
        if (!buf)
            return NULL;
        spank_err_t rc = spank_getenv(sp, var, buf, (int)len);
        if (rc == ESPANK_SUCCESS)
            return buf;
        free(buf);
        if (rc != ESPANK_NOSPACE)
            return NULL;
    }
    return NULL;
}

/* A value the submit host passed as job-control environment, through its option check. */
static void job_value(spank_t sp, const char *name, const char *have, int (*check)(const char *))
{
    if (have[0])
        return; /* the option itself reached the node */
    char var[64] = "SLURM_SPANK_";
    strcat(var, name);
    char *v = get(sp, var);
    if (v && v[0] && check(v))
        slurm_error("transit: ignoring %s from the job's environment", var);
    free(v);
}

/* var = edit(old value); 0 or -1. */
static int edit(spank_t sp, const char *var, const char *item, const char *seps, int keep_empty, int add)
{
    char *old = get(sp, var);
    if (!add && !old)
        return 0;
    char *val = add ? tr_list_prepend(old, item, seps, keep_empty) : tr_list_remove(old, item, seps, keep_empty);
    int rc = !val ? -1
           : !add && !val[0] ? (spank_unsetenv(sp, var) == ESPANK_SUCCESS ? 0 : -1)
           : spank_setenv(sp, var, val, 1) == ESPANK_SUCCESS ? 0 : -1;
    free(old);
    free(val);
    return rc;
}

static int set(spank_t sp, const char *var, const char *val)
{
    return spank_setenv(sp, var, val, 1) == ESPANK_SUCCESS ? 0 : -1;
}

/* TRANSIT_OVERLAP_STEP asks the shim's adapter to overlap the optimizer step; a step that
 * --transit=off leaves without libtransit.so does not run it. Found here (in slurmstepd,
 * whose log is slurmd's), said by tr_remote_task_init in the task, whose stderr is the
 * step's. */
static int overlap_unused;

static void check_overlap(spank_t sp)
{
    char *v = get(sp, TR_ENV_OVERLAP_STEP);
    char *pre = v && v[0] ? get(sp, TR_JOB_PRELOAD) : NULL;
    overlap_unused = v && v[0] && !(pre && strstr(pre, "libtransit")); /* a shim of the user's own still runs it */
    free(v);
    free(pre);
}

/* In each task just before exec, after Slurm connected its stdio: task 0 of the step
 * writes the line to the step's stderr (the value is not repeated). */
int tr_remote_task_init(spank_t sp)
{
    uint32_t id = 1;
    if (overlap_unused && spank_get_item(sp, S_TASK_GLOBAL_ID, &id) == ESPANK_SUCCESS && id == 0)
        slurm_error("transit: warning: " TR_ENV_OVERLAP_STEP " does nothing: --transit=off loads no shim");
    return 0;
}

int tr_remote_user_init(spank_t sp)
{
    if (!tr_site.oversubscribe && spank_unsetenv(sp, TR_ENV_ALLOW_OVERSUBSCRIBE) != ESPANK_SUCCESS) {
        slurm_error("transit: cannot remove %s (oversubscribe=deny)", TR_ENV_ALLOW_OVERSUBSCRIBE);
        return -1;
    }
    job_value(sp, TR_ENV_POLICY, tr_job.policy, tr_opt_policy);
    job_value(sp, TR_ENV_GPU_BUDGET, tr_job.budget, tr_opt_budget);
    job_value(sp, TR_ENV_STATS, tr_job.stats, tr_opt_stats);
    const char *policy = tr_job.policy[0] ? tr_job.policy : tr_site.dflt;
    if (strcmp(policy, "off") == 0) {
        if (!tr_job.policy[0])
            return 0; /* asked for nothing: the environment stays as it is */
        /* --transit=off in a step of a job that has the shim: take it out again */
        if (edit(sp, TR_JOB_PRELOAD, tr_site.shim, LD_SEPS, 0, 0) ||
            (tr_site.adapter[0] && edit(sp, TR_JOB_ADAPTER_PATH, tr_site.adapter, ":", 1, 0)))
            goto fail;
        check_overlap(sp);
        return 0;
    }
    if (set(sp, TR_ENV_POLICY, policy) ||
        (tr_job.budget[0] && set(sp, TR_ENV_GPU_BUDGET, tr_job.budget)) ||
        (tr_job.stats[0] && set(sp, TR_ENV_STATS, tr_job.stats)) ||
        (tr_site.oversubscribe && set(sp, TR_ENV_ALLOW_OVERSUBSCRIBE, "1")) ||
        set(sp, TR_JOB_ALLOC_CONF, TR_ALLOC_CONF) || set(sp, TR_JOB_CUDA_ALLOC_CONF, TR_ALLOC_CONF) ||
        edit(sp, TR_JOB_PRELOAD, tr_site.shim, LD_SEPS, 0, 1) ||
        (tr_site.adapter[0] && edit(sp, TR_JOB_ADAPTER_PATH, tr_site.adapter, ":", 1, 1)))
        goto fail;
    return 0;
fail:
    slurm_error("transit: cannot set the job environment for policy %s", policy);
    return -1;
}
