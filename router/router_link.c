/* router_link: the router's streams to one node (see router_link.h).
 *
 * Each lane drives one Internal/Batches call on the gRPC core directly: a
 * RECV_STATUS_ON_CLIENT posted when the stream opens (its completion says
 * the stream ended), one RECV_MESSAGE at a time, and one SEND_MESSAGE at a
 * time; all complete on the link's completion queue, read by the link's
 * thread.  Submitting threads queue their calls and, when the lane has
 * nothing in flight, build and start the next send themselves.  The link's
 * mutex guards the lanes, their queues, streams and messages, and the
 * calls' private fields; a call's waiter is told under it, so a caller that
 * takes the mutex knows no answer is being written into its call.
 *
 * A message is built from the queue front (whole calls, up to
 * max_message_hashes hashes): entries with the same filter, secret,
 * operation and shard get one wire entry, each call entry remembering its
 * wire entry and its offset in it (struct link_slot); the answer's
 * ShardResult of that wire entry gives the call entry its slice of
 * results, or its error.
 */
#include "router_link.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <xxhash.h>

#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "rpc_arena.h"

#define M_BATCHES "/bloomgrid.v1.Internal/Batches"
#define ENTRY_OVERHEAD 32       /* queued bytes an entry counts beyond its hashes */

enum { LANE_READ, LANE_WRITE, LANES };
static const char *const lane_names[] = {"reads", "writes"};

enum call_state { CALL_NEW, CALL_QUEUED, CALL_SENT, CALL_DONE };
enum tag_kind { TAG_SEND, TAG_RECV, TAG_STATUS };

struct link_waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    size_t pending;             /* calls not done */
};

struct link_tag {
    struct link_stream *s;
    enum tag_kind kind;
};

/* One Batches call.  Freed once every batch started on it has completed. */
struct link_stream {
    struct link_lane *lane;
    grpc_call *call;
    struct link_tag tags[3];
    int ops;                    /* batches started and not completed */
    bool md_sent, sending, ended;
    bool stuck;                 /* cancelled: a message outlived a deadline */
    bool bad_answer;            /* cancelled: an answer that does not fit */
    grpc_byte_buffer *send_buf, *recv_buf;
    grpc_metadata_array md_initial, md_trailing;
    grpc_status_code status;
    grpc_slice details;
    const char *err_string;
};

/* Where a call entry's hashes sit in a message. */
struct link_slot {
    uint32_t wire, off;
};

/* A message in flight (one allocation holding every array). */
struct link_msg {
    uint64_t id;
    struct link_stream *s;
    size_t ncalls;
    struct router_link_call **calls;   /* NULL once its caller took it back */
    size_t *first;              /* per call: its first slot */
    struct link_slot *slots;    /* per call entry */
    size_t nwire;
    uint32_t *wire_n;           /* hashes per wire entry */
    uint32_t *wire_shard;
};

struct link_lane {
    struct router_link *l;
    int kind;
    struct link_stream *cur;    /* NULL: open one on the next send */
    struct router_link_call *qhead, *qtail;
    struct link_msg *inflight;  /* at most one */
    uint64_t next_id;
};

/* Scratch for building messages, reused under the link's mutex. */
struct link_build {
    Bloomgrid__V1__BatchEntry *ent;
    Bloomgrid__V1__BatchEntry **ptr;
    struct router_link_call **wire_call;   /* the call that opened a wire entry */
    uint32_t *wire_start, *wire_n, *wire_shard;
    uint64_t *wire_hash;
    size_t wcap;
    int32_t *table;
    size_t tcap;
    uint8_t *hb;
    size_t hcap;
};

struct router_link {
    char *addr;
    struct router_link_config cfg;
    struct rpc_channel *ch;
    void *method;               /* Batches, registered on the channel */
    grpc_completion_queue *cq;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t idle;        /* a stream was freed */
    struct link_lane lane[LANES];
    size_t qbytes;              /* bytes of queued calls */
    int streams;                /* not yet freed */
    bool closing;
    struct link_build b;
    struct rpc_arena arena;     /* answers; the link's thread only */
};

