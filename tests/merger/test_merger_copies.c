/* Integration tests of bloomgrid-merger over shard groups of copies
 * (docs/MERGER.md, "A round"): datacenter dc1 is one group of three copies
 * (W = 2, R = 2) behind a router, dc2 one stand-alone node named by its
 * address.  Anti-entropy between the copies runs once a minute only, so
 * what a copy holds is what it took and what the merger pushed.
 *
 * usage: test_merger_copies NODE_BIN ROUTER_BIN MERGER_BIN TEST FIXTURES
 *                           SLOW_FSYNC_LIB
 *   quorum   keys acknowledged with copy 0 down (so on copies 1 and 2),
 *            then copy 0 back and copy 1 down during a round: the round
 *            pulls copies 0 and 2 (copy 0, asked first, lacks the keys)
 *            and the global snapshot and dc2 hold every key; with copies 1
 *            and 2 down the round covers nothing and says so, and loses
 *            nothing; copy 0 wiped and re-created SYNCING: pulled, not
 *            counted, two others pulled instead
 *   streams  a shard of more than 64 MiB that copy 2 lacks entirely (it was
 *            down while 60 000 keys were acknowledged) is pushed to it in
 *            two streams, and the merger is killed (SIGKILL) after the
 *            first (copy 2 then holds some keys, not all); with any one
 *            copy down no acknowledged key reads "no" through the router;
 *            the next round completes copy 2 and dc2
 *   migrate  a sidecar in the first merger's format (FIXTURES/
 *            shard-v1.state, its cursors filled with the nodes' current
 *            ones, which would make an incremental pull send nothing) is
 *            read as no cursor: keys added since the saved snapshot reach
 *            the other datacenter, and the sidecar is rewritten in the
 *            current format; one of an unknown format is ignored the same
 *            way
 *   joint    in a joint phase (copies_next names a new copy) a round's
 *            pushes reach the new copy too, as every write does
 *   resync   copy 0 wiped and started again (it re-syncs: refilling, its
 *            shards SYNCING until it has pulled them from copies 1 and 2):
 *            rounds while it re-syncs push it no page (on a merger that
 *            pushed it, a round pushed it every page of every shard) and
 *            say they left its pushes for later; once it serves, every key
 *            the merger had merged from dc2 before reads "maybe" from copy
 *            0 alone, and after one more round so does every key merged
 *            while it re-synced
 *   resync_last  the same for copy 2, which R copies before it leave
 *            unasked: once it serves, the round pulls it and pushes it no
 *            page (it pushed it every page when its acked round had been
 *            dropped), and the next round leaves it unasked again
 *   torn     the merger killed after saving a shard's snapshot and before
 *            its sidecar (the sidecar's fsync held by SLOW_FSYNC_LIB): the
 *            old sidecar's complete copies describe the old snapshot, so
 *            the next round still pushes the other datacenter the keys the
 *            new snapshot holds
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "bf_file.h"
#include "cluster.h"
#include "merger_once.h"
#include "node_client.h"

static const char *merger_bin, *fixtures, *slow_fsync;
static char mcfg[700], state_dir[700];
/* Anti-entropy out of the way (its slowest pace). */
static const char *const slow_ae[] = {"--replicate-interval-ms", "60000", NULL};

/* Write the merger's config and sources: dc1 the cluster's topology, dc2
 * the address of node d. */
static void merger_setup(const char *dir, const char *dc1, const char *dc2)
{
    char sources[700];
    FILE *f;
    snprintf(sources, sizeof sources, "%s/sources.ini", dir);
    snprintf(mcfg, sizeof mcfg, "%s/merger.ini", dir);
    snprintf(state_dir, sizeof state_dir, "%s/merger-state", dir);
    CHECK((f = fopen(sources, "w")), "sources");
    fprintf(f, "[filter f]\ndatacenter = dc1 %s\ndatacenter = dc2 %s\n", dc1, dc2);
    fclose(f);
    CHECK((f = fopen(mcfg, "w")), "merger config");
    fprintf(f, "[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s\nsources = %s\n"
            "interval_s = 3600\nnode_timeout_ms = 5000\nlog_level = debug\n",
            state_dir, sources);
    fclose(f);
}

static void round_once(const char *dir, struct round_out *o, const char *env,
                       const char *val)
{
    const char *pairs[] = {env, val, NULL};
    merger_once_run(merger_bin, mcfg, dir, o, env ? pairs : NULL, 0, NULL);
}

