/* node_rpc: internals shared by the node's RPC handler files.
 *
 * The node's handlers are split by topic: node_catalog_rpc.c (CreateFilter,
 * DropFilter, GetFilter, ListFilters), node_keys_rpc.c (the hot key batches,
 * through the codec of rpc_keys.h), node_transfer_rpc.c (Export, Import),
 * node_internal_rpc.c (the internal service's shard calls),
 * node_batch_rpc.c (the routers' Batches streams) and node_pages_rpc.c (page
 * streaming).  What more than one of them needs lives in node_rpc.c: the
 * handler files depend on node_rpc.c, never on each other, and
 * node_services.c lists them in the handler tables.  These *_rpc.c files are the only place that converts wire
 * messages to and from the project's structs.  Names, limits and shard
 * naming come from common/base/rules.h, so a router answers a bad name exactly as
 * a node does.  Every call validates the whole request before it changes
 * anything.
 */
#ifndef BLOOMGRID_NODE_RPC_H
#define BLOOMGRID_NODE_RPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bf.h"
#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "node.h"
#include "node_sync.h"
#include "rpc_server.h"
#include "rules.h"
#include "store.h"
#include "topo.h"

enum key_op { OP_ADD, OP_MAY_CONTAIN, OP_REMOVE };

/* Per-thread (or per-stream) buffers reused across calls. */
struct scratch {
    struct bf_hash *hashes;
    bool *out;
    size_t cap;
};

/* The calling thread's scratch (kept until the thread exits), or NULL. */
struct scratch *node_rpc__thread_scratch(void);
/* Grow to hold n keys.  Returns 0 or -ENOMEM. */
int node_rpc__scratch_reserve(struct scratch *sc, size_t n);
void node_rpc__scratch_free(struct scratch *sc);

/* A FilterInfo with the storage its strings point into. */
struct info_buf {
    Bloomgrid__V1__FilterInfo fi;
    Bloomgrid__V1__ShardInfo si;
    Bloomgrid__V1__ShardInfo *sip;
    char name[STORE_NAME_MAX + 1];
    char reason[STORE_ERRLEN];
    char fp[17];
};

/* Fill ib for the filter behind sf, described under public_name. */
void node_rpc__info_fill(struct node *n, struct info_buf *ib, struct store_filter *sf,
                         const char *public_name);

/* Checks that set an INVALID_ARGUMENT reply and return false. */
bool node_rpc__public_name_ok(const char *name, struct rpc_reply *r);
bool node_rpc__kind_from_wire(int k, enum bf_kind *out, struct rpc_reply *r);
bool node_rpc__params_ok(uint64_t capacity, double error_rate, struct rpc_reply *r);

/* The store, or NULL with UNAVAILABLE set while the node recovers. */
struct store *node_rpc__need_store(struct node *n, struct rpc_reply *r);
/* A handle on a filter, or NULL with NOT_FOUND set. */
struct store_filter *node_rpc__get_filter(struct store *s, const char *name,
                                          struct rpc_reply *r);
/* A handle on shard index of filter (the plain name for a single-shard
 * filter), or NULL with NOT_FOUND set. */
struct store_filter *node_rpc__get_shard(struct store *s, const char *filter,
                                         unsigned index, struct rpc_reply *r);
/* Creations of filters and shards here (CreateShard, a node's own
 * CreateFilter, the Redis door's BF.RESERVE and creating BF.ADD) run one
 * at a time from node_rpc__create_begin to node_rpc__create_end.  Begin
 * refuses (ALREADY_EXISTS, the lock not held) shard 0 of filter with count
 * shards when this node holds the name's other form: "<filter>" for a count
 * above one, "<filter>.shard-0" for a count of one.  Shard 0 lives on the
 * same group whatever the count (topo.h), so two creations of one name with
 * different counts meet on its copies and cannot both finish.  Returns
 * true with the lock held, or false with r set. */
bool node_rpc__create_begin(struct store *s, const char *filter, unsigned index,
                            unsigned count, struct rpc_reply *r);
void node_rpc__create_end(void);
/* Translate a store error (negative errno) about filter name to a status:
 * -ENOSPC (the node's disk is full) is UNAVAILABLE saying "no space left
 * on device", as the other failures to make a write durable; -EDQUOT
 * RESOURCE_EXHAUSTED with err (which names the budget). */
void node_rpc__store_error(struct rpc_reply *r, struct store_filter *sf,
                           const char *name, int rc, const char *err);
/* Encode "repeated bool field 1 [packed]" (+ uint64 field 2 when
 * with_version and version != 0) as the reply body. */
void node_rpc__encode_bools(struct rpc_reply *r, const bool *v, size_t n,
                            bool with_version, uint64_t version);
