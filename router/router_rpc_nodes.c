/* router_rpc_nodes: the router's side of the internal service (see
 * router_nodes.h).  With router_rpc.c, the only place of the router that
 * converts wire messages.
 *
 * Key batches go out as one call per node: the shards that have keys are
 * grouped by the primary of their group, and each node gets one
 * MultiHashesRequest (1 filter, 2 repeated ShardHashes {1 shard_index,
 * 2 hashes}, 3 check_shard, 4 secret_id) encoded by hand straight into the
 * slice that is sent.  Its answer (MultiHashesResponse: one ShardResult per
 * shard {1 shard_index, 2 packed bools, 3 version, 4 code, 5 message}) is
 * decoded by hand into the caller's output in request order, so every shard
 * still succeeds or fails on its own: a batch costs no per-key allocation.
 * One-shard HashesRequests (1 filter, 2 shard_index, 3 hashes, 4 check_shard,
 * 5 secret_id) remain for reads retried on a replica and for nodes that do
 * not serve the multi-shard calls (UNIMPLEMENTED).  The catalog calls are in
 * router_rpc_catalog.c.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "router_nodes.h"
#include "router_rpc.h"
#include "rpc_client.h"
#include "wire.h"

#define M_GET "/bloomgrid.v1.Internal/GetShard"

static const char *const key_methods[] = {
    "/bloomgrid.v1.Internal/AddHashes",
    "/bloomgrid.v1.Internal/MayContainHashes",
    "/bloomgrid.v1.Internal/RemoveHashes",
};
static const char *const op_names[] = {"Add", "MayContain", "Remove"};
static const char *const multi_methods[] = {
    "/bloomgrid.v1.Internal/AddMultiHashes",
    "/bloomgrid.v1.Internal/MayContainMultiHashes",
    "/bloomgrid.v1.Internal/RemoveMultiHashes",
};

static const char *const multi_names[] = {
    "AddMultiHashes", "MayContainMultiHashes", "RemoveMultiHashes",
};

/* ---- the frame transport (rpc_frame.h, docs/ROUTER.md) ---- */

#define FRAMES_RETRY_MS 1000        /* after a failure to learn the port */
#define FRAMES_RECHECK_MS 30000     /* after a node said it has none */
#define FRAMES_AFTER_LOSS_MS 200    /* after the port failed (a restart?) */

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

struct rpc_frame_pool *router_node_frames(struct router *r, struct router_node *n)
{
    if (!n->frames || strcmp(r->cfg.frames, "on") != 0)
        return NULL;
    pthread_mutex_lock(&n->flock);
    if (n->fport > 0) {
        pthread_mutex_unlock(&n->flock);
        return n->frames;
    }
    if (n->fasking || mono_ms() < n->fnext_ms) {
        pthread_mutex_unlock(&n->flock);
        return NULL;
    }
    n->fasking = true;
    pthread_mutex_unlock(&n->flock);

    Bloomgrid__V1__NodeInfoRequest rq = BLOOMGRID__V1__NODE_INFO_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    struct rpc_status st;
    int timeout = r->cfg.node_timeout_ms < 1000 ? (int)r->cfg.node_timeout_ms : 1000;
    int rc = rpc_call(n->ch, "/bloomgrid.v1.Internal/NodeInfo", &rq.base,
                      &bloomgrid__v1__node_info_response__descriptor, &resp, timeout, &st);
    int port = -1;
    int64_t again = FRAMES_RETRY_MS;
    if (rc == 0) {
        port = (int)((Bloomgrid__V1__NodeInfoResponse *)resp)->frame_port;
        protobuf_c_message_free_unpacked(resp, NULL);
        if (port <= 0 || port > 65535) {
            port = 0;
            again = FRAMES_RECHECK_MS;
        }
    } else if (st.code == GRPC_STATUS_UNIMPLEMENTED) {
        port = 0;                   /* a node without frames */
        again = FRAMES_RECHECK_MS;
    }
    pthread_mutex_lock(&n->flock);
    n->fasking = false;
    n->fport = port;
    if (port > 0) {
        rpc_frame_pool_set_port(n->frames, port);
        log_info("node %s: key batches over its frame port %d", n->addr, port);
    } else {
        n->fnext_ms = mono_ms() + again;
    }
    pthread_mutex_unlock(&n->flock);
    return port > 0 ? n->frames : NULL;
}

void router_node_frames_failed(struct router *r, struct router_node *n, int port)
{
    (void)r;
    pthread_mutex_lock(&n->flock);
    if (n->fport != port) {
        /* Another call learned a newer port meanwhile. */
        pthread_mutex_unlock(&n->flock);
        return;
    }
    if (n->fport > 0) {
        log_info("node %s: frame port %d failed; gRPC until it is known again",
                 n->addr, n->fport);
        rpc_frame_pool_set_port(n->frames, 0);
    }
    n->fport = -1;
    n->fnext_ms = mono_ms() + FRAMES_AFTER_LOSS_MS;
    pthread_mutex_unlock(&n->flock);
}

