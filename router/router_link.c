/* router_link: the router's streams to one node (see router_link.h).
 *
 * Each lane drives one Internal/Batches call on the gRPC core directly: a
 * RECV_STATUS_ON_CLIENT posted when the stream opens (its completion says
 * the stream ended), one RECV_MESSAGE at a time, and one SEND_MESSAGE at a
 * time; all complete on the link's completion queue, read by one thread
 * (a server loop's, or the link's own).  Submitting threads queue their
 * calls and, when the lane has room in its window, build and start the
 * next send themselves (router_link_msg.c builds it).  The link's mutex guards the lanes, their
 * queues, streams and messages, and the calls' private fields.
 *
 * Sets: a call that ends (answered, failed, past its deadline) is counted
 * off its set under the mutex; the set whose last call that was goes on
 * the link's fired list, and its done function runs once the mutex is let
 * go (link_unlock), so a done function may submit again or take other
 * locks.
 *
 * Deadlines: no caller waits for them.  The link's thread (which reads its
 * own queue, or does only this when a loop reads it) sleeps no later than
 * the earliest deadline of a pending call (l->due, lowered by each submit;
 * at most IDLE_TICK_MS when none is known, so a call submitted meanwhile
 * is late by at most that), and then takes back every call past its
 * deadline, queued or in flight.
 */
#include "router_link.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "log.h"
#include "metrics.h"
#include "router_link_int.h"
#include "rpc_ops.h"

#define ENTRY_OVERHEAD 32       /* queued bytes an entry counts beyond its hashes */
#define IDLE_TICK_MS 200        /* longest wait of the link's thread */

static const char *const lane_names[] = {"reads", "writes"};

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int lane_of(const struct router_link_call *c)
{
    return c->op == ROUTER_LINK_MAY_CONTAIN ? LANE_READ : LANE_WRITE;
}

/* Let go of the link's mutex, then run the done functions of the sets that
 * ended under it (on this thread). */
static void link_unlock(struct router_link *l)
{
    struct link_set *f = l->fired;
    l->fired = NULL;
    pthread_mutex_unlock(&l->mu);
    while (f) {
        struct link_set *next = f->next;
        f->done(f->arg);
        free(f);
        f = next;
    }
}

/* ---- calls ---- */

static const char *const lane_ops[] = {"read", "write"};

static struct metric *node_calls(struct router_link *l, int lane, grpc_status_code code)
{
    const char *labels[] = {"node", l->addr, "lane", lane_ops[lane], "code",
                            rpc_status_name(code), NULL};
    return metrics_counter(metrics_registry(), "bloomgrid_router_node_calls_total",
                           "key batches sent to a node, by the status of their "
                           "first failed entry (OK: every entry answered)", labels);
}

/* Count c's outcome and time for its node (a call's deadline is its start
 * plus its timeout). */
static void call_metrics(struct router_link *l, const struct router_link_call *c)
{
    grpc_status_code code = GRPC_STATUS_OK;
    int lane = lane_of(c);
    for (size_t j = 0; j < c->n && code == GRPC_STATUS_OK; j++)
        code = c->e[j].st.code;
    metric_add(code == GRPC_STATUS_OK ? l->m_ok[lane] : node_calls(l, lane, code), 1);
    int64_t start = c->deadline - (int64_t)c->timeout_ms * 1000000;
    metric_observe(l->m_duration, (double)(now_ns() - start) * 1e-9);
}

void router_link__call_done(struct router_link *l, struct router_link_call *c)
{
    struct link_set *set = c->set;
    call_metrics(l, c);
    c->state = CALL_DONE;
    if (atomic_fetch_sub(&set->pending, 1) == 1) {
        set->next = l->fired;
        l->fired = set;
    }
}

