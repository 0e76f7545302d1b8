/* Unit tests of log: level parsing and that disabled levels do not evaluate
 * their arguments. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* One line logged at info, as written to stderr. */
static void capture(const char *msg, char *out, size_t len)
{
    int fds[2], saved = dup(2);
    ck_assert_int_eq(pipe(fds), 0);
    dup2(fds[1], 2);
    log_set_level(LOG_LEVEL_INFO);
    log_info("%s", msg);
    dup2(saved, 2);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], out, len - 1);
    close(fds[0]);
    out[n > 0 ? n : 0] = 0;
}

START_TEST(json_lines_and_journal_priorities)
{
    char line[4096];
    enum log_format f;
    ck_assert_int_eq(log_format_parse("json", &f), 0);
    ck_assert_int_eq(f, LOG_FORMAT_JSON);
    ck_assert_int_eq(log_format_parse("xml", &f), -EINVAL);
    log_set_ident("bloomgrid-test");
    unsetenv("JOURNAL_STREAM");
    log_set_format(LOG_FORMAT_JSON);
    capture("a \"quoted\" back\\slash\nnew line\ttab", line, sizeof line);
    ck_assert_msg(strncmp(line, "{\"time\":\"20", 11) == 0, "%s", line);
    ck_assert_msg(strstr(line, "\"level\":\"info\",\"program\":\"bloomgrid-test\","
                               "\"source\":\"test_log.c:"), "%s", line);
    ck_assert_msg(strstr(line, "\"msg\":\"a \\\"quoted\\\" back\\\\slash"
                               "\\u000anew line\\u0009tab\"}\n"), "%s", line);
    ck_assert_ptr_null(strchr(line, '\n') + 1 == line + strlen(line) ? NULL : line);
    log_set_format(LOG_FORMAT_TEXT);
    setenv("JOURNAL_STREAM", "8:1234", 1);
    capture("to the journal", line, sizeof line);
    ck_assert_msg(strncmp(line, "<6>bloomgrid-test info test_log.c:", 34) == 0, "%s", line);
    unsetenv("JOURNAL_STREAM");
    capture("to a terminal", line, sizeof line);
    ck_assert_msg(strncmp(line, "20", 2) == 0 && strstr(line, " bloomgrid-test info "), "%s",
                  line);
    log_set_ident("bloomgrid");
}
END_TEST

/* What log_announce writes on stdout. */
static void capture_stdout(const char *msg, char *out, size_t len)
{
    int fds[2], saved = dup(1);
    ck_assert_int_eq(pipe(fds), 0);
    fflush(stdout);
    dup2(fds[1], 1);
    log_set_level(LOG_LEVEL_OFF);       /* the line is written whatever the level */
    log_announce("%s listening on %s", "bloomgrid-test", msg);
    dup2(saved, 1);
    close(saved);
    close(fds[1]);
    ssize_t n = read(fds[0], out, len - 1);
    close(fds[0]);
    out[n > 0 ? n : 0] = 0;
    log_set_level(LOG_LEVEL_INFO);
}

START_TEST(announce_follows_the_format)
{
    char line[4096];

    log_set_ident("bloomgrid-test");
    log_set_format(LOG_FORMAT_TEXT);
    capture_stdout("127.0.0.1:7400", line, sizeof line);
    ck_assert_str_eq(line, "bloomgrid-test listening on 127.0.0.1:7400\n");
    log_set_format(LOG_FORMAT_JSON);
    capture_stdout("127.0.0.1:7400 health 127.0.0.1:7401", line, sizeof line);
    ck_assert_msg(strncmp(line, "{\"time\":\"20", 11) == 0, "%s", line);
    ck_assert_msg(strstr(line, "\"level\":\"info\",\"program\":\"bloomgrid-test\","
                               "\"source\":\"test_log.c:"), "%s", line);
    ck_assert_msg(strstr(line, "\"msg\":\"bloomgrid-test listening on 127.0.0.1:7400 "
                               "health 127.0.0.1:7401\"}\n"), "%s", line);
    ck_assert_ptr_eq(strchr(line, '\n'), line + strlen(line) - 1);
    log_set_format(LOG_FORMAT_TEXT);
    log_set_ident("bloomgrid");
}
END_TEST

Suite *log_suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_add_test(tc, level_names_parse);
    tcase_add_test(tc, disabled_level_skips_formatting);
    tcase_add_test(tc, json_lines_and_journal_priorities);
    tcase_add_test(tc, announce_follows_the_format);
    suite_add_tcase(s, tc);
    return s;
}
