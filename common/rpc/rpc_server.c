/* rpc_server: a small gRPC server over the gRPC C core (see rpc_server.h).
 *
 * Queues and threads: each event loop has a completion queue of its own,
 * read by its thread alone; the worker threads share one queue, or two
 * when there are several (with loops, the workers' queues do not poll, so
 * only the loops read sockets).  Requests of methods marked loop are posted
 * on the loops' queues, the others (and the generic request) on the
 * workers'; worker_main reads a queue and hands each event to handle_event.
 * With a request budget one more thread runs the large requests of the
 * loops' methods (rpc_server_budget.c).
 *
 * Every posted request is a struct slot, the tag of its events.  A unary
 * slot goes REQUESTED -> (READING, with a request budget) -> (handler runs
 * on the thread that read the request) -> REPLYING -> freed; a deferred
 * one waits between the handler and REPLYING on its server's defer_book
 * until some thread finishes it.  A pool
 * stream's slot owns a completion queue bound to its call; once the call
 * arrives it is queued for the stream pool, whose thread runs the handler,
 * which blocks on that queue for each of its operations.  A stream driven
 * by its messages (struct rpc_loop_stream) has no queue or thread of its
 * own: its batches complete on the queue its request came on, as loop tags
 * (struct rpc_loop_tag, which the process may also put on a loop's queue),
 * and handle_event runs their functions.  A generic slot catches unknown
 * methods.  Whenever a request completes, a fresh one is posted for the same
 * method on the same queue, so there are always requests waiting.
 * Streaming calls are driven by rpc_stream.c, the Health service lives in
 * rpc_health.c.
 *
 * Deferred replies live in rpc_deferred.c.
 *
 * Lock order: srv->lock before a stream's s->lock (the idle sweep of
 * streams driven by their messages holds both); book->lock is never held
 * with either; srv->budget_lock (rpc_server_budget.c) is taken last,
 * inside any of them or alone.
 *
 * With a request budget, unary methods are registered without their
 * payload and their message is read in rpc_server_budget.c (SLOT_READING)
 * before the handler runs.
 */
#include "rpc_check.h"
#include "rpc_server.h"
#include "svc_notify.h"
#include "rpc_server_internal.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "grpc/health/v1/health.pb-c.h"
#include "log.h"
#include "metrics.h"

static void post_request(struct rpc_server *srv, struct rpc_method *m, int li,
                         int cqi);
static void unimplemented_unary(void *arg, const uint8_t *req, size_t len,
                                struct rpc_reply *reply);
static void post_generic(struct rpc_server *srv, int li, int cqi);

/* ---- reply helpers ---- */

static void reply_verror(struct rpc_reply *r, grpc_status_code code,
                         enum rpc_reason reason, const char *fmt, va_list ap)
{
    vsnprintf(r->st.message, sizeof r->st.message, fmt, ap);
    r->st.code = code;
    r->st.reason = reason;
    if (r->has_body) {
        grpc_slice_unref(r->body);
        r->has_body = false;
    }
}

void rpc_reply_error(struct rpc_reply *r, grpc_status_code code,
                     const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_verror(r, code, RPC_REASON_NONE, fmt, ap);
    va_end(ap);
}

void rpc_reply_fail(struct rpc_reply *r, grpc_status_code code,
                    enum rpc_reason reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    reply_verror(r, code, reason, fmt, ap);
    va_end(ap);
}


uint8_t *rpc_reply_alloc(struct rpc_reply *r, size_t len)
{
    if (r->has_body)
        grpc_slice_unref(r->body);
    r->body = grpc_slice_malloc(len);
    r->has_body = true;
    return GRPC_SLICE_START_PTR(r->body);
}

int rpc_reply_pack(struct rpc_reply *r, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *p = rpc_reply_alloc(r, len);
    if (!p)
        return -ENOMEM;
    protobuf_c_message_pack(msg, p);
    return 0;
}

/* ---- slots ---- */

static struct slot *slot_new(struct rpc_server *srv, enum slot_kind kind,
                             struct rpc_method *m, int li, int cqi)
{
    struct slot *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->kind = kind;
    s->srv = srv;
    s->m = m;
    s->li = li;
    s->cqi = cqi;
    grpc_metadata_array_init(&s->md);
    if (kind == SLOT_GENERIC)
        grpc_call_details_init(&s->details);
    return s;
}

static void drain_cq(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, rpc_server__inf_future(), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
    }
    grpc_completion_queue_destroy(cq);
}

void rpc_server__slot_free(struct slot *s)
{
    /* An orphaned slot gave its charge back at shutdown, while its server
     * still existed. */
    if (s->charge)
        rpc_server__budget_drop(s);
    if (s->has_req)
        grpc_slice_unref(s->req);
    if (s->call)
        grpc_call_unref(s->call);
    grpc_metadata_array_destroy(&s->md);
    if (s->kind == SLOT_GENERIC)
        grpc_call_details_destroy(&s->details);
    if (s->payload)
        grpc_byte_buffer_destroy(s->payload);
    if (s->send_buf)
        grpc_byte_buffer_destroy(s->send_buf);
    if (s->reply.has_body)
        grpc_slice_unref(s->reply.body);
    if (s->has_status_details)
        grpc_slice_unref(s->status_details);
    if (s->has_cur)
        grpc_slice_unref(s->cur);
    if (s->cq)
        drain_cq(s->cq);
    if (s->write_buf)
        grpc_byte_buffer_destroy(s->write_buf);
    rpc_server__stream_deinit(s);
    free(s);
}

/* A queue for next.  With loops, only the loops' queues poll: a thread
 * waiting on another queue sleeps until its own events come, instead of
 * reading sockets for the loops and waking them up. */
