/* Integration tests of input rules: a node and a router in front of it get
 * the same requests, byte for byte (built by hand, so they can carry what a
 * generated client would not: NUL bytes inside names, bad UTF-8), and must
 * give the same status and the same message, and change nothing.
 *
 *   same     names (NUL, bad UTF-8, a leading dot, too long, the longest
 *            valid name over 64 shards), parameters, kinds, capacity 2^64-1,
 *            keys to "F\0junk", Remove of no keys, a malformed key batch,
 *            Import and Export naming "F\0junk": node and router agree and
 *            nothing is written
 *   shards   internal calls on a node: DropShard with another secret drops
 *            nothing, with the right one drops; names with a NUL refused;
 *            a name has one shard count (CreateShard of shard 0 in the
 *            other form is ALREADY_EXISTS, also when both come at once)
 *   rollback a failed CreateFilter through the router drops the shards it
 *            created and never a shard of the same name with another secret;
 *            a filter whose shard 0 is gone can still be dropped
 *   stall    a node stopped (SIGSTOP) during CreateFilter: the caller gets
 *            an error naming what could not be dropped, the router stays
 *            up, and once the node is back a drop cleans up and a create
 *            succeeds
 *
 * usage: test_input NODE_BINARY ROUTER_BINARY (same|shards|rollback|stall)
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <xxhash.h>

#include "bloomgrid/v1/internal.pb-c.h"
#include "cluster.h"
#include "harness.h"

#define GS(c) GRPC_STATUS_##c
#define SVC "/bloomgrid.v1.BloomGrid/"
#define INT "/bloomgrid.v1.Internal/"

/* ---- hand-built messages ---- */

struct msg {
    uint8_t b[8192];
    size_t n;
};

