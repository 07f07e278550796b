/* One line per message on stderr, prefixed with the pid: several ranks share a log. */
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "transit.h"

void tr_log(int level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > tr_cfg.log_level)
        return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "transit[%d] %s: %s\n", (int)getpid(), names[level], buf);
}
