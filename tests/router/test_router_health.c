/* Health that tells the truth (docs/ROUTER.md, "Health"), with real nodes
 * and a router on loopback.
 *
 * usage: test_router_health NODE_BIN ROUTER_BIN CLI_BIN down|syncing
 *
 * down: one group of one copy.  The router's health per filter
 * ("bloomgrid.v1.BloomGrid/NAME") and its readiness go NOT_SERVING when the
 * node stops, its liveness ("") stays SERVING, and both come back with the
 * node; meanwhile `bloomgrid list` and `info` exit 2 naming the node,
 * `check` does not blame the router, `status` shows the copy unreachable.
 * The health_listen of node and router answer health and refuse the
 * BloomGrid service (UNIMPLEMENTED).
 *
 * syncing: one group of three copies, W = 2, R = 2.  A wiped copy that is
 * SYNCING is alive ("" SERVING) and not ready ("bloomgrid.v1.BloomGrid"
 * NOT_SERVING) on its health_listen; with another copy stopped the group
 * has one serving copy, so the router's filter is NOT_SERVING and `status`
 * shows SYNCING and unreachable; with the stopped copy back, all of it is
 * SERVING again.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "cluster.h"

#define S 4
#define FILTER_HEALTH "bloomgrid.v1.BloomGrid/f"

static const char *cli_bin;
static char out_path[700], err_path[700];

/* 1 SERVING, 2 NOT_SERVING, negative: -grpc code. */
static int health_on(struct rpc_channel *ch, const char *service)
{
    struct node_proc p = {.ch = ch};
    return node_health(&p, service);
}

static bool wait_health(struct rpc_channel *ch, const char *service, int want)
{
    for (int i = 0; i < 300; i++) {
        if (health_on(ch, service) == want)
            return true;
        harness_sleep_ms(50);
    }
    return false;
}

/* Run the CLI with args (NULL-terminated) against server; its stdout and
 * stderr go to out_path and err_path.  Returns its exit status. */
static int cli(const char *server, const char *const *args)
{
    const char *argv[32] = {cli_bin, "--server", server};
    int a = 3;
    for (int i = 0; args[i] && a < 31; i++)
        argv[a++] = args[i];
    argv[a] = NULL;
    unlink(out_path);
    unlink(err_path);
    return harness_run(argv, out_path, err_path, NULL, 0);
}

static bool said(const char *path, const char *needle)
{
    return harness_log_count(path, needle) > 0;
}

/* A BloomGrid call on a health listener: UNIMPLEMENTED. */
static void refuses_bloomgrid(struct rpc_channel *ch, const char *who)
{
    Bloomgrid__V1__ListFiltersRequest rq = BLOOMGRID__V1__LIST_FILTERS_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    struct rpc_status st;
    CHECK(rpc_call(ch, "/bloomgrid.v1.BloomGrid/ListFilters", &rq.base,
                   &bloomgrid__v1__list_filters_response__descriptor, &resp, 2000,
                   &st) < 0 && st.code == GRPC_STATUS_UNIMPLEMENTED,
          "%s health_listen: ListFilters answered %s, not UNIMPLEMENTED", who,
          rpc_status_name(st.code));
}

static void setup(struct cluster *c, const char *tag, int copies, const char *head)
{
    static const char *const node_flags[] = {"--health-listen", "127.0.0.1:0", NULL};
    static const char *const router_flags[] = {"--health-listen", "127.0.0.1:0",
                                               "--health-probe-ms", "100", NULL};
    cluster_init(c, tag, "fsync");
    c->node_flags = node_flags;
    c->router_flags = router_flags;
    cluster_run_copies(c, 1, copies, head, 1);
    snprintf(out_path, sizeof out_path, "%s/cli.out", c->dir);
    snprintf(err_path, sizeof err_path, "%s/cli.err", c->dir);
}

