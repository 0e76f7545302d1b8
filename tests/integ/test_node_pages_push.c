/* Integration tests of PushPages and drops on a real node.
 *
 * usage: test_node_pages_push NODE_BIN TEST
 *   pull_after_push  pages pushed into a shard are pulled by a puller whose
 *                    cursor was taken before the push (another copy must
 *                    get what the merger pushed into this one)
 *   push_memory      256 MiB pushed to a missing shard, and to a shard
 *                    under a wrong fingerprint, end at once (NOT_FOUND,
 *                    FAILED_PRECONDITION) and grow the node's RSS by less
 *                    than 32 MiB; a stream past max_push_mb ends
 *                    RESOURCE_EXHAUSTED and applies nothing
 *   push_spooled     a push of 48 MiB into a node with 24 MiB of its
 *                    max_memory_mb left beside its filter is applied
 *                    whole (spooled on disk, held a 1 MiB piece at a
 *                    time; a node that held the stream refused it
 *                    RESOURCE_EXHAUSTED)
 *   push_version     a push with no page and source_version 2^62, or one
 *                    refused part-way, changes nothing (the shard's
 *                    version and bits stay); a complete push applies
 *   push_keys        keys' hashes pushed (as the merger pushes a round of
 *                    keys) are added as adds: every key reads present,
 *                    and a puller whose cursor was taken before the push
 *                    gets them back as keys, not pages (the push left add
 *                    records in the log); a message of keys failing its
 *                    checksum (DATA_LOSS), one holding page data too, or
 *                    of a length that is not whole keys (INVALID_ARGUMENT)
 *                    refuses the whole stream and adds nothing
 *   tombstone        a dropped filter's old pages, file and secret are
 *                    refused (FAILED_PRECONDITION "dropped") and it stays
 *                    absent, also after a restart; the name with a new
 *                    secret works
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "bf_file.h"
#include "harness.h"
#include "node_client.h"
#include "rpc_client.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include <xxhash.h>

#define PAGE (64u << 10)
#define NKEYS 5000

static char tdir[512];

/* A node on tdir, serving (its data directory loaded). */
static void start(struct node_proc *np, const char *const *flags)
{
    node_start(np, tdir, flags);
    CHECK(node_wait_health(np, true, 20000), "node not serving");
}

/* The node's resident bytes (VmRSS of /proc/PID/status). */
static uint64_t rss_bytes(pid_t pid)
{
    char path[64], line[256];
    uint64_t kb = 0;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    CHECK(f, "cannot read %s", path);
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %" SCNu64, &kb) == 1)
            break;
    fclose(f);
    return kb << 10;
}

static void add_keys(struct bf *f, const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char key[64];
        int len = snprintf(key, sizeof key, "%s-%d", prefix, i);
        bf_add(f, key, (size_t)len);
    }
}

static bool has_keys(const struct bf *f, const char *prefix, int n)
{
    for (int i = 0; i < n; i++) {
        char key[64];
        int len = snprintf(key, sizeof key, "%s-%d", prefix, i);
        if (!bf_may_contain(f, key, (size_t)len))
            return false;
    }
    return true;
}

/* The non-empty pages of f's body (pointing into f). */
static size_t pages_of(struct bf *f, struct node_client_page **out)
{
    struct bf_layer_info li;
    size_t n = 0;

    CHECK(bf_layer_info(f, 0, &li) == 0, "layer info");
    const uint8_t *body = (const uint8_t *)bf_layer_body(f, 0);
    *out = calloc(li.body_bytes / PAGE + 1, sizeof **out);
    CHECK(*out, "out of memory");
    for (uint64_t off = 0; off < li.body_bytes; off += PAGE) {
        size_t len = li.body_bytes - off < PAGE ? li.body_bytes - off : PAGE;
        bool zero = true;
        for (size_t i = 0; i < len && zero; i++)
            zero = body[off + i] == 0;
        if (!zero)
            (*out)[n++] = (struct node_client_page){off, body + off, len};
    }
    return n;
}

