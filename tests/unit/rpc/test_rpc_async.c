/* Unit tests of the RPC server's asynchronous paths: deferred unary replies
 * finished from other threads, the stream thread pool, and stream messages
 * posted from other threads.  An in-process rpc_server on a loopback port,
 * driven through rpc_client; grpc_init/grpc_shutdown run inside each test
 * (Check forks per test). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "metrics.h"
#include "rpc_client.h"
#include "rpc_server.h"

#define M_GET_FILTER 3
#define M_ADD_STREAM 7
#define M_MAY_CONTAIN_STREAM 8
#define N_METHODS 11

#define GET_FILTER "/bloomgrid.v1.BloomGrid/GetFilter"
#define ADD_STREAM "/bloomgrid.v1.BloomGrid/AddStream"

struct fixture {
    struct rpc_server *srv;
    struct rpc_channel *ch;
    int threads_started;         /* by rpc_server_start */
};

/* Threads of this process now. */
static int count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    int n = 0;
    ck_assert_ptr_nonnull(d);
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}


static void start(struct fixture *f, const struct rpc_handler *h,
                  struct rpc_server_config c)
{
    grpc_init();
    c.listen = "127.0.0.1:0";
    c.threads = c.threads ? c.threads : 2;
    c.max_message = 1 << 20;
    if (!c.grace_ms)
        c.grace_ms = 500;
    f->srv = rpc_server_create(&c);
    ck_assert_ptr_nonnull(f->srv);
    ck_assert_int_eq(rpc_server_add_service(f->srv, &bloomgrid__v1__bloom_grid__descriptor,
                                            h, NULL), 0);
    int before = count_threads();
    int port = rpc_server_start(f->srv);
    ck_assert_int_gt(port, 0);
    f->threads_started = count_threads() - before;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    f->ch = rpc_channel_create(addr, 0);
    ck_assert_ptr_nonnull(f->ch);
}

/* A server whose AddStream runs fn (every other method UNIMPLEMENTED). */
static void start_stream(struct fixture *f, rpc_stream_fn fn, struct rpc_server_config c)
{
    struct rpc_handler h[N_METHODS];
    memset(h, 0, sizeof h);
    h[M_ADD_STREAM].stream = fn;
    start(f, h, c);
}

static void stop(struct fixture *f)
{
    rpc_channel_destroy(f->ch);
    rpc_server_destroy(f->srv);
    grpc_shutdown();
}

/* ---- deferred unary replies ---- */

/* Every deferred GetFilter lands here with the name it asked for. */
#define BOX_MAX 1100
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int n;
    struct {
        struct rpc_deferred *d;
        char name[32];
    } e[BOX_MAX];
} box = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void defer_get(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    (void)arg;
    Bloomgrid__V1__GetFilterRequest *m =
        bloomgrid__v1__get_filter_request__unpack(NULL, len, req);
    if (!m) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "malformed");
        return;
    }
    struct rpc_deferred *d = rpc_reply_defer(r);
    if (d) {
        pthread_mutex_lock(&box.lock);
        box.e[box.n].d = d;
        snprintf(box.e[box.n].name, sizeof box.e[box.n].name, "%s", m->name);
        box.n++;
        pthread_cond_broadcast(&box.cond);
        pthread_mutex_unlock(&box.lock);
    }
    bloomgrid__v1__get_filter_request__free_unpacked(m, NULL);
}

static void box_reset(void)
{
    pthread_mutex_lock(&box.lock);
    box.n = 0;
    pthread_mutex_unlock(&box.lock);
}

static void box_wait(int n)
{
    pthread_mutex_lock(&box.lock);
    while (box.n < n)
        pthread_cond_wait(&box.cond, &box.lock);
    pthread_mutex_unlock(&box.lock);
}

/* Answer box entry k with a FilterInfo; the entry forgets its handle, so
 * that a handle the finish did not free shows as a leak. */
static int finish_info(int k, const char *name, uint64_t capacity)
{
    struct rpc_deferred *d = box.e[k].d;
    Bloomgrid__V1__FilterInfo fi = BLOOMGRID__V1__FILTER_INFO__INIT;
    fi.name = (char *)name;
    fi.capacity = capacity;
    box.e[k].d = NULL;
    ck_assert_int_eq(rpc_reply_pack(rpc_deferred_reply(d), &fi.base), 0);
    return rpc_deferred_finish(d);
}

/* One GetFilter on its own thread. */
struct client_call {
    struct rpc_channel *ch;
    char name[32];
    int timeout_ms;
    pthread_t t;
    atomic_bool done;
    int rc;
    struct rpc_status st;
    char got_name[32];
    uint64_t got_capacity;
};

