/* Router test "export": a router's Export streams the shard bundle to its
 * client as the shards' copies send it (docs/ROUTER.md, "Export and
 * Import"), holding a chunk or two and, for a group read by R > 1 copies,
 * a piece and a message of each copy read in step, whatever the filter's
 * size.
 *
 * usage: test_router_export NODE_BIN ROUTER_BIN CLI_BIN CASE
 *   stream  a router with max_memory_mb = 24 (max_message_size 8 MiB)
 *           exports a filter of 16 shards whose bundle is ~250 MB (each
 *           shard ~16 MB): the Export succeeds, its last chunk says the
 *           bundle's size (the others 0: not known yet), the bundle parses
 *           with every key added present and the router's fingerprint, and
 *           the router's peak RSS (VmHWM, started over before the Export)
 *           grows by less than an eighth of the bundle (measured: 18-19 MB;
 *           not checked in a sanitizer build, whose allocator keeps freed
 *           memory in quarantine).  (A router that assembles the bundle
 *           before sending it refuses this Export RESOURCE_EXHAUSTED naming
 *           max_memory_mb.)
 *   quorum  the same budget in front of one group of three copies read by
 *           R = 2 (each shard exported from two copies read in step and
 *           ORed): a bundle of ~38 MB, larger than the budget, of 16 shards
 *           of ~2.4 MB exports with every key present, and so does a
 *           filter of 2 shards of ~10 MB, two copies of which do not fit
 *           the budget (a router that held a shard's copies while ORing
 *           them refused it RESOURCE_EXHAUSTED naming max_memory_mb).
 *   differ  the same budget and group, a filter of 2 shards of ~38 MB
 *           (one copy of one is past the budget) where each copy lacks
 *           keys the two others acknowledged (checked on each copy's own
 *           ExportShard): the Export succeeds with every key present, is
 *           byte for byte the bundle of copies 0 and 1 (the two the router
 *           reads) each parsed whole and merged (bf_merge_from, the largest
 *           copy's counts), and the router's peak RSS grows by less than a
 *           third of the bundle (a router holding the copies would have
 *           been refused by the budget); a client that goes away inside
 *           shard 0 has its Export ended by the router at once (its log
 *           says so); copy 0 killed while the client holds the Export
 *           inside shard 0 ends it UNAVAILABLE naming the shard and the
 *           copy.
 *   killed  an Export whose client goes away after its first chunk is ended
 *           by the router at once (its log says so), one whose client stops
 *           reading after stream_idle_ms (3 s here), RESOURCE_EXHAUSTED
 *           naming it; a node killed while
 *           the Export's client has taken its first
 *           chunk: the call ends UNAVAILABLE naming the shard and the node,
 *           never OK; `bloomgrid export` through a router with a node down
 *           that holds a later shard than the first (so chunks go out
 *           before the failure) exits non-zero saying so and leaves neither
 *           the file nor its temp file.
 */
#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "bundle.h"
#include "bytebuf.h"
#include "cluster.h"
#include "harness.h"
#include "node_client.h"

#define EXPORT_DEADLINE_MS 120000

/* An Export whose client takes its first chunk and goes away: the router
 * ends it (its log says so once more) within 20 s. */
static void export_client_goes_away(struct rpc_channel *ch,
                                    const Bloomgrid__V1__ExportRequest *rq,
                                    struct node_proc *rp)
{
    struct rpc_status st = {0};
    int before = harness_log_count(rp->log, "the client went away"), waited = 0;
    struct rpc_cstream *cs = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/Export",
                                              EXPORT_DEADLINE_MS);
    grpc_slice sl;
    CHECK(cs && rpc_cstream_write_msg(cs, &rq->base) == 0 &&
          rpc_cstream_close_send(cs) == 0 && rpc_cstream_read(cs, &sl) == 1,
          "the first chunk of an Export");
    grpc_slice_unref(sl);
    rpc_cstream_cancel(cs);
    rpc_cstream_finish(cs, &st);
    while (harness_log_count(rp->log, "the client went away") < 1 + before &&
           waited < 20000) {
        harness_sleep_ms(100);
        waited += 100;
    }
    CHECK(harness_log_count(rp->log, "the client went away") == 1 + before,
          "the router did not end an Export whose client went away");
    printf("an Export whose client went away ended in the router within %d ms\n", waited);
}

