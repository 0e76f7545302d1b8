/* rpc_client: gRPC client calls over the gRPC C core (see rpc_client.h).
 *
 * Each call uses its own pluck completion queue, so calls on one channel never
 * wait for each other and a stream can be read and written from two threads
 * (each plucks its own tag).
 */
#include "rpc_client.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "rpc_auth.h"
#include "rpc_ops.h"

#define MAX_METHODS 64

struct reg_method {
    char *path;
    void *handle;
};

struct rpc_channel {
    grpc_channel *ch;
    grpc_metadata auth;          /* authorization: Bearer TOKEN */
    size_t nauth;                /* 0 or 1 */
    pthread_mutex_t lock;
    struct reg_method methods[MAX_METHODS];
    int nmethods;
};

struct rpc_cstream {
    struct rpc_channel *ch;      /* its initial metadata */
    grpc_call *call;
    grpc_completion_queue *cq;
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code status;
    grpc_slice details;
    bool md_received, closed;
    /* Initial metadata goes out with the first operation that sends, so
     * opening never waits for the server; md_lock orders it between a
     * writer and a reader thread. */
    pthread_mutex_t md_lock;
    bool md_sent;
    char tags[4]; /* distinct addresses: write, read, finish, metadata */
};

/* Set at start-up, before any channel; read when one is created. */
static char default_token[RPC_TOKEN_MAX + 1];

int rpc_client_set_token(const char *token)
{
    char err[RPC_AUTH_ERRLEN];
    if (token && token[0] && rpc_token_check("token", token, strlen(token), err) < 0)
        return -EINVAL;
    snprintf(default_token, sizeof default_token, "%s", token ? token : "");
    return 0;
}

int rpc_channel_set_token(struct rpc_channel *c, const char *token)
{
    char err[RPC_AUTH_ERRLEN];
    if (token && token[0] && rpc_token_check("token", token, strlen(token), err) < 0)
        return -EINVAL;
    if (c->nauth) {
        grpc_slice_unref(c->auth.value);
        c->nauth = 0;
    }
    if (!token || !token[0])
        return 0;
    char *v = malloc(strlen(token) + 8);
    if (!v)
        return -ENOMEM;
    sprintf(v, "Bearer %s", token);
    memset(&c->auth, 0, sizeof c->auth);
    c->auth.key = grpc_slice_from_static_string("authorization");
    c->auth.value = grpc_slice_from_copied_string(v);
    c->nauth = 1;
    free(v);
    return 0;
}

size_t rpc_channel_metadata(const struct rpc_channel *c, grpc_metadata **md)
{
    *md = (grpc_metadata *)&c->auth;
    return c->nauth;
}

/* Initial metadata of a call on c: the token, if any. */
static void md_fill(struct rpc_channel *c, grpc_op *op)
{
    op->data.send_initial_metadata.count = c->nauth;
    op->data.send_initial_metadata.metadata = c->nauth ? &c->auth : NULL;
}

struct rpc_channel *rpc_channel_create(const char *target, size_t max_message)
{
    return rpc_channel_create_tls(target, max_message, rpc_tls_client());
}

static struct rpc_channel *channel_create(const char *target, size_t max_message,
                                          struct rpc_tls *tls, size_t window);

struct rpc_channel *rpc_channel_create_window(const char *target, size_t max_message,
                                              size_t window)
{
    return channel_create(target, max_message, rpc_tls_client(), window);
}

struct rpc_channel *rpc_channel_create_tls(const char *target, size_t max_message,
                                           struct rpc_tls *tls)
{
    return channel_create(target, max_message, tls, 0);
}

