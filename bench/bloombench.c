/* bloombench: the project's load client for one bloomgrid server (a node, a
 * router or bench/grpc_floor), one workload per run.
 *
 * One client thread, one HTTP/2 connection, one completion queue, and
 * --depth calls in flight on it (depth 1: sequential calls), so the
 * figures read the same as a pipelined client of another system on one
 * connection.  --stream sends the batches as messages of one AddStream /
 * MayContainStream instead, --depth of them unanswered at a time.
 *
 * Keys are 16 bytes derived from (seed, index) with splitmix64, so every run
 * with the same seed sends the same keys to every server.  A query run
 * alternates key by key between the --prefill-count keys of --prefill-seed
 * (present) and keys of its own seed (absent but for false positives).
 *
 * Requests are packed and replies read with the project's key-batch codec
 * (common/rpc/rpc_keys.h, protobuf-c on the client side); every reply must
 * carry one answer per key.
 * The latency of a call is from just before it is started to its parsed
 * reply.  A run prints one line,
 *   RESULT op=.. mode=.. batch=.. depth=.. keys=.. calls=.. secs=.. kps=..
 *          cps=.. p50=.. p99=.. p999=.. true=.. errors=.. ccpu=..
 * (latencies in µs; true: the fraction of answers that were true; ccpu: the
 * client's CPU seconds), and exits 1 when any call failed.
 *
 * --token-file FILE (or $BLOOMGRID_TOKEN) sends a token on every call, for
 * servers with a tokens file.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "rpc_auth.h"
#include "rpc_client.h"
#include "rpc_keys.h"
#include "rpc_ops.h"
#include "rpc_tls.h"

#define KEYLEN 16
#define CALL_TIMEOUT_MS 15000

enum action { A_NONE, A_CREATE, A_DROP, A_PREFILL, A_RUN };

static struct {
    enum action action;
    const char *target, *filter, *token_file;
    bool add, stream, no_warmup;
    uint64_t batch, depth;
    double duration;
    uint64_t max_keys, seed, pseed, pcount, prefill, capacity, shards;
    double error_rate;
    double wait;
    const char *tls_ca, *tls_cert, *tls_key;
} o = {
    .filter = "bench",
    .batch = 1,
    .depth = 1,
    .duration = 3,
    .seed = 1,
    .pseed = 7,
    .capacity = 10000000,
    .error_rate = 0.01,
    .wait = 20,
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void say(const char *fmt, va_list ap)
{
    fprintf(stderr, "bloombench: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    say(fmt, ap);
    va_end(ap);
    exit(2);
}

/* ---- keys ---- */

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

static void key_of(uint8_t *k, uint64_t seed, uint64_t i)
{
    uint64_t a = splitmix(splitmix(seed) ^ i);
    uint64_t b = splitmix(a ^ seed);
    memcpy(k, &a, 8);
    memcpy(k + 8, &b, 8);
}

/* The key stream of a run: key i is present (a prefill key) for even i of a
 * query run with a prefill, and of the run's own seed otherwise. */
struct keys {
    uint64_t seed, pseed, pcount, next;
};

static void keys_next(struct keys *ks, uint8_t *k)
{
    uint64_t i = ks->next++;
    if (ks->pcount && !(i & 1))
        key_of(k, ks->pseed, splitmix(ks->seed ^ i) % ks->pcount);
    else
        key_of(k, ks->seed, i);
}

/* ---- latencies ---- */

struct lats {
    uint64_t *v;
    size_t n, cap;
};

static void lats_add(struct lats *l, uint64_t ns)
{
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1 << 16;
        l->v = realloc(l->v, l->cap * sizeof *l->v);
        if (!l->v)
            die("out of memory");
    }
    l->v[l->n++] = ns;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Percentile q in µs of the sorted latencies. */
static double lats_pct(const struct lats *l, double q)
{
    return l->n ? (double)l->v[(size_t)(q * (double)(l->n - 1))] / 1000.0 : 0;
}

/* ---- one run's state ---- */

