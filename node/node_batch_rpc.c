/* node_batch_rpc: Internal/Batches, the long-lived stream on which a router
 * sends the key batches of its clients (docs/ROUTER.md), and NodeInfo's
 * counters of it.
 *
 * The stream is driven by its messages (struct rpc_loop_stream): the
 * node's event loop reads one BatchRequest, applies every entry exactly as
 * the one-shard call would (node_rpc__shard_check, then _apply: placement,
 * secret id, state) and answers with a BatchResponse of the same id and
 * one ShardResult per entry.  An entry may hold runs, the hashes of several
 * shards of one filter (BatchEntry.run_shards): each run is a unit applied
 * as an entry of its shard would be, a refused run answered in its entry's
 * run_errors.  The answers of a stream come in request
 * order, and a router that keeps reads and writes on separate streams gets
 * its reads answered by another thread than the one that waits for a
 * write's fsync.  Messages are decoded by protobuf-c into an arena
 * (common/rpc/rpc_arena.h), which also holds the answer's arrays; nothing is
 * allocated per message in the steady state.
 *
 * Reads are applied on the loop and answered at once.  Writes go
 * to the store's asynchronous calls (store_add_hashes_async): every write
 * entry of a message sets its bits and queues its log record at once, the
 * node's commit thread makes them durable together (one fsync for the
 * message, and for whatever else arrived meanwhile), and the answer leaves
 * once the last of them completed, posted by the thread that completed it
 * (rpc_stream_post).  Meanwhile the loop reads and applies the next
 * message: up to BATCH_WINDOW messages of a stream are applied and not yet
 * answered (each with its own arena; the reading pauses while the window is
 * full), so a router that sends its next
 * write before the answer to the last one is in gets it into the next
 * fsync instead of waiting a whole fsync for its turn.  Answers are posted
 * in request order whatever order the messages become durable in.  No
 * thread waits per entry and none is created.  With durability none and
 * the log idle, the loop holds the records of a message's writes and
 * writes them with one write() after applying its last entry
 * (store_log_hold_begin), where their completions run.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "node.h"
#include "node_client.h"
#include "node_rpc.h"
#include "rpc_arena.h"
#include "rpc_server.h"
#include "store.h"

/* ---- counters (NodeInfo) ---- */

static struct {
    atomic_uint_fast64_t messages, entries, hashes;
    atomic_uint_fast64_t streams, read_streams, write_streams, mixed_streams;
} counters;

void node_rpc__batch_counters(Bloomgrid__V1__NodeInfoResponse *out)
{
    out->batch_messages = atomic_load(&counters.messages);
    out->batch_entries = atomic_load(&counters.entries);
    out->batch_hashes = atomic_load(&counters.hashes);
    out->batch_streams = atomic_load(&counters.streams);
    out->read_streams = atomic_load(&counters.read_streams);
    out->write_streams = atomic_load(&counters.write_streams);
    out->mixed_streams = atomic_load(&counters.mixed_streams);
}

/* ---- one message ---- */

/* Messages of one stream applied and not yet answered, at most. */
#define BATCH_WINDOW 2

struct batch_msg;
struct batch_stream;

/* What a unit's completion needs to find its message (k: the unit). */
struct entry_ctx {
    struct batch_msg *b;
    size_t k;
};

/* A BatchRequest being answered.  Everything it points to lives in the
 * stream's arena until the answer is sent. */
