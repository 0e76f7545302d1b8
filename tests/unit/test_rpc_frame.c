/* Unit tests of the frame transport (common/rpc_frame.c): a frame server on
 * a loopback port with test handlers, driven through rpc_frame_call_many and
 * through raw sockets for malformed input. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <grpc/grpc.h>

#include "rpc_frame.h"

/* Method 0: echo reversed.  1: NOT_FOUND naming the request.  2: a stream
 * slot (not served over frames).  3: sleeps 300 ms, then echoes. */
static void h_reverse(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    uint8_t *p = rpc_reply_alloc(r, len);
    for (size_t i = 0; i < len; i++)
        p[i] = req[len - 1 - i];
}

static void h_not_found(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "no such thing: %.*s", (int)len,
                    (const char *)req);
}

static void h_stream(void *arg, struct rpc_stream *s)
{
    (void)arg;
    (void)s;
}

static void h_slow(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    h_reverse(arg, req, len, r);
}

static const struct rpc_handler handlers[] = {
    {.unary = h_reverse},
    {.unary = h_not_found},
    {.stream = h_stream},
    {.unary = h_slow},
};

static struct rpc_frame_server *start(int port, int *bound)
{
    char err[256];
    struct rpc_frame_server *s =
        rpc_frame_server_start("127.0.0.1", port, handlers, 4, NULL, NULL, 1 << 20, 64, bound, err);
    ck_assert_msg(s != NULL, "start: %s", err);
    ck_assert_int_gt(*bound, 0);
    return s;
}

static struct rpc_frame_call call_of(struct rpc_frame_pool *p, uint32_t method,
                                     const char *req, int timeout_ms)
{
    struct rpc_frame_call c;
    memset(&c, 0, sizeof c);
    c.pool = p;
    c.method = method;
    c.req = req;
    c.len = strlen(req);
    c.timeout_ms = timeout_ms;
    return c;
}

static void expect_body(struct rpc_frame_call *c, const char *want)
{
    ck_assert_msg(c->rc == 0, "call failed: %d %s", c->st.code, c->st.message);
    ck_assert(c->sent && c->answered);
    ck_assert_uint_eq(GRPC_SLICE_LENGTH(c->resp), strlen(want));
    ck_assert(memcmp(GRPC_SLICE_START_PTR(c->resp), want, strlen(want)) == 0);
    grpc_slice_unref(c->resp);
}

static int raw_connect(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

/* Read until EOF or 2 s; returns the bytes read, or -1 on timeout. */
static ssize_t read_to_eof(int fd, uint8_t *buf, size_t cap)
{
    size_t got = 0;
    for (;;) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, 2000) != 1)
            return -1;
        ssize_t r = read(fd, buf + got, cap - got);
        if (r <= 0)
            return (ssize_t)got;
        got += (size_t)r;
        if (got == cap)
            return (ssize_t)got;
    }
}

START_TEST(calls_round_trip_with_status)
{
    int port;
    grpc_init();
    struct rpc_frame_server *s = start(0, &port);
    struct rpc_frame_pool *p = rpc_frame_pool_create("127.0.0.1", port, 0);

    /* Many calls one after another (one connection, reused). */
    for (int i = 0; i < 200; i++) {
        char req[32], want[32];
        snprintf(req, sizeof req, "abc-%d", i);
        size_t n = strlen(req);
        for (size_t k = 0; k < n; k++)
            want[k] = req[n - 1 - k];
        want[n] = 0;
        struct rpc_frame_call c = call_of(p, 0, req, 2000);
        ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 0);
        expect_body(&c, want);
    }
    /* An empty request is a valid (empty) message. */
    struct rpc_frame_call c = call_of(p, 0, "", 2000);
    ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 0);
    expect_body(&c, "");

    /* The handler's status and message reach the caller. */
    c = call_of(p, 1, "widget", 2000);
    ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 1);
    ck_assert(c.answered);
    ck_assert_int_eq(c.st.code, GRPC_STATUS_NOT_FOUND);
    ck_assert_str_eq(c.st.message, "no such thing: widget");

    /* Stream slots and unknown methods answer UNIMPLEMENTED. */
    c = call_of(p, 2, "x", 2000);
    rpc_frame_call_many(&c, 1);
    ck_assert_int_eq(c.st.code, GRPC_STATUS_UNIMPLEMENTED);
    c = call_of(p, 99, "x", 2000);
    rpc_frame_call_many(&c, 1);
    ck_assert_int_eq(c.st.code, GRPC_STATUS_UNIMPLEMENTED);
    ck_assert_ptr_nonnull(strstr(c.st.message, "99"));

    /* The connection is still good after error answers. */
    c = call_of(p, 0, "ok", 2000);
    rpc_frame_call_many(&c, 1);
    expect_body(&c, "ko");

    rpc_frame_pool_destroy(p);
    rpc_frame_server_stop(s);
    grpc_shutdown();
}
END_TEST

