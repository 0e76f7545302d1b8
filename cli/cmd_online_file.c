/* cmd_online_file: `export` (a server's filter into a file) and `import` (a
 * filter file OR-merged into a server's filter).
 *
 * Export writes through common/base/durable.h like every file writer: the chunks
 * go to "<FILE>.tmp.XXXXXX" in the same directory, which is loaded and
 * verified (magic, geometry, checksum; every shard of a router's shard
 * bundle) before durable_commit fsyncs it, renames it over FILE and fsyncs
 * the directory.  Any failure or a signal removes the temp file and leaves
 * FILE as it was.
 * Import sends the file as it is; the server verifies it whole before
 * merging anything.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bundle.h"
#include "cli.h"
#include "durable.h"
#include "online.h"
#include "online_cmd.h"
#include "progress.h"

/* ---- export ----------------------------------------------------------- */

struct export_ctx {
    struct durable_file df;
    uint64_t written, total;
    bool have_total;
    struct progress prog;
};

/* The temp file of an export in progress, thrown away if a signal ends the
 * command (durable_abort only closes and unlinks: async-signal-safe). */
static struct durable_file *volatile export_df;

static void export_signal(int sig)
{
    if (export_df)
        durable_abort(export_df);
    signal(sig, SIG_DFL);
    raise(sig);
}

static void export_guard(struct durable_file *df)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

    export_df = df;
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        signal(sigs[i], df ? export_signal : SIG_DFL);
}

/* One chunk.  total is the file's size, or 0 while the server does not
 * know it yet (a router streaming a bundle says it on the last chunk): a
 * size once said never changes and nothing comes past it. */
static int export_chunk(void *ctx, uint64_t offset, const void *data,
                        size_t len, uint64_t total)
{
    struct export_ctx *e = ctx;
    int rc;

    if (total && e->have_total && total != e->total)
        return cli_fail("export: the server changed the file size during "
                        "the transfer (%llu, then %llu bytes)",
                        (unsigned long long)e->total,
                        (unsigned long long)total);
    if (total) {
        e->total = total;
        e->have_total = true;
    }
    if (offset != e->written)
        return cli_fail("export: the server sent bytes at offset %llu, "
                        "expected %llu", (unsigned long long)offset,
                        (unsigned long long)e->written);
    if (e->have_total && len > e->total - e->written)
        return cli_fail("export: the server sent more than the announced "
                        "%llu bytes", (unsigned long long)e->total);
    if ((rc = durable_write_all(e->df.fd, data, len)) < 0)
        return cli_fail("%s: cannot write: %s", e->df.tmp, strerror(-rc));
    e->written += len;
    progress_tick(&e->prog, len);
    return 0;
}

/* The temp file holds the whole export: verify it as the offline commands
 * read it (a node sends a filter file, a router a shard bundle; every check
 * of bundle_load), then publish it. */
static int export_commit(struct export_ctx *e)
{
    char err[BF_ERRLEN] = "", derr[DURABLE_ERRLEN] = "";

    if (!e->have_total)
        return cli_fail("export: the transfer ended after %llu bytes without "
                        "the server saying the file's size",
                        (unsigned long long)e->written);
    if (e->written != e->total)
        return cli_fail("export: the transfer ended after %llu of %llu bytes",
                        (unsigned long long)e->written,
                        (unsigned long long)e->total);
    /* Read back a piece at a time: an export as large as the machine's
     * memory verifies without holding it. */
    if (bundle_file_verify(e->df.tmp, err) < 0)
        return cli_fail("export: the received %s does not verify: %s",
                        bundle_file_is(e->df.tmp) ? "bundle" : "file", err);
    if (durable_commit(&e->df, derr) < 0)
        return cli_fail("%s", derr);
    return 0;
}

static const struct option export_longopts[] = {
    {"force", no_argument, NULL, 'f'},
    ONLINE_COMMON_LONGOPTS,
};

