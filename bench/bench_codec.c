/* The key-batch codec in use (common/rpc/rpc_keys.c: a hand-written decoder of
 * the requests, protobuf-c for the answers and the tool's side) beside the
 * alternatives, in one run, so that each hand-written part is kept only
 * where it pays: protobuf-c unpacking into an rpc_arena (and into malloc)
 * against the decoder, and the hand encoders used before against
 * protobuf-c.  In one process on one core, then as whole calls over
 * loopback.
 *
 * Per message (AddRequest of 1, 100 and 1000 keys of 16 bytes, and the
 * answers of as many bools):
 *   decode   rpc_keys_decode | the server's string check (rpc_check_strings,
 *            which a handler that decodes by hand skips) + protobuf-c into
 *            an arena + the same checks | the same without the string
 *            check | string check + protobuf-c with malloc
 *   answer   hand encoder (before) | rpc_keys_reply, both into a new reply
 *            slice; and both into a buffer of their own
 *   client   the tool's side: hand request builder (before) |
 *            rpc_keys_request; hand answer reader (before) | rpc_keys_answer
 *   handler  what a node does with the keys besides the codec (hash with
 *            the filter's secret, add into a 1 MiB filter): the work the
 *            codec's share is judged against
 * Whole calls: a server on loopback (one worker thread) whose Add, Remove
 * and MayContain run the same handler (decode, hash, add into the filter,
 * answer) with the codec before (hand decoder, hand encoder), the codec in
 * use, and protobuf-c with an arena for both; one client thread, one call
 * at a time (p50 latency) and 8 in flight (time per call).
 *
 * The variants alternate: each round measures every one once (in a rotating
 * order), and the figures are the median and the 10th / 90th percentiles
 * over the rounds, so a busy spell of the shared machine falls on all
 * variants alike.  "vs" is the median over rounds of the ratio to the
 * variant compared with, within the round.
 *
 * usage: bench_codec [--rounds N (31)] [--sample-ms MS (2)]
 *                    [--call-rounds N (15; 0: no whole calls)]
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>

#include "bf.h"
#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_arena.h"
#include "rpc_check.h"
#include "rpc_client.h"
#include "rpc_keys.h"
#include "rpc_server.h"
#include "rules.h"
#include "wire.h"

#define KEY_LEN 16
#define FILTER "bench-filter"
#define MAX_MESSAGE (64u << 20)

static const struct rpc_keys_limits limits = {
    .max_keys = RULES_BATCH_KEYS_DEFAULT,
    .max_key = RULES_KEY_SIZE_DEFAULT,
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Keeps results alive so the compiler cannot drop the work. */
static volatile uint64_t sink;

static void check_ok(bool ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "bench_codec: %s failed\n", what);
        exit(1);
    }
}

/* ---- the reference: the hand encoders used before ---- */

/* Tags as bytes: (field number << 3) | wire type 2 (length-delimited). */
#define TAG_ANSWERS (1 << 3 | 2)     /* repeated bool = 1, packed */
#define TAG_FILTER (RPC_KEYS_FIELD_FILTER << 3 | 2)
#define TAG_KEY (RPC_KEYS_FIELD_KEYS << 3 | 2)

/* node_rpc__encode_bools as the key batches used it: "repeated bool = 1
 * [packed]" at p; returns the bytes written. */
static size_t hand_bools_size(size_t n)
{
    return n ? 1 + varint_len(n) + n : 0;
}

static void hand_bools(uint8_t *p, const bool *v, size_t n)
{
    if (!n)
        return;
    *p++ = TAG_ANSWERS;
    p = put_varint(p, n);
    for (size_t i = 0; i < n; i++)
        p[i] = v[i] ? 1 : 0;
}

