/* rpc_metrics: the metrics_listen and metrics_tls settings of every serving
 * process (node, router, merger), which serve the process's registry
 * (metrics_registry(), metrics.h: the RPC server counts every call there,
 * and each module registers its own series there).
 *
 * metrics_listen = "" (the default) serves nothing; otherwise GET /metrics
 * is served on that address (metrics_http.h), in plain HTTP or HTTPS as
 * metrics_tls says:
 *   auto (default)  plain HTTP on a loopback address; HTTPS with the
 *                   process's tls_cert/tls_key on any other; another
 *                   address without them is refused unless --insecure is
 *                   given (then plain HTTP, warned about)
 *   on              HTTPS on any address (tls_cert/tls_key required)
 *   off             plain HTTP on any address: the explicit choice for a
 *                   network only the scraper reaches (warned about at
 *                   start when not loopback); gRPC listeners keep their
 *                   own rule (rpc_listen.h)
 * The HTTPS certificate is the one loaded at start (a SIGHUP renews the
 * gRPC listeners' certificate, not this one).  Any thread.
 */
#ifndef BLOOMGRID_RPC_METRICS_H
#define BLOOMGRID_RPC_METRICS_H

#include <stdbool.h>

#include "metrics.h"

/* The fields the entries below fill. */
#define RPC_METRICS_FIELDS                                                     \
    char metrics_listen[256]; /* GET /metrics, or "" */                        \
    char metrics_tls[8];      /* auto, on, off */

/* The settings-table entries; type is the config struct, holding
 * RPC_METRICS_FIELDS. */
#define RPC_METRICS_SETTING(type)                                              \
    {"metrics_listen", SETTING_ADDR, 0, 0, NULL, "",                           \
     SETTING_FIELD(type, metrics_listen),                                      \
     "address of the Prometheus endpoint (GET /metrics, docs/METRICS.md); "    \
     "port 0 picks a free one; empty: no endpoint"},                           \
    {"metrics_tls", SETTING_ENUM, 0, 0, "auto|on|off", "auto",                 \
     SETTING_FIELD(type, metrics_tls),                                         \
     "HTTPS for metrics_listen with tls_cert/tls_key: auto = plain HTTP on "   \
     "loopback, HTTPS elsewhere (refused without a certificate unless "       \
     "--insecure); on = always HTTPS; off = plain HTTP on any address"}

struct rpc_tls;
struct rpc_metrics_conf {
    const char *listen;       /* metrics_listen */
    const char *tls_mode;     /* metrics_tls: "auto", "on" or "off" */
    struct rpc_tls *tls;      /* the process's TLS files, or NULL */
    bool insecure;            /* --insecure */
};

struct metrics_http;
/* Apply the rule above, then serve the process's registry (with
 * metrics_process_sampler added) and print "PROG metrics on HOST:PORT" on
 * stdout (tests and scripts read the port there; " (https)" follows when
 * it is HTTPS).  An empty listen serves nothing and leaves *out NULL.
 * Returns 0, or -1 after printing "PROG: not starting: REASON" on stderr
 * (the process exits 2).  Call after rpc_signals_block (the server's
 * thread inherits the mask). */
int rpc_metrics_start(const struct rpc_metrics_conf *c, const char *prog,
                      struct metrics_http **out);

#endif
