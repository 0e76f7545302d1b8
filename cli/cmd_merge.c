/* cmd_merge: `bloomgrid merge OUT IN...`: OR-merge compatible filter files.
 *
 * Inputs are loaded one at a time into the first one, so memory holds two
 * filters at most.  Before each merge the projected fill and false-positive
 * rate are reported, so an over-full result is visible before it is used.
 * OUT is written only after every input merged cleanly.
 */
#include <getopt.h>
#include <string.h>

#include "cli.h"

struct merge_opts {
    bool force;
    const char *out;
    char **inputs;
    int ninputs;
};

static const struct option merge_longopts[] = {
    {"force", no_argument, NULL, 'f'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* OUT may be new or one of the inputs (the result is a superset of each);
 * replacing any other existing file needs --force. */
static int merge_check_out(const struct merge_opts *o)
{
    if (o->force || !cli_exists(o->out))
        return 0;
    for (int i = 0; i < o->ninputs; i++)
        if (cli_same_file(o->out, o->inputs[i]))
            return 0;
    return cli_fail("merge: %s already exists and is not one of the inputs "
                    "(use --force to replace it)", o->out);
}

static int merge_parse(struct merge_opts *o, int argc, char **argv)
{
    int c;

    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":fh", merge_longopts, NULL)) != -1) {
        if (c == 'h') {
            help_print("merge");
            return CLI_HELP_SHOWN;
        }
        if (c != 'f')
            return cli_bad_option("merge", c, argv);
        o->force = true;
    }
    if (argc - optind < 2)
        return cli_fail("merge: need OUT and at least one IN (see 'bloomgrid "
                        "help merge')");
    o->out = argv[optind];
    o->inputs = argv + optind + 1;
    o->ninputs = argc - optind - 1;
    return merge_check_out(o);
}

/* Merge the filter in file path into dst, reporting the projection. */
static int merge_one(struct bf *dst, const char *first, const char *path)
{
    struct bf_merge_projection proj;
    char err[BF_ERRLEN] = "";
    struct bf *src = cli_load(path);
    const char *field;
    int rc = CLI_ERR;

    if (!src)
        return CLI_ERR;
    field = bf_mismatch(dst, src);
    if (field) {
        cli_fail("merge: %s cannot be merged into %s: different %s", path,
                 first, field);
        goto out;
    }
    if (bf_merge_project(dst, src, &proj, err) < 0) {
        cli_fail("merge: %s: %s", path, err);
        goto out;
    }
    fprintf(stderr, "merge: + %s: projected fill %.4f, estimated FPR %.4g, "
            "about %.0f keys%s\n", path, proj.fill_ratio, proj.estimated_fpr,
            proj.estimated_count,
            proj.over_target ? " (above the target error rate)" : "");
    if (bf_merge_from(dst, src, err) < 0) {
        cli_fail("merge: %s: %s", path, err);
        goto out;
    }
    rc = 0;
out:
    bf_destroy(src);
    return rc;
}

int cmd_merge(int argc, char **argv)
{
    struct merge_opts o = {0};
    struct bf *dst;
    int rc = merge_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    dst = cli_load(o.inputs[0]);
    if (!dst)
        return CLI_ERR;
    for (int i = 1; i < o.ninputs && rc == 0; i++)
        rc = merge_one(dst, o.inputs[0], o.inputs[i]);
    if (rc == 0)
        rc = cli_save(dst, o.out);
    bf_destroy(dst);
    return rc;
}
