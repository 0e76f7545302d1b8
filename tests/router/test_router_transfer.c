/* Router test "transfer": AddStream and MayContainStream answer in order;
 * Export of a 16-shard filter gives one bundle, and Import brings it back
 * after Remove; damaged and truncated bundles are refused, and so is the
 * bundle in a filter of the same name with another secret (whose keys added
 * through a router with the old secret cached are not lost).
 *
 * usage: test_router_transfer NODE_BIN ROUTER_BIN
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

static void test_transfer(void)
{
    struct cluster c;
    struct rpc_status st;
    const size_t N = 2000;
    bool out[2000];
    cluster_start(&c, "router-transfer", 3, 2, "none");
    struct rpc_channel *a = c.router[0].ch, *b = c.router[1].ch;
    const int counting = BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING;
    CHECK(t_create_sharded(a, "cnt", 20000, 0.01, counting, 16, NULL, &st) == 0,
          "create counting: %s", st.message);
    char **k = keys_make("t", 0, N);
    /* Streams: 4 batches of 500 in, answers in order. */
    CHECK(t_stream_keys(a, "AddStream", "cnt", k, N / 4, 4, out, &st) == 0,
          "AddStream: %s", st.message);
    size_t added = 0;
    for (size_t i = 0; i < N; i++)
        added += out[i];
    CHECK(added > N * 9 / 10, "only %zu of %zu stream adds were new", added, N);
    char **mixed = malloc(N * sizeof *mixed);
    char **absent = keys_make("never", 0, N);
    for (size_t i = 0; i < N; i++)
        mixed[i] = i % 2 ? absent[i] : k[i];
    CHECK(t_stream_keys(b, "MayContainStream", "cnt", mixed, N / 4, 4, out, &st) == 0,
          "MayContainStream: %s", st.message);
    size_t neg = 0;
    for (size_t i = 0; i < N; i++) {
        if (i % 2 == 0)
            CHECK(out[i], "stream answer %zu: present key absent", i);
        else
            neg += !out[i];
    }
    CHECK(neg > N / 2 * 9 / 10, "stream: %zu of %zu absent keys said absent", neg, N / 2);
    free(mixed);
    keys_free(absent, N);

    uint8_t *bundle = NULL;
    size_t len = t_export(b, "cnt", &bundle, &st);
    CHECK(len > 0, "Export: %s", st.message);
    printf("bundle of 16 shards: %zu bytes\n", len);
    CHECK(t_keys(b, "Remove", "cnt", k, N, out, &st) == 0, "Remove: %s", st.message);
    CHECK(t_keys(a, "MayContain", "cnt", k, N, out, &st) == 0, "%s", st.message);
    size_t present = 0;
    for (size_t i = 0; i < N; i++)
        present += out[i];
    CHECK(present < N / 10, "%zu keys still present after Remove", present);

    /* Damaged bundles are refused before anything changes. */
    bundle[len / 2] ^= 1;
    CHECK(t_import(a, "cnt", bundle, len, NULL, &st) == GRPC_STATUS_INVALID_ARGUMENT,
          "damaged bundle: %d %s", st.code, st.message);
    bundle[len / 2] ^= 1;
    CHECK(t_import(a, "cnt", bundle, len - 9, NULL, &st) == GRPC_STATUS_INVALID_ARGUMENT,
          "truncated bundle: %d %s", st.code, st.message);
    uint32_t shards = 0;
    CHECK(t_import(a, "cnt", bundle, len, &shards, &st) == 0, "Import: %s", st.message);
    CHECK(shards == 16, "Import answers a filter of %u shards", shards);
    CHECK(t_keys(b, "MayContain", "cnt", k, N, out, &st) == 0, "%s", st.message);
    for (size_t i = 0; i < N; i++)
        CHECK(out[i], "key %s missing after Import", k[i]);

    /* Another filter of the same name (a new secret) refuses the bundle. */
    CHECK(t_drop(a, "cnt", &st) == 0, "drop: %s", st.message);
    CHECK(t_create_sharded(a, "cnt", 20000, 0.01, counting, 16, NULL, &st) == 0,
          "re-create: %s", st.message);
    /* Router b still caches the old secret: the nodes refuse its hashes and
     * it fetches the new secret; nothing is written with the old one. */
    CHECK(t_keys(b, "Add", "cnt", k, N, out, &st) == 0, "Add via b: %s", st.message);
    CHECK(t_keys(a, "MayContain", "cnt", k, N, out, &st) == 0, "%s", st.message);
    for (size_t i = 0; i < N; i++)
        CHECK(out[i], "key %s added through a router with a stale secret is missing",
              k[i]);
    CHECK(t_import(b, "cnt", bundle, len, NULL, &st) == GRPC_STATUS_FAILED_PRECONDITION,
          "other secret: %d %s", st.code, st.message);
    CHECK(strstr(st.message, "secret"), "message names the field: %s", st.message);
    printf("refused: %s\n", st.message);
    free(bundle);
    keys_free(k, N);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_transfer);
}
