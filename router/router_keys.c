/* router_keys: the router's key path (router_nodes.h, router_keys_start).
 *
 * The keys are hashed once, sorted by shard into one array (each shard's
 * hashes contiguous, in request order), and each shard that has keys is
 * sent to copies of its group (every copy for a write, R for a read, more
 * when some fail: struct shard_q below), the entries of one node grouped
 * into one call, which the node's link (router_link.h) sends on its batch
 * streams, coalesced with the concurrent calls of other clients.  Answers
 * come back per shard and copy, are ORed and put back in request order;
 * each shard reaches its quorum or fails on its own.  No thread waits: the
 * threads that read the links' answers end the rounds (struct key_batch),
 * and a call on one of the server's loops whose filter is not cached is
 * started on the router's pool, which may wait for the fetch.
 */
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"
#include "quorum.h"
#include "router_link.h"
#include "router_nodes.h"
#include "router_pool.h"
#include "router_rpc.h"
#include "rules.h"

static const char *const op_names[] = {"Add", "MayContain", "Remove"};

/* ---- metrics ---- */

static struct metric *quorum_failures(enum router_key_op op)
{
    const char *labels[] = {"op", op_names[op], NULL};
    return metrics_counter(metrics_registry(), "bloomgrid_router_quorum_failures_total",
                           "key calls with a shard short of its quorum, by "
                           "operation", labels);
}

void router_keys_metrics_init(void)
{
    for (int op = ROUTER_ADD; op <= ROUTER_REMOVE; op++)
        quorum_failures((enum router_key_op)op);
}

/* ---- key batches ---- */

/* What the key path asks of one shard's copies (docs/REPLICATION.md): a
 * write goes to every copy at once and is acknowledged when W copies have
 * it durable; a read asks R copies, starting at a copy chosen by a
 * per-router rotation, and asks one more untried copy for each that fails,
 * until R have answered or none is left.  Answers OR: a key is "maybe"
 * when any copy that answered says so.  A copy's error, NOT_FOUND
 * included, is a failed copy, never a "no".  While the group changes its
 * copies (copies_next or copies_prev), a write goes to every member and
 * needs W of the copies and W' of the other set; reads ask copies only.
 * The counts are kept here; what they must reach is quorum.h's. */
struct shard_q {
    uint32_t shard;
    uint32_t start, count;      /* the shard's hashes: hs[start, +count) */
    const struct topo_group *g;
    unsigned need;              /* W or R */
    unsigned ok;                /* copies that answered */
    unsigned need_other;        /* writes: W' of the other set (0: none) */
    unsigned ok_other;          /* members of the other set that answered */
    unsigned asked;             /* bit m: member m was asked */
    unsigned rot;               /* reads: the copy asked first */
    unsigned next;              /* reads: copies tried so far, from rot */
    unsigned nfail;
    /* The copies that failed, nfail of them: TOPO_MAX_COPIES slots in the
     * batch's fails (NULL until a copy of the batch fails: a batch that
     * goes well never writes them). */
    struct copy_fail {
        unsigned copy;          /* member index (topo_member) */
        grpc_status_code code;
        enum rpc_reason reason;
        char msg[160];
    } *fail;
};

/* A thread's buffers for starting a batch, kept between batches. */
struct scratch {
    struct bf_hash *h;          /* per key, request order */
    uint32_t *shard;            /* per key */
    size_t cap;                 /* of the two above */
    uint32_t count[ROUTER_MAX_SHARDS + 1], start[ROUTER_MAX_SHARDS + 1];
};

/* One scratch per thread, freed when the thread exits. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *p)
{
    struct scratch *s = p;
    free(s->h);
    free(s->shard);
    free(s);
}

static void scratch_key_init(void)
{
    pthread_key_create(&scratch_key, scratch_free);
}

/* Grow *p to n elements of size bytes; false when out of memory. */
static bool grow(void *pp, size_t n, size_t size)
{
    void **p = pp;
    void *q = realloc(*p, (n ? n : 1) * size);
    if (!q)
        return false;
    *p = q;
    return true;
}

