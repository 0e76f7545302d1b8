/* rpc_server_internal: the server's private types, shared by rpc_server.c
 * (calls, workers, the stream pool, shutdown), rpc_deferred.c (deferred
 * unary replies), rpc_stream.c (streaming calls) and rpc_health.c
 * (grpc.health.v1.Health).  Not for use outside common/rpc_*.c.
 */
#ifndef BLOOMGRID_RPC_SERVER_INTERNAL_H
#define BLOOMGRID_RPC_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "rpc_auth.h"
#include "rpc_server.h"

#define HEALTH_MAX 16

struct rpc_method {
    char *path;
    unsigned listeners;    /* the listeners that serve it (bit i: i) */
    void *handle[RPC_MAX_LISTENERS];  /* grpc_server_register_method */
    rpc_unary_fn unary;
    rpc_stream_fn stream;
    const struct rpc_loop_stream *lstream;
    void *arg;
    const ProtobufCMessageDescriptor *input;  /* NULL: the handler checks */
    bool internal;         /* struct rpc_handler.internal */
    bool loop;             /* struct rpc_handler.loop */
    bool watch;            /* grpc.health.v1.Health/Watch (its own share) */
    enum rpc_auth_rule rule;                  /* who may call it */
    /* bloomgrid_rpc_calls_total per status code (OK made at registration,
     * the others at their first call) and bloomgrid_rpc_duration_seconds. */
    char *service, *name;                     /* the labels */
    struct metric *_Atomic calls[GRPC_STATUS_UNAUTHENTICATED + 1];
    struct metric *duration;
};

enum slot_kind { SLOT_UNARY, SLOT_STREAM, SLOT_GENERIC };
/* SLOT_READING: a unary call of a server with a request budget, whose
 * message is being received (rpc_server_budget.c). */
enum slot_state { SLOT_REQUESTED, SLOT_READING, SLOT_REPLYING };

struct worker_cq {
    grpc_completion_queue *cq;
    /* Request budget: the unary messages being received on this queue,
     * oldest first (under srv->budget_lock), when they were last looked at
     * (rpc_server__budget_sweep), and the time its threads have spent
     * waiting in grpc_completion_queue_next, where the transport reads. */
    struct slot *reads_head, *reads_tail;
    _Atomic int nreads;
    int64_t swept_ns;
    _Atomic int64_t poll_ns;
};

/* A message posted to a stream and not yet sent (rpc_stream_post). */
struct out_msg {
    struct out_msg *next;
    grpc_slice body;
};

/* The deferred unary calls of one server (rpc_reply_defer).  Kept apart from
 * struct rpc_server and reference counted (the server and each deferred
 * call hold one reference), so that a finish after the server is gone still
 * finds its lock.  lock guards every field here and the defer fields of the
 * slots on the list. */
struct defer_book {
    pthread_mutex_t lock;
    int refs;
    int count, max;              /* deferred calls on the list, bound */
    bool closed;                 /* shutdown: no more deferrals */
    struct slot *head;           /* deferred, not yet finished */
};

