/* Tests of store_or_pages: pages ORed in durably (WAL_REC_PAGES), checked
 * against the geometry before any bit changes, idempotent, replayed after a
 * restart.  And of the change tracking (store_pages_since, _merge): pages
 * reported since a version, merged pages not reported back, a fresh epoch
 * for a filter created again under the same name, the tracking freed with
 * its filter (the leak checker of sanitized builds sees it otherwise). */
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <xxhash.h>

#include "bf.h"
#include "log.h"
#include "rules.h"
#include "store.h"
#include "unit_tmpdir.h"

static char tdir[4096];

static void setup(void)
{
    log_set_level(LOG_LEVEL_WARN);
    unit_tmpdir_make(tdir, sizeof(tdir), "store-pages");
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

static const uint8_t secret[BF_SECRET_LEN] = {7, 7, 7};

static struct bf_params params(enum bf_kind kind)
{
    struct bf_params p = {.kind = kind, .capacity = 100000,
                          .error_rate = 0.01, .secret = secret};
    bf_params_default(&p);
    return p;
}

/* A filter like the store's with keys [base, base+n) added. */
static struct bf *source_with_keys(enum bf_kind kind, int base, int n)
{
    struct bf_params p = params(kind);
    struct bf *f = bf_create(&p, NULL);

    ck_assert_ptr_nonnull(f);
    for (int i = base; i < base + n; i++) {
        char key[32];
        int len = snprintf(key, sizeof key, "key-%d", i);
        bf_add(f, key, (size_t)len);
    }
    return f;
}

/* Every page of src's body as store pages of page bytes. */
static size_t pages_of(struct bf *src, size_t page, struct store_page *out,
                       size_t max)
{
    struct bf_layer_info li;
    size_t n = 0;

    ck_assert_int_eq(bf_layer_info(src, 0, &li), 0);
    for (uint64_t off = 0; off < li.body_bytes && n < max; off += page) {
        uint64_t len = li.body_bytes - off < page ? li.body_bytes - off : page;
        out[n++] = (struct store_page){.layer = 0, .offset = off,
                                       .data = (uint8_t *)bf_layer_body(src, 0) + off,
                                       .len = (size_t)len};
    }
    return n;
}

static bool has_keys(struct store_filter *sf, const struct bf *like, int base,
                     int n)
{
    for (int i = base; i < base + n; i++) {
        char key[32];
        int len = snprintf(key, sizeof key, "key-%d", i);
        struct bf_hash h = bf_hash_key(like, key, (size_t)len);
        bool present = false;
        ck_assert_int_eq(store_may_contain_hashes(sf, &h, 1, &present), 0);
        if (!present)
            return false;
    }
    return true;
}

START_TEST(or_pages_is_durable_and_replayed)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *src = source_with_keys(BF_KIND_BLOCKED, 0, 5000);
    struct store_page pg[64];
    char err[STORE_ERRLEN];

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    uint64_t v0 = store_filter_version(sf);
    size_t n = pages_of(src, 16384, pg, 64);
    ck_assert_int_eq(store_or_pages(sf, pg, n, err), 0);
    ck_assert_uint_gt(store_filter_version(sf), v0);
    ck_assert(has_keys(sf, src, 0, 5000));
    /* Idempotent: again changes no answer. */
    ck_assert_int_eq(store_or_pages(sf, pg, n, err), 0);
    ck_assert(has_keys(sf, src, 0, 5000));
    store_put(sf);
    store_close(s);

    s = open_store();
    sf = store_get(s, "f");
    ck_assert(has_keys(sf, src, 0, 5000));
    store_put(sf);
    store_close(s);
    bf_destroy(src);
}
END_TEST

/* Pages whose bits the filter holds already are not logged again: a
 * second merge of the same pages adds nothing to the log, and a merge where
 * one page of many adds a bit logs about one page. */
