/* node_keys_rpc: Add, MayContain, Remove and their streams.
 *
 * The one codec of these messages, rpc_keys.h, decodes a batch without a
 * per-key allocation (it records where each key lies in the request) and
 * checks its filter name and keys by the rules a router applies too; the
 * keys are hashed in one pass under the filter's shared lock and the
 * answer packed by protobuf-c.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "bf.h"
#include "node.h"
#include "node_rpc.h"
#include "rpc_keys.h"
#include "rpc_server.h"
#include "rules.h"
#include "store.h"

static const char *const op_names[] = {"Add", "MayContain", "Remove"};
static const enum rpc_keys_op wire_op[] = {
    [OP_ADD] = RPC_KEYS_ADD,
    [OP_MAY_CONTAIN] = RPC_KEYS_MAY_CONTAIN,
    [OP_REMOVE] = RPC_KEYS_REMOVE,
};

/* A cached filter handle (streams keep it across messages). */
struct filter_ref {
    char name[RULES_FILTER_NAME_MAX + 1];
    struct store_filter *sf;
};

static void filter_ref_drop(struct filter_ref *fr)
{
    if (fr->sf)
        store_put(fr->sf);
    fr->sf = NULL;
    fr->name[0] = 0;
}

/* Hash the decoded keys with the filter's secret (under its shared lock, so
 * a recovery cannot swap the filter meanwhile).  Reads of a filter that
 * takes no writes (a full disk) are still answered; a write to it is
 * refused by the store with the reason. */
struct hash_job {
    const struct rpc_keys *k;
    struct bf_hash *h;
};

static void hash_keys(const struct bf *f, void *ctx)
{
    struct hash_job *j = ctx;
    for (size_t i = 0; i < j->k->n; i++)
        j->h[i] = bf_hash_key(f, j->k->key[i], j->k->len[i]);
}

/* ---- writes answered once durable ----
 *
 * An Add or Remove sets its bits and queues its log record
 * (store_*_hashes_async); its answer goes out from whichever of two
 * parties comes last: the handler, once it has packed the answer, or the
 * log's completion thread (wal.h: the completer, with fsync), once the
 * record is durable.  So no handler thread waits for an fsync.  A unary
 * call is deferred (rpc_reply_defer); a stream posts its answers
 * (rpc_stream_post), which stay in request order because the log completes
 * a stream's records in the order they were queued and the handler packs
 * message i before it queues message i + 1. */

/* A stream's write state, shared with its pending writes. */
struct stream_writes {
    atomic_int refs;                /* the handler's and each pending write's */
    atomic_bool failed;             /* a write could not be made durable */
    struct rpc_status why;          /* set before failed */
};

static void stream_writes_put(struct stream_writes *sw)
{
    if (sw && atomic_fetch_sub(&sw->refs, 1) == 1)
        free(sw);
}

struct pending_write {
    atomic_int parties;             /* 2: the handler and the log's completion */
    int rc;                         /* the store's outcome */
    struct store_filter *sf;        /* held until the record is durable */
    char name[RULES_FILTER_NAME_MAX + 1];
    struct rpc_deferred *d;         /* unary: the call's reply */
    struct rpc_stream *st;          /* stream: held, and where to post */
    struct stream_writes *sw;
    grpc_slice body;                /* stream: the packed answer */
};

static void write_answer(struct pending_write *w)
{
    if (w->d) {
        if (w->rc < 0)
            node_rpc__store_error(rpc_deferred_reply(w->d), NULL, w->name, w->rc,
                                  "the write could not be made durable; nothing "
                                  "was acknowledged");
        rpc_deferred_finish(w->d);
    } else {
        if (w->rc < 0 && !atomic_load(&w->sw->failed)) {
            struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
            node_rpc__store_error(&r, NULL, w->name, w->rc,
                                  "the write could not be made durable; nothing "
                                  "was acknowledged");
            w->sw->why = r.st;
            atomic_store(&w->sw->failed, true);
        }
        /* After a failed write nothing more is answered: answers come in
         * request order, and the stream ends with the failure. */
        if (atomic_load(&w->sw->failed))
            grpc_slice_unref(w->body);
        else
            rpc_stream_post(w->st, w->body);
        rpc_stream_release(w->st);
        stream_writes_put(w->sw);
    }
    store_put(w->sf);
    free(w);
}

static void write_release(struct pending_write *w)
{
    if (atomic_fetch_sub(&w->parties, 1) == 1)
        write_answer(w);
}

/* The log's completion thread: the record is durable (rc 0) or failed. */
static void write_done(void *ctx, int rc)
{
    struct pending_write *w = ctx;
    w->rc = rc;
    write_release(w);
}

