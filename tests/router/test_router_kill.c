/* Router test "kill": a node killed (SIGKILL) while batches are added.
 * The batch in flight fails UNAVAILABLE naming the node and a shard, and
 * lists the keys it did not acknowledge; reads of the dead node's shards
 * fail naming it too; after its restart every acknowledged key is present,
 * those of the failed batch included.
 *
 * usage: test_router_kill NODE_BIN ROUTER_BIN
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

struct adder {
    struct rpc_channel *ch;
    atomic_bool stop;
    atomic_size_t batches_ok;   /* batches [0, batches_ok) acknowledged */
    size_t failed_batch;   /* first batch that failed */
    char failed_msg[RPC_CLIENT_MSGLEN];
    atomic_int failed_code;
};

#define KB 5000

static void *adder_main(void *arg)
{
    struct adder *ad = arg;
    bool *out = malloc(KB * sizeof *out);
    struct rpc_status st;
    for (size_t b = 0; !atomic_load(&ad->stop); b++) {
        char **k = keys_make("acked", b * KB, KB);
        int code = t_keys(ad->ch, "Add", "kill", k, KB, out, &st);
        keys_free(k, KB);
        if (code != 0) {
            ad->failed_batch = b;
            ad->failed_code = code;
            snprintf(ad->failed_msg, sizeof ad->failed_msg, "%s", st.message);
            break;
        }
        ad->batches_ok = b + 1;
    }
    free(out);
    return NULL;
}

/* Parse "not acknowledged: 1,4-9,..." into a bitmap; false when truncated. */
static bool parse_unacked(const char *msg, bool *unacked, size_t n)
{
    const char *p = strstr(msg, "not acknowledged: ");
    if (!p)
        return false;
    p += strlen("not acknowledged: ");
    while (*p) {
        if (*p == '.')
            return false;
        char *e;
        size_t a = strtoul(p, &e, 10), b = a;
        if (e == p)
            return false;
        if (*e == '-')
            b = strtoul(e + 1, &e, 10);
        for (size_t i = a; i <= b && i < n; i++)
            unacked[i] = true;
        p = e;
        if (*p == ',')
            p++;
        else
            break;
    }
    return true;
}

static void test_kill(void)
{
    struct cluster c;
    struct rpc_status st;
    cluster_start(&c, "router-kill", 3, 1, "fsync");
    struct rpc_channel *a = c.router[0].ch;
    CHECK(t_create_sharded(a, "kill", 1000000, 0.01, 0, 48, NULL, &st) == 0, "create: %s",
          st.message);
    struct adder ad = {.ch = a};
    pthread_t th;
    pthread_create(&th, NULL, adder_main, &ad);
    for (int i = 0; i < 3000 && ad.batches_ok < 10 && !ad.failed_code; i++)
        harness_sleep_ms(10);
    CHECK(ad.batches_ok >= 10, "adder stalled: %s", ad.failed_msg);
    int port = c.node[2].port;
    char addr[64];
    snprintf(addr, sizeof addr, "%s", c.node[2].addr);
    node_stop(&c.node[2], SIGKILL);
    pthread_join(th, NULL);
    printf("after %zu acknowledged batches: %s: %s\n", ad.batches_ok,
           rpc_status_name(ad.failed_code), ad.failed_msg);
    CHECK(ad.failed_code == GRPC_STATUS_UNAVAILABLE, "code %d", ad.failed_code);
    CHECK(strstr(ad.failed_msg, addr), "message names the node %s", addr);
    CHECK(strstr(ad.failed_msg, "shard "), "message names the shard");
    bool unacked[KB] = {0};
    bool listed = parse_unacked(ad.failed_msg, unacked, KB);

    /* Reads of the dead node's shards fail naming it too. */
    char **k = keys_make("acked", 0, 1000);
    bool *out = malloc(KB * sizeof *out);
    CHECK(t_keys(a, "MayContain", "kill", k, 1000, out, &st) == GRPC_STATUS_UNAVAILABLE,
          "read with a node down: %d", st.code);
    CHECK(strstr(st.message, addr), "read message names the node: %s", st.message);
    keys_free(k, 1000);

    cluster_node_start(&c, 2, port, NULL);
    /* The channel reconnects: retry briefly while it does. */
    for (size_t b = 0; b < ad.batches_ok; b++) {
        k = keys_make("acked", b * KB, KB);
        int code, tries = 0;
        while ((code = t_keys(a, "MayContain", "kill", k, KB, out, &st)) ==
                   GRPC_STATUS_UNAVAILABLE && tries++ < 100)
            harness_sleep_ms(50);
        CHECK(code == 0, "MayContain after restart: %s", st.message);
        for (size_t i = 0; i < KB; i++)
            CHECK(out[i], "acknowledged key %s lost", k[i]);
        keys_free(k, KB);
    }
    size_t extra = 0;
    if (listed) {
        k = keys_make("acked", ad.failed_batch * KB, KB);
        CHECK(t_keys(a, "MayContain", "kill", k, KB, out, &st) == 0, "%s", st.message);
        for (size_t i = 0; i < KB; i++) {
            if (!unacked[i]) {
                CHECK(out[i], "key %s reported acknowledged but missing", k[i]);
                extra++;
            }
        }
        keys_free(k, KB);
    }
    printf("%zu batches and %zu keys of the failed batch verified present\n",
           ad.batches_ok, extra);
    free(out);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test_kill);
}
