/* resp_internal: what the files of the RESP library share: the server and
 * connection structs, the reply slots, the command table entry.  Not for
 * use outside common/resp/.
 *
 * Files: resp_server.c (the loop, listener, connections, I/O, TLS,
 * budgets, idle), resp_cmd.c (the command table, dispatch, the commands
 * of the connection: PING ... MULTI/EXEC), resp_bf.c (the BF.* commands:
 * arguments, calls to the backend, reply shapes).  Everything here runs on
 * the loop thread unless it says otherwise.
 */
#ifndef BLOOMGRID_RESP_INTERNAL_H
#define BLOOMGRID_RESP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <openssl/ssl.h>
#include <uv.h>

#include "metrics.h"
#include "resp_proto.h"
#include "resp_server.h"

struct resp_conn;

/* The arguments of one command: pointers into the connection's input (or
 * a MULTI queue entry), valid while the command is dispatched. */
struct resp_args {
    size_t argc;
    const char **argv;
    const size_t *argl;
};

/* Command flags. */
enum {
    RESP_CMD_NOAUTH = 1u << 0,  /* allowed before AUTH */
    RESP_CMD_WRITE = 1u << 1,   /* changes a filter (COMMAND flags) */
    RESP_CMD_READONLY = 1u << 2,
    RESP_CMD_FILTER = 1u << 3,  /* argv[1] names a filter */
    RESP_CMD_NOQUEUE = 1u << 4, /* runs at once inside MULTI */
    RESP_CMD_FAST = 1u << 5,
    RESP_CMD_CALL = 1u << 6,   /* a backend call: counted when it ends */
};

/* One entry of the command table (resp_cmd.c; BF.* in resp_bf.c): a new
 * family (CF.*) is a new block of entries and handlers. */
struct resp_command {
    const char *name;            /* lower case */
    int arity;                   /* > 0: exactly; < 0: at least -arity */
    unsigned flags;
    enum resp_role role;         /* the least role that may run it */
    void (*run)(struct resp_conn *c, const struct resp_args *a);
    const char *group;           /* COMMAND DOCS */
    const char *summary;
    const char *syntax;          /* the arguments after the name */
    /* filled at start */
    struct metric *m_calls, *m_errors, *m_time;
};

extern struct resp_command resp_commands[];
extern const size_t resp_commands_count;
extern struct resp_command resp_bf_commands[];
extern const size_t resp_bf_commands_count;

/* A reply that waits for its turn: every command made while an earlier
 * one of the connection is unanswered gets one. */
struct resp_slot {
    struct resp_slot *next;
    struct resp_buf buf;
    bool ready;
    size_t charge;               /* bytes counted against pipeline_bytes */
};

/* A write or catalog command of the connection in flight on a filter. */
struct resp_flight {
    char filter[160];
    unsigned adds, catalog, reads;
};

/* A BF.* call with the library's part around the backend's. */
struct resp_call_box {
    struct resp_call call;       /* first: the backend's pointer */
    struct resp_conn *conn;
    struct resp_slot *slot;
    struct resp_server *srv;
    const struct resp_command *cmd;
    unsigned shape;              /* how the reply is shaped (resp_bf.c) */
    int info_field;              /* BF.INFO's one field, or -1 */
    uint64_t t0_ns;
    size_t flight;               /* index + 1 into conn->flights, or 0 */
    int fkind;                   /* 0 add, 1 read, 2 catalog */
    size_t charge;
    void (*work)(struct resp_call *c);
    uv_work_t wreq;
    atomic_int work_state;       /* 0, 1 in the pool, 2 done there */
    struct resp_call_box *qnext; /* the done queue; the box cache */
    void *keep;                  /* kept keys */
    bool small;                  /* room for RESP_BOX_KEYS keys: cached */
    bool in_start;               /* bf() has not returned yet */
    bool finished;               /* ... and it finished the call */
    /* resp_call_offload_bounded: on the server's list until claimed,
     * done, or answered by the bound (work_state 3) */
    bool bounded;
    uint64_t deadline_ms;
    const char *what;
    struct resp_call_box *bprev, *bnext;
};

/* Boxes of calls of up to this many keys are kept for reuse (loop thread),
 * at most RESP_BOX_CACHE of them. */
