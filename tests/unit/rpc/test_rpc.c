/* Unit tests of the RPC layer: an in-process rpc_server with test handlers
 * on a loopback port, driven through rpc_client.  grpc_init/grpc_shutdown
 * run inside each test (Check forks per test). */
#include <check.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "rpc_client.h"
#include "rpc_server.h"

/* GetFilter answers a FilterInfo named after the request, or NOT_FOUND for
 * "missing"; MayContain answers one true per key byte count (raw codec). */
static void get_filter(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    Bloomgrid__V1__GetFilterRequest *m =
        bloomgrid__v1__get_filter_request__unpack(NULL, len, req);
    if (!m) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "malformed");
        return;
    }
    if (strcmp(m->name, "missing") == 0) {
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist", m->name);
    } else {
        Bloomgrid__V1__FilterInfo fi = BLOOMGRID__V1__FILTER_INFO__INIT;
        fi.name = m->name;
        fi.capacity = 42;
        rpc_reply_pack(r, &fi.base);
    }
    bloomgrid__v1__get_filter_request__free_unpacked(m, NULL);
}

/* AddStream: one AddResponse with n_keys "true" per request. */
static void add_stream(void *arg, struct rpc_stream *st)
{
    const uint8_t *buf;
    size_t len;
    (void)arg;
    for (;;) {
        int rc = rpc_stream_read(st, &buf, &len);
        if (rc < 0)
            return;
        if (rc == 0)
            break;
        Bloomgrid__V1__AddRequest *m = bloomgrid__v1__add_request__unpack(NULL, len, buf);
        if (!m) {
            rpc_stream_finish(st, GRPC_STATUS_INVALID_ARGUMENT, "malformed");
            return;
        }
        Bloomgrid__V1__AddResponse resp = BLOOMGRID__V1__ADD_RESPONSE__INIT;
        protobuf_c_boolean v[64] = {0};
        resp.n_added = m->n_keys < 64 ? m->n_keys : 64;
        resp.added = v;
        for (size_t i = 0; i < resp.n_added; i++)
            v[i] = 1;
        bloomgrid__v1__add_request__free_unpacked(m, NULL);
        if (rpc_stream_write(st, &resp.base) < 0)
            return;
    }
    rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
}

/* DropFilter fails with a typed reason; MayContain (which checks its own
 * strings) counts its calls; Import ends its stream with a typed reason. */
static int may_contain_calls;

static void drop_filter(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    (void)req;
    (void)len;
    rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION, RPC_REASON_SECRET_MISMATCH,
                   "another secret");
}

static void may_contain(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    (void)req;
    (void)len;
    __atomic_fetch_add(&may_contain_calls, 1, __ATOMIC_SEQ_CST);
    rpc_reply_alloc(r, 0);
}

static void import(void *arg, struct rpc_stream *st)
{
    const uint8_t *buf;
    size_t len;
    struct rpc_status status;
    (void)arg;
    while (rpc_stream_read(st, &buf, &len) > 0)
        ;
    rpc_status_set(&status, GRPC_STATUS_FAILED_PRECONDITION, "not counting");
    status.reason = RPC_REASON_NOT_COUNTING;
    rpc_stream_finish_status(st, &status);
}

struct fixture {
    struct rpc_server *srv;
    struct rpc_channel *ch;
    char addr[64];
};

static void setup(struct fixture *f)
{
    static struct rpc_handler h[11];
    memset(h, 0, sizeof h);
    h[1].unary = drop_filter;  /* DropFilter */
    h[3].unary = get_filter;   /* GetFilter */
    h[5].unary = may_contain;  /* MayContain */
    h[5].checks_strings = true;
    h[7].stream = add_stream;  /* AddStream */
    h[10].stream = import;     /* Import */
    grpc_init();
    struct rpc_server_config c = {.listen = "127.0.0.1:0", .threads = 2,
                                  .max_message = 1 << 20, .grace_ms = 500};
    f->srv = rpc_server_create(&c);
    ck_assert_ptr_nonnull(f->srv);
    ck_assert_int_eq(rpc_server_add_service(f->srv, &bloomgrid__v1__bloom_grid__descriptor,
                                            h, NULL), 0);
    int port = rpc_server_start(f->srv);
    ck_assert_int_gt(port, 0);
    snprintf(f->addr, sizeof f->addr, "127.0.0.1:%d", port);
    f->ch = rpc_channel_create(f->addr, 0);
    ck_assert_ptr_nonnull(f->ch);
}

