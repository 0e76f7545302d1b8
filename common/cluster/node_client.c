/* node_client: the calls of a node's internal service, their request
 * messages and the hash layout (see node_client.h for what is checked in
 * every answer).  The method paths of bloomgrid.v1.Internal are written
 * here and nowhere else. */
#include "node_client.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "grpc/health/v1/health.pb-c.h"
#include "rules.h"
#include "topo.h"

#define PATH_INTERNAL "/bloomgrid.v1.Internal/"
#define PATH_PULL PATH_INTERNAL "PullPages"
#define PATH_PUSH PATH_INTERNAL "PushPages"
#define PATH_BATCHES PATH_INTERNAL "Batches"
#define PATH_EXPORT_SHARD PATH_INTERNAL "ExportShard"
#define PATH_IMPORT_SHARD PATH_INTERNAL "ImportShard"
#define PATH_RESYNC PATH_INTERNAL "Resync"
#define PATH_HEALTH "/grpc.health.v1.Health/Check"

/* The unary methods, by enum node_client_method. */
static const char *const unary_paths[NODE_CLIENT_METHODS] = {
    [NODE_CLIENT_CREATE_SHARD] = PATH_INTERNAL "CreateShard",
    [NODE_CLIENT_DROP_SHARD] = PATH_INTERNAL "DropShard",
    [NODE_CLIENT_GET_SHARD] = PATH_INTERNAL "GetShard",
    [NODE_CLIENT_LIST_SHARDS] = PATH_INTERNAL "ListShards",
    [NODE_CLIENT_NODE_INFO] = PATH_INTERNAL "NodeInfo",
};

/* ---- the hash layout ---- */

void node_client_hashes_put(uint8_t *dst, const struct bf_hash *h, size_t n)
{
    for (size_t k = 0; k < n; k++, dst += NODE_CLIENT_HASH_LEN) {
        for (int i = 0; i < 8; i++) {
            dst[i] = (uint8_t)(h[k].h1 >> (8 * i));
            dst[8 + i] = (uint8_t)(h[k].h2 >> (8 * i));
        }
    }
}

void node_client_hashes_get(struct bf_hash *h, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = src + NODE_CLIENT_HASH_LEN * i;
        uint64_t h1 = 0, h2 = 0;
        for (int b = 7; b >= 0; b--) {
            h1 = (h1 << 8) | p[b];
            h2 = (h2 << 8) | p[8 + b];
        }
        h[i].h1 = h1;
        h[i].h2 = h2;
    }
}

/* ---- Batches ---- */

void *node_client_batches_register(grpc_channel *ch)
{
    return grpc_channel_register_call(ch, PATH_BATCHES, NULL, NULL);
}

static Bloomgrid__V1__BatchOp wire_op(enum node_client_op op)
{
    switch (op) {
    case NODE_CLIENT_MAY_CONTAIN:
        return BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN;
    case NODE_CLIENT_REMOVE:
        return BLOOMGRID__V1__BATCH_OP__BATCH_OP_REMOVE;
    default:
        return BLOOMGRID__V1__BATCH_OP__BATCH_OP_ADD;
    }
}

static int scratch_reserve(struct node_client_batch_scratch *sc, size_t n)
{
    if (n <= sc->cap)
        return 0;
    size_t cap = sc->cap ? sc->cap : 64;
    while (cap < n)
        cap *= 2;
    Bloomgrid__V1__BatchEntry *ent = realloc(sc->ent, cap * sizeof *ent);
    if (!ent)
        return -ENOMEM;
    sc->ent = ent;
    Bloomgrid__V1__BatchEntry **ptr = realloc(sc->ptr, cap * sizeof *ptr);
    if (!ptr)
        return -ENOMEM;
    sc->ptr = ptr;
    sc->cap = cap;
    return 0;
}

