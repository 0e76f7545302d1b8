/* node_rpc: the gRPC handlers of bloomgrid-node, the only place that converts
 * wire messages to and from the project's structs.
 *
 * The hot calls (Add, MayContain, Remove and their streams) skip protobuf-c:
 * a hand-written decoder walks the request once, bounds-checking every
 * length, and records (pointer, length) of each key inside the request
 * buffer, so a batch of a million keys costs no per-key allocation.  Their
 * replies (one packed repeated bool) are encoded by hand as well.  Everything
 * else uses the generated protobuf-c code.
 *
 * Every call validates the whole request before it changes anything.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf.h"
#include "bf_file.h"
#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "node.h"
#include "rpc_server.h"
#include "store.h"

#define SHARD_SUFFIX ".shard-"
#define MAX_SHARDS 4096
#define EXPORT_CHUNK_DEFAULT (1u << 20)
#define EXPORT_CHUNK_MAX (4u << 20)

enum key_op { OP_ADD, OP_MAY_CONTAIN, OP_REMOVE };

static const char *const op_names[] = {"Add", "MayContain", "Remove"};

/* Per-thread (or per-stream) buffers reused across calls. */
struct scratch {
    const uint8_t **key_ptr;
    uint32_t *key_len;
    struct bf_hash *hashes;
    bool *out;
    size_t cap;
};

static void scratch_free(struct scratch *sc);

/* Worker threads keep their scratch between calls; it is freed when the
 * thread exits (server shutdown). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_destroy(void *p)
{
    scratch_free(p);
    free(p);
}

static void scratch_key_init(void)
{
    pthread_key_create(&scratch_key, scratch_destroy);
}

static struct scratch *thread_scratch(void)
{
    pthread_once(&scratch_once, scratch_key_init);
    struct scratch *sc = pthread_getspecific(scratch_key);
    if (!sc) {
        sc = calloc(1, sizeof *sc);
        if (sc)
            pthread_setspecific(scratch_key, sc);
    }
    return sc;
}

static int scratch_reserve(struct scratch *sc, size_t n)
{
    if (n <= sc->cap)
        return 0;
    size_t cap = sc->cap ? sc->cap : 1024;
    while (cap < n)
        cap *= 2;
    const uint8_t **kp = realloc(sc->key_ptr, cap * sizeof *kp);
    if (kp)
        sc->key_ptr = kp;
    uint32_t *kl = realloc(sc->key_len, cap * sizeof *kl);
    if (kl)
        sc->key_len = kl;
    struct bf_hash *h = realloc(sc->hashes, cap * sizeof *h);
    if (h)
        sc->hashes = h;
    bool *o = realloc(sc->out, cap * sizeof *o);
    if (o)
        sc->out = o;
    if (!kp || !kl || !h || !o)
        return -ENOMEM;
    sc->cap = cap;
    return 0;
}

static void scratch_free(struct scratch *sc)
{
    free(sc->key_ptr);
    free(sc->key_len);
    free(sc->hashes);
    free(sc->out);
    memset(sc, 0, sizeof *sc);
}

/* ---- helpers ---- */

int node_shard_store_name(char *out, size_t outlen, const char *filter,
                          unsigned index, unsigned count)
{
    int n;
    if (count <= 1)
        n = snprintf(out, outlen, "%s", filter);
    else
        n = snprintf(out, outlen, "%s" SHARD_SUFFIX "%u", filter, index);
    if (n < 0 || (size_t)n >= outlen || n > STORE_NAME_MAX)
        return -EINVAL;
    return 0;
}

/* A public filter name: the store's rules, minus the shard suffix. */
static bool public_name_ok(const char *name, struct rpc_reply *r)
{
    char err[STORE_ERRLEN];
    if (store_name_check(name, err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "filter name: %s", err);
        return false;
    }
    if (strstr(name, SHARD_SUFFIX)) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "filter name \"%s\": \"" SHARD_SUFFIX "\" is reserved "
                        "for shards", name);
        return false;
    }
    return true;
}

static struct store *need_store(struct node *n, struct rpc_reply *r)
{
    struct store *s = node_store(n);
    if (!s)
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "node is recovering its data directory %s; retry shortly",
                        n->cfg.data_dir);
    return s;
}

/* Translate a store error about filter name into a status. */
static void store_error(struct rpc_reply *r, struct store_filter *sf,
                        const char *name, int rc, const char *err)
{
    char why[STORE_ERRLEN] = "";
    switch (rc) {
    case -ENOENT:
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                        name);
        break;
    case -EAGAIN:
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "filter \"%s\" is recovering; retry shortly", name);
        break;
    case -EIO:
        if (sf)
            store_filter_state(sf, why);
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "filter \"%s\" is not serving (%s); no write to it is "
                        "acknowledged until it recovers", name,
                        why[0] ? why : (err && err[0] ? err : "I/O error"));
        break;
    case -EEXIST:
        rpc_reply_error(r, GRPC_STATUS_ALREADY_EXISTS,
                        "filter \"%s\" already exists", name);
        break;
    case -EINVAL:
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "filter \"%s\": %s", name,
                        err && err[0] ? err : "invalid argument");
        break;
    case -EOPNOTSUPP:
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "filter \"%s\" is not a COUNTING filter: Remove needs one",
                        name);
        break;
    case -ENOMEM:
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "filter \"%s\": %s", name,
                        err && err[0] ? err : "out of memory");
        break;
    case -ENOSPC:
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "filter \"%s\": disk full (%s); nothing was acknowledged",
                        name, err && err[0] ? err : "ENOSPC");
        break;
    default:
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "filter \"%s\": %s (%s)",
                        name, err && err[0] ? err : "store error", strerror(-rc));
        break;
    }
}