/* End a stream with the status of r. */
void node_rpc__finish_reply(struct rpc_stream *st, const struct rpc_reply *r);

#define UNPACK_OR_FAIL(type, fn, var, req, len, r)                            \
    type *var = fn##__unpack(NULL, len, req);                                  \
    if (!var) {                                                                \
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,                       \
                        "malformed " #type " message");                       \
        return;                                                                \
    }


/* What shard replies and checks need of a live shard: geometry, the secret
 * (copied out) and its id (XXH3-64, as HashesRequest.secret_id). */
struct shard_facts {
    uint32_t count, index;
    uint32_t placement;          /* bf_placement: 0 not recorded */
    uint8_t secret[BF_SECRET_LEN];
    uint64_t secret_id;
};

/* Read the facts of sf (zeroed when it is not READY: returns the
 * store_filter_inspect error). */
int node_rpc__shard_facts(struct store_filter *sf, struct shard_facts *out);

/* Undo the drop of store name sname (label: how replies name it) with
 * the parameters and secret p at generation gen (store_undrop; *out_gen,
 * may be NULL, gets the one taken).  A name that exists answers
 * ALREADY_EXISTS when it has p's secret (nothing to undo),
 * FAILED_PRECONDITION with reason SECRET_MISMATCH when it has another
 * (created again after the drop), UNAVAILABLE when it is not serving (its
 * secret unknown).  Returns 0, or -1 with r set (node_catalog_rpc.c). */
int node_rpc__undrop(struct store *s, const char *sname, const char *label,
                     const struct bf_params *p, uint64_t gen, uint64_t *out_gen,
                     struct rpc_reply *r);

/* Catalog handlers (node_catalog_rpc.c). */
void node_rpc__h_create_filter(void *arg, const uint8_t *req, size_t len,
                               struct rpc_reply *r);
void node_rpc__h_drop_filter(void *arg, const uint8_t *req, size_t len,
                             struct rpc_reply *r);
void node_rpc__h_get_filter(void *arg, const uint8_t *req, size_t len,
                            struct rpc_reply *r);
void node_rpc__h_list_filters(void *arg, const uint8_t *req, size_t len,
                              struct rpc_reply *r);

/* Handlers (node_keys_rpc.c, node_transfer_rpc.c, node_internal_rpc.c). */
void node_rpc__h_add(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r);
void node_rpc__h_may_contain(void *arg, const uint8_t *req, size_t len,
                             struct rpc_reply *r);
void node_rpc__h_remove(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r);
extern const struct rpc_loop_stream node_rpc__add_stream;
extern const struct rpc_loop_stream node_rpc__may_contain_stream;
void node_rpc__h_export(void *arg, struct rpc_stream *st);
void node_rpc__h_import(void *arg, struct rpc_stream *st);
/* Internal ExportShard / ImportShard: the same for one shard. */
void node_rpc__h_export_shard(void *arg, struct rpc_stream *st);
void node_rpc__h_import_shard(void *arg, struct rpc_stream *st);
/* Internal Resync (node_internal_rpc.c): checked here, run by the
 * anti-entropy thread (node_resync.c), answered from there. */
void node_rpc__h_resync(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r);
/* Internal PullPages / PushPages (node_pages_rpc.c). */
void node_rpc__h_pull_pages(void *arg, struct rpc_stream *st);
void node_rpc__h_push_pages(void *arg, struct rpc_stream *st);
/* Serve bloomgrid_pull_bytes_total{kind="pages"|"hashes"} at 0. */
void node_rpc__pull_bytes_register(void);

/* The node's group (setting topology; node_rpc.c, docs/REPLICATION.md).
 * install takes over t's reference as the node's topology when a group
 * lists addr as a copy (0), else drops it and returns -ENOENT with err
 * (the old topology stays).  get returns the current one with a reference
 * (NULL without) and the node's group index; clear drops it at exit. */
int node_rpc__topo_install(struct topo *t, const char *addr, char *err, size_t errlen);
struct topo *node_rpc__topo_get(int *group);
void node_rpc__topo_clear(void);
/* ListShards of a peer announcing its data directory (m's group, copy id,
 * epoch, address and state): the highest epoch of it heard before and
 * whether another copy was recorded at its address (node_sync_peer_heard);
 * 0 and false without a topology or a copy id. */
uint64_t node_rpc__peer_heard(const Bloomgrid__V1__ListShardsRequest *m, bool *replaced);
/* Where this node stands as a copy (a Bloomgrid__V1__CopyState):
 * UNSPECIFIED outside a group of N > 1. */
int node_rpc__copy_state(void);
/* Is addr this node's address in the topology? */
bool node_rpc__is_self(const char *addr);
/* N of the node's group (1 without a topology). */
unsigned node_rpc__group_copies(void);
/* In a group of N > 1 copies, refuse a public write (always) or read
 * (unless W = N) with FAILED_PRECONDITION naming the router rule; what
 * names the call ("Add").  Returns true when refused. */
