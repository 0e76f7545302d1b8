/* router_rpc: the public bloomgrid.v1.BloomGrid handlers of bloomgrid-router
 * (Export and Import: router_rpc_transfer.c).  What the router asks of the
 * nodes goes through router_nodes.h, whose requests node_client.h builds.
 *
 * Key batches (Add, MayContain, Remove and their streams) go through the
 * codec a node uses (rpc_keys.h: no per-key allocation, the same rules and
 * messages) and never keep a thread waiting for the nodes: a unary call's
 * reply is deferred (rpc_reply_defer) and sent by whichever thread
 * completes its batch (router_keys_start); a stream, served on the event
 * loop message by message (struct rpc_loop_stream), keeps reading while up
 * to STREAM_WINDOW of its messages are with the nodes, and their answers
 * are posted in request order (rpc_stream_post).  Catalog calls use the
 * generated protobuf-c code; FilterInfo of
 * a sharded filter is the aggregate of its shards (sums of bits, bytes, n-hat
 * and inserts; fill weighted by bits; estimated FPR the mean over shards,
 * since a random absent key lands on a random shard).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "log.h"
#include "router.h"
#include "router_nodes.h"
#include "router_rpc.h"
#include "rpc_keys.h"
#include "rpc_server.h"
#include "rules.h"

/* ---- key batches ---- */

