/* online_rpc: wire side of the tool's online commands (see online.h).
 *
 * Catalog calls go through protobuf-c, key batches through rpc_keys.h
 * (protobuf-c as well on this side of the wire).
 */
#include "online.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/support/log.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "cli.h"
#include "rpc_auth.h"
#include "rpc_keys.h"
#include "rpc_runtime.h"
#include "rpc_tls.h"
#include "rules.h"

#define SVC "/bloomgrid.v1.BloomGrid/"
#define IMPORT_CHUNK (1u << 20)
/* rpc_cstream_open gives no status: the server is down, or did not answer
 * before the deadline. */
#define STREAM_NOT_STARTED "cannot start the call"

struct online_opts online_global;

static const char *const kind_names[] = {"unspecified", "blocked", "classic",
                                         "counting", "scalable"};
static const char *const state_names[] = {"unknown", "ready", "recovering",
                                          "failed", "syncing"};

/* HOST:PORT by the address rule of every process; gRPC's own target forms
 * (unix:PATH, dns:///HOST:PORT, ...) are passed on as they are. */
static bool target_ok(const char *t)
{
    if (strncmp(t, "unix:", 5) == 0 || strstr(t, ":///"))
        return true;
    return rules_addr_check("--server", t, false, NULL) == 0;
}

static void quiet_log(gpr_log_func_args *args)
{
    (void)args;
}

/* The token to send: o->token_file's, else $BLOOMGRID_TOKEN, else none
 * (buf empty).  Returns 0 or CLI_ERR (printed). */
static int token_get(const struct online *o, char *buf)
{
    char err[RPC_AUTH_ERRLEN];
    const char *env = getenv(RPC_TOKEN_ENV);

    buf[0] = 0;
    if (o->token_file) {
        if (rpc_token_read(o->token_file, buf, err) < 0)
            return cli_fail("--token-file: %s", err);
        return 0;
    }
    if (!env || !env[0])
        return 0;
    if (rpc_token_check("$" RPC_TOKEN_ENV, env, strlen(env), err) < 0)
        return cli_fail("%s", err);
    snprintf(buf, RPC_TOKEN_MAX + 1, "%s", env);
    return 0;
}

int online_open(struct online *o)
{
    char token[RPC_TOKEN_MAX + 1];

    o->ch = NULL;
    if (!o->server || !o->server[0])
        return cli_fail("no server: give --server HOST:PORT or set %s",
                        ONLINE_ENV_SERVER);
    if (!target_ok(o->server))
        return cli_fail("--server must be HOST:PORT with a port from 1 to "
                        "65535, got '%s'", o->server);
    if (o->deadline_ms <= 0)
        o->deadline_ms = ONLINE_DEADLINE_MS;
    if (token_get(o, token))
        return CLI_ERR;
    struct rpc_tls *tls = NULL;
    if (o->tls_ca || o->tls_cert || o->tls_key) {
        static const struct rpc_tls_names flags = {"--tls-cert", "--tls-key",
                                                   "--tls-ca"};
        char err[RPC_TLS_ERRLEN];
        if (!(tls = rpc_tls_load(o->tls_cert, o->tls_key, o->tls_ca, &flags, err)))
            return cli_fail("%s", err);
    }
    /* gRPC's own log lines (a failed handshake...) would come on top of the
     * tool's one-line message, which carries the status text. */
    gpr_set_log_function(quiet_log);
    rpc_runtime_init();
    grpc_init();
    /* The channel keeps its own copy of the files. */
    o->ch = rpc_channel_create_tls(o->server, 0, tls);
    rpc_tls_destroy(tls);
    if (!o->ch || rpc_channel_set_token(o->ch, token) < 0) {
        rpc_channel_destroy(o->ch);
        o->ch = NULL;
        grpc_shutdown();
        return cli_fail("cannot open a channel to %s", o->server);
    }
    return 0;
}

void online_close(struct online *o)
{
    if (!o->ch)
        return;
    rpc_channel_destroy(o->ch);
    o->ch = NULL;
    grpc_shutdown();
}

/* Transport failures come back as UNAVAILABLE with gRPC's own wording;
 * a server's UNAVAILABLE names a filter, shard, group or node instead (a
 * router passes on what its call to a node met, which says "connect"
 * too: the blame is the node's, not the router's). */
