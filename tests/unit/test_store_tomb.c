/* Tests of undoing a drop in the store (store.h, "Undoing a drop";
 * common/store_tomb.c): an undrop lifts the tombstone and records a
 * generation above it, durably; a peer's filter is taken only with a
 * generation above the tombstone's; generations are raised, never lowered;
 * the file keeps the format earlier releases read while nothing needs the
 * new one. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "store.h"
#include "store_internal.h"
#include "unit_tmpdir.h"

static char tdir[4096];

static const uint8_t secret_a[BF_SECRET_LEN] = {7, 1, 7};
static const uint8_t secret_b[BF_SECRET_LEN] = {9, 9, 9};

static void setup(void)
{
    log_set_level(LOG_LEVEL_WARN);
    unit_tmpdir_make(tdir, sizeof(tdir), "store-tomb");
}

static void teardown(void)
{
    unit_tmpdir_remove(tdir);
}

static struct store *open_store(void)
{
    struct store_options o = {.dir = tdir, .durability = STORE_DURABLE_NONE};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);

    ck_assert_msg(s != NULL, "store_open: %s", err);
    return s;
}

static void params(struct bf_params *p, const uint8_t *secret)
{
    memset(p, 0, sizeof(*p));
    p->kind = BF_KIND_BLOCKED;
    bf_params_default(p);
    p->capacity = 1000;
    p->error_rate = 0.01;
    p->secret = secret;
}

static uint64_t id_of(const uint8_t *secret)
{
    struct bf_params p;
    char err[STORE_ERRLEN];

    params(&p, secret);
    struct bf *f = bf_create(&p, err);
    ck_assert_ptr_nonnull(f);
    uint64_t id = store_secret_id(f);
    bf_destroy(f);
    return id;
}

static struct bf_hash hash_of(uint64_t i)
{
    return (struct bf_hash){i * 0x9e3779b97f4a7c15ull + 1, i * 0xbf58476d1ce4e5b9ull + 3};
}

/* The first line of DIR/.tombstones. */
static void tomb_magic(char *out, size_t len)
{
    char path[4200];

    snprintf(path, sizeof path, "%s/.tombstones", tdir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(out, (int)len, f));
    fclose(f);
}

/* Create "t" with secret_a, holding one key, and drop it. */
static void create_and_drop(struct store *s)
{
    struct bf_params p;
    char err[STORE_ERRLEN];

    params(&p, secret_a);
    ck_assert_int_eq(store_create(s, "t", &p, err), 0);
    struct store_filter *sf = store_get(s, "t");
    struct bf_hash h = hash_of(1);
    ck_assert_int_eq(store_add_hashes(sf, &h, 1, NULL, err), 0);
    store_put(sf);
    ck_assert_int_eq(store_drop(s, "t", err), 0);
}

/* An undrop lifts the tombstone, creates the filter empty with its secret
 * and records its generation, across a restart; a later drop carries that
 * generation into the tombstone, and the next undrop is above it. */
