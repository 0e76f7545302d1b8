/* Tests of store_keys_since: the keys' hashes of a filter's log records
 * after a puller's cursor, the answer to a pull instead of pages when every
 * record there is an add still in the log and the keys weigh less than the
 * pages changed.  A puller that adds them ends with the filter's bits; a
 * merge of pages, an import, a cursor older than the log or keys heavier
 * than the pages make it answer 1 (pages); the keys come in bounded chunks,
 * a record split across two when it must be. */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf.h"
#include "log.h"
#include "rules.h"
#include "store.h"
#include "store_internal.h"
#include "unit_hashes.h"
#include "unit_tmpdir.h"

static char tdir[4096];

static void setup(void)
{
    log_set_level(LOG_LEVEL_WARN);
    unit_tmpdir_make(tdir, sizeof(tdir), "store-keys");
}

static void teardown(void)
{
    unit_tmpdir_remove(tdir);
}

static struct store *open_store(void)
{
    struct store_options o = {.dir = tdir, .durability = STORE_DURABLE_FSYNC};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);

    ck_assert_msg(s != NULL, "store_open: %s", err);
    return s;
}

static const uint8_t secret[BF_SECRET_LEN] = {9, 1, 9};

static struct bf_params params(uint64_t capacity)
{
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = capacity,
                          .error_rate = 0.01, .secret = secret};
    bf_params_default(&p);
    return p;
}

static struct store_filter *create(struct store *s, uint64_t capacity)
{
    struct bf_params p = params(capacity);
    char err[STORE_ERRLEN];

    ck_assert_msg(store_create(s, "f", &p, err) == 0, "create: %s", err);
    return store_get(s, "f");
}

/* Keys [base, base + n) added in batches of batch (one record each). */
static void add_range(struct store_filter *sf, uint64_t base, size_t n,
                      size_t batch)
{
    struct bf_hash *h = malloc(batch * sizeof *h);
    char err[STORE_ERRLEN];

    ck_assert_ptr_nonnull(h);
    for (size_t i = 0; i < n; i += batch) {
        size_t m = n - i < batch ? n - i : batch;
        for (size_t j = 0; j < m; j++)
            h[j] = unit_hash_of(base + i + j);
        ck_assert_msg(store_add_hashes(sf, h, m, NULL, err) == 0, "add: %s", err);
    }
    free(h);
}

/* What a puller got. */
struct got {
    struct bf_hash *v;
    size_t n, cap;
    size_t calls, most;   /* callbacks, and the most keys one brought */
};

static int take_keys(void *ctx, const struct bf_hash *h, size_t n)
{
    struct got *g = ctx;

    if (g->n + n > g->cap) {
        g->cap = (g->n + n) * 2;
        g->v = realloc(g->v, g->cap * sizeof *g->v);
        ck_assert_ptr_nonnull(g->v);
    }
    memcpy(g->v + g->n, h, n * sizeof *h);
    g->n += n;
    g->calls++;
    if (n > g->most)
        g->most = n;
    return 0;
}

/* ORs every page walked into a blank filter of the same geometry. */
static int or_page(void *ctx, const struct store_page *pg)
{
    struct bf *into = ctx;
    uint64_t *body = bf_layer_body(into, 0) + pg->offset / 8;
    const uint64_t *d = pg->data;

    for (size_t i = 0; i < pg->len / 8; i++)
        body[i] |= d[i];
    return 0;
}

static struct bf *blank(uint64_t capacity)
{
    struct bf_params p = params(capacity);
    struct bf *f = bf_create(&p, NULL);

    ck_assert_ptr_nonnull(f);
    return f;
}

/* The filter's bits now, as a full page pull gives them. */
static struct bf *bits_of(struct store_filter *sf, uint64_t capacity)
{
    struct bf *f = blank(capacity);
    struct store_pages_mark m;
    char err[STORE_ERRLEN];

    ck_assert_msg(store_pages_since(sf, 0, 0, or_page, f, &m, err) == 0, "%s", err);
    return f;
}

