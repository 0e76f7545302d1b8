/* node_client: how every cluster process calls a node.  The one module that
 * names the methods of a node's internal service (bloomgrid.v1.Internal),
 * builds their request messages and lays out the 16-byte hashes they
 * carry; the routers' key streams (router_link), the router's catalog,
 * transfer, health and filter lookups, a copy's anti-entropy and resync, the
 * merger, and the CLI's status and resync all call nodes through it.  The
 * node's own side registers its methods from the protobuf-c service
 * descriptor and decodes hashes with node_client_hashes_get.
 *
 * Three kinds of function:
 *
 *   - blocking calls on a struct rpc_channel (thread-safe: any number of
 *     threads may call at once on one channel), each with a deadline of
 *     timeout_ms, returning 0 on OK or -1 with the status in *st (when st
 *     is not NULL; rpc_client.h);
 *   - request builders for fan-outs: a packed request (grpc_slice, the
 *     caller's) and node_client_multi_set, which makes it one entry of an
 *     rpc_call_many array, so a caller asks many nodes at once;
 *   - pure helpers (the hash layout, a BatchRequest packer) that call
 *     nobody.
 *
 * Answers the callers read field by field (InternalShardInfo, the shard
 * lists, NodeInfo, Resync) are handed back as unpacked messages, owned by
 * the caller (protobuf_c_message_free_unpacked).  What the merger and
 * anti-entropy size memory from is checked here first:
 *
 *   - a page failing its XXH64 checksum ends the pull with DATA_LOSS, and
 *     nothing of it or after it reaches the callback (callers apply pages
 *     only once the whole pull succeeded, or OR them in as they come: OR is
 *     idempotent and a bad page is never passed on);
 *   - a fingerprint that is not NODE_CLIENT_FP_LEN bytes of text, a shard
 *     geometry outside common/base/rules.h (shard count, capacity, error
 *     rate), another shard than the one asked for, a secret of another
 *     length, or a message that does not parse end the call with INTERNAL,
 *     naming what was wrong (node_client_get_shard, node_client_pull*).
 *
 * Needs grpc_init() (the caller owns it).  Its own library,
 * bloomgrid_node_client (on cluster, rpc and engine).
 */
#ifndef BLOOMGRID_NODE_CLIENT_H
#define BLOOMGRID_NODE_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "rpc_client.h"

/* A fingerprint id (bf_fingerprint_id): 16 hex digits. */
#define NODE_CLIENT_FP_LEN 16

/* The methods of the internal service that clients call (names for
 * node_client_multi_set; the paths themselves stay in node_client.c). */
enum node_client_method {
    NODE_CLIENT_CREATE_SHARD,
    NODE_CLIENT_DROP_SHARD,
    NODE_CLIENT_GET_SHARD,
    NODE_CLIENT_LIST_SHARDS,
    NODE_CLIENT_NODE_INFO,
    NODE_CLIENT_METHODS
};

/* ---- the hash layout ---- */

/* Bytes of one hash on the wire: h1 then h2, each 8 bytes little-endian. */
#define NODE_CLIENT_HASH_LEN 16

/* Write h[0..n) into dst (n * NODE_CLIENT_HASH_LEN bytes). */
void node_client_hashes_put(uint8_t *dst, const struct bf_hash *h, size_t n);

/* Read n hashes from src (n * NODE_CLIENT_HASH_LEN bytes) into h. */
void node_client_hashes_get(struct bf_hash *h, const uint8_t *src, size_t n);

/* ---- Batches: the routers' key streams ---- */

/* Register the Batches method on ch; the handle is for
 * grpc_channel_create_registered_call and lives as long as ch. */
void *node_client_batches_register(grpc_channel *ch);

enum node_client_op { NODE_CLIENT_ADD, NODE_CLIENT_MAY_CONTAIN, NODE_CLIENT_REMOVE };

/* One entry of a BatchRequest: n hashes of one shard of filter, laid out
 * by node_client_hashes_put.  Borrowed for the packing. */
struct node_client_batch_entry {
    const char *filter;
    uint32_t shard;             /* with runs: the first run's */
    enum node_client_op op;
    uint64_t secret_id;         /* XXH3-64 of the shard's secret; 0: unchecked */
    const uint8_t *hashes;
    size_t n;
    /* Runs (BatchEntry.run_shards), nruns > 1: hashes holds run_counts[0]
     * of shard run_shards[0], then the next run's; 0: one shard. */
    const uint32_t *run_shards, *run_counts;
    size_t nruns;
};

/* What a packer keeps between messages, so that packing allocates nothing
 * once it has grown.  Zero it first; one thread at a time. */
struct node_client_batch_scratch {
    Bloomgrid__V1__BatchEntry *ent;
    Bloomgrid__V1__BatchEntry **ptr;
    size_t cap;
};

/* The BatchRequest of e[0..n) with id (echoed in the answer) under
 * topology version topo_version (0: not sent), packed into a byte buffer
 * the caller owns (grpc_byte_buffer_destroy).  NULL when out of memory. */