static void *client_main(void *p)
{
    struct client_call *c = p;
    Bloomgrid__V1__GetFilterRequest rq = BLOOMGRID__V1__GET_FILTER_REQUEST__INIT;
    Bloomgrid__V1__FilterInfo *fi = NULL;
    rq.name = c->name;
    c->rc = rpc_call(c->ch, GET_FILTER, &rq.base, &bloomgrid__v1__filter_info__descriptor,
                     (ProtobufCMessage **)&fi, c->timeout_ms ? c->timeout_ms : 20000,
                     &c->st);
    if (c->rc == 0) {
        snprintf(c->got_name, sizeof c->got_name, "%s", fi->name);
        c->got_capacity = fi->capacity;
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    }
    atomic_store(&c->done, true);
    return NULL;
}

static void client_start(struct client_call *c, struct rpc_channel *ch, const char *name)
{
    memset(c, 0, sizeof *c);
    c->ch = ch;
    snprintf(c->name, sizeof c->name, "%s", name);
    ck_assert_int_eq(pthread_create(&c->t, NULL, client_main, c), 0);
}

static void defer_handlers(struct rpc_handler *h)
{
    box_reset();
    memset(h, 0, N_METHODS * sizeof *h);
    h[M_GET_FILTER].unary = defer_get;
}

/* bloomgrid_rpc_calls_total of a BloomGrid method and code, in the
 * process's registry (every server of the process counts there). */
static uint64_t calls_of(const char *method, const char *code)
{
    const char *labels[] = {"service", "bloomgrid.v1.BloomGrid", "method", method,
                            "code", code, NULL};
    return metric_count(metrics_counter(metrics_registry(), "bloomgrid_rpc_calls_total",
                                        NULL, labels));
}

START_TEST(deferred_reply_arrives_when_finished)
{
    uint64_t ok0 = calls_of("GetFilter", "OK");
    uint64_t fp0 = calls_of("GetFilter", "FAILED_PRECONDITION");
    struct fixture f;
    struct rpc_handler h[N_METHODS];
    struct client_call c;
    defer_handlers(h);
    start(&f, h, (struct rpc_server_config){0});

    client_start(&c, f.ch, "slugs");
    box_wait(1);
    /* The handler has returned: nothing may reach the client before the
     * finish. */
    usleep(100 * 1000);
    ck_assert(!atomic_load(&c.done));
    /* Counted when the reply goes out, with the code it carries. */
    ck_assert_uint_eq(calls_of("GetFilter", "OK"), ok0);
    ck_assert_int_eq(finish_info(0, "slugs", 7), 0);
    pthread_join(c.t, NULL);
    ck_assert_uint_eq(calls_of("GetFilter", "OK"), ok0 + 1);
    ck_assert_int_eq(c.rc, 0);
    ck_assert_str_eq(c.got_name, "slugs");
    ck_assert_uint_eq(c.got_capacity, 7);

    /* An error with a typed reason, finished from another thread too. */
    client_start(&c, f.ch, "other");
    box_wait(2);
    struct rpc_deferred *d = box.e[1].d;
    box.e[1].d = NULL;
    rpc_reply_fail(rpc_deferred_reply(d), GRPC_STATUS_FAILED_PRECONDITION,
                   RPC_REASON_SECRET_MISMATCH, "shard \"%s\" has another secret", "other");
    ck_assert_int_eq(rpc_deferred_finish(d), 0);
    pthread_join(c.t, NULL);
    ck_assert_int_eq(c.rc, -1);
    ck_assert_int_eq(c.st.code, GRPC_STATUS_FAILED_PRECONDITION);
    ck_assert_int_eq(c.st.reason, RPC_REASON_SECRET_MISMATCH);
    ck_assert_str_eq(c.st.message, "shard \"other\" has another secret");
    ck_assert_uint_eq(calls_of("GetFilter", "FAILED_PRECONDITION"), fp0 + 1);
    ck_assert_uint_eq(calls_of("GetFilter", "OK"), ok0 + 1);
    stop(&f);
}
END_TEST

/* Finishers: each takes every nth entry of a shuffled order. */
struct finisher {
    pthread_t t;
    int first, step, n;
    const int *order;
};

static void *finisher_main(void *p)
{
    struct finisher *w = p;
    for (int i = w->first; i < w->n; i += w->step) {
        int k = w->order[i];
        /* The answer names what its own request asked for. */
        uint64_t cap = strtoull(box.e[k].name + 1, NULL, 10);
        if (finish_info(k, box.e[k].name, cap) != 0)
            abort();
    }
    return NULL;
}

struct many_calls {
    struct rpc_multi *c;
    size_t n, failed;
};

static void *many_main(void *p)
{
    struct many_calls *mc = p;
    mc->failed = rpc_call_many(mc->c, mc->n);
    return NULL;
}