static bool same_bits(const struct bf *a, const struct bf *b)
{
    struct bf_layer_info la, lb;

    ck_assert_int_eq(bf_layer_info(a, 0, &la), 0);
    ck_assert_int_eq(bf_layer_info(b, 0, &lb), 0);
    return la.body_bytes == lb.body_bytes &&
           memcmp(bf_layer_body_const(a, 0), bf_layer_body_const(b, 0),
                  la.body_bytes) == 0;
}

/* A puller that had the filter at a cursor and adds the keys since ends
 * with the filter's bits, bit for bit; the keys are exactly those added,
 * in order, and fewer bytes than the pages they stand for. */
START_TEST(keys_since_bring_a_copy_level)
{
    const uint64_t cap = 1000000;
    struct store *s = open_store();
    struct store_filter *sf = create(s, cap);
    struct store_pages_mark m0, mk, mp;
    struct got g = {0};
    char err[STORE_ERRLEN];

    add_range(sf, 0, 3000, 500);
    struct bf *copy = blank(cap);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, or_page, copy, &m0, err), 0);
    add_range(sf, 3000, 700, 100);
    ck_assert_msg(store_keys_since(sf, m0.epoch, m0.version, take_keys, &g, &mk,
                                   err) == 0, "keys_since: %s", err);
    ck_assert_uint_eq(g.n, 700);
    ck_assert_uint_eq(mk.keys, 700);
    ck_assert_uint_eq(mk.bytes, 700 * 16);
    for (size_t i = 0; i < g.n; i++) {
        struct bf_hash want = unit_hash_of(3000 + i);
        ck_assert(g.v[i].h1 == want.h1 && g.v[i].h2 == want.h2);
    }
    ck_assert_uint_eq(mk.epoch, m0.epoch);
    ck_assert_uint_eq(mk.version, m0.version + 7);   /* seven records */
    ck_assert_uint_eq(mk.store_version, store_filter_version(sf));
    /* The pages that would have gone instead weigh more. */
    ck_assert_int_eq(store_pages_since(sf, m0.epoch, m0.version, NULL, NULL, &mp,
                                       err), 0);
    ck_assert_uint_gt(mp.bytes, mk.bytes);
    bf_add_hashes(copy, g.v, g.n, NULL);
    struct bf *now = bits_of(sf, cap);
    ck_assert(same_bits(copy, now));

    /* Nothing since: no key, answered; the next range starts there. */
    struct got none = {0};
    ck_assert_int_eq(store_keys_since(sf, mk.epoch, mk.version, take_keys, &none,
                                      &mk, err), 0);
    ck_assert_uint_eq(none.n, 0);
    /* No cursor, or another epoch: pages. */
    ck_assert_int_eq(store_keys_since(sf, 0, 0, take_keys, &none, &mk, err), 1);
    ck_assert_int_eq(store_keys_since(sf, m0.epoch + 1, m0.version, take_keys,
                                      &none, &mk, err), 1);
    ck_assert_uint_eq(none.n, 0);
    free(g.v);
    bf_destroy(copy);
    bf_destroy(now);
    store_put(sf);
    store_close(s);
}
END_TEST

/* The first non-zero page of f's bits. */
static struct store_page first_page(struct bf *f)
{
    struct bf_layer_info li;

    ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
    for (uint64_t off = 0; off < li.body_bytes; off += RULES_PAGE_BYTES) {
        size_t len = li.body_bytes - off < RULES_PAGE_BYTES
                         ? (size_t)(li.body_bytes - off) : RULES_PAGE_BYTES;
        const uint64_t *w = bf_layer_body(f, 0) + off / 8;
        for (size_t i = 0; i < len / 8; i++)
            if (w[i])
                return (struct store_page){.layer = 0, .offset = off,
                                           .data = w, .len = len};
    }
    ck_abort_msg("no bit set");
    return (struct store_page){0};
}

/* A merge of pages or an import in the range: pages (nothing given to
 * the callback); a cursor after it: keys again. */