struct batch_msg {
    struct store *s;
    Bloomgrid__V1__BatchRequest *m;
    size_t ne;                  /* entries */
    /* Units: what is applied on its own, an entry of one shard or each run
     * of an entry of runs (BatchEntry.run_shards), in entry order. */
    size_t n;
    uint32_t *u_entry;          /* per unit: its entry */
    uint32_t *u_shard;          /* per unit: its shard */
    uint32_t *u_cnt;            /* per unit: its hashes */
    uint32_t *e_unit;           /* per entry: its first unit (ne + 1 of them) */
    bool *e_runs;               /* per entry: answered run by run */
    size_t total;               /* hashes of the entries msg_prepare took */
    bool writes;                /* an Add or Remove unit among them */
    struct bf_hash *h;          /* every unit's hashes, decoded */
    bool *out;                  /* every unit's answers */
    size_t *off;                /* per unit: its first slot in h and out */
    uint64_t *version;          /* per unit */
    struct rpc_reply *rep;      /* per unit: OK, or its error */
    /* Per write unit submitted: the held shard, the completion's rc. */
    struct store_filter **sf;
    int *rc;
    struct entry_ctx *ctx;
    /* Under the stream's mu: writes submitted and not yet completed, and
     * whether every entry has been applied (the answer may go once both
     * say so). */
    size_t pending;
    bool applied;
    bool held;                  /* a hold on the stream for its post */
    struct batch_stream *bs;
};

/* One stream: its window of messages, oldest first. */
struct batch_stream {
    struct node *n;
    struct rpc_stream *st;
    pthread_mutex_t mu;
    struct rpc_arena a[BATCH_WINDOW];
    struct batch_msg msg[BATCH_WINDOW];
    unsigned head, count;       /* msg[head], ... count of them in use */
    bool failed;                /* a post failed: the call is gone */
    bool reads, writes;         /* what the stream carried (NodeInfo) */
};

static enum key_op op_of(Bloomgrid__V1__BatchOp op)
{
    switch (op) {
    case BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN:
        return OP_MAY_CONTAIN;
    case BLOOMGRID__V1__BATCH_OP__BATCH_OP_REMOVE:
        return OP_REMOVE;
    default:
        return OP_ADD;
    }
}

static bool op_known(Bloomgrid__V1__BatchOp op)
{
    return op == BLOOMGRID__V1__BATCH_OP__BATCH_OP_ADD ||
           op == BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN ||
           op == BLOOMGRID__V1__BATCH_OP__BATCH_OP_REMOVE;
}

static void *arena_zalloc(struct rpc_arena *a, size_t n, size_t size)
{
    ProtobufCAllocator *al = rpc_arena_allocator(a);
    void *p = al->alloc(al->allocator_data, (n ? n : 1) * size);
    if (p)
        memset(p, 0, (n ? n : 1) * size);
    return p;
}

/* Runs of one entry, at most. */
#define BATCH_RUNS_MAX 65536

/* The units entry e may take: one per run when its runs may fit (as many
 * shards as counts, 1 to BATCH_RUNS_MAX, no more than its hashes), else
 * one (a malformed entry's). */
static size_t units_of(const Bloomgrid__V1__BatchEntry *e)
{
    size_t r = e->n_run_shards;
    return r && r == e->n_run_counts && r <= BATCH_RUNS_MAX &&
                   r <= e->hashes.len / NODE_CLIENT_HASH_LEN
               ? r
               : 1;
}

/* e's runs against its cnt hashes: NULL when they fit, else what is wrong
 * (in buf).  Runs that fit are no more than units_of counted. */
static const char *runs_wrong(const Bloomgrid__V1__BatchEntry *e, size_t cnt, char *buf,
                              size_t len)
{
    if (e->n_run_shards != e->n_run_counts)
        snprintf(buf, len, "%zu run shards but %zu run counts", e->n_run_shards,
                 e->n_run_counts);
    else if (e->n_run_shards > BATCH_RUNS_MAX)
        snprintf(buf, len, "%zu runs; at most %d", e->n_run_shards, BATCH_RUNS_MAX);
    else {
        uint64_t sum = 0;
        for (size_t j = 0; j < e->n_run_counts; j++) {
            if (e->run_counts[j] == 0) {
                snprintf(buf, len, "run %zu has no hashes", j);
                return buf;
            }
            sum += e->run_counts[j];
        }
        if (sum == cnt)
            return NULL;
        snprintf(buf, len, "runs of %llu hashes in all, but %zu hashes",
                 (unsigned long long)sum, cnt);
    }
    return buf;
}

/* Check the message as a whole and every entry's shape, and lay out the
 * units; units that fail get their error in rep and are not applied (a
 * malformed entry is one unit, answered as the entry).  Returns 0, or
 * -ENOMEM. */