START_TEST(thousand_deferred_calls_finish_in_any_order)
{
    enum { N = 1000, FINISHERS = 4 };
    struct fixture f;
    struct rpc_handler h[N_METHODS];
    static struct rpc_multi c[N];
    static int order[N];
    defer_handlers(h);
    start(&f, h, (struct rpc_server_config){0});

    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++) {
        char name[16];
        uint8_t buf[32];
        Bloomgrid__V1__GetFilterRequest rq = BLOOMGRID__V1__GET_FILTER_REQUEST__INIT;
        snprintf(name, sizeof name, "k%d", i);
        rq.name = name;
        size_t len = protobuf_c_message_pack(&rq.base, buf);
        c[i].ch = f.ch;
        c[i].method = GET_FILTER;
        c[i].req = grpc_slice_from_copied_buffer((const char *)buf, len);
        c[i].timeout_ms = 60000;
    }
    struct many_calls mc = {.c = c, .n = N};
    pthread_t ct;
    ck_assert_int_eq(pthread_create(&ct, NULL, many_main, &mc), 0);
    box_wait(N);

    srand(11);
    for (int i = 0; i < N; i++)
        order[i] = i;
    for (int i = N - 1; i > 0; i--) {
        int j = rand() % (i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    struct finisher w[FINISHERS];
    for (int i = 0; i < FINISHERS; i++) {
        w[i] = (struct finisher){.first = i, .step = FINISHERS, .n = N, .order = order};
        ck_assert_int_eq(pthread_create(&w[i].t, NULL, finisher_main, &w[i]), 0);
    }
    for (int i = 0; i < FINISHERS; i++)
        pthread_join(w[i].t, NULL);
    pthread_join(ct, NULL);

    ck_assert_uint_eq(mc.failed, 0);
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof name, "k%d", i);
        Bloomgrid__V1__FilterInfo *fi = bloomgrid__v1__filter_info__unpack(
            NULL, GRPC_SLICE_LENGTH(c[i].resp), GRPC_SLICE_START_PTR(c[i].resp));
        ck_assert_ptr_nonnull(fi);
        ck_assert_str_eq(fi->name, name);
        ck_assert_uint_eq(fi->capacity, (uint64_t)i);
        bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
        grpc_slice_unref(c[i].resp);
        grpc_slice_unref(c[i].req);
    }
    stop(&f);
}
END_TEST

START_TEST(finish_after_shutdown_frees_and_sends_nothing)
{
    struct fixture f;
    struct rpc_handler h[N_METHODS];
    struct client_call c;
    defer_handlers(h);
    start(&f, h, (struct rpc_server_config){.grace_ms = 200});

    client_start(&c, f.ch, "late");
    box_wait(1);
    /* Shutdown cancels the call still deferred after the grace period. */
    rpc_server_shutdown(f.srv);
    pthread_join(c.t, NULL);
    ck_assert_int_eq(c.rc, -1);
    ck_assert(c.st.code == GRPC_STATUS_UNAVAILABLE || c.st.code == GRPC_STATUS_CANCELLED);
    /* A body filled after the cancel is freed by the finish. */
    ck_assert_int_eq(finish_info(0, "late", 1), -ECANCELED);

    /* And after the server is gone altogether. */
    rpc_channel_destroy(f.ch);
    rpc_server_destroy(f.srv);
    start(&f, h, (struct rpc_server_config){.grace_ms = 200});
    client_start(&c, f.ch, "later");
    box_wait(2);
    rpc_channel_destroy(f.ch);
    rpc_server_destroy(f.srv);
    pthread_join(c.t, NULL);
    ck_assert_int_eq(c.rc, -1);
    ck_assert_int_eq(finish_info(1, "later", 1), -ECANCELED);
    grpc_shutdown();
    grpc_shutdown();
}
END_TEST