/* An empty filter with the node's shard 0 of filter (same fingerprint). */
static struct bf *shard_like(struct node_proc *np, const char *filter,
                             struct node_client_shard *sh, char fp[17])
{
    struct rpc_status st;
    char err[BF_ERRLEN];

    CHECK(node_client_get_shard(np->ch, filter, 0, sh, TIMEOUT_MS, &st) == 0,
          "GetShard: %s", st.message);
    struct bf *f = node_client_shard_filter(sh, err);
    CHECK(f, "shard filter: %s", err);
    bf_fingerprint_id(f, fp);
    return f;
}

static int pull_into(void *ctx, uint64_t offset, const uint8_t *data,
                     size_t len)
{
    uint8_t *body = (uint8_t *)bf_layer_body(ctx, 0);
    for (size_t i = 0; i < len; i++)
        body[offset + i] |= data[i];
    return 0;
}

static void test_pull_after_push(void)
{
    struct node_proc n;
    struct rpc_status st;
    struct node_client_shard sh;
    struct node_client_pull_end before, after;
    char fp[17];

    start(&n, NULL);
    CHECK(t_create(n.ch, "f", 200000, 0.01, 0, &st) == 0, "create: %s",
          st.message);
    char **k = keys_make("local", 0, 100);
    keys_call(n.ch, "Add", "f", k, 100, 100, NULL);
    keys_free(k, 100);
    /* A puller (another copy) is up to date before the push. */
    CHECK(node_client_pull(n.ch, "f", 0, 0, 0, NULL, NULL, &before, TIMEOUT_MS,
                           &st) == 0, "pull: %s", st.message);
    CHECK(before.version > 0, "no version");

    /* The merger pushes pages this node never had. */
    struct bf *src = shard_like(&n, "f", &sh, fp);
    add_keys(src, "pushed", NKEYS);
    struct node_client_page *pg;
    size_t np = pages_of(src, &pg);
    uint64_t merged = 0;
    CHECK(node_client_push(n.ch, "f", 0, fp, 0, pg, np, &merged, TIMEOUT_MS,
                           &st) == 0, "push: %s", st.message);
    CHECK(merged == np, "merged %" PRIu64 " of %zu", merged, np);

    /* The puller asks what changed since its cursor: the pushed pages. */
    struct bf *got = node_client_shard_filter(&sh, NULL);
    CHECK(node_client_pull(n.ch, "f", 0, before.version, before.epoch,
                           pull_into, got, &after, TIMEOUT_MS, &st) == 0,
          "pull: %s", st.message);
    CHECK(after.pages > 0, "a pull since before the push got no page");
    CHECK(has_keys(got, "pushed", NKEYS),
          "the pull since before the push lacks pushed keys");
    free(pg);
    bf_destroy(got);
    bf_destroy(src);
    node_stop(&n, SIGTERM);
}

/* A rollback's DropShard (only_unwritten) of a copy whose keys came only
 * by pushed pages (copy-to-copy sync, the merger): its insert count is 0,
 * yet it holds keys some client was told are stored, so it stays; an
 * empty shard is dropped. */