/* A handle on a READY filter, or NULL with the reply set. */
static struct store_filter *get_filter(struct store *s, const char *name,
                                       struct rpc_reply *r)
{
    struct store_filter *sf = store_get(s, name);
    if (!sf) {
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                        name);
        return NULL;
    }
    return sf;
}

static int state_errno(enum store_state st)
{
    switch (st) {
    case STORE_READY: return 0;
    case STORE_RECOVERING: return -EAGAIN;
    case STORE_FAILED: return -EIO;
    default: return -ENOENT;
    }
}

/* ---- FilterInfo ---- */

struct info_buf {
    Bloomgrid__V1__FilterInfo fi;
    Bloomgrid__V1__ShardInfo si;
    Bloomgrid__V1__ShardInfo *sip;
    char name[STORE_NAME_MAX + 1];
    char reason[STORE_ERRLEN];
    char fp[17];
};

static Bloomgrid__V1__FilterState state_to_wire(enum store_state st)
{
    switch (st) {
    case STORE_READY: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY;
    case STORE_RECOVERING: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_RECOVERING;
    default: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED;
    }
}

static void info_fill(struct node *n, struct info_buf *ib, struct store_filter *sf,
                      const char *public_name)
{
    bloomgrid__v1__filter_info__init(&ib->fi);
    bloomgrid__v1__shard_info__init(&ib->si);
    snprintf(ib->name, sizeof ib->name, "%s", public_name);
    ib->reason[0] = 0;
    ib->fp[0] = 0;
    ib->fi.name = ib->name;
    ib->fi.reason = ib->reason;
    ib->fi.fingerprint = ib->fp;
    ib->si.node = n->cfg.listen;
    ib->si.reason = ib->reason;
    ib->sip = &ib->si;
    ib->fi.n_shard_info = 1;
    ib->fi.shard_info = &ib->sip;

    enum store_state st = store_filter_state(sf, ib->reason);
    if (st == STORE_RECOVERING && !ib->reason[0])
        snprintf(ib->reason, sizeof ib->reason, "recovering");
    ib->fi.state = state_to_wire(st);
    ib->si.state = ib->fi.state;
    ib->fi.version = store_filter_version(sf);
    ib->si.version = ib->fi.version;
    ib->fi.shards = 1;
    const struct bf *f = st == STORE_READY ? store_filter_bf(sf) : NULL;
    if (!f)
        return;
    struct bf_stats stats;
    struct bf_layer_info li;
    bf_stats(f, &stats);
    ib->fi.kind = (Bloomgrid__V1__FilterKind)bf_kind(f);
    ib->fi.capacity = bf_capacity(f);
    ib->fi.error_rate = bf_error_rate(f);
    ib->fi.shards = bf_shard_count(f);
    ib->fi.bits = stats.bits;
    if (bf_layer_info(f, 0, &li) == 0)
        ib->fi.hashes = li.k;
    ib->fi.bytes = stats.bytes;
    ib->fi.fill_ratio = stats.fill_ratio;
    ib->fi.estimated_count = stats.estimated_count;
    ib->fi.estimated_error_rate = stats.estimated_fpr;
    ib->fi.over_capacity = stats.over_capacity;
    ib->fi.layers = stats.layers;
    ib->fi.insert_count = bf_insert_count(f);
    bf_fingerprint_id(f, ib->fp);
    ib->si.index = bf_shard_index(f);
    ib->si.bits = stats.bits;
    ib->si.bytes = stats.bytes;
    ib->si.fill_ratio = stats.fill_ratio;
    ib->si.estimated_count = stats.estimated_count;
}

/* ---- hand-written wire codec for the key batches ---- */

/* Read a varint at *p (< end).  Returns false when truncated or longer than
 * 10 bytes. */
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

/* Decoded key batch (AddRequest, MayContainRequest, RemoveRequest share the
 * layout: 1 = filter name, 2 = repeated bytes keys). */
struct key_batch {
    char filter[STORE_NAME_MAX + 2];
    bool has_filter;
    size_t n;
};

/* Decode a key batch into sc.  Returns a status code; on error the reply
 * message says what is wrong. */
static grpc_status_code decode_key_batch(struct node *n, const uint8_t *buf,
                                         size_t len, struct scratch *sc,
                                         struct key_batch *kb, struct rpc_reply *r)
{
    const uint8_t *p = buf, *end = buf + len;
    uint64_t max_keys = n->cfg.max_batch_keys, max_key = n->cfg.max_key_size;

