/* resp_server: the Redis door.  A listener speaking RESP2 and RESP3 with
 * RedisBloom's BF.* commands (and what clients send on connect and for
 * health), in front of a backend that the process plugs in: the node's
 * store (node/node_resp.c) or the router's key path (router/router_resp.c).
 *
 * What the library owns: one event loop thread (libuv) with the listener
 * and every connection; the request parser and reply writer
 * (resp_proto.h); the command table (resp_cmd.h: name, arity, flags, role,
 * handler), authentication with the process's tokens, MULTI/EXEC, the
 * budgets, TLS (OpenSSL over memory BIOs, certificate renewable at run
 * time), idle connections, and the metrics.  What a backend owns: what a
 * BF.* command does to a filter.  It is handed one struct resp_call per
 * command, already checked (arity, options, the filter name and key rules,
 * the caller's role), on the loop thread, and finishes it with
 * resp_call_done from any thread, once: synchronously, or later (a write
 * acknowledged once durable, an answer from the nodes), or after running
 * blocking work on libuv's thread pool (resp_call_offload).  The library
 * shapes the reply from the call's results as RedisBloom does.
 *
 * Order: replies leave each connection in the order its commands came,
 * whatever order the calls finish in.  A command on a filter waits for
 * that connection's earlier catalog commands (BF.RESERVE, DEL) on it and,
 * when the backend asks (reads_wait_writes), a read waits for that
 * connection's earlier writes to the same filter, so that a pipelined
 * BF.ADD x then BF.EXISTS x never answers 1 then 0 through a router.
 *
 * Budgets (every one checked before it is spent): max_connections (one
 * more is answered "-ERR max number of clients reached" and closed);
 * max_args and max_bulk (a command's "*N" and "$L" headers are checked
 * before anything is allocated for them) and max_command (bytes of one
 * command): past them the command is answered with a protocol error and
 * the connection closed; pipeline_bytes (a connection's commands read but
 * not answered, with their replies, and replies not yet taken by the
 * client): past it the connection is not read until it drains, so a
 * client that pipelines without reading stalls itself only; idle_ms: a
 * connection with nothing received or sent for that long, and nothing in
 * flight, is closed (half-sent commands included).
 *
 * Threads: resp_server_create, _start, _stop and _destroy from one thread
 * (the process's main thread); resp_server_set_tls and resp_server_port
 * from any thread.  A backend's bf() runs on the loop thread and must not
 * block (it offloads what may).
 *
 * Errors: functions return 0 or a negative errno with a sentence in err
 * (RESP_SERVER_ERRLEN bytes); constructors NULL.
 */
#ifndef BLOOMGRID_RESP_SERVER_H
#define BLOOMGRID_RESP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define RESP_SERVER_ERRLEN 512
#define RESP_MSGLEN 512

/* The roles of the process's tokens (the numbers of rpc_auth.h's enum). */
enum resp_role {
    RESP_ROLE_NONE = 0,
    RESP_ROLE_READ,
    RESP_ROLE_WRITE,
    RESP_ROLE_ADMIN,
};

/* How a backend fails a call: the canonical status codes (the numbers of
 * google.rpc.Code, which gRPC uses), written as Redis errors:
 * INVALID_ARGUMENT and FAILED_PRECONDITION "ERR msg", NOT_FOUND "ERR not
 * found", ALREADY_EXISTS "ERR item exists", PERMISSION_DENIED "NOPERM msg",
 * UNAUTHENTICATED "NOAUTH msg", RESOURCE_EXHAUSTED "OOM msg", UNAVAILABLE
 * "UNAVAILABLE msg", anything else "ERR msg". */
enum resp_code {
    RESP_OK = 0,
    RESP_CANCELLED = 1,
    RESP_UNKNOWN = 2,
    RESP_INVALID_ARGUMENT = 3,
    RESP_DEADLINE_EXCEEDED = 4,
    RESP_NOT_FOUND = 5,
    RESP_ALREADY_EXISTS = 6,
    RESP_PERMISSION_DENIED = 7,
    RESP_RESOURCE_EXHAUSTED = 8,
    RESP_FAILED_PRECONDITION = 9,
    RESP_INTERNAL = 13,
    RESP_UNAVAILABLE = 14,
    RESP_UNAUTHENTICATED = 16,
};

/* What a BF.* command asks of a filter. */
enum resp_bf_op {
    RESP_BF_ADD,        /* BF.ADD, BF.MADD, BF.INSERT: keys into filter */
    RESP_BF_EXISTS,     /* BF.EXISTS, BF.MEXISTS */
    RESP_BF_RESERVE,    /* BF.RESERVE: create (params in create) */
    RESP_BF_INFO,       /* BF.INFO: info */
    RESP_BF_CARD,       /* BF.CARD: count (0 for a missing filter) */
    RESP_BF_DEL,        /* DEL: the keys are filter names; out[i] dropped */
};

/* How a filter is created: BF.RESERVE's parameters, or those of an ADD's
 * creation of a missing filter (BF.INSERT's options, or the defaults). */