static bool unreachable(const struct rpc_status *st)
{
    const char *m = st->message;

    if (st->code != GRPC_STATUS_UNAVAILABLE || st->reason != RPC_REASON_NONE ||
        strstr(m, "node ") || strstr(m, "group ") || strstr(m, "shard ") ||
        strstr(m, "copies") || strstr(m, "filter "))
        return false;
    return !m[0] || strstr(m, "connect") || strstr(m, "Connect") ||
           strstr(m, "resolution") || strstr(m, "resolve") ||
           strstr(m, "Socket closed");
}

int online_report(const struct online *o, const struct rpc_status *st)
{
    if (st->code == GRPC_STATUS_UNAVAILABLE &&
        strcmp(st->message, STREAM_NOT_STARTED) == 0)
        return cli_fail("cannot reach server %s: the call could not start "
                        "within %d ms (see --deadline)", o->server,
                        o->deadline_ms);
    if (unreachable(st) || strstr(st->message, "andshake"))
        return cli_fail("cannot reach server %s: %s%s", o->server,
                        st->message[0] ? st->message : "UNAVAILABLE",
                        strstr(st->message, "andshake")
                            ? " (is its certificate signed by the CA of --tls-ca, "
                              "for this host, and not expired?)"
                        : !o->tls_ca && strstr(st->message, "Socket closed")
                            ? " (a TLS server needs --tls-ca)"
                            : "");
    if (st->code == GRPC_STATUS_DEADLINE_EXCEEDED)
        return cli_fail("server: DEADLINE_EXCEEDED: no answer from %s within "
                        "%d ms (see --deadline)", o->server, o->deadline_ms);
    return cli_fail("server: %s: %s", rpc_status_name(st->code),
                    st->message[0] ? st->message : "(no message)");
}

/* ---- catalog ---------------------------------------------------------- */

bool online_kind_parse(const char *name, int *kind)
{
    for (int i = 1; i < (int)(sizeof kind_names / sizeof kind_names[0]); i++) {
        if (strcmp(name, kind_names[i]) == 0) {
            *kind = i;
            return true;
        }
    }
    return false;
}

static const char *kind_name(int k)
{
    if (k >= 0 && k < (int)(sizeof kind_names / sizeof kind_names[0]))
        return kind_names[k];
    return "unknown";
}

static const char *state_name(int s)
{
    if (s >= 0 && s < (int)(sizeof state_names / sizeof state_names[0]))
        return state_names[s];
    return "unknown";
}

static char *dup_str(const char *s)
{
    char *d = strdup(s ? s : "");
    if (!d) {
        cli_fail("out of memory");
        exit(CLI_ERR);
    }
    return d;
}

static void info_from_wire(struct online_info *d,
                           const Bloomgrid__V1__FilterInfo *s)
{
    memset(d, 0, sizeof *d);
    d->name = dup_str(s->name);
    d->kind = kind_name(s->kind);
    d->capacity = s->capacity;
    d->error_rate = s->error_rate;
    d->shards = s->shards;
    d->placement = s->placement;
    d->hashes = s->hashes;
    d->layers = s->layers;
    d->bits = s->bits;
    d->bytes = s->bytes;
    d->version = s->version;
    d->insert_count = s->insert_count;
    d->fill_ratio = s->fill_ratio;
    d->estimated_count = s->estimated_count;
    d->estimated_error_rate = s->estimated_error_rate;
    d->state = state_name(s->state);
    d->reason = dup_str(s->reason);
    d->over_capacity = s->over_capacity;
    d->fingerprint = dup_str(s->fingerprint);
    if (s->n_shard_info) {
        d->shard = calloc(s->n_shard_info, sizeof *d->shard);
        if (!d->shard) {
            cli_fail("out of memory");
            exit(CLI_ERR);
        }
    }
    d->nshard = s->n_shard_info;
    for (size_t i = 0; i < s->n_shard_info; i++) {
        const Bloomgrid__V1__ShardInfo *w = s->shard_info[i];
        struct online_shard *sh = &d->shard[i];
        sh->index = w->index;
        sh->node = dup_str(w->node);
        sh->state = state_name(w->state);
        sh->reason = dup_str(w->reason);
        sh->bits = w->bits;
        sh->bytes = w->bytes;
        sh->version = w->version;
        sh->fill_ratio = w->fill_ratio;
        sh->estimated_count = w->estimated_count;
    }
}

