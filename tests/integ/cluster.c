/* cluster: loopback clusters of nodes and routers for integration tests. */
#include "cluster.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>

#define PROBE_FILTER "topology-probe"
#define PROBE_SHARDS 16

/* A node's address in the topology, and the channel of its internal
 * service: the internal listener's when it has one. */
static const char *topo_addr(const struct node_proc *np)
{
    return np->iaddr[0] ? np->iaddr : np->addr;
}

static struct rpc_channel *internal_ch(const struct node_proc *np)
{
    return np->ich ? np->ich : np->ch;
}

void cluster_init(struct cluster *c, const char *tag, const char *durability)
{
    memset(c, 0, sizeof *c);
    harness_tmpdir(c->dir, sizeof c->dir, tag);
    snprintf(c->topo, sizeof c->topo, "%s/topology.ini", c->dir);
    snprintf(c->durability, sizeof c->durability, "%s", durability);
    c->copies = 1;
    c->topo_version = 1;
    for (int i = 0; i < CLUSTER_MAX_NODES; i++)
        snprintf(c->node_dir[i], sizeof c->node_dir[i], "%s/node%d", c->dir, i);
}

void cluster_start_flags(struct cluster *c, const char *tag, int nnodes, int nrouters,
                         const char *durability, const char *const *router_flags)
{
    cluster_init(c, tag, durability);
    for (int i = 0; i < nnodes; i++)
        cluster_node_start(c, i, 0, NULL);
    cluster_write_topo(c, nnodes, false, NULL);
    for (int i = 0; i < nrouters; i++)
        cluster_router_start(c, i, router_flags);
}

void cluster_start_copies(struct cluster *c, const char *tag, int ngroups, int copies,
                          const char *head, int nrouters)
{
    cluster_init(c, tag, "fsync");
    cluster_run_copies(c, ngroups, copies, head, nrouters);
}

void cluster_run_copies(struct cluster *c, int ngroups, int copies, const char *head,
                        int nrouters)
{
    int n = ngroups * copies;
    CHECK(n <= CLUSTER_MAX_NODES, "%d nodes", n);
    c->copies = copies;
    snprintf(c->topo_head, sizeof c->topo_head, "%s", head ? head : "");
    /* The ports are known once the nodes listen: start them, write the
     * topology, then restart them on the same ports reading it. */
    for (int i = 0; i < n; i++)
        cluster_node_start(c, i, 0, NULL);
    cluster_write_topo(c, n, false, NULL);
    c->node_topo = true;
    for (int i = 0; i < n; i++)
        cluster_node_restart(c, i, SIGTERM, NULL);
    /* Each copy answers reads once it has heard from its peers. */
    for (int i = 0; i < n && copies > 1; i++)
        CHECK(cluster_wait_reads(c, i, 20000), "node %d does not answer reads", i);
    for (int i = 0; i < nrouters; i++)
        cluster_router_start(c, i, NULL);
}

void cluster_start(struct cluster *c, const char *tag, int nnodes, int nrouters,
                   const char *durability)
{
    cluster_start_flags(c, tag, nnodes, nrouters, durability, NULL);
}

void cluster_stop(struct cluster *c)
{
    for (int i = 0; i < c->nrouters; i++)
        CHECK(node_stop(&c->router[i], SIGTERM) == 0, "router %d exit status", i);
    for (int i = 0; i < c->nnodes; i++)
        if (c->node[i].pid > 0)
            node_stop(&c->node[i], SIGTERM);
}

