/* rpc_server_budget: the request budget of a server (see rpc_server.h,
 * "Request budget").
 *
 * The gRPC core cannot say how large a message is before it has received
 * all of it, and it keeps receiving a message once a read of it is posted.
 * What bounds the bytes being received is therefore which reads are
 * posted.  A unary method of a server with a budget is registered without
 * its payload, so the call is handed over at its headers with at most
 * RPC_BUDGET_PROBE bytes of its message on the server (the stream window;
 * the client waits for more).  Its read then begins with that much
 * charged.  A read's age is the time its queue's threads have spent
 * waiting for events since it began: the transport reads and completes
 * reads there, not while a thread runs a handler, so a read whose message
 * has arrived is delivered before it grows old, however long the queue's
 * handlers take meanwhile, while a message still on its way is received
 * only for that long.  After each wait (rpc_server__budget_sweep), a read
 * older than RPC_BUDGET_QUICK_MS is receiving a message larger than a
 * window, so it takes the room of a whole message (max_message) out of the
 * large share, or, when the large share is full, the call is cancelled
 * with RESOURCE_EXHAUSTED naming the budget.  (Reads still running
 * STALL_MS of wall time later are taken as large too: threads waiting on
 * other queues may read for them meanwhile.)  A completed read counts its
 * message's bytes instead of its room until the call ends.
 *
 * The large share is the budget less an eighth, which only small requests
 * (reads of a window, charges within RPC_BUDGET_PROBE) may use: large
 * requests refused for want of room never hold up small ones.
 *
 * Large requests to the methods served on the loops are handed, once read,
 * to a thread of their own (heavy_main): copying, decoding and hashing tens
 * of megabytes takes the loop away from every small call for that long.
 *
 * Lock: srv->budget_lock guards budget_used, every slot's charge, the read
 * lists and the heavy thread's queue.  It is taken last: alone, or inside
 * the deferred book's lock (shutdown) or a handler's own.
 */
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "rpc_server.h"
#include "rpc_server_internal.h"

#define SWEEP_EVERY_MS 5
#define TRIM_BYTES (4u << 20)
#define STALL_MS 1000
#define IDLE_WAIT_MS 250
#define READS_WAIT_MS 5

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static const char *setting(const struct rpc_server *srv)
{
    return srv->cfg.budget_setting ? srv->cfg.budget_setting : "request_budget";
}

/* The refusal of a request for want of room (code and message). */
static void refusal(const struct rpc_server *srv, const char *what, uint64_t used,
                    struct rpc_status *st)
{
    st->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
    st->reason = RPC_REASON_NONE;
    snprintf(st->message, sizeof st->message,
             "%s refused: the server holds %" PRIu64 " MiB of requests in flight, "
             "and its budget (%s = %" PRIu64 " MiB, of which large requests may "
             "take %" PRIu64 " MiB) has no room for it; retry later", what, used >> 20,
             setting(srv), (uint64_t)srv->cfg.request_budget >> 20,
             srv->budget_large >> 20);
}

void rpc_server__budget_init(struct rpc_server *srv)
{
    pthread_mutex_init(&srv->budget_lock, NULL);
    pthread_cond_init(&srv->heavy_cond, NULL);
    srv->budget_used = 0;
    srv->budget_large = srv->cfg.request_budget - srv->cfg.request_budget / 8;
}

void rpc_server__budget_deinit(struct rpc_server *srv)
{
    pthread_cond_destroy(&srv->heavy_cond);
    pthread_mutex_destroy(&srv->budget_lock);
}

bool rpc_server__budget_gated(const struct rpc_server *srv, const struct rpc_method *m)
{
    return srv->cfg.request_budget > 0 && !m->stream && !m->lstream;
}

/* Take bytes when they fit: large requests within the large share, small
 * ones within the whole budget.  budget_lock held. */
static bool take_locked(struct rpc_server *srv, uint64_t bytes, bool large)
{
    uint64_t limit = large ? srv->budget_large : srv->cfg.request_budget;
    if (srv->budget_used + bytes > limit)
        return false;
    srv->budget_used += bytes;
    return true;
}

static void unlink_read_locked(struct slot *s)
{
    struct worker_cq *q = &s->srv->cqs[s->cqi];
    if (s->rprev)
        s->rprev->rnext = s->rnext;
    else
        q->reads_head = s->rnext;
    if (s->rnext)
        s->rnext->rprev = s->rprev;
    else
        q->reads_tail = s->rprev;
    s->rprev = s->rnext = NULL;
    atomic_fetch_sub(&q->nreads, 1);
}