void online_info_deinit(struct online_info *info)
{
    for (size_t i = 0; i < info->nshard; i++) {
        free(info->shard[i].node);
        free(info->shard[i].reason);
    }
    free(info->shard);
    free(info->name);
    free(info->reason);
    free(info->fingerprint);
    memset(info, 0, sizeof *info);
}

void online_info_list_free(struct online_info *list, size_t n)
{
    for (size_t i = 0; i < n; i++)
        online_info_deinit(&list[i]);
    free(list);
}

static int create_call(struct online *o, const char *name, uint64_t capacity,
                       double error_rate, int kind, uint32_t shards,
                       const uint8_t *secret, uint32_t placement, bool undrop,
                       struct online_info *out, struct rpc_status *st)
{
    Bloomgrid__V1__CreateFilterRequest rq =
        BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;

    rq.undrop = undrop;
    rq.name = (char *)name;
    rq.capacity = capacity;
    rq.error_rate = error_rate;
    rq.kind = (Bloomgrid__V1__FilterKind)kind;
    rq.shards = shards;
    rq.placement = placement;
    if (secret) {
        rq.secret.data = (uint8_t *)secret;
        rq.secret.len = BF_SECRET_LEN;
    }
    if (rpc_call(o->ch, SVC "CreateFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, &resp,
                 o->deadline_ms, st) < 0)
        return -1;
    info_from_wire(out, (Bloomgrid__V1__FilterInfo *)resp);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

int online_create(struct online *o, const char *name, uint64_t capacity,
                  double error_rate, int kind, uint32_t shards,
                  const uint8_t *secret, uint32_t placement,
                  struct online_info *out, struct rpc_status *st)
{
    return create_call(o, name, capacity, error_rate, kind, shards, secret,
                       placement, false, out, st);
}

int online_undrop(struct online *o, const char *name, uint64_t capacity,
                  double error_rate, int kind, uint32_t shards,
                  const uint8_t *secret, uint32_t placement,
                  struct online_info *out, struct rpc_status *st)
{
    return create_call(o, name, capacity, error_rate, kind, shards, secret,
                       placement, true, out, st);
}

int online_drop(struct online *o, const char *name, struct rpc_status *st)
{
    Bloomgrid__V1__DropFilterRequest rq = BLOOMGRID__V1__DROP_FILTER_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;

    rq.name = (char *)name;
    if (rpc_call(o->ch, SVC "DropFilter", &rq.base,
                 &bloomgrid__v1__drop_filter_response__descriptor, &resp,
                 o->deadline_ms, st) < 0)
        return -1;
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

int online_get(struct online *o, const char *name, struct online_info *out,
               struct rpc_status *st)
{
    Bloomgrid__V1__GetFilterRequest rq = BLOOMGRID__V1__GET_FILTER_REQUEST__INIT;
    ProtobufCMessage *resp = NULL;

    rq.name = (char *)name;
    if (rpc_call(o->ch, SVC "GetFilter", &rq.base,
                 &bloomgrid__v1__filter_info__descriptor, &resp,
                 o->deadline_ms, st) < 0)
        return -1;
    info_from_wire(out, (Bloomgrid__V1__FilterInfo *)resp);
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

int online_list(struct online *o, struct online_info **out, size_t *n,
                struct rpc_status *st)
{
    Bloomgrid__V1__ListFiltersRequest rq = BLOOMGRID__V1__LIST_FILTERS_REQUEST__INIT;
    Bloomgrid__V1__ListFiltersResponse *lr;
    ProtobufCMessage *resp = NULL;

    if (rpc_call(o->ch, SVC "ListFilters", &rq.base,
                 &bloomgrid__v1__list_filters_response__descriptor, &resp,
                 o->deadline_ms, st) < 0)
        return -1;
    lr = (Bloomgrid__V1__ListFiltersResponse *)resp;
    *out = calloc(lr->n_filters ? lr->n_filters : 1, sizeof **out);
    if (!*out) {
        protobuf_c_message_free_unpacked(resp, NULL);
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s", "out of memory");
        return -1;
    }
    for (size_t i = 0; i < lr->n_filters; i++)
        info_from_wire(&(*out)[i], lr->filters[i]);
    *n = lr->n_filters;
    protobuf_c_message_free_unpacked(resp, NULL);
    return 0;
}

/* ---- key batches ------------------------------------------------------ */

/* Bytes a key of len bytes adds to the packed request at most: a tag of
 * one byte and a length of up to five. */
#define KEY_FIELD_MAX(len) ((len) + 6)

static int batch_reserve(struct online_batch *b, size_t more)
{
    if (b->used + more > b->cap) {
        size_t cap = b->cap ? b->cap : 64 * 1024;
        while (cap < b->used + more)
            cap *= 2;
        uint8_t *nb = realloc(b->buf, cap);
        if (!nb)
            return -ENOMEM;
        b->buf = nb;
        b->cap = cap;
    }
    if (b->n == b->ncap) {
        size_t nc = b->ncap ? b->ncap * 2 : 1024;
        uint32_t *off = realloc(b->key_off, nc * sizeof *off);
        if (!off)
            return -ENOMEM;
        b->key_off = off;
        uint32_t *len = realloc(b->key_len, nc * sizeof *len);
        if (!len)
            return -ENOMEM;
        b->key_len = len;
        ProtobufCBinaryData *w = realloc(b->wire, nc * sizeof *w);
        if (!w)
            return -ENOMEM;
        b->wire = w;
        bool *ans = realloc(b->answer, nc * sizeof *ans);
        if (!ans)
            return -ENOMEM;
        b->answer = ans;
        b->ncap = nc;
    }
    return 0;
}

int online_batch_init(struct online_batch *b, const char *filter)
{
    memset(b, 0, sizeof *b);
    if (!(b->filter = strdup(filter)))
        return -ENOMEM;
    b->len = KEY_FIELD_MAX(strlen(filter));
    return 0;
}

void online_batch_deinit(struct online_batch *b)
{
    free(b->filter);
    free(b->buf);
    free(b->key_off);
    free(b->key_len);
    free(b->wire);
    free(b->answer);
    memset(b, 0, sizeof *b);
}

void online_batch_clear(struct online_batch *b)
{
    b->len = KEY_FIELD_MAX(strlen(b->filter));
    b->used = 0;
    b->n = 0;
}

int online_batch_add(struct online_batch *b, const void *key, size_t len)
{
    if (len > UINT32_MAX / 2 || batch_reserve(b, len) < 0)
        return -ENOMEM;
    memcpy(b->buf + b->used, key, len);
    b->key_off[b->n] = (uint32_t)b->used;
    b->key_len[b->n] = (uint32_t)len;
    b->n++;
    b->used += len;
    b->len += KEY_FIELD_MAX(len);
    return 0;
}

static const char *const op_methods[] = {SVC "Add", SVC "MayContain",
                                         SVC "Remove"};
static const enum rpc_keys_op wire_op[] = {
    [ONLINE_ADD] = RPC_KEYS_ADD,
    [ONLINE_MAY_CONTAIN] = RPC_KEYS_MAY_CONTAIN,
    [ONLINE_REMOVE] = RPC_KEYS_REMOVE,
};

/* The request of b (its keys stay where they are until it is packed). */
static grpc_slice batch_request(enum online_op op, struct online_batch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        b->wire[i].data = b->buf + b->key_off[i];
        b->wire[i].len = b->key_len[i];
    }
    return rpc_keys_request(wire_op[op], b->filter, b->wire, b->n);
}

size_t online_keys_call(struct online *o, enum online_op op,
                        struct online_batch *b, size_t n,
                        struct rpc_status *st)
{
    struct rpc_multi *calls = calloc(n ? n : 1, sizeof *calls);
    size_t first_bad = n;

    if (!calls) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s", "out of memory");
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        calls[i].ch = o->ch;
        calls[i].method = op_methods[op];
        calls[i].req = batch_request(op, &b[i]);
        calls[i].timeout_ms = o->deadline_ms;
    }
    rpc_call_many(calls, n);
    for (size_t i = 0; i < n; i++) {
        if (first_bad == n) {
            if (calls[i].rc != 0) {
                *st = calls[i].st;
                first_bad = i;
            } else if (rpc_keys_answer(wire_op[op], GRPC_SLICE_START_PTR(calls[i].resp),
                                       GRPC_SLICE_LENGTH(calls[i].resp),
                                       b[i].answer, b[i].n) < 0) {
                rpc_status_set(st, GRPC_STATUS_INTERNAL, "%s",
                               "the answer does not match the keys sent");
                first_bad = i;
            }
        }
        grpc_slice_unref(calls[i].req);
        grpc_slice_unref(calls[i].resp);
    }
    free(calls);
    return first_bad;
}

/* ---- file transfer ---------------------------------------------------- */

static struct rpc_cstream *stream_open(struct online *o, const char *method,
                                       struct rpc_status *st)
{
    struct rpc_cstream *s = rpc_cstream_open(o->ch, method, o->deadline_ms);