static int msg_prepare(struct node *n, struct rpc_arena *a, struct batch_msg *b)
{
    Bloomgrid__V1__BatchRequest *m = b->m;
    size_t ne = m->n_entries, total = 0, nu = 0;

    for (size_t k = 0; k < ne; k++)
        nu += units_of(m->entries[k]);
    b->ne = ne;
    b->u_entry = arena_zalloc(a, nu, sizeof *b->u_entry);
    b->u_shard = arena_zalloc(a, nu, sizeof *b->u_shard);
    b->u_cnt = arena_zalloc(a, nu, sizeof *b->u_cnt);
    b->e_unit = arena_zalloc(a, ne + 1, sizeof *b->e_unit);
    b->e_runs = arena_zalloc(a, ne, sizeof *b->e_runs);
    b->off = arena_zalloc(a, nu, sizeof *b->off);
    b->version = arena_zalloc(a, nu, sizeof *b->version);
    b->rep = arena_zalloc(a, nu, sizeof *b->rep);
    b->sf = arena_zalloc(a, nu, sizeof *b->sf);
    b->rc = arena_zalloc(a, nu, sizeof *b->rc);
    b->ctx = arena_zalloc(a, nu, sizeof *b->ctx);
    if (!b->u_entry || !b->u_shard || !b->u_cnt || !b->e_unit || !b->e_runs || !b->off ||
        !b->version || !b->rep || !b->sf || !b->rc || !b->ctx)
        return -ENOMEM;

    struct rpc_reply whole = {.st.code = GRPC_STATUS_OK};
    b->s = node_rpc__need_store(n, &whole);
    if (b->s && node_rpc__refuse_version(&whole, m->topology_version))
        b->s = NULL;   /* every entry gets the refusal */
    size_t u = 0;
    for (size_t k = 0; k < ne; k++) {
        const Bloomgrid__V1__BatchEntry *e = m->entries[k];
        bool shaped = e->hashes.len % NODE_CLIENT_HASH_LEN == 0;
        size_t cnt = shaped ? e->hashes.len / NODE_CLIENT_HASH_LEN : 0;
        char why[96];
        const char *bad = NULL;
        b->e_unit[k] = (uint32_t)u;
        if (!op_known(e->op)) {
            snprintf(why, sizeof why, "unknown operation %d", (int)e->op);
            bad = why;
        } else if (!shaped) {
            snprintf(why, sizeof why, "hashes is %zu bytes: not a multiple of %d",
                     e->hashes.len, NODE_CLIENT_HASH_LEN);
            bad = why;
        } else if (e->n_run_shards || e->n_run_counts) {
            bad = runs_wrong(e, cnt, why, sizeof why);
        }
        if (bad || !e->n_run_shards) {
            b->u_entry[u] = (uint32_t)k;
            b->u_shard[u] = e->shard_index;
            b->u_cnt[u] = (uint32_t)cnt;
            b->off[u] = total;
            if (bad)
                rpc_reply_error(&b->rep[u], GRPC_STATUS_INVALID_ARGUMENT,
                                "entry %zu (shard %u): %s", k, e->shard_index, bad);
            u++;
        } else {
            b->e_runs[k] = true;
            for (size_t j = 0, at = total; j < e->n_run_shards; j++) {
                b->u_entry[u] = (uint32_t)k;
                b->u_shard[u] = e->run_shards[j];
                b->u_cnt[u] = e->run_counts[j];
                b->off[u] = at;
                at += e->run_counts[j];
                u++;
            }
        }
        total += cnt;
    }
    b->e_unit[ne] = (uint32_t)u;
    b->n = u;
    b->total = total;
    b->h = arena_zalloc(a, total, sizeof *b->h);
    b->out = arena_zalloc(a, total, sizeof *b->out);
    if (!b->h || !b->out)
        return -ENOMEM;
    if (b->s && whole.st.code == GRPC_STATUS_OK && total > n->cfg.max_batch_keys)
        rpc_reply_error(&whole, GRPC_STATUS_RESOURCE_EXHAUSTED,
                        "%zu hashes in one batch; the limit is %llu (max_batch_keys)",
                        total, (unsigned long long)n->cfg.max_batch_keys);
    for (u = 0; u < b->n; u++) {
        struct rpc_reply *r = &b->rep[u];
        if (whole.st.code != GRPC_STATUS_OK)
            r->st = whole.st;
        else if (r->st.code == GRPC_STATUS_OK &&
                 op_of(m->entries[b->u_entry[u]]->op) != OP_MAY_CONTAIN)
            b->writes = true;
    }
    return 0;
}