static void call_fail(struct router_link_call *c, grpc_status_code code,
                      enum rpc_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Every entry of c fails with one status; then c is done. */
static void call_fail(struct router_link_call *c, grpc_status_code code,
                      enum rpc_reason reason, const char *fmt, ...)
{
    char msg[RPC_MSGLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (size_t j = 0; j < c->n; j++) {
        c->e[j].st.code = code;
        c->e[j].st.reason = reason;
        memcpy(c->e[j].st.message, msg, sizeof msg);
        c->e[j].version = 0;
    }
    router_link__call_done(c->link, c);
}

/* Take c out of its lane's queue. */
static void queue_remove(struct router_link *l, struct router_link_call *c)
{
    struct link_lane *ln = &l->lane[lane_of(c)];
    struct router_link_call **pp = &ln->qhead, *prev = NULL;
    while (*pp && *pp != c) {
        prev = *pp;
        pp = &(*pp)->qnext;
    }
    if (!*pp)
        return;
    *pp = c->qnext;
    if (ln->qtail == c)
        ln->qtail = prev;
    c->qnext = NULL;
    l->qbytes -= c->bytes;
}

/* ---- streams ---- */

static void link_event(struct rpc_loop_tag *hdr, bool ok);

static void stream_maybe_free(struct link_stream *s)
{
    if (s->ops > 0)
        return;
    struct router_link *l = s->lane->l;
    if (s->lane->cur == s)
        s->lane->cur = NULL;
    if (s->send_buf)
        grpc_byte_buffer_destroy(s->send_buf);
    if (s->recv_buf)
        grpc_byte_buffer_destroy(s->recv_buf);
    grpc_metadata_array_destroy(&s->md_initial);
    grpc_metadata_array_destroy(&s->md_trailing);
    grpc_slice_unref(s->details);
    if (s->err_string)
        gpr_free((void *)s->err_string);
    grpc_call_unref(s->call);
    free(s);
    l->streams--;
    pthread_cond_broadcast(&l->idle);
}

/* Post the next RECV_MESSAGE (with the initial metadata the first time). */
static bool stream_post_recv(struct link_stream *s, bool first)
{
    grpc_op ops[2];
    size_t n = rpc_ops_recv(ops, first, &s->md_initial, &s->recv_buf);
    if (grpc_call_start_batch(s->call, ops, n, &s->tags[TAG_RECV], NULL) != GRPC_CALL_OK)
        return false;
    s->ops++;
    s->receiving = true;
    return true;
}

/* Open the lane's stream: nothing goes to the network until its first
 * message.  Returns 0 or -1. */
static int lane_open(struct link_lane *ln)
{
    struct router_link *l = ln->l;
    struct link_stream *s = calloc(1, sizeof *s);
    if (!s)
        return -1;
    s->lane = ln;
    s->call = grpc_channel_create_registered_call(
        rpc_channel_grpc(l->ch), NULL, GRPC_PROPAGATE_DEFAULTS, l->cq, l->method,
        gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (!s->call) {
        free(s);
        return -1;
    }
    for (int k = 0; k < TAGS; k++) {
        s->tags[k].hdr.kind = RPC_LOOP_TAG;
        s->tags[k].hdr.fn = link_event;
        s->tags[k].s = s;
        s->tags[k].kind = (enum tag_kind)k;
    }
    grpc_metadata_array_init(&s->md_initial);
    grpc_metadata_array_init(&s->md_trailing);
    s->details = grpc_empty_slice();
    s->status = GRPC_STATUS_UNKNOWN;
    l->streams++;

    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &s->md_trailing;
    op.data.recv_status_on_client.status = &s->status;
    op.data.recv_status_on_client.status_details = &s->details;
    op.data.recv_status_on_client.error_string = &s->err_string;
    if (grpc_call_start_batch(s->call, &op, 1, &s->tags[TAG_STATUS], NULL) != GRPC_CALL_OK) {
        stream_maybe_free(s);
        return -1;
    }
    s->ops++;
    ln->cur = s;
    if (!stream_post_recv(s, true)) {
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
    }
    return 0;
}


/* Take the lane's oldest message in flight off its list. */
static struct link_msg *inflight_pop(struct link_lane *ln)
{
    struct link_msg *m = ln->ihead;
    ln->ihead = m->next;
    if (!ln->ihead)
        ln->itail = NULL;
    ln->ninflight--;
    m->next = NULL;
    return m;
}

/* Fail every call of m (those still waiting for it) and free it. */
static void msg_fail(struct link_msg *m, grpc_status_code code, const char *what,
                     const char *addr)
{
    for (size_t i = 0; i < m->ncalls; i++)
        if (m->calls[i])
            call_fail(m->calls[i], code, RPC_REASON_NONE, "node %s: %s", addr, what);
    free(m);
}

/* If the lane has calls queued and room in its window (one message in
 * flight on the read lane, LINK_WRITE_WINDOW on the write lane) and its
 * stream is not sending, send the next message (opening a stream first
 * when it has none).  Caller holds the link's mutex. */
static void lane_kick(struct link_lane *ln)
{
    struct router_link *l = ln->l;
    unsigned window = ln->kind == LANE_WRITE ? LINK_WRITE_WINDOW : 1;
    if (!ln->qhead || ln->ninflight >= window || l->closing)
        return;
    if (!ln->cur && lane_open(ln) < 0) {
        while (ln->qhead) {
            struct router_link_call *c = ln->qhead;
            queue_remove(l, c);
            call_fail(c, GRPC_STATUS_UNAVAILABLE, RPC_REASON_NONE,
                      "node %s: cannot open a stream to it", l->addr);
        }
        return;
    }
    struct link_stream *s = ln->cur;
    if (s->sending || s->ended)
        return;     /* the send's or the status's completion kicks again */
    grpc_byte_buffer *bb = NULL;
    struct link_msg *m = router_link__msg_build(ln, &bb);
    if (!m) {
        struct router_link_call *c = ln->qhead;
        queue_remove(l, c);
        call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, RPC_REASON_NONE,
                  "router out of memory for a message to node %s", l->addr);
        return;
    }
    grpc_op ops[4];
    grpc_metadata *md;
    size_t nmd = rpc_channel_metadata(l->ch, &md);
    size_t n = rpc_ops_send_md(ops, &s->md_sent, bb, md, nmd);
    /* With no receive posted, the answer's receive goes in the send's
     * batch when the lane is joined: one completion for both (no wake-up
     * of the queue's thread for the send alone), and the flow-control
     * update that posting a receive makes leaves with the message instead
     * of in a packet of its own that wakes the node.  The read lane joins
     * only a message that took every queued call (router_link_int.h). */
    bool join = !s->receiving && ln->joined &&
                grpc_byte_buffer_length(bb) <= LINK_JOIN_BYTES &&
                (ln->kind == LANE_WRITE || !ln->qhead);
    if (join)
        n += rpc_ops_recv(ops + n, false, &s->md_initial, &s->recv_buf);
    m->s = s;
    m->next = NULL;
    m->sent_ns = now_ns();
    if (ln->itail)
        ln->itail->next = m;
    else
        ln->ihead = m;
    ln->itail = m;
    ln->ninflight++;
    s->send_buf = bb;
    /* Otherwise a receive is posted before the send, as always when a
     * message is in flight. */
    if ((!join && !s->receiving && !stream_post_recv(s, false)) ||
        grpc_call_start_batch(s->call, ops, n, &s->tags[join ? TAG_SENDRECV : TAG_SEND],
                              NULL) != GRPC_CALL_OK) {
        /* The status that follows the cancel fails the message. */
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
        return;
    }
    s->ops++;
    s->sending = true;
    if (join)
        s->receiving = true;
    metric_add(l->m_sent[ln->kind][join], 1);
}


/* ---- completions (the thread that reads the link's queue) ---- */

static void on_send(struct link_stream *s, bool ok)
{
    struct router_link *l = s->lane->l;
    pthread_mutex_lock(&l->mu);
    s->ops--;
    s->sending = false;
    grpc_byte_buffer_destroy(s->send_buf);
    s->send_buf = NULL;
    if (!ok) {
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
    } else if (s->lane->cur == s) {
        lane_kick(s->lane);
    }
    stream_maybe_free(s);
    link_unlock(l);
}


/* Decode an answer (before the mutex is taken: only the thread that
 * reads the queue receives, and the arena is its own).  NULL when it
 * does not parse. */
static Bloomgrid__V1__BatchResponse *recv_decode(struct router_link *l,
                                                 grpc_byte_buffer *bb)
{
    Bloomgrid__V1__BatchResponse *resp = NULL;
    grpc_byte_buffer_reader rd;
    if (grpc_byte_buffer_reader_init(&rd, bb)) {
        grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
        rpc_arena_reset(&l->arena);
        resp = bloomgrid__v1__batch_response__unpack(rpc_arena_allocator(&l->arena),
                                                     GRPC_SLICE_LENGTH(sl),
                                                     GRPC_SLICE_START_PTR(sl));
        grpc_slice_unref(sl);
    }
    return resp;
}

/* s's receive completed: got says a message came (resp is it decoded, or
 * NULL).  Hand it to the oldest message in flight and go on.  Caller holds
 * the mutex. */
static void recv_handle(struct link_stream *s, bool got,
                        const Bloomgrid__V1__BatchResponse *resp)
{
    struct link_lane *ln = s->lane;
    struct router_link *l = ln->l;
    s->receiving = false;
    if (!got) {
        s->ended = true;        /* the status follows */
        return;
    }
    if (!resp || !ln->ihead || ln->ihead->s != s || ln->ihead->id != resp->id) {
        log_warn("node %s: an answer on the %s stream that does not parse or "
                 "matches no message; reopening it", l->addr, lane_names[ln->kind]);
        s->bad_answer = true;
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
        return;
    }
    struct link_msg *m = inflight_pop(ln);
    /* The next send joins its receive only while the answer finds nothing
     * else waiting, and on the write lane only while answers come quickly
     * (router_link_int.h, LINK_JOIN_NS). */
    ln->joined = !ln->qhead && !ln->ihead &&
                 (ln->kind == LANE_READ || now_ns() - m->sent_ns <= LINK_JOIN_NS);
    router_link__msg_deliver(l, m, resp);
    free(m);
    /* A read lane not joined, and a lane with a message still in flight,
     * receive again at once. */
    if (((ln->kind == LANE_READ && !ln->joined) || (ln->ihead && ln->ihead->s == s)) &&
        !stream_post_recv(s, false)) {
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
        return;
    }
    lane_kick(ln);
}

/* The answer a receive completed with (decoded, or NULL when it did not
 * parse or none came: *got says whether one came).  No lock held. */
static Bloomgrid__V1__BatchResponse *take_answer(struct link_stream *s, bool ok, bool *got)
{
    grpc_byte_buffer *bb = s->recv_buf;
    Bloomgrid__V1__BatchResponse *resp = ok && bb ? recv_decode(s->lane->l, bb) : NULL;

    s->recv_buf = NULL;
    *got = ok && bb;
    if (bb)
        grpc_byte_buffer_destroy(bb);
    return resp;
}

static void on_recv(struct link_stream *s, bool ok)
{
    struct router_link *l = s->lane->l;
    bool got;
    Bloomgrid__V1__BatchResponse *resp = take_answer(s, ok, &got);
    pthread_mutex_lock(&l->mu);
    s->ops--;
    recv_handle(s, got, resp);
    stream_maybe_free(s);
    link_unlock(l);
}

/* A message sent with the receive of its answer (lane_kick, joined). */
static void on_sendrecv(struct link_stream *s, bool ok)
{
    struct router_link *l = s->lane->l;
    bool got;
    Bloomgrid__V1__BatchResponse *resp = take_answer(s, ok, &got);
    pthread_mutex_lock(&l->mu);
    s->ops--;
    s->sending = false;
    grpc_byte_buffer_destroy(s->send_buf);
    s->send_buf = NULL;
    if (!ok && !s->ended) {
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
    }
    recv_handle(s, got, resp);
    stream_maybe_free(s);
    link_unlock(l);
}

static void on_status(struct link_stream *s)
{
    struct link_lane *ln = s->lane;
    struct router_link *l = ln->l;
    pthread_mutex_lock(&l->mu);
    s->ops--;
    s->ended = true;
    if (ln->ihead && ln->ihead->s == s) {
        /* Every message in flight was on this stream: each fails with why
         * it ended. */
        char what[RPC_MSGLEN];
        grpc_status_code code = GRPC_STATUS_UNAVAILABLE;
        size_t dl = GRPC_SLICE_LENGTH(s->details);
        if (s->stuck) {
            code = GRPC_STATUS_DEADLINE_EXCEEDED;
            snprintf(what, sizeof what, "no answer within the deadline");
        } else if (s->bad_answer) {
            code = GRPC_STATUS_INTERNAL;
            snprintf(what, sizeof what, "answer does not parse or has the wrong "
                     "number of results");
        } else {
            if (s->status != GRPC_STATUS_OK && s->status != GRPC_STATUS_CANCELLED)
                code = s->status;
            snprintf(what, sizeof what, "%s stream ended (%s): %.*s",
                     lane_names[ln->kind], rpc_status_name(s->status),
                     (int)(dl < 300 ? dl : 300),
                     (const char *)GRPC_SLICE_START_PTR(s->details));
        }
        if (!l->closing)
            log_info("node %s: %s", l->addr, what);
        while (ln->ihead && ln->ihead->s == s)
            msg_fail(inflight_pop(ln), code, what, l->addr);
    }
    if (ln->cur == s)
        ln->cur = NULL;
    lane_kick(ln);              /* queued calls go on a new stream */
    stream_maybe_free(s);
    link_unlock(l);
}


/* ---- deadlines ---- */

/* c's deadline passed: take it back, queued or in flight. */
static void call_abandon(struct router_link *l, struct router_link_call *c)
{
    if (c->state == CALL_QUEUED) {
        queue_remove(l, c);
        call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED, RPC_REASON_NONE,
                  "node %s: not sent within %d ms (its stream was busy)", l->addr,
                  c->timeout_ms);
    } else if (c->state == CALL_SENT) {
        struct link_msg *m = c->msg;
        m->calls[c->slot] = NULL;
        /* A message unanswered past a deadline: the node or the connection
         * is stuck; a new stream takes the next message. */
        struct link_lane *ln = &l->lane[lane_of(c)];
        if (!m->s->ended) {
            log_warn("node %s: no answer on the %s stream within %d ms; reopening it",
                     l->addr, lane_names[ln->kind], c->timeout_ms);
            m->s->stuck = true;
            m->s->ended = true;
            grpc_call_cancel(m->s->call, NULL);
        }
        call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED, RPC_REASON_NONE,
                  "node %s: no answer within %d ms", l->addr, c->timeout_ms);
    }
}

