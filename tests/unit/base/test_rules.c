/* Unit tests of rules: the name, key and shard rules every process shares,
 * with pinned messages and shard names. */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "rules.h"
#include "store.h"

static void fill(char *buf, size_t n, char c)
{
    memset(buf, c, n);
    buf[n] = 0;
}

START_TEST(filter_names_follow_the_documented_alphabet)
{
    char err[RULES_ERRLEN], name[RULES_FILTER_NAME_MAX + 2];

    ck_assert_int_eq(rules_filter_name_check("users_2024-v1.x", 15, err), 0);
    ck_assert_int_eq(rules_filter_name_check(".x", 2, err), -EINVAL);
    ck_assert_str_eq(err, "filter name \".x\" must not start with a dot");
    ck_assert_int_eq(rules_filter_name_check("", 0, err), -EINVAL);
    ck_assert_int_eq(rules_filter_name_check("a b", 3, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "bad byte 0x20 at position 1"));
    ck_assert_int_eq(rules_filter_name_check("a/b", 3, err), -EINVAL);
    ck_assert_int_eq(rules_filter_name_check("f.shard-1", 9, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "reserved for shards"));
    fill(name, RULES_FILTER_NAME_MAX, 'n');
    ck_assert_int_eq(rules_filter_name_check(name, strlen(name), err), 0);
    fill(name, RULES_FILTER_NAME_MAX + 1, 'n');
    ck_assert_int_eq(rules_filter_name_check(name, strlen(name), err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "is 129 bytes long; it must be 1 to 128"));
}
END_TEST

START_TEST(nul_and_bad_utf8_are_refused)
{
    char err[RULES_ERRLEN];

    /* The name check sees every byte, so "x\0y" is not "x". */
    ck_assert_int_eq(rules_filter_name_check("x\0y", 3, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "bad byte 0x00 at position 1"));
    ck_assert_ptr_nonnull(strstr(err, "\"x\\x00y\""));
    ck_assert_int_eq(rules_string_check("node", "a\0b", 3, err), -EINVAL);
    ck_assert_str_eq(err, "node \"a\\x00b\" contains a NUL byte at position 1");
    ck_assert_int_eq(rules_string_check("node", "h\xc3\xa9", 3, err), 0);
    ck_assert_int_eq(rules_string_check("node", "\xc3", 1, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "is not valid UTF-8"));
}
END_TEST