    if (!s)
        rpc_status_set(st, GRPC_STATUS_UNAVAILABLE, "%s", STREAM_NOT_STARTED);
    return s;
}

int online_export(struct online *o, const char *name, online_chunk_fn fn,
                  void *ctx, struct rpc_status *st)
{
    Bloomgrid__V1__ExportRequest rq = BLOOMGRID__V1__EXPORT_REQUEST__INIT;
    struct rpc_cstream *s = stream_open(o, SVC "Export", st);
    int stop = 0;

    if (!s)
        return -1;
    rq.filter = (char *)name;
    if (rpc_cstream_write_msg(s, &rq.base) == 0)
        rpc_cstream_close_send(s);
    for (;;) {
        grpc_slice msg;
        int r = rpc_cstream_read(s, &msg);
        if (r <= 0)
            break;
        Bloomgrid__V1__FileChunk *c = bloomgrid__v1__file_chunk__unpack(
            NULL, GRPC_SLICE_LENGTH(msg), GRPC_SLICE_START_PTR(msg));
        grpc_slice_unref(msg);
        if (!c) {
            stop = cli_fail("export: the server sent a malformed chunk");
        } else {
            stop = fn(ctx, c->offset, c->data.data, c->data.len, c->total_size);
            bloomgrid__v1__file_chunk__free_unpacked(c, NULL);
        }
        if (stop) {
            rpc_cstream_cancel(s);
            break;
        }
    }
    if (rpc_cstream_finish(s, st) < 0 && !stop)
        return -1;
    return stop;
}

int online_import(struct online *o, const char *name, online_read_fn rd,
                  void *ctx, struct online_import_result *res,
                  struct rpc_status *st)
{
    Bloomgrid__V1__ImportRequest rq = BLOOMGRID__V1__IMPORT_REQUEST__INIT;
    struct rpc_cstream *s = stream_open(o, SVC "Import", st);
    uint8_t *buf = malloc(IMPORT_CHUNK);
    bool first = true, sent_all = false;
    int stop = 0;

