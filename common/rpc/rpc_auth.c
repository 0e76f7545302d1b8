/* rpc_auth: bearer tokens, their roles, and who may call which method (see
 * rpc_auth.h).
 *
 * A table is an open-addressing hash set of token digests (SHA-256), keyed
 * by the digest's first 8 bytes (which say nothing of the token) and
 * compared whole with CRYPTO_memcmp, so that a lookup takes the same time
 * whichever bytes of a wrong digest differ.  The running table of a server
 * is swapped under a write lock at a reload; every lookup holds the read
 * lock only while it probes and copies the role and name out.  A
 * generation number, bumped at each swap, lets an open stream re-check its
 * token only when the table changed.
 */
#include "rpc_auth.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "durable.h"
#include "log.h"
#include "rpc_client.h"

#define TOKENS_FILE_MAX (16u << 20)
#define TOKENS_MAX 100000         /* lines of a tokens file */
#define REFUSALS_PER_S 5          /* refusal lines logged per second at most */

/* ---- who may call what ---- */

/* By service (its descriptor, as the servers register their methods) and
 * method name: the path is "/" service "/" method. */
static const struct {
    const ProtobufCServiceDescriptor *service;
    const char *method;
    enum rpc_auth_rule rule;
} method_rules[] = {
    {&bloomgrid__v1__bloom_grid__descriptor, "MayContain", RPC_AUTH_READ},
    {&bloomgrid__v1__bloom_grid__descriptor, "MayContainStream", RPC_AUTH_READ},
    {&bloomgrid__v1__bloom_grid__descriptor, "GetFilter", RPC_AUTH_READ},
    {&bloomgrid__v1__bloom_grid__descriptor, "ListFilters", RPC_AUTH_READ},
    {&bloomgrid__v1__bloom_grid__descriptor, "Add", RPC_AUTH_WRITE},
    {&bloomgrid__v1__bloom_grid__descriptor, "AddStream", RPC_AUTH_WRITE},
    {&bloomgrid__v1__bloom_grid__descriptor, "Import", RPC_AUTH_WRITE},
    {&bloomgrid__v1__bloom_grid__descriptor, "CreateFilter", RPC_AUTH_ADMIN},
    {&bloomgrid__v1__bloom_grid__descriptor, "DropFilter", RPC_AUTH_ADMIN},
    {&bloomgrid__v1__bloom_grid__descriptor, "Remove", RPC_AUTH_ADMIN},
    /* An export holds the filter's secret. */
    {&bloomgrid__v1__bloom_grid__descriptor, "Export", RPC_AUTH_ADMIN},
    /* An operator's acceptance of a loss: a cluster certificate alone is
     * not enough. */
    {&bloomgrid__v1__internal__descriptor, "Resync", RPC_AUTH_ADMIN},
};

/* Is path "/" service "/" method? */
static bool path_is(const char *path, const ProtobufCServiceDescriptor *service,
                    const char *method)
{
    size_t n = strlen(service->name);
    return path[0] == '/' && strncmp(path + 1, service->name, n) == 0 &&
           path[1 + n] == '/' && strcmp(path + 2 + n, method) == 0;
}

/* Services open to anyone: what a load balancer or an operator's tool asks
 * before it has a token. */
static const char *const open_services[] = {
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1.ServerReflection/",
    "/grpc.reflection.v1alpha.ServerReflection/",
};

enum rpc_auth_rule rpc_auth_rule_of(const char *path)
{
    for (size_t i = 0; i < sizeof open_services / sizeof open_services[0]; i++)
        if (strncmp(path, open_services[i], strlen(open_services[i])) == 0)
            return RPC_AUTH_OPEN;
    for (size_t i = 0; i < sizeof method_rules / sizeof method_rules[0]; i++)
        if (path_is(path, method_rules[i].service, method_rules[i].method))
            return method_rules[i].rule;
    /* Internal, Merger, and whatever a later service adds until it is
     * listed: cluster peers only. */
    return RPC_AUTH_PEER;
}

