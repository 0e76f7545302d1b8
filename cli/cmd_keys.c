/* cmd_keys: the commands that take a filter file and keys: `add`, `query`
 * and `remove`.  Keys come from the arguments, or one per line from stdin
 * when there are none.  query and add take a filter file or a shard bundle
 * (a router's export) alike, each key going to its shard; remove takes one
 * counting filter. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "keys_input.h"

struct keys_opts {
    const char *cmd;
    bool count_only;      /* query --count */
    const char *file;
    char **keys;
    int nkeys;
};

static const struct option query_longopts[] = {
    {"count", no_argument, NULL, 'c'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static const struct option keys_longopts[] = {
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* Parse "CMD [--count] FILE [KEY...]"; --count only for query. */
static int keys_parse(struct keys_opts *o, int argc, char **argv)
{
    bool is_query = strcmp(o->cmd, "query") == 0;
    int c;

    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, is_query ? ":ch" : ":h",
                            is_query ? query_longopts : keys_longopts,
                            NULL)) != -1) {
        if (c == 'h') {
            help_print(o->cmd);
            return CLI_HELP_SHOWN;
        }
        if (c != 'c')
            return cli_bad_option(o->cmd, c, argv);
        o->count_only = true;   /* only query's options have 'c' */
    }
    if (optind >= argc)
        return cli_fail("%s: missing FILE (see 'bloomgrid help %s')", o->cmd,
                        o->cmd);
    o->file = argv[optind];
    o->keys = argv + optind + 1;
    o->nkeys = argc - optind - 1;
    return 0;
}

static int keys_run(struct keys_opts *o, keys_batch_fn fn, void *ctx)
{
    if (o->nkeys)
        return keys_from_args(o->keys, o->nkeys, fn, ctx);
    return keys_read_path("-", fn, ctx);
}

/* ---- add ------------------------------------------------------------- */

int cmd_add(int argc, char **argv)
{
    struct keys_opts o = {.cmd = "add"};
    struct cli_adding a;
    struct bundle *b;
    int rc = keys_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if (!(b = cli_load(o.file)))
        return CLI_ERR;
    cli_adding_start(&a, b);
    rc = keys_run(&o, cli_add_batch, &a);
    if (rc == 0) {
        progress_done(&a.prog);
        rc = cli_save(b, o.file);
    }
    bundle_destroy(b);
    return rc;
}

/* ---- query ----------------------------------------------------------- */

struct query_ctx {
    const struct bundle *b;
    bool count_only;
    uint64_t maybe, no;
};

static void query_print(const char *verdict, const void *key, size_t len)
{
    fputs(verdict, stdout);
    fwrite(key, 1, len, stdout);
    putchar('\n');
}

static int query_batch(void *ctx, const void *const *keys, const size_t *lens,
                       size_t n)
{
    struct query_ctx *q = ctx;
    bool present[KEYS_BATCH];

    bundle_may_contain_keys(q->b, keys, lens, n, present);
    for (size_t i = 0; i < n; i++) {
        if (present[i])
            q->maybe++;
        else
            q->no++;
        if (!q->count_only)
            query_print(present[i] ? "maybe\t" : "no\t", keys[i], lens[i]);
    }
    return 0;
}

/* Make sure everything printed reached stdout (a full disk, a closed pipe). */
static int flush_stdout(void)
{
    if (fflush(stdout) == EOF || ferror(stdout))
        return cli_fail("cannot write the output: %s", strerror(errno));
    return 0;
}

int cmd_query(int argc, char **argv)
{
    static char outbuf[1 << 20];
    struct keys_opts o = {.cmd = "query"};
    struct query_ctx q = {0};
    struct bundle *b;
    int rc = keys_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if (!(b = cli_load(o.file)))
        return CLI_ERR;
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    q.b = b;
    q.count_only = o.count_only;
    rc = keys_run(&o, query_batch, &q);
    if (rc == 0 && o.count_only)
        printf("maybe %llu\nno %llu\n", (unsigned long long)q.maybe,
               (unsigned long long)q.no);
    if (rc == 0)
        rc = flush_stdout();
    bundle_destroy(b);
    if (rc)
        return rc;
    return q.no ? CLI_NO : CLI_OK;
}

/* ---- remove ---------------------------------------------------------- */

struct remove_ctx {
    struct bf *f;
    uint64_t removed, absent;
};

static int remove_batch(void *ctx, const void *const *keys, const size_t *lens,
                        size_t n)
{
    struct remove_ctx *r = ctx;

    for (size_t i = 0; i < n; i++) {
        int rc = bf_remove(r->f, keys[i], lens[i]);
        if (rc == 0)
            r->removed++;
        else if (rc == -ENOENT)
            r->absent++;
        else
            return cli_fail("remove: %s", strerror(-rc));
        query_print(rc == 0 ? "removed\t" : "no\t", keys[i], lens[i]);
    }
    return 0;
}

int cmd_remove(int argc, char **argv)
{
    struct keys_opts o = {.cmd = "remove"};
    struct remove_ctx r = {0};
    struct bundle *b;
    int rc = keys_parse(&o, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if (bundle_file_is(o.file))
        return cli_refuse_bundle(o.file);
    if (!(b = cli_load(o.file)))
        return CLI_ERR;
    r.f = b->shard[0];
    if (bf_kind(r.f) != BF_KIND_COUNTING) {
        rc = cli_fail("remove: %s is a %s filter; only counting filters "
                      "support remove", o.file, bf_kind_name(bf_kind(r.f)));
        goto out;
    }
    bf_set_exclusive(r.f, true);
    rc = keys_run(&o, remove_batch, &r);
    if (rc == 0)
        rc = flush_stdout();
    if (rc == 0 && r.removed)
        rc = cli_save(b, o.file);
    if (rc == 0 && r.absent)
        rc = CLI_NO;
out:
    bundle_destroy(b);
    return rc;
}