/* Run the calls of a batch: over frames to the nodes that offer them, over
 * gRPC to the others, and over gRPC again for frame calls that never left
 * this process (no connection).  A frame call that was sent and then lost
 * fails like a gRPC call whose connection broke (UNAVAILABLE). */
static void call_nodes(struct router *r, struct rpc_multi *calls,
                       struct router_node *const *nodes, size_t n, uint32_t method)
{
    size_t m = n ? n : 1, nf = 0, ng = 0;
    struct rpc_frame_call *fc = calloc(m, sizeof *fc);
    size_t *fmap = calloc(m, sizeof *fmap);
    struct rpc_multi *g = calloc(m, sizeof *g);
    bool *grpc = calloc(m, sizeof *grpc);

    if (!fc || !fmap || !g || !grpc) {
        rpc_call_many(calls, n);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        struct rpc_frame_pool *p = nodes[i] ? router_node_frames(r, nodes[i]) : NULL;
        grpc[i] = !p;
        if (!p)
            continue;
        fc[nf].pool = p;
        fc[nf].method = method;
        fc[nf].req = GRPC_SLICE_START_PTR(calls[i].req);
        fc[nf].len = GRPC_SLICE_LENGTH(calls[i].req);
        fc[nf].timeout_ms = calls[i].timeout_ms;
        fmap[nf++] = i;
    }
    if (nf)
        rpc_frame_call_many(fc, nf);
    for (size_t k = 0; k < nf; k++) {
        struct rpc_multi *c = &calls[fmap[k]];
        if (!fc[k].answered && !fc[k].refused)
            router_node_frames_failed(r, nodes[fmap[k]], fc[k].port);
        if (!fc[k].sent) {
            grpc[fmap[k]] = true;
            continue;
        }
        c->rc = fc[k].rc;
        c->st = fc[k].st;
        c->resp = fc[k].resp;
    }
    /* The rest over gRPC, as one fan-out. */
    for (size_t i = 0; i < n; i++)
        if (grpc[i])
            g[ng++] = calls[i];
    if (ng) {
        rpc_call_many(g, ng);
        for (size_t i = 0, j = 0; i < n; i++)
            if (grpc[i])
                calls[i] = g[j++];
    }
out:
    free(fc);
    free(fmap);
    free(g);
    free(grpc);
}

/* Index of an Internal method, as frames name it. */
static uint32_t internal_method(const char *name)
{
    const ProtobufCMethodDescriptor *m = protobuf_c_service_descriptor_get_method_by_name(
        &bloomgrid__v1__internal__descriptor, name);
    return m ? (uint32_t)(m - bloomgrid__v1__internal__descriptor.methods) : UINT32_MAX;
}

bool router_node_down(grpc_status_code c)
{
    return c == GRPC_STATUS_UNAVAILABLE || c == GRPC_STATUS_DEADLINE_EXCEEDED ||
           c == GRPC_STATUS_CANCELLED || c == GRPC_STATUS_UNKNOWN ||
           c == GRPC_STATUS_INTERNAL;
}

grpc_slice router_rpc__pack_slice(const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    return s;
}

void router_rpc__multi_free(struct rpc_multi *calls, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        grpc_slice_unref(calls[i].req);
        grpc_slice_unref(calls[i].resp);
    }
    free(calls);
}

const char *router_rpc__primary(const struct topo *t, const struct router_filter *f,
                                uint32_t shard)
{
    return t->groups[f->group[shard]].primary;
}

/* ---- filters: secret and shard count ---- */

/* Ask one node for shard 0 of name with its secret. */
static int fetch_secret(struct router *r, const char *addr, const char *name,
                        uint8_t *secret, uint32_t *shards, struct rpc_status *rs)
{
    Bloomgrid__V1__GetShardRequest req = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;
    struct rpc_channel *ch = router_channel(r, addr);
    if (!ch) {
        rs->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(rs->message, sizeof rs->message, "out of memory");
        return -1;
    }
    req.filter = (char *)name;
    req.shard_index = 0;
    req.include_secret = true;
    if (rpc_call(ch, M_GET, &req.base, &bloomgrid__v1__internal_shard_info__descriptor,
                 &resp, (int)r->cfg.node_timeout_ms, rs) < 0)
        return -1;
    Bloomgrid__V1__InternalShardInfo *isi = (Bloomgrid__V1__InternalShardInfo *)resp;
    int rc = 0;
    if (isi->secret.len != BF_SECRET_LEN || isi->shard_count < 1 ||
        isi->shard_count > ROUTER_MAX_SHARDS ||
        (isi->hash_id && isi->hash_id != BF_HASH_XXH3_128)) {
        rs->code = GRPC_STATUS_UNAVAILABLE;
        snprintf(rs->message, sizeof rs->message,
                 "node %s describes shard 0 of filter \"%s\" without a usable "
                 "secret (%zu bytes, %u shards, hash %u); it is not ready", addr,
                 name, isi->secret.len, isi->shard_count, isi->hash_id);
        rc = -1;
    } else {
        memcpy(secret, isi->secret.data, BF_SECRET_LEN);
        *shards = isi->shard_count;
    }
    protobuf_c_message_free_unpacked(resp, NULL);
    return rc;
}