    kb->n = 0;
    kb->has_filter = false;
    kb->filter[0] = 0;
    while (p < end) {
        uint64_t tag, v;
        if (!get_varint(&p, end, &tag))
            goto malformed;
        unsigned field = (unsigned)(tag >> 3), wt = (unsigned)(tag & 7);
        if (field == 0)
            goto malformed;
        switch (wt) {
        case 0:
            if (!get_varint(&p, end, &v))
                goto malformed;
            if (field == 1 || field == 2)
                goto malformed;
            break;
        case 1:
            if ((size_t)(end - p) < 8 || field == 1 || field == 2)
                goto malformed;
            p += 8;
            break;
        case 5:
            if ((size_t)(end - p) < 4 || field == 1 || field == 2)
                goto malformed;
            p += 4;
            break;
        case 2:
            if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p))
                goto malformed;
            if (field == 1) {
                if (v > STORE_NAME_MAX) {
                    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                                    "filter name is %llu bytes; the limit is %d",
                                    (unsigned long long)v, STORE_NAME_MAX);
                    return r->code;
                }
                memcpy(kb->filter, p, v);
                kb->filter[v] = 0;
                kb->has_filter = v > 0;
            } else if (field == 2) {
                if (kb->n >= max_keys) {
                    rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                    "more than %llu keys in one batch "
                                    "(max_batch_keys); split the batch",
                                    (unsigned long long)max_keys);
                    return r->code;
                }
                if (v == 0) {
                    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                                    "key %zu is empty; keys must be 1..%llu bytes",
                                    kb->n, (unsigned long long)max_key);
                    return r->code;
                }
                if (v > max_key) {
                    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                                    "key %zu is %llu bytes; the limit is %llu "
                                    "(max_key_size)", kb->n,
                                    (unsigned long long)v,
                                    (unsigned long long)max_key);
                    return r->code;
                }
                if (kb->n >= sc->cap && scratch_reserve(sc, kb->n + 1) < 0) {
                    rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                    "out of memory decoding the batch");
                    return r->code;
                }
                sc->key_ptr[kb->n] = p;
                sc->key_len[kb->n] = (uint32_t)v;
                kb->n++;
            }
            p += v;
            break;
        default:
            goto malformed;
        }
    }
    return GRPC_STATUS_OK;
malformed:
    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                    "malformed request message (byte %zu of %zu)",
                    (size_t)(p - buf), len);
    return r->code;
}

/* Encode "repeated bool field 1 [packed]" (+ optional uint64 field 2). */
static void encode_bools(struct rpc_reply *r, const bool *v, size_t n,
                         bool with_version, uint64_t version)
{
    size_t len = 0;
    if (n)
        len += 1 + varint_len(n) + n;
    if (with_version && version)
        len += 1 + varint_len(version);
    uint8_t *p = rpc_reply_alloc(r, len);
    if (n) {
        *p++ = 0x0a;
        p = put_varint(p, n);
        for (size_t i = 0; i < n; i++)
            *p++ = v[i] ? 1 : 0;
    }
    if (with_version && version) {
        *p++ = 0x10;
        p = put_varint(p, version);
    }
}

/* A cached filter handle (streams keep it across messages). */
struct filter_ref {
    char name[STORE_NAME_MAX + 2];
    struct store_filter *sf;
};

static void filter_ref_drop(struct filter_ref *fr)
{
    if (fr->sf)
        store_put(fr->sf);
    fr->sf = NULL;
    fr->name[0] = 0;
}

/* Run one key batch: decode, hash, apply, encode. */
static void run_key_batch(struct node *n, enum key_op op, const uint8_t *buf,
                          size_t len, struct scratch *sc, struct filter_ref *fr,
                          struct rpc_reply *r)
{
    struct key_batch kb;
    char err[STORE_ERRLEN] = "";
    struct store *s = need_store(n, r);
    if (!s)
        return;
    if (decode_key_batch(n, buf, len, sc, &kb, r) != GRPC_STATUS_OK)
        return;
    if (kb.has_filter && (!fr->sf || strcmp(kb.filter, fr->name) != 0)) {
        filter_ref_drop(fr);
        fr->sf = store_get(s, kb.filter);
        if (!fr->sf) {
            if (!public_name_ok(kb.filter, r))
                return;
            rpc_reply_error(r, GRPC_STATUS_NOT_FOUND,
                            "filter \"%s\" does not exist", kb.filter);
            return;
        }
        memcpy(fr->name, kb.filter, sizeof fr->name);
    } else if (!kb.has_filter && !fr->sf) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: the request names no filter", op_names[op]);
        return;
    }
    if (scratch_reserve(sc, kb.n ? kb.n : 1) < 0) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    const struct bf *f = store_filter_bf(fr->sf);
    if (!f) {
        store_error(r, fr->sf, fr->name,
                    state_errno(store_filter_state(fr->sf, NULL)), NULL);
        if (r->code == GRPC_STATUS_OK)
            rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "filter \"%s\" is not ready",
                            fr->name);
        return;
    }
    for (size_t i = 0; i < kb.n; i++)
        sc->hashes[i] = bf_hash_key(f, sc->key_ptr[i], sc->key_len[i]);
    int rc = 0;
    if (kb.n) {
        switch (op) {
        case OP_ADD:
            rc = store_add_hashes(fr->sf, sc->hashes, kb.n, sc->out, err);
            break;
        case OP_MAY_CONTAIN:
            rc = store_may_contain_hashes(fr->sf, sc->hashes, kb.n, sc->out);
            break;
        case OP_REMOVE:
            rc = store_remove_hashes(fr->sf, sc->hashes, kb.n, sc->out, err);
            break;
        }
    } else if (op == OP_REMOVE && bf_kind(f) != BF_KIND_COUNTING) {
        rc = -EOPNOTSUPP;
    }
    if (rc < 0) {
        store_error(r, fr->sf, fr->name, rc, err);
        return;
    }
    encode_bools(r, sc->out, kb.n, false, 0);
}

static void key_unary(struct node *n, enum key_op op, const uint8_t *req,
                      size_t len, struct rpc_reply *r)
{
    struct filter_ref fr = {0};
    struct scratch *sc = thread_scratch();
    if (!sc) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    run_key_batch(n, op, req, len, sc, &fr, r);
    filter_ref_drop(&fr);
}

static void h_add(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    key_unary(arg, OP_ADD, req, len, r);
}

