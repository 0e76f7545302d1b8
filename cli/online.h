/* online: the bloomgrid tool's side of the public API (bloomgrid.v1), the
 * same against a node or a router.
 *
 * This module owns the connection (one gRPC channel per command run) and is
 * the only part of the tool that sees wire messages: online_rpc.c converts
 * between protobuf and the plain structs below; key batches go through
 * rpc_keys.h, the codec the servers use.
 *
 * Errors: the calls return 0 on OK and -1 otherwise with the status in *st;
 * online_report() turns a status into the one-line message of the tool
 * ("bloomgrid: server: NOT_FOUND: ...") and returns CLI_ERR.  Single-threaded
 * like the rest of the tool.
 */
#ifndef BLOOMGRID_ONLINE_H
#define BLOOMGRID_ONLINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "rpc_client.h"

#define ONLINE_DEADLINE_MS 10000         /* default per call */
#define ONLINE_TRANSFER_DEADLINE_MS 600000 /* default for export and import */
#define ONLINE_ENV_SERVER "BLOOMGRID_SERVER"
#define ONLINE_ENV_TLS_CA "BLOOMGRID_TLS_CA"
#define ONLINE_ENV_TLS_CERT "BLOOMGRID_TLS_CERT"
#define ONLINE_ENV_TLS_KEY "BLOOMGRID_TLS_KEY"

/* Options before the command name (bloomgrid --server H:P --deadline MS
 * COMMAND ...), set by main(); commands may override them. */
struct online_opts {
    const char *server;     /* NULL: not given */
    int deadline_ms;        /* 0: not given */
    const char *tls_ca, *tls_cert, *tls_key;   /* NULL: not given */
    const char *token_file; /* NULL: not given */
};
extern struct online_opts online_global;

struct online {
    const char *server;
    int deadline_ms;
    const char *tls_ca, *tls_cert, *tls_key;   /* TLS when tls_ca is set */
    const char *token_file; /* NULL: $BLOOMGRID_TOKEN, or no token */
    struct rpc_channel *ch;
};

/* Open a channel to o->server (which must be set): TLS verified with
 * o->tls_ca when it is set, with o->tls_cert and o->tls_key as the client
 * certificate when they are, plaintext otherwise; sending the token of
 * o->token_file or $BLOOMGRID_TOKEN on every call.  Prints the reason and
 * returns CLI_ERR on failure (a TLS or token file refused names it), else 0.
 * online_close() is safe after a failed open. */
int online_open(struct online *o);
void online_close(struct online *o);

/* Print a failed call as one line and return CLI_ERR.  An unreachable
 * server is told apart from an answer of the server. */
int online_report(const struct online *o, const struct rpc_status *st);

/* ---- catalog ---------------------------------------------------------- */

struct online_shard {
    uint32_t index;
    char *node;             /* "" on a node */
    const char *state;      /* "ready", "recovering", "failed", "unknown" */
    char *reason;
    uint64_t bits, bytes, version;
    double fill_ratio, estimated_count;
};

/* FilterInfo.  Strings are owned by the struct (online_info_deinit). */
struct online_info {
    char *name;
    const char *kind;       /* static: "blocked", ... */
    uint64_t capacity;
    double error_rate;
    uint32_t shards, hashes, layers;
    uint32_t placement;     /* placement version (0: not said, a server
                               from before versions) */
    uint64_t bits, bytes, version, insert_count;
    double fill_ratio, estimated_count, estimated_error_rate;
    const char *state;
    char *reason;
    bool over_capacity;
    char *fingerprint;
    struct online_shard *shard;
    size_t nshard;
};
void online_info_deinit(struct online_info *info);

/* Kind names as on the command line; false when name is not one. */
bool online_kind_parse(const char *name, int *kind);

/* secret: BF_SECRET_LEN bytes (an export's, for a restore), or NULL for
 * one the server draws.  placement: the placement version a router places
 * the shards by (docs/TOPOLOGY.md), 0 for its newest. */