static const char *cli_bin;

/* The router flags of a budget smaller than the bundles here and larger
 * than one shard (max_memory_mb must be at least 8/7 of the message size). */
static const char *const SMALL_BUDGET[] = {"--max-memory-mb", "24", "--max-message-size",
                                           "8388608", "--node-timeout-ms", "10000", NULL};

/* Every key present in the bundle buf, whose shards are the router's: its
 * fingerprint is the filter's, as the router's FilterInfo says it. */
static void bundle_check(struct rpc_channel *r, const char *name, const uint8_t *buf,
                         size_t len, uint32_t shards, char **k, size_t n)
{
    char err[BF_ERRLEN], fp[17];
    struct bundle *b = bundle_parse(buf, len, err);
    CHECK(b, "the export does not parse: %s", err);
    CHECK(b->count == shards && !b->plain, "the export has %u shards", b->count);
    bool *in = calloc(n, sizeof *in);
    size_t *lens = calloc(n, sizeof *lens);
    CHECK(in && lens, "out of memory");
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(k[i]);
    bundle_may_contain_keys(b, (const void *const *)k, lens, n, in);
    for (size_t i = 0; i < n; i++)
        CHECK(in[i], "key %s is not in the export", k[i]);
    Bloomgrid__V1__FilterInfo *fi = NULL;
    struct rpc_status st;
    CHECK(t_get(r, name, &fi, &st) == 0, "GetFilter %s: %s", name, st.message);
    bundle_fingerprint_id(b, fp);
    CHECK(!strcmp(fp, fi->fingerprint), "the export's fingerprint %s, the router's %s",
          fp, fi->fingerprint);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    free(lens);
    free(in);
    bundle_destroy(b);
}

/* Export name through the router (p) while its peak RSS is watched: it
 * must grow by less than 1/part of the bundle (0: not checked).  Returns
 * the bundle (*len bytes) and prints what the router held. */
static uint8_t *export_watched(struct node_proc *p, const char *name, size_t part,
                               size_t *len)
{
    struct rpc_status st;
    uint8_t *buf = NULL;
    FILE *f = NULL;
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)p->pid);
    CHECK((f = fopen(path, "w")) && fputs("5", f) >= 0 && fclose(f) == 0,
          "cannot reset the peak RSS of %d", (int)p->pid);
    uint64_t rss0 = harness_status_bytes(p->pid, "VmRSS");
    double t0 = harness_now_s();
    *len = t_export_ms(p->ch, name, &buf, EXPORT_DEADLINE_MS, &st);
    double t1 = harness_now_s();
    CHECK(*len > 0, "Export of %s: %s %s", name, rpc_status_name(st.code), st.message);
    uint64_t hwm = harness_status_bytes(p->pid, "VmHWM");
    printf("Export of %s: %zu bytes in %.2f s; router VmRSS before %" PRIu64
           " kB, VmHWM during %" PRIu64 " kB (+%" PRIu64 " kB)\n", name, *len, t1 - t0,
           rss0 >> 10, hwm >> 10, hwm > rss0 ? (hwm - rss0) >> 10 : 0);
#ifdef __SANITIZE_ADDRESS__
    part = 0;   /* freed memory stays in the sanitizer's quarantine */
#endif
    CHECK(!part || hwm < rss0 + *len / part, "the router's RSS grew by %" PRIu64 " kB for an "
          "Export of %zu bytes", (hwm - rss0) >> 10, *len);
    return buf;
}