static void test_down(void)
{
    struct cluster c;
    struct rpc_status st;
    const char *server;

    setup(&c, "router-health-down", 1, NULL);
    server = c.router[0].addr;
    CHECK(c.router[0].haddr[0] && c.node[0].haddr[0], "no health listener address");
    struct rpc_channel *rh = rpc_channel_create(c.router[0].haddr, 0);
    struct rpc_channel *nh = rpc_channel_create(c.node[0].haddr, 0);
    CHECK(rh && nh, "channel");
    CHECK(wait_health(rh, "", 1), "router health_listen: \"\" not SERVING");
    CHECK(wait_health(nh, "", 1), "node health_listen: \"\" not SERVING");
    refuses_bloomgrid(rh, "router");
    refuses_bloomgrid(nh, "node");
    printf("health_listen: health answered, BloomGrid UNIMPLEMENTED\n");

    CHECK(t_create_sharded(c.router[0].ch, "f", 10000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    CHECK(wait_health(rh, FILTER_HEALTH, 1), "filter health not SERVING");
    CHECK(health_on(rh, "bloomgrid.v1.BloomGrid") == 1, "readiness not SERVING");
    CHECK(cli(server, (const char *[]){"list", NULL}) == 0, "list with the node up");
    CHECK(cli(server, (const char *[]){"info", "f", NULL}) == 0, "info with the node up");
    CHECK(cli(server, (const char *[]){"status", "--topology", c.topo, NULL}) == 0 &&
              said(out_path, "serving") && said(out_path, "1 of 1 copies serving"),
          "status with the node up");

    node_stop(&c.node[0], SIGTERM);
    CHECK(wait_health(c.router[0].ch, FILTER_HEALTH, 2),
          "filter health still SERVING with its only copy stopped");
    CHECK(health_on(c.router[0].ch, "bloomgrid.v1.BloomGrid") == 2,
          "readiness still SERVING with the only copy stopped");
    CHECK(health_on(c.router[0].ch, "bloomgrid.v1.BloomGrid/never-seen") == 2,
          "a filter not seen yet is judged by every group");
    CHECK(health_on(c.router[0].ch, "") == 1, "liveness went NOT_SERVING");
    CHECK(health_on(rh, FILTER_HEALTH) == 2, "health_listen disagrees");
    printf("node stopped: filter and readiness NOT_SERVING, liveness SERVING\n");

    CHECK(cli(server, (const char *[]){"list", NULL}) == 2 &&
              said(err_path, "group g0") && said(err_path, c.node[0].addr),
          "list with the node down: not exit 2 naming the group and node");
    CHECK(cli(server, (const char *[]){"info", "f", NULL}) == 2 &&
              said(err_path, c.node[0].addr),
          "info with the node down: not exit 2 naming the node");
    CHECK(cli(server, (const char *[]){"check", "f", "k", NULL}) == 2 &&
              !said(err_path, "cannot reach server") && said(err_path, c.node[0].addr),
          "check with the node down blames the router, not the node");
    CHECK(cli(server, (const char *[]){"status", "--topology", c.topo, NULL}) == 1 &&
              said(out_path, "unreachable") && said(out_path, "NOT READABLE") &&
              said(out_path, "NOT_SERVING"),
          "status with the node down");
    printf("node stopped: list, info, check exit 2 naming it; status exit 1\n");

    cluster_node_start(&c, 0, c.node[0].port, NULL);
    CHECK(wait_health(c.router[0].ch, FILTER_HEALTH, 1),
          "filter health not SERVING again with the node back");
    CHECK(wait_health(c.router[0].ch, "bloomgrid.v1.BloomGrid", 1), "readiness not back");
    CHECK(cli(server, (const char *[]){"list", NULL}) == 0, "list with the node back");
    printf("node back: SERVING, list exit 0\n");
    rpc_channel_destroy(rh);
    rpc_channel_destroy(nh);
    cluster_stop(&c);
}


static void test_syncing(void)
{
    struct cluster c;
    struct rpc_status st;
    const int SY = 1, STOPPED = 2;

    setup(&c, "router-health-syncing", 3, "write_quorum = 2\nread_quorum = 2\n");
    CHECK(t_create_sharded(c.router[0].ch, "f", 10000, 0.01, 0, S, NULL, &st) == 0,
          "create: %s", st.message);
    CHECK(wait_health(c.router[0].ch, FILTER_HEALTH, 1), "filter health not SERVING");

    harness_sigstop(c.node[STOPPED].pid);
    cluster_node_wipe(&c, SY);
    CHECK(t_wait_shard_states(c.node[SY].ch, "f", S, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING,
                      60000), "the wiped copy's shards are not re-created SYNCING");
    struct rpc_channel *hh = rpc_channel_create(c.node[SY].haddr, 0);
    CHECK(hh, "channel");
    /* Liveness follows the filters' states, refreshed every 200 ms: a
     * shard re-created a moment ago may still count as not ready. */
    CHECK(wait_health(hh, "", 1), "SYNCING copy: liveness (\"\") not SERVING");
    CHECK(health_on(hh, "bloomgrid.v1.BloomGrid") == 2,
          "SYNCING copy: readiness (bloomgrid.v1.BloomGrid) not NOT_SERVING");
    printf("SYNCING copy: liveness SERVING, readiness NOT_SERVING\n");
    CHECK(wait_health(c.router[0].ch, FILTER_HEALTH, 2),
          "filter health SERVING with one serving copy of R = 2");
    CHECK(cli(c.router[0].addr, (const char *[]){"status", "--topology", c.topo, NULL}) == 1 &&
              said(out_path, "SYNCING") && said(out_path, "unreachable") &&
              said(out_path, "1 of 3 copies serving"),
          "status with a copy SYNCING and one stopped");
    printf("one copy SYNCING, one stopped: filter NOT_SERVING, status exit 1\n");

    kill(c.node[STOPPED].pid, SIGCONT);
    CHECK(t_wait_shard_states(c.node[SY].ch, "f", S, BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY,
                      60000), "the wiped copy does not leave SYNCING");
    CHECK(wait_health(hh, "bloomgrid.v1.BloomGrid", 1), "readiness not back after SYNCING");
    CHECK(wait_health(c.router[0].ch, FILTER_HEALTH, 1),
          "filter health not SERVING with every copy back");
    CHECK(cli(c.router[0].addr, (const char *[]){"status", "--topology", c.topo, NULL}) == 0,
          "status with every copy serving");
    printf("copies back: SERVING, status exit 0\n");
    rpc_channel_destroy(hh);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN CLI_BIN down|syncing\n", argv[0]);
        return 2;
    }
    cli_bin = argv[3];
    char *cargv[] = {argv[0], argv[1], argv[2], NULL};
    return cluster_test_main(3, cargv,
                             strcmp(argv[4], "syncing") == 0 ? test_syncing : test_down);
}
