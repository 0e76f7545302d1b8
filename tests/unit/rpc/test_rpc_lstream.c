/* Unit tests of streams driven by their messages (struct rpc_loop_stream):
 * an in-process rpc_server whose AddStream is such a stream, driven through
 * rpc_client.  Messages are AddRequests whose filter field carries a
 * number; the handlers below echo them, hold them for another thread,
 * pause on them or end the stream at them.  grpc_init/grpc_shutdown run
 * inside each test (Check forks per test). */
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

#define M_ADD_STREAM 7
#define N_METHODS 11
#define ADD_STREAM "/bloomgrid.v1.BloomGrid/AddStream"

/* What the handlers saw, shared with the test's thread. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int messages;               /* message() calls, every stream */
    int ends, ends_failed;      /* end() calls, with failed true */
    int opens;
    pid_t tid[4];               /* the threads message() ran on */
    int ntid;
    bool off_loop;              /* a message() not on a loop */
    struct rpc_stream *paused;  /* the stream that paused last */
    int order_errors;           /* a message out of its stream's order */
} seen = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void seen_reset(void)
{
    pthread_mutex_lock(&seen.lock);
    seen.messages = seen.ends = seen.ends_failed = seen.opens = 0;
    seen.ntid = 0;
    seen.off_loop = false;
    seen.paused = NULL;
    seen.order_errors = 0;
    pthread_mutex_unlock(&seen.lock);
}

/* Wait until *v reaches n (under seen.lock); 0, or -1 after 20 s. */
static int seen_wait(const int *v, int n)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20;
    int rc = 0;
    pthread_mutex_lock(&seen.lock);
    while (*v < n && rc == 0)
        if (pthread_cond_timedwait(&seen.cond, &seen.lock, &ts) != 0)
            rc = -1;
    pthread_mutex_unlock(&seen.lock);
    return rc;
}

static int seen_get(const int *v)
{
    pthread_mutex_lock(&seen.lock);
    int n = *v;
    pthread_mutex_unlock(&seen.lock);
    return n;
}

/* The number a message carries, or -1. */
static int msg_id(const uint8_t *buf, size_t len)
{
    Bloomgrid__V1__AddRequest *m = bloomgrid__v1__add_request__unpack(NULL, len, buf);
    if (!m)
        return -1;
    int id = atoi(m->filter);
    bloomgrid__v1__add_request__free_unpacked(m, NULL);
    return id;
}

static int answer_id(grpc_slice sl)
{
    int id = msg_id(GRPC_SLICE_START_PTR(sl), GRPC_SLICE_LENGTH(sl));
    grpc_slice_unref(sl);
    return id;
}

static void write_id(struct rpc_cstream *cs, int id)
{
    char name[16];
    Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
    snprintf(name, sizeof name, "%d", id);
    rq.filter = name;
    ck_assert_int_eq(rpc_cstream_write_msg(cs, &rq.base), 0);
}

/* ---- the handlers ---- */

enum mode { ECHO, HOLD, PAUSE, SELF_RESUME, END_AT_7 };

struct state {
    enum mode mode;
    struct rpc_stream *st;
    int next;                   /* the id expected next */
    atomic_int held;            /* answers handed to holders, not yet posted */
    pthread_mutex_t mu;         /* HOLD: the holders post in turn */
    pthread_cond_t cv;
    int posted;
};

static enum mode mode_now;

static void *h_open(void *arg, struct rpc_stream *st)
{
    (void)arg;
    struct state *s = calloc(1, sizeof *s);
    s->mode = mode_now;
    s->st = st;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_lock(&seen.lock);
    seen.opens++;
    pthread_cond_broadcast(&seen.cond);
    pthread_mutex_unlock(&seen.lock);
    return s;
}

/* A holder: posts its answer after a while (in the messages' order, as a
 * commit thread would), then lets the stream go. */
struct held {
    struct state *s;
    grpc_slice answer;
    int index, delay_ms;
};

