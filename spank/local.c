/* Local and allocator context (sbatch, salloc, srun on the submit host): the options were
 * checked by their callbacks; what the user chose is handed to the job as job-control
 * environment, which reaches the job as SLURM_SPANK_TRANSIT_* even with --export=NONE.
 * sbatch and salloc set all three, empty when not given, so that a SLURM_SPANK_TRANSIT_*
 * the user exported is overwritten (the node checks the values again in any case). srun
 * inside a job sets only what it was given: its steps inherit the job's choice. */
#include <stdlib.h>
#include <string.h>

#include "transit_spank.h"

static const struct {
    const char *name;
    const char *val;
} job_vars[] = {
    {TR_ENV_POLICY, tr_job.policy},
    {TR_ENV_GPU_BUDGET, tr_job.budget},
    {TR_ENV_STATS, tr_job.stats},
};

/* Whether srun's value of an option is the job's own (SLURM_SPANK_<var>): srun inside an
 * allocation takes the allocation's options again, and sbatch or salloc already warned. */
static int inherited(int allocator, const char *var, const char *val)
{
    const char *job = allocator ? NULL : getenv(var);
    return job && strcmp(job, val) == 0;
}

/* --transit-budget and --transit-stats only reach the shim: under a policy of off no shim
 * is loaded and they change nothing. Say so in one line on the user's terminal (this runs
 * in sbatch, salloc or srun; slurm_info reaches their stderr), without the values. The
 * policy is the one the node will use: --transit, else for srun inside a job the job's
 * (SLURM_SPANK_TRANSIT_POLICY, which sbatch and salloc always set; the node checks it
 * again), else the site default. Returns whether --transit-stats was given here to a policy
 * other than off: then the stats will be written. */
static int warn_unused(int allocator)
{
    int budget = tr_job.budget[0] && !inherited(allocator, "SLURM_SPANK_" TR_ENV_GPU_BUDGET, tr_job.budget);
    int stats = tr_job.stats[0] && !inherited(allocator, "SLURM_SPANK_" TR_ENV_STATS, tr_job.stats);
    if (!budget && !stats)
        return 0;
    const char *policy = tr_job.policy, *why = "--transit=off loads no shim";
    const char *job = allocator || policy[0] ? NULL : getenv("SLURM_SPANK_" TR_ENV_POLICY);
    if (!policy[0] && job && job[0]) {
        policy = job;
        why = "the job's --transit=off loads no shim";
    } else if (!policy[0]) {
        policy = tr_site.dflt;
        why = "without --transit this cluster's policy is off and loads no shim (add --transit=advise)";
    }
    if (strcmp(policy, "off") != 0)
        return stats;
    slurm_info("transit: warning: %s%s%s do%s nothing: %s", budget ? "--transit-budget" : "",
               budget && stats ? " and " : "", stats ? "--transit-stats" : "", budget && stats ? "" : "es", why);
    return 0;
}

int tr_local_post_opt(spank_t sp, int allocator)
{
    /* --transit-stats given here (not the job's, inherited by srun) to a shim that will run:
     * the directory must exist (args.c) */
    if (warn_unused(allocator) && tr_stats_dir_exists(tr_job.stats))
        return -1;
    for (size_t i = 0; i < sizeof job_vars / sizeof job_vars[0]; i++) {
        if (!allocator && !job_vars[i].val[0])
            continue;
        if (spank_job_control_setenv(sp, job_vars[i].name, job_vars[i].val, 1) != ESPANK_SUCCESS) {
            slurm_error("transit: cannot pass the --transit options to the job");
            return -1;
        }
    }
    return 0;
}