/* Start copy i again on its port and data and wait until it answers reads
 * (a restarted copy is held until it has checked its epoch with two
 * peers: docs/REPLICATION.md). */
static void copy_start(struct cluster *c, int i)
{
    cluster_node_start(c, i, c->node[i].port, slow_ae);
    CHECK(cluster_wait_reads(c, i, 20000), "copy %d does not answer reads", i);
}

/* A router over dc2's node d (a node reads sharded filters through one). */
static void start_dc2_router(struct cluster *c, struct node_proc *d,
                             struct node_proc *r)
{
    char topo[700], log[700], text[256];
    snprintf(topo, sizeof topo, "%s/dc2.ini", c->dir);
    snprintf(log, sizeof log, "%s/dc2-router.log", c->dir);
    snprintf(text, sizeof text, "version = 1\n[group g0]\ncopies = %s\n", d->addr);
    FILE *f = fopen(topo, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", topo);
    router_start(r, log, topo, NULL);
    CHECK(node_wait_health(r, true, 10000), "dc2 router");
}

/* Three copies reading the topology, W = 2, R = 2, and a router; the
 * nodes restarted with anti-entropy slowed down.  d: dc2's node. */
static void start_dcs(struct cluster *c, const char *tag, struct node_proc *d)
{
    char dir[700];
    cluster_start_copies(c, tag, 1, 3, "write_quorum = 2\nread_quorum = 2\n", 0);
    for (int i = 0; i < 3; i++)
        cluster_node_restart(c, i, SIGTERM, slow_ae);
    for (int i = 0; i < 3; i++)
        CHECK(cluster_wait_reads(c, i, 20000), "copy %d does not answer reads", i);
    cluster_router_start(c, 0, NULL);
    snprintf(dir, sizeof dir, "%s/dc2", c->dir);
    node_start(d, dir, NULL);
    CHECK(node_wait_health(d, true, 20000), "dc2 node not serving");
    merger_setup(c->dir, c->topo, d->addr);
}

/* Keys of k present in the saved global snapshot (shards files; none is
 * saved before a round changed something). */
static size_t snapshot_has(char **k, size_t n, uint32_t shards)
{
    struct bf *g[8];
    char path[800], err[BF_ERRLEN];
    size_t have = 0;
    CHECK(shards <= 8, "%u shards", shards);
    for (uint32_t i = 0; i < shards; i++) {
        snprintf(path, sizeof path, "%s/f/shard-%04u.bf", state_dir, i);
        if (access(path, F_OK) < 0) {
            for (uint32_t j = 0; j < i; j++)
                bf_destroy(g[j]);
            return 0;
        }
        CHECK((g[i] = bf_file_load(path, err, NULL)), "%s: %s", path, err);
    }
    for (size_t j = 0; j < n; j++) {
        struct bf_hash h = bf_hash_key(g[0], k[j], strlen(k[j]));
        have += bf_may_contain_hash(g[bf_hash_shard(h, shards)], h);
    }
    for (uint32_t i = 0; i < shards; i++)
        bf_destroy(g[i]);
    return have;
}

/* Does the report list, for every shard, dc1's group pull as expected
 * ("covered: A=pulled B=failed C=pulled" with the copies' addresses)? */
static void check_pulls(struct cluster *c, const struct round_out *o, int shards,
                        const char *cover, const char *s0, const char *s1,
                        const char *s2)
{
    for (int i = 0; i < shards; i++) {
        char want[600];
        snprintf(want, sizeof want,
                 "pull f shard %d dc1 group g0 read_quorum 2 %s: %s=%s %s=%s %s=%s\n",
                 i, cover, c->node[0].addr, s0, c->node[1].addr, s1,
                 c->node[2].addr, s2);
        CHECK(strstr(o->text, want), "report lacks \"%s\":\n%s", want, o->text);
    }
}

#define QK 2000
#define QS 2

static void test_quorum(void)
{
    struct cluster c;
    struct node_proc d, d_router;
    struct round_out o;
    struct rpc_status st;
    start_dcs(&c, "merger-copies-quorum", &d);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, QS, NULL, &st) == 0,
          "create: %s", st.message);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0, "first round:\n%s", o.text);
    start_dc2_router(&c, &d, &d_router);
    check_pulls(&c, &o, QS, "covered", "pulled", "pulled", "not-asked");

    /* Acknowledged by copies 1 and 2 only. */
    char **k = keys_make("q", 0, QK);
    node_stop(&c.node[0], SIGKILL);
    keys_call(c.router[0].ch, "Add", "f", k, QK, 500, NULL);
    copy_start(&c, 0);
    node_stop(&c.node[1], SIGKILL);
    /* Copy 0 answers first and lacks every key: a round that took it alone
     * would not hold them. */
    round_once(c.dir, &o, NULL, NULL);
    check_pulls(&c, &o, QS, "covered", "pulled", "failed", "pulled");
    size_t in_snap = snapshot_has(k, QK, QS);
    CHECK(in_snap == QK, "the global snapshot holds %zu of %d acknowledged keys",
          in_snap, QK);
    size_t in_dc2 = keys_present(d_router.ch, "f", k, QK, NULL);
    CHECK(in_dc2 == QK, "dc2 holds %zu of %d acknowledged keys", in_dc2, QK);
    printf("keys acknowledged by copies 1 and 2, copy 1 down: all %d merged\n", QK);

    /* One copy left: short of the read quorum, reported, nothing lost. */
    node_stop(&c.node[2], SIGKILL);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 1 && strstr(o.text, " uncovered 2 ") &&
          strstr(o.text, "this round does not cover dc1"),
          "round with one copy up:\n%s", o.text);
    check_pulls(&c, &o, QS, "not-covered", "pulled", "failed", "failed");
    CHECK(snapshot_has(k, QK, QS) == QK &&
              keys_present(d_router.ch, "f", k, QK, NULL) == QK,
          "keys lost by a round short of its quorum");

    /* Copy 0 loses its disk: the round finds it without the shards (a
     * failed pull) and creates them, SYNCING; the next one pulls it but
     * counts copies 1 and 2. */
    cluster_node_start(&c, 1, c.node[1].port, slow_ae);
    copy_start(&c, 2);
    CHECK(cluster_wait_reads(&c, 1, 20000), "copy 1 does not answer reads");
    node_stop(&c.node[0], SIGKILL);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c.node_dir[0]);
    CHECK(system(cmd) == 0, "%s", cmd);
    cluster_node_start(&c, 0, c.node[0].port, slow_ae);
    round_once(c.dir, &o, NULL, NULL);
    check_pulls(&c, &o, QS, "covered", "failed", "pulled", "pulled");
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0, "round with copy 0 syncing:\n%s", o.text);
    check_pulls(&c, &o, QS, "covered", "syncing", "pulled", "pulled");
    keys_free(k, QK);
    node_stop(&d_router, SIGTERM);
    node_stop(&d, SIGTERM);
    cluster_stop(&c);
}

