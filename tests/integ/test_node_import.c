/* Integration tests: an Import's file waits on disk (a spool in the data
 * directory) and is verified whole before any piece of it is applied, a
 * piece at a time (docs/STORAGE.md, "Imports").
 *
 * usage: test_node_import NODE_BIN CASE [SLOW_FSYNC_LIBRARY]
 *
 * Every case has two filters of one secret and geometry (about 10 MiB of
 * bits: three pieces of 4 MiB), "f" with 2 000 keys A and "src" with
 * 20 000 keys B, and src's export F (whose bits f lacks).
 *
 * bad        each bad file is refused with its status and changes nothing
 *            stored: f's export stays byte for byte what it was (bits and
 *            counts) and no spool file is left: F with its checksum's
 *            last byte changed (the very end: every piece arrived), with a
 *            byte of its last piece changed, cut short by one byte and by
 *            half, one byte too long, with a bad magic, 2 MiB too long
 *            (RESOURCE_EXHAUSTED), a file of another secret, of another
 *            geometry (FAILED_PRECONDITION), and F sent by ImportShard to
 *            shard 1 of 2 of a filter of F's secret (another shard).  Then F itself is taken: every
 *            key B present, the insert counts summed, and so after kill -9.
 * crash_stream  kill -9 with 60 % of F sent: after the restart no spool is
 *            left (one planted as a crash between its creation and its
 *            unlink would leave it is removed too), f is what it was, and
 *            the caller's retry takes F whole.
 * crash_apply   the log's fdatasync held (slow_fsync.c) while the first
 *            piece of F is being made durable: the file was verified and
 *            the apply began; kill -9 there.  After the restart no spool is
 *            left, f serves every key A, the Import was not acknowledged,
 *            and the caller's retry succeeds with every key B present and
 *            src's insert count added once.
 */
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "harness.h"

#define NA 2000
#define NB 20000
#define CAP 8000000     /* about 9.2 MiB of bits at 1 % */

struct fixture {
    struct node_proc n;
    char dir[512];
    uint8_t secret[32];
    char **a, **b;
    uint8_t *file;        /* F: src's export */
    size_t flen;
    uint8_t *base;        /* f's export before any Import */
    size_t blen;
    uint64_t ins_f, ins_src;   /* their insert counts before any Import */
};

/* Import buf[0, len) into name (shard: ImportShard of shard index), 256
 * KiB a message.  Returns 0 or the status code. */
static int import_call(struct rpc_channel *ch, const char *name, bool shard,
                       uint32_t index, const uint8_t *buf, size_t len,
                       struct rpc_status *st)
{
    struct rpc_cstream *cs = t_import_send(ch, name, shard, index, buf, len, 256 << 10,
                                           60000);
    rpc_cstream_close_send(cs);
    return t_import_answer(cs, len, NULL, st);
}

/* Spool files (".import-*") in dir. */
static int spools(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;

    CHECK(d, "cannot read %s", dir);
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, ".import-", 8))
            n++;
    closedir(d);
    return n;
}

static uint64_t inserts(struct rpc_channel *ch, const char *name)
{
    Bloomgrid__V1__FilterInfo *fi = NULL;
    struct rpc_status st;
    CHECK(t_get(ch, name, &fi, &st) == 0, "GetFilter %s: %s", name, st.message);
    CHECK(fi->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
          "filter %s is not READY: %s", name, fi->reason);
    uint64_t k = fi->insert_count;
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return k;
}

/* f's export is byte for byte base: nothing stored changed. */
static void unchanged(struct fixture *x, const char *after)
{
    struct rpc_status st;
    uint8_t *now = NULL;
    size_t len = t_export(x->n.ch, "f", &now, &st);
    CHECK(len == x->blen && memcmp(now, x->base, len) == 0,
          "f changed after %s (%zu bytes exported, %zu before)", after, len, x->blen);
    free(now);
    CHECK(spools(x->dir) == 0, "a spool file is left after %s", after);
}

