/* Tests of page versions (bf.h, "Page versions"): every path that changes
 * bits stamps exactly the pages it changed with the writer's version, in
 * every kind, and nothing when tracking is off. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf.h"

static struct bf *make(enum bf_kind kind, uint64_t capacity)
{
    struct bf_params p = {.kind = kind, .capacity = capacity, .error_rate = 0.01};
    struct bf *f = bf_create(&p, NULL);

    ck_assert_ptr_nonnull(f);
    return f;
}

/* Pages whose version is above v, and whether every page that differs
 * between before and f (layer 0) is among them. */
static uint64_t pages_above(const struct bf *f, uint32_t layer, uint64_t v)
{
    uint64_t n = 0;

    for (uint64_t p = 0; p < bf_layer_pages(f, layer); p++)
        n += bf_page_version(f, layer, p) > v;
    return n;
}

static void check_changed_are_stamped(const struct bf *f, const uint8_t *before,
                                      uint64_t v)
{
    struct bf_layer_info li;
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(f, 0);

    ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
    for (uint64_t p = 0; p < bf_layer_pages(f, 0); p++) {
        uint64_t off = p * BF_PAGE_BYTES;
        uint64_t len = li.body_bytes - off < BF_PAGE_BYTES ? li.body_bytes - off
                                                           : BF_PAGE_BYTES;
        bool differs = memcmp(body + off, before + off, len) != 0;
        ck_assert_msg(!differs || bf_page_version(f, 0, p) == v,
                      "page %llu changed, version %llu", (unsigned long long)p,
                      (unsigned long long)bf_page_version(f, 0, p));
        ck_assert_msg(differs || bf_page_version(f, 0, p) != v,
                      "page %llu unchanged but stamped", (unsigned long long)p);
    }
}

static uint8_t *snapshot(const struct bf *f)
{
    struct bf_layer_info li;

    ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
    uint8_t *c = malloc(li.body_bytes);
    ck_assert_ptr_nonnull(c);
    memcpy(c, bf_layer_body_const(f, 0), li.body_bytes);
    return c;
}

static void add_range(struct bf *f, int base, int n)
{
    for (int i = base; i < base + n; i++) {
        char key[32];
        int len = snprintf(key, sizeof key, "k-%d", i);
        bf_add(f, key, (size_t)len);
    }
}

START_TEST(adds_stamp_the_pages_they_change)
{
    static const enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC,
                                         BF_KIND_COUNTING, BF_KIND_SCALABLE};
    for (size_t k = 0; k < 4; k++) {
        for (int excl = 0; excl < 2; excl++) {
            struct bf *f = make(kinds[k], 200000);
            bf_set_exclusive(f, excl);
            ck_assert_int_eq(bf_track_pages(f, true), 0);
            ck_assert(bf_tracked(f));
            ck_assert_uint_eq(pages_above(f, 0, 0), 0);
            bf_set_stamp(f, 5);
            add_range(f, 0, 50);
            bf_fold_versions(f, 5);
            uint8_t *before = snapshot(f);
            bf_set_stamp(f, 6);
            add_range(f, 1000, 50);
            check_changed_are_stamped(f, before, 6);
            ck_assert_uint_gt(pages_above(f, 0, 5), 0);
            ck_assert_uint_le(pages_above(f, 0, 5), 50 * (kinds[k] == BF_KIND_BLOCKED ||
                                                          kinds[k] == BF_KIND_SCALABLE
                                                          ? 1 : 10));
            /* Re-adding changes no bit and stamps nothing. */
            free(before);
            before = snapshot(f);
            ck_assert_uint_gt(bf_fold_versions(f, 6), 0);
            ck_assert_uint_eq(pages_above(f, 0, 6), 0);   /* folded at 6 */
            bf_set_stamp(f, 7);
            if (kinds[k] != BF_KIND_COUNTING) {
                add_range(f, 1000, 50);
                ck_assert_uint_eq(pages_above(f, 0, 6), 0);
            }
            free(before);
            bf_destroy(f);
        }
    }
}
END_TEST

