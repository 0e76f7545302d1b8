/* rpc_auth: bearer tokens, their roles, and who may call which method.
 *
 * A tokens file (setting tokens_file) lists one token per line,
 *
 *     ROLE NAME SHA256HEX
 *
 * ROLE is read, write or admin, NAME (1 to RPC_TOKEN_NAME_MAX bytes of
 * [A-Za-z0-9._-]) names the token in logs, SHA256HEX is the SHA-256 of the
 * token, 64 hex digits; blank lines and lines starting with '#' are
 * skipped.  A bad line refuses the whole file, naming the line; so do two
 * lines with one name or one hash, and more than 100 000 lines.  The file holds no token itself: a
 * presented token is hashed and its hash looked up (the hashes are compared
 * in constant time).
 *
 * Who may call what is one table and one decision (rpc_auth_rule_of,
 * rpc_auth_decide), pure functions: health and reflection are open;
 * bloomgrid.v1.BloomGrid wants read, write or admin by method; Internal
 * and Merger (and any service not in the table) want a cluster peer: a
 * call that arrived with a verified client certificate, or an admin token.
 * Without a tokens file every method is open (the loopback default).
 * Missing or unknown token: UNAUTHENTICATED; too weak a role:
 * PERMISSION_DENIED.
 *
 * A cluster certificate is a peer identity of x509 kind in the call's auth
 * context, which gRPC sets only from a client certificate on a TLS
 * listener.  A listener that requests client certificates must also verify
 * them against the cluster CA, or an unverified certificate would count.
 *
 * struct rpc_auth is the running table of a server: rpc_auth_reload (on
 * SIGHUP) swaps in the file's new content at once, or keeps the old one
 * when the new file is refused.  Readers (any thread, many at once) take a
 * read lock only for a lookup.  A token removed at a reload stops working
 * for new calls and, through rpc_auth_recheck on every message a stream
 * reads, for open streams.
 *
 * Errors: 0 or a negative errno with a sentence in err (RPC_AUTH_ERRLEN
 * bytes); constructors return NULL.  No token is ever logged: refusals
 * name the token's NAME (at most a few lines a second).
 */
#ifndef BLOOMGRID_RPC_AUTH_H
#define BLOOMGRID_RPC_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/grpc.h>
#include <grpc/status.h>

#include "rpc_status.h"

#define RPC_AUTH_ERRLEN 512
#define RPC_TOKEN_NAME_MAX 64
#define RPC_TOKEN_MAX 512             /* longest token a client may send */
#define RPC_TOKEN_DIGEST 32           /* SHA-256 */
#define RPC_TOKEN_ENV "BLOOMGRID_TOKEN"

enum rpc_role {
    RPC_ROLE_NONE = 0,                /* no token, or one the file lacks */
    RPC_ROLE_READ,
    RPC_ROLE_WRITE,
    RPC_ROLE_ADMIN,
};

/* What a method asks of its caller when a tokens file is set. */
enum rpc_auth_rule {
    RPC_AUTH_OPEN,                    /* health, reflection */
    RPC_AUTH_READ,                    /* a token of role read or more */
    RPC_AUTH_WRITE,
    RPC_AUTH_ADMIN,
    RPC_AUTH_PEER,                    /* a cluster certificate or an admin token */
};

/* What is known of a call's caller. */
struct rpc_caller {
    bool tokens;                      /* the server has a tokens file */
    bool has_token;                   /* the call carried a bearer token */
    enum rpc_role role;               /* that token's; NONE: not in the file */
    bool peer_cert;                   /* a verified client certificate */
};

/* The rule of a method path ("/bloomgrid.v1.BloomGrid/Add").  A method no
 * table lists gets RPC_AUTH_PEER. */
enum rpc_auth_rule rpc_auth_rule_of(const char *path);

/* The decision: GRPC_STATUS_OK, UNAUTHENTICATED or PERMISSION_DENIED. */
grpc_status_code rpc_auth_decide(enum rpc_auth_rule rule, const struct rpc_caller *c);

/* "read", "write", "admin" ("none" for RPC_ROLE_NONE); the role a rule
 * asks for ("admin" for PEER). */
const char *rpc_role_name(enum rpc_role role);
enum rpc_role rpc_auth_rule_role(enum rpc_auth_rule rule);
/* Parse a role name; -EINVAL for anything else. */
int rpc_role_parse(const char *name, enum rpc_role *out);

/* ---- the tokens of one file ---- */

struct rpc_tokens;

/* Parse the text of a tokens file (len bytes; file names it in err).
 * Returns the table or NULL with err set ("FILE:LINE: ..."). */
struct rpc_tokens *rpc_tokens_parse(const char *text, size_t len, const char *file,
                                    char *err);
/* Read and parse a file (at most 16 MiB). */
struct rpc_tokens *rpc_tokens_load(const char *path, char *err);
void rpc_tokens_free(struct rpc_tokens *t);
size_t rpc_tokens_count(const struct rpc_tokens *t);
/* The role and name (may be NULL) of the token with this digest; RPC_ROLE_NONE
 * when the table lacks it.  *name points into t. */
enum rpc_role rpc_tokens_find(const struct rpc_tokens *t,
                              const uint8_t digest[RPC_TOKEN_DIGEST], const char **name);