/* The calling thread's scratch for n keys, or NULL when out of memory. */
static struct scratch *scratch_get(size_t n)
{
    pthread_once(&scratch_once, scratch_key_init);
    struct scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (n > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < n)
            cap *= 2;
        if (!grow(&s->h, cap, sizeof *s->h) || !grow(&s->shard, cap, sizeof *s->shard))
            return NULL;
        s->cap = cap;
    }
    return s;
}

/* One node's call of a batch's round, as its link set's done argument. */
struct batch_set {
    struct key_batch *b;
    uint32_t c;                 /* index into b->calls */
};

/* A batch in flight, from its start to its last link call's end.  It owns
 * the hashes and the answer slots lent to the links, so it lives (refs)
 * until every link call has ended, which may be after its caller was
 * answered (done): a write is answered as soon as every shard has W copies
 * that took it, the slower copies' outcomes coming in afterwards; the
 * caller's keys and out are used only until done (answered, under mu).  References: the starter's while it
 * submits, and one per link set in flight.  A read's later rounds are
 * built and submitted by the thread that ended the round before. */
struct key_batch {
    atomic_int refs;
    atomic_size_t pending;      /* link sets of this round not ended */
    pthread_mutex_t mu;         /* a write's counts, out and answered */
    bool answered;              /* done was called or is being called */
    struct router *r;
    struct topo *t;
    struct router_filter *f;
    enum router_key_op op;
    bool retried;               /* the second attempt, after a new secret */
    char filter[ROUTER_NAME_MAX + 1];
    const uint8_t *const *keys; /* the caller's, until done */
    const uint32_t *lens;
    size_t n;
    bool *out;
    router_keys_fn done;
    void *arg;
    struct shard_q *q;          /* per shard asked */
    size_t nq;
    struct copy_fail *fails;    /* TOPO_MAX_COPIES per shard asked, once one fails */
    size_t ne;                  /* entries of the round in flight */
    uint32_t *shard;            /* per key */
    struct bf_hash *hs;         /* by shard: each shard's hashes contiguous */
    uint32_t *idx;              /* by shard: the key's index in the request */
    bool *couts;                /* per copy asked in a round: its answers */
    struct router_link_entry *ent;   /* per copy asked in a round, by call */
    uint32_t *ent_q;            /* per entry: its struct shard_q */
    uint8_t *ent_copy;          /* per entry: the copy */
    struct router_link_call *calls;  /* per node */
    struct batch_set *sets;          /* per node */
    uint32_t *pair_q, *pair_call;    /* round_build's (shard, copy) pairs */
    uint8_t *pair_c;
    size_t *fill;
};

/* A batch for n keys, nq shards and at most N copies a shard (one block),
 * or NULL. */
static struct key_batch *batch_alloc(size_t n, size_t nq, unsigned N)
{
    size_t ne = nq * N;
    size_t sz = sizeof(struct key_batch) + nq * sizeof(struct shard_q) +
                ne * (sizeof(struct router_link_entry) + sizeof(struct router_link_call) +
                      sizeof(struct batch_set) + sizeof(size_t) + 3 * sizeof(uint32_t) + 2) +
                n * (sizeof(struct bf_hash) + 2 * sizeof(uint32_t) + N) + 64;
    /* Not zeroed: every array is written before it is read (the shards'
     * records when laid out, the entries by round_build), and the block
     * is a few kB per shard. */
    struct key_batch *b = malloc(sz);
    if (!b)
        return NULL;
    memset(b, 0, sizeof *b);
    /* Widest alignment first. */
    b->q = (struct shard_q *)(b + 1);
    b->ent = (struct router_link_entry *)(b->q + nq);
    b->calls = (struct router_link_call *)(b->ent + ne);
    b->sets = (struct batch_set *)(b->calls + ne);
    b->fill = (size_t *)(b->sets + ne);
    b->hs = (struct bf_hash *)(b->fill + ne);
    b->shard = (uint32_t *)(b->hs + n);
    b->idx = b->shard + n;
    b->ent_q = b->idx + n;
    b->pair_q = b->ent_q + ne;
    b->pair_call = b->pair_q + ne;
    b->ent_copy = (uint8_t *)(b->pair_call + ne);
    b->pair_c = b->ent_copy + ne;
    b->couts = (bool *)(b->pair_c + ne);
    pthread_mutex_init(&b->mu, NULL);
    return b;
}