/* The filter as this router knows it, fetching its secret from shard 0's
 * group (primary, then replicas) when it is not cached or is stale.  A stale
 * entry still serves when no node of that group answers. */
struct router_filter *router_filter_lookup(struct router *r, const struct topo *t,
                                          const char *name, struct rpc_status *st)
{
    struct router_filter *stale = NULL;
    struct router_filter *f = router_filter_get(r, name, t, &stale);
    if (f)
        return f;
    const struct topo_group *g = &t->groups[topo_group_for(t, name, 0)];
    struct rpc_status rs = {0};
    uint8_t secret[BF_SECRET_LEN];
    uint32_t shards = 0;
    int rc = fetch_secret(r, g->primary, name, secret, &shards, &rs);
    const char *addr = g->primary;
    for (unsigned i = 0; rc < 0 && router_node_down(rs.code) && i < g->nreplicas; i++) {
        addr = g->replicas[i];
        rc = fetch_secret(r, addr, name, secret, &shards, &rs);
    }
    if (rc < 0) {
        if (rs.code == GRPC_STATUS_NOT_FOUND) {
            router_filter_forget(r, name);
            router_filter_unref(stale);
            rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                       name);
            return NULL;
        }
        if (stale && router_node_down(rs.code)) {
            log_warn("cannot re-check filter %s on %s (%s); using the cached secret",
                     name, addr, rs.message);
            f = router_filter_add(r, name, stale->secret, stale->shards,
                                  (struct topo *)t, stale);
            router_filter_unref(stale);
            if (!f)
                rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            return f;
        }
        router_filter_unref(stale);
        rpc_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                   "filter \"%s\": shard 0 on node %s (group %s): %s: %s", name,
                   addr, g->name, rpc_status_name(rs.code), rs.message);
        return NULL;
    }
    if (stale && memcmp(stale->secret, secret, BF_SECRET_LEN) != 0)
        log_info("filter %s was re-created: new secret", name);
    f = router_filter_add(r, name, secret, shards, (struct topo *)t, stale);
    router_filter_unref(stale);
    if (!f)
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return f;
}

/* ---- key batches ---- */

struct scratch {
    struct bf_hash *h;
    uint32_t *shard, *idx;
    size_t cap;
    uint32_t count[ROUTER_MAX_SHARDS + 1], start[ROUTER_MAX_SHARDS + 1];
};

/* One scratch per thread, freed when the thread exits. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    struct scratch *s = p;
    free(s->h);
    free(s->shard);
    free(s->idx);
    free(s);
}

static void scratch_key_init(void)
{
    pthread_key_create(&scratch_key, scratch_free);
}

static struct scratch *scratch_get(size_t n)
{
    pthread_once(&scratch_once, scratch_key_init);
    struct scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < n)
            cap *= 2;
        struct bf_hash *h = realloc(s->h, cap * sizeof *h);
        if (h)
            s->h = h;
        uint32_t *sh = realloc(s->shard, cap * sizeof *sh);
        if (sh)
            s->shard = sh;
        uint32_t *ix = realloc(s->idx, cap * sizeof *ix);
        if (ix)
            s->idx = ix;
        if (!h || !sh || !ix)
            return NULL;
        s->cap = cap;
    }
    return s;
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* One `repeated bool results` field of a response: packed (a length and
 * one byte per result) or a single unpacked value, at *p.  Stores into
 * out[idx[*got]] onwards; false when it does not parse or would exceed want
 * results. */
static bool read_bools(const uint8_t **p, const uint8_t *end, bool packed, size_t want,
                       const uint32_t *idx, bool *out, size_t *got)
{
    uint64_t v;

    if (!get_varint(p, end, &v))
        return false;
    if (!packed) {
        if (*got >= want)
            return false;
        out[idx[(*got)++]] = v != 0;
        return true;
    }
    if (v > (uint64_t)(end - *p) || *got + v > want)
        return false;
    for (uint64_t k = 0; k < v; k++)
        out[idx[(*got)++]] = (*p)[k] != 0;
    *p += v;
    return true;
}

/* Decode a HashesResponse of want results into out[idx[k]].  Returns false
 * when it does not parse or has the wrong number of results. */