#define RESP_BOX_KEYS 8
#define RESP_BOX_CACHE 1024

#define RESP_QUEUE_MAX 100000    /* commands in one MULTI */

/* Calls finished together on another thread are answered in place only
 * when they are of at most this many connections (counted as runs of one
 * connection's calls in the list). */
#define RESP_IN_PLACE_CONNS 4

struct resp_queued {
    size_t argc;
    size_t *len;
    char **argv;                 /* one block */
};

struct resp_conn {
    uv_tcp_t tcp;                /* first: handle->data is the conn */
    struct resp_server *srv;
    struct resp_conn *prev, *next;
    uint64_t id;
    int fd;                      /* the socket's, -1: none known */
    char addr[64];
    /* input: in[start, len) not yet dispatched */
    char *in;
    size_t in_start, in_len, in_cap;
    struct resp_parser parser;
    bool parsed;                 /* parser holds a DONE command at in_start */
    uint64_t t0_ns;              /* when process() began on the input: where
                                    the time of its commands starts (one
                                    clock read for all of them) */
    /* output */
    struct resp_buf out;         /* ready, not handed to the socket */
    struct resp_buf wbuf;        /* handed to uv_write */
    uv_write_t wreq;
    bool writing;
    struct resp_slot *head, *tail;
    size_t pending;              /* bytes counted against pipeline_bytes */
    unsigned inflight;           /* calls not done */
    struct resp_flight *flights;
    size_t nflights, flights_cap;
    bool reading, closing, closed, blocked, paused, dirty;
    struct resp_conn *dnext;     /* the dirty list */
    uint64_t last_ms;
    uint64_t await_gen;          /* answered by that pass end (resp_server) */
    /* session */
    int proto;                   /* 2 or 3 */
    bool authed;
    struct resp_who who;
    char name[128];
    char lib_name[64], lib_ver[32];
    unsigned db;
    /* MULTI */
    bool multi, multi_dirty, exec_running;
    struct resp_queued *queue;
    size_t nqueue, queue_cap, qbytes, exec_next;
    /* the command being dispatched, and its error for the metrics */
    const struct resp_command *cur;
    bool cmd_error;
    /* TLS */
    SSL *ssl;
    BIO *rbio, *wbio;
};

struct resp_server {
    struct resp_server_config cfg;
    char listen[256], prog[64], version[64];
    struct resp_backend be;
    struct resp_limits lim;
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t wake;             /* done calls and stop */
    uv_timer_t idle;
    uv_prepare_t pass;           /* be.pass_end, before every poll */
    uv_idle_t drain;             /* be.pass_drain, be.pass_wait_ns: active,
                                    the poll does not wait */
    unsigned drains;             /* passes drained since the last pass end */
    uint64_t drain_mark;         /* dispatched when the last pass ended */
    /* be.pass_wait_ns: the connections answered by the last pass end that
     * answered calls (those with await_gen == answer_gen) and have not
     * dispatched a command since: awaited of them, until wait_until_ns */
    bool answering;              /* in be.pass_end */
    bool answer_fresh;           /* no call answered yet in this pass end */
    uint64_t answer_gen;
    unsigned awaited;
    uint64_t wait_until_ns;
    bool wait_idle;              /* drain started by such a wait */
    uv_timer_t slow_timer;       /* bounds of offloaded calls, while any */
    struct resp_call_box *bounded;   /* bounded calls in the pool */
    pthread_t thread;
    bool started, running;
    atomic_bool stopping;
    atomic_int port;
    struct resp_conn *conns;     /* list */
    atomic_uint nconns;
    uint64_t next_id;
    unsigned calls;              /* in flight, server-wide */
    uint64_t dispatched;         /* commands dispatched (loop thread) */
    struct resp_call_box *box_cache; /* free small boxes (loop thread) */
    unsigned nbox_cache;
    struct resp_conn *dirty;     /* connections with output to flush */
    /* calls finished on other threads */
    pthread_mutex_t qmu;
    struct resp_call_box *qhead, *qtail;
    /* The loop's state (connections, boxes, dirty list, counts): held by
     * the loop thread whenever it runs a callback, let go just before it
     * polls (resp__loop_leave); taken with a try-lock by a thread that
     * answers calls in place (be.answer_in_place), which sets in_place
     * while it holds it. */
    pthread_mutex_t loop_mu;
    bool loop_owned;             /* the loop thread holds loop_mu */
    bool in_place;               /* another thread holds it, answering */
    uint64_t finish_ns;          /* with the loop's state: when the calls
                                    being finished came back (one clock
                                    read for a list of them); 0: none */
    /* the arguments of the command being dispatched (loop thread) */
    const char **argv;
    size_t *argl, acap;
    /* TLS */
    pthread_mutex_t tls_mu;
    SSL_CTX *ssl_ctx;
    /* metrics */
    struct metric *m_conns, *m_conns_total, *m_rejected, *m_unknown, *m_proto_err;
    struct metric *m_answered_loop, *m_answered_in_place;
    uint64_t started_s;
};