static void case_stream(void)
{
    struct cluster c;
    struct rpc_status st;
    cluster_start_flags(&c, "router-export-stream", 3, 1, "none", SMALL_BUDGET);
    struct node_proc *rp = &c.router[0];

    /* 200 M keys at 1 %: ~250 MB of bits in 16 shards of ~16 MB. */
    CHECK(t_create_sharded(rp->ch, "big", 200000000, 0.01, 0, 16, NULL, &st) == 0,
          "create big: %s", st.message);
    const size_t N = 20000;
    char **k = keys_make("exp", 0, N);
    keys_call(rp->ch, "Add", "big", k, N, 1000, NULL);

    size_t len;
    uint8_t *buf = export_watched(rp, "big", 8, &len);
    CHECK(len > (200u << 20), "a bundle of %zu bytes", len);
    bundle_check(rp->ch, "big", buf, len, 16, k, N);
    free(buf);
    keys_free(k, N);
    cluster_stop(&c);
}

static void case_quorum(void)
{
    struct cluster c;
    struct rpc_status st;
    cluster_init(&c, "router-export-quorum", "fsync");
    c.router_flags = SMALL_BUDGET;
    cluster_run_copies(&c, 1, 3, "write_quorum = 2\nread_quorum = 2\n", 1);
    struct node_proc *rp = &c.router[0];

    /* ~38 MB of bits in 16 shards of ~2.4 MB: the budget holds a shard's
     * copies while they are ORed, not the bundle. */
    CHECK(t_create_sharded(rp->ch, "q", 32000000, 0.01, 0, 16, NULL, &st) == 0,
          "create q: %s", st.message);
    const size_t N = 5000;
    char **k = keys_make("q", 0, N);
    keys_call(rp->ch, "Add", "q", k, N, 1000, NULL);
    size_t len;
    uint8_t *buf = export_watched(rp, "q", 0, &len);
    CHECK(len > (24u << 20), "a bundle of %zu bytes", len);
    bundle_check(rp->ch, "q", buf, len, 16, k, N);
    free(buf);
    keys_free(k, N);

    /* Shards of ~10 MB, two copies of which would not fit the budget's
     * large share (21 MiB) beside the stream's chunks: exported all the
     * same, the copies read in step. */
    CHECK(t_create_sharded(rp->ch, "wide", 16000000, 0.01, 0, 2, NULL, &st) == 0,
          "create wide: %s", st.message);
    k = keys_make("w", 0, N);
    keys_call(rp->ch, "Add", "wide", k, N, 1000, NULL);
    buf = export_watched(rp, "wide", 0, &len);
    bundle_check(rp->ch, "wide", buf, len, 2, k, N);
    free(buf);
    keys_free(k, N);
    cluster_stop(&c);
}

/* Shard s's file as copy p exports it (ExportShard, the router's own
 * call), parsed. */
static struct bf *copy_shard(struct node_proc *p, const char *name, uint32_t s)
{
    struct node_client_ref ref = {.filter = name, .shard = s};
    struct rpc_status st;
    struct bytebuf b;
    bool sent = false;
    grpc_slice sl;
    char err[BF_ERRLEN];
    bytebuf_init(&b, SIZE_MAX);
    struct rpc_cstream *cs = node_client_export_open(p->ch, &ref, 1u << 20,
                                                     EXPORT_DEADLINE_MS, &sent);
    CHECK(cs && sent, "ExportShard %s/%u on %s", name, s, p->addr);
    while (rpc_cstream_read(cs, &sl) == 1) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(fc && fc->offset == b.len && bytebuf_append(&b, fc->data.data,
                                                          fc->data.len) == 0,
              "a chunk of %s/%u from %s", name, s, p->addr);
        bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
        grpc_slice_unref(sl);
    }
    CHECK(rpc_cstream_finish(cs, &st) == 0, "ExportShard %s/%u on %s: %s", name, s,
          p->addr, st.message);
    struct bf *f = bf_file_parse(b.p, b.len, err);
    CHECK(f, "copy %s of %s/%u does not parse: %s", p->addr, name, s, err);
    bytebuf_deinit(&b);
    return f;
}