START_TEST(or_pages_logs_only_pages_that_add_bits)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *src = source_with_keys(BF_KIND_BLOCKED, 0, 5000);
    struct store_page pg[64];
    char err[STORE_ERRLEN];
    const size_t page = 4096;

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    size_t n = pages_of(src, page, pg, 64);
    ck_assert_uint_ge(n, 8);
    uint64_t l0 = store_log_bytes(s);
    ck_assert_int_eq(store_or_pages(sf, pg, n, err), 0);
    uint64_t l1 = store_log_bytes(s);
    ck_assert_uint_ge(l1 - l0, (uint64_t)(n - 1) * page);
    uint64_t v1 = store_filter_version(sf);

    /* Everything again: no record, no new version. */
    ck_assert_int_eq(store_or_pages(sf, pg, n, err), 0);
    ck_assert_uint_eq(store_log_bytes(s), l1);
    ck_assert_uint_eq(store_filter_version(sf), v1);

    /* One page of the n with one bit more: about one page logged. */
    uint8_t *one = malloc(pg[3].len);
    ck_assert_ptr_nonnull(one);
    memcpy(one, pg[3].data, pg[3].len);
    size_t bit;
    for (bit = 0; bit < pg[3].len * 8 && (one[bit / 8] >> (bit % 8) & 1); bit++)
        ;
    ck_assert_uint_lt(bit, pg[3].len * 8);
    one[bit / 8] |= (uint8_t)(1u << (bit % 8));
    pg[3].data = one;
    ck_assert_int_eq(store_or_pages(sf, pg, n, err), 0);
    uint64_t l2 = store_log_bytes(s);
    ck_assert_uint_gt(l2, l1);
    ck_assert_uint_lt(l2 - l1, 2 * page);
    ck_assert_uint_gt(store_filter_version(sf), v1);
    store_put(sf);
    store_close(s);

    /* And that page is durable: reopened, the bit is there (merging the
     * page again finds nothing to log). */
    s = open_store();
    sf = store_get(s, "f");
    ck_assert(has_keys(sf, src, 0, 5000));
    uint64_t l3 = store_log_bytes(s);
    ck_assert_int_eq(store_or_pages(sf, &pg[3], 1, err), 0);
    ck_assert_uint_eq(store_log_bytes(s), l3);
    store_put(sf);
    store_close(s);
    free(one);
    bf_destroy(src);
}
END_TEST

/* store_pages_hashes: XXH64 of each page of the live bits, the count when
 * the array is short, nothing for a kind that is not tracked. */
START_TEST(pages_hashes_are_the_pages)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *src = source_with_keys(BF_KIND_BLOCKED, 0, 5000);
    struct store_page pg[64];
    uint64_t h[64];
    char err[STORE_ERRLEN];
    size_t n, np;

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    np = pages_of(src, RULES_PAGE_BYTES, pg, 64);
    ck_assert_int_eq(store_or_pages(sf, pg, np, err), 0);
    ck_assert_int_eq(store_pages_hashes(sf, h, 64, &n), 0);
    ck_assert_uint_eq(n, np);
    for (size_t i = 0; i < n; i++)
        ck_assert_uint_eq(h[i], XXH64(pg[i].data, pg[i].len, 0));
    if (np > 1) {
        ck_assert_int_eq(store_pages_hashes(sf, h, np - 1, &n), -ERANGE);
        ck_assert_uint_eq(n, np);
    }
    store_put(sf);
    struct bf_params pc = params(BF_KIND_COUNTING);
    ck_assert_int_eq(store_create(s, "c", &pc, err), 0);
    sf = store_get(s, "c");
    ck_assert_int_eq(store_pages_hashes(sf, h, 64, &n), -EOPNOTSUPP);
    store_put(sf);
    store_close(s);
    bf_destroy(src);
}
END_TEST