static void flush_ready(struct batch_stream *bs, unsigned *holds);

/* A write entry is durable (rc 0) or failed; on the log's completion
 * thread (wal.h: the completer, with fsync). */
static void entry_done(void *arg, int rc)
{
    struct entry_ctx *c = arg;
    struct batch_stream *bs = c->b->bs;
    struct rpc_stream *st = bs->st;
    unsigned holds = 0;
    pthread_mutex_lock(&bs->mu);
    c->b->rc[c->k] = rc;
    if (--c->b->pending == 0 && c->b->applied)
        flush_ready(bs, &holds);
    pthread_mutex_unlock(&bs->mu);
    /* After the mutex: the last release may end the call and free bs
     * with it. */
    while (holds--)
        rpc_stream_release(st);
}

struct prefetch {
    const struct bf_hash *h;
    size_t n;
};

static void prefetch_read(const struct bf *f, void *ctx)
{
    const struct prefetch *p = ctx;
    for (size_t i = 0; i < p->n; i++)
        bf_prefetch_hash(f, p->h[i]);
}

/* Entries looked up and their bits' lines asked for this many entries
 * ahead of the one applied.  A router's message holds an entry for each
 * shard its keys fell in, mostly of one or two keys when a filter has many
 * shards; each filter call prefetches only within its own keys, so without
 * this every entry would wait for its line from memory in turn. */
#define BATCH_AHEAD 8

/* Entry k's hashes as the wire has them, from unit u's on. */
static const uint8_t *unit_data(const struct batch_msg *b, size_t u)
{
    uint32_t k = b->u_entry[u];
    return b->m->entries[k]->hashes.data +
           NODE_CLIENT_HASH_LEN * (b->off[u] - b->off[b->e_unit[k]]);
}

/* Find unit u's shard (unless msg_prepare refused it), decode and check
 * its hashes, hold the shard in b->sf[u] and start loading the lines its
 * hashes touch.  A refusal goes into b->rep[u]. */
static void msg_find(struct batch_msg *b, size_t u)
{
    const Bloomgrid__V1__BatchEntry *e = b->m->entries[b->u_entry[u]];
    size_t cnt = b->u_cnt[u];
    struct bf_hash *h = b->h + b->off[u];

    if (b->rep[u].st.code != GRPC_STATUS_OK)
        return;
    b->sf[u] = node_rpc__shard_check(b->s, op_of(e->op), e->filter, b->u_shard[u],
                                     unit_data(b, u), cnt, true, e->secret_id, h,
                                     &b->rep[u]);
    if (b->sf[u] && cnt) {
        struct prefetch p = {.h = h, .n = cnt};
        store_filter_read(b->sf[u], prefetch_read, &p);
    }
}

/* Apply unit u, found by msg_find: a read at once (its shard let go), a
 * write submitted to the store, its outcome in entry_done. */
