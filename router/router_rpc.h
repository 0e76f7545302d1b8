/* router_rpc: the public bloomgrid.v1.BloomGrid handlers of bloomgrid-router
 * (router_rpc.c).  The handler argument is the struct router. */
#ifndef BLOOMGRID_ROUTER_RPC_H
#define BLOOMGRID_ROUTER_RPC_H

#include <stddef.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "router_nodes.h"
#include "rpc_client.h"
#include "rpc_server.h"

/* Handler table in descriptor order. */
extern const struct rpc_handler router_rpc_public[];
extern const size_t router_rpc_public_count;

/* Cross-file internals of the RPC edge. */

/* Is name a valid public filter name?  Sets the reply when not. */
bool router_rpc__name_ok(const char *name, struct rpc_reply *rep);

/* Send resp with info set to the aggregate of d (router_rpc.c).  Returns 0 or
 * -1 (the stream is gone or was finished with an error). */
int router_rpc__write_info(struct rpc_stream *s, Bloomgrid__V1__ImportResponse *resp,
                           struct router_filter_desc *d);

/* Export of sharded filters, streamed to the client as the shards' copies
 * send it (router_rpc_transfer.c), and Import, streamed to the nodes shard
 * by shard (router_rpc_import.c). */
void router_rpc__export(void *arg, struct rpc_stream *s);
void router_rpc__import(void *arg, struct rpc_stream *s);

#endif
