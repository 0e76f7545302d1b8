/* Unit tests of rpc_arena: protobuf-c messages unpacked into an arena are
 * the same as with malloc, a second message of the same size needs no new
 * block, and the limit holds. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_arena.h"

/* An AddRequest of n keys "key-<i>", packed; caller frees. */
static uint8_t *packed_keys(size_t n, size_t *len)
{
    Bloomgrid__V1__AddRequest m = BLOOMGRID__V1__ADD_REQUEST__INIT;
    ProtobufCBinaryData *k = calloc(n, sizeof *k);
    char (*text)[24] = calloc(n, sizeof *text);
    for (size_t i = 0; i < n; i++) {
        k[i].len = (size_t)snprintf(text[i], sizeof text[i], "key-%zu", i);
        k[i].data = (uint8_t *)text[i];
    }
    m.filter = "users";
    m.n_keys = n;
    m.keys = k;
    *len = protobuf_c_message_get_packed_size(&m.base);
    uint8_t *buf = malloc(*len);
    protobuf_c_message_pack(&m.base, buf);
    free(k);
    free(text);
    return buf;
}

START_TEST(arena_unpack_matches_malloc_unpack)
{
    size_t len;
    uint8_t *buf = packed_keys(1000, &len);
    struct rpc_arena a;
    rpc_arena_init(&a, 0);
    Bloomgrid__V1__AddRequest *x =
        bloomgrid__v1__add_request__unpack(rpc_arena_allocator(&a), len, buf);
    Bloomgrid__V1__AddRequest *y = bloomgrid__v1__add_request__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(x);
    ck_assert_ptr_nonnull(y);
    ck_assert_str_eq(x->filter, "users");
    ck_assert_uint_eq(x->n_keys, 1000);
    for (size_t i = 0; i < 1000; i++) {
        ck_assert_uint_eq(x->keys[i].len, y->keys[i].len);
        ck_assert_int_eq(memcmp(x->keys[i].data, y->keys[i].data, x->keys[i].len), 0);
    }
    bloomgrid__v1__add_request__free_unpacked(y, NULL);
    rpc_arena_deinit(&a);
    free(buf);
}
END_TEST

START_TEST(steady_state_allocates_no_new_block)
{
    size_t len;
    uint8_t *buf = packed_keys(5000, &len);
    struct rpc_arena a;
    rpc_arena_init(&a, 0);
    for (int round = 0; round < 3; round++) {
        Bloomgrid__V1__AddRequest *x =
            bloomgrid__v1__add_request__unpack(rpc_arena_allocator(&a), len, buf);
        ck_assert_ptr_nonnull(x);
        ck_assert_uint_eq(x->n_keys, 5000);
        /* The first message grows the arena by doubling (a few chunks,
         * not one per key); from the second on, the kept block holds it
         * all. */
        int chunks = 0;
        for (struct rpc_arena_chunk *c = a.extra; c; c = *(struct rpc_arena_chunk **)c)
            chunks++;
        ck_assert_int_le(chunks, 8);
        if (round > 0)
            ck_assert_int_eq(chunks, 0);
        rpc_arena_reset(&a);
    }
    rpc_arena_deinit(&a);
    free(buf);
}
END_TEST

START_TEST(limit_makes_the_unpack_fail)
{
    size_t len;
    uint8_t *buf = packed_keys(1000, &len);
    struct rpc_arena a;
    rpc_arena_init(&a, 4096);
    ck_assert_ptr_null(bloomgrid__v1__add_request__unpack(rpc_arena_allocator(&a), len,
                                                           buf));
    rpc_arena_reset(&a);
    /* A small message still fits afterwards. */
    free(buf);
    buf = packed_keys(3, &len);
    Bloomgrid__V1__AddRequest *x =
        bloomgrid__v1__add_request__unpack(rpc_arena_allocator(&a), len, buf);
    ck_assert_ptr_nonnull(x);
    ck_assert_uint_eq(x->n_keys, 3);
    rpc_arena_deinit(&a);
    free(buf);
}
END_TEST

Suite *rpc_arena_suite(void)
{
    Suite *s = suite_create("rpc_arena");
    TCase *tc = tcase_create("rpc_arena");
    tcase_add_test(tc, arena_unpack_matches_malloc_unpack);
    tcase_add_test(tc, steady_state_allocates_no_new_block);
    tcase_add_test(tc, limit_makes_the_unpack_fail);
    suite_add_tcase(s, tc);
    return s;
}