int online_create(struct online *o, const char *name, uint64_t capacity,
                  double error_rate, int kind, uint32_t shards,
                  const uint8_t *secret, uint32_t placement,
                  struct online_info *out, struct rpc_status *st);
/* CreateFilter with undrop set: undo a drop of name with secret (needed;
 * docs/BACKUP.md, "Undoing a drop") and placement version placement (the
 * dropped filter's; 0: the surviving shard 0's, else the router's
 * newest).  Errors as online_create, and ALREADY_EXISTS when it exists
 * with this secret. */
int online_undrop(struct online *o, const char *name, uint64_t capacity,
                  double error_rate, int kind, uint32_t shards,
                  const uint8_t *secret, uint32_t placement,
                  struct online_info *out, struct rpc_status *st);
int online_drop(struct online *o, const char *name, struct rpc_status *st);
int online_get(struct online *o, const char *name, struct online_info *out,
               struct rpc_status *st);
/* *out: an array of *n entries owned by the caller (online_info_list_free). */
int online_list(struct online *o, struct online_info **out, size_t *n,
                struct rpc_status *st);
void online_info_list_free(struct online_info *list, size_t n);

/* ---- key batches -------------------------------------------------------- */

enum online_op { ONLINE_ADD, ONLINE_MAY_CONTAIN, ONLINE_REMOVE };

/* One request (AddRequest, MayContainRequest and RemoveRequest share their
 * layout) being filled: its keys, copied once, one after another, so that
 * results can be printed next to them. */
struct online_batch {
    char *filter;
    uint8_t *buf;           /* the keys */
    size_t used, cap;       /* bytes of buf */
    size_t len;             /* at least the packed request's size */
    uint32_t *key_off, *key_len;
    ProtobufCBinaryData *wire;  /* the keys as they are packed */
    size_t n, ncap;
    bool *answer;           /* n results after a call */
};

/* Start an empty batch for filter.  Returns 0 or -ENOMEM. */
int online_batch_init(struct online_batch *b, const char *filter);
void online_batch_deinit(struct online_batch *b);
/* Drop the keys, keep the filter and the memory. */
void online_batch_clear(struct online_batch *b);
int online_batch_add(struct online_batch *b, const void *key, size_t len);
static inline const char *online_batch_key(const struct online_batch *b,
                                           size_t i, size_t *len)
{
    *len = b->key_len[i];
    return (const char *)b->buf + b->key_off[i];
}

/* Send n batches as concurrent unary calls and wait for all.  Fills each
 * batch's answer[].  Returns n when every call succeeded, else the index of
 * the first batch (in order) that failed, with its status in *st; answers
 * of the batches before it are valid. */
size_t online_keys_call(struct online *o, enum online_op op,
                        struct online_batch *b, size_t n,
                        struct rpc_status *st);

/* ---- file transfer -------------------------------------------------------- */

/* Receives the Export stream: data belongs at offset of a file of total
 * bytes.  Return 0 to go on; anything else cancels the call and is returned
 * by online_export. */
typedef int (*online_chunk_fn)(void *ctx, uint64_t offset, const void *data,
                               size_t len, uint64_t total);
/* Returns 0, -1 with *st (the call failed), or the callback's stop value. */
int online_export(struct online *o, const char *name, online_chunk_fn fn,
                  void *ctx, struct rpc_status *st);

/* Supplies the Import stream: fill buf with up to cap bytes; return the
 * count, 0 at the end, or a negative value (reason already printed) to
 * abandon the call. */
typedef ssize_t (*online_read_fn)(void *ctx, void *buf, size_t cap);

struct online_import_result {
    uint64_t bytes_received;
    double projected_fill_ratio, projected_error_rate;
    bool over_target;
    struct online_info info;
};
/* Returns 0, -1 with *st, or CLI_ERR when read failed. */
int online_import(struct online *o, const char *name, online_read_fn rd,
                  void *ctx, struct online_import_result *res,
                  struct rpc_status *st);

#endif
