/* Unit tests of rpc_auth: the tokens file parser, the table of who may call
 * what and the decision, reloads of a running table, the start-up rule. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "bloomgrid/v1/merger.pb-c.h"
#include "rpc_auth.h"
#include "unit_tmpdir.h"

/* sha256sum of "bgt-read-0001", "bgt-write-0001", "bgt-admin-0001". */
#define H_READ "f4e97fa3e78f773c111d108e174c7197656c5a68f26cce2f8dfc9bc0de41d33f"
#define H_WRITE "53c7268a661edbea4ecafe830861f89bb8eb4d95f0a64fbbc0d069ad885bca71"
#define H_ADMIN "75c3d3777c1e033c564c3ca76cbaa744866ec9b7cca48ca17c4ff53aa4872d9c"

static struct rpc_tokens *parse(const char *text, char *err)
{
    return rpc_tokens_parse(text, strlen(text), "tokens", err);
}

static enum rpc_role role_of(const struct rpc_tokens *t, const char *token,
                             const char **name)
{
    uint8_t d[RPC_TOKEN_DIGEST];
    rpc_token_digest(token, strlen(token), d);
    return rpc_tokens_find(t, d, name);
}

START_TEST(token_digest_is_sha256)
{
    uint8_t d[RPC_TOKEN_DIGEST];
    char hex[2 * RPC_TOKEN_DIGEST + 1];
    rpc_token_digest("bgt-admin-0001", 14, d);
    for (int i = 0; i < RPC_TOKEN_DIGEST; i++)
        sprintf(hex + 2 * i, "%02x", d[i]);
    ck_assert_str_eq(hex, H_ADMIN);
}
END_TEST

START_TEST(tokens_file_parses_roles_comments_and_blank_lines)
{
    char err[RPC_AUTH_ERRLEN] = "";
    const char *name = NULL;
    struct rpc_tokens *t = parse("# who may call\n"
                                 "\n"
                                 "read reader " H_READ "\n"
                                 "  \t# indented comment\n"
                                 "write\tci\t" H_WRITE "\r\n"
                                 "   admin ops   " "75C3D3777C1E033C564C3CA76CBAA744866EC9B7CCA48CA17C4FF53AA4872D9C",
                                 err);
    ck_assert_msg(t != NULL, "%s", err);
    ck_assert_uint_eq(rpc_tokens_count(t), 3);
    ck_assert_int_eq(role_of(t, "bgt-read-0001", &name), RPC_ROLE_READ);
    ck_assert_str_eq(name, "reader");
    ck_assert_int_eq(role_of(t, "bgt-write-0001", &name), RPC_ROLE_WRITE);
    ck_assert_str_eq(name, "ci");
    ck_assert_int_eq(role_of(t, "bgt-admin-0001", &name), RPC_ROLE_ADMIN);
    ck_assert_str_eq(name, "ops");
    ck_assert_int_eq(role_of(t, "bgt-admin-0002", NULL), RPC_ROLE_NONE);
    ck_assert_int_eq(role_of(t, "", NULL), RPC_ROLE_NONE);
    rpc_tokens_free(t);

    /* An empty file is a table that admits no one. */
    t = parse("", err);
    ck_assert_ptr_nonnull(t);
    ck_assert_uint_eq(rpc_tokens_count(t), 0);
    ck_assert_int_eq(role_of(t, "bgt-read-0001", NULL), RPC_ROLE_NONE);
    rpc_tokens_free(t);
}
END_TEST

