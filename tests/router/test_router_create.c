/* Router test "create": CreateFilter is all or nothing.  With a node down
 * it fails UNAVAILABLE naming the node and a shard and leaves no shard on
 * the other nodes; with the node back it creates every shard; a duplicate
 * create drops no existing shard; bad names and parameters are refused.
 *
 * usage: test_router_create NODE_BIN ROUTER_BIN
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

static void test_create(void)
{
    struct cluster c;
    struct rpc_status st;
    cluster_start(&c, "router-create", 3, 1, "none");
    struct rpc_channel *a = c.router[0].ch;
    int port = c.node[1].port;
    node_stop(&c.node[1], SIGTERM);

    int code = t_create_sharded(a, "half", 100000, 0.01, 0, 32, NULL, &st);
    CHECK(code == GRPC_STATUS_UNAVAILABLE, "create with a node down: %d %s", code,
          st.message);
    CHECK(strstr(st.message, c.node[1].addr), "message names the node: %s",
          st.message);
    CHECK(strstr(st.message, "shard "), "message names the shard: %s", st.message);
    printf("create with a node down: %s\n", st.message);
    CHECK(t_shard_count(c.node[0].ch, "half") == 0, "node 0 kept shards");
    CHECK(t_shard_count(c.node[2].ch, "half") == 0, "node 2 kept shards");
    Bloomgrid__V1__FilterInfo *fi;
    CHECK(t_get(a, "half", &fi, &st) == GRPC_STATUS_UNAVAILABLE ||
          st.code == GRPC_STATUS_NOT_FOUND, "get: %d", st.code);

    cluster_node_start(&c, 1, port, NULL);
    /* The router's channel reconnects within its backoff (at most 1 s). */
    int tries = 0;
    while ((code = t_create_sharded(a, "half", 100000, 0.01, 0, 32, NULL, &st)) ==
               GRPC_STATUS_UNAVAILABLE && tries++ < 100)
        harness_sleep_ms(50);
    CHECK(code == 0, "create after restart: %s", st.message);
    int total = 0;
    for (int i = 0; i < 3; i++)
        total += t_shard_count(c.node[i].ch, "half");
    CHECK(total == 32, "%d shards", total);

    /* A shard that already exists is never dropped by a failed create. */
    CHECK(t_create_sharded(a, "half", 100000, 0.01, 0, 32, NULL, &st) ==
          GRPC_STATUS_ALREADY_EXISTS, "duplicate: %d %s", st.code, st.message);
    total = 0;
    for (int i = 0; i < 3; i++)
        total += t_shard_count(c.node[i].ch, "half");
    CHECK(total == 32, "%d shards after a duplicate create", total);
    CHECK(t_create_sharded(a, "bad.shard-1", 10, 0.01, 0, 2, NULL, &st) ==
          GRPC_STATUS_INVALID_ARGUMENT, "reserved name");
    CHECK(t_create_sharded(a, "zero", 0, 0.01, 0, 2, NULL, &st) ==
          GRPC_STATUS_INVALID_ARGUMENT, "capacity 0");
    CHECK(t_create_sharded(a, "p1", 10, 1.0, 0, 2, NULL, &st) ==
          GRPC_STATUS_INVALID_ARGUMENT, "p = 1");
    CHECK(t_create_sharded(a, "many", 10, 0.01, 0, 5000, NULL, &st) ==
          GRPC_STATUS_INVALID_ARGUMENT, "5000 shards");
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_create);
}
