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

struct node {
    struct node_config cfg;
    struct rpc_server *srv;
    _Atomic(struct store *) store;   /* NULL until recovery finished */
    atomic_bool stopping;
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
struct node_replicate;
struct node_replicate *node_replicate_start(struct node *n);
void node_replicate_stop(struct node_replicate *r);

#endif