/* Every key of k is "maybe" through the router.  A call that fails (a copy
 * just restarted, not yet reached) is asked again: only a "no" fails. */
static void all_maybe(struct cluster *c, char **k, size_t n, const char *when)
{
    static bool out[5000];
    struct rpc_status st;
    for (size_t i = 0; i < n; i += 5000) {
        size_t b = n - i < 5000 ? n - i : 5000;
        int tries = 0, rc;
        while ((rc = t_keys(c->router[0].ch, "MayContain", "f", k + i, b, out, &st)) &&
               ++tries < 100)
            harness_sleep_ms(100);
        CHECK(rc == 0, "%s: %d %s", when, st.code, st.message);
        for (size_t j = 0; j < b; j++)
            CHECK(out[j], "%s: acknowledged key %s reads \"no\"", when, k[i + j]);
    }
    printf("%s: every acknowledged key is \"maybe\"\n", when);
}

#define SK 60000

static void test_streams(void)
{
    struct cluster c;
    struct node_proc d, view;
    struct round_out o;
    struct rpc_status st;
    start_dcs(&c, "merger-copies-streams", &d);
    /* One shard of about 72 MB: more than one push stream of 64 MiB. */
    CHECK(t_create_sharded(c.router[0].ch, "f", 60000000, 0.01, 0, 1, NULL, &st) == 0,
          "create: %s", st.message);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0, "first round:\n%s", o.text);

    char **k = keys_make("s", 0, SK);
    node_stop(&c.node[2], SIGKILL);
    keys_call(c.router[0].ch, "Add", "f", k, SK, 5000, NULL);
    copy_start(&c, 2);
    /* Copies 0 and 1 hold every page whole and get nothing; copy 2 is
     * pushed first, and the merger dies after its first stream. */
    round_once(c.dir, &o, "BLOOMGRID_MERGER_TEST_KILL_AFTER_STREAMS", "1");
    CHECK(o.status == 128 + SIGKILL, "merger not killed mid-push: %d\n%s", o.status,
          o.text);
    cluster_view_start(&c, 2, &view);
    size_t on2 = keys_present(view.ch, "f", k, SK, NULL);
    CHECK(on2 > 0 && on2 < SK, "copy 2 holds %zu of %d keys: not a push cut "
          "between its streams", on2, SK);
    printf("copy 2 holds %zu of %d keys after the first stream\n", on2, SK);
    for (int i = 0; i < 3; i++) {
        char when[64];
        node_stop(&c.node[i], SIGKILL);
        snprintf(when, sizeof when, "copy %d down", i);
        all_maybe(&c, k, SK, when);
        copy_start(&c, i);
    }

    /* The next round completes copy 2 and dc2. */
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0, "round after the kill:\n%s", o.text);
    node_stop(&view, SIGTERM);
    cluster_view_start(&c, 2, &view);
    on2 = keys_present(view.ch, "f", k, SK, NULL);
    CHECK(on2 == SK, "copy 2 holds %zu of %d keys after a complete round", on2, SK);
    size_t in_dc2 = keys_present(d.ch, "f", k, SK, NULL);
    CHECK(in_dc2 == SK, "dc2 holds %zu of %d keys", in_dc2, SK);
    node_stop(&view, SIGTERM);
    keys_free(k, SK);
    node_stop(&d, SIGTERM);
    cluster_stop(&c);
}

