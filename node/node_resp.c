/* node_resp: BF.* commands on the node's store (node_resp.h).
 *
 * A key command follows the gRPC key path (node_keys_rpc.c): the store,
 * the group rule, the filter, the keys hashed under the filter's shared
 * lock; a read answers at once from the bits (refused while the shard is
 * SYNCING), a write sets its bits and queues its log record
 * (store_add_hashes_async) and is answered by the commit thread once the
 * record is durable.  The adds of one loop pass to one filter are joined
 * into one such write, and the writes of a pass committed by the loop
 * thread at its end (below).  An add to a missing filter that may create it runs
 * the creation and then the add on libuv's pool.
 */
#include "node_resp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf.h"
#include "log.h"
#include "node_rpc.h"
#include "rules.h"
#include "store.h"
#include "wal.h"

/* A refusal in r (a gRPC handler's) as the call's failure. */
static void fail_reply(struct resp_call *c, const struct rpc_reply *r)
{
    resp_call_fail(c, (int)r->st.code, "%s", r->st.message);
}

struct hash_job {
    const struct resp_call *c;
    struct bf_hash *h;
};

static void hash_keys(const struct bf *f, void *ctx)
{
    struct hash_job *j = ctx;
    for (size_t i = 0; i < j->c->n; i++)
        j->h[i] = bf_hash_key(f, j->c->keys[i], j->c->lens[i]);
}

/* The commit thread: the write is durable (rc 0) or failed. */
static void write_done(void *ctx, int rc)
{
    struct resp_call *c = ctx;
    struct store_filter *sf = c->bctx[0];
    if (rc < 0) {
        struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
        node_rpc__store_error(&r, NULL, c->filter, rc,
                              "the write could not be made durable; nothing was "
                              "acknowledged");
        fail_reply(c, &r);
    }
    store_put(sf);
    resp_call_done(c);
}

/* Hash c's keys into the filter sf (held) and apply c's op.  Any thread.
 * Finishes c (now, or from the commit thread). */