grpc_status_code rpc_auth_decide(enum rpc_auth_rule rule, const struct rpc_caller *c)
{
    if (!c->tokens || rule == RPC_AUTH_OPEN)
        return GRPC_STATUS_OK;
    if (rule == RPC_AUTH_PEER && c->peer_cert)
        return GRPC_STATUS_OK;
    if (!c->has_token || c->role == RPC_ROLE_NONE)
        return GRPC_STATUS_UNAUTHENTICATED;
    return c->role >= rpc_auth_rule_role(rule) ? GRPC_STATUS_OK
                                               : GRPC_STATUS_PERMISSION_DENIED;
}

enum rpc_role rpc_auth_rule_role(enum rpc_auth_rule rule)
{
    switch (rule) {
    case RPC_AUTH_OPEN:
        return RPC_ROLE_NONE;
    case RPC_AUTH_READ:
        return RPC_ROLE_READ;
    case RPC_AUTH_WRITE:
        return RPC_ROLE_WRITE;
    case RPC_AUTH_ADMIN:
    case RPC_AUTH_PEER:
        break;
    }
    return RPC_ROLE_ADMIN;
}

static const char *const role_names[] = {"none", "read", "write", "admin"};

const char *rpc_role_name(enum rpc_role role)
{
    return (unsigned)role < 4 ? role_names[role] : "none";
}

int rpc_role_parse(const char *name, enum rpc_role *out)
{
    for (int r = RPC_ROLE_READ; r <= RPC_ROLE_ADMIN; r++) {
        if (strcmp(name, role_names[r]) == 0) {
            *out = (enum rpc_role)r;
            return 0;
        }
    }
    return -EINVAL;
}

/* ---- tokens ---- */

/* Fetched once: EVP_sha256() looks the algorithm up on every digest, which
 * costs more than the digest of a token. */
static EVP_MD *sha256_md;
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;

static void sha256_fetch(void)
{
    sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
}

void rpc_token_digest(const char *token, size_t len, uint8_t out[RPC_TOKEN_DIGEST])
{
    unsigned int n = RPC_TOKEN_DIGEST;
    pthread_once(&sha256_once, sha256_fetch);
    /* EVP_Digest fails only when out of memory: a zero digest then matches
     * no line (a file line's digest is never all zero in practice). */
    if (EVP_Digest(token, len, out, &n, sha256_md ? sha256_md : EVP_sha256(), NULL) != 1)
        memset(out, 0, RPC_TOKEN_DIGEST);
}

int rpc_token_check(const char *what, const char *token, size_t len, char *err)
{
    if (len == 0 || len > RPC_TOKEN_MAX) {
        snprintf(err, RPC_AUTH_ERRLEN, "%s: a token is 1 to %d bytes, this one %zu",
                 what, RPC_TOKEN_MAX, len);
        return -EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)token[i];
        if (ch <= 0x20 || ch >= 0x7f) {
            snprintf(err, RPC_AUTH_ERRLEN, "%s: a token is printable ASCII without "
                     "spaces; byte %zu is 0x%02x", what, i, ch);
            return -EINVAL;
        }
    }
    return 0;
}

int rpc_token_read(const char *path, char *buf, char *err)
{
    size_t len;
    char *text = durable_read_all(path, 4096, &len, err, RPC_AUTH_ERRLEN);
    char what[300];

    if (!text)
        return -EIO;
    size_t a = 0, b = len;
    while (a < b && isspace((unsigned char)text[a]))
        a++;
    while (b > a && isspace((unsigned char)text[b - 1]))
        b--;
    snprintf(what, sizeof what, "token file %s", path);
    int rc = rpc_token_check(what, text + a, b - a, err);
    if (rc == 0) {
        memcpy(buf, text + a, b - a);
        buf[b - a] = 0;
    }
    free(text);
    return rc;
}

/* ---- tables ---- */