void cluster_node_start(struct cluster *c, int i, int port, const char *const *more)
{
    char listen[64], ilisten[64];
    const char *extra[10 + 3 * CLUSTER_MAX_FLAGS + 1] = {"--durability", c->durability,
                                                         "--threads", "4"};
    int a = 4;
    if (c->internal) {
        /* A restart keeps the internal port the topology lists. */
        snprintf(ilisten, sizeof ilisten, "127.0.0.1:%d", port ? c->node[i].iport : 0);
        extra[a++] = "--internal-listen";
        extra[a++] = ilisten;
    }
    for (int k = 0; c->node_flags && c->node_flags[k]; k++) {
        CHECK(k < 2 * CLUSTER_MAX_FLAGS, "too many node flags");
        extra[a++] = c->node_flags[k];
    }
    if (c->node_topo) {
        extra[a++] = "--topology";
        extra[a++] = c->topo;
    }
    CHECK(i >= 0 && i < CLUSTER_MAX_NODES, "node %d", i);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    if (port) {
        extra[a++] = "--listen";
        extra[a++] = listen;
    }
    for (int k = 0; more && more[k]; k++) {
        CHECK(k < CLUSTER_MAX_FLAGS, "too many node flags");
        extra[a++] = more[k];
    }
    extra[a] = NULL;
    node_start(&c->node[i], c->node_dir[i], extra);
    CHECK(node_wait_health(&c->node[i], true, 20000), "node %d not serving", i);
    if (i >= c->nnodes)
        c->nnodes = i + 1;
}

bool cluster_wait_reads(struct cluster *c, int i, int timeout_ms)
{
    for (int waited = 0; waited < timeout_ms; waited += 20) {
        if (node_health(&c->node[i], "bloomgrid.v1.BloomGrid") == 1)
            return true;
        harness_sleep_ms(20);
    }
    return false;
}

void cluster_node_restart(struct cluster *c, int i, int sig, const char *const *more)
{
    node_stop(&c->node[i], sig);
    cluster_node_start(c, i, c->node[i].port, more);
}

void cluster_node_wipe(struct cluster *c, int i)
{
    char cmd[700];
    node_stop(&c->node[i], SIGKILL);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->node_dir[i]);
    CHECK(system(cmd) == 0, "%s", cmd);
    cluster_node_start(c, i, c->node[i].port, NULL);
}

void cluster_router_start(struct cluster *c, int i, const char *const *more)
{
    struct node_proc *rp = &c->router[i];
    char log[sizeof rp->log];
    const char *extra[4 + 3 * CLUSTER_MAX_FLAGS + 1] = {"--node-timeout-ms", "3000",
                                                        "--threads", "4"};
    int a = 4;
    for (int k = 0; c->router_flags && c->router_flags[k]; k++) {
        CHECK(k < 2 * CLUSTER_MAX_FLAGS, "too many router flags");
        extra[a++] = c->router_flags[k];
    }
    CHECK(i >= 0 && i < CLUSTER_MAX_ROUTERS, "router %d", i);
    for (int k = 0; more && more[k]; k++) {
        CHECK(k < CLUSTER_MAX_FLAGS, "too many router flags");
        extra[a++] = more[k];
    }
    extra[a] = NULL;
    snprintf(log, sizeof log, "%s/router%d.log", c->dir, i);
    router_start(rp, log, c->topo, extra);
    CHECK(node_wait_health(rp, true, 10000), "router %d not serving", i);
    if (i >= c->nrouters)
        c->nrouters = i + 1;
}

void cluster_write_topo(struct cluster *c, int n, bool reversed, const char *extra)
{
    FILE *f = fopen(c->topo, "w");
    CHECK(f, "open %s", c->topo);
    int groups = n / c->copies;
    fprintf(f, "; test topology\nversion = %llu\n%s", c->topo_version, c->topo_head);
    for (int k = 0; k < groups; k++) {
        int g = reversed ? groups - 1 - k : k;
        fprintf(f, "[group g%d]\ncopies =", g);
        for (int i = g * c->copies; i < (g + 1) * c->copies; i++)
            fprintf(f, " %s", topo_addr(&c->node[i]));
        fprintf(f, "\n\n");
    }
    if (extra)
        fputs(extra, f);
    fclose(f);
}

void cluster_view_start(struct cluster *c, int i, struct node_proc *view)
{
    char path[700], log[700];
    snprintf(path, sizeof path, "%s/view%d.ini", c->dir, i);
    snprintf(log, sizeof log, "%s/view%d.log", c->dir, i);
    FILE *f = fopen(path, "w");
    CHECK(f, "open %s", path);
    fprintf(f, "version = %llu\n[group g0]\ncopies = %s\n", c->topo_version,
            topo_addr(&c->node[i]));
    fclose(f);
    router_start(view, log, path, NULL);
    CHECK(node_wait_health(view, true, 10000), "view router of node %d", i);
}

