/* router_rpc_nodes: the router's side of the internal service (see
 * router_nodes.h).  With router_rpc.c, the only place of the router that
 * converts wire messages.
 *
 * Hash batches are encoded by hand straight into the slice that is sent
 * (HashesRequest: 1 filter, 2 shard_index, 3 hashes, 4 check_shard), and
 * answers (HashesResponse: 1 packed bools, 2 version) are decoded by hand
 * into the caller's output in request order: a batch costs no per-key
 * allocation.  Catalog messages use the generated protobuf-c code.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "router_nodes.h"
#include "rpc_client.h"

#define M_CREATE "/bloomgrid.v1.Internal/CreateShard"
#define M_DROP "/bloomgrid.v1.Internal/DropShard"
#define M_GET "/bloomgrid.v1.Internal/GetShard"
#define M_LIST "/bloomgrid.v1.Internal/ListShards"

static const char *const key_methods[] = {
    "/bloomgrid.v1.Internal/AddHashes",
    "/bloomgrid.v1.Internal/MayContainHashes",
    "/bloomgrid.v1.Internal/RemoveHashes",
};
static const char *const op_names[] = {"Add", "MayContain", "Remove"};

void router_status_set(struct router_status *st, grpc_status_code code,
                       const char *fmt, ...)
{
    va_list ap;
    st->code = code;
    va_start(ap, fmt);
    vsnprintf(st->msg, sizeof st->msg, fmt, ap);
    va_end(ap);
}

/* Transport-like failures: the node is down, slow or going away. */
bool router_node_down(grpc_status_code c)
{
    return c == GRPC_STATUS_UNAVAILABLE || c == GRPC_STATUS_DEADLINE_EXCEEDED ||
           c == GRPC_STATUS_CANCELLED || c == GRPC_STATUS_UNKNOWN ||
           c == GRPC_STATUS_INTERNAL;
}

static grpc_slice pack_slice(const ProtobufCMessage *m)
{
    size_t len = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(len);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    return s;
}

static void multi_free(struct rpc_multi *calls, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        grpc_slice_unref(calls[i].req);
        grpc_slice_unref(calls[i].resp);
    }
    free(calls);
}

static const char *group_primary(const struct topo *t, const struct router_filter *f,
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
                                          const char *name, struct router_status *st)
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
            router_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
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
                router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            return f;
        }
        router_filter_unref(stale);
        router_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                   "filter \"%s\": shard 0 on node %s (group %s): %s: %s", name,
                   addr, g->name, rpc_status_name(rs.code), rs.message);
        return NULL;
    }
    if (stale && memcmp(stale->secret, secret, BF_SECRET_LEN) != 0)
        log_info("filter %s was re-created: new secret", name);
    f = router_filter_add(r, name, secret, shards, (struct topo *)t, stale);
    router_filter_unref(stale);
    if (!f)
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
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

static inline uint8_t *put_varint(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static inline size_t varint_len(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    const uint8_t *q = *p;
    for (int shift = 0; shift < 70 && q < end; shift += 7) {
        uint8_t b = *q++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *p = q;
            *v = x;
            return true;
        }
    }
    return false;
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
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
        case 0x0a: /* packed bools */
            if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p) ||
                got + v > want)
                return false;
            for (uint64_t k = 0; k < v; k++)
                out[idx[got++]] = p[k] != 0;
            p += v;
            break;
        case 0x08: /* one unpacked bool */
            if (!get_varint(&p, end, &v) || got >= want)
                return false;
            out[idx[got++]] = v != 0;
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
    char msg[200];
};

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
static void batch_failure(struct router_status *st, enum router_key_op op,
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
    int w = snprintf(st->msg, sizeof st->msg, "%s on filter \"%s\": shard %u on node "
                     "%s: %s: %s", op_names[op], filter, fails[0].shard,
                     fails[0].node, rpc_status_name(fails[0].code), fails[0].msg);
    if (nfail > 1 && w > 0 && (size_t)w < sizeof st->msg) {
        w += snprintf(st->msg + w, sizeof st->msg - (size_t)w, " (and %zu more "
                      "shards:", nfail - 1);
        for (size_t i = 1; i < nfail && i < 6 && (size_t)w < sizeof st->msg; i++)
            w += snprintf(st->msg + w, sizeof st->msg - (size_t)w, " %u@%s",
                          fails[i].shard, fails[i].node);
        if ((size_t)w < sizeof st->msg)
            w += snprintf(st->msg + w, sizeof st->msg - (size_t)w, "%s)",
                          nfail > 6 ? " ..." : "");
    }
    if (op != ROUTER_MAY_CONTAIN && all_down && w > 0 && (size_t)w < sizeof st->msg) {
        /* Writes: say which keys were acknowledged anyway. */
        snprintf(st->msg + w, sizeof st->msg - (size_t)w,
                 "; acknowledged %zu of %zu keys; not acknowledged: ", acked, n);
        list_keys(st->msg, sizeof st->msg, failed_shard, shard_of, n, true);
    }
    st->code = code;
}

