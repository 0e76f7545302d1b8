/* Router tests of shard groups of several copies (docs/REPLICATION.md):
 * one group of three copies behind a router, nodes reading the topology.
 *
 * usage: test_router_copies NODE_BIN ROUTER_BIN TEST
 *   quorum  W = 2, R = 2: every acknowledged key is "maybe" with any one
 *           copy stopped (SIGSTOP) or killed, and writes go on; with two
 *           copies down, Add is UNAVAILABLE naming the shard and both
 *           copies, and MayContain is UNAVAILABLE
 *   wipe    W = 2, R = 2: a copy killed, its data directory deleted and
 *           restarted empty, without pulls: it reports NOT_SERVING (it
 *           lacks its group's shards); then its shards re-created empty by
 *           hand, so they are SYNCING and the copy alone refuses reads: no
 *           acknowledged key reads "no" through the router
 *   w3r1    W = 3, R = 1: writes need every copy (one down: UNAVAILABLE),
 *           reads need one (two down: still answered); a copy takes public
 *           reads directly (W = N) but no public write
 *   single  N = 1 with the node reading the topology: public calls go to
 *           the node directly, and every acknowledged key is "maybe" after
 *           the node is killed and restarted on its data
 *   early   W = 2, R = 2, a router whose node timeout (60 s) is far past
 *           the client's deadline (10 s): with one copy stopped, writes
 *           are acknowledged once the two others have them, without
 *           waiting for the stopped one, and reads that ask it move on to
 *           the third copy after read_failover_ms; the keys are "maybe"
 *           once it is back
 *   export  W = 2, R = 2: a router's Export ORs R copies of each shard, so
 *           a copy that missed acknowledged writes (the first one asked)
 *           does not make the export miss them; with fewer than R copies
 *           up, Export is UNAVAILABLE
 *   metrics every copy's metrics show, per other copy, anti-entropy pages
 *           and the time of its last pull, which stops for a killed copy
 *   refuse  a copy refuses a public Add and MayContain, CreateFilter and
 *           DropFilter (FAILED_PRECONDITION naming the router rule), a
 *           counting filter cannot be created on the group, a node refuses router calls made under another
 *           topology version until it reads the same file, and a node
 *           refuses to start outside the topology or with durability none
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "bundle.h"
#include "topo.h"
#include "cluster.h"

#define NKEYS 2000
#define S 4        /* shards */

static const char *test_name;

/* Every key of k is "maybe" through the router, in one call. */
static void all_maybe(struct cluster *c, char **k, const char *when)
{
    static bool out[NKEYS];
    struct rpc_status st;
    CHECK(t_keys(c->router[0].ch, "MayContain", "f", k, NKEYS, out, &st) == 0,
          "%s: %d %s", when, st.code, st.message);
    for (int i = 0; i < NKEYS; i++)
        CHECK(out[i], "%s: acknowledged key %s reads \"no\"", when, k[i]);
    printf("%s: every acknowledged key is \"maybe\"\n", when);
}

/* Start node i again (port kept) and wait until the router's link reaches
 * it: its channel reconnects within the reconnect backoff (at most 1 s),
 * seen as a batch message arriving at the node.  Writing a probe key
 * again and again is safe. */
static void restart_reached_held(struct cluster *c, int i, const char *const *more,
                                bool reads)
{
    char *probe[] = {"probe"};
    bool out[1];
    struct rpc_status st;
    struct node_info ni = {0};
    cluster_node_start(c, i, c->node[i].port, more);
    for (int t = 0; t < 100 && ni.messages == 0; t++) {
        t_keys(c->router[0].ch, "Add", "f", probe, 1, out, &st);
        t_node_info(c->node[i].ch, &ni);
        if (!ni.messages)
            harness_sleep_ms(50);
    }
    CHECK(ni.messages > 0, "the router does not reach restarted node %d", i);
    /* A restarted copy answers reads once it has checked its epoch with
     * its peers (docs/REPLICATION.md, "Restored copies"). */
    CHECK(!reads || cluster_wait_reads(c, i, 20000),
          "restarted node %d does not answer reads", i);
}

static void restart_reached(struct cluster *c, int i, const char *const *more)
{
    restart_reached_held(c, i, more, true);
}