static void h_may_contain(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *r)
{
    key_unary(arg, OP_MAY_CONTAIN, req, len, r);
}

static void h_remove(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    key_unary(arg, OP_REMOVE, req, len, r);
}

static void key_stream(struct node *n, enum key_op op, struct rpc_stream *st)
{
    struct scratch sc = {0};
    struct filter_ref fr = {0};
    const uint8_t *buf;
    size_t len;

    for (;;) {
        int rc = rpc_stream_read(st, &buf, &len);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
        struct rpc_reply r = {.code = GRPC_STATUS_OK};
        run_key_batch(n, op, buf, len, &sc, &fr, &r);
        if (r.code != GRPC_STATUS_OK) {
            rpc_stream_finish(st, r.code, "%s", r.message);
            goto out;
        }
        grpc_slice body = r.has_body ? r.body : grpc_empty_slice();
        if (rpc_stream_send(st, body) < 0) /* overlaps the next read */
            goto out;
    }
    rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
out:
    filter_ref_drop(&fr);
    scratch_free(&sc);
}

static void h_add_stream(void *arg, struct rpc_stream *st)
{
    key_stream(arg, OP_ADD, st);
}

static void h_may_contain_stream(void *arg, struct rpc_stream *st)
{
    key_stream(arg, OP_MAY_CONTAIN, st);
}

/* ---- catalog ---- */

static bool kind_from_wire(int k, enum bf_kind *out, struct rpc_reply *r)
{
    switch (k) {
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_UNSPECIFIED:
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_BLOCKED:
        *out = BF_KIND_BLOCKED;
        return true;
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_CLASSIC:
        *out = BF_KIND_CLASSIC;
        return true;
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING:
        *out = BF_KIND_COUNTING;
        return true;
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_SCALABLE:
        *out = BF_KIND_SCALABLE;
        return true;
    }
    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                    "unknown filter kind %d (BLOCKED=1, CLASSIC=2, COUNTING=3, "
                    "SCALABLE=4)", k);
    return false;
}

static bool params_ok(uint64_t capacity, double error_rate, struct rpc_reply *r)
{
    if (capacity == 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "capacity must be > 0 (the number of keys the filter "
                        "is sized for)");
        return false;
    }
    if (!(error_rate > 0.0 && error_rate < 1.0)) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "error_rate must be strictly between 0 and 1 (e.g. "
                        "0.01), not %g", error_rate);
        return false;
    }
    return true;
}

static void reply_info(struct node *n, struct store_filter *sf, const char *name,
                       struct rpc_reply *r)
{
    struct info_buf ib;
    info_fill(n, &ib, sf, name);
    rpc_reply_pack(r, &ib.fi.base);
}

#define UNPACK_OR_FAIL(type, fn, var, req, len, r)                            \
    type *var = fn##__unpack(NULL, len, req);                                  \
    if (!var) {                                                                \
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,                       \
                        "malformed " #type " message");                       \
        return;                                                                \
    }

static void h_create_filter(void *arg, const uint8_t *req, size_t len,
                            struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__CreateFilterRequest,
                   bloomgrid__v1__create_filter_request, m, req, len, r);
    struct bf_params p = {0};
    char err[STORE_ERRLEN] = "";
    if (!public_name_ok(m->name, r) || !params_ok(m->capacity, m->error_rate, r) ||
        !kind_from_wire(m->kind, &p.kind, r))
        goto out;
    if (m->shards > 1) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "shards = %u: a node serves single-shard filters; create "
                        "sharded filters through bloomgrid-router", m->shards);
        goto out;
    }
    p.capacity = m->capacity;
    p.error_rate = m->error_rate;
    bf_params_default(&p);
    int rc = store_create(s, m->name, &p, err);
    if (rc < 0) {
        store_error(r, NULL, m->name, rc, err);
        goto out;
    }
    log_info("created filter %s (%s, capacity %llu, error_rate %g)", m->name,
             bf_kind_name(p.kind), (unsigned long long)p.capacity, p.error_rate);
    struct store_filter *sf = store_get(s, m->name);
    if (!sf) {
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND,
                        "filter \"%s\" was dropped right after creation", m->name);
        goto out;
    }
    reply_info(n, sf, m->name, r);
    store_put(sf);
out:
    bloomgrid__v1__create_filter_request__free_unpacked(m, NULL);
}

static void h_drop_filter(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__DropFilterRequest,
                   bloomgrid__v1__drop_filter_request, m, req, len, r);
    char err[STORE_ERRLEN] = "";
    if (public_name_ok(m->name, r)) {
        int rc = store_drop(s, m->name, err);
        if (rc < 0) {
            store_error(r, NULL, m->name, rc, err);
        } else {
            log_info("dropped filter %s", m->name);
            Bloomgrid__V1__DropFilterResponse resp =
                BLOOMGRID__V1__DROP_FILTER_RESPONSE__INIT;
            rpc_reply_pack(r, &resp.base);
        }
    }
    bloomgrid__v1__drop_filter_request__free_unpacked(m, NULL);
}

static void h_get_filter(void *arg, const uint8_t *req, size_t len,
                         struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__GetFilterRequest,
                   bloomgrid__v1__get_filter_request, m, req, len, r);
    if (public_name_ok(m->name, r)) {
        struct store_filter *sf = get_filter(s, m->name, r);
        if (sf) {
            reply_info(n, sf, m->name, r);
            store_put(sf);
        }
    }
    bloomgrid__v1__get_filter_request__free_unpacked(m, NULL);
}

