/* cluster: a loopback cluster of bloomgrid nodes and routers for
 * integration tests, built on the harness.
 *
 * A struct cluster owns one temporary directory holding a data directory per
 * node (<dir>/node<i>, logging to <dir>/node<i>.log), the routers' logs
 * (<dir>/router<i>.log) and the topology file the routers read
 * (<dir>/topology.ini: one group g<i> per node, or with cluster_start_copies
 * groups of several copies that the nodes read too).  Every process
 * listens on a free loopback port.  Nodes run with --threads 4 and the
 * cluster's durability; routers with --threads 4 and --node-timeout-ms 3000.
 * Single-threaded use; failures die (CHECK) like the harness.
 */
#ifndef BLOOMGRID_TEST_CLUSTER_H
#define BLOOMGRID_TEST_CLUSTER_H

#include <stdbool.h>

#include "harness.h"

#define CLUSTER_MAX_NODES 6
#define CLUSTER_MAX_ROUTERS 2
#define CLUSTER_MAX_FLAGS 8     /* further flags a node or router may get */

struct cluster {
    char dir[512];
    char topo[600];
    char durability[16];        /* --durability of every node */
    int nnodes;                 /* nodes [0, nnodes) have been started */
    int nrouters;
    struct node_proc node[CLUSTER_MAX_NODES];
    char node_dir[CLUSTER_MAX_NODES][600];
    struct node_proc router[CLUSTER_MAX_ROUTERS];
    int copies;                 /* per group (1 unless cluster_start_copies) */
    unsigned long long topo_version;   /* written as version = (from 1) */
    char topo_head[256];        /* settings written before the groups */
    bool node_topo;             /* nodes start with --topology */
    /* Set after cluster_init, before starting processes (all may be left
     * unset): flags every node and every router gets (NULL-terminated),
     * and whether nodes listen on an internal address too
     * (--internal-listen; the topology then lists those addresses). */
    const char *const *node_flags;
    const char *const *router_flags;
    bool internal;
};

/* Set c up on a fresh temporary directory named after tag, with nodes of
 * the given durability ("none", "fsync"...); starts nothing. */
void cluster_init(struct cluster *c, const char *tag, const char *durability);

/* cluster_init, then nnodes nodes, the topology of all of them, and nrouters
 * routers, each waited for until it is SERVING. */
void cluster_start(struct cluster *c, const char *tag, int nnodes, int nrouters,
                   const char *durability);

/* cluster_start with further flags for every router (NULL-terminated, may
 * be NULL). */
void cluster_start_flags(struct cluster *c, const char *tag, int nnodes, int nrouters,
                         const char *durability, const char *const *router_flags);

/* cluster_init, then ngroups * copies nodes forming groups g0, g1, ...
 * of copies nodes each (node k in group k / copies), the topology with
 * head (settings before the groups, e.g. "write_quorum = 2\n"; may be
 * NULL), every node restarted on its port reading it (--topology), and
 * nrouters routers.  Nodes run with durability fsync. */
void cluster_start_copies(struct cluster *c, const char *tag, int ngroups, int copies,
                          const char *head, int nrouters);
/* The same on a cluster already set up with cluster_init (durability
 * fsync): its node_flags, router_flags and internal apply. */
void cluster_run_copies(struct cluster *c, int ngroups, int copies, const char *head,
                        int nrouters);

/* Stop every router (each must exit 0 on SIGTERM) and every running node. */
void cluster_stop(struct cluster *c);

/* Start node i on its data directory and wait until it is SERVING.  port 0
 * picks a free port; a restarted node passes its old c->node[i].port.  more:
 * further flags (NULL-terminated, may be NULL). */
void cluster_node_start(struct cluster *c, int i, int port, const char *const *more);

/* Wait until node i answers reads: the health of its public service
 * (bloomgrid.v1.BloomGrid) is SERVING, i.e. no shard is SYNCING and a
 * copy of a group has checked its epoch with its peers.  Returns whether
 * it did within timeout_ms. */
bool cluster_wait_reads(struct cluster *c, int i, int timeout_ms);

/* Stop node i with sig and start it again on the same gRPC port and data
 * with the flags more (NULL-terminated, may be NULL). */
void cluster_node_restart(struct cluster *c, int i, int sig, const char *const *more);

/* Kill node i (SIGKILL), delete its data directory and start it again on
 * its port: a copy that lost its disk. */
void cluster_node_wipe(struct cluster *c, int i);

/* Start router i on the cluster's topology with the flags more
 * (NULL-terminated, may be NULL) and wait until it is SERVING. */
void cluster_router_start(struct cluster *c, int i, const char *const *more);

/* Start a "view" router on a topology of node i alone (one group of one
 * copy, the cluster's version): what that copy answers by itself.  The
 * caller stops it (node_stop). */
void cluster_view_start(struct cluster *c, int i, struct node_proc *view);

/* Write the topology file: version c->topo_version, c->topo_head, then
 * one group per c->copies nodes of [0, n) (g<i> for nodes i*copies..), in
 * reverse file order when reversed (the same topology), then the text extra
 * (may be NULL). */
void cluster_write_topo(struct cluster *c, int n, bool reversed, const char *extra);

/* Wait until router r places the shards of a new filter on the nodes
 * nodes[0, n), each holding at least one, and on no other node: a probe
 * filter of 16 shards (a new name each time) is created through r, its
 * placement read from the answer, and dropped, until one matches (a
 * topology reloaded by SIGHUP is in force) or timeout_ms passed.  Returns
 * whether one matched; dies if a probe cannot be created. */
bool cluster_wait_placement(struct cluster *c, int r, const int *nodes, int n,
                            int timeout_ms);

/* The main of a cluster test program, "PROG NODE_BIN ROUTER_BIN": sets the
 * harness's binaries, runs test and prints "ok".  Returns the exit code. */
int cluster_test_main(int argc, char **argv, void (*test)(void));

#endif
