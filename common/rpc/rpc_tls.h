/* rpc_tls: a process's TLS files (certificate chain, key, cluster CA) and
 * the gRPC credentials built from them, for its listeners and its channels.
 *
 * A struct rpc_tls holds the PEM text of three files, checked when read:
 * the certificate chain parses, the key parses and matches the chain's
 * first certificate, the CA file holds at least one certificate.  A
 * certificate that has expired or is not valid yet is loaded with a
 * warning (its peers will refuse it; the clock may be the one at fault).
 * rpc_tls_reload reads the same paths again (SIGHUP): when every file
 * passes, the new text replaces the old at once; otherwise the old text
 * stays and the reason is returned.
 *
 * Server side: rpc_tls_server_credentials builds credentials whose
 * certificate comes from a config fetcher that gRPC asks on every new
 * connection, so a reload takes effect for connections accepted after it
 * without a restart; open connections keep the certificate they were
 * made with.  The peer argument says what is asked of clients: nothing
 * (RPC_TLS_PEER_NONE), a certificate signed by the CA when one is offered
 * (RPC_TLS_PEER_VERIFY), or such a certificate always (RPC_TLS_PEER_REQUIRE:
 * the handshake of a client without one fails).
 *
 * Client side: rpc_tls_channel_credentials builds credentials on gRPC's
 * watcher of the same three files (one per struct rpc_tls, reading them
 * again every RPC_TLS_WATCH_S seconds, keeping the last good pair): the
 * CA verifies the server (its certificate must name the host of the
 * target, as a DNS or IP subject alternative name), and the certificate
 * and key are offered as the client's.  Every handshake takes the files
 * as last read, so a renewed certificate or CA reaches open channels at
 * their next connection, without a restart and without SIGHUP (which
 * renews the listeners' side).
 * rpc_tls_set_client sets the process-wide client TLS that rpc_channel_create
 * uses (rpc_client.h); NULL, the default, is plaintext.
 *
 * Threads: every function may be called from any thread, except
 * rpc_tls_set_client (once at start, before any channel is created) and
 * rpc_tls_destroy.  A struct rpc_tls must outlive every server built with
 * its credentials (their fetcher reads it); channel credentials hold their
 * own copies.
 *
 * Errors: constructors return NULL and functions a negative errno, with a
 * sentence in err (RPC_TLS_ERRLEN bytes) that names the setting and the file.
 */
#ifndef BLOOMGRID_RPC_TLS_H
#define BLOOMGRID_RPC_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#define RPC_TLS_ERRLEN 512
/* How often channels' credentials read their files again. */
#define RPC_TLS_WATCH_S 5
/* The largest PEM file read. */
#define RPC_TLS_FILE_MAX (1u << 20)

struct rpc_tls;

/* What a listener asks of its clients. */
enum rpc_tls_peer {
    RPC_TLS_PEER_NONE,      /* no client certificate asked for */
    RPC_TLS_PEER_VERIFY,    /* asked for; verified against the CA when given */
    RPC_TLS_PEER_REQUIRE,   /* required and verified against the CA */
};

/* The setting names used in messages, so that a process and the CLI can
 * each name their own ("tls_cert" for a process, "--tls-cert" for the CLI). */
struct rpc_tls_names {
    const char *cert, *key, *ca;
};
extern const struct rpc_tls_names rpc_tls_setting_names;  /* tls_cert ... */

/* Read and check the files.  ca is required; cert and key go together and
 * may both be NULL or "" (a client without a certificate; such a struct
 * cannot make server credentials).  names: how to call the three in
 * messages (NULL: rpc_tls_setting_names).  The paths are copied.  NULL with
 * err set on failure. */
struct rpc_tls *rpc_tls_load(const char *cert, const char *key, const char *ca,
                             const struct rpc_tls_names *names, char *err);

/* Read the same files again; on success the new text is used from now on
 * (returns 0), otherwise the running text stays (negative errno, err set). */
int rpc_tls_reload(struct rpc_tls *t, char *err);

/* A SIGHUP hook (rpc_signals_on_hup) for rpc_tls_reload: logs the outcome. */
void rpc_tls_reload_hook(void *t);

/* Whether a certificate and key are loaded. */
bool rpc_tls_has_cert(const struct rpc_tls *t);

/* Free t.  NULL is allowed.  Every server built with its credentials must
 * have been destroyed. */
void rpc_tls_destroy(struct rpc_tls *t);

/* Copies of the certificate chain and key as loaded now (PEM; free both),
 * for a server that is not gRPC (the metrics endpoint).  0, -ENOENT without
 * a certificate, -ENOMEM. */
int rpc_tls_pem_pair(struct rpc_tls *t, char **cert, char **key);

/* Credentials for one listener (a new reference: the caller releases it
 * with grpc_server_credentials_release once the port is added).  t NULL:
 * plaintext.  NULL when t has no certificate or out of memory. */
grpc_server_credentials *rpc_tls_server_credentials(struct rpc_tls *t,
                                                    enum rpc_tls_peer peer);

/* Credentials for a new channel (the caller releases them once the channel
 * is created).  t NULL: plaintext. */
grpc_channel_credentials *rpc_tls_channel_credentials(struct rpc_tls *t);

/* The process-wide client TLS used by rpc_channel_create (kept by pointer,
 * not owned).  NULL: plaintext. */
void rpc_tls_set_client(struct rpc_tls *t);
struct rpc_tls *rpc_tls_client(void);

#endif
