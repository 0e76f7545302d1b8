/* rpc_server: a small gRPC server over the gRPC C core.
 *
 * The server owns one completion queue per worker thread.  On every queue it
 * keeps requests posted for each registered method, plus one generic request
 * so that a call to an unknown method is answered UNIMPLEMENTED at once.
 *
 * Unary handlers run on the worker threads: they get the request bytes and
 * fill a struct rpc_reply (response bytes or an error status).  Streaming
 * handlers (client, server or bidirectional streams alike) run on a thread of
 * their own per call and drive the call with the blocking rpc_stream_*
 * functions.  Handlers may block (e.g. on a durable write) and run
 * concurrently; they must be thread-safe.
 *
 * Methods are registered from protobuf-c service descriptors: the paths are
 * "/<service full name>/<method>", and the handler table marks streaming
 * methods by hand (descriptors carry no streaming flag).  A method with no
 * handler answers UNIMPLEMENTED.
 *
 * Every server serves grpc.health.v1.Health/Check from a small table set with
 * rpc_server_set_health().
 *
 * Shutdown: rpc_server_shutdown() stops accepting calls, lets in-flight calls
 * finish for a grace period, cancels what is left (open streams see
 * UNAVAILABLE), joins every thread.  rpc_signals_block() and
 * rpc_signals_wait() implement the SIGTERM/SIGINT handling around it, and
 * run what each process registered with rpc_signals_on_hup() on SIGHUP.
 *
 * Errors: functions return 0 or a negative errno; rpc_server_create returns
 * NULL.  The caller owns grpc_init()/grpc_shutdown().
 */
#ifndef BLOOMGRID_RPC_SERVER_H
#define BLOOMGRID_RPC_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "rpc_status.h"

#define RPC_DEFAULT_MAX_STREAMS 256

struct rpc_server_config {
    const char *listen;      /* "host:port"; port 0 picks a free one */
    int threads;             /* worker threads (completion queues), >= 1 */
    size_t max_message;      /* max message size, both directions (bytes) */
    int grace_ms;            /* how long shutdown lets calls finish */
    int max_streams;         /* open streaming calls at once (each has a
                                thread); more get RESOURCE_EXHAUSTED.
                                0: RPC_DEFAULT_MAX_STREAMS */
};

/* The outcome of a unary call, filled by its handler.  The handler either
 * sets a body (rpc_reply_pack / rpc_reply_alloc) and leaves st.code OK, or
 * calls rpc_reply_error / rpc_reply_fail.  The server owns and frees the
 * body. */
struct rpc_reply {
    struct rpc_status st;        /* reason sent as "bloomgrid-reason" */
    grpc_slice body;
    bool has_body;
};

struct rpc_stream;
struct rpc_server;

/* req/len: the request message bytes, valid during the call only. */
typedef void (*rpc_unary_fn)(void *arg, const uint8_t *req, size_t len,
                             struct rpc_reply *reply);
/* The handler reads and writes with rpc_stream_* and should end the call with
 * rpc_stream_finish; if it does not, the server finishes it with OK. */
typedef void (*rpc_stream_fn)(void *arg, struct rpc_stream *st);

/* One entry per method of a service descriptor, in descriptor order.  Set
 * unary for unary methods, stream for any streaming method, neither for a
 * method this server does not implement (UNIMPLEMENTED).
 *
 * Before a handler sees a request message (unary, or each message a stream
 * handler reads), the server checks every string field of it against the
 * method's input descriptor (rpc_check_strings: no NUL byte, valid UTF-8)
 * and answers INVALID_ARGUMENT itself when one breaks the rule; a stream
 * read then returns -EINVAL and the call ends with that status whatever
 * the handler finishes it with.  checks_strings: the handler decodes the
 * message by hand and checks its strings itself (hot paths). */
struct rpc_handler {
    rpc_unary_fn unary;
    rpc_stream_fn stream;
    bool checks_strings;
};

/* Create a server (not yet listening).  NULL on bad config. */
struct rpc_server *rpc_server_create(const struct rpc_server_config *cfg);

