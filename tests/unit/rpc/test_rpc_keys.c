/* Unit tests of rpc_keys, the key-batch codec, field by field against
 * protobuf-c: the hand-written request decoder accepts exactly the messages
 * protobuf-c accepts (round trips, unknown fields of every wire type, every
 * truncation, the bounds of tags, lengths and varints) and yields the same
 * fields; its rules name the first bad field in order; answers and the
 * tool's requests are protobuf-c's bytes, and answers are read packed or
 * not. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_keys.h"

#define WT_VARINT 0
#define WT_FIXED64 1
#define WT_LEN 2
#define WT_START_GROUP 3
#define WT_END_GROUP 4
#define WT_FIXED32 5

static const ProtobufCMessageDescriptor *const req_desc[] = {
    [RPC_KEYS_ADD] = &bloomgrid__v1__add_request__descriptor,
    [RPC_KEYS_MAY_CONTAIN] = &bloomgrid__v1__may_contain_request__descriptor,
    [RPC_KEYS_REMOVE] = &bloomgrid__v1__remove_request__descriptor,
};
static const ProtobufCMessageDescriptor *const resp_desc[] = {
    [RPC_KEYS_ADD] = &bloomgrid__v1__add_response__descriptor,
    [RPC_KEYS_MAY_CONTAIN] = &bloomgrid__v1__may_contain_response__descriptor,
    [RPC_KEYS_REMOVE] = &bloomgrid__v1__remove_response__descriptor,
};

/* Limits no test message reaches, for the codec tests. */
static const struct rpc_keys_limits wide = {.max_keys = 1u << 20, .max_key = 1u << 20};

/* ---- building messages byte by byte ---- */

struct msg {
    uint8_t *b;
    size_t n, cap;
};

static void put(struct msg *m, const void *p, size_t len)
{
    if (m->n + len > m->cap) {
        m->cap = (m->n + len) * 2 + 64;
        m->b = realloc(m->b, m->cap);
        ck_assert_ptr_nonnull(m->b);
    }
    memcpy(m->b + m->n, p, len);
    m->n += len;
}

static void put_varint(struct msg *m, uint64_t v)
{
    uint8_t c;
    while (v >= 0x80) {
        c = (uint8_t)(v | 0x80);
        put(m, &c, 1);
        v >>= 7;
    }
    c = (uint8_t)v;
    put(m, &c, 1);
}

static void put_tag(struct msg *m, uint64_t field, unsigned wt)
{
    put_varint(m, field << 3 | wt);
}

static void put_bytes(struct msg *m, uint64_t field, const void *p, size_t len)
{
    put_tag(m, field, WT_LEN);
    put_varint(m, len);
    put(m, p, len);
}

/* One unknown field of each wire type, numbered from base. */
static void put_unknowns(struct msg *m, uint64_t base)
{
    static const uint8_t eight[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    put_tag(m, base, WT_VARINT);
    put_varint(m, UINT64_MAX);              /* 10 bytes */
    put_tag(m, base + 1, WT_FIXED64);
    put(m, eight, 8);
    put_tag(m, base + 2, WT_FIXED32);
    put(m, eight, 4);
    put_bytes(m, base + 3, "unknown", 7);
    put_bytes(m, base + 4, "", 0);
}

/* ---- comparing with protobuf-c ---- */

/* The filter and keys of a request protobuf-c unpacked (the three request
 * types share their fields, found through the descriptor). */
static void pbc_fields(const ProtobufCMessage *m, const char **filter, size_t *n,
                       const ProtobufCBinaryData **keys)
{
    const ProtobufCFieldDescriptor *ff =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "filter");
    const ProtobufCFieldDescriptor *fk =
        protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "keys");
    *filter = *(char *const *)((const char *)m + ff->offset);
    *n = *(const size_t *)((const char *)m + fk->quantifier_offset);
    *keys = *(ProtobufCBinaryData *const *)((const char *)m + fk->offset);
}

