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
 * A host name other than localhost counts as non-loopback (it is not
 * resolved here).  Pure checks, no I/O but the warning log lines; any
 * thread.
 */
#ifndef BLOOMGRID_RPC_LISTEN_H
#define BLOOMGRID_RPC_LISTEN_H

#include <stdbool.h>
#include <stddef.h>

#define RPC_LISTEN_ERRLEN 512

struct rpc_listen_rule {
    const char *listen;           /* the public listener, host:port */
    const char *internal_listen;  /* "" or NULL: none */
    bool has_internal;            /* serves bloomgrid.v1.Internal (the node) */
    const char *tls_cert, *tls_key, *tls_ca;  /* "" or NULL: not set */
    bool insecure;                /* --insecure */
};

/* Is host:port (or a bare host) a loopback address? */
bool rpc_listen_loopback(const char *addr);

/* Whether TLS is configured (all three files named). */
bool rpc_listen_tls(const struct rpc_listen_rule *r);

/* Apply the rule.  Returns 0 when the process may start (warnings
 * logged), or -1 with a sentence in err (RPC_LISTEN_ERRLEN bytes) that
 * says what to set. */
int rpc_listen_check(const struct rpc_listen_rule *r, char *err);

#endif