int cmd_online_export(int argc, char **argv)
{
    struct online o;
    bool force = false;
    const char *path;
    int c, rc;

    online_cmd_init(&o);
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":fh", export_longopts, NULL)) != -1) {
        if (c == 'f') {
            force = true;
            continue;
        }
        if ((rc = online_common_opt(&o, "export", c, argv)))
            return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    }
    if ((rc = online_need_args("export", argc - optind, 2, "NAME and FILE")))
        return rc;
    path = argv[optind + 1];
    if (!force && cli_exists(path))
        return cli_fail("export: %s already exists (use --force to replace "
                        "it)", path);
    if (o.deadline_ms <= 0)
        o.deadline_ms = ONLINE_TRANSFER_DEADLINE_MS;
    if ((rc = online_open(&o)))
        return rc;
    rc = online_export_file(&o, argv[optind], path, 0644);
    online_close(&o);
    return rc;
}

int online_export_file(struct online *o, const char *name, const char *path,
                       mode_t mode)
{
    char derr[DURABLE_ERRLEN] = "";
    struct export_ctx e = {0};
    struct rpc_status st;
    int rc;

    if (durable_open(&e.df, path, NULL, mode, derr) < 0)
        return cli_fail("%s", derr);
    export_guard(&e.df);
    progress_init_bytes(&e.prog);
    rc = online_export(o, name, export_chunk, &e, &st);
    if (rc < 0)
        rc = online_report(o, &st);
    if (rc == 0)
        rc = export_commit(&e);
    if (rc == 0)
        progress_done(&e.prog);
    durable_abort(&e.df);       /* nothing left to remove once committed */
    export_guard(NULL);
    return rc;
}

/* ---- import ----------------------------------------------------------- */

struct import_ctx {
    const char *path;
    int fd;
    struct progress prog;
};

static ssize_t import_read(void *ctx, void *buf, size_t cap)
{
    struct import_ctx *im = ctx;
    size_t got = 0;

    /* Full chunks: short reads only at the end of the file. */
    while (got < cap) {
        ssize_t n = read(im->fd, (char *)buf + got, cap - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            cli_fail("%s: cannot read: %s", im->path, strerror(errno));
            return -1;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    progress_tick(&im->prog, got);
    return (ssize_t)got;
}

int online_import_file(struct online *o, const char *name, const char *path,
                       struct online_import_result *res)
{
    struct import_ctx im = {.path = path};
    struct rpc_status st;
    struct stat sb;
    int rc;

    im.fd = open(path, O_RDONLY | O_CLOEXEC);
    if (im.fd < 0)
        return cli_fail("%s: cannot open: %s", path, strerror(errno));
    if (fstat(im.fd, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        close(im.fd);
        return cli_fail("%s: is a directory", path);
    }
    progress_init_bytes(&im.prog);
    rc = online_import(o, name, import_read, &im, res, &st);
    if (rc < 0)
        rc = online_report(o, &st);
    else if (rc == 0)
        progress_done(&im.prog);
    close(im.fd);
    return rc;
}

int cmd_online_import(int argc, char **argv)
{
    struct online_import_result res;
    struct online o;
    const char *path;
    int c, rc;

    online_cmd_init(&o);
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":h", export_longopts + 1,
                            NULL)) != -1) {
        if ((rc = online_common_opt(&o, "import", c, argv)))
            return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    }
    if ((rc = online_need_args("import", argc - optind, 2, "NAME and FILE")))
        return rc;
    path = argv[optind + 1];
    if (o.deadline_ms <= 0)
        o.deadline_ms = ONLINE_TRANSFER_DEADLINE_MS;
    if ((rc = online_open(&o)))
        return rc;
    rc = online_import_file(&o, argv[optind], path, &res);
    if (rc == 0) {
        fprintf(stderr, "import: %s into %s: %llu bytes, projected fill "
                "%.4f, estimated FPR %.4g%s\n", path, argv[optind],
                (unsigned long long)res.bytes_received,
                res.projected_fill_ratio, res.projected_error_rate,
                res.over_target ? " (above the target error rate)" : "");
        online_info_deinit(&res.info);
    }
    online_close(&o);
    return rc;
}
