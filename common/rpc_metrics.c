/* rpc_metrics: the process's registry and its endpoint (see rpc_metrics.h). */
#include "rpc_metrics.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics_http.h"
#include "rpc_listen.h"
#include "rpc_tls.h"

/* Whether to serve HTTPS (1), plain HTTP (0), or refuse (-1). */
static int choose(const struct rpc_metrics_conf *c, const char *prog)
{
    bool loopback = rpc_listen_loopback(c->listen);

    if (strcmp(c->tls_mode, "on") == 0) {
        if (c->tls)
            return 1;
        fprintf(stderr, "%s: not starting: metrics_tls = on needs tls_cert and "
                "tls_key (the certificate HTTPS serves)\n", prog);
        return -1;
    }
    if (strcmp(c->tls_mode, "off") == 0) {
        if (!loopback)
            log_warn("metrics_tls = off: serving metrics_listen %s in plain HTTP: "
                     "anyone who can reach it can read this process's metrics",
                     c->listen);
        return 0;
    }
    if (loopback)
        return 0;
    if (c->tls)
        return 1;
    if (!c->insecure) {
        fprintf(stderr, "%s: not starting: metrics_listen %s is not a loopback "
                "address and there is no tls_cert/tls_key for HTTPS: use a "
                "loopback address (a scraper on this host, or a proxy), give the "
                "process a certificate, or set metrics_tls = off to serve plain "
                "HTTP there\n", prog, c->listen);
        return -1;
    }
    log_warn("--insecure: serving metrics_listen %s in plain HTTP: anyone who "
             "can reach it can read this process's metrics", c->listen);
    return 0;
}

int rpc_metrics_start(const struct rpc_metrics_conf *c, const char *prog,
                      struct metrics_http **out)
{
    char err[256], host[256];
    char *cert = NULL, *key = NULL;
    int port = 0;
    struct metrics *m = metrics_registry();

    *out = NULL;
    if (!c->listen[0])
        return 0;
    int https = choose(c, prog);
    if (https < 0)
        return -1;
    if (!m) {
        fprintf(stderr, "%s: not starting: out of memory for metrics\n", prog);
        return -1;
    }
    if (https && rpc_tls_pem_pair(c->tls, &cert, &key) < 0) {
        fprintf(stderr, "%s: not starting: metrics_listen %s: HTTPS needs "
                "tls_cert and tls_key\n", prog, c->listen);
        return -1;
    }
    metrics_add_sampler(m, metrics_process_sampler, NULL);
    *out = metrics_http_start(c->listen, m, cert, key, &port, err, sizeof err);
    free(cert);
    if (key) {
        explicit_bzero(key, strlen(key));
        free(key);
    }
    if (!*out) {
        fprintf(stderr, "%s: not starting: metrics_listen %s: %s\n", prog, c->listen,
                err);
        return -1;
    }
    rpc_listen_host(c->listen, host, sizeof host);
    log_announce("%s metrics on %s:%d%s", prog, host, port, https ? " (https)" : "");
    log_info("metrics on %s://%s:%d/metrics", https ? "https" : "http", host, port);
    return 0;
}