struct run {
    bool add;
    uint64_t batch, depth, limit;    /* limit: keys to send at most */
    uint64_t deadline;
    struct keys ks;
    grpc_channel *ch;
    grpc_metadata *md;               /* initial metadata: the token */
    size_t nmd;
    grpc_completion_queue *cq;
    void *method;                    /* registered call handle */
    uint8_t *keybuf;                 /* batch keys, KEYLEN each */
    ProtobufCBinaryData *kd;
    bool *answers;                   /* of one reply */
    uint64_t sent, done, calls, trues, errors;
    struct lats lat;
};

static void run_error(struct run *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void run_error(struct run *r, const char *fmt, ...)
{
    if (r->errors++ == 0) {    /* the first says what went wrong */
        va_list ap;
        va_start(ap, fmt);
        say(fmt, ap);
        va_end(ap);
    }
}

/* Keys of the next message (at most the batch, none past the limit). */
static uint64_t run_next_count(const struct run *r)
{
    uint64_t left = r->limit - r->sent;
    return left < r->batch ? left : r->batch;
}

/* Pack the next n keys into a request (filter named when name is set). */
static grpc_byte_buffer *run_request(struct run *r, uint64_t n, bool name)
{
    for (uint64_t j = 0; j < n; j++) {
        keys_next(&r->ks, r->keybuf + j * KEYLEN);
        r->kd[j].len = KEYLEN;
        r->kd[j].data = r->keybuf + j * KEYLEN;
    }
    grpc_slice s = rpc_keys_request(r->add ? RPC_KEYS_ADD : RPC_KEYS_MAY_CONTAIN,
                                    name ? o.filter : "", r->kd, n);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    r->sent += n;
    return bb;
}

/* Check and count one reply of n answers; bb is destroyed. */
static void run_reply(struct run *r, grpc_byte_buffer *bb, uint64_t n, uint64_t t0)
{
    uint64_t t1 = now_ns();
    grpc_byte_buffer_reader rd;
    grpc_slice s = grpc_empty_slice();
    if (grpc_byte_buffer_reader_init(&rd, bb)) {
        s = grpc_byte_buffer_reader_readall(&rd);
        grpc_byte_buffer_reader_destroy(&rd);
    }
    grpc_byte_buffer_destroy(bb);
    int rc = rpc_keys_answer(r->add ? RPC_KEYS_ADD : RPC_KEYS_MAY_CONTAIN,
                             GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), r->answers, n);
    grpc_slice_unref(s);
    if (rc < 0) {
        run_error(r, "a reply that does not hold one answer for each of its %llu keys",
                  (unsigned long long)n);
        return;
    }
    for (uint64_t i = 0; i < n; i++)
        r->trues += r->answers[i];
    r->done += n;
    r->calls++;
    lats_add(&r->lat, t1 - t0);
}