/* Queue the write of batch k on the filter of fr (the pending write takes
 * its own reference: a stream may move on to another filter meanwhile) and
 * arrange its answer: through d, a deferred unary call, or posted to st.
 * Returns 0 once the answer is taken care of (for d also when the write was
 * refused: d is then finished here with the error), or -1 with r set when a
 * stream's write was refused (nothing applied). */
static int write_async(enum key_op op, struct rpc_keys *k, const struct bf_hash *h,
                       struct filter_ref *fr, struct rpc_reply *r,
                       struct rpc_deferred *d, struct rpc_stream *st,
                       struct stream_writes *sw)
{
    char err[STORE_ERRLEN] = "";
    struct pending_write *w = calloc(1, sizeof *w);
    int rc;

    if (!w) {
        rpc_reply_error(d ? rpc_deferred_reply(d) : r,
                        GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        if (d)
            rpc_deferred_finish(d);
        return d ? 0 : -1;
    }
    if (st && rpc_stream_hold(st) < 0) {
        free(w);
        rpc_reply_error(r, GRPC_STATUS_CANCELLED, "the call has ended");
        return -1;
    }
    atomic_init(&w->parties, 2);
    w->sf = store_ref(fr->sf);
    snprintf(w->name, sizeof w->name, "%s", fr->name);
    w->d = d;
    w->st = st;
    w->sw = sw;
    if (sw)
        atomic_fetch_add(&sw->refs, 1);
    rc = op == OP_ADD
             ? store_add_hashes_async(fr->sf, h, k->n, k->out, write_done, w, err)
             : store_remove_hashes_async(fr->sf, h, k->n, k->out, write_done, w, err);
    if (rc < 0) {
        /* Nothing was applied and done will not run. */
        store_put(w->sf);
        free(w);
        if (st) {
            stream_writes_put(sw);
            rpc_stream_release(st);
            node_rpc__store_error(r, fr->sf, fr->name, rc, err);
            return -1;
        }
        node_rpc__store_error(rpc_deferred_reply(d), fr->sf, fr->name, rc, err);
        rpc_deferred_finish(d);
        return 0;
    }
    /* added[] is complete: pack the answer, then let go. */
    struct rpc_reply *out = d ? rpc_deferred_reply(d) : r;
    rpc_keys_reply(k, out);
    if (!d) {
        w->body = out->has_body ? out->body : grpc_empty_slice();
        out->has_body = false;
    }
    write_release(w);
    return 0;
}

/* Run one key batch: decode into kb, hash into sc, apply, answer.  Returns
 * 0 when r holds the answer (or the error), 1 when a write's answer goes out
 * once it is durable: deferred (a unary call, st NULL) or posted to st. */
static int run_key_batch(struct node *n, enum key_op op, const uint8_t *buf,
                         size_t len, struct rpc_keys_buf *kb, struct scratch *sc,
                         struct filter_ref *fr, struct rpc_reply *r,
                         struct rpc_stream *st, struct stream_writes *sw)
{
    const struct rpc_keys_limits lim = {.max_keys = n->cfg.max_batch_keys,
                                        .max_key = n->cfg.max_key_size};
    struct rpc_keys k;
    char err[STORE_ERRLEN] = "";
    struct store *s = node_rpc__need_store(n, r);
    if (!s || node_rpc__refuse_public(r, op_names[op], op != OP_MAY_CONTAIN))
        return 0;
    if (rpc_keys_decode(kb, &lim, wire_op[op], buf, len, &k, r) < 0)
        return 0;
    if (k.filter[0] && (!fr->sf || strcmp(k.filter, fr->name) != 0)) {
        filter_ref_drop(fr);
        /* The decoder applied the name rule, which refuses shard names:
         * shards of router-managed filters are reachable only through the
         * internal service (their keys must be placed by shard). */
        fr->sf = store_get(s, k.filter);
        if (!fr->sf) {
            rpc_reply_error(r, GRPC_STATUS_NOT_FOUND,
                            "filter \"%s\" does not exist", k.filter);
            return 0;
        }
        snprintf(fr->name, sizeof fr->name, "%s", k.filter);
    } else if (!k.filter[0] && !fr->sf) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: the request names no filter", op_names[op]);
        return 0;
    }
    if (node_rpc__scratch_reserve(sc, k.n ? k.n : 1) < 0) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return 0;
    }
    struct hash_job job = {.k = &k, .h = sc->hashes};
    int rc = store_filter_read(fr->sf, hash_keys, &job);
    if (rc < 0) {
        node_rpc__store_error(r, fr->sf, fr->name, rc, NULL);
        return 0;
    }
    /* An empty batch still asks the store: a Remove on a kind without
     * counters is refused whatever the number of keys. */
    if (op == OP_MAY_CONTAIN) {
        if (node_rpc__refuse_syncing(fr->sf, r))
            return 0;
        rc = store_may_contain_hashes(fr->sf, sc->hashes, k.n, k.out);
        if (rc < 0) {
            node_rpc__store_error(r, fr->sf, fr->name, rc, err);
            return 0;
        }
        rpc_keys_reply(&k, r);
        return 0;
    }
    if (!st) {
        struct rpc_deferred *d = rpc_reply_defer(r);
        if (!d)
            return 0; /* r holds the error */
        write_async(op, &k, sc->hashes, fr, r, d, NULL, NULL);
        return 1;
    }
    return write_async(op, &k, sc->hashes, fr, r, NULL, st, sw) == 0 ? 1 : 0;
}