/* ---- resp_server.c ---- */
uint64_t resp__now_ms(void);
uint64_t resp__now_ns(void);
/* Where the reply of the command being dispatched goes: conn->out when no
 * earlier reply is waiting, else a new ready slot.  NULL when out of
 * memory (the connection is closing). */
struct resp_buf *resp__reply_buf(struct resp_conn *c);
/* A slot (not ready) for a reply that comes later; NULL out of memory. */
struct resp_slot *resp__slot_new(struct resp_conn *c);
/* The slot is ready: move every ready reply at the head to the output. */
void resp__slot_ready(struct resp_conn *c, struct resp_slot *s);
/* Write every connection's new output (end of a loop callback). */
void resp__flush_dirty(struct resp_server *s);
/* Flush the connection's output at the end of this loop pass. */
void resp__mark_dirty(struct resp_conn *c);
/* Close after what is queued has been written (QUIT, a protocol error). */
void resp__close_after_reply(struct resp_conn *c);
/* Go on with the connection's input (after a blocked command may run). */
void resp__resume(struct resp_conn *c);
/* A call of c was answered (loop thread): awaited when in a pass end. */
void resp__answered(struct resp_conn *c);
/* A call's connection let go of one reference (a call finished). */
void resp__conn_release(struct resp_conn *c);
/* From any thread: queue the finished calls head .. tail (linked by
 * qnext) for the loop, one wake. */
void resp__call_post_list(struct resp_server *s, struct resp_call_box *head,
                          struct resp_call_box *tail);
/* The server's count of calls in flight changed (stop waits for 0). */
void resp__calls_changed(struct resp_server *s);
/* The loop thread takes its state (first thing of every loop callback;
 * nothing when it holds it already) and lets it go before it polls. */
void resp__loop_enter(struct resp_server *s);
void resp__loop_leave(struct resp_server *s);
/* Another thread: the calls head .. (qnext) of server s, finished there
 * (be.answer_in_place).  Those that can be answered in place are finished
 * and their replies written; the others are handed to the loop.  Needs
 * no lock held by the caller. */
void resp__answer_here(struct resp_server *s, struct resp_call_box *head);
/* A connection whose output cannot take a reply (out of memory): closed,
 * or, when the call is answered in place, closed by the loop. */
void resp__conn_fail(struct resp_conn *c);

/* ---- resp_cmd.c ---- */
void resp__commands_init(struct resp_server *s);
/* Run one command (from the input or a MULTI queue).  Returns 1 when it
 * ran (or was queued or refused), 0 when it must wait for an earlier
 * command of the connection on its filter (nothing done). */
int resp__dispatch(struct resp_conn *c, const struct resp_args *a);
/* Free a connection's session state (MULTI queue). */
void resp__session_free(struct resp_conn *c);
/* Errors of the command being dispatched, counted for its metrics. */
void resp__err(struct resp_conn *c, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const struct resp_command *resp__lookup(const char *name, size_t len);

/* ---- resp_bf.c ---- */
/* Would this BF.* command wait for an earlier one of the connection? */
bool resp__bf_must_wait(struct resp_conn *c, const struct resp_command *cmd,
                        const struct resp_args *a);
/* Finish a call on the loop thread: shape its reply, release its slot. */
void resp__call_finish(struct resp_call_box *b);
/* The slow timer: answer the bounded calls past their deadline. */
void resp__slow_tick(uv_timer_t *t);

#endif