grpc_byte_buffer *node_client_batch_pack(struct node_client_batch_scratch *sc,
                                         uint64_t id, uint64_t topo_version,
                                         const struct node_client_batch_entry *e,
                                         size_t n)
{
    Bloomgrid__V1__BatchRequest rq = BLOOMGRID__V1__BATCH_REQUEST__INIT;

    if (scratch_reserve(sc, n) < 0)
        return NULL;
    for (size_t w = 0; w < n; w++) {
        Bloomgrid__V1__BatchEntry *be = &sc->ent[w];
        bloomgrid__v1__batch_entry__init(be);
        be->filter = (char *)e[w].filter;
        be->shard_index = e[w].shard;
        be->op = wire_op(e[w].op);
        be->secret_id = e[w].secret_id;
        be->hashes.len = NODE_CLIENT_HASH_LEN * e[w].n;
        be->hashes.data = (uint8_t *)e[w].hashes;
        if (e[w].nruns > 1) {
            be->n_run_shards = be->n_run_counts = e[w].nruns;
            be->run_shards = (uint32_t *)e[w].run_shards;
            be->run_counts = (uint32_t *)e[w].run_counts;
        }
        sc->ptr[w] = be;
    }
    rq.id = id;
    rq.topology_version = topo_version;
    rq.n_entries = n;
    rq.entries = sc->ptr;
    size_t len = protobuf_c_message_get_packed_size(&rq.base);
    grpc_slice sl = grpc_slice_malloc(len);
    protobuf_c_message_pack(&rq.base, GRPC_SLICE_START_PTR(sl));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);
    return bb;
}

void node_client_batch_scratch_free(struct node_client_batch_scratch *sc)
{
    free(sc->ent);
    free(sc->ptr);
    memset(sc, 0, sizeof *sc);
}

/* ---- pages ---- */

/* A fingerprint id as bf_fingerprint_id writes it: 16 lower-case hex
 * digits.  Anything else would be cut or compared wrongly. */
static bool fp_valid(const char *fp)
{
    return fp && strlen(fp) == NODE_CLIENT_FP_LEN &&
           strspn(fp, "0123456789abcdef") == NODE_CLIENT_FP_LEN;
}

/* One message of a pull.  Returns 0 to go on, -1 with st set to stop. */
static int pull_message(const Bloomgrid__V1__Page *pg, const char *filter,
                        uint32_t shard, node_client_page_fn fn,
                        node_client_keys_fn keys, void *ctx,
                        struct node_client_pull_end *end, bool *got_last,
                        struct rpc_status *st)
{
    if (*got_last) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "PullPages of shard %u of \"%s\" "
                       "sent a message after its last one",
                       shard, filter);
        return -1;
    }
    /* A node of this release names the shard's fingerprint in every
     * message, an earlier one in the last only: known from the first
     * message that carries it, before its page or keys are handed on, and
     * the same in every later one. */
    if (pg->fingerprint && pg->fingerprint[0]) {
        if (!fp_valid(pg->fingerprint)) {
            rpc_status_set(
                st, GRPC_STATUS_INTERNAL,
                "PullPages of shard %u of \"%s\" "
                "sent a malformed fingerprint (want %d hex digits)",
                shard, filter, NODE_CLIENT_FP_LEN);
            return -1;
        }
        if (!end->fp[0]) {
            memcpy(end->fp, pg->fingerprint, NODE_CLIENT_FP_LEN + 1);
        } else if (strcmp(end->fp, pg->fingerprint) != 0) {
            rpc_status_set(st, GRPC_STATUS_INTERNAL,
                           "PullPages of shard %u of \"%s\" changed its "
                           "fingerprint from \"%s\" to \"%s\" during the "
                           "stream", shard, filter, end->fp, pg->fingerprint);
            return -1;
        }
    }
    if (pg->last) {
        if (!fp_valid(pg->fingerprint)) {
            rpc_status_set(
                st, GRPC_STATUS_INTERNAL,
                "PullPages of shard %u of \"%s\" "
                "ended with a malformed fingerprint (want %d hex digits)",
                shard, filter, NODE_CLIENT_FP_LEN);
            return -1;
        }
        end->version = pg->version;
        end->store_version = pg->store_version;
        end->epoch = pg->epoch;
        end->syncing = pg->syncing;
        memcpy(end->fp, pg->fingerprint, NODE_CLIENT_FP_LEN + 1);
        *got_last = true;
        return 0;
    }
    if (pg->key_hashes.len) {
        size_t n = pg->key_hashes.len / 16;
        if (!keys) {
            rpc_status_set(st, GRPC_STATUS_INTERNAL,
                           "PullPages of shard %u of \"%s\" sent keys' hashes "
                           "that were not asked for", shard, filter);
            return -1;
        }
        if (pg->key_hashes.len % 16 || pg->data.len ||
            XXH64(pg->key_hashes.data, pg->key_hashes.len, 0) != pg->checksum) {
            rpc_status_set(st, GRPC_STATUS_DATA_LOSS,
                           "keys' hashes (%zu bytes) of shard %u of \"%s\" "
                           "fail their checksum or length", pg->key_hashes.len,
                           shard, filter);
            return -1;
        }
        end->keys += n;
        if (keys(ctx, pg->key_hashes.data, n) < 0) {
            rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                           "%zu keys' hashes of shard %u of \"%s\" do not fit",
                           n, shard, filter);
            return -1;
        }
        return 0;
    }
    if (XXH64(pg->data.data, pg->data.len, 0) != pg->checksum) {
        rpc_status_set(st, GRPC_STATUS_DATA_LOSS,
                       "page at offset %" PRIu64 " of shard "
                       "%u of \"%s\" fails its checksum",
                       pg->offset, shard, filter);
        return -1;
    }
    if (pg->layer != 0) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL, "page of layer %u", pg->layer);
        return -1;
    }
    end->pages++;
    end->bytes += pg->data.len;
    if (fn && fn(ctx, pg->offset, pg->data.data, pg->data.len) < 0) {
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
               "page at offset %" PRIu64 " (%zu bytes) of shard %u of \"%s\" "
               "does not fit", pg->offset, pg->data.len, shard, filter);
        return -1;
    }
    return 0;
}