/* Decode buf with rpc_keys and with protobuf-c; both must accept it or
 * both refuse it (as malformed), and give the same fields.  Returns whether
 * it was accepted. */
static bool agree(enum rpc_keys_op op, const uint8_t *buf, size_t len)
{
    struct rpc_keys_buf b = {0};
    struct rpc_keys k;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    int rc = rpc_keys_decode(&b, &wide, op, buf, len, &k, &r);
    ProtobufCMessage *m = protobuf_c_message_unpack(req_desc[op], NULL, len, buf);

    ck_assert_msg((rc == 0) == (m != NULL), "%zu bytes: rpc_keys %s, protobuf-c %s",
                  len, rc == 0 ? "accepts" : r.st.message, m ? "accepts" : "refuses");
    if (rc < 0) {
        ck_assert_int_eq(r.st.code, GRPC_STATUS_INVALID_ARGUMENT);
        ck_assert_msg(strncmp(r.st.message, "malformed request message (byte ", 32) == 0,
                      "%s", r.st.message);
    } else {
        const char *filter;
        size_t n;
        const ProtobufCBinaryData *keys;
        pbc_fields(m, &filter, &n, &keys);
        ck_assert_str_eq(k.filter, filter);
        ck_assert_uint_eq(k.n, n);
        for (size_t i = 0; i < n; i++) {
            ck_assert_uint_eq(k.len[i], keys[i].len);
            ck_assert_int_eq(memcmp(k.key[i], keys[i].data, keys[i].len), 0);
            /* The key is read in place, not copied. */
            ck_assert(k.key[i] >= buf && k.key[i] + k.len[i] <= buf + len);
        }
        protobuf_c_message_free_unpacked(m, NULL);
    }
    rpc_keys_buf_free(&b);
    return rc == 0;
}

/* A request packed by protobuf-c: n keys of lengths 1, 2, ... cycling up
 * to maxlen, filter as given.  Caller frees. */
static uint8_t *pbc_request(enum rpc_keys_op op, const char *filter, size_t n,
                            size_t maxlen, size_t *len)
{
    Bloomgrid__V1__AddRequest m = BLOOMGRID__V1__ADD_REQUEST__INIT;
    ProtobufCBinaryData *k = calloc(n ? n : 1, sizeof *k);
    uint8_t *bytes = malloc(maxlen);
    ck_assert(k && bytes);
    for (size_t i = 0; i < maxlen; i++)
        bytes[i] = (uint8_t)(i * 7 + 3);
    for (size_t i = 0; i < n; i++) {
        k[i].len = 1 + i % maxlen;
        k[i].data = bytes + (maxlen - k[i].len);
    }
    m.base.descriptor = req_desc[op];       /* the three share the layout */
    m.filter = (char *)filter;
    m.n_keys = n;
    m.keys = k;
    *len = protobuf_c_message_get_packed_size(&m.base);
    uint8_t *buf = malloc(*len ? *len : 1);
    protobuf_c_message_pack(&m.base, buf);
    free(k);
    free(bytes);
    return buf;
}

START_TEST(field_numbers_are_the_descriptors)
{
    for (int op = 0; op < 3; op++) {
        const ProtobufCFieldDescriptor *f =
            protobuf_c_message_descriptor_get_field_by_name(req_desc[op], "filter");
        const ProtobufCFieldDescriptor *k =
            protobuf_c_message_descriptor_get_field_by_name(req_desc[op], "keys");
        ck_assert_uint_eq(req_desc[op]->n_fields, 2);
        ck_assert_uint_eq(f->id, RPC_KEYS_FIELD_FILTER);
        ck_assert_int_eq(f->type, PROTOBUF_C_TYPE_STRING);
        ck_assert_uint_eq(k->id, RPC_KEYS_FIELD_KEYS);
        ck_assert_int_eq(k->type, PROTOBUF_C_TYPE_BYTES);
        ck_assert_int_eq(k->label, PROTOBUF_C_LABEL_REPEATED);
        ck_assert_uint_eq(resp_desc[op]->n_fields, 1);
        ck_assert_int_eq(resp_desc[op]->fields[0].type, PROTOBUF_C_TYPE_BOOL);
    }
}
END_TEST