/* One posted request and, once it arrives, the call. */
struct slot {
    enum slot_kind kind;
    enum slot_state state;
    struct rpc_server *srv;
    struct rpc_method *m;        /* NULL for generic */
    int li;                      /* listener the request is posted on */
    int cqi;                     /* notification queue index */
    grpc_call *call;
    gpr_timespec deadline;
    struct timespec t0;          /* when the call arrived (metrics) */
    grpc_metadata_array md;
    grpc_byte_buffer *payload;   /* unary request */
    grpc_call_details details;   /* generic */
    struct rpc_reply reply;
    grpc_slice status_details;
    bool has_status_details;
    grpc_metadata reason_md;     /* trailing "bloomgrid-reason" */
    grpc_byte_buffer *send_buf;
    int cancelled;
    /* unary, deferred (under book->lock) */
    struct defer_book *book;     /* set once deferred */
    struct slot *dprev, *dnext;  /* on book->head's list */
    bool orphaned;               /* cancelled at shutdown, call released:
                                    the finish only frees the slot */
    /* streaming only */
    struct slot *job_next;       /* waiting for a pool thread */
    grpc_completion_queue *cq;   /* bound to the call */
    bool md_sent, finished;
    grpc_slice cur;              /* last message read */
    bool has_cur;
    /* A RECV_CLOSE_ON_SERVER posted early (health Watch) to learn when the
     * client goes away; its completion has the tag &close_tag. */
    bool close_posted, close_done;
    char close_tag;
    /* Outgoing messages (rpc_stream_post and the handler's writes): one
     * send batch in flight (write_tag) and the rest queued behind it.
     * lock guards these, close_done and every grpc_call_start_batch on the
     * call; only the handler's thread waits on cq.  Invariant: a queued
     * message implies a send in flight. */
    pthread_mutex_t lock;
    pthread_cond_t cond;         /* holds released, a send started */
    bool sync_init;
    char write_tag;
    bool write_pending;
    bool dead;                   /* a send or read failed: drop, refuse */
    bool closed;                 /* finish began: posts refused */
    grpc_byte_buffer *write_buf;
    size_t write_len;
    struct out_msg *out_head, *out_tail;
    size_t out_bytes;            /* queued + in flight */
    uint64_t post_seq;           /* messages accepted so far */
    uint64_t sent_seq;           /* of those, sent or dropped */
    int holds;                   /* rpc_stream_hold */
    /* No message for stream_idle_ms: the call was cancelled with a status
     * saying so. */
    bool idled;
    /* A message broke the string rule, or the stream's token lost its
     * role: the status the call ends with. */
    bool bad_request;
    grpc_status_code bad_code;
    char bad_msg[RPC_MSGLEN];
    /* The caller as admitted (a tokens table is set), re-checked on each
     * message a stream reads. */
    struct rpc_auth_who who;
    /* Streams driven by their messages (struct rpc_loop_stream): the call
     * is bound to the notification queue and its batches carry loop tags;
     * lock guards these as the send queue. */
    bool lmode;
    bool counted;                /* in streams_alive (and streams_active) */
    bool ending;                 /* its status started: out of streams_active */
    void *lstate;
    struct rpc_loop_tag recv_lt, send_lt, fin_lt;
    grpc_byte_buffer *lrecv;
    bool reading;                /* a receive in flight */
    bool in_message;             /* message() running */
    bool read_over;              /* no more reads: half-close, failure, end */
    bool call_failed;
    bool paused;                 /* message() said 1, no resume yet */
    int resumes;                 /* resumes that came before their pause */
    bool fin_started;
    struct rpc_status lend;      /* message()'s -1 */
    bool lend_set;
    int64_t active_ns;           /* last message read or send completed */
    struct slot *lprev, *lnext;  /* srv->lstreams */
    /* Request budget (rpc_server_budget.c), under srv->budget_lock: the
     * bytes this call holds of it (a message being received, or received
     * with what its handler charged), and for a unary message being
     * received, when its read began, its place on its queue's list,
     * whether it holds a large read's room and whether it was refused. */
    uint64_t charge;
    int64_t read_ns, read_poll_ns;
    struct slot *rprev, *rnext;     /* also the heavy thread's queue */
    bool read_large, read_refused;
    grpc_slice req;              /* a unary request kept until the reply */
    bool has_req;
};

struct health_entry {
    char name[128];
    bool serving;
};

/* One address the server listens on: a grpc_server of its own. */
struct listener {
    char *addr;
    struct rpc_tls *tls;
    enum rpc_tls_peer peer;
    grpc_server *server;
    int port;
};

#define SERVER_ARGS 10