static void h_list_filters(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__ListFiltersRequest,
                   bloomgrid__v1__list_filters_request, m, req, len, r);
    bloomgrid__v1__list_filters_request__free_unpacked(m, NULL);
    char **names = NULL;
    size_t nn = 0;
    if (store_list(s, &names, &nn) < 0) {
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "cannot list the filters");
        return;
    }
    struct info_buf *ibs = calloc(nn ? nn : 1, sizeof *ibs);
    Bloomgrid__V1__FilterInfo **fis = calloc(nn ? nn : 1, sizeof *fis);
    size_t k = 0;
    if (!ibs || !fis) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nn; i++) {
        if (strstr(names[i], SHARD_SUFFIX))
            continue; /* shards of router-managed filters: see ListShards */
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        info_fill(n, &ibs[k], sf, names[i]);
        store_put(sf);
        ibs[k].fi.shard_info = &ibs[k].sip; /* fix the self-pointer */
        fis[k] = &ibs[k].fi;
        k++;
    }
    Bloomgrid__V1__ListFiltersResponse resp = BLOOMGRID__V1__LIST_FILTERS_RESPONSE__INIT;
    resp.n_filters = k;
    resp.filters = fis;
    rpc_reply_pack(r, &resp.base);
out:
    free(fis);
    free(ibs);
    store_list_free(names, nn);
}

/* ---- Export / Import ---- */

struct membuf {
    uint8_t *p;
    size_t len, cap;
};

static int membuf_write(void *ctx, const void *buf, size_t len)
{
    struct membuf *mb = ctx;
    if (mb->len + len > mb->cap) {
        size_t cap = mb->cap ? mb->cap : 1 << 16;
        while (cap < mb->len + len)
            cap *= 2;
        uint8_t *p = realloc(mb->p, cap);
        if (!p)
            return -ENOMEM;
        mb->p = p;
        mb->cap = cap;
    }
    memcpy(mb->p + mb->len, buf, len);
    mb->len += len;
    return 0;
}

static void finish_reply(struct rpc_stream *st, const struct rpc_reply *r)
{
    rpc_stream_finish(st, r->code, "%s", r->message);
}

/* Export writer: fills a chunk and sends it whenever it is full. */
struct chunker {
    struct rpc_stream *st;
    uint8_t *buf;
    size_t cap, len;
    uint64_t offset, total;
    bool failed;
};

static int chunk_flush(struct chunker *c)
{
    Bloomgrid__V1__FileChunk fc = BLOOMGRID__V1__FILE_CHUNK__INIT;
    fc.offset = c->offset;
    fc.data.data = c->buf;
    fc.data.len = c->len;
    fc.total_size = c->total;
    if (rpc_stream_write(c->st, &fc.base) < 0) {
        c->failed = true;
        return -ECANCELED;
    }
    c->offset += c->len;
    c->len = 0;
    return 0;
}

static int chunk_write(void *ctx, const void *buf, size_t len)
{
    struct chunker *c = ctx;
    const uint8_t *p = buf;
    while (len) {
        size_t n = c->cap - c->len < len ? c->cap - c->len : len;
        memcpy(c->buf + c->len, p, n);
        c->len += n;
        p += n;
        len -= n;
        if (c->len == c->cap && chunk_flush(c) < 0)
            return -ECANCELED;
    }
    return 0;
}

/* Export: a point-in-time copy of the filter (no lock held while sending),
 * serialized straight into chunks. */
static void h_export(void *arg, struct rpc_stream *st)
{
    struct node *n = arg;
    struct rpc_reply r = {.code = GRPC_STATUS_OK};
    const uint8_t *buf;
    size_t len;
    struct store_filter *sf = NULL;
    struct bf *copy = NULL;
    Bloomgrid__V1__ExportRequest *m = NULL;
    struct chunker c = {.st = st};

    int rc = rpc_stream_read(st, &buf, &len);
    if (rc < 0)
        return;
    if (rc == 0) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT, "Export needs a request");
        goto done;
    }
    m = bloomgrid__v1__export_request__unpack(NULL, len, buf);
    if (!m) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT, "malformed ExportRequest");
        goto done;
    }
    struct store *s = need_store(n, &r);
    if (!s || !public_name_ok(m->filter, &r))
        goto done;
    sf = get_filter(s, m->filter, &r);
    if (!sf)
        goto done;
    c.cap = m->chunk_size ? m->chunk_size : EXPORT_CHUNK_DEFAULT;
    if (c.cap > EXPORT_CHUNK_MAX)
        c.cap = EXPORT_CHUNK_MAX;
    if (c.cap + 64 > rpc_stream_max_message(st))
        c.cap = rpc_stream_max_message(st) - 64;
    copy = store_filter_copy(sf);
    if (!copy) {
        enum store_state state = store_filter_state(sf, NULL);
        store_error(&r, sf, m->filter, state == STORE_READY ? -ENOMEM : state_errno(state),
                    "not enough memory for a copy of the filter");
        goto done;
    }
    c.buf = malloc(c.cap);
    if (!c.buf) {
        rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    c.total = bf_file_size(copy);
    rc = bf_file_write(copy, chunk_write, &c);
    if (rc == 0 && (c.len > 0 || c.offset == 0))
        rc = chunk_flush(&c);
    if (c.failed)
        goto out; /* the client went away */
    if (rc < 0) {
        rpc_reply_error(&r, GRPC_STATUS_INTERNAL, "cannot serialize filter \"%s\": %s",
                        m->filter, strerror(-rc));
        goto done;
    }
    log_info("exported filter %s (%llu bytes)", m->filter,
             (unsigned long long)c.total);
done:
    finish_reply(st, &r);
out:
    bf_destroy(copy);
    free(c.buf);
    if (sf)
        store_put(sf);
    if (m)
        bloomgrid__v1__export_request__free_unpacked(m, NULL);
}