static void start(struct fixture *x, const char *const *flags)
{
    node_start(&x->n, x->dir, flags);
    CHECK(node_wait_health(&x->n, true, 60000), "node not serving");
}

static void setup(struct fixture *x, const char *tag, const char *const *flags)
{
    struct rpc_status st;

    if (!x->dir[0])
        harness_tmpdir(x->dir, sizeof x->dir, tag);
    start(x, flags);
    for (int i = 0; i < 32; i++)
        x->secret[i] = (uint8_t)(i * 5 + 7);
    CHECK(t_create_shard(x->n.ch, "f", 0, 1, CAP, 0.01, x->secret, &st) == 0,
          "create f: %s", st.message);
    CHECK(t_create_shard(x->n.ch, "src", 0, 1, CAP, 0.01, x->secret, &st) == 0,
          "create src: %s", st.message);
    x->a = keys_make("a", 0, NA);
    x->b = keys_make("b", 0, NB);
    keys_call(x->n.ch, "Add", "f", x->a, NA, 1000, NULL);
    keys_call(x->n.ch, "Add", "src", x->b, NB, 5000, NULL);
    x->ins_f = inserts(x->n.ch, "f");
    x->ins_src = inserts(x->n.ch, "src");
    CHECK(x->ins_f > NA * 9 / 10 && x->ins_src > NB * 9 / 10, "insert counts %" PRIu64
          " and %" PRIu64, x->ins_f, x->ins_src);
    x->flen = t_export(x->n.ch, "src", &x->file, &st);
    CHECK(x->flen > (8u << 20), "export src: %s", st.message);
    x->blen = t_export(x->n.ch, "f", &x->base, &st);
    CHECK(x->blen == x->flen, "export f: %s", st.message);
    CHECK(keys_present(x->n.ch, "f", x->b, NB, NULL) < NB / 10,
          "f already holds keys B");
}

static void teardown(struct fixture *x)
{
    CHECK(node_stop(&x->n, 15) == 0, "node exit");
    keys_free(x->a, NA);
    keys_free(x->b, NB);
    free(x->file);
    free(x->base);
}

/* The good file is taken: every key B present, the counts summed, and so
 * after kill -9. */
static void take_whole(struct fixture *x, const char *const *flags)
{
    struct rpc_status st;
    int rc = import_call(x->n.ch, "f", false, 0, x->file, x->flen, &st);
    CHECK(rc == 0, "import of F: %d %s", rc, st.message);
    CHECK(spools(x->dir) == 0, "a spool file is left after the import");
    CHECK(keys_present(x->n.ch, "f", x->b, NB, NULL) == NB, "keys B missing");
    CHECK(keys_present(x->n.ch, "f", x->a, NA, NULL) == NA, "keys A missing");
    CHECK(inserts(x->n.ch, "f") == x->ins_f + x->ins_src, "f counts %" PRIu64
          " inserts", inserts(x->n.ch, "f"));
    node_stop(&x->n, 9);
    start(x, flags);
    CHECK(keys_present(x->n.ch, "f", x->b, NB, NULL) == NB, "keys B lost in a restart");
    CHECK(keys_present(x->n.ch, "f", x->a, NA, NULL) == NA, "keys A lost in a restart");
    CHECK(inserts(x->n.ch, "f") == x->ins_f + x->ins_src, "f counts %" PRIu64
          " inserts after a restart", inserts(x->n.ch, "f"));
}

static void expect(int rc, const struct rpc_status *st, int code, const char *needle,
                   const char *what)
{
    CHECK(rc == code && strstr(st->message, needle),
          "%s: want status %d naming \"%s\", got %d: %s", what, code, needle, rc,
          st->message);
    printf("  %-36s %d: %s\n", what, rc, st->message);
}