static grpc_completion_queue *cq_create(const struct rpc_server *srv, bool polling)
{
    grpc_completion_queue_attributes a = {
        .version = 1,
        .cq_completion_type = GRPC_CQ_NEXT,
        .cq_polling_type = polling || !srv->nloops ? GRPC_CQ_DEFAULT_POLLING
                                                   : GRPC_CQ_NON_POLLING,
    };
    return grpc_completion_queue_create(
        grpc_completion_queue_factory_lookup(&a), &a, NULL);
}

static void post_request(struct rpc_server *srv, struct rpc_method *m, int li,
                         int cqi)
{
    if (atomic_load(&srv->stopping))
        return;
    bool stream = m->stream || m->lstream;
    struct slot *s = slot_new(srv, stream ? SLOT_STREAM : SLOT_UNARY, m, li, cqi);
    if (!s) {
        log_error("out of memory posting a request for %s", m->path);
        return;
    }
    grpc_completion_queue *ncq = srv->cqs[cqi].cq;
    grpc_completion_queue *bound = ncq;
    if (m->lstream) {
        /* Its batches complete where its request did. */
        s->lmode = true;
        rpc_server__stream_init(s);
    } else if (stream) {
        s->cq = cq_create(srv, false);
        bound = s->cq;
        rpc_server__stream_init(s);
    }
    /* A method read under the request budget gets its message later. */
    bool payload = !stream && !rpc_server__budget_gated(srv, m);
    grpc_call_error e = grpc_server_request_registered_call(
        srv->listeners[li].server, m->handle[li], &s->call, &s->deadline, &s->md,
        payload ? &s->payload : NULL, bound, ncq, s);
    if (e != GRPC_CALL_OK) {
        log_error("grpc_server_request_registered_call(%s): %d", m->path, e);
        rpc_server__slot_free(s);
    }
}

static void post_generic(struct rpc_server *srv, int li, int cqi)
{
    if (atomic_load(&srv->stopping))
        return;
    struct slot *s = slot_new(srv, SLOT_GENERIC, NULL, li, cqi);
    if (!s)
        return;
    grpc_completion_queue *cq = srv->cqs[cqi].cq;
    grpc_call_error e = grpc_server_request_call(srv->listeners[li].server, &s->call,
                                                 &s->details, &s->md, cq, cq, s);
    if (e != GRPC_CALL_OK) {
        log_error("grpc_server_request_call: %d", e);
        rpc_server__slot_free(s);
    }
}

size_t rpc_server__status_ops(struct slot *s, grpc_op *ops, grpc_status_code code,
                              enum rpc_reason reason, const char *msg)
{
    ops[0].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[0].data.send_status_from_server.status = code;
    if (code != GRPC_STATUS_OK) {
        s->status_details = grpc_slice_from_copied_string(msg);
        s->has_status_details = true;
        ops[0].data.send_status_from_server.status_details = &s->status_details;
        if (reason != RPC_REASON_NONE) {
            s->reason_md.key = grpc_slice_from_static_string(RPC_REASON_KEY);
            s->reason_md.value = grpc_slice_from_static_string(rpc_reason_name(reason));
            ops[0].data.send_status_from_server.trailing_metadata_count = 1;
            ops[0].data.send_status_from_server.trailing_metadata = &s->reason_md;
        }
    }
    ops[1].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[1].data.recv_close_on_server.cancelled = &s->cancelled;
    return 2;
}

/* Send the status (and the body when OK) of a unary or generic call.  On
 * failure the slot is freed and -ECANCELED returned. */
int rpc_server__send_reply(struct slot *s)
{
    grpc_op ops[4];
    size_t n = 0;
    struct rpc_reply *r = &s->reply;

    memset(ops, 0, sizeof ops);
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    n++;
    if (r->st.code == GRPC_STATUS_OK) {
        grpc_slice body = r->has_body ? r->body : grpc_empty_slice();
        s->send_buf = grpc_raw_byte_buffer_create(&body, 1);
        if (r->has_body) {
            grpc_slice_unref(r->body);
            r->has_body = false;
        }
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n].data.send_message.send_message = s->send_buf;
        n++;
    }
    rpc_server__call_done(s, r->st.code);
    n += rpc_server__status_ops(s, ops + n, r->st.code, r->st.reason, r->st.message);
    s->state = SLOT_REPLYING;
    grpc_call_error e = grpc_call_start_batch(s->call, ops, n, s, NULL);
    if (e != GRPC_CALL_OK) {
        log_error("reply batch failed to start: %d", e);
        rpc_server__slot_free(s);
        return -ECANCELED;
    }
    return 0;
}

/* Run the handler and send its reply, unless it deferred it: the slot then
 * belongs to the deferred handle and is not touched here again. */
void rpc_server__unary_run(struct slot *s)
{
    struct rpc_reply *r = &s->reply;
    struct rpc_unary_run run = {.s = s};
    grpc_slice sl = grpc_empty_slice();
    grpc_byte_buffer_reader rd;
    char msg[RPC_MSGLEN];

    r->st.code = GRPC_STATUS_OK;
    if (s->m->unary == unimplemented_unary) {
        unimplemented_unary(s->m->arg, NULL, 0, r);
    } else if (!s->payload) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: the request carried no message", s->m->path);
    } else if (!grpc_byte_buffer_reader_init(&rd, s->payload)) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: the request message cannot be read", s->m->path);
    } else {
        sl = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
        grpc_byte_buffer_destroy(s->payload);
        s->payload = NULL;
        rpc_server__budget_trim(s->srv, GRPC_SLICE_LENGTH(sl));
        if (s->srv->cfg.request_budget) {
            /* The slot keeps the request until the call ends, so that a
             * deferred handler may read it until its finish (attached
             * before the handler runs: once it defers, the slot may be
             * finished and freed by another thread at any time). */
            s->req = sl;
            s->has_req = true;
            sl = grpc_empty_slice();
        }
        /* Through a pointer: a small slice holds its bytes inline, so they
         * are where this slice struct is, not in a copy of it. */
        const grpc_slice *body = s->has_req ? &s->req : &sl;
        const uint8_t *req = GRPC_SLICE_START_PTR(*body);
        size_t len = GRPC_SLICE_LENGTH(*body);
        if (rpc_check_strings(s->m->input, req, len, msg, sizeof msg) < 0) {
            rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", msg);
        } else {
            rpc_server__current_run = &run;
            s->m->unary(s->m->arg, req, len, r);
            rpc_server__current_run = NULL;
        }
    }
    grpc_slice_unref(sl);
    if (run.deferred)
        return;
    if (s->payload) {
        grpc_byte_buffer_destroy(s->payload);
        s->payload = NULL;
    }
    rpc_server__send_reply(s);
}