static bool decode_results(grpc_slice resp, size_t want, const uint32_t *idx,
                           bool *out, uint64_t *version)
{
    const uint8_t *p = GRPC_SLICE_START_PTR(resp), *end = p + GRPC_SLICE_LENGTH(resp);
    size_t got = 0;
    uint64_t tag, v;
    *version = 0;
    while (p < end) {
        if (!get_varint(&p, end, &tag))
            return false;
        switch (tag) {
        case 0x0a: /* results, packed */
        case 0x08: /* one result, unpacked */
            if (!read_bools(&p, end, tag == 0x0a, want, idx, out, &got))
                return false;
            break;
        case 0x10:
            if (!get_varint(&p, end, version))
                return false;
            break;
        default:
            switch (tag & 7) {
            case 0:
                if (!get_varint(&p, end, &v))
                    return false;
                break;
            case 1:
                if (end - p < 8)
                    return false;
                p += 8;
                break;
            case 2:
                if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p))
                    return false;
                p += v;
                break;
            case 5:
                if (end - p < 4)
                    return false;
                p += 4;
                break;
            default:
                return false;
            }
        }
    }
    return got == want;
}

/* A failed shard of a batch. */
struct shard_fail {
    uint32_t shard;
    const char *node;
    grpc_status_code code;
    enum rpc_reason reason;
    char msg[200];
};

static int shard_fail_cmp(const void *a, const void *b)
{
    uint32_t x = ((const struct shard_fail *)a)->shard;
    uint32_t y = ((const struct shard_fail *)b)->shard;
    return x < y ? -1 : x > y;
}

/* Try a failed read on the replicas of its group that are known to be caught
 * up: they must report at least the version this router last saw from the
 * primary.  Returns true when a replica answered. */
static bool read_from_replica(struct router *r, const struct topo *t,
                              struct router_filter *f, uint32_t shard,
                              grpc_slice req, size_t want, const uint32_t *idx,
                              bool *out)
{
    const struct topo_group *g = &t->groups[f->group[shard]];
    uint64_t need = atomic_load(&f->seen_version[shard]);
    if (need == 0)
        return false;    /* nothing to compare a replica with */
    for (unsigned i = 0; i < g->nreplicas; i++) {
        struct rpc_channel *ch = router_channel(r, g->replicas[i]);
        grpc_slice resp;
        struct rpc_status rs;
        uint64_t version;
        if (!ch || rpc_call_raw(ch, key_methods[ROUTER_MAY_CONTAIN],
                                GRPC_SLICE_START_PTR(req), GRPC_SLICE_LENGTH(req),
                                &resp, (int)r->cfg.node_timeout_ms, &rs) < 0)
            continue;
        bool ok = decode_results(resp, want, idx, out, &version) && version >= need;
        grpc_slice_unref(resp);
        if (ok) {
            log_info("shard %u of %s read from replica %s (version %llu)", shard,
                     f->name, g->replicas[i], (unsigned long long)version);
            return true;
        }
    }
    return false;
}

/* Append the ranges of key indices whose shard failed (or did not) to buf. */
static void list_keys(char *buf, size_t len, const bool *failed_shard,
                      const uint32_t *shard_of, size_t n, bool want_failed)
{
    size_t used = strlen(buf);
    size_t i = 0;
    bool first = true;
    while (i < n) {
        if (failed_shard[shard_of[i]] != want_failed) {
            i++;
            continue;
        }
        size_t j = i;
        while (j + 1 < n && failed_shard[shard_of[j + 1]] == want_failed)
            j++;
        char item[48];
        if (j == i)
            snprintf(item, sizeof item, "%s%zu", first ? "" : ",", i);
        else
            snprintf(item, sizeof item, "%s%zu-%zu", first ? "" : ",", i, j);
        if (used + strlen(item) + 5 >= len) {
            snprintf(buf + used, len - used, ",...");
            return;
        }
        memcpy(buf + used, item, strlen(item) + 1);
        used += strlen(item);
        first = false;
        i = j + 1;
    }
}

/* Build the status of a batch with failed shards. */
static void batch_failure(struct rpc_status *st, enum router_key_op op,
                          const char *filter, const struct shard_fail *fails,
                          size_t nfail, const bool *failed_shard,
                          const uint32_t *shard_of, size_t n)
{
    grpc_status_code code = GRPC_STATUS_UNAVAILABLE;
    bool all_down = true;
    for (size_t i = 0; i < nfail; i++)
        if (!router_node_down(fails[i].code) && fails[i].code != GRPC_STATUS_NOT_FOUND) {
            code = fails[i].code;   /* e.g. FAILED_PRECONDITION: pass it on */
            all_down = false;
            break;
        }
    size_t acked = 0;
    for (size_t i = 0; i < n; i++)
        if (!failed_shard[shard_of[i]])
            acked++;
    int w = snprintf(st->message, sizeof st->message, "%s on filter \"%s\": shard %u on node "
                     "%s: %s: %s", op_names[op], filter, fails[0].shard,
                     fails[0].node, rpc_status_name(fails[0].code), fails[0].msg);
    if (nfail > 1 && w > 0 && (size_t)w < sizeof st->message) {
        w += snprintf(st->message + w, sizeof st->message - (size_t)w, " (and %zu more "
                      "shards:", nfail - 1);
        for (size_t i = 1; i < nfail && i < 6 && (size_t)w < sizeof st->message; i++)
            w += snprintf(st->message + w, sizeof st->message - (size_t)w, " %u@%s",
                          fails[i].shard, fails[i].node);
        if ((size_t)w < sizeof st->message)
            w += snprintf(st->message + w, sizeof st->message - (size_t)w, "%s)",
                          nfail > 6 ? " ..." : "");
    }
    if (op != ROUTER_MAY_CONTAIN && all_down && w > 0 && (size_t)w < sizeof st->message) {
        /* Writes: say which keys were acknowledged anyway. */
        snprintf(st->message + w, sizeof st->message - (size_t)w,
                 "; acknowledged %zu of %zu keys; not acknowledged: ", acked, n);
        list_keys(st->message, sizeof st->message, failed_shard, shard_of, n, true);
    }
    st->code = code;
}