/* cli/online_rpc.c as it was: the request built by appending. */
static size_t hand_request(uint8_t *buf, const char *filter,
                           const ProtobufCBinaryData *k, size_t n)
{
    uint8_t *p = buf;
    size_t flen = strlen(filter);
    *p++ = TAG_FILTER;
    p = put_varint(p, flen);
    memcpy(p, filter, flen);
    p += flen;
    for (size_t i = 0; i < n; i++) {
        *p++ = TAG_KEY;
        p = put_varint(p, k[i].len);
        memcpy(p, k[i].data, k[i].len);
        p += k[i].len;
    }
    return (size_t)(p - buf);
}

/* cli/online_rpc.c decode_bools as it was. */
static int hand_answer(const uint8_t *p, size_t len, bool *out, size_t want)
{
    const uint8_t *end = p + len;
    size_t got = 0;
    uint64_t tag, v, n;

    while (p < end) {
        if (!get_varint(&p, end, &tag))
            return -1;
        unsigned wt = (unsigned)(tag & 7);
        if (tag >> 3 == 1 && wt == 2) {
            if (!get_varint(&p, end, &n) || n > (uint64_t)(end - p))
                return -1;
            const uint8_t *stop = p + n;
            while (p < stop) {
                if (!get_varint(&p, stop, &v) || got == want)
                    return -1;
                out[got++] = v != 0;
            }
        } else if (tag >> 3 == 1 && wt == 0) {
            if (!get_varint(&p, end, &v) || got == want)
                return -1;
            out[got++] = v != 0;
        } else if (wt == 0) {
            if (!get_varint(&p, end, &v))
                return -1;
        } else if (wt == 2) {
            if (!get_varint(&p, end, &n) || n > (uint64_t)(end - p))
                return -1;
            p += n;
        } else if (wt == 1 || wt == 5) {
            size_t skip = wt == 1 ? 8 : 4;
            if ((size_t)(end - p) < skip)
                return -1;
            p += skip;
        } else {
            return -1;
        }
    }
    return got == want ? 0 : -1;
}

/* ---- the alternative: protobuf-c for the requests too ---- */

/* What a handler does with protobuf-c: unpack (into the arena a, reset
 * first, or malloc when a is NULL), then the checks rpc_keys_decode makes.
 * The server's string check is separate (string_check). */
static Bloomgrid__V1__AddRequest *pbc_decode(struct rpc_arena *a, const uint8_t *buf,
                                             size_t len)
{
    char err[RULES_ERRLEN];
    if (a)
        rpc_arena_reset(a);
    Bloomgrid__V1__AddRequest *q =
        bloomgrid__v1__add_request__unpack(a ? rpc_arena_allocator(a) : NULL, len, buf);
    check_ok(q != NULL, "unpack");
    check_ok(!q->filter[0] ||
                 rules_filter_name_check(q->filter, strlen(q->filter), err) == 0,
             "name");
    for (size_t i = 0; i < q->n_keys; i++)
        check_ok(i < limits.max_keys &&
                     rules_key_check(i, q->keys[i].len, limits.max_key, err) == 0,
                 "key");
    return q;
}

static void string_check(const uint8_t *buf, size_t len)
{
    char msg[RPC_MSGLEN];
    check_ok(rpc_check_strings(&bloomgrid__v1__add_request__descriptor, buf, len, msg,
                               sizeof msg) == 0, "string check");
}

/* ---- one message at a time ---- */

struct msgset {
    size_t n;                     /* keys */
    ProtobufCBinaryData *key;     /* into keybytes */
    uint8_t *keybytes;
    uint8_t *req;                 /* packed AddRequest */
    size_t req_len;
    bool *answers;                /* n bools, every other one true */
    uint8_t *resp;                /* packed AddResponse */
    size_t resp_len;
    uint8_t *out;                 /* room for any encoding of either */
    struct bf_hash *h;
};

struct ctx {
    struct msgset *m;
    struct rpc_keys_buf kb;
    struct rpc_arena arena;
    struct rpc_keys reply_k;      /* a decoded request, for the answers */
    struct rpc_keys_buf reply_kb; /* where reply_k lives */
    struct bf *f;
};