grpc_byte_buffer *node_client_batch_pack(struct node_client_batch_scratch *sc,
                                         uint64_t id, uint64_t topo_version,
                                         const struct node_client_batch_entry *e,
                                         size_t n);

/* Free what sc holds (it may be used again). */
void node_client_batch_scratch_free(struct node_client_batch_scratch *sc);

/* ---- shards: create, drop, describe, list ---- */

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
    bool syncing;              /* GetShard's: the shard is SYNCING (or its
                                  node held) there; CreateShard ignores it */
};

/* A CreateShard as a router's CreateFilter sends it. */
struct node_client_create {
    const char *filter;
    const struct node_client_shard *sh;   /* shard_index .. secret */
    uint64_t topology_version;            /* 0: not sent */
    bool new_filter;            /* nothing was ever acknowledged for it */
    uint64_t undrop_generation; /* an undrop's (docs/REPLICATION.md); 0: none */
};

/* A shard a DropShard or GetShard names. */
struct node_client_ref {
    const char *filter;
    uint32_t shard;
    uint64_t topology_version;  /* 0: not sent */
    uint64_t secret_id;         /* DropShard: only a shard of this secret; 0: any */
    uint64_t generation;        /* DropShard: only one of at least this; 0: any */
    bool only_unwritten;        /* DropShard: only a shard that never took a
                                   key (FAILED_PRECONDITION otherwise) */
    uint32_t placement_known;   /* GetShard with the secret: the newest
                                   placement version the caller places by
                                   (topo.h); a filter placed by a newer one
                                   is FAILED_PRECONDITION, PLACEMENT_UNKNOWN */
};

/* What anti-entropy announces with a listing (ListShardsRequest; docs/
 * REPLICATION.md, "Restored copies" and "Re-created copies"). */
