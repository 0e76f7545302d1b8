/* bloomgrid: the command-line tool.  main() only dispatches: the first
 * argument names a command, which gets the remaining arguments.  Offline
 * commands work on filter files, online ones talk to a server (node or
 * router).  create, add and remove exist in both forms: they go online when
 * a server is named (--server before or after the command name, or the
 * BLOOMGRID_SERVER environment variable), and work on a file otherwise. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf_file.h"
#include "cli.h"
#include "online.h"
#include "online_cmd.h"
#include "version.h"


struct command {
    const char *name;
    int (*offline)(int argc, char **argv);   /* on files */
    int (*online)(int argc, char **argv);    /* against a server */
};

static const struct command commands[] = {
    {"create", cmd_create, cmd_online_create},
    {"build", cmd_build, NULL},
    {"add", cmd_add, cmd_online_add},
    {"query", cmd_query, NULL},
    {"remove", cmd_remove, cmd_online_remove},
    {"merge", cmd_merge, NULL},
    {"inspect", cmd_inspect, NULL},
    {"token", cmd_token, NULL},
    {"drop", NULL, cmd_online_drop},
    {"list", NULL, cmd_online_list},
    {"info", NULL, cmd_online_info},
    {"check", NULL, cmd_online_check},
    {"export", NULL, cmd_online_export},
    {"import", NULL, cmd_online_import},
    {"status", NULL, cmd_online_status},
    {"resync", NULL, cmd_online_resync},
    {"backup", NULL, cmd_backup},
    {"restore", NULL, cmd_restore},
    {"canary", NULL, cmd_canary},
    {"health", NULL, cmd_health},
    {NULL, NULL, NULL},
};

static const struct command *command_find(const char *name)
{
    for (const struct command *c = commands; c->name; c++)
        if (strcmp(c->name, name) == 0)
            return c;
    return NULL;
}

/* Does a command with both forms go online? */
static bool wants_server(int argc, char **argv)
{
    const char *env = getenv(ONLINE_ENV_SERVER);

    if (online_global.server || (env && env[0]))
        return true;
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (strcmp(argv[i], "--server") == 0 ||
            strncmp(argv[i], "--server=", 9) == 0)
            return true;
    return false;
}

/* Options before the command name that take a value; NULL dst: --deadline. */
static const struct {
    const char *name;
    const char **dst;
} global_opts[] = {
    {"--server", &online_global.server},
    {"--deadline", NULL},
    {"--tls-ca", &online_global.tls_ca},
    {"--tls-cert", &online_global.tls_cert},
    {"--tls-key", &online_global.tls_key},
    {"--token-file", &online_global.token_file},
};

/* Options before the command name: --server, --deadline, the TLS files
 * and --token-file.  Returns how many arguments they took, or -1 after printing an
 * error. */
static int global_options(int argc, char **argv)
{
    int i = 1;

    while (i < argc) {
        const char *a = argv[i], *v = NULL;
        size_t k, n = 0;
        for (k = 0; k < sizeof global_opts / sizeof global_opts[0]; k++) {
            n = strlen(global_opts[k].name);
            if (strncmp(a, global_opts[k].name, n) == 0 && (!a[n] || a[n] == '='))
                break;
        }
        if (k == sizeof global_opts / sizeof global_opts[0])
            break;
        int used = 1;
        if (a[n] == '=') {
            v = a + n + 1;
        } else {
            if (i + 1 >= argc) {
                cli_fail("option '%s' needs a value", a);
                return -1;
            }
            v = argv[i + 1];
            used = 2;
        }
        if (global_opts[k].dst)
            *global_opts[k].dst = v;
        else if (online_parse_deadline(v, &online_global.deadline_ms))
            return -1;
        i += used;
    }
    return i - 1;
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
    int skip;

    /* Over a file-size limit, fail the write (and remove the temp file)
     * instead of being killed with the temp file left behind. */
    signal(SIGXFSZ, SIG_IGN);
    skip = global_options(argc, argv);
    if (skip < 0)
        return CLI_ERR;
    argc -= skip;
    argv += skip;
    if (argc < 2) {
        help_overview(stderr);
        return CLI_ERR;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)
        return run_help(1, argv + 1);
    if (strcmp(argv[1], "--version") == 0) {
        printf("bloomgrid %s (file format version %d)\n", bloomgrid_version,
               BF_FILE_VERSION);
        return CLI_OK;
    }
    if (strcmp(argv[1], "help") == 0)
        return run_help(argc - 1, argv + 1);
    c = command_find(argv[1]);
    if (!c)
        return cli_fail("unknown command '%s' (see 'bloomgrid --help')",
                        argv[1]);
    if (c->online && (!c->offline || wants_server(argc - 1, argv + 1)))
        return c->online(argc - 1, argv + 1);
    return c->offline(argc - 1, argv + 1);
}