int node_client_pull(struct rpc_channel *ch, const char *filter,
                     uint32_t shard, uint64_t since, uint64_t epoch,
                     node_client_page_fn fn, void *ctx,
                     struct node_client_pull_end *end, int timeout_ms,
                     struct rpc_status *st)
{
    return node_client_pull_holding(ch, 0, NULL, 0, filter, shard, since, epoch,
                                    fn, ctx, end, timeout_ms, st);
}

int node_client_pull_holding(struct rpc_channel *ch, uint64_t topo_version,
                             const uint64_t *have, size_t nhave,
                             const char *filter, uint32_t shard,
                             uint64_t since, uint64_t epoch,
                             node_client_page_fn fn, void *ctx,
                             struct node_client_pull_end *end, int timeout_ms,
                             struct rpc_status *st)
{
    return node_client_pull_keys(ch, topo_version, have, nhave, filter, shard,
                                 since, epoch, fn, NULL, ctx, end, timeout_ms,
                                 st);
}

/* A client stream of path, or NULL with st saying why. */
static struct rpc_cstream *open_call(struct rpc_channel *ch, const char *path,
                                     int timeout_ms, struct rpc_status *st)
{
    struct rpc_cstream *s = rpc_cstream_open(ch, path, timeout_ms);

    if (!s)
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "cannot open a call");
    return s;
}