static void batch_unref(struct key_batch *b)
{
    if (atomic_fetch_sub(&b->refs, 1) != 1)
        return;
    router_filter_unref(b->f);
    topo_unref(b->t);
    pthread_mutex_destroy(&b->mu);
    free(b->fails);
    free(b);
}

static enum router_link_op link_op(enum router_key_op op)
{
    switch (op) {
    case ROUTER_MAY_CONTAIN:
        return ROUTER_LINK_MAY_CONTAIN;
    case ROUTER_REMOVE:
        return ROUTER_LINK_REMOVE;
    default:
        return ROUTER_LINK_ADD;
    }
}

/* Append the ranges of key indices whose shard failed (or did not) to buf. */
static void list_keys(char *buf, size_t len, const bool *failed_shard,
                      const uint32_t *shard_of, size_t n, bool want_failed)
{
    size_t used = strlen(buf);
    size_t i = 0;
    bool first = true;
    while (i < n) {
        if (failed_shard[shard_of[i]] != want_failed) {
            i++;
            continue;
        }
        size_t j = i;
        while (j + 1 < n && failed_shard[shard_of[j + 1]] == want_failed)
            j++;
        char item[48];
        if (j == i)
            snprintf(item, sizeof item, "%s%zu", first ? "" : ",", i);
        else
            snprintf(item, sizeof item, "%s%zu-%zu", first ? "" : ",", i, j);
        if (used + strlen(item) + 5 >= len) {
            snprintf(buf + used, len - used, ",...");
            return;
        }
        memcpy(buf + used, item, strlen(item) + 1);
        used += strlen(item);
        first = false;
        i = j + 1;
    }
}

/* Append fmt to the message of st (cut at its end). */
static void msg_add(struct rpc_status *st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void msg_add(struct rpc_status *st, const char *fmt, ...)
{
    size_t used = strlen(st->message);
    if (used + 1 >= sizeof st->message)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message + used, sizeof st->message - used, fmt, ap);
    va_end(ap);
}

/* Has q as many answers as its quorums need (a write's, or a read's)? */
static bool shard_quorate(const struct shard_q *q, bool write)
{
    return write ? quorum_write_met(q->g, q->ok, q->ok_other) : quorum_read_met(q->g, q->ok);
}

/* Does this error come from a copy that is down, slow or lacks the shard
 * (a failed copy), rather than from a refusal to pass on? */
static bool copy_missing(grpc_status_code c)
{
    return router_node_down(c) || c == GRPC_STATUS_NOT_FOUND;
}

/* The status of a batch with shards short of their quorum: q[0..nq) with
 * failed[] set for those.  UNAVAILABLE, or a copy's refusal passed on
 * (FAILED_PRECONDITION, RESOURCE_EXHAUSTED...); the message names each
 * failed shard, its group and the copies that failed. */