static struct rpc_channel *channel_create(const char *target, size_t max_message,
                                          struct rpc_tls *tls, size_t window)
{
    struct rpc_channel *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (!max_message)
        max_message = 64u << 20;
    grpc_arg args[6];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)max_message;
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH;
    args[1].value.integer = (int)max_message;
    /* Reconnect quickly after a node restarts. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[2].value.integer = 1000;
    /* Each channel its own connections: TLS credentials on one file
     * watcher compare equal, and gRPC's global pool would hand a new
     * channel a connection made before the files changed. */
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[3].value.integer = 1;
    grpc_channel_args cargs = {.num_args = 4, .args = args};
    if (window) {
        /* One window per call, never grown by BDP probes. */
        args[4].type = GRPC_ARG_INTEGER;
        args[4].key = GRPC_ARG_HTTP2_BDP_PROBE;
        args[4].value.integer = 0;
        args[5].type = GRPC_ARG_INTEGER;
        args[5].key = GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES;
        args[5].value.integer = window > INT32_MAX ? INT32_MAX : (int)window;
        cargs.num_args = 6;
    }
    grpc_channel_credentials *creds = rpc_tls_channel_credentials(tls);
    if (!creds) {
        free(c);
        return NULL;
    }
    c->ch = grpc_channel_create(target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    if (!c->ch) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->lock, NULL);
    if (default_token[0])
        rpc_channel_set_token(c, default_token);
    return c;
}

void rpc_channel_destroy(struct rpc_channel *c)
{
    if (!c)
        return;
    grpc_channel_destroy(c->ch);
    rpc_channel_set_token(c, NULL);
    for (int i = 0; i < c->nmethods; i++)
        free(c->methods[i].path);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

grpc_channel *rpc_channel_grpc(struct rpc_channel *c)
{
    return c->ch;
}

/* The registered handle of a path; NULL when the table is full (the call is
 * then made unregistered). */
static void *method_handle(struct rpc_channel *c, const char *path)
{
    void *h = NULL;
    pthread_mutex_lock(&c->lock);
    for (int i = 0; i < c->nmethods; i++) {
        if (strcmp(c->methods[i].path, path) == 0) {
            h = c->methods[i].handle;
            goto out;
        }
    }
    if (c->nmethods < MAX_METHODS) {
        char *p = strdup(path);
        if (p) {
            h = grpc_channel_register_call(c->ch, p, NULL, NULL);
            c->methods[c->nmethods].path = p;
            c->methods[c->nmethods].handle = h;
            c->nmethods++;
        }
    }
out:
    pthread_mutex_unlock(&c->lock);
    return h;
}

static grpc_call *call_create(struct rpc_channel *c, const char *method,
                              grpc_completion_queue *cq, int timeout_ms)
{
    gpr_timespec deadline = gpr_time_add(
        gpr_now(GPR_CLOCK_MONOTONIC),
        gpr_time_from_millis(timeout_ms > 0 ? timeout_ms : 1, GPR_TIMESPAN));
    void *h = method_handle(c, method);
    if (h)
        return grpc_channel_create_registered_call(c->ch, NULL,
                                                   GRPC_PROPAGATE_DEFAULTS, cq,
                                                   h, deadline, NULL);
    grpc_slice m = grpc_slice_from_copied_string(method);
    grpc_call *call = grpc_channel_create_call(c->ch, NULL, GRPC_PROPAGATE_DEFAULTS,
                                               cq, m, NULL, deadline, NULL);
    grpc_slice_unref(m);
    return call;
}

static void set_status(struct rpc_status *st, grpc_status_code code,
                       const grpc_slice *details, const char *fallback)
{
    if (!st)
        return;
    st->code = code;
    st->reason = RPC_REASON_NONE;
    if (details && GRPC_SLICE_LENGTH(*details)) {
        size_t n = GRPC_SLICE_LENGTH(*details);
        if (n >= sizeof st->message)
            n = sizeof st->message - 1;
        memcpy(st->message, GRPC_SLICE_START_PTR(*details), n);
        st->message[n] = 0;
    } else {
        snprintf(st->message, sizeof st->message, "%s", fallback ? fallback : "");
    }
}

/* The reason a server put in the trailing metadata, if any. */
static void set_reason(struct rpc_status *st, const grpc_metadata_array *md)
{
    if (!st)
        return;
    for (size_t i = 0; i < md->count; i++)
        if (grpc_slice_str_cmp(md->metadata[i].key, RPC_REASON_KEY) == 0)
            st->reason = rpc_reason_parse(
                (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value),
                GRPC_SLICE_LENGTH(md->metadata[i].value));
}

static grpc_slice buffer_to_slice(grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader rd;
    if (!grpc_byte_buffer_reader_init(&rd, bb))
        return grpc_empty_slice();
    grpc_slice s = grpc_byte_buffer_reader_readall(&rd);
    grpc_byte_buffer_reader_destroy(&rd);
    return s;
}

static void drain_pluck(grpc_completion_queue *cq)
{
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME),
                                       NULL).type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
}