START_TEST(keys_since_not_over_merges_or_imports)
{
    const uint64_t cap = 1000000;
    struct store *s = open_store();
    struct store_filter *sf = create(s, cap);
    struct store_pages_mark m0, m1, mk;
    struct got g = {0};
    char err[STORE_ERRLEN];

    add_range(sf, 0, 1000, 100);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m0, err), 0);
    add_range(sf, 1000, 100, 100);
    /* A page ORed in from a peer. */
    struct bf *src = blank(cap);
    struct bf_hash h = unit_hash_of(999999);
    bf_add_hashes(src, &h, 1, NULL);
    struct store_page pg = first_page(src);
    ck_assert_int_eq(store_or_pages(sf, &pg, 1, err), 0);
    add_range(sf, 1100, 100, 100);
    ck_assert_int_eq(store_keys_since(sf, m0.epoch, m0.version, take_keys, &g, &mk,
                                      err), 1);
    ck_assert_msg(strstr(err, "not an add"), "why: %s", err);
    ck_assert_uint_eq(g.n, 0);
    /* After the merge: adds only again. */
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m1, err), 0);
    add_range(sf, 1200, 100, 100);
    ck_assert_int_eq(store_keys_since(sf, m1.epoch, m1.version, take_keys, &g, &mk,
                                      err), 0);
    ck_assert_uint_eq(g.n, 100);
    /* An import in the range. */
    ck_assert_int_eq(store_import(sf, src, err), 0);
    add_range(sf, 1300, 100, 100);
    g.n = 0;
    ck_assert_int_eq(store_keys_since(sf, mk.epoch, mk.version, take_keys, &g, &mk,
                                      err), 1);
    ck_assert_uint_eq(g.n, 0);
    free(g.v);
    bf_destroy(src);
    store_put(sf);
    store_close(s);
}
END_TEST

/* A cursor older than the log (the records after it went with a
 * checkpoint): pages; a cursor after that checkpoint: keys, read from
 * the checkpoint's LSN on. */
START_TEST(keys_since_not_before_the_log)
{
    const uint64_t cap = 1000000;
    struct store *s = open_store();
    struct store_filter *sf = create(s, cap);
    struct store_pages_mark m0, m1, mk;
    struct got g = {0};
    char err[STORE_ERRLEN];

    add_range(sf, 0, 1000, 100);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m0, err), 0);
    add_range(sf, 1000, 500, 100);
    /* Still in the log: keys. */
    ck_assert_int_eq(store_keys_since(sf, m0.epoch, m0.version, take_keys, &g, &mk,
                                      err), 0);
    ck_assert_uint_eq(g.n, 500);
    ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
    wal_rotate(s->wal);
    ck_assert_msg(store__filter_checkpoint(sf, STORE_CKPT_ADVANCE, err) == 0, "%s", err);
    ck_assert_int_eq(store__discard_log(s, false), 0);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m1, err), 0);
    add_range(sf, 1500, 300, 100);
    g.n = 0;
    ck_assert_int_eq(store_keys_since(sf, m0.epoch, m0.version, take_keys, &g, &mk,
                                      err), 1);
    ck_assert_msg(strstr(err, "not in the log") || strstr(err, "no longer"),
                  "why: %s", err);
    ck_assert_uint_eq(g.n, 0);
    ck_assert_int_eq(store_keys_since(sf, m1.epoch, m1.version, take_keys, &g, &mk,
                                      err), 0);
    ck_assert_uint_eq(g.n, 300);
    free(g.v);
    store_put(sf);
    store_close(s);
}
END_TEST

/* Keys heavier than the pages changed: pages. */
START_TEST(keys_since_not_when_pages_are_smaller)
{
    const uint64_t cap = 2000;   /* one page of bits */
    struct store *s = open_store();
    struct store_filter *sf = create(s, cap);
    struct store_pages_mark m0, mk;
    struct got g = {0};
    char err[STORE_ERRLEN];

    add_range(sf, 0, 10, 10);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m0, err), 0);
    add_range(sf, 10, 2000, 500);   /* 32 000 bytes of keys */
    struct bf *b = bits_of(sf, cap);
    ck_assert_int_le(bf_bytes(b), 32000);
    bf_destroy(b);
    ck_assert_int_eq(store_keys_since(sf, m0.epoch, m0.version, take_keys, &g, &mk,
                                      err), 1);
    ck_assert_uint_eq(g.n, 0);
    free(g.v);
    store_put(sf);
    store_close(s);
}
END_TEST