typedef void (*case_fn)(struct ctx *c);

static void c_decode(struct ctx *c)
{
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    struct rpc_keys k;
    check_ok(rpc_keys_decode(&c->kb, &limits, RPC_KEYS_ADD, c->m->req, c->m->req_len,
                             &k, &r) == 0, "rpc_keys_decode");
    sink += k.n + k.key[k.n - 1][0];
}

static void c_pbc_arena_checked(struct ctx *c)
{
    string_check(c->m->req, c->m->req_len);
    Bloomgrid__V1__AddRequest *q = pbc_decode(&c->arena, c->m->req, c->m->req_len);
    sink += q->n_keys + q->keys[q->n_keys - 1].data[0];
}

static void c_pbc_arena(struct ctx *c)
{
    Bloomgrid__V1__AddRequest *q = pbc_decode(&c->arena, c->m->req, c->m->req_len);
    sink += q->n_keys + q->keys[q->n_keys - 1].data[0];
}

static void c_pbc_malloc(struct ctx *c)
{
    string_check(c->m->req, c->m->req_len);
    Bloomgrid__V1__AddRequest *q = pbc_decode(NULL, c->m->req, c->m->req_len);
    sink += q->n_keys + q->keys[q->n_keys - 1].data[0];
    bloomgrid__v1__add_request__free_unpacked(q, NULL);
}

static void c_hand_reply(struct ctx *c)
{
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    uint8_t *p = rpc_reply_alloc(&r, hand_bools_size(c->m->n));
    hand_bools(p, c->m->answers, c->m->n);
    sink += GRPC_SLICE_LENGTH(r.body);
    grpc_slice_unref(r.body);
}

static void c_reply(struct ctx *c)
{
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    memcpy(c->reply_k.out, c->m->answers, c->m->n);
    check_ok(rpc_keys_reply(&c->reply_k, &r) == 0, "rpc_keys_reply");
    sink += GRPC_SLICE_LENGTH(r.body);
    grpc_slice_unref(r.body);
}

static void c_hand_reply_buf(struct ctx *c)
{
    hand_bools(c->m->out, c->m->answers, c->m->n);
    sink += c->m->out[c->m->n];
}

static void c_pbc_reply_buf(struct ctx *c)
{
    /* rpc_keys_reply's work without the slice. */
    Bloomgrid__V1__AddResponse m = BLOOMGRID__V1__ADD_RESPONSE__INIT;
    for (size_t i = 0; i < c->m->n; i++)
        c->reply_k.wire[i] = c->m->answers[i];
    m.n_added = c->m->n;
    m.added = c->reply_k.wire;
    size_t len = protobuf_c_message_get_packed_size(&m.base);
    protobuf_c_message_pack(&m.base, c->m->out);
    sink += len + c->m->out[c->m->n];
}

static void c_hand_request(struct ctx *c)
{
    /* The tool built into a buffer and then copied it into the slice. */
    size_t len = hand_request(c->m->out, FILTER, c->m->key, c->m->n);
    grpc_slice s = grpc_slice_from_copied_buffer((const char *)c->m->out, len);
    sink += GRPC_SLICE_LENGTH(s);
    grpc_slice_unref(s);
}

static void c_request(struct ctx *c)
{
    grpc_slice s = rpc_keys_request(RPC_KEYS_ADD, FILTER, c->m->key, c->m->n);
    sink += GRPC_SLICE_LENGTH(s);
    grpc_slice_unref(s);
}

static void c_hand_answer(struct ctx *c)
{
    bool *out = (bool *)c->m->out;
    check_ok(hand_answer(c->m->resp, c->m->resp_len, out, c->m->n) == 0, "hand answer");
    sink += out[c->m->n - 1];
}

static void c_answer(struct ctx *c)
{
    bool *out = (bool *)c->m->out;
    check_ok(rpc_keys_answer(RPC_KEYS_ADD, c->m->resp, c->m->resp_len, out,
                             c->m->n) == 0, "rpc_keys_answer");
    sink += out[c->m->n - 1];
}

