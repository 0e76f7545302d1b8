/* Tests of resp_proto: the request parser (whole, byte by byte, limits,
 * malformed input, inline commands) and the reply writer. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "resp_proto.h"

static const struct resp_limits lim = {.max_args = 8, .max_bulk = 16, .max_command = 150};

static int parse_all(struct resp_parser *p, const char *s)
{
    resp_parser_reset(p);
    return resp_parse(p, s, strlen(s));
}

static bool arg_eq(const struct resp_parser *p, const char *buf, size_t i, const char *want)
{
    return p->len[i] == strlen(want) && memcmp(buf + p->off[i], want, p->len[i]) == 0;
}

START_TEST(parse_array_command)
{
    struct resp_parser p;
    resp_parser_init(&p, &lim);
    const char *s = "*3\r\n$6\r\nBF.ADD\r\n$1\r\nf\r\n$3\r\nkey\r\n*1\r\n";
    ck_assert_int_eq(parse_all(&p, s), RESP_PARSE_DONE);
    ck_assert_uint_eq(p.argc, 3);
    ck_assert(arg_eq(&p, s, 0, "BF.ADD") && arg_eq(&p, s, 1, "f") && arg_eq(&p, s, 2, "key"));
    ck_assert_uint_eq(p.used, strlen(s) - 4);   /* the next command is not taken */
    resp_parser_deinit(&p);
}
END_TEST

/* Fed one byte more at a time, the parser answers MORE until the last
 * byte and then the same command. */
START_TEST(parse_byte_by_byte)
{
    struct resp_parser p;
    resp_parser_init(&p, &lim);
    const char *s = "*2\r\n$4\r\nPING\r\n$0\r\n\r\n";
    size_t n = strlen(s);
    resp_parser_reset(&p);
    for (size_t i = 0; i < n; i++)
        ck_assert_int_eq(resp_parse(&p, s, i), RESP_PARSE_MORE);
    ck_assert_int_eq(resp_parse(&p, s, n), RESP_PARSE_DONE);
    ck_assert_uint_eq(p.argc, 2);
    ck_assert(arg_eq(&p, s, 0, "PING") && arg_eq(&p, s, 1, ""));
    ck_assert_uint_eq(p.used, n);
    resp_parser_deinit(&p);
}
END_TEST

START_TEST(parse_inline)
{
    struct resp_parser p;
    resp_parser_init(&p, &lim);
    const char *s = "BF.EXISTS  f \"two words\"\r\n";
    ck_assert_int_eq(parse_all(&p, s), RESP_PARSE_DONE);
    ck_assert_uint_eq(p.argc, 3);
    ck_assert(arg_eq(&p, s, 0, "BF.EXISTS") && arg_eq(&p, s, 2, "two words"));
    ck_assert_int_eq(parse_all(&p, "\r\n"), RESP_PARSE_DONE);
    ck_assert(p.empty);
    ck_assert_int_eq(parse_all(&p, "PING"), RESP_PARSE_MORE);
    ck_assert_int_eq(parse_all(&p, "ECHO \"x\r\n"), RESP_PARSE_ERROR);
    ck_assert_str_eq(p.err, "Protocol error: unbalanced quotes in request");
    resp_parser_deinit(&p);
}
END_TEST

/* Every count is checked before it is used: too many arguments, too long
 * an argument, too long a command, a malformed header. */