static void teardown(struct fixture *f)
{
    rpc_channel_destroy(f->ch);
    rpc_server_destroy(f->srv);
    grpc_shutdown();
}

static int get(struct fixture *f, const char *name, struct rpc_status *st)
{
    Bloomgrid__V1__GetFilterRequest rq = BLOOMGRID__V1__GET_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    rq.name = (char *)name;
    int rc = rpc_call(f->ch, "/bloomgrid.v1.BloomGrid/GetFilter", &rq.base,
                      &bloomgrid__v1__filter_info__descriptor, (ProtobufCMessage **)&fi,
                      5000, st);
    if (rc == 0) {
        ck_assert_str_eq(fi->name, name);
        ck_assert_uint_eq(fi->capacity, 42);
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    }
    return rc;
}

START_TEST(unary_call_round_trips)
{
    struct fixture f;
    struct rpc_status st;
    setup(&f);
    ck_assert_int_eq(get(&f, "slugs", &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_OK);
    teardown(&f);
}
END_TEST

START_TEST(handler_status_reaches_client)
{
    struct fixture f;
    struct rpc_status st;
    setup(&f);
    ck_assert_int_lt(get(&f, "missing", &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_NOT_FOUND);
    ck_assert_str_eq(st.message, "filter \"missing\" does not exist");
    teardown(&f);
}
END_TEST

START_TEST(unknown_and_unimplemented_methods_answer_unimplemented)
{
    struct fixture f;
    struct rpc_status st;
    grpc_slice out;
    setup(&f);
    ck_assert_int_lt(rpc_call_raw(f.ch, "/x.Y/Z", "", 0, &out, 2000, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_UNIMPLEMENTED);
    /* A method of the service without a handler. */
    ck_assert_int_lt(rpc_call_raw(f.ch, "/bloomgrid.v1.BloomGrid/Add", "", 0, &out,
                                  2000, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_UNIMPLEMENTED);
    teardown(&f);
}
END_TEST

START_TEST(malformed_request_is_invalid_argument)
{
    struct fixture f;
    struct rpc_status st;
    grpc_slice out;
    static const uint8_t junk[] = {0x0a, 0x7f, 'x'};
    setup(&f);
    ck_assert_int_lt(rpc_call_raw(f.ch, "/bloomgrid.v1.BloomGrid/GetFilter", junk,
                                  sizeof junk, &out, 2000, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_int_eq(get(&f, "after", &st), 0);
    teardown(&f);
}
END_TEST

START_TEST(reasons_reach_the_client)
{
    struct fixture f;
    struct rpc_status st;
    grpc_slice out;
    setup(&f);
    ck_assert_int_lt(rpc_call_raw(f.ch, "/bloomgrid.v1.BloomGrid/DropFilter", "", 0,
                                  &out, 2000, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_FAILED_PRECONDITION);
    ck_assert_int_eq(st.reason, RPC_REASON_SECRET_MISMATCH);
    ck_assert_str_eq(st.message, "another secret");
    /* The same through a fan-out. */
    struct rpc_multi m[2];
    memset(m, 0, sizeof m);
    for (int i = 0; i < 2; i++) {
        m[i].ch = f.ch;
        m[i].method = i ? "/bloomgrid.v1.BloomGrid/DropFilter"
                        : "/bloomgrid.v1.BloomGrid/GetFilter";
        m[i].req = grpc_slice_from_static_string("\x0a\x07missing");
        m[i].timeout_ms = 2000;
    }
    ck_assert_uint_eq(rpc_call_many(m, 2), 2);
    ck_assert_int_eq(m[0].st.code, GRPC_STATUS_NOT_FOUND);
    ck_assert_int_eq(m[0].st.reason, RPC_REASON_NONE);
    ck_assert_int_eq(m[1].st.reason, RPC_REASON_SECRET_MISMATCH);
    for (int i = 0; i < 2; i++)
        grpc_slice_unref(m[i].resp);
    /* And at the end of a stream. */
    struct rpc_cstream *cs = rpc_cstream_open(f.ch, "/bloomgrid.v1.BloomGrid/Import", 2000);
    ck_assert_ptr_nonnull(cs);
    rpc_cstream_close_send(cs);
    ck_assert_int_lt(rpc_cstream_finish(cs, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_FAILED_PRECONDITION);
    ck_assert_int_eq(st.reason, RPC_REASON_NOT_COUNTING);
    ck_assert_str_eq(rpc_reason_name(st.reason), "NOT_COUNTING");
    teardown(&f);
}
END_TEST

START_TEST(strings_with_nul_never_reach_a_handler)
{
    struct fixture f;
    struct rpc_status st;
    grpc_slice out;
    static const uint8_t nul[] = {0x0a, 0x08, 'm', 'i', 's', 0, 's', 'i', 'n', 'g'};
    static const uint8_t utf[] = {0x0a, 0x02, 'x', 0xc3};
    setup(&f);
    /* "mis\0sing" must not become "mis" (or "missing" in a C string). */
    ck_assert_int_lt(rpc_call_raw(f.ch, "/bloomgrid.v1.BloomGrid/GetFilter", nul,
                                  sizeof nul, &out, 2000, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_str_eq(st.message, "GetFilterRequest.name \"mis\\x00sing\" contains a "
                                 "NUL byte at position 3");
    ck_assert_int_lt(rpc_call_raw(f.ch, "/bloomgrid.v1.BloomGrid/GetFilter", utf,
                                  sizeof utf, &out, 2000, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(st.message, "is not valid UTF-8"));
    /* A handler that checks its own strings gets the bytes as they are. */
    may_contain_calls = 0;
    ck_assert_int_eq(rpc_call_raw(f.ch, "/bloomgrid.v1.BloomGrid/MayContain", nul,
                                  sizeof nul, &out, 2000, &st), 0);
    grpc_slice_unref(out);
    ck_assert_int_eq(may_contain_calls, 1);
    /* A stream message: the call ends INVALID_ARGUMENT whatever the
     * handler finishes with. */
    struct rpc_cstream *cs = rpc_cstream_open(f.ch, "/bloomgrid.v1.BloomGrid/Import", 2000);
    ck_assert_ptr_nonnull(cs);
    ck_assert_int_eq(rpc_cstream_write(cs, nul, sizeof nul), 0);
    rpc_cstream_close_send(cs);
    ck_assert_int_lt(rpc_cstream_finish(cs, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(st.message, "ImportRequest.filter"));
    ck_assert_int_eq(st.reason, RPC_REASON_NONE);
    teardown(&f);
}
END_TEST

START_TEST(oversize_message_is_refused)
{
    struct fixture f;
    struct rpc_status st;
    grpc_slice out;
    setup(&f);
    size_t n = 2 << 20;
    uint8_t *big = calloc(1, n);
    ck_assert_int_lt(rpc_call_raw(f.ch, "/bloomgrid.v1.BloomGrid/GetFilter", big, n,
                                  &out, 5000, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    free(big);
    ck_assert_int_eq(get(&f, "after", &st), 0);
    teardown(&f);
}
END_TEST

START_TEST(stream_answers_each_message_in_order)
{
    struct fixture f;
    struct rpc_status st;
    setup(&f);
    struct rpc_cstream *s = rpc_cstream_open(f.ch, "/bloomgrid.v1.BloomGrid/AddStream", 5000);
    ck_assert_ptr_nonnull(s);
    for (size_t n = 1; n <= 10; n++) {
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        ProtobufCBinaryData keys[10];
        for (size_t i = 0; i < n; i++) {
            keys[i].data = (uint8_t *)"k";
            keys[i].len = 1;
        }
        rq.n_keys = n;
        rq.keys = keys;
        ck_assert_int_eq(rpc_cstream_write_msg(s, &rq.base), 0);
        grpc_slice sl;
        ck_assert_int_eq(rpc_cstream_read(s, &sl), 1);
        Bloomgrid__V1__AddResponse *r = bloomgrid__v1__add_response__unpack(
            NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
        ck_assert_ptr_nonnull(r);
        ck_assert_uint_eq(r->n_added, n);
        bloomgrid__v1__add_response__free_unpacked(r, NULL);
        grpc_slice_unref(sl);
    }
    ck_assert_int_eq(rpc_cstream_close_send(s), 0);
    grpc_slice sl;
    ck_assert_int_eq(rpc_cstream_read(s, &sl), 0);
    ck_assert_int_eq(rpc_cstream_finish(s, &st), 0);
    teardown(&f);
}
END_TEST

START_TEST(shutdown_cancels_open_streams)
{
    struct fixture f;
    struct rpc_status st;
    setup(&f);
    struct rpc_cstream *s = rpc_cstream_open(f.ch, "/bloomgrid.v1.BloomGrid/AddStream",
                                             20000);
    ck_assert_ptr_nonnull(s);
    Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
    ck_assert_int_eq(rpc_cstream_write_msg(s, &rq.base), 0);
    grpc_slice sl;
    ck_assert_int_eq(rpc_cstream_read(s, &sl), 1);
    grpc_slice_unref(sl);
    /* The stream stays open; shutdown must still return. */
    rpc_server_shutdown(f.srv);
    ck_assert_int_lt(rpc_cstream_finish(s, &st), 0);
    ck_assert(st.code == GRPC_STATUS_UNAVAILABLE || st.code == GRPC_STATUS_CANCELLED);
    teardown(&f);
}
END_TEST

START_TEST(many_calls_complete_independently)
{
    struct fixture f;
    setup(&f);
    struct rpc_multi c[8];
    uint8_t req[8][32];
    static const char *const names[8] = {"a", "b", "missing", "d", "e", "f", "g", "h"};
    memset(c, 0, sizeof c);
    for (int i = 0; i < 8; i++) {
        Bloomgrid__V1__GetFilterRequest rq = BLOOMGRID__V1__GET_FILTER_REQUEST__INIT;
        rq.name = (char *)names[i];
        c[i].ch = f.ch;
        c[i].method = i == 7 ? "/x.Y/Z" : "/bloomgrid.v1.BloomGrid/GetFilter";
        size_t len = protobuf_c_message_pack(&rq.base, req[i]);
        c[i].req = grpc_slice_from_copied_buffer((const char *)req[i], len);
        c[i].timeout_ms = 5000;
    }
    ck_assert_uint_eq(rpc_call_many(c, 8), 2);
    for (int i = 0; i < 8; i++)
        grpc_slice_unref(c[i].req);
    for (int i = 0; i < 8; i++) {
        if (i == 2) {
            ck_assert_int_eq(c[i].rc, -1);
            ck_assert_int_eq(c[i].st.code, GRPC_STATUS_NOT_FOUND);
        } else if (i == 7) {
            ck_assert_int_eq(c[i].st.code, GRPC_STATUS_UNIMPLEMENTED);
        } else {
            ck_assert_int_eq(c[i].rc, 0);
            Bloomgrid__V1__FilterInfo *fi = bloomgrid__v1__filter_info__unpack(
                NULL, GRPC_SLICE_LENGTH(c[i].resp), GRPC_SLICE_START_PTR(c[i].resp));
            ck_assert_ptr_nonnull(fi);
            ck_assert_str_eq(fi->name, names[i]);
            bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
            grpc_slice_unref(c[i].resp);
        }
    }
    teardown(&f);
}
END_TEST

START_TEST(streams_over_the_limit_are_refused)
{
    struct rpc_status st;
    static struct rpc_handler h[11];
    memset(h, 0, sizeof h);
    h[7].stream = add_stream;
    grpc_init();
    struct rpc_server_config c = {.listen = "127.0.0.1:0", .threads = 2,
                                  .max_message = 1 << 20, .grace_ms = 200,
                                  .max_streams = 2};
    struct rpc_server *srv = rpc_server_create(&c);
    ck_assert_int_eq(rpc_server_add_service(srv, &bloomgrid__v1__bloom_grid__descriptor,
                                            h, NULL), 0);
    int port = rpc_server_start(srv);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    struct rpc_channel *ch = rpc_channel_create(addr, 0);
    struct rpc_cstream *s[3];
    Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
    for (int i = 0; i < 3; i++) {
        s[i] = rpc_cstream_open(ch, "/bloomgrid.v1.BloomGrid/AddStream", 5000);
        ck_assert_ptr_nonnull(s[i]);
        rpc_cstream_write_msg(s[i], &rq.base);
        grpc_slice sl;
        int rc = rpc_cstream_read(s[i], &sl);
        if (i < 2) {
            ck_assert_int_eq(rc, 1);
            grpc_slice_unref(sl);
        } else {
            ck_assert_int_le(rc, 0);
            ck_assert_int_lt(rpc_cstream_finish(s[i], &st), 0);
            ck_assert_int_eq(st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
        }
    }
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(rpc_cstream_finish(s[i], &st), 0);
    rpc_channel_destroy(ch);
    rpc_server_destroy(srv);
    grpc_shutdown();
}
END_TEST

static int health(struct fixture *f, const char *service)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckResponse *r = NULL;
    struct rpc_status st;
    rq.service = (char *)service;
    if (rpc_call(f->ch, "/grpc.health.v1.Health/Check", &rq.base,
                 &grpc__health__v1__health_check_response__descriptor,
                 (ProtobufCMessage **)&r, 2000, &st) < 0)
        return -(int)st.code;
    int s = r->status;
    grpc__health__v1__health_check_response__free_unpacked(r, NULL);
    return s;
}

START_TEST(health_follows_set_health)
{
    struct fixture f;
    setup(&f);
    ck_assert_int_eq(health(&f, ""), 2);   /* NOT_SERVING until told */
    rpc_server_set_health(f.srv, "", true);
    rpc_server_set_health(f.srv, "svc", false);
    ck_assert_int_eq(health(&f, ""), 1);
    ck_assert_int_eq(health(&f, "svc"), 2);
    ck_assert_int_eq(health(&f, "other"), -GRPC_STATUS_NOT_FOUND);
    teardown(&f);
}
END_TEST

Suite *rpc_suite(void)
{
    Suite *s = suite_create("rpc");
    TCase *tc = tcase_create("rpc");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, unary_call_round_trips);
    tcase_add_test(tc, handler_status_reaches_client);
    tcase_add_test(tc, unknown_and_unimplemented_methods_answer_unimplemented);
    tcase_add_test(tc, malformed_request_is_invalid_argument);
    tcase_add_test(tc, oversize_message_is_refused);
    tcase_add_test(tc, reasons_reach_the_client);
    tcase_add_test(tc, strings_with_nul_never_reach_a_handler);
    tcase_add_test(tc, stream_answers_each_message_in_order);
    tcase_add_test(tc, shutdown_cancels_open_streams);
    tcase_add_test(tc, health_follows_set_health);
    tcase_add_test(tc, many_calls_complete_independently);
    tcase_add_test(tc, streams_over_the_limit_are_refused);
    suite_add_tcase(s, tc);
    return s;
}
