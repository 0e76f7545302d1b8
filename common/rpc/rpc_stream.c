/* rpc_stream: streaming calls on the server side (see rpc_server.h), in two
 * models that share the send queue below.
 *
 * Outgoing messages: one send batch in flight and a queue behind it, fed by
 * the handler's writes and by rpc_stream_post from any thread.  A message
 * that finds no send in flight is started at once by whoever posts it;
 * otherwise it waits in the queue, and the completion of each send starts
 * the next.  s->lock orders posters, the handler and the batches they
 * start.  Holds (rpc_stream_hold) keep the slot alive for posting threads:
 * the finish waits until none is left and nothing is in flight.
 *
 * Pool streams (struct rpc_handler.stream): the handler runs on a pool
 * thread and drives its call with one batch at a time on the call's own
 * completion queue (each read, the final status).  Only the handler's
 * thread waits on that queue, so it meets every completion (in reads,
 * writes, drains and the finish) and no event is handed between threads.
 *
 * Streams driven by their messages (struct rpc_loop_stream, the second
 * half of this file): no thread of their own.  The call's batches complete
 * on the queue its request came on (an event loop's, or the workers'),
 * tagged with loop tags: each receive runs the handler's message() on the
 * thread that read it, each send's completion starts the next, and
 * whichever thread completes the stream's last piece of work (a receive
 * that ends the reading, a send, a release, a resume) runs end() and sends
 * the status.  Both models count against max_streams and stream_idle_ms.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>

#include "log.h"
#include "rpc_check.h"
#include "rpc_ops.h"
#include "rpc_server.h"
#include "rpc_server_internal.h"

void rpc_server__stream_init(struct slot *s)
{
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->cond, NULL);
    s->sync_init = true;
}

/* Drop every queued message (the call is gone or ending).  s->lock held. */
static void drop_queue_locked(struct slot *s)
{
    while (s->out_head) {
        struct out_msg *m = s->out_head;
        s->out_head = m->next;
        s->out_bytes -= GRPC_SLICE_LENGTH(m->body);
        s->sent_seq++;
        grpc_slice_unref(m->body);
        free(m);
    }
    s->out_tail = NULL;
}

void rpc_server__stream_deinit(struct slot *s)
{
    if (!s->sync_init)
        return;
    drop_queue_locked(s);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->cond);
}

grpc_call_error rpc_server__stream_start(struct slot *s, const grpc_op *ops,
                                         size_t n, void *tag)
{
    pthread_mutex_lock(&s->lock);
    grpc_call_error e = grpc_call_start_batch(s->call, ops, n, tag, NULL);
    pthread_mutex_unlock(&s->lock);
    return e;
}

/* Start sending body, already counted in out_bytes and post_seq; takes the
 * slice.  s->lock held, no send in flight.  Returns 0 or -ECANCELED. */
