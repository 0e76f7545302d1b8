/* Router test "create": CreateFilter is all or nothing.  With a node down
 * it fails UNAVAILABLE naming the node and a shard and leaves no shard on
 * the other nodes; with the node back it creates every shard; a duplicate
 * create drops no existing shard; bad names and parameters are refused.
 * A create that carries a secret (a restore, docs/BACKUP.md) makes a
 * filter of that secret, at a router and at a node: two filters of one
 * secret and geometry show one fingerprint; a secret of another length
 * than 32 bytes is refused.
 *
 * usage: test_router_create NODE_BIN ROUTER_BIN
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

static void test_secret(struct cluster *c);

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
    test_secret(&c);
    cluster_stop(&c);
}

/* CreateFilter with a secret of len bytes (all 0x5a); returns the status
 * code, *fp the filter's fingerprint on success. */
static int create_with_secret(struct rpc_channel *ch, const char *name,
                              uint32_t shards, size_t len, char *fp,
                              struct rpc_status *st)
{
    Bloomgrid__V1__CreateFilterRequest rq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    uint8_t secret[40];

    memset(secret, 0x5a, sizeof secret);
    rq.name = (char *)name;
    rq.capacity = 10000;
    rq.error_rate = 0.01;
    rq.shards = shards;
    rq.secret.data = secret;
    rq.secret.len = len;
    if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                 10000, st) < 0)
        return st->code;
    snprintf(fp, 17, "%s", fi->fingerprint);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    return 0;
}

static void test_secret(struct cluster *c)
{
    struct rpc_status st;
    char a[17], b[17], x[17];
    struct rpc_channel *ch[2] = {c->router[0].ch, c->node[0].ch};
    const char *where[2] = {"router", "node"};

    for (int i = 0; i < 2; i++) {
        uint32_t shards = i == 0 ? 4 : 1;
        char n1[32], n2[32];
        snprintf(n1, sizeof n1, "sec-%s-1", where[i]);
        snprintf(n2, sizeof n2, "sec-%s-2", where[i]);
        CHECK(create_with_secret(ch[i], n1, shards, 32, a, &st) == 0 &&
                  create_with_secret(ch[i], n2, shards, 32, b, &st) == 0,
              "%s: create with a secret: %s", where[i], st.message);
        CHECK(strcmp(a, b) == 0, "%s: one secret, two fingerprints %s %s", where[i], a, b);
        CHECK(t_create_sharded(ch[i], "sec-random", 10000, 0.01, 0, shards, NULL, &st) == 0,
              "%s: create: %s", where[i], st.message);
        Bloomgrid__V1__FilterInfo *fi;
        CHECK(t_get(ch[i], "sec-random", &fi, &st) == 0, "get: %s", st.message);
        CHECK(strcmp(fi->fingerprint, a) != 0, "%s: a random secret has the given "
              "one's fingerprint", where[i]);
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
        CHECK(t_drop(ch[i], "sec-random", &st) == 0, "drop: %s", st.message);
        CHECK(create_with_secret(ch[i], "sec-short", shards, 5, x, &st) ==
                  GRPC_STATUS_INVALID_ARGUMENT &&
                  strstr(st.message, "secret must be 32 bytes (or empty), not 5"),
              "%s: a 5-byte secret: %d %s", where[i], st.code, st.message);
        CHECK(t_get(ch[i], "sec-short", &fi, &st) == GRPC_STATUS_NOT_FOUND,
              "%s: a refused create made the filter", where[i]);
    }
    printf("CreateFilter with a secret: one fingerprint; 5 bytes refused\n");
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_create);
}