/* Take back every call past its deadline and find the next one due. */
static void link_expire(struct router_link *l)
{
    pthread_mutex_lock(&l->mu);
    int64_t now = now_ns(), due = INT64_MAX;
    for (int k = 0; k < LANES; k++) {
        struct link_lane *ln = &l->lane[k];
        struct router_link_call *c = ln->qhead, *next;
        for (; c; c = next) {
            next = c->qnext;
            if (c->deadline <= now)
                call_abandon(l, c);
            else if (c->deadline < due)
                due = c->deadline;
        }
        for (struct link_msg *m = ln->ihead; m; m = m->next)
            for (size_t i = 0; i < m->ncalls; i++) {
                c = m->calls[i];
                if (!c)
                    continue;
                if (c->deadline <= now)
                    call_abandon(l, c);   /* may end m's stream, not free m */
                else if (c->deadline < due)
                    due = c->deadline;
            }
    }
    atomic_store(&l->due, due);
    link_unlock(l);
}

/* One completed operation of a stream, on whichever thread reads the
 * link's queue. */
static void link_event(struct rpc_loop_tag *hdr, bool ok)
{
    struct link_tag *t = (struct link_tag *)(void *)hdr;
    struct router_link *l = t->s->lane->l;
    /* On a server's queue, the last stream's end lets router_link_destroy
     * free l: nothing of l is read after the event is handled. */
    bool own_cq = l->own_cq;
    switch (t->kind) {
    case TAG_SEND:
        on_send(t->s, ok);
        break;
    case TAG_RECV:
        on_recv(t->s, ok);
        break;
    case TAG_SENDRECV:
        on_sendrecv(t->s, ok);
        break;
    case TAG_STATUS:
        on_status(t->s);
        break;
    case TAGS:
        break;
    }
    if (own_cq && now_ns() >= atomic_load(&l->due))
        link_expire(l);
}

