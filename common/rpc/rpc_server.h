/* rpc_server: a small gRPC server over the gRPC C core.
 *
 * The server owns its completion queues and threads, all made at start: one
 * queue per event loop, read by that loop's thread alone (config loops),
 * and one or two queues shared by the worker threads (config threads).  On
 * the loops' queues it keeps requests posted for each method marked loop,
 * on the workers' queues for every other registered method, plus one
 * generic request so that a call to an unknown method is answered
 * UNIMPLEMENTED at once.
 *
 * Unary handlers run on the thread that read the request (a loop for the
 * methods marked loop, else a worker; with a request budget, a large
 * request to a loop's method runs on a thread of the server's own, see
 * "Request budget"): they get the request bytes and
 * fill a struct rpc_reply (response bytes or an error status), which the
 * server sends when the handler returns.  A handler that cannot answer yet
 * (a write that completes when its log record is durable) defers the reply
 * instead (rpc_reply_defer) and returns at once; any thread fills the reply
 * later and sends it with rpc_deferred_finish.
 *
 * Streaming handlers (client, server or bidirectional streams alike) run on
 * a pool of max_streams threads created when the server starts, one stream
 * per thread at a time, and drive the call with the blocking rpc_stream_*
 * functions.  No thread is created after start.  A stream handler may hand
 * answers to other threads, which send them with rpc_stream_post while the
 * handler goes on reading.  Handlers may block and run concurrently; they
 * must be thread-safe.  A stream method may instead be driven by its
 * messages (struct rpc_loop_stream): served on the event loops, with no
 * thread of its own.
 *
 * Methods are registered from protobuf-c service descriptors: the paths are
 * "/<service full name>/<method>", and the handler table marks streaming
 * methods by hand (descriptors carry no streaming flag).  A method with no
 * handler answers UNIMPLEMENTED.
 *
 * Every server serves grpc.health.v1.Health/Check from a small table set with
 * rpc_server_set_health().
 *
 * Memory: with a request budget (request_budget, see "Request budget"),
 * the server reads a unary call's message only when it has room for it,
 * counts every request it holds until the call ends and refuses what does
 * not fit with RESOURCE_EXHAUSTED; large requests to the loops' methods
 * are handled on one more thread of its own, started with the server.
 *
 * Listeners: a server listens on the address of its config and on every
 * address added with rpc_server_add_listener, each with its own
 * credentials (plaintext, or TLS asking clients for a certificate or
 * requiring one) and its own set of services (rpc_server_add_service_on;
 * Health is served on every listener).  Each listener is a grpc_server of
 * its own, sharing the server's completion queues, worker threads and
 * stream pool, so a second listener adds no thread.  A call to a service
 * that its listener does not serve is answered UNIMPLEMENTED, saying so.
 * No listener shares its port with another process (SO_REUSEPORT is off):
 * binding a port in use fails rpc_server_start, naming the address.
 *
 * With a tokens table (rpc_server_set_auth, rpc_auth.h) every call is
 * admitted or refused (UNAUTHENTICATED, PERMISSION_DENIED) by its method's
 * rule before any handler runs, and every message a stream reads is
 * checked again against the table in force.
 *
 * Metrics: every call of a registered method is counted once in the
 * process's registry (metrics_registry(), docs/METRICS.md) when its status
 * is sent: bloomgrid_rpc_calls_total{service,method,code} and
 * bloomgrid_rpc_duration_seconds{service,method} (from its arrival).  The
 * calls series of OK and of the server's own failures (UNKNOWN,
 * DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, INTERNAL, UNAVAILABLE, DATA_LOSS)
 * exist at 0 from the method's registration.
 *
 * Shutdown: rpc_server_shutdown() stops accepting calls, lets in-flight calls
 * (deferred ones included) finish for a grace period, cancels what is left
 * (open streams and deferred calls; clients see UNAVAILABLE or CANCELLED),
 * joins every thread.  rpc_signals_block() and rpc_signals_wait() implement
 * the SIGTERM/SIGINT handling around it, and run what each process
 * registered with rpc_signals_on_hup() on SIGHUP.
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
#include "rpc_tls.h"

#define RPC_DEFAULT_MAX_STREAMS 256
#define RPC_DEFAULT_MAX_DEFERRED 4096
#define RPC_DEFAULT_STREAM_QUEUE (4u << 20)

struct rpc_server_config {
    const char *listen;      /* "host:port"; port 0 picks a free one: the
                                first listener (RPC_LISTENER_MAIN) */
    struct rpc_tls *tls;     /* its TLS (rpc_tls.h, outlives the server);
                                NULL: plaintext */
    enum rpc_tls_peer peer;  /* with tls: what it asks of clients */
    int threads;             /* worker threads (completion queues), >= 1 */
    int loops;               /* event loops: completion queues with one
                                thread each, serving the methods marked
                                loop (and what the process puts on them,
                                rpc_server_loop_cq); 0: none, every method
                                on the worker threads */
    size_t max_message;      /* max message size, both directions (bytes) */
    int grace_ms;            /* how long shutdown lets calls finish */
    int max_streams;         /* open streaming calls at once: the size of
                                the stream thread pool created at start;
                                more get RESOURCE_EXHAUSTED, and so do
                                health Watch streams past a quarter of
                                it.  0: RPC_DEFAULT_MAX_STREAMS */
    int max_deferred;        /* unary calls deferred at once
                                (rpc_reply_defer); more get
                                RESOURCE_EXHAUSTED.
                                0: RPC_DEFAULT_MAX_DEFERRED */
    size_t stream_queue;     /* bytes a stream may have waiting behind the
                                message it is sending before its handler's
                                reads wait (rpc_stream_post).
                                0: RPC_DEFAULT_STREAM_QUEUE */
    int stream_idle_ms;      /* a stream of a method not marked internal
                                that neither receives a message nor gets
                                one sent for this long is ended with
                                RESOURCE_EXHAUSTED; 0: never */
    int internal_streams;    /* pool threads only streams of internal
                                methods may take (public ones get
                                RESOURCE_EXHAUSTED past max_streams minus
                                this); 0: none kept */
    int conn_idle_ms;        /* a connection with no call for this long is
                                closed (GOAWAY), and one that has not
                                finished its handshake within it; 0: gRPC's
                                defaults (none, 120 s) */
    size_t stream_window;    /* bytes a client may send on a call ahead of
                                what its handler has read (the HTTP/2
                                stream window, BDP probing off: never
                                grown).  0: gRPC's, grown by BDP probes to
                                tens of MiB a call on a fast link, held in
                                the server's memory while its handler
                                catches up.  With request_budget, its
                                RPC_BUDGET_PROBE instead */
    size_t request_budget;   /* bytes of requests the server holds at once
                                (see "Request budget"); 0: no bound */
    const char *budget_setting; /* the setting request_budget comes from,
                                named with its value in refusals
                                ("max_memory_mb"); NULL: "request_budget" */
};

