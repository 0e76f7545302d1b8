/* Router test "replica": one group, node 0 its primary and node 1 its
 * replica (shards created with the primary's secret and brought up to and
 * past the primary's versions).  With the primary killed, reads are served
 * by the replica, which reports at least the version the router saw; writes
 * are never sent to a replica and fail naming the primary.
 *
 * usage: test_router_replica NODE_BIN ROUTER_BIN
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "cluster.h"

#define N 1000     /* keys */
#define S 4        /* shards */

/* The shards of "rep" on node 1, the replica, with the primary's secret
 * (into secret[BF_SECRET_LEN]). */
static void replica_shards(struct cluster *c, uint8_t *secret)
{
    struct rpc_status st;
    Bloomgrid__V1__GetShardRequest gq = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    gq.filter = "rep";
    gq.include_secret = true;
    CHECK(rpc_call(c->node[0].ch, "/bloomgrid.v1.Internal/GetShard", &gq.base,
                   &bloomgrid__v1__internal_shard_info__descriptor,
                   (ProtobufCMessage **)&isi, TIMEOUT_MS, &st) == 0, "%s", st.message);
    CHECK(isi->secret.len == BF_SECRET_LEN, "secret");
    memcpy(secret, isi->secret.data, BF_SECRET_LEN);
    uint64_t cap = isi->info->capacity;
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    for (uint32_t s = 0; s < S; s++) {
        Bloomgrid__V1__CreateShardRequest cq = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
        ProtobufCMessage *resp = NULL;
        cq.filter = "rep";
        cq.shard_index = s;
        cq.shard_count = S;
        cq.capacity = cap;
        cq.error_rate = 0.01;
        cq.secret.data = secret;
        cq.secret.len = BF_SECRET_LEN;
        CHECK(rpc_call(c->node[1].ch, "/bloomgrid.v1.Internal/CreateShard", &cq.base,
                       &bloomgrid__v1__internal_shard_info__descriptor, &resp,
                       TIMEOUT_MS, &st) == 0, "replica shard %u: %s", s, st.message);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
}

/* Bring the replica up to (and past) the primary's versions: every shard's
 * hashes of keys k[0, N) twice. */
static void replica_catch_up(struct cluster *c, char **k, const uint8_t *secret)
{
    struct rpc_status st;
    char err[BF_ERRLEN];
    struct bf_params bp = {.capacity = 1, .error_rate = 0.5, .secret = secret};
    struct bf *hasher = bf_create(&bp, err);
    CHECK(hasher, "%s", err);
    uint8_t *hb = malloc(16 * N);
    for (uint32_t s = 0; s < S; s++) {
        size_t n = 0;
        for (size_t i = 0; i < N; i++) {
            struct bf_hash h = bf_hash_key(hasher, k[i], strlen(k[i]));
            if (bf_hash_shard(h, S) != s)
                continue;
            for (int b = 0; b < 8; b++) {
                hb[16 * n + b] = (uint8_t)(h.h1 >> (8 * b));
                hb[16 * n + 8 + b] = (uint8_t)(h.h2 >> (8 * b));
            }
            n++;
        }
        for (int rep = 0; rep < 2; rep++) {
            Bloomgrid__V1__HashesRequest hq = BLOOMGRID__V1__HASHES_REQUEST__INIT;
            ProtobufCMessage *resp = NULL;
            hq.filter = "rep";
            hq.shard_index = s;
            hq.hashes.data = hb;
            hq.hashes.len = 16 * n;
            CHECK(rpc_call(c->node[1].ch, "/bloomgrid.v1.Internal/AddHashes", &hq.base,
                           &bloomgrid__v1__hashes_response__descriptor, &resp,
                           TIMEOUT_MS, &st) == 0, "AddHashes: %s", st.message);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
    }
    free(hb);
    bf_destroy(hasher);
}

static void test_replica(void)
{
    struct cluster c;
    struct rpc_status st;
    bool out[N];
    cluster_start(&c, "router-replica", 2, 1, "none");
    /* One group: node 0 primary, node 1 its replica. */
    FILE *f = fopen(c.topo, "w");
    fprintf(f, "[group g0]\nprimary = %s\nreplica = %s\n", c.node[0].addr,
            c.node[1].addr);
    fclose(f);
    kill(c.router[0].pid, SIGHUP);
    CHECK(cluster_wait_placement(&c, 0, (int[]){0}, 1, 5000),
          "router 0 still places shards on node 1 after SIGHUP");
    struct rpc_channel *a = c.router[0].ch;
    CHECK(t_create_sharded(a, "rep", 10000, 0.01, 0, S, NULL, &st) == 0, "%s", st.message);
    CHECK(t_shard_count(c.node[0].ch, "rep") == (int)S, "all shards on the primary");

    uint8_t secret[BF_SECRET_LEN];
    replica_shards(&c, secret);
    char **k = keys_make("rep", 0, N);
    CHECK(t_keys(a, "Add", "rep", k, N, out, &st) == 0, "%s", st.message);
    replica_catch_up(&c, k, secret);

    /* The primary dies: reads are served by the replica. */
    node_stop(&c.node[0], SIGKILL);
    CHECK(t_keys(a, "MayContain", "rep", k, N, out, &st) == 0,
          "read with the primary down: %s", st.message);
    /* (Node 1, the replica, is the only copy left to answer.) */
    for (size_t i = 0; i < N; i++)
        CHECK(out[i], "key %s missing from the replica read", k[i]);
    /* Writes are never sent to a replica. */
    CHECK(t_keys(a, "Add", "rep", k, 10, out, &st) == GRPC_STATUS_UNAVAILABLE,
          "write with the primary down: %d", st.code);
    CHECK(strstr(st.message, c.node[0].addr), "write names the primary: %s", st.message);
    keys_free(k, N);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_replica);
}