START_TEST(deferred_calls_past_the_bound_are_refused)
{
    struct fixture f;
    struct rpc_handler h[N_METHODS];
    struct client_call c[4], late;
    defer_handlers(h);
    start(&f, h, (struct rpc_server_config){.max_deferred = 3});

    for (int i = 0; i < 3; i++) {
        char name[8];
        snprintf(name, sizeof name, "d%d", i);
        client_start(&c[i], f.ch, name);
        box_wait(i + 1);
    }
    client_start(&late, f.ch, "over");
    pthread_join(late.t, NULL);
    ck_assert_int_eq(late.rc, -1);
    ck_assert_int_eq(late.st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
    ck_assert_ptr_nonnull(strstr(late.st.message, "max_deferred"));
    ck_assert_int_eq(box.n, 3);

    /* A finish makes room again. */
    ck_assert_int_eq(finish_info(0, "d0", 0), 0);
    pthread_join(c[0].t, NULL);
    ck_assert_int_eq(c[0].rc, 0);
    client_start(&c[3], f.ch, "d3");
    box_wait(4);
    for (int i = 1; i < 4; i++) {
        ck_assert_int_eq(finish_info(i, box.e[i].name, (uint64_t)i), 0);
        pthread_join(c[i].t, NULL);
        ck_assert_int_eq(c[i].rc, 0);
        ck_assert_str_eq(c[i].got_name, box.e[i].name);
        ck_assert_uint_eq(c[i].got_capacity, (uint64_t)i);
    }
    stop(&f);
}
END_TEST

/* A stream handler's own reply cannot be deferred: INTERNAL, not a hang. */
static void stream_defers_local_reply(void *arg, struct rpc_stream *st)
{
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    const uint8_t *buf;
    size_t len;
    (void)arg;
    while (rpc_stream_read(st, &buf, &len) > 0)
        ;
    if (!rpc_reply_defer(&r))
        rpc_stream_finish_status(st, &r.st);
}

START_TEST(only_a_unary_handlers_reply_can_be_deferred)
{
    struct fixture f;
    struct rpc_handler h[N_METHODS];
    struct rpc_status st;
    defer_handlers(h);
    h[M_MAY_CONTAIN_STREAM].stream = stream_defers_local_reply;
    start(&f, h, (struct rpc_server_config){0});
    struct rpc_cstream *cs =
        rpc_cstream_open(f.ch, "/bloomgrid.v1.BloomGrid/MayContainStream", 5000);
    ck_assert_ptr_nonnull(cs);
    rpc_cstream_close_send(cs);
    ck_assert_int_lt(rpc_cstream_finish(cs, &st), 0);
    ck_assert_int_eq(st.code, GRPC_STATUS_INTERNAL);
    stop(&f);
}
END_TEST

/* ---- the stream thread pool ---- */


/* Echo: every request message back, then OK.  Records its thread. */
static struct {
    pthread_mutex_t lock;
    pid_t tids[256];
    int ntids;
} seen = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void echo_stream(void *arg, struct rpc_stream *st)
{
    const uint8_t *buf;
    size_t len;
    (void)arg;
    pid_t me = gettid();
    pthread_mutex_lock(&seen.lock);
    int i;
    for (i = 0; i < seen.ntids && seen.tids[i] != me; i++)
        ;
    if (i == seen.ntids && seen.ntids < 256)
        seen.tids[seen.ntids++] = me;
    pthread_mutex_unlock(&seen.lock);
    while (rpc_stream_read(st, &buf, &len) > 0)
        if (rpc_stream_write_slice(st, grpc_slice_from_copied_buffer((const char *)buf,
                                                                     len)) < 0)
            return;
}

/* Write one AddRequest whose filter names id; read one answer back. */
static void write_id(struct rpc_cstream *cs, int id, size_t pad)
{
    char name[16];
    Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
    ProtobufCBinaryData key;
    uint8_t *p = calloc(1, pad + 1);
    snprintf(name, sizeof name, "%d", id);
    rq.filter = name;
    if (pad) {
        key.data = p;
        key.len = pad;
        rq.n_keys = 1;
        rq.keys = &key;
    }
    ck_assert_int_eq(rpc_cstream_write_msg(cs, &rq.base), 0);
    free(p);
}

/* The id of an answer (an AddRequest echoed), or -1. */
static int answer_id(grpc_slice sl)
{
    Bloomgrid__V1__AddRequest *m = bloomgrid__v1__add_request__unpack(
        NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    if (!m)
        return -1;
    int id = atoi(m->filter);
    bloomgrid__v1__add_request__free_unpacked(m, NULL);
    return id;
}

START_TEST(sequential_streams_reuse_the_pool_threads)
{
    enum { POOL = 16, CALLS = 100 };
    struct fixture f;
    struct rpc_status st;
    seen.ntids = 0;
    uint64_t ok0 = calls_of("AddStream", "OK");
    start_stream(&f, echo_stream, (struct rpc_server_config){.max_streams = POOL});
    /* The pool exists before any stream arrives. */
    ck_assert_int_ge(f.threads_started, POOL);

    for (int i = 0; i < CALLS; i++) {
        struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 5000);
        grpc_slice sl;
        ck_assert_ptr_nonnull(cs);
        write_id(cs, i, 0);
        ck_assert_int_eq(rpc_cstream_read(cs, &sl), 1);
        ck_assert_int_eq(answer_id(sl), i);
        ck_assert_int_eq(rpc_cstream_close_send(cs), 0);
        ck_assert_int_eq(rpc_cstream_read(cs, &sl), 0);
        ck_assert_int_eq(rpc_cstream_finish(cs, &st), 0);
    }
    /* Each stream counted once, when it ended (the handler's finish is
     * sent before the client's finish returns). */
    ck_assert_uint_eq(calls_of("AddStream", "OK"), ok0 + CALLS);
    /* A thread per stream would have shown CALLS thread ids. */
    ck_assert_int_ge(seen.ntids, 1);
    ck_assert_int_le(seen.ntids, POOL);
    stop(&f);
}
END_TEST

/* A handler that answers one message, finishes, and keeps its thread a
 * while longer (work after its status, as a handler closing its channels
 * does). */
static struct {
    atomic_int running, most;
} linger;

static void linger_stream(void *arg, struct rpc_stream *st)
{
    const uint8_t *buf;
    size_t len;
    (void)arg;
    int now = atomic_fetch_add(&linger.running, 1) + 1;
    if (now > atomic_load(&linger.most))
        atomic_store(&linger.most, now);
    if (rpc_stream_read(st, &buf, &len) > 0)
        rpc_stream_write_slice(st, grpc_slice_from_copied_buffer((const char *)buf, len));
    rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
    usleep(100 * 1000);
    atomic_fetch_sub(&linger.running, 1);
}

/* A client that has a stream's end opens the next one at once: with one
 * stream allowed, the next is not refused because the ended one's thread
 * is not back yet; it waits for that thread, so that no more handlers run
 * than max_streams. */
START_TEST(a_stream_whose_client_has_its_end_no_longer_counts)
{
    struct fixture f;
    struct rpc_status st;
    atomic_store(&linger.running, 0);
    atomic_store(&linger.most, 0);
    start_stream(&f, linger_stream, (struct rpc_server_config){.max_streams = 1});
    for (int i = 0; i < 5; i++) {
        struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 5000);
        grpc_slice sl;
        ck_assert_ptr_nonnull(cs);
        write_id(cs, i, 0);
        ck_assert_int_eq(rpc_cstream_close_send(cs), 0);
        ck_assert_int_eq(rpc_cstream_read(cs, &sl), 1);
        ck_assert_int_eq(answer_id(sl), i);
        ck_assert_int_eq(rpc_cstream_read(cs, &sl), 0);
        int rc = rpc_cstream_finish(cs, &st);
        ck_assert_msg(rc == 0, "stream %d: %d %s", i, st.code, st.message);
    }
    ck_assert_int_eq(atomic_load(&linger.most), 1);
    stop(&f);
}
END_TEST