/* How long the deadline watch may sleep now. */
static int64_t link_wait_ns(struct router_link *l)
{
    int64_t wait = atomic_load(&l->due) - now_ns();
    if (wait > (int64_t)IDLE_TICK_MS * 1000000)
        wait = (int64_t)IDLE_TICK_MS * 1000000;
    return wait < 0 ? 0 : wait;
}

/* The link's own queue: its events and the deadlines. */
static void *link_main(void *arg)
{
    struct router_link *l = arg;
    for (;;) {
        gpr_timespec dl = gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                                       gpr_time_from_nanos(link_wait_ns(l), GPR_TIMESPAN));
        grpc_event ev = grpc_completion_queue_next(l->cq, dl, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE)
            link_event(ev.tag, ev.success != 0);
        else if (now_ns() >= atomic_load(&l->due))
            link_expire(l);
    }
    return NULL;
}

/* A loop reads the events: this thread only takes back calls past their
 * deadline. */
static void *link_deadlines(void *arg)
{
    struct router_link *l = arg;
    pthread_mutex_lock(&l->tmu);
    while (!l->quit) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t at = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec + link_wait_ns(l);
        ts.tv_sec = at / 1000000000;
        ts.tv_nsec = at % 1000000000;
        pthread_cond_timedwait(&l->tcv, &l->tmu, &ts);
        if (l->quit)
            break;
        pthread_mutex_unlock(&l->tmu);
        if (now_ns() >= atomic_load(&l->due))
            link_expire(l);
        pthread_mutex_lock(&l->tmu);
    }
    pthread_mutex_unlock(&l->tmu);
    return NULL;
}

