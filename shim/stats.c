/* TRANSIT_STATS: a JSON report at exit (and on demand through transit_write_stats).
 * A path naming a directory gets transit-<rank or pid>.json inside it; "%p" in a path
 * is replaced by the pid and "%r" by $RANK, so every rank of a job writes its own. */
#define _GNU_SOURCE /* fdopen, getrandom */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "transit.h"

enum { PATH_LEN = 4096 }; /* Linux's PATH_MAX */

/* Appends n bytes of s to out (of len bytes) at *o; -1 when they do not fit. */
static int put(char *out, size_t len, size_t *o, const char *s, size_t n)
{
    if (n >= len - *o)
        return -1;
    memcpy(out + *o, s, n);
    *o += n;
    out[*o] = 0;
    return 0;
}

/* path with %p and %r replaced, or the file for this process in a directory; -1 when
 * that does not fit in len (RANK is the user's: any length). */
static int expand(const char *in, char *out, size_t len)
{
    struct stat st;
    char pid[24];
    const char *rank = getenv("RANK");
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    if (stat(in, &st) == 0 && S_ISDIR(st.st_mode)) {
        int n = snprintf(out, len, "%s/transit-%s%s.json", in, rank ? "rank" : "", rank ? rank : pid);
        return n >= 0 && (size_t)n < len ? 0 : -1;
    }
    size_t o = 0;
    out[0] = 0;
    for (const char *c = in; *c; c++) {
        const char *s = c;
        size_t n = 1;
        if (c[0] == '%' && (c[1] == 'p' || c[1] == 'r')) {
            s = c[1] == 'p' ? pid : rank ? rank : "0";
            n = strlen(s);
            c++;
        }
        if (put(out, len, &o, s, n) != 0)
            return -1;
    }
    return 0;
}

/* s when it is non-empty and every character is in ok, else NULL: what goes into the
 * JSON unquoted (a rank) or quoted without escapes (a node's name). */
static const char *plain(const char *s, const char *ok)
{
    return s && s[0] && strlen(s) < 256 && s[strspn(s, ok)] == 0 ? s : NULL;
}

/* A rank as a JSON number (digits, no leading zero), or NULL. */
static const char *number(const char *s)
{
    s = plain(s, "0123456789");
    return s && (s[0] != '0' || !s[1]) ? s : NULL;
}

/* Which rank of which node wrote the report, for `transit-launch report`: $RANK, and the
 * node as Slurm names it ($SLURMD_NODENAME: the lab's nodes share one host) or the host. */