static gpr_timespec deadline_in(int ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* The next completion; a queue silent for a whole call timeout is an error. */
static bool run_next_event(struct run *r, grpc_event *ev)
{
    *ev = grpc_completion_queue_next(r->cq, deadline_in(CALL_TIMEOUT_MS + 5000), NULL);
    if (ev->type == GRPC_OP_COMPLETE)
        return true;
    run_error(r, "no completion for %d ms", CALL_TIMEOUT_MS + 5000);
    return false;
}

/* ---- unary calls, --depth in flight ---- */

struct ucall {
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata_array md_i, md_t;
    grpc_status_code code;
    grpc_slice details;
    const char *err;
    uint64_t t0, n;
};

static void ucall_start(struct run *r, struct ucall *c, uint64_t n)
{
    memset(c, 0, sizeof *c);
    c->n = n;
    c->send = run_request(r, n, true);
    c->details = grpc_empty_slice();
    grpc_metadata_array_init(&c->md_i);
    grpc_metadata_array_init(&c->md_t);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = r->nmd;
    ops[0].data.send_initial_metadata.metadata = r->md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = c->send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &c->md_i;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &c->recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &c->md_t;
    ops[5].data.recv_status_on_client.status = &c->code;
    ops[5].data.recv_status_on_client.status_details = &c->details;
    ops[5].data.recv_status_on_client.error_string = &c->err;
    c->t0 = now_ns();
    c->call = grpc_channel_create_registered_call(r->ch, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq,
                                                  r->method, deadline_in(CALL_TIMEOUT_MS), NULL);
    if (!c->call || grpc_call_start_batch(c->call, ops, 6, c, NULL) != GRPC_CALL_OK)
        die("cannot start a call");
}

static void ucall_finish(struct run *r, struct ucall *c)
{
    if (c->code == GRPC_STATUS_OK && c->recv) {
        run_reply(r, c->recv, c->n, c->t0);
    } else {
        run_error(r, "call failed: %s %.*s", rpc_status_name(c->code),
                  (int)GRPC_SLICE_LENGTH(c->details), (const char *)GRPC_SLICE_START_PTR(c->details));
        if (c->recv)
            grpc_byte_buffer_destroy(c->recv);
    }
    grpc_byte_buffer_destroy(c->send);
    grpc_slice_unref(c->details);
    gpr_free((void *)c->err);
    grpc_metadata_array_destroy(&c->md_i);
    grpc_metadata_array_destroy(&c->md_t);
    grpc_call_unref(c->call);
}

static void run_unary(struct run *r)
{
    struct ucall *slots = calloc(r->depth, sizeof *slots);
    struct ucall **idle = calloc(r->depth, sizeof *idle);
    if (!slots || !idle)
        die("out of memory");
    size_t nidle = 0, inflight = 0;
    for (uint64_t i = 0; i < r->depth; i++)
        idle[nidle++] = &slots[i];
    for (;;) {
        while (nidle && now_ns() < r->deadline && r->sent < r->limit) {
            ucall_start(r, idle[--nidle], run_next_count(r));
            inflight++;
        }
        if (!inflight)
            break;
        grpc_event ev;
        if (!run_next_event(r, &ev))
            break;    /* calls still in flight die with the queue */
        ucall_finish(r, ev.tag);
        idle[nidle++] = ev.tag;
        inflight--;
    }
    free(slots);
    free(idle);
}

/* ---- one stream, --depth messages unanswered ---- */

/* gRPC allows one send and one receive batch at a time on a call: the loop
 * keeps one receive posted and sends whenever no send is running and fewer
 * than --depth messages wait for their answers (which come in order). */
struct scall {
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    bool sending, closed, md_sent, ended;
    uint64_t *t0, *n;                /* ring of unanswered messages */
    uint64_t head, unanswered;
    grpc_metadata_array md_i, md_t;
    grpc_status_code code;
    grpc_slice details;
    const char *err;
    char send_tag, recv_tag, status_tag;
};

static void scall_batch(struct scall *s, const grpc_op *ops, size_t n, void *tag)
{
    if (grpc_call_start_batch(s->call, ops, n, tag, NULL) != GRPC_CALL_OK)
        die("cannot start a stream batch");
}

static void scall_send(struct run *r, struct scall *s)
{
    grpc_op ops[2];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    if (!s->md_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = r->nmd;
        ops[n++].data.send_initial_metadata.metadata = r->md;
        s->md_sent = true;
    }
    if (now_ns() >= r->deadline || r->sent >= r->limit) {
        ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
        s->closed = true;
    } else {
        uint64_t k = run_next_count(r), slot = (s->head + s->unanswered) % r->depth;
        s->send = run_request(r, k, r->sent == 0);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = s->send;
        s->n[slot] = k;
        s->t0[slot] = now_ns();
        s->unanswered++;
    }
    s->sending = true;
    scall_batch(s, ops, n, &s->send_tag);
}

static void scall_recv(struct scall *s, bool first)
{
    grpc_op ops[2];
    size_t n = rpc_ops_recv(ops, first, &s->md_i, &s->recv);
    scall_batch(s, ops, n, &s->recv_tag);
}

static void run_stream(struct run *r)
{
    const char *path = r->add ? "/bloomgrid.v1.BloomGrid/AddStream"
                              : "/bloomgrid.v1.BloomGrid/MayContainStream";
    struct scall s = {0};
    s.t0 = calloc(r->depth, sizeof *s.t0);
    s.n = calloc(r->depth, sizeof *s.n);
    if (!s.t0 || !s.n)
        die("out of memory");
    grpc_metadata_array_init(&s.md_i);
    grpc_metadata_array_init(&s.md_t);
    s.details = grpc_empty_slice();
    grpc_slice method = grpc_slice_from_static_string(path);
    int ms = (int)(o.duration * 1000) + CALL_TIMEOUT_MS;
    s.call = grpc_channel_create_call(r->ch, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq, method, NULL,
                                      deadline_in(ms), NULL);
    if (!s.call)
        die("cannot create a stream");
    scall_recv(&s, true);
    scall_send(r, &s);
    bool recv_busy = true;
    while (recv_busy || s.sending) {
        grpc_event ev;
        if (!run_next_event(r, &ev)) {
            grpc_call_cancel(s.call, NULL);
            break;
        }
        if (ev.tag == &s.send_tag) {
            s.sending = false;
            if (s.send)
                grpc_byte_buffer_destroy(s.send);
            s.send = NULL;
            if (!ev.success)
                s.closed = true;    /* the call is over: its status says why */
        } else {
            recv_busy = false;
            if (!s.recv || !ev.success || !s.unanswered) {
                if (s.recv) {
                    run_error(r, "an answer to no message");
                    grpc_byte_buffer_destroy(s.recv);
                }
                s.ended = true;
            } else {
                uint64_t h = s.head;
                s.head = (s.head + 1) % r->depth;
                s.unanswered--;
                run_reply(r, s.recv, s.n[h], s.t0[h]);
                s.recv = NULL;
                scall_recv(&s, false);
                recv_busy = true;
            }
        }
        if (s.ended && !s.closed && !s.sending) {
            grpc_call_cancel(s.call, NULL);    /* the server stopped reading */
            s.closed = true;
        }
        if (!s.sending && !s.closed && (s.unanswered < r->depth || now_ns() >= r->deadline))
            scall_send(r, &s);
    }
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &s.md_t;
    op.data.recv_status_on_client.status = &s.code;
    op.data.recv_status_on_client.status_details = &s.details;
    op.data.recv_status_on_client.error_string = &s.err;
    scall_batch(&s, &op, 1, &s.status_tag);
    grpc_event ev = grpc_completion_queue_next(r->cq, deadline_in(ms), NULL);
    if (ev.type != GRPC_OP_COMPLETE || s.code != GRPC_STATUS_OK)
        run_error(r, "stream ended: %s %.*s", rpc_status_name(s.code),
                  (int)GRPC_SLICE_LENGTH(s.details), (const char *)GRPC_SLICE_START_PTR(s.details));
    else if (s.unanswered)
        run_error(r, "the stream ended with %llu messages unanswered",
                  (unsigned long long)s.unanswered);
    grpc_slice_unref(s.details);
    gpr_free((void *)s.err);
    grpc_metadata_array_destroy(&s.md_i);
    grpc_metadata_array_destroy(&s.md_t);
    grpc_call_unref(s.call);
    free(s.t0);
    free(s.n);
}

/* ---- runs ---- */

static void run_init(struct run *r, struct rpc_channel *rch, grpc_completion_queue *cq,
                     bool add, uint64_t batch, uint64_t depth)
{
    memset(r, 0, sizeof *r);
    grpc_channel *ch = rpc_channel_grpc(rch);
    r->ch = ch;
    r->nmd = rpc_channel_metadata(rch, &r->md);
    r->cq = cq;
    r->add = add;
    r->batch = batch;
    r->depth = depth;
    r->method = grpc_channel_register_call(ch, add ? "/bloomgrid.v1.BloomGrid/Add"
                                                   : "/bloomgrid.v1.BloomGrid/MayContain",
                                           NULL, NULL);
    r->keybuf = malloc(batch * KEYLEN);
    r->kd = malloc(batch * sizeof *r->kd);
    r->answers = malloc(batch * sizeof *r->answers);
    if (!r->keybuf || !r->kd || !r->answers)
        die("out of memory");
}

static void run_deinit(struct run *r)
{
    free(r->keybuf);
    free(r->kd);
    free(r->lat.v);
    free(r->answers);
}

static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* Create, drop: blocking calls with the shared client, retried while the
 * server comes up. */
static void setup(void)
{
    struct rpc_channel *ch = rpc_channel_create(o.target, 0);
    if (!ch)
        die("out of memory");
    Bloomgrid__V1__DropFilterRequest drq = BLOOMGRID__V1__DROP_FILTER_REQUEST__INIT;
    struct rpc_status st = {0};
    ProtobufCMessage *resp = NULL;
    drq.name = (char *)o.filter;
    uint64_t until = now_ns() + (uint64_t)(o.wait * 1e9);
    int rc;
    while ((rc = rpc_call(ch, "/bloomgrid.v1.BloomGrid/DropFilter", &drq.base,
                          &bloomgrid__v1__drop_filter_response__descriptor, &resp, CALL_TIMEOUT_MS,
                          &st)) < 0 &&
           st.code == GRPC_STATUS_UNAVAILABLE && now_ns() < until)
        usleep(50000);
    if (rc == 0)
        protobuf_c_message_free_unpacked(resp, NULL);
    else if (st.code != GRPC_STATUS_NOT_FOUND)
        die("DropFilter at %s: %s %s", o.target, rpc_status_name(st.code), st.message);
    if (o.action == A_CREATE) {
        Bloomgrid__V1__CreateFilterRequest crq = BLOOMGRID__V1__CREATE_FILTER_REQUEST__INIT;
        crq.name = (char *)o.filter;
        crq.capacity = o.capacity;
        crq.error_rate = o.error_rate;
        crq.shards = (uint32_t)o.shards;
        if (rpc_call(ch, "/bloomgrid.v1.BloomGrid/CreateFilter", &crq.base,
                     &bloomgrid__v1__filter_info__descriptor, &resp, CALL_TIMEOUT_MS, &st) < 0)
            die("CreateFilter at %s: %s %s", o.target, rpc_status_name(st.code), st.message);
        protobuf_c_message_free_unpacked(resp, NULL);
    }
    rpc_channel_destroy(ch);
    printf("OK %s %s\n", o.action == A_CREATE ? "created" : "dropped", o.filter);
}

/* Run r until the deadline or its limit. */
static void run_go(struct run *r, bool stream)
{
    if (stream)
        run_stream(r);
    else
        run_unary(r);
}

static int measure(void)
{
    struct rpc_channel *rch = rpc_channel_create(o.target, 0);
    if (!rch)
        die("out of memory");
    grpc_completion_queue *cq = grpc_completion_queue_create_for_next(NULL);
    struct run r;
    bool prefill = o.action == A_PREFILL;

    /* Warm-up: one single-key call (connection, first-call costs), not
     * counted, with keys no measured run uses (--no-warmup: none, for a
     * load shape that must send exactly its own calls). */
    if (!o.no_warmup) {
        run_init(&r, rch, cq, prefill || o.add, 1, 1);
        r.ks.seed = o.seed ^ 0x5741524d55505f5fu;
        r.limit = 1;
        r.deadline = now_ns() + 10 * 1000000000ull;
        run_unary(&r);
        if (r.errors)
            die("the warm-up call to %s failed", o.target);
        run_deinit(&r);
    }

    if (prefill) {
        run_init(&r, rch, cq, true, 1000, 4);
        r.ks.seed = o.pseed;
        r.limit = o.prefill;
        r.deadline = UINT64_MAX;
    } else {
        run_init(&r, rch, cq, o.add, o.batch, o.depth);
        r.ks = (struct keys){.seed = o.seed, .pseed = o.pseed, .pcount = o.add ? 0 : o.pcount};
        r.limit = o.max_keys ? o.max_keys : o.add ? o.capacity : UINT64_MAX;
    }
    double c0 = cpu_seconds();
    uint64_t t0 = now_ns();
    if (!prefill)
        r.deadline = t0 + (uint64_t)(o.duration * 1e9);
    run_go(&r, o.stream && !prefill);
    double secs = (double)(now_ns() - t0) / 1e9, ccpu = cpu_seconds() - c0;
    qsort(r.lat.v, r.lat.n, sizeof *r.lat.v, cmp_u64);
    if (prefill)
        printf("PREFILLED keys=%llu secs=%.3f errors=%llu\n", (unsigned long long)r.done, secs,
               (unsigned long long)r.errors);
    else
        printf("RESULT op=%s mode=%s batch=%llu depth=%llu keys=%llu calls=%llu secs=%.3f "
               "kps=%.0f cps=%.0f p50=%.1f p99=%.1f p999=%.1f true=%.4f errors=%llu "
               "ccpu=%.3f\n",
               o.add ? "add" : "query", o.stream ? "stream" : "unary",
               (unsigned long long)o.batch, (unsigned long long)o.depth,
               (unsigned long long)r.done, (unsigned long long)r.calls, secs,
               (double)r.done / secs, (double)r.calls / secs, lats_pct(&r.lat, 0.5),
               lats_pct(&r.lat, 0.99), lats_pct(&r.lat, 0.999),
               r.done ? (double)r.trues / (double)r.done : 0, (unsigned long long)r.errors, ccpu);
    fflush(stdout);
    int rc = r.errors ? 1 : 0;
    run_deinit(&r);
    rpc_channel_destroy(rch);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN)
        ;
    grpc_completion_queue_destroy(cq);
    return rc;
}