/* ---- answers posted from other threads ---- */

/* A stand-in for a commit loop: requests handed over by a stream handler
 * (with a hold each), answered later from this thread. */
struct pending {
    struct rpc_stream *st;
    grpc_slice answer;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct pending q[512];
    int n;
    int batch;                 /* answer once this many are waiting */
    bool quit;
    bool handler_finishing;    /* the handler is about to finish */
    bool handler_returns;      /* leave the finish to the server */
    int delay_ms;              /* before answering a batch */
    struct rpc_status final;   /* what late_stream finishes with */
    int read_rc;               /* the handler's last read */
    int post_rc[512];
    int nposted;
} commit = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void commit_reset(int batch)
{
    pthread_mutex_lock(&commit.lock);
    commit.n = 0;
    commit.batch = batch;
    commit.quit = false;
    commit.handler_finishing = false;
    commit.handler_returns = false;
    commit.read_rc = 1;
    commit.nposted = 0;
    commit.delay_ms = 0;
    rpc_status_set(&commit.final, GRPC_STATUS_OK, "%s", "");
    pthread_mutex_unlock(&commit.lock);
}

static void commit_hand_over(struct rpc_stream *st, grpc_slice answer)
{
    ck_assert_int_eq(rpc_stream_hold(st), 0);
    pthread_mutex_lock(&commit.lock);
    commit.q[commit.n].st = st;
    commit.q[commit.n].answer = answer;
    commit.n++;
    pthread_cond_broadcast(&commit.cond);
    pthread_mutex_unlock(&commit.lock);
}

/* Answer what is waiting, in reverse order of arrival (out of order), once
 * a batch is full or the handler is finishing. */
static void *commit_main(void *p)
{
    (void)p;
    pthread_mutex_lock(&commit.lock);
    for (;;) {
        while (!commit.quit && commit.n < commit.batch &&
               !(commit.handler_finishing && commit.n > 0))
            pthread_cond_wait(&commit.cond, &commit.lock);
        if (commit.quit && commit.n == 0)
            break;
        int n = commit.n;
        struct pending q[512];
        memcpy(q, commit.q, (size_t)n * sizeof *q);
        commit.n = 0;
        int delay_ms = commit.delay_ms;
        pthread_mutex_unlock(&commit.lock);
        /* Lets the handler reach its finish first (a finish that did not
         * wait would then end the call without the answers). */
        usleep((useconds_t)delay_ms * 1000);
        for (int i = n - 1; i >= 0; i--) {
            int rc = rpc_stream_post(q[i].st, q[i].answer);
            pthread_mutex_lock(&commit.lock);
            commit.post_rc[commit.nposted++] = rc;
            pthread_cond_broadcast(&commit.cond);
            pthread_mutex_unlock(&commit.lock);
            rpc_stream_release(q[i].st);
        }
        pthread_mutex_lock(&commit.lock);
    }
    pthread_mutex_unlock(&commit.lock);
    return NULL;
}

static pthread_t commit_start(int batch)
{
    pthread_t t;
    commit_reset(batch);
    ck_assert_int_eq(pthread_create(&t, NULL, commit_main, NULL), 0);
    return t;
}

