/* plugstack.conf arguments (strict key=value: unknown or repeated keys are an error, the
 * shim and adapter must be files only root can change) and the checks of the values of
 * --transit, --transit-budget and --transit-stats. No Slurm calls but slurm_error, so that
 * the installer's check (tools/check.c) and the fuzz harness run this very code. */
#define _DEFAULT_SOURCE /* lstat, readlink */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transit_spank.h"
#include "../shim/transit_size.h"

struct tr_site tr_site;
struct tr_job tr_job;

/* Is item (n bytes) one of the sep-separated entries of list? */
int tr_list_has(const char *list, char sep, const char *item, size_t n)
{
    for (const char *p = list; *p;) {
        const char *end = strchr(p, sep);
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, item, n) == 0)
            return 1;
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

static int in_list(const char *item, const char *list) { return tr_list_has(list, ',', item, strlen(item)); }

int tr_policy_known(const char *p) { return *p && in_list(p, TR_POLICIES); }
int tr_policy_allowed(const char *p) { return *p && in_list(p, tr_site.allowed); }

/* --transit-budget: the grammar libtransit.so's TRANSIT_GPU_BUDGET reads (transit_size.h). */
int tr_size_valid(const char *s)
{
    uint64_t v;
    return tr_size_parse(s, &v) == TR_SIZE_OK;
}

/* No control characters and nothing beyond ASCII (C1 controls, U+2028 would reach logs). */
static int printable(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
            return 0;
    return 1;
}

/* What a log line may repeat of a user's value: short and plain, else "?". Slurm keeps
 * only the tail of an over-long message, without its prefix, so a long value could
 * forge a whole log line. */
static const char *echo(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 32 || strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._ -") != n)
        return "?";
    return s;
}

/* The option values, from the command line (sbatch/salloc/srun), from Slurm on the node,
 * or from the job-control environment: every one goes through these. */
int tr_opt_policy(const char *arg)
{
    if (!arg || !tr_policy_known(arg)) {
        slurm_error("transit: --transit=%s: expected one of %s", echo(arg), TR_POLICIES);
        return -1;
    }
    if (!tr_policy_allowed(arg)) {
        slurm_error("transit: --transit=%s is not allowed on this cluster (allowed: %s)", echo(arg), tr_site.allowed);
        return -1;
    }
    snprintf(tr_job.policy, sizeof tr_job.policy, "%s", arg);
    return 0;
}

/* The rule of the CLI's --gpu-budget: a size with its unit (a bare 70 is refused, not 70
 * bytes), at least TR_GPU_BUDGET_MIN, about a CUDA context, and at most TR_GPU_BUDGET_MAX,
 * more than any GPU has (rules.py). The GPU's own size is not known here. */
int tr_opt_budget(const char *arg)
{
    uint64_t v = 0;
    int rc = arg && strlen(arg) < sizeof tr_job.budget ? tr_size_parse(arg, &v) : TR_SIZE_BAD;
    if (rc != TR_SIZE_OK) {
        slurm_error("transit: --transit-budget=%s: expected a size such as 40GB or 64GiB%s", echo(arg),
                    rc == TR_SIZE_NO_UNIT ? " (a number needs its unit; B for bytes)" : "");
        return -1;
    }
    if (v < TR_GPU_BUDGET_MIN) {
        slurm_error("transit: --transit-budget=%s is below " TR_GPU_BUDGET_MIN_TEXT
                    ", the least GPU budget (about what a CUDA context alone takes)", echo(arg));
        return -1;
    }
    if (v > TR_GPU_BUDGET_MAX) {
        slurm_error("transit: --transit-budget=%s is above " TR_GPU_BUDGET_MAX_TEXT
                    ", more than any GPU has (a budget emulates a smaller GPU)", echo(arg));
        return -1;
    }
    strcpy(tr_job.budget, arg);
    return 0;
}