static void *holder_main(void *p)
{
    struct held *h = p;
    struct state *s = h->s;
    struct rpc_stream *st = s->st;
    usleep((useconds_t)h->delay_ms * 1000);
    pthread_mutex_lock(&s->mu);
    while (s->posted != h->index)
        pthread_cond_wait(&s->cv, &s->mu);
    atomic_fetch_sub(&s->held, 1);
    ck_assert_int_eq(rpc_stream_post(st, h->answer), 0);
    s->posted++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    free(h);
    rpc_stream_release(st);   /* s may be gone after this */
    return NULL;
}

static int h_message(void *state, const uint8_t *buf, size_t len, struct rpc_status *end)
{
    struct state *s = state;
    int id = msg_id(buf, len);
    pthread_mutex_lock(&seen.lock);
    seen.messages++;
    if (!rpc_server_on_loop())
        seen.off_loop = true;
    pid_t me = gettid();
    int i;
    for (i = 0; i < seen.ntid && seen.tid[i] != me; i++)
        ;
    if (i == seen.ntid && seen.ntid < 4)
        seen.tid[seen.ntid++] = me;
    if (id != s->next)
        seen.order_errors++;
    pthread_cond_broadcast(&seen.cond);
    pthread_mutex_unlock(&seen.lock);
    s->next = id + 1;
    grpc_slice echo = grpc_slice_from_copied_buffer((const char *)buf, len);
    switch (s->mode) {
    case ECHO:
        return rpc_stream_post(s->st, echo) < 0 ? -1 : 0;
    case HOLD: {
        /* Holders run after message() returns, some after the client's
         * half-close has been read. */
        pthread_t t;
        struct held *h = malloc(sizeof *h);
        *h = (struct held){.s = s, .answer = echo, .index = id, .delay_ms = 1 + (id * 7) % 20};
        ck_assert_int_eq(rpc_stream_hold(s->st), 0);
        atomic_fetch_add(&s->held, 1);
        ck_assert_int_eq(pthread_create(&t, NULL, holder_main, h), 0);
        pthread_detach(t);
        return 0;
    }
    case PAUSE:
        pthread_mutex_lock(&seen.lock);
        seen.paused = s->st;
        pthread_mutex_unlock(&seen.lock);
        return rpc_stream_post(s->st, echo) < 0 ? -1 : 1;
    case SELF_RESUME:
        /* The resume comes before the pause it ends. */
        rpc_stream_resume(s->st);
        return rpc_stream_post(s->st, echo) < 0 ? -1 : 1;
    case END_AT_7:
        if (id == 7) {
            grpc_slice_unref(echo);
            end->code = GRPC_STATUS_FAILED_PRECONDITION;
            snprintf(end->message, sizeof end->message, "message 7 ends it");
            return -1;
        }
        return rpc_stream_post(s->st, echo) < 0 ? -1 : 0;
    }
    return -1;
}

