/* Unit tests of the start-up rule (common/rpc/rpc_listen.h): what a process
 * may listen on with and without TLS and --insecure. */
#include <check.h>
#include <string.h>

#include "log.h"
#include "rpc_listen.h"

START_TEST(loopback_addresses_are_told_apart)
{
    const char *yes[] = {"127.0.0.1:7400", "127.9.8.7:0", "localhost:7400", "[::1]:7400",
                         "::1", "127.0.0.1"};
    const char *no[] = {"0.0.0.0:7400", "[::]:7400", "10.0.0.1:7400", "128.0.0.1:1",
                        "example.com:7400", "localhost.example.com:1", "[::2]:1",
                        "[::1:1", ""};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        ck_assert_msg(rpc_listen_loopback(yes[i]), "%s is loopback", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        ck_assert_msg(!rpc_listen_loopback(no[i]), "%s is not loopback", no[i]);
}
END_TEST

START_TEST(plaintext_only_on_loopback_unless_insecure)
{
    char err[RPC_LISTEN_ERRLEN];
    log_set_level(LOG_LEVEL_OFF);
    struct rpc_listen_rule r = {.listen = "127.0.0.1:7400", .has_internal = true};
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);
    r.listen = "0.0.0.0:7400";
    ck_assert_int_eq(rpc_listen_check(&r, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "listen 0.0.0.0:7400"));
    ck_assert_ptr_nonnull(strstr(err, "--insecure"));
    r.insecure = true;
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);
    /* The internal listener follows the same rule. */
    r = (struct rpc_listen_rule){.listen = "127.0.0.1:7400",
                                 .internal_listen = "10.0.0.1:7401", .has_internal = true};
    ck_assert_int_eq(rpc_listen_check(&r, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "internal_listen 10.0.0.1:7401"));
    r.insecure = true;
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);
    log_set_level(LOG_LEVEL_INFO);
}
END_TEST

START_TEST(tls_settings_go_together)
{
    char err[RPC_LISTEN_ERRLEN];
    struct rpc_listen_rule r = {.listen = "0.0.0.0:7500", .tls_cert = "c.pem",
                                .tls_key = "c.key", .tls_ca = "ca.pem", .tokens = true};
    ck_assert(rpc_listen_tls(&r));
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);   /* a router with TLS */
    r.tls_key = "";
    ck_assert(!rpc_listen_tls(&r));
    ck_assert_int_eq(rpc_listen_check(&r, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "tls_key"));
    r.tls_key = "c.key";
    r.tls_ca = NULL;
    ck_assert_int_eq(rpc_listen_check(&r, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "tls_ca"));
}
END_TEST

START_TEST(a_node_with_tls_needs_an_internal_listener)
{
    char err[RPC_LISTEN_ERRLEN];
    struct rpc_listen_rule r = {.listen = "10.0.0.1:7400", .has_internal = true,
                                .tls_cert = "c.pem", .tls_key = "c.key",
                                .tls_ca = "ca.pem", .tokens = true};
    ck_assert_int_eq(rpc_listen_check(&r, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "internal_listen"));
    r.internal_listen = "10.0.0.1:7401";
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);
    r.internal_listen = "";
    r.insecure = true;   /* --insecure is about plaintext, not this */
    ck_assert_int_eq(rpc_listen_check(&r, err), -1);
}
END_TEST

START_TEST(public_listeners_off_loopback_need_tokens)
{
    char err[RPC_LISTEN_ERRLEN];
    log_set_level(LOG_LEVEL_OFF);
    struct rpc_listen_rule r = {.listen = "10.0.0.1:7500", .tls_cert = "c.pem",
                                .tls_key = "c.key", .tls_ca = "ca.pem"};
    ck_assert_int_eq(rpc_listen_check(&r, err), -1);   /* TLS, no tokens */
    ck_assert_ptr_nonnull(strstr(err, "tokens_file"));
    ck_assert_ptr_nonnull(strstr(err, "listen 10.0.0.1:7500"));
    r.tokens = true;
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);
    r.tokens = false;
    r.insecure = true;
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);    /* warned about */
    /* Loopback needs neither; nor does the node's internal listener
     * (client certificates are required there). */
    r = (struct rpc_listen_rule){.listen = "[::ffff:127.0.0.1]:7500"};
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);
    r = (struct rpc_listen_rule){.listen = "127.0.0.1:7400", .has_internal = true,
                                 .internal_listen = "10.0.0.1:7401", .tls_cert = "c.pem",
                                 .tls_key = "c.key", .tls_ca = "ca.pem"};
    ck_assert_int_eq(rpc_listen_check(&r, err), 0);
    /* Without TLS, a tokens file alone does not make plaintext acceptable. */
    r = (struct rpc_listen_rule){.listen = "0.0.0.0:7400", .tokens = true};
    ck_assert_int_eq(rpc_listen_check(&r, err), -1);
    ck_assert_ptr_nonnull(strstr(err, "TLS"));
    log_set_level(LOG_LEVEL_INFO);
}
END_TEST

Suite *rpc_listen_suite(void)
{
    Suite *s = suite_create("rpc_listen");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, loopback_addresses_are_told_apart);
    tcase_add_test(tc, plaintext_only_on_loopback_unless_insecure);
    tcase_add_test(tc, tls_settings_go_together);
    tcase_add_test(tc, a_node_with_tls_needs_an_internal_listener);
    tcase_add_test(tc, public_listeners_off_loopback_need_tokens);
    suite_add_tcase(s, tc);
    return s;
}