/* ---- stream pool ---- */

/* A pool thread: run one stream at a time, as they come, until shutdown. */
static void *pool_main(void *p)
{
    struct rpc_server *srv = p;

    pthread_mutex_lock(&srv->lock);
    for (;;) {
        while (!srv->jobs_head && !srv->pool_quit)
            pthread_cond_wait(&srv->job_cond, &srv->lock);
        struct slot *s = srv->jobs_head;
        if (!s)
            break;
        srv->jobs_head = s->job_next;
        if (!srv->jobs_head)
            srv->jobs_tail = NULL;
        pthread_mutex_unlock(&srv->lock);

        s->m->stream(s->m->arg, (struct rpc_stream *)s);
        if (!s->finished)
            rpc_stream_finish((struct rpc_stream *)s, GRPC_STATUS_OK, "%s", "");
        rpc_server__stream_uncount(s);
        rpc_server__slot_free(s);
        pthread_mutex_lock(&srv->lock);
    }
    pthread_mutex_unlock(&srv->lock);
    return NULL;
}

static void stream_leave_locked(struct rpc_server *srv, const struct slot *s)
{
    srv->streams_active--;
    srv->streams_public -= !s->m->internal;
    srv->streams_watch -= s->m->watch;
}

void rpc_server__stream_ending(struct slot *s)
{
    struct rpc_server *srv = s->srv;
    pthread_mutex_lock(&srv->lock);
    if (s->counted && !s->ending) {
        s->ending = true;
        stream_leave_locked(srv, s);
    }
    pthread_mutex_unlock(&srv->lock);
}

void rpc_server__stream_uncount(struct slot *s)
{
    struct rpc_server *srv = s->srv;
    pthread_mutex_lock(&srv->lock);
    if (!s->ending)
        stream_leave_locked(srv, s);
    srv->streams_alive--;
    pthread_cond_broadcast(&srv->cond);
    pthread_mutex_unlock(&srv->lock);
}

/* Health Watch streams live as long as their client and never read again
 * (stream_idle_ms cannot end them): they get a quarter of the pool, so
 * that watchers cannot hold the threads Export, Import and page streams
 * need. */
static int watch_limit(const struct rpc_server *srv)
{
    return srv->npool / 4 > 0 ? srv->npool / 4 : 1;
}

/* Hand a stream to the pool, or refuse it when every pool thread has one
 * (a stream holds its thread until it ends). */
static void stream_start(struct slot *s)
{
    struct rpc_server *srv = s->srv;

    pthread_mutex_lock(&srv->lock);
    /* Public streams leave internal_streams threads to the cluster's. */
    int limit = srv->npool;
    bool internal = s->m->internal, watch = s->m->watch;
    bool full = srv->streams_active >= limit;
    if (!internal && !full) {
        limit = srv->npool - srv->cfg.internal_streams;
        full = srv->streams_public >= limit;
    }
    bool watch_full = !full && watch && srv->streams_watch >= watch_limit(srv);
    if (watch_full)
        limit = watch_limit(srv);
    /* A stream handed to the pool may be over (and freed) once the lock is
     * let go: only these locals are read after it. */
    bool lmode = s->lmode, begin = false;
    if (!full && !watch_full && lmode) {
        srv->streams_active++;
        srv->streams_public += !internal;
        srv->streams_alive++;
        s->counted = begin = true;
    } else if (!full && !watch_full) {
        srv->streams_active++;
        srv->streams_public += !internal;
        srv->streams_watch += watch;
        srv->streams_alive++;
        s->counted = true;
        s->job_next = NULL;
        if (srv->jobs_tail)
            srv->jobs_tail->job_next = s;
        else
            srv->jobs_head = s;
        srv->jobs_tail = s;
        pthread_cond_signal(&srv->job_cond);
    }
    pthread_mutex_unlock(&srv->lock);
    if (begin) {
        rpc_server__lstream_begin(s);
        return;
    }
    if (!full && !watch_full)
        return;
    /* Refused: every pool thread it could take has a stream. */
    struct rpc_status st = {.code = GRPC_STATUS_RESOURCE_EXHAUSTED};
    if (watch_full) {
        log_warn("refusing stream %s: %d health Watch streams open", s->m->path, limit);
        snprintf(st.message, sizeof st.message,
                 "server has %d health Watch streams open, its limit (a quarter of "
                 "max_streams); use Check, or retry later", limit);
    } else {
        log_warn("refusing stream %s: %d %sstreams open", s->m->path, limit,
                 internal ? "" : "public ");
        bool kept = !internal && srv->cfg.internal_streams > 0;
        snprintf(st.message, sizeof st.message,
                 "server has %d %sstreams open, its limit (max_streams%s); retry later",
                 limit, kept ? "public " : "", kept ? " less internal_streams" : "");
    }
    if (lmode) {
        rpc_server__lstream_refuse(s, &st);   /* frees the slot once sent */
    } else {
        rpc_stream_finish_status((struct rpc_stream *)s, &st);
        rpc_server__slot_free(s);
    }
}