void rpc_server__read_start(struct slot *s)
{
    struct rpc_server *srv = s->srv;
    struct worker_cq *q = &srv->cqs[s->cqi];
    grpc_op op;

    pthread_mutex_lock(&srv->budget_lock);
    uint64_t used = srv->budget_used;
    if (!take_locked(srv, RPC_BUDGET_PROBE, false)) {
        pthread_mutex_unlock(&srv->budget_lock);
        refusal(srv, s->m->path, used, &s->reply.st);
        log_warn("%s", s->reply.st.message);
        rpc_server__send_reply(s);
        return;
    }
    s->charge = RPC_BUDGET_PROBE;
    s->read_ns = now_ns();
    s->read_poll_ns = atomic_load(&q->poll_ns);
    s->state = SLOT_READING;
    /* Appended: the list stays oldest first. */
    s->rnext = NULL;
    s->rprev = q->reads_tail;
    if (q->reads_tail)
        q->reads_tail->rnext = s;
    else
        q->reads_head = s;
    q->reads_tail = s;
    atomic_fetch_add(&q->nreads, 1);
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->payload;
    grpc_call_error e = grpc_call_start_batch(s->call, &op, 1, s, NULL);
    if (e != GRPC_CALL_OK) {
        unlink_read_locked(s);
        pthread_mutex_unlock(&srv->budget_lock);
        log_error("%s: the read of the request failed to start: %d", s->m->path, e);
        rpc_server__slot_free(s);    /* gives the charge back */
        return;
    }
    pthread_mutex_unlock(&srv->budget_lock);
}

bool rpc_server__read_done(struct slot *s, bool ok)
{
    struct rpc_server *srv = s->srv;
    uint64_t len = s->payload ? grpc_byte_buffer_length(s->payload) : 0;

    pthread_mutex_lock(&srv->budget_lock);
    unlink_read_locked(s);
    bool refused = s->read_refused;
    /* The message's bytes instead of its room, whatever its size: it is
     * here now. */
    srv->budget_used = srv->budget_used - s->charge + len;
    s->charge = len;
    pthread_mutex_unlock(&srv->budget_lock);
    s->state = SLOT_REQUESTED;
    return ok && !refused;
}

/* A read taking long: the room of a whole message from the large share,
 * or the call is refused.  budget_lock held. */
static void read_slow_locked(struct rpc_server *srv, struct slot *s)
{
    uint64_t need = srv->cfg.max_message > s->charge ? srv->cfg.max_message - s->charge : 0;
    uint64_t used = srv->budget_used;
    if (take_locked(srv, need, true)) {
        s->charge += need;
        s->read_large = true;
        return;
    }
    struct rpc_status st;
    refusal(srv, s->m->path, used, &st);
    snprintf(st.message + strlen(st.message), sizeof st.message - strlen(st.message),
             " (a request of more than %u KiB is given the room of max_message)",
             RPC_BUDGET_PROBE >> 10);
    log_warn("%s", st.message);
    s->read_refused = true;
    rpc_server__call_done(s, GRPC_STATUS_RESOURCE_EXHAUSTED);
    grpc_call_cancel_with_status(s->call, GRPC_STATUS_RESOURCE_EXHAUSTED, st.message,
                                 NULL);
}

void rpc_server__budget_sweep(struct rpc_server *srv, int cqi, int64_t poll_ns)
{
    if (!srv->cfg.request_budget || cqi >= srv->ncq)
        return;
    struct worker_cq *q = &srv->cqs[cqi];
    int64_t polled = atomic_fetch_add(&q->poll_ns, poll_ns) + poll_ns;
    if (atomic_load(&q->nreads) == 0)
        return;
    int64_t now = now_ns();
    pthread_mutex_lock(&srv->budget_lock);
    if (now - q->swept_ns < (int64_t)SWEEP_EVERY_MS * 1000000) {
        pthread_mutex_unlock(&srv->budget_lock);
        return;
    }
    q->swept_ns = now;
    const int64_t quick = (int64_t)RPC_BUDGET_QUICK_MS * 1000000;
    const int64_t stall = (int64_t)STALL_MS * 1000000;
    for (struct slot *s = q->reads_head; s; s = s->rnext) {
        if (now - s->read_ns < quick)
            break;              /* the rest began later */
        if (!s->read_large && !s->read_refused &&
            (polled - s->read_poll_ns >= quick || now - s->read_ns >= stall))
            read_slow_locked(srv, s);
    }
    pthread_mutex_unlock(&srv->budget_lock);
}

int rpc_server__budget_wait_ms(const struct rpc_server *srv, int cqi)
{
    if (!srv->cfg.request_budget || cqi >= srv->ncq ||
        atomic_load(&srv->cqs[cqi].nreads) == 0)
        return IDLE_WAIT_MS;
    return READS_WAIT_MS;
}

void rpc_server__budget_stream_add(struct slot *s, size_t len)
{
    struct rpc_server *srv = s->srv;
    if (!srv->cfg.request_budget)
        return;
    pthread_mutex_lock(&srv->budget_lock);
    srv->budget_used += len;
    s->charge += len;
    pthread_mutex_unlock(&srv->budget_lock);
}

void rpc_server__budget_stream_sub(struct slot *s)
{
    rpc_server__budget_drop(s);
}

void rpc_server__budget_drop(struct slot *s)
{
    struct rpc_server *srv = s->srv;
    if (!s->charge)
        return;
    pthread_mutex_lock(&srv->budget_lock);
    srv->budget_used -= s->charge;
    s->charge = 0;
    pthread_mutex_unlock(&srv->budget_lock);
}

