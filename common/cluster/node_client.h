/* node_client: the client of a node's internal service (bloomgrid.v1.Internal)
 * as the cluster processes use it: PullPages, PushPages, GetShard and
 * CreateShard.  The merger pulls from and pushes to every copy with it, a
 * read replica pulls from its primary with it, and the tests drive nodes
 * with it.
 *
 * Every function is a blocking call on a struct rpc_channel (thread-safe:
 * any number of threads may call at once on one channel) with a deadline of
 * timeout_ms, and returns 0 on OK or -1 with the status in *st (when st is
 * not NULL).  Nothing a node answers is trusted before it is checked here:
 *
 *   - a page failing its XXH64 checksum ends the pull with DATA_LOSS, and
 *     nothing of it or after it reaches the callback (callers apply pages
 *     only once the whole pull succeeded, or OR them in as they come: OR is
 *     idempotent and a bad page is never passed on);
 *   - a fingerprint that is not NODE_CLIENT_FP_LEN bytes of text, a shard
 *     geometry outside common/base/rules.h (shard count, capacity, error rate),
 *     another shard than the one asked for, a secret of another length, or a
 *     message that does not parse end the call with INTERNAL, naming what
 *     was wrong.
 *
 * Needs grpc_init() (the caller owns it).  Links in bloomgrid_rpc.
 */
#ifndef BLOOMGRID_NODE_CLIENT_H
#define BLOOMGRID_NODE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bf.h"
#include "rpc_client.h"

#define NODE_CLIENT_PATH_PULL "/bloomgrid.v1.Internal/PullPages"
#define NODE_CLIENT_PATH_PUSH "/bloomgrid.v1.Internal/PushPages"
#define NODE_CLIENT_PATH_GET_SHARD "/bloomgrid.v1.Internal/GetShard"
#define NODE_CLIENT_PATH_CREATE_SHARD "/bloomgrid.v1.Internal/CreateShard"

/* A fingerprint id (bf_fingerprint_id): 16 hex digits. */
#define NODE_CLIENT_FP_LEN 16

/* What the last message of a pull says. */
struct node_client_pull_end {
    uint64_t version;         /* change counter: the next since_version */
    uint64_t store_version;   /* acknowledged writes covered */
    uint64_t epoch;
    char fp[NODE_CLIENT_FP_LEN + 1];   /* fingerprint id of the shard */
    uint64_t pages, bytes;    /* page data received */
    bool syncing;             /* the shard is SYNCING on the answering node */
};

/* Called for each verified page (data is valid during the call only); a
 * negative return cancels the pull with FAILED_PRECONDITION. */
typedef int (*node_client_page_fn)(void *ctx, uint64_t offset,
                                   const uint8_t *data, size_t len);

/* PullPages of shard `shard` of filter, the pages changed since `since` in
 * `epoch` (0, 0: every non-empty page).  fn (may be NULL) gets every page;
 * *end is zeroed first and filled from the last message. */
int node_client_pull(struct rpc_channel *ch, const char *filter,
                     uint32_t shard, uint64_t since, uint64_t epoch,
                     node_client_page_fn fn, void *ctx,
                     struct node_client_pull_end *end, int timeout_ms,
                     struct rpc_status *st);

/* node_client_pull under topology version topo_version (0: not sent), by
 * a caller that may hold a copy of the shard: have[i] is XXH64 of its page
 * i (store_pages_hashes; nhave 0 or have NULL: none), and pages that hash
 * the same are not streamed (end->pages counts those that were). */
int node_client_pull_holding(struct rpc_channel *ch, uint64_t topo_version,
                             const uint64_t *have, size_t nhave,
                             const char *filter, uint32_t shard,
                             uint64_t since, uint64_t epoch,
                             node_client_page_fn fn, void *ctx,
                             struct node_client_pull_end *end, int timeout_ms,
                             struct rpc_status *st);

/* One page to push; data is borrowed for the call. */
struct node_client_page {
    uint64_t offset;
    const void *data;
    size_t len;
};

/* PushPages: n pages in one stream (n may be 0: only source_version
 * travels).  fp: the shard's fingerprint id.  *merged (may be NULL) gets the
 * node's count of pages merged. */
int node_client_push(struct rpc_channel *ch, const char *filter,
                     uint32_t shard, const char *fp, uint64_t source_version,
                     const struct node_client_page *pages, size_t n,
                     uint64_t *merged, int timeout_ms, struct rpc_status *st);

/* Geometry and secret of a shard, as CreateShard takes them. */
struct node_client_shard {
    uint32_t shard_index, shard_count;
    int kind;                  /* wire FilterKind */
    uint64_t capacity;
    double error_rate;
    uint8_t secret[BF_SECRET_LEN];
    uint64_t version;
    uint64_t generation;       /* GetShard's (store.h, "Undoing a drop");
                                  CreateShard does not send it */
    uint32_t placement;        /* the filter's placement version (topo.h;
                                  0: not recorded, version 1) */
};

/* GetShard with the secret into *out, by a caller that places shards by
 * the placement versions this build knows (topo.h): a filter placed by a
 * newer version is FAILED_PRECONDITION, reason PLACEMENT_UNKNOWN, from the
 * node.  NOT_FOUND when the node lacks the shard. */
int node_client_get_shard(struct rpc_channel *ch, const char *filter,
                          uint32_t shard, struct node_client_shard *out,
                          int timeout_ms, struct rpc_status *st);

/* The same for a caller that places nothing and only copies the shard to
 * where it already is (a copy re-creating a shard its peer holds): every
 * placement version is answered. */
int node_client_get_shard_to_copy(struct rpc_channel *ch, const char *filter,
                                  uint32_t shard, struct node_client_shard *out,
                                  int timeout_ms, struct rpc_status *st);

/* CreateShard with sh's geometry, secret and placement version (a copy
 * that joins a group). */
int node_client_create_shard(struct rpc_channel *ch, const char *filter,
                             const struct node_client_shard *sh,
                             int timeout_ms, struct rpc_status *st);

/* An empty filter for shard sh (same geometry and secret as the node's, so
 * the same fingerprint).  The caller owns it (bf_destroy); NULL with err
 * (BF_ERRLEN bytes) when the geometry is refused. */
struct bf *node_client_shard_filter(const struct node_client_shard *sh,
                                    char *err);

#endif