static void commit_stop(pthread_t t)
{
    pthread_mutex_lock(&commit.lock);
    commit.quit = true;
    pthread_cond_broadcast(&commit.cond);
    pthread_mutex_unlock(&commit.lock);
    pthread_join(t, NULL);
}

/* Odd ids are answered at once by the handler (a read), even ones by the
 * commit thread, in batches, while the handler reads on (a write). */
static void split_stream(void *arg, struct rpc_stream *st)
{
    const uint8_t *buf;
    size_t len;
    int rc;
    (void)arg;
    while ((rc = rpc_stream_read(st, &buf, &len)) > 0) {
        grpc_slice copy = grpc_slice_from_copied_buffer((const char *)buf, len);
        Bloomgrid__V1__AddRequest *m = bloomgrid__v1__add_request__unpack(NULL, len, buf);
        ck_assert_ptr_nonnull(m);
        int id = atoi(m->filter);
        bloomgrid__v1__add_request__free_unpacked(m, NULL);
        if (id % 2)
            ck_assert_int_eq(rpc_stream_post(st, copy), 0);
        else
            commit_hand_over(st, copy);
    }
    pthread_mutex_lock(&commit.lock);
    commit.read_rc = rc;
    commit.handler_finishing = true;
    bool leave = commit.handler_returns;
    pthread_cond_broadcast(&commit.cond);
    pthread_mutex_unlock(&commit.lock);
    if (!leave)
        rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
}

/* The client's reader: records every answer id in arrival order. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int ids[512];
    int n;
    bool ended;
    struct rpc_cstream *cs;
} got = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void *reader_main(void *p)
{
    (void)p;
    for (;;) {
        grpc_slice sl;
        int rc = rpc_cstream_read(got.cs, &sl);
        pthread_mutex_lock(&got.lock);
        if (rc == 1 && got.n < 512)
            got.ids[got.n++] = answer_id(sl);
        if (rc != 1)
            got.ended = true;
        pthread_cond_broadcast(&got.cond);
        pthread_mutex_unlock(&got.lock);
        if (rc != 1)
            return NULL;
    }
}

static bool got_has(int id)
{
    for (int i = 0; i < got.n; i++)
        if (got.ids[i] == id)
            return true;
    return false;
}

START_TEST(answers_posted_from_another_thread_while_the_handler_reads)
{
    enum { N = 100 };
    struct fixture f;
    struct rpc_status st;
    pthread_t reader;
    start_stream(&f, split_stream, (struct rpc_server_config){0});
    pthread_t ct = commit_start(5);

    got.n = 0;
    got.ended = false;
    got.cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    ck_assert_ptr_nonnull(got.cs);
    ck_assert_int_eq(pthread_create(&reader, NULL, reader_main, NULL), 0);
    for (int i = 0; i < N; i += 2) {
        write_id(got.cs, i, 0);
        write_id(got.cs, i + 1, 0);
        /* The odd answer comes while earlier even ones are still pending:
         * the handler goes on reading behind them. */
        pthread_mutex_lock(&got.lock);
        while (!got_has(i + 1) && !got.ended)
            pthread_cond_wait(&got.cond, &got.lock);
        ck_assert(got_has(i + 1));
        pthread_mutex_unlock(&got.lock);
    }
    ck_assert_int_eq(rpc_cstream_close_send(got.cs), 0);
    pthread_join(reader, NULL);
    ck_assert_int_eq(rpc_cstream_finish(got.cs, &st), 0);
    commit_stop(ct);

    /* Every answer exactly once, and the commit thread's out of order. */
    ck_assert_int_eq(got.n, N);
    int inversions = 0, last_even = -1;
    for (int id = 0; id < N; id++)
        ck_assert(got_has(id));
    for (int i = 0; i < got.n; i++) {
        if (got.ids[i] % 2)
            continue;
        if (got.ids[i] < last_even)
            inversions++;
        last_even = got.ids[i];
    }
    ck_assert_int_gt(inversions, 0);
    for (int i = 0; i < commit.nposted; i++)
        ck_assert_int_eq(commit.post_rc[i], 0);
    stop(&f);
}
END_TEST

/* Every request is answered by the commit thread, and only once the handler
 * is finishing (with commit.final); answers are larger than the stream's
 * queue bound. */
static void late_stream(void *arg, struct rpc_stream *st)
{
    const uint8_t *buf;
    size_t len;
    int rc;
    (void)arg;
    while ((rc = rpc_stream_read(st, &buf, &len)) > 0)
        commit_hand_over(st, grpc_slice_from_copied_buffer((const char *)buf, len));
    pthread_mutex_lock(&commit.lock);
    commit.read_rc = rc;
    commit.handler_finishing = true;
    bool leave = commit.handler_returns;
    struct rpc_status final = commit.final;
    pthread_cond_broadcast(&commit.cond);
    pthread_mutex_unlock(&commit.lock);
    if (!leave)
        rpc_stream_finish_status(st, &final);
}