static void apply_keys(struct node *n, struct resp_call *c, struct store_filter *sf)
{
    (void)n;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    char err[STORE_ERRLEN] = "";
    struct scratch *sc = node_rpc__thread_scratch();
    if (!sc || node_rpc__scratch_reserve(sc, c->n ? c->n : 1) < 0) {
        resp_call_fail(c, RESP_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    struct hash_job job = {c, sc->hashes};
    int rc = store_filter_read(sf, hash_keys, &job);
    if (rc < 0) {
        node_rpc__store_error(&r, sf, c->filter, rc, NULL);
        fail_reply(c, &r);
        goto done;
    }
    if (c->op == RESP_BF_EXISTS) {
        if (node_rpc__refuse_syncing(sf, &r)) {
            fail_reply(c, &r);
            goto done;
        }
        rc = store_may_contain_hashes(sf, sc->hashes, c->n, c->out);
        if (rc < 0) {
            node_rpc__store_error(&r, sf, c->filter, rc, err);
            fail_reply(c, &r);
        }
        goto done;
    }
    c->bctx[0] = sf;
    rc = store_add_hashes_async(sf, sc->hashes, c->n, c->out, write_done, c, err);
    if (rc == 0)
        return;   /* write_done finishes c and lets go of sf */
    node_rpc__store_error(&r, sf, c->filter, rc, err);
    fail_reply(c, &r);
done:
    store_put(sf);
    resp_call_done(c);
}

/* ---- the adds of one loop pass, joined ----
 *
 * BF.ADD and BF.MADD on a filter that is there are not written one by one:
 * their keys are hashed at once (under the filter's shared lock, as
 * apply_keys does) and held in the loop thread's batch, and at the end of
 * the loop pass (the library's pass_end, before the loop waits for I/O
 * again) the batch is one store_add_hashes_async: one log record, one
 * wake of the commit thread, one completion, for every add of the pass on
 * that filter, from every connection.  The answers are those of the adds
 * made one after the other in the order they came (a key added twice
 * answers 1 then 0).  Any other command flushes the batch first, so that
 * its bits are set before a later command reads the filter (a pipelined
 * BF.ADD x, BF.EXISTS x answers 1, 1), and an add to another filter, or
 * one that would take the batch past BATCH_KEYS, flushes it too.  A
 * write's reply still goes out only once the whole batch is durable. */

#define BATCH_KEYS 4096

struct add_batch {
    struct store_filter *sf;   /* one reference per call */
    size_t n, cap;             /* keys */
    struct bf_hash *h;
    bool *out;
    size_t ncalls, ccap;
    struct resp_call **calls;
};

/* The loop thread's batch (one door, one loop thread, per process). */
static __thread struct add_batch *held;
/* Records started with wal_hold that the pass's end commits (wal_lead). */
static __thread bool led_pending;

/* Passes the loop drains (resp_backend.pass_drain) before committing the
 * adds it holds: each a poll that does not wait, made only while the last
 * one brought commands (a client's pass of writes after its replies). */
#define LEAD_DRAIN 8

/* How long the last group this thread led took (write, fdatasync and
 * completions), in ns: the bound of the wait for the clients it answered
 * (node_pass_wait). */
static __thread uint64_t lead_ns;

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The commit thread (or the loop thread on a refusal): finish every call
 * of b with its slice of the answers, or with rc's failure. */
static void batch_finish(struct add_batch *b, int rc, const char *err)
{
    size_t off = 0;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    if (rc < 0)
        node_rpc__store_error(&r, b->sf, b->calls[0]->filter, rc, err);
    for (size_t i = 0; i < b->ncalls; i++) {
        struct resp_call *c = b->calls[i];
        if (rc < 0)
            fail_reply(c, &r);
        else
            memcpy(c->out, b->out + off, c->n * sizeof *c->out);
        off += c->n;
        store_put(b->sf);
    }
    resp_calls_done(b->calls, b->ncalls);   /* one wake of the loop */
    free(b->h);
    free(b->out);
    free(b->calls);
    free(b);
}

static void batch_done(void *ctx, int rc)
{
    batch_finish(ctx, rc, rc < 0 ? "the write could not be made durable; nothing "
                                   "was acknowledged" : NULL);
}

/* Does the loop thread commit its pass's writes (resp_commit = loop)? */
static bool leads(const struct node *n)
{
    return n->cfg.resp_commit[0] == 'l';
}

/* Start the held batch (loop thread).  Its calls finish later, or now on
 * a refusal.  Leading, its log record waits for the pass's end
 * (wal_hold): node_pass_end commits it. */
static void batch_flush(const struct node *n)
{
    bool lead_commit = leads(n);
    struct add_batch *b = held;
    char err[STORE_ERRLEN] = "";
    if (!b)
        return;
    held = NULL;   /* a call finished below may resume a connection */
    if (lead_commit) {
        wal_hold(true);
        led_pending = true;
    }
    int rc = store_add_hashes_async(b->sf, b->h, b->n, b->out, batch_done, b, err);
    if (lead_commit)
        wal_hold(false);
    if (rc < 0)
        batch_finish(b, rc, err);
}

/* Every held add started (loop thread): before any other command. */
static void batch_flush_all(const struct node *n)
{
    while (held)
        batch_flush(n);
}

/* The end of a loop pass: the adds held are started, and their records
 * (every add of the pass, of every filter) committed as one group by
 * this thread when the log's commit thread is idle (wal_lead: one
 * fdatasync, then every reply of the pass goes out from here, as Redis
 * does with appendfsync always); otherwise the commit thread takes them.
 * Their completions may resume connections that hold more adds. */
static void node_pass_end(void *arg)
{
    const struct node *n = arg;
    do {
        batch_flush_all(n);
        led_pending = false;
        if (leads(n)) {
            uint64_t t0 = mono_ns();
            if (wal_lead() > 0)
                lead_ns = mono_ns() - t0;
        }
    } while (held);
}

/* Does the loop hold adds whose commit it leads (durability fsync)? */
static bool node_pass_held(void *arg)
{
    const struct node *n = arg;
    return (held || led_pending) && leads(n) && n->cfg.durability[0] == 'f';
}

/* How long the loop may wait, after a group it led answered its clients,
 * for them to send their next adds before it commits those it holds
 * without them (resp_backend.pass_wait_ns): wal_commit_delay_us, and no
 * longer than the last led group took (a wait that brings no one costs
 * at most one more such group's time; the commit thread's rule).  0
 * (no wait) when the loop does not lead. */
static uint64_t node_pass_wait(void *arg)
{
    const struct node *n = arg;
    if (!leads(n) || n->cfg.durability[0] != 'f')
        return 0;
    uint64_t d = n->cfg.wal_commit_delay_us * 1000u;
    return d < lead_ns ? d : lead_ns;
}

struct hash_into {
    const struct resp_call *c;
    struct bf_hash *h;
};

static void hash_keys_into(const struct bf *f, void *ctx)
{
    struct hash_into *j = ctx;
    for (size_t i = 0; i < j->c->n; i++)
        j->h[i] = bf_hash_key(f, j->c->keys[i], j->c->lens[i]);
}

/* Hold the add c to sf (held by the caller, the reference passes to the
 * batch).  Returns 0, or -1 when c must go on its own (too large, out of
 * memory): the caller keeps sf then. */
static int batch_hold(struct resp_call *c, struct store_filter *sf)
{
    if (c->n == 0 || c->n > BATCH_KEYS)
        return -1;
    if (held && (held->sf != sf || held->n + c->n > BATCH_KEYS))
        batch_flush(c->bctx[1]);
    struct add_batch *b = held;
    if (!b) {
        if (!(b = calloc(1, sizeof *b)))
            return -1;
        b->sf = sf;
    }
    if (b->n + c->n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + c->n)
            cap *= 2;
        struct bf_hash *h = realloc(b->h, cap * sizeof *h);
        if (h)
            b->h = h;
        bool *o = h ? realloc(b->out, cap * sizeof *o) : NULL;
        if (o)
            b->out = o;
        if (!h || !o)
            goto no;
        b->cap = cap;
    }
    if (b->ncalls == b->ccap) {
        size_t cap = b->ccap ? b->ccap * 2 : 16;
        struct resp_call **v = realloc(b->calls, cap * sizeof *v);
        if (!v)
            goto no;
        b->calls = v;
        b->ccap = cap;
    }
    struct hash_into job = {c, b->h + b->n};
    int rc = store_filter_read(sf, hash_keys_into, &job);
    if (rc < 0)
        goto no;   /* on its own: apply_keys answers the refusal */
    b->n += c->n;
    b->calls[b->ncalls++] = c;
    held = b;
    return 0;
no:
    if (b != held) {
        free(b->h);
        free(b->out);
        free(b->calls);
        free(b);
    }
    return -1;
}

/* The parameters of a filter BF.RESERVE or an add creates: RedisBloom's
 * scaling filter unless NONSCALING. */
static int create_params(const struct resp_call *c, struct bf_params *p,
                         struct rpc_reply *r)
{
    memset(p, 0, sizeof *p);
    if (c->create.shards > 1) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "SHARDS %u: a node's door "
                        "makes filters of one shard (a filter of many shards is "
                        "made through a router)", c->create.shards);
        return -1;
    }
    p->capacity = c->create.capacity;
    p->error_rate = c->create.error_rate;
    p->kind = c->create.nonscaling ? BF_KIND_BLOCKED : BF_KIND_SCALABLE;
    if (!c->create.nonscaling) {
        if (c->create.expansion < 1 || c->create.expansion > BF_GROWTH_MAX) {
            rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "EXPANSION %u: a "
                            "scaling filter grows 1 to %g times a layer",
                            c->create.expansion, BF_GROWTH_MAX);
            return -1;
        }
        p->growth = c->create.expansion;
    }
    if (!node_rpc__params_ok(p->capacity, p->error_rate, r))
        return -1;
    bf_params_default(p);
    return 0;
}