static void h_import(void *arg, struct rpc_stream *st)
{
    struct node *n = arg;
    struct rpc_reply r = {.code = GRPC_STATUS_OK};
    const uint8_t *buf;
    size_t len;
    struct membuf mb = {0};
    struct store_filter *sf = NULL;
    struct bf *src = NULL;
    char name[STORE_NAME_MAX + 1] = "";
    char err[STORE_ERRLEN] = "";
    size_t limit = 0;

    struct store *s = need_store(n, &r);
    if (!s)
        goto done;
    for (;;) {
        int rc = rpc_stream_read(st, &buf, &len);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
        Bloomgrid__V1__ImportRequest *m =
            bloomgrid__v1__import_request__unpack(NULL, len, buf);
        if (!m) {
            rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                            "malformed ImportRequest message");
            goto done;
        }
        if (!sf) {
            if (!m->filter[0]) {
                rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                                "the first ImportRequest must name the filter");
            } else if (public_name_ok(m->filter, &r)) {
                snprintf(name, sizeof name, "%s", m->filter);
                sf = get_filter(s, name, &r);
                const struct bf *f = sf ? store_filter_bf(sf) : NULL;
                if (sf && !f)
                    store_error(&r, sf, name,
                                state_errno(store_filter_state(sf, NULL)), NULL);
                if (f) {
                    /* A compatible file is the filter's size; scalable ones
                     * may have grown more layers. */
                    uint64_t sz = bf_file_size(f);
                    limit = bf_kind(f) == BF_KIND_SCALABLE ? (size_t)sz * 64 + (16u << 20)
                                                            : (size_t)sz + (1u << 20);
                }
            }
        } else if (m->filter[0] && strcmp(m->filter, name) != 0) {
            rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                            "ImportRequest names filter \"%s\" after \"%s\"",
                            m->filter, name);
        }
        if (r.code == GRPC_STATUS_OK) {
            if (mb.len + m->data.len > limit)
                rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                "import is larger (%zu+ bytes) than any file "
                                "compatible with filter \"%s\" (%zu bytes)",
                                mb.len + m->data.len, name, limit);
            else if (membuf_write(&mb, m->data.data, m->data.len) < 0)
                rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        }
        bloomgrid__v1__import_request__free_unpacked(m, NULL);
        if (r.code != GRPC_STATUS_OK)
            goto done;
    }
    if (!sf) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "Import received no message naming a filter");
        goto done;
    }
    src = bf_file_parse(mb.p, mb.len, err);
    if (!src) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "imported file refused: %s", err);
        goto done;
    }
    const struct bf *dst = store_filter_bf(sf);
    struct bf_merge_projection proj = {0};
    if (!dst) {
        store_error(&r, sf, name, state_errno(store_filter_state(sf, NULL)), NULL);
        goto done;
    }
    const char *field = bf_mismatch(dst, src);
    if (field) {
        rpc_reply_error(&r, GRPC_STATUS_FAILED_PRECONDITION,
                        "imported filter is incompatible with \"%s\": field "
                        "\"%s\" differs", name, field);
        goto done;
    }
    bf_merge_project(dst, src, &proj, err);
    int rc = store_import(sf, src, err);
    if (rc == -EINVAL) {
        rpc_reply_error(&r, GRPC_STATUS_FAILED_PRECONDITION,
                        "imported filter is incompatible with \"%s\": %s", name, err);
        goto done;
    }
    if (rc < 0) {
        store_error(&r, sf, name, rc, err);
        goto done;
    }
    log_info("imported %zu bytes into filter %s", mb.len, name);
    struct info_buf ib;
    info_fill(n, &ib, sf, name);
    Bloomgrid__V1__ImportResponse resp = BLOOMGRID__V1__IMPORT_RESPONSE__INIT;
    resp.info = &ib.fi;
    resp.bytes_received = mb.len;
    resp.projected_fill_ratio = proj.fill_ratio;
    resp.projected_error_rate = proj.estimated_fpr;
    resp.over_target = proj.over_target;
    if (rpc_stream_write(st, &resp.base) < 0)
        goto out;
done:
    finish_reply(st, &r);
out:
    bf_destroy(src);
    if (sf)
        store_put(sf);
    free(mb.p);
}

/* ---- internal service ---- */

static void shard_info_fill(struct node *n, Bloomgrid__V1__InternalShardInfo *isi,
                            struct info_buf *ib, struct store_filter *sf,
                            const char *filter, unsigned index, bool secret)
{
    bloomgrid__v1__internal_shard_info__init(isi);
    info_fill(n, ib, sf, filter);
    isi->filter = ib->name;
    isi->shard_index = index;
    isi->info = &ib->fi;
    isi->hash_id = BF_HASH_XXH3_128;
    const struct bf *f = store_filter_bf(sf);
    if (f) {
        isi->shard_count = bf_shard_count(f);
        isi->shard_index = bf_shard_index(f);
        if (secret) {
            isi->secret.data = (uint8_t *)bf_secret(f);
            isi->secret.len = BF_SECRET_LEN;
        }
    }
}