static void c_handler(struct ctx *c)
{
    /* Hash with the filter's secret and add: the node's work per batch
     * between decoding and answering (in memory; no log). */
    bool *out = (bool *)c->m->out;
    for (size_t i = 0; i < c->m->n; i++)
        c->m->h[i] = bf_hash_key(c->f, c->m->key[i].data, c->m->key[i].len);
    bf_add_hashes(c->f, c->m->h, c->m->n, out);
    sink += out[0];
}

struct bcase {
    const char *group, *name;
    case_fn fn;
    int base;              /* index of the case it is compared with, or -1 */
};

static const struct bcase cases[] = {
    {"decode", "rpc_keys_decode (in use)", c_decode, -1},
    {"decode", "string check + protobuf-c, arena", c_pbc_arena_checked, 0},
    {"decode", "protobuf-c, arena, no string check", c_pbc_arena, 0},
    {"decode", "string check + protobuf-c, malloc", c_pbc_malloc, 0},
    {"answer", "hand encoder, new slice (before)", c_hand_reply, -1},
    {"answer", "rpc_keys_reply, new slice (in use)", c_reply, 4},
    {"answer", "hand encoder, own buffer", c_hand_reply_buf, -1},
    {"answer", "protobuf-c pack, own buffer", c_pbc_reply_buf, 6},
    {"client", "hand request builder (before)", c_hand_request, -1},
    {"client", "rpc_keys_request (in use)", c_request, 8},
    {"client", "hand answer reader (before)", c_hand_answer, -1},
    {"client", "rpc_keys_answer (in use)", c_answer, 10},
    {"handler", "hash + add, 1 MiB filter", c_handler, -1},
};
#define NCASES (sizeof cases / sizeof cases[0])
#define MAX_ROUNDS 1024

static void msgset_init(struct msgset *m, size_t n, uint64_t *rng)
{
    m->n = n;
    m->key = calloc(n, sizeof *m->key);
    m->keybytes = malloc(n * KEY_LEN);
    m->answers = malloc(n);
    m->h = malloc(n * sizeof *m->h);
    check_ok(m->key && m->keybytes && m->answers && m->h, "memory");
    for (size_t i = 0; i < n * KEY_LEN; i++) {
        *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17;
        m->keybytes[i] = (uint8_t)*rng;
    }
    for (size_t i = 0; i < n; i++) {
        m->key[i].data = m->keybytes + i * KEY_LEN;
        m->key[i].len = KEY_LEN;
        m->answers[i] = i % 2 == 0;
    }
    Bloomgrid__V1__AddRequest q = BLOOMGRID__V1__ADD_REQUEST__INIT;
    q.filter = FILTER;
    q.n_keys = n;
    q.keys = m->key;
    m->req_len = protobuf_c_message_get_packed_size(&q.base);
    m->req = malloc(m->req_len);
    protobuf_c_message_pack(&q.base, m->req);
    protobuf_c_boolean *b = malloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++)
        b[i] = m->answers[i];
    Bloomgrid__V1__AddResponse a = BLOOMGRID__V1__ADD_RESPONSE__INIT;
    a.n_added = n;
    a.added = b;
    m->resp_len = protobuf_c_message_get_packed_size(&a.base);
    m->resp = malloc(m->resp_len);
    protobuf_c_message_pack(&a.base, m->resp);
    free(b);
    m->out = malloc(m->req_len + n * sizeof(bool) + 64);
}

static void msgset_free(struct msgset *m)
{
    free(m->key);
    free(m->keybytes);
    free(m->answers);
    free(m->h);
    free(m->req);
    free(m->resp);
    free(m->out);
}