/* Create c's filter (pool thread).  0, or -1 with r set; an add treats a
 * filter created meanwhile by another call as its own. */
static int create_filter(struct node *n, struct store *s, struct resp_call *c,
                         struct rpc_reply *r)
{
    struct bf_params p;
    char err[STORE_ERRLEN] = "";
    if (node_rpc__refuse_public_catalog(r, c->op == RESP_BF_RESERVE ? "BF.RESERVE"
                                                                      : "BF.ADD creating a filter") ||
        create_params(c, &p, r) < 0 || !node_rpc__create_begin(s, c->filter, 0, 1, r))
        return -1;
    int rc = store_create(s, c->filter, &p, err);
    node_rpc__create_end();
    if (rc == -EEXIST && c->op == RESP_BF_ADD)
        return 0;
    if (rc < 0) {
        node_rpc__store_error(r, NULL, c->filter, rc, err);
        return -1;
    }
    (void)n;
    log_info("created filter %s (%s, capacity %llu, error_rate %g) over RESP",
             c->filter, bf_kind_name(p.kind), (unsigned long long)p.capacity,
             p.error_rate);
    return 0;
}

static struct node *node_of(struct resp_call *c)
{
    return c->bctx[1];
}

/* Pool thread: create the filter, then add. */
static void create_and_add(struct resp_call *c)
{
    struct node *n = node_of(c);
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    struct store *s = node_rpc__need_store(n, &r);
    if (!s || create_filter(n, s, c, &r) < 0) {
        fail_reply(c, &r);
        resp_call_done(c);
        return;
    }
    struct store_filter *sf = store_get(s, c->filter);
    if (!sf) {
        resp_call_fail(c, RESP_NOT_FOUND, "filter \"%s\" was dropped right after "
                       "its creation", c->filter);
        resp_call_done(c);
        return;
    }
    apply_keys(n, c, sf);
}

static void reserve_work(struct resp_call *c)
{
    struct node *n = node_of(c);
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    struct store *s = node_rpc__need_store(n, &r);
    if (!s || create_filter(n, s, c, &r) < 0)
        fail_reply(c, &r);
    resp_call_done(c);
}

