/* advise without framework hints: classify page ranges by observed access.
 *
 * In the recorded warm-up iteration every region starts on the host, so each 2 MiB
 * block migrates on its first GPU touch and CUPTI reports where in the iteration that
 * was. Blocks first touched in the last TRANSIT_COLD_TAIL fraction of the iteration's
 * launches (default 2%: the optimizer step) are treated as optimizer state. A heuristic,
 * used only when no adapter reported cold ranges. */
#include <stdlib.h>
#include <string.h>

#include "transit.h"

#define BLOCK (2u << 20)

struct touch { uintptr_t block; uint64_t pos; };
static struct touch *t;
static size_t n, cap;
static uint64_t max_pos;

void tr_observe_touch(uintptr_t addr, uint64_t bytes, uint64_t pos)
{
    for (uintptr_t b = addr & ~(uintptr_t)(BLOCK - 1); b < addr + bytes; b += BLOCK) {
        if (n == cap) {
            size_t c = cap ? cap * 2 : 4096;
            struct touch *p = realloc(t, c * sizeof *p);
            if (!p)
                return;
            t = p;
            cap = c;
        }
        t[n++] = (struct touch){b, pos};
    }
    if (pos > max_pos)
        max_pos = pos;
}

static int by_block(const void *a, const void *b)
{
    const struct touch *x = a, *y = b;
    if (x->block != y->block)
        return x->block < y->block ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

void tr_observe_classify(void)
{
    uint64_t launches = tr_count.period ? tr_count.period : max_pos + 1; /* < 2^32: no wrap below */
    uint64_t late = launches * (1000000 - tr_cfg.cold_tail_ppm) / 1000000;
    if (n) /* qsort of NULL is undefined, even for no elements */
        qsort(t, n, sizeof *t, by_block);
    uint64_t cold = 0;
    uintptr_t run_start = 0, run_end = 0;
    for (size_t i = 0; i < n; i++) {
        if (i > 0 && t[i].block == t[i - 1].block)
            continue; /* sorted by position within a block: the first is the first touch */
        if (t[i].pos < late)
            continue;
        if (t[i].block == run_end) {
            run_end += BLOCK;
        } else {
            if (run_end > run_start)
                cold += tr_hint(run_start, run_end - run_start, TR_COLD_OPT) == 0 ? run_end - run_start : 0;
            run_start = t[i].block;
            run_end = run_start + BLOCK;
        }
    }
    if (run_end > run_start)
        cold += tr_hint(run_start, run_end - run_start, TR_COLD_OPT) == 0 ? run_end - run_start : 0;
    tr_log(TR_INFO, "observed access: %zu block touches over %llu launches, %llu bytes first touched in the "
                    "last %.1f%% classified cold", n, (unsigned long long)launches, (unsigned long long)cold,
           tr_cfg.cold_tail_ppm / 1e4);
    free(t);
    t = NULL;
    n = cap = 0;
}

void tr_observe_discard(void)
{
    free(t);
    t = NULL;
    n = cap = 0;
    max_pos = 0;
}
