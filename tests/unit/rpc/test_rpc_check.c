/* Unit tests of rpc_check: the string rule on serialized messages, checked
 * against what protobuf-c makes of the same bytes. */
#include <check.h>
#include <errno.h>
#include <string.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "rpc_check.h"

static size_t pack(const ProtobufCMessage *m, uint8_t *buf)
{
    return protobuf_c_message_pack(m, buf);
}

START_TEST(clean_messages_pass)
{
    uint8_t buf[1024];
    char msg[256];
    Bloomgrid__V1__CreateFilterRequest c = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    c.name = "users";
    c.capacity = 1000;
    c.error_rate = 0.01;
    c.shards = 4;
    size_t n = pack(&c.base, buf);
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__create_filter_request__descriptor,
                                       buf, n, msg, sizeof msg), 0);
    /* Bytes fields may hold anything; only strings are checked. */
    uint8_t key[3] = {'a', 0, 0xff};
    ProtobufCBinaryData keys[1] = {{.len = 3, .data = key}};
    Bloomgrid__V1__AddRequest a = BLOOMGRID__V1__ADD_REQUEST__INIT;
    a.filter = "users";
    a.n_keys = 1;
    a.keys = keys;
    n = pack(&a.base, buf);
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__add_request__descriptor, buf, n,
                                       msg, sizeof msg), 0);
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__add_request__descriptor, buf, 0,
                                       msg, sizeof msg), 0);
}
END_TEST

START_TEST(nul_inside_a_string_is_found_where_protobuf_c_would_cut)
{
    uint8_t buf[1024];
    char msg[256];
    /* CreateFilterRequest { name: "x\0y", capacity: 5 } by hand. */
    static const uint8_t raw[] = {0x0a, 3, 'x', 0, 'y', 0x10, 5};
    Bloomgrid__V1__CreateFilterRequest *m =
        bloomgrid__v1__create_filter_request__unpack(NULL, sizeof raw, raw);
    ck_assert_ptr_nonnull(m);
    ck_assert_str_eq(m->name, "x"); /* what a handler would have seen */
    bloomgrid__v1__create_filter_request__free_unpacked(m, NULL);
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__create_filter_request__descriptor,
                                       raw, sizeof raw, msg, sizeof msg), -EINVAL);
    ck_assert_str_eq(msg, "CreateFilterRequest.name \"x\\x00y\" contains a NUL byte "
                          "at position 1");
    (void)buf;
}
END_TEST

START_TEST(strings_in_nested_messages_are_checked)
{
    uint8_t buf[1024];
    char msg[256];
    Bloomgrid__V1__ShardInfo si = BLOOMGRID__V1__SHARD_INFO__INIT;
    Bloomgrid__V1__ShardInfo *sip = &si;
    Bloomgrid__V1__FilterInfo fi = BLOOMGRID__V1__FILTER_INFO__INIT;
    Bloomgrid__V1__ImportResponse ir = BLOOMGRID__V1__IMPORT_RESPONSE__INIT;
    si.node = "h\xc3\xa9:1";             /* valid UTF-8 */
    fi.name = "f";
    fi.n_shard_info = 1;
    fi.shard_info = &sip;
    ir.info = &fi;
    size_t n = pack(&ir.base, buf);
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__import_response__descriptor, buf,
                                       n, msg, sizeof msg), 0);
    si.node = "h\xc3:1";                 /* a lone lead byte */
    n = pack(&ir.base, buf);
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__import_response__descriptor, buf,
                                       n, msg, sizeof msg), -EINVAL);
    ck_assert_ptr_nonnull(strstr(msg, "ShardInfo.node"));
    ck_assert_ptr_nonnull(strstr(msg, "not valid UTF-8"));
}
END_TEST

START_TEST(unknown_fields_are_skipped_and_malformed_bytes_refused)
{
    char msg[256];
    /* Unknown field 9 (a string-like length-delimited field with a NUL), a
     * varint, a fixed64 and a fixed32: skipped. */
    static const uint8_t unknown[] = {0x4a, 2, 'a', 0, 0x50, 1,
                                      0x59, 1, 2, 3, 4, 5, 6, 7, 8,
                                      0x65, 1, 2, 3, 4, 0x0a, 1, 'f'};
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__get_filter_request__descriptor,
                                       unknown, sizeof unknown, msg, sizeof msg), 0);
    static const uint8_t truncated[] = {0x0a, 5, 'a', 'b'};
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__get_filter_request__descriptor,
                                       truncated, sizeof truncated, msg, sizeof msg),
                     -EBADMSG);
    ck_assert_str_eq(msg, "malformed GetFilterRequest message");
    static const uint8_t badtype[] = {0x0b, 0};
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__get_filter_request__descriptor,
                                       badtype, sizeof badtype, msg, sizeof msg),
                     -EBADMSG);
    static const uint8_t field0[] = {0x02, 0};
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__get_filter_request__descriptor,
                                       field0, sizeof field0, msg, sizeof msg),
                     -EBADMSG);
    /* A nested message that runs past its parent's length. */
    static const uint8_t nested[] = {0x0a, 3, 0x0a, 5, 'x'};
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__import_response__descriptor,
                                       nested, sizeof nested, msg, sizeof msg),
                     -EBADMSG);
}
END_TEST

START_TEST(strings_of_a_nested_field_are_checked_by_its_type)
{
    char msg[256];
    /* InternalShardInfo.filter (1) then info (4) holding FilterInfo.name. */
    static const uint8_t ok[] = {0x0a, 1, 'f', 0x22, 3, 0x0a, 1, 'g'};
    static const uint8_t bad[] = {0x0a, 1, 'f', 0x22, 3, 0x0a, 1, 0};
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__internal_shard_info__descriptor,
                                       ok, sizeof ok, msg, sizeof msg), 0);
    ck_assert_int_eq(rpc_check_strings(&bloomgrid__v1__internal_shard_info__descriptor,
                                       bad, sizeof bad, msg, sizeof msg), -EINVAL);
    ck_assert_ptr_nonnull(strstr(msg, "FilterInfo.name"));
}
END_TEST

Suite *rpc_check_suite(void)
{
    Suite *s = suite_create("rpc_check");
    TCase *tc = tcase_create("rpc_check");
    tcase_add_test(tc, clean_messages_pass);
    tcase_add_test(tc, nul_inside_a_string_is_found_where_protobuf_c_would_cut);
    tcase_add_test(tc, strings_in_nested_messages_are_checked);
    tcase_add_test(tc, unknown_fields_are_skipped_and_malformed_bytes_refused);
    tcase_add_test(tc, strings_of_a_nested_field_are_checked_by_its_type);
    suite_add_tcase(s, tc);
    return s;
}