/* A range larger than a chunk comes in chunks of at most
 * STORE_KEYS_CHUNK keys, records split across chunks where they must be,
 * every key once and in order. */
START_TEST(keys_since_in_bounded_chunks)
{
    const uint64_t cap = 20000000;
    const size_t n = STORE_KEYS_CHUNK * 2 + 1234;
    struct store *s = open_store();
    struct store_filter *sf = create(s, cap);
    struct store_pages_mark m0, mk;
    struct got g = {0};
    char err[STORE_ERRLEN];

    add_range(sf, 0, 10, 10);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m0, err), 0);
    add_range(sf, 10, n, 5000);   /* records straddle the chunks' edges */
    ck_assert_msg(store_keys_since(sf, m0.epoch, m0.version, take_keys, &g, &mk,
                                   err) == 0, "%s", err);
    ck_assert_uint_eq(g.n, n);
    ck_assert_uint_ge(g.calls, 3);
    ck_assert_uint_le(g.most, STORE_KEYS_CHUNK);
    for (size_t i = 0; i < n; i++) {
        struct bf_hash want = unit_hash_of(10 + i);
        ck_assert_msg(g.v[i].h1 == want.h1 && g.v[i].h2 == want.h2, "key %zu", i);
    }
    free(g.v);
    store_put(sf);
    store_close(s);
}
END_TEST

/* ---- what a keyed pull reads of a log shared with other shards ---- */

/* A store whose own thread neither checkpoints nor discards during a test
 * (a long interval, a large bound): the log holds everything written.
 * Durability none: many records, no fsync each. */
static struct store *open_store_quiet(void)
{
    struct store_options o = {.dir = tdir, .durability = STORE_DURABLE_NONE,
                              .snapshot_interval_ms = 3600000,
                              .snapshot_wal_bytes = UINT64_C(1) << 30,
                              .checkpoint_log_percent = 100000};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);

    ck_assert_msg(s != NULL, "store_open: %s", err);
    return s;
}

static struct store_filter *create_named(struct store *s, const char *name,
                                         uint64_t capacity)
{
    struct bf_params p = params(capacity);
    char err[STORE_ERRLEN];

    ck_assert_msg(store_create(s, name, &p, err) == 0, "create %s: %s", name,
                  err);
    return store_get(s, name);
}

static uint64_t rescan_bytes(struct store *s)
{
    struct wal_stats st;

    wal_stats(s->wal, &st);
    return st.rescan_bytes;
}

#define OTHERS 4
#define OTHER_CAP 4000000   /* about 4.8 MB of bits each */

/* Other shards' traffic: an import of a filled filter into each (one
 * large record each) when import, and n keys added to each in records of
 * batch keys.  Returns the bytes of the log it wrote. */
static uint64_t others_write(struct store *s, struct store_filter **o,
                             uint64_t base, bool import, size_t n,
                             size_t batch)
{
    uint64_t before = wal_bytes(s->wal);
    char err[STORE_ERRLEN];

    for (int i = 0; i < OTHERS; i++) {
        if (import) {
            struct bf *src = blank(OTHER_CAP);
            struct bf_hash h[1000];
            for (uint64_t j = 0; j < 200; j++) {
                for (int k = 0; k < 1000; k++)
                    h[k] = unit_hash_of(base + (uint64_t)i * 1000000 + j * 1000 +
                                        (uint64_t)k);
                bf_add_hashes(src, h, 1000, NULL);
            }
            ck_assert_msg(store_import(o[i], src, err) == 0, "import: %s", err);
            bf_destroy(src);
        }
        add_range(o[i], base + 500000 + (uint64_t)i * 1000000, n, batch);
    }
    return wal_bytes(s->wal) - before;
}