/* ---- one call per node ---- */

/* One shard's outcome inside a node's answer. */
struct shard_res {
    grpc_status_code code;
    enum rpc_reason reason;
    uint64_t version;
    char msg[200];
};

/* Skip one field of wire type wt.  Returns false when it does not parse. */
static bool skip_field(const uint8_t **p, const uint8_t *end, unsigned wt)
{
    uint64_t v;
    switch (wt) {
    case 0:
        return get_varint(p, end, &v);
    case 1:
        if (end - *p < 8)
            return false;
        *p += 8;
        return true;
    case 2:
        if (!get_varint(p, end, &v) || v > (uint64_t)(end - *p))
            return false;
        *p += v;
        return true;
    case 5:
        if (end - *p < 4)
            return false;
        *p += 4;
        return true;
    default:
        return false;
    }
}

/* Decode one ShardResult [p, end) for shard s with want results into
 * out[idx[k]].  Returns false when it does not parse, names another shard
 * or (on OK) has the wrong number of results. */
static bool decode_shard_result(const uint8_t *p, const uint8_t *end, uint32_t s,
                                size_t want, const uint32_t *idx, bool *out,
                                struct shard_res *res)
{
    uint64_t tag, v, index = 0;
    size_t got = 0;
    res->code = GRPC_STATUS_OK;
    res->reason = RPC_REASON_NONE;
    res->version = 0;
    res->msg[0] = 0;
    while (p < end) {
        if (!get_varint(&p, end, &tag))
            return false;
        switch (tag) {
        case 0x08:
            if (!get_varint(&p, end, &index))
                return false;
            break;
        case 0x12: /* results, packed */
        case 0x10: /* one result, unpacked */
            if (!read_bools(&p, end, tag == 0x12, want, idx, out, &got))
                return false;
            break;
        case 0x18:
            if (!get_varint(&p, end, &res->version))
                return false;
            break;
        case 0x20:
            if (!get_varint(&p, end, &v))
                return false;
            res->code = (grpc_status_code)(int32_t)v;
            break;
        case 0x2a:
            if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return false;
            snprintf(res->msg, sizeof res->msg, "%.*s", (int)(v < 199 ? v : 199),
                     (const char *)p);
            p += v;
            break;
        case 0x30:
            if (!get_varint(&p, end, &v))
                return false;
            res->reason = (enum rpc_reason)v;
            break;
        default:
            if (!skip_field(&p, end, (unsigned)(tag & 7)))
                return false;
        }
    }
    if (index != s)
        return false;
    if (res->code == GRPC_STATUS_OK && got != want)
        return false;
    if (res->code != GRPC_STATUS_OK && !res->msg[0])
        snprintf(res->msg, sizeof res->msg, "%s", rpc_status_name(res->code));
    return true;
}

/* A key batch in flight: the shards that have keys, grouped into one call
 * per node. */
struct batch {
    struct router *r;
    const struct topo *t;
    struct router_filter *f;
    const char *filter;
    enum router_key_op op;
    struct scratch *sc;
    bool *out;
    uint32_t *order;          /* used shards, grouped by call, ascending */
    uint32_t *call_first;     /* per call: its first entry in order */
    uint32_t *call_n;         /* per call: how many shards */
    struct rpc_multi *calls;
    struct router_node **node;  /* per call */
    size_t ncalls;
    struct shard_res *res;    /* per entry of order */
    bool ask0;                /* shard 0 takes part even with no keys */
};

/* Does shard s take part in the batch? */
static bool batch_uses(const struct batch *b, uint32_t s)
{
    return b->sc->count[s] || (b->ask0 && s == 0);
}

/* Keys of shard s in request order (valid after the hashes are placed). */
static const uint32_t *shard_idx(const struct scratch *sc, uint32_t s)
{
    return sc->idx + sc->start[s] - sc->count[s];
}

/* A one-shard HashesRequest for shard s (fallbacks: replicas, nodes that do
 * not serve the multi-shard calls). */