START_TEST(undrop_lifts_the_tombstone)
{
    struct store *s = open_store();
    char err[STORE_ERRLEN] = "", magic[64];
    struct bf_params p;
    uint64_t gen = 0, tg = 99;
    uint64_t id = id_of(secret_a);

    create_and_drop(s);
    tomb_magic(magic, sizeof magic);
    ck_assert_str_eq(magic, "bloomgrid-tombstones 1\n");
    ck_assert(store_dropped_gen(s, "t", id, NULL, &tg));
    ck_assert_uint_eq(tg, 0);
    params(&p, secret_a);
    ck_assert_int_eq(store_create(s, "t", &p, err), -ESTALE);
    ck_assert_ptr_nonnull(strstr(err, "undrop"));

    ck_assert_int_eq(store_undrop(s, "t", &p, 5, &gen, err), 0);
    ck_assert_uint_eq(gen, 5);
    ck_assert(!store_dropped(s, "t", id, NULL));
    ck_assert_uint_eq(store_generation(s, "t", id), 5);
    struct store_filter *sf = store_get(s, "t");
    ck_assert_ptr_nonnull(sf);
    ck_assert_uint_eq(store_secret_id(store_filter_bf(sf)), id);
    bool out[1];
    struct bf_hash h = hash_of(1);
    ck_assert_int_eq(store_may_contain_hashes(sf, &h, 1, out), 0);
    ck_assert(!out[0]);   /* created empty: the restore imports the keys */
    store_put(sf);
    tomb_magic(magic, sizeof magic);
    ck_assert_str_eq(magic, "bloomgrid-tombstones 2\n");
    store_close(s);

    s = open_store();
    ck_assert(!store_dropped(s, "t", id, NULL));
    ck_assert_uint_eq(store_generation(s, "t", id), 5);
    ck_assert_int_eq(store_undrop(s, "t", &p, 9, &gen, err), -EEXIST);
    ck_assert_int_eq(store_drop(s, "t", err), 0);
    ck_assert(store_dropped_gen(s, "t", id, NULL, &tg));
    ck_assert_uint_eq(tg, 5);
    ck_assert_uint_eq(store_generation(s, "t", id), 0);
    /* An undrop asked for a generation at or below the drop's gets one
     * above it (another router's clock behind). */
    ck_assert_int_eq(store_undrop(s, "t", &p, 3, &gen, err), 0);
    ck_assert_uint_eq(gen, 6);
    store_close(s);
    s = open_store();
    ck_assert_uint_eq(store_generation(s, "t", id), 6);
    ck_assert(!store_dropped(s, "t", id, NULL));
    store_close(s);
}
END_TEST

/* An undrop needs the secret; one of another secret lifts nothing. */
START_TEST(undrop_needs_the_secret)
{
    struct store *s = open_store();
    char err[STORE_ERRLEN] = "";
    struct bf_params p;

    create_and_drop(s);
    params(&p, NULL);
    ck_assert_int_eq(store_undrop(s, "t", &p, 1, NULL, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "secret"));
    ck_assert(store_dropped(s, "t", id_of(secret_a), NULL));
    /* Another secret is another filter: created, and the tombstone of
     * secret_a stays. */
    params(&p, secret_b);
    ck_assert_int_eq(store_undrop(s, "t", &p, 1, NULL, err), 0);
    ck_assert(store_dropped(s, "t", id_of(secret_a), NULL));
    params(&p, secret_a);
    ck_assert_int_eq(store_undrop(s, "t", &p, 1, NULL, err), -EEXIST);
    store_close(s);
}
END_TEST

/* A peer's filter (store_undrop_from) is taken over a tombstone only with
 * a generation above the tombstone's: at or below it, it is the filter as
 * it was before the drop here. */
START_TEST(undrop_from_needs_a_later_generation)
{
    struct store *s = open_store();
    char err[STORE_ERRLEN] = "";
    struct bf_params p;
    uint64_t id = id_of(secret_a);

    create_and_drop(s);
    params(&p, secret_a);
    struct bf *f = bf_create(&p, err);
    /* Generation 0: a plain create, refused by the tombstone. */
    ck_assert_int_eq(store_undrop_from(s, "t", f, 0, err), -ESTALE);
    ck_assert_int_eq(store_undrop_from(s, "t", f, 4, err), 0);   /* f is the store's */
    ck_assert_uint_eq(store_generation(s, "t", id), 4);
    ck_assert(!store_dropped(s, "t", id, NULL));
    ck_assert_int_eq(store_drop(s, "t", err), 0);

    f = bf_create(&p, err);
    err[0] = 0;
    ck_assert_int_eq(store_undrop_from(s, "t", f, 4, err), -ESTALE);
    ck_assert_ptr_nonnull(strstr(err, "generation"));
    ck_assert_int_eq(store_undrop_from(s, "t", f, 3, err), -ESTALE);
    ck_assert_ptr_null(store_get(s, "t"));
    ck_assert(store_dropped(s, "t", id, NULL));
    ck_assert_int_eq(store_undrop_from(s, "t", f, 5, err), 0);
    ck_assert_uint_eq(store_generation(s, "t", id), 5);
    store_close(s);
}
END_TEST

/* A live filter takes a peer's higher generation of the same fingerprint,
 * durably, never a lower one, nor one of another fingerprint. */