/* N answers of 8 KiB posted after the handler has read everything (and,
 * bad_last, met a message that breaks the string rule), then the status. */
static void run_late_answers(bool handler_returns, const struct rpc_status *final,
                             bool bad_last, grpc_status_code want)
{
    enum { N = 50 };
    struct fixture f;
    struct rpc_status st;
    start_stream(&f, late_stream, (struct rpc_server_config){.stream_queue = 1024});
    /* No batch is ever full until the handler finishes. */
    pthread_t ct = commit_start(1000);
    pthread_mutex_lock(&commit.lock);
    commit.handler_returns = handler_returns;
    commit.delay_ms = 50;
    if (final)
        commit.final = *final;
    pthread_mutex_unlock(&commit.lock);

    struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    ck_assert_ptr_nonnull(cs);
    for (int i = 0; i < N; i++)
        write_id(cs, i, 8192);
    if (bad_last) {
        static const uint8_t nul[] = {0x0a, 0x03, 'x', 0, 'y'};
        ck_assert_int_eq(rpc_cstream_write(cs, nul, sizeof nul), 0);
    }
    ck_assert_int_eq(rpc_cstream_close_send(cs), 0);
    /* Answers in the order posted (reverse), all before the status. */
    for (int i = N - 1; i >= 0; i--) {
        grpc_slice sl;
        ck_assert_int_eq(rpc_cstream_read(cs, &sl), 1);
        ck_assert_int_eq(answer_id(sl), i);
    }
    grpc_slice sl;
    ck_assert_int_eq(rpc_cstream_read(cs, &sl), 0);
    rpc_cstream_finish(cs, &st);
    ck_assert_int_eq(st.code, want);
    if (final && want == final->code) {
        ck_assert_int_eq(st.reason, final->reason);
        ck_assert_str_eq(st.message, final->message);
    }
    commit_stop(ct);
    ck_assert(commit.handler_finishing);
    stop(&f);
}

START_TEST(finish_sends_pending_posts_first)
{
    run_late_answers(false, NULL, false, GRPC_STATUS_OK);
}
END_TEST

START_TEST(handler_return_sends_pending_posts_first)
{
    run_late_answers(true, NULL, false, GRPC_STATUS_OK);
}
END_TEST

START_TEST(pending_posts_go_before_a_failed_status_and_its_reason)
{
    struct rpc_status final;
    rpc_status_set(&final, GRPC_STATUS_FAILED_PRECONDITION, "filter \"%s\" has no counters",
                   "slugs");
    final.reason = RPC_REASON_NOT_COUNTING;
    run_late_answers(false, &final, false, GRPC_STATUS_FAILED_PRECONDITION);
    /* A message that breaks the string rule ends the call INVALID_ARGUMENT,
     * after the answers of the requests before it. */
    run_late_answers(false, &final, true, GRPC_STATUS_INVALID_ARGUMENT);
}
END_TEST

START_TEST(a_cancelled_stream_with_answers_pending_gives_its_thread_back)
{
    struct fixture f;
    struct rpc_status st;
    /* One stream thread: the second stream needs the first one's back. */
    start_stream(&f, late_stream, (struct rpc_server_config){.max_streams = 1});
    pthread_t ct = commit_start(1000);

    struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    ck_assert_ptr_nonnull(cs);
    write_id(cs, 1, 0);
    pthread_mutex_lock(&commit.lock);
    while (commit.n < 1)
        pthread_cond_wait(&commit.cond, &commit.lock);
    pthread_mutex_unlock(&commit.lock);
    rpc_cstream_cancel(cs);
    ck_assert_int_lt(rpc_cstream_finish(cs, &st), 0);
    /* The handler's read ends (gRPC reports a cancel as the end of the
     * client's messages or as a failure) and its finish waits for the
     * answer, which is posted after that and goes nowhere. */
    pthread_mutex_lock(&commit.lock);
    while (commit.nposted < 1)
        pthread_cond_wait(&commit.cond, &commit.lock);
    ck_assert_int_le(commit.read_rc, 0);
    ck_assert(commit.post_rc[0] == 0 || commit.post_rc[0] == -ECANCELED);
    pthread_mutex_unlock(&commit.lock);
    commit_stop(ct);

    /* The pool thread comes back once the first call has ended (refused
     * until then), and serves the next stream; the commit thread answers
     * at once now. */
    ct = commit_start(1);
    for (int tries = 0;; tries++) {
        grpc_slice sl;
        cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
        ck_assert_ptr_nonnull(cs);
        write_id(cs, 2, 0);
        rpc_cstream_close_send(cs);
        if (rpc_cstream_read(cs, &sl) == 1) {
            ck_assert_int_eq(answer_id(sl), 2);
            ck_assert_int_eq(rpc_cstream_read(cs, &sl), 0);
            ck_assert_int_eq(rpc_cstream_finish(cs, &st), 0);
            break;
        }
        ck_assert_int_lt(rpc_cstream_finish(cs, &st), 0);
        ck_assert_int_eq(st.code, GRPC_STATUS_RESOURCE_EXHAUSTED);
        ck_assert_int_lt(tries, 1000);
        usleep(10 * 1000);
    }
    commit_stop(ct);
    stop(&f);
}
END_TEST