/* Register every method of a service.  handlers has sd->n_methods entries.
 * arg is passed to every handler.  Must be called before rpc_server_start. */
int rpc_server_add_service(struct rpc_server *srv,
                           const ProtobufCServiceDescriptor *sd,
                           const struct rpc_handler *handlers, void *arg);

/* Bind and start the workers.  Returns the bound port (> 0) or a negative
 * errno (-EADDRINUSE when the address cannot be bound). */
int rpc_server_start(struct rpc_server *srv);

/* Health status of a service name ("" is the whole process).  Names never set
 * answer NOT_FOUND, except "" which starts as NOT_SERVING. */
void rpc_server_set_health(struct rpc_server *srv, const char *service,
                           bool serving);

/* Stop accepting, finish or cancel in-flight calls, join every thread.
 * Idempotent. */
void rpc_server_shutdown(struct rpc_server *srv);

/* Shut down if needed and free.  NULL is allowed. */
void rpc_server_destroy(struct rpc_server *srv);

/* Unary reply helpers. */
void rpc_reply_error(struct rpc_reply *r, grpc_status_code code,
                     const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* An error with a typed reason (rpc_status.h). */
void rpc_reply_fail(struct rpc_reply *r, grpc_status_code code,
                    enum rpc_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Pack msg as the body.  Returns 0 or -ENOMEM. */
int rpc_reply_pack(struct rpc_reply *r, const ProtobufCMessage *msg);
/* Allocate a body of len bytes and return where to write it (hand-written
 * encoders), or NULL. */
uint8_t *rpc_reply_alloc(struct rpc_reply *r, size_t len);

/* Streaming calls (valid only inside a stream handler). */

/* Read the next message.  Returns 1 with *buf and *len set (valid until the next
 * read or the end of the handler), 0 when the client half-closed, -ECANCELED
 * when the call failed or was cancelled, -EINVAL when the message broke the
 * string rule (see struct rpc_handler; the call ends INVALID_ARGUMENT). */
int rpc_stream_read(struct rpc_stream *st, const uint8_t **buf, size_t *len);
/* Send one message.  Returns 0 or -ECANCELED (call gone) / -ENOMEM. */
int rpc_stream_write(struct rpc_stream *st, const ProtobufCMessage *msg);
/* Send one message already encoded; takes over the slice reference. */
int rpc_stream_write_slice(struct rpc_stream *st, grpc_slice body);
/* Start sending one encoded message and return at once, so the handler can
 * read the next request meanwhile; the next send, write or finish waits for
 * it.  Takes over the slice reference.  Returns 0 or -ECANCELED (this or an
 * earlier send failed). */
int rpc_stream_send(struct rpc_stream *st, grpc_slice body);
/* End the call with a status.  Returns 0 or -ECANCELED. */
int rpc_stream_finish(struct rpc_stream *st, grpc_status_code code,
                      const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* End the call with st (code, reason and message). */
int rpc_stream_finish_status(struct rpc_stream *s, const struct rpc_status *st);
/* The message size limit the server runs with. */
size_t rpc_stream_max_message(const struct rpc_stream *st);

/* Block SIGINT, SIGTERM and SIGHUP (and ignore SIGPIPE) in the calling
 * thread; call before grpc_init() and before creating threads so every
 * thread inherits it. */
void rpc_signals_block(void);

/* What SIGHUP reloads (settings; certificates and token files alike): each
 * fn(arg) runs on the thread waiting in rpc_signals_wait, once per SIGHUP,
 * in the order registered, while the server keeps serving.  Register from
 * the main thread before waiting.  Returns 0, or -ENOSPC past
 * RPC_SIGHUP_HOOKS. */
#define RPC_SIGHUP_HOOKS 8
int rpc_signals_on_hup(void (*fn)(void *arg), void *arg);

/* Wait for SIGINT or SIGTERM and return its number, running the SIGHUP
 * hooks for every SIGHUP on the way (with none, SIGHUP is ignored). */
int rpc_signals_wait(void);

#endif
