/* SYNCING copies (docs/REPLICATION.md): one group of three copies, W = 2,
 * R = 2, behind a router.
 *
 * usage: test_router_syncing NODE_BIN ROUTER_BIN [CLI_BIN SCENARIO]
 *
 * Without a scenario: a filter created through the router is READY on
 * every copy and read at once.  Keys k2 are then acknowledged by copies 1
 * and 2 alone (copy 0 is down, and comes back without anti-entropy, so it
 * lacks them).  Copy 2 is stopped; copy 1 is killed, its data directory
 * deleted, and restarted: anti-entropy re-creates its shards from copy 0,
 * and they report SYNCING (also after a restart of copy 1).  Every read of
 * k2 through the router is then "maybe" or UNAVAILABLE, never "no" —
 * without SYNCING, copies 0 and 1 would both answer "no".  Once copy 2 is
 * back, copy 1 leaves SYNCING and, by itself, holds every acknowledged key.
 *
 * wiped: a copy loses its disk and restarts empty while the two others
 * serve.  From its first moment until it holds every shard of its group,
 * READY, neither its health (bloomgrid.v1.BloomGrid) nor `bloomgrid
 * status` says it serves (each sample is checked against what the copy
 * holds after it: shards only come), and no read through the router says
 * "no"; it is seen held (NOT_SERVING, status SYNCING), and then serves
 * with every key.
 *
 * new_group: three nodes start for the first time in a group, each on an
 * empty data directory: they serve (their group is new), and a filter is
 * created, written and read through a router.  Then a shard created on two
 * copies alone: `bloomgrid status` does not show the third serving (it
 * lacks a shard its group holds), though its health says SERVING.
 *
 * double_wipe: two copies lose their disks in turn (copy 1 stopped while
 * copy 0 is wiped, then wiped itself): both refill from copy 2 alone and
 * cannot leave SYNCING (each needs two copies that are not SYNCING), so
 * the group refuses reads.  `bloomgrid resync` without --accept-loss
 * refuses (and so does the RPC without accept_loss), and against a router
 * says it wants a copy; with --accept-loss on copy 0 it names the copies
 * it pulled from, copy 0 leaves SYNCING, copy 1 then by the usual rule,
 * and every key acknowledged before and after the loss reads "maybe".
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "cluster.h"

#define NKEYS 1000
#define S 4        /* shards */

/* Wait until every shard of f on copy ch is in state want. */
static bool wait_states(struct rpc_channel *ch, int want, int timeout_ms)
{
    return t_wait_shard_states(ch, "f", S, want, timeout_ms);
}

/* Read k through the router: answered with every key "maybe", or
 * UNAVAILABLE; never "no".  Returns whether it was answered. */
static bool never_no(struct cluster *c, char **k, const char *when)
{
    return t_never_no(c->router[0].ch, "f", k, NKEYS, when);
}