static int grow_write(void *ctx, const void *data, size_t len)
{
    return bytebuf_append(ctx, data, len);
}

/* The bundle of copies ci[0..n) of every shard, each shard's files merged
 * the way a router did before it read copies in step: parsed whole, merged
 * in order (bf_merge_from), the largest copy's counts, written whole. */
static void copies_bundle(struct cluster *c, const char *name, uint32_t shards,
                          const int *ci, int n, struct bytebuf *out)
{
    struct bundle_writer w;
    char err[BF_ERRLEN];
    bytebuf_init(out, SIZE_MAX);
    CHECK(bundle_writer_begin(&w, shards, grow_write, out) == 0, "bundle");
    for (uint32_t s = 0; s < shards; s++) {
        struct bf *acc = NULL;
        uint64_t inserts = 0, keys = 0, count = 0;
        for (int i = 0; i < n; i++) {
            struct bf *one = copy_shard(&c->node[ci[i]], name, s);
            struct bf_layer_info li;
            CHECK(bf_layer_info(one, 0, &li) == 0 && bf_layer_count(one) == 1,
                  "one layer");
            inserts = bf_insert_count(one) > inserts ? bf_insert_count(one) : inserts;
            keys = bf_keys_added(one) > keys ? bf_keys_added(one) : keys;
            count = li.count > count ? li.count : count;
            if (!acc) {
                acc = one;
                continue;
            }
            CHECK(bf_merge_from(acc, one, err) == 0, "merge: %s", err);
            bf_destroy(one);
        }
        bf_set_counts(acc, inserts, keys, &count);
        CHECK(bundle_writer_entry(&w, s, bf_file_size(acc)) == 0 &&
              bf_file_write_stable(acc, bundle_writer_data, &w) == 0, "entry %u", s);
        bf_destroy(acc);
    }
    CHECK(bundle_writer_end(&w) == 0, "bundle end");
}

/* How many of keys k[0..n) the bundle buf may contain. */
static size_t bundle_count(const struct bytebuf *buf, char **k, size_t n)
{
    char err[BF_ERRLEN];
    struct bundle *b = bundle_parse(buf->p, buf->len, err);
    CHECK(b, "bundle: %s", err);
    bool *in = calloc(n, sizeof *in);
    size_t *lens = calloc(n, sizeof *lens), got = 0;
    CHECK(in && lens, "out of memory");
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(k[i]);
    bundle_may_contain_keys(b, (const void *const *)k, lens, n, in);
    for (size_t i = 0; i < n; i++)
        got += in[i];
    free(in);
    free(lens);
    bundle_destroy(b);
    return got;
}

/* Start copy i again with anti-entropy slowed down (so that it goes on
 * lacking what it missed) and wait until the router writes to it and it
 * answers reads. */
static void copy_back(struct cluster *c, int i)
{
    const char *slow[] = {"--replicate-interval-ms", "60000", NULL};
    char *probe[] = {"probe"};
    bool out[1];
    struct rpc_status st;
    struct node_info ni = {0};
    cluster_node_start(c, i, c->node[i].port, slow);
    for (int t = 0; t < 200 && ni.messages == 0; t++) {
        t_keys(c->router[0].ch, "Add", "d", probe, 1, out, &st);
        t_node_info(c->node[i].ch, &ni);
        if (!ni.messages)
            harness_sleep_ms(50);
    }
    CHECK(ni.messages > 0, "the router does not reach restarted copy %d", i);
    CHECK(cluster_wait_reads(c, i, 20000), "restarted copy %d does not answer reads", i);
}

