/* node_client: PullPages / PushPages / GetShard / CreateShard clients (see
 * node_client.h for what is checked in every answer). */
#include "node_client.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "bloomgrid/v1/internal.pb-c.h"
#include "rules.h"
#include "topo.h"

/* A fingerprint id as bf_fingerprint_id writes it: 16 lower-case hex
 * digits.  Anything else would be cut or compared wrongly. */
static bool fp_valid(const char *fp)
{
    return fp && strlen(fp) == NODE_CLIENT_FP_LEN &&
           strspn(fp, "0123456789abcdef") == NODE_CLIENT_FP_LEN;
}

/* One message of a pull.  Returns 0 to go on, -1 with st set to stop. */
static int pull_message(const Bloomgrid__V1__Page *pg, const char *filter,
                        uint32_t shard, node_client_page_fn fn, void *ctx,
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
    Bloomgrid__V1__PullPagesRequest req =
        BLOOMGRID__V1__PULL_PAGES_REQUEST__INIT;
    struct rpc_cstream *s = rpc_cstream_open(ch, NODE_CLIENT_PATH_PULL,
                                             timeout_ms);
    grpc_slice msg;
    bool got_last = false, failed = false;

    memset(end, 0, sizeof *end);
    if (!s) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "cannot open a call");
        return -1;
    }
    req.filter = (char *)filter;
    req.shard_index = shard;
    req.since_version = since;
    req.epoch = epoch;
    req.topology_version = topo_version;
    req.page_hashes = (uint64_t *)have;
    req.n_page_hashes = have ? nhave : 0;
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
        failed = pull_message(pg, filter, shard, fn, ctx, end, &got_last,
                              st) < 0;
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

int node_client_push(struct rpc_channel *ch, const char *filter,
                     uint32_t shard, const char *fp, uint64_t source_version,
                     const struct node_client_page *pages, size_t n,
                     uint64_t *merged, int timeout_ms, struct rpc_status *st)
{
    Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
    Bloomgrid__V1__PushPagesResponse *r = NULL;
    struct rpc_cstream *s = rpc_cstream_open(ch, NODE_CLIENT_PATH_PUSH,
                                             timeout_ms);
    grpc_slice msg;
    int rc;

    if (!s) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "cannot open a call");
        return -1;
    }
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
    if (rpc_cstream_close_send(s) < 0)
        return rpc_cstream_finish(s, st);
    if ((rc = rpc_cstream_read(s, &msg)) == 1) {
        r = bloomgrid__v1__push_pages_response__unpack(
            NULL, GRPC_SLICE_LENGTH(msg), GRPC_SLICE_START_PTR(msg));
        grpc_slice_unref(msg);
    }
    if (rpc_cstream_finish(s, st) < 0)
        goto out;
    /* OK without a response that parses: the pages may or may not have been
     * merged, so the push is not counted as done. */
    if (!r) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL,
                       "PushPages of shard %u of \"%s\" "
                       "answered OK without a PushPagesResponse",
                       shard, filter);
        return -1;
    }
    if (merged)
        *merged = r->pages_merged;
    bloomgrid__v1__push_pages_response__free_unpacked(r, NULL);
    return 0;
out:
    if (r)
        bloomgrid__v1__push_pages_response__free_unpacked(r, NULL);
    return -1;
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

/* GetShard with the secret, known: the newest placement version the
 * caller accepts. */
static int get_shard(struct rpc_channel *ch, const char *filter, uint32_t shard,
                     uint32_t known, struct node_client_shard *out,
                     int timeout_ms, struct rpc_status *st)
{
    Bloomgrid__V1__GetShardRequest req = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    int rc = -1;

    req.filter = (char *)filter;
    req.shard_index = shard;
    req.include_secret = true;
    req.placement_known = known;
    if (rpc_call(ch, NODE_CLIENT_PATH_GET_SHARD, &req.base,
                 &bloomgrid__v1__internal_shard_info__descriptor,
                 (ProtobufCMessage **)&isi, timeout_ms, st) < 0)
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

int node_client_create_shard(struct rpc_channel *ch, const char *filter,
                             const struct node_client_shard *sh,
                             int timeout_ms, struct rpc_status *st)
{
    Bloomgrid__V1__CreateShardRequest req =
        BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
    Bloomgrid__V1__InternalShardInfo *isi = NULL;

    req.filter = (char *)filter;
    req.shard_index = sh->shard_index;
    req.shard_count = sh->shard_count;
    req.kind = sh->kind;
    req.capacity = sh->capacity;
    req.error_rate = sh->error_rate;
    req.secret.data = (uint8_t *)sh->secret;
    req.secret.len = BF_SECRET_LEN;
    req.placement = sh->placement;
    if (rpc_call(ch, NODE_CLIENT_PATH_CREATE_SHARD, &req.base,
                 &bloomgrid__v1__internal_shard_info__descriptor,
                 (ProtobufCMessage **)&isi, timeout_ms, st) < 0)
        return -1;
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
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
