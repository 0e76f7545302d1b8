/* SYNCING copies (docs/REPLICATION.md): one group of three copies, W = 2,
 * R = 2, behind a router.
 *
 * usage: test_router_syncing NODE_BIN ROUTER_BIN
 *
 * A filter created through the router is READY on every copy and read at
 * once.  Keys k2 are then acknowledged by copies 1 and 2 alone (copy 0 is
 * down, and comes back without anti-entropy, so it lacks them).  Copy 2 is
 * stopped; copy 1 is killed, its data directory deleted, and restarted:
 * anti-entropy re-creates its shards from copy 0, and they report SYNCING
 * (also after a restart of copy 1).  Every read of k2 through the router
 * is then "maybe" or UNAVAILABLE, never "no" — without SYNCING, copies 0
 * and 1 would both answer "no".  Once copy 2 is back, copy 1 leaves
 * SYNCING and, by itself, holds every acknowledged key.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test);
}