static void who(FILE *f)
{
    static const char name[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-";
    char host[256] = "";
    const char *rank = number(getenv("RANK")), *local = number(getenv("LOCAL_RANK"));
    const char *node = plain(getenv("SLURMD_NODENAME"), name);
    if (!node && gethostname(host, sizeof host - 1) == 0)
        node = plain(host, name);
    fprintf(f, "  \"rank\": %s,\n  \"local_rank\": %s,\n", rank ? rank : "null", local ? local : "null");
    fprintf(f, node ? "  \"node\": \"%s\",\n" : "  \"node\": null,\n", node);
}

/* Another user cannot have changed this: it is root's or ours. */
static int owner_trusted(uid_t uid) { return uid == 0 || uid == geteuid(); }

/* Only a trusted owner can add, remove or rename the directory's entries. */
static int dir_protects(const struct stat *d)
{
    return owner_trusted(d->st_uid) && !(d->st_mode & (S_IWGRP | S_IWOTH));
}

/* The directory that holds path's last component, opened by walking the path one entry at
 * a time with O_NOFOLLOW (from / or from the working directory); the last component goes to
 * leaf. A link on the way is followed only when no other user can have put it there: its
 * directory is protected (dir_protects), or it is a sticky directory (/tmp) of root's or
 * ours and the link is ours or root's (the owner of a sticky directory can still move
 * any entry in it). So a root job's stats do not follow a link
 * another user planted in /tmp into root's directories. The directory itself may be shared:
 * the file is made in it with O_EXCL|O_NOFOLLOW and renamed within it. -1 with why set. */
static int open_parent(const char *path, char *leaf, size_t leaf_len, const char **why)
{
    char rest[2 * PATH_LEN], lnk[PATH_LEN];
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    size_t dir_len = slash ? (size_t)(slash - path) : 0;
    *why = "the path is too long";
    if (!*name || strlen(name) >= leaf_len || dir_len >= sizeof rest)
        return -1;
    strcpy(leaf, name);
    memcpy(rest, path, dir_len);
    rest[dir_len] = 0;
    int fd = open(path[0] == '/' ? "/" : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), links = 0;
    char *p = rest;
    while (fd >= 0 && *p) {
        while (*p == '/')
            p++;
        char *end = strchrnul(p, '/');
        char comp[PATH_LEN];
        size_t n = (size_t)(end - p);
        if (n == 0)
            break;
        if (n >= sizeof comp)
            goto fail;
        memcpy(comp, p, n);
        comp[n] = 0;
        p = end;
        if (!strcmp(comp, "."))
            continue;
        int next = openat(fd, comp, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        struct stat ls, ds;
        if (next < 0 && (errno == ELOOP || errno == ENOTDIR) && !fstatat(fd, comp, &ls, AT_SYMLINK_NOFOLLOW) &&
            S_ISLNK(ls.st_mode)) {
            *why = "a directory on the way is a link that another user could have made";
            if (fstat(fd, &ds) ||
                !(dir_protects(&ds) || ((ds.st_mode & S_ISVTX) && owner_trusted(ds.st_uid) && owner_trusted(ls.st_uid))))
                goto fail;
            *why = "a directory on the way is a link that cannot be followed";
            ssize_t len = readlinkat(fd, comp, lnk, sizeof lnk - 1);
            if (len <= 0 || ++links > 40 || (size_t)len + strlen(p) + 2 > sizeof rest)
                goto fail;
            lnk[len] = 0;
            char tail[2 * PATH_LEN];
            snprintf(tail, sizeof tail, "%s%s", lnk, p); /* p is "" or starts with '/' */
            strcpy(rest, tail);
            p = rest;
            if (lnk[0] == '/') {
                close(fd);
                fd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            }
            continue;
        }
        *why = "a directory on the way cannot be opened";
        if (next < 0)
            goto fail;
        close(fd);
        fd = next;
    }
    return fd;
fail:
    if (fd >= 0)
        close(fd);
    return -1;
}

/* A new file in the directory dfd, made with O_EXCL|O_NOFOLLOW under a name nobody can
 * guess (the directory may be shared: a link or a file planted under a predictable name
 * would be written through or clobbered); its name in tmp. NULL when none can be made. */
static FILE *create_tmp(int dfd, const char *leaf, char *tmp, size_t len)
{
    static _Atomic unsigned long long writes;
    for (int tries = 0; tries < 16; tries++) {
        unsigned long long r;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
            /* no getrandom (an old kernel, a seccomp filter): O_EXCL|O_NOFOLLOW still keep
             * the write safe; the name only makes planting a file in the way harder */
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            r = ((unsigned long long)ts.tv_nsec << 20) ^ (unsigned long long)ts.tv_sec ^
                ((unsigned long long)getpid() << 40) ^ atomic_fetch_add(&writes, 1) * 0x9e3779b97f4a7c15ull;
        }
        if (snprintf(tmp, len, ".%s.tmp%016llx", leaf, r) >= (int)len)
            return NULL;
        int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666); /* the umask applies */
        if (fd >= 0) {
            FILE *f = fdopen(fd, "w");
            if (!f) {
                close(fd);
                unlinkat(dfd, tmp, 0);
            }
            return f;
        }
        if (errno != EEXIST)
            return NULL;
    }
    return NULL;
}

