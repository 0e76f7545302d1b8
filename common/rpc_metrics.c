/* rpc_metrics: the process's registry and its endpoint (see rpc_metrics.h). */
#include "rpc_metrics.h"

#include <stdio.h>

#include "log.h"
#include "metrics_http.h"
#include "rpc_listen.h"

static int check(const char *addr, bool insecure, const char *prog)
{
    if (rpc_listen_loopback(addr))
        return 0;
    if (!insecure) {
        fprintf(stderr, "%s: not starting: metrics_listen %s is not a loopback "
                "address, and metrics are served in plain HTTP: use a loopback "
                "address (a scraper on this host, or a proxy), or give --insecure "
                "to serve them there anyway\n", prog, addr);
        return -1;
    }
    log_warn("--insecure: serving metrics_listen %s in plain HTTP: anyone who "
             "can reach it can read this process's metrics", addr);
    return 0;
}

int rpc_metrics_start(const char *addr, bool insecure, const char *prog,
                      struct metrics_http **out)
{
    char err[256], host[256];
    int port = 0;
    struct metrics *m = metrics_registry();

    *out = NULL;
    if (!addr[0])
        return 0;
    if (check(addr, insecure, prog) < 0)
        return -1;
    if (!m) {
        fprintf(stderr, "%s: not starting: out of memory for metrics\n", prog);
        return -1;
    }
    metrics_add_sampler(m, metrics_process_sampler, NULL);
    if (!(*out = metrics_http_start(addr, m, &port, err, sizeof err))) {
        fprintf(stderr, "%s: not starting: metrics_listen %s: %s\n", prog, addr, err);
        return -1;
    }
    rpc_listen_host(addr, host, sizeof host);
    printf("%s metrics on %s:%d\n", prog, host, port);
    fflush(stdout);
    log_info("metrics on http://%s:%d/metrics", host, port);
    return 0;
}
