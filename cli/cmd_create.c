/* cmd_create: `bloomgrid create` (an empty filter file) and `bloomgrid
 * build` (a new filter file filled with keys from files or stdin).  With
 * --like a shard bundle (a router's export), both make a bundle of empty
 * shards like it, each key going to its shard: a partial that the router
 * can import. */
#include <getopt.h>
#include <string.h>

#include "bundle.h"
#include "cli.h"
#include "keys_input.h"
#include "progress.h"

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

/* A new empty filter: from the template, or from the parameters. */
static struct bf *create_filter(struct create_opts *o)
{
    char err[BF_ERRLEN] = "";
    struct bf *tmpl = NULL, *f;

    if (o->like) {
        tmpl = cli_load(o->like);
        if (!tmpl)
            return NULL;
        f = bf_create_like(tmpl, err);
        bf_destroy(tmpl);
    } else {
        bf_params_default(&o->params);
        f = bf_create(&o->params, err);
    }
    if (!f)
        cli_fail("%s: %s", o->cmd, err[0] ? err : "cannot create the filter");
    return f;
}

/* A new empty bundle like the bundle o->like. */
static struct bundle *create_bundle(struct create_opts *o)
{
    char err[BF_ERRLEN] = "";
    struct bundle *tmpl = bundle_load(o->like, err), *b = NULL;

    if (!tmpl) {
        cli_fail("%s: %s", o->like, err);
        return NULL;
    }
    b = bundle_create_like(tmpl, err);
    bundle_destroy(tmpl);
    if (!b)
        cli_fail("%s: %s", o->cmd, err);
    return b;
}

static int bundle_batch(void *ctx, const void *const *keys, const size_t *lens,
                        size_t n)
{
    bundle_add_keys(ctx, keys, lens, n);
    return 0;
}

/* create/build --like BUNDLE. */
static int build_bundle(struct create_opts *o)
{
    char err[BF_ERRLEN] = "";
    struct bundle *b = create_bundle(o);
    int rc = 0;

    if (!b)
        return CLI_ERR;
    for (uint32_t i = 0; i < b->count; i++)
        bf_set_exclusive(b->shard[i], true);
    if (strcmp(o->cmd, "build") == 0)
        rc = keys_read_paths(o->inputs, o->ninputs, bundle_batch, b);
    if (rc == 0 && bundle_save(b, o->file, err) < 0)
        rc = cli_fail("%s: cannot save: %s", o->file, err);
    bundle_destroy(b);
    return rc;
}

int cmd_create(int argc, char **argv)
{
    struct create_opts o = {.cmd = "create"};
    struct bf *f;
    int rc = create_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if (o.ninputs)
        return cli_fail("create: unexpected argument '%s' (to add keys, use "
                        "'bloomgrid build')", o.inputs[0]);
    if (o.like && bundle_file_is(o.like))
        return build_bundle(&o);
    f = create_filter(&o);
    if (!f)
        return CLI_ERR;
    rc = cli_save(f, o.file);
    bf_destroy(f);
    return rc;
}

struct build_ctx {
    struct bf *f;
    struct progress prog;
};

static int build_batch(void *ctx, const void *const *keys, const size_t *lens,
                       size_t n)
{
    struct build_ctx *b = ctx;

    bf_add_keys(b->f, keys, lens, n, NULL);
    progress_tick(&b->prog, n);
    return 0;
}

int cmd_build(int argc, char **argv)
{
    struct create_opts o = {.cmd = "build"};
    struct build_ctx b = {0};
    int rc = create_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if (o.like && bundle_file_is(o.like))
        return build_bundle(&o);
    b.f = create_filter(&o);
    if (!b.f)
        return CLI_ERR;
    /* The tool is single-threaded: plain stores instead of atomic ORs. */
    bf_set_exclusive(b.f, true);
    progress_init(&b.prog, b.f);
    rc = keys_read_paths(o.inputs, o.ninputs, build_batch, &b);
    if (rc == 0) {
        progress_done(&b.prog);
        rc = cli_save(b.f, o.file);
    }
    bf_destroy(b.f);
    return rc;
}