static inline void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static int lane_of(const struct router_link_call *c)
{
    return c->op == ROUTER_LINK_MAY_CONTAIN ? LANE_READ : LANE_WRITE;
}

/* ---- calls ---- */

/* The call is done: tell its waiter.  Caller holds the link's mutex; the
 * call is not touched after this (its owner may return at once). */
static void call_done(struct router_link_call *c)
{
    struct link_waiter *w = c->w;
    c->state = CALL_DONE;
    pthread_mutex_lock(&w->mu);
    if (--w->pending == 0)
        pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void call_fail(struct router_link_call *c, grpc_status_code code,
                      enum rpc_reason reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Every entry of c fails with one status; then c is done. */
static void call_fail(struct router_link_call *c, grpc_status_code code,
                      enum rpc_reason reason, const char *fmt, ...)
{
    char msg[RPC_MSGLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    for (size_t j = 0; j < c->n; j++) {
        c->e[j].st.code = code;
        c->e[j].st.reason = reason;
        memcpy(c->e[j].st.message, msg, sizeof msg);
        c->e[j].version = 0;
    }
    call_done(c);
}

/* Take c out of its lane's queue. */
static void queue_remove(struct router_link *l, struct router_link_call *c)
{
    struct link_lane *ln = &l->lane[lane_of(c)];
    struct router_link_call **pp = &ln->qhead, *prev = NULL;
    while (*pp && *pp != c) {
        prev = *pp;
        pp = &(*pp)->qnext;
    }
    if (!*pp)
        return;
    *pp = c->qnext;
    if (ln->qtail == c)
        ln->qtail = prev;
    c->qnext = NULL;
    l->qbytes -= c->bytes;
}

/* ---- streams ---- */

static void stream_maybe_free(struct link_stream *s)
{
    if (s->ops > 0)
        return;
    struct router_link *l = s->lane->l;
    if (s->lane->cur == s)
        s->lane->cur = NULL;
    if (s->send_buf)
        grpc_byte_buffer_destroy(s->send_buf);
    if (s->recv_buf)
        grpc_byte_buffer_destroy(s->recv_buf);
    grpc_metadata_array_destroy(&s->md_initial);
    grpc_metadata_array_destroy(&s->md_trailing);
    grpc_slice_unref(s->details);
    if (s->err_string)
        gpr_free((void *)s->err_string);
    grpc_call_unref(s->call);
    free(s);
    l->streams--;
    pthread_cond_broadcast(&l->idle);
}

/* Post the next RECV_MESSAGE (with the initial metadata the first time). */
static bool stream_post_recv(struct link_stream *s, bool first)
{
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (first) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n].data.recv_initial_metadata.recv_initial_metadata = &s->md_initial;
        n++;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &s->recv_buf;
    n++;
    if (grpc_call_start_batch(s->call, ops, n, &s->tags[TAG_RECV], NULL) != GRPC_CALL_OK)
        return false;
    s->ops++;
    return true;
}

/* Open the lane's stream: nothing goes to the network until its first
 * message.  Returns 0 or -1. */
static int lane_open(struct link_lane *ln)
{
    struct router_link *l = ln->l;
    struct link_stream *s = calloc(1, sizeof *s);
    if (!s)
        return -1;
    s->lane = ln;
    s->call = grpc_channel_create_registered_call(
        rpc_channel_grpc(l->ch), NULL, GRPC_PROPAGATE_DEFAULTS, l->cq, l->method,
        gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    if (!s->call) {
        free(s);
        return -1;
    }
    for (int k = 0; k < 3; k++) {
        s->tags[k].s = s;
        s->tags[k].kind = (enum tag_kind)k;
    }
    grpc_metadata_array_init(&s->md_initial);
    grpc_metadata_array_init(&s->md_trailing);
    s->details = grpc_empty_slice();
    s->status = GRPC_STATUS_UNKNOWN;
    l->streams++;

    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &s->md_trailing;
    op.data.recv_status_on_client.status = &s->status;
    op.data.recv_status_on_client.status_details = &s->details;
    op.data.recv_status_on_client.error_string = &s->err_string;
    if (grpc_call_start_batch(s->call, &op, 1, &s->tags[TAG_STATUS], NULL) != GRPC_CALL_OK) {
        stream_maybe_free(s);
        return -1;
    }
    s->ops++;
    ln->cur = s;
    if (!stream_post_recv(s, true)) {
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
    }
    return 0;
}

/* ---- building a message ---- */

/* Grow *pp to n elements of size bytes; false when out of memory (*pp is
 * then unchanged). */
static bool grow(void *pp, size_t n, size_t size)
{
    void **p = pp;
    void *q = realloc(*p, n * size);
    if (!q)
        return false;
    *p = q;
    return true;
}

static int build_reserve(struct link_build *b, size_t wires, size_t table, size_t hbytes)
{
    if (wires > b->wcap) {
        size_t cap = b->wcap ? b->wcap : 64;
        while (cap < wires)
            cap *= 2;
        if (!grow(&b->ent, cap, sizeof *b->ent) || !grow(&b->ptr, cap, sizeof *b->ptr) ||
            !grow(&b->wire_call, cap, sizeof *b->wire_call) ||
            !grow(&b->wire_start, cap, sizeof *b->wire_start) ||
            !grow(&b->wire_n, cap, sizeof *b->wire_n) ||
            !grow(&b->wire_shard, cap, sizeof *b->wire_shard) ||
            !grow(&b->wire_hash, cap, sizeof *b->wire_hash))
            return -ENOMEM;
        b->wcap = cap;
    }
    if (table > b->tcap) {
        if (!grow(&b->table, table, sizeof *b->table))
            return -ENOMEM;
        b->tcap = table;
    }
    if (hbytes > b->hcap) {
        size_t cap = b->hcap ? b->hcap : 4096;
        while (cap < hbytes)
            cap *= 2;
        if (!grow(&b->hb, cap, 1))
            return -ENOMEM;
        b->hcap = cap;
    }
    return 0;
}

static void build_free(struct link_build *b)
{
    free(b->ent);
    free(b->ptr);
    free(b->wire_call);
    free(b->wire_start);
    free(b->wire_n);
    free(b->wire_shard);
    free(b->wire_hash);
    free(b->table);
    free(b->hb);
    memset(b, 0, sizeof *b);
}

static bool same_key(const struct router_link_call *a, const struct router_link_call *c)
{
    return a == c || (a->op == c->op && a->secret_id == c->secret_id &&
                      strcmp(a->filter, c->filter) == 0);
}

static Bloomgrid__V1__BatchOp wire_op(enum router_link_op op)
{
    switch (op) {
    case ROUTER_LINK_MAY_CONTAIN:
        return BLOOMGRID__V1__BATCH_OP__BATCH_OP_MAY_CONTAIN;
    case ROUTER_LINK_REMOVE:
        return BLOOMGRID__V1__BATCH_OP__BATCH_OP_REMOVE;
    default:
        return BLOOMGRID__V1__BATCH_OP__BATCH_OP_ADD;
    }
}

static size_t call_hashes(const struct router_link_call *c)
{
    size_t n = 0;
    for (size_t j = 0; j < c->n; j++)
        n += c->e[j].n;
    return n;
}

/* A message of the calls at the lane's queue front, packed into *out.
 * The calls taken leave the queue.  NULL when out of memory (the calls
 * then stay queued). */
static struct link_msg *msg_build(struct link_lane *ln, grpc_byte_buffer **out)
{
    struct router_link *l = ln->l;
    struct link_build *b = &l->b;
    size_t ncalls = 0, nent = 0, nhash = 0, bytes = 0;
    size_t max_bytes = l->cfg.max_message > 4096 ? l->cfg.max_message - 1024 : 4096;

    for (struct router_link_call *c = ln->qhead; c; c = c->qnext) {
        size_t h = call_hashes(c);
        if (ncalls && (nhash + h > l->cfg.max_message_hashes || bytes + c->bytes > max_bytes ||
                       c->topology_version != ln->qhead->topology_version))
            break;
        ncalls++;
        nent += c->n;
        nhash += h;
        bytes += c->bytes + strlen(c->filter);
    }
    size_t tsize = 16;
    while (tsize < 2 * nent)
        tsize *= 2;
    if (build_reserve(b, nent, tsize, 16 * nhash) < 0)
        return NULL;

    /* One block: the message and its arrays, pointers first. */
    size_t sz = sizeof(struct link_msg) + ncalls * sizeof(struct router_link_call *) +
                ncalls * sizeof(size_t) + nent * sizeof(struct link_slot) +
                2 * nent * sizeof(uint32_t);
    struct link_msg *m = calloc(1, sz);
    if (!m)
        return NULL;
    m->calls = (struct router_link_call **)(m + 1);
    m->first = (size_t *)(m->calls + ncalls);
    m->slots = (struct link_slot *)(m->first + ncalls);
    m->wire_n = (uint32_t *)(m->slots + nent);
    m->wire_shard = m->wire_n + nent;
    m->ncalls = ncalls;
    m->id = ++ln->next_id;

    /* Merge entries into wire entries. */
    memset(b->table, 0xff, tsize * sizeof *b->table);
    size_t nwire = 0, slot = 0;
    struct router_link_call *c = ln->qhead;
    for (size_t i = 0; i < ncalls; i++, c = c->qnext) {
        uint64_t fh = XXH3_64bits(c->filter, strlen(c->filter)) ^
                      (c->secret_id * 0x9E3779B97F4A7C15ull) ^ (uint64_t)c->op;
        m->calls[i] = c;
        m->first[i] = slot;
        for (size_t j = 0; j < c->n; j++, slot++) {
            const struct router_link_entry *e = &c->e[j];
            uint64_t h = XXH3_64bits_withSeed(&e->shard, sizeof e->shard, fh);
            size_t t = (size_t)h & (tsize - 1);
            int32_t w;
            while ((w = b->table[t]) >= 0 &&
                   !(b->wire_hash[w] == h && b->wire_shard[w] == e->shard &&
                     same_key(b->wire_call[w], c)))
                t = (t + 1) & (tsize - 1);
            if (w < 0) {
                w = (int32_t)nwire++;
                b->table[t] = w;
                b->wire_hash[w] = h;
                b->wire_shard[w] = e->shard;
                b->wire_call[w] = c;
                b->wire_n[w] = 0;
            }
            m->slots[slot].wire = (uint32_t)w;
            m->slots[slot].off = b->wire_n[w];
            b->wire_n[w] += e->n;
        }
    }
    m->nwire = nwire;
    for (size_t w = 0, start = 0; w < nwire; w++) {
        b->wire_start[w] = (uint32_t)start;
        start += b->wire_n[w];
        m->wire_n[w] = b->wire_n[w];
        m->wire_shard[w] = b->wire_shard[w];
    }
    /* Hashes into place, 16 bytes each (h1, h2 little-endian). */
    for (size_t i = 0; i < ncalls; i++) {
        c = m->calls[i];
        for (size_t j = 0; j < c->n; j++) {
            const struct link_slot *sl = &m->slots[m->first[i] + j];
            uint8_t *p = b->hb + 16 * ((size_t)b->wire_start[sl->wire] + sl->off);
            for (uint32_t k = 0; k < c->e[j].n; k++, p += 16) {
                put_le64(p, c->e[j].h[k].h1);
                put_le64(p + 8, c->e[j].h[k].h2);
            }
        }
    }
    Bloomgrid__V1__BatchRequest rq = BLOOMGRID__V1__BATCH_REQUEST__INIT;
    rq.topology_version = ln->qhead->topology_version;
    for (size_t w = 0; w < nwire; w++) {
        Bloomgrid__V1__BatchEntry *be = &b->ent[w];
        const struct router_link_call *wc = b->wire_call[w];
        bloomgrid__v1__batch_entry__init(be);
        be->filter = (char *)wc->filter;
        be->shard_index = b->wire_shard[w];
        be->op = wire_op(wc->op);
        be->secret_id = wc->secret_id;
        be->hashes.len = 16 * (size_t)b->wire_n[w];
        be->hashes.data = b->hb + 16 * (size_t)b->wire_start[w];
        b->ptr[w] = be;
    }
    rq.id = m->id;
    rq.n_entries = nwire;
    rq.entries = b->ptr;
    size_t len = protobuf_c_message_get_packed_size(&rq.base);
    grpc_slice sl = grpc_slice_malloc(len);
    protobuf_c_message_pack(&rq.base, GRPC_SLICE_START_PTR(sl));
    *out = grpc_raw_byte_buffer_create(&sl, 1);
    grpc_slice_unref(sl);

    /* The calls leave the queue. */
    for (size_t i = 0; i < ncalls; i++) {
        c = m->calls[i];
        ln->qhead = c->qnext;
        c->qnext = NULL;
        l->qbytes -= c->bytes;
        c->state = CALL_SENT;
        c->msg = m;
        c->slot = i;
    }
    if (!ln->qhead)
        ln->qtail = NULL;
    return m;
}

/* Fail every call of m (those still waiting for it) and free it. */
static void msg_fail(struct link_msg *m, grpc_status_code code, const char *what,
                     const char *addr)
{
    for (size_t i = 0; i < m->ncalls; i++)
        if (m->calls[i])
            call_fail(m->calls[i], code, RPC_REASON_NONE, "node %s: %s", addr, what);
    free(m);
}

/* If the lane has calls queued and nothing in flight, send the next
 * message (opening a stream first when it has none).  Caller holds the
 * link's mutex. */
static void lane_kick(struct link_lane *ln)
{
    struct router_link *l = ln->l;
    if (!ln->qhead || ln->inflight || l->closing)
        return;
    if (!ln->cur && lane_open(ln) < 0) {
        while (ln->qhead) {
            struct router_link_call *c = ln->qhead;
            queue_remove(l, c);
            call_fail(c, GRPC_STATUS_UNAVAILABLE, RPC_REASON_NONE,
                      "node %s: cannot open a stream to it", l->addr);
        }
        return;
    }
    struct link_stream *s = ln->cur;
    if (s->sending || s->ended)
        return;     /* the send's or the status's completion kicks again */
    grpc_byte_buffer *bb = NULL;
    struct link_msg *m = msg_build(ln, &bb);
    if (!m) {
        struct router_link_call *c = ln->qhead;
        queue_remove(l, c);
        call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, RPC_REASON_NONE,
                  "router out of memory for a message to node %s", l->addr);
        return;
    }
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!s->md_sent) {
        ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        s->md_sent = true;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = bb;
    n++;
    m->s = s;
    ln->inflight = m;
    s->send_buf = bb;
    if (grpc_call_start_batch(s->call, ops, n, &s->tags[TAG_SEND], NULL) != GRPC_CALL_OK) {
        /* The status that follows the cancel fails the message. */
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
        return;
    }
    s->ops++;
    s->sending = true;
}

/* ---- completions (the link's thread) ---- */

static void on_send(struct link_stream *s, bool ok)
{
    struct router_link *l = s->lane->l;
    pthread_mutex_lock(&l->mu);
    s->ops--;
    s->sending = false;
    grpc_byte_buffer_destroy(s->send_buf);
    s->send_buf = NULL;
    if (!ok) {
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
    } else if (s->lane->cur == s) {
        lane_kick(s->lane);
    }
    stream_maybe_free(s);
    pthread_mutex_unlock(&l->mu);
}

/* Give every call of m its entries' outcomes from resp. */
static void msg_deliver(struct link_msg *m, const Bloomgrid__V1__BatchResponse *resp,
                        const char *addr)
{
    for (size_t i = 0; i < m->ncalls; i++) {
        struct router_link_call *c = m->calls[i];
        if (!c)
            continue;
        for (size_t j = 0; j < c->n; j++) {
            struct router_link_entry *e = &c->e[j];
            const struct link_slot *sl = &m->slots[m->first[i] + j];
            const Bloomgrid__V1__ShardResult *r =
                sl->wire < resp->n_results ? resp->results[sl->wire] : NULL;
            e->version = 0;
            e->st.reason = RPC_REASON_NONE;
            e->st.message[0] = 0;
            if (!r || r->shard_index != m->wire_shard[sl->wire] ||
                (r->code == 0 && r->n_results != m->wire_n[sl->wire])) {
                e->st.code = GRPC_STATUS_INTERNAL;
                snprintf(e->st.message, sizeof e->st.message,
                         "node %s: answer does not parse or has the wrong number "
                         "of results", addr);
                continue;
            }
            if (r->code != 0) {
                e->st.code = (grpc_status_code)r->code;
                if ((int)r->reason > 0 && (int)r->reason <= RPC_REASON_NOT_COUNTING)
                    e->st.reason = (enum rpc_reason)r->reason;
                snprintf(e->st.message, sizeof e->st.message, "%s",
                         r->message && r->message[0] ? r->message
                                                     : rpc_status_name(e->st.code));
                continue;
            }
            e->st.code = GRPC_STATUS_OK;
            e->version = r->version;
            for (uint32_t k = 0; k < e->n; k++)
                e->out[k] = r->results[sl->off + k] != 0;
        }
        call_done(c);
    }
}

static void on_recv(struct link_stream *s, bool ok)
{
    struct link_lane *ln = s->lane;
    struct router_link *l = ln->l;
    grpc_byte_buffer *bb = s->recv_buf;
    s->recv_buf = NULL;
    Bloomgrid__V1__BatchResponse *resp = NULL;
    if (ok && bb) {
        /* Decoded before the mutex is taken; only this thread receives. */
        grpc_byte_buffer_reader rd;
        if (grpc_byte_buffer_reader_init(&rd, bb)) {
            grpc_slice sl = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
            rpc_arena_reset(&l->arena);
            resp = bloomgrid__v1__batch_response__unpack(rpc_arena_allocator(&l->arena),
                                                         GRPC_SLICE_LENGTH(sl),
                                                         GRPC_SLICE_START_PTR(sl));
            grpc_slice_unref(sl);
        }
    }
    if (bb)
        grpc_byte_buffer_destroy(bb);
    pthread_mutex_lock(&l->mu);
    s->ops--;
    if (!ok || !bb) {
        s->ended = true;        /* the status follows */
    } else if (!resp || !ln->inflight || ln->inflight->s != s ||
               ln->inflight->id != resp->id) {
        log_warn("node %s: an answer on the %s stream that does not parse or "
                 "matches no message; reopening it", l->addr, lane_names[ln->kind]);
        s->bad_answer = true;
        s->ended = true;
        grpc_call_cancel(s->call, NULL);
    } else {
        struct link_msg *m = ln->inflight;
        ln->inflight = NULL;
        msg_deliver(m, resp, l->addr);
        free(m);
        if (!stream_post_recv(s, false)) {
            s->ended = true;
            grpc_call_cancel(s->call, NULL);
        } else {
            lane_kick(ln);
        }
    }
    stream_maybe_free(s);
    pthread_mutex_unlock(&l->mu);
}

static void on_status(struct link_stream *s)
{
    struct link_lane *ln = s->lane;
    struct router_link *l = ln->l;
    pthread_mutex_lock(&l->mu);
    s->ops--;
    s->ended = true;
    if (ln->inflight && ln->inflight->s == s) {
        char what[RPC_MSGLEN];
        grpc_status_code code = GRPC_STATUS_UNAVAILABLE;
        size_t dl = GRPC_SLICE_LENGTH(s->details);
        if (s->stuck) {
            code = GRPC_STATUS_DEADLINE_EXCEEDED;
            snprintf(what, sizeof what, "no answer within the deadline");
        } else if (s->bad_answer) {
            code = GRPC_STATUS_INTERNAL;
            snprintf(what, sizeof what, "answer does not parse or has the wrong "
                     "number of results");
        } else {
            if (s->status != GRPC_STATUS_OK && s->status != GRPC_STATUS_CANCELLED)
                code = s->status;
            snprintf(what, sizeof what, "%s stream ended (%s): %.*s",
                     lane_names[ln->kind], rpc_status_name(s->status),
                     (int)(dl < 300 ? dl : 300),
                     (const char *)GRPC_SLICE_START_PTR(s->details));
        }
        struct link_msg *m = ln->inflight;
        ln->inflight = NULL;
        if (!l->closing)
            log_info("node %s: %s", l->addr, what);
        msg_fail(m, code, what, l->addr);
    }
    if (ln->cur == s)
        ln->cur = NULL;
    lane_kick(ln);              /* queued calls go on a new stream */
    stream_maybe_free(s);
    pthread_mutex_unlock(&l->mu);
}

static void *link_main(void *arg)
{
    struct router_link *l = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(
            l->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type != GRPC_OP_COMPLETE)
            continue;
        struct link_tag *t = ev.tag;
        switch (t->kind) {
        case TAG_SEND:
            on_send(t->s, ev.success != 0);
            break;
        case TAG_RECV:
            on_recv(t->s, ev.success != 0);
            break;
        case TAG_STATUS:
            on_status(t->s);
            break;
        }
    }
    return NULL;
}

/* ---- the link ---- */

struct router_link *router_link_create(const char *addr,
                                       const struct router_link_config *cfg)
{
    struct router_link *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->cfg = *cfg;
    if (!l->cfg.max_message_hashes)
        l->cfg.max_message_hashes = 1;
    l->addr = strdup(addr);
    l->ch = l->addr ? rpc_channel_create(addr, cfg->max_message) : NULL;
    if (!l->ch)
        goto fail;
    l->method = grpc_channel_register_call(rpc_channel_grpc(l->ch), M_BATCHES, NULL, NULL);
    l->cq = grpc_completion_queue_create_for_next(NULL);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->idle, NULL);
    for (int k = 0; k < LANES; k++) {
        l->lane[k].l = l;
        l->lane[k].kind = k;
    }
    rpc_arena_init(&l->arena, 4 * cfg->max_message + (1u << 20));
    if (pthread_create(&l->thread, NULL, link_main, l) != 0) {
        rpc_arena_deinit(&l->arena);
        grpc_completion_queue_shutdown(l->cq);
        grpc_completion_queue_destroy(l->cq);
        pthread_mutex_destroy(&l->mu);
        pthread_cond_destroy(&l->idle);
        goto fail;
    }
    return l;
fail:
    rpc_channel_destroy(l->ch);
    free(l->addr);
    free(l);
    return NULL;
}

