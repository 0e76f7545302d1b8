/* resp_door: the Redis door of a server process (resp_door.h). */
#include "resp_door.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rpc_auth.h"
#include "rpc_listen.h"
#include "rpc_tls.h"
#include "version.h"

struct resp_door {
    struct resp_server *srv;
    struct rpc_tls *tls;
    struct rpc_auth *auth;
    char listen[256];
};

static int door_auth(void *arg, const char *token, size_t len, struct resp_who *who)
{
    struct resp_door *d = arg;
    char name[RPC_TOKEN_NAME_MAX + 1];
    uint64_t gen;
    enum rpc_role r = rpc_auth_lookup(d->auth, token, len, who->cred, name, &gen);
    if (r == RPC_ROLE_NONE)
        return -EACCES;
    who->role = (enum resp_role)r;
    who->gen = gen;
    snprintf(who->name, sizeof who->name, "%s", name);
    return 0;
}

static int door_recheck(void *arg, struct resp_who *who)
{
    struct resp_door *d = arg;
    char name[RPC_TOKEN_NAME_MAX + 1];
    int r = rpc_auth_lookup_digest(d->auth, who->cred, name, &who->gen);
    if (r < 0 || r == (int)who->role)
        return 0;
    who->role = (enum resp_role)r;
    return -EACCES;
}

int resp_door_check(const struct resp_door_conf *c)
{
    const char *addr = c->set->resp_listen;
    if (!addr[0] || rpc_listen_loopback(addr))
        return 0;
    const char *miss = !c->tls && !c->auth ? "TLS (tls_cert, tls_key, tls_ca) and "
                                             "tokens_file are"
                       : !c->tls            ? "TLS (tls_cert, tls_key, tls_ca) is"
                       : !c->auth           ? "tokens_file is"
                                            : NULL;
    if (!miss)
        return 0;
    if (!c->insecure) {
        fprintf(stderr, "%s: not starting: resp_listen %s is not a loopback address "
                "and %s not set: anyone who reaches it could read and change every "
                "filter (docs/RESP.md, docs/SECURITY.md); set them, or give "
                "--insecure to serve it anyway\n", c->prog, addr, miss);
        return -1;
    }
    log_warn("--insecure: serving resp_listen %s although %s not set", addr, miss);
    return 0;
}

int resp_door_start(const struct resp_door_conf *c, struct resp_door **out)
{
    char err[RESP_SERVER_ERRLEN];
    char *cert = NULL, *key = NULL;
    struct resp_server_config sc = {.prog = c->prog, .version = bloomgrid_version};
    struct resp_backend be = *c->be;

    *out = NULL;
    if (!c->set->resp_listen[0])
        return 0;
    if (resp_door_check(c) < 0)
        return -1;
    if (resp_settings_config(c->set, &sc, err) < 0) {
        fprintf(stderr, "%s: not starting: %s\n", c->prog, err);
        return -1;
    }
    struct resp_door *d = calloc(1, sizeof *d);
    if (!d) {
        fprintf(stderr, "%s: not starting: out of memory\n", c->prog);
        return -1;
    }
    d->tls = c->tls;
    d->auth = c->auth;
    snprintf(d->listen, sizeof d->listen, "%s", c->set->resp_listen);
    if (c->tls && rpc_tls_pem_pair(c->tls, &cert, &key) < 0) {
        fprintf(stderr, "%s: not starting: resp_listen: the certificate cannot be "
                "read\n", c->prog);
        free(d);
        return -1;
    }
    sc.tls_cert_pem = cert;
    sc.tls_key_pem = key;
    be.auth = c->auth ? door_auth : NULL;
    be.recheck = c->auth ? door_recheck : NULL;
    be.auth_arg = d;
    d->srv = resp_server_create(&sc, &be, err);
    free(cert);
    free(key);
    int port = d->srv ? resp_server_start(d->srv, err) : -1;
    if (port < 0) {
        fprintf(stderr, "%s: not starting: %s\n", c->prog, err);
        resp_server_destroy(d->srv);
        free(d);
        return -1;
    }
    log_info("resp: listening on %s (port %d, %s, %s)", d->listen, port,
             c->tls ? "TLS" : "plaintext", c->auth ? "tokens asked for" : "no tokens");
    *out = d;
    return 0;
}

int resp_door_port(const struct resp_door *d)
{
    return d ? resp_server_port(d->srv) : 0;
}

void resp_door_note(const struct resp_door *d, char *out, size_t len)
{
    char host[256];
    if (!d) {
        if (len)
            out[0] = 0;
        return;
    }
    rpc_listen_host(d->listen, host, sizeof host);
    snprintf(out, len, " resp %s:%d", host, resp_server_port(d->srv));
}

void resp_door_reload_tls(void *door)
{
    struct resp_door *d = door;
    char *cert = NULL, *key = NULL;
    char err[RESP_SERVER_ERRLEN];
    if (!d || !d->tls)
        return;
    if (rpc_tls_pem_pair(d->tls, &cert, &key) < 0) {
        log_error("SIGHUP: resp_listen keeps its certificate: it cannot be read");
        return;
    }
    if (resp_server_set_tls(d->srv, cert, key, err) < 0)
        log_error("SIGHUP: resp_listen keeps its certificate: %s", err);
    else
        log_info("SIGHUP: resp_listen serves the certificate of tls_cert as read now");
    free(cert);
    free(key);
}

void resp_door_stop(struct resp_door *d)
{
    if (!d)
        return;
    resp_server_destroy(d->srv);
    free(d);
}
