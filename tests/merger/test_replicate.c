/* Integration test of a read replica fed straight from its primary
 * (role = replica, primary = HOST:PORT), with no merger.
 *
 * usage: test_replicate NODE_BIN
 *   Keys added to the primary become present on the replica within a few
 *   intervals, and the replica then reports a version at least the
 *   primary's; the replica refuses Add; with the primary killed the replica
 *   keeps answering for what it had and logs the failure once, not every
 *   interval; with the primary restarted on the same port replication
 *   resumes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>

#include "harness.h"
#include "node_client.h"

#define NKEYS 5000
#define INTERVAL "50"

/* The shard version a node reports (a replica: the primary's it covers). */
static uint64_t shard_version(struct rpc_channel *ch)
{
    Bloomgrid__V1__HashesRequest req = BLOOMGRID__V1__HASHES_REQUEST__INIT;
    Bloomgrid__V1__HashesResponse *resp = NULL;
    struct rpc_status st;
    uint8_t h[16] = {1, 2, 3};

    req.filter = "f";
    req.hashes.data = h;
    req.hashes.len = sizeof h;
    CHECK(rpc_call(ch, "/bloomgrid.v1.Internal/MayContainHashes", &req.base,
                   &bloomgrid__v1__hashes_response__descriptor,
                   (ProtobufCMessage **)&resp, TIMEOUT_MS, &st) == 0,
          "MayContainHashes: %s", st.message);
    uint64_t v = resp->version;
    bloomgrid__v1__hashes_response__free_unpacked(resp, NULL);
    return v;
}

/* Wait until the replica holds every key; false after timeout_ms. */
static bool wait_present(struct rpc_channel *ch, char **k, int n,
                         int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 20) {
        if (keys_present(ch, "f", k, (size_t)n, NULL) == (size_t)n)
            return true;
        harness_sleep_ms(20);
    }
    return false;
}

int main(int argc, char **argv)
{
    struct node_proc a, b;
    char da[512], db[512], port[32], listen[64];
    struct rpc_status st;
    struct node_client_shard sh;

    CHECK(argc >= 2, "usage: test_replicate NODE_BIN");
    harness_node_bin = argv[1];
    grpc_init();
    harness_tmpdir(da, sizeof da, "repl-primary");
    harness_tmpdir(db, sizeof db, "repl-replica");
    const char *fast[] = {"--durability", "none", NULL};
    node_start(&a, da, fast);
    CHECK(node_wait_health(&a, true, 20000), "node not serving");
    const char *replica[] = {"--durability", "none", "--role", "replica",
                             "--primary", a.addr,
                             "--replicate-interval-ms", INTERVAL, NULL};
    node_start(&b, db, replica);
    CHECK(node_wait_health(&b, true, 20000), "node not serving");
    CHECK(t_create(a.ch, "f", 200000, 0.01, 1, &st) == 0, "create: %s",
          st.message);
    CHECK(node_client_get_shard(a.ch, "f", 0, &sh, TIMEOUT_MS, &st) == 0, "get: %s",
          st.message);
    CHECK(node_client_create_shard(b.ch, "f", &sh, TIMEOUT_MS, &st) == 0,
          "create on the replica: %s", st.message);

    /* Keys added to the primary reach the replica, with its version. */
    char **k1 = keys_make("one", 0, NKEYS);
    keys_call(a.ch, "Add", "f", k1, NKEYS, NKEYS, NULL);
    uint64_t va = shard_version(a.ch);
    CHECK(wait_present(b.ch, k1, NKEYS, 5000), "keys did not reach the replica");
    for (int waited = 0; shard_version(b.ch) < va && waited < 2000; waited += 20)
        harness_sleep_ms(20);
    CHECK(shard_version(b.ch) >= va, "replica reports version %llu < %llu",
          (unsigned long long)shard_version(b.ch), (unsigned long long)va);
    printf("replica caught up with primary version %llu\n",
           (unsigned long long)va);

    /* The replica refuses writes. */
    bool out[1];
    char *one[] = {"x"};
    CHECK(t_keys(b.ch, "Add", "f", one, 1, out, &st) ==
              GRPC_STATUS_FAILED_PRECONDITION, "Add on the replica: %d %s",
          st.code, st.message);

    /* Primary gone: the replica serves what it had, logs once. */
    snprintf(port, sizeof port, "%d", a.port);
    CHECK(node_stop(&a, 9) != 0, "kill the primary");
    harness_sleep_ms(1000);   /* 20 intervals */
    CHECK(keys_present(b.ch, "f", k1, NKEYS, NULL) == NKEYS,
          "replica lost keys while its primary was down");
    int warned = harness_log_count(b.log, "PullPages");
    CHECK(warned >= 1 && warned <= 3, "%d warnings about the primary in 20 "
          "intervals", warned);

    /* Primary back on the same port: replication resumes. */
    snprintf(listen, sizeof listen, "127.0.0.1:%s", port);
    const char *again[] = {"--durability", "none", "--listen", listen, NULL};
    node_start(&a, da, again);
    CHECK(a.port == atoi(port), "primary came back on port %d", a.port);
    CHECK(node_wait_health(&a, true, 10000), "primary healthy");
    char **k2 = keys_make("two", 0, NKEYS);
    keys_call(a.ch, "Add", "f", k2, NKEYS, NKEYS, NULL);
    CHECK(wait_present(b.ch, k2, NKEYS, 5000),
          "replication did not resume after the primary restarted");
    CHECK(keys_present(b.ch, "f", k1, NKEYS, NULL) == NKEYS, "old keys lost");
    CHECK(harness_log_count(b.log, "resumed") >= 1, "no \"resumed\" line in %s", b.log);

    node_stop(&a, 15);
    CHECK(node_stop(&b, 15) == 0, "replica exit status");
    keys_free(k1, NKEYS);
    keys_free(k2, NKEYS);
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