struct resp_bf_create {
    bool allowed;          /* ADD: create the filter when it is missing
                              (role, resp_autocreate and NOCREATE
                              checked); RESERVE: true */
    bool given;            /* BF.RESERVE, or BF.INSERT with CAPACITY, ERROR
                              or SHARDS: the parameters below were asked for */
    double error_rate;     /* given, or the backend's default */
    uint64_t capacity;
    unsigned expansion;    /* scaling: growth per layer (RedisBloom's 2) */
    bool nonscaling;       /* NONSCALING given */
    bool expansion_given;  /* EXPANSION given */
    unsigned shards;       /* SHARDS given (1..RULES_SHARDS_MAX): the
                              filter's shard count; 0: the door's own
                              (a router's count from the filter's size,
                              router_default_shards; a node's 1) */
    const char *why_not;   /* ADD, not allowed: why (for the error) */
};

/* BF.INFO's fields, filled by the backend. */
struct resp_bf_info {
    uint64_t capacity;     /* keys the filter is sized for (all layers) */
    uint64_t size;         /* bytes of its bits */
    uint64_t filters;      /* layers */
    uint64_t items;        /* adds that set a bit */
    long long expansion;   /* growth of a scaling filter; < 0: non-scaling */
};

/* One BF.* command, from the library to the backend and back. */
struct resp_call {
    /* The request: valid until resp_call_done. */
    enum resp_bf_op op;
    char filter[160];              /* checked by the filter-name rule */
    const uint8_t *const *keys;    /* n keys (DEL: filter names), checked by
                                      the key rule; valid only while bf()
                                      runs unless kept (resp_call_keep) */
    const uint32_t *lens;
    size_t n;
    struct resp_bf_create create;
    enum resp_role role;           /* the caller's (ADMIN without tokens) */
    bool tokens;                   /* the process asks for tokens */
    /* The results, set by the backend before resp_call_done. */
    bool *out;                     /* n answers (library's memory) */
    struct resp_bf_info info;
    long long count;               /* CARD */
    int code;                      /* enum resp_code; RESP_OK */
    char msg[RESP_MSGLEN];
    /* The backend's own, untouched by the library. */
    void *bctx[4];
    uint64_t bval[2];
};