static void msg_apply(struct batch_msg *b, size_t u)
{
    const Bloomgrid__V1__BatchEntry *e = b->m->entries[b->u_entry[u]];
    struct rpc_reply *r = &b->rep[u];
    enum key_op op = op_of(e->op);
    uint32_t shard = b->u_shard[u];
    size_t cnt = b->u_cnt[u];
    struct bf_hash *h = b->h + b->off[u];
    bool *out = b->out + b->off[u];
    struct store_filter *sf = b->sf[u];
    char err[STORE_ERRLEN] = "";

    if (!sf)
        return;
    if (op == OP_MAY_CONTAIN) {
        b->sf[u] = NULL;
        node_rpc__shard_apply(sf, op, e->filter, shard, h, cnt, out, &b->version[u], r);
        return;
    }
    b->ctx[u] = (struct entry_ctx){.b = b, .k = u};
    /* Counted first: the completion may come before the call returns. */
    pthread_mutex_lock(&b->bs->mu);
    b->pending++;
    pthread_mutex_unlock(&b->bs->mu);
    int rc = op == OP_ADD
                 ? store_add_hashes_async(sf, h, cnt, out, entry_done, &b->ctx[u], err)
                 : store_remove_hashes_async(sf, h, cnt, out, entry_done, &b->ctx[u], err);
    if (rc < 0) {
        pthread_mutex_lock(&b->bs->mu);
        b->pending--;
        pthread_mutex_unlock(&b->bs->mu);
        node_rpc__shard_store_error(r, sf, e->filter, shard, rc, err);
        store_put(sf);
        b->sf[u] = NULL;
    }
}

/* Every write of b has completed: its units' outcomes and versions. */
static void msg_settle(struct batch_msg *b)
{
    for (size_t u = 0; u < b->n; u++) {
        struct store_filter *sf = b->sf[u];
        if (!sf)
            continue;
        const Bloomgrid__V1__BatchEntry *e = b->m->entries[b->u_entry[u]];
        if (b->rc[u] < 0)
            node_rpc__shard_store_error(&b->rep[u], sf, e->filter, b->u_shard[u],
                                        b->rc[u], "");
        else
            b->version[u] = node_rpc__shard_version(sf);
        store_put(sf);
        b->sf[u] = NULL;
    }
}

/* Encode the answer into the arena's arrays and post it: one ShardResult
 * per entry, an entry of runs with its refused runs in run_errors.
 * Returns 0, -ENOMEM or -ECANCELED (the stream is gone). */
static int msg_answer(struct rpc_stream *st, struct rpc_arena *a, struct batch_msg *b)
{
    Bloomgrid__V1__BatchResponse resp = BLOOMGRID__V1__BATCH_RESPONSE__INIT;
    Bloomgrid__V1__ShardResult *res = arena_zalloc(a, b->ne, sizeof *res);
    Bloomgrid__V1__ShardResult **ptrs = arena_zalloc(a, b->ne, sizeof *ptrs);
    protobuf_c_boolean *bools = arena_zalloc(a, b->total, sizeof *bools);
    size_t nbad = 0;
    for (size_t u = 0; u < b->n; u++)
        nbad += b->e_runs[b->u_entry[u]] && b->rep[u].st.code != GRPC_STATUS_OK;
    Bloomgrid__V1__RunError *errs = arena_zalloc(a, nbad, sizeof *errs);
    Bloomgrid__V1__RunError **eptrs = arena_zalloc(a, nbad, sizeof *eptrs);
    if (!res || !ptrs || !bools || !errs || !eptrs)
        return -ENOMEM;
    resp.id = b->m->id;
    resp.n_results = b->ne;
    resp.results = ptrs;
    size_t ei = 0;
    for (size_t k = 0; k < b->ne; k++) {
        const Bloomgrid__V1__BatchEntry *e = b->m->entries[k];
        size_t u0 = b->e_unit[k], u1 = b->e_unit[k + 1];
        Bloomgrid__V1__ShardResult *sr = &res[k];
        bloomgrid__v1__shard_result__init(sr);
        ptrs[k] = sr;
        sr->shard_index = e->shard_index;
        if (!b->e_runs[k] && b->rep[u0].st.code != GRPC_STATUS_OK) {
            const struct rpc_reply *r = &b->rep[u0];
            sr->code = (int32_t)r->st.code;
            sr->message = (char *)r->st.message;
            sr->reason = (Bloomgrid__V1__ErrorReason)r->st.reason;
            continue;
        }
        protobuf_c_boolean *o = bools + b->off[u0];
        size_t cnt = 0, e0 = ei;
        for (size_t u = u0; u < u1; u++) {
            const struct rpc_reply *r = &b->rep[u];
            bool ok = r->st.code == GRPC_STATUS_OK;
            for (size_t i = 0; i < b->u_cnt[u]; i++)
                o[cnt + i] = ok && b->out[b->off[u] + i];
            cnt += b->u_cnt[u];
            if (ok || !b->e_runs[k])
                continue;
            Bloomgrid__V1__RunError *re = &errs[ei];
            bloomgrid__v1__run_error__init(re);
            re->run = (uint32_t)(u - u0);
            re->code = (int32_t)r->st.code;
            re->message = (char *)r->st.message;
            re->reason = (Bloomgrid__V1__ErrorReason)r->st.reason;
            eptrs[ei++] = re;
        }
        sr->n_results = cnt;
        sr->results = o;
        if (b->e_runs[k]) {
            sr->n_run_errors = ei - e0;
            sr->run_errors = ei > e0 ? eptrs + e0 : NULL;
        } else {
            sr->version = b->version[u0];
        }
    }
    size_t len = protobuf_c_message_get_packed_size(&resp.base);
    grpc_slice sl = grpc_slice_malloc(len);
    protobuf_c_message_pack(&resp.base, GRPC_SLICE_START_PTR(sl));
    return rpc_stream_post(st, sl);
}

