/* Unit tests of the RPC server's request budget (rpc_server.h, "Request
 * budget"): requests stay valid and counted until their call ends, large
 * ones past the large share are refused naming the setting while small
 * ones are served, everything charged is given back, and large requests to
 * the loops' methods are handled off the loops.  An in-process rpc_server
 * on a loopback port, driven through rpc_client; grpc_init/grpc_shutdown
 * run inside each test (Check forks per test). */
#include <check.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_client.h"
#include "rpc_server.h"

#define M_MAY_CONTAIN 5
#define N_METHODS 11
#define MAY_CONTAIN "/bloomgrid.v1.BloomGrid/MayContain"
#define HELD_MAX 64
#define SETTING "test_budget"

struct fixture {
    struct rpc_server *srv;
    struct rpc_channel *ch;
};

/* Calls the handler deferred, with the request it was given. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;
    struct {
        struct rpc_deferred *d;
        const uint8_t *req;
        size_t len;
        bool on_loop;
    } e[HELD_MAX];
} held = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

/* Charges a copy's worth of the request (as a router charges what it
 * builds), then defers, keeping req to read it after returning. */
static void hold_call(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    if (rpc_reply_charge(r, len) < 0)
        return;
    struct rpc_deferred *d = rpc_reply_defer(r);
    ck_assert_ptr_nonnull(d);
    pthread_mutex_lock(&held.lock);
    ck_assert_int_lt(held.n, HELD_MAX);
    held.e[held.n].d = d;
    held.e[held.n].req = req;
    held.e[held.n].len = len;
    held.e[held.n].on_loop = rpc_server_on_loop();
    held.n++;
    pthread_cond_broadcast(&held.cond);
    pthread_mutex_unlock(&held.lock);
}

static void held_wait(int n)
{
    pthread_mutex_lock(&held.lock);
    while (held.n < n)
        pthread_cond_wait(&held.cond, &held.lock);
    pthread_mutex_unlock(&held.lock);
}

/* Answer every held call (an empty MayContainResponse). */
static void held_finish_all(void)
{
    pthread_mutex_lock(&held.lock);
    for (int i = 0; i < held.n; i++) {
        Bloomgrid__V1__MayContainResponse m = BLOOMGRID__V1__MAY_CONTAIN_RESPONSE__INIT;
        ck_assert_int_eq(rpc_reply_pack(rpc_deferred_reply(held.e[i].d), &m.base), 0);
        ck_assert_int_eq(rpc_deferred_finish(held.e[i].d), 0);
    }
    held.n = 0;
    pthread_mutex_unlock(&held.lock);
}