int tr_write_stats(const char *path)
{
    char full[PATH_LEN], tmp[300];
    const char *rank = getenv("RANK");
    if (rank && strchr(rank, '/')) { /* it names a file: a '/' would name another directory */
        tr_log(TR_WARN, "cannot write stats: RANK holds a '/'");
        return -1;
    }
    if (expand(path, full, sizeof full) != 0) {
        tr_log(TR_WARN, "cannot write stats: the path (TRANSIT_STATS or transit_write_stats) is too long once %%p, "
                        "%%r (RANK) or the directory's file name are filled in: %.60s...", path);
        return -1;
    }
    /* written under a new name, then renamed over full within its directory: rename
     * replaces a link planted at full instead of writing through it, and a reader never
     * sees half a report */
    char leaf[256];
    const char *why = NULL;
    int dfd = open_parent(full, leaf, sizeof leaf, &why);
    if (dfd < 0) {
        tr_log(TR_WARN, "cannot write stats to %s: %s", full, why);
        return -1;
    }
    FILE *f = create_tmp(dfd, leaf, tmp, sizeof tmp);
    if (!f) {
        tr_log(TR_WARN, "cannot write stats to %s", full);
        close(dfd);
        return -1;
    }
    pthread_mutex_lock(&tr_lock);
    if (!tr_s.passthrough && tr_cfg.policy != TR_OFF)
        tr_sample_residency();
    static const char *sources[] = {"none", "adapter", "kernel-sequence"};
    fprintf(f, "{\n  \"version\": 1,\n  \"pid\": %d,\n  \"policy\": \"%s\",\n  \"passthrough\": %s,\n",
            (int)getpid(), tr_policy_name(tr_cfg.policy), tr_s.passthrough ? "true" : "false");
    who(f);
    fprintf(f, "  \"budget_bytes\": %llu,\n  \"budget_explicit\": %s,\n  \"guard_limit_bytes\": %llu,\n",
            (unsigned long long)(tr_s.passthrough ? 0 : tr_budget_total()), tr_cfg.budget ? "true" : "false",
            (unsigned long long)tr_guard_limit());
    fprintf(f, "  \"free_at_start_bytes\": %llu,\n  \"runtime_version\": %d,\n",
            (unsigned long long)tr_s.free_at_start, tr_real.runtime_version);
    fprintf(f, "  \"cuda_malloc_calls\": %llu,\n  \"cuda_free_calls\": %llu,\n  \"managed_allocs\": %llu,\n",
            (unsigned long long)tr_count.mallocs, (unsigned long long)tr_count.frees,
            (unsigned long long)tr_count.managed_allocs);
    fprintf(f, "  \"failed_allocs\": %llu,\n  \"guard_refusals\": %llu,\n  \"managed_fallbacks\": %llu,\n"
               "  \"kernel_launches\": %llu,\n",
            (unsigned long long)tr_count.failed_allocs, (unsigned long long)tr_count.guard_refusals,
            (unsigned long long)tr_count.managed_fallbacks, (unsigned long long)tr_count.launches);
    fprintf(f, "  \"managed_bytes\": %llu,\n  \"managed_peak_bytes\": %llu,\n",
            (unsigned long long)tr_tab.managed_bytes, (unsigned long long)tr_count.managed_peak);
    fprintf(f, "  \"device_placed_bytes\": %llu,\n  \"device_placed_peak_bytes\": %llu,\n",
            (unsigned long long)tr_tab.dev_bytes, (unsigned long long)tr_count.dev_placed_peak);
    fprintf(f, "  \"device_buffer_bytes\": %llu,\n", (unsigned long long)tr_devbuf_bytes());
    fprintf(f, "  \"host_placed_bytes\": %llu,\n  \"host_placed_peak_bytes\": %llu,\n",
            (unsigned long long)tr_count.host_placed_bytes, (unsigned long long)tr_count.host_placed_peak);
    fprintf(f, "  \"host_state_bytes\": %llu,\n  \"host_state_peak_bytes\": %llu,\n  \"host_state_allocs\": %llu,\n",
            (unsigned long long)tr_hoststate_bytes(), (unsigned long long)tr_count.host_state_peak,
            (unsigned long long)tr_count.host_state_allocs);
    fprintf(f, "  \"host_state_kept_bytes\": %llu,\n  \"host_state_pin_s\": %.3f,\n",
            (unsigned long long)tr_count.host_state_kept, tr_count.host_state_pin_ms / 1e3);
    fprintf(f, "  \"host_state_first_room_bytes\": %llu,\n  \"host_state_prefill_hold_regions\": %llu,\n"
               "  \"host_state_prefill_hold_room_bytes\": %llu,\n",
            (unsigned long long)tr_count.host_state_first_room, (unsigned long long)tr_count.host_state_prefill_hold_regions,
            (unsigned long long)tr_count.host_state_prefill_hold_room);
    fprintf(f, "  \"host_state_prefill_bytes\": %llu,\n  \"host_state_prefill_used_bytes\": %llu,\n",
            (unsigned long long)tr_count.host_state_prefill, (unsigned long long)tr_count.host_state_prefill_used);
    /* where the first step's pinning went: the fill's lead, the slices' waits, registration */
    fprintf(f, "  \"host_state_prefill_ahead_bytes\": %llu,\n  \"host_state_prefill_lead_s\": %.3f,\n"
               "  \"host_state_prefill_wait_s\": %.3f,\n  \"host_state_register_s\": %.3f,\n",
            (unsigned long long)tr_count.host_state_prefill_ahead, tr_count.host_state_prefill_lead_ms / 1e3,
            tr_count.host_state_prefill_wait_ms / 1e3, tr_count.host_state_register_ms / 1e3);
    fprintf(f, "  \"host_state_prefill_ready_bytes\": %llu,\n  \"host_state_prefill_unused_bytes\": %llu,\n"
               "  \"host_state_prefill_register_s\": %.3f,\n  \"host_state_prefill_release_s\": %.3f,\n",
            (unsigned long long)tr_count.host_state_prefill_ready, (unsigned long long)tr_count.host_state_prefill_unused,
            tr_count.host_state_prefill_register_ms / 1e3, tr_count.host_state_prefill_release_ms / 1e3);
    fprintf(f, "  \"zero_copy_mapped_bytes\": %llu,\n  \"zero_copy_mapped_peak_bytes\": %llu,\n",
            (unsigned long long)tr_count.zero_copy_bytes, (unsigned long long)tr_count.zero_copy_peak);
    fprintf(f, "  \"cold_hint_bytes\": {\"optimizer\": %llu, \"master\": %llu, \"sparse\": %llu},\n",
            (unsigned long long)tr_count.hint_bytes[TR_COLD_OPT], (unsigned long long)tr_count.hint_bytes[TR_COLD_MASTER],
            (unsigned long long)tr_count.hint_bytes[TR_COLD_SPARSE]);
    fprintf(f, "  \"gpu_resident_peak_bytes\": %llu,\n  \"gpu_resident_peak_steady_bytes\": %llu,\n",
            (unsigned long long)tr_count.resident_peak, (unsigned long long)tr_count.resident_peak_steady);
    fprintf(f, "  \"page_faults\": %llu,\n  \"htod_bytes\": %llu,\n  \"dtoh_bytes\": %llu,\n",
            (unsigned long long)tr_count.um_faults, (unsigned long long)tr_count.um_htod_bytes,
            (unsigned long long)tr_count.um_dtoh_bytes);
    fprintf(f, "  \"prefetch_calls\": %llu,\n  \"prefetch_bytes\": %llu,\n  \"evict_calls\": %llu,\n"
               "  \"evict_bytes\": %llu,\n  \"advise_calls\": %llu,\n  \"hint_errors\": %llu,\n"
               "  \"replay_positions\": %llu,\n  \"room_demotions\": %llu,\n",
            (unsigned long long)tr_count.prefetch_calls, (unsigned long long)tr_count.prefetch_bytes,
            (unsigned long long)tr_count.evict_calls, (unsigned long long)tr_count.evict_bytes,
            (unsigned long long)tr_count.advise_calls, (unsigned long long)tr_count.hint_errors,
            (unsigned long long)tr_replay_positions(), (unsigned long long)tr_count.room_demotions);
    fprintf(f, "  \"adapter\": %s,\n", tr_s.adapter_stats ? tr_s.adapter_stats : "null");
    fprintf(f, "  \"plan\": %s,\n", tr_cfg.plan ? tr_cfg.plan : "null");
    fprintf(f, "  \"iterations\": %d,\n  \"iteration_source\": \"%s\",\n  \"detected_period\": %llu,\n",
            tr_count.iterations, sources[tr_count.boundary_source], (unsigned long long)tr_count.period);
    fprintf(f, "  \"first_iteration_ms\": %.3f,\n", tr_count.first_iter_ms);
    fprintf(f, "  \"iteration_ms\": [");
    for (int i = 0; i < tr_count.n_iter_ms; i++)
        fprintf(f, "%s%.3f", i ? ", " : "", tr_count.iter_ms[i]);
    fprintf(f, "]\n}\n");
    pthread_mutex_unlock(&tr_lock);
    int bad = fclose(f) != 0;
    if (bad || renameat(dfd, tmp, dfd, leaf) != 0) {
        tr_log(TR_WARN, "cannot write stats to %s", full);
        unlinkat(dfd, tmp, 0);
        close(dfd);
        return -1;
    }
    close(dfd);
    return 0;
}
