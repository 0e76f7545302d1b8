/* rpc_tls: TLS files and gRPC credentials (see rpc_tls.h).
 *
 * The PEM text lives in one struct pem_set, replaced whole by a reload
 * under t->lock and counted by t->gen.  Each listener's credentials get
 * their own fetcher state (the generation it last handed to gRPC): gRPC
 * calls the fetcher of a listener on every handshake, one at a time, and
 * it answers UNCHANGED until a reload moves the generation.  The files are
 * checked with OpenSSL's PEM readers, so that a bad file is refused with
 * its name when read, not at the first handshake.
 */
#include "rpc_tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "durable.h"
#include "log.h"

const struct rpc_tls_names rpc_tls_setting_names = {"tls_cert", "tls_key", "tls_ca"};

struct pem_set {
    char *cert, *key, *ca;     /* PEM text; cert and key NULL without a pair */
};

/* One listener's fetcher: what it last gave gRPC. */
struct fetcher {
    struct fetcher *next;
    struct rpc_tls *t;
    uint64_t gen;
};

struct rpc_tls {
    char *cert_path, *key_path, *ca_path;
    struct rpc_tls_names names;
    pthread_mutex_t lock;      /* pem, gen, fetchers */
    struct pem_set pem;
    uint64_t gen;
    struct fetcher *fetchers;
    /* Channels: gRPC's watcher of the same files, made at the first
     * channel and shared by all (one thread reading them). */
    grpc_tls_certificate_provider *watcher;
};

static struct rpc_tls *client_tls;

static void pem_free(struct pem_set *p)
{
    free(p->cert);
    free(p->key);
    free(p->ca);
    memset(p, 0, sizeof *p);
}

/* The text of path, NUL-terminated; NULL with err naming the setting. */
static char *file_read(const char *what, const char *path, char *err)
{
    char e[RPC_TLS_ERRLEN - 64];
    char *buf = durable_read_all(path, RPC_TLS_FILE_MAX, NULL, e, sizeof e);
    if (!buf)
        snprintf(err, RPC_TLS_ERRLEN, "%s %s", what, e);
    return buf;
}

/* OpenSSL's last error, for messages. */
static const char *ssl_reason(void)
{
    unsigned long e = ERR_peek_last_error();
    const char *r = e ? ERR_reason_error_string(e) : NULL;
    return r ? r : "no PEM block found";
}

/* Warn about a certificate outside its validity period. */
static void cert_check_dates(const char *what, const char *path, X509 *x)
{
    const char *when = NULL;
    if (X509_cmp_current_time(X509_get0_notAfter(x)) < 0)
        when = "has expired";
    else if (X509_cmp_current_time(X509_get0_notBefore(x)) > 0)
        when = "is not valid yet";
    if (!when)
        return;
    char date[64] = "";
    BIO *b = BIO_new(BIO_s_mem());
    if (b && ASN1_TIME_print(b, X509_get0_notAfter(x)) > 0)
        BIO_read(b, date, sizeof date - 1);
    BIO_free(b);
    log_warn("%s %s: the certificate %s (valid until %s): peers will refuse it",
             what, path, when, date);
}

/* Count the certificates in pem (at least one, else -1 with err).  The
 * first is returned in *first when first is not NULL (caller frees). */
static int certs_parse(const char *what, const char *path, const char *pem,
                       X509 **first, char *err)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    int n = 0;
    X509 *x;

    ERR_clear_error();
    while (b && (x = PEM_read_bio_X509(b, NULL, NULL, NULL))) {
        if (n == 0)
            cert_check_dates(what, path, x);
        if (n == 0 && first)
            *first = x;
        else
            X509_free(x);
        n++;
    }
    BIO_free(b);
    if (n == 0) {
        snprintf(err, RPC_TLS_ERRLEN, "%s %s: no PEM certificate in it (%s)",
                 what, path, ssl_reason());
        return -1;
    }
    ERR_clear_error();
    return n;
}

