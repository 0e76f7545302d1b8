/* rpc_keys: the public key batches (see rpc_keys.h).
 *
 * The decoder follows the protobuf wire format: each field is a varint tag,
 * (field number << 3) | wire type, and a value whose size the wire type
 * gives.  Where protobuf-c 1.4 sets a bound, the decoder sets the same one,
 * so that it never accepts what protobuf-c would refuse: a tag of at most 5
 * bytes, a length prefix of at most 5 bytes and at most INT_MAX, a varint
 * of at most 10 bytes, and wire type 2 for both known fields.  It refuses
 * field number 0 even where protobuf-c lets a padded one through.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_keys.h"
#include "wire.h"

/* Wire types. */
#define WIRE_VARINT 0
#define WIRE_FIXED64 1
#define WIRE_LEN 2
#define WIRE_FIXED32 5

/* protobuf-c's bounds on tags and length prefixes. */
#define TAG_MAX_BYTES 5
#define LEN_MAX_BYTES 5

static int buf_reserve(struct rpc_keys_buf *b, size_t n)
{
    if (n <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < n)
        cap *= 2;
    const uint8_t **p = realloc(b->ptr, cap * sizeof *p);
    if (p)
        b->ptr = p;
    uint32_t *l = realloc(b->len, cap * sizeof *l);
    if (l)
        b->len = l;
    bool *o = realloc(b->out, cap * sizeof *o);
    if (o)
        b->out = o;
    protobuf_c_boolean *w = realloc(b->wire, cap * sizeof *w);
    if (w)
        b->wire = w;
    if (!p || !l || !o || !w)
        return -ENOMEM;
    b->cap = cap;
    return 0;
}

void rpc_keys_buf_free(struct rpc_keys_buf *b)
{
    free(b->ptr);
    free(b->len);
    free(b->out);
    free(b->wire);
    memset(b, 0, sizeof *b);
}

/* Worker threads keep their buf between calls. */
static pthread_key_t buf_key;
static pthread_once_t buf_once = PTHREAD_ONCE_INIT;

static void buf_destroy(void *p)
{
    rpc_keys_buf_free(p);
    free(p);
}

static void buf_key_init(void)
{
    pthread_key_create(&buf_key, buf_destroy);
}

struct rpc_keys_buf *rpc_keys_thread_buf(void)
{
    pthread_once(&buf_once, buf_key_init);
    struct rpc_keys_buf *b = pthread_getspecific(buf_key);
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b || pthread_setspecific(buf_key, b) != 0) {
            free(b);
            return NULL;
        }
    }
    return b;
}

/* A varint of at most max bytes at *p. */
static bool get_varint_max(const uint8_t **p, const uint8_t *end, size_t max,
                           uint64_t *v)
{
    return get_varint(p, (size_t)(end - *p) > max ? *p + max : end, v);
}

int rpc_keys_decode(struct rpc_keys_buf *b, const struct rpc_keys_limits *lim,
                    enum rpc_keys_op op, const uint8_t *buf, size_t len,
                    struct rpc_keys *out, struct rpc_reply *r)
{
    const uint8_t *p = buf, *end = buf + len;
    char err[RULES_ERRLEN];
    size_t n = 0;

    out->op = op;
    out->filter[0] = 0;
    while (p < end) {
        uint64_t tag, v;
        if (!get_varint_max(&p, end, TAG_MAX_BYTES, &tag) || tag >> 3 == 0)
            goto malformed;
        uint64_t field = tag >> 3;
        unsigned wt = (unsigned)(tag & 7);
        if (wt != WIRE_LEN &&
            (field == RPC_KEYS_FIELD_FILTER || field == RPC_KEYS_FIELD_KEYS))
            goto malformed;
        switch (wt) {
        case WIRE_VARINT:
            if (!get_varint(&p, end, &v))
                goto malformed;
            continue;
        case WIRE_FIXED64:
            if (end - p < 8)
                goto malformed;
            p += 8;
            continue;
        case WIRE_FIXED32:
            if (end - p < 4)
                goto malformed;
            p += 4;
            continue;
        case WIRE_LEN:
            if (!get_varint_max(&p, end, LEN_MAX_BYTES, &v) || v > INT_MAX ||
                v > (uint64_t)(end - p))
                goto malformed;
            break;
        default:
            goto malformed;
        }
        if (field == RPC_KEYS_FIELD_FILTER) {
            /* The name rule on the exact bytes: "F\0junk" is not "F". */
            if (v && rules_filter_name_check(p, v, err) < 0) {
                rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
                return -1;
            }
            memcpy(out->filter, p, v);
            out->filter[v] = 0;
        } else if (field == RPC_KEYS_FIELD_KEYS) {
            if (n >= lim->max_keys) {
                rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                "more than %" PRIu64 " keys in one batch "
                                "(max_batch_keys); split the batch", lim->max_keys);
                return -1;
            }
            if (rules_key_check(n, v, lim->max_key, err) < 0) {
                rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
                return -1;
            }
            if (n >= b->cap && buf_reserve(b, n + 1) < 0)
                goto nomem;
            b->ptr[n] = p;
            b->len[n] = (uint32_t)v;
            n++;
        }
        p += v;
    }
    /* Room for the answers even of an empty batch. */
    if (buf_reserve(b, 1) < 0)
        goto nomem;
    out->n = n;
    out->key = b->ptr;
    out->len = b->len;
    out->out = b->out;
    out->wire = b->wire;
    return 0;