START_TEST(or_pages_outside_geometry_changes_nothing)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *src = source_with_keys(BF_KIND_BLOCKED, 0, 2000);
    struct store_page pg[65];
    char err[STORE_ERRLEN];
    struct bf_layer_info li;

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    size_t n = pages_of(src, 16384, pg, 64);
    ck_assert_int_eq(bf_layer_info(src, 0, &li), 0);
    /* The last page runs past the body: the whole call is refused. */
    pg[n] = (struct store_page){.layer = 0, .offset = li.body_bytes - 8,
                                .data = pg[0].data, .len = 16};
    uint64_t v0 = store_filter_version(sf);
    ck_assert_int_eq(store_or_pages(sf, pg, n + 1, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "outside"));
    ck_assert_uint_eq(store_filter_version(sf), v0);
    ck_assert(!has_keys(sf, src, 0, 2000));
    /* An unaligned offset too. */
    pg[0].offset = 4;
    ck_assert_int_eq(store_or_pages(sf, pg, 1, err), -EINVAL);
    store_put(sf);
    store_close(s);
    bf_destroy(src);
}
END_TEST

START_TEST(or_pages_refuses_counting)
{
    struct bf_params p = params(BF_KIND_COUNTING);
    struct store *s = open_store();
    char err[STORE_ERRLEN];
    uint64_t zero[8] = {0};
    struct store_page pg = {.layer = 0, .offset = 0, .data = zero,
                            .len = sizeof zero};

    ck_assert_int_eq(store_create(s, "c", &p, err), 0);
    struct store_filter *sf = store_get(s, "c");
    ck_assert_int_eq(store_or_pages(sf, &pg, 1, err), -EOPNOTSUPP);
    ck_assert_ptr_nonnull(strstr(err, "counting"));
    store_put(sf);
    store_close(s);
}
END_TEST

START_TEST(or_pages_survive_a_snapshot)
{
    struct bf_params p = params(BF_KIND_CLASSIC);
    struct store *s = open_store();
    struct bf *src = source_with_keys(BF_KIND_CLASSIC, 100, 3000);
    struct store_page pg[256];
    char err[STORE_ERRLEN];

    ck_assert_int_eq(store_create(s, "k", &p, err), 0);
    struct store_filter *sf = store_get(s, "k");
    size_t n = pages_of(src, 65536, pg, 256);
    ck_assert_int_eq(store_or_pages(sf, pg, n, err), 0);
    ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
    store_put(sf);
    store_close(s);
    s = open_store();
    sf = store_get(s, "k");
    ck_assert(has_keys(sf, src, 100, 3000));
    store_put(sf);
    store_close(s);
    bf_destroy(src);
}
END_TEST

/* What a walk reported: the pages ORed into a filter like the store's. */
struct walked {
    struct bf *into;
    size_t pages;
    int stop_after;                  /* > 0: fail the walk after that many */
};

static int walk_page(void *ctx, const struct store_page *pg)
{
    struct walked *w = ctx;
    struct bf_layer_info li;

    ck_assert_int_eq(bf_layer_info(w->into, 0, &li), 0);
    ck_assert_uint_eq(pg->offset % RULES_PAGE_BYTES, 0);
    ck_assert(pg->len == RULES_PAGE_BYTES ||
              pg->offset + pg->len == li.body_bytes);
    if (w->stop_after && (int)w->pages == w->stop_after)
        return -ECANCELED;
    uint64_t *body = bf_layer_body(w->into, 0) + pg->offset / 8;
    const uint64_t *d = pg->data;
    for (size_t i = 0; i < pg->len / 8; i++)
        body[i] |= d[i];
    w->pages++;
    return 0;
}

static void add_keys(struct store_filter *sf, const struct bf *like, int base,
                     int n)
{
    char err[STORE_ERRLEN];

    for (int i = base; i < base + n; i++) {
        char key[32];
        int len = snprintf(key, sizeof key, "key-%d", i);
        struct bf_hash h = bf_hash_key(like, key, (size_t)len);
        ck_assert_int_eq(store_add_hashes(sf, &h, 1, NULL, err), 0);
    }
}

static bool bf_has_keys(const struct bf *f, int base, int n)
{
    for (int i = base; i < base + n; i++) {
        char key[32];
        int len = snprintf(key, sizeof key, "key-%d", i);
        if (!bf_may_contain(f, key, (size_t)len))
            return false;
    }
    return true;
}