/* ---- the link ---- */

struct router_link *router_link_create(const char *addr,
                                       const struct router_link_config *cfg)
{
    struct router_link *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->cfg = *cfg;
    if (!l->cfg.max_message_hashes)
        l->cfg.max_message_hashes = 1;
    l->addr = strdup(addr);
    l->ch = l->addr ? rpc_channel_create(addr, cfg->max_message) : NULL;
    if (!l->ch)
        goto fail;
    const char *labels[] = {"node", l->addr, NULL};
    l->m_ok[LANE_READ] = node_calls(l, LANE_READ, GRPC_STATUS_OK);
    l->m_ok[LANE_WRITE] = node_calls(l, LANE_WRITE, GRPC_STATUS_OK);
    /* A node down or slow: at 0 from the start, so that its first failed
     * batch is an increase (other codes appear when first seen). */
    for (int lane = 0; lane < LANES; lane++) {
        node_calls(l, lane, GRPC_STATUS_UNAVAILABLE);
        node_calls(l, lane, GRPC_STATUS_DEADLINE_EXCEEDED);
        for (int j = 0; j < 2; j++) {
            const char *ml[] = {"node", l->addr, "lane", lane_ops[lane], "receive",
                                j ? "joined" : "apart", NULL};
            l->m_sent[lane][j] = metrics_counter(
                metrics_registry(), "bloomgrid_router_node_messages_total",
                "batch messages sent to a node, by lane and by whether the receive "
                "of the answer was started with the send (joined) or apart", ml);
        }
    }
    l->m_duration = metrics_histogram(metrics_registry(),
                                      "bloomgrid_router_node_duration_seconds",
                                      "time from a key batch's submission to its "
                                      "node's answer (or its failure)", labels,
                                      metrics_latency_bounds, metrics_latency_nbounds);
    l->method = node_client_batches_register(rpc_channel_grpc(l->ch));
    l->own_cq = !cfg->cq;
    l->cq = cfg->cq ? cfg->cq : grpc_completion_queue_create_for_next(NULL);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->idle, NULL);
    pthread_mutex_init(&l->tmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->tcv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_init(&l->due, INT64_MAX);
    for (int k = 0; k < LANES; k++) {
        l->lane[k].l = l;
        l->lane[k].kind = k;
        l->lane[k].joined = true;
    }
    rpc_arena_init(&l->arena, 4 * cfg->max_message + (1u << 20));
    if (pthread_create(&l->thread, NULL, l->own_cq ? link_main : link_deadlines, l) != 0) {
        rpc_arena_deinit(&l->arena);
        if (l->own_cq) {
            grpc_completion_queue_shutdown(l->cq);
            grpc_completion_queue_destroy(l->cq);
        }
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->idle);
        pthread_mutex_destroy(&l->tmu);
        pthread_cond_destroy(&l->tcv);
        goto fail;
    }
    return l;