malformed:
    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                    "malformed request message (byte %zu of %zu)",
                    (size_t)(p - buf), len);
    return -1;
nomem:
    rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                    "out of memory decoding the batch");
    return -1;
}

int rpc_keys_reply(const struct rpc_keys *k, struct rpc_reply *r)
{
    int rc = -EINVAL;

    for (size_t i = 0; i < k->n; i++)
        k->wire[i] = k->out[i];
    switch (k->op) {
    case RPC_KEYS_ADD: {
        Bloomgrid__V1__AddResponse m = BLOOMGRID__V1__ADD_RESPONSE__INIT;
        m.n_added = k->n, m.added = k->wire;
        rc = rpc_reply_pack(r, &m.base);
        break;
    }
    case RPC_KEYS_MAY_CONTAIN: {
        Bloomgrid__V1__MayContainResponse m = BLOOMGRID__V1__MAY_CONTAIN_RESPONSE__INIT;
        m.n_present = k->n, m.present = k->wire;
        rc = rpc_reply_pack(r, &m.base);
        break;
    }
    case RPC_KEYS_REMOVE: {
        Bloomgrid__V1__RemoveResponse m = BLOOMGRID__V1__REMOVE_RESPONSE__INIT;
        m.n_removed = k->n, m.removed = k->wire;
        rc = rpc_reply_pack(r, &m.base);
        break;
    }
    }
    if (rc < 0)
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return rc;
}

static grpc_slice pack_slice(const ProtobufCMessage *m)
{
    grpc_slice s = grpc_slice_malloc(protobuf_c_message_get_packed_size(m));
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    return s;
}

grpc_slice rpc_keys_request(enum rpc_keys_op op, const char *filter,
                            const ProtobufCBinaryData *key, size_t n)
{
    /* protobuf-c packs from pointers without const but only reads them. */
    char *f = (char *)filter;
    ProtobufCBinaryData *k = (ProtobufCBinaryData *)key;

    switch (op) {
    case RPC_KEYS_ADD: {
        Bloomgrid__V1__AddRequest m = BLOOMGRID__V1__ADD_REQUEST__INIT;
        m.filter = f, m.n_keys = n, m.keys = k;
        return pack_slice(&m.base);
    }
    case RPC_KEYS_MAY_CONTAIN: {
        Bloomgrid__V1__MayContainRequest m = BLOOMGRID__V1__MAY_CONTAIN_REQUEST__INIT;
        m.filter = f, m.n_keys = n, m.keys = k;
        return pack_slice(&m.base);
    }
    case RPC_KEYS_REMOVE:
        break;
    }
    Bloomgrid__V1__RemoveRequest m = BLOOMGRID__V1__REMOVE_REQUEST__INIT;
    m.filter = f, m.n_keys = n, m.keys = k;
    return pack_slice(&m.base);
}

int rpc_keys_answer(enum rpc_keys_op op, const uint8_t *buf, size_t len,
                    bool *out, size_t want)
{
    /* A packed answer costs protobuf-c two allocations whatever its
     * length, so malloc serves as well as an arena would. */
    ProtobufCMessage *m = NULL;
    const protobuf_c_boolean *v = NULL;
    size_t n = 0;

    switch (op) {
    case RPC_KEYS_ADD: {
        Bloomgrid__V1__AddResponse *a = bloomgrid__v1__add_response__unpack(NULL, len, buf);
        if (a)
            m = &a->base, v = a->added, n = a->n_added;
        break;
    }
    case RPC_KEYS_MAY_CONTAIN: {
        Bloomgrid__V1__MayContainResponse *a =
            bloomgrid__v1__may_contain_response__unpack(NULL, len, buf);
        if (a)
            m = &a->base, v = a->present, n = a->n_present;
        break;
    }
    case RPC_KEYS_REMOVE: {
        Bloomgrid__V1__RemoveResponse *a =
            bloomgrid__v1__remove_response__unpack(NULL, len, buf);
        if (a)
            m = &a->base, v = a->removed, n = a->n_removed;
        break;
    }
    }
    if (!m)
        return -EBADMSG;
    for (size_t i = 0; n == want && i < n; i++)
        out[i] = v[i] != 0;
    protobuf_c_message_free_unpacked(m, NULL);
    return n == want ? 0 : -EBADMSG;
}
