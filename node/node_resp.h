/* node_resp: the node's backend of the Redis door (resp_server.h): what
 * BF.* commands do to the node's store, with the same rules as the gRPC
 * handlers (node_keys_rpc.c, node_catalog_rpc.c): the refusals of a copy
 * in a group of N > 1 (keys and the catalog go through routers), SYNCING
 * and held shards, FAILED filters, the store's budgets, writes answered
 * once durable.  Refusals are the gRPC handlers' own statuses and
 * messages, written as Redis errors.
 *
 * Threads: bf() and pass_end() on the door's loop thread: reads and the
 * hashing of a write run there (in memory), and the adds of one loop pass
 * to a filter are joined into one write started at the pass's end; a write
 * is answered from the log's completer once durable, or, with
 * resp_commit = loop and durability fsync, from the loop thread itself,
 * which writes and syncs the pass's records at its end when the log's
 * commit thread is idle (wal_lead), after waiting a while for the
 * clients its last group answered (pass_wait_ns: wal_commit_delay_us, at
 * most that group's time); creations and drops (disk work) run on libuv's
 * pool.
 */
#ifndef BLOOMGRID_NODE_RESP_H
#define BLOOMGRID_NODE_RESP_H

#include "node.h"
#include "resp_server.h"

/* The backend for node n (n outlives the door). */
void node_resp_backend(struct node *n, struct resp_backend *be);

#endif