START_TEST(round_trips_agree_with_protobuf_c)
{
    static const size_t counts[] = {0, 1, 2, 127, 128, 1000, 20000};
    static const char *const filters[] = {"", "users", "a-b_c.9"};
    for (int op = 0; op < 3; op++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++)
            for (size_t f = 0; f < 3; f++) {
                size_t len;
                /* Keys up to 300 bytes: one- and two-byte lengths. */
                uint8_t *buf = pbc_request(op, filters[f], counts[c], 300, &len);
                ck_assert(agree(op, buf, len));
                free(buf);
            }
    /* A key whose length takes three bytes. */
    size_t len;
    uint8_t *buf = pbc_request(RPC_KEYS_ADD, "big", 1, 70000, &len);
    ck_assert(agree(RPC_KEYS_ADD, buf, len));
    free(buf);
}
END_TEST

START_TEST(unknown_fields_are_skipped_as_protobuf_c_does)
{
    static const uint64_t bases[] = {3, 12, 15, 16, 2043, (1u << 29) - 5};
    for (size_t i = 0; i < sizeof bases / sizeof bases[0]; i++) {
        struct msg m = {0};
        put_unknowns(&m, bases[i]);
        put_bytes(&m, RPC_KEYS_FIELD_FILTER, "users", 5);
        put_unknowns(&m, bases[i]);
        put_bytes(&m, RPC_KEYS_FIELD_KEYS, "k0", 2);
        put_unknowns(&m, bases[i]);
        put_bytes(&m, RPC_KEYS_FIELD_KEYS, "key-1", 5);
        put_unknowns(&m, bases[i]);
        ck_assert(agree(RPC_KEYS_MAY_CONTAIN, m.b, m.n));
        Bloomgrid__V1__MayContainRequest *q =
            bloomgrid__v1__may_contain_request__unpack(NULL, m.n, m.b);
        ck_assert_uint_eq(q->base.n_unknown_fields, 20);
        bloomgrid__v1__may_contain_request__free_unpacked(q, NULL);
        free(m.b);
    }
}
END_TEST

START_TEST(repeated_filter_field_last_one_wins)
{
    struct msg m = {0};
    put_bytes(&m, RPC_KEYS_FIELD_FILTER, "first", 5);
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, "k", 1);
    put_bytes(&m, RPC_KEYS_FIELD_FILTER, "second", 6);
    ck_assert(agree(RPC_KEYS_ADD, m.b, m.n));
    put_bytes(&m, RPC_KEYS_FIELD_FILTER, "", 0);
    ck_assert(agree(RPC_KEYS_ADD, m.b, m.n));
    free(m.b);
}
END_TEST

START_TEST(every_truncation_agrees_with_protobuf_c)
{
    struct msg m = {0};
    put_bytes(&m, RPC_KEYS_FIELD_FILTER, "users", 5);
    put_unknowns(&m, 7);
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, "k0", 2);
    uint8_t big[200];
    memset(big, 0xab, sizeof big);
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, big, sizeof big);   /* two-byte length */
    put_unknowns(&m, 3000);                                 /* two-byte tags */
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, "last", 4);
    size_t accepted = 0;
    for (size_t len = 0; len <= m.n; len++) {
        /* A copy of exactly len bytes, so nothing past it can be read. */
        uint8_t *cut = malloc(len ? len : 1);
        memcpy(cut, m.b, len);
        accepted += agree(RPC_KEYS_ADD, cut, len);
        free(cut);
    }
    /* Every field boundary, and only those: 1 + 5 + 3 + 5 + 1 = 15
     * (the empty message, each field's end). */
    ck_assert_uint_eq(accepted, 15);
    free(m.b);
}
END_TEST