void router_link_destroy(struct router_link *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->mu);
    l->closing = true;
    for (int k = 0; k < LANES; k++)
        if (l->lane[k].cur)
            grpc_call_cancel(l->lane[k].cur->call, NULL);
    while (l->streams > 0)
        pthread_cond_wait(&l->idle, &l->mu);
    pthread_mutex_unlock(&l->mu);
    grpc_completion_queue_shutdown(l->cq);
    pthread_join(l->thread, NULL);
    grpc_completion_queue_destroy(l->cq);
    rpc_channel_destroy(l->ch);
    rpc_arena_deinit(&l->arena);
    build_free(&l->b);
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->idle);
    free(l->addr);
    free(l);
}

const char *router_link_addr(const struct router_link *l)
{
    return l->addr;
}

struct rpc_channel *router_link_channel(struct router_link *l)
{
    return l->ch;
}

/* Queue c on its lane and send at once if the lane is idle. */
static void call_submit(struct router_link_call *c)
{
    struct router_link *l = c->link;
    pthread_mutex_lock(&l->mu);
    if (l->closing) {
        call_fail(c, GRPC_STATUS_UNAVAILABLE, RPC_REASON_NONE,
                  "node %s: the router is shutting down", l->addr);
    } else if (l->qbytes > 0 && l->qbytes + c->bytes > l->cfg.max_queue_bytes) {
        call_fail(c, GRPC_STATUS_RESOURCE_EXHAUSTED, RPC_REASON_NONE,
                  "node %s: %zu bytes already wait to be sent to it (the limit is "
                  "%zu: node_queue_mb); retry shortly", l->addr, l->qbytes,
                  l->cfg.max_queue_bytes);
    } else {
        struct link_lane *ln = &l->lane[lane_of(c)];
        c->state = CALL_QUEUED;
        c->qnext = NULL;
        if (ln->qtail)
            ln->qtail->qnext = c;
        else
            ln->qhead = c;
        ln->qtail = c;
        l->qbytes += c->bytes;
        lane_kick(ln);
    }
    pthread_mutex_unlock(&l->mu);
}