static void test_drop_unwritten_pushed(void)
{
    struct node_proc n;
    struct rpc_status st;
    struct node_client_shard sh;
    char fp[17];

    start(&n, NULL);
    CHECK(t_create(n.ch, "f", 200000, 0.01, 0, &st) == 0, "create: %s", st.message);
    CHECK(t_create(n.ch, "empty", 200000, 0.01, 0, &st) == 0, "create: %s",
          st.message);
    struct bf *src = shard_like(&n, "f", &sh, fp);
    add_keys(src, "pushed", NKEYS);
    struct node_client_page *pg;
    size_t np = pages_of(src, &pg);
    uint64_t merged = 0;
    CHECK(node_client_push(n.ch, "f", 0, fp, 0, pg, np, &merged, TIMEOUT_MS,
                           &st) == 0, "push: %s", st.message);
    CHECK(merged == np, "merged %" PRIu64 " of %zu", merged, np);

    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    ProtobufCMessage *dr = NULL;
    ref.filter = "f";
    ref.shard_index = 0;
    ref.only_unwritten = true;
    CHECK(rpc_call(n.ch, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                   &bloomgrid__v1__drop_shard_response__descriptor, &dr, TIMEOUT_MS,
                   &st) < 0 && st.code == GRPC_STATUS_FAILED_PRECONDITION &&
              strstr(st.message, "has taken keys"),
          "only_unwritten drop of a shard with pushed keys: %d %s", st.code,
          st.message);
    struct bf *got = node_client_shard_filter(&sh, NULL);
    struct node_client_pull_end end;
    CHECK(node_client_pull(n.ch, "f", 0, 0, 0, pull_into, got, &end, TIMEOUT_MS,
                           &st) == 0, "pull: %s", st.message);
    CHECK(has_keys(got, "pushed", NKEYS), "pushed keys lost after the refused drop");
    ref.filter = "empty";
    CHECK(rpc_call(n.ch, "/bloomgrid.v1.Internal/DropShard", &ref.base,
                   &bloomgrid__v1__drop_shard_response__descriptor, &dr, TIMEOUT_MS,
                   &st) == 0, "only_unwritten drop of an empty shard: %s", st.message);
    protobuf_c_message_free_unpacked(dr, NULL);
    free(pg);
    bf_destroy(got);
    bf_destroy(src);
    node_stop(&n, SIGTERM);
}

/* Push n_pages copies of one 64 KiB page (offset 0) under fp. */
static int push_many(struct node_proc *np, const char *filter, const char *fp,
                     size_t n_pages, struct rpc_status *st)
{
    static uint8_t data[PAGE];
    struct node_client_page *pg = calloc(n_pages, sizeof *pg);

    CHECK(pg, "out of memory");
    memset(data, 0xff, sizeof data);
    for (size_t i = 0; i < n_pages; i++)
        pg[i] = (struct node_client_page){0, data, sizeof data};
    int rc = node_client_push(np->ch, filter, 0, fp, 0, pg, n_pages, NULL,
                              120000, st);
    free(pg);
    return rc < 0 ? (int)st->code : 0;
}

static void test_push_memory(void)
{
    struct node_proc n;
    struct rpc_status st;
    struct node_client_shard sh;
    char fp[17];
    const char *const flags[] = {"--max-push-mb", "8", NULL};

    start(&n, flags);
    CHECK(t_create(n.ch, "big", 20000000, 0.01, 0, &st) == 0, "create: %s",
          st.message);
    struct bf *like = shard_like(&n, "big", &sh, fp);
    uint64_t rss0 = rss_bytes(n.pid);

    /* 256 MiB at a shard that does not exist: refused on sight. */
    int code = push_many(&n, "nope", fp, 4096, &st);
    CHECK(code == GRPC_STATUS_NOT_FOUND, "missing shard: %d %s", code,
          st.message);
    /* And at one that exists, under another fingerprint. */
    code = push_many(&n, "big", "0123456789abcdef", 4096, &st);
    CHECK(code == GRPC_STATUS_FAILED_PRECONDITION && strstr(st.message, "fingerprint"),
          "wrong fingerprint: %d %s", code, st.message);
    uint64_t rss1 = rss_bytes(n.pid);
    CHECK(rss1 < rss0 + (32u << 20),
          "RSS grew by %" PRIu64 " MiB for pushes refused on sight",
          (rss1 - rss0) >> 20);

    /* The right shard and fingerprint, past max_push_mb (8 MiB). */
    code = push_many(&n, "big", fp, 256, &st);
    CHECK(code == GRPC_STATUS_RESOURCE_EXHAUSTED &&
          strstr(st.message, "max_push_mb"),
          "past the bound: %d %s", code, st.message);
    uint64_t rss2 = rss_bytes(n.pid);
    CHECK(rss2 < rss0 + (32u << 20), "RSS grew by %" PRIu64 " MiB",
          (rss2 - rss0) >> 20);
    /* Nothing of it was applied: the shard is still empty. */
    struct node_client_pull_end end;
    CHECK(node_client_pull(n.ch, "big", 0, 0, 0, NULL, NULL, &end, TIMEOUT_MS,
                           &st) == 0, "pull: %s", st.message);
    CHECK(end.pages == 0, "%" PRIu64 " pages applied from refused pushes",
          end.pages);
    /* Within the bound it merges. */
    CHECK(push_many(&n, "big", fp, 4, &st) == 0, "push: %s", st.message);
    bf_destroy(like);
    node_stop(&n, SIGTERM);
}