int tr_opt_stats(const char *arg)
{
    if (!arg || !*arg || strlen(arg) >= sizeof tr_job.stats || !printable(arg)) {
        slurm_error("transit: --transit-stats needs a directory (a path without control characters)");
        return -1;
    }
    strcpy(tr_job.stats, arg);
    return 0;
}

/* On the submit host (sbatch, salloc, srun): the directory --transit-stats names must exist
 * (for a file name with %r or %p, one file a rank as the shim fills them in: its directory).
 * Each rank writes its own file into it; a path that is no directory the shim takes for one
 * file, which every rank replaces (the last one's report alone is left), and a missing parent
 * loses every report to a warning in the job's output. The node makes no directory. */
int tr_stats_dir_exists(const char *arg)
{
    struct stat st;
    char dir[TR_PATH_MAX]; /* tr_opt_stats checked arg's length against it */
    const char *path = arg, *slash = strrchr(arg, '/');
    if (strstr(arg, "%r") || strstr(arg, "%p")) {
        if (!slash) {
            strcpy(dir, ".");
        } else if (slash == arg) {
            strcpy(dir, "/");
        } else {
            memcpy(dir, arg, (size_t)(slash - arg));
            dir[slash - arg] = 0;
        }
        path = dir;
    }
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    const char *shown = echo(arg); /* "?" for a long or unusual path: said without it */
    slurm_error("transit: the --transit-stats directory%s%s is not there on this host: make it first (each rank "
                "writes its own file into it; the nodes must see it too)", *shown == '?' ? "" : " ",
                *shown == '?' ? "" : shown);
    return -1;
}

/* --- shim= and adapter=: only root may be able to change what every job loads ---------- */

/* Can anyone but root change this entry (or, for a directory, what it holds)? A directory
 * writable by others passes only with the sticky bit (/tmp): then only an entry's owner
 * can replace it, and the next entry on the path must be root's (checked next). */
static const char *unsafe(const struct stat *st, int final)
{
    if (st->st_uid != 0)
        return "is not owned by root";
    if (S_ISLNK(st->st_mode))
        return NULL; /* a link cannot be changed, only replaced in its directory */
    if ((st->st_mode & (S_IWGRP | S_IWOTH)) && !(S_ISDIR(st->st_mode) && (st->st_mode & S_ISVTX) && !final))
        return "is writable by group or others";
    return NULL;
}

/* Walk path from /, following symlinks the way the kernel does and checking every
 * directory, link and the final entry on the way. 0, or -1 with why/where filled in. */
static int walk(const char *path, int want_dir, const char **why, char *where)
{
    char cur[TR_PATH_MAX] = "", rest[TR_PATH_MAX], link[TR_PATH_MAX], tmp[TR_PATH_MAX];
    int links = 0;
    struct stat st;
    if (lstat("/", &st) || (*why = unsafe(&st, 0))) {
        *why = *why ? *why : "cannot be read";
        strcpy(where, "/");
        return -1;
    }
    if (snprintf(rest, sizeof rest, "%s", path) >= (int)sizeof rest)
        goto too_long;
    while (rest[0]) {
        char *comp = rest;
        while (*comp == '/')
            comp++;
        size_t n = strcspn(comp, "/");
        char *next = comp + n;
        while (*next == '/')
            next++;
        if (n == 0)
            break;
        if ((n == 1 && comp[0] == '.') || (n == 2 && comp[0] == '.' && comp[1] == '.')) {
            if (n == 2) { /* cur holds no links: going up is textual */
                char *slash = strrchr(cur, '/');
                if (slash)
                    *slash = 0;
            }
            memmove(rest, next, strlen(next) + 1);
            continue;
        }
        if (strlen(cur) + 1 + n >= sizeof cur)
            goto too_long;
        size_t clen = strlen(cur);
        cur[clen] = '/';
        memcpy(cur + clen + 1, comp, n);
        cur[clen + 1 + n] = 0;
        memmove(rest, next, strlen(next) + 1);
        if (lstat(cur, &st)) {
            *why = "does not exist";
            strcpy(where, cur);
            return -1;
        }
        int final = rest[0] == 0;
        if ((*why = unsafe(&st, final && !S_ISLNK(st.st_mode)))) {
            strcpy(where, cur);
            return -1;
        }
        if (S_ISLNK(st.st_mode)) {
            ssize_t len = readlink(cur, link, sizeof link - 1);
            if (len <= 0 || ++links > 40) {
                *why = len <= 0 ? "is a link that cannot be read" : "has too many links";
                strcpy(where, cur);
                return -1;
            }
            link[len] = 0;
            *strrchr(cur, '/') = 0; /* the link resolves relative to its directory */
            if (link[0] == '/')
                cur[0] = 0;
            if (snprintf(tmp, sizeof tmp, "%s/%s", link, rest) >= (int)sizeof tmp)
                goto too_long;
            strcpy(rest, tmp);
            continue;
        }
        if (!final && !S_ISDIR(st.st_mode)) {
            *why = "is not a directory";
            strcpy(where, cur);
            return -1;
        }
    }
    if (!cur[0])
        strcpy(cur, "/");
    strcpy(where, cur);
    if (lstat(cur, &st) || (*why = unsafe(&st, 1))) { /* again: '..' may have ended elsewhere */
        *why = *why ? *why : "cannot be read";
        return -1;
    }
    if (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode)) {
        *why = want_dir ? "is not a directory" : "is not a regular file";
        return -1;
    }
    return 0;
