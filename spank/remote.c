/* Remote context (slurmstepd, every step on every node): build the environment that
 * loads libtransit.so into the tasks. Nothing is touched when the user asked for nothing
 * and the site's default is off. */
#include <stdio.h>
#include <string.h>

#include "transit_spank.h"

#define ALLOC_CONF "backend:native,expandable_segments:False"

/* The user's value: from the option (travels as _SLURM_SPANK_OPTION_*), else from the
 * job-control environment set at submission (survives --export=NONE). */
static void job_value(spank_t sp, const char *name, char *dst, int len)
{
    if (dst[0])
        return;
    char var[64];
    snprintf(var, sizeof var, "SPANK_%s", name);
    if (spank_getenv(sp, var, dst, len) != ESPANK_SUCCESS)
        dst[0] = 0;
}

/* VAR = first[:VAR], unless first is already in it (srun steps inside a batch step
 * inherit what the batch step got). */
static int prepend(spank_t sp, const char *var, const char *first)
{
    char old[8192] = "", val[8192 + TR_PATH_MAX + 2];
    if (spank_getenv(sp, var, old, sizeof old) != ESPANK_SUCCESS)
        old[0] = 0;
    if (tr_list_has(old, ':', first, strlen(first)))
        return 0;
    snprintf(val, sizeof val, "%s%s%s", first, old[0] ? ":" : "", old);
    return spank_setenv(sp, var, val, 1) == ESPANK_SUCCESS ? 0 : -1;
}

int tr_remote_user_init(spank_t sp)
{
    job_value(sp, "TRANSIT_POLICY", tr_job.policy, sizeof tr_job.policy);
    job_value(sp, "TRANSIT_GPU_BUDGET", tr_job.budget, sizeof tr_job.budget);
    job_value(sp, "TRANSIT_STATS", tr_job.stats, sizeof tr_job.stats);
    const char *policy = tr_job.policy[0] ? tr_job.policy : tr_site.dflt;
    if (!tr_job.policy[0] && strcmp(policy, "off") == 0)
        return 0; /* asked for nothing: the environment stays as it is */
    if (!tr_policy_known(policy) || !tr_policy_allowed(policy)) {
        slurm_error("transit: policy '%s' is not allowed here (%s): the job runs without the shim", policy,
                    tr_site.allowed);
        return 0;
    }
    if (!tr_site.shim[0]) {
        slurm_error("transit: plugstack.conf gives no shim=PATH: the job runs without the shim");
        return 0;
    }
    if (spank_setenv(sp, "TRANSIT_POLICY", policy, 1) != ESPANK_SUCCESS)
        goto fail;
    if (tr_job.budget[0] && spank_setenv(sp, "TRANSIT_GPU_BUDGET", tr_job.budget, 1) != ESPANK_SUCCESS)
        goto fail;
    if (tr_job.stats[0] && spank_setenv(sp, "TRANSIT_STATS", tr_job.stats, 1) != ESPANK_SUCCESS)
        goto fail;
    if (tr_site.oversubscribe && spank_setenv(sp, "TRANSIT_ALLOW_OVERSUBSCRIBE", "1", 1) != ESPANK_SUCCESS)
        goto fail;
    if (spank_setenv(sp, "PYTORCH_ALLOC_CONF", ALLOC_CONF, 1) != ESPANK_SUCCESS ||
        spank_setenv(sp, "PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF, 1) != ESPANK_SUCCESS)
        goto fail;
    if (prepend(sp, "LD_PRELOAD", tr_site.shim))
        goto fail;
    if (tr_site.adapter[0] && prepend(sp, "PYTHONPATH", tr_site.adapter))
        goto fail;
    return 0;
fail:
    slurm_error("transit: cannot set the job environment for policy %s", policy);
    return -1;
}
