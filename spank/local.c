/* Local and allocator context (sbatch, salloc, srun on the submit host): the options were
 * checked by their callbacks; what the user chose is handed to the job as job-control
 * environment, which reaches slurmstepd even with --export=NONE. */
#include <string.h>

#include "transit_spank.h"

int tr_local_post_opt(spank_t sp)
{
    if (tr_job.policy[0] && spank_job_control_setenv(sp, "TRANSIT_POLICY", tr_job.policy, 1) != ESPANK_SUCCESS)
        goto fail;
    if (tr_job.budget[0] && spank_job_control_setenv(sp, "TRANSIT_GPU_BUDGET", tr_job.budget, 1) != ESPANK_SUCCESS)
        goto fail;
    if (tr_job.stats[0] && spank_job_control_setenv(sp, "TRANSIT_STATS", tr_job.stats, 1) != ESPANK_SUCCESS)
        goto fail;
    return 0;
fail:
    slurm_error("transit: cannot pass the --transit options to the job");
    return -1;
}
