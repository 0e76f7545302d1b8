/* router_resp: the router's backend of the Redis door (resp_server.h).
 *
 * The keys of every RESP connection join the same coalesced per-node
 * streams as gRPC calls (router_keys_start: hashed once, split by shard,
 * quorum per shard, a batch short of a quorum fails whole), so a reply is
 * never built from fewer than the quorum, and a write's reply goes out
 * when the same gRPC Add would be acknowledged.
 *
 * Filters are used only once complete: a filter not yet found complete by
 * the door (or cached with another secret) is checked on every copy of
 * every shard (router_filter_complete) before any key is sent to it.  An add to a missing filter creates it (for an
 * admin, or without tokens; never with resp_autocreate = off) with
 * router_create_filter, which creates every shard on every copy or rolls
 * back the shards it made; a creation that meets another's (ALREADY_EXISTS,
 * a copy short) waits for that filter to be complete and goes on with it,
 * for at most 10 s (then -UNAVAILABLE: nothing was written).  Every
 * command that goes to the pool (the first check of a filter, a creation,
 * BF.INFO, BF.CARD, DEL) is answered within resp_slow_timeout_ms: past it
 * the door answers -UNAVAILABLE saying what was still under way (an add
 * then sends nothing), and the connection's later commands on that filter
 * go on (resp_call_offload_bounded).  The waits for another's creation
 * end at the same bound.
 * In a topology with a group of N > 1 copies a scaling filter cannot be
 * kept: BF.RESERVE without NONSCALING is an error naming NONSCALING, and
 * an add creates a non-scaling filter with resp_autocreate_capacity and
 * resp_autocreate_error_rate.
 *
 * A key command's keys count against the router's request budget
 * (max_memory_mb) while the router holds them, as a gRPC key call's do
 * (their bytes and 96 bytes a key); past it the command is answered "OOM"
 * naming the budget.
 *
 * The keys of a loop pass on one cached, complete filter are joined into
 * one key batch per (filter, op) at the pass's end (pass_end): one call
 * per node, one hand-back of every command to the loop; a joined batch
 * that fails runs each of its commands again alone.
 *
 * Threads: bf() and pass_end on the door's loop thread, never waiting: a
 * cached filter's keys go to the links at the pass's end; the rest runs on libuv's pool
 * (UV_THREADPOOL_SIZE, which the router sets to its `threads` setting).
 * The tables of struct router_resp are under its mutex.
 */
#ifndef BLOOMGRID_ROUTER_RESP_H
#define BLOOMGRID_ROUTER_RESP_H

#include "resp_server.h"
#include "router.h"

/* The backend's state for router r (r outlives it): the filters found
 * complete (by name, with their secret; a cached filter goes the fast way
 * only when its secret is the one found complete) and the filters being
 * created over RESP (one creation per filter at a time in this router; a
 * command that meets one waits for it to end).  NULL when out of memory. */
struct router_resp *router_resp_new(struct router *r);
/* After the door stopped (no call in flight). */
void router_resp_free(struct router_resp *d);

/* The backend on d (d outlives the door). */
void router_resp_backend(struct router_resp *d, struct resp_backend *be);

#endif