static struct bf *empty_like(enum bf_kind kind)
{
    return source_with_keys(kind, 0, 0);
}

START_TEST(pages_since_reports_what_changed)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *like = empty_like(BF_KIND_BLOCKED);
    struct walked w = {.into = empty_like(BF_KIND_BLOCKED)};
    struct store_pages_mark m, m2;
    char err[STORE_ERRLEN], fp[17];

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    /* An empty filter: nothing to report, but an epoch to ask with. */
    ck_assert_int_eq(store_pages_since(sf, 0, 0, walk_page, &w, &m, err), 0);
    ck_assert_uint_eq(m.pages, 0);
    ck_assert_uint_ne(m.epoch, 0);
    bf_fingerprint_id(like, fp);
    ck_assert_str_eq(m.fp, fp);

    add_keys(sf, like, 0, 2000);
    ck_assert_int_eq(store_pages_since(sf, m.epoch, m.version, walk_page, &w,
                                       &m2, err), 0);
    ck_assert_uint_gt(m2.pages, 0);
    ck_assert_uint_eq(m2.pages, w.pages);
    ck_assert_uint_gt(m2.version, m.version);
    ck_assert_uint_eq(m2.store_version, store_filter_version(sf));
    ck_assert(bf_has_keys(w.into, 0, 2000));
    uint64_t all = m2.pages;

    /* Quiet: nothing since the version just returned. */
    ck_assert_int_eq(store_pages_since(sf, m2.epoch, m2.version, NULL, NULL,
                                       &m, err), 0);
    ck_assert_uint_eq(m.pages, 0);
    ck_assert_uint_eq(m.version, m2.version);

    /* Three keys change at most three pages, and those hold them. */
    bf_destroy(w.into);
    w = (struct walked){.into = empty_like(BF_KIND_BLOCKED)};
    add_keys(sf, like, 5000, 3);
    ck_assert_int_eq(store_pages_since(sf, m2.epoch, m2.version, walk_page,
                                       &w, &m, err), 0);
    ck_assert_uint_ge(m.pages, 1);
    ck_assert_uint_le(m.pages, 3);
    ck_assert(bf_has_keys(w.into, 5000, 3));

    /* Another epoch, or since 0: every non-empty page. */
    ck_assert_int_eq(store_pages_since(sf, m.epoch + 1, m.version, NULL, NULL,
                                       &m2, err), 0);
    ck_assert_uint_ge(m2.pages, all);
    ck_assert_int_eq(store_pages_since(sf, m.epoch, 0, NULL, NULL, &m, err),
                     0);
    ck_assert_uint_eq(m.pages, m2.pages);

    /* A failing callback stops the walk; its error comes back. */
    bf_destroy(w.into);
    w = (struct walked){.into = empty_like(BF_KIND_BLOCKED), .stop_after = 1};
    ck_assert_int_eq(store_pages_since(sf, 0, 0, walk_page, &w, &m, err),
                     -ECANCELED);
    ck_assert_uint_eq(w.pages, 1);
    store_put(sf);
    store_close(s);
    bf_destroy(w.into);
    bf_destroy(like);
}
END_TEST