static void batch_failure(struct rpc_status *st, enum router_key_op op,
                          const char *filter, const struct shard_q *q, size_t nq,
                          const bool *failed_shard, const uint32_t *shard_of, size_t n)
{
    grpc_status_code code = GRPC_STATUS_UNAVAILABLE;
    size_t nbad = 0, acked = 0;
    bool write = op != ROUTER_MAY_CONTAIN;

    metric_add(quorum_failures(op), 1);

    st->message[0] = 0;
    for (size_t k = 0; k < nq; k++) {
        if (!failed_shard[q[k].shard])
            continue;
        const struct topo_group *g = q[k].g;
        for (unsigned f = 0; f < q[k].nfail && code == GRPC_STATUS_UNAVAILABLE; f++)
            if (!copy_missing(q[k].fail[f].code))
                code = q[k].fail[f].code;
        nbad++;
        if (nbad == 1) {
            /* The first failed shard in full: each failed copy's answer. */
            msg_add(st, "%s on filter \"%s\": shard %u (group %s): %u of %u copies "
                    "%s, %s quorum %u", op_names[op], filter, q[k].shard, g->name,
                    q[k].ok, g->ncopies, write ? "acknowledged" : "answered",
                    write ? "write" : "read", q[k].need);
            if (q[k].need_other)
                msg_add(st, ", and %u of the %u of %s, write quorum %u", q[k].ok_other,
                        g->nother, g->joint == TOPO_JOINT_NEXT ? "copies_next"
                                                              : "copies_prev",
                        q[k].need_other);
            /* The failed copies by name first, then what the first said,
             * so that a long message cuts only that. */
            for (unsigned f = 0; f < q[k].nfail; f++)
                msg_add(st, "%s %s %s", f ? "," : "; failed copies:",
                        topo_member(g, q[k].fail[f].copy),
                        rpc_status_name(q[k].fail[f].code));
            if (q[k].nfail)
                msg_add(st, " (%s: %s)", topo_member(g, q[k].fail[0].copy),
                        q[k].fail[0].msg);
        } else if (nbad <= 6) {
            /* The others by shard and failed copies. */
            msg_add(st, "%s %u@", nbad == 2 ? " (and shards" : ",", q[k].shard);
            for (unsigned f = 0; f < q[k].nfail; f++)
                msg_add(st, "%s%s", f ? "+" : "", topo_member(g, q[k].fail[f].copy));
        }
    }
    if (nbad > 1)
        msg_add(st, "%s)", nbad > 6 ? " ..." : "");
    /* Room for the list of keys a write did not acknowledge. */
    if (write && code == GRPC_STATUS_UNAVAILABLE && strlen(st->message) > 300)
        memcpy(st->message + 296, "...", 4);
    for (size_t i = 0; i < n; i++)
        acked += !failed_shard[shard_of[i]];
    if (write && code == GRPC_STATUS_UNAVAILABLE) {
        /* Writes: say which keys were acknowledged anyway, and that copies
         * that applied the others keep harmless bits. */
        msg_add(st, "; acknowledged %zu of %zu keys; not acknowledged: ", acked, n);
        list_keys(st->message, sizeof st->message, failed_shard, shard_of, n, true);
        msg_add(st, " (copies that applied them keep the bits: retrying is safe)");
    }
    st->code = code;
}

/* The members of q to ask in the next round: every member for a write at
 * once; for a read, as many untried copies (in rotation order) as answers
 * are missing.  Returns how many were chosen into copies[]. */
static unsigned round_copies(struct shard_q *q, bool write, unsigned *copies)
{
    unsigned N = q->g->ncopies, k = 0;
    if (write) {
        if (q->asked)
            return 0;
        for (unsigned c = 0; c < q->g->nmembers; c++)
            copies[k++] = c;
        return k;
    }
    /* A new round starts once every copy asked has answered or failed. */
    unsigned want = quorum_read_ask(q->g, q->ok, 0, N - q->next);
    while (k < want && q->next < N) {
        unsigned c = (q->rot + q->next++) % N;
        copies[k++] = c;
    }
    return k;
}

/* Lay out one round of b: for each shard the copies round_copies picks,
 * one entry each (answers into b->couts), grouped by node so that each
 * node's entries are contiguous and travel as one call.  Returns the number
 * of calls (0: nothing left to ask), or -ENOMEM. */
static int round_build(struct key_batch *b)
{
    struct router *r = b->r;
    const struct topo *t = b->t;
    struct router_filter *f = b->f;
    struct shard_q *q = b->q;
    bool write = b->op != ROUTER_MAY_CONTAIN;
    size_t npairs = 0, ncalls = 0, outs = 0;
    unsigned copies[TOPO_MAX_COPIES];
    uint32_t *pair_q = b->pair_q, *pair_call = b->pair_call;
    uint8_t *pair_c = b->pair_c;
    size_t *fill = b->fill;

    for (size_t k = 0; k < b->nq; k++) {
        unsigned m = round_copies(&q[k], write, copies);
        for (unsigned j = 0; j < m; j++) {
            const char *a = topo_member(q[k].g, copies[j]);
            size_t c = 0;
            while (c < ncalls && strcmp(router_link_addr(b->calls[c].link), a) != 0)
                c++;
            if (c == ncalls) {
                struct router_link *l = router_node_link(r, a);
                if (!l)
                    return -ENOMEM;
                memset(&b->calls[c], 0, sizeof b->calls[c]);
                b->calls[c].link = l;
                ncalls++;
            }
            q[k].asked |= 1u << copies[j];
            pair_q[npairs] = (uint32_t)k;
            pair_c[npairs] = (uint8_t)copies[j];
            pair_call[npairs++] = (uint32_t)c;
            b->calls[c].n++;
        }
    }
    /* Each call's entries start where the previous call's end. */
    for (size_t c = 0, first = 0; c < ncalls; c++) {
        struct router_link_call *lc = &b->calls[c];
        lc->filter = b->filter;
        lc->secret_id = f->secret_id;
        lc->topology_version = t->version;
        lc->op = link_op(b->op);
        lc->e = b->ent + first;
        fill[c] = first;
        first += lc->n;
    }
    for (size_t p = 0; p < npairs; p++) {
        size_t at = fill[pair_call[p]]++;
        const struct shard_q *sq = &q[pair_q[p]];
        struct router_link_entry *e = &b->ent[at];
        e->st.code = GRPC_STATUS_OK;
        e->st.reason = RPC_REASON_NONE;
        e->st.message[0] = 0;
        e->version = 0;
        e->shard = sq->shard;
        e->h = b->hs + sq->start;
        e->n = sq->count;
        e->out = b->couts + outs;
        outs += sq->count;
        b->ent_q[at] = pair_q[p];
        b->ent_copy[at] = pair_c[p];
    }
    b->ne = npairs;
    return (int)ncalls;
}