static void setup_flags(struct cluster *c, const char *tag, const char *head, char ***k,
                        const char *const *router_flags)
{
    struct rpc_status st;
    cluster_start_copies(c, tag, 1, 3, head, 0);
    cluster_router_start(c, 0, router_flags);
    CHECK(t_create_sharded(c->router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    for (int i = 0; i < 3; i++)
        CHECK(t_shard_count(c->node[i].ch, "f") == S, "copy %d holds every shard", i);
    *k = keys_make("k", 0, NKEYS);
    keys_call(c->router[0].ch, "Add", "f", *k, NKEYS, 500, NULL);
}

static void setup(struct cluster *c, const char *tag, const char *head, char ***k)
{
    setup_flags(c, tag, head, k, NULL);
}

static void test_early(void)
{
    struct cluster c;
    struct rpc_status st;
    char **k;
    bool out[64];
    const char *slow_timeout[] = {"--node-timeout-ms", "60000", NULL};
    setup_flags(&c, "router-copies-early", "write_quorum = 2\nread_quorum = 2\n", &k,
                slow_timeout);

    /* Each write touches every shard's group, the stopped copy included:
     * waiting for it would take the router's 60 s node timeout, past the
     * client's 10 s deadline. */
    harness_sigstop(c.node[1].pid);
    char **more = keys_make("early", 0, 64 * 8);
    for (int r = 0; r < 8; r++)
        CHECK(t_keys(c.router[0].ch, "Add", "f", more + 64 * r, 64, out, &st) == 0,
              "Add %d with one copy stopped: %d %s", r, st.code, st.message);
    printf("8 Adds acknowledged with copy 1 stopped\n");
    /* Reads that ask the stopped copy count it failed after
     * read_failover_ms (1 s) and ask the third: answered within the
     * client's deadline.  Three reads: the rotation makes at least two of
     * them ask copy 1. */
    for (int r = 0; r < 3; r++)
        all_maybe(&c, k, "copy 1 stopped (reads)");
    kill(c.node[1].pid, SIGCONT);
    char **all = malloc(NKEYS * sizeof *all);
    CHECK(all, "memory");
    for (int i = 0; i < NKEYS; i++)
        all[i] = i < 64 * 8 ? more[i] : k[i];
    all_maybe(&c, all, "copy 1 back");
    free(all);
    keys_free(more, 64 * 8);
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

static void test_quorum(void)
{
    struct cluster c;
    struct rpc_status st;
    char **k;
    bool out[64];
    setup(&c, "router-copies-quorum", "write_quorum = 2\nread_quorum = 2\n", &k);

    for (int i = 0; i < 3; i++) {
        char when[64];
        harness_sigstop(c.node[i].pid);
        snprintf(when, sizeof when, "copy %d stopped", i);
        all_maybe(&c, k, when);
        char **more = keys_make(when, 0, 64);
        CHECK(t_keys(c.router[0].ch, "Add", "f", more, 64, out, &st) == 0,
              "Add with one copy stopped: %s", st.message);
        kill(c.node[i].pid, SIGCONT);
        keys_free(more, 64);

        node_stop(&c.node[i], SIGKILL);
        snprintf(when, sizeof when, "copy %d killed", i);
        all_maybe(&c, k, when);
        restart_reached(&c, i, NULL);
    }

    /* Two copies down: below both quorums. */
    node_stop(&c.node[0], SIGKILL);
    node_stop(&c.node[2], SIGKILL);
    char **more = keys_make("late", 0, 64);
    CHECK(t_keys(c.router[0].ch, "Add", "f", more, 64, out, &st) ==
              GRPC_STATUS_UNAVAILABLE,
          "Add with two copies down: %d %s", st.code, st.message);
    printf("Add with two copies down: %s\n", st.message);
    CHECK(strstr(st.message, "1 of 3 copies acknowledged, write quorum 2") &&
              strstr(st.message, c.node[0].addr) && strstr(st.message, c.node[2].addr) &&
              strstr(st.message, "shard ") && strstr(st.message, "not acknowledged"),
          "Add names the shard and the failed copies: %s", st.message);
    CHECK(t_keys(c.router[0].ch, "MayContain", "f", k, 64, out, &st) ==
              GRPC_STATUS_UNAVAILABLE &&
              strstr(st.message, "1 of 3 copies answered, read quorum 2"),
          "MayContain with two copies down: %d %s", st.code, st.message);
    keys_free(more, 64);
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

static void test_wipe(void)
{
    struct cluster c;
    struct rpc_status st;
    char **k;
    setup(&c, "router-copies-wipe", NULL, &k);
    const int w = 1;
    uint8_t secret[BF_SECRET_LEN];
    uint64_t cap = 0;

    /* The filter's secret and shard capacity, from another copy. */
    Bloomgrid__V1__GetShardRequest gq = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    gq.filter = "f";
    gq.include_secret = true;
    gq.placement_known = TOPO_PLACEMENT_NEWEST;   /* a caller of this build */
    CHECK(rpc_call(c.node[0].ch, "/bloomgrid.v1.Internal/GetShard", &gq.base,
                   &bloomgrid__v1__internal_shard_info__descriptor,
                   (ProtobufCMessage **)&isi, TIMEOUT_MS, &st) == 0, "%s", st.message);
    CHECK(isi->secret.len == BF_SECRET_LEN, "secret");
    memcpy(secret, isi->secret.data, BF_SECRET_LEN);
    cap = isi->info->capacity;
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);

    /* The disk of copy w is lost; it comes back empty, without pulling
     * from the others for the length of the test. */
    char cmd[700];
    node_stop(&c.node[w], SIGKILL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c.node_dir[w]);
    CHECK(system(cmd) == 0, "%s", cmd);
    const char *slow[] = {"--replicate-interval-ms", "60000", NULL};
    restart_reached_held(&c, w, slow, false);
    all_maybe(&c, k, "copy restarted on an empty data directory");
    /* It lacks what its group holds: held, refilling, however slowly it
     * pulls (docs/REPLICATION.md, "Re-created copies"); its epoch check
     * (a few hundred ms) does not let it serve. */
    for (int i = 0; i < 30; i++) {
        CHECK(node_health(&c.node[w], "bloomgrid.v1.BloomGrid") == 2,
              "the wiped copy says it serves reads");
        harness_sleep_ms(50);
    }

    /* Its shards re-created empty: it now answers "no" by itself. */
    for (uint32_t s = 0; s < S; s++) {
        Bloomgrid__V1__CreateShardRequest cq = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        cq.filter = "f";
        cq.shard_index = s;
        cq.shard_count = S;
        cq.capacity = cap;
        cq.error_rate = 0.01;
        cq.secret.data = secret;
        cq.secret.len = BF_SECRET_LEN;
        CHECK(rpc_call(c.node[w].ch, "/bloomgrid.v1.Internal/CreateShard", &cq.base,
                       &bloomgrid__v1__internal_shard_info__descriptor, &resp,
                       TIMEOUT_MS, &st) == 0, "re-create shard %u: %s", s, st.message);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    /* Created by hand, not by a router's CreateFilter: SYNCING, so the
     * copy alone refuses reads instead of answering "no". */
    struct node_proc view = {0};
    static bool alone[NKEYS];
    cluster_view_start(&c, w, &view);
    CHECK(t_keys(view.ch, "MayContain", "f", k, NKEYS, alone, &st) ==
              GRPC_STATUS_UNAVAILABLE && strstr(st.message, "is syncing"),
          "the re-created copy alone: %d %s", st.code, st.message);
    printf("the wiped copy alone: %s\n", st.message);
    node_stop(&view, SIGTERM);
    for (int r = 0; r < 20; r++)
        all_maybe(&c, k, "wiped copy SYNCING");
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

static void test_w3r1(void)
{
    struct cluster c;
    struct rpc_status st;
    char **k;
    bool out[64];
    setup(&c, "router-copies-w3r1", "write_quorum = 3\nread_quorum = 1\n", &k);

    /* W = N: one copy alone has every acknowledged write, so it answers
     * public reads (of a one-shard filter: a node serves no other by its
     * public name); it still refuses public writes. */
    CHECK(t_create_sharded(c.router[0].ch, "one", 100000, 0.01, 0, 1, NULL, &st) == 0,
          "create one: %s", st.message);
    keys_call(c.router[0].ch, "Add", "one", k, NKEYS, 500, NULL);
    CHECK(keys_present(c.node[1].ch, "one", k, NKEYS, NULL) == NKEYS,
          "a copy read directly lacks keys");
    CHECK(t_keys(c.node[1].ch, "Add", "one", k, 1, out, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION, "public Add on a copy: %d %s", st.code,
          st.message);

    node_stop(&c.node[0], SIGKILL);
    char **more = keys_make("late", 0, 64);
    CHECK(t_keys(c.router[0].ch, "Add", "f", more, 64, out, &st) ==
              GRPC_STATUS_UNAVAILABLE &&
              strstr(st.message, "2 of 3 copies acknowledged, write quorum 3") &&
              strstr(st.message, c.node[0].addr),
          "Add with one copy down at W = 3: %d %s", st.code, st.message);
    node_stop(&c.node[1], SIGKILL);
    all_maybe(&c, k, "two copies down at R = 1");
    CHECK(t_keys(c.router[0].ch, "MayContain", "f", more, 64, out, &st) == 0,
          "reads at R = 1: %s", st.message);
    keys_free(more, 64);
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

static void test_single(void)
{
    struct cluster c;
    struct rpc_status st;
    bool out[64];
    cluster_start_copies(&c, "router-copies-single", 1, 1, NULL, 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    CHECK(t_create(c.node[0].ch, "direct", 10000, 0.01, 0, &st) == 0,
          "public create on a group of one: %s", st.message);
    char **k = keys_make("k", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k, NKEYS, 500, NULL);
    CHECK(t_keys(c.node[0].ch, "Add", "direct", k, 64, out, &st) == 0,
          "public Add on a group of one: %s", st.message);
    node_stop(&c.node[0], SIGKILL);
    restart_reached(&c, 0, NULL);
    all_maybe(&c, k, "one copy killed and restarted");
    CHECK(keys_present(c.node[0].ch, "direct", k, 64, NULL) == 64,
          "public reads after the restart");
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

/* Run the node with flags; its exit status and first line of output. */
static int node_run(const char *flags, char *line, size_t len)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", harness_node_bin, flags);
    FILE *p = popen(cmd, "r");
    CHECK(p, "%s", cmd);
    line[0] = 0;
    char buf[1024];
    while (fgets(buf, sizeof buf, p))
        if (strstr(buf, "topology") && !line[0])
            snprintf(line, len, "%s", buf);
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_refuse(void)
{
    struct cluster c;
    struct rpc_status st;
    char **k;
    bool out[4];
    setup(&c, "router-copies-refuse", NULL, &k);

    CHECK(t_keys(c.node[0].ch, "Add", "f", k, 1, out, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION &&
              strstr(st.message, "in a group of 3 copies, keys go through a router"),
          "public Add on a copy: %d %s", st.code, st.message);
    CHECK(t_keys(c.node[0].ch, "MayContain", "f", k, 1, out, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION &&
              strstr(st.message, "in a group of 3 copies, keys go through a router"),
          "public MayContain on a copy (W < N): %d %s", st.code, st.message);
    CHECK(t_create(c.node[0].ch, "direct", 10000, 0.01, 0, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION &&
              strstr(st.message, "filters are created and dropped through a router"),
          "public CreateFilter on a copy: %d %s", st.code, st.message);
    CHECK(t_drop(c.node[0].ch, "f.shard-0", &st) == GRPC_STATUS_FAILED_PRECONDITION &&
              strstr(st.message, "filters are created and dropped through a router"),
          "public DropFilter on a copy: %d %s", st.code, st.message);
    CHECK(t_shard_count(c.node[0].ch, "f") == S, "the refused drop dropped nothing");
    CHECK(t_create_sharded(c.router[0].ch, "counts", 1000, 0.01,
                           BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING, 2, NULL,
                           &st) == GRPC_STATUS_FAILED_PRECONDITION &&
              strstr(st.message, "counting kind cannot have 3 copies"),
          "counting filter on 3 copies: %d %s", st.code, st.message);

    /* The routers' file moves to version 2 before the nodes read it. */
    c.topo_version = 2;
    cluster_write_topo(&c, 3, false, NULL);
    kill(c.router[0].pid, SIGHUP);
    int code = 0;
    for (int i = 0; i < 250; i++) {
        code = t_keys(c.router[0].ch, "MayContain", "f", k, 4, out, &st);
        if (code == GRPC_STATUS_FAILED_PRECONDITION)
            break;
        harness_sleep_ms(20);
    }
    CHECK(code == GRPC_STATUS_FAILED_PRECONDITION &&
              strstr(st.message, "topology version 2, this node has 1"),
          "a call under another version: %d %s", code, st.message);
    printf("under another version: %s\n", st.message);
    CHECK(t_keys(c.router[0].ch, "Add", "f", k, 4, out, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION, "Add under another version: %d %s",
          st.code, st.message);
    for (int i = 0; i < 3; i++)
        kill(c.node[i].pid, SIGHUP);
    for (int i = 0; i < 250; i++) {
        code = t_keys(c.router[0].ch, "MayContain", "f", k, 4, out, &st);
        if (code == 0)
            break;
        harness_sleep_ms(20);
    }
    CHECK(code == 0, "after the nodes read version 2: %d %s", code, st.message);
    all_maybe(&c, k, "nodes and router on version 2");

    /* Start-up refusals: exit 2 with a message naming the topology. */
    char flags[1500], line[1024];
    snprintf(flags, sizeof flags, "--listen 127.0.0.1:0 --data-dir %s/stray "
             "--topology %s", c.dir, c.topo);
    CHECK(node_run(flags, line, sizeof line) == 2 && strstr(line, "lists no group"),
          "a node outside the topology: %s", line);
    printf("outside the topology: %s", line);
    snprintf(flags, sizeof flags, "--listen %s --advertise %s --data-dir %s/stray "
             "--durability none --topology %s", "127.0.0.1:0", c.node[0].addr, c.dir,
             c.topo);
    CHECK(node_run(flags, line, sizeof line) == 2 && strstr(line, "durability = none"),
          "durability none in a group of 3: %s", line);
    snprintf(flags, sizeof flags, "--listen 127.0.0.1:0 --data-dir %s/stray --role "
             "replica", c.dir);
    CHECK(node_run(flags, line, sizeof line) == 2 && strstr(line, "role is gone"),
          "role = replica: %s", line);
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

/* Every key of k (n) is "maybe" in the bundle buf. */
static void bundle_holds(const uint8_t *buf, size_t len, char **k, size_t n,
                         const char *when)
{
    char err[256];
    struct bundle *b = bundle_parse(buf, len, err);
    CHECK(b, "%s: the export does not parse: %s", when, err);
    size_t *lens = malloc(n * sizeof *lens);
    bool *out = malloc(n);
    CHECK(lens && out, "memory");
    for (size_t i = 0; i < n; i++)
        lens[i] = strlen(k[i]);
    bundle_may_contain_keys(b, (const void *const *)k, lens, n, out);
    for (size_t i = 0; i < n; i++)
        CHECK(out[i], "%s: acknowledged key %s is not in the export", when, k[i]);
    printf("%s: every acknowledged key is in the export\n", when);
    free(lens);
    free(out);
    bundle_destroy(b);
}

static void test_export(void)
{
    struct cluster c;
    struct rpc_status st;
    char **k;
    uint8_t *buf = NULL;
    setup(&c, "router-copies-export", "write_quorum = 2\nread_quorum = 2\n", &k);

    /* Copy 0, the first an Export asks, misses writes the two others
     * acknowledge, and comes back with anti-entropy slowed down so that it
     * still lacks them. */
    node_stop(&c.node[0], SIGKILL);
    char **more = keys_make("missed", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", more, NKEYS, 500, NULL);
    const char *slow[] = {"--replicate-interval-ms", "60000", NULL};
    restart_reached(&c, 0, slow);
    size_t len = t_export(c.router[0].ch, "f", &buf, &st);
    CHECK(len > 0, "Export: %s", st.message);
    bundle_holds(buf, len, k, NKEYS, "export, copy 0 behind");
    bundle_holds(buf, len, more, NKEYS, "export, copy 0 behind");
    /* inserts and keys added are one copy's counts, not the sums over the
     * copies read. */
    char err[256];
    struct bundle *b = bundle_parse(buf, len, err);
    CHECK(b, "export: %s", err);
    uint64_t inserts = 0, keys = 0;
    for (uint32_t i = 0; i < b->count; i++) {
        inserts += bf_insert_count(b->shard[i]);
        CHECK(bf_keys_added(b->shard[i]) != BF_KEYS_UNCOUNTED, "shard %u: keys uncounted", i);
        keys += bf_keys_added(b->shard[i]);
    }
    bundle_destroy(b);
    free(buf);
    CHECK(inserts >= 2 * NKEYS - 20 && inserts <= 2 * NKEYS + 100,
          "export inserts %llu, expected about %d (one copy's adds)",
          (unsigned long long)inserts, 2 * NKEYS);
    CHECK(keys >= 2 * NKEYS && keys <= 2 * NKEYS + 100,
          "export keys added %llu, expected %d (one copy's adds)",
          (unsigned long long)keys, 2 * NKEYS);

    /* Two copies down: fewer than R answer, and nothing is exported. */
    node_stop(&c.node[1], SIGKILL);
    node_stop(&c.node[2], SIGKILL);
    buf = NULL;
    CHECK(t_export(c.router[0].ch, "f", &buf, &st) == 0 && st.code ==
              GRPC_STATUS_UNAVAILABLE && strstr(st.message, "read quorum 2"),
          "Export with one copy up: %d %s", st.code, st.message);
    free(buf);
    keys_free(more, NKEYS);
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

/* Anti-entropy's series on every copy: for each other copy, pages and
 * bytes pulled and the time of the last successful pull, which moves on
 * while the copies run and stops for a copy that is stopped.  Before any
 * filter, the counters alerts read are served at 0; then every copy holds
 * every shard, one series each, labels filter (its name) and shard. */
static void test_metrics(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *flags[] = {"--metrics-listen", "127.0.0.1:0", "--replicate-interval-ms",
                           "100", NULL};
    cluster_init(&c, "router-copies-metrics", "fsync");
    c.node_flags = flags;
    cluster_run_copies(&c, 1, 3, "write_quorum = 2\nread_quorum = 2\n", 1);
    for (int i = 0; i < 3; i++)
        CHECK(c.node[i].maddr[0], "node %d printed no metrics address", i);
    const char *const any[1] = {""};
    const char *const zero[] = {"bloomgrid_checkpoint_failures_total",
                                "bloomgrid_keys_added_total",
                                "bloomgrid_checkpoint_bytes_total"};
    for (size_t z = 0; z < sizeof zero / sizeof *zero; z++) {
        double v = NAN;
        CHECK(harness_scrape(c.node[0].maddr, zero[z], NULL, any, 1, &v) == 0,
              "GET /metrics of node 0");
        CHECK(v == 0, "node 0 before any filter: %s = %f, not served at 0", zero[z], v);
    }
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    char **k = keys_make("m", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k, NKEYS, 500, NULL);
    /* Every copy: shard i of f as {filter="f", shard="i"}, not the store
     * name f.shard-i. */
    char sel[S + 1][32];
    const char *sels[S + 1];
    for (int s = 0; s < S; s++) {
        snprintf(sel[s], sizeof sel[s], "filter=f,shard=%d", s);
        sels[s] = sel[s];
    }
    snprintf(sel[S], sizeof sel[S], "filter=f.shard-0");
    sels[S] = sel[S];
    for (int i = 0; i < 3; i++) {
        double bytes[S + 1], sync[S + 1];
        CHECK(harness_scrape(c.node[i].maddr, "bloomgrid_filter_bytes", NULL, sels, S + 1,
                             bytes) == 0 &&
              harness_scrape(c.node[i].maddr, "bloomgrid_shard_syncing", NULL, sels, S + 1,
                             sync) == 0, "GET /metrics of node %d", i);
        for (int s = 0; s < S; s++)
            CHECK(bytes[s] > 0 && sync[s] == 0, "node %d: shard %d of f: bytes %f, "
                  "syncing %f", i, s, bytes[s], sync[s]);
        CHECK(isnan(bytes[S]), "node %d serves filter=\"f.shard-0\"", i);
    }

    const char *const peers[2] = {c.node[1].addr, c.node[2].addr};
    const char *ts = "bloomgrid_antientropy_last_pull_timestamp_seconds";
    double t[2] = {NAN, NAN}, pg = NAN;
    /* Copy 0 has pulled from both others, recently. */
    double now = (double)time(NULL);
    for (int i = 0; i < 100; i++) {
        CHECK(harness_scrape(c.node[0].maddr, ts, "peer", peers, 2, t) == 0,
              "GET /metrics of node 0");
        CHECK(harness_scrape(c.node[0].maddr, "bloomgrid_antientropy_pages_total", "peer",
                             peers, 1, &pg) == 0, "GET /metrics of node 0");
        if (!isnan(pg) && t[0] >= now - 1 && t[1] >= now - 1)
            break;
        harness_sleep_ms(100);
    }
    CHECK(!isnan(pg) && t[0] >= now - 1 && t[1] >= now - 1,
          "node 0: last pulls %f and %f, not after %f", t[0], t[1], now);
    /* Copy 2 killed: its timestamp stays, copy 1's moves on. */
    node_stop(&c.node[2], SIGKILL);
    harness_sleep_ms(1500);
    double a[2], b[2];
    CHECK(harness_scrape(c.node[0].maddr, ts, "peer", peers, 2, a) == 0, "GET /metrics");
    harness_sleep_ms(1500);
    CHECK(harness_scrape(c.node[0].maddr, ts, "peer", peers, 2, b) == 0, "GET /metrics");
    CHECK(b[0] > a[0], "the last pull from copy 1 did not move on: %f then %f", a[0], b[0]);
    CHECK(b[1] == a[1], "the last pull from killed copy 2 moved: %f then %f", a[1], b[1]);
    printf("anti-entropy lag: copy 1 pulled again, killed copy 2 %.1f s behind\n",
           b[0] - b[1]);
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

/* Copies that took the same writes ship each other (almost) no pages:
 * each pull carries the hashes of the puller's pages.  Eight bursts of
 * writes through the router, each changing every shard's page on all three
 * copies; without the hashes every copy pulls each changed page from both
 * others after every burst (8 x 2 x S pages), with them only a page caught
 * between two copies' applies of one burst (the bound leaves room for four
 * such pulls a copy on a loaded machine). */
static void test_insync(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *flags[] = {"--metrics-listen", "127.0.0.1:0", "--replicate-interval-ms",
                           "100", NULL};
    const int bursts = 8;
    cluster_init(&c, "router-copies-insync", "fsync");
    c.node_flags = flags;
    /* W = 3: a burst is acknowledged once every copy holds it, so only a
     * pull made during the burst itself can find the copies apart. */
    cluster_run_copies(&c, 1, 3, "write_quorum = 3\nread_quorum = 1\n", 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    const char *ts = "bloomgrid_antientropy_last_pull_timestamp_seconds";
    for (int b = 0; b < bursts; b++) {
        char tag[16];
        snprintf(tag, sizeof tag, "sync%d", b);
        char **k = keys_make(tag, 0, NKEYS);
        keys_call(c.router[0].ch, "Add", "f", k, NKEYS, NKEYS, NULL);
        keys_free(k, NKEYS);
        /* Every copy pulls from both others before the next burst. */
        double after = (double)time(NULL) + 1, t[2] = {NAN, NAN};
        for (int i = 0; i < 3; i++) {
            const char *peers[2] = {c.node[(i + 1) % 3].addr, c.node[(i + 2) % 3].addr};
            for (int w = 0; w < 100; w++) {
                CHECK(harness_scrape(c.node[i].maddr, ts, "peer", peers, 2, t) == 0,
                      "GET /metrics of node %d", i);
                if (t[0] >= after && t[1] >= after)
                    break;
                harness_sleep_ms(100);
            }
            CHECK(t[0] >= after && t[1] >= after, "node %d did not pull after burst %d", i, b);
        }
    }
    double total = 0;
    for (int i = 0; i < 3; i++) {
        const char *peers[2] = {c.node[(i + 1) % 3].addr, c.node[(i + 2) % 3].addr};
        double pg[2] = {NAN, NAN};
        CHECK(harness_scrape(c.node[i].maddr, "bloomgrid_antientropy_pages_total", "peer",
                             peers, 2, pg) == 0, "GET /metrics of node %d", i);
        double n = (isnan(pg[0]) ? 0 : pg[0]) + (isnan(pg[1]) ? 0 : pg[1]);
        printf("node %d pulled %.0f pages in %d bursts (%d without the hashes)\n", i, n,
               bursts, bursts * 2 * S);
        CHECK(n < bursts * 2 * S / 4, "node %d pulled %.0f pages from copies in step",
              i, n);
        total += n;
    }
    printf("pages pulled by the three copies: %.0f\n", total);
    cluster_stop(&c);
}

static void run(void)
{
    if (!strcmp(test_name, "quorum"))
        test_quorum();
    else if (!strcmp(test_name, "wipe"))
        test_wipe();
    else if (!strcmp(test_name, "w3r1"))
        test_w3r1();
    else if (!strcmp(test_name, "single"))
        test_single();
    else if (!strcmp(test_name, "early"))
        test_early();
    else if (!strcmp(test_name, "refuse"))
        test_refuse();
    else if (!strcmp(test_name, "export"))
        test_export();
    else if (!strcmp(test_name, "metrics"))
        test_metrics();
    else if (!strcmp(test_name, "insync"))
        test_insync();
    else
        CHECK(false, "unknown test %s", test_name);
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN TEST\n", argv[0]);
        return 2;
    }
    test_name = argv[3];
    return cluster_test_main(3, argv, run);
}