/* ---- options ---- */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: bloombench --target HOST:PORT [--filter NAME] ACTION [options]\n"
            "Load one bloomgrid server (node, router or bench/grpc_floor) over gRPC:\n"
            "one connection, --depth calls in flight; prints one RESULT line.\n"
            "actions:\n"
            "  --create            drop the filter if it exists, create it\n"
            "                      (--capacity, --error-rate, --shards)\n"
            "  --drop              drop the filter (absent is fine)\n"
            "  --prefill N         add the N keys of --prefill-seed (1000-key calls,\n"
            "                      4 in flight); prints PREFILLED keys=.. secs=..\n"
            "  --op add|query      one measured run (below)\n"
            "run options:\n"
            "  --batch N           keys per call (or stream message) [1]\n"
            "  --depth N           calls (or messages) in flight; 1 = sequential [1]\n"
            "  --stream            AddStream / MayContainStream: one stream, --batch\n"
            "                      keys a message, --depth messages unanswered\n"
            "  --duration S        seconds [3]\n"
            "  --max-keys N        send no more keys than N [adds: --capacity; queries:\n"
            "                      no limit]\n"
            "  --seed N            the run's own keys [1]\n"
            "  --prefill-seed N    the present keys [7]\n"
            "  --prefill-count N   query: every other key is one of the first N keys of\n"
            "                      --prefill-seed (0: all keys are the run's own) [0]\n"
            "  --no-warmup         no uncounted single-key call before the run (by\n"
            "                      default one is made: connection, first-call costs)\n"
            "setup options:\n"
            "  --filter NAME       filter to use [bench]\n"
            "  --capacity N        [10000000]\n"
            "  --error-rate P      [0.01]\n"
            "  --shards N          shards of a filter created through a router\n"
            "                      (0: the router's default) [0]\n"
            "  --wait S            how long --create/--drop retry while the server\n"
            "                      is not answering yet [20]\n"
            "  --tls-ca FILE       TLS to the server, verified with this CA (PEM)\n"
            "                      [plaintext]\n"
            "  --tls-cert FILE     a client certificate to present, with --tls-key\n"
            "  --tls-key FILE      its private key\n"
            "  --token-file FILE   send the token in FILE (default: $BLOOMGRID_TOKEN)\n"
            "  -h, --help          this text\n"
            "RESULT fields: keys, calls, secs, kps (keys/s), cps (calls/s), p50/p99/p999\n"
            "(µs per call), true (fraction of true answers), errors, ccpu (client CPU s).\n"
            "Exit status: 0, 1 when a call failed, 2 on bad usage or setup errors.\n");
}