static void start(struct fixture *f, size_t budget, size_t max_message, int loops)
{
    struct rpc_handler h[N_METHODS];
    memset(h, 0, sizeof h);
    h[M_MAY_CONTAIN].unary = hold_call;
    h[M_MAY_CONTAIN].loop = true;
    struct rpc_server_config c = {
        .listen = "127.0.0.1:0", .threads = 2, .loops = loops, .grace_ms = 500,
        .max_message = max_message, .request_budget = budget, .budget_setting = SETTING,
    };
    held.n = 0;
    grpc_init();
    f->srv = rpc_server_create(&c);
    ck_assert_ptr_nonnull(f->srv);
    ck_assert_int_eq(rpc_server_add_service(f->srv, &bloomgrid__v1__bloom_grid__descriptor,
                                            h, NULL), 0);
    int port = rpc_server_start(f->srv);
    ck_assert_int_gt(port, 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    f->ch = rpc_channel_create(addr, 4u << 20);
    ck_assert_ptr_nonnull(f->ch);
}

static void stop(struct fixture *f)
{
    rpc_channel_destroy(f->ch);
    rpc_server_destroy(f->srv);
    grpc_shutdown();
}

/* A MayContainRequest of filter "f" and one key of key_len bytes (each
 * byte its index, so that the bytes can be checked). */
static grpc_slice request_of(size_t key_len)
{
    uint8_t *key = malloc(key_len ? key_len : 1);
    ck_assert_ptr_nonnull(key);
    for (size_t i = 0; i < key_len; i++)
        key[i] = (uint8_t)(i * 7 + 1);
    ProtobufCBinaryData kd = {.data = key, .len = key_len};
    Bloomgrid__V1__MayContainRequest rq = BLOOMGRID__V1__MAY_CONTAIN_REQUEST__INIT;
    rq.filter = "f";
    rq.n_keys = 1;
    rq.keys = &kd;
    grpc_slice s = grpc_slice_malloc(protobuf_c_message_get_packed_size(&rq.base));
    protobuf_c_message_pack(&rq.base, GRPC_SLICE_START_PTR(s));
    free(key);
    return s;
}

/* The bytes charged, once every call has ended (a reply's completion gives
 * its call's charge back just after the client has the reply). */
static uint64_t used_settled(struct rpc_server *srv)
{
    uint64_t used = 0, max;
    for (int i = 0; i < 200; i++) {
        rpc_server_budget(srv, &used, &max);
        if (used == 0)
            break;
        usleep(10000);
    }
    return used;
}

struct call {
    struct rpc_channel *ch;
    grpc_slice body;
    pthread_t t;
    atomic_bool done;
    int rc;
    struct rpc_status st;
};

static void *call_main(void *p)
{
    struct call *c = p;
    grpc_slice resp;
    c->rc = rpc_call_raw(c->ch, MAY_CONTAIN, GRPC_SLICE_START_PTR(c->body),
                         GRPC_SLICE_LENGTH(c->body), &resp, 30000, &c->st);
    if (c->rc == 0)
        grpc_slice_unref(resp);
    atomic_store(&c->done, true);
    return NULL;
}

static void call_start(struct call *c, struct rpc_channel *ch, grpc_slice body)
{
    memset(c, 0, sizeof *c);
    c->ch = ch;
    c->body = body;
    ck_assert_int_eq(pthread_create(&c->t, NULL, call_main, c), 0);
}

START_TEST(a_deferred_request_stays_valid_and_counted_until_its_finish)
{
    struct fixture f;
    start(&f, 16u << 20, 1u << 20, 0);
    /* A request small enough for a slice to hold it inline, and a larger
     * one: the handler's pointers are read after it has returned. */
    const size_t sizes[2] = {3, 4000};
    grpc_slice bodies[2];
    struct call calls[2];
    for (int i = 0; i < 2; i++) {
        bodies[i] = request_of(sizes[i]);
        call_start(&calls[i], f.ch, bodies[i]);
        held_wait(i + 1);
    }
    uint64_t used, max;
    rpc_server_budget(f.srv, &used, &max);
    ck_assert_uint_eq(max, 16u << 20);
    /* Each call counts its message and the handler's charge of as much. */
    ck_assert_uint_eq(used, 2 * (GRPC_SLICE_LENGTH(bodies[0]) + GRPC_SLICE_LENGTH(bodies[1])));
    usleep(50000);
    pthread_mutex_lock(&held.lock);
    for (int i = 0; i < 2; i++) {
        size_t len = GRPC_SLICE_LENGTH(bodies[i]);
        int k = held.e[0].len == len ? 0 : 1;
        ck_assert_uint_eq(held.e[k].len, len);
        ck_assert_int_eq(memcmp(held.e[k].req, GRPC_SLICE_START_PTR(bodies[i]), len), 0);
    }
    pthread_mutex_unlock(&held.lock);
    held_finish_all();
    for (int i = 0; i < 2; i++) {
        pthread_join(calls[i].t, NULL);
        ck_assert_int_eq(calls[i].rc, 0);
        grpc_slice_unref(bodies[i]);
    }
    ck_assert_uint_eq(used_settled(f.srv), 0);
    stop(&f);
}
END_TEST

START_TEST(large_requests_past_their_share_are_refused_and_small_ones_served)
{
    struct fixture f;
    /* 8 MiB: large requests may take 7; each here holds about 1.8 MB (its
     * message and the handler's charge). */
    start(&f, 8u << 20, 1u << 20, 0);
    enum { N = 12 };
    grpc_slice big = request_of(900000);
    struct call calls[N];
    for (int i = 0; i < N; i++)
        call_start(&calls[i], f.ch, big);
    /* The refused calls return; the held ones wait for the finish. */
    int refused = 0, accepted = 0;
    for (int tries = 0; accepted + refused < N; tries++) {
        ck_assert_int_lt(tries, 3000);
        usleep(10000);
        refused = 0;
        for (int i = 0; i < N; i++)
            refused += atomic_load(&calls[i].done);
        pthread_mutex_lock(&held.lock);
        accepted = held.n;
        pthread_mutex_unlock(&held.lock);
    }
    for (int i = 0; i < N; i++) {
        if (!atomic_load(&calls[i].done))
            continue;
        ck_assert_int_eq(calls[i].st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
        ck_assert_ptr_nonnull(strstr(calls[i].st.message, SETTING));
    }
    ck_assert_int_ge(accepted, 1);
    ck_assert_int_le(accepted, 4);
    ck_assert_int_eq(accepted + refused, N);

    /* A small request is served meanwhile: the last eighth is its. */
    grpc_slice small = request_of(10);
    struct call sc;
    call_start(&sc, f.ch, small);
    held_wait(accepted + 1);
    held_finish_all();
    pthread_join(sc.t, NULL);
    ck_assert_int_eq(sc.rc, 0);
    for (int i = 0; i < N; i++)
        pthread_join(calls[i].t, NULL);
    ck_assert_uint_eq(used_settled(f.srv), 0);
    grpc_slice_unref(big);
    grpc_slice_unref(small);
    stop(&f);
}
END_TEST

START_TEST(a_large_request_to_a_loop_method_is_handled_off_the_loop)
{
    struct fixture f;
    start(&f, 32u << 20, 4u << 20, 1);
    grpc_slice small = request_of(100), large = request_of(RPC_BUDGET_HEAVY + 1000);
    struct call c[2];
    call_start(&c[0], f.ch, small);
    held_wait(1);
    call_start(&c[1], f.ch, large);
    held_wait(2);
    pthread_mutex_lock(&held.lock);
    ck_assert(held.e[0].on_loop);
    ck_assert(!held.e[1].on_loop);
    pthread_mutex_unlock(&held.lock);
    held_finish_all();
    for (int i = 0; i < 2; i++) {
        pthread_join(c[i].t, NULL);
        ck_assert_int_eq(c[i].rc, 0);
    }
    ck_assert_uint_eq(used_settled(f.srv), 0);
    grpc_slice_unref(small);
    grpc_slice_unref(large);
    stop(&f);
}
END_TEST

START_TEST(charges_without_a_budget_always_succeed)
{
    struct fixture f;
    start(&f, 0, 1u << 20, 0);
    struct rpc_status st;
    ck_assert_int_eq(rpc_server_charge(f.srv, 1u << 30, &st), 0);
    rpc_server_uncharge(f.srv, 1u << 30);
    uint64_t used, max;
    rpc_server_budget(f.srv, &used, &max);
    ck_assert_uint_eq(used, 0);
    ck_assert_uint_eq(max, 0);
    stop(&f);
}
END_TEST

Suite *rpc_budget_suite(void)
{
    Suite *s = suite_create("rpc_budget");
    TCase *tc = tcase_create("rpc_budget");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, a_deferred_request_stays_valid_and_counted_until_its_finish);
    tcase_add_test(tc, large_requests_past_their_share_are_refused_and_small_ones_served);
    tcase_add_test(tc, a_large_request_to_a_loop_method_is_handled_off_the_loop);
    tcase_add_test(tc, charges_without_a_budget_always_succeed);
    suite_add_tcase(s, tc);
    return s;
}