static grpc_slice shard_request(const struct batch *b, uint32_t s)
{
    const struct scratch *sc = b->sc;
    size_t flen = strlen(b->filter), cnt = sc->count[s], hb = 16 * cnt;
    size_t len = 1 + varint_len(flen) + flen + (s ? 1 + varint_len(s) : 0) + 2 +
                 9 + 1 + varint_len(hb) + hb;
    grpc_slice sl = grpc_slice_malloc(len);
    uint8_t *p = GRPC_SLICE_START_PTR(sl);
    const uint32_t *idx = shard_idx(sc, s);
    *p++ = 0x0a;
    p = put_varint(p, flen);
    memcpy(p, b->filter, flen);
    p += flen;
    if (s) {
        *p++ = 0x10;
        p = put_varint(p, s);
    }
    *p++ = 0x20;     /* check_shard = true: the node refuses strays */
    *p++ = 0x01;
    *p++ = 0x29;     /* secret_id: the node refuses another secret */
    put_le64(p, b->f->secret_id);
    p += 8;
    *p++ = 0x1a;
    p = put_varint(p, hb);
    for (size_t k = 0; k < cnt; k++, p += 16) {
        put_le64(p, sc->h[idx[k]].h1);
        put_le64(p + 8, sc->h[idx[k]].h2);
    }
    return sl;
}

/* Length of shard s's ShardHashes entry (without its tag and length). */
static size_t entry_len(uint32_t s, size_t cnt)
{
    return (s ? 1 + varint_len(s) : 0) + 1 + varint_len(16 * cnt) + 16 * cnt;
}

/* Group the used shards by the primary of their group and start one
 * MultiHashesRequest per node, hashes written in place.  Returns 0 or
 * -ENOMEM. */
static int batch_build(struct batch *b, size_t n, uint32_t nused)
{
    struct scratch *sc = b->sc;
    const struct topo *t = b->t;
    uint32_t S = b->f->shards;
    uint32_t *call_of_group = malloc(t->ngroups * sizeof *call_of_group);
    uint32_t *call_of = malloc(S * sizeof *call_of);
    uint8_t **wp = malloc(S * sizeof *wp);
    const char **addr = calloc(nused, sizeof *addr);   /* per call */
    int rc = -ENOMEM;

    b->order = malloc(nused * sizeof *b->order);
    b->call_first = calloc(nused, sizeof *b->call_first);
    b->call_n = calloc(nused, sizeof *b->call_n);
    b->calls = calloc(nused, sizeof *b->calls);
    b->node = calloc(nused, sizeof *b->node);
    b->res = calloc(nused, sizeof *b->res);
    if (!call_of_group || !call_of || !wp || !addr || !b->order || !b->call_first ||
        !b->call_n || !b->calls || !b->node || !b->res)
        goto out;
    for (unsigned g = 0; g < t->ngroups; g++)
        call_of_group[g] = UINT32_MAX;
    /* Calls by node: groups that share a primary share its call. */
    for (uint32_t s = 0; s < S; s++) {
        if (!batch_uses(b, s))
            continue;
        uint32_t g = b->f->group[s];
        if (call_of_group[g] == UINT32_MAX) {
            const char *a = t->groups[g].primary;
            uint32_t c = 0;
            while (c < b->ncalls && strcmp(addr[c], a) != 0)
                c++;
            if (c == b->ncalls)
                addr[b->ncalls++] = a;
            call_of_group[g] = c;
        }
        call_of[s] = call_of_group[g];
        b->call_n[call_of[s]]++;
    }
    for (size_t c = 1; c < b->ncalls; c++)
        b->call_first[c] = b->call_first[c - 1] + b->call_n[c - 1];
    size_t flen = strlen(b->filter);
    size_t *len = calloc(b->ncalls, sizeof *len);
    uint32_t *fill = calloc(b->ncalls, sizeof *fill);
    if (!len || !fill) {
        free(len);
        free(fill);
        goto out;
    }
    for (uint32_t s = 0; s < S; s++) {
        if (!batch_uses(b, s))
            continue;
        uint32_t c = call_of[s];
        size_t e = entry_len(s, sc->count[s]);
        b->order[b->call_first[c] + fill[c]++] = s;
        len[c] += 1 + varint_len(e) + e;
    }
    for (size_t c = 0; c < b->ncalls; c++) {
        struct rpc_multi *m = &b->calls[c];
        b->node[c] = router_node_get(b->r, addr[c]);
        m->ch = b->node[c] ? b->node[c]->ch : NULL;
        m->method = multi_methods[b->op];
        m->timeout_ms = (int)b->r->cfg.node_timeout_ms;
        m->resp = grpc_empty_slice();
        m->req = grpc_slice_malloc(1 + varint_len(flen) + flen + len[c] + 2 + 9);
        uint8_t *p = GRPC_SLICE_START_PTR(m->req);
        *p++ = 0x0a;
        p = put_varint(p, flen);
        memcpy(p, b->filter, flen);
        p += flen;
        for (uint32_t k = 0; k < b->call_n[c]; k++) {
            uint32_t s = b->order[b->call_first[c] + k];
            size_t cnt = sc->count[s];
            *p++ = 0x12;
            p = put_varint(p, entry_len(s, cnt));
            if (s) {
                *p++ = 0x08;
                p = put_varint(p, s);
            }
            *p++ = 0x12;
            p = put_varint(p, 16 * cnt);
            wp[s] = p;
            p += 16 * cnt;
        }
        *p++ = 0x18;     /* check_shard = true: the node refuses strays */
        *p++ = 0x01;
        *p++ = 0x21;     /* secret_id: each shard refuses another secret */
        put_le64(p, b->f->secret_id);
    }
    free(len);
    free(fill);
    for (size_t i = 0; i < n; i++) {
        uint32_t s = sc->shard[i];
        put_le64(wp[s], sc->h[i].h1);
        put_le64(wp[s] + 8, sc->h[i].h2);
        wp[s] += 16;
        sc->idx[sc->start[s]++] = (uint32_t)i;
    }
    /* start[s] now points at the end of shard s's keys (shard_idx). */
    rc = 0;
    for (size_t c = 0; c < b->ncalls; c++)
        if (!b->calls[c].ch)
            rc = -ENOMEM;
out:
    free(call_of_group);
    free(call_of);
    free(wp);
    free(addr);
    return rc;
}

