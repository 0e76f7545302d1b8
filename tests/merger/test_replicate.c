/* Integration test of anti-entropy between the copies of a group (nodes
 * reading the topology; node_replicate.c), with no merger.
 *
 * usage: test_replicate NODE_BIN ROUTER_BIN
 *   One group of two copies, write quorum 1 (read quorum 2).  With copy 1
 *   down, keys are acknowledged by copy 0 alone; copy 1, restarted, pulls
 *   them from copy 0 and then holds every one of them by itself (read
 *   through a router that asks copy 1 only).  Keys written later with copy
 *   0 down reach copy 0 the same way once it is back.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#include "cluster.h"

#define NKEYS 3000
#define INTERVAL "50"

/* Wait until node i alone holds every key of k; false after timeout_ms. */
static bool wait_copy_has(struct cluster *c, int i, char **k, int timeout_ms)
{
    struct node_proc view = {0};
    bool all = false;
    /* A restarted copy reads once it has checked its epoch with its peer. */
    CHECK(cluster_wait_reads(c, i, timeout_ms), "copy %d does not answer reads", i);
    cluster_view_start(c, i, &view);
    for (int t = 0; t < timeout_ms && !all; t += 50) {
        all = keys_present(view.ch, "f", k, NKEYS, NULL) == NKEYS;
        if (!all)
            harness_sleep_ms(50);
    }
    node_stop(&view, SIGTERM);
    return all;
}

/* Wait (bounded) until the router reaches a restarted copy again: its
 * channel reconnects within the reconnect backoff (1 s at most). */
static void wait_writable(struct cluster *c)
{
    char *probe[] = {"probe"};
    bool out[1];
    struct rpc_status st;
    int code = -1;
    for (int i = 0; i < 100 && code != 0; i++)
        if ((code = t_keys(c->router[0].ch, "Add", "f", probe, 1, out, &st)) != 0)
            harness_sleep_ms(50);
    CHECK(code == 0, "writes stay refused: %s", st.message);
}

static void test(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *fast[] = {"--replicate-interval-ms", INTERVAL, NULL};

    cluster_start_copies(&c, "anti-entropy", 1, 2,
                         "write_quorum = 1\nread_quorum = 2\n", 1);
    CHECK(t_create_sharded(c.router[0].ch, "f", 100000, 0.01, 0, 2, NULL, &st) == 0,
          "create: %s", st.message);

    node_stop(&c.node[1], SIGKILL);
    char **k1 = keys_make("a", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k1, NKEYS, 500, NULL);
    cluster_node_start(&c, 1, c.node[1].port, fast);
    CHECK(wait_copy_has(&c, 1, k1, 20000), "copy 1 did not pull the keys it missed");
    printf("copy 1 pulled the %d keys it missed\n", NKEYS);

    node_stop(&c.node[0], SIGKILL);
    wait_writable(&c);
    char **k2 = keys_make("b", 0, NKEYS);
    keys_call(c.router[0].ch, "Add", "f", k2, NKEYS, 500, NULL);
    cluster_node_start(&c, 0, c.node[0].port, fast);
    CHECK(wait_copy_has(&c, 0, k2, 20000), "copy 0 did not pull the keys it missed");
    CHECK(wait_copy_has(&c, 0, k1, 1000), "copy 0 lost keys");
    printf("copy 0 pulled the %d keys it missed\n", NKEYS);
    keys_free(k1, NKEYS);
    keys_free(k2, NKEYS);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    return cluster_test_main(argc, argv, test);
}