/* The outcome of a unary call, filled by its handler (or, once deferred, by
 * whoever holds the struct rpc_deferred).  The filler either sets a body
 * (rpc_reply_pack / rpc_reply_alloc) and leaves st.code OK, or calls
 * rpc_reply_error / rpc_reply_fail.  The server owns and frees the body. */
struct rpc_reply {
    struct rpc_status st;        /* reason sent as "bloomgrid-reason" */
    grpc_slice body;
    bool has_body;
};

struct rpc_stream;
struct rpc_server;
struct rpc_deferred;

/* req/len: the request message bytes, valid during the call only. */
typedef void (*rpc_unary_fn)(void *arg, const uint8_t *req, size_t len,
                             struct rpc_reply *reply);
/* The handler reads and writes with rpc_stream_* and should end the call with
 * rpc_stream_finish; if it does not, the server finishes it with OK (once
 * every hold is released and every posted message sent, as the finish). */
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
    /* A method of cluster peers (long-lived streams such as the routers'
     * Batches): its streams may take the pool threads kept by
     * internal_streams and are not ended by stream_idle_ms. */
    bool internal;
    /* The handler never blocks (it answers at once or defers its reply):
     * served on the event loops when the server has them. */
    bool loop;
    /* A stream method served without a thread of its own (instead of
     * stream; see struct rpc_loop_stream). */
    const struct rpc_loop_stream *loop_stream;
};