/* Does the probe's placement name exactly the nodes nodes[0, n)? */
static bool probe_matches(const struct cluster *c, const Bloomgrid__V1__FilterInfo *fi,
                          const int *nodes, int n)
{
    bool used[CLUSTER_MAX_NODES] = {false};
    for (size_t s = 0; s < fi->n_shard_info; s++) {
        int j = 0;
        while (j < n && strcmp(fi->shard_info[s]->node, topo_addr(&c->node[nodes[j]])) != 0)
            j++;
        if (j == n)
            return false;   /* a shard on a node not in the set */
        used[j] = true;
    }
    for (int j = 0; j < n; j++)
        if (!used[j])
            return false;
    return true;
}

/* Drop the probe through router r; should the topology have changed since
 * its create (the drop then misses shards), drop its shards on every
 * running node directly. */
static void probe_drop(struct cluster *c, int r, const char *name)
{
    struct rpc_status st;
    if (t_drop(c->router[r].ch, name, &st) == 0)
        return;
    for (int i = 0; i < c->nnodes; i++) {
        if (c->node[i].pid <= 0)
            continue;
        Bloomgrid__V1__ListShardsRequest rq = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
        Bloomgrid__V1__ListShardsResponse *ls = NULL;
        CHECK(rpc_call(internal_ch(&c->node[i]), "/bloomgrid.v1.Internal/ListShards", &rq.base,
                       &bloomgrid__v1__list_shards_response__descriptor,
                       (ProtobufCMessage **)&ls, TIMEOUT_MS, &st) == 0,
              "ListShards on node %d: %s", i, st.message);
        for (size_t k = 0; k < ls->n_shards; k++) {
            if (strcmp(ls->shards[k]->filter, name) != 0)
                continue;
            Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
            ProtobufCMessage *resp = NULL;
            ref.filter = (char *)name;
            ref.shard_index = ls->shards[k]->shard_index;
            CHECK(rpc_call(internal_ch(&c->node[i]), "/bloomgrid.v1.Internal/DropShard", &ref.base,
                           &bloomgrid__v1__drop_shard_response__descriptor, &resp,
                           TIMEOUT_MS, &st) == 0,
                  "drop shard %u of %s on node %d: %s", ref.shard_index, name, i,
                  st.message);
            protobuf_c_message_free_unpacked(resp, NULL);
        }
        bloomgrid__v1__list_shards_response__free_unpacked(ls, NULL);
    }
}

bool cluster_wait_placement(struct cluster *c, int r, const int *nodes, int n,
                            int timeout_ms)
{
    static unsigned probes;
    struct rpc_status st;
    CHECK(n > 0 && n <= CLUSTER_MAX_NODES, "%d nodes", n);
    double end = harness_now_s() + timeout_ms / 1000.0;
    for (;;) {
        /* A new name each time: another placement, should this one leave a
         * node of the set without a shard. */
        char name[64];
        snprintf(name, sizeof name, "%s-%u", PROBE_FILTER, ++probes);
        Bloomgrid__V1__FilterInfo *fi = NULL;
        CHECK(t_create_sharded(c->router[r].ch, name, 100 * PROBE_SHARDS, 0.01, 0,
                               PROBE_SHARDS, &fi, &st) == 0,
              "create %s through router %d: %s", name, r, st.message);
        bool match = fi->n_shard_info == PROBE_SHARDS && probe_matches(c, fi, nodes, n);
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
        probe_drop(c, r, name);
        if (match)
            return true;
        if (harness_now_s() >= end)
            return false;
        harness_sleep_ms(20);
    }
}

int cluster_test_main(int argc, char **argv, void (*test)(void))
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s NODE_BIN ROUTER_BIN\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    grpc_init();
    test();
    grpc_shutdown();
    printf("ok\n");
    return 0;
}