START_TEST(parse_refuses_past_limits)
{
    struct resp_parser p;
    resp_parser_init(&p, &lim);
    ck_assert_int_eq(parse_all(&p, "*9\r\n"), RESP_PARSE_ERROR);
    ck_assert_ptr_nonnull(strstr(p.err, "invalid multibulk length"));
    ck_assert_int_eq(parse_all(&p, "*2000000000\r\n"), RESP_PARSE_ERROR);
    ck_assert_uint_eq(p.cap, 0);   /* nothing was allocated for it */
    ck_assert_int_eq(parse_all(&p, "*1\r\n$17\r\n"), RESP_PARSE_ERROR);
    ck_assert_ptr_nonnull(strstr(p.err, "invalid bulk length"));
    ck_assert_int_eq(parse_all(&p, "*1\r\n$-5\r\n"), RESP_PARSE_ERROR);
    ck_assert_int_eq(parse_all(&p, "*x\r\n"), RESP_PARSE_ERROR);
    ck_assert_int_eq(parse_all(&p, "*1\r\n:5\r\n"), RESP_PARSE_ERROR);
    ck_assert_str_eq(p.err, "Protocol error: expected '$', got ':'");
    ck_assert_int_eq(parse_all(&p, "*1\r\n$3\r\nabcde"), RESP_PARSE_ERROR);
    /* a header line that never ends */
    ck_assert_int_eq(parse_all(&p, "*11111111111111111111111111111111111111"),
                     RESP_PARSE_ERROR);
    /* 8 arguments of 16 bytes pass max_bulk but not max_command */
    char big[512] = "*8\r\n";
    for (int i = 0; i < 8; i++)
        strcat(big, "$16\r\n0123456789abcdef\r\n");
    ck_assert_int_eq(parse_all(&p, big), RESP_PARSE_ERROR);
    ck_assert_ptr_nonnull(strstr(p.err, "command longer than"));
    /* *0 and *-1 are empty commands */
    ck_assert_int_eq(parse_all(&p, "*0\r\n"), RESP_PARSE_DONE);
    ck_assert(p.empty);
    ck_assert_int_eq(parse_all(&p, "*-1\r\n"), RESP_PARSE_DONE);
    ck_assert(p.empty);
    resp_parser_deinit(&p);
}
END_TEST

START_TEST(writer_shapes)
{
    struct resp_buf b;
    resp_buf_init(&b);
    resp_add_int(&b, 1);
    resp_add_int(&b, -42);
    resp_add_simple(&b, "OK");
    resp_add_error(&b, "ERR", "two\r\nlines");
    resp_add_bulk_str(&b, "hi");
    resp_add_null(&b, 2);
    resp_add_null(&b, 3);
    resp_add_map(&b, 2, 2);
    resp_add_map(&b, 3, 2);
    resp_add_verbatim(&b, 3, "a");
    ck_assert(!b.oom);
    const char *want = ":1\r\n:-42\r\n+OK\r\n-ERR two  lines\r\n$2\r\nhi\r\n$-1\r\n_\r\n"
                       "*4\r\n%2\r\n=5\r\ntxt:a\r\n";
    ck_assert_uint_eq(b.len, strlen(want));
    ck_assert(memcmp(b.p, want, b.len) == 0);
    resp_buf_free(&b);
}
END_TEST

START_TEST(args_numbers)
{
    long long v;
    double d;
    ck_assert_int_eq(resp_arg_ll("123", 3, &v), 0);
    ck_assert_int_eq(v, 123);
    ck_assert_int_eq(resp_arg_ll("12x", 3, &v), -22);
    ck_assert_int_eq(resp_arg_ll(" 1", 2, &v), -22);
    ck_assert_int_eq(resp_arg_double("0.01", 4, &d), 0);
    ck_assert(d == 0.01);
    ck_assert_int_eq(resp_arg_double("inf", 3, &d), -22);
    ck_assert(resp_arg_is("bf.ADD", 6, "BF.add"));
    ck_assert(!resp_arg_is("bf.AD", 5, "BF.add"));
}
END_TEST

Suite *resp_proto_suite(void)
{
    Suite *s = suite_create("resp_proto");
    TCase *t = tcase_create("core");
    tcase_add_test(t, parse_array_command);
    tcase_add_test(t, parse_byte_by_byte);
    tcase_add_test(t, parse_inline);
    tcase_add_test(t, parse_refuses_past_limits);
    tcase_add_test(t, writer_shapes);
    tcase_add_test(t, args_numbers);
    suite_add_tcase(s, t);
    return s;
}
