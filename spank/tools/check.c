/* transit_spank_check ARG...: the plugin's own plugstack parser (../args.c) on the
 * arguments of a plugstack line, exactly as the plugin runs it when Slurm loads it
 * (shim= and adapter= checked on this machine). transit_spank_check --dir DIR: the same
 * check of a directory (the include directory the line goes into: whoever can change it
 * can change the line). transit_spank_check --file PATH: the same check of a file (the
 * installed plugin: whoever can change it runs code in every slurmstepd). Exit 0, or 2 after the plugin's error line on stderr.
 * `transit-launch spank install` runs both before it writes the line. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
    if (argc == 3 && strcmp(argv[1], "--dir") == 0) /* the plugstack include directory */
        return tr_path_secure("include", argv[2], 1) ? 2 : 0;
    if (argc == 3 && strcmp(argv[1], "--file") == 0) /* the installed plugin */
        return tr_path_secure("plugin", argv[2], 0) ? 2 : 0;
    return tr_parse_args(argc - 1, argv + 1) ? 2 : 0;
}