/* A keyed pull of one shard reads that shard's part of the log, not the
 * log: with tens of MB of other shards' records (imports and adds) in the
 * log, before and after the puller's cursor, the pull since that cursor
 * reads a small part of them and gets exactly the keys added since.  A
 * cursor with more of the log after it than the bound allows (thousands
 * of other records): pages, with no byte of the log read, and the pages
 * bring the copy level as well. */
START_TEST(keys_since_reads_the_shards_changes)
{
    const uint64_t cap = 200000;   /* 4 pages of 64 KiB */
    struct store *s = open_store_quiet();
    struct store_filter *x = create_named(s, "x", cap), *o[OTHERS];
    struct store_pages_mark m0, m1, mk, mp;
    struct got g = {0};
    char err[STORE_ERRLEN], name[16];

    for (int i = 0; i < OTHERS; i++) {
        snprintf(name, sizeof name, "o%d", i);
        o[i] = create_named(s, name, OTHER_CAP);
    }
    add_range(x, 0, 2000, 100);
    struct bf *copy0 = blank(cap), *copy1 = blank(cap);
    ck_assert_int_eq(store_pages_since(x, 0, 0, or_page, copy0, &m0, err), 0);
    /* 4 imports and 16 000 records of 5 keys */
    uint64_t other = others_write(s, o, 10000000, true, 20000, 5);
    add_range(x, 2000, 100, 100);
    ck_assert_int_eq(store_pages_since(x, 0, 0, or_page, copy1, &m1, err), 0);
    /* 40 records of 1 000 keys */
    other += others_write(s, o, 20000000, false, 10000, 1000);
    add_range(x, 2100, 300, 100);   /* three records of x */
    ck_assert_uint_ge(other, UINT64_C(20) << 20);

    /* Since the recent cursor: the three records' keys, and a small part
     * of the other shards' bytes read. */
    uint64_t r0 = rescan_bytes(s);
    ck_assert_msg(store_keys_since(x, m1.epoch, m1.version, take_keys, &g, &mk,
                                   err) == 0, "keys_since: %s", err);
    uint64_t read = rescan_bytes(s) - r0;
    ck_assert_uint_eq(g.n, 300);
    for (size_t i = 0; i < g.n; i++) {
        struct bf_hash want = unit_hash_of(2100 + i);
        ck_assert(g.v[i].h1 == want.h1 && g.v[i].h2 == want.h2);
    }
    ck_assert_msg(read * 128 < other, "a pull of 300 keys read %" PRIu64
                  " bytes of the log; the other shards wrote %" PRIu64,
                  read, other);
    bf_add_hashes(copy1, g.v, g.n, NULL);
    struct bf *now = bits_of(x, cap);
    ck_assert(same_bits(copy1, now));

    /* Since the old cursor, 16 000 records of the others after it: pages,
     * the log not read; the pages bring that copy level. */
    g.n = 0;
    r0 = rescan_bytes(s);
    ck_assert_int_eq(store_keys_since(x, m0.epoch, m0.version, take_keys, &g,
                                      &mk, err), 1);
    ck_assert_msg(strstr(err, "more to read than"), "why: %s", err);
    ck_assert_uint_eq(rescan_bytes(s) - r0, 0);
    ck_assert_uint_eq(g.n, 0);
    ck_assert_int_eq(store_pages_since(x, m0.epoch, m0.version, or_page, copy0,
                                       &mp, err), 0);
    ck_assert(same_bits(copy0, now));

    free(g.v);
    bf_destroy(copy0);
    bf_destroy(copy1);
    bf_destroy(now);
    for (int i = 0; i < OTHERS; i++)
        store_put(o[i]);
    store_put(x);
    store_close(s);
}
END_TEST

Suite *store_keys_suite(void)
{
    Suite *s = suite_create("store_keys");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, keys_since_bring_a_copy_level);
    tcase_add_test(tc, keys_since_not_over_merges_or_imports);
    tcase_add_test(tc, keys_since_not_before_the_log);
    tcase_add_test(tc, keys_since_not_when_pages_are_smaller);
    tcase_add_test(tc, keys_since_in_bounded_chunks);
    tcase_add_test(tc, keys_since_reads_the_shards_changes);
    suite_add_tcase(s, tc);
    return s;
}