/* The outcome of b once its rounds are over: 0, or -1 with st; *stale is
 * set when a copy says the cached secret is no longer the filter's. */
static int batch_outcome(struct key_batch *b, struct rpc_status *st, bool *stale)
{
    struct router *r = b->r;
    struct shard_q *q = b->q;
    size_t nq = b->nq, nfail = 0;
    const char *filter = b->filter;
    bool *failed_shard = calloc(b->f->shards, sizeof *failed_shard);
    int rc = -1;

    if (!failed_shard) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    size_t notfound = 0;
    bool not_counting = false;
    const char *stale_msg = NULL;
    for (size_t k = 0; k < nq; k++) {
        if (shard_quorate(&q[k], b->op != ROUTER_MAY_CONTAIN))
            continue;
        failed_shard[q[k].shard] = true;
        nfail++;
        bool all_nf = q[k].ok == 0 && q[k].nfail > 0;
        for (unsigned j = 0; j < q[k].nfail; j++) {
            all_nf &= q[k].fail[j].code == GRPC_STATUS_NOT_FOUND;
            if (q[k].fail[j].reason == RPC_REASON_SECRET_MISMATCH && !stale_msg)
                stale_msg = q[k].fail[j].msg;
            if (q[k].fail[j].reason == RPC_REASON_NOT_COUNTING)
                not_counting = true;
        }
        notfound += all_nf;
    }
    if (nfail == 0) {
        rc = 0;
        goto out;
    }
    if (stale_msg) {
        *stale = true;
        router_filter_forget(r, filter);
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, "%s", stale_msg);
        goto out;
    }
    if (not_counting) {
        /* Every shard has the filter's kind: answer as a node would. */
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, RULES_MSG_NOT_COUNTING,
                       filter);
        st->reason = RPC_REASON_NOT_COUNTING;
        goto out;
    }
    if (notfound) /* dropped or re-created elsewhere: fetch it again next time */
        router_filter_forget(r, filter);
    if (notfound == nfail && nfail == nq) {
        rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist", filter);
        goto out;
    }
    batch_failure(st, b->op, filter, q, nq, failed_shard, b->shard, b->n);
    log_warn("%s", st->message);
out:
    free(failed_shard);
    return rc;
}

static void keys_start(struct router *r, const char *filter, enum router_key_op op,
                       const uint8_t *const *keys, const uint32_t *lens, size_t n,
                       bool *out, router_keys_fn done, void *arg, bool retried);

/* The pool's part of a batch a copy refused for its secret: fetch the new
 * one (blocking) and run the batch again; nothing was applied with the old
 * secret. */
static void batch_retry(void *arg)
{
    struct key_batch *b = arg;
    log_info("filter %s has a new secret; fetching it", b->filter);
    keys_start(b->r, b->filter, b->op, b->keys, b->lens, b->n, b->out, b->done, b->arg,
               true);
    batch_unref(b);
}

/* The rounds of b are over: answer its caller, or hand the second attempt
 * to the router's pool (never on a link's thread: it may block). */