    if (!s || !buf) {
        free(buf);
        if (s) {
            rpc_cstream_cancel(s);
            rpc_cstream_finish(s, st);
            return cli_fail("out of memory");
        }
        return -1;
    }
    /* A write that fails means the server ended the call: its status
     * follows from finish. */
    for (;;) {
        ssize_t got = rd(ctx, buf, IMPORT_CHUNK);
        if (got < 0) {
            stop = CLI_ERR;
            rpc_cstream_cancel(s);
            break;
        }
        if (got == 0 && !first) {
            sent_all = true;
            break;
        }
        rq.filter = first ? (char *)name : (char *)"";
        rq.data.data = buf;
        rq.data.len = (size_t)got;
        first = false;
        if (rpc_cstream_write_msg(s, &rq.base) < 0)
            break;
        if (got == 0) {
            sent_all = true;
            break;
        }
    }
    free(buf);
    memset(res, 0, sizeof *res);
    if (sent_all && rpc_cstream_close_send(s) == 0) {
        grpc_slice msg;
        if (rpc_cstream_read(s, &msg) == 1) {
            Bloomgrid__V1__ImportResponse *r = bloomgrid__v1__import_response__unpack(
                NULL, GRPC_SLICE_LENGTH(msg), GRPC_SLICE_START_PTR(msg));
            grpc_slice_unref(msg);
            if (r) {
                res->bytes_received = r->bytes_received;
                res->projected_fill_ratio = r->projected_fill_ratio;
                res->projected_error_rate = r->projected_error_rate;
                res->over_target = r->over_target;
                if (r->info)
                    info_from_wire(&res->info, r->info);
                bloomgrid__v1__import_response__free_unpacked(r, NULL);
            }
        }
    }
    if (rpc_cstream_finish(s, st) < 0) {
        online_info_deinit(&res->info);
        return stop ? stop : -1;
    }
    if (stop) {
        online_info_deinit(&res->info);
        return stop;
    }
    return 0;
}