/* A push larger than the memory budget left beside the filters is taken:
 * the node spools it and holds a piece of it at a time (what it reserves
 * against max_memory_mb is what it holds), never the whole stream.  The
 * filter's body takes about 40 of the 64 MiB budget; the push is 48 MiB
 * (every non-empty page of the shard, again and again), more than the
 * 24 MiB left, and less than the 64 MiB its spool may take on disk. */
static uint64_t shard_version(struct node_proc *np, const char *filter);

static void test_push_spooled(void)
{
    struct node_proc n;
    struct rpc_status st;
    struct node_client_shard sh;
    char fp[17];
    const char *const flags[] = {"--max-memory-mb", "64", NULL};

    start(&n, flags);
    CHECK(t_create(n.ch, "s", 35000000, 0.01, 0, &st) == 0, "create: %s",
          st.message);
    struct bf *src = shard_like(&n, "s", &sh, fp);
    struct bf_layer_info li;
    CHECK(bf_layer_info(src, 0, &li) == 0, "layer info");
    CHECK(li.body_bytes > (32u << 20) && li.body_bytes < (48u << 20),
          "a body of %" PRIu64 " bytes", li.body_bytes);
    add_keys(src, "sp", 20000);
    struct node_client_page *pg;
    size_t np = pages_of(src, &pg);
    CHECK(np > 0, "no page");
    size_t want = (48u << 20) / PAGE, got = 0;
    struct node_client_page *all = calloc(want, sizeof *all);
    CHECK(all, "out of memory");
    for (got = 0; got < want; got++)
        all[got] = pg[got % np];
    uint64_t v0 = shard_version(&n, "s");
    CHECK(node_client_push(n.ch, "s", 0, fp, 5, all, want, NULL, 120000,
                           &st) == 0,
          "a push of %zu MiB with %" PRIu64 " MiB of budget left: %s: %s",
          want * PAGE >> 20, ((uint64_t)(64u << 20) - li.body_bytes) >> 20,
          rpc_status_name(st.code), st.message);
    CHECK(shard_version(&n, "s") > v0, "the push left the version");
    char **k = keys_make("sp", 0, 20000);
    CHECK(keys_present(n.ch, "s", k, 20000, NULL) == 20000, "pushed keys missing");
    keys_free(k, 20000);
    free(all);
    free(pg);
    bf_destroy(src);
    node_stop(&n, SIGTERM);
}

/* The version the node reports for shard 0 of filter (HashesResponse of
 * a MayContainHashes of one hash). */
static uint64_t shard_version(struct node_proc *np, const char *filter)
{
    Bloomgrid__V1__HashesRequest rq = BLOOMGRID__V1__HASHES_REQUEST__INIT;
    Bloomgrid__V1__HashesResponse *resp = NULL;
    struct rpc_status st;
    uint8_t h[16] = {1, 2, 3};

    rq.filter = (char *)filter;
    rq.hashes.data = h;
    rq.hashes.len = sizeof h;
    CHECK(rpc_call(np->ch, "/bloomgrid.v1.Internal/MayContainHashes", &rq.base,
                   &bloomgrid__v1__hashes_response__descriptor,
                   (ProtobufCMessage **)&resp, TIMEOUT_MS, &st) == 0,
          "MayContainHashes: %s", st.message);
    uint64_t v = resp->version;
    bloomgrid__v1__hashes_response__free_unpacked(resp, NULL);
    return v;
}

