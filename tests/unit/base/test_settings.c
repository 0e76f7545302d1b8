/* Unit tests of the settings table parser: defaults < file < flags, and
 * errors that name the setting, file and line. */
#include <check.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "settings.h"

struct cfg {
    char listen[32];
    uint64_t threads;
    char mode[8];
    char peer[32];
    _Atomic uint64_t limit;
    char level[8];
    bool loud;
};

#define F(f) SETTING_FIELD(struct cfg, f)
static const struct setting table[] = {
    {"listen", SETTING_ADDR, 0, 0, NULL, "127.0.0.1:1", F(listen), "address"},
    {"threads", SETTING_UINT, 1, 64, NULL, "4", F(threads), "threads"},
    {"mode", SETTING_ENUM, 0, 0, "fast|safe", "safe", F(mode), "mode"},
    {"peer", SETTING_ADDR, 1, 0, NULL, "", F(peer), "peer address or empty"},
    {"limit", SETTING_UINT | SETTING_LIVE, 1, 1000, NULL, "100", F(limit), "limit"},
    {"level", SETTING_ENUM | SETTING_LIVE, 0, 0, "low|high", "low", F(level), "level"},
    {"loud", SETTING_FLAG, 0, 0, NULL, "false", F(loud), "a flag"},
};
static const struct settings_spec spec = {"prog", "test", "intro\n", table,
                                          sizeof table / sizeof table[0]};

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