/* Streams driven by their messages.  The server reads each message of the
 * stream on the event loop (or a worker, without loops) and hands it to
 * message(); the handler answers with rpc_stream_post, from that thread or
 * from a thread holding the stream (rpc_stream_hold), never blocking.  One
 * message() runs at a time, in order.  message() returns 0 to have the
 * next message read, 1 to have reading wait until rpc_stream_resume (a
 * handler's window of work in flight is full), or -1 with *end filled to
 * end the stream (nothing more is read).  Once reading is over (the client
 * half-closed, the call failed, or message() said -1) and every hold is
 * released and every posted message sent, end() runs once, on whichever
 * thread got there last: it frees the state and sets *end, which holds
 * message()'s status or OK (unless the call failed: failed true, the status
 * goes nowhere), and the server sends it.  Bounds as for other streams:
 * reading waits while more than stream_queue bytes wait to be sent; public
 * methods' streams end after stream_idle_ms with no message read or taken
 * by the client while waiting on it; each counts against max_streams. */
struct rpc_loop_stream {
    /* The stream began: the handler's state, or NULL (no memory: the call
     * ends RESOURCE_EXHAUSTED). */
    void *(*open)(void *arg, struct rpc_stream *st);
    int (*message)(void *state, const uint8_t *buf, size_t len,
                   struct rpc_status *end);
    void (*end)(void *state, bool failed, struct rpc_status *end);
};

/* Create a server (not yet listening).  NULL on bad config. */
struct rpc_server *rpc_server_create(const struct rpc_server_config *cfg);

/* Listeners, as bits of a mask: the config's listener is bit 0
 * (RPC_LISTENER_MAIN), rpc_server_add_listener returns the next ones. */
#define RPC_MAX_LISTENERS 4
#define RPC_LISTENER_MAIN 0
#define RPC_LISTENERS_ALL ((1u << RPC_MAX_LISTENERS) - 1)

struct rpc_listener {
    const char *listen;      /* "host:port"; port 0 picks a free one */
    struct rpc_tls *tls;     /* NULL: plaintext; outlives the server */
    enum rpc_tls_peer peer;  /* with tls: what it asks of clients */
};

/* Add a listener before rpc_server_start.  Returns its index (1 ..
 * RPC_MAX_LISTENERS - 1), or -ENOSPC, -EBUSY (started), -EINVAL (a bad
 * listener: no address, or tls without a certificate) or -ENOMEM. */
int rpc_server_add_listener(struct rpc_server *srv, const struct rpc_listener *l);

/* Register every method of a service on every listener.  handlers has
 * sd->n_methods entries.  arg is passed to every handler.  Must be called
 * before rpc_server_start. */
int rpc_server_add_service(struct rpc_server *srv,
                           const ProtobufCServiceDescriptor *sd,
                           const struct rpc_handler *handlers, void *arg);
/* The same, on the listeners of the mask (bit i: listener i) only. */
int rpc_server_add_service_on(struct rpc_server *srv,
                              const ProtobufCServiceDescriptor *sd,
                              const struct rpc_handler *handlers, void *arg,
                              unsigned listeners);

/* Bind every listener and start the workers.  Returns the port bound by
 * the main listener (> 0), or a negative errno (-EADDRINUSE when an
 * address cannot be bound, with the address logged); nothing listens
 * then. */
int rpc_server_start(struct rpc_server *srv);

/* Event loops.  Each loop is one completion queue read by one thread, so
 * that a call's request, the work it hands to others on the same queue
 * and its reply are all handled by one thread, with no hand-over between
 * threads.  A process may start its own operations on a loop's queue
 * (after rpc_server_create): their tag must begin with a struct
 * rpc_loop_tag, whose fn then runs on the loop's thread with the
 * operation's success.  fn must not block. */
struct rpc_loop_tag {
    int kind;                /* RPC_LOOP_TAG */
    void (*fn)(struct rpc_loop_tag *t, bool ok);
};
#define RPC_LOOP_TAG 0x6c6f6f70

/* Is the calling thread one of a server's loops?  (A handler there that
 * would block hands the work to other threads instead.) */
bool rpc_server_on_loop(void);
/* Number of loops (the config's loops). */
int rpc_server_loops(const struct rpc_server *srv);
/* Loop i's queue (0 <= i < rpc_server_loops), valid until the server's
 * shutdown; NULL for another i. */