/* Is path a method of this server that another listener serves? */
static bool served_elsewhere(const struct rpc_server *srv, const char *path)
{
    for (size_t i = 0; i < srv->nmethods; i++)
        if (strcmp(srv->methods[i]->path, path) == 0)
            return true;
    return false;
}

/* Admit the call, or fill its refusal (UNAUTHENTICATED or
 * PERMISSION_DENIED) in s->reply before any handler sees it.  Without a
 * tokens table this is one test. */
static bool call_admitted(struct slot *s)
{
    struct rpc_auth *a = s->srv->auth;
    if (!a || s->m->rule == RPC_AUTH_OPEN)
        return true;
    return rpc_auth_admit(a, s->m->rule, s->m->path, s->call, &s->md, &s->who,
                          &s->reply.st) == 0;
}

/* A loop's queue holds slots and the process's own tags, told apart by the
 * int each begins with. */
_Static_assert(offsetof(struct slot, kind) == 0 && sizeof(enum slot_kind) == sizeof(int),
               "a slot begins with its kind");
_Static_assert(RPC_LOOP_TAG > SLOT_GENERIC, "RPC_LOOP_TAG is no slot kind");

static void handle_event(struct rpc_server *srv, struct slot *s, bool ok)
{
    int kind;           /* a slot's kind, or a struct rpc_loop_tag's */
    memcpy(&kind, s, sizeof kind);
    if (kind == RPC_LOOP_TAG) {
        struct rpc_loop_tag *t = (struct rpc_loop_tag *)(void *)s;
        t->fn(t, ok);
        return;
    }
    if (s->state == SLOT_REPLYING) {
        rpc_server__slot_free(s);
        return;
    }
    if (s->state == SLOT_READING) {
        /* Its message, read under the request budget. */
        if (!rpc_server__read_done(s, ok))
            rpc_server__slot_free(s);
        else if (!rpc_server__budget_heavy(s))
            rpc_server__unary_run(s);
        return;
    }
    if (!ok) {
        /* Server shutting down: the request was never matched. */
        rpc_server__slot_free(s);
        return;
    }
    clock_gettime(CLOCK_MONOTONIC, &s->t0);
    switch (s->kind) {
    case SLOT_GENERIC: {
        post_generic(srv, s->li, s->cqi);
        char path[256];
        size_t len = GRPC_SLICE_LENGTH(s->details.method);
        if (len >= sizeof path)
            len = sizeof path - 1;
        memcpy(path, GRPC_SLICE_START_PTR(s->details.method), len);
        path[len] = 0;
        log_debug("unknown method %s on %s", path, srv->listeners[s->li].addr);
        if (served_elsewhere(srv, path))
            rpc_reply_error(&s->reply, GRPC_STATUS_UNIMPLEMENTED,
                            "%s is not served on this address (%s): this "
                            "server serves it on another listener", path,
                            srv->listeners[s->li].addr);
        else
            rpc_reply_error(&s->reply, GRPC_STATUS_UNIMPLEMENTED,
                            "unknown method %s", path);
        rpc_server__send_reply(s);
        break;
    }
    case SLOT_UNARY:
        post_request(srv, s->m, s->li, s->cqi);
        if (!call_admitted(s))
            rpc_server__send_reply(s);
        else if (rpc_server__budget_gated(srv, s->m) && s->m->unary != unimplemented_unary)
            rpc_server__read_start(s);   /* unary_run once it is in */
        else if (s->m->unary)
            rpc_server__unary_run(s);
        break;
    case SLOT_STREAM:
        post_request(srv, s->m, s->li, s->cqi);
        if (call_admitted(s)) {
            stream_start(s);
            break;
        }
        if (s->lmode) {
            rpc_server__lstream_refuse(s, &s->reply.st);
            break;
        }
        rpc_stream_finish_status((struct rpc_stream *)s, &s->reply.st);
        rpc_server__slot_free(s);
        break;
    }
}

static _Thread_local bool on_loop;

bool rpc_server_on_loop(void)
{
    return on_loop;
}

static void *worker_main(void *p)
{
    struct rpc_server *srv = ((void **)p)[0];
    int cqi = (int)(intptr_t)((void **)p)[1];
    free(p);
    on_loop = cqi < srv->nloops;
    grpc_completion_queue *cq = srv->cqs[cqi].cq;
    for (;;) {
        /* Woken now and then to end idle streams (stream_idle_ms), and
         * often while requests are being read under the budget. */
        struct timespec w0, w1;
        clock_gettime(CLOCK_MONOTONIC, &w0);
        grpc_event ev = grpc_completion_queue_next(
            cq, gpr_time_from_millis(rpc_server__budget_wait_ms(srv, cqi), GPR_TIMESPAN),
            NULL);  /* relative */
        clock_gettime(CLOCK_MONOTONIC, &w1);
        rpc_server__lstream_sweep(srv);
        rpc_server__budget_sweep(srv, cqi, (int64_t)(w1.tv_sec - w0.tv_sec) * 1000000000 +
                                               (w1.tv_nsec - w0.tv_nsec));
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        handle_event(srv, ev.tag, ev.success != 0);
    }
    return NULL;
}

/* ---- methods that answer UNIMPLEMENTED ---- */

static void unimplemented_unary(void *arg, const uint8_t *req, size_t len,
                                struct rpc_reply *reply)
{
    const char *path = arg;
    (void)req;
    (void)len;
    rpc_reply_error(reply, GRPC_STATUS_UNIMPLEMENTED,
                    "%s is not implemented by this server", path);
}

/* ---- server ---- */

/* ---- metrics ---- */

