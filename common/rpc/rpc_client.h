/* rpc_client: gRPC client calls over the gRPC C core.
 *
 * A struct rpc_channel is one HTTP/2 connection (re-established by gRPC when
 * the server comes back) plus a cache of registered method paths.  It is
 * thread-safe: any number of threads may make calls on one channel at once.
 * Every call carries a deadline (timeout_ms > 0 is required).
 *
 * A struct rpc_cstream is one streaming call.  One thread may write while
 * another reads; otherwise one thread at a time.
 *
 * Token: a channel with a token (rpc_channel_set_token, or the process's
 * default from rpc_client_set_token) sends "authorization: Bearer TOKEN"
 * in the initial metadata of every call it makes, unary or streaming.
 *
 * Status: calls return 0 when the call ended with OK and -1 otherwise, with
 * the code, reason (the server's "bloomgrid-reason" trailing metadata) and
 * message in *st (when st is not NULL; see rpc_status.h).  Transport failures
 * appear as UNAVAILABLE or DEADLINE_EXCEEDED, as gRPC reports them.  The
 * caller owns grpc_init()/grpc_shutdown().
 */
#ifndef BLOOMGRID_RPC_CLIENT_H
#define BLOOMGRID_RPC_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "rpc_status.h"
#include "rpc_tls.h"

#define RPC_CLIENT_MSGLEN RPC_MSGLEN

struct rpc_channel;
struct rpc_cstream;

/* Open a channel to "host:port".  max_message bounds both directions
 * (0: 64 MiB).  The channel uses the process-wide client TLS
 * (rpc_tls_set_client; plaintext when none is set).  Returns NULL when out
 * of memory. */
struct rpc_channel *rpc_channel_create(const char *target, size_t max_message);
/* The same with the TLS files of tls (NULL: plaintext), whatever the
 * process-wide setting.  The channel keeps the files as they are now (see
 * rpc_tls.h); tls may be destroyed while the channel lives. */
struct rpc_channel *rpc_channel_create_tls(const char *target, size_t max_message,
                                           struct rpc_tls *tls);
/* rpc_channel_create for a caller that reads large streams slowly (a
 * puller that makes each piece durable before it reads the next): every
 * call's receive window stays window bytes (HTTP/2 BDP probing, which
 * grows it to tens of MiB on a fast link, is off), so the stream the peer
 * sent ahead of the reader that the channel holds is bounded by window
 * per call, not by the link's speed.  window 0: as rpc_channel_create. */
struct rpc_channel *rpc_channel_create_window(const char *target, size_t max_message,
                                              size_t window);
void rpc_channel_destroy(struct rpc_channel *ch);
/* The gRPC core channel inside, for callers that drive their own calls on
 * it (the router's batch streams); owned by ch. */
grpc_channel *rpc_channel_grpc(struct rpc_channel *ch);

/* The token every channel created afterwards sends (NULL or "": none).
 * Call once at start-up, before any channel exists.  Returns 0, or -EINVAL
 * for a token that cannot travel in a header (rpc_token_check). */
int rpc_client_set_token(const char *token);
/* Give ch its own token (NULL: none), before any call on it.  0 or -EINVAL. */
int rpc_channel_set_token(struct rpc_channel *ch, const char *token);
/* The initial metadata every call on ch sends (the token; count 0 without
 * one), for callers that drive their own calls on rpc_channel_grpc(ch).
 * Owned by ch. */
size_t rpc_channel_metadata(const struct rpc_channel *ch, grpc_metadata **md);

/* Unary call with raw bytes.  On OK, *resp (when not NULL) receives the
 * response bytes, owned by the caller (grpc_slice_unref).  method is a full
 * path, "/bloomgrid.v1.BloomGrid/Add". */
int rpc_call_raw(struct rpc_channel *ch, const char *method, const void *req,
                 size_t len, grpc_slice *resp, int timeout_ms,
                 struct rpc_status *st);

/* Unary call with protobuf-c messages.  On OK, *resp is unpacked with
 * resp_desc and owned by the caller (protobuf_c_message_free_unpacked).  A
 * response that does not parse gives -1 with code INTERNAL. */
int rpc_call(struct rpc_channel *ch, const char *method,
             const ProtobufCMessage *req,
             const ProtobufCMessageDescriptor *resp_desc,
             ProtobufCMessage **resp, int timeout_ms, struct rpc_status *st);

/* One unary call of a fan-out (rpc_call_many).  The caller fills ch, method,
 * req (borrowed: kept alive by the caller until rpc_call_many returns) and
 * timeout_ms; rpc_call_many fills rc, st and, on OK, resp (owned by the
 * caller: grpc_slice_unref). */
struct rpc_multi {
    struct rpc_channel *ch;
    const char *method;
    grpc_slice req;
    int timeout_ms;
    int rc;                 /* 0 on OK, -1 otherwise */
    struct rpc_status st;
    grpc_slice resp;
};

/* Start n unary calls on one completion queue, then wait until every one has
 * ended (each bounded by its own deadline).  Returns how many failed. */
size_t rpc_call_many(struct rpc_multi *calls, size_t n);

/* Open a streaming call.  Nothing is sent yet (the initial metadata goes
 * with the first write, read or finish), so this does not wait for the
 * server: a server that is down or silent shows as a failed write or read
 * and its status comes from rpc_cstream_finish.  NULL only when the call
 * cannot be created locally. */
struct rpc_cstream *rpc_cstream_open(struct rpc_channel *ch, const char *method,
                                     int timeout_ms);
/* Send one message.  Returns 0 or -1 (the call failed: see finish). */
int rpc_cstream_write(struct rpc_cstream *s, const void *buf, size_t len);
int rpc_cstream_write_msg(struct rpc_cstream *s, const ProtobufCMessage *msg);
/* Half-close: no more messages from the client.  Returns 0 or -1. */
int rpc_cstream_close_send(struct rpc_cstream *s);
/* Receive one message into *out (caller unrefs).  Returns 1, 0 at the end of
 * the server's messages, -1 when the call failed. */
int rpc_cstream_read(struct rpc_cstream *s, grpc_slice *out);
/* Cancel the call (the server sees the client go away, never the end of
 * its messages: no half-close is sent after this); finish still needs to
 * be called. */
void rpc_cstream_cancel(struct rpc_cstream *s);
/* Wait for the final status and free the stream (also cancels it if messages
 * are still flowing).  Returns 0 on OK, -1 otherwise. */
int rpc_cstream_finish(struct rpc_cstream *s, struct rpc_status *st);

#endif