static void case_differ(void)
{
    struct cluster c;
    struct rpc_status st;
    enum { N = 3000, SHARDS = 2 };
    cluster_init(&c, "router-export-differ", "fsync");
    c.router_flags = SMALL_BUDGET;
    cluster_run_copies(&c, 1, 3, "write_quorum = 2\nread_quorum = 2\n", 1);
    struct node_proc *rp = &c.router[0];

    /* Shards of ~38 MB: one copy of one held whole does not fit the
     * budget (24 MiB), nor does the router's RSS grow by a third of the
     * bundle. */
    CHECK(t_create_sharded(rp->ch, "d", 64000000, 0.01, 0, SHARDS, NULL, &st) == 0,
          "create d: %s", st.message);
    char **all = keys_make("all", 0, N), **miss[3];
    keys_call(rp->ch, "Add", "d", all, N, 1000, NULL);
    /* Copy i misses the keys miss[i], which the two others acknowledge. */
    for (int i = 0; i < 3; i++) {
        char prefix[16];
        snprintf(prefix, sizeof prefix, "miss%d", i);
        miss[i] = keys_make(prefix, 0, N);
        node_stop(&c.node[i], SIGKILL);
        keys_call(rp->ch, "Add", "d", miss[i], N, 1000, NULL);
        copy_back(&c, i);
    }
    for (int i = 0; i < 3; i++) {
        struct bytebuf one;
        int ci[] = {i};
        copies_bundle(&c, "d", SHARDS, ci, 1, &one);
        size_t lack = N - bundle_count(&one, miss[i], N);
        CHECK(lack > N / 2, "copy %d lacks only %zu of the %d keys it missed", i, lack, N);
        for (int j = 0; j < 3; j++)
            CHECK(j == i || bundle_count(&one, miss[j], N) == N, "copy %d lacks keys of "
                  "miss%d", i, j);
        printf("copy %d (%s) lacks %zu of the %d keys it missed\n", i, c.node[i].addr, lack,
               N);
        bytebuf_deinit(&one);
    }

    /* The router reads copies 0 and 1 (R = 2, in the group's order): every
     * key is in its export, which is byte for byte the two copies merged
     * whole. */
    struct bytebuf want;
    int first2[] = {0, 1};
    copies_bundle(&c, "d", SHARDS, first2, 2, &want);
    size_t len;
    uint8_t *buf = export_watched(rp, "d", 3, &len);
    CHECK(len == want.len && !memcmp(buf, want.p, len), "the export (%zu bytes) is not "
          "the copies merged whole (%zu bytes)", len, want.len);
    bundle_check(rp->ch, "d", buf, len, SHARDS, all, N);
    for (int i = 0; i < 3; i++)
        bundle_check(rp->ch, "d", buf, len, SHARDS, miss[i], N);
    printf("the export is byte for byte copies 0 and 1 merged whole; every key is in it\n");
    free(buf);
    bytebuf_deinit(&want);

    /* A client that goes away inside the first shard: the router ends the
     * Export and its two node streams at once (only its log says so; its
     * handler would otherwise wait for the nodes' deadline). */
    struct rpc_channel *slow = rpc_channel_create_window(rp->addr, 0, 1u << 20);
    CHECK(slow, "channel");
    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    rq.filter = "d";
    rq.chunk_size = 65536;
    export_client_goes_away(slow, &rq, rp);
    struct rpc_cstream *cs;
    grpc_slice sl;

    /* Copy 0 killed while the client holds the Export in the first shard
     * (its 64 KiB chunks, a 1 MiB window: far from the shard's end): the
     * Export fails UNAVAILABLE naming it, never OK from one copy. */
    cs = rpc_cstream_open(slow, "/bloomgrid.v1.BloomGrid/Export", EXPORT_DEADLINE_MS);
    CHECK(cs && rpc_cstream_write_msg(cs, &rq.base) == 0 &&
          rpc_cstream_close_send(cs) == 0 && rpc_cstream_read(cs, &sl) == 1,
          "the first chunk of an Export");
    grpc_slice_unref(sl);
    char victim[64];
    snprintf(victim, sizeof victim, "%s", c.node[0].addr);
    node_stop(&c.node[0], SIGKILL);
    uint64_t got = 65536;
    while (rpc_cstream_read(cs, &sl) == 1) {
        got += GRPC_SLICE_LENGTH(sl);
        grpc_slice_unref(sl);
    }
    int rc = rpc_cstream_finish(cs, &st);
    printf("copy 0 killed: the Export ended after ~%" PRIu64 " bytes: %s %s\n", got,
           rpc_status_name(st.code), st.message);
    CHECK(rc < 0 && st.code == GRPC_STATUS_UNAVAILABLE && strstr(st.message, victim) &&
          strstr(st.message, "shard 0"), "Export with copy 0 killed in it: %s %s",
          rpc_status_name(st.code), st.message);
    rpc_channel_destroy(slow);
    for (int i = 0; i < 3; i++)
        keys_free(miss[i], N);
    keys_free(all, N);
    cluster_stop(&c);
}

