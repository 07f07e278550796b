/* SPANK plugin for transit-launch: `sbatch --transit=advise job.sh` injects libtransit.so
 * into every task of every step. One file per Slurm context (local.c: sbatch/salloc/srun
 * on the submit host; remote.c: slurmstepd on the nodes), args.c for plugstack.conf and
 * the checks of the options' values, env.c for the path lists the plugin edits, plugin.c
 * for the entry points Slurm calls. Only slurm_spank_* and the plugin symbols are exported
 * (transit_spank.map). tools/check.c (the installer's check of a plugstack line) and
 * tools/fuzz.c (the parsers under ASan/UBSan) link args.c and env.c without Slurm. */
#ifndef TRANSIT_SPANK_H
#define TRANSIT_SPANK_H

#include <stddef.h>
#include <slurm/spank.h>

#include "../shim/transit_rules.h"

#define TR_PATH_MAX 4096
#define TR_POLICIES TR_POLICY_LIST

struct tr_site {               /* plugstack.conf arguments */
    char shim[TR_PATH_MAX];    /* shim=PATH (required) */
    char adapter[TR_PATH_MAX]; /* adapter=PATH */
    char dflt[16];             /* default=POLICY (off) */
    char allowed[64];          /* allowed=LIST (all policies) */
    int oversubscribe;         /* oversubscribe=allow|deny (deny) */
};

struct tr_job {                /* what the user asked for, set only through tr_opt_* */
    char policy[16];           /* "" = not given */
    char budget[64];
    char stats[TR_PATH_MAX];
};

extern struct tr_site tr_site;
extern struct tr_job tr_job;

/* args.c: the plugstack line (0, or -1 after one logged line) and the option values. */
int tr_parse_args(int ac, char **av);
int tr_opt_policy(const char *arg);
int tr_opt_budget(const char *arg);
int tr_opt_stats(const char *arg);
int tr_stats_dir_exists(const char *arg);
int tr_path_secure(const char *key, const char *path, int want_dir);
int tr_list_has(const char *list, char sep, const char *item, size_t n);
int tr_policy_known(const char *p);
int tr_policy_allowed(const char *p);
int tr_size_valid(const char *s);

/* env.c: path lists (LD_PRELOAD, PYTHONPATH); results are malloc'd, NULL when out of memory. */
char *tr_list_prepend(const char *old, const char *first, const char *seps, int keep_empty);
char *tr_list_remove(const char *old, const char *item, const char *seps, int keep_empty);

int tr_local_post_opt(spank_t sp, int allocator);
int tr_remote_user_init(spank_t sp);
int tr_remote_task_init(spank_t sp);

#endif