START_TEST(wrong_wire_types_are_refused_as_protobuf_c_does)
{
    static const unsigned wts[] = {WT_VARINT, WT_FIXED64, WT_START_GROUP,
                                   WT_END_GROUP, WT_FIXED32, 6, 7};
    for (size_t i = 0; i < sizeof wts / sizeof wts[0]; i++) {
        for (uint64_t field = 1; field <= 3; field++) {
            struct msg m = {0};
            unsigned wt = wts[i];
            put_bytes(&m, RPC_KEYS_FIELD_KEYS, "ok", 2);
            put_tag(&m, field, wt);
            if (wt == WT_VARINT)
                put_varint(&m, 1);
            else
                put(&m, "\x01\x02\x03\x04\x05\x06\x07\x08", wt == WT_FIXED32 ? 4 : 8);
            /* Known fields must be length-delimited; an unknown one may be
             * of any wire type but a group, 6 or 7. */
            bool want = field == 3 && (wt == WT_VARINT || wt == WT_FIXED64 ||
                                       wt == WT_FIXED32);
            ck_assert_msg(agree(RPC_KEYS_REMOVE, m.b, m.n) == want,
                          "field %u wire type %u", (unsigned)field, wt);
            free(m.b);
        }
    }
}
END_TEST

START_TEST(bounds_are_protobuf_c_bounds)
{
    static const struct {
        const char *why, *bytes;
        size_t len;
        bool accepted;
    } cases[] = {
        {"tag padded to 5 bytes", "\x92\x80\x80\x80\x00\x01k", 7, true},
        {"tag padded to 6 bytes", "\x92\x80\x80\x80\x80\x00\x01k", 8, false},
        {"length padded to 5 bytes", "\x12\x81\x80\x80\x80\x00k", 7, true},
        {"length padded to 6 bytes", "\x12\x81\x80\x80\x80\x80\x00k", 8, false},
        /* Above INT_MAX too: a message that long is more than any server
         * takes, so that bound cannot show on its own. */
        {"length past the end", "\x12\xff\xff\xff\xff\x0f", 6, false},
        {"10-byte varint", "\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11, true},
        {"11-byte varint", "\x18\xff\xff\xff\xff\xff\xff\xff\xff\xff\x80\x01", 12,
         false},
        {"field number 0", "\x02\x01k", 3, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(agree(RPC_KEYS_ADD, (const uint8_t *)cases[i].bytes,
                            cases[i].len) == cases[i].accepted, "%s", cases[i].why);
    /* ...also padded, where protobuf-c lets it through as an unknown
     * field: the one place the decoder is stricter. */
    static const uint8_t padded0[] = {0x82, 0x00, 0x01, 'k'};
    struct rpc_keys_buf b = {0};
    struct rpc_keys k;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    Bloomgrid__V1__AddRequest *q =
        bloomgrid__v1__add_request__unpack(NULL, sizeof padded0, padded0);
    ck_assert_ptr_nonnull(q);
    bloomgrid__v1__add_request__free_unpacked(q, NULL);
    ck_assert_int_eq(rpc_keys_decode(&b, &wide, RPC_KEYS_ADD, padded0, sizeof padded0,
                                     &k, &r), -1);
    ck_assert_str_eq(r.st.message, "malformed request message (byte 2 of 4)");
    rpc_keys_buf_free(&b);
}
END_TEST

/* ---- the rules ---- */

/* Decode with small limits; returns the status code, msg the message. */
static int decode_status(const struct msg *m, char *msg)
{
    static const struct rpc_keys_limits lim = {.max_keys = 3, .max_key = 4};
    struct rpc_keys_buf b = {0};
    struct rpc_keys k;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    rpc_keys_decode(&b, &lim, RPC_KEYS_ADD, m->b, m->n, &k, &r);
    snprintf(msg, RPC_MSGLEN, "%s", r.st.message);
    rpc_keys_buf_free(&b);
    return r.st.code;
}

START_TEST(rules_name_the_first_bad_field)
{
    char msg[RPC_MSGLEN];
    struct msg m = {0};

    put_bytes(&m, RPC_KEYS_FIELD_FILTER, "F", 1);
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, "a", 1);
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, "", 0);
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, "toolong", 7);
    ck_assert_int_eq(decode_status(&m, msg), GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_str_eq(msg, "key 1 is empty; keys must be 1..4 bytes");
    free(m.b);

    m = (struct msg){0};
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, "toolong", 7);
    put(&m, "\x12", 1);                                     /* truncated */
    ck_assert_int_eq(decode_status(&m, msg), GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_str_eq(msg, "key 0 is 7 bytes; the limit is 4 (max_key_size)");
    free(m.b);

    m = (struct msg){0};
    for (int i = 0; i < 4; i++)
        put_bytes(&m, RPC_KEYS_FIELD_KEYS, "k", 1);
    put_bytes(&m, RPC_KEYS_FIELD_KEYS, "", 0);
    ck_assert_int_eq(decode_status(&m, msg), GRPC_STATUS_RESOURCE_EXHAUSTED);
    ck_assert_str_eq(msg, "more than 3 keys in one batch (max_batch_keys); split "
                          "the batch");
    free(m.b);

    /* The name rule on the exact bytes. */
    m = (struct msg){0};
    put_bytes(&m, RPC_KEYS_FIELD_FILTER, "F\0junk", 6);
    ck_assert_int_eq(decode_status(&m, msg), GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_msg(strstr(msg, "filter name") && strstr(msg, "0x00 at position 1"),
                  "%s", msg);
    free(m.b);
    m = (struct msg){0};
    put_bytes(&m, RPC_KEYS_FIELD_FILTER, "f.shard-1", 9);
    ck_assert_int_eq(decode_status(&m, msg), GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_msg(strstr(msg, "reserved for shards"), "%s", msg);
    free(m.b);
    m = (struct msg){0};
    char longname[RULES_FILTER_NAME_MAX + 1];
    memset(longname, 'n', sizeof longname);
    put_bytes(&m, RPC_KEYS_FIELD_FILTER, longname, sizeof longname);
    ck_assert_int_eq(decode_status(&m, msg), GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_msg(strstr(msg, "is 129 bytes long"), "%s", msg);
    free(m.b);

    /* Malformed: where it was found. */
    m = (struct msg){0};
    put_bytes(&m, RPC_KEYS_FIELD_FILTER, "F", 1);
    put_tag(&m, RPC_KEYS_FIELD_KEYS, WT_VARINT);
    put_varint(&m, 1);
    ck_assert_int_eq(decode_status(&m, msg), GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_str_eq(msg, "malformed request message (byte 4 of 5)");
    free(m.b);
}
END_TEST

START_TEST(one_buf_serves_message_after_message)
{
    struct rpc_keys_buf b = {0};
    struct rpc_keys k;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    size_t len1, len2;
    uint8_t *big = pbc_request(RPC_KEYS_ADD, "a", 5000, 40, &len1);
    uint8_t *small = pbc_request(RPC_KEYS_ADD, "", 3, 40, &len2);

    ck_assert_int_eq(rpc_keys_decode(&b, &wide, RPC_KEYS_ADD, big, len1, &k, &r), 0);
    ck_assert_uint_eq(k.n, 5000);
    size_t cap = b.cap;
    ck_assert_int_eq(rpc_keys_decode(&b, &wide, RPC_KEYS_ADD, small, len2, &k, &r), 0);
    ck_assert_str_eq(k.filter, "");
    ck_assert_uint_eq(k.n, 3);
    ck_assert_uint_eq(k.len[2], 3);
    ck_assert_uint_eq(b.cap, cap);
    ck_assert(k.key[0] >= small && k.key[0] < small + len2);
    /* An empty request still has room for its (no) answers. */
    ck_assert_int_eq(rpc_keys_decode(&b, &wide, RPC_KEYS_ADD, small, 0, &k, &r), 0);
    ck_assert_uint_eq(k.n, 0);
    ck_assert_ptr_nonnull(k.out);
    rpc_keys_buf_free(&b);
    ck_assert_uint_eq(b.cap, 0);
    free(big);
    free(small);
}
END_TEST

static pthread_barrier_t both_alive;

/* A worker: its buf twice, a decode into it; returns the buf, once the
 * other worker has its own (so that both are alive at once). */
static void *thread_decode(void *arg)
{
    const struct msg *m = arg;
    struct rpc_keys_buf *b = rpc_keys_thread_buf();
    struct rpc_keys k;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_eq(rpc_keys_thread_buf(), b);
    ck_assert_int_eq(rpc_keys_decode(b, &wide, RPC_KEYS_ADD, m->b, m->n, &k, &r), 0);
    ck_assert_uint_eq(k.n, 2000);
    pthread_barrier_wait(&both_alive);
    return b;
}

START_TEST(each_thread_has_its_own_buf)
{
    /* Freed when the thread ends: the sanitizer build reports a leak
     * otherwise. */
    struct msg m = {0};
    pthread_t t[2];
    void *b[2];
    m.b = pbc_request(RPC_KEYS_ADD, "f", 2000, 16, &m.n);
    pthread_barrier_init(&both_alive, NULL, 2);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, thread_decode, &m), 0);
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_join(t[i], &b[i]), 0);
    ck_assert_ptr_ne(b[0], b[1]);
    pthread_barrier_destroy(&both_alive);
    free(m.b);
}
END_TEST

/* ---- answers and the tool's side ---- */

START_TEST(answers_are_protobuf_c_bytes)
{
    static const size_t counts[] = {0, 1, 127, 128, 1000};
    for (int op = 0; op < 3; op++)
        for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
            size_t n = counts[c], len;
            uint8_t *req = pbc_request(op, "f", n, 8, &len);
            struct rpc_keys_buf b = {0};
            struct rpc_keys k;
            struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
            ck_assert_int_eq(rpc_keys_decode(&b, &wide, op, req, len, &k, &r), 0);
            protobuf_c_boolean *want = calloc(n ? n : 1, sizeof *want);
            for (size_t i = 0; i < n; i++) {
                want[i] = i % 3 == 0;
                k.out[i] = want[i];
            }
            ck_assert_int_eq(rpc_keys_reply(&k, &r), 0);
            ck_assert(r.has_body);
            /* The same bytes protobuf-c packs for the response type. */
            Bloomgrid__V1__AddResponse a = BLOOMGRID__V1__ADD_RESPONSE__INIT;
            a.base.descriptor = resp_desc[op];
            a.n_added = n;
            a.added = want;
            size_t plen = protobuf_c_message_get_packed_size(&a.base);
            uint8_t *p = malloc(plen + 1);
            protobuf_c_message_pack(&a.base, p);
            ck_assert_uint_eq(GRPC_SLICE_LENGTH(r.body), plen);
            ck_assert_int_eq(memcmp(GRPC_SLICE_START_PTR(r.body), p, plen), 0);
            /* And the tool reads them back. */
            bool *got = calloc(n ? n : 1, sizeof *got);
            ck_assert_int_eq(rpc_keys_answer(op, p, plen, got, n), 0);
            for (size_t i = 0; i < n; i++)
                ck_assert_int_eq(got[i], want[i]);
            ck_assert_int_eq(rpc_keys_answer(op, p, plen, got, n + 1), -EBADMSG);
            grpc_slice_unref(r.body);
            rpc_keys_buf_free(&b);
            free(req);
            free(want);
            free(got);
            free(p);
        }
}
END_TEST

START_TEST(answers_are_read_packed_or_not)
{
    bool got[5];
    struct msg m = {0};
    /* Unpacked, packed, unknown fields between, a bool written as 2. */
    put_tag(&m, 1, WT_VARINT);
    put_varint(&m, 1);
    put_unknowns(&m, 9);
    put_bytes(&m, 1, "\x00\x02", 2);
    put_tag(&m, 1, WT_VARINT);
    put_varint(&m, 0);
    put_bytes(&m, 1, "\x01", 1);
    ck_assert_int_eq(rpc_keys_answer(RPC_KEYS_MAY_CONTAIN, m.b, m.n, got, 5), 0);
    ck_assert(got[0] && !got[1] && got[2] && !got[3] && got[4]);
    /* Every truncation is refused (never fewer answers taken as all). */
    for (size_t len = 0; len < m.n; len++)
        ck_assert_int_eq(rpc_keys_answer(RPC_KEYS_MAY_CONTAIN, m.b, len, got, 5),
                         -EBADMSG);
    free(m.b);
    /* A packed run that ends inside a varint is refused. */
    ck_assert_int_eq(rpc_keys_answer(RPC_KEYS_ADD, (const uint8_t *)"\x0a\x02\x01\x80",
                                     4, got, 2), -EBADMSG);
}
END_TEST

START_TEST(requests_are_protobuf_c_bytes)
{
    ProtobufCBinaryData keys[3] = {{2, (uint8_t *)"k0"}, {1, (uint8_t *)"\0"},
                                   {5, (uint8_t *)"key-2"}};
    for (int op = 0; op < 3; op++) {
        grpc_slice s = rpc_keys_request(op, "users", keys, 3);
        const uint8_t *p = GRPC_SLICE_START_PTR(s);
        size_t len = GRPC_SLICE_LENGTH(s);
        ProtobufCMessage *m = protobuf_c_message_unpack(req_desc[op], NULL, len, p);
        const char *filter;
        size_t n;
        const ProtobufCBinaryData *k;
        ck_assert_ptr_nonnull(m);
        pbc_fields(m, &filter, &n, &k);
        ck_assert_str_eq(filter, "users");
        ck_assert_uint_eq(n, 3);
        for (size_t i = 0; i < 3; i++) {
            ck_assert_uint_eq(k[i].len, keys[i].len);
            ck_assert_int_eq(memcmp(k[i].data, keys[i].data, k[i].len), 0);
        }
        ck_assert(agree(op, p, len));
        protobuf_c_message_free_unpacked(m, NULL);
        grpc_slice_unref(s);
    }
}
END_TEST

Suite *rpc_keys_suite(void)
{
    Suite *s = suite_create("rpc_keys");
    TCase *tc = tcase_create("rpc_keys");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, field_numbers_are_the_descriptors);
    tcase_add_test(tc, round_trips_agree_with_protobuf_c);
    tcase_add_test(tc, unknown_fields_are_skipped_as_protobuf_c_does);
    tcase_add_test(tc, repeated_filter_field_last_one_wins);
    tcase_add_test(tc, every_truncation_agrees_with_protobuf_c);
    tcase_add_test(tc, wrong_wire_types_are_refused_as_protobuf_c_does);
    tcase_add_test(tc, bounds_are_protobuf_c_bounds);
    tcase_add_test(tc, rules_name_the_first_bad_field);
    tcase_add_test(tc, one_buf_serves_message_after_message);
    tcase_add_test(tc, each_thread_has_its_own_buf);
    tcase_add_test(tc, answers_are_protobuf_c_bytes);
    tcase_add_test(tc, answers_are_read_packed_or_not);
    tcase_add_test(tc, requests_are_protobuf_c_bytes);
    suite_add_tcase(s, tc);
    return s;
}