/* Split a store name into filter and shard index. */
static void split_store_name(const char *sname, char *filter, size_t flen,
                             unsigned *index)
{
    const char *suf = strstr(sname, SHARD_SUFFIX);
    *index = 0;
    if (!suf) {
        snprintf(filter, flen, "%s", sname);
        return;
    }
    snprintf(filter, flen, "%.*s", (int)(suf - sname), sname);
    *index = (unsigned)strtoul(suf + strlen(SHARD_SUFFIX), NULL, 10);
}

static void h_create_shard(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__CreateShardRequest,
                   bloomgrid__v1__create_shard_request, m, req, len, r);
    struct bf_params p = {0};
    char sname[STORE_NAME_MAX + 1], err[STORE_ERRLEN] = "";
    if (!public_name_ok(m->filter, r) || !params_ok(m->capacity, m->error_rate, r) ||
        !kind_from_wire(m->kind, &p.kind, r))
        goto out;
    if (m->shard_count < 1 || m->shard_count > MAX_SHARDS ||
        m->shard_index >= m->shard_count) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "shard %u of %u: need 1 <= shard_count <= %d and "
                        "shard_index < shard_count", m->shard_index,
                        m->shard_count, MAX_SHARDS);
        goto out;
    }
    if (m->secret.len != 0 && m->secret.len != BF_SECRET_LEN) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "secret must be %d bytes (or empty), not %zu",
                        BF_SECRET_LEN, m->secret.len);
        goto out;
    }
    if (m->secret.len == 0 && m->shard_count > 1) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "a sharded filter needs one secret shared by every shard");
        goto out;
    }
    if (node_shard_store_name(sname, sizeof sname, m->filter, m->shard_index,
                              m->shard_count) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "filter name too long for a shard name");
        goto out;
    }
    p.capacity = m->capacity;
    p.error_rate = m->error_rate;
    p.shard_index = m->shard_index;
    p.shard_count = m->shard_count;
    p.secret = m->secret.len ? m->secret.data : NULL;
    bf_params_default(&p);
    int rc = store_create(s, sname, &p, err);
    if (rc < 0) {
        store_error(r, NULL, sname, rc, err);
        goto out;
    }
    log_info("created shard %u/%u of filter %s", m->shard_index, m->shard_count,
             m->filter);
    struct store_filter *sf = store_get(s, sname);
    if (!sf) {
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "shard dropped during creation");
        goto out;
    }
    Bloomgrid__V1__InternalShardInfo isi;
    struct info_buf ib;
    shard_info_fill(n, &isi, &ib, sf, m->filter, m->shard_index, false);
    rpc_reply_pack(r, &isi.base);
    store_put(sf);
out:
    bloomgrid__v1__create_shard_request__free_unpacked(m, NULL);
}

/* Find the store filter of (filter, index): the plain name holds a
 * single-shard filter, "<filter>.shard-<index>" one shard of many. */
static struct store_filter *get_shard(struct store *s, const char *filter,
                                      unsigned index, struct rpc_reply *r)
{
    char sname[STORE_NAME_MAX + 1];
    struct store_filter *sf = NULL;
    if (!public_name_ok(filter, r))
        return NULL;
    if (node_shard_store_name(sname, sizeof sname, filter, index, 2) == 0)
        sf = store_get(s, sname);
    if (!sf && index == 0)
        sf = store_get(s, filter);
    if (!sf)
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND,
                        "shard %u of filter \"%s\" is not on this node", index,
                        filter);
    return sf;
}

static void h_drop_shard(void *arg, const uint8_t *req, size_t len,
                         struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__ShardRef, bloomgrid__v1__shard_ref, m, req, len, r);
    struct store_filter *sf = get_shard(s, m->filter, m->shard_index, r);
    if (sf) {
        char sname[STORE_NAME_MAX + 1], err[STORE_ERRLEN] = "";
        snprintf(sname, sizeof sname, "%s", store_filter_name(sf));
        store_put(sf);
        int rc = store_drop(s, sname, err);
        if (rc < 0) {
            store_error(r, NULL, sname, rc, err);
        } else {
            Bloomgrid__V1__DropShardResponse resp =
                BLOOMGRID__V1__DROP_SHARD_RESPONSE__INIT;
            rpc_reply_pack(r, &resp.base);
        }
    }
    bloomgrid__v1__shard_ref__free_unpacked(m, NULL);
}

static void h_get_shard(void *arg, const uint8_t *req, size_t len,
                        struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__GetShardRequest, bloomgrid__v1__get_shard_request,
                   m, req, len, r);
    struct store_filter *sf = get_shard(s, m->filter, m->shard_index, r);
    if (sf) {
        Bloomgrid__V1__InternalShardInfo isi;
        struct info_buf ib;
        shard_info_fill(n, &isi, &ib, sf, m->filter, m->shard_index,
                        m->include_secret);
        rpc_reply_pack(r, &isi.base);
        store_put(sf);
    }
    bloomgrid__v1__get_shard_request__free_unpacked(m, NULL);
}

static void h_list_shards(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__ListShardsRequest,
                   bloomgrid__v1__list_shards_request, m, req, len, r);
    bloomgrid__v1__list_shards_request__free_unpacked(m, NULL);
    char **names = NULL;
    size_t nn = 0;
    if (store_list(s, &names, &nn) < 0) {
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "cannot list the shards");
        return;
    }
    struct info_buf *ibs = calloc(nn ? nn : 1, sizeof *ibs);
    Bloomgrid__V1__InternalShardInfo *isis = calloc(nn ? nn : 1, sizeof *isis);
    Bloomgrid__V1__InternalShardInfo **ptrs = calloc(nn ? nn : 1, sizeof *ptrs);
    size_t k = 0;
    if (!ibs || !isis || !ptrs) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nn; i++) {
        char filter[STORE_NAME_MAX + 1];
        unsigned index;
        split_store_name(names[i], filter, sizeof filter, &index);
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        shard_info_fill(n, &isis[k], &ibs[k], sf, filter, index, false);
        ibs[k].fi.shard_info = &ibs[k].sip;
        isis[k].info = &ibs[k].fi;
        isis[k].filter = ibs[k].name;
        ptrs[k] = &isis[k];
        store_put(sf);
        k++;
    }
    Bloomgrid__V1__ListShardsResponse resp = BLOOMGRID__V1__LIST_SHARDS_RESPONSE__INIT;
    resp.n_shards = k;
    resp.shards = ptrs;
    rpc_reply_pack(r, &resp.base);