grpc_completion_queue *rpc_server_loop_cq(struct rpc_server *srv, int i);
/* Run fn(arg) during rpc_server_shutdown once no call is left and before
 * the loops stop: where the process ends the operations it started on the
 * loops' queues (each must have completed when fn returns).  One hook. */
void rpc_server_on_drain(struct rpc_server *srv, void (*fn)(void *), void *arg);

/* The port listener i bound (after rpc_server_start), or -ENOENT. */
int rpc_server_port(const struct rpc_server *srv, int listener);

/* Health status of a service name ("" is the whole process).  Names never set
 * answer NOT_FOUND, except "" which starts as NOT_SERVING. */
void rpc_server_set_health(struct rpc_server *srv, const char *service,
                           bool serving);

/* Names not in that table (a router's one name per filter): fn(arg,
 * service) returns 1 SERVING, 0 NOT_SERVING or -1 unknown.  It runs on a
 * worker thread for each Check and every 200 ms of a Watch, with no lock
 * of the server held, and must not block.  Before rpc_server_start. */
typedef int (*rpc_health_fn)(void *arg, const char *service);
void rpc_server_set_health_fn(struct rpc_server *srv, rpc_health_fn fn, void *arg);

/* Ask every call for a token of the role its method needs (rpc_auth.h).
 * auth is borrowed and must outlive the server; NULL (the default): every
 * method is open.  Before rpc_server_start. */
struct rpc_auth;
void rpc_server_set_auth(struct rpc_server *srv, struct rpc_auth *auth);

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

/* Request budget.
 *
 * The gRPC core hands a unary request to the server whole, once it has
 * received all of it, and (in gRPC 1.51) checks max_message only after
 * that; so a server that lets the core read every call's message at once
 * holds every message clients are sending it, whatever their number.  With
 * request_budget set, the server reads a unary call's message only when it
 * has room for it, and counts what it holds:
 *
 *  - before its message is read, a call's client can send no more than
 *    RPC_BUDGET_PROBE bytes of it (the HTTP/2 stream window the server
 *    announces, with BDP probing off).  Reading begins with that much
 *    charged; a call that finds no room even for that is refused;
 *  - a read still running RPC_BUDGET_QUICK_MS later, while its queue had
 *    nothing else to deliver (so its message is still on its way: a small
 *    one has arrived by then), is a large message: it is given the room of
 *    a whole message (max_message), or refused when large requests already
 *    take their share of the budget, all of it but an eighth, which stays
 *    for small requests (whose reads and charges stay within
 *    RPC_BUDGET_PROBE bytes), so that large ones cannot starve them;
 *  - a message received counts its bytes, instead of the room it had,
 *    until its call ends (its reply has been sent).  A handler may keep
 *    using the request until then, deferred or not (rpc_reply_defer);
 *  - what a handler builds from a request it charges before it builds it
 *    (rpc_reply_charge; rpc_server_charge for streams and the rest), and
 *    the charge of a large request fails past the large share;
 *  - a request of RPC_BUDGET_HEAVY bytes or more to a method served on the
 *    loops is handled on a thread of the server's own instead (copying,
 *    decoding and hashing megabytes takes milliseconds), so that the loops
 *    go on serving small calls meanwhile.
 *
 * Every refusal is RESOURCE_EXHAUSTED with a message naming
 * budget_setting and its value.  A stream's message counts from the moment
 * the server has it until its handler is done with it (its next read, the
 * end of message()); a stream waits for its next message with a read
 * posted, so what streams may be receiving at once is bounded by
 * max_streams times the size of a message rather than by the budget.
 * Without request_budget nothing is counted, every charge succeeds, and
 * unary requests are read whole before the handler is called, as the
 * core does. */
#define RPC_BUDGET_PROBE (64u << 10)
#define RPC_BUDGET_QUICK_MS 20
#define RPC_BUDGET_HEAVY (1u << 20)

/* Charge bytes to the unary call whose handler runs on this thread (r is
 * its own reply), before building that much from its request; released
 * when the call ends.  Returns 0, or -ENOSPC with r set to the refusal
 * (RESOURCE_EXHAUSTED naming the budget): the handler just returns. */
