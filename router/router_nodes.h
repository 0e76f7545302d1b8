/* router_nodes: what the router asks of the nodes, in the project's own
 * terms.  router_nodes.c (filters), router_keys.c (key batches) and
 * router_catalog.c (create, drop, describe, list) implement it over the
 * internal service (bloomgrid.v1.Internal), which they call through
 * node_client.h; router_rpc.c calls it from the public handlers.
 *
 * Fan-out: a key batch is hashed once, split by shard, and each shard goes
 * to copies of its group (docs/REPLICATION.md): a write to all N at once,
 * acknowledged when W have it durable (while the group changes its copies,
 * to every member, acknowledged when W of the copies and W' of the other
 * set have it); a read to R copies (then one more for each that failed),
 * "maybe" when any answering copy says so.  The
 * entries of one node go to that node's link (router_link.h) as one call,
 * every node's at once, without waiting (the batch is answered from the
 * thread that completes it); the link sends them on its batch stream together
 * with the calls of other clients.  Answers are put back in request order,
 * and each shard reaches its quorum or fails on its own.  Catalog calls
 * (create, drop, describe, list) fan out one call per shard and copy.
 *
 * Failures: every function returns 0 or -1 with a status (rpc_status.h:
 * code, reason, a message naming the shard(s) and node(s)) in *st.
 */
#ifndef BLOOMGRID_ROUTER_NODES_H
#define BLOOMGRID_ROUTER_NODES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

#include "router.h"

/* Is a status one of a node that is down, slow or going away? */
bool router_node_down(grpc_status_code c);

/* The filter as this router knows it (secret, shard count, placement under
 * t), fetched from shard 0's group when not cached or stale.  Returns a
 * reference (router_filter_unref) or NULL with st set (NOT_FOUND, ...). */
struct router_filter *router_filter_lookup(struct router *r, const struct topo *t,
                                          const char *name, struct rpc_status *st);

enum router_key_op { ROUTER_ADD, ROUTER_MAY_CONTAIN, ROUTER_REMOVE };

/* Make bloomgrid_router_quorum_failures_total{op} of every op at 0, so
 * that the first failure is an increase an alert sees (router_init calls
 * it).  Any thread, any number of times. */
void router_keys_metrics_init(void);

/* The answer of a key batch: rc 0 with out filled, or -1 with st. */
typedef void (*router_keys_fn)(void *arg, int rc, const struct rpc_status *st);

/* Start one batch of n keys (keys[i] has lens[i] bytes) on filter and
 * return without waiting for the copies; done(arg, rc, st) runs exactly
 * once, with out[i] the answer of key i (ORed over the copies that
 * answered).  keys, lens and out stay the caller's and must stay valid
 * until done runs (nothing of them is used after).
 *
 * A batch with a shard short of its quorum (fewer than W copies
 * acknowledged a write, fewer than R answered a read) fails as a whole with
 * UNAVAILABLE (or a copy's refusal passed on); the message names the
 * shard(s), their group and the copies that failed, and for writes lists
 * the keys that were acknowledged anyway (docs/ROUTER.md,
 * docs/REPLICATION.md).
 *
 * Threads: the filter's lookup (a fetch from shard 0 when it is not
 * cached) runs on the calling thread, which may block for it, except on
 * one of the server's loops: there a filter that is not cached is fetched,
 * and the batch started, on one of the router's pool threads
 * (router_pool.h).  done runs on the calling thread before
 * router_keys_start returns when the batch ends at once (no keys, an
 * unknown filter, no memory); else on the thread that read the answer
 * that decided it (a link's loop or own thread: for a write, the answer
 * that gave the last shard its W copies; for a read, the last of its final
 * round, a read's further rounds being submitted from there); or on a pool
 * thread when the filter has a new secret and the batch runs again.  done
 * must not block. */
void router_keys_start(struct router *r, const char *filter, enum router_key_op op,
                       const uint8_t *const *keys, const uint32_t *lens, size_t n,
                       bool *out, router_keys_fn done, void *arg);

/* router_keys_start for a caller that must never wait (an event loop of
 * its own, the Redis door's): a filter that is not cached is fetched on
 * the router's pool, as for a call on one of the server's loops. */
void router_keys_start_nowait(struct router *r, const char *filter,
                              enum router_key_op op, const uint8_t *const *keys,
                              const uint32_t *lens, size_t n, bool *out,
                              router_keys_fn done, void *arg);

