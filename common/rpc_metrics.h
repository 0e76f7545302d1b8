/* rpc_metrics: the metrics_listen setting of every serving process (node,
 * router, merger), which serves the process's registry (metrics_registry(),
 * metrics.h: the RPC server counts every call there, and each module
 * registers its own series there).
 *
 * metrics_listen = "" (the default) serves nothing; otherwise GET /metrics is served in plaintext HTTP on that address
 * (metrics_http.h).  The rule of rpc_listen.h applies to it whatever the
 * TLS settings (the metrics listener never speaks TLS): a non-loopback
 * address is refused unless --insecure is given, and is then warned about.
 * Any thread.
 */
#ifndef BLOOMGRID_RPC_METRICS_H
#define BLOOMGRID_RPC_METRICS_H

#include <stdbool.h>

#include "metrics.h"

/* The settings-table entry; type is the config struct, with a field
 * char metrics_listen[] (a host:port, or ""). */
#define RPC_METRICS_SETTING(type)                                              \
    {"metrics_listen", SETTING_ADDR, 0, 0, NULL, "",                           \
     SETTING_FIELD(type, metrics_listen),                                      \
     "address of the Prometheus endpoint (plain HTTP GET /metrics, "           \
     "docs/METRICS.md); port 0 picks a free one; empty: no endpoint; "         \
     "a non-loopback address needs --insecure (no TLS there)"}

struct metrics_http;
/* Apply the start-up rule to addr, then serve the process's registry (with
 * metrics_process_sampler added) there and print "PROG metrics on
 * HOST:PORT" on stdout (tests and scripts read the port there).  ""
 * serves nothing and leaves *out NULL.  Returns 0, or -1 after printing
 * "PROG: not starting: REASON" on stderr (the process exits 2).  Call
 * after rpc_signals_block (the server's thread inherits the mask). */
int rpc_metrics_start(const char *addr, bool insecure, const char *prog,
                      struct metrics_http **out);

#endif