/* The codecs must agree before they are timed. */
static void cross_check(struct ctx *c)
{
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    struct rpc_keys k;
    struct msgset *m = c->m;

    check_ok(rpc_keys_decode(&c->kb, &limits, RPC_KEYS_ADD, m->req, m->req_len, &k,
                             &r) == 0, "rpc_keys_decode");
    Bloomgrid__V1__AddRequest *q = pbc_decode(&c->arena, m->req, m->req_len);
    check_ok(q->n_keys == k.n && strcmp(q->filter, k.filter) == 0, "decoders agree");
    for (size_t i = 0; i < k.n; i++)
        check_ok(q->keys[i].len == k.len[i] &&
                     memcmp(q->keys[i].data, k.key[i], k.len[i]) == 0,
                 "keys agree");
    memcpy(k.out, m->answers, k.n);
    check_ok(rpc_keys_reply(&k, &r) == 0 && GRPC_SLICE_LENGTH(r.body) ==
                 hand_bools_size(k.n), "answer size");
    hand_bools(m->out, m->answers, k.n);
    check_ok(memcmp(GRPC_SLICE_START_PTR(r.body), m->out, hand_bools_size(k.n)) == 0,
             "answers agree byte for byte");
    grpc_slice_unref(r.body);
    grpc_slice s = rpc_keys_request(RPC_KEYS_ADD, FILTER, m->key, k.n);
    size_t hl = hand_request(m->out, FILTER, m->key, k.n);
    check_ok(GRPC_SLICE_LENGTH(s) == hl &&
                 memcmp(GRPC_SLICE_START_PTR(s), m->out, hl) == 0,
             "requests agree byte for byte");
    grpc_slice_unref(s);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The p-quantile of v[0..n) (sorts v). */
static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[(int)(p * (n - 1) + 0.5)];
}