fail:
    rpc_channel_destroy(l->ch);
    free(l->addr);
    free(l);
    return NULL;
}

void router_link_destroy(struct router_link *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->closing = true;
    for (int k = 0; k < LANES; k++) {
        /* Calls still queued never go out; those in flight fail with
         * their stream. */
        while (l->lane[k].qhead) {
            struct router_link_call *c = l->lane[k].qhead;
            queue_remove(l, c);
            call_fail(c, GRPC_STATUS_UNAVAILABLE, RPC_REASON_NONE,
                      "node %s: the router is shutting down", l->addr);
        }
        if (l->lane[k].cur)
            grpc_call_cancel(l->lane[k].cur->call, NULL);
    }
    link_unlock(l);
    pthread_mutex_lock(&l->mu);
    while (l->streams > 0)
        pthread_cond_wait(&l->idle, &l->mu);
    link_unlock(l);
    if (l->own_cq) {
        grpc_completion_queue_shutdown(l->cq);
    } else {
        pthread_mutex_lock(&l->tmu);
        l->quit = true;
        pthread_cond_signal(&l->tcv);
        pthread_mutex_unlock(&l->tmu);
    }
    pthread_join(l->thread, NULL);
    if (l->own_cq)
        grpc_completion_queue_destroy(l->cq);
    rpc_channel_destroy(l->ch);
    rpc_arena_deinit(&l->arena);
    router_link__build_free(&l->b);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->idle);
    pthread_mutex_destroy(&l->tmu);
    pthread_cond_destroy(&l->tcv);
    free(l->addr);
    free(l);
}