static void h_end(void *state, bool failed, struct rpc_status *end)
{
    struct state *s = state;
    /* Every hold is released before the end. */
    ck_assert_int_eq(atomic_load(&s->held), 0);
    if (!failed && s->mode == HOLD && end->code == GRPC_STATUS_OK) {
        end->code = GRPC_STATUS_DATA_LOSS;   /* any code the handler picks */
        snprintf(end->message, sizeof end->message, "held stream ended after %d", s->posted);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
    pthread_mutex_lock(&seen.lock);
    seen.ends++;
    seen.ends_failed += failed;
    pthread_cond_broadcast(&seen.cond);
    pthread_mutex_unlock(&seen.lock);
}

static const struct rpc_loop_stream ops = {
    .open = h_open, .message = h_message, .end = h_end};

struct fixture {
    struct rpc_server *srv;
    struct rpc_channel *ch;
};

static void start(struct fixture *f, enum mode mode, struct rpc_server_config c)
{
    struct rpc_handler h[N_METHODS];
    memset(h, 0, sizeof h);
    h[M_ADD_STREAM].loop_stream = &ops;
    seen_reset();
    mode_now = mode;
    grpc_init();
    c.listen = "127.0.0.1:0";
    c.threads = c.threads ? c.threads : 2;
    c.max_message = 1 << 20;
    c.grace_ms = 500;
    f->srv = rpc_server_create(&c);
    ck_assert_ptr_nonnull(f->srv);
    ck_assert_int_eq(rpc_server_add_service(f->srv, &bloomgrid__v1__bloom_grid__descriptor,
                                            h, NULL), 0);
    int port = rpc_server_start(f->srv);
    ck_assert_int_gt(port, 0);
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    f->ch = rpc_channel_create(addr, 0);
    ck_assert_ptr_nonnull(f->ch);
}

static void stop(struct fixture *f)
{
    rpc_channel_destroy(f->ch);
    rpc_server_destroy(f->srv);
    grpc_shutdown();
}

/* Read n answers numbered from first, in order. */
static void read_ids(struct rpc_cstream *cs, int first, int n)
{
    for (int i = 0; i < n; i++) {
        grpc_slice sl;
        ck_assert_int_eq(rpc_cstream_read(cs, &sl), 1);
        ck_assert_int_eq(answer_id(sl), first + i);
    }
}

/* Half-close, read the end of the answers and the status: finish's rc. */
static int close_and_finish(struct rpc_cstream *cs, struct rpc_status *st)
{
    grpc_slice sl;
    ck_assert_int_eq(rpc_cstream_close_send(cs), 0);
    ck_assert_int_eq(rpc_cstream_read(cs, &sl), 0);
    return rpc_cstream_finish(cs, st);
}

/* No more answers: the stream ends with code, its message holding what. */
static void expect_end(struct rpc_cstream *cs, grpc_status_code code, const char *what)
{
    struct rpc_status st;
    grpc_slice sl;
    ck_assert_int_le(rpc_cstream_read(cs, &sl), 0);
    ck_assert_int_eq(rpc_cstream_finish(cs, &st), -1);
    ck_assert_int_eq(st.code, code);
    ck_assert_msg(strstr(st.message, what), "status message \"%s\"", st.message);
}

/* One stream of msgs messages, every answer read in order, the stream's
 * end seen by the handler; finish's rc and the status in *st. */
static int run_stream(struct fixture *f, int msgs, struct rpc_status *st)
{
    struct rpc_cstream *cs = rpc_cstream_open(f->ch, ADD_STREAM, 20000);
    ck_assert_ptr_nonnull(cs);
    for (int i = 0; i < msgs; i++)
        write_id(cs, i);
    ck_assert_int_eq(rpc_cstream_close_send(cs), 0);
    read_ids(cs, 0, msgs);
    grpc_slice sl;
    ck_assert_int_eq(rpc_cstream_read(cs, &sl), 0);
    int rc = rpc_cstream_finish(cs, st);
    ck_assert_int_eq(seen_wait(&seen.ends, 1), 0);
    return rc;
}

/* ---- tests ---- */

/* Three streams at once, every message answered in its stream's order, all
 * handled on the one loop thread (no pool thread takes them), then end()
 * once per stream with the client's half-close. */
static void three_streams(int loops)
{
    enum { STREAMS = 3, MSGS = 200 };
    struct fixture f;
    struct rpc_cstream *cs[STREAMS];
    start(&f, ECHO, (struct rpc_server_config){.loops = loops, .max_streams = 8});
    for (int k = 0; k < STREAMS; k++) {
        cs[k] = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
        ck_assert_ptr_nonnull(cs[k]);
    }
    for (int i = 0; i < MSGS; i++)
        for (int k = 0; k < STREAMS; k++)
            write_id(cs[k], i);
    for (int k = 0; k < STREAMS; k++) {
        struct rpc_status st;
        read_ids(cs[k], 0, MSGS);
        ck_assert_int_eq(close_and_finish(cs[k], &st), 0);
    }
    ck_assert_int_eq(seen_wait(&seen.ends, STREAMS), 0);
    stop(&f);
    ck_assert_int_eq(seen.messages, STREAMS * MSGS);
    ck_assert_int_eq(seen.order_errors, 0);
    ck_assert_int_eq(seen.ends, STREAMS);
    ck_assert_int_eq(seen.ends_failed, 0);
    if (loops) {
        ck_assert(!seen.off_loop);
        ck_assert_int_eq(seen.ntid, 1);
    } else {
        ck_assert(seen.off_loop);
    }
}

START_TEST(messages_are_handled_on_the_loop_in_order)
{
    three_streams(1);
}
END_TEST

START_TEST(without_loops_the_workers_handle_them)
{
    three_streams(0);
}
END_TEST

/* Answers posted by holders keep the order of the messages; end() waits
 * for the last release, and the status it picks follows every answer. */
START_TEST(end_waits_for_every_hold_and_its_status_goes_last)
{
    enum { MSGS = 30 };
    struct fixture f;
    struct rpc_status st;
    start(&f, HOLD, (struct rpc_server_config){.loops = 1});
    ck_assert_int_eq(run_stream(&f, MSGS, &st), -1);
    ck_assert_int_eq(st.code, GRPC_STATUS_DATA_LOSS);
    ck_assert_str_eq(st.message, "held stream ended after 30");
    stop(&f);
    ck_assert_int_eq(seen.ends_failed, 0);
}
END_TEST

/* message() saying 1 stops the reading until rpc_stream_resume: the
 * messages the client sent meanwhile wait unread. */
START_TEST(a_paused_stream_reads_nothing_until_resumed)
{
    struct fixture f;
    struct rpc_status st;
    start(&f, PAUSE, (struct rpc_server_config){.loops = 1});
    struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    for (int i = 0; i < 5; i++)
        write_id(cs, i);
    read_ids(cs, 0, 1);
    usleep(300 * 1000);
    ck_assert_int_eq(seen_get(&seen.messages), 1);
    for (int i = 1; i < 5; i++) {
        pthread_mutex_lock(&seen.lock);
        struct rpc_stream *p = seen.paused;
        pthread_mutex_unlock(&seen.lock);
        rpc_stream_resume(p);
        read_ids(cs, i, 1);
        ck_assert_int_eq(seen_get(&seen.messages), i + 1);
    }
    ck_assert_int_eq(rpc_cstream_close_send(cs), 0);
    pthread_mutex_lock(&seen.lock);
    struct rpc_stream *p = seen.paused;
    pthread_mutex_unlock(&seen.lock);
    rpc_stream_resume(p);    /* reads the half-close */
    grpc_slice sl;
    ck_assert_int_eq(rpc_cstream_read(cs, &sl), 0);
    ck_assert_int_eq(rpc_cstream_finish(cs, &st), 0);
    ck_assert_int_eq(seen_wait(&seen.ends, 1), 0);
    stop(&f);
}
END_TEST

/* A resume that comes before its pause (the window emptied while message()
 * was returning) still counts: the reading goes on. */
START_TEST(a_resume_before_its_pause_counts)
{
    enum { MSGS = 50 };
    struct fixture f;
    struct rpc_status st;
    start(&f, SELF_RESUME, (struct rpc_server_config){.loops = 1});
    ck_assert_int_eq(run_stream(&f, MSGS, &st), 0);
    stop(&f);
}
END_TEST

/* message() saying -1 ends the stream with its status, after the answers
 * posted before; nothing after that message is handed on. */
START_TEST(an_error_ends_the_stream_after_the_answers_before_it)
{
    struct fixture f;
    start(&f, END_AT_7, (struct rpc_server_config){.loops = 1});
    struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    for (int i = 0; i < 8; i++)
        write_id(cs, i);
    /* Later ones may find the call over already. */
    for (int i = 8; i < 12; i++) {
        char name[16];
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        snprintf(name, sizeof name, "%d", i);
        rq.filter = name;
        rpc_cstream_write_msg(cs, &rq.base);
    }
    read_ids(cs, 0, 7);
    expect_end(cs, GRPC_STATUS_FAILED_PRECONDITION, "message 7 ends it");
    ck_assert_int_eq(seen_wait(&seen.ends, 1), 0);
    stop(&f);
    ck_assert_int_eq(seen.messages, 8);
}
END_TEST

/* stream_idle_ms: a public stream waiting on its client ends with
 * RESOURCE_EXHAUSTED saying why; end() runs with failed. */
START_TEST(an_idle_stream_is_ended)
{
    struct fixture f;
    start(&f, ECHO, (struct rpc_server_config){.loops = 1, .stream_idle_ms = 300});
    struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    write_id(cs, 0);
    read_ids(cs, 0, 1);
    expect_end(cs, GRPC_STATUS_RESOURCE_EXHAUSTED, "stream_idle_ms");
    ck_assert_int_eq(seen_wait(&seen.ends, 1), 0);
    stop(&f);
    ck_assert_int_eq(seen.ends_failed, 1);
}
END_TEST

/* They count against max_streams like any stream: one more is refused. */
START_TEST(they_count_against_max_streams)
{
    struct fixture f;
    struct rpc_status st;
    start(&f, ECHO, (struct rpc_server_config){.loops = 1, .max_streams = 2});
    struct rpc_cstream *a = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    struct rpc_cstream *b = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    write_id(a, 0);
    write_id(b, 0);
    read_ids(a, 0, 1);
    read_ids(b, 0, 1);
    struct rpc_cstream *c = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    write_id(c, 0);
    expect_end(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "max_streams");
    ck_assert_int_eq(seen_get(&seen.opens), 2);
    /* One ends: its place is free again. */
    ck_assert_int_eq(close_and_finish(a, &st), 0);
    ck_assert_int_eq(seen_wait(&seen.ends, 1), 0);
    c = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    write_id(c, 0);
    read_ids(c, 0, 1);
    ck_assert_int_eq(close_and_finish(c, &st), 0);
    ck_assert_int_eq(close_and_finish(b, &st), 0);
    ck_assert_int_eq(seen_wait(&seen.ends, 3), 0);
    stop(&f);
}
END_TEST

/* Shutdown with a stream open: the call is cancelled, end() runs and the
 * server's threads all stop. */
START_TEST(shutdown_ends_an_open_stream)
{
    struct fixture f;
    struct rpc_status st;
    start(&f, ECHO, (struct rpc_server_config){.loops = 1});
    struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    write_id(cs, 0);
    read_ids(cs, 0, 1);
    rpc_server_shutdown(f.srv);
    ck_assert_int_eq(seen_get(&seen.ends), 1);
    ck_assert_int_eq(rpc_cstream_finish(cs, &st), -1);
    stop(&f);
}
END_TEST

Suite *rpc_lstream_suite(void)
{
    Suite *s = suite_create("rpc_lstream");
    TCase *tc = tcase_create("rpc_lstream");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, messages_are_handled_on_the_loop_in_order);
    tcase_add_test(tc, without_loops_the_workers_handle_them);
    tcase_add_test(tc, end_waits_for_every_hold_and_its_status_goes_last);
    tcase_add_test(tc, a_paused_stream_reads_nothing_until_resumed);
    tcase_add_test(tc, a_resume_before_its_pause_counts);
    tcase_add_test(tc, an_error_ends_the_stream_after_the_answers_before_it);
    tcase_add_test(tc, an_idle_stream_is_ended);
    tcase_add_test(tc, they_count_against_max_streams);
    tcase_add_test(tc, shutdown_ends_an_open_stream);
    suite_add_tcase(s, tc);
    return s;
}