/* Median, p10, p90 of column col of a rounds x ncol table. */
static void spread(const double *t, int rounds, size_t ncol, size_t col, double out[3])
{
    double v[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        v[r] = t[(size_t)r * ncol + col];
    out[0] = pct(v, rounds, 0.5);
    out[1] = pct(v, rounds, 0.1);
    out[2] = pct(v, rounds, 0.9);
}

/* Median over rounds of t[col] / t[base]. */
static double ratio(const double *t, int rounds, size_t ncol, size_t col, size_t base)
{
    double v[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++)
        v[r] = t[(size_t)r * ncol + col] / t[(size_t)r * ncol + base];
    return pct(v, rounds, 0.5);
}

/* ns per call of fn, over iters calls. */
static double time_case(struct ctx *c, case_fn fn, long iters)
{
    double t0 = now_ns();
    for (long i = 0; i < iters; i++)
        fn(c);
    return (now_ns() - t0) / (double)iters;
}

static void run_size(size_t n, int rounds, double sample_ms, uint64_t *rng,
                     struct bf *f)
{
    struct msgset m;
    struct ctx c = {.m = &m, .f = f};
    struct rpc_reply rr = {.st.code = GRPC_STATUS_OK};
    long iters[NCASES];
    double *ns = calloc((size_t)rounds * NCASES, sizeof *ns), med[NCASES];

    check_ok(ns != NULL, "memory");
    msgset_init(&m, n, rng);
    rpc_arena_init(&c.arena, MAX_MESSAGE);
    cross_check(&c);
    check_ok(rpc_keys_decode(&c.reply_kb, &limits, RPC_KEYS_ADD, m.req, m.req_len,
                             &c.reply_k, &rr) == 0, "rpc_keys_decode");
    /* Calibrate: iterations for about sample_ms per sample. */
    for (size_t i = 0; i < NCASES; i++) {
        long it = 16;
        double t;
        while ((t = time_case(&c, cases[i].fn, it) * (double)it) < 1e5)
            it *= 4;
        iters[i] = (long)(sample_ms * 1e6 / (t / (double)it)) + 1;
    }
    for (int r = 0; r < rounds; r++) {
        for (size_t j = 0; j < NCASES; j++) {
            size_t i = (j + (size_t)r) % NCASES;
            ns[(size_t)r * NCASES + i] = time_case(&c, cases[i].fn, iters[i]);
        }
    }
    printf("\n%zu key%s of %d bytes: request %zu bytes, answer %zu bytes\n", n,
           n == 1 ? "" : "s", KEY_LEN, m.req_len, m.resp_len);
    printf("  %-8s %-36s %10s %10s %10s %8s %9s\n", "", "", "ns/msg", "p10", "p90",
           "vs", "ns/key");
    for (size_t i = 0; i < NCASES; i++) {
        double sv[3];
        char vs[16] = "";
        spread(ns, rounds, NCASES, i, sv);
        med[i] = sv[0];
        if (cases[i].base >= 0)
            snprintf(vs, sizeof vs, "%.2fx",
                     ratio(ns, rounds, NCASES, i, (size_t)cases[i].base));
        printf("  %-8s %-36s %10.1f %10.1f %10.1f %8s %9.2f\n", cases[i].group,
               cases[i].name, sv[0], sv[1], sv[2], vs, sv[0] / (double)n);
    }
    /* The handler's work with the codec in use: decode, hash and add, answer. */
    double work = med[0] + med[5] + med[12];
    printf("  of the handler's work (%.0f ns): protobuf-c + arena for the request "
           "would add %+.1f %%, the hand answer encoder save %.1f %%\n", work,
           100.0 * (med[1] - med[0]) / work, 100.0 * (med[5] - med[4]) / work);
    rpc_keys_buf_free(&c.kb);
    rpc_keys_buf_free(&c.reply_kb);
    rpc_arena_deinit(&c.arena);
    msgset_free(&m);
    free(ns);
}

/* ---- whole calls: the same handler with each codec, over loopback ---- */

enum call_codec { CODEC_BEFORE, CODEC_IN_USE, CODEC_PBC, NCODECS };

/* One server thread: the handlers share these. */
static struct bf *call_f;
static struct rpc_keys_buf call_kb;
static struct rpc_arena call_arena;
static struct bf_hash *call_h;
static bool *call_out;
static protobuf_c_boolean *call_wire;
static size_t call_cap;

static void call_room(size_t n)
{
    if (n <= call_cap)
        return;
    call_h = realloc(call_h, n * sizeof *call_h);
    call_out = realloc(call_out, n * sizeof *call_out);
    call_wire = realloc(call_wire, n * sizeof *call_wire);
    check_ok(call_h && call_out && call_wire, "memory");
    call_cap = n;
}

/* Hash and add the keys, answers into out. */
static void call_add(const struct rpc_keys *k, const ProtobufCBinaryData *key,
                     size_t n, bool *out)
{
    call_room(n ? n : 1);
    for (size_t i = 0; i < n; i++)
        call_h[i] = k ? bf_hash_key(call_f, k->key[i], k->len[i])
                      : bf_hash_key(call_f, key[i].data, key[i].len);
    bf_add_hashes(call_f, call_h, n, out);
}

/* Remove: the node before (hand decoder, hand encoder). */
static void h_before(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    struct rpc_keys k;
    (void)arg;
    if (rpc_keys_decode(&call_kb, &limits, RPC_KEYS_ADD, req, len, &k, r) < 0)
        return;
    call_add(&k, NULL, k.n, k.out);
    hand_bools(rpc_reply_alloc(r, hand_bools_size(k.n)), k.out, k.n);
}

/* Add: the codec in use. */
static void h_in_use(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    struct rpc_keys k;
    (void)arg;
    if (rpc_keys_decode(&call_kb, &limits, RPC_KEYS_ADD, req, len, &k, r) < 0)
        return;
    call_add(&k, NULL, k.n, k.out);
    rpc_keys_reply(&k, r);
}

/* MayContain: protobuf-c and the arena (the server checks the strings). */
static void h_pbc(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    Bloomgrid__V1__AddRequest *q = pbc_decode(&call_arena, req, len);
    call_add(NULL, q->keys, q->n_keys, call_out);
    call_room(q->n_keys ? q->n_keys : 1);
    for (size_t i = 0; i < q->n_keys; i++)
        call_wire[i] = call_out[i];
    Bloomgrid__V1__AddResponse m = BLOOMGRID__V1__ADD_RESPONSE__INIT;
    m.n_added = q->n_keys;
    m.added = call_wire;
    rpc_reply_pack(r, &m.base);
}

/* Descriptor order: Add, MayContain and Remove only. */
static const struct rpc_handler call_handlers[11] = {
    [4] = {.unary = h_in_use, .checks_strings = true},
    [5] = {.unary = h_pbc},
    [6] = {.unary = h_before, .checks_strings = true},
};

static const char *const call_method[NCODECS] = {
    [CODEC_BEFORE] = "/bloomgrid.v1.BloomGrid/Remove",
    [CODEC_IN_USE] = "/bloomgrid.v1.BloomGrid/Add",
    [CODEC_PBC] = "/bloomgrid.v1.BloomGrid/MayContain",
};
static const char *const call_name[NCODECS] = {"before", "in use", "protobuf-c"};
#define INFLIGHT 8

/* Sequential calls: the p50 latency in ns of ncalls calls. */
static double seq_p50(struct rpc_channel *ch, const char *method,
                      const struct msgset *m, int ncalls)
{
    double lat[256];
    for (int i = 0; i < ncalls; i++) {
        grpc_slice resp;
        struct rpc_status st;
        double t0 = now_ns();
        check_ok(rpc_call_raw(ch, method, m->req, m->req_len, &resp, 10000, &st) == 0,
                 method);
        lat[i] = now_ns() - t0;
        grpc_slice_unref(resp);
    }
    return pct(lat, ncalls, 0.5);
}

/* INFLIGHT calls at once, bursts times: ns per call. */
static double inflight_ns(struct rpc_channel *ch, const char *method,
                          const struct msgset *m, int bursts)
{
    struct rpc_multi calls[INFLIGHT];
    grpc_slice req = grpc_slice_from_copied_buffer((const char *)m->req, m->req_len);
    double t0 = now_ns();
    for (int b = 0; b < bursts; b++) {
        for (int i = 0; i < INFLIGHT; i++)
            calls[i] = (struct rpc_multi){.ch = ch, .method = method, .req = req,
                                          .timeout_ms = 10000};
        check_ok(rpc_call_many(calls, INFLIGHT) == 0, method);
        for (int i = 0; i < INFLIGHT; i++)
            grpc_slice_unref(calls[i].resp);
    }
    double t = (now_ns() - t0) / (double)(bursts * INFLIGHT);
    grpc_slice_unref(req);
    return t;
}

static void run_calls(int rounds, uint64_t *rng, struct bf *f)
{
    static const size_t sizes[] = {1, 100, 1000};
    struct rpc_server_config cfg = {.listen = "127.0.0.1:0", .threads = 1,
                                    .max_message = MAX_MESSAGE, .grace_ms = 100};
    struct rpc_server *srv = rpc_server_create(&cfg);
    char addr[64];

    call_f = f;
    rpc_arena_init(&call_arena, MAX_MESSAGE);
    check_ok(srv && rpc_server_add_service(srv, &bloomgrid__v1__bloom_grid__descriptor,
                                           call_handlers, NULL) == 0, "server");
    int port = rpc_server_start(srv);
    check_ok(port > 0, "server start");
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    struct rpc_channel *ch = rpc_channel_create(addr, MAX_MESSAGE);
    check_ok(ch != NULL, "channel");
    printf("\nWhole calls over loopback, one server thread; the handler hashes and "
           "adds into a 1 MiB filter\n");
    printf("  %5s  %-11s %11s %8s %8s %11s %15s %8s %8s %11s\n", "keys", "codec",
           "1 call: us", "p10", "p90", "vs before", "8 in flight: us", "p10", "p90",
           "vs before");
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        struct msgset m;
        size_t n = sizes[si];
        int ncalls = n >= 1000 ? 40 : 100, bursts = n >= 1000 ? 8 : 20;
        double *seq = calloc((size_t)rounds * NCODECS, sizeof *seq);
        double *inf = calloc((size_t)rounds * NCODECS, sizeof *inf);

        check_ok(seq && inf, "memory");
        msgset_init(&m, n, rng);
        for (int i = 0; i < NCODECS; i++)         /* warm up */
            seq_p50(ch, call_method[i], &m, 20);
        for (int r = 0; r < rounds; r++) {
            for (int j = 0; j < NCODECS; j++) {
                int i = (j + r) % NCODECS;
                seq[r * NCODECS + i] = seq_p50(ch, call_method[i], &m, ncalls) / 1e3;
                inf[r * NCODECS + i] = inflight_ns(ch, call_method[i], &m, bursts) / 1e3;
            }
        }
        for (int i = 0; i < NCODECS; i++) {
            double sv[3], iv[3];
            char vs1[16] = "", vs2[16] = "";
            spread(seq, rounds, NCODECS, (size_t)i, sv);
            spread(inf, rounds, NCODECS, (size_t)i, iv);
            if (i != CODEC_BEFORE) {
                snprintf(vs1, sizeof vs1, "%.3fx",
                         ratio(seq, rounds, NCODECS, (size_t)i, CODEC_BEFORE));
                snprintf(vs2, sizeof vs2, "%.3fx",
                         ratio(inf, rounds, NCODECS, (size_t)i, CODEC_BEFORE));
            }
            printf("  %5zu  %-11s %11.1f %8.1f %8.1f %11s %15.1f %8.1f %8.1f %11s\n", n,
                   call_name[i], sv[0], sv[1], sv[2], vs1, iv[0], iv[1], iv[2], vs2);
        }
        msgset_free(&m);
        free(seq);
        free(inf);
    }
    rpc_channel_destroy(ch);
    rpc_server_destroy(srv);
    rpc_keys_buf_free(&call_kb);
    rpc_arena_deinit(&call_arena);
    free(call_h);
    free(call_out);
    free(call_wire);
}

