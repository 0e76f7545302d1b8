/* rpc_status: the one status type of every bloomgrid process: a gRPC code,
 * a typed reason and a message a person can act on.
 *
 * Servers fill it for a reply (struct rpc_reply holds one), clients get it
 * back from every call, and the router, the merger and the CLI pass it on.
 * The reason says what a program may act on without reading the message
 * text ("the shard has another secret: fetch it again"); it travels as the
 * trailing metadata "bloomgrid-reason" (its name, e.g. "SECRET_MISMATCH")
 * and, inside multi-shard answers, as ShardResult.reason.  Stateless.
 */
#ifndef BLOOMGRID_RPC_STATUS_H
#define BLOOMGRID_RPC_STATUS_H

#include <grpc/status.h>

#define RPC_MSGLEN 512               /* status message buffers */
#define RPC_REASON_KEY "bloomgrid-reason"

/* The numbers are those of the wire enum bloomgrid.v1.ErrorReason. */
enum rpc_reason {
    RPC_REASON_NONE = 0,
    RPC_REASON_SECRET_MISMATCH = 1,  /* the shard has another secret than
                                        the caller's (re-created) */
    RPC_REASON_WRONG_SHARD = 2,      /* a hash that belongs to another shard */
    RPC_REASON_NOT_COUNTING = 3,     /* Remove on a kind without counters */
    RPC_REASON_DROPPED = 4,          /* a filter of this name and secret was
                                        dropped (CreateFilter's undrop
                                        brings it back) */
    RPC_REASON_PLACEMENT_UNKNOWN = 5, /* the filter's placement version is
                                        newer than the caller knows */
};

struct rpc_status {
    grpc_status_code code;
    enum rpc_reason reason;
    char message[RPC_MSGLEN];
};

/* Set code and message (reason NONE).  st may be NULL. */
void rpc_status_set(struct rpc_status *st, grpc_status_code code,
                    const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Short name of a status code ("NOT_FOUND"). */
const char *rpc_status_name(grpc_status_code code);

/* Name of a reason ("SECRET_MISMATCH"; "" for NONE), and back (NONE for an
 * unknown name, len bytes of s). */
const char *rpc_reason_name(enum rpc_reason reason);
enum rpc_reason rpc_reason_parse(const char *s, size_t len);

#endif