static void rewrite_ini(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
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

START_TEST(flags_take_no_value_and_stay_off_the_file)
{
    struct cfg c;
    const char *a0[] = {"prog"};
    ck_assert_int_eq(load(&c, 1, a0), 0);
    ck_assert(!c.loud);
    /* The flag does not take the next argument as its value. */
    const char *a1[] = {"prog", "--loud", "--threads", "5"};
    ck_assert_int_eq(load(&c, 4, a1), 0);
    ck_assert(c.loud);
    ck_assert_uint_eq(c.threads, 5);
    const char *a2[] = {"prog", "--loud", "--loud=false"};
    ck_assert_int_eq(load(&c, 3, a2), 0);
    ck_assert(!c.loud);
    const char *a3[] = {"prog", "--loud=yes"};
    ck_assert_int_eq(load(&c, 2, a3), -1);
    /* A file cannot set it: what it allows is asked for at each start. */
    char *path = write_ini("[test]\nloud = true\n");
    const char *a4[] = {"prog", "--config", path};
    ck_assert_int_eq(load(&c, 3, a4), -1);
    char err[SETTINGS_ERRLEN];
    ck_assert_int_eq(settings_reload(&spec, &c, 3, (char **)a4, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "command-line flag"));
    unlink(path);
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

/* One address rule for every address setting: a port above 65535 would
 * wrap to another port. */
START_TEST(addresses_are_checked)
{
    struct cfg c;
    char err[SETTINGS_ERRLEN];
    const char *bad[][3] = {
        {"prog", "--listen", "127.0.0.1:99999"}, {"prog", "--listen", "h:"},
        {"prog", "--listen", ":80"},             {"prog", "--listen", "h:x"},
        {"prog", "--listen", "nohost"},          {"prog", "--peer", "h:0"},
        {"prog", "--peer", "h:65536"},           {"prog", "--peer", ":1"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(load(&c, 3, bad[i]) == -1, "accepted %s %s", bad[i][1], bad[i][2]);

    const char *a[] = {"prog", "--listen", "127.0.0.1:99999"};
    memset(&c, 0, sizeof c);
    ck_assert_int_eq(settings_reload(&spec, &c, 3, (char **)a, err), -1);
    ck_assert_str_eq(err, "listen \"127.0.0.1:99999\": the port must be a number "
                     "from 0 to 65535");

    char *path = write_ini("[test]\npeer = 10.0.0.1:70000\n");
    const char *f[] = {"prog", "--config", path};
    ck_assert_int_eq(settings_reload(&spec, &c, 3, (char **)f, err), -1);
    char want[SETTINGS_ERRLEN];
    snprintf(want, sizeof want, "%s:2: peer \"10.0.0.1:70000\": the port must be a "
             "number from 1 to 65535", path);
    ck_assert_str_eq(err, want);
    unlink(path);

    /* Port 0 where the process listens; an empty peer is its default (off). */
    const char *ok[] = {"prog", "--listen", "127.0.0.1:0", "--peer", "h:65535"};
    ck_assert_int_eq(load(&c, 5, ok), 0);
    ck_assert_str_eq(c.listen, "127.0.0.1:0");
    ck_assert_str_eq(c.peer, "h:65535");
    const char *off[] = {"prog", "--peer", ""};
    ck_assert_int_eq(load(&c, 3, off), 0);
    ck_assert_str_eq(c.peer, "");
}
END_TEST

START_TEST(reload_applies_only_live_settings)
{
    struct cfg c, next;
    char err[SETTINGS_ERRLEN];

    log_set_level(LOG_LEVEL_OFF);
    char *path = write_ini("[test]\nlimit = 10\nthreads = 2\n");
    const char *a[] = {"prog", "--config", path, "--level", "high"};
    ck_assert_int_eq(load(&c, 5, a), 0);
    ck_assert_uint_eq(c.limit, 10);

    /* limit is live; threads and listen need a restart; the --level flag
     * still overrides the file. */
    rewrite_ini(path, "[test]\nlimit = 50\nthreads = 9\nlisten = h:2\nlevel = low\n");
    memset(&next, 0, sizeof next);
    ck_assert_int_eq(settings_reload(&spec, &next, 5, (char **)a, err), 0);
    ck_assert_int_eq(settings_apply(&spec, &c, &next), 1);
    ck_assert_uint_eq(c.limit, 50);
    ck_assert_uint_eq(c.threads, 2);
    ck_assert_str_eq(c.listen, "127.0.0.1:1");
    ck_assert_str_eq(c.level, "high");

    /* A live string is copied too. */
    const char *b[] = {"prog", "--config", path};
    rewrite_ini(path, "[test]\nlimit = 50\nthreads = 2\nlevel = low\n");
    memset(&next, 0, sizeof next);
    ck_assert_int_eq(settings_reload(&spec, &next, 3, (char **)b, err), 0);
    ck_assert_int_eq(settings_apply(&spec, &c, &next), 1);
    ck_assert_str_eq(c.level, "low");
    unlink(path);
}
END_TEST

START_TEST(reload_refuses_a_bad_file_and_keeps_nothing_of_it)
{
    struct cfg next;
    char err[SETTINGS_ERRLEN], want[SETTINGS_ERRLEN];

    char *path = write_ini("[test]\nlimit = 20\nthreads = 100\n");
    const char *a[] = {"prog", "--config", path};
    memset(&next, 0, sizeof next);
    ck_assert_int_eq(settings_reload(&spec, &next, 3, (char **)a, err), -1);
    snprintf(want, sizeof want, "%s:3: threads must be an integer in 1..64, not \"100\"",
             path);
    ck_assert_str_eq(err, want);
    unlink(path);
    ck_assert_int_eq(settings_reload(&spec, &next, 3, (char **)a, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "cannot read config file"));
}
END_TEST

START_TEST(help_names_the_settings_sighup_reloads)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);

    ck_assert_ptr_nonnull(out);
    settings_usage(&spec, out, "prog");
    fclose(out);
    const char *limit = strstr(text, "--limit");
    const char *level = strstr(text, "--level");
    ck_assert_ptr_nonnull(limit);
    ck_assert_ptr_nonnull(level);
    ck_assert_ptr_nonnull(strstr(limit, "default 100; SIGHUP reloads]"));
    ck_assert_ptr_nonnull(strstr(level, "default low; SIGHUP reloads]"));
    ck_assert_ptr_nonnull(strstr(text, "[1..64; default 4]"));   /* threads */
    ck_assert_ptr_nonnull(strstr(text, "[host:port, port 0..65535; default 127.0.0.1:1]"));
    free(text);
}
END_TEST

Suite *settings_suite(void)
{
    Suite *s = suite_create("settings");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, defaults_then_file_then_flags);
    tcase_add_test(tc, bad_values_are_refused);
    tcase_add_test(tc, bad_file_is_refused);
    tcase_add_test(tc, flags_take_no_value_and_stay_off_the_file);
    tcase_add_test(tc, help_exits_early);
    tcase_add_test(tc, addresses_are_checked);
    tcase_add_test(tc, reload_applies_only_live_settings);
    tcase_add_test(tc, reload_refuses_a_bad_file_and_keeps_nothing_of_it);
    tcase_add_test(tc, help_names_the_settings_sighup_reloads);
    suite_add_tcase(s, tc);
    return s;
}