START_TEST(bad_lines_refuse_the_file_with_their_number)
{
    static const struct {
        const char *text, *msg;
    } cases[] = {
        {"read a " H_READ "\nsuper b " H_WRITE "\n",
         "tokens:2: role \"super\" is not read, write or admin"},
        {"read a " H_READ "\n\n# x\nwrite b\n",
         "tokens:4: expected \"ROLE NAME SHA256HEX\" (3 fields), found 2"},
        {"read a " H_READ " extra\n",
         "tokens:1: expected \"ROLE NAME SHA256HEX\" (3 fields), found 4"},
        {"read a b c d e\n", "tokens:1: expected \"ROLE NAME SHA256HEX\" (3 fields), "
                             "found more than 4"},
        {"read a/b " H_READ "\n", "tokens:1: token name \"a/b\" must be 1 to 64 bytes"},
        {"read a " H_READ "0\n", "tokens:1: the SHA-256 of token \"a\" must be 64 hex"},
        {"read a f4e97fa3e78f773c111d108e174c7197656c5a68f26cce2f8dfc9bc0de41d3zz\n",
         "tokens:1: the SHA-256 of token \"a\" must be 64 hex"},
        {"read a " H_READ "\nwrite a " H_WRITE "\n",
         "tokens:2: token name \"a\" is already used on line 1"},
        {"read a " H_READ "\nadmin b " H_READ "\n",
         "tokens:2: token \"b\" has the same SHA-256 as token \"a\" on line 1"},
        {"read a\x01 " H_READ "\n", "tokens:1: control byte 0x01"},
        {"read a " H_READ "\0\n", "tokens:1: control byte 0x00"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char err[RPC_AUTH_ERRLEN] = "";
        /* The NUL case is one byte longer than strlen says. */
        size_t len = strlen(cases[i].text);
        if (strstr(cases[i].msg, "0x00"))
            len += 2;
        struct rpc_tokens *t = rpc_tokens_parse(cases[i].text, len, "tokens", err);
        ck_assert_msg(t == NULL, "case %zu accepted", i);
        ck_assert_msg(strncmp(err, cases[i].msg, strlen(cases[i].msg)) == 0,
                      "case %zu: \"%s\"", i, err);
    }
}
END_TEST

START_TEST(a_file_of_too_many_lines_is_refused_before_any_is_parsed)
{
    size_t n = 100001, len = 2 * n;
    char *text = malloc(len + 1), err[RPC_AUTH_ERRLEN] = "";
    ck_assert_ptr_nonnull(text);
    for (size_t i = 0; i < n; i++)
        memcpy(text + 2 * i, "x\n", 2);
    text[len] = 0;
    ck_assert_ptr_null(rpc_tokens_parse(text, len, "tokens", err));
    ck_assert_str_eq(err, "tokens: 100001 lines of tokens, more than 100000");
    /* Blank and comment lines do not count. */
    for (size_t i = 0; i < n; i++)
        memcpy(text + 2 * i, i % 2 ? "#\n" : " \n", 2);
    struct rpc_tokens *t = rpc_tokens_parse(text, len, "tokens", err);
    ck_assert_msg(t != NULL, "%s", err);
    rpc_tokens_free(t);
    free(text);
}
END_TEST

/* The roles of the public API as docs/SECURITY.md lists them, written out
 * here apart from rpc_auth.c's table. */
static enum rpc_role public_role(const char *method)
{
    static const char *const reads[] = {"MayContain", "MayContainStream", "GetFilter",
                                        "ListFilters"};
    static const char *const writes[] = {"Add", "AddStream", "Import"};
    for (size_t i = 0; i < 4; i++)
        if (strcmp(method, reads[i]) == 0)
            return RPC_ROLE_READ;
    for (size_t i = 0; i < 3; i++)
        if (strcmp(method, writes[i]) == 0)
            return RPC_ROLE_WRITE;
    return RPC_ROLE_ADMIN;
}

/* Every method of sd, every kind of caller. */
static void check_service(const ProtobufCServiceDescriptor *sd, bool peers_only)
{
    for (unsigned i = 0; i < sd->n_methods; i++) {
        char path[256];
        snprintf(path, sizeof path, "/%s/%s", sd->name, sd->methods[i].name);
        enum rpc_auth_rule rule = rpc_auth_rule_of(path);
        enum rpc_role need = peers_only ? RPC_ROLE_ADMIN : public_role(sd->methods[i].name);
        /* Internal Resync: an operator's admin token, never a certificate
         * alone (docs/SECURITY.md). */
        bool cert_opens = peers_only && strcmp(path, "/bloomgrid.v1.Internal/Resync") != 0;
        for (int tokens = 0; tokens < 2; tokens++)
            for (int cert = 0; cert < 2; cert++)
                for (int has = 0; has < 2; has++)
                    for (int role = RPC_ROLE_NONE; role <= RPC_ROLE_ADMIN; role++) {
                        if (!has && role != RPC_ROLE_NONE)
                            continue;
                        struct rpc_caller c = {.tokens = tokens, .has_token = has,
                                               .role = (enum rpc_role)role,
                                               .peer_cert = cert};
                        grpc_status_code want;
                        if (!tokens || (cert_opens && cert))
                            want = GRPC_STATUS_OK;
                        else if (role == RPC_ROLE_NONE)
                            want = GRPC_STATUS_UNAUTHENTICATED;
                        else if (role < (int)need)
                            want = GRPC_STATUS_PERMISSION_DENIED;
                        else
                            want = GRPC_STATUS_OK;
                        ck_assert_msg(rpc_auth_decide(rule, &c) == want,
                                      "%s tokens %d cert %d token %d role %d", path,
                                      tokens, cert, has, role);
                    }
    }
}

START_TEST(every_method_has_the_documented_rule)
{
    check_service(&bloomgrid__v1__bloom_grid__descriptor, false);
    check_service(&bloomgrid__v1__internal__descriptor, true);
    check_service(&bloomgrid__v1__merger__descriptor, true);

    /* Health is open to anyone; a service no table names is for peers. */
    struct rpc_caller nobody = {.tokens = true};
    ck_assert_int_eq(rpc_auth_decide(rpc_auth_rule_of("/grpc.health.v1.Health/Check"),
                                     &nobody), GRPC_STATUS_OK);
    ck_assert_int_eq(rpc_auth_decide(rpc_auth_rule_of("/grpc.health.v1.Health/Watch"),
                                     &nobody), GRPC_STATUS_OK);
    ck_assert_int_eq(rpc_auth_rule_of("/bloomgrid.v2.Future/Call"), RPC_AUTH_PEER);
    ck_assert_int_eq(rpc_auth_rule_of("/bloomgrid.v1.BloomGrid/Unknown"), RPC_AUTH_PEER);
    /* A certificate opens no public method by itself. */
    struct rpc_caller cert = {.tokens = true, .peer_cert = true};
    ck_assert_int_eq(rpc_auth_decide(RPC_AUTH_READ, &cert), GRPC_STATUS_UNAUTHENTICATED);
}
END_TEST

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(reload_swaps_the_table_or_keeps_the_old_one)
{
    char dir[512], path[600], err[RPC_AUTH_ERRLEN];
    unit_tmpdir_make(dir, sizeof dir, "rpc_auth");
    snprintf(path, sizeof path, "%s/tokens", dir);
    write_text(path, "write ci " H_WRITE "\nadmin ops " H_ADMIN "\n");
    struct rpc_auth *a = rpc_auth_create(path, err);
    ck_assert_msg(a != NULL, "%s", err);

    /* Admitting is tested end to end by tests/integ/test_auth.c; here the
     * table behind a stream's re-check. */
    struct rpc_auth_who who = {.rule = RPC_AUTH_WRITE, .by_token = true, .gen = 0};
    struct rpc_status st;
    rpc_token_digest("bgt-write-0001", 14, who.digest);
    snprintf(who.name, sizeof who.name, "ci");
    ck_assert_int_eq(rpc_auth_recheck(a, "/x/Add", NULL, &who, &st), 0);

    write_text(path, "read ci " H_READ "\nwrite\n");
    ck_assert_int_eq(rpc_auth_reload(a, err), -EINVAL);
    ck_assert_msg(strstr(err, "tokens:2:") != NULL, "%s", err);
    ck_assert_int_eq(rpc_auth_recheck(a, "/x/Add", NULL, &who, &st), 0);

    /* The write token demoted to read: its streams stop. */
    write_text(path, "read ci " H_WRITE "\n");
    ck_assert_int_eq(rpc_auth_reload(a, err), 0);
    ck_assert_int_eq(rpc_auth_recheck(a, "/x/Add", NULL, &who, &st), -EACCES);
    ck_assert_int_eq(st.code, GRPC_STATUS_PERMISSION_DENIED);
    /* Removed: unknown. */
    write_text(path, "admin ops " H_ADMIN "\n");
    ck_assert_int_eq(rpc_auth_reload(a, err), 0);
    ck_assert_int_eq(rpc_auth_recheck(a, "/x/Add", NULL, &who, &st), -EACCES);
    ck_assert_int_eq(st.code, GRPC_STATUS_UNAUTHENTICATED);
    /* A call admitted by a certificate is not re-checked. */
    who.by_token = false;
    ck_assert_int_eq(rpc_auth_recheck(a, "/x/Add", NULL, &who, &st), 0);

    unlink(path);
    ck_assert_int_eq(rpc_auth_reload(a, err), -EINVAL);
    rpc_auth_destroy(a);
    ck_assert_ptr_null(rpc_auth_create(path, err));
    unit_tmpdir_remove(dir);
}
END_TEST

START_TEST(tokens_read_from_files_and_checked)
{
    char dir[512], path[600], buf[RPC_TOKEN_MAX + 1], err[RPC_AUTH_ERRLEN];
    unit_tmpdir_make(dir, sizeof dir, "rpc_auth");
    snprintf(path, sizeof path, "%s/token", dir);
    write_text(path, "  bgt-admin-0001\n\n");
    ck_assert_int_eq(rpc_token_read(path, buf, err), 0);
    ck_assert_str_eq(buf, "bgt-admin-0001");
    write_text(path, "two words\n");
    ck_assert_int_eq(rpc_token_read(path, buf, err), -EINVAL);
    ck_assert_msg(strstr(err, "without spaces; byte 3 is 0x20") != NULL, "%s", err);
    write_text(path, "\n");
    ck_assert_int_eq(rpc_token_read(path, buf, err), -EINVAL);
    ck_assert_int_eq(rpc_token_check("t", "\xc3\xa9", 2, err), -EINVAL);
    ck_assert_int_eq(rpc_token_check("t", "a", 1, err), 0);
    ck_assert(rpc_token_name_ok("ci-1.x_y", 8));
    ck_assert(!rpc_token_name_ok("", 0));
    ck_assert(!rpc_token_name_ok("a b", 3));
    unit_tmpdir_remove(dir);
}
END_TEST

Suite *rpc_auth_suite(void)
{
    Suite *s = suite_create("rpc_auth");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, token_digest_is_sha256);
    tcase_add_test(tc, tokens_file_parses_roles_comments_and_blank_lines);
    tcase_add_test(tc, bad_lines_refuse_the_file_with_their_number);
    tcase_add_test(tc, a_file_of_too_many_lines_is_refused_before_any_is_parsed);
    tcase_add_test(tc, every_method_has_the_documented_rule);
    tcase_add_test(tc, reload_swaps_the_table_or_keeps_the_old_one);
    tcase_add_test(tc, tokens_read_from_files_and_checked);
    suite_add_tcase(s, tc);
    return s;
}
