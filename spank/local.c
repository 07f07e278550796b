/* Local and allocator context (sbatch, salloc, srun on the submit host): the options were
 * checked by their callbacks; what the user chose is handed to the job as job-control
 * environment, which reaches the job as SLURM_SPANK_TRANSIT_* even with --export=NONE.
 * sbatch and salloc set all three, empty when not given, so that a SLURM_SPANK_TRANSIT_*
 * the user exported is overwritten (the node checks the values again in any case). srun
 * inside a job sets only what it was given: its steps inherit the job's choice. */
#include <string.h>

#include "transit_spank.h"

static const struct {
    const char *name;
    const char *val;
} job_vars[] = {
    {"TRANSIT_POLICY", tr_job.policy},
    {"TRANSIT_GPU_BUDGET", tr_job.budget},
    {"TRANSIT_STATS", tr_job.stats},
};

int tr_local_post_opt(spank_t sp, int allocator)
{
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
