/* cmd_create: `bloomgrid create` (an empty filter file) and `bloomgrid
 * build` (a new filter file filled with keys from files or stdin).  --like
 * copies a template's kind, geometry and secret; a shard bundle (a router's
 * export) as template gives a bundle of empty shards like it, each key going
 * to its shard: a partial that the router can import. */
#include <getopt.h>

#include "cli.h"
#include "keys_input.h"

struct create_opts {
    const char *cmd;
    struct bf_params params;
    bool have_capacity, have_rate, have_kind;
    const char *like;
    bool force;
    const char *file;
    char **inputs;
    int ninputs;
};

static const struct option create_longopts[] = {
    {"capacity", required_argument, NULL, 'n'},
    {"error-rate", required_argument, NULL, 'p'},
    {"kind", required_argument, NULL, 'k'},
    {"like", required_argument, NULL, 'l'},
    {"force", no_argument, NULL, 'f'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Handle one option; returns 0, CLI_ERR, or -1 for --help. */
static int create_opt(struct create_opts *o, int c, char **argv)
{
    switch (c) {
    case 'n':
        o->have_capacity = true;
        return cli_parse_capacity(optarg, &o->params.capacity);
    case 'p':
        o->have_rate = true;
        return cli_parse_rate(optarg, &o->params.error_rate);
    case 'k':
        o->have_kind = true;
        if (bf_kind_parse(optarg, &o->params.kind) < 0)
            return cli_fail("%s: unknown kind '%s' (blocked, classic, "
                            "counting or scalable)", o->cmd, optarg);
        return 0;
    case 'l':
        o->like = optarg;
        return 0;
    case 'f':
        o->force = true;
        return 0;
    case 'h':
        return -1;
    }
    return cli_bad_option(o->cmd, c, argv);
}

/* Options that only make sense together. */
static int create_check(struct create_opts *o)
{
    if (o->like && (o->have_capacity || o->have_rate || o->have_kind))
        return cli_fail("%s: --like copies kind, capacity and error rate; "
                        "do not give them too", o->cmd);
    if (!o->like && !o->have_capacity)
        return cli_fail("%s: --capacity is required (or --like TEMPLATE)",
                        o->cmd);
    if (!o->like && !o->have_rate)
        return cli_fail("%s: --error-rate is required (or --like TEMPLATE)",
                        o->cmd);
    if (!o->force && cli_exists(o->file))
        return cli_fail("%s: %s already exists (use --force to replace it)",
                        o->cmd, o->file);
    return 0;
}

static int create_parse(struct create_opts *o, int argc, char **argv)
{
    int c, rc;

    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":n:p:k:l:fh", create_longopts,
                            NULL)) != -1) {
        rc = create_opt(o, c, argv);
        if (rc < 0) {
            help_print(o->cmd);
            return CLI_HELP_SHOWN;
        }
        if (rc)
            return rc;
    }
    if (optind >= argc)
        return cli_fail("%s: missing FILE (see 'bloomgrid help %s')", o->cmd,
                        o->cmd);
    o->file = argv[optind];
    o->inputs = argv + optind + 1;
    o->ninputs = argc - optind - 1;
    return create_check(o);
}

/* A new empty bundle: like the template (a filter file or a shard bundle,
 * whose form it takes), or one filter from the parameters. */
static struct bundle *create_new(struct create_opts *o)
{
    char err[BF_ERRLEN] = "";
    struct bundle *tmpl, *b;
    struct bf *f;

    if (o->like) {
        if (!(tmpl = cli_load(o->like)))
            return NULL;
        b = bundle_create_like(tmpl, err);
        bundle_destroy(tmpl);
    } else {
        bf_params_default(&o->params);
        f = bf_create(&o->params, err);
        b = f ? bundle_of_filter(f, err) : NULL;
    }
    if (!b)
        cli_fail("%s: %s", o->cmd, err[0] ? err : "cannot create the filter");
    return b;
}

int cmd_create(int argc, char **argv)
{
    struct create_opts o = {.cmd = "create"};
    struct bundle *b;
    int rc = create_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if (o.ninputs)
        return cli_fail("create: unexpected argument '%s' (to add keys, use "
                        "'bloomgrid build')", o.inputs[0]);
    if (!(b = create_new(&o)))
        return CLI_ERR;
    rc = cli_save(b, o.file);
    bundle_destroy(b);
    return rc;
}

int cmd_build(int argc, char **argv)
{
    struct create_opts o = {.cmd = "build"};
    struct cli_adding a;
    struct bundle *b;
    int rc = create_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if (!(b = create_new(&o)))
        return CLI_ERR;
    cli_adding_start(&a, b);
    rc = keys_read_paths(o.inputs, o.ninputs, cli_add_batch, &a);
    if (rc == 0) {
        progress_done(&a.prog);
        rc = cli_save(b, o.file);
    }
    bundle_destroy(b);
    return rc;
}