START_TEST(utf8_validation_known_answers)
{
    static const struct {
        const char *s;
        bool ok;
    } cases[] = {
        {"", true},
        {"plain ascii", true},
        {"\xc3\xa9", true},              /* U+00E9 */
        {"\xe2\x82\xac", true},          /* U+20AC */
        {"\xf0\x9f\x98\x80", true},      /* U+1F600 */
        {"\xf4\x8f\xbf\xbf", true},      /* U+10FFFF */
        {"\xc0\xaf", false},             /* overlong '/' */
        {"\xe0\x80\xaf", false},         /* overlong */
        {"\xed\xa0\x80", false},         /* surrogate U+D800 */
        {"\xf4\x90\x80\x80", false},     /* above U+10FFFF */
        {"\x80", false},                 /* lone continuation */
        {"\xe2\x82", false},             /* truncated */
        {"\xff", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        ck_assert_msg(rules_utf8_valid(cases[i].s, strlen(cases[i].s)) == cases[i].ok,
                      "case %zu", i);
}
END_TEST

START_TEST(every_valid_name_has_shard_names_for_4096_shards)
{
    char name[RULES_FILTER_NAME_MAX + 1], out[RULES_STORE_NAME_MAX + 1];
    char err[RULES_ERRLEN];

    fill(name, RULES_FILTER_NAME_MAX, 'z');
    ck_assert_int_eq(rules_shard_name(out, sizeof out, name, 4095, 4096, err), 0);
    ck_assert_int_eq(strlen(out), RULES_STORE_NAME_MAX);
    ck_assert_int_eq(rules_store_name_check(out, strlen(out), err), 0);
    ck_assert_int_eq(store_name_check(out, err), 0);
    ck_assert(rules_is_shard_name(out));
    /* Pinned: the store names of shards a router creates. */
    ck_assert_int_eq(rules_shard_name(out, sizeof out, "users", 7, 16, err), 0);
    ck_assert_str_eq(out, "users.shard-7");
    ck_assert_int_eq(rules_shard_name(out, sizeof out, "users", 0, 16, err), 0);
    ck_assert_str_eq(out, "users.shard-0");
    ck_assert_int_eq(rules_shard_name(out, sizeof out, "u", 10, 64, err), 0);
    ck_assert_str_eq(out, "u.shard-10");
    ck_assert_int_eq(rules_shard_name(out, sizeof out, "users", 4095, 4096, err), 0);
    ck_assert_str_eq(out, "users.shard-4095");
    /* The name and its terminator must fit: 13 bytes for "users.shard-7". */
    char small[13];
    ck_assert_int_eq(rules_shard_name(small, sizeof small, "users", 7, 16, err), -EINVAL);
    ck_assert_int_eq(rules_shard_name(small, sizeof small, "users", 0, 1, err), 0);
    ck_assert_str_eq(small, "users");
    char exact[14];
    ck_assert_int_eq(rules_shard_name(exact, sizeof exact, "users", 7, 16, err), 0);
    ck_assert_str_eq(exact, "users.shard-7");
    ck_assert_int_eq(rules_shard_name(out, sizeof out, "users", 0, 1, err), 0);
    ck_assert_str_eq(out, "users");
    ck_assert(!rules_is_shard_name(out));
    ck_assert_int_eq(rules_shard_name(out, sizeof out, "users", 16, 16, err), -EINVAL);
    ck_assert_int_eq(rules_shard_name(out, sizeof out, "users", 0, 4097, err), -EINVAL);
    ck_assert_int_eq(rules_shard_name(out, sizeof out, ".users", 0, 2, err), -EINVAL);
}
END_TEST

START_TEST(keys_and_parameters)
{
    char err[RULES_ERRLEN];

    ck_assert_int_eq(rules_key_check(0, 1, 4096, err), 0);
    ck_assert_int_eq(rules_key_check(3, 0, 4096, err), -EINVAL);
    ck_assert_str_eq(err, "key 3 is empty; keys must be 1..4096 bytes");
    ck_assert_int_eq(rules_key_check(5, 4097, 4096, err), -EINVAL);
    ck_assert_str_eq(err, "key 5 is 4097 bytes; the limit is 4096 (max_key_size)");
    ck_assert_int_eq(rules_params_check(0, 0.01, err), -EINVAL);
    ck_assert_int_eq(rules_params_check(10, 1.0, err), -EINVAL);
    ck_assert_int_eq(rules_params_check(10, 0.0, err), -EINVAL);
    ck_assert_int_eq(rules_params_check(UINT64_MAX, 0.5, err), 0);
    ck_assert_int_eq(rules_shard_count_check(0, err), -EINVAL);
    ck_assert_int_eq(rules_shard_count_check(4096, err), 0);
    ck_assert_int_eq(rules_shard_count_check(4097, err), -EINVAL);
}
END_TEST

START_TEST(shard_capacity_never_overflows)
{
    ck_assert_uint_eq(rules_shard_capacity(UINT64_MAX, 4), UINT64_MAX / 4 + 1);
    ck_assert_uint_eq(rules_shard_capacity(UINT64_MAX, 1), UINT64_MAX);
    ck_assert_uint_eq(rules_shard_capacity(1000, 3), 334);
    ck_assert_uint_eq(rules_shard_capacity(999, 3), 333);
    ck_assert_uint_eq(rules_shard_capacity(1, 4096), 1);
}
END_TEST

START_TEST(addresses_follow_one_rule)
{
    static const char *const bad[] = {"127.0.0.1:99999", "h:65536", "h:123456",
                                      "h:", "h:x", "h:+1", "h:-1", "h: 1",
                                      "h:1x", ":1", "nohost", "", "a b:1",
                                      "a\tb:1", "h:0x50"};
    char err[RULES_ERRLEN];

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_msg(rules_addr_check("listen", bad[i], true, err) == -EINVAL,
                      "accepted \"%s\"", bad[i]);
        ck_assert_msg(rules_addr_check("primary", bad[i], false, NULL) == -EINVAL,
                      "accepted \"%s\"", bad[i]);
    }
    ck_assert_int_eq(rules_addr_check("listen", "127.0.0.1:99999", true, err), -EINVAL);
    ck_assert_str_eq(err, "listen \"127.0.0.1:99999\": the port must be a number "
                     "from 0 to 65535");
    ck_assert_int_eq(rules_addr_check("primary", ":7400", false, err), -EINVAL);
    ck_assert_str_eq(err, "primary \":7400\" has no host (host:port)");
    ck_assert_int_eq(rules_addr_check("--server", "nohost", false, err), -EINVAL);
    ck_assert_str_eq(err, "--server \"nohost\" is not host:port");
    /* Port 0 asks for a free port: only where the process listens. */
    ck_assert_int_eq(rules_addr_check("listen", "127.0.0.1:0", true, err), 0);
    ck_assert_int_eq(rules_addr_check("primary", "h:0", false, err), -EINVAL);
    ck_assert_str_eq(err, "primary \"h:0\": the port must be a number from 1 to 65535");
    ck_assert_int_eq(rules_addr_check("primary", "h:65535", false, err), 0);
    ck_assert_int_eq(rules_addr_check("primary", "h:1", false, err), 0);
    ck_assert_int_eq(rules_addr_check("primary", "[::1]:7400", false, err), 0);
    ck_assert_int_eq(rules_addr_check("primary", "node-3.example:07400", false, err), 0);
}
END_TEST

Suite *rules_suite(void)
{
    Suite *s = suite_create("rules");
    TCase *tc = tcase_create("rules");
    tcase_add_test(tc, filter_names_follow_the_documented_alphabet);
    tcase_add_test(tc, nul_and_bad_utf8_are_refused);
    tcase_add_test(tc, utf8_validation_known_answers);
    tcase_add_test(tc, every_valid_name_has_shard_names_for_4096_shards);
    tcase_add_test(tc, keys_and_parameters);
    tcase_add_test(tc, shard_capacity_never_overflows);
    tcase_add_test(tc, addresses_follow_one_rule);
    suite_add_tcase(s, tc);
    return s;
}