/* Replace every "@NAME@" of text (in place, into out) by its value. */
static void fill(char *out, size_t len, const char *text, const char *const *subst)
{
    size_t o = 0;
    while (*text && o + 1 < len) {
        bool done = false;
        for (int i = 0; subst[i] && !done; i += 2) {
            size_t n = strlen(subst[i]);
            if (!strncmp(text, subst[i], n)) {
                o += (size_t)snprintf(out + o, len - o, "%s", subst[i + 1]);
                text += n;
                done = true;
            }
        }
        if (!done)
            out[o++] = *text++;
    }
    out[o < len ? o : len - 1] = 0;
}

/* The node's current pull cursor of shard 0 of f: epoch, version, store
 * version (a pull by the test: other pullers still see every change). */
static void cursor_of(struct node_proc *n, char out[3][32])
{
    struct node_client_pull_end end;
    struct rpc_status st;
    CHECK(node_client_pull(n->ch, "f", 0, 0, 0, NULL, NULL, &end, TIMEOUT_MS, &st) == 0,
          "pull from %s: %s", n->addr, st.message);
    snprintf(out[0], 32, "%llu", (unsigned long long)end.epoch);
    snprintf(out[1], 32, "%llu", (unsigned long long)end.version);
    snprintf(out[2], 32, "%llu", (unsigned long long)end.store_version);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0, "write %s", path);
}

/* Two stand-alone nodes a and b (datacenters a and b) with an unsharded
 * filter f holding k on a, merged once. */
static void start_pair(char *tdir, size_t len, const char *tag, struct node_proc *a,
                       struct node_proc *b, char **k, size_t n)
{
    char da[600], db[600], sources[700], text[600];
    struct rpc_status st;
    struct round_out o;
    const char *fast[] = {"--durability", "none", NULL};

    harness_tmpdir(tdir, len, tag);
    snprintf(da, sizeof da, "%s/a", tdir);
    snprintf(db, sizeof db, "%s/b", tdir);
    node_start(a, da, fast);
    node_start(b, db, fast);
    CHECK(node_wait_health(a, true, 20000) && node_wait_health(b, true, 20000),
          "nodes not serving");
    CHECK(t_create(a->ch, "f", 100000, 0.01, 1, &st) == 0, "create: %s", st.message);
    keys_call(a->ch, "Add", "f", k, n, 1000, NULL);
    merger_setup(tdir, a->addr, b->addr);
    snprintf(sources, sizeof sources, "%s/sources.ini", tdir);
    snprintf(text, sizeof text, "[filter f]\ndatacenter = a %s\ndatacenter = b %s\n",
             a->addr, b->addr);
    write_file(sources, text);
    round_once(tdir, &o, NULL, NULL);
    CHECK(o.status == 0 && keys_present(b->ch, "f", k, n, NULL) == n,
          "first round:\n%s", o.text);
}