START_TEST(generation_is_raised_only)
{
    struct store *s = open_store();
    char err[STORE_ERRLEN] = "", fp[17], magic[64];
    struct bf_params p;
    uint64_t id = id_of(secret_a);

    params(&p, secret_a);
    ck_assert_int_eq(store_create(s, "t", &p, err), 0);
    struct store_filter *sf = store_get(s, "t");
    bf_fingerprint_id(store_filter_bf(sf), fp);
    ck_assert_uint_eq(store_generation(s, "t", id), 0);
    ck_assert_int_eq(store_generation_raise(s, sf, fp, 8, err), 0);
    ck_assert_uint_eq(store_generation(s, "t", id), 8);
    ck_assert_int_eq(store_generation_raise(s, sf, fp, 2, err), 0);
    ck_assert_uint_eq(store_generation(s, "t", id), 8);
    ck_assert_int_eq(store_generation_raise(s, sf, "0123456789abcdef", 20, err),
                     -EINVAL);
    ck_assert_uint_eq(store_generation(s, "t", id), 8);
    store_put(sf);
    store_close(s);
    s = open_store();
    ck_assert_uint_eq(store_generation(s, "t", id), 8);
    /* The drop takes the generation along; with no record left of one,
     * the file goes back to the format earlier releases read only when no
     * tombstone has a generation either. */
    ck_assert_int_eq(store_drop(s, "t", err), 0);
    uint64_t tg = 0;
    ck_assert(store_dropped_gen(s, "t", 0, fp, &tg));
    ck_assert_uint_eq(tg, 8);
    tomb_magic(magic, sizeof magic);
    ck_assert_str_eq(magic, "bloomgrid-tombstones 2\n");
    store_close(s);
}
END_TEST

/* Generation records are bounded as tombstones are (8 here), and a drop
 * of a name removes the record of its generation. */
START_TEST(generations_are_bounded)
{
    store__tombs_max = 8;
    struct store *s = open_store();
    char err[STORE_ERRLEN], name[32];
    struct bf_params p;

    params(&p, secret_a);
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "g%d", i);
        ck_assert_int_eq(store_undrop(s, name, &p, 100 + i, NULL, err), 0);
    }
    ck_assert_uint_eq(s->ngens, 8);
    ck_assert_uint_eq(store_generation(s, "g0", id_of(secret_a)), 0);
    ck_assert_uint_eq(store_generation(s, "g9", id_of(secret_a)), 109);
    ck_assert_int_eq(store_drop(s, "g9", err), 0);
    ck_assert_uint_eq(s->ngens, 7);
    store_close(s);
    s = open_store();
    ck_assert_uint_eq(s->ngens, 7);
    ck_assert_uint_eq(store_generation(s, "g8", id_of(secret_a)), 108);
    uint64_t tg = 0;
    ck_assert(store_dropped_gen(s, "g9", id_of(secret_a), NULL, &tg));
    ck_assert_uint_eq(tg, 109);
    store_close(s);
    store__tombs_max = STORE_TOMBS_MAX;
}
END_TEST

/* A file of format 2 that does not parse is refused, never read in part. */
START_TEST(damaged_generation_refuses_the_open)
{
    struct store *s = open_store();
    char err[STORE_ERRLEN], path[4200];
    struct bf_params p;

    params(&p, secret_a);
    ck_assert_int_eq(store_undrop(s, "t", &p, 3, NULL, err), 0);
    store_close(s);
    snprintf(path, sizeof path, "%s/.tombstones", tdir);
    FILE *f = fopen(path, "a");
    ck_assert_ptr_nonnull(f);
    fputs("x 0000000000000001 0000000000000002 0000000000000003 t\n", f);
    fclose(f);
    struct store_options o = {.dir = tdir};
    ck_assert_ptr_null(store_open(&o, err));
    ck_assert_ptr_nonnull(strstr(err, ".tombstones"));
}
END_TEST

Suite *store_tomb_suite(void)
{
    Suite *su = suite_create("store_tomb");
    TCase *tc = tcase_create("undrop");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, undrop_lifts_the_tombstone);
    tcase_add_test(tc, undrop_needs_the_secret);
    tcase_add_test(tc, undrop_from_needs_a_later_generation);
    tcase_add_test(tc, generation_is_raised_only);
    tcase_add_test(tc, generations_are_bounded);
    tcase_add_test(tc, damaged_generation_refuses_the_open);
    suite_add_tcase(su, tc);
    return su;
}