int main(int argc, char **argv)
{
    int rounds = 31, call_rounds = 15;
    double sample_ms = 2;
    uint8_t secret[BF_SECRET_LEN] = {7};
    char err[BF_ERRLEN];
    uint64_t rng = 0x9e3779b97f4a7c15ull;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (strcmp(argv[i], "--sample-ms") == 0 && i + 1 < argc)
            sample_ms = atof(argv[++i]);
        else if (strcmp(argv[i], "--call-rounds") == 0 && i + 1 < argc)
            call_rounds = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: bench_codec [--rounds N] [--sample-ms MS] "
                            "[--call-rounds N (0: none)]\n");
            return 2;
        }
    }
    if (rounds < 3 || rounds > MAX_ROUNDS || sample_ms <= 0 ||
        (call_rounds && (call_rounds < 3 || call_rounds > MAX_ROUNDS))) {
        fprintf(stderr, "bench_codec: --rounds and --call-rounds 3..%d, "
                        "--sample-ms > 0\n", MAX_ROUNDS);
        return 2;
    }
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = 800000,
                          .error_rate = 0.01, .secret = secret};
    bf_params_default(&p);
    struct bf *f = bf_create(&p, err);
    if (!f) {
        fprintf(stderr, "bench_codec: %s\n", err);
        return 1;
    }
    bf_set_exclusive(f, true);
    printf("bench_codec: %d rounds of %.1f ms per variant, alternating; median and "
           "10th/90th percentile over rounds\n", rounds, sample_ms);
    static const size_t sizes[] = {1, 100, 1000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        run_size(sizes[i], rounds, sample_ms, &rng, f);
    if (call_rounds) {
        grpc_init();
        run_calls(call_rounds, &rng, f);
        grpc_shutdown();
    }
    bf_destroy(f);
    return 0;
}