struct token_slot {
    bool used;
    enum rpc_role role;
    unsigned line;
    uint8_t digest[RPC_TOKEN_DIGEST];
    char name[RPC_TOKEN_NAME_MAX + 1];
};

struct rpc_tokens {
    size_t count;
    size_t mask;                  /* slots - 1, slots a power of two */
    struct token_slot *slot;
};

static size_t slot_home(const struct rpc_tokens *t, const uint8_t *d)
{
    uint64_t h;
    memcpy(&h, d, sizeof h);
    return (size_t)h & t->mask;
}

/* The slot holding d, or the empty slot where it would go. */
static struct token_slot *slot_find(const struct rpc_tokens *t, const uint8_t *d)
{
    size_t i = slot_home(t, d);
    for (;;) {
        struct token_slot *s = &t->slot[i];
        if (!s->used || CRYPTO_memcmp(s->digest, d, RPC_TOKEN_DIGEST) == 0)
            return s;
        i = (i + 1) & t->mask;
    }
}

enum rpc_role rpc_tokens_find(const struct rpc_tokens *t,
                              const uint8_t digest[RPC_TOKEN_DIGEST], const char **name)
{
    const struct token_slot *s = slot_find(t, digest);
    if (!s->used)
        return RPC_ROLE_NONE;
    if (name)
        *name = s->name;
    return s->role;
}

size_t rpc_tokens_count(const struct rpc_tokens *t)
{
    return t->count;
}

void rpc_tokens_free(struct rpc_tokens *t)
{
    if (!t)
        return;
    /* The digests are of secrets: leave nothing behind in freed memory. */
    OPENSSL_cleanse(t->slot, (t->mask + 1) * sizeof *t->slot);
    free(t->slot);
    free(t);
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

bool rpc_token_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > RPC_TOKEN_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && s[i] != '.' && s[i] != '_' && s[i] != '-')
            return false;
    return true;
}

static int cmp_name(const void *a, const void *b)
{
    const struct token_slot *x = *(const struct token_slot *const *)a,
                            *y = *(const struct token_slot *const *)b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->line > y->line) - (x->line < y->line);
}

/* Two lines with one name: the later one is refused. */
static int check_names(struct rpc_tokens *t, const char *file, char *err)
{
    struct token_slot **v = malloc((t->count ? t->count : 1) * sizeof *v);
    size_t n = 0;
    int rc = 0;

    if (!v) {
        snprintf(err, RPC_AUTH_ERRLEN, "%s: out of memory", file);
        return -ENOMEM;
    }
    for (size_t i = 0; i <= t->mask; i++)
        if (t->slot[i].used)
            v[n++] = &t->slot[i];
    qsort(v, n, sizeof *v, cmp_name);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(v[i - 1]->name, v[i]->name) == 0) {
            snprintf(err, RPC_AUTH_ERRLEN, "%s:%u: token name \"%s\" is already used "
                     "on line %u: names must be unique", file, v[i]->line,
                     v[i]->name, v[i - 1]->line);
            rc = -EINVAL;
            break;
        }
    }
    free(v);
    return rc;
}

/* Split one line into at most 4 fields separated by blanks. */
static int split(const char *s, size_t n, const char **f, size_t *fl)
{
    int k = 0;
    size_t i = 0;
    while (i < n) {
        while (i < n && (s[i] == ' ' || s[i] == '\t'))
            i++;
        if (i == n)
            break;
        size_t start = i;
        while (i < n && s[i] != ' ' && s[i] != '\t')
            i++;
        if (k == 4)
            return 5;
        f[k] = s + start;
        fl[k++] = i - start;
    }
    return k;
}