/* A peer that stalls before reading, on a frame larger than the socket
 * buffers hold, makes the sender's writes partial: the bytes that arrive are
 * still the whole frame, in order. */
struct stall_peer {
    int lfd;
    uint8_t *got;
    size_t cap, len;
};

static void *stall_peer_run(void *arg)
{
    struct stall_peer *sp = arg;
    int fd = accept(sp->lfd, NULL, NULL);
    struct timespec ts = {0, 300 * 1000 * 1000};

    if (fd < 0)
        return NULL;
    nanosleep(&ts, NULL);
    ssize_t r = read_to_eof(fd, sp->got, sp->cap);
    sp->len = r > 0 ? (size_t)r : 0;
    close(fd);
    return NULL;
}

START_TEST(partial_writes_send_every_byte)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t alen = sizeof a;
    struct stall_peer sp = {.cap = RPC_FRAME_HDR + (8u << 20)};
    size_t n = 8u << 20;   /* more than the socket buffers hold */
    char *req = malloc(n + 1);
    pthread_t th;

    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sp.lfd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(sp.lfd, 0);
    ck_assert_int_eq(bind(sp.lfd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(sp.lfd, 1), 0);
    ck_assert_int_eq(getsockname(sp.lfd, (struct sockaddr *)&a, &alen), 0);
    sp.got = malloc(sp.cap);
    for (size_t k = 0; k < n; k++)
        req[k] = (char)('a' + (k * 7) % 26);
    req[n] = 0;
    grpc_init();
    ck_assert_int_eq(pthread_create(&th, NULL, stall_peer_run, &sp), 0);
    struct rpc_frame_pool *p = rpc_frame_pool_create("127.0.0.1", ntohs(a.sin_port), 0);
    struct rpc_frame_call c = call_of(p, 0, req, 3000);
    /* The peer reads the whole frame, then closes without answering. */
    ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 1);
    ck_assert(c.sent && !c.answered);
    pthread_join(th, NULL);
    ck_assert_uint_eq(sp.len, RPC_FRAME_HDR + n);
    ck_assert(memcmp(sp.got + RPC_FRAME_HDR, req, n) == 0);
    rpc_frame_pool_destroy(p);
    close(sp.lfd);
    free(sp.got);
    free(req);
    grpc_shutdown();
}
END_TEST

START_TEST(calls_to_several_servers_at_once)
{
    int pa, pb;
    grpc_init();
    struct rpc_frame_server *a = start(0, &pa), *b = start(0, &pb);
    struct rpc_frame_pool *qa = rpc_frame_pool_create("127.0.0.1", pa, 0);
    struct rpc_frame_pool *qb = rpc_frame_pool_create("127.0.0.1", pb, 0);
    struct rpc_frame_call c[3] = {call_of(qa, 0, "one", 2000), call_of(qb, 1, "two", 2000),
                                  call_of(qb, 0, "three", 2000)};

    /* Two calls on one pool at once use two connections. */
    ck_assert_uint_eq(rpc_frame_call_many(c, 3), 1);
    expect_body(&c[0], "eno");
    ck_assert_int_eq(c[1].st.code, GRPC_STATUS_NOT_FOUND);
    expect_body(&c[2], "eerht");

    rpc_frame_pool_destroy(qa);
    rpc_frame_pool_destroy(qb);
    rpc_frame_server_stop(a);
    rpc_frame_server_stop(b);
    grpc_shutdown();
}
END_TEST

START_TEST(unreachable_server_fails_unsent)
{
    int port;
    grpc_init();
    struct rpc_frame_server *s = start(0, &port);
    rpc_frame_server_stop(s);     /* nobody listens there now */

    struct rpc_frame_pool *p = rpc_frame_pool_create("127.0.0.1", port, 0);
    struct rpc_frame_call c = call_of(p, 0, "x", 1000);
    ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 1);
    ck_assert(!c.sent && !c.answered);
    ck_assert_int_eq(c.st.code, GRPC_STATUS_UNAVAILABLE);
    ck_assert_ptr_nonnull(strstr(c.st.message, "cannot connect"));

    /* No port known: unsent too. */
    rpc_frame_pool_set_port(p, 0);
    ck_assert_int_eq(rpc_frame_pool_port(p), 0);
    c = call_of(p, 0, "x", 1000);
    ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 1);
    ck_assert(!c.sent);
    ck_assert_int_eq(c.st.code, GRPC_STATUS_UNAVAILABLE);
    rpc_frame_pool_destroy(p);
    grpc_shutdown();
}
END_TEST