/* One attempt at a key batch; *stale is set when a node says the cached
 * secret is no longer the filter's. */
static int keys_once(struct router *r, const char *filter, enum router_key_op op,
                     const uint8_t *const *keys, const uint32_t *lens, size_t n,
                     bool *out, struct router_status *st, bool *stale)
{
    struct topo *t = router_topo(r);
    struct router_filter *f = router_filter_lookup(r, t, filter, st);
    struct rpc_multi *calls = NULL;
    struct shard_fail *fails = NULL;
    bool *failed_shard = NULL;
    size_t ncalls = 0, nfail = 0;
    int rc = -1;

    if (!f)
        goto out;
    struct scratch *sc = scratch_get(n ? n : 1);
    if (!sc) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
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
    size_t used = 0;
    for (uint32_t s = 0, off = 0; s < S; s++) {
        sc->start[s] = off;
        off += sc->count[s];
        used += sc->count[s] > 0;
    }
    calls = calloc(used ? used : 1, sizeof *calls);
    fails = calloc(used ? used : 1, sizeof *fails);
    failed_shard = calloc(S, sizeof *failed_shard);
    uint32_t *call_of = calloc(S, sizeof *call_of);
    uint8_t **wp = calloc(S, sizeof *wp);
    if (!calls || !fails || !failed_shard || !call_of || !wp) {
        free(call_of);
        free(wp);
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* One HashesRequest per shard, hashes written in place. */
    size_t flen = strlen(filter);
    for (uint32_t s = 0; s < S; s++) {
        if (!sc->count[s])
            continue;
        size_t hb = 16 * (size_t)sc->count[s];
        size_t len = 1 + varint_len(flen) + flen + (s ? 1 + varint_len(s) : 0) + 2 +
                     9 + 1 + varint_len(hb) + hb;
        struct rpc_multi *c = &calls[ncalls];
        c->req = grpc_slice_malloc(len);
        c->resp = grpc_empty_slice();
        uint8_t *p = GRPC_SLICE_START_PTR(c->req);
        *p++ = 0x0a;
        p = put_varint(p, flen);
        memcpy(p, filter, flen);
        p += flen;
        if (s) {
            *p++ = 0x10;
            p = put_varint(p, s);
        }
        *p++ = 0x20;     /* check_shard = true: the node refuses strays */
        *p++ = 0x01;
        *p++ = 0x29;     /* secret_id: the node refuses another secret */
        put_le64(p, f->secret_id);
        p += 8;
        *p++ = 0x1a;
        p = put_varint(p, hb);
        wp[s] = p;
        c->ch = router_channel(r, group_primary(t, f, s));
        c->method = key_methods[op];
        c->timeout_ms = (int)r->cfg.node_timeout_ms;
        call_of[s] = (uint32_t)ncalls++;
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t s = sc->shard[i];
        put_le64(wp[s], sc->h[i].h1);
        put_le64(wp[s] + 8, sc->h[i].h2);
        wp[s] += 16;
        sc->idx[sc->start[s]++] = (uint32_t)i;
    }
    free(wp);
    /* start[s] now points at the end of shard s's keys. */
    for (size_t i = 0; i < ncalls; i++)
        if (!calls[i].ch) {
            free(call_of);
            router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
    rpc_call_many(calls, ncalls);
    for (uint32_t s = 0; s < S; s++) {
        if (!sc->count[s])
            continue;
        struct rpc_multi *c = &calls[call_of[s]];
        const uint32_t *idx = sc->idx + sc->start[s] - sc->count[s];
        uint64_t version = 0;
        if (c->rc == 0 && decode_results(c->resp, sc->count[s], idx, out, &version)) {
            router_filter_saw_version(f, s, version);
            continue;
        }
        if (c->rc == 0) {
            c->st.code = GRPC_STATUS_INTERNAL;
            snprintf(c->st.message, sizeof c->st.message,
                     "answer does not parse or has the wrong number of results");
        }
        if (op == ROUTER_MAY_CONTAIN && router_node_down(c->st.code) &&
            read_from_replica(r, t, f, s, c->req, sc->count[s], idx, out))
            continue;
        struct shard_fail *sf = &fails[nfail++];
        sf->shard = s;
        sf->node = group_primary(t, f, s);
        sf->code = c->st.code;
        snprintf(sf->msg, sizeof sf->msg, "%.199s", c->st.message);
        failed_shard[s] = true;
    }
    free(call_of);
    if (nfail == 0) {
        rc = 0;
        goto out;
    }
    size_t notfound = 0;
    for (size_t i = 0; i < nfail; i++) {
        notfound += fails[i].code == GRPC_STATUS_NOT_FOUND;
        if (fails[i].code == GRPC_STATUS_FAILED_PRECONDITION &&
            strstr(fails[i].msg, "another secret"))
            *stale = true;
    }
    if (*stale) {
        router_filter_forget(r, filter);
        router_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, "%s", fails[0].msg);
        goto out;
    }
    if (notfound) /* dropped or re-created elsewhere: fetch it again next time */
        router_filter_forget(r, filter);
    if (notfound == nfail && nfail == ncalls) {
        router_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist", filter);
        goto out;
    }
    batch_failure(st, op, filter, fails, nfail, failed_shard, sc->shard, n);
    log_warn("%s", st->msg);
out:
    if (calls)
        multi_free(calls, ncalls);
    free(fails);
    free(failed_shard);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

int router_keys(struct router *r, const char *filter, enum router_key_op op,
                const uint8_t *const *keys, const uint32_t *lens, size_t n,
                bool *out, struct router_status *st)
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

/* ---- catalog ---- */

void router_filter_desc_free(struct router_filter_desc *d)
{
    free(d->shard);
    d->shard = NULL;
}

static void shard_desc_from(struct router_shard_desc *d,
                            const Bloomgrid__V1__InternalShardInfo *isi,
                            const char *node)
{
    const Bloomgrid__V1__FilterInfo *fi = isi->info;
    d->ok = true;
    d->index = isi->shard_index;
    snprintf(d->node, sizeof d->node, "%s", node);
    if (!fi) {
        d->state = BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED;
        snprintf(d->reason, sizeof d->reason, "node %s sent no shard info", node);
        return;
    }
    d->state = fi->state;
    snprintf(d->reason, sizeof d->reason, "%s", fi->reason ? fi->reason : "");
    d->kind = fi->kind;
    d->capacity = fi->capacity;
    d->error_rate = fi->error_rate;
    d->bits = fi->bits;
    d->bytes = fi->bytes;
    d->hashes = fi->hashes;
    d->layers = fi->layers;
    d->fill_ratio = fi->fill_ratio;
    d->estimated_count = fi->estimated_count;
    d->estimated_error_rate = fi->estimated_error_rate;
    d->over_capacity = fi->over_capacity;
    d->version = fi->version;
    d->insert_count = fi->insert_count;
    snprintf(d->fingerprint, sizeof d->fingerprint, "%s",
             fi->fingerprint ? fi->fingerprint : "");
}

static void shard_desc_failed(struct router_shard_desc *d, uint32_t index,
                              const char *node, const struct rpc_status *rs)
{
    memset(d, 0, sizeof *d);
    d->index = index;
    snprintf(d->node, sizeof d->node, "%s", node);
    d->state = BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED;
    snprintf(d->reason, sizeof d->reason, "node %.64s: %s: %.160s", node,
             rpc_status_name(rs->code), rs->message);
}

/* Send one ShardRef-like request per shard in list[0..n) and collect. */
static struct rpc_multi *shard_calls(struct router *r, const struct topo *t,
                                     const struct router_filter *f,
                                     const uint32_t *list, size_t n,
                                     const char *method, bool get)
{
    struct rpc_multi *calls = calloc(n ? n : 1, sizeof *calls);
    if (!calls)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = list[i];
        if (get) {
            Bloomgrid__V1__GetShardRequest m = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
            m.filter = (char *)f->name;
            m.shard_index = s;
            calls[i].req = pack_slice(&m.base);
        } else {
            Bloomgrid__V1__ShardRef m = BLOOMGRID__V1__SHARD_REF__INIT;
            m.filter = (char *)f->name;
            m.shard_index = s;
            calls[i].req = pack_slice(&m.base);
        }
        calls[i].resp = grpc_empty_slice();
        calls[i].ch = router_channel(r, group_primary(t, f, s));
        calls[i].method = method;
        calls[i].timeout_ms = (int)r->cfg.node_timeout_ms;
    }
    for (size_t i = 0; i < n; i++)
        if (!calls[i].ch) {
            multi_free(calls, n);
            return NULL;
        }
    rpc_call_many(calls, n);
    return calls;
}

int router_create_filter(struct router *r, const struct router_create *c,
                         struct router_filter_desc *out, struct router_status *st)
{
    struct topo *t = router_topo(r);
    uint8_t secret[BF_SECRET_LEN];
    struct rpc_multi *calls = NULL;
    struct router_filter *f = NULL;
    uint32_t S = c->shards;
    int rc = -1;

    memset(out, 0, sizeof *out);
    if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret) {
        router_status_set(st, GRPC_STATUS_INTERNAL, "cannot read random bytes");
        goto out;
    }
    /* A placement entry, not cached until every shard exists. */
    f = router_filter_add(r, c->name, secret, S, t, NULL);
    if (!f) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    router_filter_forget(r, c->name);
    calls = calloc(S, sizeof *calls);
    out->shard = calloc(S, sizeof *out->shard);
    if (!calls || !out->shard) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    snprintf(out->name, sizeof out->name, "%s", c->name);
    out->shards = S;
    uint64_t per_shard = (c->capacity + S - 1) / S;
    for (uint32_t s = 0; s < S; s++) {
        Bloomgrid__V1__CreateShardRequest m = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
        m.filter = (char *)c->name;
        m.shard_index = s;
        m.shard_count = S;
        m.kind = c->kind;
        m.capacity = per_shard;
        m.error_rate = c->error_rate;
        m.secret.data = secret;
        m.secret.len = sizeof secret;
        calls[s].req = pack_slice(&m.base);
        calls[s].resp = grpc_empty_slice();
        calls[s].ch = router_channel(r, group_primary(t, f, s));
        calls[s].method = M_CREATE;
        calls[s].timeout_ms = (int)r->cfg.node_timeout_ms;
        if (!calls[s].ch) {
            router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            S = s + 1;
            goto out;
        }
    }
    size_t failed = rpc_call_many(calls, S);
    if (failed == 0) {
        for (uint32_t s = 0; s < S; s++) {
            Bloomgrid__V1__InternalShardInfo *isi =
                bloomgrid__v1__internal_shard_info__unpack(
                    NULL, GRPC_SLICE_LENGTH(calls[s].resp),
                    GRPC_SLICE_START_PTR(calls[s].resp));
            if (isi) {
                shard_desc_from(&out->shard[s], isi, group_primary(t, f, s));
                bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
            }
            out->shard[s].index = s;
        }
        router_filter_unref(router_filter_add(r, c->name, secret, S, t, NULL));
        log_info("created filter %s: %u shards over %u groups", c->name, S,
                 t->ngroups);
        rc = 0;
        goto out;
    }
    /* Roll back: drop what this call created (never a shard that already
     * existed), and shards whose answer was lost to a deadline. */
    uint32_t *undo = calloc(S, sizeof *undo), nundo = 0;
    struct rpc_multi *first = NULL;
    for (uint32_t s = 0; s < S; s++) {
        if (calls[s].rc == 0 || calls[s].st.code == GRPC_STATUS_DEADLINE_EXCEEDED) {
            if (undo)
                undo[nundo++] = s;
        } else if (!first || (router_node_down(first->st.code) && !router_node_down(calls[s].st.code))) {
            first = &calls[s];
        }
    }
    uint32_t fs = (uint32_t)(first - calls);
    struct rpc_multi *drops = undo ? shard_calls(r, t, f, undo, nundo, M_DROP, false)
                                   : NULL;
    size_t left = 0;
    for (uint32_t i = 0; drops && i < nundo; i++)
        if (drops[i].rc != 0 && drops[i].st.code != GRPC_STATUS_NOT_FOUND) {
            log_error("create %s: rollback cannot drop shard %u on %s: %s", c->name,
                      undo[i], group_primary(t, f, undo[i]), drops[i].st.message);
            left++;
        }
    if (!drops && nundo)
        left = nundo;
    grpc_status_code code = first->st.code;
    if (router_node_down(code))
        code = GRPC_STATUS_UNAVAILABLE;
    router_status_set(st, code, "CreateFilter \"%s\": shard %u on node %s (group %s): %s: "
               "%s; %zu of %u shards failed; %s", c->name, fs,
               group_primary(t, f, fs), t->groups[f->group[fs]].name,
               rpc_status_name(first->st.code), first->st.message, failed, S,
               left ? "some created shards could not be dropped (see the router "
                      "log); drop the filter to clean up"
                    : "the shards created by this call were dropped");
    log_warn("%s", st->msg);
    if (drops)
        multi_free(drops, nundo);
    free(undo);
out:
    if (rc < 0)
        router_filter_desc_free(out);
    if (calls)
        multi_free(calls, S);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

int router_drop_filter(struct router *r, const char *name, struct router_status *st)
{
    struct topo *t = router_topo(r);
    struct router_filter *f = router_filter_lookup(r, t, name, st);
    uint32_t *list = NULL;
    int rc = -1;

    if (!f)
        goto out;
    list = calloc(f->shards, sizeof *list);
    if (!list) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* Shard 0 last: while it exists, the filter can be found and dropped. */
    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0;
        if (pass == 0)
            for (uint32_t s = 1; s < f->shards; s++)
                list[n++] = s;
        else
            list[n++] = 0;
        if (!n)
            continue;
        struct rpc_multi *calls = shard_calls(r, t, f, list, n, M_DROP, false);
        if (!calls) {
            router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (calls[i].rc != 0 && calls[i].st.code != GRPC_STATUS_NOT_FOUND && !bad++)
                first = i;
        if (bad) {
            router_status_set(st, GRPC_STATUS_UNAVAILABLE,
                       "DropFilter \"%s\": shard %u on node %s: %s: %s; %zu shards "
                       "not dropped; retry DropFilter to finish", name, list[first],
                       group_primary(t, f, list[first]),
                       rpc_status_name(calls[first].st.code),
                       calls[first].st.message, bad);
            multi_free(calls, n);
            goto out;
        }
        multi_free(calls, n);
    }
    log_info("dropped filter %s (%u shards)", name, f->shards);
    rc = 0;
out:
    router_filter_forget(r, name);
    free(list);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

int router_describe_filter(struct router *r, const char *name,
                           struct router_filter_desc *out, struct router_status *st)
{
    struct topo *t = router_topo(r);
    struct router_filter *f = router_filter_lookup(r, t, name, st);
    uint32_t *list = NULL;
    struct rpc_multi *calls = NULL;
    int rc = -1;

    memset(out, 0, sizeof *out);
    if (!f)
        goto out;
    list = calloc(f->shards, sizeof *list);
    out->shard = calloc(f->shards, sizeof *out->shard);
    if (!list || !out->shard) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (uint32_t s = 0; s < f->shards; s++)
        list[s] = s;
    calls = shard_calls(r, t, f, list, f->shards, M_GET, true);
    if (!calls) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    out->shards = f->shards;
    size_t notfound = 0;
    for (uint32_t s = 0; s < f->shards; s++) {
        const char *node = group_primary(t, f, s);
        Bloomgrid__V1__InternalShardInfo *isi = NULL;
        if (calls[s].rc == 0)
            isi = bloomgrid__v1__internal_shard_info__unpack(
                NULL, GRPC_SLICE_LENGTH(calls[s].resp),
                GRPC_SLICE_START_PTR(calls[s].resp));
        if (isi) {
            shard_desc_from(&out->shard[s], isi, node);
            bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
        } else {
            if (calls[s].rc == 0) {
                calls[s].st.code = GRPC_STATUS_INTERNAL;
                snprintf(calls[s].st.message, sizeof calls[s].st.message,
                         "shard info does not parse");
            }
            notfound += calls[s].st.code == GRPC_STATUS_NOT_FOUND;
            shard_desc_failed(&out->shard[s], s, node, &calls[s].st);
        }
    }
    if (notfound == f->shards) {
        router_filter_forget(r, name);
        router_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist", name);
        goto out;
    }
    rc = 0;
out:
    if (rc < 0)
        router_filter_desc_free(out);
    if (calls)
        multi_free(calls, f->shards);
    free(list);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

static int desc_cmp(const void *a, const void *b)
{
    return strcmp(((const struct router_filter_desc *)a)->name,
                  ((const struct router_filter_desc *)b)->name);
}

int router_list_filters(struct router *r, struct router_filter_desc **out,
                        size_t *nout, struct router_status *st)
{
    struct topo *t = router_topo(r);
    unsigned G = t->ngroups;
    struct rpc_multi *calls = calloc(G, sizeof *calls);
    struct router_filter_desc *d = NULL;
    size_t nd = 0, cap = 0;
    int rc = -1;

    *out = NULL;
    *nout = 0;
    if (!calls) {
        router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    Bloomgrid__V1__ListShardsRequest lreq = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    for (unsigned g = 0; g < G; g++) {
        calls[g].req = pack_slice(&lreq.base);
        calls[g].resp = grpc_empty_slice();
        calls[g].ch = router_channel(r, t->groups[g].primary);
        calls[g].method = M_LIST;
        calls[g].timeout_ms = (int)r->cfg.node_timeout_ms;
        if (!calls[g].ch) {
            router_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
    }
    rpc_call_many(calls, G);
    for (unsigned g = 0; g < G; g++) {
        if (calls[g].rc != 0) {
            log_warn("ListFilters: node %s (group %s): %s", t->groups[g].primary,
                     t->groups[g].name, calls[g].st.message);
            continue;
        }
        Bloomgrid__V1__ListShardsResponse *lr = bloomgrid__v1__list_shards_response__unpack(
            NULL, GRPC_SLICE_LENGTH(calls[g].resp), GRPC_SLICE_START_PTR(calls[g].resp));
        for (size_t k = 0; lr && k < lr->n_shards; k++) {
            const Bloomgrid__V1__InternalShardInfo *isi = lr->shards[k];
            if (!isi->filter || !isi->shard_count || isi->shard_count > ROUTER_MAX_SHARDS ||
                isi->shard_index >= isi->shard_count ||
                strlen(isi->filter) > ROUTER_NAME_MAX)
                continue;
            /* Only the group a shard is placed on counts (not strays). */
            if (topo_group_for(t, isi->filter, isi->shard_index) != g)
                continue;
            size_t j;
            for (j = 0; j < nd; j++)
                if (strcmp(d[j].name, isi->filter) == 0)
                    break;
            if (j == nd) {
                if (nd == cap) {
                    size_t nc = cap ? 2 * cap : 16;
                    struct router_filter_desc *p = realloc(d, nc * sizeof *p);
                    if (!p)
                        continue;
                    d = p;
                    cap = nc;
                }
                memset(&d[nd], 0, sizeof d[nd]);
                snprintf(d[nd].name, sizeof d[nd].name, "%s", isi->filter);
                d[nd].shards = isi->shard_count;
                d[nd].shard = calloc(isi->shard_count, sizeof *d[nd].shard);
                if (!d[nd].shard)
                    continue;
                nd++;
            }
            if (isi->shard_count != d[j].shards)
                continue;
            shard_desc_from(&d[j].shard[isi->shard_index], isi, t->groups[g].primary);
        }
        if (lr)
            bloomgrid__v1__list_shards_response__free_unpacked(lr, NULL);
    }
    /* Shards nobody reported. */
    for (size_t j = 0; j < nd; j++) {
        for (uint32_t s = 0; s < d[j].shards; s++) {
            struct router_shard_desc *sd = &d[j].shard[s];
            if (sd->ok)
                continue;
            unsigned g = topo_group_for(t, d[j].name, s);
            struct rpc_status rs = {.code = GRPC_STATUS_NOT_FOUND};
            if (calls[g].rc != 0)
                rs = calls[g].st;
            else
                snprintf(rs.message, sizeof rs.message, "shard %u is missing", s);
            shard_desc_failed(sd, s, t->groups[g].primary, &rs);
        }
    }
    qsort(d, nd, sizeof *d, desc_cmp);
    *out = d;
    *nout = nd;
    d = NULL;
    rc = 0;
out:
    if (calls)
        multi_free(calls, G);
    for (size_t j = 0; d && j < nd; j++)
        router_filter_desc_free(&d[j]);
    free(d);
    topo_unref(t);
    return rc;
}