struct rpc_server {
    struct rpc_server_config cfg;
    grpc_arg args[SERVER_ARGS];  /* every listener's channel args */
    grpc_channel_args cargs;
    struct listener listeners[RPC_MAX_LISTENERS];
    int nlisteners;
    int ncq;                     /* loops first, then the workers' */
    struct worker_cq *cqs;
    int nloops;                  /* cqs[0, nloops): one thread each */
    int nthreads;                /* loops + workers */
    void (*drain_fn)(void *);    /* rpc_server_on_drain */
    void *drain_arg;
    pthread_t *threads;
    struct rpc_method **methods;
    size_t nmethods;
    atomic_bool stopping;
    bool started, shut;
    pthread_mutex_t lock;        /* the streams' counts, the pool, health */
    pthread_cond_t cond;         /* broadcast when a stream ends */
    pthread_cond_t health_cond;  /* broadcast on every health change */
    /* Streams against max_streams: queued for the pool or running, until
     * their status is started (a client may open its next stream as soon
     * as it has the last one's end, before that one's thread is back). */
    int streams_active;
    int streams_public;          /* of those, of methods not internal */
    int streams_watch;           /* of those, health Watch streams */
    int streams_alive;           /* counted, until their slot is given back */
    /* Stream thread pool, created at start: streams wait on job_cond. */
    pthread_t *pool;
    int npool;
    struct slot *jobs_head, *jobs_tail;
    bool pool_quit;
    pthread_cond_t job_cond;
    struct defer_book *book;
    struct health_entry health[HEALTH_MAX];
    int nhealth;
    rpc_health_fn health_fn;     /* names not in the table; NULL: none */
    void *health_arg;
    struct rpc_auth *auth;       /* NULL: every method open */
    /* Streams driven by their messages, for the idle sweep (under lock). */
    struct slot *lstreams;
    _Atomic int64_t swept_ns;
    /* Request budget (cfg.request_budget; rpc_server_budget.c): the bytes
     * charged, and the part of the budget large requests may take. */
    pthread_mutex_t budget_lock;
    uint64_t budget_used;
    uint64_t budget_large;
    /* Large unary requests of the loops' methods, run on a thread of
     * their own (under budget_lock). */
    struct slot *heavy_head, *heavy_tail;
    pthread_cond_t heavy_cond;
    pthread_t heavy_thread;
    bool heavy_started, heavy_quit;
};

static inline gpr_timespec rpc_server__inf_future(void)
{
    return gpr_inf_future(GPR_CLOCK_REALTIME);
}

/* rpc_server.c: free a slot and everything it holds (its call too); send a
 * unary or generic reply (on failure the slot is freed, -ECANCELED). */
void rpc_server__slot_free(struct slot *s);
int rpc_server__send_reply(struct slot *s);

/* rpc_server.c: the status ops of a call at ops[0] and ops[1] (the send
 * of code, reason and msg, whose details and trailing metadata the slot
 * keeps until the batch completes, and the receive of the close); returns
 * 2. */
size_t rpc_server__status_ops(struct slot *s, grpc_op *ops, grpc_status_code code,
                              enum rpc_reason reason, const char *msg);

/* rpc_server.c: count a call of a registered method as answered with
 * code (unary, deferred or not, and streams; once per call). */
void rpc_server__call_done(struct slot *s, grpc_status_code code);

/* rpc_deferred.c.  The unary call whose handler runs on this thread (set by
 * the worker around the handler), for rpc_reply_defer. */
struct rpc_unary_run {
    struct slot *s;
    bool deferred;               /* the handler deferred: hands off */
};
extern _Thread_local struct rpc_unary_run *rpc_server__current_run;
/* A book with one reference (the server's) and room for max deferrals. */
struct defer_book *rpc_server__book_create(int max);
/* Drop one reference; b->lock held, released here (the last frees b). */
void rpc_server__book_unref_unlock(struct defer_book *b);
/* Shutdown: refuse new deferrals and release the call of every slot still
 * deferred (already cancelled), so that the server can finish shutting
 * down; the slots stay with their holders, whose finish frees them. */
void rpc_server__book_close(struct defer_book *b);

/* rpc_health.c: the Health service's handlers. */
void rpc_server__health_check(void *arg, const uint8_t *req, size_t len,
                              struct rpc_reply *reply);