static void case_bad(void)
{
    struct fixture x = {0};
    struct rpc_status st;
    const char *flags[] = {"--durability", "none", NULL};
    setup(&x, "import-bad", flags);
    uint8_t *bad = malloc(x.flen + (2u << 20));
    CHECK(bad, "out of memory");
    int rc;

#define BAD(len, code, needle, what)                                               \
    do {                                                                           \
        rc = import_call(x.n.ch, "f", false, 0, bad, (len), &st);         \
        expect(rc, &st, (code), (needle), (what));                                 \
        unchanged(&x, (what));                                                     \
    } while (0)

    /* The very end: the checksum's last byte, after every piece arrived. */
    memcpy(bad, x.file, x.flen);
    bad[x.flen - 1] ^= 0x40;
    BAD(x.flen, GRPC_STATUS_INVALID_ARGUMENT, "checksum", "checksum's last byte");
    /* A bit of the last piece of the bits. */
    memcpy(bad, x.file, x.flen);
    bad[x.flen - 8 - 4096] ^= 0x01;
    BAD(x.flen, GRPC_STATUS_INVALID_ARGUMENT, "checksum", "a bit of the last piece");
    /* Cut short, by one byte and by half. */
    memcpy(bad, x.file, x.flen);
    BAD(x.flen - 1, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused",
        "one byte short");
    BAD(x.flen / 2, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused", "half of it");
    /* One byte too long. */
    bad[x.flen] = 0;
    BAD(x.flen + 1, GRPC_STATUS_INVALID_ARGUMENT, "imported file refused",
        "one byte too long");
    /* Past the largest file compatible with f: refused while it arrives. */
    memset(bad + x.flen, 0, 2u << 20);
    BAD(x.flen + (2u << 20), GRPC_STATUS_RESOURCE_EXHAUSTED, "larger",
        "2 MiB too long");
    /* Not a filter file. */
    bad[0] ^= 0xFF;
    BAD(x.flen, GRPC_STATUS_INVALID_ARGUMENT, "magic", "a bad magic");

    /* Another secret: a filter created with its own. */
    CHECK(t_create(x.n.ch, "other", CAP, 0.01, 0, &st) == 0, "create other: %s",
          st.message);
    uint8_t *of = NULL;
    size_t olen = t_export(x.n.ch, "other", &of, &st);
    CHECK(olen == x.flen, "export other: %s", st.message);
    rc = import_call(x.n.ch, "f", false, 0, of, olen, &st);
    expect(rc, &st, GRPC_STATUS_FAILED_PRECONDITION, "secret", "another secret");
    unchanged(&x, "another secret");
    free(of);
    /* Another geometry, of f's secret. */
    CHECK(t_create_shard(x.n.ch, "half", 0, 1, CAP / 2, 0.01, x.secret, &st) == 0,
          "create half: %s", st.message);
    keys_call(x.n.ch, "Add", "half", x.b, 1000, 1000, NULL);
    olen = t_export(x.n.ch, "half", &of, &st);
    CHECK(olen > 0, "export half: %s", st.message);
    rc = import_call(x.n.ch, "f", false, 0, of, olen, &st);
    expect(rc, &st, GRPC_STATUS_FAILED_PRECONDITION, "bits", "another geometry");
    unchanged(&x, "another geometry");
    free(of);
    /* Another shard: F (shard 0 of 1) into shard 1 of 2 of its secret. */
    CHECK(t_create_shard(x.n.ch, "two", 1, 2, CAP, 0.01, x.secret, &st) == 0,
          "create two: %s", st.message);
    rc = import_call(x.n.ch, "two", true, 1, x.file, x.flen, &st);
    expect(rc, &st, GRPC_STATUS_FAILED_PRECONDITION, "shard", "another shard");
    unchanged(&x, "another shard");
    free(bad);

    take_whole(&x, flags);
    teardown(&x);
}

static void case_crash_stream(void)
{
    struct fixture x = {0};
    struct rpc_status st;
    const char *flags[] = {"--durability", "none", NULL};
    setup(&x, "import-crash-stream", flags);
    struct rpc_cstream *cs = t_import_send(x.n.ch, "f", false, 0, x.file,
                                           x.flen * 6 / 10, 256 << 10, 60000);
    /* The bytes sent are in the node's spool (on disk, nameless), not in
     * its data directory's listing. */
    harness_sleep_ms(500);
    CHECK(spools(x.dir) == 0, "the spool has a name");
    /* A spool left by a crash between its creation and its unlink. */
    char path[700];
    snprintf(path, sizeof path, "%s/.import-AbC123", x.dir);
    FILE *fp = fopen(path, "w");
    CHECK(fp && fwrite(x.file, 1, 4096, fp) == 4096 && fclose(fp) == 0,
          "cannot write %s", path);
    kill(x.n.pid, SIGKILL);
    rpc_cstream_cancel(cs);
    rpc_cstream_finish(cs, &st);
    node_stop(&x.n, 9);
    start(&x, flags);
    CHECK(keys_present(x.n.ch, "f", x.a, NA, NULL) == NA, "keys A lost");
    unchanged(&x, "kill -9 while the file streamed in");
    take_whole(&x, flags);
    teardown(&x);
}

static void case_crash_apply(const char *lib)
{
    struct fixture x = {0};
    struct rpc_status st;
    char gate[600], held[620];
    /* The log's fdatasync can be held (durability fsync, the default). */
    const char *flags[] = {"--durability", "fsync", NULL};

    harness_tmpdir(x.dir, sizeof x.dir, "import-crash-apply");
    snprintf(gate, sizeof gate, "%s.gate", x.dir);
    harness_fsync_gate(gate, "/wal-", held, sizeof held);
    harness_preload_begin(lib);
    setup(&x, "import-crash-apply", flags);
    harness_preload_end();
    /* From here the log's next fdatasync is held: the first piece's. */
    FILE *g = fopen(gate, "w");
    CHECK(g && fclose(g) == 0, "cannot create %s", gate);
    struct rpc_cstream *cs = t_import_send(x.n.ch, "f", false, 0, x.file, x.flen,
                                           256 << 10, 60000);
    rpc_cstream_close_send(cs);
    int waited = 0;
    while (access(held, F_OK) != 0 && waited < 60000) {
        harness_sleep_ms(20);
        waited += 20;
    }
    CHECK(access(held, F_OK) == 0, "no piece reached the log's fdatasync");
    /* Verified, applying: the first piece's bits are in, its record is
     * written and held in its fdatasync.  No answer yet. */
    grpc_slice sl;
    kill(x.n.pid, SIGKILL);
    CHECK(rpc_cstream_read(cs, &sl) != 1, "the Import was answered");
    CHECK(rpc_cstream_finish(cs, &st) < 0, "the Import succeeded");
    node_stop(&x.n, 9);
    unlink(gate);
    unlink(held);
    start(&x, flags);
    CHECK(spools(x.dir) == 0, "a spool file is left after kill -9");
    CHECK(keys_present(x.n.ch, "f", x.a, NA, NULL) == NA, "keys A lost");
    CHECK(inserts(x.n.ch, "f") == x.ins_f, "f counts %" PRIu64 " inserts",
          inserts(x.n.ch, "f"));
    size_t part = keys_present(x.n.ch, "f", x.b, NB, NULL);
    printf("  after kill -9 while applying: %zu of %d keys B present\n", part, NB);
    /* The caller's retry. */
    take_whole(&x, flags);
    teardown(&x);
}

int main(int argc, char **argv)
{
    CHECK(argc >= 3, "usage: test_node_import NODE_BIN bad | crash_stream | "
          "crash_apply SLOW_FSYNC_LIBRARY");
    harness_node_bin = argv[1];
    grpc_init();
    if (strcmp(argv[2], "bad") == 0) {
        case_bad();
    } else if (strcmp(argv[2], "crash_stream") == 0) {
        case_crash_stream();
    } else if (strcmp(argv[2], "crash_apply") == 0) {
        CHECK(argc >= 4, "crash_apply needs the slow_fsync library");
        case_crash_apply(argv[3]);
    } else {
        CHECK(0, "unknown case %s", argv[2]);
    }
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
