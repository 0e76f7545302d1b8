/* bloomgrid: the command-line tool.  main() only dispatches: the first
 * argument names a command, which gets the remaining arguments.  Offline
 * commands work on filter files; online ones (talking to a server) will be
 * added to the same table. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "bf_file.h"
#include "cli.h"

#ifndef BLOOMGRID_VERSION
#define BLOOMGRID_VERSION "unknown"
#endif

struct command {
    const char *name;
    int (*run)(int argc, char **argv);
};

static const struct command commands[] = {
    {"create", cmd_create},
    {"build", cmd_build},
    {"add", cmd_add},
    {"query", cmd_query},
    {"remove", cmd_remove},
    {"merge", cmd_merge},
    {"inspect", cmd_inspect},
    {NULL, NULL},
};

static const struct command *command_find(const char *name)
{
    for (const struct command *c = commands; c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

static int run_help(int argc, char **argv)
{
    if (argc < 2) {
        help_overview(stdout);
        return CLI_OK;
    }
    return help_print(argv[1]);
}

int main(int argc, char **argv)
{
    const struct command *c;

    /* Over a file-size limit, fail the write (and remove the temp file)
     * instead of being killed with the temp file left behind. */
    signal(SIGXFSZ, SIG_IGN);
    if (argc < 2) {
        help_overview(stderr);
        return CLI_ERR;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
        return run_help(1, argv + 1);
    if (strcmp(argv[1], "--version") == 0) {
        printf("bloomgrid %s (file format version %d)\n", BLOOMGRID_VERSION,
               BF_FILE_VERSION);
        return CLI_OK;
    }
    if (strcmp(argv[1], "help") == 0)
        return run_help(argc - 1, argv + 1);
    c = command_find(argv[1]);
    if (!c)
        return cli_fail("unknown command '%s' (see 'bloomgrid --help')",
                        argv[1]);
    return c->run(argc - 1, argv + 1);
}
