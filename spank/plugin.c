/* The entry points Slurm calls; options are registered in slurm_spank_init so that
 * sbatch, salloc and srun accept them and list them in --help. */
#include <string.h>

#include "transit_spank.h"

SPANK_PLUGIN(transit, 1);

/* The option callbacks: on the submit host from the command line, on the node from what
 * Slurm forwards; both check the value through args.c. */
static int opt_policy(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    return tr_opt_policy(arg);
}

static int opt_budget(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    return tr_opt_budget(arg);
}

static int opt_stats(int val, const char *arg, int remote)
{
    (void)val; (void)remote;
    return tr_opt_stats(arg);
}

static struct spank_option options[] = {
    {"transit", "POLICY", "run with libtransit.so: off, base, prefetch or advise (host DRAM as GPU memory)", 1, 0,
     opt_policy},
    {"transit-budget", "SIZE", "GPU memory the transit shim lets managed data use (e.g. 40GB)", 1, 0, opt_budget},
    {"transit-stats", "DIR", "directory for the transit shim's per-rank stats JSON", 1, 0, opt_stats},
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    memset(&tr_job, 0, sizeof tr_job);
    if (tr_parse_args(ac, av))
        return -1;
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (spank_option_register(sp, &options[i]) != ESPANK_SUCCESS) {
            slurm_error("transit: cannot register --%s", options[i].name);
            return -1;
        }
    return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    spank_context_t ctx = spank_context();
    if (ctx == S_CTX_LOCAL || ctx == S_CTX_ALLOCATOR)
        return tr_local_post_opt(sp, ctx == S_CTX_ALLOCATOR);
    return 0;
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    return spank_remote(sp) ? tr_remote_user_init(sp) : 0;
}