START_TEST(pages_tracking_starts_fresh_after_drop)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *like = empty_like(BF_KIND_BLOCKED);
    struct store_pages_mark m, old, full;
    char err[STORE_ERRLEN];

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    add_keys(sf, like, 0, 3000);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &old, err), 0);
    ck_assert_uint_gt(old.pages, 0);
    ck_assert_int_eq(store_drop(s, "f", err), 0);
    /* The dropped filter's handle walks no more. */
    ck_assert_int_eq(store_pages_since(sf, old.epoch, old.version, NULL, NULL,
                                       &m, err), -ENOENT);
    store_put(sf);   /* the last reference: the tracking goes with it */

    /* The same name again (a new secret: the old one is a tombstone),
     * with fewer writes than before: a walk since the old epoch and
     * version gets every non-empty page. */
    static const uint8_t other[BF_SECRET_LEN] = {8, 8, 8};
    p.secret = other;
    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    sf = store_get(s, "f");
    add_keys(sf, like, 0, 10);
    ck_assert_uint_lt(store_filter_version(sf), old.version);
    ck_assert_int_eq(store_pages_since(sf, old.epoch, old.version, NULL, NULL,
                                       &m, err), 0);
    ck_assert_uint_ne(m.epoch, old.epoch);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &full, err), 0);
    ck_assert_uint_gt(m.pages, 0);
    ck_assert_uint_eq(m.pages, full.pages);
    ck_assert_uint_eq(store_pages_source_version(sf), 0);
    store_put(sf);
    store_close(s);
    bf_destroy(like);
}
END_TEST

/* Several pullers (the copies of a group, the merger) share one tracking:
 * pages a merge changed are stamped like local changes, so a puller whose
 * cursor is before the merge gets them, however they arrived. */
START_TEST(pages_merged_are_reported_to_every_puller)
{
    struct bf_params p = params(BF_KIND_CLASSIC);
    struct store *s = open_store();
    struct bf *src = source_with_keys(BF_KIND_CLASSIC, 0, 4000);
    struct store_page pg[256];
    struct store_pages_mark m, m2, again;
    char err[STORE_ERRLEN];

    ck_assert_int_eq(store_create(s, "k", &p, err), 0);
    struct store_filter *sf = store_get(s, "k");
    /* A walk with something in it, so its version is not 0 (since 0 asks
     * for every non-empty page): a puller's cursor before the merge. */
    add_keys(sf, src, 80000, 1);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m, err), 0);
    ck_assert_uint_gt(m.version, 0);
    size_t n = pages_of(src, RULES_PAGE_BYTES, pg, 256);
    ck_assert_int_eq(store_pages_merge(sf, pg, n, 42, err), 0);
    ck_assert(has_keys(sf, src, 0, 4000));
    ck_assert_uint_eq(store_pages_source_version(sf), 42);
    /* Every page the merge changed is reported, and its bits are in the
     * walk's copy. */
    struct walked w = {.into = empty_like(BF_KIND_CLASSIC)};
    ck_assert_int_eq(store_pages_since(sf, m.epoch, m.version, walk_page, &w,
                                       &m2, err), 0);
    ck_assert_uint_gt(m2.pages, 0);
    ck_assert(bf_has_keys(w.into, 0, 4000));
    bf_destroy(w.into);
    /* A second puller with the same old cursor gets them too. */
    ck_assert_int_eq(store_pages_since(sf, m.epoch, m.version, NULL, NULL,
                                       &again, err), 0);
    ck_assert_uint_eq(again.pages, m2.pages);
    /* The same pages again change nothing: nothing new to report. */
    ck_assert_int_eq(store_pages_merge(sf, pg, n, 43, err), 0);
    ck_assert_int_eq(store_pages_since(sf, m2.epoch, m2.version, NULL, NULL,
                                       &m, err), 0);
    ck_assert_uint_eq(m.pages, 0);
    /* No page, no version: an empty merge claims nothing. */
    ck_assert_int_eq(store_pages_merge(sf, NULL, 0, UINT64_C(1) << 62, err), 0);
    ck_assert_uint_eq(store_pages_source_version(sf), 43);
    /* Local writes after the merge are reported. */
    add_keys(sf, src, 90000, 1);
    ck_assert_int_eq(store_pages_since(sf, m.epoch, m.version, NULL, NULL,
                                       &m2, err), 0);
    ck_assert_uint_eq(m2.pages, 1);
    /* A page outside the body is refused whole, as by store_or_pages. */
    struct bf_layer_info li;
    bf_layer_info(src, 0, &li);
    pg[0].offset = li.body_bytes;
    ck_assert_int_eq(store_pages_merge(sf, pg, 1, 60, err), -EINVAL);
    ck_assert_uint_eq(store_pages_source_version(sf), 43);
    store_put(sf);
    store_close(s);
    bf_destroy(src);
}
END_TEST