int rpc_call_raw(struct rpc_channel *c, const char *method, const void *req,
                 size_t len, grpc_slice *resp, int timeout_ms,
                 struct rpc_status *st)
{
    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_call *call = call_create(c, method, cq, timeout_ms);
    grpc_metadata_array md_initial, md_trailing;
    grpc_byte_buffer *recv = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    const char *err_string = NULL;
    int rc = -1;

    grpc_metadata_array_init(&md_initial);
    grpc_metadata_array_init(&md_trailing);
    grpc_slice body = grpc_slice_malloc(len);
    if (len)
        memcpy(GRPC_SLICE_START_PTR(body), req, len);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    md_fill(c, &ops[0]);
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &md_initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &md_trailing;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    ops[5].data.recv_status_on_client.error_string = &err_string;

    if (!call || grpc_call_start_batch(call, ops, 6, ops, NULL) != GRPC_CALL_OK) {
        set_status(st, GRPC_STATUS_INTERNAL, NULL, "cannot start the call");
        goto out;
    }
    grpc_event ev = grpc_completion_queue_pluck(
        cq, ops, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE || !ev.success) {
        set_status(st, GRPC_STATUS_INTERNAL, NULL, "call batch failed");
        goto out;
    }
    set_status(st, code, &details, err_string);
    set_reason(st, &md_trailing);
    if (code == GRPC_STATUS_OK) {
        if (!recv) {
            set_status(st, GRPC_STATUS_INTERNAL, NULL, "OK without a message");
            goto out;
        }
        if (resp)
            *resp = buffer_to_slice(recv);
        rc = 0;
    }
out:
    if (recv)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    if (err_string)
        gpr_free((void *)err_string);
    grpc_metadata_array_destroy(&md_initial);
    grpc_metadata_array_destroy(&md_trailing);
    if (call)
        grpc_call_unref(call);
    drain_pluck(cq);
    return rc;
}

int rpc_call(struct rpc_channel *c, const char *method,
             const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *resp_desc,
             ProtobufCMessage **resp, int timeout_ms, struct rpc_status *st)
{
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        set_status(st, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL, "out of memory");
        return -1;
    }
    protobuf_c_message_pack(req, buf);
    grpc_slice out;
    int rc = rpc_call_raw(c, method, buf, len, &out, timeout_ms, st);
    free(buf);
    if (rc < 0)
        return rc;
    *resp = protobuf_c_message_unpack(resp_desc, NULL, GRPC_SLICE_LENGTH(out),
                                      GRPC_SLICE_START_PTR(out));
    grpc_slice_unref(out);
    if (!*resp) {
        set_status(st, GRPC_STATUS_INTERNAL, NULL, "response does not parse");
        return -1;
    }
    return 0;
}

/* ---- fan-out: many unary calls on one completion queue ---- */

struct multi_state {
    grpc_call *call;
    grpc_op ops[6];
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code code;
    grpc_slice details;
    const char *err_string;
    bool started;
};