static void batch_end(struct key_batch *b)
{
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    bool stale = false;
    pthread_mutex_lock(&b->mu);     /* a write's slower copies still count */
    int rc = batch_outcome(b, &st, &stale);
    pthread_mutex_unlock(&b->mu);
    if (rc < 0 && stale && !b->retried) {
        atomic_fetch_add(&b->refs, 1);
        int prc = router_pool_push(b->r->pool, batch_retry, b);
        if (prc == 0)
            return;
        atomic_fetch_sub(&b->refs, 1);   /* a caller's reference remains */
        if (prc == -ECANCELED)
            rpc_status_set(&st, GRPC_STATUS_UNAVAILABLE, "%s on filter \"%s\": the "
                           "router is shutting down", op_names[b->op], b->filter);
        else
            rpc_status_set(&st, GRPC_STATUS_UNAVAILABLE, "%s on filter \"%s\": the "
                           "filter has a new secret, and the router's queue for "
                           "fetching one is full (%d waiting); retry shortly",
                           op_names[b->op], b->filter, ROUTER_POOL_QUEUE);
    }
    b->done(b->arg, rc, &st);
}

static void batch_set_done(void *arg);

/* The deadline of one node's call: node_timeout_ms, but for a read of a
 * group with a copy to spare (N > R) read_failover_ms, after which the
 * copy counts as failed and the next round asks another.  A node's call
 * holds shards of one group (an address is in one group only). */
static int set_timeout(const struct key_batch *b, const struct router_link_call *lc)
{
    const struct router_config *cfg = &b->r->cfg;
    if (b->op == ROUTER_MAY_CONTAIN && lc->n > 0) {
        const struct shard_q *q = &b->q[b->ent_q[lc->e - b->ent]];
        if (quorum_read_reachable(q->g, 1) && cfg->read_failover_ms < cfg->node_timeout_ms)
            return (int)cfg->read_failover_ms;
    }
    return (int)cfg->node_timeout_ms;
}

/* Build and submit b's next round, or end b when nothing is left to ask. */
static void batch_round(struct key_batch *b)
{
    int ncalls = round_build(b);
    if (ncalls <= 0) {
        if (ncalls < 0) {
            struct rpc_status st;
            rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            b->done(b->arg, -1, &st);
            return;
        }
        batch_end(b);
        return;
    }
    atomic_fetch_add(&b->refs, ncalls);
    atomic_store(&b->pending, (size_t)ncalls);
    /* One set per node: each node's outcome is known on its own.  The round
     * may end inside the last submit (and the next one be built over these
     * arrays): nothing of them is touched after it. */
    for (int c = 0; c < ncalls; c++) {
        b->sets[c] = (struct batch_set){.b = b, .c = (uint32_t)c};
        router_link_submit(&b->calls[c], 1, set_timeout(b, &b->calls[c]), batch_set_done,
                           &b->sets[c]);
    }
}

/* The next failure record of sq, or NULL when out of memory (as
 * batch_count: under b->mu for a write; a read's round is counted on one
 * thread). */
static struct copy_fail *fail_slot(struct key_batch *b, struct shard_q *sq)
{
    if (!b->fails) {
        b->fails = calloc(b->nq * TOPO_MAX_COPIES, sizeof *b->fails);
        if (!b->fails)
            return NULL;
        for (size_t k = 0; k < b->nq; k++)
            b->q[k].fail = b->fails + k * TOPO_MAX_COPIES;
    }
    if (sq->nfail >= TOPO_MAX_COPIES)
        return NULL;
    return &sq->fail[sq->nfail++];
}

/* Count the copies' answers of entries [i0, i1) of b's round; the
 * caller's out only while it has not been answered. */
static void batch_count(struct key_batch *b, size_t i0, size_t i1)
{
    for (size_t i = i0; i < i1; i++) {
        const struct router_link_entry *e = &b->ent[i];
        struct shard_q *sq = &b->q[b->ent_q[i]];
        if (e->st.code == GRPC_STATUS_OK) {
            unsigned m = b->ent_copy[i];
            sq->ok += m < sq->g->ncopies;
            sq->ok_other += (sq->g->other_mask >> m) & 1;
            if (!b->answered)
                for (uint32_t j = 0; j < e->n; j++)
                    b->out[b->idx[sq->start + j]] |= e->out[j];
            continue;
        }
        struct copy_fail *cf = fail_slot(b, sq);
        if (!cf)
            continue;   /* out of memory: the shard only lacks the details */
        cf->copy = b->ent_copy[i];
        cf->code = e->st.code;
        cf->reason = e->st.reason;
        snprintf(cf->msg, sizeof cf->msg, "%.159s", e->st.message);
    }
}