bool node_rpc__refuse_public(struct rpc_reply *r, const char *what, bool write);
/* In a group of N > 1 copies, refuse a public CreateFilter or DropFilter
 * (what) into r: every copy must hold a filter, so the catalog goes
 * through a router.  Returns true when refused. */
bool node_rpc__refuse_public_catalog(struct rpc_reply *r, const char *what);
/* Refuse an internal call made under topology version (0: not sent)
 * other than the node's with FAILED_PRECONDITION.  Returns true when
 * refused. */
bool node_rpc__refuse_version(struct rpc_reply *r, uint64_t version);
/* SYNCING shards (node_sync.h; docs/REPLICATION.md).  set installs the
 * node's list once the store is open, before it serves (NULL: none); get
 * returns it.  shard_syncing: is sf SYNCING on this copy of a group of
 * N > 1?  refuse_syncing sets UNAVAILABLE ("shard X is syncing ...") and
 * returns true when it is. */
void node_rpc__sync_set(struct node_sync *ns);
struct node_sync *node_rpc__sync_get(void);
bool node_rpc__shard_syncing(struct store_filter *sf);
bool node_rpc__refuse_syncing(struct store_filter *sf, struct rpc_reply *r);
void node_rpc__h_create_shard(void *arg, const uint8_t *req, size_t len,
                              struct rpc_reply *r);
void node_rpc__h_drop_shard(void *arg, const uint8_t *req, size_t len,
                            struct rpc_reply *r);
void node_rpc__h_get_shard(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *r);
void node_rpc__h_list_shards(void *arg, const uint8_t *req, size_t len,
                             struct rpc_reply *r);
void node_rpc__h_add_hashes(void *arg, const uint8_t *req, size_t len,
                            struct rpc_reply *r);
void node_rpc__h_may_contain_hashes(void *arg, const uint8_t *req, size_t len,
                                    struct rpc_reply *r);
void node_rpc__h_remove_hashes(void *arg, const uint8_t *req, size_t len,
                               struct rpc_reply *r);
/* Batches, the routers' stream of key batches (node_batch_rpc.c). */
extern const struct rpc_loop_stream node_rpc__batches;
/* Fill the Batches counters of a NodeInfo answer (node_batch_rpc.c). */
void node_rpc__batch_counters(Bloomgrid__V1__NodeInfoResponse *out);
/* NodeInfo (node_internal_rpc.c): what the node counted of Batches. */
void node_rpc__h_node_info(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *r);

/* The work of AddHashes / MayContainHashes / RemoveHashes on one shard
 * (used by node_internal_rpc.c and node_batch_rpc.c): decode cnt packed hashes from data into h, check
 * them (check_shard, secret_id as in HashesRequest) and apply op.  out[i]
 * gets hash i's answer and *version the shard's version.  Returns 0, or -1
 * with r set to the shard's error (nothing was changed unless a write
 * failed in the store).  h and out hold cnt entries, owned by the caller. */
int node_rpc__shard_hashes(struct store *s, enum key_op op, const char *filter,
                           unsigned index, const uint8_t *data, size_t cnt,
                           bool check_shard, uint64_t secret_id,
                           struct bf_hash *h, bool *out, uint64_t *version,
                           struct rpc_reply *r);

/* The second half of node_rpc__shard_hashes: apply op to the cnt hashes h
 * on sf (held, let go here), out[i] and *version as there.  Returns 0, or
 * -1 with r set to the shard's error. */
int node_rpc__shard_apply(struct store_filter *sf, enum key_op op, const char *filter,
                          unsigned index, const struct bf_hash *h, size_t cnt, bool *out,
                          uint64_t *version, struct rpc_reply *r);

/* The first half of node_rpc__shard_hashes, for callers that apply op
 * themselves (node_batch_rpc.c, with the store's _async writes): find the
 * shard, decode the hashes into h and check
 * them.  Returns the held shard (store_put when done), or NULL with r set
 * to the shard's error. */
struct store_filter *node_rpc__shard_check(struct store *s, enum key_op op,
                                           const char *filter, unsigned index,
                                           const uint8_t *data, size_t cnt,
                                           bool check_shard, uint64_t secret_id,
                                           struct bf_hash *h, struct rpc_reply *r);
/* The version a shard's answers carry. */
uint64_t node_rpc__shard_version(struct store_filter *sf);
/* Set r from a store error rc (err may be "") of shard index of filter. */
void node_rpc__shard_store_error(struct rpc_reply *r, struct store_filter *sf,
                                 const char *filter, unsigned index, int rc,
                                 const char *err);

#endif