void rpc_server__health_watch(void *arg, struct rpc_stream *st);

/* rpc_stream.c: streams driven by their messages.  Begin one that has
 * been admitted and counted (the server's accounting is undone, and the
 * slot freed, when its status has gone); refuse one with a status (slot
 * freed once sent); end those idle past stream_idle_ms (every few hundred
 * ms, from the loops and workers). */
void rpc_server__lstream_begin(struct slot *s);
void rpc_server__lstream_refuse(struct slot *s, const struct rpc_status *st);
void rpc_server__lstream_sweep(struct rpc_server *srv);
/* rpc_server.c: a counted stream's status is about to be started (it
 * leaves streams_active and the rest; no-op for a stream not counted or
 * already ending); a counted stream has ended (streams_alive, and the
 * rest if it was not ending). */
void rpc_server__stream_ending(struct slot *s);
void rpc_server__stream_uncount(struct slot *s);

/* rpc_server_budget.c: the request budget (see rpc_server.h).
 * budget_init sets it up (after srv->cfg is filled).  read_start begins
 * receiving a unary call's message, or refuses the call when the budget
 * has no room even to begin (the reply is sent); read_done accounts for
 * the receive's completion and returns whether the handler may run (else
 * the slot is the caller's to free).  sweep, from a queue's thread after
 * each wait for an event (which took poll_ns), gives reads that are
 * taking long the room of a large message or refuses them; wait_ms is how
 * long that thread may wait for its next event.  stream_add and stream_sub
 * count a stream's message while the server holds it; drop gives back
 * what a slot holds (a slot freed, or orphaned at shutdown). */
void rpc_server__budget_init(struct rpc_server *srv);
void rpc_server__budget_deinit(struct rpc_server *srv);
bool rpc_server__budget_gated(const struct rpc_server *srv, const struct rpc_method *m);
void rpc_server__read_start(struct slot *s);
bool rpc_server__read_done(struct slot *s, bool ok);
void rpc_server__budget_sweep(struct rpc_server *srv, int cqi, int64_t poll_ns);
int rpc_server__budget_wait_ms(const struct rpc_server *srv, int cqi);
void rpc_server__budget_stream_add(struct slot *s, size_t len);
void rpc_server__budget_stream_sub(struct slot *s);
void rpc_server__budget_drop(struct slot *s);
/* A request message of len bytes, received in the transport's many small
 * buffers, was copied whole and its buffers freed: give the memory they
 * took back to the system when it was large (with a request budget). */
void rpc_server__budget_trim(const struct rpc_server *srv, size_t len);
/* heavy_start starts the thread that runs large requests of the loops'
 * methods (rpc_server_start); heavy takes a slot whose message has arrived
 * when it is one (true: the thread runs it); heavy_stop runs what is left
 * and joins the thread (shutdown, once every call has ended). */
void rpc_server__budget_heavy_start(struct rpc_server *srv);
bool rpc_server__budget_heavy(struct slot *s);
void rpc_server__budget_heavy_stop(struct rpc_server *srv);

/* rpc_server.c: run a unary handler on the request in s->payload and send
 * its reply (unless deferred). */
void rpc_server__unary_run(struct slot *s);

/* rpc_stream.c: set up and tear down a stream slot's send queue. */
void rpc_server__stream_init(struct slot *s);
void rpc_server__stream_deinit(struct slot *s);
/* Wait up to deadline for one completion on the stream's queue and account
 * for it unless it is the handler's own batch (tag s): a send's completion
 * starts the next queued message, the early RECV_CLOSE_ON_SERVER sets
 * close_done.  Returns the event.  Handler's thread only. */
grpc_event rpc_server__stream_next(struct slot *s, gpr_timespec deadline);
/* Start a batch on the stream's call under its lock. */
grpc_call_error rpc_server__stream_start(struct slot *s, const grpc_op *ops,
                                         size_t n, void *tag);

#endif