static void test_torn(void)
{
    char tdir[512], gate[600], held[700];
    struct node_proc a, b;
    struct round_out o;
    char **k1 = keys_make("before", 0, 2000), **k2 = keys_make("after", 0, 2000);
    start_pair(tdir, sizeof tdir, "merger-copies-torn", &a, &b, k1, 2000);

    /* The round saves the snapshot holding k2, then stops in the
     * sidecar's fsync and is killed there. */
    keys_call(a.ch, "Add", "f", k2, 2000, 1000, NULL);
    snprintf(gate, sizeof gate, "%s/gate", tdir);
    snprintf(held, sizeof held, "%s.held", gate);
    write_file(gate, "");
    const char *env[] = {"LD_PRELOAD", slow_fsync, "SLOW_FSYNC_GATE", gate,
                         "SLOW_FSYNC_MATCH", ".state",
                         "ASAN_OPTIONS", "verify_asan_link_order=0", NULL};
    merger_once_run(merger_bin, mcfg, tdir, &o, env, 0, held);
    CHECK(o.status == 128 + SIGKILL, "merger not killed in the sidecar's fsync: %d",
          o.status);
    CHECK(snapshot_has(k2, 2000, 1) == 2000, "the snapshot was not saved before "
          "the kill");
    unlink(gate);
    round_once(tdir, &o, NULL, NULL);
    CHECK(o.status == 0, "round after the kill:\n%s", o.text);
    size_t on_b = keys_present(b.ch, "f", k2, 2000, NULL);
    CHECK(on_b == 2000, "b holds %zu of 2000 keys of the saved snapshot", on_b);
    printf("killed between snapshot and sidecar: the next round pushed every key\n");
    keys_free(k1, 2000);
    keys_free(k2, 2000);
    node_stop(&a, SIGTERM);
    node_stop(&b, SIGTERM);
}

static void test_migrate(void)
{
    char tdir[512], path[800], fixture[800], text[4096], out[4096];
    char ca[3][32], cb[3][32];
    struct node_proc a, b;
    struct round_out o;
    char **k1 = keys_make("before", 0, 2000), **k2 = keys_make("after", 0, 2000);
    start_pair(tdir, sizeof tdir, "merger-copies-migrate", &a, &b, k1, 2000);

    /* Keys the saved snapshot lacks, and a sidecar of the first format
     * whose per-datacenter cursors are the nodes' current ones: taken
     * for cursors, they would make the next pull send nothing. */
    keys_call(a.ch, "Add", "f", k2, 2000, 1000, NULL);
    cursor_of(&a, ca);
    cursor_of(&b, cb);
    snprintf(fixture, sizeof fixture, "%s/shard-v1.state", fixtures);
    FILE *f = fopen(fixture, "r");
    CHECK(f, "fixture %s", fixture);
    text[fread(text, 1, sizeof text - 1, f)] = 0;
    fclose(f);
    const char *subst[] = {"@EPOCH_A@", ca[0], "@VERSION_A@", ca[1], "@STORE_A@", ca[2],
                           "@EPOCH_B@", cb[0], "@VERSION_B@", cb[1], "@STORE_B@", cb[2],
                           "@ADDR_A@", a.addr, "@ADDR_B@", b.addr, NULL};
    fill(out, sizeof out, text, subst);
    snprintf(path, sizeof path, "%s/f/shard-0000.state", state_dir);
    write_file(path, out);
    round_once(tdir, &o, NULL, NULL);
    CHECK(o.status == 0, "round on the old sidecar:\n%s", o.text);
    size_t on_b = keys_present(b.ch, "f", k2, 2000, NULL);
    CHECK(on_b == 2000, "b holds %zu of 2000 keys added after the saved snapshot "
          "(an old cursor was trusted)", on_b);
    CHECK((f = fopen(path, "r")) && fgets(text, sizeof text, f), "read %s", path);
    fclose(f);
    CHECK(!strcmp(text, "bloomgrid-merger-state 2\n"), "sidecar rewritten as %s", text);
    printf("a sidecar of the first format: full pull, rewritten in format 2\n");

    /* A format this merger does not know: ignored, the same way. */
    char **k3 = keys_make("later", 0, 2000);
    keys_call(a.ch, "Add", "f", k3, 2000, 1000, NULL);
    cursor_of(&a, ca);
    snprintf(text, sizeof text, "bloomgrid-merger-state 9\nC a %s %s %s %s 1\n",
             a.addr, ca[0], ca[1], ca[2]);
    write_file(path, text);
    round_once(tdir, &o, NULL, NULL);
    CHECK(o.status == 0 && keys_present(b.ch, "f", k3, 2000, NULL) == 2000,
          "round on a sidecar of an unknown format:\n%s", o.text);
    keys_free(k1, 2000);
    keys_free(k2, 2000);
    keys_free(k3, 2000);
    node_stop(&a, SIGTERM);
    node_stop(&b, SIGTERM);
}