/* Has every shard of b as many copies that answered as its quorum needs? */
static bool batch_quorate(const struct key_batch *b)
{
    for (size_t k = 0; k < b->nq; k++)
        if (!shard_quorate(&b->q[k], b->op != ROUTER_MAY_CONTAIN))
            return false;
    return true;
}

/* One link set (one node's call) of b's round ended.  A write counts each
 * node's answers as they come and is answered once every shard has W
 * (the copies still out only add to the counts, which nobody reads any
 * more); otherwise, when the last set ends.  A read counts its round at
 * the end and asks more copies where some failed. */
static void batch_set_done(void *arg)
{
    struct batch_set *set = arg;
    struct key_batch *b = set->b;
    const struct router_link_call *lc = &b->calls[set->c];
    bool write = b->op != ROUTER_MAY_CONTAIN, end = false;

    if (write) {
        size_t i0 = (size_t)(lc->e - b->ent);
        pthread_mutex_lock(&b->mu);
        batch_count(b, i0, i0 + lc->n);
        if (!b->answered && batch_quorate(b))
            end = b->answered = true;
        pthread_mutex_unlock(&b->mu);
        if (end)
            batch_end(b);
    }
    if (atomic_fetch_sub(&b->pending, 1) == 1) {
        if (write) {
            pthread_mutex_lock(&b->mu);
            end = !b->answered;
            b->answered = true;
            pthread_mutex_unlock(&b->mu);
            if (end)
                batch_end(b);   /* a write has one round */
        } else {
            batch_count(b, 0, b->ne);
            batch_round(b);
        }
    }
    batch_unref(b);
}

/* A batch whose filter must be fetched first, on the pool. */
struct keys_job {
    struct router *r;
    char filter[ROUTER_NAME_MAX + 1];
    enum router_key_op op;
    const uint8_t *const *keys;
    const uint32_t *lens;
    size_t n;
    bool *out;
    router_keys_fn done;
    void *arg;
};

static void keys_job_run(void *arg)
{
    struct keys_job *j = arg;
    keys_start(j->r, j->filter, j->op, j->keys, j->lens, j->n, j->out, j->done, j->arg,
               false);
    free(j);
}

/* Start the batch on the router's pool, which may wait for the fetch; or
 * answer it with why not. */
static void keys_to_pool(struct router *r, const char *filter, enum router_key_op op,
                         const uint8_t *const *keys, const uint32_t *lens, size_t n,
                         bool *out, router_keys_fn done, void *arg)
{
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    struct keys_job *j = malloc(sizeof *j);
    if (!j) {
        rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        done(arg, -1, &st);
        return;
    }
    *j = (struct keys_job){.r = r, .op = op, .keys = keys, .lens = lens, .n = n,
                           .out = out, .done = done, .arg = arg};
    snprintf(j->filter, sizeof j->filter, "%s", filter);
    int prc = router_pool_push(r->pool, keys_job_run, j);
    if (prc == 0)
        return;
    free(j);
    if (prc == -ECANCELED)
        rpc_status_set(&st, GRPC_STATUS_UNAVAILABLE, "%s on filter \"%s\": the "
                       "router is shutting down", op_names[op], filter);
    else
        rpc_status_set(&st, GRPC_STATUS_UNAVAILABLE, "%s on filter \"%s\": the "
                       "router is fetching the secrets of %d filters already; "
                       "retry shortly", op_names[op], filter, ROUTER_POOL_QUEUE);
    done(arg, -1, &st);
}

/* Set while router_keys_start_nowait runs on its caller's thread. */
static __thread bool keys_nowait;