START_TEST(pages_tracking_survives_recovery)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *like = empty_like(BF_KIND_BLOCKED);
    struct store_pages_mark m, m2;
    char err[STORE_ERRLEN];

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    add_keys(sf, like, 0, 1000);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m, err), 0);
    /* The same bits reloaded from disk: nothing to ship again. */
    ck_assert_int_eq(store_filter_recover(sf, err), 0);
    ck_assert_int_eq(store_pages_since(sf, m.epoch, m.version, NULL, NULL,
                                       &m2, err), 0);
    ck_assert_uint_eq(m2.epoch, m.epoch);
    ck_assert_uint_eq(m2.pages, 0);
    store_put(sf);
    store_close(s);
    bf_destroy(like);
}
END_TEST

/* Two pullers at different cursors, with changes by every path between
 * their walks (adds, an import, ORed and merged pages, records replayed by
 * a reload): each, ORing what it got, has every key acknowledged before
 * its last walk, and a walk with nothing changed since reports nothing. */
START_TEST(pages_two_pullers_each_get_every_change)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *like = empty_like(BF_KIND_BLOCKED);
    struct walked a = {.into = empty_like(BF_KIND_BLOCKED)};
    struct walked b = {.into = empty_like(BF_KIND_BLOCKED)};
    struct store_pages_mark ma = {0}, mb = {0}, m;
    struct store_page pg[64];
    char err[STORE_ERRLEN];

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    add_keys(sf, like, 0, 500);
    ck_assert_int_eq(store_pages_since(sf, 0, 0, walk_page, &a, &ma, err), 0);
    ck_assert(bf_has_keys(a.into, 0, 500));

    struct bf *imp = source_with_keys(BF_KIND_BLOCKED, 1000, 500);
    ck_assert_int_eq(store_import(sf, imp, err), 0);
    add_keys(sf, like, 2000, 500);
    /* B starts here, A is one walk behind. */
    ck_assert_int_eq(store_pages_since(sf, 0, 0, walk_page, &b, &mb, err), 0);
    ck_assert(bf_has_keys(b.into, 0, 500) && bf_has_keys(b.into, 1000, 500) &&
              bf_has_keys(b.into, 2000, 500));

    struct bf *orp = source_with_keys(BF_KIND_BLOCKED, 3000, 500);
    ck_assert_int_eq(store_or_pages(sf, pg, pages_of(orp, 16384, pg, 64), err), 0);
    struct bf *push = source_with_keys(BF_KIND_BLOCKED, 4000, 500);
    ck_assert_int_eq(store_pages_merge(sf, pg, pages_of(push, 4096, pg, 64), 9,
                                       err), 0);
    add_keys(sf, like, 5000, 500);
    /* A reload: the records since the last checkpoint are replayed. */
    ck_assert_int_eq(store_filter_recover(sf, err), 0);
    add_keys(sf, like, 6000, 500);

    ck_assert_int_eq(store_pages_since(sf, ma.epoch, ma.version, walk_page, &a,
                                       &m, err), 0);
    ma = m;
    ck_assert_int_eq(store_pages_since(sf, mb.epoch, mb.version, walk_page, &b,
                                       &m, err), 0);
    mb = m;
    for (int base = 0; base <= 6000; base += 1000) {
        ck_assert_msg(bf_has_keys(a.into, base, 500), "A lacks keys from %d", base);
        ck_assert_msg(bf_has_keys(b.into, base, 500), "B lacks keys from %d", base);
    }
    /* Quiet: both cursors are current. */
    ck_assert_int_eq(store_pages_since(sf, ma.epoch, ma.version, NULL, NULL,
                                       &m, err), 0);
    ck_assert_uint_eq(m.pages, 0);
    ck_assert_int_eq(store_pages_since(sf, mb.epoch, mb.version, NULL, NULL,
                                       &m, err), 0);
    ck_assert_uint_eq(m.pages, 0);
    store_put(sf);
    store_close(s);
    bf_destroy(imp);
    bf_destroy(orp);
    bf_destroy(push);
    bf_destroy(a.into);
    bf_destroy(b.into);
    bf_destroy(like);
}
END_TEST