too_long:
    *why = "is too long";
    snprintf(where, TR_PATH_MAX, "%.64s...", path);
    return -1;
}

/* The adapter directory's own entries (Python imports them into every job) must be
 * root's too: regular files and directories only, one level of subdirectories. */
static int walk_dir(const char *dir, int depth, const char **why, char *where)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int rc = 0;
    if (!d) {
        *why = "cannot be listed";
        snprintf(where, TR_PATH_MAX, "%s", dir);
        return -1;
    }
    while (rc == 0 && (e = readdir(d))) {
        struct stat st;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (snprintf(where, TR_PATH_MAX, "%s/%s", dir, e->d_name) >= TR_PATH_MAX) {
            *why = "is too long";
            rc = -1;
        } else if (lstat(where, &st)) {
            *why = "cannot be read";
            rc = -1;
        } else if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
            *why = "is neither a file nor a directory";
            rc = -1;
        } else if ((*why = unsafe(&st, 1))) {
            rc = -1;
        } else if (S_ISDIR(st.st_mode)) {
            char sub[TR_PATH_MAX];
            strcpy(sub, where);
            if (depth >= 2) {
                *why = "is nested too deep";
                rc = -1;
            } else {
                rc = walk_dir(sub, depth + 1, why, where);
            }
        }
    }
    closedir(d);
    return rc;
}

/* shim=PATH (a file) or adapter=PATH (a directory): absolute, there, and nothing on the
 * way can be changed by anyone but root. 0, or -1 after one logged line. */
int tr_path_secure(const char *key, const char *path, int want_dir)
{
    const char *why = NULL;
    char where[TR_PATH_MAX];
    if (path[0] != '/') {
        slurm_error("transit: plugstack %s=%s: not an absolute path", key, path);
        return -1;
    }
    /* LD_PRELOAD splits at both ' ' and ':', PYTHONPATH at ':'; ld.so expands $LIB,
     * $PLATFORM and $ORIGIN, so the file loaded would not be the file checked. */
    if (strpbrk(path, " :$")) {
        slurm_error("transit: plugstack %s=%s: a path with ':', '$' or a space cannot go on %s", key, path,
                    want_dir ? TR_JOB_ADAPTER_PATH : TR_JOB_PRELOAD);
        return -1;
    }
    char dir[TR_PATH_MAX];
    if (walk(path, want_dir, &why, where) || (want_dir && walk_dir(strcpy(dir, where), 0, &why, where))) {
        slurm_error("transit: plugstack %s=%s: %s %s (it must exist and be changeable by root only)", key, path,
                    where, why);
        return -1;
    }
    return 0;
}

