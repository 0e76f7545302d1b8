/* resp_door: what the node and the router share to open their Redis door:
 * the listening rule, the TLS certificate and tokens of the process's
 * gRPC side (rpc_tls.h, rpc_auth.h) put to work for RESP, start and stop,
 * and the SIGHUP renewal of the certificate.  The glue between the RESP
 * library (which knows neither gRPC nor storage) and the RPC layer; each
 * process brings its own backend (what BF.* commands do).
 *
 * The rule: a resp_listen that is not a loopback address needs TLS
 * (tls_cert, tls_key, tls_ca, as for gRPC) and a tokens_file (RESP
 * clients present no certificate, so a token is the only identity);
 * --insecure serves it without them, warned about at start.  With TLS the
 * RESP port speaks TLS only, with the process's certificate; SIGHUP
 * renews it for connections accepted afterwards (register
 * resp_door_reload_tls after rpc_tls_reload_hook).
 *
 * Threads: start and stop from the main thread; the reload hook on the
 * SIGHUP thread.
 */
#ifndef BLOOMGRID_RESP_DOOR_H
#define BLOOMGRID_RESP_DOOR_H

#include <stdbool.h>
#include <stddef.h>

#include "resp_server.h"
#include "resp_settings.h"

struct rpc_tls;
struct rpc_auth;
struct resp_door;

struct resp_door_conf {
    const struct resp_settings_in *set;
    const char *prog;              /* "bloomgrid-node" */
    struct rpc_tls *tls;           /* the process's TLS files, or NULL */
    struct rpc_auth *auth;         /* its tokens table, or NULL: open */
    bool insecure;                 /* --insecure */
    const struct resp_backend *be; /* bf and reads_wait_writes; the door sets
                                      auth and recheck */
};

/* Check the rule (before anything listens: call early), 0 or -1 after
 * printing "PROG: not starting: REASON" on stderr. */
int resp_door_check(const struct resp_door_conf *c);

/* Create and start the door; *out NULL when resp_listen is "".  Returns
 * 0, or -1 after printing "PROG: not starting: REASON". */
int resp_door_start(const struct resp_door_conf *c, struct resp_door **out);

/* " resp HOST:PORT" for the "listening on" line ("" for NULL). */
void resp_door_note(const struct resp_door *d, char *out, size_t len);
int resp_door_port(const struct resp_door *d);

/* For rpc_signals_on_hup (arg: the door): take the certificate the
 * process's TLS holds now (after rpc_tls_reload_hook), logging the
 * outcome.  NULL door or no TLS: nothing. */
void resp_door_reload_tls(void *door);

/* Stop (connections closed, calls in flight finished: the backend must
 * still work) and free.  NULL is allowed. */
void resp_door_stop(struct resp_door *d);

#endif