static void key_unary(struct node *n, enum key_op op, const uint8_t *req,
                      size_t len, struct rpc_reply *r)
{
    struct filter_ref fr = {0};
    struct scratch *sc = node_rpc__thread_scratch();
    struct rpc_keys_buf *kb = rpc_keys_thread_buf();
    if (!sc || !kb) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    run_key_batch(n, op, req, len, kb, sc, &fr, r, NULL, NULL);
    filter_ref_drop(&fr);
}

void node_rpc__h_add(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    key_unary(arg, OP_ADD, req, len, r);
}

void node_rpc__h_may_contain(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *r)
{
    key_unary(arg, OP_MAY_CONTAIN, req, len, r);
}

void node_rpc__h_remove(void *arg, const uint8_t *req, size_t len, struct rpc_reply *r)
{
    key_unary(arg, OP_REMOVE, req, len, r);
}

/* AddStream and MayContainStream, driven by their messages (struct
 * rpc_loop_stream): each message is decoded and applied where it was read
 * (the event loop), its answer posted at once (reads) or by the commit
 * thread once durable (writes); the stream keeps its filter handle and
 * buffers across messages. */
struct key_stream {
    struct node *n;
    enum key_op op;
    struct rpc_stream *st;
    struct scratch sc;
    struct rpc_keys_buf kb;
    struct filter_ref fr;
    struct stream_writes *sw;
};

static void *key_stream_open(struct node *n, enum key_op op, struct rpc_stream *st)
{
    struct key_stream *ks = calloc(1, sizeof *ks);
    if (!ks)
        return NULL;
    ks->sw = calloc(1, sizeof *ks->sw);
    if (!ks->sw) {
        free(ks);
        return NULL;
    }
    atomic_init(&ks->sw->refs, 1);
    ks->n = n;
    ks->op = op;
    ks->st = st;
    return ks;
}

static void *add_stream_open(void *arg, struct rpc_stream *st)
{
    return key_stream_open(arg, OP_ADD, st);
}

static void *may_contain_stream_open(void *arg, struct rpc_stream *st)
{
    return key_stream_open(arg, OP_MAY_CONTAIN, st);
}

static int key_stream_message(void *state, const uint8_t *buf, size_t len,
                              struct rpc_status *end)
{
    struct key_stream *ks = state;
    if (atomic_load(&ks->sw->failed)) {
        *end = ks->sw->why;   /* answers stopped at the failed write */
        return -1;
    }
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    if (run_key_batch(ks->n, ks->op, buf, len, &ks->kb, &ks->sc, &ks->fr, &r, ks->st,
                      ks->sw) == 1)
        return 0; /* posted once durable */
    if (r.st.code != GRPC_STATUS_OK) {
        *end = r.st;
        return -1;
    }
    grpc_slice body = r.has_body ? r.body : grpc_empty_slice();
    if (rpc_stream_post(ks->st, body) < 0) /* after the answers posted before */
        return -1;                          /* the call is gone */
    return 0;
}

/* Every pending write has answered (or failed) by now. */
static void key_stream_end(void *state, bool failed, struct rpc_status *end)
{
    struct key_stream *ks = state;
    if (!failed && atomic_load(&ks->sw->failed))
        *end = ks->sw->why;
    stream_writes_put(ks->sw);
    filter_ref_drop(&ks->fr);
    node_rpc__scratch_free(&ks->sc);
    rpc_keys_buf_free(&ks->kb);
    free(ks);
}

const struct rpc_loop_stream node_rpc__add_stream = {
    .open = add_stream_open,
    .message = key_stream_message,
    .end = key_stream_end,
};

const struct rpc_loop_stream node_rpc__may_contain_stream = {
    .open = may_contain_stream_open,
    .message = key_stream_message,
    .end = key_stream_end,
};
