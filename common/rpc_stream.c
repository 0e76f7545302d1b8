/* rpc_stream: streaming calls on the server side (see rpc_server.h).
 *
 * A stream's handler thread drives its call with one batch at a time on the
 * call's own completion queue, except that one message send
 * (rpc_stream_send) may be in flight while it reads, and that the health
 * Watch posts a RECV_CLOSE_ON_SERVER early; completions of those arrive
 * while waiting for another batch and are accounted for on the way.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/support/time.h>

#include "log.h"
#include "rpc_check.h"
#include "rpc_server.h"
#include "rpc_server_internal.h"

/* Account for a completion that is not the batch being waited for. */
void rpc_server__stream_side_event(struct slot *s, const grpc_event *ev)
{
    if (ev->tag == &s->close_tag) {
        s->close_done = true;
    } else if (ev->tag == &s->write_tag) {
        s->write_pending = false;
        if (!ev->success)
            s->write_failed = true;
        if (s->write_buf) {
            grpc_byte_buffer_destroy(s->write_buf);
            s->write_buf = NULL;
        }
    }
}

/* Wait for the send started by rpc_stream_send, if any. */
static int stream_drain_write(struct slot *s)
{
    while (s->write_pending) {
        grpc_event ev = grpc_completion_queue_next(s->cq, rpc_server__inf_future(), NULL);
        if (ev.type != GRPC_OP_COMPLETE) {
            s->write_pending = false;
            s->write_failed = true;
            break;
        }
        rpc_server__stream_side_event(s, &ev);
    }
    return s->write_failed ? -ECANCELED : 0;
}

static bool stream_wait(struct slot *s, grpc_op *ops, size_t n)
{
    grpc_call_error e = grpc_call_start_batch(s->call, ops, n, s, NULL);
    if (e != GRPC_CALL_OK) {
        log_error("stream batch failed to start: %d", e);
        return false;
    }
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(s->cq, rpc_server__inf_future(), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            return false;
        if (ev.tag != s) {
            rpc_server__stream_side_event(s, &ev);
            continue;
        }
        return ev.success != 0;
    }
}

int rpc_stream_read(struct rpc_stream *st, const uint8_t **buf, size_t *len)
{
    struct slot *s = (struct slot *)st;
    grpc_byte_buffer *bb = NULL;
    grpc_op op;

    if (s->has_cur) {
        grpc_slice_unref(s->cur);
        s->has_cur = false;
    }
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &bb;
    if (!stream_wait(s, &op, 1)) {
        if (bb)
            grpc_byte_buffer_destroy(bb);
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
    if (s->m && rpc_check_strings(s->m->input, *buf, *len, s->bad_msg,
                                  sizeof s->bad_msg) < 0) {
        s->bad_request = true;
        *buf = NULL;
        *len = 0;
        return -EINVAL;
    }
    return 1;
}

int rpc_stream_send(struct rpc_stream *st, grpc_slice body)
{
    struct slot *s = (struct slot *)st;
    grpc_op ops[2];
    size_t n = 0;

    if (stream_drain_write(s) < 0) {
        grpc_slice_unref(body);
        return -ECANCELED;
    }
    memset(ops, 0, sizeof ops);
    if (!s->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        s->md_sent = true;
    }
    s->write_buf = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = s->write_buf;
    n++;
    if (grpc_call_start_batch(s->call, ops, n, &s->write_tag, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(s->write_buf);
        s->write_buf = NULL;
        s->write_failed = true;
        return -ECANCELED;
    }
    s->write_pending = true;
    return 0;
}

int rpc_stream_write_slice(struct rpc_stream *st, grpc_slice body)
{
    struct slot *s = (struct slot *)st;
    grpc_op ops[2];
    size_t n = 0;

    if (stream_drain_write(s) < 0) {
        grpc_slice_unref(body);
        return -ECANCELED;
    }
    memset(ops, 0, sizeof ops);
    if (!s->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        s->md_sent = true;
    }
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    n++;
    bool ok = stream_wait(s, ops, n);
    grpc_byte_buffer_destroy(bb);
    return ok ? 0 : -ECANCELED;
}

int rpc_stream_write(struct rpc_stream *st, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    grpc_slice sl = grpc_slice_malloc(len);
    protobuf_c_message_pack(msg, GRPC_SLICE_START_PTR(sl));
    return rpc_stream_write_slice(st, sl);
}

/* Send the final status: code, reason (trailing metadata) and msg. */
static int finish(struct slot *s, grpc_status_code code, enum rpc_reason reason,
                  const char *msg)
{
    grpc_op ops[3];
    grpc_metadata md;
    size_t n = 0;

    if (s->finished)
        return 0;
    s->finished = true;
    stream_drain_write(s);
    if (s->bad_request) {
        code = GRPC_STATUS_INVALID_ARGUMENT;
        reason = RPC_REASON_NONE;
        msg = s->bad_msg;
    }
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
    bool ok = stream_wait(s, ops, n);
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