/* Parse one line into slot fields; 0 or -EINVAL with err. */
static int parse_line(const char *s, size_t n, const char *file, unsigned line,
                      struct token_slot *out, char *err)
{
    const char *f[4];
    size_t fl[4];
    char role[16];

    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch < 0x20 && ch != '\t') {
            snprintf(err, RPC_AUTH_ERRLEN, "%s:%u: control byte 0x%02x", file, line, ch);
            return -EINVAL;
        }
    }
    int k = split(s, n, f, fl);
    if (k != 3) {
        snprintf(err, RPC_AUTH_ERRLEN, "%s:%u: expected \"ROLE NAME SHA256HEX\" "
                 "(3 fields), found %s%d", file, line, k > 4 ? "more than " : "",
                 k > 4 ? 4 : k);
        return -EINVAL;
    }
    snprintf(role, sizeof role, "%.*s", (int)(fl[0] < 15 ? fl[0] : 15), f[0]);
    if (fl[0] >= sizeof role || rpc_role_parse(role, &out->role) < 0) {
        snprintf(err, RPC_AUTH_ERRLEN, "%s:%u: role \"%.*s\" is not read, write or "
                 "admin", file, line, (int)(fl[0] < 32 ? fl[0] : 32), f[0]);
        return -EINVAL;
    }
    if (!rpc_token_name_ok(f[1], fl[1])) {
        snprintf(err, RPC_AUTH_ERRLEN, "%s:%u: token name \"%.*s\" must be 1 to %d "
                 "bytes of letters, digits, '.', '_' and '-'", file, line,
                 (int)(fl[1] < 80 ? fl[1] : 80), f[1], RPC_TOKEN_NAME_MAX);
        return -EINVAL;
    }
    memcpy(out->name, f[1], fl[1]);
    out->name[fl[1]] = 0;
    bool hex = fl[2] == 2 * RPC_TOKEN_DIGEST;
    for (size_t i = 0; hex && i < RPC_TOKEN_DIGEST; i++) {
        int hi = hexval(f[2][2 * i]), lo = hexval(f[2][2 * i + 1]);
        hex = hi >= 0 && lo >= 0;
        if (hex)
            out->digest[i] = (uint8_t)(hi << 4 | lo);
    }
    if (!hex) {
        snprintf(err, RPC_AUTH_ERRLEN, "%s:%u: the SHA-256 of token \"%s\" must be %d "
                 "hex digits (bloomgrid token new makes the line)", file, line,
                 out->name, 2 * RPC_TOKEN_DIGEST);
        return -EINVAL;
    }
    out->line = line;
    out->used = true;
    return 0;
}

struct rpc_tokens *rpc_tokens_parse(const char *text, size_t len, const char *file,
                                    char *err)
{
    struct rpc_tokens *t = calloc(1, sizeof *t);
    size_t lines = 0, slots = 8;

    if (!t)
        goto oom;
    /* Lines that may hold a token size the table (at most half full). */
    for (size_t i = 0; i < len; i++) {
        while (i < len && (text[i] == ' ' || text[i] == '\t' || text[i] == '\r'))
            i++;
        if (i < len && text[i] != '\n' && text[i] != '#')
            lines++;
        const char *nl = memchr(text + i, '\n', len - i);
        i = nl ? (size_t)(nl - text) : len;
    }
    if (lines > TOKENS_MAX) {
        snprintf(err, RPC_AUTH_ERRLEN, "%s: %zu lines of tokens, more than %d", file,
                 lines, TOKENS_MAX);
        free(t);
        return NULL;
    }
    while (slots < 2 * lines)
        slots *= 2;
    t->mask = slots - 1;
    if (!(t->slot = calloc(slots, sizeof *t->slot)))
        goto oom;

    unsigned line = 0;
    for (size_t i = 0; i < len;) {
        const char *s = text + i;
        const char *nl = memchr(s, '\n', len - i);
        size_t n = nl ? (size_t)(nl - s) : len - i;
        i += n + (nl != NULL);
        line++;
        if (n && s[n - 1] == '\r')
            n--;
        size_t b = 0;
        while (b < n && (s[b] == ' ' || s[b] == '\t'))
            b++;
        if (b == n || s[b] == '#')
            continue;
        struct token_slot ts = {0};
        if (parse_line(s, n, file, line, &ts, err) < 0)
            goto fail;
        struct token_slot *at = slot_find(t, ts.digest);
        if (at->used) {
            snprintf(err, RPC_AUTH_ERRLEN, "%s:%u: token \"%s\" has the same SHA-256 "
                     "as token \"%s\" on line %u: one token, one line", file, line,
                     ts.name, at->name, at->line);
            goto fail;
        }
        *at = ts;
        OPENSSL_cleanse(&ts, sizeof ts);
        t->count++;
    }
    if (check_names(t, file, err) < 0)
        goto fail;
    return t;
oom:
    snprintf(err, RPC_AUTH_ERRLEN, "%s: out of memory", file);
fail:
    if (t && t->slot)
        rpc_tokens_free(t);
    else
        free(t);
    return NULL;
}