static void test(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *slow[] = {"--replicate-interval-ms", "60000", NULL};
    const int SY = 1, STOPPED = 2;

    cluster_start_copies(&c, "router-syncing", 1, 3,
                         "write_quorum = 2\nread_quorum = 2\n", 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    /* A router's new filter: READY everywhere, read at once. */
    for (int i = 0; i < 3; i++)
        for (uint32_t s = 0; s < S; s++)
            CHECK(t_shard_state(c.node[i].ch, "f", s) ==
                      BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
                  "copy %d shard %u is not READY after CreateFilter", i, s);
    char **k = keys_make("k", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k, NKEYS, 500, NULL);
    CHECK(never_no(&c, k, "right after CreateFilter"), "reads refused after create");

    /* k2: acknowledged by copies 1 and 2 only. */
    node_stop(&c.node[0], SIGKILL);
    char **k2 = keys_make("k2", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k2, NKEYS, 500, NULL);
    cluster_node_start(&c, 0, c.node[0].port, slow);
    CHECK(cluster_wait_reads(&c, 0, 20000), "restarted copy 0 does not answer reads");
    struct node_proc view = {0};
    cluster_view_start(&c, 0, &view);
    size_t on0 = keys_present(view.ch, "f", k2, NKEYS, NULL);
    node_stop(&view, SIGTERM);
    CHECK(on0 < NKEYS / 10, "copy 0 already has %zu keys of k2", on0);

    /* Copy 2 stopped, copy 1 loses its disk. */
    harness_sigstop(c.node[STOPPED].pid);
    cluster_node_wipe(&c, SY);
    CHECK(wait_states(c.node[SY].ch, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING,
                      60000), "the wiped copy's shards are not re-created SYNCING");
    printf("wiped copy: every shard re-created, SYNCING\n");
    int answered = 0;
    for (int r = 0; r < 3; r++) {
        answered += never_no(&c, k2, "wiped copy SYNCING, another copy stopped");
        answered += never_no(&c, k, "wiped copy SYNCING, another copy stopped");
    }
    printf("reads with a copy SYNCING and one stopped: %d of 6 answered, "
           "none \"no\"\n", answered);

    /* SYNCING is on disk. */
    node_stop(&c.node[SY], SIGKILL);
    cluster_node_start(&c, SY, c.node[SY].port, NULL);
    CHECK(wait_states(c.node[SY].ch, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING,
                      10000), "SYNCING did not survive a restart");
    printf("after a restart of the wiped copy: still SYNCING\n");
    for (int r = 0; r < 2; r++)
        never_no(&c, k2, "SYNCING copy restarted");

    /* Copy 2 back: the wiped copy fills from copies 0 and 2. */
    kill(c.node[STOPPED].pid, SIGCONT);
    CHECK(wait_states(c.node[SY].ch, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
                      60000), "the wiped copy does not leave SYNCING");
    printf("wiped copy left SYNCING\n");
    cluster_view_start(&c, SY, &view);
    CHECK(keys_present(view.ch, "f", k, NKEYS, NULL) == NKEYS &&
              keys_present(view.ch, "f", k2, NKEYS, NULL) == NKEYS,
          "the copy that left SYNCING lacks acknowledged keys");
    node_stop(&view, SIGTERM);
    CHECK(never_no(&c, k, "after SYNCING") && never_no(&c, k2, "after SYNCING"),
          "reads after SYNCING not answered");
    printf("every acknowledged key \"maybe\"\n");
    keys_free(k, NKEYS);
    keys_free(k2, NKEYS);
    cluster_stop(&c);
}

/* ---- scenarios with the CLI ---- */

static const char *cli_bin;
static char out_path[700], err_path[700];

static const char *const HEAD = "write_quorum = 2\nread_quorum = 2\n";

/* Run the CLI with args (NULL-terminated); stdout to out_path, stderr to
 * err_path.  Returns its exit status. */
static int cli(const char *const *args)
{
    const char *argv[32] = {cli_bin};
    int a = 1;
    for (int i = 0; args[i] && a < 31; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    unlink(out_path);
    unlink(err_path);
    return harness_run(argv, out_path, err_path, NULL, 60000);
}

/* Does a line of the file at path hold both a and b? */
static bool line_with(const char *path, const char *a, const char *b)
{
    char line[2048];
    bool found = false;
    FILE *f = fopen(path, "r");
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, a) && strstr(line, b);
    if (f)
        fclose(f);
    return found;
}

static void paths_set(struct cluster *c)
{
    snprintf(out_path, sizeof out_path, "%s/cli.out", c->dir);
    snprintf(err_path, sizeof err_path, "%s/cli.err", c->dir);
}

/* How many shards of f node i holds READY (GetShard: a held copy reports
 * its shards SYNCING). */
static int ready_shards(struct cluster *c, int i)
{
    int ready = 0;
    for (uint32_t s = 0; s < S; s++)
        ready += t_shard_state(c->node[i].ch, "f", s) ==
                 BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY;
    return ready;
}

/* Where node i stands (ListShardsResponse.copy_state). */
static int copy_state(struct cluster *c, int i)
{
    Bloomgrid__V1__ListShardsRequest rq = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    Bloomgrid__V1__ListShardsResponse *ls = NULL;
    struct rpc_status st;
    CHECK(rpc_call(c->node[i].ch, "/bloomgrid.v1.Internal/ListShards", &rq.base,
                   &bloomgrid__v1__list_shards_response__descriptor,
                   (ProtobufCMessage **)&ls, TIMEOUT_MS, &st) == 0,
          "ListShards on node %d: %s", i, st.message);
    int state = ls->copy_state;
    bloomgrid__v1__list_shards_response__free_unpacked(ls, NULL);
    return state;
}

static void test_wiped(void)
{
    struct cluster c;
    struct rpc_status st;
    const int SY = 1;

    cluster_start_copies(&c, "router-syncing-wiped", 1, 3, HEAD, 1);
    paths_set(&c);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    char **k = keys_make("k", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k, NKEYS, 500, NULL);
    const char *status[] = {"status", "--topology", c.topo, NULL};
    CHECK(cli(status) == 0 && line_with(out_path, c.node[SY].addr, "serving"),
          "status before the wipe");

    /* Back on an empty data directory, the two others serving: from its
     * first moment (health "" SERVING: its store is open) until it serves,
     * nothing says it serves while it lacks a shard of its group. */
    cluster_node_wipe(&c, SY);
    double t0 = harness_now_s();
    bool held = false, syncing = false;
    int samples = 0;
    for (;; samples++) {
        /* Health every sample, status (a process: slower) every fourth. */
        int h = node_health(&c.node[SY], "bloomgrid.v1.BloomGrid");
        bool says_serving = false;
        if (samples % 4 == 0) {
            cli(status);
            says_serving = line_with(out_path, c.node[SY].addr, "serving");
            syncing |= line_with(out_path, c.node[SY].addr, "SYNCING");
        }
        held |= h == 2;
        /* Read after the two answers: what it lacks now it lacked then. */
        int ready = ready_shards(&c, SY);
        CHECK(h != 1 || ready == S, "%.2f s after its start the wiped copy's health "
              "is SERVING with %d of %d shards READY", harness_now_s() - t0, ready, S);
        CHECK(!says_serving || ready == S, "%.2f s after its start `bloomgrid status` "
              "says the wiped copy is serving with %d of %d shards READY",
              harness_now_s() - t0, ready, S);
        if (h == 1 && says_serving)
            break;
        if (samples % 4 == 2)
            never_no(&c, k, "wiped copy coming back");
        CHECK(harness_now_s() - t0 < 60, "the wiped copy does not serve within 60 s");
        harness_sleep_ms(50);
    }
    CHECK(held && syncing, "the wiped copy was never seen held (health NOT_SERVING: "
          "%d, status SYNCING: %d)", held, syncing);
    printf("wiped copy: held and SYNCING in status from its start, serving %.1f s "
           "later with every shard (%d samples)\n", harness_now_s() - t0, samples);
    CHECK(copy_state(&c, SY) == BLOOMGRID__V1__COPY_STATE__COPY_STATE_CHECKED,
          "the refilled copy does not say it is checked");
    struct node_proc view = {0};
    cluster_view_start(&c, SY, &view);
    CHECK(keys_present(view.ch, "f", k, NKEYS, NULL) == NKEYS,
          "the refilled copy lacks acknowledged keys");
    node_stop(&view, SIGTERM);
    CHECK(cli(status) == 0 && line_with(out_path, "3 of 3 copies serving", ""),
          "status once the copy is back");
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

static void test_new_group(void)
{
    struct cluster c;
    struct rpc_status st;
    char cmd[700];

    /* The ports first (a topology names them), then every data directory
     * empty again: the group's first start. */
    cluster_init(&c, "router-syncing-new", "fsync");
    paths_set(&c);
    for (int i = 0; i < 3; i++)
        cluster_node_start(&c, i, 0, NULL);
    c.copies = 3;
    snprintf(c.topo_head, sizeof c.topo_head, "%s", HEAD);
    cluster_write_topo(&c, 3, false, NULL);
    for (int i = 0; i < 3; i++) {
        node_stop(&c.node[i], SIGTERM);
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", c.node_dir[i]);
        CHECK(system(cmd) == 0, "%s", cmd);
    }
    c.node_topo = true;
    for (int i = 0; i < 3; i++)
        cluster_node_start(&c, i, c.node[i].port, NULL);
    for (int i = 0; i < 3; i++)
        CHECK(cluster_wait_reads(&c, i, 20000), "copy %d of a new group does not "
              "serve", i);
    printf("a new group: every copy serves\n");
    cluster_router_start(&c, 0, NULL);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    char **k = keys_make("k", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k, NKEYS, 500, NULL);
    CHECK(never_no(&c, k, "a new group"), "reads refused in a new group");
    for (int i = 0; i < 3; i++)
        CHECK(ready_shards(&c, i) == S, "copy %d: shards not READY", i);
    /* A node's health follows its filters' states every 200 ms, and a
     * shard being created reads as not ready until its files are in
     * place: the status settles within a few of those ticks. */
    const char *status[] = {"status", "--topology", c.topo, NULL};
    bool settled = false;
    for (int t = 0; t < 50 && !settled; t++) {
        settled = cli(status) == 0 && line_with(out_path, "3 of 3 copies serving", "");
        if (!settled)
            usleep(100 * 1000);
    }
    CHECK(settled, "status of a new group");
    printf("created, written and read through the router\n");

    /* A copy that lacks a shard its group holds (created on the two others
     * alone; its anti-entropy slowed so it does not re-create it) is not
     * shown serving, whatever its health says. */
    const char *slow[] = {"--replicate-interval-ms", "60000", NULL};
    cluster_node_restart(&c, 1, SIGTERM, slow);
    CHECK(cluster_wait_reads(&c, 1, 20000), "copy 1 does not serve after a restart");
    for (int i = 0; i < 3; i += 2) {
        Bloomgrid__V1__CreateShardRequest cq = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        cq.filter = "lone";
        cq.shard_count = 1;
        cq.capacity = 1000;
        cq.error_rate = 0.01;
        cq.new_filter = true;
        static uint8_t secret[32] = {7};
        cq.secret.data = secret;
        cq.secret.len = sizeof secret;
        CHECK(rpc_call(c.node[i].ch, "/bloomgrid.v1.Internal/CreateShard", &cq.base,
                       &bloomgrid__v1__internal_shard_info__descriptor, &resp,
                       TIMEOUT_MS, &st) == 0, "create lone on copy %d: %s", i, st.message);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    CHECK(node_health(&c.node[1], "bloomgrid.v1.BloomGrid") == 1,
          "copy 1's health is not SERVING");
    CHECK(cli(status) == 0 && line_with(out_path, c.node[1].addr, "lacks 1 shard") &&
              !line_with(out_path, c.node[1].addr, "serving") &&
              line_with(out_path, "2 of 3 copies serving", ""),
          "status shows serving a copy that lacks a shard of its group");
    printf("status: a copy that lacks a shard of its group is not shown serving\n");
    keys_free(k, NKEYS);
    cluster_stop(&c);
}

static void test_double_wipe(void)
{
    struct cluster c;
    struct rpc_status st;
    const int A = 0, B = 1, KEPT = 2;

    cluster_start_copies(&c, "router-syncing-double", 1, 3, HEAD, 1);
    paths_set(&c);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    char **k = keys_make("k", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k, NKEYS, 500, NULL);

    /* A loses its disk while B is stopped: A refills from KEPT alone and
     * cannot leave SYNCING.  Then B loses its disk too. */
    harness_sigstop(c.node[B].pid);
    cluster_node_wipe(&c, A);
    CHECK(wait_states(c.node[A].ch, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING,
                      60000), "A's shards are not re-created SYNCING");
    cluster_node_wipe(&c, B);
    CHECK(wait_states(c.node[B].ch, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING,
                      60000), "B's shards are not re-created SYNCING");
    /* Writes go on (the SYNCING copies take them); reads are refused. */
    char **k3 = keys_make("k3", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k3, NKEYS, 500, NULL);
    for (int r = 0; r < 6; r++) {
        CHECK(!never_no(&c, k, "two copies wiped"), "a read was answered with two of "
              "three copies wiped and SYNCING");
        harness_sleep_ms(500);
    }
    const char *status[] = {"status", "--topology", c.topo, NULL};
    CHECK(cli(status) == 1 && line_with(out_path, c.node[A].addr, "SYNCING") &&
              line_with(out_path, c.node[B].addr, "SYNCING") &&
              line_with(out_path, "1 of 3 copies serving", "NOT READABLE"),
          "status of the stuck group");
    printf("two copies wiped in turn: the group refuses reads, both SYNCING\n");

    /* The way out refuses without --accept-loss, and names what it wants. */
    const char *no_accept[] = {"--server", c.node[A].addr, "resync", NULL};
    CHECK(cli(no_accept) == 2 && line_with(err_path, "--accept-loss", "gone"),
          "resync without --accept-loss did not refuse with a clear message");
    Bloomgrid__V1__ResyncRequest rq = BLOOMGRID__V1__RESYNC_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    CHECK(rpc_call(c.node[A].ch, "/bloomgrid.v1.Internal/Resync", &rq.base,
                   &bloomgrid__v1__resync_response__descriptor, &resp, TIMEOUT_MS,
                   &st) < 0 && st.code == GRPC_STATUS_FAILED_PRECONDITION &&
              strstr(st.message, "accept_loss"),
          "Resync without accept_loss: %s: %s", rpc_status_name(st.code), st.message);
    const char *at_router[] = {"--server", c.router[0].addr, "resync", "--accept-loss",
                               NULL};
    CHECK(cli(at_router) == 2 && line_with(err_path, "UNIMPLEMENTED", "topology"),
          "resync against a router");
    CHECK(ready_shards(&c, A) == 0 && ready_shards(&c, B) == 0,
          "a refused resync changed something");
    printf("resync without --accept-loss refused: nothing changed\n");

    const char *accept[] = {"--server", c.node[A].addr, "resync", "--accept-loss", NULL};
    CHECK(cli(accept) == 0 && line_with(out_path, "pulled every shard from",
                                        c.node[B].addr) &&
              line_with(out_path, "pulled every shard from", c.node[KEPT].addr) &&
              line_with(out_path, "taken off SYNCING", "4 shards"),
          "resync --accept-loss on A did not succeed naming the copies it used");
    CHECK(wait_states(c.node[A].ch, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
                      10000), "A did not leave SYNCING after its resync");
    CHECK(cluster_wait_reads(&c, A, 10000), "A does not serve after its resync");
    /* B: full pulls from A and KEPT, neither SYNCING now. */
    CHECK(wait_states(c.node[B].ch, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
                      60000), "B did not leave SYNCING once A had");
    CHECK(cluster_wait_reads(&c, B, 20000), "B does not serve");
    printf("resync --accept-loss on A: A and then B left SYNCING\n");
    CHECK(never_no(&c, k, "after the resync") && never_no(&c, k3, "after the resync"),
          "reads refused after the resync");
    for (int i = 0; i < 3; i++) {
        struct node_proc view = {0};
        cluster_view_start(&c, i, &view);
        CHECK(keys_present(view.ch, "f", k, NKEYS, NULL) == NKEYS,
              "copy %d alone lacks keys the kept copy had", i);
        node_stop(&view, SIGTERM);
    }
    CHECK(cli(status) == 0 && line_with(out_path, "3 of 3 copies serving", ""),
          "status after the resync");
    printf("every key of the kept copy \"maybe\" on every copy\n");
    keys_free(k, NKEYS);
    keys_free(k3, NKEYS);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc == 3)
        return cluster_test_main(argc, argv, test);
    if (argc != 5) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN [CLI_BIN wiped|new_group|"
                "double_wipe]\n", argv[0]);
        return 2;
    }
    cli_bin = argv[3];
    void (*fn)(void) = strcmp(argv[4], "wiped") == 0       ? test_wiped
                       : strcmp(argv[4], "new_group") == 0 ? test_new_group
                       : strcmp(argv[4], "double_wipe") == 0 ? test_double_wipe
                                                             : NULL;
    if (!fn) {
        fprintf(stderr, "%s: unknown scenario %s\n", argv[0], argv[4]);
        return 2;
    }
    char *cargv[] = {argv[0], argv[1], argv[2], NULL};
    return cluster_test_main(3, cargv, fn);
}