/* Check that key parses and belongs to cert. */
static int key_check(const struct rpc_tls *t, const char *pem, X509 *cert,
                     char *err)
{
    BIO *b = BIO_new_mem_buf(pem, -1);
    EVP_PKEY *k = NULL;
    int rc = -EINVAL;

    ERR_clear_error();
    if (b)
        k = PEM_read_bio_PrivateKey(b, NULL, NULL, NULL);
    BIO_free(b);
    if (!k) {
        snprintf(err, RPC_TLS_ERRLEN, "%s %s: no PEM private key in it (%s; "
                 "an encrypted key is not supported)", t->names.key, t->key_path,
                 ssl_reason());
        goto out;
    }
    if (X509_check_private_key(cert, k) != 1) {
        snprintf(err, RPC_TLS_ERRLEN, "%s %s does not match the certificate of "
                 "%s %s", t->names.key, t->key_path, t->names.cert, t->cert_path);
        goto out;
    }
    rc = 0;
out:
    EVP_PKEY_free(k);
    ERR_clear_error();
    return rc;
}

/* Read and check every file of t into out. */
static int pem_load(const struct rpc_tls *t, struct pem_set *out, char *err)
{
    X509 *cert = NULL;
    memset(out, 0, sizeof *out);

    if (!(out->ca = file_read(t->names.ca, t->ca_path, err)) ||
        certs_parse(t->names.ca, t->ca_path, out->ca, NULL, err) < 0)
        goto fail;
    if (!t->cert_path)
        return 0;
    if (!(out->cert = file_read(t->names.cert, t->cert_path, err)) ||
        certs_parse(t->names.cert, t->cert_path, out->cert, &cert, err) < 0 ||
        !(out->key = file_read(t->names.key, t->key_path, err)) ||
        key_check(t, out->key, cert, err) < 0)
        goto fail;
    X509_free(cert);
    return 0;
fail:
    X509_free(cert);
    pem_free(out);
    return -EINVAL;
}

struct rpc_tls *rpc_tls_load(const char *cert, const char *key, const char *ca,
                             const struct rpc_tls_names *names, char *err)
{
    struct rpc_tls *t = calloc(1, sizeof *t);
    bool pair = cert && cert[0];

    if (!t) {
        snprintf(err, RPC_TLS_ERRLEN, "out of memory");
        return NULL;
    }
    t->names = names ? *names : rpc_tls_setting_names;
    pthread_mutex_init(&t->lock, NULL);
    if (!ca || !ca[0]) {
        snprintf(err, RPC_TLS_ERRLEN, "%s is not set: TLS needs the CA file that "
                 "signs the servers' certificates", t->names.ca);
        goto fail;
    }
    if (pair != (key && key[0])) {
        snprintf(err, RPC_TLS_ERRLEN, "%s and %s go together: set both or neither",
                 t->names.cert, t->names.key);
        goto fail;
    }
    t->ca_path = strdup(ca);
    if (pair) {
        t->cert_path = strdup(cert);
        t->key_path = strdup(key);
    }
    if (!t->ca_path || (pair && (!t->cert_path || !t->key_path))) {
        snprintf(err, RPC_TLS_ERRLEN, "out of memory");
        goto fail;
    }
    if (pem_load(t, &t->pem, err) < 0)
        goto fail;
    t->gen = 1;
    return t;
fail:
    rpc_tls_destroy(t);
    return NULL;
}

int rpc_tls_reload(struct rpc_tls *t, char *err)
{
    struct pem_set next, old;
    int rc = pem_load(t, &next, err);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&t->lock);
    old = t->pem;
    t->pem = next;
    t->gen++;
    pthread_mutex_unlock(&t->lock);
    pem_free(&old);
    return 0;
}

void rpc_tls_reload_hook(void *arg)
{
    struct rpc_tls *t = arg;
    char err[RPC_TLS_ERRLEN];

    if (rpc_tls_reload(t, err) < 0)
        log_error("SIGHUP: TLS files refused, the running ones stay: %s", err);
    else
        log_info("SIGHUP: TLS files reloaded (%s%s%s): new connections and "
                 "new channels use them", t->cert_path ? t->cert_path : "",
                 t->cert_path ? ", " : "", t->ca_path);
}

bool rpc_tls_has_cert(const struct rpc_tls *t)
{
    return t && t->cert_path;
}

int rpc_tls_pem_pair(struct rpc_tls *t, char **cert, char **key)
{
    int rc = 0;

    *cert = *key = NULL;
    pthread_mutex_lock(&t->lock);
    if (!t->pem.cert || !t->pem.key)
        rc = -ENOENT;
    else if (!(*cert = strdup(t->pem.cert)) || !(*key = strdup(t->pem.key)))
        rc = -ENOMEM;
    pthread_mutex_unlock(&t->lock);
    if (rc == -ENOMEM) {
        free(*cert);
        *cert = NULL;
    }
    return rc;
}