static void del_work(struct resp_call *c)
{
    struct node *n = node_of(c);
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    char err[STORE_ERRLEN] = "", name[RULES_FILTER_NAME_MAX + 1];
    struct store *s = node_rpc__need_store(n, &r);
    if (!s || node_rpc__refuse_public_catalog(&r, "DEL")) {
        fail_reply(c, &r);
        resp_call_done(c);
        return;
    }
    for (size_t i = 0; i < c->n; i++) {
        snprintf(name, sizeof name, "%.*s", (int)c->lens[i], (const char *)c->keys[i]);
        int rc = store_drop(s, name, err);
        if (rc == -ENOENT)
            continue;
        if (rc < 0) {
            node_rpc__store_error(&r, NULL, name, rc, err);
            fail_reply(c, &r);
            break;
        }
        c->out[i] = true;
        log_info("dropped filter %s over RESP", name);
        node_sync_forget(node_rpc__sync_get(), name, 0);
    }
    resp_call_done(c);
}

static void info_read(const struct bf *f, void *ctx)
{
    struct resp_bf_info *in = ctx;
    struct bf_layer_info li;
    uint32_t layers = bf_layer_count(f);
    in->capacity = 0;
    for (uint32_t i = 0; i < layers; i++)
        if (bf_layer_info(f, i, &li) == 0)
            in->capacity += li.capacity;
    in->size = bf_bytes(f);
    in->filters = layers;
    in->items = bf_insert_count(f);
    in->expansion = bf_kind(f) == BF_KIND_SCALABLE ? (long long)bf_growth(f) : -1;
}

static void node_bf(void *arg, struct resp_call *c)
{
    struct node *n = arg;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    c->bctx[1] = n;
    if (c->op != RESP_BF_ADD)
        batch_flush_all(n);   /* the adds before it first */
    struct store *s = node_rpc__need_store(n, &r);
    if (!s) {
        fail_reply(c, &r);
        resp_call_done(c);
        return;
    }
    switch (c->op) {
    case RESP_BF_RESERVE:
        if (resp_call_offload(c, reserve_work) < 0)
            goto oom;
        return;
    case RESP_BF_DEL:
        if (resp_call_offload(c, del_work) < 0)
            goto oom;
        return;
    case RESP_BF_INFO:
    case RESP_BF_CARD: {
        struct store_filter *sf = store_get(s, c->filter);
        if (!sf) {
            if (c->op == RESP_BF_CARD)
                c->count = 0;   /* RedisBloom's answer for a missing filter */
            else
                resp_call_fail(c, RESP_NOT_FOUND, "filter \"%s\" does not exist",
                               c->filter);
            break;
        }
        int rc = store_filter_read(sf, info_read, &c->info);
        if (rc < 0) {
            node_rpc__store_error(&r, sf, c->filter, rc, NULL);
            fail_reply(c, &r);
        }
        c->count = (long long)c->info.items;
        store_put(sf);
        break;
    }
    case RESP_BF_ADD:
    case RESP_BF_EXISTS: {
        bool write = c->op == RESP_BF_ADD;
        if (node_rpc__refuse_public(&r, write ? "BF.ADD" : "BF.EXISTS", write)) {
            fail_reply(c, &r);
            break;
        }
        struct store_filter *sf = store_get(s, c->filter);
        if (sf) {
            if (!write || batch_hold(c, sf) < 0) {
                if (write)
                    batch_flush_all(n);   /* in order with the held adds */
                apply_keys(n, c, sf);
            }
            return;
        }
        if (!write) {
            resp_call_fail(c, RESP_NOT_FOUND, "filter \"%s\" does not exist (a read "
                           "of a missing filter is an error here, never 0: "
                           "docs/RESP.md)", c->filter);
            break;
        }
        if (!c->create.allowed) {
            resp_call_fail(c, RESP_NOT_FOUND, "filter \"%s\" does not exist; %s",
                           c->filter, c->create.why_not ? c->create.why_not : "");
            break;
        }
        if (resp_call_offload(c, create_and_add) < 0)
            goto oom;
        return;
    }
    }
    resp_call_done(c);
    return;
oom:
    resp_call_fail(c, RESP_RESOURCE_EXHAUSTED, "out of memory");
    resp_call_done(c);
}

void node_resp_backend(struct node *n, struct resp_backend *be)
{
    memset(be, 0, sizeof *be);
    be->arg = n;
    be->bf = node_bf;
    /* A write's bits are set before its command returns: a later read on
     * the node sees them. */
    be->reads_wait_writes = false;
    be->pass_end = node_pass_end;
    be->pass_held = node_pass_held;
    be->pass_drain = LEAD_DRAIN;
    be->pass_wait_ns = node_pass_wait;
}