/* Fail c with a status code and message (the reply is the error). */
void resp_call_fail(struct resp_call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The call is finished (results or failure set): any thread, exactly once.
 * The library takes c back; nothing of it may be used afterwards. */
void resp_call_done(struct resp_call *c);
/* resp_call_done of n calls of one server at once (any thread): from
 * another thread than the loop's, they are handed over under one lock and
 * with one wake of the loop, which answers them in one pass.  v itself may
 * be freed on return. */
void resp_calls_done(struct resp_call *const *v, size_t n);
/* From bf(), on the loop thread: copy keys and lens so that they stay
 * valid until resp_call_done (an answer that comes after bf() returns and
 * still needs the keys).  0 or -ENOMEM. */
int resp_call_keep(struct resp_call *c);
/* From bf(), on the loop thread: run fn(c) on libuv's thread pool (it may
 * block: a creation, a lookup of a filter not cached), keeping the keys;
 * fn finishes c (resp_call_done) there or later.  0, or -ENOMEM (fn will
 * not run). */
int resp_call_offload(struct resp_call *c, void (*fn)(struct resp_call *c));
/* resp_call_offload with a bound: when fn has neither finished c nor
 * claimed it (resp_call_claim) timeout_ms after the command came, the
 * library answers it "-UNAVAILABLE <command> on filter "<name>" not
 * answered within N ms (resp_slow_timeout_ms): <what>; retry", and the
 * connection's later commands on that filter go on.  fn may still read
 * the request then (the call is kept until fn returns), its results are
 * not used and its resp_call_done is ignored; it must not start anything
 * that finishes c later without claiming it first.  0 or -ENOMEM. */
int resp_call_offload_bounded(struct resp_call *c, void (*fn)(struct resp_call *c),
                              uint64_t timeout_ms, const char *what);
/* From a bounded call's fn: true, and the bound no longer applies (fn, or
 * what it starts, finishes c as usual); false when the bound answered c
 * already (fn must not act on c: nothing more of it is sent). */
bool resp_call_claim(struct resp_call *c);

/* Who a connection is, once authenticated. */
struct resp_who {
    enum resp_role role;
    uint64_t gen;          /* the backend's table generation at the check */
    uint8_t cred[32];      /* the backend's (a token's digest) */
    char name[72];         /* the token's name, for messages and CLIENT */
};

struct resp_backend {
    void *arg;
    /* A BF.* call, on the loop thread; finish with resp_call_done. */
    void (*bf)(void *arg, struct resp_call *c);
    /* Tokens (NULL when the process has no tokens file: every connection
     * acts as admin).  auth: look up a presented token; 0 with who filled,
     * or -EACCES.  recheck: is who still valid in the table in force
     * (cheap when unchanged)?  0, or -EACCES (the token was removed or its
     * role changed: who gets the new role, NONE when removed).  Both get
     * auth_arg. */
    int (*auth)(void *auth_arg, const char *token, size_t len, struct resp_who *who);
    int (*recheck)(void *auth_arg, struct resp_who *who);
    void *auth_arg;
    /* A read waits for the connection's earlier writes to its filter (a
     * router, whose writes are acknowledged by copies a read may not ask). */
    bool reads_wait_writes;
    /* The end of a loop pass (NULL: none): called on the loop thread
     * before the loop waits for I/O again, after the commands of every
     * connection that had input were dispatched.  A backend that holds
     * calls back to join them (the node: the adds of one pass to a filter
     * as one write) starts them here; it must not leave any held when it
     * returns (a call started from here, e.g. by a connection it resumes,
     * included), since the loop may then sleep.  Replies ready before it
     * are written before it is called (it may block the loop a while:
     * the node commits the pass's writes here); when writing replies
     * after it lets paused connections dispatch more, it is called
     * again. */
    void (*pass_end)(void *arg);
    /* Draining (0: none; needs pass_end and pass_held): when a pass
     * brought commands and pass_held answers true (the backend holds
     * calls for pass_end), the loop first polls once more without
     * sleeping, and again while each such poll brings commands, at most
     * pass_drain times in a row, before calling pass_end: the commands
     * arriving in a burst (many clients answered at once sending their
     * next) join the held ones.  Replies ready meanwhile are written at
     * every pass. */
    unsigned pass_drain;
    bool (*pass_held)(void *arg);
    /* Waiting for the answered (NULL: none; needs pass_end and
     * pass_held): the connections answered by a pass_end (the replies of
     * the calls it finished) are awaited: while the backend holds calls
     * (pass_held), some of them have not sent a command since, and less
     * than pass_wait_ns(arg) nanoseconds (asked when that pass_end
     * returns; 0: no wait) have gone by since its replies were written,
     * the loop waits for input instead of calling pass_end (looking again
     * at any input), so that the clients its replies let go join the
     * held calls instead of making a group of their own.  Only the
     * last pass_end's answers are awaited (a client that does not come
     * back costs one wait, once); a connection closed is not awaited. */
    uint64_t (*pass_wait_ns)(void *arg);
    /* Answering where the answer comes (false: every call finished on
     * another thread is handed to the loop, which writes its reply).
     * When true, resp_call_done / resp_calls_done on another thread finish
     * the calls there and write their replies to the clients' sockets at
     * once (one send() per connection), provided that the loop is waiting
     * for I/O at that moment (not running), that the calls finished
     * together are of at most RESP_IN_PLACE_CONNS connections (one
     * pipelined client's, not a group of many clients' commands), and that
     * no call's connection is closed or waiting for that call to run its
     * next command.  A reply that cannot be sent there (TLS, a write of
     * the loop's under way, a paused or closing connection, a short send)
     * is left for the loop to write, in its place; anything else is handed
     * to the loop as before.  It saves the loop's wake-up per answer (an
     * eventfd write, a poll, a context switch): with one pipelined client,
     * one of the three wake-ups of a router per round trip.  The finishing
     * calls nothing of the backend's and waits for no lock (the loop's
     * state is taken with a try-lock), so the backend may call
     * resp_call(s)_done holding its own locks. */
    bool answer_in_place;
};

struct resp_server_config {
    const char *listen;          /* host:port; port 0 picks a free one */
    const char *prog;            /* "bloomgrid-node", for INFO and logs */
    const char *version;         /* bloomgrid's version, for INFO and HELLO */
    unsigned max_connections;
    size_t max_args;             /* arguments of a command, name included */
    size_t max_bulk;             /* bytes of one argument */
    size_t max_command;          /* bytes of one command */
    size_t max_key;              /* the key rule's max_key_size */
    size_t pipeline_bytes;
    uint64_t idle_ms;            /* 0: never */
    bool autocreate;             /* resp_autocreate */
    double autocreate_error_rate;
    uint64_t autocreate_capacity;
    /* TLS: the certificate chain and key (PEM text, copied); NULL: plain. */
    const char *tls_cert_pem, *tls_key_pem;
};

struct resp_server;

/* A server with this config and backend (both copied), not listening
 * yet.  NULL with err set (a bad address, TLS text that does not load). */
struct resp_server *resp_server_create(const struct resp_server_config *cfg,
                                       const struct resp_backend *be, char *err);
/* Bind and start the loop thread.  Returns the port bound (> 0), or a
 * negative errno with err set (-EADDRINUSE naming the address). */
int resp_server_start(struct resp_server *s, char *err);
int resp_server_port(const struct resp_server *s);
/* Replace the certificate for connections accepted from now on (SIGHUP).
 * 0, or -EINVAL with err set (the running one stays); -ENOENT on a server
 * started without TLS. */
int resp_server_set_tls(struct resp_server *s, const char *cert_pem,
                        const char *key_pem, char *err);
/* Stop: close the listener and every connection, wait for calls in flight
 * to finish (the backend must still run), join the thread.  Idempotent. */
void resp_server_stop(struct resp_server *s);
void resp_server_destroy(struct resp_server *s);

/* Connections open now (tests, INFO). */
unsigned resp_server_connections(const struct resp_server *s);

#endif