size_t rpc_call_many(struct rpc_multi *calls, size_t n)
{
    struct multi_state *ms = calloc(n ? n : 1, sizeof *ms);
    size_t failed = 0, pending = 0;

    if (!ms) {
        for (size_t i = 0; i < n; i++) {
            calls[i].rc = -1;
            calls[i].resp = grpc_empty_slice();
            set_status(&calls[i].st, GRPC_STATUS_RESOURCE_EXHAUSTED, NULL,
                       "out of memory");
        }
        return n;
    }
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    for (size_t i = 0; i < n; i++) {
        struct rpc_multi *c = &calls[i];
        struct multi_state *m = &ms[i];
        c->rc = -1;
        c->resp = grpc_empty_slice();
        m->details = grpc_empty_slice();
        m->code = GRPC_STATUS_UNKNOWN;
        grpc_metadata_array_init(&m->md_initial);
        grpc_metadata_array_init(&m->md_trailing);
        m->call = call_create(c->ch, c->method, cq, c->timeout_ms);
        m->send = grpc_raw_byte_buffer_create(&c->req, 1);
        grpc_op *ops = m->ops;
        ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
        md_fill(c->ch, &ops[0]);
        ops[1].op = GRPC_OP_SEND_MESSAGE;
        ops[1].data.send_message.send_message = m->send;
        ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[3].data.recv_initial_metadata.recv_initial_metadata = &m->md_initial;
        ops[4].op = GRPC_OP_RECV_MESSAGE;
        ops[4].data.recv_message.recv_message = &m->recv;
        ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        ops[5].data.recv_status_on_client.trailing_metadata = &m->md_trailing;
        ops[5].data.recv_status_on_client.status = &m->code;
        ops[5].data.recv_status_on_client.status_details = &m->details;
        ops[5].data.recv_status_on_client.error_string = &m->err_string;
        if (m->call && grpc_call_start_batch(m->call, ops, 6, m, NULL) == GRPC_CALL_OK) {
            m->started = true;
            pending++;
        } else {
            set_status(&c->st, GRPC_STATUS_INTERNAL, NULL, "cannot start the call");
        }
    }
    while (pending > 0) {
        grpc_event ev = grpc_completion_queue_next(
            cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            break;
        struct multi_state *m = ev.tag;
        struct rpc_multi *c = &calls[m - ms];
        pending--;
        if (!ev.success) {
            set_status(&c->st, GRPC_STATUS_INTERNAL, NULL, "call batch failed");
            continue;
        }
        set_status(&c->st, m->code, &m->details, m->err_string);
        set_reason(&c->st, &m->md_trailing);
        if (m->code == GRPC_STATUS_OK) {
            if (m->recv) {
                c->resp = buffer_to_slice(m->recv);
                c->rc = 0;
            } else {
                set_status(&c->st, GRPC_STATUS_INTERNAL, NULL, "OK without a message");
            }
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct multi_state *m = &ms[i];
        if (calls[i].rc != 0)
            failed++;
        if (m->recv)
            grpc_byte_buffer_destroy(m->recv);
        if (m->send)
            grpc_byte_buffer_destroy(m->send);
        grpc_slice_unref(m->details);
        if (m->err_string)
            gpr_free((void *)m->err_string);
        grpc_metadata_array_destroy(&m->md_initial);
        grpc_metadata_array_destroy(&m->md_trailing);
        if (m->call)
            grpc_call_unref(m->call);
    }
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    free(ms);
    return failed;
}

/* ---- streams ---- */

static bool stream_batch(struct rpc_cstream *s, grpc_op *ops, size_t n, void *tag)
{
    if (grpc_call_start_batch(s->call, ops, n, tag, NULL) != GRPC_CALL_OK)
        return false;
    grpc_event ev = grpc_completion_queue_pluck(
        s->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

struct rpc_cstream *rpc_cstream_open(struct rpc_channel *c, const char *method,
                                     int timeout_ms)
{
    struct rpc_cstream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->ch = c;
    s->cq = grpc_completion_queue_create_for_pluck(NULL);
    s->call = call_create(c, method, s->cq, timeout_ms);
    grpc_metadata_array_init(&s->md_initial);
    grpc_metadata_array_init(&s->md_trailing);
    s->details = grpc_empty_slice();
    if (!s->call) {
        drain_pluck(s->cq);
        grpc_metadata_array_destroy(&s->md_initial);
        grpc_metadata_array_destroy(&s->md_trailing);
        free(s);
        return NULL;
    }
    pthread_mutex_init(&s->md_lock, NULL);
    return s;
}

/* Start a sending batch, prefixed with the initial metadata when it has not
 * gone out yet, and wait for it. */
static bool stream_send(struct rpc_cstream *s, grpc_op *op, void *tag)
{
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    pthread_mutex_lock(&s->md_lock);
    if (!s->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        md_fill(s->ch, &ops[n++]);
        s->md_sent = true;
    }
    ops[n++] = *op;
    grpc_call_error e = grpc_call_start_batch(s->call, ops, n, tag, NULL);
    pthread_mutex_unlock(&s->md_lock);
    if (e != GRPC_CALL_OK)
        return false;
    grpc_event ev = grpc_completion_queue_pluck(
        s->cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

/* Make sure the initial metadata is on its way (before a read). */
static bool stream_send_md(struct rpc_cstream *s)
{
    pthread_mutex_lock(&s->md_lock);
    if (s->md_sent) {
        pthread_mutex_unlock(&s->md_lock);
        return true;
    }
    s->md_sent = true;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    md_fill(s->ch, &op);
    grpc_call_error e = grpc_call_start_batch(s->call, &op, 1, &s->tags[3], NULL);
    pthread_mutex_unlock(&s->md_lock);
    if (e != GRPC_CALL_OK)
        return false;
    grpc_event ev = grpc_completion_queue_pluck(
        s->cq, &s->tags[3], gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

int rpc_cstream_write(struct rpc_cstream *s, const void *buf, size_t len)
{
    grpc_slice body = grpc_slice_malloc(len);
    if (len)
        memcpy(GRPC_SLICE_START_PTR(body), buf, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = bb;
    bool ok = stream_send(s, &op, &s->tags[0]);
    grpc_byte_buffer_destroy(bb);
    return ok ? 0 : -1;
}

int rpc_cstream_write_msg(struct rpc_cstream *s, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf)
        return -1;
    protobuf_c_message_pack(msg, buf);
    int rc = rpc_cstream_write(s, buf, len);
    free(buf);
    return rc;
}

int rpc_cstream_close_send(struct rpc_cstream *s)
{
    if (s->closed)
        return 0;
    s->closed = true;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    return stream_send(s, &op, &s->tags[0]) ? 0 : -1;
}

int rpc_cstream_read(struct rpc_cstream *s, grpc_slice *out)
{
    grpc_op ops[2];
    grpc_byte_buffer *bb = NULL;

    if (!stream_send_md(s))
        return -1;
    size_t n = rpc_ops_recv(ops, !s->md_received, &s->md_initial, &bb);
    s->md_received = true;
    if (!stream_batch(s, ops, n, &s->tags[1])) {
        if (bb)
            grpc_byte_buffer_destroy(bb);
        return -1;
    }
    if (!bb)
        return 0;
    *out = buffer_to_slice(bb);
    grpc_byte_buffer_destroy(bb);
    return 1;
}

void rpc_cstream_cancel(struct rpc_cstream *s)
{
    /* No half-close after this (the finish would send one): the server
     * could see the end of the messages before the cancel, and take a
     * cancelled stream's messages as whole. */
    s->closed = true;
    grpc_call_cancel(s->call, NULL);
}

int rpc_cstream_finish(struct rpc_cstream *s, struct rpc_status *st)
{
    grpc_op ops[4];
    size_t n = 0;
    const char *err_string = NULL;
    int rc = -1;

    s->status = GRPC_STATUS_UNKNOWN;
    memset(ops, 0, sizeof ops);
    if (!s->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        md_fill(s->ch, &ops[n++]);
        s->md_sent = true;
    }
    if (!s->md_received) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n].data.recv_initial_metadata.recv_initial_metadata = &s->md_initial;
        n++;
        s->md_received = true;
    }
    if (!s->closed) {
        ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        s->closed = true;
    }
    ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[n].data.recv_status_on_client.trailing_metadata = &s->md_trailing;
    ops[n].data.recv_status_on_client.status = &s->status;
    ops[n].data.recv_status_on_client.status_details = &s->details;
    ops[n].data.recv_status_on_client.error_string = &err_string;
    n++;
    if (!stream_batch(s, ops, n, &s->tags[2])) {
        /* The call is in a bad state (e.g. a message still unread and the
         * batch refused): cancel it so the status arrives. */
        grpc_call_cancel(s->call, NULL);
        set_status(st, GRPC_STATUS_CANCELLED, NULL, "stream cancelled");
    } else {
        set_status(st, s->status, &s->details, err_string);
        set_reason(st, &s->md_trailing);
        rc = s->status == GRPC_STATUS_OK ? 0 : -1;
    }
    if (err_string)
        gpr_free((void *)err_string);
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->md_initial);
    grpc_metadata_array_destroy(&s->md_trailing);
    grpc_call_unref(s->call);
    drain_pluck(s->cq);
    pthread_mutex_destroy(&s->md_lock);
    free(s);
    return rc;
}
