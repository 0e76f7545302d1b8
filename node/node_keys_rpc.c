/* node_keys_rpc: Add, MayContain, Remove and their streams.
 *
 * The one codec of these messages, rpc_keys.h, decodes a batch without a
 * per-key allocation (it records where each key lies in the request) and
 * checks its filter name and keys by the rules a router applies too; the
 * keys are hashed in one pass under the filter's shared lock and the
 * answer packed by protobuf-c.
 */
#include <errno.h>
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
 * a recovery cannot swap the filter meanwhile). */
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

/* Run one key batch: decode into kb, hash into sc, apply, answer. */
static void run_key_batch(struct node *n, enum key_op op, const uint8_t *buf,
                          size_t len, struct rpc_keys_buf *kb, struct scratch *sc,
                          struct filter_ref *fr, struct rpc_reply *r)
{
    const struct rpc_keys_limits lim = {.max_keys = n->cfg.max_batch_keys,
                                        .max_key = n->cfg.max_key_size};
    struct rpc_keys k;
    char err[STORE_ERRLEN] = "";
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    if (rpc_keys_decode(kb, &lim, wire_op[op], buf, len, &k, r) < 0)
        return;
    if (k.filter[0] && (!fr->sf || strcmp(k.filter, fr->name) != 0)) {
        filter_ref_drop(fr);
        /* The decoder applied the name rule, which refuses shard names:
         * shards of router-managed filters are reachable only through the
         * internal service (their keys must be placed by shard). */
        fr->sf = store_get(s, k.filter);
        if (!fr->sf) {
            rpc_reply_error(r, GRPC_STATUS_NOT_FOUND,
                            "filter \"%s\" does not exist", k.filter);
            return;
        }
        snprintf(fr->name, sizeof fr->name, "%s", k.filter);
    } else if (!k.filter[0] && !fr->sf) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: the request names no filter", op_names[op]);
        return;
    }
    if (op != OP_MAY_CONTAIN &&
        node_rpc__refuse_on_replica(r, op == OP_ADD ? "Add" : "Remove"))
        return;
    if (node_rpc__scratch_reserve(sc, k.n ? k.n : 1) < 0) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    struct hash_job job = {.k = &k, .h = sc->hashes};
    int rc = store_filter_inspect(fr->sf, hash_keys, &job);
    if (rc < 0) {
        node_rpc__store_error(r, fr->sf, fr->name, rc, NULL);
        return;
    }
    {   /* An empty batch still asks the store: a Remove on a kind without
         * counters is refused whatever the number of keys. */
        switch (op) {
        case OP_ADD:
            rc = store_add_hashes(fr->sf, sc->hashes, k.n, k.out, err);
            break;
        case OP_MAY_CONTAIN:
            rc = store_may_contain_hashes(fr->sf, sc->hashes, k.n, k.out);
            break;
        case OP_REMOVE:
            rc = store_remove_hashes(fr->sf, sc->hashes, k.n, k.out, err);
            break;
        }
    }
    if (rc < 0) {
        node_rpc__store_error(r, fr->sf, fr->name, rc, err);
        return;
    }
    rpc_keys_reply(&k, r);
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
    run_key_batch(n, op, req, len, kb, sc, &fr, r);
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

static void key_stream(struct node *n, enum key_op op, struct rpc_stream *st)
{
    struct scratch sc = {0};
    struct rpc_keys_buf kb = {0};
    struct filter_ref fr = {0};
    const uint8_t *buf;
    size_t len;

    for (;;) {
        int rc = rpc_stream_read(st, &buf, &len);
        if (rc < 0)
            goto out;
        if (rc == 0)
            break;
        struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
        run_key_batch(n, op, buf, len, &kb, &sc, &fr, &r);
        if (r.st.code != GRPC_STATUS_OK) {
            rpc_stream_finish_status(st, &r.st);
            goto out;
        }
        grpc_slice body = r.has_body ? r.body : grpc_empty_slice();
        if (rpc_stream_send(st, body) < 0) /* overlaps the next read */
            goto out;
    }
    rpc_stream_finish(st, GRPC_STATUS_OK, "%s", "");
out:
    filter_ref_drop(&fr);
    node_rpc__scratch_free(&sc);
    rpc_keys_buf_free(&kb);
}

void node_rpc__h_add_stream(void *arg, struct rpc_stream *st)
{
    key_stream(arg, OP_ADD, st);
}

void node_rpc__h_may_contain_stream(void *arg, struct rpc_stream *st)
{
    key_stream(arg, OP_MAY_CONTAIN, st);
}