/* c's deadline passed: take it back. */
static void call_abandon(struct router_link_call *c, int timeout_ms)
{
    struct router_link *l = c->link;
    pthread_mutex_lock(&l->mu);
    if (c->state == CALL_QUEUED) {
        queue_remove(l, c);
        call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED, RPC_REASON_NONE,
                  "node %s: not sent within %d ms (its stream was busy)", l->addr,
                  timeout_ms);
    } else if (c->state == CALL_SENT) {
        struct link_msg *m = c->msg;
        m->calls[c->slot] = NULL;
        /* A message unanswered past a deadline: the node or the connection
         * is stuck; a new stream takes the next message. */
        struct link_lane *ln = &l->lane[lane_of(c)];
        if (ln->inflight == m && !m->s->ended) {
            log_warn("node %s: no answer on the %s stream within %d ms; reopening it",
                     l->addr, lane_names[ln->kind], timeout_ms);
            m->s->stuck = true;
            m->s->ended = true;
            grpc_call_cancel(m->s->call, NULL);
        }
        call_fail(c, GRPC_STATUS_DEADLINE_EXCEEDED, RPC_REASON_NONE,
                  "node %s: no answer within %d ms", l->addr, timeout_ms);
    }
    pthread_mutex_unlock(&l->mu);
}

void router_link_run(struct router_link_call *calls, size_t n, int timeout_ms)
{
    struct link_waiter w;
    pthread_condattr_t ca;

    if (n == 0)
        return;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&w.mu, NULL);
    w.pending = n;
    for (size_t i = 0; i < n; i++) {
        struct router_link_call *c = &calls[i];
        c->w = &w;
        c->state = CALL_NEW;
        c->msg = NULL;
        c->qnext = NULL;
        c->bytes = 16 * call_hashes(c) + ENTRY_OVERHEAD * c->n;
    }
    struct timespec dl;
    clock_gettime(CLOCK_MONOTONIC, &dl);
    dl.tv_sec += timeout_ms / 1000;
    dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
    if (dl.tv_nsec >= 1000000000) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000;
    }
    for (size_t i = 0; i < n; i++)
        call_submit(&calls[i]);
    pthread_mutex_lock(&w.mu);
    while (w.pending > 0)
        if (pthread_cond_timedwait(&w.cv, &w.mu, &dl) == ETIMEDOUT)
            break;
    bool late = w.pending > 0;
    pthread_mutex_unlock(&w.mu);
    if (late)
        for (size_t i = 0; i < n; i++)
            call_abandon(&calls[i], timeout_ms);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
}
