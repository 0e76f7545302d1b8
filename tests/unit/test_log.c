/* Unit tests of log: level parsing and that disabled levels do not evaluate
 * their arguments. */
#include <check.h>
#include <errno.h>

#include "log.h"

static int evaluated;

static int side_effect(void)
{
    return ++evaluated;
}

START_TEST(level_names_parse)
{
    enum log_level l;
    ck_assert_int_eq(log_level_parse("debug", &l), 0);
    ck_assert_int_eq(l, LOG_LEVEL_DEBUG);
    ck_assert_int_eq(log_level_parse("WARN", &l), 0);
    ck_assert_int_eq(l, LOG_LEVEL_WARN);
    ck_assert_int_eq(log_level_parse("off", &l), 0);
    ck_assert_int_eq(l, LOG_LEVEL_OFF);
    ck_assert_int_eq(log_level_parse("loud", &l), -EINVAL);
}
END_TEST

START_TEST(disabled_level_skips_formatting)
{
    log_set_level(LOG_LEVEL_ERROR);
    evaluated = 0;
    log_debug("%d", side_effect());
    log_info("%d", side_effect());
    ck_assert_int_eq(evaluated, 0);
    log_set_level(LOG_LEVEL_OFF);
    log_error("%d", side_effect());
    ck_assert_int_eq(evaluated, 0);
    log_set_level(LOG_LEVEL_DEBUG);
    log_debug("unit test line %d", side_effect());
    ck_assert_int_eq(evaluated, 1);
}
END_TEST

Suite *log_suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_add_test(tc, level_names_parse);
    tcase_add_test(tc, disabled_level_skips_formatting);
    suite_add_tcase(s, tc);
    return s;
}