bool router_rpc__name_ok(const char *name, struct rpc_reply *rep)
{
    char err[RULES_ERRLEN];
    if (rules_filter_name_check(name, strlen(name), err) < 0) {
        rpc_reply_error(rep, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        return false;
    }
    return true;
}

static const char *const op_names[] = {"Add", "MayContain", "Remove"};
static const enum rpc_keys_op wire_op[] = {
    [ROUTER_ADD] = RPC_KEYS_ADD,
    [ROUTER_MAY_CONTAIN] = RPC_KEYS_MAY_CONTAIN,
    [ROUTER_REMOVE] = RPC_KEYS_REMOVE,
};

/* Decode one key batch into k (with kb) and settle its filter: the one it
 * names, else cur, the filter of the stream so far ("" for none; updated).
 * Returns 0, or -1 with rep set. */
static int keys_decode(struct router *r, enum router_key_op op, const uint8_t *buf,
                       size_t len, struct rpc_keys_buf *kb, struct rpc_keys *k,
                       char *cur, struct rpc_reply *rep)
{
    const struct rpc_keys_limits lim = {.max_keys = r->cfg.max_batch_keys,
                                        .max_key = r->cfg.max_key_size};
    /* The decoder applies the name rule of every node. */
    if (rpc_keys_decode(kb, &lim, wire_op[op], buf, len, k, rep) < 0)
        return -1;
    if (k->filter[0]) {
        snprintf(cur, RULES_FILTER_NAME_MAX + 1, "%s", k->filter);
    } else if (!cur[0]) {
        rpc_reply_error(rep, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: the request names no filter", op_names[op]);
        return -1;
    }
    return 0;
}

/* What the router builds for each key of a batch, beyond the request's own
 * bytes, rounded up: the decoded pointers and lengths, its hash twice (the
 * batch's shard order and a node's message), its answer on the way back
 * and its share of the batch's bookkeeping.  Counted against max_memory_mb
 * (rpc_server.h, "Request budget") before the keys are hashed. */
#define KEY_COST 96

/* Keep a copy of a stream's message in *buf (capacity *cap): the keys are
 * read again after the server let go of the original (a batch run again
 * with a new secret).  Returns the copy or NULL. */
static uint8_t *keep_copy(uint8_t **buf, size_t *cap, const uint8_t *req, size_t len)
{
    if (len > *cap || !*buf) {
        uint8_t *p = realloc(*buf, len ? len : 1);
        if (!p)
            return NULL;
        *buf = p;
        *cap = len ? len : 1;
    }
    if (len)
        memcpy(*buf, req, len);
    return *buf;
}

/* ---- unary Add, MayContain, Remove: deferred replies ---- */

/* One unary key call between its handler and its answer.  Calls are kept
 * on a short free list with their buffers, so that a busy router does not
 * allocate them per call. */
struct unary_call {
    struct unary_call *next;
    struct rpc_deferred *d;
    struct rpc_keys_buf kb;
    struct rpc_keys k;
};

#define UNARY_FREE_MAX 256
static pthread_mutex_t unary_mu = PTHREAD_MUTEX_INITIALIZER;
static struct unary_call *unary_free;
static size_t unary_nfree;

static struct unary_call *unary_get(void)
{
    pthread_mutex_lock(&unary_mu);
    struct unary_call *u = unary_free;
    if (u) {
        unary_free = u->next;
        unary_nfree--;
    }
    pthread_mutex_unlock(&unary_mu);
    return u ? u : calloc(1, sizeof *u);
}

static void unary_put(struct unary_call *u)
{
    pthread_mutex_lock(&unary_mu);
    if (unary_nfree < UNARY_FREE_MAX && u->kb.cap <= 4096) {
        u->next = unary_free;
        unary_free = u;
        unary_nfree++;
        u = NULL;
    }
    pthread_mutex_unlock(&unary_mu);
    if (u) {
        rpc_keys_buf_free(&u->kb);
        free(u);
    }
}

/* The batch's answer: fill the deferred reply and send it. */
static void unary_done(void *arg, int rc, const struct rpc_status *st)
{
    struct unary_call *u = arg;
    struct rpc_reply *rep = rpc_deferred_reply(u->d);
    if (rc < 0)
        rpc_reply_fail(rep, st->code, st->reason, "%s", st->message);
    else
        rpc_keys_reply(&u->k, rep);
    rpc_deferred_finish(u->d);
    unary_put(u);
}

/* Check the request, count what it takes, defer the reply and hand the
 * batch to the nodes: the loop (or worker) thread is free again once the
 * hashes are on their way.  The keys point into req, which the server
 * keeps (and counts) until the reply is sent (rpc_server.h, "Request
 * budget"). */
static void key_unary(void *arg, enum router_key_op op, const uint8_t *req,
                      size_t len, struct rpc_reply *rep)
{
    struct router *r = arg;
    char cur[RULES_FILTER_NAME_MAX + 1] = "";
    struct unary_call *u = unary_get();
    if (!u) {
        rpc_reply_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    if (keys_decode(r, op, req, len, &u->kb, &u->k, cur, rep) < 0 ||
        rpc_reply_charge(rep, (size_t)u->k.n * KEY_COST) < 0)
        goto fail;
    u->d = rpc_reply_defer(rep);
    if (!u->d)
        goto fail;      /* rep says why (max_deferred, shutdown) */
    router_keys_start(r, cur, op, u->k.key, u->k.len, u->k.n, u->k.out, unary_done, u);
    return;
fail:
    if (u)
        unary_put(u);
}

static void h_add(void *arg, const uint8_t *req, size_t len, struct rpc_reply *rep)
{
    key_unary(arg, ROUTER_ADD, req, len, rep);
}

static void h_may_contain(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *rep)
{
    key_unary(arg, ROUTER_MAY_CONTAIN, req, len, rep);
}

static void h_remove(void *arg, const uint8_t *req, size_t len, struct rpc_reply *rep)
{
    key_unary(arg, ROUTER_REMOVE, req, len, rep);
}

/* ---- AddStream, MayContainStream: pipelined ---- */

/* Messages of one stream submitted and not yet answered, at most. */
#define STREAM_WINDOW 64

struct stream_ctx;

/* One message of a stream, from its read to its answer's post. */
struct stream_msg {
    struct stream_ctx *c;
    struct rpc_keys_buf kb;
    struct rpc_keys k;
    uint8_t *req;
    size_t cap;
    size_t charged;             /* of max_memory_mb, until answered */
    bool ready;                 /* rep holds its answer or its error */
    bool held;                  /* a hold on the stream is its own */
    struct rpc_reply rep;
};

/* The window of a stream: messages [head, tail) are in it, by number;
 * head is the first whose answer is not posted yet. */
struct stream_ctx {
    struct router *r;
    enum router_key_op op;
    struct rpc_stream *s;
    char cur[RULES_FILTER_NAME_MAX + 1];   /* the stream's filter so far */
    pthread_mutex_t mu;
    uint64_t head, tail;
    bool failed;                /* a message failed: fst ends the stream */
    struct rpc_status fst;
    struct stream_msg m[STREAM_WINDOW];
};

/* Post the answers of the ready messages at the window's front, in order;
 * the first error stops the posting (later answers are dropped).  c->mu
 * held.  Returns how many holds the caller must give back once it has let
 * go of c->mu. */
static int stream_post_ready(struct stream_ctx *c)
{
    int release = 0;
    bool was_full = c->tail - c->head == STREAM_WINDOW;
    while (c->head < c->tail) {
        struct stream_msg *m = &c->m[c->head % STREAM_WINDOW];
        if (!m->ready)
            break;
        if (!c->failed && m->rep.st.code != GRPC_STATUS_OK) {
            c->failed = true;
            c->fst = m->rep.st;
        } else if (!c->failed) {
            rpc_stream_post(c->s, m->rep.has_body ? m->rep.body : grpc_empty_slice());
            m->rep.has_body = false;
        }
        if (m->rep.has_body) {
            grpc_slice_unref(m->rep.body);
            m->rep.has_body = false;
        }
        release += m->held;
        m->held = false;
        m->ready = false;
        /* Answered: what it held goes back, and so do large buffers, so
         * that a stream keeps no more than it counts. */
        rpc_server_uncharge(c->r->srv, m->charged);
        m->charged = 0;
        if (m->cap > RPC_BUDGET_PROBE) {
            free(m->req);
            m->req = NULL;
            m->cap = 0;
        }
        if (m->kb.cap > 4096)
            rpc_keys_buf_free(&m->kb);
        c->head++;
    }
    /* A full window paused the reading (stream_message said 1). */
    if (was_full && c->tail - c->head < STREAM_WINDOW)
        rpc_stream_resume(c->s);
    return release;
}

/* m's answer is in (rep filled): post what is ready.  Not a thing of c is
 * touched after its mutex is let go (the last release may free it). */
static void stream_msg_ready(struct stream_msg *m)
{
    struct stream_ctx *c = m->c;
    struct rpc_stream *s = c->s;
    pthread_mutex_lock(&c->mu);
    m->ready = true;
    int release = stream_post_ready(c);
    pthread_mutex_unlock(&c->mu);
    while (release-- > 0)
        rpc_stream_release(s);
}

static void stream_done(void *arg, int rc, const struct rpc_status *st)
{
    struct stream_msg *m = arg;
    m->rep = (struct rpc_reply){.st.code = GRPC_STATUS_OK};
    if (rc < 0)
        rpc_reply_fail(&m->rep, st->code, st->reason, "%s", st->message);
    else
        rpc_keys_reply(&m->k, &m->rep);
    stream_msg_ready(m);
}

/* The streams are driven by their messages (struct rpc_loop_stream): each
 * message is handed to the nodes as it is read, up to STREAM_WINDOW
 * unanswered (then the reading pauses); the answers are posted in request
 * order by whichever thread completes the window's front.  An error in a
 * message ends the stream with it, after the answers of the messages
 * before it, as if they had run one after the other. */
static void *stream_open(struct router *r, enum router_key_op op, struct rpc_stream *s)
{
    struct stream_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->r = r;
    c->op = op;
    c->s = s;
    pthread_mutex_init(&c->mu, NULL);
    for (size_t i = 0; i < STREAM_WINDOW; i++)
        c->m[i].c = c;
    return c;
}

static void *add_stream_open(void *arg, struct rpc_stream *s)
{
    return stream_open(arg, ROUTER_ADD, s);
}

static void *may_contain_stream_open(void *arg, struct rpc_stream *s)
{
    return stream_open(arg, ROUTER_MAY_CONTAIN, s);
}

static int stream_message(void *state, const uint8_t *buf, size_t len,
                          struct rpc_status *end)
{
    struct stream_ctx *c = state;
    (void)end;   /* an error goes out in its turn, through c->fst */
    pthread_mutex_lock(&c->mu);
    bool failed = c->failed;
    struct stream_msg *m = &c->m[c->tail % STREAM_WINDOW];
    pthread_mutex_unlock(&c->mu);
    if (failed)
        return -1;
    m->rep = (struct rpc_reply){.st.code = GRPC_STATUS_OK};
    /* The copy, then what the keys take, counted before either is made. */
    struct rpc_server *srv = c->r->srv;
    const uint8_t *copy = NULL;
    bool ok = false;
    if (rpc_server_charge(srv, len, &m->rep.st) < 0)
        goto out;
    m->charged = len;
    if (!(copy = keep_copy(&m->req, &m->cap, buf, len)))
        rpc_reply_error(&m->rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    else if (keys_decode(c->r, c->op, copy, len, &m->kb, &m->k, c->cur, &m->rep) == 0 &&
             rpc_server_charge(srv, (size_t)m->k.n * KEY_COST, &m->rep.st) == 0) {
        m->charged += (size_t)m->k.n * KEY_COST;
        ok = rpc_stream_hold(c->s) == 0;
    }
out:
    pthread_mutex_lock(&c->mu);
    c->tail++;
    bool full = c->tail - c->head == STREAM_WINDOW;
    m->held = ok;
    pthread_mutex_unlock(&c->mu);
    if (!ok) {
        /* The error ends the stream in its turn: read nothing more, as
         * a handler running the messages one by one would. */
        stream_msg_ready(m);
        return -1;
    }
    router_keys_start(c->r, c->cur, c->op, m->k.key, m->k.len, m->k.n, m->k.out,
                      stream_done, m);
    return full ? 1 : 0;
}

/* Every message read has been answered (or dropped after an error). */
static void stream_end(void *state, bool failed, struct rpc_status *end)
{
    struct stream_ctx *c = state;
    if (!failed && c->failed)
        *end = c->fst;
    for (size_t i = 0; i < STREAM_WINDOW; i++) {
        rpc_server_uncharge(c->r->srv, c->m[i].charged);
        rpc_keys_buf_free(&c->m[i].kb);
        free(c->m[i].req);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static const struct rpc_loop_stream add_stream = {
    .open = add_stream_open, .message = stream_message, .end = stream_end};
static const struct rpc_loop_stream may_contain_stream = {
    .open = may_contain_stream_open, .message = stream_message, .end = stream_end};

/* ---- FilterInfo of a sharded filter ---- */

struct info_buf {
    Bloomgrid__V1__FilterInfo fi;
    Bloomgrid__V1__ShardInfo *si;
    Bloomgrid__V1__ShardInfo **sip;
    char reason[300];
    char fp[17];
};

static int info_build(struct info_buf *ib, struct router_filter_desc *d)
{
    Bloomgrid__V1__FilterInfo *fi = &ib->fi;
    uint32_t S = d->shards, ok = 0, failed = 0, recovering = 0;
    double fill_bits = 0, fpr_sum = 0;
    const struct router_shard_desc *bad = NULL;
    XXH3_state_t *xs = XXH3_createState();

    bloomgrid__v1__filter_info__init(fi);
    ib->si = calloc(S ? S : 1, sizeof *ib->si);
    ib->sip = calloc(S ? S : 1, sizeof *ib->sip);
    if (!ib->si || !ib->sip || !xs) {
        free(ib->si);
        free(ib->sip);
        XXH3_freeState(xs);
        return -ENOMEM;
    }
    XXH3_64bits_reset(xs);
    ib->reason[0] = 0;
    fi->name = d->name;
    fi->shards = S;
    fi->placement = d->placement;
    fi->reason = ib->reason;
    fi->fingerprint = ib->fp;
    for (uint32_t s = 0; s < S; s++) {
        const struct router_shard_desc *sd = &d->shard[s];
        Bloomgrid__V1__ShardInfo *si = &ib->si[s];
        bloomgrid__v1__shard_info__init(si);
        ib->sip[s] = si;
        si->index = s;
        si->node = (char *)sd->node;
        si->state = sd->state;
        si->reason = (char *)sd->reason;
        if (sd->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_RECOVERING)
            recovering++;
        else if (sd->state != BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY)
            failed++;
        if (sd->state != BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY && !bad)
            bad = sd;
        if (!sd->ok)
            continue;
        si->bits = sd->bits;
        si->bytes = sd->bytes;
        si->fill_ratio = sd->fill_ratio;
        si->estimated_count = sd->estimated_count;
        si->version = sd->version;
        if (sd->state != BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY)
            continue;
        if (!ok++) {
            fi->kind = sd->kind;
            fi->error_rate = sd->error_rate;
            fi->hashes = sd->hashes;
        }
        /* Saturating: S shards of ceil(capacity / S) can sum past 2^64. */
        fi->capacity = fi->capacity > UINT64_MAX - sd->capacity
                           ? UINT64_MAX : fi->capacity + sd->capacity;
        fi->bits += sd->bits;
        fi->bytes += sd->bytes;
        fill_bits += sd->fill_ratio * (double)sd->bits;
        fi->estimated_count += sd->estimated_count;
        fpr_sum += sd->estimated_error_rate;
        fi->version += sd->version;
        fi->insert_count += sd->insert_count;
        fi->over_capacity |= sd->over_capacity;
        if (sd->layers > fi->layers)
            fi->layers = sd->layers;
        XXH3_64bits_update(xs, sd->fingerprint, strlen(sd->fingerprint) + 1);
    }
    fi->fill_ratio = fi->bits ? fill_bits / (double)fi->bits : 0;
    fi->estimated_error_rate = ok ? fpr_sum / ok : 0;
    if (ok && fi->estimated_error_rate > fi->error_rate)
        fi->over_capacity = true;
    snprintf(ib->fp, sizeof ib->fp, "%016" PRIx64, (uint64_t)XXH3_64bits_digest(xs));
    XXH3_freeState(xs);
    if (failed)
        fi->state = BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED;
    else if (recovering)
        fi->state = BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_RECOVERING;
    else
        fi->state = BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY;
    if (bad)
        snprintf(ib->reason, sizeof ib->reason, "%u of %u shards not ready; shard "
                 "%u on node %.64s: %.160s", failed + recovering, S, bad->index, bad->node,
                 bad->reason[0] ? bad->reason : "not ready");
    fi->n_shard_info = S;
    fi->shard_info = ib->sip;
    return 0;
}

static void info_free(struct info_buf *ib)
{
    free(ib->si);
    free(ib->sip);
}

/* ---- catalog ---- */

#define UNPACK_OR_FAIL(type, fn, var, req, len, rep)                          \
    type *var = fn##__unpack(NULL, len, req);                                  \
    if (!var) {                                                                \
        rpc_reply_error(rep, GRPC_STATUS_INVALID_ARGUMENT,                     \
                        "malformed " #type " message");                       \
        return;                                                                \
    }

static void reply_desc(struct router_filter_desc *d, struct rpc_reply *rep)
{
    struct info_buf ib;
    if (info_build(&ib, d) < 0) {
        rpc_reply_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    rpc_reply_pack(rep, &ib.fi.base);
    info_free(&ib);
}

static void h_create_filter(void *arg, const uint8_t *req, size_t len,
                            struct rpc_reply *rep)
{
    struct router *r = arg;
    UNPACK_OR_FAIL(Bloomgrid__V1__CreateFilterRequest,
                   bloomgrid__v1__create_filter_request, m, req, len, rep);
    struct rpc_status st;
    struct router_filter_desc d;
    struct router_create c = {
        .name = m->name,
        .capacity = m->capacity,
        .error_rate = m->error_rate,
        .kind = m->kind,
        .shards = m->shards,
        .secret = m->secret.len ? m->secret.data : NULL,
        .undrop = m->undrop,
        .placement = m->placement,
    };
    char err[RULES_ERRLEN];
    if (!c.shards)
        c.shards = router_default_shards(r, m->kind, m->capacity, m->error_rate);
    /* Every rule a node applies to each shard, checked before any fan-out. */
    if (!router_rpc__name_ok(m->name, rep))
        goto out;
    if (rules_params_check(m->capacity, m->error_rate, err) < 0 ||
        rules_kind_check(m->kind, err) < 0 ||
        rules_shard_count_check(c.shards, err) < 0 ||
        rules_secret_check(m->secret.len, err) < 0) {
        rpc_reply_error(rep, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        goto out;
    }
    if (c.undrop && !c.secret) {
        rpc_reply_error(rep, GRPC_STATUS_INVALID_ARGUMENT, "filter \"%s\": an "
                        "undrop needs the dropped filter's secret (a backup's "
                        "file holds it: bloomgrid restore --undrop)", m->name);
        goto out;
    }
    if (router_create_filter(r, &c, &d, &st) < 0) {
        rpc_reply_fail(rep, st.code, st.reason, "%s", st.message);
        goto out;
    }
    reply_desc(&d, rep);
    router_filter_desc_free(&d);
out:
    bloomgrid__v1__create_filter_request__free_unpacked(m, NULL);
}

static void h_drop_filter(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *rep)
{
    struct router *r = arg;
    UNPACK_OR_FAIL(Bloomgrid__V1__DropFilterRequest,
                   bloomgrid__v1__drop_filter_request, m, req, len, rep);
    struct rpc_status st;
    if (router_rpc__name_ok(m->name, rep)) {
        if (router_drop_filter(r, m->name, &st) < 0) {
            rpc_reply_fail(rep, st.code, st.reason, "%s", st.message);
        } else {
            Bloomgrid__V1__DropFilterResponse resp =
                BLOOMGRID__V1__DROP_FILTER_RESPONSE__INIT;
            rpc_reply_pack(rep, &resp.base);
        }
    }
    bloomgrid__v1__drop_filter_request__free_unpacked(m, NULL);
}

static void h_get_filter(void *arg, const uint8_t *req, size_t len,
                         struct rpc_reply *rep)
{
    struct router *r = arg;
    UNPACK_OR_FAIL(Bloomgrid__V1__GetFilterRequest,
                   bloomgrid__v1__get_filter_request, m, req, len, rep);
    struct rpc_status st;
    struct router_filter_desc d;
    if (router_rpc__name_ok(m->name, rep)) {
        if (router_describe_filter(r, m->name, &d, &st) < 0) {
            rpc_reply_fail(rep, st.code, st.reason, "%s", st.message);
        } else {
            reply_desc(&d, rep);
            router_filter_desc_free(&d);
        }
    }
    bloomgrid__v1__get_filter_request__free_unpacked(m, NULL);
}

static void h_list_filters(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *rep)
{
    struct router *r = arg;
    UNPACK_OR_FAIL(Bloomgrid__V1__ListFiltersRequest,
                   bloomgrid__v1__list_filters_request, m, req, len, rep);
    bloomgrid__v1__list_filters_request__free_unpacked(m, NULL);
    struct rpc_status st;
    struct router_filter_desc *d = NULL;
    size_t nd = 0, k = 0;
    if (router_list_filters(r, &d, &nd, &st) < 0) {
        rpc_reply_fail(rep, st.code, st.reason, "%s", st.message);
        return;
    }
    struct info_buf *ibs = calloc(nd ? nd : 1, sizeof *ibs);
    Bloomgrid__V1__FilterInfo **fis = calloc(nd ? nd : 1, sizeof *fis);
    if (!ibs || !fis) {
        rpc_reply_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (; k < nd; k++) {
        if (info_build(&ibs[k], &d[k]) < 0) {
            rpc_reply_error(rep, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        fis[k] = &ibs[k].fi;
    }
    Bloomgrid__V1__ListFiltersResponse resp = BLOOMGRID__V1__LIST_FILTERS_RESPONSE__INIT;
    resp.n_filters = nd;
    resp.filters = fis;
    rpc_reply_pack(rep, &resp.base);
out:
    for (size_t i = 0; ibs && i < k; i++)
        info_free(&ibs[i]);
    for (size_t i = 0; i < nd; i++)
        router_filter_desc_free(&d[i]);
    free(d);
    free(ibs);
    free(fis);
}

int router_rpc__write_info(struct rpc_stream *s, Bloomgrid__V1__ImportResponse *resp,
                           struct router_filter_desc *d)
{
    struct info_buf ib;
    if (info_build(&ib, d) < 0) {
        rpc_stream_finish(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    resp->info = &ib.fi;
    int rc = rpc_stream_write(s, &resp->base);
    resp->info = NULL;
    info_free(&ib);
    return rc;
}

/* Descriptor order: CreateFilter, DropFilter, ListFilters, GetFilter, Add,
 * MayContain, Remove, AddStream, MayContainStream, Export, Import. */
const struct rpc_handler router_rpc_public[] = {
    {.unary = h_create_filter},
    {.unary = h_drop_filter},
    {.unary = h_list_filters},
    {.unary = h_get_filter},
    {.unary = h_add, .checks_strings = true, .loop = true},
    {.unary = h_may_contain, .checks_strings = true, .loop = true},
    {.unary = h_remove, .checks_strings = true, .loop = true},
    {.loop_stream = &add_stream, .checks_strings = true},
    {.loop_stream = &may_contain_stream, .checks_strings = true},
    {.stream = router_rpc__export},
    {.stream = router_rpc__import},
};

const size_t router_rpc_public_count =
    sizeof router_rpc_public / sizeof router_rpc_public[0];
