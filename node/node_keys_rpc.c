/* node_keys_rpc: Add, MayContain, Remove and their streams.
 *
 * These calls skip protobuf-c: a hand-written decoder walks the request once,
 * bounds-checking every length, and records (pointer, length) of each key
 * inside the request buffer, so a batch of a million keys costs no per-key
 * allocation.  Replies (one packed repeated bool) are encoded by hand too.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf.h"
#include "bf_file.h"
#include "log.h"
#include "node.h"
#include "node_rpc.h"
#include "rpc_server.h"
#include "rules.h"
#include "store.h"
#include "wire.h"

static const char *const op_names[] = {"Add", "MayContain", "Remove"};

/* ---- hand-written wire codec for the key batches ---- */

/* Decoded key batch (AddRequest, MayContainRequest, RemoveRequest share the
 * layout: 1 = filter name, 2 = repeated bytes keys). */
struct key_batch {
    char filter[RULES_FILTER_NAME_MAX + 1];
    bool has_filter;
    size_t n;
};

/* Decode a key batch into sc.  Returns a status code; on error the reply
 * message says what is wrong. */
static grpc_status_code decode_key_batch(struct node *n, const uint8_t *buf,
                                         size_t len, struct scratch *sc,
                                         struct key_batch *kb, struct rpc_reply *r)
{
    const uint8_t *p = buf, *end = buf + len;
    uint64_t max_keys = n->cfg.max_batch_keys, max_key = n->cfg.max_key_size;
    char err[RULES_ERRLEN];

    kb->n = 0;
    kb->has_filter = false;
    kb->filter[0] = 0;
    while (p < end) {
        uint64_t tag, v;
        if (!get_varint(&p, end, &tag))
            goto malformed;
        unsigned field = (unsigned)(tag >> 3), wt = (unsigned)(tag & 7);
        if (field == 0)
            goto malformed;
        switch (wt) {
        case 0:
            if (!get_varint(&p, end, &v))
                goto malformed;
            if (field == 1 || field == 2)
                goto malformed;
            break;
        case 1:
            if ((size_t)(end - p) < 8 || field == 1 || field == 2)
                goto malformed;
            p += 8;
            break;
        case 5:
            if ((size_t)(end - p) < 4 || field == 1 || field == 2)
                goto malformed;
            p += 4;
            break;
        case 2:
            if (!get_varint(&p, end, &v) || v > (uint64_t)(end - p))
                goto malformed;
            if (field == 1) {
                /* Checked on the exact bytes: "F\0junk" is not "F". */
                if (v && rules_filter_name_check(p, v, err) < 0) {
                    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
                    return r->st.code;
                }
                memcpy(kb->filter, p, v);
                kb->filter[v] = 0;
                kb->has_filter = v > 0;
            } else if (field == 2) {
                if (kb->n >= max_keys) {
                    rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                    "more than %llu keys in one batch "
                                    "(max_batch_keys); split the batch",
                                    (unsigned long long)max_keys);
                    return r->st.code;
                }
                if (rules_key_check(kb->n, v, max_key, err) < 0) {
                    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
                    return r->st.code;
                }
                if (kb->n >= sc->cap && node_rpc__scratch_reserve(sc, kb->n + 1) < 0) {
                    rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                    "out of memory decoding the batch");
                    return r->st.code;
                }
                sc->key_ptr[kb->n] = p;
                sc->key_len[kb->n] = (uint32_t)v;
                kb->n++;
            }
            p += v;
            break;
        default:
            goto malformed;
        }
    }
    return GRPC_STATUS_OK;
malformed:
    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                    "malformed request message (byte %zu of %zu)",
                    (size_t)(p - buf), len);
    return r->st.code;
}

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
    struct scratch *sc;
    size_t n;
};

static void hash_keys(const struct bf *f, void *ctx)
{
    struct hash_job *j = ctx;
    for (size_t i = 0; i < j->n; i++)
        j->sc->hashes[i] = bf_hash_key(f, j->sc->key_ptr[i], j->sc->key_len[i]);
}

/* Run one key batch: decode, hash, apply, encode. */
static void run_key_batch(struct node *n, enum key_op op, const uint8_t *buf,
                          size_t len, struct scratch *sc, struct filter_ref *fr,
                          struct rpc_reply *r)
{
    struct key_batch kb;
    char err[STORE_ERRLEN] = "";
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    if (decode_key_batch(n, buf, len, sc, &kb, r) != GRPC_STATUS_OK)
        return;
    if (kb.has_filter && (!fr->sf || strcmp(kb.filter, fr->name) != 0)) {
        filter_ref_drop(fr);
        /* Shards of router-managed filters are reachable only through the
         * internal service (their keys must be placed by shard). */
        if (!node_rpc__public_name_ok(kb.filter, r))
            return;
        fr->sf = store_get(s, kb.filter);
        if (!fr->sf) {
            rpc_reply_error(r, GRPC_STATUS_NOT_FOUND,
                            "filter \"%s\" does not exist", kb.filter);
            return;
        }
        snprintf(fr->name, sizeof fr->name, "%s", kb.filter);
    } else if (!kb.has_filter && !fr->sf) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: the request names no filter", op_names[op]);
        return;
    }
    if (op != OP_MAY_CONTAIN &&
        node_rpc__refuse_on_replica(r, op == OP_ADD ? "Add" : "Remove"))
        return;
    if (node_rpc__scratch_reserve(sc, kb.n ? kb.n : 1) < 0) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    struct hash_job job = {.sc = sc, .n = kb.n};
    int rc = store_filter_inspect(fr->sf, hash_keys, &job);
    if (rc < 0) {
        node_rpc__store_error(r, fr->sf, fr->name, rc, NULL);
        return;
    }
    {   /* An empty batch still asks the store: a Remove on a kind without
         * counters is refused whatever the number of keys. */
        switch (op) {
        case OP_ADD:
            rc = store_add_hashes(fr->sf, sc->hashes, kb.n, sc->out, err);
            break;
        case OP_MAY_CONTAIN:
            rc = store_may_contain_hashes(fr->sf, sc->hashes, kb.n, sc->out);
            break;
        case OP_REMOVE:
            rc = store_remove_hashes(fr->sf, sc->hashes, kb.n, sc->out, err);
            break;
        }
    }
    if (rc < 0) {
        node_rpc__store_error(r, fr->sf, fr->name, rc, err);
        return;
    }
    node_rpc__encode_bools(r, sc->out, kb.n, false, 0);
}

static void key_unary(struct node *n, enum key_op op, const uint8_t *req,
                      size_t len, struct rpc_reply *r)
{
    struct filter_ref fr = {0};
    struct scratch *sc = node_rpc__thread_scratch();
    if (!sc) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    run_key_batch(n, op, req, len, sc, &fr, r);
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
        run_key_batch(n, op, buf, len, &sc, &fr, &r);
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
}

void node_rpc__h_add_stream(void *arg, struct rpc_stream *st)
{
    key_stream(arg, OP_ADD, st);
}

void node_rpc__h_may_contain_stream(void *arg, struct rpc_stream *st)
{
    key_stream(arg, OP_MAY_CONTAIN, st);
}