/* Whether name may name a token (1 to RPC_TOKEN_NAME_MAX bytes of
 * [A-Za-z0-9._-]). */
bool rpc_token_name_ok(const char *name, size_t len);
/* SHA-256 of a token. */
void rpc_token_digest(const char *token, size_t len, uint8_t out[RPC_TOKEN_DIGEST]);
/* Whether a token can travel as a header value and be written in a file:
 * 1 to RPC_TOKEN_MAX printable ASCII bytes, no space.  Returns 0 or -EINVAL
 * with err naming what (e.g. "--token-file x"). */
int rpc_token_check(const char *what, const char *token, size_t len, char *err);
/* Read a token from a file (surrounding white space dropped; the file holds
 * the token alone).  buf has RPC_TOKEN_MAX + 1 bytes.  Returns 0 or -errno. */
int rpc_token_read(const char *path, char *buf, char *err);

/* ---- the running table of a server ---- */

struct rpc_auth;

/* Load path.  NULL with err set when the file is refused. */
struct rpc_auth *rpc_auth_create(const char *path, char *err);
/* Read the file again; on success the new table is in force for every call
 * from now on.  On failure the old table stays. */
int rpc_auth_reload(struct rpc_auth *a, char *err);
/* For rpc_signals_on_hup: reload, and log the outcome. */
void rpc_auth_reload_hook(void *a);
/* Free.  No call may use a afterwards.  NULL is allowed. */
void rpc_auth_destroy(struct rpc_auth *a);

/* Who a call is, as recorded when it was admitted (for rpc_auth_recheck). */
struct rpc_auth_who {
    enum rpc_auth_rule rule;
    bool by_token;                    /* admitted for its token: re-checked */
    bool peer_cert;
    uint64_t gen;                     /* table generation of the last check */
    uint8_t digest[RPC_TOKEN_DIGEST];
    char name[RPC_TOKEN_NAME_MAX + 1];
};

/* Admit or refuse a call to path (rule) that arrived with the initial
 * metadata md on call (its auth context tells a client certificate apart).
 * Returns 0 and fills who, or -EACCES with the refusal in st (code and a
 * message for the client; the refusal is logged). */
int rpc_auth_admit(struct rpc_auth *a, enum rpc_auth_rule rule, const char *path,
                   grpc_call *call, const grpc_metadata_array *md,
                   struct rpc_auth_who *who, struct rpc_status *st);
/* Before each message of an admitted stream: its token still holds its role
 * in the current table.  Cheap when the table has not changed since the
 * last check (one load).  Returns 0 or -EACCES with st filled. */
int rpc_auth_recheck(struct rpc_auth *a, const char *path, grpc_call *call,
                     struct rpc_auth_who *who, struct rpc_status *st);

/* A token presented outside gRPC (the RESP door's AUTH): its role (NONE
 * when the table lacks it or it is malformed), its name (name holds
 * RPC_TOKEN_NAME_MAX + 1 bytes, "" for NONE), its digest (for
 * rpc_auth_lookup_digest) and the table generation it was checked under.
 * Any thread. */
enum rpc_role rpc_auth_lookup(struct rpc_auth *a, const char *token, size_t len,
                              uint8_t digest[RPC_TOKEN_DIGEST], char *name,
                              uint64_t *gen);
/* The same check again, by digest: at once when the table is still the
 * one of *gen (returns -1: nothing changed); else the role in the table
 * now, *gen and name updated. */
int rpc_auth_lookup_digest(struct rpc_auth *a, const uint8_t digest[RPC_TOKEN_DIGEST],
                           char *name, uint64_t *gen);

/* ---- start-up ---- */

/* The two settings of every server process (node, router, merger): the
 * tokens file its callers' tokens are checked against, and the file of the
 * token its own calls to nodes send.  RPC_AUTH_FIELDS goes in its config
 * struct, RPC_AUTH_SETTINGS in its table (settings.h; F is the table's
 * field macro). */
#define RPC_AUTH_FIELDS                                                         \
    char tokens_file[1024]; /* tokens callers present, or "" */                 \
    char token_file[1024];  /* the token of this process's calls, or "" */
#define RPC_AUTH_SETTINGS(F)                                                    \
    {"tokens_file", SETTING_STRING, 0, 0, NULL, "", F(tokens_file),            \
     "file of the tokens callers must present, one \"ROLE NAME SHA256HEX\" "   \
     "per line (docs/SECURITY.md); SIGHUP re-reads it; empty: no token is "     \
     "asked for (the loopback default)"},                                      \
    {"token_file", SETTING_STRING, 0, 0, NULL, "", F(token_file),              \
     "file holding the token this process sends on its own calls to nodes "    \
     "(an admin token, needed when they have a tokens file and no cluster "    \
     "certificate is used); empty: none"}

/* A server process's tokens: the token its own calls send (token_file, ""
 * for none: read and given to rpc_client_set_token) and the table callers
 * must match (tokens_file; *auth NULL for "").  Returns 0, or -EINVAL with
 * err set when a file is refused. */
int rpc_auth_setup(const char *tokens_file, const char *token_file,
                   struct rpc_auth **auth, char *err);


#endif
