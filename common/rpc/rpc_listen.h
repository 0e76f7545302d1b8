/* rpc_listen: the start-up rule of every serving process (node, router,
 * merger): what it may listen on, given its TLS settings and --insecure.
 *
 * The rule, in one place:
 *  - tls_cert and tls_key go together, and tls_ca with them: all three or
 *    none;
 *  - without TLS a process listens in plaintext on loopback addresses only
 *    (127.0.0.0/8, ::1, localhost); any other address is refused unless
 *    --insecure is given, and then each such address is warned about at
 *    start;
 *  - a node with TLS must have internal_listen: its internal service is
 *    served there, to clients with a certificate of tls_ca only.
 *  - health_listen (every process; empty: none) is exempt: it is
 *    plaintext on any address, because it serves grpc.health.v1 alone
 *    (the kubelet's gRPC probe speaks neither TLS nor tokens) and a
 *    health answer says nothing about any filter.
 * A host name other than localhost counts as non-loopback (it is not
 * resolved here).  Pure checks, no I/O but the warning log lines; any
 * thread.
 */
#ifndef BLOOMGRID_RPC_LISTEN_H
#define BLOOMGRID_RPC_LISTEN_H

#include <stdbool.h>
#include <stddef.h>

#define RPC_LISTEN_ERRLEN 512

/* The fields the entries below fill, for the config struct of every
 * serving process. */
#define RPC_LISTEN_FIELDS                                                      \
    char tls_cert[1024], tls_key[1024], tls_ca[1024]; /* "" without TLS */     \
    bool insecure;                                     /* --insecure */        \
    char health_listen[256]; /* plaintext, health only, or "" */

/* The settings-table entries (settings.h) of the TLS files, --insecure and
 * health_listen, shared by every serving process; type is its config
 * struct, holding RPC_LISTEN_FIELDS. */
#define RPC_LISTEN_SETTINGS(type)                                              \
    {"tls_cert", SETTING_STRING, 0, 0, NULL, "", SETTING_FIELD(type, tls_cert), \
     "certificate chain of this process (PEM, its own certificate first), "    \
     "served on every listener and offered as the client certificate on "      \
     "calls to cluster processes; its subject alternative names must hold "    \
     "the host of every address it is called on; SIGHUP re-reads the file; "   \
     "empty: no TLS (loopback only, see --insecure)"},                        \
    {"tls_key", SETTING_STRING, 0, 0, NULL, "", SETTING_FIELD(type, tls_key),   \
     "private key of tls_cert (PEM, not encrypted); SIGHUP re-reads it"},     \
    {"tls_ca", SETTING_STRING, 0, 0, NULL, "", SETTING_FIELD(type, tls_ca),     \
     "the cluster CA (PEM): verifies the servers this process calls and the "  \
     "client certificates of cluster processes; SIGHUP re-reads it"},         \
    {"insecure", SETTING_FLAG, 0, 0, NULL, "false", SETTING_FIELD(type, insecure), \
     "allow listening on a non-loopback address without TLS (plaintext: "      \
     "anyone who can reach it can read and change every filter); warned "     \
     "about at start"}

/* The health_listen entry of the settings table. */
#define RPC_HEALTH_LISTEN_SETTING(type)                                        \
    {"health_listen", SETTING_ADDR, 0, 0, NULL, "", SETTING_FIELD(type, health_listen), \
     "a plaintext listener (any address, no TLS, no token) that serves "      \
     "only grpc.health.v1 (for the kubelet's gRPC probes: liveness asks "     \
     "service \"\", readiness \"bloomgrid.v1.BloomGrid\"); every other call "  \
     "there is UNIMPLEMENTED; empty: none"}

struct rpc_listen_rule {
    const char *listen;           /* the public listener, host:port */
    const char *internal_listen;  /* "" or NULL: none */
    bool has_internal;            /* serves bloomgrid.v1.Internal (the node) */
    const char *tls_cert, *tls_key, *tls_ca;  /* "" or NULL: not set */
    bool insecure;                /* --insecure */
    bool tokens;                  /* a tokens_file is set (rpc_auth.h) */
};

/* Is host:port (or a bare host) a loopback address? */
bool rpc_listen_loopback(const char *addr);

/* Whether TLS is configured (all three files named). */
bool rpc_listen_tls(const struct rpc_listen_rule *r);

/* Apply the rule.  Returns 0 when the process may start (warnings
 * logged), or -1 with a sentence in err (RPC_LISTEN_ERRLEN bytes) that
 * says what to set. */
int rpc_listen_check(const struct rpc_listen_rule *r, char *err);

struct rpc_tls;
/* At start: apply the rule and, with TLS, load the files (rpc_tls_load)
 * into *tls and make them the process's client TLS (rpc_tls_set_client);
 * *tls is NULL without TLS.  Returns 0, or -1 after printing
 * "PROG: not starting: REASON" on stderr (the process exits 2). */
int rpc_listen_setup(const struct rpc_listen_rule *r, const char *prog,
                     struct rpc_tls **tls);

struct rpc_server;
/* Add the health_listen listener to srv (before rpc_server_start):
 * plaintext, serving only grpc.health.v1 (no other service is registered
 * on it; a reflection service must be added with the mask
 * rpc_listen_not(index)).  Returns the listener's index (> 0), 0 when addr
 * is empty (no listener), or a negative errno (logged). */
int rpc_listen_add_health(struct rpc_server *srv, const char *addr);

/* After rpc_server_start: " health HOST:PORT" (the port bound) for the
 * listener index > 0 of addr, for the "listening on" line; "" for 0. */
void rpc_listen_health_note(const struct rpc_server *srv, int index,
                            const char *addr, char *out, size_t len);

/* Every listener but index (0: every listener). */
unsigned rpc_listen_not(int index);

/* The host of a host:port listen address, for the "listening on" line. */
void rpc_listen_host(const char *addr, char *host, size_t len);

#endif