int node_client_pull_keys(struct rpc_channel *ch, uint64_t topo_version,
                          const uint64_t *have, size_t nhave,
                          const char *filter, uint32_t shard,
                          uint64_t since, uint64_t epoch,
                          node_client_page_fn fn, node_client_keys_fn keys,
                          void *ctx, struct node_client_pull_end *end,
                          int timeout_ms, struct rpc_status *st)
{
    Bloomgrid__V1__PullPagesRequest req =
        BLOOMGRID__V1__PULL_PAGES_REQUEST__INIT;
    struct rpc_cstream *s = open_call(ch, PATH_PULL, timeout_ms, st);
    grpc_slice msg;
    bool got_last = false, failed = false;

    memset(end, 0, sizeof *end);
    if (!s)
        return -1;
    req.filter = (char *)filter;
    req.shard_index = shard;
    req.since_version = since;
    req.epoch = epoch;
    req.topology_version = topo_version;
    req.page_hashes = (uint64_t *)have;
    req.n_page_hashes = have ? nhave : 0;
    req.accept_key_hashes = keys && since;
    if (rpc_cstream_write_msg(s, &req.base) < 0 ||
        rpc_cstream_close_send(s) < 0)
        return rpc_cstream_finish(s, st);
    while (!failed && rpc_cstream_read(s, &msg) == 1) {
        Bloomgrid__V1__Page *pg = bloomgrid__v1__page__unpack(
            NULL, GRPC_SLICE_LENGTH(msg), GRPC_SLICE_START_PTR(msg));
        grpc_slice_unref(msg);
        if (!pg) {
            rpc_status_set(st, GRPC_STATUS_INTERNAL, "malformed Page message");
            failed = true;
            break;
        }
        failed = pull_message(pg, filter, shard, fn, keys, ctx, end,
                              &got_last, st) < 0;
        bloomgrid__v1__page__free_unpacked(pg, NULL);
    }
    if (failed) {
        rpc_cstream_cancel(s);
        rpc_cstream_finish(s, NULL);
        return -1;
    }
    if (rpc_cstream_finish(s, st) < 0)
        return -1;
    if (!got_last) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "PullPages ended without its last message");
        return -1;
    }
    return 0;
}

/* End a push stream: close the sending side and read its one answer.
 * Returns the answer (the caller frees it) when the call ended OK with one
 * that parses; NULL otherwise, with st set. */
static Bloomgrid__V1__PushPagesResponse *push_answer(struct rpc_cstream *s,
                                                      const char *filter,
                                                      uint32_t shard,
                                                      struct rpc_status *st)
{
    Bloomgrid__V1__PushPagesResponse *r = NULL;
    grpc_slice msg;

    if (rpc_cstream_close_send(s) < 0) {
        rpc_cstream_finish(s, st);
        return NULL;
    }
    if (rpc_cstream_read(s, &msg) == 1) {
        r = bloomgrid__v1__push_pages_response__unpack(
            NULL, GRPC_SLICE_LENGTH(msg), GRPC_SLICE_START_PTR(msg));
        grpc_slice_unref(msg);
    }
    if (rpc_cstream_finish(s, st) < 0) {
        if (r)
            bloomgrid__v1__push_pages_response__free_unpacked(r, NULL);
        return NULL;
    }
    /* OK without a response that parses: what was pushed may or may not
     * have been merged, so the push is not counted as done. */
    if (!r)
        rpc_status_set(st, GRPC_STATUS_INTERNAL, "PushPages of shard %u of \"%s\" "
                       "answered OK without a PushPagesResponse", shard, filter);
    return r;
}

int node_client_push(struct rpc_channel *ch, const char *filter,
                     uint32_t shard, const char *fp, uint64_t source_version,
                     const struct node_client_page *pages, size_t n,
                     uint64_t *merged, int timeout_ms, struct rpc_status *st)
{
    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    Bloomgrid__V1__PushPagesResponse *r = NULL;
    struct rpc_cstream *s = open_call(ch, PATH_PUSH, timeout_ms, st);

    if (!s)
        return -1;
    ref.filter = (char *)filter;
    ref.shard_index = shard;
    for (size_t i = 0; i < n || i == 0; i++) {
        Bloomgrid__V1__PushPagesRequest m =
            BLOOMGRID__V1__PUSH_PAGES_REQUEST__INIT;
        if (i == 0) {
            m.shard = &ref;
            m.fingerprint = (char *)fp;
            m.source_version = source_version;
        }
        if (i < n) {
            m.offset = pages[i].offset;
            m.data.data = (uint8_t *)pages[i].data;
            m.data.len = pages[i].len;
            m.checksum = XXH64(pages[i].data, pages[i].len, 0);
        } else {
            m.checksum = XXH64(NULL, 0, 0);
        }
        if (rpc_cstream_write_msg(s, &m.base) < 0)
            return rpc_cstream_finish(s, st);
    }
    if (!(r = push_answer(s, filter, shard, st)))
        return -1;
    if (merged)
        *merged = r->pages_merged;
    bloomgrid__v1__push_pages_response__free_unpacked(r, NULL);
    return 0;
}