/* Put call c's answer into out and res, entry by entry. */
static void batch_collect(struct batch *b, size_t c)
{
    struct rpc_multi *m = &b->calls[c];
    struct shard_res *res = b->res + b->call_first[c];
    const uint32_t *order = b->order + b->call_first[c];
    uint32_t n = b->call_n[c];

    if (m->rc == 0) {
        const uint8_t *p = GRPC_SLICE_START_PTR(m->resp);
        const uint8_t *end = p + GRPC_SLICE_LENGTH(m->resp);
        uint32_t k = 0;
        bool ok = true;
        while (ok && p < end) {
            uint64_t tag, v;
            ok = get_varint(&p, end, &tag);
            if (ok && tag != 0x0a) {
                ok = skip_field(&p, end, (unsigned)(tag & 7));
                continue;
            }
            ok = ok && get_varint(&p, end, &v) && v <= (uint64_t)(end - p) && k < n;
            if (ok) {
                uint32_t s = order[k];
                ok = decode_shard_result(p, p + v, s, b->sc->count[s],
                                         shard_idx(b->sc, s), b->out, &res[k]);
                p += v;
                k++;
            }
        }
        if (ok && k == n)
            return;
        m->st.code = GRPC_STATUS_INTERNAL;
        snprintf(m->st.message, sizeof m->st.message,
                 "answer does not parse or has the wrong number of results");
    } else if (m->st.code == GRPC_STATUS_UNIMPLEMENTED) {
        /* A node that does not serve the multi-shard calls: one call per
         * shard, as before. */
        struct rpc_multi *one = calloc(n, sizeof *one);
        if (one) {
            for (uint32_t k = 0; k < n; k++) {
                one[k].ch = m->ch;
                one[k].method = key_methods[b->op];
                one[k].req = shard_request(b, order[k]);
                one[k].timeout_ms = m->timeout_ms;
            }
            rpc_call_many(one, n);
            for (uint32_t k = 0; k < n; k++) {
                uint32_t s = order[k];
                res[k].code = one[k].st.code;
                res[k].reason = one[k].st.reason;
                res[k].version = 0;
                snprintf(res[k].msg, sizeof res[k].msg, "%.199s", one[k].st.message);
                if (one[k].rc == 0 &&
                    !decode_results(one[k].resp, b->sc->count[s], shard_idx(b->sc, s),
                                    b->out, &res[k].version)) {
                    res[k].code = GRPC_STATUS_INTERNAL;
                    snprintf(res[k].msg, sizeof res[k].msg, "answer does not parse "
                             "or has the wrong number of results");
                }
            }
            router_rpc__multi_free(one, n);
            return;
        }
    }
    for (uint32_t k = 0; k < n; k++) {
        res[k].code = m->st.code;
        res[k].reason = m->st.reason;
        res[k].version = 0;
        snprintf(res[k].msg, sizeof res[k].msg, "%.199s", m->st.message);
    }
}

static void batch_free(struct batch *b)
{
    if (b->calls)
        router_rpc__multi_free(b->calls, b->ncalls);
    free(b->order);
    free(b->call_first);
    free(b->call_n);
    free(b->node);
    free(b->res);
}

/* One attempt at a key batch; *stale is set when a node says the cached
 * secret is no longer the filter's. */
