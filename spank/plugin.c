/* The entry points Slurm calls; options are registered in slurm_spank_init so that
 * sbatch, salloc and srun accept them and list them in --help. */
#include <string.h>

#include "transit_spank.h"

SPANK_PLUGIN(transit, 1);

/* The option callbacks: on the submit host from the command line, on the node from what
 * Slurm forwards; both check the value through args.c. On the node a refused value does
 * not fail the callback: Slurm would log the raw value ("spank: failed to process option
 * NAME=VALUE"), and a value with a newline (--export-file carries one) would forge a line
 * of slurmd's log. There only the check's own line is logged (it repeats a value only
 * when short and plain) and the value is ignored, as if the option had not been given. */
static int on_node(int rc, int remote)
{
    return remote ? 0 : rc;
}

static int opt_policy(int val, const char *arg, int remote)
{
    (void)val;
    return on_node(tr_opt_policy(arg), remote);
}

static int opt_budget(int val, const char *arg, int remote)
{
    (void)val;
    return on_node(tr_opt_budget(arg), remote);
}

static int opt_stats(int val, const char *arg, int remote)
{
    (void)val;
    return on_node(tr_opt_stats(arg), remote);
}

static struct spank_option options[] = {
    {TR_OPT_POLICY, "POLICY", "run with libtransit.so: off, base, prefetch or advise (host DRAM as GPU memory)", 1, 0,
     opt_policy},
    {TR_OPT_GPU_BUDGET, "SIZE", "GPU memory the transit shim lets managed data use (e.g. 40GB)", 1, 0, opt_budget},
    {TR_OPT_STATS, "DIR", "directory for the transit shim's per-rank stats JSON", 1, 0, opt_stats},
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

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    return spank_remote(sp) ? tr_remote_task_init(sp) : 0;
}