static uint64_t num(const char *opt, const char *s, uint64_t min, uint64_t max)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < min || v > max)
        die("%s takes a whole number from %llu to %llu, not \"%s\"", opt,
            (unsigned long long)min, (unsigned long long)max, s);
    return v;
}

static double real(const char *opt, const char *s, double min, double max)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= min && v <= max))
        die("%s takes a number from %g to %g, not \"%s\"", opt, min, max, s);
    return v;
}

/* The token every channel sends: --token-file, else $BLOOMGRID_TOKEN. */
static void token_setup(void)
{
    char token[RPC_TOKEN_MAX + 1], err[RPC_AUTH_ERRLEN];
    const char *env = getenv(RPC_TOKEN_ENV);

    if (o.token_file) {
        if (rpc_token_read(o.token_file, token, err) < 0)
            die("--token-file: %s", err);
        env = token;
    }
    if (env && env[0] && rpc_client_set_token(env) < 0)
        die("the token of %s is not a token", o.token_file ? o.token_file : "$" RPC_TOKEN_ENV);
}

static void set_action(enum action a)
{
    if (o.action != A_NONE && o.action != a)
        die("give one action: --create, --drop, --prefill or --op");
    o.action = a;
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"target", 1, 0, 'T'},        {"filter", 1, 0, 'f'},        {"create", 0, 0, 'C'},
        {"drop", 0, 0, 'D'},          {"prefill", 1, 0, 'F'},       {"op", 1, 0, 'o'},
        {"batch", 1, 0, 'b'},         {"depth", 1, 0, 'd'},         {"stream", 0, 0, 'S'},
        {"duration", 1, 0, 't'},      {"max-keys", 1, 0, 'm'},      {"seed", 1, 0, 's'},
        {"prefill-seed", 1, 0, 'p'},  {"prefill-count", 1, 0, 'n'}, {"capacity", 1, 0, 'c'},
        {"error-rate", 1, 0, 'e'},    {"shards", 1, 0, 'x'},        {"wait", 1, 0, 'w'},
        {"tls-ca", 1, 0, 'A'},        {"tls-cert", 1, 0, 'R'},      {"tls-key", 1, 0, 'K'},
        {"token-file", 1, 0, 'O'},    {"help", 0, 0, 'h'},          {"no-warmup", 0, 0, 'N'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 'T': o.target = optarg; break;
        case 'f': o.filter = optarg; break;
        case 'C': set_action(A_CREATE); break;
        case 'D': set_action(A_DROP); break;
        case 'F':
            set_action(A_PREFILL);
            o.prefill = num("--prefill", optarg, 0, UINT64_MAX);
            break;
        case 'o':
            set_action(A_RUN);
            if (!strcmp(optarg, "add"))
                o.add = true;
            else if (strcmp(optarg, "query"))
                die("--op takes add or query, not \"%s\"", optarg);
            break;
        case 'b': o.batch = num("--batch", optarg, 1, 1000000); break;
        case 'd': o.depth = num("--depth", optarg, 1, 4096); break;
        case 'S': o.stream = true; break;
        case 'N': o.no_warmup = true; break;
        case 't': o.duration = real("--duration", optarg, 0.01, 3600); break;
        case 'm': o.max_keys = num("--max-keys", optarg, 1, UINT64_MAX); break;
        case 's': o.seed = num("--seed", optarg, 0, UINT64_MAX); break;
        case 'p': o.pseed = num("--prefill-seed", optarg, 0, UINT64_MAX); break;
        case 'n': o.pcount = num("--prefill-count", optarg, 0, UINT64_MAX); break;
        case 'c': o.capacity = num("--capacity", optarg, 1, UINT64_MAX); break;
        case 'e': o.error_rate = real("--error-rate", optarg, 1e-9, 0.5); break;
        case 'x': o.shards = num("--shards", optarg, 0, 65536); break;
        case 'w': o.wait = real("--wait", optarg, 0, 3600); break;
        case 'A': o.tls_ca = optarg; break;
        case 'R': o.tls_cert = optarg; break;
        case 'K': o.tls_key = optarg; break;
        case 'O': o.token_file = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc)
        die("unexpected argument \"%s\" (see --help)", argv[optind]);
    if (!o.target)
        die("--target HOST:PORT is required (see --help)");
    if (o.action == A_NONE)
        die("give an action: --create, --drop, --prefill N or --op add|query (see --help)");
    struct rpc_tls *tls = NULL;
    if (o.tls_ca || o.tls_cert || o.tls_key) {
        static const struct rpc_tls_names flags = {"--tls-cert", "--tls-key", "--tls-ca"};
        char err[RPC_TLS_ERRLEN];
        if (!(tls = rpc_tls_load(o.tls_cert, o.tls_key, o.tls_ca, &flags, err)))
            die("%s", err);
        rpc_tls_set_client(tls);   /* every channel of this run */
    }
    token_setup();
    grpc_init();
    int rc;
    if (o.action == A_CREATE || o.action == A_DROP) {
        setup();
        rc = 0;
    } else {
        rc = measure();
    }
    grpc_shutdown();
    rpc_tls_destroy(tls);
    return rc;
}