/* Answer the messages at the window's front that are complete, in order;
 * under bs->mu.  *holds counts the holds to give back once the mutex is let
 * go. */
static void flush_ready(struct batch_stream *bs, unsigned *holds)
{
    while (bs->count > 0) {
        unsigned i = bs->head;
        struct batch_msg *b = &bs->msg[i];
        if (!b->applied || b->pending > 0)
            break;
        msg_settle(b);
        int rc = bs->failed ? -ECANCELED : msg_answer(bs->st, &bs->a[i], b);
        if (rc < 0)
            bs->failed = true;     /* the call is gone, or no memory: see batch_end */
        if (b->held)
            (*holds)++;
        b->held = false;
        b->applied = false;
        bs->head = (bs->head + 1) % BATCH_WINDOW;
        /* A full window paused the reading (batch_message said 1). */
        if (bs->count-- == BATCH_WINDOW)
            rpc_stream_resume(bs->st);
    }
}

/* ---- the stream ---- */

/* Count what kind of entries a stream carried (NodeInfo). */
static void count_kinds(const Bloomgrid__V1__BatchRequest *m, bool *reads, bool *writes)
{
    bool r = *reads, w = *writes;
    size_t hashes = 0;
    for (size_t k = 0; k < m->n_entries; k++) {
        hashes += m->entries[k]->hashes.len / NODE_CLIENT_HASH_LEN;
        if (m->entries[k]->op == BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN)
            r = true;
        else
            w = true;
    }
    atomic_fetch_add(&counters.messages, 1);
    atomic_fetch_add(&counters.entries, m->n_entries);
    atomic_fetch_add(&counters.hashes, hashes);
    if (r && !*reads)
        atomic_fetch_add(&counters.read_streams, 1);
    if (w && !*writes)
        atomic_fetch_add(&counters.write_streams, 1);
    if (r && w && !(*reads && *writes))
        atomic_fetch_add(&counters.mixed_streams, 1);
    *reads = r;
    *writes = w;
}

/* Tests only: BLOOMGRID_TEST_NO_RUNS=1 makes the node read entries as a
 * node of an earlier release does, without their runs (so that a test can
 * make a router meet one: tests/resp/test_resp_router.py).  Unset (every
 * deployment): runs are read. */
static bool no_runs_v;
static pthread_once_t no_runs_once = PTHREAD_ONCE_INIT;

static void no_runs_read_env(void)
{
    const char *v = getenv("BLOOMGRID_TEST_NO_RUNS");
    no_runs_v = v && strcmp(v, "1") == 0;
    if (no_runs_v)
        log_warn("BLOOMGRID_TEST_NO_RUNS=1: entries are read without their runs "
                 "(a test's stand-in for a node of an earlier release)");
}

/* Take one message of the stream into the window and apply it (its answer
 * goes once its writes are durable).  The reading pauses while the window
 * is full (1), and the stream ends at a malformed message (-1). */