out:
    free(ptrs);
    free(isis);
    free(ibs);
    store_list_free(names, nn);
}

static void hashes_call(struct node *n, enum key_op op, const uint8_t *req,
                        size_t len, struct rpc_reply *r)
{
    struct store *s = need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__HashesRequest, bloomgrid__v1__hashes_request, m,
                   req, len, r);
    struct scratch *sc = thread_scratch();
    struct store_filter *sf = NULL;
    char err[STORE_ERRLEN] = "";
    size_t cnt = m->hashes.len / 16;
    if (!sc) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    if (m->hashes.len % 16) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "hashes is %zu bytes: not a multiple of 16", m->hashes.len);
        goto out;
    }
    if (cnt > n->cfg.max_batch_keys) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                        "%zu hashes in one batch; the limit is %llu (max_batch_keys)",
                        cnt, (unsigned long long)n->cfg.max_batch_keys);
        goto out;
    }
    sf = get_shard(s, m->filter, m->shard_index, r);
    if (!sf)
        goto out;
    if (scratch_reserve(sc, cnt ? cnt : 1) < 0) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < cnt; i++) {
        const uint8_t *p = m->hashes.data + 16 * i;
        uint64_t h1 = 0, h2 = 0;
        for (int b = 7; b >= 0; b--) {
            h1 = (h1 << 8) | p[b];
            h2 = (h2 << 8) | p[8 + b];
        }
        sc->hashes[i].h1 = h1;
        sc->hashes[i].h2 = h2;
    }
    if (m->check_shard) {
        const struct bf *f = store_filter_bf(sf);
        uint32_t count = f ? bf_shard_count(f) : 1;
        for (size_t i = 0; f && i < cnt; i++) {
            if (bf_hash_shard(sc->hashes[i], count) != m->shard_index) {
                rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                                "hash %zu belongs to shard %u, not %u", i,
                                bf_hash_shard(sc->hashes[i], count), m->shard_index);
                goto out;
            }
        }
    }
    int rc = 0;
    if (cnt) {
        switch (op) {
        case OP_ADD:
            rc = store_add_hashes(sf, sc->hashes, cnt, sc->out, err);
            break;
        case OP_MAY_CONTAIN:
            rc = store_may_contain_hashes(sf, sc->hashes, cnt, sc->out);
            break;
        case OP_REMOVE:
            rc = store_remove_hashes(sf, sc->hashes, cnt, sc->out, err);
            break;
        }
    }
    if (rc < 0) {
        char label[STORE_NAME_MAX + 32];
        snprintf(label, sizeof label, "%s shard %u", m->filter, m->shard_index);
        store_error(r, sf, label, rc, err);
        goto out;
    }
    encode_bools(r, sc->out, cnt, true, store_filter_version(sf));
out:
    if (sf)
        store_put(sf);
    bloomgrid__v1__hashes_request__free_unpacked(m, NULL);
}

static void h_add_hashes(void *arg, const uint8_t *req, size_t len,
                         struct rpc_reply *r)
{
    hashes_call(arg, OP_ADD, req, len, r);
}

static void h_may_contain_hashes(void *arg, const uint8_t *req, size_t len,
                                 struct rpc_reply *r)
{
    hashes_call(arg, OP_MAY_CONTAIN, req, len, r);
}

static void h_remove_hashes(void *arg, const uint8_t *req, size_t len,
                            struct rpc_reply *r)
{
    hashes_call(arg, OP_REMOVE, req, len, r);
}

/* Descriptor order: CreateFilter, DropFilter, ListFilters, GetFilter, Add,
 * MayContain, Remove, AddStream, MayContainStream, Export, Import. */
const struct rpc_handler node_rpc_public[] = {
    {.unary = h_create_filter},
    {.unary = h_drop_filter},
    {.unary = h_list_filters},
    {.unary = h_get_filter},
    {.unary = h_add},
    {.unary = h_may_contain},
    {.unary = h_remove},
    {.stream = h_add_stream},
    {.stream = h_may_contain_stream},
    {.stream = h_export},
    {.stream = h_import},
};

/* CreateShard, DropShard, GetShard, ListShards, AddHashes, MayContainHashes,
 * RemoveHashes, PullPages (not yet), PushPages (not yet). */
const struct rpc_handler node_rpc_internal[] = {
    {.unary = h_create_shard},
    {.unary = h_drop_shard},
    {.unary = h_get_shard},
    {.unary = h_list_shards},
    {.unary = h_add_hashes},
    {.unary = h_may_contain_hashes},
    {.unary = h_remove_hashes},
    {0},
    {0},
};

const size_t node_rpc_public_count = sizeof node_rpc_public / sizeof node_rpc_public[0];
const size_t node_rpc_internal_count =
    sizeof node_rpc_internal / sizeof node_rpc_internal[0];