const char *router_link_addr(const struct router_link *l)
{
    return l->addr;
}

struct rpc_channel *router_link_channel(struct router_link *l)
{
    return l->ch;
}

/* Queue c on its lane and send at once if the lane is idle. */
static void call_submit(struct router_link_call *c)
{
    struct router_link *l = c->link;
    pthread_mutex_lock(&l->mu);
    if (l->closing) {
        call_fail(c, GRPC_STATUS_UNAVAILABLE, RPC_REASON_NONE,
                  "node %s: the router is shutting down", l->addr);
    } else if (l->qbytes > 0 && l->qbytes + c->bytes > l->cfg.max_queue_bytes) {
        call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, RPC_REASON_NONE,
                  "node %s: %zu bytes already wait to be sent to it (the limit is "
                  "%zu: node_queue_mb); retry shortly", l->addr, l->qbytes,
                  l->cfg.max_queue_bytes);
    } else {
        struct link_lane *ln = &l->lane[lane_of(c)];
        c->state = CALL_QUEUED;
        c->qnext = NULL;
        if (ln->qtail)
            ln->qtail->qnext = c;
        else
            ln->qhead = c;
        ln->qtail = c;
        l->qbytes += c->bytes;
        if (c->deadline < atomic_load(&l->due))
            atomic_store(&l->due, c->deadline);
        lane_kick(ln);
    }
    link_unlock(l);
}

void router_link_submit(struct router_link_call *calls, size_t n, int timeout_ms,
                        router_link_done_fn done, void *arg)
{
    struct link_set *set = n ? malloc(sizeof *set) : NULL;
    if (!set) {
        for (size_t i = 0; i < n; i++)
            for (size_t j = 0; j < calls[i].n; j++) {
                struct router_link_entry *e = &calls[i].e[j];
                rpc_status_set(&e->st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
                e->version = 0;
            }
        done(arg);
        return;
    }
    atomic_init(&set->pending, n);
    set->done = done;
    set->arg = arg;
    set->next = NULL;
    int64_t deadline = now_ns() + (int64_t)timeout_ms * 1000000;
    for (size_t i = 0; i < n; i++) {
        struct router_link_call *c = &calls[i];
        c->set = set;
        c->state = CALL_NEW;
        c->msg = NULL;
        c->qnext = NULL;
        c->deadline = deadline;
        c->timeout_ms = timeout_ms;
        c->bytes = NODE_CLIENT_HASH_LEN * router_link__call_hashes(c) + ENTRY_OVERHEAD * c->n;
    }
    /* The set may end, and calls[] go back to the caller, as soon as the
     * last call is in: nothing of it is touched after that. */
    for (size_t i = 0; i < n; i++)
        call_submit(&calls[i]);
}
