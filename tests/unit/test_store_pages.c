/* Tests of store_or_pages: pages ORed in durably (WAL_REC_PAGES), checked
 * against the geometry before any bit changes, idempotent, replayed after a
 * restart. */
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bf.h"
#include "log.h"
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

Suite *store_pages_suite(void)
{
    Suite *s = suite_create("store_pages");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, or_pages_is_durable_and_replayed);
    tcase_add_test(tc, or_pages_outside_geometry_changes_nothing);
    tcase_add_test(tc, or_pages_refuses_counting);
    tcase_add_test(tc, or_pages_survive_a_snapshot);
    suite_add_tcase(s, tc);
    return s;
}
