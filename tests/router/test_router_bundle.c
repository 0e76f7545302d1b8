/* Integration tests of shard bundles through bloomgrid-router: two real
 * nodes and a router on loopback, the bundles read and written with
 * common/engine/bundle.h as the offline tool does.
 *
 * usage: test_router_bundle NODE_BIN ROUTER_BIN TEST
 *   layout  the router's Export is a bundle the common reader takes (one
 *           entry per shard, in order, each shard's own file, also for a
 *           filter of one shard); a partial built with the common writer
 *           imports; bundles of another shard count, with entries out of
 *           order, with another filter's shard, or a plain filter file are
 *           refused with the status naming the problem, and change nothing
 *   empty   Import streams whose messages carry empty data fields (the
 *           first one naming the filter only, empty ones between and after
 *           the chunks) get the same answer as without them, from the router
 *           and from a node; a stream of no data at all is refused as
 *           INVALID_ARGUMENT, not a crash
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"
#include "bundle.h"
#include "bytebuf.h"
#include "cluster.h"
#include "harness.h"

/* Two nodes, one group each, and a router in front of them. */
static void rig_start(struct cluster *c, const char *tag)
{
    cluster_start(c, tag, 2, 1, "none");
}

static int create_sharded(struct rpc_channel *ch, const char *name, uint32_t shards,
                          struct rpc_status *st)
{
    return t_create_sharded(ch, name, 20000, 0.01, 0, shards, NULL, st);
}

/* How many of keys the filter says may be present. */
static size_t present(struct rpc_channel *ch, const char *name, char **keys, size_t n)
{
    return keys_present(ch, name, keys, n, NULL);
}

/* Export name whole into out (caller frees out->p).  0 or the status. */
static int export_file(struct rpc_channel *ch, const char *name, struct bytebuf *out,
                       struct rpc_status *st)
{
    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    struct rpc_cstream *cs = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Export",
                                              TIMEOUT_MS);
    grpc_slice sl;

    bytebuf_init(out, 1u << 30);
    rq.filter = (char *)name;
    CHECK(cs, "open Export");
    CHECK(rpc_cstream_write_msg(cs, &rq.base) == 0 && rpc_cstream_close_send(cs) == 0,
          "send ExportRequest");
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(fc && fc->offset == out->len, "chunk at %zu", out->len);
        CHECK(bytebuf_append(out, fc->data.data, fc->data.len) == 0, "append");
        bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
        grpc_slice_unref(sl);
    }
    return rpc_cstream_finish(cs, st) < 0 ? (int)st->code : 0;
}

/* Import len bytes into name in chunks of chunk bytes.  empties: the first
 * message only names the filter, and a message without data follows every
 * chunk.  Returns 0 (with the bytes the server says it received in *got)
 * or the status. */
static int import_file(struct rpc_channel *ch, const char *name, const uint8_t *buf,
                       size_t len, size_t chunk, bool empties, uint64_t *got,
                       struct rpc_status *st)
{
    struct rpc_cstream *cs = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Import",
                                              TIMEOUT_MS);
    bool named = false, ok = true;
    grpc_slice sl;

    CHECK(cs, "open Import");
    *got = 0;
    if (empties) {
        Bloomgrid__V1__ImportRequest rq = BLOOMGRID__V1__IMPORT_REQUEST__INIT;
        rq.filter = (char *)name;
        ok = rpc_cstream_write_msg(cs, &rq.base) == 0;
        named = true;
    }
    for (size_t off = 0; ok && off < len; off += chunk) {
        Bloomgrid__V1__ImportRequest rq = BLOOMGRID__V1__IMPORT_REQUEST__INIT;
        rq.filter = named ? "" : (char *)name;
        rq.data.data = (uint8_t *)buf + off;
        rq.data.len = len - off < chunk ? len - off : chunk;
        named = true;
        ok = rpc_cstream_write_msg(cs, &rq.base) == 0;
        if (ok && empties) {
            Bloomgrid__V1__ImportRequest none = BLOOMGRID__V1__IMPORT_REQUEST__INIT;
            ok = rpc_cstream_write_msg(cs, &none.base) == 0;
        }
    }
    rpc_cstream_close_send(cs);
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__ImportResponse *ir = bloomgrid__v1__import_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(ir && ir->info, "ImportResponse");
        *got = ir->bytes_received;
        bloomgrid__v1__import_response__free_unpacked(ir, NULL);
        grpc_slice_unref(sl);
    }
    return rpc_cstream_finish(cs, st) < 0 ? (int)st->code : 0;
}

