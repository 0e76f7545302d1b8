/* Unit tests of the settings table parser: defaults < file < flags, and
 * errors that name the setting, file and line. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "settings.h"

struct cfg {
    char listen[32];
    uint64_t threads;
    char mode[8];
};

#define F(f) SETTING_FIELD(struct cfg, f)
static const struct setting table[] = {
    {"listen", SETTING_STRING, 0, 0, NULL, "127.0.0.1:1", F(listen), "address"},
    {"threads", SETTING_UINT, 1, 64, NULL, "4", F(threads), "threads"},
    {"mode", SETTING_ENUM, 0, 0, "fast|safe", "safe", F(mode), "mode"},
};
static const struct settings_spec spec = {"prog", "test", "intro\n", table, 3};

static int load(struct cfg *c, int argc, const char **argv)
{
    memset(c, 0, sizeof(*c));
    /* Errors go to stderr; keep the test output readable. */
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    int rc = settings_load(&spec, c, argc, (char **)argv);
    fclose(stderr);
    stderr = saved;
    return rc;
}

static char *write_ini(const char *text)
{
    static char path[] = "/tmp/settings-test-XXXXXX";
    strcpy(path, "/tmp/settings-test-XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
    return path;
}

START_TEST(defaults_then_file_then_flags)
{
    struct cfg c;
    const char *a0[] = {"prog"};
    ck_assert_int_eq(load(&c, 1, a0), 0);
    ck_assert_str_eq(c.listen, "127.0.0.1:1");
    ck_assert_uint_eq(c.threads, 4);
    ck_assert_str_eq(c.mode, "safe");

    char *path = write_ini("[test]\nthreads = 9\nmode = fast\n");
    const char *a1[] = {"prog", "--config", path, "--threads=12"};
    ck_assert_int_eq(load(&c, 4, a1), 0);
    ck_assert_uint_eq(c.threads, 12);   /* the flag wins over the file */
    ck_assert_str_eq(c.mode, "fast");   /* the file wins over the default */
    unlink(path);
}
END_TEST

START_TEST(bad_values_are_refused)
{
    struct cfg c;
    const char *bad[][3] = {
        {"prog", "--threads", "0"},  {"prog", "--threads", "65"}, {"prog", "--threads", "-1"},
        {"prog", "--threads", "4x"}, {"prog", "--mode", "quick"}, {"prog", "--nope", "1"},
        {"prog", "stray", "x"},      {"prog", "--listen", ""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(load(&c, 3, bad[i]) == -1, "accepted %s %s", bad[i][1], bad[i][2]);
    const char *missing[] = {"prog", "--threads"};
    ck_assert_int_eq(load(&c, 2, missing), -1);
}
END_TEST

START_TEST(bad_file_is_refused)
{
    struct cfg c;
    const char *texts[] = {"[test]\nthreads = 100\n", "[other]\nthreads = 2\n",
                           "[test]\nunknown = 1\n", "[test]\nthreads\n"};
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        char *path = write_ini(texts[i]);
        const char *a[] = {"prog", "--config", path};
        ck_assert_msg(load(&c, 3, a) == -1, "accepted file %s", texts[i]);
        unlink(path);
    }
    const char *a[] = {"prog", "--config", "/nonexistent/settings.ini"};
    ck_assert_int_eq(load(&c, 3, a), -1);
}
END_TEST

START_TEST(help_exits_early)
{
    struct cfg c;
    const char *a[] = {"prog", "--threads", "0", "--help"};
    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w");
    int rc = load(&c, 4, a);
    fclose(stdout);
    stdout = saved;
    ck_assert_int_eq(rc, 1);
}
END_TEST

Suite *settings_suite(void)
{
    Suite *s = suite_create("settings");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, defaults_then_file_then_flags);
    tcase_add_test(tc, bad_values_are_refused);
    tcase_add_test(tc, bad_file_is_refused);
    tcase_add_test(tc, help_exits_early);
    suite_add_tcase(s, tc);
    return s;
}
