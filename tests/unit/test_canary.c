/* Unit tests of canary: the keys (pinned: a renamed key would turn every
 * key of the earlier runs into a false negative), the state file (round
 * trip, refusals naming the line, another filter's state refused) and the
 * keys a round picks (bounded, distinct, the newest always, every key
 * sooner or later). */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "canary.h"
#include "unit_tmpdir.h"

static char dir[512];

static void setup(void)
{
    unit_tmpdir_make(dir, sizeof dir, "canary");
}

static void teardown(void)
{
    unit_tmpdir_remove(dir);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(keys_are_pinned)
{
    char buf[CANARY_KEY_MAX], name[CANARY_NAME_MAX + 1];

    ck_assert_uint_eq(canary_key(buf, "cli", 0), 22);
    ck_assert_str_eq(buf, "bloomgrid-canary/cli/0");
    canary_key(buf, "router-1", 1234567);
    ck_assert_str_eq(buf, "bloomgrid-canary/router-1/1234567");
    /* The longest name and sequence fit. */
    memset(name, 'n', CANARY_NAME_MAX);
    name[CANARY_NAME_MAX] = 0;
    size_t len = canary_key(buf, name, UINT64_MAX);
    ck_assert_uint_eq(len, strlen(CANARY_KEY_PREFIX) + CANARY_NAME_MAX + 1 + 20);
    ck_assert_str_eq(buf + len - 20, "18446744073709551615");
}
END_TEST

START_TEST(names_are_checked)
{
    char err[CANARY_ERRLEN], long_name[CANARY_NAME_MAX + 2];

    ck_assert_int_eq(canary_name_check("--name", "cli", err), 0);
    ck_assert_int_eq(canary_name_check("--name", "r-1.dc_2", err), 0);
    ck_assert_int_eq(canary_name_check("--name", "", err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "--name"));
    ck_assert_int_eq(canary_name_check("canary_name", "a/b", err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "canary_name \"a/b\""));
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = 0;
    ck_assert_int_eq(canary_name_check("--name", long_name, err), -EINVAL);
}
END_TEST

START_TEST(state_round_trip)
{
    char path[600], err[CANARY_ERRLEN];
    struct canary_state st = {.filter = "slugs", .name = "cli", .next = 42}, got;

    snprintf(path, sizeof path, "%s/s.state", dir);
    ck_assert_int_eq(canary_state_load(path, &got, err), -ENOENT);
    ck_assert_int_eq(canary_state_save(path, &st, err), 0);
    memset(&got, 0, sizeof got);
    ck_assert_int_eq(canary_state_load(path, &got, err), 0);
    ck_assert_str_eq(got.filter, "slugs");
    ck_assert_str_eq(got.name, "cli");
    ck_assert_uint_eq(got.next, 42);
    ck_assert_int_eq(canary_state_match(path, &got, "slugs", "cli", err), 0);
    ck_assert_int_eq(canary_state_match(path, &got, "users", "cli", err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "is for filter \"slugs\", not \"users\""));
    ck_assert_int_eq(canary_state_match(path, &got, "slugs", "other", err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "is for canary \"cli\", not \"other\""));
}
END_TEST

START_TEST(bad_state_is_refused)
{
    static const struct { const char *text, *why; } cases[] = {
        {"filter a\ncanary c\nnext x\n", "line 3: next \"x\" is not a whole number"},
        {"filter a\ncanary c\nnext -1\n", "line 3: next"},
        {"filter a\ncolour red\n", "line 2: unknown key \"colour\""},
        {"filter a/b\n", "line 1: \"a/b\" is not a filter name"},
        {"# header\nfilter a\ncanary c/d\n", "line 3: \"c/d\" is not a canary name"},
        {"filter a\nnext 3\n", "incomplete"},
        {"filter\n", "line 1: expected"},
        {"", "incomplete"},
    };
    char path[600], err[CANARY_ERRLEN];
    struct canary_state st = {.next = 7};

    snprintf(path, sizeof path, "%s/bad.state", dir);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_text(path, cases[i].text);
        err[0] = 0;
        ck_assert_int_eq(canary_state_load(path, &st, err), -EINVAL);
        ck_assert_msg(strstr(err, cases[i].why), "case %zu: %s", i, err);
        ck_assert_ptr_nonnull(strstr(err, path));
        ck_assert_uint_eq(st.next, 7);     /* untouched */
    }
}
END_TEST

START_TEST(pick_takes_all_while_few)
{
    uint64_t out[10], rng = 1;

    ck_assert_uint_eq(canary_pick(0, 10, out, &rng), 0);
    ck_assert_uint_eq(canary_pick(10, 10, out, &rng), 10);
    for (uint64_t i = 0; i < 10; i++)
        ck_assert_uint_eq(out[i], i);
}
END_TEST

START_TEST(pick_is_bounded_and_covers_every_key)
{
    enum { NEXT = 5000, MAX = 100 };
    uint64_t out[MAX], rng = 12345;
    static bool seen[NEXT];

    memset(seen, 0, sizeof seen);
    for (int round = 0; round < 2000; round++) {
        size_t n = canary_pick(NEXT, MAX, out, &rng);
        ck_assert_uint_eq(n, MAX);
        /* Checked without an assertion per key (each costs Check a
         * message to its parent), then asserted once a round. */
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            bad += out[i] >= NEXT;
            bad += i && out[i] <= out[i - 1];           /* distinct, in order */
            if (out[i] < NEXT)
                seen[out[i]] = true;
        }
        /* The newest half every round. */
        for (size_t i = 0; i < MAX / 2; i++)
            bad += out[MAX - 1 - i] != NEXT - 1 - i;
        ck_assert_msg(bad == 0, "round %d: %zu keys out of range, order or the newest half",
                      round, bad);
    }
    for (int k = 0; k < NEXT; k++)
        ck_assert_msg(seen[k], "key %d never checked", k);
    /* One key a round: the newest. */
    ck_assert_uint_eq(canary_pick(NEXT, 1, out, &rng), 1);
    ck_assert_uint_eq(out[0], NEXT - 1);
}
END_TEST

Suite *canary_suite(void)
{
    Suite *s = suite_create("canary");
    TCase *tc = tcase_create("canary");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, keys_are_pinned);
    tcase_add_test(tc, names_are_checked);
    tcase_add_test(tc, state_round_trip);
    tcase_add_test(tc, bad_state_is_refused);
    tcase_add_test(tc, pick_takes_all_while_few);
    tcase_add_test(tc, pick_is_bounded_and_covers_every_key);
    suite_add_tcase(s, tc);
    return s;
}