int rpc_reply_charge(struct rpc_reply *r, size_t bytes);
/* Charge bytes to the server's budget (any thread); the caller gives them
 * back with rpc_server_uncharge.  A charge of more than RPC_BUDGET_PROBE
 * bytes counts as large.  Returns 0, or -ENOSPC with st set to the refusal
 * (RESOURCE_EXHAUSTED naming the budget; st may be NULL). */
int rpc_server_charge(struct rpc_server *srv, size_t bytes, struct rpc_status *st);
void rpc_server_uncharge(struct rpc_server *srv, size_t bytes);
/* The bytes charged now and the budget (0: none). */
void rpc_server_budget(struct rpc_server *srv, uint64_t *used, uint64_t *max);

/* Deferred unary replies.
 *
 * Inside a unary handler, rpc_reply_defer(r) on the handler's own reply
 * tells the server not to answer when the handler returns: the call stays
 * open and the returned handle now owns it.  The handler copies from req
 * what it still needs (req is freed when it returns, except on a server
 * with a request budget, where it stays valid until the finish), hands the
 * handle on and returns.  Later, from any thread, the holder fills the reply
 * (rpc_deferred_reply; r itself stays valid until the finish too) with the
 * rpc_reply_* helpers and calls rpc_deferred_finish exactly once, which
 * sends it (status, reason and body as for an immediate reply) and frees
 * the handle.  Only the holder may touch the reply meanwhile.
 *
 * Shutdown: a call still deferred after the grace period is cancelled (its
 * client sees UNAVAILABLE or CANCELLED); the handle stays valid, and its
 * finish, even after rpc_server_destroy, sends nothing, returns -ECANCELED
 * and frees it.  So a holder always finishes, and nothing else frees a
 * handle.  At most max_deferred calls of a server are deferred at once. */

/* Defer r, the reply of the unary call whose handler is running on this
 * thread, from the handler, before it returns; at most once (a second call
 * returns NULL and leaves r to the first handle).  Returns the handle, or
 * NULL when the call cannot be deferred; r then holds the error to send
 * and the handler just returns: RESOURCE_EXHAUSTED when
 * max_deferred calls are deferred already, UNAVAILABLE while the server
 * shuts down, INTERNAL when r is not the running unary handler's own reply
 * (a stream handler's local reply, a copy). */
struct rpc_deferred *rpc_reply_defer(struct rpc_reply *r);
/* The reply to fill before rpc_deferred_finish. */
struct rpc_reply *rpc_deferred_reply(struct rpc_deferred *d);
/* Send the reply and free d (any thread, exactly once).  Returns 0 when the
 * reply was handed to gRPC, -ECANCELED when the call was cancelled at
 * shutdown (nothing sent). */
int rpc_deferred_finish(struct rpc_deferred *d);

/* Streaming calls.  Every function below is for the handler's own thread,
 * except rpc_stream_post, rpc_stream_hold, rpc_stream_release and
 * rpc_stream_resume (see there).  A stream driven by its messages (struct
 * rpc_loop_stream) has no handler thread: it uses only those four and
 * rpc_stream_max_message. */

/* Read the next message.  Returns 1 with *buf and *len set (valid until the next
 * read or the end of the handler), 0 when the client half-closed, -ECANCELED
 * when the call failed or was cancelled (or sat idle past stream_idle_ms:
 * the client then gets RESOURCE_EXHAUSTED), -EINVAL when the message broke the
 * string rule (see struct rpc_handler; the call ends INVALID_ARGUMENT),
 * -EACCES when the stream's token no longer has the role its method needs
 * (removed from the tokens file at a reload: the call ends UNAUTHENTICATED
 * or PERMISSION_DENIED whatever the handler finishes it with).
 * Waits first while more than stream_queue posted bytes wait behind the
 * message being sent (see rpc_stream_post). */
int rpc_stream_read(struct rpc_stream *st, const uint8_t **buf, size_t *len);
/* Send one message (after any posted before it) and wait until it is sent.
 * Returns 0 or -ECANCELED (call gone) / -ENOMEM, or -EACCES when the
 * caller's token no longer admits the call (revoked at a reload: nothing
 * is sent and the call ends UNAUTHENTICATED or PERMISSION_DENIED, as for
 * rpc_stream_read).  The same holds for rpc_stream_write_slice and
 * rpc_stream_send. */
