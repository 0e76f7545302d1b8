/* Unit tests of bytebuf: appends concatenate across growth, nothing from
 * NULL is a no-op (the {NULL, 0} of an empty protobuf-c bytes field, which
 * must never reach memcpy: the sanitizer build aborts on it), the maximum is
 * never passed and a refused append changes nothing. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf.h"
#include "bf_file.h"
#include "bytebuf.h"

/* Byte i of the test pattern. */
static uint8_t pat(size_t i)
{
    return (uint8_t)(i * 131 + (i >> 8));
}

START_TEST(append_of_nothing_from_null_changes_nothing)
{
    struct bytebuf b = {0};

    /* A zeroed buffer: max 0, no memory yet. */
    ck_assert_int_eq(bytebuf_append(&b, NULL, 0), 0);
    ck_assert_ptr_null(b.p);
    ck_assert_uint_eq(b.len, 0);

    bytebuf_init(&b, 16);
    ck_assert_int_eq(bytebuf_append(&b, NULL, 0), 0);
    ck_assert_int_eq(bytebuf_append(&b, "abc", 3), 0);
    ck_assert_int_eq(bytebuf_append(&b, NULL, 0), 0);
    ck_assert_int_eq(bytebuf_write(&b, NULL, 0), 0);
    ck_assert_int_eq(bytebuf_append(&b, "de", 2), 0);
    ck_assert_uint_eq(b.len, 5);
    ck_assert_mem_eq(b.p, "abcde", 5);

    /* Full to the byte: nothing more, but still nothing is fine. */
    ck_assert_int_eq(bytebuf_append(&b, "0123456789a", 11), 0);
    ck_assert_uint_eq(b.len, 16);
    ck_assert_int_eq(bytebuf_append(&b, NULL, 0), 0);
    ck_assert_uint_eq(b.len, 16);
    bytebuf_deinit(&b);
}
END_TEST

START_TEST(appends_concatenate_across_growth)
{
    enum { TOTAL = 700000 };
    uint8_t *src = malloc(TOTAL);
    struct bytebuf b;
    size_t off = 0, piece = 1;

    for (size_t i = 0; i < TOTAL; i++)
        src[i] = pat(i);
    bytebuf_init(&b, TOTAL);
    /* Pieces of growing, uneven sizes cross every doubling. */
    while (off < TOTAL) {
        size_t n = piece < TOTAL - off ? piece : TOTAL - off;
        ck_assert_int_eq(bytebuf_append(&b, src + off, n), 0);
        off += n;
        piece = piece * 3 + 1;
    }
    ck_assert_uint_eq(b.len, TOTAL);
    ck_assert_uint_le(b.cap, b.max);
    ck_assert_int_eq(memcmp(b.p, src, TOTAL), 0);
    bytebuf_deinit(&b);
    ck_assert_ptr_null(b.p);
    ck_assert_uint_eq(b.len, 0);
    /* Usable again after deinit, with the same maximum. */
    ck_assert_int_eq(bytebuf_append(&b, src, 10), 0);
    ck_assert_uint_eq(b.max, TOTAL);
    bytebuf_deinit(&b);
    free(src);
}
END_TEST

START_TEST(refuses_past_the_maximum_and_keeps_the_content)
{
    uint8_t src[100];
    struct bytebuf b;

    for (size_t i = 0; i < sizeof src; i++)
        src[i] = pat(i);
    bytebuf_init(&b, 100);
    ck_assert_int_eq(bytebuf_append(&b, src, 60), 0);
    ck_assert_int_eq(bytebuf_append(&b, src + 60, 41), -E2BIG);
    ck_assert_uint_eq(b.len, 60);
    ck_assert_int_eq(bytebuf_append(&b, src + 60, 40), 0);
    ck_assert_int_eq(bytebuf_append(&b, src, 1), -E2BIG);
    ck_assert_uint_eq(b.len, 100);
    ck_assert_uint_le(b.cap, 100);
    ck_assert_int_eq(memcmp(b.p, src, 100), 0);
    bytebuf_deinit(&b);

    /* Maximum 0: not one byte. */
    struct bytebuf z = {0};
    ck_assert_int_eq(bytebuf_append(&z, "x", 1), -E2BIG);
    ck_assert_ptr_null(z.p);
}
END_TEST

START_TEST(huge_lengths_do_not_wrap_around)
{
    struct bytebuf b;

    bytebuf_init(&b, SIZE_MAX);
    ck_assert_int_eq(bytebuf_append(&b, "0123456789", 10), 0);
    /* len + 10 would wrap to a small number: refused before any memcpy. */
    ck_assert_int_eq(bytebuf_append(&b, "x", SIZE_MAX - 5), -E2BIG);
    ck_assert_uint_eq(b.len, 10);
    bytebuf_deinit(&b);

    bytebuf_init(&b, 1000);
    ck_assert_int_eq(bytebuf_append(&b, "x", SIZE_MAX), -E2BIG);
    ck_assert_uint_eq(b.len, 0);
    bytebuf_deinit(&b);
}
END_TEST

START_TEST(capacity_stays_within_a_maximum_between_doublings)
{
    enum { MAX = (64 << 10) + 1000 };
    uint8_t *src = calloc(1, MAX);
    struct bytebuf b;

    bytebuf_init(&b, MAX);
    ck_assert_int_eq(bytebuf_append(&b, src, 64 << 10), 0);
    ck_assert_int_eq(bytebuf_append(&b, src, 1000), 0);
    ck_assert_uint_eq(b.cap, MAX);
    bytebuf_deinit(&b);
    free(src);
}
END_TEST

START_TEST(serves_as_a_file_writer)
{
    struct bf_params p = {.capacity = 5000, .error_rate = 0.01};
    char err[BF_ERRLEN] = "";
    struct bytebuf b;
    struct bf *f, *back;

    bf_params_default(&p);
    f = bf_create(&p, err);
    ck_assert_ptr_nonnull(f);
    bf_add(f, "k", 1);
    bytebuf_init(&b, bf_file_size(f));
    ck_assert_int_eq(bf_file_write(f, bytebuf_write, &b), 0);
    ck_assert_uint_eq(b.len, bf_file_size(f));
    back = bf_file_parse(b.p, b.len, err);
    ck_assert_msg(back != NULL, "%s", err);
    ck_assert(bf_may_contain(back, "k", 1));
    bf_destroy(back);
    bytebuf_deinit(&b);

    /* One byte short of room: the writer's error stops serializing. */
    bytebuf_init(&b, bf_file_size(f) - 1);
    ck_assert_int_eq(bf_file_write(f, bytebuf_write, &b), -E2BIG);
    bytebuf_deinit(&b);
    bf_destroy(f);
}
END_TEST

Suite *bytebuf_suite(void)
{
    Suite *s = suite_create("bytebuf");
    TCase *tc = tcase_create("bytebuf");
    tcase_add_test(tc, append_of_nothing_from_null_changes_nothing);
    tcase_add_test(tc, appends_concatenate_across_growth);
    tcase_add_test(tc, refuses_past_the_maximum_and_keeps_the_content);
    tcase_add_test(tc, huge_lengths_do_not_wrap_around);
    tcase_add_test(tc, capacity_stays_within_a_maximum_between_doublings);
    tcase_add_test(tc, serves_as_a_file_writer);
    suite_add_tcase(s, tc);
    return s;
}