/* The index of the node at addr. */
static int node_of(const struct cluster *c, const char *addr)
{
    for (int i = 0; i < c->nnodes; i++)
        if (!strcmp(c->node[i].addr, addr))
            return i;
    CHECK(0, "no node at %s", addr);
    return -1;
}

/* Does dir hold a file whose name starts with prefix? */
static bool dir_has(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    bool found = false;
    CHECK(d, "cannot open %s", dir);
    while (!found && (e = readdir(d)))
        found = !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return found;
}

static void case_killed(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *flags[] = {"--stream-idle-ms", "3000", NULL};
    cluster_start_flags(&c, "router-export-killed", 3, 1, "none", flags);
    struct node_proc *rp = &c.router[0];
    CHECK(t_create_sharded(rp->ch, "big", 100000000, 0.01, 0, 16, NULL, &st) == 0,
          "create big: %s", st.message);
    Bloomgrid__V1__FilterInfo *fi = NULL;
    CHECK(t_get(rp->ch, "big", &fi, &st) == 0 && fi->n_shard_info == 16, "GetFilter: %s",
          st.message);

    /* The node killed: the one of the last shard not on shard 0's node, so
     * that the bundle's first shard goes out before the failure; first:
     * the first shard it holds. */
    int n0 = node_of(&c, fi->shard_info[0]->node), last = -1, first = 0;
    for (int s = 15; s > 0 && last < 0; s--)
        if (node_of(&c, fi->shard_info[s]->node) != n0)
            last = node_of(&c, fi->shard_info[s]->node);
    CHECK(last >= 0, "every shard is on one node");
    while (node_of(&c, fi->shard_info[first]->node) != last)
        first++;
    char victim[64];
    snprintf(victim, sizeof victim, "%s", c.node[last].addr);

    /* The clients that stop reading below keep a 1 MiB receive window
     * (gRPC's automatic window growth would let one take in the whole
     * bundle on its side meanwhile). */
    struct rpc_channel *slow = rpc_channel_create_window(rp->addr, 0, 1u << 20);
    CHECK(slow, "channel");

    /* A client that goes away after its first chunk: the router gives up
     * the node's stream at once (its handler would otherwise wait for the
     * node's deadline, ten minutes), which only its log says. */
    Bloomgrid__V1__ExportRequest rq0 = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    rq0.filter = "big";
    export_client_goes_away(slow, &rq0, rp);
    struct rpc_cstream *cs0;
    grpc_slice sl0;

    /* A client that takes one chunk and then none for longer than
     * stream_idle_ms: the call ends, naming it, and the router lets the
     * node's stream go too. */
    cs0 = rpc_cstream_open(slow, "/bloomgrid.v1.BloomGrid/Export", EXPORT_DEADLINE_MS);
    CHECK(cs0 && rpc_cstream_write_msg(cs0, &rq0.base) == 0 &&
          rpc_cstream_close_send(cs0) == 0 && rpc_cstream_read(cs0, &sl0) == 1,
          "the first chunk of an Export");
    grpc_slice_unref(sl0);
    harness_sleep_ms(6000);
    while (rpc_cstream_read(cs0, &sl0) == 1)
        grpc_slice_unref(sl0);
    CHECK(rpc_cstream_finish(cs0, &st) < 0 && st.code == GRPC_STATUS_RESOURCE_EXHAUSTED &&
          strstr(st.message, "stream_idle_ms"), "an Export whose client stopped reading: "
          "%s %s", rpc_status_name(st.code), st.message);
    CHECK(harness_log_count(rp->log, "the client went away") == 2,
          "the router did not end an Export whose client stopped reading");
    printf("an Export whose client stopped reading: %s\n", st.message);

    /* The client takes one chunk and waits while that node is killed (the
     * router, held by the client, is far from its shards' turn). */
    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    rq.filter = "big";
    rq.chunk_size = 65536;
    struct rpc_cstream *cs = rpc_cstream_open(slow, "/bloomgrid.v1.BloomGrid/Export",
                                              EXPORT_DEADLINE_MS);
    CHECK(cs && rpc_cstream_write_msg(cs, &rq.base) == 0 &&
          rpc_cstream_close_send(cs) == 0, "send ExportRequest");
    grpc_slice sl;
    uint64_t got = 0;
    bool said_total = false;
    CHECK(rpc_cstream_read(cs, &sl) == 1, "no first chunk");
    for (;;) {
        Bloomgrid__V1__FileChunk *fc = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        CHECK(fc && fc->offset == got, "chunk at %" PRIu64, got);
        got += fc->data.len;
        said_total |= fc->total_size != 0;
        bloomgrid__v1__file_chunk__free_unpacked(fc, NULL);
        grpc_slice_unref(sl);
        if (c.node[last].pid > 0) {
            node_stop(&c.node[last], SIGKILL);
            printf("node %d (%s, shards %d..) killed after %" PRIu64 " bytes\n", last,
                   victim, first, got);
        }
        if (rpc_cstream_read(cs, &sl) != 1)
            break;
    }
    int rc = rpc_cstream_finish(cs, &st);
    printf("the Export ended after %" PRIu64 " bytes: %s %s\n", got,
           rpc_status_name(st.code), st.message);
    CHECK(rc < 0 && st.code == GRPC_STATUS_UNAVAILABLE, "Export with a node killed: %s %s",
          rpc_status_name(st.code), st.message);
    CHECK(strstr(st.message, "shard") && strstr(st.message, victim),
          "the status names neither the shard nor the node: %s", st.message);
    CHECK(!said_total, "a chunk of a cut-short Export said the bundle's size");

    /* The CLI, with that node down: shards 0..first-1 go out, then the call
     * fails; no file is left. */
    char path[700], out[700], err[700];
    snprintf(path, sizeof path, "%s/big.bundle", c.dir);
    snprintf(out, sizeof out, "%s/cli.out", c.dir);
    snprintf(err, sizeof err, "%s/cli.err", c.dir);
    const char *argv[] = {cli_bin, "--server", rp->addr, "export", "big", path, NULL};
    rc = harness_run(argv, out, err, NULL, EXPORT_DEADLINE_MS);
    char msg[1024] = "";
    FILE *f = fopen(err, "r");
    if (f) {
        size_t n = fread(msg, 1, sizeof msg - 1, f);
        msg[n] = '\0';
        fclose(f);
    }
    printf("bloomgrid export (shard %d first on the node down): exit %d: %s", first, rc,
           msg);
    CHECK(rc != 0, "bloomgrid export succeeded with a node down");
    CHECK(strstr(msg, "UNAVAILABLE") && strstr(msg, victim),
          "the CLI does not say why: %s", msg);
    CHECK(access(path, F_OK) != 0, "bloomgrid export left %s", path);
    CHECK(!dir_has(c.dir, "big.bundle"), "bloomgrid export left a temp file in %s", c.dir);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    rpc_channel_destroy(slow);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN CLI_BIN stream|quorum|killed|differ\n",
                argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    cli_bin = argv[3];
    grpc_init();
    const char *c = argv[4];
    if (!strcmp(c, "stream"))
        case_stream();
    else if (!strcmp(c, "quorum"))
        case_quorum();
    else if (!strcmp(c, "killed"))
        case_killed();
    else if (!strcmp(c, "differ"))
        case_differ();
    else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