static void put_varint(struct msg *m, uint64_t v)
{
    while (v >= 0x80) {
        m->b[m->n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    m->b[m->n++] = (uint8_t)v;
}

static void put_bytes(struct msg *m, unsigned field, const void *p, size_t len)
{
    CHECK(m->n + len + 16 < sizeof m->b, "message too long");
    put_varint(m, (uint64_t)field << 3 | 2);
    put_varint(m, len);
    memcpy(m->b + m->n, p, len);
    m->n += len;
}

static void put_uint(struct msg *m, unsigned field, uint64_t v)
{
    put_varint(m, (uint64_t)field << 3);
    put_varint(m, v);
}

static void put_double(struct msg *m, unsigned field, double d)
{
    put_varint(m, (uint64_t)field << 3 | 1);
    memcpy(m->b + m->n, &d, 8);
    m->n += 8;
}

static void put_fixed64(struct msg *m, unsigned field, uint64_t v)
{
    put_varint(m, (uint64_t)field << 3 | 1);
    for (int i = 0; i < 8; i++)
        m->b[m->n++] = (uint8_t)(v >> (8 * i));
}

/* CreateFilterRequest: name (len bytes), capacity, error_rate, kind, shards. */
static struct msg create_msg(const char *name, size_t len, uint64_t cap, double p,
                             int kind, unsigned shards)
{
    struct msg m = {.n = 0};
    put_bytes(&m, 1, name, len);
    put_uint(&m, 2, cap);
    put_double(&m, 3, p);
    if (kind)
        put_uint(&m, 4, (uint64_t)kind);
    if (shards)
        put_uint(&m, 5, shards);
    return m;
}

static struct msg name_msg(const char *name, size_t len)
{
    struct msg m = {.n = 0};
    put_bytes(&m, 1, name, len);
    return m;
}

/* AddRequest / MayContainRequest / RemoveRequest with nkeys keys k0, k1... */
static struct msg keys_msg(const char *filter, size_t flen, int nkeys)
{
    struct msg m = {.n = 0};
    put_bytes(&m, 1, filter, flen);
    for (int i = 0; i < nkeys; i++) {
        char k[16];
        int kl = snprintf(k, sizeof k, "k%d", i);
        put_bytes(&m, 2, k, (size_t)kl);
    }
    return m;
}

/* One unary call; returns the status code, st the message, *resp the
 * answer (unref'd here unless resp is given). */
static int call(struct rpc_channel *ch, const char *method, const struct msg *m,
                struct rpc_status *st, grpc_slice *resp)
{
    grpc_slice r;
    memset(st, 0, sizeof *st);
    if (rpc_call_raw(ch, method, m->b, m->n, &r, TIMEOUT_MS, st) == 0) {
        st->code = GRPC_STATUS_OK;
        if (resp)
            *resp = r;
        else
            grpc_slice_unref(r);
    }
    return st->code;
}

/* The packed bools of a key answer (field 1). */
static size_t answers(grpc_slice r, bool *out, size_t max)
{
    const uint8_t *p = GRPC_SLICE_START_PTR(r), *end = p + GRPC_SLICE_LENGTH(r);
    size_t n = 0;
    if (p < end && *p == 0x0a) {
        p++;
        size_t len = *p++;
        for (size_t i = 0; i < len && n < max && p < end; i++)
            out[n++] = *p++ != 0;
    }
    grpc_slice_unref(r);
    return n;
}

/* ---- nodes and a router in front of them ---- */

/* Start n nodes (one group each) and a router with the given node
 * deadline. */
static void start(struct cluster *c, int n, const char *tag, const char *timeout_ms)
{
    const char *const flags[] = {"--node-timeout-ms", timeout_ms,
                                 NULL};
    cluster_init(c, tag, "none");
    for (int i = 0; i < n; i++)
        cluster_node_start(c, i, 0, NULL);
    cluster_write_topo(c, n, false, NULL);
    cluster_router_start(c, 0, flags);
}

/* The same request to node and router: same code (want), same message. */
static void same(struct cluster *c, const char *what, const char *method,
                 const struct msg *m, int want)
{
    struct rpc_status a, b;
    int ca = call(c->node[0].ch, method, m, &a, NULL);
    int cb = call(c->router[0].ch, method, m, &b, NULL);
    CHECK(ca == want, "%s: node answered %s (%s), not %s", what, rpc_status_name(ca),
          a.message, rpc_status_name(want));
    CHECK(cb == want, "%s: router answered %s (%s), not %s", what,
          rpc_status_name(cb), b.message, rpc_status_name(want));
    CHECK(strcmp(a.message, b.message) == 0, "%s: node says \"%s\", router \"%s\"",
          what, a.message, b.message);
}

static int filters(struct rpc_channel *ch)
{
    struct msg m = {.n = 0};
    grpc_slice r;
    struct rpc_status st;
    CHECK(call(ch, SVC "ListFilters", &m, &st, &r) == 0, "list: %s", st.message);
    Bloomgrid__V1__ListFiltersResponse *lr = bloomgrid__v1__list_filters_response__unpack(
        NULL, GRPC_SLICE_LENGTH(r), GRPC_SLICE_START_PTR(r));
    grpc_slice_unref(r);
    CHECK(lr, "ListFiltersResponse");
    int n = (int)lr->n_filters;
    bloomgrid__v1__list_filters_response__free_unpacked(lr, NULL);
    return n;
}

static int import_named(struct rpc_channel *ch, const char *name, size_t len,
                        struct rpc_status *st)
{
    struct rpc_cstream *cs = rpc_cstream_open(ch, SVC "Import", TIMEOUT_MS);
    struct msg m = {.n = 0};
    CHECK(cs, "open Import");
    put_bytes(&m, 1, name, len);
    put_bytes(&m, 2, "BLOOMGRD", 8);
    rpc_cstream_write(cs, m.b, m.n);
    rpc_cstream_close_send(cs);
    grpc_slice out;
    while (rpc_cstream_read(cs, &out) == 1)
        grpc_slice_unref(out);
    memset(st, 0, sizeof *st);
    if (rpc_cstream_finish(cs, st) == 0)
        st->code = GRPC_STATUS_OK;
    return st->code;
}

static void test_same(void)
{
    struct cluster c;
    struct rpc_status st;
    char longest[129], toolong[130];
    struct msg m;

    start(&c, 1, "input-same", "5000");
    memset(longest, 'n', 128);
    longest[128] = 0;
    memset(toolong, 't', 129);
    toolong[129] = 0;

    m = create_msg("x\0y", 3, 1000, 0.01, 0, 1);
    same(&c, "NUL in a name", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = create_msg("caf\xc3", 4, 1000, 0.01, 0, 1);
    same(&c, "bad UTF-8", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = create_msg(".x", 2, 1000, 0.01, 0, 1);
    same(&c, "leading dot", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = create_msg(toolong, 129, 1000, 0.01, 0, 1);
    same(&c, "129-byte name", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = create_msg("a b", 3, 1000, 0.01, 0, 1);
    same(&c, "space in a name", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = create_msg("f.shard-1", 9, 1000, 0.01, 0, 1);
    same(&c, "shard suffix", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = create_msg("p", 1, 0, 0.01, 0, 1);
    same(&c, "capacity 0", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = create_msg("p", 1, 1000, 1.5, 0, 1);
    same(&c, "error_rate 1.5", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = create_msg("p", 1, 1000, 0.01, 9, 1);
    same(&c, "kind 9", SVC "CreateFilter", &m, GS(INVALID_ARGUMENT));
    m = name_msg("x\0y", 3);
    same(&c, "GetFilter with a NUL", SVC "GetFilter", &m, GS(INVALID_ARGUMENT));
    same(&c, "DropFilter with a NUL", SVC "DropFilter", &m, GS(INVALID_ARGUMENT));
    CHECK(filters(c.node[0].ch) == 0, "a refused create left a filter behind");

    /* The longest valid name works whatever the shard count. */
    m = create_msg(longest, 128, 1000, 0.01, 0, 1);
    CHECK(call(c.node[0].ch, SVC "CreateFilter", &m, &st, NULL) == 0,
          "node: 128-byte name: %s", st.message);
    longest[0] = 'm';
    m = create_msg(longest, 128, 100000, 0.01, 0, 64);
    CHECK(call(c.router[0].ch, SVC "CreateFilter", &m, &st, NULL) == 0,
          "router: 128-byte name over 64 shards: %s", st.message);
    CHECK(t_drop(c.router[0].ch, longest, &st) == 0, "drop: %s", st.message);

    /* Capacity 2^64-1: the router splits it without overflow and the
     * node's own refusal (too large) comes back, not "capacity 0". */
    m = create_msg("huge", 4, UINT64_MAX, 0.01, 0, 1);
    struct rpc_status a, b;
    int ca = call(c.node[0].ch, SVC "CreateFilter", &m, &a, NULL);
    m = create_msg("huge", 4, UINT64_MAX, 0.01, 0, 4);
    int cb = call(c.router[0].ch, SVC "CreateFilter", &m, &b, NULL);
    CHECK(ca != 0 && cb == ca, "capacity 2^64-1: node %s (%s), router %s (%s)",
          rpc_status_name(ca), a.message, rpc_status_name(cb), b.message);
    CHECK(!strstr(b.message, "capacity must be > 0") && strstr(b.message, "too large"),
          "router: %s", b.message);

    /* Keys to "F\0junk" never reach F. */
    CHECK(t_create(c.node[0].ch, "F", 1000, 0.01, 0, &st) == 0, "create F: %s",
          st.message);
    m = keys_msg("F\0junk", 6, 3);
    same(&c, "Add to F\\0junk", SVC "Add", &m, GS(INVALID_ARGUMENT));
    same(&c, "Remove from F\\0junk", SVC "Remove", &m, GS(INVALID_ARGUMENT));
    m = keys_msg("F", 1, 3);
    grpc_slice r;
    bool out[3] = {true, true, true};
    CHECK(call(c.router[0].ch, SVC "MayContain", &m, &st, &r) == 0, "query: %s",
          st.message);
    CHECK(answers(r, out, 3) == 3 && !out[0] && !out[1] && !out[2],
          "F got keys sent to F\\0junk");
    CHECK(import_named(c.node[0].ch, "F\0junk", 6, &a) == GS(INVALID_ARGUMENT),
          "node Import to F\\0junk: %s", a.message);
    CHECK(import_named(c.router[0].ch, "F\0junk", 6, &b) == GS(INVALID_ARGUMENT),
          "router Import to F\\0junk: %s", b.message);
    CHECK(strcmp(a.message, b.message) == 0, "Import: node \"%s\", router \"%s\"",
          a.message, b.message);

    /* Remove of no keys: refused on a kind without counters, both ways. */
    m = keys_msg("F", 1, 0);
    same(&c, "Remove of no keys (blocked)", SVC "Remove", &m,
         GS(FAILED_PRECONDITION));
    CHECK(t_create(c.node[0].ch, "C", 1000, 0.01, 3, &st) == 0, "create C: %s",
          st.message);
    m = keys_msg("C", 1, 0);
    same(&c, "Remove of no keys (counting)", SVC "Remove", &m, GS(OK));
    m = keys_msg("nosuch", 6, 0);
    same(&c, "Remove of no keys (missing)", SVC "Remove", &m, GS(NOT_FOUND));

    /* A key sent as a varint: malformed, at the same byte on both. */
    m = keys_msg("F", 1, 0);
    put_uint(&m, 2, 1);
    same(&c, "key as a varint", SVC "Add", &m, GS(INVALID_ARGUMENT));

    cluster_stop(&c);
}

/* ---- internal calls on a node ---- */

static int create_shard(struct rpc_channel *ch, const char *filter, unsigned index,
                        unsigned count, const uint8_t *secret, struct rpc_status *st)
{
    struct msg m = {.n = 0};
    put_bytes(&m, 1, filter, strlen(filter));
    put_uint(&m, 2, index);
    put_uint(&m, 3, count);
    put_uint(&m, 5, 1000);
    put_double(&m, 6, 0.01);
    put_bytes(&m, 7, secret, 32);
    return call(ch, INT "CreateShard", &m, st, NULL);
}

static int drop_shard(struct rpc_channel *ch, const char *filter, size_t flen,
                      unsigned index, uint64_t secret_id, struct rpc_status *st)
{
    struct msg m = {.n = 0};
    put_bytes(&m, 1, filter, flen);
    put_uint(&m, 2, index);
    if (secret_id)
        put_fixed64(&m, 3, secret_id);
    return call(ch, INT "DropShard", &m, st, NULL);
}

/* The secret of a shard (GetShard include_secret), or false when absent. */
static bool shard_secret(struct rpc_channel *ch, const char *filter, unsigned index,
                         uint8_t *secret)
{
    struct msg m = {.n = 0};
    struct rpc_status st;
    grpc_slice r;
    put_bytes(&m, 1, filter, strlen(filter));
    put_uint(&m, 2, index);
    put_uint(&m, 3, 1);
    put_uint(&m, 5, 2);   /* placement_known: versions 1 and 2 */
    if (call(ch, INT "GetShard", &m, &st, &r) != 0)
        return false;
    Bloomgrid__V1__InternalShardInfo *isi = bloomgrid__v1__internal_shard_info__unpack(
        NULL, GRPC_SLICE_LENGTH(r), GRPC_SLICE_START_PTR(r));
    grpc_slice_unref(r);
    CHECK(isi && isi->secret.len == 32, "GetShard answer");
    memcpy(secret, isi->secret.data, 32);
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    return true;
}


/* One CreateShard of a racing pair (forms). */
struct form_call {
    struct rpc_channel *ch;
    const char *name;
    unsigned count;
    uint8_t secret[32];
    pthread_barrier_t *go;
    int rc;
    struct rpc_status st;
};

static void *form_main(void *arg)
{
    struct form_call *f = arg;
    pthread_barrier_wait(f->go);
    f->rc = create_shard(f->ch, f->name, 0, f->count, f->secret, &f->st);
    return NULL;
}

/* A name has one shard count: a node holding shard 0 as "e" (one shard)
 * refuses shard 0 as "e.shard-0" (of three), and the other way round, also
 * when the two come at once. */
static void forms(struct rpc_channel *ch)
{
    struct rpc_status st;
    uint8_t s1[32], s2[32], got[32];
    memset(s1, 1, sizeof s1);
    memset(s2, 2, sizeof s2);
    CHECK(create_shard(ch, "e", 0, 1, s1, &st) == 0, "CreateShard e: %s", st.message);
    CHECK(create_shard(ch, "e", 0, 3, s2, &st) == GS(ALREADY_EXISTS),
          "shard 0 of 3 beside the filter of one: %s: %s", rpc_status_name(st.code),
          st.message);
    CHECK(strstr(st.message, "one shard count"), "message: %s", st.message);
    CHECK(shard_secret(ch, "e", 0, got) && memcmp(got, s1, 32) == 0,
          "the filter of one shard changed");
    CHECK(t_shard_count(ch, "e") == 1, "e has %d shards", t_shard_count(ch, "e"));
    CHECK(drop_shard(ch, "e", 1, 0, XXH3_64bits(s1, 32), &st) == 0, "DropShard e: %s",
          st.message);
    CHECK(create_shard(ch, "e", 0, 3, s2, &st) == 0, "CreateShard e.shard-0: %s",
          st.message);
    CHECK(create_shard(ch, "e", 0, 1, s1, &st) == GS(ALREADY_EXISTS),
          "a filter of one shard beside shard 0 of 3: %s: %s", rpc_status_name(st.code),
          st.message);
    CHECK(shard_secret(ch, "e", 0, got) && memcmp(got, s2, 32) == 0,
          "shard 0 of 3 changed");

    for (int i = 0; i < 12; i++) {
        char name[16];
        pthread_barrier_t go;
        struct form_call f[2];
        pthread_t th[2];
        snprintf(name, sizeof name, "race%d", i);
        pthread_barrier_init(&go, NULL, 2);
        for (int k = 0; k < 2; k++) {
            memset(&f[k], 0, sizeof f[k]);
            f[k].ch = ch;
            f[k].name = name;
            f[k].count = k ? 3 : 1;
            memset(f[k].secret, 10 + k, sizeof f[k].secret);
            f[k].go = &go;
            CHECK(pthread_create(&th[k], NULL, form_main, &f[k]) == 0, "pthread_create");
        }
        for (int k = 0; k < 2; k++)
            pthread_join(th[k], NULL);
        pthread_barrier_destroy(&go);
        int won = (f[0].rc == 0) + (f[1].rc == 0);
        int refused = (f[0].rc == GS(ALREADY_EXISTS)) + (f[1].rc == GS(ALREADY_EXISTS));
        CHECK(won == 1 && refused == 1, "%s at once: %s (%s) and %s (%s)", name,
              rpc_status_name(f[0].st.code), f[0].st.message,
              rpc_status_name(f[1].st.code), f[1].st.message);
        CHECK(t_shard_count(ch, name) == 1, "%s: %d shards after the race", name,
              t_shard_count(ch, name));
    }
}

static void test_shards(void)
{
    struct cluster c;
    struct rpc_status st;
    uint8_t s1[32], got[32];

    start(&c, 1, "input-shards", "5000");
    memset(s1, 7, sizeof s1);
    CHECK(create_shard(c.node[0].ch, "d", 2, 4, s1, &st) == 0, "CreateShard: %s",
          st.message);
    uint64_t id1 = XXH3_64bits(s1, 32);
    CHECK(drop_shard(c.node[0].ch, "d", 1, 2, id1 + 1, &st) == GS(FAILED_PRECONDITION),
          "DropShard with another secret: %s", rpc_status_name(st.code));
    CHECK(shard_secret(c.node[0].ch, "d", 2, got) && memcmp(got, s1, 32) == 0,
          "the shard went away with another secret named");
    CHECK(drop_shard(c.node[0].ch, "d\0x", 3, 2, id1, &st) == GS(INVALID_ARGUMENT),
          "DropShard d\\0x: %s", rpc_status_name(st.code));
    CHECK(shard_secret(c.node[0].ch, "d", 2, got), "d\\0x dropped d");
    CHECK(drop_shard(c.node[0].ch, "d", 1, 2, id1, &st) == 0, "DropShard: %s",
          st.message);
    CHECK(!shard_secret(c.node[0].ch, "d", 2, got), "shard still there");
    CHECK(drop_shard(c.node[0].ch, "d", 1, 2, 0, &st) == GS(NOT_FOUND), "drop twice");
    forms(c.node[0].ch);
    cluster_stop(&c);
}

/* ---- CreateFilter rollback ---- */

static void test_rollback(void)
{
    struct cluster c;
    struct rpc_status st;
    uint8_t other[32], got[32];

    start(&c, 2, "input-rollback", "5000");
    /* Another call's shard 5 of "dup" (8 shards), with its own secret, on
     * whichever node the router places shard 5. */
    memset(other, 0x5a, sizeof other);
    for (int i = 0; i < 2; i++)
        CHECK(create_shard(c.node[i].ch, "dup", 5, 8, other, &st) == 0,
              "CreateShard: %s", st.message);
    struct msg m = create_msg("dup", 3, 8000, 0.01, 0, 8);
    CHECK(call(c.router[0].ch, SVC "CreateFilter", &m, &st, NULL) == GS(ALREADY_EXISTS),
          "CreateFilter over an existing shard: %s (%s)", rpc_status_name(st.code),
          st.message);
    CHECK(strstr(st.message, "were dropped"), "message: %s", st.message);
    for (int i = 0; i < 2; i++) {
        CHECK(shard_secret(c.node[i].ch, "dup", 5, got) && memcmp(got, other, 32) == 0,
              "node %d: the other call's shard was dropped by the rollback", i);
        int n = t_shard_count(c.node[i].ch, "dup");
        CHECK(n == 1, "node %d holds %d shards of dup after the rollback", i, n);
    }
    CHECK(node_health(&c.router[0], "") == 1, "router not serving");

    /* A filter whose shard 0 is gone can still be dropped: the router
     * sweeps up the other shards of that name. */
    m = create_msg("half", 4, 8000, 0.01, 0, 8);
    CHECK(call(c.router[0].ch, SVC "CreateFilter", &m, &st, NULL) == 0, "create half: %s",
          st.message);
    for (int i = 0; i < 2; i++)
        drop_shard(c.node[i].ch, "half", 4, 0, 0, &st);
    CHECK(t_shard_count(c.node[0].ch, "half") + t_shard_count(c.node[1].ch, "half") == 7,
          "shard 0 of half not dropped");
    CHECK(t_drop(c.router[0].ch, "half", &st) == 0, "drop of a filter without shard 0: %s",
          st.message);
    CHECK(t_shard_count(c.node[0].ch, "half") + t_shard_count(c.node[1].ch, "half") == 0,
          "shards of half left behind");
    CHECK(t_drop(c.router[0].ch, "half", &st) == GS(NOT_FOUND), "drop twice: %s",
          st.message);
    cluster_stop(&c);
}

/* ---- a node stopped during CreateFilter ---- */

static void test_stall(void)
{
    struct cluster c;
    struct rpc_status st;

    start(&c, 2, "input-stall", "1000");
    CHECK(harness_sigstop(c.node[1].pid) == 0, "SIGSTOP");
    struct msg m = create_msg("victim", 6, 1000, 0.01, 0, 4);
    int code = call(c.router[0].ch, SVC "CreateFilter", &m, &st, NULL);
    CHECK(code == GS(UNAVAILABLE) || code == GS(DEADLINE_EXCEEDED),
          "create with a stopped node: %s (%s)", rpc_status_name(code), st.message);
    CHECK(strstr(st.message, "could not be dropped") && strstr(st.message, c.node[1].addr),
          "the message names what is left: %s", st.message);
    CHECK(node_health(&c.router[0], "") == 1, "router not serving after the failure");
    /* The shards on the running node are gone already. */
    CHECK(t_shard_count(c.node[0].ch, "victim") == 0, "node 0 keeps shards of victim");
    CHECK(kill(c.node[1].pid, SIGCONT) == 0, "SIGCONT");
    /* Whatever the stopped node did with the calls it got late, a drop
     * cleans up and the name can be used again. */
    sleep(2);
    int d = t_drop(c.router[0].ch, "victim", &st);
    CHECK(d == 0 || d == GS(NOT_FOUND), "drop victim: %s", st.message);
    CHECK(t_shard_count(c.node[1].ch, "victim") == 0, "node 1 keeps shards of victim");
    CHECK(call(c.router[0].ch, SVC "CreateFilter", &m, &st, NULL) == 0,
          "create again: %s", st.message);
    cluster_stop(&c);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s NODE_BINARY ROUTER_BINARY "
                        "(same|shards|rollback|stall)\n", argv[0]);
        return 2;
    }
    harness_node_bin = argv[1];
    harness_router_bin = argv[2];
    grpc_init();
    if (strcmp(argv[3], "same") == 0)
        test_same();
    else if (strcmp(argv[3], "shards") == 0)
        test_shards();
    else if (strcmp(argv[3], "rollback") == 0)
        test_rollback();
    else if (strcmp(argv[3], "stall") == 0)
        test_stall();
    else {
        fprintf(stderr, "unknown scenario %s\n", argv[3]);
        return 2;
    }
    grpc_shutdown();
    printf("ok %s\n", argv[3]);
    return 0;
}
