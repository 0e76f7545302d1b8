/* router_link: how the router calls a node.
 *
 * One struct router_link per node address owns the gRPC channel to that
 * node (every call the router makes to it goes there) and the router's
 * long-lived Internal/Batches streams to it, one per lane: a read lane
 * (MayContain) and a write lane (Add, Remove), so that no read waits behind
 * a write's fsync on the node.
 *
 * Callers hand over the hashes of one call, shard by shard (struct
 * router_link_entry), never gRPC messages, so every front end of the router
 * submits into the same streams.
 *
 * Coalescing: the read lane has at most one message in flight, the write
 * lane two (the second goes while the node makes the first durable, so
 * that its writes join the node's next fsync).  Calls submitted while a
 * lane's window is full wait in its queue and all travel together in the
 * next message, which leaves as soon as an answer is in; a lane with room
 * sends at once, from the submitting thread (there is no timer).  A small
 * message that goes out alone is started with the receive of its answer in
 * one batch: one completion, and no packet of its own for the receive's
 * flow-control update (router_link_int.h says when: on the write lane its
 * answers come quickly and find nothing waiting, and its second message
 * then waits for that answer; on the read lane its last answer found no
 * call waiting).  The entries of several calls with the same
 * filter, secret, operation and shard share one wire entry.  Each caller
 * gets its own answers, in its own order.  A message holds at most
 * max_message_hashes hashes (one call alone may exceed it), and only calls
 * made under one topology version (the message carries it).
 *
 * Failures: a stream that ends (the node restarted, the connection broke)
 * fails the calls of its message in flight with the stream's status, or
 * UNAVAILABLE when that says nothing better: a write whose message was sent
 * is then not acknowledged.  Calls still queued go on a new stream, opened
 * at once.  Each call has its own deadline: a call past it is taken back
 * (DEADLINE_EXCEEDED), queued or in flight, and a message in flight past a
 * caller's deadline cancels its stream (the node is stuck; the next message
 * goes on a new one).  No thread waits for a deadline: the link's thread
 * wakes for the earliest one (a call may end up to 200 ms late when the
 * link was idle and its node sends nothing).  Bytes queued and not yet sent
 * are bounded per link: a call past max_queue_bytes fails at once with
 * RESOURCE_EXHAUSTED.
 *
 * Threads: the answers and stream events are read from a completion queue:
 * a server loop's (the config's cq), by that loop's thread, or else the
 * link's own, by a thread the link starts with it.  Each link also has a
 * thread, started with it, that watches the deadlines (with its own queue,
 * the same thread).  No thread is created per call.  Every function may
 * be called from any thread.
 *
 * Ownership: calls and entries (and the hashes and answer slots they point
 * to) belong to the caller, lent to the link from router_link_submit until
 * the set's done function runs; the link touches none of them after that.
 */
#ifndef BLOOMGRID_ROUTER_LINK_H
#define BLOOMGRID_ROUTER_LINK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "rpc_client.h"
#include "rpc_status.h"

enum router_link_op { ROUTER_LINK_ADD, ROUTER_LINK_MAY_CONTAIN, ROUTER_LINK_REMOVE };

struct router_link_config {
    size_t max_message;           /* bytes per gRPC message, both ways */
    size_t max_queue_bytes;       /* hash bytes queued, not yet sent */
    size_t max_message_hashes;    /* hashes coalesced into one message */
    /* A server loop's queue (rpc_server_loop_cq): the streams' operations
     * complete there and are handled on that loop's thread, the one that
     * also serves the calls whose hashes they carry.  NULL: the link reads
     * a queue of its own on a thread of its own. */
    grpc_completion_queue *cq;
};

struct router_link;

/* Open a link to addr (a gRPC target, "host:port"): its channel and its
 * thread; streams open on first use.  NULL when out of memory or no thread
 * could be started. */
struct router_link *router_link_create(const char *addr,
                                       const struct router_link_config *cfg);

/* Cancel the streams, join the thread, close the channel.  No call may be
 * running.  With a loop's queue, that loop must still run (the streams'
 * last events complete there), and this must not run on it.  NULL is a
 * no-op. */
void router_link_destroy(struct router_link *l);

/* The node's address and channel (valid until router_link_destroy). */
const char *router_link_addr(const struct router_link *l);
struct rpc_channel *router_link_channel(struct router_link *l);

/* One shard's part of a call. */
struct router_link_entry {
    uint32_t shard;
    const struct bf_hash *h;      /* n hashes, borrowed for the call */
    uint32_t n;
    bool *out;                    /* n answers, written by the link */
    /* Filled by the link before the set's done function runs: OK with out
     * and version, or the shard's error (code, reason, message) and out
     * untouched. */
    struct rpc_status st;
    uint64_t version;
};

/* The caller's part of a call to one node; zero it, then fill the fields
 * before the private ones. */
struct router_link_call {
    struct router_link *link;
    const char *filter;           /* borrowed for the call */
    uint64_t secret_id;           /* the node refuses another secret; 0: any */
    uint64_t topology_version;    /* the caller's (BatchRequest); 0: none */
    enum router_link_op op;
    struct router_link_entry *e;  /* n entries, one per shard */
    size_t n;
    /* private to the link */
    int state;
    size_t bytes;
    struct router_link_call *qnext;
    struct link_msg *msg;
    size_t slot;
    struct link_set *set;
    int64_t deadline;             /* CLOCK_MONOTONIC ns */
    int timeout_ms;
};

/* Runs once every call of a set has its outcome. */
typedef void (*router_link_done_fn)(void *arg);

/* Submit calls[0, n) (n >= 1, each on its own link, entries of one lane
 * each), each bounded by timeout_ms, and return without waiting.  done(arg)
 * runs exactly once, when every entry has its outcome (every entry's st
 * says how it went; a set never fails as a whole): normally on the thread
 * that read the answer of the call that ended last (its link's loop or
 * own thread; the deadline thread for a call past its deadline), but on
 * the submitting thread, before router_link_submit returns, when every
 * call ended at once (shutdown, the queue bound, no memory).  done runs
 * with no lock of the link held, so it may submit again; it must not
 * block, since every other call of that loop waits for it. */
void router_link_submit(struct router_link_call *calls, size_t n, int timeout_ms,
                        router_link_done_fn done, void *arg);


#endif
