/* metrics_http: serves a registry (metrics.h) as GET /metrics over HTTP,
 * with libmicrohttpd on one thread of its own.
 *
 * Only GET and HEAD of /metrics are served (text exposition format 0.0.4);
 * anything else is 404 or 405.  Bounded: at most 32 connections, 8 per
 * client address, 10 s of idleness, libmicrohttpd's 32 KiB per connection.
 * Plain HTTP, or HTTPS with a certificate and key given at start (read
 * once: a new certificate takes a restart).
 */
#ifndef BLOOMGRID_METRICS_HTTP_H
#define BLOOMGRID_METRICS_HTTP_H

#include "metrics.h"

struct metrics_http;

/* Listen on addr ("host:port", port 0 picks a free one; IPv6 as
 * "[::1]:port") and serve m, over HTTPS when cert_pem and key_pem (PEM
 * text, copied) are given, else plain HTTP (both NULL).  Returns the
 * server, with the bound port in *port, or NULL with a message in err
 * (errlen bytes). */
struct metrics_http *metrics_http_start(const char *addr, struct metrics *m,
                                        const char *cert_pem, const char *key_pem,
                                        int *port, char *err, size_t errlen);
/* Stop serving and free.  NULL is allowed. */
void metrics_http_stop(struct metrics_http *h);

#endif