START_TEST(slow_answer_hits_the_deadline)
{
    int port;
    grpc_init();
    struct rpc_frame_server *s = start(0, &port);
    struct rpc_frame_pool *p = rpc_frame_pool_create("127.0.0.1", port, 0);
    struct timespec t0, t1;

    struct rpc_frame_call c = call_of(p, 3, "slow", 50);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 1);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    ck_assert_int_eq(c.st.code, GRPC_STATUS_DEADLINE_EXCEEDED);
    ck_assert(c.sent && !c.answered);
    ck_assert_msg(ms >= 45 && ms < 280, "deadline of 50 ms took %.1f ms", ms);

    /* The late answer is not mistaken for the next call's. */
    c = call_of(p, 0, "next", 2000);
    rpc_frame_call_many(&c, 1);
    expect_body(&c, "txen");
    rpc_frame_pool_destroy(p);
    rpc_frame_server_stop(s);
    grpc_shutdown();
}
END_TEST

START_TEST(restarted_server_is_reconnected)
{
    int port, port2;
    grpc_init();
    struct rpc_frame_server *s = start(0, &port);
    struct rpc_frame_pool *p = rpc_frame_pool_create("127.0.0.1", port, 0);
    struct rpc_frame_call c = call_of(p, 0, "ab", 2000);
    rpc_frame_call_many(&c, 1);
    expect_body(&c, "ba");

    /* The pooled connection dies with the server; a new server on the same
     * port is reached through a new connection, without an error. */
    rpc_frame_server_stop(s);
    s = start(port, &port2);
    ck_assert_int_eq(port2, port);
    c = call_of(p, 0, "cd", 2000);
    ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 0);
    expect_body(&c, "dc");

    /* Moving the pool to another server's port. */
    int port3;
    struct rpc_frame_server *s3 = start(0, &port3);
    rpc_frame_server_stop(s);
    rpc_frame_pool_set_port(p, port3);
    c = call_of(p, 0, "ef", 2000);
    rpc_frame_call_many(&c, 1);
    expect_body(&c, "fe");
    rpc_frame_pool_destroy(p);
    rpc_frame_server_stop(s3);
    grpc_shutdown();
}
END_TEST

START_TEST(bad_frames_close_only_their_connection)
{
    int port;
    uint8_t buf[256];
    grpc_init();
    struct rpc_frame_server *s = start(0, &port);
    struct rpc_frame_pool *p = rpc_frame_pool_create("127.0.0.1", port, 0);

    /* Wrong magic: the connection is closed without an answer. */
    int fd = raw_connect(port);
    ck_assert_int_eq(write(fd, "GET / HTTP/1.1\r\n\r\n", 18), 18);
    ck_assert_int_eq(read_to_eof(fd, buf, sizeof buf), 0);
    close(fd);

    /* Too long: RESOURCE_EXHAUSTED, then closed. */
    uint8_t h[16] = {'B', 'G', 'F', '1', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40};
    fd = raw_connect(port);
    ck_assert_int_eq(write(fd, h, 16), 16);
    ssize_t n = read_to_eof(fd, buf, sizeof buf);
    ck_assert_int_ge(n, 16);
    ck_assert_int_eq(buf[4], GRPC_STATUS_RESOURCE_EXHAUSTED);
    ck_assert_ptr_nonnull(memmem(buf + 16, (size_t)n - 16, "limit", 5));
    close(fd);

    /* A frame that stops half-way is dropped after the stall limit, while
     * an idle connection (no frame begun) stays open. */
    rpc_frame_set_stall_ms(300);
    int idle = raw_connect(port);
    fd = raw_connect(port);
    ck_assert_int_eq(write(fd, h, 7), 7);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(read_to_eof(fd, buf, sizeof buf), 0);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    ck_assert_msg(ms >= 250 && ms < 1900, "stalled frame closed after %.0f ms", ms);
    close(fd);
    struct pollfd ipf = {.fd = idle, .events = POLLIN};
    ck_assert_int_eq(poll(&ipf, 1, 100), 0);
    close(idle);
    rpc_frame_set_stall_ms(10000);

    /* Random bytes and truncated frames, many times: the server lives on. */
    srand(7);
    for (int i = 0; i < 300; i++) {
        uint8_t junk[64];
        size_t len = (size_t)(rand() % 64);
        for (size_t k = 0; k < len; k++)
            junk[k] = (uint8_t)rand();
        if (i % 3 == 0 && len >= 4)
            memcpy(junk, "BGF1", 4);
        fd = raw_connect(port);
        if (len)
            ck_assert_int_eq(write(fd, junk, len), (ssize_t)len);
        shutdown(fd, SHUT_WR);
        read_to_eof(fd, buf, sizeof buf);
        close(fd);
    }
    struct rpc_frame_call c = call_of(p, 0, "alive", 2000);
    rpc_frame_call_many(&c, 1);
    expect_body(&c, "evila");
    rpc_frame_pool_destroy(p);
    rpc_frame_server_stop(s);
    grpc_shutdown();
}
END_TEST