static int keys_once(struct router *r, const char *filter, enum router_key_op op,
                     const uint8_t *const *keys, const uint32_t *lens, size_t n,
                     bool *out, struct rpc_status *st, bool *stale)
{
    struct topo *t = router_topo(r);
    struct batch b = {.r = r, .t = t, .filter = filter, .op = op, .out = out};
    struct shard_fail *fails = NULL;
    bool *failed_shard = NULL;
    size_t nfail = 0;
    uint32_t nused = 0;
    int rc = -1;

    b.f = router_filter_lookup(r, t, filter, st);
    if (!b.f)
        goto out;
    struct router_filter *f = b.f;
    struct scratch *sc = b.sc = scratch_get(n ? n : 1);
    if (!sc) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    uint32_t S = f->shards;
    /* Hash once, count per shard. */
    memset(sc->count, 0, (S + 1) * sizeof sc->count[0]);
    for (size_t i = 0; i < n; i++) {
        sc->h[i] = bf_hash_key(f->hasher, keys[i], lens[i]);
        sc->shard[i] = bf_hash_shard(sc->h[i], S);
        sc->count[sc->shard[i]]++;
    }
    for (uint32_t s = 0, off = 0; s < S; s++) {
        sc->start[s] = off;
        off += sc->count[s];
        nused += sc->count[s] > 0;
    }
    if (nused == 0 && op == ROUTER_REMOVE) {
        /* No keys: shard 0 still answers whether the filter takes a
         * Remove, as a node's Remove of no keys does. */
        b.ask0 = true;
        nused = 1;
    }
    if (nused == 0) {
        rc = 0;
        goto out;
    }
    fails = calloc(nused, sizeof *fails);
    failed_shard = calloc(S, sizeof *failed_shard);
    if (!fails || !failed_shard || batch_build(&b, n, nused) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    call_nodes(r, b.calls, b.node, b.ncalls, internal_method(multi_names[op]));
    for (size_t c = 0; c < b.ncalls; c++)
        batch_collect(&b, c);
    for (uint32_t k = 0; k < nused; k++) {
        uint32_t s = b.order[k];
        struct shard_res *res = &b.res[k];
        if (res->code == GRPC_STATUS_OK) {
            router_filter_saw_version(f, s, res->version);
            continue;
        }
        if (op == ROUTER_MAY_CONTAIN && router_node_down(res->code)) {
            grpc_slice req = shard_request(&b, s);
            bool ok = read_from_replica(r, t, f, s, req, sc->count[s],
                                       shard_idx(sc, s), out);
            grpc_slice_unref(req);
            if (ok)
                continue;
        }
        struct shard_fail *sf = &fails[nfail++];
        sf->shard = s;
        sf->node = router_rpc__primary(t, f, s);
        sf->code = res->code;
        sf->reason = res->reason;
        snprintf(sf->msg, sizeof sf->msg, "%s", res->msg);
        failed_shard[s] = true;
    }
    if (nfail == 0) {
        rc = 0;
        goto out;
    }
    /* Failures in shard order, as the messages list them. */
    qsort(fails, nfail, sizeof *fails, shard_fail_cmp);
    size_t notfound = 0;
    bool not_counting = false;
    for (size_t i = 0; i < nfail; i++) {
        notfound += fails[i].code == GRPC_STATUS_NOT_FOUND;
        if (fails[i].reason == RPC_REASON_SECRET_MISMATCH)
            *stale = true;
        if (fails[i].reason == RPC_REASON_NOT_COUNTING)
            not_counting = true;
    }
    if (*stale) {
        router_filter_forget(r, filter);
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, "%s", fails[0].msg);
        goto out;
    }
    if (not_counting) {
        /* Every shard has the filter's kind: answer as a node would. */
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, RULES_MSG_NOT_COUNTING,
                       filter);
        st->reason = RPC_REASON_NOT_COUNTING;
        goto out;
    }
    if (notfound) /* dropped or re-created elsewhere: fetch it again next time */
        router_filter_forget(r, filter);
    if (notfound == nfail && nfail == nused) {
        rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist", filter);
        goto out;
    }
    batch_failure(st, op, filter, fails, nfail, failed_shard, sc->shard, n);
    log_warn("%s", st->message);
out:
    batch_free(&b);
    free(fails);
    free(failed_shard);
    router_filter_unref(b.f);
    topo_unref(t);
    return rc;
}

int router_keys(struct router *r, const char *filter, enum router_key_op op,
                const uint8_t *const *keys, const uint32_t *lens, size_t n,
                bool *out, struct rpc_status *st)
{
    bool stale = false;
    int rc = keys_once(r, filter, op, keys, lens, n, out, st, &stale);
    if (rc < 0 && stale) {
        /* The filter was re-created elsewhere: nothing was applied with the
         * old secret; fetch the new one and run the batch again. */
        log_info("filter %s has a new secret; fetching it", filter);
        stale = false;
        rc = keys_once(r, filter, op, keys, lens, n, out, st, &stale);
    }
    return rc;
}