/* Is filter complete: does every copy of every shard's group that
 * answers hold its shard with the secret the router knows (fetched when
 * not cached), and at least a write quorum of copies per shard?  A copy
 * that is down does not make it incomplete (a creation needs every copy,
 * so a filter that was ever acknowledged is on it); one that answers
 * without the shard (NOT_FOUND), or with another secret, does.  The Redis
 * door sends no key to a filter before it is complete (a creation on the
 * way, or rolled back).  Returns 1 with the secret checked in secret
 * (BF_SECRET_LEN bytes; may be NULL), 0 with st saying which shard and
 * copy lacks it (the cached entry is forgotten), or -1 with st (NOT_FOUND
 * when the filter does not exist).  Blocks for one round of GetShard
 * calls. */
int router_filter_complete(struct router *r, const char *name, uint8_t *secret,
                           struct rpc_status *st);

/* One shard as a node describes it. */
struct router_shard_desc {
    bool ok;                   /* false: the fields below are not known */
    uint32_t index;
    char node[TOPO_ADDR_MAX + 1];
    int state;                 /* bloomgrid.v1.FilterState */
    char reason[256];
    int kind;                  /* bloomgrid.v1.FilterKind */
    uint64_t capacity;
    double error_rate;
    uint64_t bits, bytes;
    uint32_t hashes, layers;
    double fill_ratio, estimated_count, estimated_error_rate;
    bool over_capacity;
    uint64_t version, insert_count;
    char fingerprint[17];
};

struct router_filter_desc {
    char name[ROUTER_NAME_MAX + 1];
    uint32_t shards;
    uint32_t placement;                /* placement version, >= 1 */
    struct router_shard_desc *shard;   /* shards entries (owned) */
};

void router_filter_desc_free(struct router_filter_desc *d);

struct router_create {
    const char *name;
    uint64_t capacity;
    double error_rate;
    int kind;                  /* bloomgrid.v1.FilterKind */
    uint32_t shards;           /* resolved (> 0) */
    const uint8_t *secret;     /* BF_SECRET_LEN bytes, or NULL for random */
    bool undrop;               /* undo a drop of name with secret (needed) */
    uint32_t placement;        /* placement version; 0: the newest, or for
                                  an undrop the surviving shard 0's */
};

/* The shard count of a filter made without one (CreateFilter's shards 0,
 * the Redis door without SHARDS): default_shards for a scaling filter (its
 * bits grow) or with default_shard_mb 0; otherwise one shard per
 * default_shard_mb of the filter's bits, rounded up, at least one per
 * group of the router's topology and at most default_shards (docs/ROUTER.md,
 * "Shards and the cost of a key").  kind is a bloomgrid.v1.FilterKind. */
uint32_t router_default_shards(struct router *r, int kind, uint64_t capacity,
                               double error_rate);

/* Create every shard on its group, or none: shards created before a failure
 * are dropped again.  On success *out describes the new filter.  With
 * c->undrop (docs/REPLICATION.md, "Undoing a drop"): copies that are down
 * are passed over while every shard still reaches its write quorums (they
 * keep their tombstones until anti-entropy brings them the filter); a copy
 * that refuses, or a shard short of a quorum, rolls back every shard this
 * call undropped (not those a copy held before); ALREADY_EXISTS when every
 * copy that answered held it already.  The shards are placed by
 * c->placement (INVALID_ARGUMENT for a version this router does not know),
 * or the newest version; an undrop without one takes that of the
 * filter's surviving shard 0 (FAILED_PRECONDITION when it names another).
 * Every copy must record the version asked: a node that does not
 * (one from before placement versions) fails the creation. */
int router_create_filter(struct router *r, const struct router_create *c,
                         struct router_filter_desc *out, struct rpc_status *st);

/* Drop every shard (shard 0 last, so a failed drop can be retried). */
int router_drop_filter(struct router *r, const char *name, struct rpc_status *st);

/* Describe every shard of one filter. */
int router_describe_filter(struct router *r, const char *name,
                           struct router_filter_desc *out, struct rpc_status *st);

/* Every filter on the copies, sorted by name.  Free with
 * router_filter_desc_free on each, then free(*out). */
int router_list_filters(struct router *r, struct router_filter_desc **out,
                        size_t *n, struct rpc_status *st);

#endif