static void keys_start(struct router *r, const char *filter, enum router_key_op op,
                       const uint8_t *const *keys, const uint32_t *lens, size_t n,
                       bool *out, router_keys_fn done, void *arg, bool retried)
{
    struct topo *t = router_topo(r);
    struct key_batch *b = NULL;
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    bool write = op != ROUTER_MAY_CONTAIN;
    uint32_t nused = 0;
    bool ask0 = false;

    struct router_filter *f;
    if (rpc_server_on_loop() || keys_nowait) {
        /* A loop never waits for a node: a filter to fetch is the pool's. */
        struct router_filter *stale = NULL;
        f = router_filter_get(r, filter, t, &stale);
        router_filter_unref(stale);
        if (!f) {
            topo_unref(t);
            keys_to_pool(r, filter, op, keys, lens, n, out, done, arg);
            return;
        }
    } else if (!(f = router_filter_lookup(r, t, filter, &st))) {
        goto fail;
    }
    uint32_t S = f->shards;
    struct scratch *sc = scratch_get(n);
    if (!sc) {
        rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    /* Hash once, count per shard. */
    memset(sc->count, 0, (S + 1) * sizeof sc->count[0]);
    for (size_t i = 0; i < n; i++) {
        sc->h[i] = bf_hash_key(f->hasher, keys[i], lens[i]);
        sc->shard[i] = bf_hash_shard(sc->h[i], S);
        sc->count[sc->shard[i]]++;
        out[i] = false;
    }
    unsigned N = 1;
    for (uint32_t s = 0, off = 0; s < S; s++) {
        sc->start[s] = off;
        off += sc->count[s];
        nused += sc->count[s] > 0;
        if (sc->count[s] && t->groups[f->group[s]].nmembers > N)
            N = t->groups[f->group[s]].nmembers;
    }
    if (nused == 0 && op == ROUTER_REMOVE) {
        /* No keys: shard 0 still answers whether the filter takes a
         * Remove, as a node's Remove of no keys does. */
        ask0 = true;
        nused = 1;
        N = t->groups[f->group[0]].nmembers;
    }
    if (nused == 0) {
        router_filter_unref(f);
        topo_unref(t);
        done(arg, 0, &st);
        return;
    }
    b = batch_alloc(n, nused, N);
    if (!b) {
        rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto fail;
    }
    /* Sort by shard into the batch. */
    uint32_t fillc[ROUTER_MAX_SHARDS];
    memset(fillc, 0, S * sizeof fillc[0]);
    for (size_t i = 0; i < n; i++) {
        uint32_t s = sc->shard[i];
        size_t at = sc->start[s] + fillc[s]++;
        b->hs[at] = sc->h[i];
        b->idx[at] = (uint32_t)i;
        b->shard[i] = s;
    }
    unsigned rot = atomic_fetch_add(&r->read_rotation, 1);
    for (uint32_t s = 0; s < S; s++) {
        if (!sc->count[s] && !(ask0 && s == 0))
            continue;
        const struct topo_group *g = &t->groups[f->group[s]];
        b->q[b->nq++] = (struct shard_q){.shard = s, .start = sc->start[s],
                                         .count = sc->count[s], .g = g,
                                         .need = write ? quorum_write_need(g)
                                                       : quorum_read_need(g),
                                         .need_other = write ? quorum_write_need_other(g)
                                                             : 0,
                                         .rot = rot % g->ncopies};
    }
    snprintf(b->filter, sizeof b->filter, "%s", filter);
    b->r = r;
    b->t = t;
    b->f = f;
    b->op = op;
    b->retried = retried;
    b->keys = keys;
    b->lens = lens;
    b->n = n;
    b->out = out;
    b->done = done;
    b->arg = arg;
    atomic_init(&b->refs, 1);
    batch_round(b);
    batch_unref(b);
    return;
fail:
    router_filter_unref(f);
    topo_unref(t);
    done(arg, -1, &st);
}

void router_keys_start(struct router *r, const char *filter, enum router_key_op op,
                       const uint8_t *const *keys, const uint32_t *lens, size_t n,
                       bool *out, router_keys_fn done, void *arg)
{
    keys_start(r, filter, op, keys, lens, n, out, done, arg, false);
}

void router_keys_start_nowait(struct router *r, const char *filter,
                              enum router_key_op op, const uint8_t *const *keys,
                              const uint32_t *lens, size_t n, bool *out,
                              router_keys_fn done, void *arg)
{
    keys_nowait = true;
    keys_start(r, filter, op, keys, lens, n, out, done, arg, false);
    keys_nowait = false;
}