int node_client_push_keys(struct rpc_channel *ch, const char *filter,
                          uint32_t shard, const char *fp,
                          const uint8_t *hashes, size_t n, int timeout_ms,
                          struct rpc_status *st)
{
    enum { PER_MSG = 4096 };   /* 64 KiB of hashes a message */
    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    Bloomgrid__V1__PushPagesResponse *r = NULL;
    struct rpc_cstream *s = open_call(ch, PATH_PUSH, timeout_ms, st);

    if (!s)
        return -1;
    ref.filter = (char *)filter;
    ref.shard_index = shard;
    for (size_t i = 0; i < n || i == 0; i += PER_MSG) {
        Bloomgrid__V1__PushPagesRequest m =
            BLOOMGRID__V1__PUSH_PAGES_REQUEST__INIT;
        size_t k = n - i < PER_MSG ? n - i : PER_MSG;
        if (i == 0) {
            m.shard = &ref;
            m.fingerprint = (char *)fp;
        }
        m.key_hashes.data = (uint8_t *)hashes + 16 * i;
        m.key_hashes.len = 16 * k;
        m.checksum = XXH64(m.key_hashes.data, m.key_hashes.len, 0);
        if (rpc_cstream_write_msg(s, &m.base) < 0)
            return rpc_cstream_finish(s, st);
        if (n == 0)
            break;
    }
    if (!(r = push_answer(s, filter, shard, st)))
        return -1;
    /* OK without counting every key: they may or may not have been added,
     * so the push is not counted as done. */
    bool all = r->keys_added == n;
    bloomgrid__v1__push_pages_response__free_unpacked(r, NULL);
    if (!all) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "PushPages of %zu keys' hashes to shard %u of \"%s\" "
                       "answered OK without adding them all (a node that does "
                       "not take keys?)", n, shard, filter);
        return -1;
    }
    return 0;
}

/* The geometry GetShard answered, before anything is sized from it. */
static int shard_info_check(const Bloomgrid__V1__InternalShardInfo *isi,
                            const char *filter, uint32_t shard,
                            struct rpc_status *st)
{
    char why[RULES_ERRLEN];
    uint32_t count = isi->shard_count ? isi->shard_count : 1;

    if (!isi->info || isi->secret.len != BF_SECRET_LEN) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "GetShard of shard %u of \"%s\" "
                       "answered without the geometry or the secret",
                       shard, filter);
        return -1;
    }
    if (isi->shard_index != shard) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "GetShard of shard %u of \"%s\" "
                       "answered for shard %u",
                       shard, filter, isi->shard_index);
        return -1;
    }
    if (rules_shard_count_check(count, why) < 0 ||
        rules_params_check(isi->info->capacity, isi->info->error_rate,
                           why) < 0) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "GetShard of shard %u of \"%s\" "
                       "answered a geometry that is refused: %s",
                       shard, filter, why);
        return -1;
    }
    if (shard >= count) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "GetShard of shard %u of \"%s\" "
                       "answered a shard count of %u",
                       shard, filter, count);
        return -1;
    }
    if (isi->placement > TOPO_PLACEMENT_LIMIT) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "GetShard of shard %u of \"%s\" "
                       "answered placement version %u (at most %u)",
                       shard, filter, isi->placement, TOPO_PLACEMENT_LIMIT);
        return -1;
    }
    return 0;
}

/* ---- shards ---- */

static Bloomgrid__V1__GetShardRequest get_shard_msg(const struct node_client_ref *ref,
                                                   bool with_secret)
{
    Bloomgrid__V1__GetShardRequest req = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    req.filter = (char *)ref->filter;
    req.shard_index = ref->shard;
    req.include_secret = with_secret;
    req.topology_version = ref->topology_version;
    req.placement_known = ref->placement_known;
    return req;
}

int node_client_get_shard_info(struct rpc_channel *ch, const struct node_client_ref *ref,
                               Bloomgrid__V1__InternalShardInfo **out, int timeout_ms,
                               struct rpc_status *st)
{
    Bloomgrid__V1__GetShardRequest req = get_shard_msg(ref, true);

