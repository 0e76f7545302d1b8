/* Router test "reload": the topology file reloaded on SIGHUP.  Benign
 * reloads (the same groups in another order) drop no call; a bad file is
 * refused naming its line, and the old topology stays; a new group takes
 * shards of new filters.
 *
 * usage: test_router_reload NODE_BIN ROUTER_BIN
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

/* Calls MayContain of the 500 keys of f1 until told to stop, counting
 * failed calls and keys answered absent. */
struct reader {
    struct rpc_channel *ch;
    atomic_bool stop;
    size_t calls, failures;
    char msg[RPC_CLIENT_MSGLEN];
};

static void *reader_main(void *arg)
{
    struct reader *rd = arg;
    char **k = keys_make("r", 0, 500);
    bool out[500];
    struct rpc_status st;
    while (!atomic_load(&rd->stop)) {
        if (t_keys(rd->ch, "MayContain", "f1", k, 500, out, &st) != 0) {
            rd->failures++;
            snprintf(rd->msg, sizeof rd->msg, "%s", st.message);
        } else {
            for (int i = 0; i < 500; i++)
                if (!out[i])
                    rd->failures++;
        }
        rd->calls++;
    }
    keys_free(k, 500);
    return NULL;
}

static void test_reload(void)
{
    struct cluster c;
    struct rpc_status st;
    bool out[500];
    cluster_start(&c, "router-reload", 3, 1, "none");
    /* A fourth node, not yet in the topology. */
    cluster_node_start(&c, 3, 0, NULL);
    struct rpc_channel *a = c.router[0].ch;
    CHECK(t_create_sharded(a, "f1", 10000, 0.01, 0, 16, NULL, &st) == 0, "%s", st.message);
    char **k = keys_make("r", 0, 500);
    CHECK(t_keys(a, "Add", "f1", k, 500, out, &st) == 0, "%s", st.message);
    keys_free(k, 500);

    struct reader rd = {.ch = a};
    pthread_t th;
    pthread_create(&th, NULL, reader_main, &rd);
    /* Benign reloads (same groups, another order) while calls run. */
    for (int i = 0; i < 10; i++) {
        cluster_write_topo(&c, 3, i % 2, NULL);
        kill(c.router[0].pid, SIGHUP);
        harness_sleep_ms(50);
    }
    /* A bad file: refused naming its file and line, the old topology stays.
     * A refused reload has no caller to answer: the router reports it only
     * in its log, so the message is read there.  Waiting for it also tells
     * that this SIGHUP was handled (pending SIGHUPs merge into one) before
     * the next file is written. */
    cluster_write_topo(&c, 3, false, "[group g9]\ncopies = 127.0.0.1:1\nbogus line\n");
    kill(c.router[0].pid, SIGHUP);
    char want[700];
    snprintf(want, sizeof want, "%s:14: syntax error", c.topo);
    for (int i = 0; i < 250 && !harness_log_count(c.router[0].log, want); i++)
        harness_sleep_ms(20);
    atomic_store(&rd.stop, true);
    pthread_join(th, NULL);
    printf("%zu calls during reloads, %zu failures %s\n", rd.calls, rd.failures, rd.msg);
    CHECK(rd.calls > 5 && rd.failures == 0, "calls dropped during reload: %s", rd.msg);
    CHECK(harness_log_count(c.router[0].log, want) > 0, "router log lacks \"%s\"", want);
    k = keys_make("r", 0, 500);
    CHECK(t_keys(a, "MayContain", "f1", k, 500, out, &st) == 0, "%s", st.message);
    keys_free(k, 500);
    /* The old three groups still place new filters (the bad file's g9 has
     * no node: a create that used it would fail). */
    CHECK(cluster_wait_placement(&c, 0, (int[]){0, 1, 2}, 3, 5000),
          "new filters are not placed on the three groups of the old topology");
    CHECK(t_create_sharded(a, "f2", 10000, 0.01, 0, 32, NULL, &st) == 0, "%s", st.message);
    CHECK(t_shard_count(c.node[3].ch, "f2") == 0, "node 3 used before it is in the topology");
    CHECK(t_shard_count(c.node[0].ch, "f2") + t_shard_count(c.node[1].ch, "f2") +
              t_shard_count(c.node[2].ch, "f2") == 32, "f2 lacks shards on the old groups");

    /* A fourth group: new filters use it. */
    cluster_write_topo(&c, 4, false, NULL);
    kill(c.router[0].pid, SIGHUP);
    CHECK(cluster_wait_placement(&c, 0, (int[]){0, 1, 2, 3}, 4, 5000),
          "router 0 does not place new filters on the fourth group after SIGHUP");
    CHECK(t_create_sharded(a, "f3", 10000, 0.01, 0, 32, NULL, &st) == 0, "%s", st.message);
    int on3 = t_shard_count(c.node[3].ch, "f3");
    CHECK(on3 > 0, "the new group holds no shard of a new filter");
    k = keys_make("f3", 0, 500);
    CHECK(t_keys(a, "Add", "f3", k, 500, out, &st) == 0, "%s", st.message);
    CHECK(t_keys(a, "MayContain", "f3", k, 500, out, &st) == 0, "%s", st.message);
    for (int i = 0; i < 500; i++)
        CHECK(out[i], "f3 key %d missing", i);
    keys_free(k, 500);
    printf("after adding a group: %d of 32 shards of a new filter on it\n", on3);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_reload);
}