int rpc_reply_charge(struct rpc_reply *r, size_t bytes)
{
    struct rpc_unary_run *run = rpc_server__current_run;
    if (!run || &run->s->reply != r) {
        rpc_reply_error(r, GRPC_STATUS_INTERNAL,
                        "server error: a charge for a reply that is not its unary "
                        "handler's own");
        return -EINVAL;
    }
    struct slot *s = run->s;
    struct rpc_server *srv = s->srv;
    if (!srv->cfg.request_budget || !bytes)
        return 0;
    pthread_mutex_lock(&srv->budget_lock);
    uint64_t used = srv->budget_used;
    bool ok = take_locked(srv, bytes, s->charge + bytes > RPC_BUDGET_PROBE);
    if (ok)
        s->charge += bytes;
    pthread_mutex_unlock(&srv->budget_lock);
    if (ok)
        return 0;
    refusal(srv, s->m->path, used, &r->st);
    if (r->has_body) {
        grpc_slice_unref(r->body);
        r->has_body = false;
    }
    log_warn("%s", r->st.message);
    return -ENOSPC;
}

int rpc_server_charge(struct rpc_server *srv, size_t bytes, struct rpc_status *st)
{
    if (!srv->cfg.request_budget || !bytes)
        return 0;
    pthread_mutex_lock(&srv->budget_lock);
    uint64_t used = srv->budget_used;
    bool ok = take_locked(srv, bytes, bytes > RPC_BUDGET_PROBE);
    pthread_mutex_unlock(&srv->budget_lock);
    if (ok)
        return 0;
    if (st)
        refusal(srv, "request", used, st);
    return -ENOSPC;
}

void rpc_server_uncharge(struct rpc_server *srv, size_t bytes)
{
    if (!srv->cfg.request_budget || !bytes)
        return;
    pthread_mutex_lock(&srv->budget_lock);
    srv->budget_used -= bytes < srv->budget_used ? bytes : srv->budget_used;
    pthread_mutex_unlock(&srv->budget_lock);
}

void rpc_server_budget(struct rpc_server *srv, uint64_t *used, uint64_t *max)
{
    pthread_mutex_lock(&srv->budget_lock);
    *used = srv->budget_used;
    pthread_mutex_unlock(&srv->budget_lock);
    *max = srv->cfg.request_budget;
}

void rpc_server__budget_trim(const struct rpc_server *srv, size_t len)
{
    /* The transport's buffers are small allocations, which malloc keeps
     * for reuse (proc_malloc.h) in the arena of whichever thread read
     * them; a large message leaves megabytes of them behind. */
    if (srv->cfg.request_budget && len >= TRIM_BYTES)
        malloc_trim(0);
}

/* ---- large requests off the loops ---- */

static void *heavy_main(void *p)
{
    struct rpc_server *srv = p;
    pthread_mutex_lock(&srv->budget_lock);
    for (;;) {
        while (!srv->heavy_head && !srv->heavy_quit)
            pthread_cond_wait(&srv->heavy_cond, &srv->budget_lock);
        struct slot *s = srv->heavy_head;
        if (!s)
            break;
        srv->heavy_head = s->rnext;
        if (!srv->heavy_head)
            srv->heavy_tail = NULL;
        s->rnext = NULL;
        pthread_mutex_unlock(&srv->budget_lock);
        rpc_server__unary_run(s);
        pthread_mutex_lock(&srv->budget_lock);
    }
    pthread_mutex_unlock(&srv->budget_lock);
    return NULL;
}

void rpc_server__budget_heavy_start(struct rpc_server *srv)
{
    if (!srv->cfg.request_budget || !srv->nloops)
        return;
    if (pthread_create(&srv->heavy_thread, NULL, heavy_main, srv) != 0) {
        log_error("cannot start the thread for large requests: the loops serve them");
        return;
    }
    srv->heavy_started = true;
}

bool rpc_server__budget_heavy(struct slot *s)
{
    struct rpc_server *srv = s->srv;
    if (!srv->heavy_started || s->cqi >= srv->nloops || !s->payload ||
        grpc_byte_buffer_length(s->payload) < RPC_BUDGET_HEAVY)
        return false;
    pthread_mutex_lock(&srv->budget_lock);
    s->rnext = NULL;
    if (srv->heavy_tail)
        srv->heavy_tail->rnext = s;
    else
        srv->heavy_head = s;
    srv->heavy_tail = s;
    pthread_cond_signal(&srv->heavy_cond);
    pthread_mutex_unlock(&srv->budget_lock);
    return true;
}

void rpc_server__budget_heavy_stop(struct rpc_server *srv)
{
    if (!srv->heavy_started)
        return;
    pthread_mutex_lock(&srv->budget_lock);
    srv->heavy_quit = true;
    pthread_cond_broadcast(&srv->heavy_cond);
    pthread_mutex_unlock(&srv->budget_lock);
    pthread_join(srv->heavy_thread, NULL);
    srv->heavy_started = false;
}