struct node_client_announce {
    const char *group;
    uint64_t copy_id;
    uint64_t copy_epoch;
    const char *address;
    Bloomgrid__V1__CopyState copy_state;
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

/* GetShard of ref (filter, shard, topology version, placement versions
 * known) with the secret, the answer unchecked in *out (the caller frees
 * it). */
int node_client_get_shard_info(struct rpc_channel *ch, const struct node_client_ref *ref,
                               Bloomgrid__V1__InternalShardInfo **out, int timeout_ms,
                               struct rpc_status *st);

/* CreateShard with sh's geometry, secret and placement version (a copy
 * that joins a group). */
int node_client_create_shard(struct rpc_channel *ch, const char *filter,
                             const struct node_client_shard *sh,
                             int timeout_ms, struct rpc_status *st);

/* DropShard of ref. */
int node_client_drop_shard(struct rpc_channel *ch, const struct node_client_ref *ref,
                           int timeout_ms, struct rpc_status *st);

/* ListShards under topo_version (0: not sent), announcing a (NULL:
 * nothing; the listing then changes nothing on the node); the answer in
 * *out (the caller frees it). */
int node_client_list_shards(struct rpc_channel *ch, uint64_t topo_version,
                            const struct node_client_announce *a,
                            Bloomgrid__V1__ListShardsResponse **out, int timeout_ms,
                            struct rpc_status *st);

/* An operator's Resync with the loss accepted (docs/REPLICATION.md,
 * "Accepting a loss"); the answer in *out (the caller frees it). */
int node_client_resync(struct rpc_channel *ch, Bloomgrid__V1__ResyncResponse **out,
                       int timeout_ms, struct rpc_status *st);

/* An empty filter for shard sh (same geometry and secret as the node's, so
 * the same fingerprint).  The caller owns it (bf_destroy); NULL with err
 * (BF_ERRLEN bytes) when the geometry is refused. */
struct bf *node_client_shard_filter(const struct node_client_shard *sh,
                                    char *err);

/* ---- fan-outs: one request to many nodes at once ---- */

/* Packed requests (the caller owns the slice: grpc_slice_unref). */
grpc_slice node_client_create_shard_req(const struct node_client_create *c);
grpc_slice node_client_drop_shard_req(const struct node_client_ref *ref);
/* GetShard without the secret. */
grpc_slice node_client_get_shard_req(const struct node_client_ref *ref);
/* GetShard with the secret, by a caller that knows ref->placement_known
 * (a newer placement version is FAILED_PRECONDITION, PLACEMENT_UNKNOWN). */
grpc_slice node_client_get_shard_secret_req(const struct node_client_ref *ref);
grpc_slice node_client_list_shards_req(uint64_t topo_version);
grpc_slice node_client_node_info_req(void);

/* Make *m the call of method on ch with req (the reference passes to m)
 * and a deadline of timeout_ms, its answer empty until rpc_call_many runs
 * it; node_client_multi_free gives every slice back. */
void node_client_multi_set(struct rpc_multi *m, struct rpc_channel *ch,
                           enum node_client_method method, grpc_slice req,
                           int timeout_ms);

/* Run calls[0..n) at once and wait until each has ended (rpc_call_many).
 * Returns how many failed. */
size_t node_client_multi_run(struct rpc_multi *calls, size_t n);

/* Unref the request and answer of calls[0..n) and free calls. */
void node_client_multi_free(struct rpc_multi *calls, size_t n);

/* ---- health ---- */

/* One node's health check (node_client_probe_many). */
struct node_client_probe {
    struct rpc_channel *ch;     /* in */
    int rc;                     /* 0: it answered OK; -1: st says why not */
    struct rpc_status st;
    bool serving;               /* it answered SERVING */
};

/* grpc.health.v1 Check of service (NULL: the node as a whole) on every
 * p[i].ch at once, each within timeout_ms; fills rc, st and serving.
 * Returns 0, or -ENOMEM (more than TOPO_MAX_COPIES probes and no memory
 * for them) when nothing was asked. */
int node_client_probe_many(struct node_client_probe *p, size_t n, const char *service,
                            int timeout_ms);

/* ---- pages: anti-entropy and the merger ---- */

/* What the last message of a pull says. */
struct node_client_pull_end {
    uint64_t version;         /* change counter: the next since_version */
    uint64_t store_version;   /* acknowledged writes covered */
    uint64_t epoch;
    /* Fingerprint id of the shard.  Set as soon as a message carries it
     * (a node of this release names it in every message, an earlier one
     * in the last only), before fn or keys gets that message's page or
     * keys; every later message must name the same (the pull fails with
     * INTERNAL otherwise).  So a caller that reads it through its ctx
     * while pages arrive may check them against its own shard and apply
     * them at once; while it is empty (an earlier node) a page can be
     * vouched for only at the end. */
    char fp[NODE_CLIENT_FP_LEN + 1];
    uint64_t pages, bytes;    /* page data received */
    uint64_t keys;            /* keys' hashes received (node_client_pull_keys;
                                 16 bytes each, not in bytes) */
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

/* Called for each verified message of keys' hashes: n keys, 16 bytes
 * each ({h1, h2} as little-endian 64-bit words), valid during the call
 * only; a negative return cancels the pull with FAILED_PRECONDITION. */
typedef int (*node_client_keys_fn)(void *ctx, const uint8_t *hashes, size_t n);

/* node_client_pull_holding by a caller that can also add keys' hashes:
 * with keys non-NULL and since nonzero the request sets accept_key_hashes,
 * and a node that finds the keys of the records since the smaller answer
 * sends them (docs/REPLICATION.md, "Keys instead of pages"): keys gets
 * them, fn any pages (a stream may bring both; the caller applies every
 * one, then passes end->version as since next time).  A node of an
 * earlier release ignores the field and sends pages. */
int node_client_pull_keys(struct rpc_channel *ch, uint64_t topo_version,
                          const uint64_t *have, size_t nhave,
                          const char *filter, uint32_t shard,
                          uint64_t since, uint64_t epoch,
                          node_client_page_fn fn, node_client_keys_fn keys,
                          void *ctx, struct node_client_pull_end *end,
                          int timeout_ms, struct rpc_status *st);

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

/* Keys' hashes pushed instead of pages (PushPagesRequest.key_hashes), the
 * shard's fingerprint id fp checked on the first message as for pages: n
 * keys, 16 bytes each ({h1, h2} as little-endian 64-bit words), sent in
 * messages of at most 4096 keys, all in one stream (the node spools the
 * stream's keys until it ends: at most its max_push_mb).  The node adds
 * them as adds (add records in its log) once the stream completed.
 * Returns 0 once the node answered that it added every one; -1 with st
 * otherwise, also for an OK answer that does not count them all (a node
 * of an earlier release refuses the messages with DATA_LOSS: the caller
 * pushes pages instead). */
int node_client_push_keys(struct rpc_channel *ch, const char *filter,
                          uint32_t shard, const char *fp,
                          const uint8_t *hashes, size_t n, int timeout_ms,
                          struct rpc_status *st);

/* ---- shard files: a router's Export and Import ---- */

/* Open an ExportShard of ref's shard (its filter, shard and topology
 * version) in chunks of chunk_size bytes, and send its request.  NULL when
 * the call cannot be started; otherwise *sent says whether the request
 * went out (when not, rpc_cstream_finish says why).  The caller reads the
 * FileChunk messages and finishes the stream. */
struct rpc_cstream *node_client_export_open(struct rpc_channel *ch,
                                            const struct node_client_ref *ref,
                                            uint32_t chunk_size, int timeout_ms,
                                            bool *sent);

/* Open an ImportShard; NULL when the call cannot be started.  The caller
 * writes its chunks (node_client_import_write), half-closes, reads the
 * ImportResponse and finishes the stream. */
struct rpc_cstream *node_client_import_open(struct rpc_channel *ch, int timeout_ms);

/* One chunk of ref's shard file (len bytes of data) on s.  0, or -1 when
 * the call failed (rpc_cstream_finish says why). */
int node_client_import_write(struct rpc_cstream *s, const struct node_client_ref *ref,
                             const void *data, size_t len);

#endif