    *out = NULL;
    return rpc_call(ch, unary_paths[NODE_CLIENT_GET_SHARD], &req.base,
                    &bloomgrid__v1__internal_shard_info__descriptor,
                    (ProtobufCMessage **)out, timeout_ms, st);
}

/* GetShard with the secret, known: the newest placement version the
 * caller accepts. */
static int get_shard(struct rpc_channel *ch, const char *filter, uint32_t shard,
                     uint32_t known, struct node_client_shard *out,
                     int timeout_ms, struct rpc_status *st)
{
    struct node_client_ref ref = {.filter = filter, .shard = shard,
                                  .placement_known = known};
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    int rc = -1;

    if (node_client_get_shard_info(ch, &ref, &isi, timeout_ms, st) < 0)
        return -1;
    memset(out, 0, sizeof *out);
    if (shard_info_check(isi, filter, shard, st) < 0)
        goto out;
    out->shard_index = isi->shard_index;
    out->shard_count = isi->shard_count ? isi->shard_count : 1;
    out->kind = isi->info->kind;
    out->capacity = isi->info->capacity;
    out->error_rate = isi->info->error_rate;
    out->version = isi->info->version;
    out->generation = isi->generation;
    out->placement = isi->placement;
    out->syncing = isi->info->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_SYNCING;
    memcpy(out->secret, isi->secret.data, BF_SECRET_LEN);
    rc = 0;
out:
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    return rc;
}

int node_client_get_shard(struct rpc_channel *ch, const char *filter,
                          uint32_t shard, struct node_client_shard *out,
                          int timeout_ms, struct rpc_status *st)
{
    return get_shard(ch, filter, shard, TOPO_PLACEMENT_NEWEST, out, timeout_ms, st);
}

int node_client_get_shard_to_copy(struct rpc_channel *ch, const char *filter,
                                  uint32_t shard, struct node_client_shard *out,
                                  int timeout_ms, struct rpc_status *st)
{
    return get_shard(ch, filter, shard, TOPO_PLACEMENT_LIMIT, out, timeout_ms, st);
}

static Bloomgrid__V1__CreateShardRequest create_shard_msg(const struct node_client_create *c)
{
    Bloomgrid__V1__CreateShardRequest req = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
    const struct node_client_shard *sh = c->sh;

    req.filter = (char *)c->filter;
    req.shard_index = sh->shard_index;
    req.shard_count = sh->shard_count;
    req.kind = sh->kind;
    req.capacity = sh->capacity;
    req.error_rate = sh->error_rate;
    req.secret.data = (uint8_t *)sh->secret;
    req.secret.len = BF_SECRET_LEN;
    req.topology_version = c->topology_version;
    req.new_filter = c->new_filter;
    req.undrop_generation = c->undrop_generation;
    req.placement = sh->placement;
    return req;
}

int node_client_create_shard(struct rpc_channel *ch, const char *filter,
                             const struct node_client_shard *sh,
                             int timeout_ms, struct rpc_status *st)
{
    struct node_client_create c = {.filter = filter, .sh = sh};
    Bloomgrid__V1__CreateShardRequest req = create_shard_msg(&c);
    Bloomgrid__V1__InternalShardInfo *isi = NULL;

    if (rpc_call(ch, unary_paths[NODE_CLIENT_CREATE_SHARD], &req.base,
                 &bloomgrid__v1__internal_shard_info__descriptor,
                 (ProtobufCMessage **)&isi, timeout_ms, st) < 0)
        return -1;
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    return 0;
}

static Bloomgrid__V1__ShardRef drop_shard_msg(const struct node_client_ref *ref)
{
    Bloomgrid__V1__ShardRef m = BLOOMGRID__V1__SHARD_REF__INIT;
    m.filter = (char *)ref->filter;
    m.shard_index = ref->shard;
    m.secret_id = ref->secret_id;
    m.generation = ref->generation;
    m.topology_version = ref->topology_version;
    m.only_unwritten = ref->only_unwritten;
    return m;
}