/* A joint phase (copies_next names node 3): the merger's pushes are writes
 * and reach node 3 too, not only through its next pull from the others. */
static void test_joint(void)
{
    struct cluster c;
    struct node_proc d, d_router, view = {0};
    struct round_out o;
    struct rpc_status st;
    char tmp[700];
    start_dcs(&c, "merger-copies-joint", &d);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, QS, NULL, &st) == 0,
          "create: %s", st.message);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0, "first round:\n%s", o.text);
    start_dc2_router(&c, &d, &d_router);

    /* Node 3 joins (its port known once it listened alone first), fills
     * its shards by anti-entropy, then runs with it slowed down. */
    c.node_topo = false;
    cluster_node_start(&c, 3, 0, NULL);
    node_stop(&c.node[3], SIGTERM);
    c.node_topo = true;
    snprintf(tmp, sizeof tmp, "%s.tmp", c.topo);
    FILE *f = fopen(tmp, "w");
    CHECK(f, "cannot write %s", tmp);
    fprintf(f, "version = 2\nwrite_quorum = 2\nread_quorum = 2\n[group g0]\n"
               "copies = %s %s %s\ncopies_next = %s %s %s\n", c.node[0].addr,
            c.node[1].addr, c.node[2].addr, c.node[0].addr, c.node[1].addr, c.node[3].addr);
    CHECK(fclose(f) == 0 && rename(tmp, c.topo) == 0, "cannot write %s", c.topo);
    c.topo_version = 2;
    for (int i = 0; i < 3; i++)
        CHECK(kill(c.node[i].pid, SIGHUP) == 0, "SIGHUP node %d", i);
    CHECK(kill(c.router[0].pid, SIGHUP) == 0, "SIGHUP router");
    cluster_node_start(&c, 3, c.node[3].port, NULL);
    CHECK(cluster_wait_reads(&c, 3, 60000), "node 3 does not report in sync");
    cluster_node_restart(&c, 3, SIGTERM, slow_ae);
    CHECK(cluster_wait_reads(&c, 3, 20000), "node 3 does not answer reads");

    /* Keys of dc2, merged into dc1 by one round. */
    char **k = keys_make("joint", 0, QK);
    keys_call(d_router.ch, "Add", "f", k, QK, 500, NULL);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0, "round in the joint phase:\n%s", o.text);
    cluster_view_start(&c, 3, &view);
    size_t on3 = keys_present(view.ch, "f", k, QK, NULL);
    node_stop(&view, SIGTERM);
    CHECK(on3 == QK, "node 3 (joining) holds %zu of %d keys the round pushed", on3, QK);
    printf("a round in the joint phase pushed into the joining copy\n");
    keys_free(k, QK);
    node_stop(&d_router, SIGTERM);
    node_stop(&d, SIGTERM);
    cluster_stop(&c);
}

#define RK 2000

/* The count of "pushes_later N" in a round's report. */
static unsigned pushes_later(const struct round_out *o)
{
    const char *p = strstr(o->text, " pushes_later ");
    return p ? (unsigned)strtoul(p + 14, NULL, 10) : 0;
}

/* The two datacenters with filter f (QS shards), its first round, and a
 * router over dc2's node. */
static void resync_start(struct cluster *c, const char *name, struct node_proc *d,
                         struct node_proc *d_router)
{
    struct round_out o;
    struct rpc_status st;
    start_dcs(c, name, d);
    CHECK(t_create_sharded(c->router[0].ch, "f", 100000, 0.01, 0, QS, NULL, &st) == 0,
          "create: %s", st.message);
    round_once(c->dir, &o, NULL, NULL);
    CHECK(o.status == 0, "first round:\n%s", o.text);
    start_dc2_router(c, d, d_router);
}

/* Copy i loses its disk and comes back empty, its own anti-entropy slowed
 * down so that rounds run while it re-syncs. */