static struct metric *calls_counter(struct rpc_method *m, grpc_status_code code)
{
    const char *labels[] = {"service", m->service, "method", m->name, "code",
                            rpc_status_name(code), NULL};
    return metrics_counter(metrics_registry(), "bloomgrid_rpc_calls_total",
                           "calls answered, by method and status code", labels);
}

/* The codes whose calls series exist from the start, at 0: OK and the
 * server's own failures (down, overloaded, broken), which alerts count, so
 * that the first such failure is an increase.  A client's mistakes
 * (NOT_FOUND, INVALID_ARGUMENT...) appear when first answered. */
static const grpc_status_code calls_at_start[] = {
    GRPC_STATUS_OK, GRPC_STATUS_UNKNOWN, GRPC_STATUS_DEADLINE_EXCEEDED,
    GRPC_STATUS_RESOURCE_EXHAUSTED, GRPC_STATUS_INTERNAL, GRPC_STATUS_UNAVAILABLE,
    GRPC_STATUS_DATA_LOSS,
};

/* The method's series, made before any call arrives. */
static void method_metrics(struct rpc_method *m)
{
    const char *labels[] = {"service", m->service, "method", m->name, NULL};
    for (size_t i = 0; i < sizeof calls_at_start / sizeof *calls_at_start; i++)
        atomic_store_explicit(&m->calls[calls_at_start[i]],
                              calls_counter(m, calls_at_start[i]), memory_order_relaxed);
    m->duration = metrics_histogram(metrics_registry(), "bloomgrid_rpc_duration_seconds",
                                    "time from a call's arrival to its status "
                                    "(streams: their whole life), by method",
                                    labels, metrics_latency_bounds,
                                    metrics_latency_nbounds);
}

void rpc_server__call_done(struct slot *s, grpc_status_code code)
{
    struct rpc_method *m = s->m;
    struct timespec now;

    if (!m || !s->t0.tv_sec || (unsigned)code > GRPC_STATUS_UNAUTHENTICATED)
        return;
    struct metric *c = atomic_load_explicit(&m->calls[code], memory_order_relaxed);
    if (!c) {
        /* Same labels, same series: a race here stores the same pointer. */
        c = calls_counter(m, code);
        atomic_store_explicit(&m->calls[code], c, memory_order_relaxed);
    }
    metric_add(c, 1);
    clock_gettime(CLOCK_MONOTONIC, &now);
    metric_observe(m->duration, (double)(now.tv_sec - s->t0.tv_sec) +
                                    (double)(now.tv_nsec - s->t0.tv_nsec) * 1e-9);
    s->t0.tv_sec = 0;   /* once */
}

static int add_method(struct rpc_server *srv, const char *path,
                      const struct rpc_handler *h,
                      const ProtobufCMessageDescriptor *input, void *arg,
                      unsigned listeners)
{
    rpc_unary_fn unary = h->unary;
    rpc_stream_fn stream = h->stream;
    struct rpc_method *m = calloc(1, sizeof *m);
    struct rpc_method **nm =
        realloc(srv->methods, (srv->nmethods + 1) * sizeof *srv->methods);
    if (!m || !nm) {
        free(m);
        return -ENOMEM;
    }
    srv->methods = nm;
    for (size_t i = 0; i < srv->nmethods; i++)
        if (strcmp(srv->methods[i]->path, path) == 0) {
            log_error("method %s registered twice", path);
            free(m);
            return -EEXIST;
        }
    /* "/svc/method", then "svc" and "method" (the metrics labels), in one
     * allocation freed with the path. */
    size_t plen = strlen(path);
    m->path = malloc(2 * plen + 2);
    if (!m->path) {
        free(m);
        return -ENOMEM;
    }
    memcpy(m->path, path, plen + 1);
    memcpy(m->path + plen + 1, path + 1, plen);
    m->service = m->path + plen + 1;
    char *slash = strchr(m->service, '/');
    m->name = slash ? slash + 1 : m->service + plen - 1;
    if (slash)
        *slash = 0;
    method_metrics(m);
    m->listeners = listeners;
    m->unary = unary;
    m->stream = stream;
    m->arg = arg;
    m->input = h->checks_strings ? NULL : input;
    m->internal = h->internal;
    m->lstream = stream ? NULL : h->loop_stream;
    m->loop = (h->loop && !stream) || m->lstream;
    m->watch = stream == rpc_server__health_watch;
    m->rule = rpc_auth_rule_of(m->path);
    if (!unary && !stream && !m->lstream) {
        m->unary = unimplemented_unary;
        m->arg = m->path;
    }
    srv->methods[srv->nmethods++] = m;
    return 0;
}