START_TEST(removes_and_merges_stamp)
{
    struct bf *f = make(BF_KIND_COUNTING, 100000);
    ck_assert_int_eq(bf_track_pages(f, true), 0);
    bf_set_stamp(f, 1);
    add_range(f, 0, 100);
    bf_fold_versions(f, 1);
    uint8_t *before = snapshot(f);
    bf_set_stamp(f, 2);
    ck_assert_int_eq(bf_remove(f, "k-3", 3), 0);
    check_changed_are_stamped(f, before, 2);
    free(before);

    /* A merge stamps the pages it changed in the destination. */
    struct bf *src = bf_create_like(f, NULL);
    ck_assert_ptr_nonnull(src);
    add_range(src, 5000, 20);
    bf_fold_versions(f, 2);
    before = snapshot(f);
    bf_set_stamp(f, 3);
    ck_assert_int_eq(bf_merge_from(f, src, NULL), 0);
    check_changed_are_stamped(f, before, 3);
    free(before);
    bf_destroy(src);
    bf_destroy(f);

    /* bf_stamp_range: the pages of a byte range. */
    f = make(BF_KIND_BLOCKED, 1000000);
    ck_assert_int_eq(bf_track_pages(f, true), 0);
    bf_set_stamp(f, 9);
    bf_stamp_range(f, 0, BF_PAGE_BYTES - 8, 16);
    ck_assert_uint_eq(bf_page_version(f, 0, 0), 9);
    ck_assert_uint_eq(bf_page_version(f, 0, 1), 9);
    ck_assert_uint_eq(pages_above(f, 0, 0), 2);
    bf_destroy(f);
}
END_TEST

START_TEST(scalable_layers_appended_are_tracked)
{
    struct bf *f = make(BF_KIND_SCALABLE, 1000);
    ck_assert_int_eq(bf_track_pages(f, true), 0);
    bf_set_stamp(f, 4);
    add_range(f, 0, 5000);
    ck_assert_uint_gt(bf_layer_count(f), 1);
    for (uint32_t l = 0; l < bf_layer_count(f); l++)
        ck_assert_uint_gt(pages_above(f, l, 0), 0);
    ck_assert_uint_eq(bf_tracking_bytes(f) > 0, 1);
    bf_destroy(f);
}
END_TEST

START_TEST(untracked_filters_keep_no_versions)
{
    struct bf *f = make(BF_KIND_BLOCKED, 100000);
    ck_assert(!bf_tracked(f));
    bf_set_stamp(f, 3);
    add_range(f, 0, 100);
    ck_assert_uint_eq(pages_above(f, 0, 0), 0);
    ck_assert_uint_eq(bf_tracking_bytes(f), 0);
    ck_assert_int_eq(bf_track_pages(f, true), 0);
    ck_assert_uint_eq(bf_tracking_bytes(f), bf_layer_pages(f, 0) * 8 +
                                                (bf_layer_pages(f, 0) + 63) / 64 * 8);
    ck_assert_int_eq(bf_track_pages(f, false), 0);
    ck_assert_uint_eq(bf_tracking_bytes(f), 0);
    bf_destroy(f);
}
END_TEST

/* Two readers keep their own cursors and fold at them while a writer goes
 * on: between a reader's cursors, every page that changed reads above its
 * older cursor, whenever the other reader folded; a page that did not
 * change since a reader's fold never reads above that reader's cursor. */
