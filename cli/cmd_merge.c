/* cmd_merge: `bloomgrid merge OUT IN...`: OR-merge compatible filter files.
 *
 * Inputs are loaded one at a time into the first one, so memory holds two
 * filters at most.  Before each merge the projected fill and false-positive
 * rate are reported, so an over-full result is visible before it is used.
 * OUT is written only after every input merged cleanly.  Shard bundles (a
 * router's export, or partials built --like one) merge shard by shard.
 */
#include <getopt.h>
#include <string.h>

#include "bundle.h"
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

/* Merge src (from file path) into dst, reporting the projection; src stays
 * the caller's. */
static int merge_filter(struct bf *dst, const char *first, const char *path,
                        const struct bf *src)
{
    struct bf_merge_projection proj;
    char err[BF_ERRLEN] = "";
    const char *field;

    field = bf_mismatch(dst, src);
    if (field)
        return cli_fail("merge: %s cannot be merged into %s: different %s",
                        path, first, field);
    if (bf_merge_project(dst, src, &proj, err) < 0)
        return cli_fail("merge: %s: %s", path, err);
    if (proj.over_target)
        fprintf(stderr, "merge: + %s: shard %u: projected FPR %.4g is above "
                "the target error rate\n", path, bf_shard_index(dst),
                proj.estimated_fpr);
    if (bf_merge_from(dst, src, err) < 0)
        return cli_fail("merge: %s: %s", path, err);
    return 0;
}

/* Bundles: every input a bundle with the same shard count, merged shard by
 * shard into the first. */
static int merge_bundles(const struct merge_opts *o)
{
    char err[BF_ERRLEN] = "";
    struct bundle *dst = bundle_load(o->inputs[0], err);
    int rc = 0;

    if (!dst)
        return cli_fail("merge: %s: %s", o->inputs[0], err);
    for (int i = 1; i < o->ninputs && rc == 0; i++) {
        struct bundle *src = bundle_load(o->inputs[i], err);
        if (!src) {
            rc = cli_fail("merge: %s: %s%s", o->inputs[i], err,
                          bundle_file_is(o->inputs[i]) ? ""
                          : " (bundles merge only with bundles)");
            break;
        }
        if (src->count != dst->count)
            rc = cli_fail("merge: %s cannot be merged into %s: different "
                          "shard_count (%u, not %u)", o->inputs[i],
                          o->inputs[0], src->count, dst->count);
        for (uint32_t s = 0; rc == 0 && s < dst->count; s++)
            rc = merge_filter(dst->shard[s], o->inputs[0], o->inputs[i],
                              src->shard[s]);
        if (rc == 0)
            fprintf(stderr, "merge: + %s: %u shards\n", o->inputs[i],
                    src->count);
        bundle_destroy(src);
    }
    if (rc == 0 && bundle_save(dst, o->out, err) < 0)
        rc = cli_fail("merge: cannot write %s: %s", o->out, err);
    bundle_destroy(dst);
    return rc;
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
    if (bundle_file_is(o.inputs[0]))
        return merge_bundles(&o);
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