void rpc_tls_destroy(struct rpc_tls *t)
{
    if (!t)
        return;
    if (client_tls == t)
        client_tls = NULL;
    while (t->fetchers) {
        struct fetcher *f = t->fetchers;
        t->fetchers = f->next;
        free(f);
    }
    if (t->watcher)
        grpc_tls_certificate_provider_release(t->watcher);
    pem_free(&t->pem);
    free(t->cert_path);
    free(t->key_path);
    free(t->ca_path);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

/* gRPC's fetcher: a new config when the files changed since this listener
 * last asked.  gRPC owns (and destroys) the config it is given. */
static grpc_ssl_certificate_config_reload_status
fetch_config(void *user, grpc_ssl_server_certificate_config **config)
{
    struct fetcher *f = user;
    struct rpc_tls *t = f->t;
    grpc_ssl_certificate_config_reload_status rs =
        GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;

    pthread_mutex_lock(&t->lock);
    if (f->gen != t->gen) {
        /* The config takes copies of the strings. */
        grpc_ssl_pem_key_cert_pair pair = {.private_key = t->pem.key,
                                           .cert_chain = t->pem.cert};
        *config = grpc_ssl_server_certificate_config_create(t->pem.ca, &pair, 1);
        if (*config) {
            f->gen = t->gen;
            rs = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
        } else {
            rs = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return rs;
}

grpc_server_credentials *rpc_tls_server_credentials(struct rpc_tls *t,
                                                    enum rpc_tls_peer peer)
{
    static const grpc_ssl_client_certificate_request_type req[] = {
        [RPC_TLS_PEER_NONE] = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        [RPC_TLS_PEER_VERIFY] = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY,
        [RPC_TLS_PEER_REQUIRE] =
            GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
    };

    if (!t)
        return grpc_insecure_server_credentials_create();
    if (!t->cert_path || (unsigned)peer > RPC_TLS_PEER_REQUIRE)
        return NULL;
    struct fetcher *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->t = t;
    pthread_mutex_lock(&t->lock);
    f->next = t->fetchers;
    t->fetchers = f;
    pthread_mutex_unlock(&t->lock);
    grpc_ssl_server_credentials_options *o =
        grpc_ssl_server_credentials_create_options_using_config_fetcher(
            req[peer], fetch_config, f);
    return o ? grpc_ssl_server_credentials_create_with_options(o) : NULL;
}

grpc_channel_credentials *rpc_tls_channel_credentials(struct rpc_tls *t)
{
    if (!t)
        return grpc_insecure_credentials_create();
    /* Every handshake (the first, and each reconnect of a long-lived
     * channel) takes the files as the watcher last read them, so a renewed
     * client certificate or CA reaches channels that are already open. */
    pthread_mutex_lock(&t->lock);
    if (!t->watcher)
        t->watcher = grpc_tls_certificate_provider_file_watcher_create(
            t->key_path, t->cert_path, t->ca_path, RPC_TLS_WATCH_S);
    grpc_tls_certificate_provider *w = t->watcher;
    pthread_mutex_unlock(&t->lock);
    if (!w)
        return NULL;
    grpc_tls_credentials_options *o = grpc_tls_credentials_options_create();
    if (!o)
        return NULL;
    grpc_tls_credentials_options_set_certificate_provider(o, w);
    grpc_tls_credentials_options_watch_root_certs(o);
    if (t->cert_path)
        grpc_tls_credentials_options_watch_identity_key_cert_pairs(o);
    /* The server's certificate is verified against the CA and must name
     * the target's host (gRPC's default verifier, said here). */
    grpc_tls_credentials_options_set_verify_server_cert(o, 1);
    grpc_tls_certificate_verifier *v = grpc_tls_certificate_verifier_host_name_create();
    grpc_tls_credentials_options_set_certificate_verifier(o, v);
    grpc_tls_certificate_verifier_release(v);
    return grpc_tls_credentials_create(o);
}

void rpc_tls_set_client(struct rpc_tls *t)
{
    client_tls = t;
}

struct rpc_tls *rpc_tls_client(void)
{
    return client_tls;
}