struct rpc_tokens *rpc_tokens_load(const char *path, char *err)
{
    size_t len;
    char *text = durable_read_all(path, TOKENS_FILE_MAX, &len, err, RPC_AUTH_ERRLEN);
    if (!text)
        return NULL;
    struct rpc_tokens *t = rpc_tokens_parse(text, len, path, err);
    free(text);
    return t;
}

/* ---- the running table ---- */

struct rpc_auth {
    char *path;
    pthread_rwlock_t lock;        /* guards cur (the pointer and the swap) */
    struct rpc_tokens *cur;
    atomic_uint_fast64_t gen;     /* bumped at each swap, under the write lock */
    /* Refusal lines: at most REFUSALS_PER_S per second. */
    pthread_mutex_t log_lock;
    time_t log_second;
    unsigned log_count, log_dropped;
};

struct rpc_auth *rpc_auth_create(const char *path, char *err)
{
    struct rpc_auth *a = calloc(1, sizeof *a);
    if (!a || !(a->path = strdup(path))) {
        snprintf(err, RPC_AUTH_ERRLEN, "%s: out of memory", path);
        free(a);
        return NULL;
    }
    if (!(a->cur = rpc_tokens_load(path, err))) {
        free(a->path);
        free(a);
        return NULL;
    }
    pthread_rwlock_init(&a->lock, NULL);
    pthread_mutex_init(&a->log_lock, NULL);
    atomic_init(&a->gen, 1);
    return a;
}

int rpc_auth_reload(struct rpc_auth *a, char *err)
{
    struct rpc_tokens *t = rpc_tokens_load(a->path, err);
    if (!t)
        return -EINVAL;
    pthread_rwlock_wrlock(&a->lock);
    struct rpc_tokens *old = a->cur;
    a->cur = t;
    atomic_fetch_add_explicit(&a->gen, 1, memory_order_release);
    pthread_rwlock_unlock(&a->lock);
    rpc_tokens_free(old);
    return 0;
}

void rpc_auth_reload_hook(void *arg)
{
    struct rpc_auth *a = arg;
    char err[RPC_AUTH_ERRLEN];

    if (rpc_auth_reload(a, err) < 0) {
        log_error("SIGHUP: tokens file refused, the running tokens stay: %s", err);
        return;
    }
    pthread_rwlock_rdlock(&a->lock);
    size_t n = rpc_tokens_count(a->cur);
    pthread_rwlock_unlock(&a->lock);
    log_info("SIGHUP: tokens file %s reloaded: %zu tokens", a->path, n);
}

void rpc_auth_destroy(struct rpc_auth *a)
{
    if (!a)
        return;
    rpc_tokens_free(a->cur);
    pthread_rwlock_destroy(&a->lock);
    pthread_mutex_destroy(&a->log_lock);
    free(a->path);
    free(a);
}

/* Role and name of digest in the current table, and the table's
 * generation. */
static enum rpc_role lookup(struct rpc_auth *a, const uint8_t *digest, char *name,
                            uint64_t *gen)
{
    const char *nm = NULL;
    pthread_rwlock_rdlock(&a->lock);
    enum rpc_role r = rpc_tokens_find(a->cur, digest, &nm);
    *gen = atomic_load_explicit(&a->gen, memory_order_relaxed);
    if (r != RPC_ROLE_NONE)
        snprintf(name, RPC_TOKEN_NAME_MAX + 1, "%s", nm);
    else
        name[0] = 0;
    pthread_rwlock_unlock(&a->lock);
    return r;
}