/* Several threads post to one stream at once while its handler reads. */
enum { POSTERS = 4, PER_POSTER = 200 };

struct poster {
    pthread_t t;
    struct rpc_stream *st;
    int first;
};

static void *poster_main(void *p)
{
    struct poster *w = p;
    for (int k = 0; k < PER_POSTER; k++) {
        char name[16];
        uint8_t buf[32];
        Bloomgrid__V1__AddRequest rq = BLOOMGRID__V1__ADD_REQUEST__INIT;
        snprintf(name, sizeof name, "%d", w->first + k);
        rq.filter = name;
        size_t len = protobuf_c_message_pack(&rq.base, buf);
        if (rpc_stream_post(w->st, grpc_slice_from_copied_buffer((const char *)buf, len)) < 0)
            break;
    }
    rpc_stream_release(w->st);
    return NULL;
}

static void fan_stream(void *arg, struct rpc_stream *st)
{
    struct poster w[POSTERS];
    const uint8_t *buf;
    size_t len;
    (void)arg;
    if (rpc_stream_read(st, &buf, &len) <= 0)
        return;
    for (int i = 0; i < POSTERS; i++) {
        w[i].st = st;
        w[i].first = (i + 1) * 1000;
        ck_assert_int_eq(rpc_stream_hold(st), 0);
        ck_assert_int_eq(pthread_create(&w[i].t, NULL, poster_main, &w[i]), 0);
    }
    /* The handler's own answers go between the posters'. */
    while (rpc_stream_read(st, &buf, &len) > 0)
        rpc_stream_send(st, grpc_slice_from_copied_buffer((const char *)buf, len));
    rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
    for (int i = 0; i < POSTERS; i++)
        pthread_join(w[i].t, NULL);
}

START_TEST(posts_from_many_threads_keep_each_threads_order)
{
    struct fixture f;
    struct rpc_status st;
    int next[POSTERS + 1];
    start_stream(&f, fan_stream, (struct rpc_server_config){.stream_queue = 256});
    struct rpc_cstream *cs = rpc_cstream_open(f.ch, ADD_STREAM, 20000);
    ck_assert_ptr_nonnull(cs);
    write_id(cs, 0, 0);
    for (int i = 1; i <= 20; i++)
        write_id(cs, i, 0);
    ck_assert_int_eq(rpc_cstream_close_send(cs), 0);
    for (int i = 0; i <= POSTERS; i++)
        next[i] = i * 1000;
    next[0] = 1;
    for (int n = 0; n < POSTERS * PER_POSTER + 20; n++) {
        grpc_slice sl;
        ck_assert_int_eq(rpc_cstream_read(cs, &sl), 1);
        int id = answer_id(sl);
        int who = id / 1000;
        ck_assert_int_le(who, POSTERS);
        ck_assert_int_eq(id, next[who]);
        next[who]++;
    }
    grpc_slice sl;
    ck_assert_int_eq(rpc_cstream_read(cs, &sl), 0);
    ck_assert_int_eq(rpc_cstream_finish(cs, &st), 0);
    stop(&f);
}
END_TEST

Suite *rpc_async_suite(void)
{
    Suite *s = suite_create("rpc_async");
    TCase *tc = tcase_create("rpc_async");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, deferred_reply_arrives_when_finished);
    tcase_add_test(tc, thousand_deferred_calls_finish_in_any_order);
    tcase_add_test(tc, finish_after_shutdown_frees_and_sends_nothing);
    tcase_add_test(tc, deferred_calls_past_the_bound_are_refused);
    tcase_add_test(tc, only_a_unary_handlers_reply_can_be_deferred);
    tcase_add_test(tc, sequential_streams_reuse_the_pool_threads);
    tcase_add_test(tc, a_stream_whose_client_has_its_end_no_longer_counts);
    tcase_add_test(tc, answers_posted_from_another_thread_while_the_handler_reads);
    tcase_add_test(tc, finish_sends_pending_posts_first);
    tcase_add_test(tc, handler_return_sends_pending_posts_first);
    tcase_add_test(tc, pending_posts_go_before_a_failed_status_and_its_reason);
    tcase_add_test(tc, a_cancelled_stream_with_answers_pending_gives_its_thread_back);
    tcase_add_test(tc, posts_from_many_threads_keep_each_threads_order);
    suite_add_tcase(s, tc);
    return s;
}
