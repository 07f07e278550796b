/* The plugin's parsers under a fuzzer: the plugstack line (tr_parse_args, with the
 * shim=/adapter= path walk), the option checks (tr_opt_*) and the path-list edits of
 * env.c, whose invariants are checked here (abort() on a violation).
 *
 * Input: fields separated by '\n'. They are the plugstack arguments, each one an option
 * value, and the first two are also (old list, entry) for tr_list_prepend/remove.
 *
 * clang -fsanitize=fuzzer,address,undefined -DTR_LIBFUZZER: a libFuzzer target. Otherwise
 * (gcc -fsanitize=address,undefined) main(SEED, RUNS) feeds it seeded random inputs built
 * from the grammar's own words. tests/test_spank.py runs both where it can. */
#define _DEFAULT_SOURCE /* strdup */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../transit_spank.h"

void slurm_error(const char *fmt, ...)
{
    char buf[16384];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap); /* every argument is formatted, as Slurm would */
    va_end(ap);
    if (strchr(buf, '\n'))
        abort(); /* one log line, never two */
}

#define MAXF 16

static const char *cur_old, *cur_item, *cur_seps;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "fuzz: invariant broken: %s\n", what);
        if (cur_old)
            fprintf(stderr, "fuzz: old='%s' entry='%s' separators='%s'\n", cur_old, cur_item, cur_seps);
        abort();
    }
}

/* Entries of s split at any of seps, empties dropped unless keep; NULL-terminated, in buf. */
static size_t split(char *s, const char *seps, int keep, char **out, size_t max)
{
    size_t n = 0;
    if (!*s)
        return 0;
    for (char *p = s;;) {
        size_t len = strcspn(p, seps);
        int last = !p[len];
        p[len] = 0;
        if ((len || keep) && n < max)
            out[n++] = p;
        if (last)
            break;
        p += len + 1;
    }
    return n;
}

static void lists(const char *old, const char *item, const char *seps, int keep)
{
    if (!*item || strpbrk(item, seps) || strpbrk(item, ":"))
        return; /* args.c refuses such a shim= or adapter= */
    enum { MAXE = 1 << 17 }; /* more than the entries of any input (64 KiB) */
    cur_old = old, cur_item = item, cur_seps = seps;
    static char *want[MAXE], *got[MAXE];
    char *o = strdup(old), *res = tr_list_prepend(old, item, seps, keep);
    char *rem = tr_list_remove(old, item, seps, keep);
    check(o && res && rem, "out of memory");
    size_t nw = split(o, seps, keep, want, MAXE), k = 0;
    size_t ng = split(res, ":", 1, got, MAXE);
    check(ng >= 1 && strcmp(got[0], item) == 0, "prepend: the entry comes first");
    for (size_t i = 0; i < nw; i++)
        if (strcmp(want[i], item) != 0) {
            check(k + 1 < ng && strcmp(got[k + 1], want[i]) == 0, "prepend: the old entries stay, in order");
            k++;
        }
    check(k + 1 == ng, "prepend: nothing added");
    ng = split(rem, ":", 1, got, MAXE);
    for (size_t i = 0; i < ng; i++)
        check(strcmp(got[i], item) != 0, "remove: the entry is gone");
    free(o);
    free(res);
    free(rem);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    char *field[MAXF];
    int n = 0;
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0;
    for (char *p = text; n < MAXF;) {
        field[n++] = p;
        char *nl = strchr(p, '\n');
        if (!nl)
            break;
        *nl = 0;
        p = nl + 1;
    }
    int rc = tr_parse_args(n, field);
    if (rc == 0) { /* what loaded is consistent */
        check(tr_policy_known(tr_site.dflt) && tr_policy_allowed(tr_site.dflt), "default is an allowed policy");
        check(tr_site.shim[0] == '/', "shim is absolute");
    }
    for (int i = 0; i < n; i++) {
        memset(&tr_job, 0, sizeof tr_job);
        if (tr_opt_policy(field[i]) == 0)
            check(tr_policy_known(tr_job.policy) && tr_policy_allowed(tr_job.policy), "policy checked");
        if (tr_opt_budget(field[i]) == 0)
            check(tr_size_valid(tr_job.budget), "budget checked");
        if (tr_opt_stats(field[i]) == 0)
            check(tr_job.stats[0] != 0, "stats checked");
    }
    if (n >= 2)
        for (int keep = 0; keep < 2; keep++) {
            lists(field[0], field[1], " :", keep);
            lists(field[0], field[1], ":", keep);
        }
    free(text);
    return 0;
}

#ifndef TR_LIBFUZZER
static uint64_t rng;

static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static const char *words[] = {
    "shim=", "adapter=", "default=", "allowed=", "oversubscribe=", "allow", "deny", "off", "base", "prefetch",
    "advise", "bogus", ",", "=", "/", "//", ".", "..", "/../", "./", ":", " ", "\t", "\n", "\n", "\n", "#", "%s",
    "%n", "40GB", "1.5 TB", "1e99", "nan", "inf", "0x10GB", "1e-300", "-5GB", "9999999999999999TiB", "GiB",
    "/bin/sh", "/usr/bin", "/usr/include/slurm", "/usr/include/slurm/spank.h", "/tmp", "/dev/null",
    "/proc/self/root", "/proc/self/cwd/", "/nonexistent", "/lib", "\x7f", "\x01", "\xff", "\xc3\xa9",
};

int main(int argc, char **argv)
{
    rng = argc > 1 ? strtoull(argv[1], NULL, 10) * 2654435761u + 1 : 1;
    long runs = argc > 2 ? atol(argv[2]) : 100000;
    static uint8_t buf[1 << 16];
    for (long r = 0; r < runs; r++) {
        size_t len = 0, parts = 1 + next() % 24;
        for (size_t i = 0; i < parts && len < sizeof buf - 8192; i++) {
            uint64_t pick = next() % 16;
            if (pick < 12) { /* a word of the grammar */
                const char *w = words[next() % (sizeof words / sizeof words[0])];
                memcpy(buf + len, w, strlen(w));
                len += strlen(w);
            } else if (pick < 15) { /* random bytes */
                for (size_t k = next() % 12; k; k--)
                    buf[len++] = (uint8_t)next();
            } else { /* a long run, past every buffer in the plugin */
                size_t k = 60 + next() % 8000;
                memset(buf + len, "A/:,"[next() % 4], k);
                len += k;
            }
        }
        LLVMFuzzerTestOneInput(buf, len);
    }
    printf("fuzz: %ld inputs, no invariant broken\n", runs);
    return 0;
}
#endif