int node_client_drop_shard(struct rpc_channel *ch, const struct node_client_ref *ref,
                           int timeout_ms, struct rpc_status *st)
{
    Bloomgrid__V1__ShardRef m = drop_shard_msg(ref);
    ProtobufCMessage *resp = NULL;

    if (rpc_call(ch, unary_paths[NODE_CLIENT_DROP_SHARD], &m.base,
                 &bloomgrid__v1__drop_shard_response__descriptor, &resp, timeout_ms,
                 st) < 0)
        return -1;
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

static Bloomgrid__V1__ListShardsRequest list_shards_msg(uint64_t topo_version,
                                                       const struct node_client_announce *a)
{
    Bloomgrid__V1__ListShardsRequest req = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    req.topology_version = topo_version;
    if (a) {
        req.group = (char *)a->group;
        req.copy_id = a->copy_id;
        req.copy_epoch = a->copy_epoch;
        req.address = (char *)a->address;
        req.copy_state = a->copy_state;
    }
    return req;
}

int node_client_list_shards(struct rpc_channel *ch, uint64_t topo_version,
                            const struct node_client_announce *a,
                            Bloomgrid__V1__ListShardsResponse **out, int timeout_ms,
                            struct rpc_status *st)
{
    Bloomgrid__V1__ListShardsRequest req = list_shards_msg(topo_version, a);

    *out = NULL;
    if (rpc_call(ch, unary_paths[NODE_CLIENT_LIST_SHARDS], &req.base,
                 &bloomgrid__v1__list_shards_response__descriptor,
                 (ProtobufCMessage **)out, timeout_ms, st) < 0) {
        *out = NULL;
        return -1;
    }
    return 0;
}

int node_client_resync(struct rpc_channel *ch, Bloomgrid__V1__ResyncResponse **out,
                       int timeout_ms, struct rpc_status *st)
{
    Bloomgrid__V1__ResyncRequest rq = BLOOMGRID__V1__RESYNC_REQUEST__INIT;

    rq.accept_loss = true;
    *out = NULL;
    if (rpc_call(ch, PATH_RESYNC, &rq.base, &bloomgrid__v1__resync_response__descriptor,
                 (ProtobufCMessage **)out, timeout_ms, st) < 0) {
        *out = NULL;
        return -1;
    }
    return 0;
}

struct bf *node_client_shard_filter(const struct node_client_shard *sh,
                                    char *err)
{
    struct bf_params p = {.kind = (enum bf_kind)sh->kind,
                          .capacity = sh->capacity,
                          .error_rate = sh->error_rate,
                          .shard_index = sh->shard_index,
                          .shard_count = sh->shard_count,
                          .secret = sh->secret,
                          .placement = sh->placement};

    bf_params_default(&p);
    return bf_create(&p, err);
}

/* ---- fan-outs ---- */

static grpc_slice pack_slice(const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    return s;
}

grpc_slice node_client_create_shard_req(const struct node_client_create *c)
{
    Bloomgrid__V1__CreateShardRequest m = create_shard_msg(c);
    return pack_slice(&m.base);
}

grpc_slice node_client_drop_shard_req(const struct node_client_ref *ref)
{
    Bloomgrid__V1__ShardRef m = drop_shard_msg(ref);
    return pack_slice(&m.base);
}

grpc_slice node_client_get_shard_req(const struct node_client_ref *ref)
{
    Bloomgrid__V1__GetShardRequest m = get_shard_msg(ref, false);
    return pack_slice(&m.base);
}

grpc_slice node_client_get_shard_secret_req(const struct node_client_ref *ref)
{
    Bloomgrid__V1__GetShardRequest m = get_shard_msg(ref, true);
    return pack_slice(&m.base);
}

grpc_slice node_client_list_shards_req(uint64_t topo_version)
{
    Bloomgrid__V1__ListShardsRequest m = list_shards_msg(topo_version, NULL);
    return pack_slice(&m.base);
}

grpc_slice node_client_node_info_req(void)
{
    Bloomgrid__V1__NodeInfoRequest m = BLOOMGRID__V1__NODE_INFO_REQUEST__INIT;
    return pack_slice(&m.base);
}

void node_client_multi_set(struct rpc_multi *m, struct rpc_channel *ch,
                           enum node_client_method method, grpc_slice req,
                           int timeout_ms)
{
    m->ch = ch;
    m->method = unary_paths[method];
    m->req = req;
    m->resp = grpc_empty_slice();
    m->timeout_ms = timeout_ms;
}

size_t node_client_multi_run(struct rpc_multi *calls, size_t n)
{
    return rpc_call_many(calls, n);
}

void node_client_multi_free(struct rpc_multi *calls, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        grpc_slice_unref(calls[i].req);
        grpc_slice_unref(calls[i].resp);
    }
    free(calls);
}