static void copy_wipe(struct cluster *c, int i)
{
    char cmd[800];
    node_stop(&c->node[i], SIGKILL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->node_dir[i]);
    CHECK(system(cmd) == 0, "%s", cmd);
    cluster_node_start(c, i, c->node[i].port, slow_ae);
}

static void test_resync(void)
{
    struct cluster c;
    struct node_proc d, d_router, view;
    struct round_out o;
    resync_start(&c, "merger-copies-resync", &d, &d_router);

    /* Keys only dc2 took: dc1's copies get them from the merger alone. */
    char **k1 = keys_make("r1-", 0, RK), **k2 = keys_make("r2-", 0, RK);
    keys_call(d_router.ch, "Add", "f", k1, RK, 500, NULL);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && o.pages_pushed > 0, "round merging dc2's keys:\n%s",
          o.text);
    /* Every copy holds the snapshot: the next round pushes nothing. */
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && o.pages_pushed == 0 && pushes_later(&o) == 0,
          "quiet round:\n%s", o.text);

    /* Copy 0 loses its disk and comes back empty: it re-syncs (its own
     * anti-entropy slowed down, so that rounds run while it does). */
    copy_wipe(&c, 0);
    round_once(c.dir, &o, NULL, NULL);
    /* Its pulls fail (NOT_FOUND: the cursors name shards it lost), the
     * only errors of the round. */
    CHECK(o.errors == QS, "round with copy 0 re-syncing:\n%s", o.text);
    check_pulls(&c, &o, QS, "covered", "failed", "pulled", "pulled");
    CHECK(o.pages_pushed == 0 && o.pushed == 0,
          "a round pushed copy 0 %llu pages while it re-syncs:\n%s",
          o.pages_pushed, o.text);
    CHECK(pushes_later(&o) == QS, "pushes left for later: %u, want %d:\n%s",
          pushes_later(&o), QS, o.text);
    for (int i = 0; i < QS; i++) {
        int state = t_shard_state(c.node[0].ch, "f", (uint32_t)i);
        CHECK(state == -1 || state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING,
              "copy 0 shard %d in state %d: not re-syncing", i, state);
    }
    /* Keys merged while it re-syncs reach copies 1 and 2, not copy 0. */
    keys_call(d_router.ch, "Add", "f", k2, RK, 500, NULL);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && o.pushed > 0 && pushes_later(&o) == QS,
          "round merging dc2's keys while copy 0 re-syncs:\n%s", o.text);
    CHECK(!strstr(o.text, "=syncing") || strstr(o.text, "not pushed until"),
          "copy 0 pushed while SYNCING:\n%s", o.text);
    printf("while copy 0 re-syncs: 2 rounds, 0 pages pushed to it, %u pushes "
           "left for later each\n", pushes_later(&o));

    /* Copy 0 re-syncs at its usual pace: once it serves, it holds every
     * key the merger had merged before (its full pulls from copies 1 and
     * 2, which the merger pushed them to). */
    node_stop(&c.node[0], SIGTERM);
    cluster_node_start(&c, 0, c.node[0].port, NULL);
    CHECK(cluster_wait_reads(&c, 0, 60000), "copy 0 does not leave SYNCING");
    cluster_view_start(&c, 0, &view);
    size_t on0 = keys_present(view.ch, "f", k1, RK, NULL);
    CHECK(on0 == RK, "copy 0 serves with %zu of %d merged keys", on0, RK);
    on0 = keys_present(view.ch, "f", k2, RK, NULL);
    printf("copy 0 serves: %d of %d keys merged before, %zu of %d merged "
           "while it re-synced\n", RK, RK, on0, RK);

    /* The round after pushes it what it may lack, and leaves nothing. */
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && pushes_later(&o) == 0,
          "round after copy 0 re-synced:\n%s", o.text);
    node_stop(&view, SIGTERM);
    cluster_view_start(&c, 0, &view);
    on0 = keys_present(view.ch, "f", k1, RK, NULL);
    size_t on0b = keys_present(view.ch, "f", k2, RK, NULL);
    CHECK(on0 == RK && on0b == RK, "copy 0 holds %zu + %zu of %d + %d merged "
          "keys", on0, on0b, RK, RK);
    node_stop(&view, SIGTERM);
    keys_free(k1, RK);
    keys_free(k2, RK);
    node_stop(&d_router, SIGTERM);
    node_stop(&d, SIGTERM);
    cluster_stop(&c);
}