static void test_push_version(void)
{
    struct node_proc n;
    struct rpc_status st;
    struct node_client_shard sh;
    char fp[17];

    start(&n, NULL);
    CHECK(t_create(n.ch, "r", 100000, 0.01, 0, &st) == 0, "create: %s",
          st.message);
    struct bf *src = shard_like(&n, "r", &sh, fp);
    uint64_t v0 = shard_version(&n, "r");

    /* No page, a huge version: accepted, changes and claims nothing. */
    CHECK(node_client_push(n.ch, "r", 0, fp, UINT64_C(1) << 62, NULL, 0, NULL,
                           TIMEOUT_MS, &st) == 0, "empty push: %s", st.message);
    uint64_t v = shard_version(&n, "r");
    CHECK(v == v0, "an empty push moved the version from %" PRIu64
          " to %" PRIu64, v0, v);

    /* A push refused part-way (its last page outside the body): nothing
     * of it is applied. */
    add_keys(src, "v", 1000);
    struct node_client_page *pg;
    size_t np = pages_of(src, &pg);
    CHECK(np >= 2, "%zu pages", np);
    struct bf_layer_info li;
    bf_layer_info(src, 0, &li);
    struct node_client_page keep = pg[np - 1];
    pg[np - 1].offset = li.body_bytes;
    CHECK(node_client_push(n.ch, "r", 0, fp, UINT64_C(1) << 62, pg, np, NULL,
                           TIMEOUT_MS, &st) < 0 &&
          st.code == GRPC_STATUS_INVALID_ARGUMENT, "bad page: %s", st.message);
    pg[np - 1] = keep;
    v = shard_version(&n, "r");
    CHECK(v == v0, "a refused push moved the version to %" PRIu64, v);
    struct node_client_pull_end end;
    CHECK(node_client_pull(n.ch, "r", 0, 0, 0, NULL, NULL, &end, TIMEOUT_MS,
                           &st) == 0, "pull: %s", st.message);
    CHECK(end.pages == 0, "%" PRIu64 " pages of a refused push applied",
          end.pages);

    /* A complete push applies, once. */
    CHECK(node_client_push(n.ch, "r", 0, fp, 7, pg, np, NULL, TIMEOUT_MS,
                           &st) == 0, "push: %s", st.message);
    CHECK(shard_version(&n, "r") > v0, "a complete push left the version");
    char **k = keys_make("v", 0, 1000);
    CHECK(keys_present(n.ch, "r", k, 1000, NULL) == 1000, "pushed keys missing");
    keys_free(k, 1000);
    free(pg);
    bf_destroy(src);
    node_stop(&n, SIGTERM);
}

static int keys_absent_code(struct node_proc *np, const char *filter)
{
    struct rpc_status st;
    char **k = keys_make("old", 0, 1);
    int code = t_keys(np->ch, "MayContain", filter, k, 1, NULL, &st);
    keys_free(k, 1);
    return code;
}