/* A partial like the exported template (either form), holding keys: what
 * `bloomgrid build --like` makes.  Returns its bytes in out. */
static void build_partial(const struct bytebuf *tmpl, char **keys, size_t n,
                          struct bytebuf *out)
{
    char err[BF_ERRLEN] = "";
    struct bundle *t = bundle_parse(tmpl->p, tmpl->len, err), *b;

    CHECK(t, "template: %s", err);
    b = bundle_create_like(t, err);
    CHECK(b, "create_like: %s", err);
    for (size_t i = 0; i < n; i++) {
        const void *k = keys[i];
        size_t len = strlen(keys[i]);
        bundle_add_keys(b, &k, &len, 1);
    }
    bytebuf_init(out, 1u << 30);
    CHECK(bundle_write(b, bytebuf_write, out) == 0, "bundle_write");
    bundle_destroy(t);
    bundle_destroy(b);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A valid trailer after a field was changed on purpose. */
static void reseal(uint8_t *buf, size_t len)
{
    uint64_t h = XXH3_64bits(buf, len - 8);
    for (int i = 0; i < 8; i++)
        buf[len - 8 + i] = (uint8_t)(h >> (8 * i));
}

/* ---- layout ---- */

static void test_layout(void)
{
    struct cluster g;
    struct rpc_status st;
    struct bytebuf tmpl, part, other, bytes;
    struct bundle_layout l;
    char err[BF_ERRLEN] = "";
    const size_t N = 1000;
    uint64_t got;

    rig_start(&g, "router-bundle-layout");
    struct rpc_channel *r = g.router[0].ch;
    CHECK(create_sharded(r, "four", 4, &st) == 0, "create: %s", st.message);
    CHECK(create_sharded(r, "one", 1, &st) == 0, "create: %s", st.message);
    CHECK(create_sharded(r, "three", 3, &st) == 0, "create: %s", st.message);
    CHECK(create_sharded(r, "other", 4, &st) == 0, "create: %s", st.message);

    /* The export: one entry per shard, in order, each shard's own file. */
    CHECK(export_file(r, "four", &tmpl, &st) == 0, "Export: %s", st.message);
    CHECK(bundle_layout_parse(tmpl.p, tmpl.len, &l, err) == 0, "layout: %s", err);
    CHECK(l.count == 4, "%u entries", l.count);
    struct bf *s0 = bf_file_parse(l.entry[0].file, l.entry[0].len, err);
    CHECK(s0, "shard 0: %s", err);
    for (uint32_t i = 0; i < 4; i++) {
        struct bf *sh = bf_file_parse(l.entry[i].file, l.entry[i].len, err);
        CHECK(sh, "shard %u: %s", i, err);
        CHECK(!bundle_shard_mismatch(sh, i, 4, bf_secret(s0)), "shard %u: %s", i,
              bundle_shard_mismatch(sh, i, 4, bf_secret(s0)));
        bf_destroy(sh);
    }
    bf_destroy(s0);
    bundle_layout_deinit(&l);

    /* A filter of one shard is exported as a bundle of one, not a plain file. */
    CHECK(export_file(r, "one", &bytes, &st) == 0, "Export one: %s", st.message);
    CHECK(bundle_layout_parse(bytes.p, bytes.len, &l, err) == 0 && l.count == 1,
          "bundle of one: %s", err);
    bundle_layout_deinit(&l);
    bytebuf_deinit(&bytes);

    /* A partial made by the common writer imports; its keys are present. */
    char **keys = keys_make("part", 0, N);
    build_partial(&tmpl, keys, N, &part);
    CHECK(present(r, "four", keys, N) < N / 10, "keys present before the import");

    /* Refusals, each before anything changes. */
    CHECK(export_file(r, "three", &bytes, &st) == 0, "Export three: %s", st.message);
    struct bytebuf p3;
    build_partial(&bytes, keys, N, &p3);
    bytebuf_deinit(&bytes);
    CHECK(import_file(r, "four", p3.p, p3.len, 65536, false, &got, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION && strstr(st.message, "shard_count"),
          "3 shards into 4: %d %s", st.code, st.message);
    bytebuf_deinit(&p3);

    CHECK(bundle_layout_parse(part.p, part.len, &l, err) == 0, "%s", err);
    size_t e1 = (size_t)(l.entry[1].file - part.p) - 12;
    bundle_layout_deinit(&l);
    put32(part.p + e1, 2);
    reseal(part.p, part.len);
    CHECK(import_file(r, "four", part.p, part.len, 65536, false, &got, &st) ==
              GRPC_STATUS_INVALID_ARGUMENT && strstr(st.message, "shard order"),
          "entry out of order: %d %s", st.code, st.message);
    put32(part.p + e1, 1);
    reseal(part.p, part.len);

    CHECK(export_file(r, "other", &bytes, &st) == 0, "Export other: %s", st.message);
    build_partial(&bytes, keys, N, &other);
    bytebuf_deinit(&bytes);
    CHECK(import_file(r, "four", other.p, other.len, 65536, false, &got, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION && strstr(st.message, "\"secret\""),
          "another filter's bundle: %d %s", st.code, st.message);
    bytebuf_deinit(&other);

    CHECK(t_create(g.node[0].ch, "plain", 1000, 0.01, 0, &st) == 0, "%s", st.message);
    CHECK(export_file(g.node[0].ch, "plain", &bytes, &st) == 0, "%s", st.message);
    CHECK(!bundle_is(bytes.p, bytes.len), "a node exports a plain file");
    CHECK(import_file(r, "four", bytes.p, bytes.len, 65536, false, &got, &st) ==
              GRPC_STATUS_INVALID_ARGUMENT && strstr(st.message, "not a shard bundle"),
          "plain file: %d %s", st.code, st.message);
    bytebuf_deinit(&bytes);
    CHECK(present(r, "four", keys, N) < N / 10, "a refused import changed the filter");

    CHECK(import_file(r, "four", part.p, part.len, 65536, false, &got, &st) == 0,
          "Import: %s", st.message);
    CHECK(got == part.len, "bytes_received %llu of %zu", (unsigned long long)got,
          part.len);
    CHECK(present(r, "four", keys, N) == N, "imported keys missing");
    printf("bundle of 4 shards: %zu bytes, imported\n", part.len);

    bytebuf_deinit(&part);
    bytebuf_deinit(&tmpl);
    keys_free(keys, N);
    cluster_stop(&g);
}

/* ---- empty data fields ---- */

/* Import keys into name on ch twice-checked: a stream with empty messages
 * answers as a stream without them. */
static void import_with_empties(struct rpc_channel *ch, const char *name, const char *tag)
{
    struct bytebuf tmpl, part;
    struct rpc_status st;
    const size_t N = 800;
    uint64_t got;

    CHECK(export_file(ch, name, &tmpl, &st) == 0, "%s: Export: %s", tag, st.message);
    char **keys = keys_make(tag, 0, N);
    build_partial(&tmpl, keys, N, &part);
    CHECK(present(ch, name, keys, N) < N / 10, "%s: keys present before", tag);

    /* No data at all, only the name: refused, and the server lives on. */
    CHECK(import_file(ch, name, NULL, 0, 4096, true, &got, &st) ==
              GRPC_STATUS_INVALID_ARGUMENT, "%s: no data: %d %s", tag, st.code,
          st.message);
    CHECK(strstr(st.message, "imported file refused"), "%s: %s", tag, st.message);

    CHECK(import_file(ch, name, part.p, part.len, 4096, true, &got, &st) == 0,
          "%s: Import with empty messages: %d %s", tag, st.code, st.message);
    CHECK(got == part.len, "%s: bytes_received %llu of %zu", tag,
          (unsigned long long)got, part.len);
    CHECK(present(ch, name, keys, N) == N, "%s: imported keys missing", tag);
    /* The same import without empty messages answers the same. */
    CHECK(import_file(ch, name, part.p, part.len, 4096, false, &got, &st) == 0 &&
              got == part.len, "%s: plain Import: %s", tag, st.message);
    printf("%s: %zu bytes imported in 4 KiB chunks with empty messages\n", tag,
           part.len);
    bytebuf_deinit(&part);
    bytebuf_deinit(&tmpl);
    keys_free(keys, N);
}

static void test_empty(void)
{
    struct cluster g;
    struct rpc_status st;

    rig_start(&g, "router-bundle-empty");
    CHECK(create_sharded(g.router[0].ch, "sharded", 4, &st) == 0, "create: %s", st.message);
    import_with_empties(g.router[0].ch, "sharded", "router");
    CHECK(t_create(g.node[1].ch, "solo", 5000, 0.01, 0, &st) == 0, "create: %s",
          st.message);
    import_with_empties(g.node[1].ch, "solo", "node");
    cluster_stop(&g);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN layout|empty\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    grpc_init();
    if (strcmp(argv[3], "layout") == 0)
        test_layout();
    else if (strcmp(argv[3], "empty") == 0)
        test_empty();
    else {
        fprintf(stderr, "unknown test %s\n", argv[3]);
        return 2;
    }
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