static int batch_message(void *state, const uint8_t *buf, size_t len,
                         struct rpc_status *end)
{
    struct batch_stream *bs = state;
    pthread_mutex_lock(&bs->mu);
    bool failed = bs->failed;
    unsigned i = (bs->head + bs->count) % BATCH_WINDOW;
    pthread_mutex_unlock(&bs->mu);
    if (failed)
        return -1;   /* the call is gone, or no memory: see batch_end */
    struct rpc_arena *a = &bs->a[i];
    struct batch_msg *b = &bs->msg[i];
    rpc_arena_reset(a);
    *b = (struct batch_msg){.bs = bs};
    b->m = bloomgrid__v1__batch_request__unpack(rpc_arena_allocator(a), len, buf);
    if (!b->m) {
        end->code = GRPC_STATUS_INVALID_ARGUMENT;
        snprintf(end->message, sizeof end->message,
                 "malformed BatchRequest message (%zu bytes)", len);
        return -1;
    }
    pthread_once(&no_runs_once, no_runs_read_env);
    for (size_t k = 0; no_runs_v && k < b->m->n_entries; k++)
        b->m->entries[k]->n_run_shards = b->m->entries[k]->n_run_counts = 0;
    count_kinds(b->m, &bs->reads, &bs->writes);
    if (msg_prepare(bs->n, a, b) < 0) {
        end->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(end->message, sizeof end->message,
                 "out of memory for a batch of %zu entries (%zu bytes)",
                 b->m->n_entries, len);
        return -1;
    }
    /* A message with writes may be answered by the log's completion thread. */
    if (b->writes && rpc_stream_hold(bs->st) < 0)
        return -1;
    b->held = b->writes;
    pthread_mutex_lock(&bs->mu);
    bool full = ++bs->count == BATCH_WINDOW;
    pthread_mutex_unlock(&bs->mu);
    /* A message's writes to many shards: their log records in one write
     * (store_log_hold_begin; their completions run at its end). */
    if (b->writes && b->s)
        store_log_hold_begin(b->s);
    for (size_t u = 0; u < b->n && u < BATCH_AHEAD; u++)
        msg_find(b, u);
    for (size_t u = 0; u < b->n; u++) {
        if (u + BATCH_AHEAD < b->n)
            msg_find(b, u + BATCH_AHEAD);
        msg_apply(b, u);
    }
    if (b->writes && b->s)
        store_log_hold_end(b->s);
    unsigned holds = 0;
    pthread_mutex_lock(&bs->mu);
    b->applied = true;
    if (b->pending == 0)
        flush_ready(bs, &holds);
    pthread_mutex_unlock(&bs->mu);
    while (holds--)
        rpc_stream_release(bs->st);
    return full ? 1 : 0;
}

static void *batch_open(void *arg, struct rpc_stream *st)
{
    struct batch_stream *bs = calloc(1, sizeof *bs);
    if (!bs)
        return NULL;
    bs->n = arg;
    bs->st = st;
    pthread_mutex_init(&bs->mu, NULL);
    atomic_fetch_add(&counters.streams, 1);
    /* Each message decoded, its hashes and answers: a few times its size. */
    for (int i = 0; i < BATCH_WINDOW; i++)
        rpc_arena_init(&bs->a[i], 4 * rpc_stream_max_message(st) + (1u << 20));
    return bs;
}

/* Every message taken has been answered (or dropped with the call): no
 * hold is left, so the window is empty. */
static void batch_end(void *state, bool failed, struct rpc_status *end)
{
    struct batch_stream *bs = state;
    if (!failed && bs->failed && end->code == GRPC_STATUS_OK) {
        end->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(end->message, sizeof end->message, "out of memory for a batch answer");
    }
    for (int i = 0; i < BATCH_WINDOW; i++)
        rpc_arena_deinit(&bs->a[i]);
    pthread_mutex_destroy(&bs->mu);
    free(bs);
}

const struct rpc_loop_stream node_rpc__batches = {
    .open = batch_open,
    .message = batch_message,
    .end = batch_end,
};
