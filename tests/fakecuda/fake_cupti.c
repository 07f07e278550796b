/* A stand-in libcupti.so for the shim's warm-up recorder (cupti.c) without a GPU. Each
 * launch position the shim pushes becomes a kernel record tied to it by an external
 * correlation record, and every FAKE_CUPTI_TOUCH_EVERY-th (4) a 2 MiB host-to-device
 * migration of a live managed allocation of the fake runtime (fake_cudart_pick); the
 * records arrive through the shim's buffer callbacks at cuptiActivityFlushAll.
 * FAKE_CUPTI_ERROR=N: cuptiActivityRegisterCallbacks fails with N. Calls go to the fake
 * runtime's log ($FAKE_CUDART_LOG); a pop without a push is logged as unbalanced. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cupti.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static CUpti_BuffersCallbackRequestFunc requested;
static CUpti_BuffersCallbackCompleteFunc completed;
static _Thread_local int depth; /* external ids pushed by this thread */
static uint64_t clock_ns, pushes;
static uint32_t next_corr = 1;

union rec { /* one slot per record: the shim reads each by its kind */
    CUpti_Activity any;
    CUpti_ActivityKernel10 k;
    CUpti_ActivityExternalCorrelation x;
    CUpti_ActivityUnifiedMemoryCounter3 u;
};
static union rec *pending;
static size_t npending, cpending;

/* A line in the fake runtime's log (fake_cudart_log). */
static void logcall(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logcall(const char *fmt, ...)
{
    void (*log)(const char *) = (void (*)(const char *))dlsym(RTLD_DEFAULT, "fake_cudart_log");
    char line[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (log)
        log(line);
}

static void add(union rec r) /* under mu */
{
    if (npending == cpending) {
        size_t c = cpending ? cpending * 2 : 1024;
        union rec *p = realloc(pending, c * sizeof *p);
        if (!p)
            return;
        pending = p;
        cpending = c;
    }
    pending[npending++] = r;
}

CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc req, CUpti_BuffersCallbackCompleteFunc done)
{
    const char *e = getenv("FAKE_CUPTI_ERROR");
    logcall("cuptiActivityRegisterCallbacks%s%s", e ? " -> " : "", e ? e : "");
    if (e)
        return (CUptiResult)atoi(e);
    pthread_mutex_lock(&mu);
    requested = req;
    completed = done;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityConfigureUnifiedMemoryCounter(CUpti_ActivityUnifiedMemoryCounterConfig *c, uint32_t n)
{
    (void)c;
    (void)n;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityEnable(CUpti_ActivityKind k) { (void)k; return CUPTI_SUCCESS; }
CUptiResult cuptiActivityDisable(CUpti_ActivityKind k) { (void)k; return CUPTI_SUCCESS; }

CUptiResult cuptiActivityPushExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t id)
{
    static uint64_t every;
    unsigned long long (*pick)(unsigned long long) =
        (unsigned long long (*)(unsigned long long))dlsym(RTLD_DEFAULT, "fake_cudart_pick");
    depth++;
    pthread_mutex_lock(&mu);
    if (!every) {
        const char *v = getenv("FAKE_CUPTI_TOUCH_EVERY");
        every = v && atoi(v) > 0 ? (uint64_t)atoi(v) : 4;
    }
    uint32_t corr = next_corr++;
    uint64_t t = clock_ns += 1000;
    union rec r;
    memset(&r, 0, sizeof r);
    r.x.kind = CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION;
    r.x.externalKind = kind;
    r.x.externalId = id;
    r.x.correlationId = corr;
    add(r);
    memset(&r, 0, sizeof r);
    r.k.kind = CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL;
    r.k.start = t;
    r.k.end = t + 500;
    r.k.correlationId = corr;
    add(r);
    uint64_t addr = ++pushes % every == 0 && pick ? pick(pushes) : 0;
    if (addr) {
        memset(&r, 0, sizeof r);
        r.u.kind = CUPTI_ACTIVITY_KIND_UNIFIED_MEMORY_COUNTER;
        r.u.counterKind = CUPTI_ACTIVITY_UNIFIED_MEMORY_COUNTER_KIND_BYTES_TRANSFER_HTOD;
        r.u.start = t + 100;
        r.u.end = t + 200;
        r.u.address = addr;
        r.u.value = 2u << 20;
        add(r);
    }
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityPopExternalCorrelationId(CUpti_ExternalCorrelationKind kind, uint64_t *last)
{
    (void)kind;
    if (last)
        *last = 0;
    if (depth == 0) {
        logcall("cuptiActivityPopExternalCorrelationId -> unbalanced");
        return CUPTI_ERROR_QUEUE_EMPTY;
    }
    depth--;
    return CUPTI_SUCCESS;
}

/* Every record so far goes to the shim in buffers it provides. */
CUptiResult cuptiActivityFlushAll(uint32_t flag)
{
    (void)flag;
    pthread_mutex_lock(&mu);
    size_t done = 0;
    while (requested && completed && done < npending) {
        uint8_t *buf = NULL;
        size_t size = 0, max = 0, n = 0;
        requested(&buf, &size, &max);
        if (!buf)
            break;
        for (; done < npending && (n + 1) * sizeof(union rec) <= size; n++, done++)
            memcpy(buf + n * sizeof(union rec), &pending[done], sizeof(union rec));
        pthread_mutex_unlock(&mu); /* the callback takes the shim's own lock */
        completed(NULL, 0, buf, size, n * sizeof(union rec));
        pthread_mutex_lock(&mu);
    }
    npending = 0;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiActivityGetNextRecord(uint8_t *buf, size_t valid, CUpti_Activity **rec)
{
    uint8_t *next = *rec ? (uint8_t *)*rec + sizeof(union rec) : buf;
    if (next + sizeof(union rec) > buf + valid)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *rec = (CUpti_Activity *)next;
    return CUPTI_SUCCESS;
}

CUptiResult cuptiFinalize(void)
{
    logcall("cuptiFinalize");
    pthread_mutex_lock(&mu);
    requested = NULL;
    completed = NULL;
    npending = 0;
    pthread_mutex_unlock(&mu);
    return CUPTI_SUCCESS;
}

CUptiResult cuptiGetResultString(CUptiResult r, const char **str)
{
    static const struct { CUptiResult r; const char *name; } names[] = {
        {CUPTI_SUCCESS, "CUPTI_SUCCESS"},
        {CUPTI_ERROR_INSUFFICIENT_PRIVILEGES, "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"},
        {CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"},
        {CUPTI_ERROR_UNKNOWN, "CUPTI_ERROR_UNKNOWN"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (names[i].r == r) {
            *str = names[i].name;
            return CUPTI_SUCCESS;
        }
    return CUPTI_ERROR_INVALID_PARAMETER;
}
