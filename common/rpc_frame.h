/* rpc_frame: unary calls of a service's methods over plain TCP frames.
 *
 * The router's key batches are small, frequent calls to a few nodes; over
 * gRPC each one costs an HTTP/2 round trip plus several thread hand-offs
 * inside the gRPC core (measured: ~100 us on loopback, twice a client's own
 * call).  Frames carry the same request and response bytes as the gRPC call,
 * with a fixed 16-byte header, on connections that one caller uses at a
 * time: a call is one write and one read (~15 us on loopback).
 *
 * Wire format (little-endian u32 fields), one call at a time per connection:
 *   request:  "BGF1" | method | timeout_ms | length   then length bytes
 *   response: "BGF1" | status | msg_len    | length   then msg_len bytes of
 *             status message, then length bytes of response message
 * method is the index of the method in the service descriptor; status is a
 * grpc_status_code.  A frame with a bad magic, or longer than the server's
 * max_message, ends the connection (after a RESOURCE_EXHAUSTED response for
 * the too-long case).  Streaming methods answer UNIMPLEMENTED.  A server at
 * its connection limit writes a refusal ("BGFR" | UNAVAILABLE | msg_len | 0,
 * then the message) on a new connection before reading anything, and closes
 * it: the caller's request was not run.
 * docs/ROUTER.md describes how the router finds a node's frame port
 * (Internal/NodeInfo) and when it falls back to gRPC.
 */
#ifndef BLOOMGRID_RPC_FRAME_H
#define BLOOMGRID_RPC_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rpc_client.h"
#include "rpc_server.h"

#define RPC_FRAME_MAGIC 0x31464742u   /* "BGF1" */
#define RPC_FRAME_REFUSED 0x52464742u /* "BGFR" */
#define RPC_FRAME_HDR 16

/* ---- server ---- */

struct rpc_frame_server;

/* Listen on host:port (port 0 picks a free port; host as in a listen
 * address, "[::1]" allowed) and serve handlers[0..n) with arg, one thread
 * per connection, at most max_conns connections (more are closed at once).
 * sd (may be NULL) is the service the handlers implement: each request's
 * strings are checked against its method's input as rpc_server does.
 * *bound_port receives the port.  NULL with err (256 bytes) on failure. */
struct rpc_frame_server *rpc_frame_server_start(const char *host, int port,
                                                const struct rpc_handler *handlers,
                                                size_t n,
                                                const ProtobufCServiceDescriptor *sd,
                                                void *arg,
                                                size_t max_message, int max_conns,
                                                int *bound_port, char *err);

/* How long the rest of a frame may take once its first bytes arrived
 * before the server closes the connection (default 10000 ms; an idle
 * connection between frames is never timed out).  Process-wide. */
void rpc_frame_set_stall_ms(int ms);

/* Stop accepting, end every connection (a call being handled finishes
 * first; its response may be lost), join the threads and free.  NULL is
 * allowed. */
void rpc_frame_server_stop(struct rpc_frame_server *s);

/* ---- client ---- */

/* Connections to one host:port, reused by one call at a time each. */
struct rpc_frame_pool;

/* port may be 0 (no frame port known yet: calls fail unsent). */
struct rpc_frame_pool *rpc_frame_pool_create(const char *host, int port,
                                             size_t max_message);
void rpc_frame_pool_destroy(struct rpc_frame_pool *p);

/* Point the pool at another port (0: none).  Idle connections are closed;
 * connections in use are closed when their call ends. */
void rpc_frame_pool_set_port(struct rpc_frame_pool *p, int port);
int rpc_frame_pool_port(struct rpc_frame_pool *p);

/* One call of rpc_frame_call_many. */
struct rpc_frame_call {
    struct rpc_frame_pool *pool;
    uint32_t method;
    const void *req;
    size_t len;
    int timeout_ms;
    /* Results. */
    int rc;                 /* 0 on OK status, -1 otherwise */
    bool sent;              /* false: the request never left this process,
                             * so the call can be made again another way */
    bool answered;          /* a response frame arrived (rc and st are the
                             * server's); false: a transport failure */
    bool refused;           /* the server was at its connection limit and
                             * did not run the call (sent is false) */
    int port;               /* the port the call went to */
    struct rpc_status st;
    grpc_slice resp;        /* on OK: the response (caller unrefs) */
};

/* Make n calls at once (each on its own connection), each bounded by its
 * deadline; returns how many failed.  Transport failures are UNAVAILABLE
 * (or DEADLINE_EXCEEDED) with a message naming host:port. */
size_t rpc_frame_call_many(struct rpc_frame_call *calls, size_t n);

/* Let one caller at a time of rpc_frame_call_many busy-wait up to us
 * microseconds for answers before it sleeps in poll() (0, the default: never
 * busy-wait).  Process-wide. */
void rpc_frame_set_spin(long us);

/* Parse "host:port" / "[v6]:port" into host (without brackets) and port.
 * Returns 0 or -1. */
int rpc_frame_split_addr(const char *addr, char *host, size_t hostlen, int *port);

#endif