static void test_tombstone(void)
{
    struct node_proc n;
    struct rpc_status st;
    struct node_client_shard old, now;
    char fp[17], fp2[17];

    start(&n, NULL);
    CHECK(t_create(n.ch, "t", 100000, 0.01, 0, &st) == 0, "create: %s",
          st.message);
    char **k = keys_make("old", 0, 1000);
    keys_call(n.ch, "Add", "t", k, 1000, 1000, NULL);
    keys_free(k, 1000);
    /* What a merger holds of it: the identity, its pages, its file. */
    struct bf *src = shard_like(&n, "t", &old, fp);
    uint8_t *file = NULL;
    size_t flen = t_export(n.ch, "t", &file, &st);
    CHECK(flen > 0, "export: %s", st.message);
    add_keys(src, "old", 1000);
    struct node_client_page *pg;
    size_t np = pages_of(src, &pg);
    CHECK(t_drop(n.ch, "t", &st) == 0, "drop: %s", st.message);

    /* The old pages, the old template and the old file are refused. */
    CHECK(node_client_push(n.ch, "t", 0, fp, 0, pg, np, NULL, TIMEOUT_MS,
                           &st) < 0 &&
          st.code == GRPC_STATUS_FAILED_PRECONDITION &&
          strstr(st.message, "dropped"), "push after drop: %d %s", st.code,
          st.message);
    CHECK(node_client_create_shard(n.ch, "t", &old, TIMEOUT_MS, &st) < 0 &&
          st.code == GRPC_STATUS_FAILED_PRECONDITION &&
          strstr(st.message, "dropped"), "CreateShard with the old secret: "
          "%d %s", st.code, st.message);
    CHECK(keys_absent_code(&n, "t") == GRPC_STATUS_NOT_FOUND,
          "the dropped filter came back");

    /* Across a restart too. */
    node_stop(&n, SIGTERM);
    start(&n, NULL);
    CHECK(node_client_create_shard(n.ch, "t", &old, TIMEOUT_MS, &st) < 0 &&
          st.code == GRPC_STATUS_FAILED_PRECONDITION,
          "CreateShard with the old secret after a restart: %d %s", st.code,
          st.message);
    CHECK(node_client_push(n.ch, "t", 0, fp, 0, pg, np, NULL, TIMEOUT_MS,
                           &st) < 0 &&
          st.code == GRPC_STATUS_FAILED_PRECONDITION,
          "push after a restart: %d %s", st.code, st.message);
    CHECK(keys_absent_code(&n, "t") == GRPC_STATUS_NOT_FOUND,
          "the dropped filter came back after a restart");

    /* The name again: a new secret, a new filter that works. */
    CHECK(t_create(n.ch, "t", 100000, 0.01, 0, &st) == 0, "re-create: %s",
          st.message);
    struct bf *like = shard_like(&n, "t", &now, fp2);
    CHECK(memcmp(now.secret, old.secret, BF_SECRET_LEN) != 0,
          "re-created with the old secret");
    k = keys_make("new", 0, 100);
    keys_call(n.ch, "Add", "t", k, 100, 100, NULL);
    CHECK(keys_present(n.ch, "t", k, 100, NULL) == 100, "new keys missing");
    keys_free(k, 100);
    /* Old pages and the old file still do not get in. */
    CHECK(node_client_push(n.ch, "t", 0, fp, 0, pg, np, NULL, TIMEOUT_MS,
                           &st) < 0 &&
          st.code == GRPC_STATUS_FAILED_PRECONDITION &&
          strstr(st.message, "dropped"), "old pages into the new filter: "
          "%d %s", st.code, st.message);
    CHECK(t_import(n.ch, "t", file, flen, NULL, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION, "old file: %s", st.message);
    CHECK(node_client_push(n.ch, "t", 0, fp2, 0, NULL, 0, NULL, TIMEOUT_MS,
                           &st) == 0, "push under the new fingerprint: %s",
          st.message);
    free(pg);
    free(file);
    bf_destroy(src);
    bf_destroy(like);
    node_stop(&n, SIGTERM);
}

/* One PushPages stream of the given messages, as they are (checksums
 * included); returns the status code. */
static int push_raw(struct node_proc *np, Bloomgrid__V1__PushPagesRequest *m,
                    size_t n)
{
    struct rpc_cstream *cs = rpc_cstream_open(np->ch,
                                              "/bloomgrid.v1.Internal/PushPages",
                                              TIMEOUT_MS);
    struct rpc_status st;
    grpc_slice msg;

    CHECK(cs, "open");
    for (size_t i = 0; i < n; i++)
        if (rpc_cstream_write_msg(cs, &m[i].base) < 0)
            break;
    rpc_cstream_close_send(cs);
    if (rpc_cstream_read(cs, &msg) == 1)
        grpc_slice_unref(msg);
    rpc_cstream_finish(cs, &st);
    return (int)st.code;
}

static int count_keys(void *ctx, const uint8_t *hashes, size_t n)
{
    (void)hashes;
    *(uint64_t *)ctx += n;
    return 0;
}

static void test_push_keys(void)
{
    struct node_proc n;
    struct rpc_status st;
    struct node_client_shard sh;
    struct node_client_pull_end before, after;
    char fp[17];
    enum { N = 3000 };

    start(&n, NULL);
    CHECK(t_create(n.ch, "f", 2000000, 0.01, 0, &st) == 0, "create: %s",
          st.message);
    /* A write first: the puller's cursor is then past the creation. */
    char **k0 = keys_make("local", 0, 10);
    keys_call(n.ch, "Add", "f", k0, 10, 10, NULL);
    keys_free(k0, 10);
    CHECK(node_client_pull(n.ch, "f", 0, 0, 0, NULL, NULL, &before, TIMEOUT_MS,
                           &st) == 0, "pull: %s", st.message);
    struct bf *f = shard_like(&n, "f", &sh, fp);
    char **k = keys_make("pushed", 0, N);
    uint8_t *h = malloc(16 * N);
    CHECK(h, "memory");
    for (int i = 0; i < N; i++) {
        struct bf_hash x = bf_hash_key(f, k[i], strlen(k[i]));
        node_client_hashes_put(h + 16 * i, &x, 1);
    }

    /* Refused streams add nothing. */
    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    ref.filter = "f";
    Bloomgrid__V1__PushPagesRequest m[2];
    for (int i = 0; i < 2; i++) {
        bloomgrid__v1__push_pages_request__init(&m[i]);
        m[i].key_hashes.data = h + 16 * 1000 * i;
        m[i].key_hashes.len = 16 * 1000;
        m[i].checksum = XXH64(m[i].key_hashes.data, m[i].key_hashes.len, 0);
    }
    m[0].shard = &ref;
    m[0].fingerprint = fp;
    m[1].checksum ^= 1;
    CHECK(push_raw(&n, m, 2) == GRPC_STATUS_DATA_LOSS, "a bad checksum");
    m[1].checksum ^= 1;
    uint64_t word = 0;
    m[1].data.data = (uint8_t *)&word;
    m[1].data.len = 8;
    CHECK(push_raw(&n, m, 2) == GRPC_STATUS_INVALID_ARGUMENT, "data and keys");
    m[1].data.len = 0;
    m[1].key_hashes.len = 15;
    m[1].checksum = XXH64(m[1].key_hashes.data, 15, 0);
    CHECK(push_raw(&n, m, 2) == GRPC_STATUS_INVALID_ARGUMENT, "a cut key");
    CHECK(keys_present(n.ch, "f", k, 2000, NULL) < 2000 / 10,
          "a refused push of keys added them");

    CHECK(node_client_push_keys(n.ch, "f", 0, fp, h, N, TIMEOUT_MS, &st) == 0,
          "push of keys: %s", st.message);
    CHECK(keys_present(n.ch, "f", k, N, NULL) == N, "pushed keys missing");
    /* Another copy's cursor from before the push: the push's adds come back
     * as keys. */
    uint64_t got = 0;
    CHECK(node_client_pull_keys(n.ch, 0, NULL, 0, "f", 0, before.version,
                                before.epoch, NULL, count_keys, &got,
                                &after, TIMEOUT_MS, &st) == 0,
          "pull: %s", st.message);
    CHECK(after.keys == N && after.pages == 0 && got == N,
          "a pull since before the push got %" PRIu64 " keys and %" PRIu64
          " pages", after.keys, after.pages);
    free(h);
    keys_free(k, N);
    bf_destroy(f);
    node_stop(&n, SIGTERM);
}

int main(int argc, char **argv)
{
    CHECK(argc >= 3, "usage: test_node_pages_push NODE_BIN TEST");
    harness_node_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    grpc_init();
    harness_tmpdir(tdir, sizeof tdir, argv[2]);
    if (!strcmp(argv[2], "pull_after_push"))
        test_pull_after_push();
    else if (!strcmp(argv[2], "push_memory"))
        test_push_memory();
    else if (!strcmp(argv[2], "push_version"))
        test_push_version();
    else if (!strcmp(argv[2], "push_spooled"))
        test_push_spooled();
    else if (!strcmp(argv[2], "drop_unwritten_pushed"))
        test_drop_unwritten_pushed();
    else if (!strcmp(argv[2], "push_keys"))
        test_push_keys();
    else if (!strcmp(argv[2], "tombstone"))
        test_tombstone();
    else
        CHECK(0, "unknown test %s", argv[2]);
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