/* ---- health ---- */

int node_client_probe_many(struct node_client_probe *p, size_t n, const char *service,
                           int timeout_ms)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    struct rpc_multi few[TOPO_MAX_COPIES];
    struct rpc_multi *calls = n <= TOPO_MAX_COPIES ? few : calloc(n, sizeof *calls);

    if (!calls)
        return -ENOMEM;
    if (service)
        rq.service = (char *)service;
    size_t len = grpc__health__v1__health_check_request__get_packed_size(&rq);
    for (size_t i = 0; i < n; i++) {
        calls[i] = (struct rpc_multi){.ch = p[i].ch, .method = PATH_HEALTH,
                                      .req = grpc_slice_malloc(len),
                                      .resp = grpc_empty_slice(),
                                      .timeout_ms = timeout_ms};
        grpc__health__v1__health_check_request__pack(&rq,
                                                     GRPC_SLICE_START_PTR(calls[i].req));
    }
    if (n)
        rpc_call_many(calls, n);
    for (size_t i = 0; i < n; i++) {
        p[i].rc = calls[i].rc;
        p[i].st = calls[i].st;
        p[i].serving = false;
        if (calls[i].rc == 0) {
            Grpc__Health__V1__HealthCheckResponse *resp =
                grpc__health__v1__health_check_response__unpack(
                    NULL, GRPC_SLICE_LENGTH(calls[i].resp),
                    GRPC_SLICE_START_PTR(calls[i].resp));
            p[i].serving = resp && resp->status ==
                GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
            if (resp)
                grpc__health__v1__health_check_response__free_unpacked(resp, NULL);
        }
        grpc_slice_unref(calls[i].req);
        grpc_slice_unref(calls[i].resp);
    }
    if (calls != few)
        free(calls);
    return 0;
}

/* ---- shard files ---- */

struct rpc_cstream *node_client_export_open(struct rpc_channel *ch,
                                            const struct node_client_ref *ref,
                                            uint32_t chunk_size, int timeout_ms,
                                            bool *sent)
{
    Bloomgrid__V1__ExportShardRequest rq = BLOOMGRID__V1__EXPORT_SHARD_REQUEST__INIT;
    struct rpc_cstream *cs = rpc_cstream_open(ch, PATH_EXPORT_SHARD, timeout_ms);

    *sent = false;
    if (!cs)
        return NULL;
    rq.filter = (char *)ref->filter;
    rq.chunk_size = chunk_size;
    rq.shard_index = ref->shard;
    rq.topology_version = ref->topology_version;
    *sent = rpc_cstream_write_msg(cs, &rq.base) == 0 && rpc_cstream_close_send(cs) == 0;
    return cs;
}

struct rpc_cstream *node_client_import_open(struct rpc_channel *ch, int timeout_ms)
{
    return rpc_cstream_open(ch, PATH_IMPORT_SHARD, timeout_ms);
}

int node_client_import_write(struct rpc_cstream *s, const struct node_client_ref *ref,
                             const void *data, size_t len)
{
    Bloomgrid__V1__ImportShardRequest rq = BLOOMGRID__V1__IMPORT_SHARD_REQUEST__INIT;

    rq.filter = (char *)ref->filter;
    rq.shard_index = ref->shard;
    rq.topology_version = ref->topology_version;
    rq.data.data = (uint8_t *)data;
    rq.data.len = len;
    return rpc_cstream_write_msg(s, &rq.base);
}
