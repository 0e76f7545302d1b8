/* rpc_listen: the start-up rule (see rpc_listen.h). */
#include "rpc_listen.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "rpc_server.h"
#include "rpc_tls.h"

static bool set(const char *s)
{
    return s && s[0];
}

bool rpc_listen_loopback(const char *addr)
{
    char host[256];
    const char *colon = strrchr(addr, ':');
    size_t n = strlen(addr);

    /* host:port, [v6]:port, or a bare host. */
    if (addr[0] == '[') {
        const char *end = strchr(addr, ']');
        if (!end)
            return false;
        addr++;
        n = (size_t)(end - addr);
    } else if (colon && strchr(addr, ':') == colon) {
        n = (size_t)(colon - addr);
    }
    if (n >= sizeof host)
        return false;
    memcpy(host, addr, n);
    host[n] = 0;
    if (strcmp(host, "localhost") == 0)
        return true;
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) ||
               (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return false;
}

bool rpc_listen_tls(const struct rpc_listen_rule *r)
{
    return set(r->tls_cert) && set(r->tls_key) && set(r->tls_ca);
}

/* A non-loopback address without TLS: refused, or warned about with
 * --insecure. */
static int plaintext_check(const struct rpc_listen_rule *r, const char *what,
                           const char *addr, char *err)
{
    if (!set(addr) || rpc_listen_loopback(addr))
        return 0;
    if (!r->insecure) {
        snprintf(err, RPC_LISTEN_ERRLEN, "%s %s is not a loopback address and "
                 "TLS is not set: set tls_cert, tls_key and tls_ca (docs/SECURITY.md), "
                 "or give --insecure to serve it in plaintext anyway", what, addr);
        return -1;
    }
    log_warn("--insecure: serving %s %s in plaintext, without TLS: anyone who "
             "can reach it can read and change every filter", what, addr);
    return 0;
}

/* A non-loopback public listener without a tokens file (its clients
 * present no certificate): refused, or warned about with --insecure. */
static int tokens_check(const struct rpc_listen_rule *r, char *err)
{
    if (r->tokens || !set(r->listen) || rpc_listen_loopback(r->listen))
        return 0;
    if (!r->insecure) {
        snprintf(err, RPC_LISTEN_ERRLEN, "listen %s is not a loopback address and "
                 "tokens_file is not set: anyone who reaches it could drop filters "
                 "and read their secrets; set tokens_file (docs/SECURITY.md), or "
                 "give --insecure to serve it without tokens anyway", r->listen);
        return -1;
    }
    log_warn("--insecure: serving listen %s without a tokens file: anyone who "
             "can reach it can drop filters and read their secrets", r->listen);
    return 0;
}

int rpc_listen_check(const struct rpc_listen_rule *r, char *err)
{
    bool cert = set(r->tls_cert), key = set(r->tls_key), ca = set(r->tls_ca);

    if (cert != key || cert != ca) {
        snprintf(err, RPC_LISTEN_ERRLEN, "tls_cert, tls_key and tls_ca go "
                 "together: %s%s%s%s not set",
                 cert ? "" : "tls_cert ", key ? "" : "tls_key ", ca ? "" : "tls_ca ",
                 (cert + key + ca) == 2 ? "is" : "are");
        return -1;
    }
    if (!cert)
        return plaintext_check(r, "listen", r->listen, err) < 0 ||
                       plaintext_check(r, "internal_listen", r->internal_listen, err) < 0 ||
                       tokens_check(r, err) < 0
                   ? -1
                   : 0;
    if (r->has_internal && !set(r->internal_listen)) {
        snprintf(err, RPC_LISTEN_ERRLEN, "with TLS set, internal_listen must be "
                 "set too: the HOST:PORT where routers, the merger and the other "
                 "copies call this node (client certificates of tls_ca required "
                 "there); the topology lists that address");
        return -1;
    }
    return tokens_check(r, err);
}

int rpc_listen_setup(const struct rpc_listen_rule *r, const char *prog,
                     struct rpc_tls **tls)
{
    char err[RPC_LISTEN_ERRLEN > RPC_TLS_ERRLEN ? RPC_LISTEN_ERRLEN : RPC_TLS_ERRLEN];

    *tls = NULL;
    if (rpc_listen_check(r, err) < 0) {
        fprintf(stderr, "%s: not starting: %s\n", prog, err);
        return -1;
    }
    if (!rpc_listen_tls(r))
        return 0;
    if (!(*tls = rpc_tls_load(r->tls_cert, r->tls_key, r->tls_ca, NULL, err))) {
        fprintf(stderr, "%s: not starting: %s\n", prog, err);
        return -1;
    }
    rpc_tls_set_client(*tls);
    return 0;
}

void rpc_listen_host(const char *addr, char *host, size_t len)
{
    snprintf(host, len, "%s", addr);
    char *colon = strrchr(host, ':');
    if (colon)
        *colon = 0;
}

int rpc_listen_add_health(struct rpc_server *srv, const char *addr)
{
    if (!addr || !addr[0])
        return 0;
    struct rpc_listener hl = {.listen = addr};
    int li = rpc_server_add_listener(srv, &hl);
    if (li < 0)
        log_error("cannot add the health listener %s: %s", addr, strerror(-li));
    return li;
}

unsigned rpc_listen_not(int index)
{
    return index > 0 ? RPC_LISTENERS_ALL & ~(1u << index) : RPC_LISTENERS_ALL;
}

void rpc_listen_health_note(const struct rpc_server *srv, int index,
                            const char *addr, char *out, size_t len)
{
    char host[256];
    if (index <= 0) {
        snprintf(out, len, "%s", "");
        return;
    }
    rpc_listen_host(addr, host, sizeof host);
    snprintf(out, len, " health %s:%d", host, rpc_server_port(srv, index));
}