/* The token of the first authorization header: 1 with *tok set, 0 when
 * there is none, -1 when it is not "Bearer TOKEN". */
static int bearer(const grpc_metadata_array *md, const char **tok, size_t *len)
{
    for (size_t i = 0; i < md->count; i++) {
        if (grpc_slice_str_cmp(md->metadata[i].key, "authorization") != 0)
            continue;
        const char *v = (const char *)GRPC_SLICE_START_PTR(md->metadata[i].value);
        size_t n = GRPC_SLICE_LENGTH(md->metadata[i].value);
        if (n < 8 || strncasecmp(v, "Bearer ", 7) != 0)
            return -1;
        *tok = v + 7;
        *len = n - 7;
        return 1;
    }
    return 0;
}

/* A verified client certificate: an x509 peer identity on a TLS call. */
static bool call_peer_cert(grpc_call *call)
{
    grpc_auth_context *ctx = call ? grpc_call_auth_context(call) : NULL;
    bool ok = false;

    if (!ctx)
        return false;
    if (grpc_auth_context_peer_is_authenticated(ctx)) {
        const char *id = grpc_auth_context_peer_identity_property_name(ctx);
        grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(
            ctx, GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
        const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
        ok = id && strncmp(id, "x509_", 5) == 0 && p &&
             p->value_length == strlen(GRPC_SSL_TRANSPORT_SECURITY_TYPE) &&
             memcmp(p->value, GRPC_SSL_TRANSPORT_SECURITY_TYPE, p->value_length) == 0;
    }
    grpc_auth_context_release(ctx);
    return ok;
}

/* Log one refusal, unless REFUSALS_PER_S were logged this second already. */
static void log_refusal(struct rpc_auth *a, grpc_call *call, const char *path,
                        const struct rpc_status *st)
{
    unsigned dropped = 0;
    time_t now = time(NULL);

    pthread_mutex_lock(&a->log_lock);
    if (now != a->log_second) {
        dropped = a->log_dropped;
        a->log_second = now;
        a->log_count = 0;
        a->log_dropped = 0;
    }
    bool show = a->log_count < REFUSALS_PER_S;
    if (show)
        a->log_count++;
    else
        a->log_dropped++;
    pthread_mutex_unlock(&a->log_lock);
    if (dropped)
        log_warn("%u more refused calls were not logged", dropped);
    if (!show)
        return;
    char *peer = call ? grpc_call_get_peer(call) : NULL;
    log_warn("refused %s from %s: %s: %s", path, peer ? peer : "?",
             rpc_status_name(st->code), st->message);
    gpr_free(peer);
}

static void refusal(const struct rpc_caller *c, enum rpc_auth_rule rule,
                    const char *path, const char *name, bool malformed,
                    grpc_status_code code, struct rpc_status *st)
{
    st->reason = RPC_REASON_NONE;
    st->code = code;
    if (code == GRPC_STATUS_PERMISSION_DENIED && rule == RPC_AUTH_PEER)
        snprintf(st->message, sizeof st->message, "%s is for cluster peers: it needs "
                 "a cluster certificate or an admin token; token \"%s\" has role %s",
                 path, name, rpc_role_name(c->role));
    else if (code == GRPC_STATUS_PERMISSION_DENIED)
        snprintf(st->message, sizeof st->message, "token \"%s\" has role %s; %s "
                 "needs role %s", name, rpc_role_name(c->role), path,
                 rpc_role_name(rpc_auth_rule_role(rule)));
    else if (malformed)
        snprintf(st->message, sizeof st->message, "the authorization header must be "
                 "\"Bearer TOKEN\"");
    else if (c->has_token)
        snprintf(st->message, sizeof st->message, "unknown token: it is not in the "
                 "server's tokens file (or was removed from it)");
    else
        snprintf(st->message, sizeof st->message, "%s needs a token: send "
                 "\"authorization: Bearer TOKEN\" (bloomgrid --token-file FILE or "
                 "$%s)", path, RPC_TOKEN_ENV);
}

int rpc_auth_admit(struct rpc_auth *a, enum rpc_auth_rule rule, const char *path,
                   grpc_call *call, const grpc_metadata_array *md,
                   struct rpc_auth_who *who, struct rpc_status *st)
{
    struct rpc_caller c = {.tokens = true};
    const char *tok = NULL;
    size_t len = 0;

    who->rule = rule;
    who->by_token = false;
    who->name[0] = 0;
    int b = bearer(md, &tok, &len);
    if (b > 0) {
        c.has_token = true;
        rpc_token_digest(tok, len, who->digest);
        c.role = lookup(a, who->digest, who->name, &who->gen);
    }
    /* The auth context is asked only where a certificate decides. */
    who->peer_cert = rule == RPC_AUTH_PEER && c.role != RPC_ROLE_ADMIN &&
                     call_peer_cert(call);
    c.peer_cert = who->peer_cert;
    grpc_status_code code = b < 0 ? GRPC_STATUS_UNAUTHENTICATED : rpc_auth_decide(rule, &c);
    if (code == GRPC_STATUS_OK) {
        who->by_token = !who->peer_cert && rule != RPC_AUTH_OPEN;
        return 0;
    }
    refusal(&c, rule, path, who->name, b < 0, code, st);
    log_refusal(a, call, path, st);
    return -EACCES;
}

int rpc_auth_recheck(struct rpc_auth *a, const char *path, grpc_call *call,
                     struct rpc_auth_who *who, struct rpc_status *st)
{
    if (!who->by_token ||
        atomic_load_explicit(&a->gen, memory_order_acquire) == who->gen)
        return 0;
    struct rpc_caller c = {.tokens = true, .has_token = true, .peer_cert = who->peer_cert};
    char name[RPC_TOKEN_NAME_MAX + 1];
    c.role = lookup(a, who->digest, name, &who->gen);
    grpc_status_code code = rpc_auth_decide(who->rule, &c);
    if (code == GRPC_STATUS_OK)
        return 0;
    refusal(&c, who->rule, path, who->name, false, code, st);
    log_refusal(a, call, path, st);
    return -EACCES;
}

enum rpc_role rpc_auth_lookup(struct rpc_auth *a, const char *token, size_t len,
                              uint8_t digest[RPC_TOKEN_DIGEST], char *name,
                              uint64_t *gen)
{
    char err[RPC_AUTH_ERRLEN];
    name[0] = 0;
    *gen = 0;
    memset(digest, 0, RPC_TOKEN_DIGEST);
    if (rpc_token_check("token", token, len, err) < 0)
        return RPC_ROLE_NONE;
    rpc_token_digest(token, len, digest);
    return lookup(a, digest, name, gen);
}

int rpc_auth_lookup_digest(struct rpc_auth *a, const uint8_t digest[RPC_TOKEN_DIGEST],
                           char *name, uint64_t *gen)
{
    if (atomic_load_explicit(&a->gen, memory_order_acquire) == *gen)
        return -1;
    return (int)lookup(a, digest, name, gen);
}

/* ---- start-up ---- */

int rpc_auth_setup(const char *tokens_file, const char *token_file,
                   struct rpc_auth **auth, char *err)
{
    char token[RPC_TOKEN_MAX + 1];

    *auth = NULL;
    if (token_file[0]) {
        if (rpc_token_read(token_file, token, err) < 0)
            return -EINVAL;
        rpc_client_set_token(token);
        OPENSSL_cleanse(token, sizeof token);
    }
    if (tokens_file[0] && !(*auth = rpc_auth_create(tokens_file, err)))
        return -EINVAL;
    return 0;
}
