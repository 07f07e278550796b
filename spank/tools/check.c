/* transit_spank_check ARG...: the plugin's own plugstack parser (../args.c) on the
 * arguments of a plugstack line, exactly as the plugin runs it when Slurm loads it
 * (shim= and adapter= checked on this machine). Exit 0, or 2 after the plugin's error
 * line on stderr. `transit-launch spank install` runs it before it writes the line. */
#include <stdarg.h>
#include <stdio.h>

#include "../transit_spank.h"

void slurm_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int main(int argc, char **argv)
{
    return tr_parse_args(argc - 1, argv + 1) ? 2 : 0;
}