/* The copy that re-syncs is the last of its group: R copies before it
 * answer every round, so it is not pulled for the quorum.  Once it serves
 * again the merger pulls it anyway and pushes it only what it lacks (here
 * nothing: its full pulls from copies 0 and 1 brought every merged key),
 * not every page as a copy whose acked round was dropped. */
static void test_resync_last(void)
{
    struct cluster c;
    struct node_proc d, d_router, view;
    struct round_out o;
    resync_start(&c, "merger-copies-resync-last", &d, &d_router);
    char **k1 = keys_make("l1-", 0, RK);
    keys_call(d_router.ch, "Add", "f", k1, RK, 500, NULL);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && o.pages_pushed > 0, "round merging dc2's keys:\n%s",
          o.text);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && o.pages_pushed == 0, "quiet round:\n%s", o.text);
    check_pulls(&c, &o, QS, "covered", "pulled", "pulled", "not-asked");

    copy_wipe(&c, 2);
    /* Keys merged while it re-syncs: the round pushes them to copies 0 and
     * 1, leaves copy 2 for later and drops its acked round (it may have
     * lost the shard). */
    char **k2 = keys_make("l2-", 0, RK);
    keys_call(d_router.ch, "Add", "f", k2, RK, 500, NULL);
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && o.pushed > 0 && pushes_later(&o) == QS,
          "round with copy 2 re-syncing:\n%s", o.text);
    check_pulls(&c, &o, QS, "covered", "pulled", "pulled", "not-asked");
    /* Still re-syncing: not pulled either (no full pull of a SYNCING copy). */
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && o.pages_pushed == 0 && pushes_later(&o) == QS,
          "second round with copy 2 re-syncing:\n%s", o.text);
    check_pulls(&c, &o, QS, "covered", "pulled", "pulled", "not-asked");

    node_stop(&c.node[2], SIGTERM);
    cluster_node_start(&c, 2, c.node[2].port, NULL);
    CHECK(cluster_wait_reads(&c, 2, 60000), "copy 2 does not leave SYNCING");
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && pushes_later(&o) == 0,
          "round after copy 2 re-synced:\n%s", o.text);
    CHECK(o.pages_pushed == 0 && o.pushed == 0, "the round after copy 2 "
          "re-synced pushed %llu pages (every page of a copy whose acked round "
          "was dropped):\n%s", o.pages_pushed, o.text);
    check_pulls(&c, &o, QS, "covered", "pulled", "pulled", "pulled");
    cluster_view_start(&c, 2, &view);
    size_t on2 = keys_present(view.ch, "f", k1, RK, NULL);
    size_t on2b = keys_present(view.ch, "f", k2, RK, NULL);
    CHECK(on2 == RK && on2b == RK, "copy 2 holds %zu + %zu of %d + %d merged "
          "keys", on2, on2b, RK, RK);
    node_stop(&view, SIGTERM);
    /* Its acked round is known again: the next round asks only R copies. */
    round_once(c.dir, &o, NULL, NULL);
    CHECK(o.status == 0 && o.pages_pushed == 0, "round after:\n%s", o.text);
    check_pulls(&c, &o, QS, "covered", "pulled", "pulled", "not-asked");
    printf("copy 2 re-synced: pulled once it served, 0 pages pushed to it, "
           "%zu + %zu of %d + %d merged keys on it\n", on2, on2b, RK, RK);
    keys_free(k1, RK);
    keys_free(k2, RK);
    node_stop(&d_router, SIGTERM);
    node_stop(&d, SIGTERM);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    CHECK(argc == 7, "usage: test_merger_copies NODE_BIN ROUTER_BIN MERGER_BIN "
          "TEST FIXTURES SLOW_FSYNC_LIB");
    slow_fsync = argv[6];
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    merger_bin = argv[3];
    fixtures = argv[5];
    signal(SIGPIPE, SIG_IGN);
    grpc_init();
    if (!strcmp(argv[4], "quorum"))
        test_quorum();
    else if (!strcmp(argv[4], "streams"))
        test_streams();
    else if (!strcmp(argv[4], "migrate"))
        test_migrate();
    else if (!strcmp(argv[4], "torn"))
        test_torn();
    else if (!strcmp(argv[4], "joint"))
        test_joint();
    else if (!strcmp(argv[4], "resync"))
        test_resync();
    else if (!strcmp(argv[4], "resync_last"))
        test_resync_last();
    else
        CHECK(0, "unknown test %s", argv[4]);
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
