/* metrics_http: GET /metrics with libmicrohttpd. */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

struct metrics_http {
    struct MHD_Daemon *d;
    struct metrics *m;
    char *cert, *key;   /* PEM, for HTTPS; NULL for plain HTTP */
};

static void http_free(struct metrics_http *h)
{
    if (!h)
        return;
    free(h->cert);
    if (h->key) {
        explicit_bzero(h->key, strlen(h->key));
        free(h->key);
    }
    free(h);
}

static enum MHD_Result reply(struct MHD_Connection *c, unsigned code,
                             const char *type, char *body, size_t len,
                             enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result rc = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_len, void **con_cls)
{
    (void)version;
    (void)upload;
    struct metrics_http *h = cls;
    static const char *text = "text/plain; charset=utf-8";
    if (*con_cls == NULL) {        /* first call: headers only */
        *con_cls = h;
        return MHD_YES;
    }
    if (*upload_len) {             /* a body is not expected: drop it */
        *upload_len = 0;
        return MHD_YES;
    }
    if (strcmp(url, "/metrics") != 0)
        return reply(c, MHD_HTTP_NOT_FOUND, text, (char *)"not found: try /metrics\n",
                     strlen("not found: try /metrics\n"), MHD_RESPMEM_PERSISTENT);
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply(c, MHD_HTTP_METHOD_NOT_ALLOWED, text, (char *)"GET only\n",
                     strlen("GET only\n"), MHD_RESPMEM_PERSISTENT);
    char *body;
    size_t len;
    if (metrics_render_string(h->m, &body, &len) != 0)
        return reply(c, MHD_HTTP_INTERNAL_SERVER_ERROR, text, (char *)"render failed\n",
                     strlen("render failed\n"), MHD_RESPMEM_PERSISTENT);
    return reply(c, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len,
                 MHD_RESPMEM_MUST_FREE);
}

/* "host:port" or "[v6]:port" into a socket address. */
static int parse_addr(const char *addr, struct sockaddr_storage *ss, char *err,
                      size_t errlen)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr) {
        snprintf(err, errlen, "metrics address \"%s\": want HOST:PORT", addr);
        return -EINVAL;
    }
    size_t hl = (size_t)(colon - addr);
    const char *h = addr;
    if (*h == '[' && hl >= 2 && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= sizeof host) {
        snprintf(err, errlen, "metrics address \"%s\": host too long", addr);
        return -EINVAL;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || port < 0 || port > 65535) {
        snprintf(err, errlen, "metrics address \"%s\": bad port", addr);
        return -EINVAL;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE}, *ai;
    int rc = getaddrinfo(*host ? host : NULL, colon + 1, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errlen, "metrics address \"%s\": %s", addr, gai_strerror(rc));
        return -EINVAL;
    }
    memcpy(ss, ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(ai);
    return 0;
}

struct metrics_http *metrics_http_start(const char *addr, struct metrics *m,
                                        const char *cert_pem, const char *key_pem,
                                        int *port, char *err, size_t errlen)
{
    struct sockaddr_storage ss = {0};
    if (parse_addr(addr, &ss, err, errlen) != 0)
        return NULL;
    if (!cert_pem != !key_pem) {
        snprintf(err, errlen, "metrics: HTTPS needs both a certificate and a key");
        return NULL;
    }
    if (cert_pem && MHD_is_feature_supported(MHD_FEATURE_TLS) != MHD_YES) {
        snprintf(err, errlen, "metrics: this libmicrohttpd was built without TLS");
        return NULL;
    }
    struct metrics_http *h = calloc(1, sizeof *h);
    if (!h) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->m = m;
    /* libmicrohttpd keeps pointers to the PEM text: the server owns copies. */
    if (cert_pem && (!(h->cert = strdup(cert_pem)) || !(h->key = strdup(key_pem)))) {
        snprintf(err, errlen, "out of memory");
        http_free(h);
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* Options after MHD_OPTION_END are not read: plain HTTP ends the list
     * before the TLS ones. */
    h->d = MHD_start_daemon(flags | (h->cert ? MHD_USE_TLS : 0), 0, NULL, NULL,
                            on_request, h,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)32,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)8,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)0,
                            h->cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, h->cert,
                            MHD_OPTION_HTTPS_MEM_KEY, h->key,
                            MHD_OPTION_END);
    if (!h->d) {
        snprintf(err, errlen, "metrics: cannot listen on %s (%s)", addr,
                 h->cert ? "address in use, not local, or a certificate/key "
                           "libmicrohttpd cannot use"
                 : errno ? strerror(errno) : "address in use or not local");
        http_free(h);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    *port = di ? (int)di->port : 0;
    return h;
}

void metrics_http_stop(struct metrics_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->d);
    http_free(h);
}