START_TEST(readers_folding_at_their_cursors_miss_nothing)
{
    for (int excl = 0; excl < 2; excl++) {
        struct bf *f = make(BF_KIND_BLOCKED, 400000);
        struct bf_layer_info li;
        uint64_t cur[2] = {0, 0}, seq = 0;
        uint8_t *seen[2];
        int next = 0;

        bf_set_exclusive(f, excl);
        ck_assert_int_eq(bf_track_pages(f, true), 0);
        ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
        seen[0] = snapshot(f);
        seen[1] = snapshot(f);
        for (int round = 0; round < 60; round++) {
            bf_set_stamp(f, ++seq);
            add_range(f, next, 37 + round % 5 * 40);
            next += 37 + round % 5 * 40;
            int r = round % 3 == 2 ? 1 : 0;   /* reader 0 more often */
            if (round % 2)
                continue;
            const uint8_t *body = (const uint8_t *)bf_layer_body_const(f, 0);
            for (uint64_t p = 0; p < bf_layer_pages(f, 0); p++) {
                uint64_t off = p * BF_PAGE_BYTES;
                uint64_t len = li.body_bytes - off < BF_PAGE_BYTES ? li.body_bytes - off
                                                                   : BF_PAGE_BYTES;
                bool changed = memcmp(body + off, seen[r] + off, len) != 0;
                ck_assert_msg(!changed || bf_page_version(f, 0, p) > cur[r],
                              "reader %d: page %llu changed since %llu, reads %llu", r,
                              (unsigned long long)p, (unsigned long long)cur[r],
                              (unsigned long long)bf_page_version(f, 0, p));
            }
            /* The reader takes its cursor at seq and folds there. */
            bf_fold_versions(f, seq);
            cur[r] = seq;
            memcpy(seen[r], body, li.body_bytes);
            for (uint64_t p = 0; p < bf_layer_pages(f, 0); p++)
                ck_assert_uint_le(bf_page_version(f, 0, p), seq);
        }
        free(seen[0]);
        free(seen[1]);
        bf_destroy(f);
    }
}
END_TEST

/* A page reads as never written exactly when it holds no bit set since
 * tracking started: before and after the marks are folded into versions,
 * in every kind; an untracked filter has no page known to be unwritten. */
START_TEST(unwritten_pages_are_exactly_the_zero_ones)
{
    static const enum bf_kind kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC,
                                         BF_KIND_COUNTING, BF_KIND_SCALABLE};
    for (size_t k = 0; k < 4; k++) {
        struct bf *f = make(kinds[k], 2000000);
        struct bf_layer_info li;
        ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
        ck_assert(!bf_page_unwritten(f, 0, 0));   /* untracked */
        ck_assert_int_eq(bf_track_pages(f, true), 0);
        for (uint64_t p = 0; p < bf_layer_pages(f, 0); p++)
            ck_assert(bf_page_unwritten(f, 0, p));
        ck_assert(!bf_page_unwritten(f, 0, bf_layer_pages(f, 0)));   /* past the end */
        bf_set_stamp(f, 5);
        add_range(f, 0, 50);
        for (int fold = 0; fold < 2; fold++) {
            const uint8_t *body = (const uint8_t *)bf_layer_body_const(f, 0);
            uint64_t written = 0;
            for (uint64_t p = 0; p < bf_layer_pages(f, 0); p++) {
                uint64_t off = p * BF_PAGE_BYTES;
                uint64_t len = li.body_bytes - off < BF_PAGE_BYTES ? li.body_bytes - off
                                                                   : BF_PAGE_BYTES;
                bool zero = true;
                for (uint64_t i = 0; i < len && zero; i++)
                    zero = body[off + i] == 0;
                ck_assert_msg(bf_page_unwritten(f, 0, p) == zero,
                              "kind %d page %llu: zero %d, unwritten %d", (int)kinds[k],
                              (unsigned long long)p, zero, bf_page_unwritten(f, 0, p));
                written += !zero;
            }
            ck_assert_uint_gt(written, 0);
            bf_fold_versions(f, 5);
        }
        bf_destroy(f);
    }
}
END_TEST

Suite *bf_pages_suite(void)
{
    Suite *s = suite_create("bf_pages");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, adds_stamp_the_pages_they_change);
    tcase_add_test(tc, removes_and_merges_stamp);
    tcase_add_test(tc, readers_folding_at_their_cursors_miss_nothing);
    tcase_add_test(tc, scalable_layers_appended_are_tracked);
    tcase_add_test(tc, untracked_filters_keep_no_versions);
    tcase_add_test(tc, unwritten_pages_are_exactly_the_zero_ones);
    suite_add_tcase(s, tc);
    return s;
}
