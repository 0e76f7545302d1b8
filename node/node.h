/* node: the state of one bloomgrid-node process shared by its RPC handlers.
 *
 * The store is opened (and its filters recovered) by a background thread
 * after the server starts listening; until then node_store() is NULL and
 * every data call answers UNAVAILABLE while health says NOT_SERVING.
 */
#ifndef BLOOMGRID_NODE_H
#define BLOOMGRID_NODE_H

#include <stdatomic.h>
#include <stdbool.h>

#include "node_config.h"
#include "rpc_server.h"
#include "store.h"

struct node_replicate;

struct node {
    struct node_config cfg;
    struct rpc_server *srv;
    _Atomic(struct store *) store;   /* NULL until recovery finished */
    atomic_bool stopping;
    /* Anti-entropy, with a topology: set once it runs, until it stops. */
    _Atomic(struct node_replicate *) repl;
};

static inline struct store *node_store(struct node *n)
{
    return atomic_load_explicit(&n->store, memory_order_acquire);
}

/* Handler tables in descriptor order (node_services.c). */
extern const struct rpc_handler node_rpc_public[];
extern const struct rpc_handler node_rpc_internal[];
extern const size_t node_rpc_public_count, node_rpc_internal_count;

/* Anti-entropy: pulls of changed pages from the other copies of the
 * node's group (node_replicate.c; settings topology and
 * replicate_interval_ms).  start returns the running
 * puller or NULL (out of memory, no thread); stop, called after
 * n->stopping was set and before the store closes, joins it and frees it
 * (NULL is a no-op). */
struct node_replicate *node_replicate_start(struct node *n);
void node_replicate_stop(struct node_replicate *r);

/* An operator's Resync (docs/REPLICATION.md, "Accepting a loss"), run by
 * the anti-entropy thread: what it did, in plain form for the RPC edge. */
#define NODE_RESYNC_FAILURES_MAX 64      /* messages kept; more are counted */
#define NODE_RESYNC_MSGLEN 320
struct node_resync_result {
    int code;                            /* a grpc_status_code: OK, or why
                                            nothing changed (message) */
    char message[NODE_RESYNC_MSGLEN];
    char group[64], copy[128];
    char used[16][128];                  /* members pulled from */
    unsigned nused;
    char unreachable[16][128];           /* members that did not answer */
    unsigned nunreachable;
    unsigned shards, created, left_syncing;
    char failures[NODE_RESYNC_FAILURES_MAX][NODE_RESYNC_MSGLEN];
    unsigned nfailures;                  /* all of them, kept or not */
    uint64_t pages, bytes;
};

/* Called once, on the anti-entropy thread, with the result (valid during
 * the call only). */
typedef void (*node_resync_done)(void *ctx, const struct node_resync_result *res);

/* Queue a Resync under topology version topo_version (0: any) for r's
 * thread, which calls done(ctx, ...) once: when it ran, or when the node
 * stops first (UNAVAILABLE).  Returns 0, or -EBUSY when one is queued or
 * runs (done is not called). */
int node_replicate_resync(struct node_replicate *r, uint64_t topo_version,
                          node_resync_done done, void *ctx);

#endif
