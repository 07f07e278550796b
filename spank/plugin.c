/* The entry points Slurm calls; options are registered in slurm_spank_init so that
 * sbatch, salloc and srun accept them and list them in --help. */
#include <stdio.h>
#include <string.h>

#include "transit_spank.h"

SPANK_PLUGIN(transit, 1);

static int opt_policy(int val, const char *arg, int remote)
{
    (void)val;
    if (!arg || !tr_policy_known(arg)) {
        slurm_error("transit: --transit=%s: expected one of %s", arg ? arg : "", TR_POLICIES);
        return -1;
    }
    if (!tr_policy_allowed(arg)) {
        slurm_error("transit: --transit=%s is not allowed on this cluster (allowed: %s)", arg, tr_site.allowed);
        return -1;
    }
    (void)remote;
    snprintf(tr_job.policy, sizeof tr_job.policy, "%s", arg);
    return 0;
}

static int opt_budget(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    if (!arg || strlen(arg) >= sizeof tr_job.budget || !tr_size_valid(arg)) {
        slurm_error("transit: --transit-budget=%s: expected a size such as 40GB or 64GiB", arg ? arg : "");
        return -1;
    }
    strcpy(tr_job.budget, arg);
    return 0;
}

static int opt_stats(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    if (!arg || !*arg || strlen(arg) >= sizeof tr_job.stats) {
        slurm_error("transit: --transit-stats needs a directory");
        return -1;
    }
    strcpy(tr_job.stats, arg);
    return 0;
}

static struct spank_option options[] = {
    {"transit", "POLICY", "run with libtransit.so: off, base, prefetch or advise (host DRAM as GPU memory)", 1, 0,
     opt_policy},
    {"transit-budget", "SIZE", "GPU memory the transit shim lets managed data use (e.g. 40GB)", 1, 0, opt_budget},
    {"transit-stats", "DIR", "directory for the transit shim's per-rank stats JSON", 1, 0, opt_stats},
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    if (tr_parse_args(ac, av))
        goto fail;
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (spank_option_register(sp, &options[i]) != ESPANK_SUCCESS) {
            slurm_error("transit: cannot register --%s", options[i].name);
            goto fail;
        }
    return 0;
fail:
    return -1;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    spank_context_t ctx = spank_context();
    if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR)
        return tr_local_post_opt(sp);
    return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    return spank_remote(sp) ? tr_remote_user_init(sp) : 0;
}