static int send_locked(struct slot *s, grpc_slice body)
{
    grpc_op ops[2];

    s->write_len = GRPC_SLICE_LENGTH(body);
    s->write_buf = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    size_t n = rpc_ops_send(ops, &s->md_sent, s->write_buf);
    void *tag = s->lmode ? (void *)&s->send_lt : (void *)&s->write_tag;
    if (grpc_call_start_batch(s->call, ops, n, tag, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(s->write_buf);
        s->write_buf = NULL;
        s->out_bytes -= s->write_len;
        s->sent_seq++;
        s->dead = true;
        drop_queue_locked(s);
        return -ECANCELED;
    }
    s->write_pending = true;
    return 0;
}

/* The send in flight completed: start the next queued message.  s->lock
 * held. */
static void sent_locked(struct slot *s, bool ok)
{
    s->write_pending = false;
    grpc_byte_buffer_destroy(s->write_buf);
    s->write_buf = NULL;
    s->out_bytes -= s->write_len;
    s->sent_seq++;
    if (!ok) {
        s->dead = true;
        drop_queue_locked(s);
    } else if (s->out_head) {
        struct out_msg *m = s->out_head;
        s->out_head = m->next;
        if (!s->out_head)
            s->out_tail = NULL;
        grpc_slice body = m->body;
        free(m);
        send_locked(s, body);
    }
}

grpc_event rpc_server__stream_next(struct slot *s, gpr_timespec deadline)
{
    grpc_event ev = grpc_completion_queue_next(s->cq, deadline, NULL);
    if (ev.type == GRPC_OP_COMPLETE && ev.tag != s) {
        pthread_mutex_lock(&s->lock);
        if (ev.tag == &s->close_tag)
            s->close_done = true;
        else if (ev.tag == &s->write_tag)
            sent_locked(s, ev.success != 0);
        pthread_mutex_unlock(&s->lock);
    }
    return ev;
}

/* Idle streams (stream_idle_ms): a read that gets no message, or a send
 * the client does not take, for that long ends the call.  Internal
 * methods' streams are exempt (struct rpc_handler.internal). */
static gpr_timespec idle_deadline(const struct slot *s)
{
    int ms = s->srv->cfg.stream_idle_ms;

    if (ms <= 0 || !s->m || s->m->internal)
        return rpc_server__inf_future();
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* Cancel an idle call with a status that says why; the batches in flight
 * then complete as failed.  s->lock not held. */
static void idle_end(struct slot *s)
{
    char msg[RPC_MSGLEN];

    if (s->idled)
        return;
    s->idled = true;
    snprintf(msg, sizeof msg, "%s: stream ended: no message for %d ms (the "
             "server's stream_idle_ms); open a new one", s->m->path,
             s->srv->cfg.stream_idle_ms);
    log_info("%s", msg);
    pthread_mutex_lock(&s->lock);
    grpc_call_cancel_with_status(s->call, GRPC_STATUS_RESOURCE_EXHAUSTED, msg,
                                 NULL);
    pthread_mutex_unlock(&s->lock);
}

/* One step of a wait on the handler's thread (s->lock held): meet the next
 * completion while a send is in flight, else sleep until a post or a
 * release wakes it.  Returns false when the call's queue is gone. */
static bool wait_step_locked(struct slot *s)
{
    if (!s->write_pending) {
        pthread_cond_wait(&s->cond, &s->lock);
        return true;
    }
    pthread_mutex_unlock(&s->lock);
    grpc_event ev = rpc_server__stream_next(s, idle_deadline(s));
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        idle_end(s);   /* the send now completes, failed */
        ev.type = GRPC_OP_COMPLETE;
    }
    pthread_mutex_lock(&s->lock);
    return ev.type == GRPC_OP_COMPLETE;
}

/* Wait until every message accepted before seq is sent or dropped; the
 * handler's thread.  Returns 0 or -ECANCELED. */
static int wait_sent(struct slot *s, uint64_t seq)
{
    pthread_mutex_lock(&s->lock);
    while (!s->dead && s->sent_seq < seq)
        if (!wait_step_locked(s))
            break;
    int rc = s->dead ? -ECANCELED : 0;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Queue body (or start it when nothing is in flight); *seq gets its number.
 * Takes the slice. */
static int post(struct slot *s, grpc_slice body, uint64_t *seq)
{
    size_t len = GRPC_SLICE_LENGTH(body);
    int rc = 0;

    pthread_mutex_lock(&s->lock);
    if (s->dead || s->closed) {
        rc = -ECANCELED;
        goto refuse;
    }
    if (!s->write_pending) {
        s->out_bytes += len;
        *seq = ++s->post_seq;
        rc = send_locked(s, body);
        /* A finish sleeping on holds must now meet this completion. */
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        return rc;
    }
    struct out_msg *m = malloc(sizeof *m);
    if (!m) {
        rc = -ENOMEM;
        goto refuse;
    }
    m->next = NULL;
    m->body = body;
    if (s->out_tail)
        s->out_tail->next = m;
    else
        s->out_head = m;
    s->out_tail = m;
    s->out_bytes += len;
    *seq = ++s->post_seq;
    pthread_mutex_unlock(&s->lock);
    return 0;
refuse:
    pthread_mutex_unlock(&s->lock);
    grpc_slice_unref(body);
    return rc;
}

int rpc_stream_post(struct rpc_stream *st, grpc_slice body)
{
    uint64_t seq;
    return post((struct slot *)st, body, &seq);
}

int rpc_stream_hold(struct rpc_stream *st)
{
    struct slot *s = (struct slot *)st;
    int rc = 0;
    pthread_mutex_lock(&s->lock);
    if (s->closed)
        rc = -ECANCELED;
    else
        s->holds++;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

static bool lfinish_due_locked(struct slot *s);
static void lfinish(struct slot *s);

void rpc_stream_release(struct rpc_stream *st)
{
    struct slot *s = (struct slot *)st;
    pthread_mutex_lock(&s->lock);
    if (--s->holds == 0)
        pthread_cond_broadcast(&s->cond);
    bool due = s->lmode && lfinish_due_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (due)
        lfinish(s);
}

/* Wait until no hold is left and no send is in flight.  s->lock held. */
static void settle_locked(struct slot *s)
{
    while (s->write_pending || s->holds > 0)
        if (!wait_step_locked(s))
            break;
}

int rpc_stream_drain(struct rpc_stream *st)
{
    struct slot *s = (struct slot *)st;
    pthread_mutex_lock(&s->lock);
    settle_locked(s);
    int rc = s->dead ? -ECANCELED : 0;
    pthread_mutex_unlock(&s->lock);
    return rc;
}

/* Run the handler's batch (tag s) and wait for it, meeting the sends'
 * completions on the way.  idle: the call ends if the batch has not
 * completed by deadline (a read). */
static bool stream_wait(struct slot *s, grpc_op *ops, size_t n, bool idle)
{
    gpr_timespec deadline = idle ? idle_deadline(s) : rpc_server__inf_future();
    grpc_call_error e = rpc_server__stream_start(s, ops, n, s);
    if (e != GRPC_CALL_OK) {
        log_error("stream batch failed to start: %d", e);
        return false;
    }
    for (;;) {
        grpc_event ev = rpc_server__stream_next(s, deadline);
        if (ev.type == GRPC_QUEUE_TIMEOUT) {
            idle_end(s);   /* the read now completes, failed */
            deadline = rpc_server__inf_future();
            continue;
        }
        if (ev.type != GRPC_OP_COMPLETE)
            return false;
        if (ev.tag == s)
            return ev.success != 0;
        /* A send went out: the client is taking messages. */
        if (idle)
            deadline = idle_deadline(s);
    }
}

/* Before a read: wait while more than the bound waits behind the send in
 * flight (the message being sent does not count, so that one
 * rpc_stream_send of any size still overlaps the next read). */
static void throttle(struct slot *s)
{
    size_t bound = s->srv->cfg.stream_queue;
    pthread_mutex_lock(&s->lock);
    while (s->write_pending && s->out_bytes - s->write_len > bound)
        if (!wait_step_locked(s))
            break;
    pthread_mutex_unlock(&s->lock);
}

int rpc_stream_read(struct rpc_stream *st, const uint8_t **buf, size_t *len)
{
    struct slot *s = (struct slot *)st;
    grpc_byte_buffer *bb = NULL;
    grpc_op op;

    if (s->has_cur) {
        grpc_slice_unref(s->cur);
        s->has_cur = false;
        rpc_server__budget_stream_sub(s);
    }
    throttle(s);
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (!stream_wait(s, &op, 1, true)) {
        if (bb)
            grpc_byte_buffer_destroy(bb);
        /* The call is gone: what is queued can never be sent. */
        pthread_mutex_lock(&s->lock);
        s->dead = true;
        drop_queue_locked(s);
        pthread_mutex_unlock(&s->lock);
        return -ECANCELED;
    }
    if (!bb)
        return 0;
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb)) {
        grpc_byte_buffer_destroy(bb);
        return -ECANCELED;
    }
    s->cur = grpc_byte_buffer_reader_readall(&rd);
    s->has_cur = true;
    grpc_byte_buffer_reader_destroy(&rd);
    grpc_byte_buffer_destroy(bb);
    *buf = GRPC_SLICE_START_PTR(s->cur);
    *len = GRPC_SLICE_LENGTH(s->cur);
    /* Counted until the next read (request budget). */
    rpc_server__budget_stream_add(s, *len);
    struct rpc_status refused;
    if (s->who.by_token &&
        rpc_auth_recheck(s->srv->auth, s->m->path, s->call, &s->who, &refused) < 0) {
        s->bad_request = true;
        s->bad_code = refused.code;
        memcpy(s->bad_msg, refused.message, sizeof s->bad_msg);
        *buf = NULL;
        *len = 0;
        return -EACCES;
    }
    if (s->m && rpc_check_strings(s->m->input, *buf, *len, s->bad_msg,
                                  sizeof s->bad_msg) < 0) {
        s->bad_request = true;
        s->bad_code = GRPC_STATUS_INVALID_ARGUMENT;
        *buf = NULL;
        *len = 0;
        return -EINVAL;
    }
    return 1;
}

/* A stream's token is checked again before each message its handler
 * sends, as before each it reads, so a revoked token also ends a stream
 * that only sends (Export, PullPages).  The check is one load while the
 * tokens table has not changed. */
static int send_admitted(struct slot *s)
{
    struct rpc_status refused;
    if (!s->who.by_token ||
        rpc_auth_recheck(s->srv->auth, s->m->path, s->call, &s->who, &refused) == 0)
        return 0;
    s->bad_request = true;
    s->bad_code = refused.code;
    memcpy(s->bad_msg, refused.message, sizeof s->bad_msg);
    return -EACCES;
}

int rpc_stream_send(struct rpc_stream *st, grpc_slice body)
{
    struct slot *s = (struct slot *)st;
    uint64_t seq;

    if (send_admitted(s) < 0) {
        grpc_slice_unref(body);
        return -EACCES;
    }
    pthread_mutex_lock(&s->lock);
    seq = s->post_seq;
    pthread_mutex_unlock(&s->lock);
    if (wait_sent(s, seq) < 0) {
        grpc_slice_unref(body);
        return -ECANCELED;
    }
    return post(s, body, &seq);
}

int rpc_stream_write_slice(struct rpc_stream *st, grpc_slice body)
{
    struct slot *s = (struct slot *)st;
    uint64_t seq;
    if (send_admitted(s) < 0) {
        grpc_slice_unref(body);
        return -EACCES;
    }
    int rc = post(s, body, &seq);
    return rc < 0 ? rc : wait_sent(s, seq);
}

int rpc_stream_write(struct rpc_stream *st, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice sl = grpc_slice_malloc(len);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
    return rpc_stream_write_slice(st, sl);
}

/* Send the final status: code, reason (trailing metadata) and msg, once
 * every hold is released and every posted message sent. */
static int finish(struct slot *s, grpc_status_code code, enum rpc_reason reason,
                  const char *msg)
{
    grpc_op ops[3];
    grpc_metadata md;
    size_t n = 0;

    if (s->finished)
        return 0;
    s->finished = true;
    pthread_mutex_lock(&s->lock);
    settle_locked(s);
    s->closed = true;
    drop_queue_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (s->bad_request) {
        code = s->bad_code;
        reason = RPC_REASON_NONE;
        msg = s->bad_msg;
    }
    rpc_server__call_done(s, code);
    rpc_server__stream_ending(s);
    memset(ops, 0, sizeof ops);
    if (!s->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        s->md_sent = true;
    }
    grpc_slice details = grpc_slice_from_copied_string(msg);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = code;
    if (code != GRPC_STATUS_OK) {
        ops[n].data.send_status_from_server.status_details = &details;
        if (reason != RPC_REASON_NONE) {
            md.key = grpc_slice_from_static_string(RPC_REASON_KEY);
            md.value = grpc_slice_from_static_string(rpc_reason_name(reason));
            ops[n].data.send_status_from_server.trailing_metadata_count = 1;
            ops[n].data.send_status_from_server.trailing_metadata = &md;
        }
    }
    n++;
    if (!s->close_posted) {
        ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
        ops[n].data.recv_close_on_server.cancelled = &s->cancelled;
        n++;
    }
    bool ok = stream_wait(s, ops, n, false);
    grpc_slice_unref(details);
    return ok ? 0 : -ECANCELED;
}

int rpc_stream_finish(struct rpc_stream *st, grpc_status_code code,
                      const char *fmt, ...)
{
    char msg[RPC_MSGLEN];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return finish((struct slot *)st, code, RPC_REASON_NONE, msg);
}

int rpc_stream_finish_status(struct rpc_stream *st, const struct rpc_status *status)
{
    return finish((struct slot *)st, status->code, status->reason, status->message);
}

size_t rpc_stream_max_message(const struct rpc_stream *st)
{
    return ((const struct slot *)st)->srv->cfg.max_message;
}

/* ---- streams driven by their messages (struct rpc_loop_stream) ----
 *
 * The call is bound to the queue its request came on (a loop's, or the
 * workers'), and each of its batches carries a struct rpc_loop_tag in the
 * slot: one receive at a time (recv_lt), the send queue above (send_lt),
 * and the final status (fin_lt), whose completion frees the slot.  Whoever
 * makes the last of the stream's work complete (a receive that ends the
 * reading, a send, a release) finishes it. */

#define SLOT_OF(t, field) ((struct slot *)(void *)((char *)(t) - offsetof(struct slot, field)))

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Post the next receive unless reading is over, paused or held back by
 * the send queue (a send's completion tries again).  s->lock held. */
static void lread_locked(struct slot *s)
{
    grpc_op op;

    if (s->read_over || s->reading || s->in_message || s->paused || s->fin_started)
        return;
    if (s->write_pending && s->out_bytes - s->write_len > s->srv->cfg.stream_queue)
        return;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->lrecv;
    s->reading = true;
    if (grpc_call_start_batch(s->call, &op, 1, &s->recv_lt, NULL) != GRPC_CALL_OK) {
        s->reading = false;
        s->read_over = true;
        s->call_failed = true;
    }
}

/* Is it time for the status?  Then it is taken (once).  s->lock held. */
static bool lfinish_due_locked(struct slot *s)
{
    if (s->fin_started || !s->read_over || s->reading || s->in_message ||
        s->holds > 0 || s->write_pending)
        return false;
    s->fin_started = true;
    s->closed = true;
    drop_queue_locked(s);
    return true;
}

static void lsend_status(struct slot *s, const struct rpc_status *st)
{
    grpc_op ops[3];
    size_t n = 0;
    grpc_status_code code = st->code;
    enum rpc_reason reason = st->reason;
    const char *msg = st->message;

    if (s->bad_request) {
        code = s->bad_code;
        reason = RPC_REASON_NONE;
        msg = s->bad_msg;
    }
    s->finished = true;
    rpc_server__call_done(s, code);
    rpc_server__stream_ending(s);
    memset(ops, 0, sizeof ops);
    if (!s->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        s->md_sent = true;
    }
    n += rpc_server__status_ops(s, ops + n, code, reason, msg);
    if (rpc_server__stream_start(s, ops, n, &s->fin_lt) != GRPC_CALL_OK)
        s->fin_lt.fn(&s->fin_lt, false);
}

/* Every piece of work is over: the handler's end, then the status. */
static void lfinish(struct slot *s)
{
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    if (s->lend_set)
        st = s->lend;
    if (s->lstate)
        s->m->lstream->end(s->lstate, s->call_failed || s->dead || s->idled, &st);
    s->lstate = NULL;
    lsend_status(s, &st);
}

static void lfin_done(struct rpc_loop_tag *t, bool ok)
{
    struct slot *s = SLOT_OF(t, fin_lt);
    struct rpc_server *srv = s->srv;
    (void)ok;
    if (s->counted) {
        pthread_mutex_lock(&srv->lock);
        if (s->lprev)
            s->lprev->lnext = s->lnext;
        else
            srv->lstreams = s->lnext;
        if (s->lnext)
            s->lnext->lprev = s->lprev;
        pthread_mutex_unlock(&srv->lock);
        rpc_server__stream_uncount(s);
    }
    rpc_server__slot_free(s);
}

/* A message of the client's (or the end of them).  Each locked section
 * decides whether to finish before it lets go: once it has, another
 * thread may finish the stream and free the slot. */
static void lrecv_done(struct rpc_loop_tag *t, bool ok)
{
    struct slot *s = SLOT_OF(t, recv_lt);
    grpc_byte_buffer *bb = s->lrecv;
    grpc_slice sl = grpc_empty_slice();
    grpc_byte_buffer_reader rd;

    s->lrecv = NULL;
    if (bb && ok && grpc_byte_buffer_reader_init(&rd, bb)) {
        sl = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
    } else if (bb) {
        ok = false;
    }
    if (bb)
        grpc_byte_buffer_destroy(bb);
    pthread_mutex_lock(&s->lock);
    s->reading = false;
    s->active_ns = mono_ns();
    if (!ok) {
        s->read_over = true;
        s->call_failed = true;
        s->dead = true;          /* what is queued can never be sent */
        drop_queue_locked(s);
    } else if (!bb) {
        s->read_over = true;     /* half-closed */
    } else {
        s->in_message = true;    /* the stream cannot end meanwhile */
    }
    bool run = s->in_message;
    bool due = !run && lfinish_due_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (run) {
        const uint8_t *buf = GRPC_SLICE_START_PTR(sl);
        size_t len = GRPC_SLICE_LENGTH(sl);
        /* Counted while message() has it (request budget). */
        rpc_server__budget_stream_add(s, len);
        struct rpc_status end = {.code = GRPC_STATUS_OK}, refused;
        int rc;
        if (s->who.by_token &&
            rpc_auth_recheck(s->srv->auth, s->m->path, s->call, &s->who, &refused) < 0) {
            s->bad_request = true;
            s->bad_code = refused.code;
            memcpy(s->bad_msg, refused.message, sizeof s->bad_msg);
            rc = -1;
        } else if (s->m->input && rpc_check_strings(s->m->input, buf, len, s->bad_msg,
                                                    sizeof s->bad_msg) < 0) {
            s->bad_request = true;
            s->bad_code = GRPC_STATUS_INVALID_ARGUMENT;
            rc = -1;
        } else {
            rc = s->m->lstream->message(s->lstate, buf, len, &end);
        }
        grpc_slice_unref(sl);
        rpc_server__budget_stream_sub(s);
        pthread_mutex_lock(&s->lock);
        s->in_message = false;
        if (rc < 0) {
            s->read_over = true;
            if (!s->bad_request) {
                s->lend = end;
                s->lend_set = true;
            }
        } else if (rc == 1) {
            if (s->resumes > 0)
                s->resumes--;
            else
                s->paused = true;
        }
        lread_locked(s);
        due = lfinish_due_locked(s);
        pthread_mutex_unlock(&s->lock);
    }
    if (due)
        lfinish(s);
}

static void lsend_done(struct rpc_loop_tag *t, bool ok)
{
    struct slot *s = SLOT_OF(t, send_lt);
    pthread_mutex_lock(&s->lock);
    sent_locked(s, ok);
    s->active_ns = mono_ns();
    lread_locked(s);
    bool due = lfinish_due_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (due)
        lfinish(s);
}

static void tags_init(struct slot *s)
{
    s->recv_lt = (struct rpc_loop_tag){.kind = RPC_LOOP_TAG, .fn = lrecv_done};
    s->send_lt = (struct rpc_loop_tag){.kind = RPC_LOOP_TAG, .fn = lsend_done};
    s->fin_lt = (struct rpc_loop_tag){.kind = RPC_LOOP_TAG, .fn = lfin_done};
}

void rpc_server__lstream_refuse(struct slot *s, const struct rpc_status *st)
{
    tags_init(s);
    s->fin_started = true;
    s->closed = true;
    lsend_status(s, st);
}

void rpc_server__lstream_begin(struct slot *s)
{
    struct rpc_server *srv = s->srv;

    tags_init(s);
    s->active_ns = mono_ns();
    pthread_mutex_lock(&srv->lock);
    s->lprev = NULL;
    s->lnext = srv->lstreams;
    if (srv->lstreams)
        srv->lstreams->lprev = s;
    srv->lstreams = s;
    pthread_mutex_unlock(&srv->lock);
    s->lstate = s->m->lstream->open(s->m->arg, (struct rpc_stream *)s);
    if (!s->lstate) {
        struct rpc_status st = {.code = GRPC_STATUS_RESOURCE_EXHAUSTED};
        snprintf(st.message, sizeof st.message, "%s: out of memory for a stream",
                 s->m->path);
        rpc_server__lstream_refuse(s, &st);
        return;
    }
    pthread_mutex_lock(&s->lock);
    lread_locked(s);
    bool due = lfinish_due_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (due)
        lfinish(s);
}

void rpc_stream_resume(struct rpc_stream *st)
{
    struct slot *s = (struct slot *)st;
    pthread_mutex_lock(&s->lock);
    if (s->paused) {
        s->paused = false;
        lread_locked(s);
    } else {
        s->resumes++;
    }
    bool due = lfinish_due_locked(s);
    pthread_mutex_unlock(&s->lock);
    if (due)
        lfinish(s);
}

/* stream_idle_ms for streams driven by their messages: one waiting on its
 * client (a receive or a send in flight) with nothing moving for that long
 * is cancelled, with a status that says why. */
void rpc_server__lstream_sweep(struct rpc_server *srv)
{
    int ms = srv->cfg.stream_idle_ms;
    if (ms <= 0)
        return;
    int64_t now = mono_ns(), last = atomic_load(&srv->swept_ns);
    int64_t every = ms < 800 ? (int64_t)ms * 250000 : 200000000;
    if (now - last < every || !atomic_compare_exchange_strong(&srv->swept_ns, &last, now))
        return;
    pthread_mutex_lock(&srv->lock);
    for (struct slot *s = srv->lstreams; s; s = s->lnext) {
        if (s->m->internal)
            continue;
        pthread_mutex_lock(&s->lock);
        if (!s->idled && !s->fin_started && (s->reading || s->write_pending) &&
            now - s->active_ns > (int64_t)ms * 1000000) {
            char msg[RPC_MSGLEN];
            s->idled = true;
            snprintf(msg, sizeof msg, "%s: stream ended: no message for %d ms (the "
                     "server's stream_idle_ms); open a new one", s->m->path, ms);
            log_info("%s", msg);
            grpc_call_cancel_with_status(s->call, GRPC_STATUS_RESOURCE_EXHAUSTED, msg,
                                         NULL);
        }
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&srv->lock);
}