/* --- the line itself -------------------------------------------------------------------- */

static int copy(char *dst, size_t size, const char *key, const char *val)
{
    if (strlen(val) >= size || !*val) {
        slurm_error("transit: plugstack argument %s= is empty or too long", key);
        return -1;
    }
    strcpy(dst, val);
    return 0;
}

/* The string-valued arguments and where each goes. */
static const struct {
    const char *key;
    char *dst;
    size_t size;
} strings[] = {
    {"shim", tr_site.shim, sizeof tr_site.shim},
    {"adapter", tr_site.adapter, sizeof tr_site.adapter},
    {"default", tr_site.dflt, sizeof tr_site.dflt},
    {"allowed", tr_site.allowed, sizeof tr_site.allowed},
};
#define N_STRINGS (sizeof strings / sizeof strings[0])

int tr_parse_args(int ac, char **av)
{
    unsigned seen = 0;
    tr_site.shim[0] = tr_site.adapter[0] = 0;
    strcpy(tr_site.dflt, "off");
    strcpy(tr_site.allowed, TR_POLICIES);
    tr_site.oversubscribe = 0;
    for (int i = 0; i < ac; i++) {
        if (!printable(av[i])) {
            slurm_error("transit: plugstack argument %d holds a control character", i + 1);
            return -1;
        }
        char *eq = strchr(av[i], '=');
        if (!eq) {
            slurm_error("transit: plugstack argument '%s' is not key=value", av[i]);
            return -1;
        }
        size_t klen = (size_t)(eq - av[i]);
        const char *val = eq + 1;
#define KEY(k) (klen == strlen(k) && strncmp(av[i], k, klen) == 0)
        size_t s = 0;
        while (s < N_STRINGS && !KEY(strings[s].key))
            s++;
        if (s == N_STRINGS && !KEY("oversubscribe")) {
            slurm_error("transit: unknown plugstack argument '%.*s' (known: shim, adapter, default, allowed, "
                        "oversubscribe)", (int)(klen > 64 ? 64 : klen), av[i]);
            return -1;
        }
        if (seen & (1u << s)) {
            slurm_error("transit: plugstack argument %.*s= is given twice", (int)klen, av[i]);
            return -1;
        }
        seen |= 1u << s;
        if (s < N_STRINGS) {
            if (copy(strings[s].dst, strings[s].size, strings[s].key, val))
                return -1;
        } else {
            if (strcmp(val, "allow") && strcmp(val, "deny")) {
                slurm_error("transit: plugstack argument oversubscribe=%.64s: expected allow or deny", val);
                return -1;
            }
            tr_site.oversubscribe = strcmp(val, "allow") == 0;
        }
#undef KEY
    }
    for (const char *p = tr_site.allowed; *p;) { /* every allowed entry must be a policy */
        char item[16] = "";
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len < sizeof item)
            memcpy(item, p, len);
        if (len >= sizeof item || !tr_policy_known(item)) {
            slurm_error("transit: plugstack allowed=%s: '%.*s' is not one of %s", tr_site.allowed,
                        (int)(len > 16 ? 16 : len), p, TR_POLICIES);
            return -1;
        }
        if (!comma)
            break;
        p = comma + 1;
        if (!*p) {
            slurm_error("transit: plugstack allowed=%s ends with a comma", tr_site.allowed);
            return -1;
        }
    }
    if (!tr_policy_known(tr_site.dflt) || !tr_policy_allowed(tr_site.dflt)) {
        slurm_error("transit: plugstack default=%s is not an allowed policy (%s)", tr_site.dflt, tr_site.allowed);
        return -1;
    }
    if (!tr_site.shim[0]) {
        slurm_error("transit: plugstack gives no shim=PATH (the libtransit.so jobs load)");
        return -1;
    }
    if (tr_path_secure("shim", tr_site.shim, 0))
        return -1;
    if (tr_site.adapter[0] && tr_path_secure("adapter", tr_site.adapter, 1))
        return -1;
    return 0;
}