START_TEST(connection_limit_refuses_without_running)
{
    int port;
    char err[256];
    grpc_init();
    struct rpc_frame_server *s =
        rpc_frame_server_start("127.0.0.1", 0, handlers, 4, NULL, NULL, 1 << 20, 1, &port, err);
    ck_assert_msg(s != NULL, "%s", err);
    struct rpc_frame_pool *a = rpc_frame_pool_create("127.0.0.1", port, 0);
    struct rpc_frame_pool *b = rpc_frame_pool_create("127.0.0.1", port, 0);

    /* a's idle connection is the one the server allows. */
    struct rpc_frame_call c = call_of(a, 0, "mine", 2000);
    rpc_frame_call_many(&c, 1);
    expect_body(&c, "enim");
    c = call_of(b, 0, "yours", 2000);
    ck_assert_uint_eq(rpc_frame_call_many(&c, 1), 1);
    ck_assert(c.refused && !c.sent && !c.answered);
    ck_assert_int_eq(c.st.code, GRPC_STATUS_UNAVAILABLE);
    ck_assert_int_eq(c.port, port);
    /* The allowed connection still works. */
    c = call_of(a, 0, "again", 2000);
    rpc_frame_call_many(&c, 1);
    expect_body(&c, "niaga");
    rpc_frame_pool_destroy(a);
    rpc_frame_pool_destroy(b);
    rpc_frame_server_stop(s);
    grpc_shutdown();
}
END_TEST

START_TEST(addresses_split)
{
    char h[64];
    int port;
    ck_assert_int_eq(rpc_frame_split_addr("127.0.0.1:7401", h, sizeof h, &port), 0);
    ck_assert_str_eq(h, "127.0.0.1");
    ck_assert_int_eq(port, 7401);
    ck_assert_int_eq(rpc_frame_split_addr("[::1]:80", h, sizeof h, &port), 0);
    ck_assert_str_eq(h, "::1");
    ck_assert_int_eq(port, 80);
    ck_assert_int_eq(rpc_frame_split_addr("node-a.example:1", h, sizeof h, &port), 0);
    ck_assert_str_eq(h, "node-a.example");
    ck_assert_int_eq(rpc_frame_split_addr("unix:/tmp/sock", h, sizeof h, &port), -1);
    ck_assert_int_eq(rpc_frame_split_addr("host:", h, sizeof h, &port), -1);
    ck_assert_int_eq(rpc_frame_split_addr(":80", h, sizeof h, &port), -1);
    ck_assert_int_eq(rpc_frame_split_addr("host:70000", h, sizeof h, &port), -1);
}
END_TEST

Suite *rpc_frame_suite(void)
{
    Suite *s = suite_create("rpc_frame");
    TCase *tc = tcase_create("rpc_frame");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, calls_round_trip_with_status);
    tcase_add_test(tc, partial_writes_send_every_byte);
    tcase_add_test(tc, calls_to_several_servers_at_once);
    tcase_add_test(tc, unreachable_server_fails_unsent);
    tcase_add_test(tc, slow_answer_hits_the_deadline);
    tcase_add_test(tc, restarted_server_is_reconnected);
    tcase_add_test(tc, bad_frames_close_only_their_connection);
    tcase_add_test(tc, connection_limit_refuses_without_running);
    tcase_add_test(tc, addresses_split);
    suite_add_tcase(s, tc);
    return s;
}