/* Walks while a writer adds: every key acknowledged before a walk starts
 * is in what the pullers have after it, round after round. */
struct adder {
    struct store_filter *sf;
    const struct bf *like;
    _Atomic int acked;               /* keys [0, acked) acknowledged */
    _Atomic bool stop;
};

static void *adder_main(void *arg)
{
    struct adder *ad = arg;

    for (int i = 0; !atomic_load(&ad->stop) && i < 200000; i += 50) {
        add_keys(ad->sf, ad->like, i, 50);
        atomic_store(&ad->acked, i + 50);
    }
    return NULL;
}

START_TEST(pages_walks_during_adds_miss_nothing)
{
    struct bf_params p = params(BF_KIND_BLOCKED);
    struct store *s = open_store();
    struct bf *like = empty_like(BF_KIND_BLOCKED);
    struct walked w[2] = {{.into = empty_like(BF_KIND_BLOCKED)},
                          {.into = empty_like(BF_KIND_BLOCKED)}};
    struct store_pages_mark mk[2] = {{0}, {0}}, m;
    char err[STORE_ERRLEN];
    pthread_t t;

    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct adder ad = {.sf = store_get(s, "f"), .like = like};
    ck_assert_int_eq(pthread_create(&t, NULL, adder_main, &ad), 0);
    for (int round = 0; round < 40; round++) {
        int i = round % 2;
        int acked = atomic_load(&ad.acked);
        ck_assert_int_eq(store_pages_since(ad.sf, mk[i].epoch, mk[i].version,
                                           walk_page, &w[i], &m, err), 0);
        mk[i] = m;
        ck_assert_msg(bf_has_keys(w[i].into, 0, acked), "round %d", round);
    }
    atomic_store(&ad.stop, true);
    pthread_join(t, NULL);
    store_put(ad.sf);
    store_close(s);
    bf_destroy(w[0].into);
    bf_destroy(w[1].into);
    bf_destroy(like);
}
END_TEST

START_TEST(pages_refuses_counting)
{
    struct bf_params p = params(BF_KIND_COUNTING);
    struct store *s = open_store();
    struct store_pages_mark m;
    char err[STORE_ERRLEN];

    ck_assert_int_eq(store_create(s, "c", &p, err), 0);
    struct store_filter *sf = store_get(s, "c");
    ck_assert_int_eq(store_pages_since(sf, 0, 0, NULL, NULL, &m, err),
                     -EOPNOTSUPP);
    ck_assert_ptr_nonnull(strstr(err, "counting"));
    store_put(sf);
    store_close(s);
}
END_TEST

Suite *store_pages_suite(void)
{
    Suite *s = suite_create("store_pages");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, or_pages_is_durable_and_replayed);
    tcase_add_test(tc, or_pages_logs_only_pages_that_add_bits);
    tcase_add_test(tc, pages_hashes_are_the_pages);
    tcase_add_test(tc, or_pages_outside_geometry_changes_nothing);
    tcase_add_test(tc, or_pages_refuses_counting);
    tcase_add_test(tc, or_pages_survive_a_snapshot);
    tcase_add_test(tc, pages_since_reports_what_changed);
    tcase_add_test(tc, pages_tracking_starts_fresh_after_drop);
    tcase_add_test(tc, pages_merged_are_reported_to_every_puller);
    tcase_add_test(tc, pages_tracking_survives_recovery);
    tcase_add_test(tc, pages_two_pullers_each_get_every_change);
    tcase_add_test(tc, pages_walks_during_adds_miss_nothing);
    tcase_add_test(tc, pages_refuses_counting);
    suite_add_tcase(s, tc);
    return s;
}