int rpc_stream_write(struct rpc_stream *st, const ProtobufCMessage *msg);
/* Send one message already encoded; takes over the slice reference. */
int rpc_stream_write_slice(struct rpc_stream *st, grpc_slice body);
/* Start sending one encoded message and return at once, so the handler can
 * read the next request meanwhile; the next send, write or finish waits for
 * it (and for anything posted before it).  Takes over the slice reference.
 * Returns 0 or -ECANCELED (this or an earlier send failed). */
int rpc_stream_send(struct rpc_stream *st, grpc_slice body);
/* End the call with a status, after every message posted so far has been
 * sent and every hold released (rpc_stream_drain).  Returns 0 or
 * -ECANCELED. */
int rpc_stream_finish(struct rpc_stream *st, grpc_status_code code,
                      const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* End the call with st (code, reason and message), as rpc_stream_finish. */
int rpc_stream_finish_status(struct rpc_stream *s, const struct rpc_status *st);

/* Answers sent from other threads.
 *
 * rpc_stream_post queues one encoded message and returns at once; the
 * messages go out one at a time in the order posted, whatever thread
 * posted them, interleaved with the handler's own writes.  A thread other
 * than the handler's may post only while it holds the stream: the handler
 * takes a hold (rpc_stream_hold) before handing the stream on, and the
 * holder releases it (rpc_stream_release) after its last post.  The stream
 * stays valid while any hold is outstanding: the handler's finish, and the
 * server's end of the call when the handler returns, wait for every hold to
 * be released and every posted message to be sent.  So every hold must be
 * released, also when the work fails or the call has gone.
 *
 * Posting never blocks and never fails for lack of room, so that a thread
 * posting for many streams (a commit loop) is never held up by one slow
 * client.  The bound is on reading instead: while more than stream_queue
 * bytes wait behind the message being sent, rpc_stream_read waits (sending
 * the queue meanwhile) before it reads the next request.  A stream thus
 * holds at most stream_queue bytes, the message in flight and the answers
 * of the requests it has already accepted.  The queue moves while the
 * handler waits in rpc_stream_read, a write, rpc_stream_drain or the
 * finish: a handler that posts from other threads should spend its time
 * there, not blocked elsewhere, or later messages wait for it (a message
 * that finds nothing in flight is sent at once, by its poster). */

/* Queue body (takes over the slice reference).  The handler's thread, or a
 * thread holding the stream.  Returns 0, or -ECANCELED when the call has
 * failed or been finished (body released, nothing sent) or -ENOMEM. */
int rpc_stream_post(struct rpc_stream *st, grpc_slice body);
/* Take a hold on the stream for a thread that will post to it (see above).
 * Handler's thread, or a holder.  Returns 0, or -ECANCELED after the
 * finish. */
int rpc_stream_hold(struct rpc_stream *st);
/* Give a hold back (any thread, once per hold).  The releasing thread must
 * not touch the stream afterwards: the call may end at once. */
void rpc_stream_release(struct rpc_stream *st);
/* Wait until no hold is outstanding and every posted message has been sent.
 * Returns 0, or -ECANCELED when the call failed (queued messages dropped). */
int rpc_stream_drain(struct rpc_stream *st);
/* A stream of a struct rpc_loop_stream whose message() returned 1: read
 * again.  Any thread, exactly once for each 1 returned; a resume that comes
 * before the pause it ends (the window emptied while message() was still
 * returning) still counts.  A stream paused and never resumed is never
 * read again, not even for its end, so a handler pauses only while work of
 * its own is in flight (its holds). */
void rpc_stream_resume(struct rpc_stream *st);
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

/* What SIGUSR1 does (one fn; NULL: SIGUSR1 is not waited for).  The
 * caller blocks SIGUSR1 itself before creating threads (only a process that
 * uses it does).  Register from the main thread before waiting. */
void rpc_signals_on_usr1(void (*fn)(void *arg), void *arg);

/* Wait for SIGINT or SIGTERM and return its number, running the SIGHUP
 * hooks for every SIGHUP on the way (with none, SIGHUP is ignored) and the
 * SIGUSR1 one for every SIGUSR1.  Tells the service manager (svc_notify.h)
 * RELOADING/READY around the SIGHUP hooks and STOPPING before it returns. */
int rpc_signals_wait(void);

#endif
