/* cmd_merge: `bloomgrid merge OUT IN...`: OR-merge compatible filter files.
 *
 * Inputs are loaded one at a time into the first one, so memory holds two
 * filters at most.  Before each merge the projected fill and false-positive
 * rate are reported, so an over-full result is visible before it is used.
 * OUT is written only after every input merged cleanly.  Every input is
 * read as a bundle (common/engine/bundle.h; a filter file is a bundle of one), and
 * merged shard by shard: shard bundles (a router's export, or partials built
 * --like one) with shard bundles, filter files with filter files.
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

/* Load an input: the first one (dst NULL) in either form, every later one
 * in the form of the first; filter files merge with filter files and shard
 * bundles with shard bundles. */
static struct bundle *merge_load(const struct bundle *dst, const char *path)
{
    char err[BF_ERRLEN] = "";
    bool is_bundle = bundle_file_is(path);
    bool bundles = dst ? !dst->plain : is_bundle;
    struct bundle *b;

    if (!bundles && is_bundle) {
        cli_refuse_bundle(path);
        return NULL;
    }
    if (!(b = bundle_load(path, err))) {
        cli_fail("%s%s: %s%s", bundles ? "merge: " : "", path, err,
                 bundles && !is_bundle ? " (bundles merge only with bundles)"
                                       : "");
        return NULL;
    }
    if (bundles && b->plain) {
        cli_fail("merge: %s: bad magic: not a shard bundle (bundles merge "
                 "only with bundles)", path);
        bundle_destroy(b);
        return NULL;
    }
    return b;
}

/* Before a shard is merged: the projection of every filter file, the
 * warnings of a bundle's shards. */
static void merge_report(const struct bundle *dst, const char *path,
                         uint32_t shard, const struct bf_merge_projection *p)
{
    if (dst->plain)
        fprintf(stderr, "merge: + %s: projected fill %.4f, estimated FPR "
                "%.4g, about %.0f keys%s\n", path, p->fill_ratio,
                p->estimated_fpr, p->estimated_count,
                p->over_target ? " (above the target error rate)" : "");
    else if (p->over_target)
        fprintf(stderr, "merge: + %s: shard %u: projected FPR %.4g is above "
                "the target error rate\n", path, shard, p->estimated_fpr);
}

/* Merge src (from file path) into dst shard by shard; src stays the
 * caller's. */
static int merge_into(struct bundle *dst, const char *first, const char *path,
                      const struct bundle *src)
{
    struct bf_merge_projection proj;
    char err[BF_ERRLEN] = "";
    const char *field;

    if (src->count != dst->count)
        return cli_fail("merge: %s cannot be merged into %s: different "
                        "shard_count (%u, not %u)", path, first, src->count,
                        dst->count);
    for (uint32_t s = 0; s < dst->count; s++) {
        struct bf *d = dst->shard[s];
        field = bf_mismatch(d, src->shard[s]);
        if (field)
            return cli_fail("merge: %s cannot be merged into %s: different %s",
                            path, first, field);
        if (bf_merge_project(d, src->shard[s], &proj, err) < 0)
            return cli_fail("merge: %s: %s", path, err);
        merge_report(dst, path, bf_shard_index(d), &proj);
        if (bf_merge_from(d, src->shard[s], err) < 0)
            return cli_fail("merge: %s: %s", path, err);
    }
    if (!dst->plain)
        fprintf(stderr, "merge: + %s: %u shards\n", path, src->count);
    return 0;
}

int cmd_merge(int argc, char **argv)
{
    char err[BF_ERRLEN] = "";
    struct merge_opts o = {0};
    struct bundle *dst, *src;
    int rc = merge_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if (!(dst = merge_load(NULL, o.inputs[0])))
        return CLI_ERR;
    for (int i = 1; i < o.ninputs && rc == 0; i++) {
        if (!(src = merge_load(dst, o.inputs[i]))) {
            rc = CLI_ERR;
            break;
        }
        rc = merge_into(dst, o.inputs[0], o.inputs[i], src);
        bundle_destroy(src);
    }
    if (rc == 0 && bundle_save(dst, o.out, err) < 0)
        rc = dst->plain ? cli_fail("%s: cannot save: %s", o.out, err)
                        : cli_fail("merge: cannot write %s: %s", o.out, err);
    bundle_destroy(dst);
    return rc;
}