int rpc_server_add_service_on(struct rpc_server *srv,
                              const ProtobufCServiceDescriptor *sd,
                              const struct rpc_handler *handlers, void *arg,
                              unsigned listeners)
{
    if (srv->started)
        return -EBUSY;
    if (!(listeners & RPC_LISTENERS_ALL))
        return -EINVAL;
    for (unsigned i = 0; i < sd->n_methods; i++) {
        char path[256];
        snprintf(path, sizeof path, "/%s/%s", sd->name, sd->methods[i].name);
        int rc = add_method(srv, path, &handlers[i], sd->methods[i].input, arg,
                            listeners);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int rpc_server_add_service(struct rpc_server *srv,
                           const ProtobufCServiceDescriptor *sd,
                           const struct rpc_handler *handlers, void *arg)
{
    return rpc_server_add_service_on(srv, sd, handlers, arg, RPC_LISTENERS_ALL);
}

int rpc_server_add_listener(struct rpc_server *srv, const struct rpc_listener *l)
{
    if (srv->started)
        return -EBUSY;
    if (srv->nlisteners >= RPC_MAX_LISTENERS)
        return -ENOSPC;
    if (!l || !l->listen || !l->listen[0] || (l->tls && !rpc_tls_has_cert(l->tls)))
        return -EINVAL;
    struct listener *ln = &srv->listeners[srv->nlisteners];
    if (!(ln->addr = strdup(l->listen)))
        return -ENOMEM;
    ln->tls = l->tls;
    ln->peer = l->peer;
    return srv->nlisteners++;
}

void rpc_server_set_auth(struct rpc_server *srv, struct rpc_auth *auth)
{
    srv->auth = auth;
}

struct rpc_server *rpc_server_create(const struct rpc_server_config *cfg)
{
    if (!cfg || !cfg->listen || cfg->threads < 1 || cfg->max_message < 64)
        return NULL;
    struct rpc_server *srv = calloc(1, sizeof *srv);
    if (!srv)
        return NULL;
    srv->cfg = *cfg;
    srv->cfg.listen = strdup(cfg->listen);
    if (srv->cfg.max_streams <= 0)
        srv->cfg.max_streams = RPC_DEFAULT_MAX_STREAMS;
    if (srv->cfg.max_deferred <= 0)
        srv->cfg.max_deferred = RPC_DEFAULT_MAX_DEFERRED;
    if (srv->cfg.stream_queue == 0)
        srv->cfg.stream_queue = RPC_DEFAULT_STREAM_QUEUE;
    if (srv->cfg.internal_streams < 0 ||
        srv->cfg.internal_streams >= srv->cfg.max_streams)
        srv->cfg.internal_streams = 0;
    pthread_mutex_init(&srv->lock, NULL);
    pthread_cond_init(&srv->cond, NULL);
    pthread_cond_init(&srv->health_cond, NULL);
    pthread_cond_init(&srv->job_cond, NULL);
    atomic_init(&srv->stopping, false);
    rpc_server__budget_init(srv);
    snprintf(srv->health[0].name, sizeof srv->health[0].name, "%s", "");
    srv->health[0].serving = false;
    srv->nhealth = 1;

    grpc_arg *args = srv->args;
    memset(srv->args, 0, sizeof srv->args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)cfg->max_message;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = (int)cfg->max_message;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_CONCURRENT_STREAMS;
    args[2].value.integer = 1024;
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_KEEPALIVE_TIME_MS;
    args[3].value.integer = 60000;
    /* A peer that stops answering pings is dropped, as are connections
     * with no call (and ones stuck in their handshake) past conn_idle_ms. */
    args[4].type = GRPC_ARG_INTEGER;
    args[4].key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS;
    args[4].value.integer = 20000;
    /* On by default: a second process on the port would start and take a
     * share of the calls. */
    args[5].type = GRPC_ARG_INTEGER;
    args[5].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[5].value.integer = 0;
    size_t nargs = 6;
    if (cfg->request_budget > 0 || cfg->stream_window > 0) {
        /* What a client may send of a message before the server reads it
         * (rpc_server_budget.c), or ahead of a handler (stream_window):
         * one window, never grown by BDP probes. */
        size_t w = cfg->request_budget > 0 ? RPC_BUDGET_PROBE : cfg->stream_window;
        args[nargs].type = GRPC_ARG_INTEGER;
        args[nargs].key = GRPC_ARG_HTTP2_BDP_PROBE;
        args[nargs++].value.integer = 0;
        args[nargs].type = GRPC_ARG_INTEGER;
        args[nargs].key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
        args[nargs++].value.integer = w > INT32_MAX ? INT32_MAX : (int)w;
    }
    if (cfg->conn_idle_ms > 0) {
        args[nargs].type = GRPC_ARG_INTEGER;
        args[nargs].key = GRPC_ARG_MAX_CONNECTION_IDLE_MS;
        args[nargs++].value.integer = cfg->conn_idle_ms;
        args[nargs].type = GRPC_ARG_INTEGER;
        args[nargs].key = GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS;
        args[nargs++].value.integer = cfg->conn_idle_ms;
    }
    srv->cargs.num_args = nargs;
    srv->cargs.args = args;

    struct rpc_listener main_listener = {.listen = cfg->listen, .tls = cfg->tls,
                                         .peer = cfg->peer};
    /* Worker threads share a few queues, so that a handler blocked on a
     * durable write does not hold up calls waiting on its queue; each loop
     * has a queue of its own. */
    srv->nloops = cfg->loops > 0 ? cfg->loops : 0;
    srv->nthreads = srv->nloops + cfg->threads;
    srv->ncq = srv->nloops + (cfg->threads < 2 ? 1 : 2);
    srv->cqs = calloc((size_t)srv->ncq, sizeof *srv->cqs);
    srv->threads = calloc((size_t)srv->nthreads, sizeof *srv->threads);
    srv->pool = calloc((size_t)srv->cfg.max_streams, sizeof *srv->pool);
    srv->book = rpc_server__book_create(srv->cfg.max_deferred);
    if (!srv->cqs || !srv->threads || !srv->pool || !srv->book ||
        !srv->cfg.listen || rpc_server_add_listener(srv, &main_listener) < 0)
        goto fail;
    for (int i = 0; i < srv->ncq; i++)
        srv->cqs[i].cq = cq_create(srv, i < srv->nloops);
    static const struct rpc_handler health_handlers[] = {
        {.unary = rpc_server__health_check},
        {.stream = rpc_server__health_watch},
    };
    if (rpc_server_add_service(srv, &grpc__health__v1__health__descriptor,
                               health_handlers, srv) < 0)
        goto fail;
    return srv;
fail:
    if (srv->cqs)
        for (int i = 0; i < srv->ncq; i++)
            if (srv->cqs[i].cq)
                grpc_completion_queue_destroy(srv->cqs[i].cq);
    for (size_t i = 0; i < srv->nmethods; i++) {
        free(srv->methods[i]->path);
        free(srv->methods[i]);
    }
    free(srv->methods);
    free(srv->listeners[0].addr);
    free(srv->cqs);
    free(srv->threads);
    free(srv->pool);
    free(srv->book);
    free((char *)srv->cfg.listen);
    free(srv);
    return NULL;
}

/* The grpc_server of listener li, its methods, queues and bound port.
 * Returns the port, or -EADDRINUSE (logged with the address). */
static int listener_bind(struct rpc_server *srv, int li)
{
    struct listener *ln = &srv->listeners[li];
    if (!(ln->server = grpc_server_create(&srv->cargs, NULL)))
        return -ENOMEM;
    for (int i = 0; i < srv->ncq; i++)
        grpc_server_register_completion_queue(ln->server, srv->cqs[i].cq, NULL);
    for (size_t i = 0; i < srv->nmethods; i++) {
        struct rpc_method *m = srv->methods[i];
        if (!(m->listeners & (1u << li)))
            continue;
        m->handle[li] = grpc_server_register_method(
            ln->server, m->path, NULL,
            m->stream || m->lstream || rpc_server__budget_gated(srv, m)
                ? GRPC_SRM_PAYLOAD_NONE : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
            0);
        if (!m->handle[li]) {
            log_error("cannot register method %s", m->path);
            return -EEXIST;
        }
    }
    grpc_server_credentials *creds = rpc_tls_server_credentials(ln->tls, ln->peer);
    if (!creds) {
        log_error("cannot make the credentials of %s", ln->addr);
        return -ENOMEM;
    }
    ln->port = grpc_server_add_http2_port(ln->server, ln->addr, creds);
    grpc_server_credentials_release(creds);
    if (ln->port <= 0) {
        log_error("cannot listen on %s: the address is in use (another process "
                  "listens on that port) or not an address of this machine",
                  ln->addr);
        return -EADDRINUSE;
    }
    return ln->port;
}

/* Undo listener_bind of a server never started: gRPC destroys a server
 * with a bound port only once it has been shut down. */
static void listener_unbind(struct rpc_server *srv, int li)
{
    struct listener *ln = &srv->listeners[li];
    if (!ln->server)
        return;
    if (ln->port > 0) {
        grpc_completion_queue *scq = grpc_completion_queue_create_for_pluck(NULL);
        grpc_server_shutdown_and_notify(ln->server, scq, ln);
        grpc_completion_queue_pluck(scq, ln, rpc_server__inf_future(), NULL);
        grpc_completion_queue_shutdown(scq);
        grpc_completion_queue_pluck(scq, ln, rpc_server__inf_future(), NULL);
        grpc_completion_queue_destroy(scq);
    }
    grpc_server_destroy(ln->server);
    ln->server = NULL;
    ln->port = 0;
}

int rpc_server_start(struct rpc_server *srv)
{
    if (srv->started)
        return -EBUSY;
    for (int li = 0; li < srv->nlisteners; li++) {
        int rc = listener_bind(srv, li);
        if (rc < 0) {
            for (int k = 0; k <= li; k++)
                listener_unbind(srv, k);
            return rc;
        }
    }
    for (int li = 0; li < srv->nlisteners; li++)
        grpc_server_start(srv->listeners[li].server);
    srv->started = true;

    /* Every stream thread now, before any call can arrive, so that no
     * request path creates one. */
    for (int i = 0; i < srv->cfg.max_streams; i++) {
        if (pthread_create(&srv->pool[i], NULL, pool_main, srv) != 0) {
            log_error("cannot start stream thread %d of %d: streams past %d "
                      "will be refused", i + 1, srv->cfg.max_streams, i);
            break;
        }
        srv->npool = i + 1;
    }
    rpc_server__budget_heavy_start(srv);

    int nwq = srv->ncq - srv->nloops;
    int per_cq = (srv->nthreads - srv->nloops) / nwq + 1;
    if (per_cq < 2)
        per_cq = 2;
    for (int q = 0; q < srv->ncq; q++) {
        bool loop_q = q < srv->nloops;
        for (int li = 0; li < srv->nlisteners; li++) {
            for (size_t i = 0; i < srv->nmethods; i++) {
                struct rpc_method *m = srv->methods[i];
                if (!(m->listeners & (1u << li)) || (m->loop && srv->nloops) != loop_q)
                    continue;
                /* A loop reposts at once, before its handler runs. */
                int n = m->stream || m->lstream ? 1 : loop_q ? 8 : per_cq;
                for (int k = 0; k < n; k++)
                    post_request(srv, m, li, q);
            }
            if (!loop_q)
                post_generic(srv, li, q);
        }
    }
    for (int i = 0; i < srv->nthreads; i++) {
        void **p = malloc(2 * sizeof *p);
        p[0] = srv;
        p[1] = (void *)(intptr_t)(i < srv->nloops ? i
                                                  : srv->nloops + (i - srv->nloops) % nwq);
        if (pthread_create(&srv->threads[i], NULL, worker_main, p) != 0) {
            log_error("cannot start worker thread %d", i);
            free(p);
            srv->nthreads = i;
            break;
        }
    }
    return srv->listeners[RPC_LISTENER_MAIN].port;
}

int rpc_server_loops(const struct rpc_server *srv)
{
    return srv->nloops;
}

grpc_completion_queue *rpc_server_loop_cq(struct rpc_server *srv, int i)
{
    return i >= 0 && i < srv->nloops && srv->cqs ? srv->cqs[i].cq : NULL;
}

void rpc_server_on_drain(struct rpc_server *srv, void (*fn)(void *), void *arg)
{
    srv->drain_fn = fn;
    srv->drain_arg = arg;
}

int rpc_server_port(const struct rpc_server *srv, int listener)
{
    if (listener < 0 || listener >= srv->nlisteners || !srv->listeners[listener].port)
        return -ENOENT;
    return srv->listeners[listener].port;
}

static void cancel_all(struct rpc_server *srv)
{
    for (int li = 0; li < srv->nlisteners; li++)
        grpc_server_cancel_all_calls(srv->listeners[li].server);
}

void rpc_server_shutdown(struct rpc_server *srv)
{
    if (!srv || !srv->started || srv->shut)
        return;
    srv->shut = true;
    atomic_store(&srv->stopping, true);

    /* Every listener stops accepting at once; the grace period is shared. */
    grpc_completion_queue *scq = grpc_completion_queue_create_for_pluck(NULL);
    for (int li = 0; li < srv->nlisteners; li++)
        grpc_server_shutdown_and_notify(srv->listeners[li].server, scq,
                                        &srv->listeners[li]);
    gpr_timespec grace = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                      gpr_time_from_millis(srv->cfg.grace_ms,
                                                           GPR_TIMESPAN));
    bool cancelled = false;
    for (int li = 0; li < srv->nlisteners; li++) {
        grpc_event ev = grpc_completion_queue_pluck(scq, &srv->listeners[li],
                                                    cancelled ? rpc_server__inf_future()
                                                              : grace, NULL);
        if (ev.type == GRPC_QUEUE_TIMEOUT) {
            log_info("cancelling calls still running after %d ms", srv->cfg.grace_ms);
            cancel_all(srv);
            /* A deferred call's reference would hold the shutdown up. */
            rpc_server__book_close(srv->book);
            cancelled = true;
            li--;
        }
    }
    rpc_server__book_close(srv->book);
    grpc_completion_queue_shutdown(scq);
    grpc_completion_queue_pluck(scq, srv, rpc_server__inf_future(), NULL);
    grpc_completion_queue_destroy(scq);

    pthread_mutex_lock(&srv->lock);
    while (srv->streams_alive > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        if (pthread_cond_timedwait(&srv->cond, &srv->lock, &ts) == ETIMEDOUT)
            cancel_all(srv);
    }
    srv->pool_quit = true;
    pthread_cond_broadcast(&srv->job_cond);
    pthread_mutex_unlock(&srv->lock);
    for (int i = 0; i < srv->npool; i++)
        pthread_join(srv->pool[i], NULL);
    rpc_server__budget_heavy_stop(srv);
    if (srv->drain_fn)
        srv->drain_fn(srv->drain_arg);

    for (int i = 0; i < srv->ncq; i++)
        grpc_completion_queue_shutdown(srv->cqs[i].cq);
    for (int i = 0; i < srv->nthreads; i++)
        pthread_join(srv->threads[i], NULL);
    for (int li = 0; li < srv->nlisteners; li++) {
        grpc_server_destroy(srv->listeners[li].server);
        srv->listeners[li].server = NULL;
    }
    for (int i = 0; i < srv->ncq; i++)
        grpc_completion_queue_destroy(srv->cqs[i].cq);
    srv->ncq = 0;
    srv->nloops = 0;
}

void rpc_server_destroy(struct rpc_server *srv)
{
    if (!srv)
        return;
    if (srv->started)
        rpc_server_shutdown(srv);
    else
        for (int i = 0; i < srv->ncq; i++)
            grpc_completion_queue_destroy(srv->cqs[i].cq);
    for (size_t i = 0; i < srv->nmethods; i++) {
        free(srv->methods[i]->path);
        free(srv->methods[i]);
    }
    for (int li = 0; li < srv->nlisteners; li++)
        free(srv->listeners[li].addr);
    free(srv->methods);
    free(srv->cqs);
    free(srv->threads);
    free(srv->pool);
    free((char *)srv->cfg.listen);
    pthread_mutex_destroy(&srv->lock);
    pthread_cond_destroy(&srv->cond);
    pthread_cond_destroy(&srv->health_cond);
    pthread_cond_destroy(&srv->job_cond);
    rpc_server__budget_deinit(srv);
    /* Deferred calls not yet finished keep the book. */
    pthread_mutex_lock(&srv->book->lock);
    rpc_server__book_unref_unlock(srv->book);
    free(srv);
}

/* ---- signals ---- */

/* Registered by the main thread before it waits; read only by it. */
static struct {
    void (*fn)(void *);
    void *arg;
} hup_hooks[RPC_SIGHUP_HOOKS];
static unsigned hup_count;
static struct {
    void (*fn)(void *);
    void *arg;
} usr1_hook;

static void signal_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGHUP);
}

void rpc_signals_block(void)
{
    sigset_t set;
    signal_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int rpc_signals_on_hup(void (*fn)(void *arg), void *arg)
{
    if (hup_count >= RPC_SIGHUP_HOOKS)
        return -ENOSPC;
    hup_hooks[hup_count].fn = fn;
    hup_hooks[hup_count].arg = arg;
    hup_count++;
    return 0;
}

void rpc_signals_on_usr1(void (*fn)(void *arg), void *arg)
{
    usr1_hook.fn = fn;
    usr1_hook.arg = arg;
}

int rpc_signals_wait(void)
{
    sigset_t set;
    int sig = 0;
    signal_set(&set);
    if (usr1_hook.fn)
        sigaddset(&set, SIGUSR1);
    for (;;) {
        if (sigwait(&set, &sig) != 0)
            continue;
        if (sig == SIGUSR1) {
            usr1_hook.fn(usr1_hook.arg);
            continue;
        }
        if (sig != SIGHUP) {
            svc_notify_stopping(strsignal(sig));
            return sig;
        }
        svc_notify_reloading();
        for (unsigned i = 0; i < hup_count; i++)
            hup_hooks[i].fn(hup_hooks[i].arg);
        svc_notify_reloaded();
    }
}
