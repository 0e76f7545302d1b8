/* resp_bf: RedisBloom's BF.* commands (and DEL) over the backend: their
 * arguments, checked as RedisBloom checks them and with its error words
 * ("ERR bad error rate", "Bad capacity", "Unknown argument received"), the
 * project's rules on filter names and keys, the call to the backend, the
 * order of a connection's commands on one filter, and the reply shapes:
 *
 *   BF.RESERVE                     +OK
 *   BF.ADD, BF.EXISTS              :0 / :1 (RESP3: #f / #t)
 *   BF.MADD, BF.MEXISTS, BF.INSERT *N of :0 / :1 (RESP3: #f / #t)
 *   BF.INFO key                    RESP2: *10 (name, value pairs); RESP3: a
 *                                  map; "Expansion rate" null when
 *                                  non-scaling
 *   BF.INFO key FIELD              *1 of the value
 *   BF.CARD                        :items (0 for a missing filter)
 *   DEL key ...                    :filters dropped
 *
 * A failed call is one error for the whole command, never an array with
 * some elements: a reply is built only from a complete answer.
 */
#include "resp_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rules.h"

enum shape { SH_INT1, SH_ARRAY, SH_OK, SH_INFO, SH_CARD, SH_DEL };
enum fkind { FK_ADD, FK_READ, FK_CATALOG };

static const char *const info_fields[] = {"CAPACITY", "SIZE", "FILTERS", "ITEMS",
                                          "EXPANSION"};

/* ---- a connection's commands in flight, by filter ---- */

static struct resp_flight *flight_find(struct resp_conn *c, const char *f, size_t n)
{
    for (size_t i = 0; i < c->nflights; i++)
        if (strlen(c->flights[i].filter) == n && memcmp(c->flights[i].filter, f, n) == 0)
            return &c->flights[i];
    return NULL;
}

static bool flight_blocks(struct resp_conn *c, const char *f, size_t n, int kind)
{
    struct resp_flight *e = flight_find(c, f, n);
    if (!e)
        return false;
    if (e->catalog)
        return true;
    if (kind == FK_CATALOG)
        return e->adds || e->reads;
    return kind == FK_READ && e->adds && c->srv->be.reads_wait_writes;
}

static int cmd_kind(const struct resp_command *cmd)
{
    if (cmd->flags & RESP_CMD_READONLY)
        return FK_READ;
    if (strcmp(cmd->name, "bf.reserve") == 0 || strcmp(cmd->name, "del") == 0)
        return FK_CATALOG;
    return FK_ADD;
}

bool resp__bf_must_wait(struct resp_conn *c, const struct resp_command *cmd,
                        const struct resp_args *a)
{
    if (!c->nflights)
        return false;
    int kind = cmd_kind(cmd);
    if (strcmp(cmd->name, "del") == 0) {
        for (size_t i = 1; i < a->argc; i++)
            if (flight_blocks(c, a->argv[i], a->argl[i], kind))
                return true;
        return false;
    }
    return flight_blocks(c, a->argv[1], a->argl[1], kind);
}

static void flight_add(struct resp_call_box *b, const char *f, int kind)
{
    struct resp_conn *c = b->conn;
    size_t n = strlen(f);
    struct resp_flight *e = flight_find(c, f, n);
    if (!e) {
        if (c->nflights == c->flights_cap) {
            size_t cap = c->flights_cap ? c->flights_cap * 2 : 4;
            struct resp_flight *p = realloc(c->flights, cap * sizeof *p);
            if (!p)
                return;   /* no ordering record: the command still runs */
            c->flights = p;
            c->flights_cap = cap;
        }
        e = &c->flights[c->nflights++];
        memset(e, 0, sizeof *e);
        snprintf(e->filter, sizeof e->filter, "%s", f);
    }
    if (kind == FK_ADD)
        e->adds++;
    else if (kind == FK_READ)
        e->reads++;
    else
        e->catalog++;
    b->flight = 1;
    b->fkind = kind;
}

static void flight_done(struct resp_call_box *b)
{
    struct resp_conn *c = b->conn;
    if (!b->flight)
        return;
    struct resp_flight *e = flight_find(c, b->call.filter, strlen(b->call.filter));
    if (!e)
        return;
    if (b->fkind == FK_ADD)
        e->adds--;
    else if (b->fkind == FK_READ)
        e->reads--;
    else
        e->catalog--;
    if (!e->adds && !e->reads && !e->catalog)
        *e = c->flights[--c->nflights];
}

/* An offloaded call holds back the commands after it on its filter (a
 * creation on the way, a lookup). */
static void flight_upgrade(struct resp_call_box *b)
{
    if (!b->flight || b->fkind == FK_CATALOG)
        return;
    struct resp_conn *c = b->conn;
    struct resp_flight *e = flight_find(c, b->call.filter, strlen(b->call.filter));
    if (!e)
        return;
    if (b->fkind == FK_ADD)
        e->adds--;
    else
        e->reads--;
    e->catalog++;
    b->fkind = FK_CATALOG;
}

/* ---- calls ---- */

void resp_call_fail(struct resp_call *c, int code, const char *fmt, ...)
{
    va_list ap;
    c->code = code ? code : RESP_UNKNOWN;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
}

/* Done inside the pool's work (state 1, or 4 once claimed): the work's
 * end finishes it.  Answered by its bound already (3): nothing to do. */
static bool done_in_work(struct resp_call_box *b)
{
    int one = 1, four = 4;
    if (atomic_compare_exchange_strong(&b->work_state, &one, 2) ||
        atomic_compare_exchange_strong(&b->work_state, &four, 2))
        return true;
    return atomic_load(&b->work_state) == 3;
}

void resp_call_done(struct resp_call *c)
{
    struct resp_call_box *b = (struct resp_call_box *)c;
    if (done_in_work(b))
        return;
    if (pthread_equal(pthread_self(), b->srv->thread)) {
        resp__call_finish(b);
    } else {
        b->qnext = NULL;
        resp__answer_here(b->srv, b);
    }
}

void resp_calls_done(struct resp_call *const *v, size_t n)
{
    struct resp_call_box *head = NULL, *tail = NULL;
    struct resp_server *s = n ? ((struct resp_call_box *)v[0])->srv : NULL;
    if (!n)
        return;
    if (pthread_equal(pthread_self(), s->thread)) {
        for (size_t i = 0; i < n; i++)
            resp_call_done(v[i]);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        struct resp_call_box *b = (struct resp_call_box *)v[i];
        if (b->srv != s) {   /* not of one server: one by one */
            resp_call_done(v[i]);
            continue;
        }
        if (done_in_work(b))
            continue;   /* inside its pool work: the work's end finishes it */
        if (tail)
            tail->qnext = b;
        else
            head = b;
        tail = b;
    }
    if (head) {
        tail->qnext = NULL;
        resp__answer_here(s, head);
    }
}

int resp_call_keep(struct resp_call *c)
{
    struct resp_call_box *b = (struct resp_call_box *)c;
    if (b->keep)
        return 0;
    size_t bytes = 1;
    for (size_t i = 0; i < c->n; i++)
        bytes += c->lens[i];
    uint8_t *p = malloc(bytes);
    if (!p)
        return -ENOMEM;
    b->keep = p;
    const uint8_t **keys = (const uint8_t **)c->keys;
    for (size_t i = 0; i < c->n; i++) {
        memcpy(p, keys[i], c->lens[i]);
        keys[i] = p;
        p += c->lens[i];
    }
    return 0;
}

static void work_run(uv_work_t *w)
{
    struct resp_call_box *b = w->data;
    b->work(&b->call);
}

static void box_free(struct resp_server *s, struct resp_call_box *b);

/* ---- the bound of offloaded calls (resp_call_offload_bounded) ----
 * A bounded call in the pool is on the server's list (loop thread) until
 * its work ends, it is claimed, or the bound answers it. */

static void bounded_unlink(struct resp_call_box *b)
{
    struct resp_server *s = b->srv;
    if (!b->bounded)
        return;
    b->bounded = false;
    if (b->bprev)
        b->bprev->bnext = b->bnext;
    else
        s->bounded = b->bnext;
    if (b->bnext)
        b->bnext->bprev = b->bprev;
    b->bprev = b->bnext = NULL;
    if (!s->bounded)
        uv_timer_stop(&s->slow_timer);
}

/* The bound answers b (loop thread): its reply is the error, its
 * connection goes on; the box stays until the work ends (fn may still
 * read the request, and its resp_call_done is then ignored). */
static void bounded_expire(struct resp_call_box *b, uint64_t now)
{
    struct resp_conn *c = b->conn;
    struct resp_server *s = b->srv;
    struct resp_buf *o = &b->slot->buf;
    resp_add_errorf(o, "UNAVAILABLE", "%s on filter \"%s\" not answered within "
                    "%llu ms (resp_slow_timeout_ms): %s; retry", b->cmd->name,
                    b->call.filter, (unsigned long long)(now - b->t0_ns / 1000000u),
                    b->what);
    metric_add(b->cmd->m_errors, 1);
    metric_observe(b->cmd->m_time, (double)(resp__now_ns() - b->t0_ns) / 1e9);
    flight_done(b);
    b->flight = 0;
    resp__slot_ready(c, b->slot);
    bool resume = c->blocked;
    free(b->keep);
    b->keep = NULL;
    s->calls--;
    resp__conn_release(c);   /* may free c when it was closed */
    b->conn = NULL;
    resp__calls_changed(s);
    if (resume)
        resp__resume(c);
}

void resp__slow_tick(uv_timer_t *t)
{
    struct resp_server *s = t->data;
    resp__loop_enter(s);
    uint64_t now = resp__now_ms();
    struct resp_call_box *b = s->bounded;
    while (b) {
        struct resp_call_box *n = b->bnext;
        int one = 1;
        if (now >= b->deadline_ms &&
            atomic_compare_exchange_strong(&b->work_state, &one, 3)) {
            bounded_unlink(b);
            bounded_expire(b, now);
        }
        b = n;
    }
    resp__flush_dirty(s);
}

bool resp_call_claim(struct resp_call *c)
{
    struct resp_call_box *b = (struct resp_call_box *)c;
    int one = 1;
    if (atomic_compare_exchange_strong(&b->work_state, &one, 4))
        return true;
    return atomic_load(&b->work_state) != 3;
}

static void work_after(uv_work_t *w, int status)
{
    struct resp_call_box *b = w->data;
    struct resp_server *s = b->srv;
    int one = 1, four = 4;
    (void)status;
    resp__loop_enter(s);
    bounded_unlink(b);
    /* Answered by its bound: only the box is left. */
    if (atomic_load(&b->work_state) == 3) {
        atomic_store(&b->work_state, 0);
        box_free(s, b);
        return;
    }
    /* Left with 1 or 4: fn returned without finishing (it finishes later,
     * from wherever). */
    if (atomic_compare_exchange_strong(&b->work_state, &one, 0) ||
        atomic_compare_exchange_strong(&b->work_state, &four, 0))
        return;
    atomic_store(&b->work_state, 0);
    resp__call_finish(b);
    resp__flush_dirty(s);
}

int resp_call_offload(struct resp_call *c, void (*fn)(struct resp_call *c))
{
    return resp_call_offload_bounded(c, fn, 0, NULL);
}

int resp_call_offload_bounded(struct resp_call *c, void (*fn)(struct resp_call *c),
                              uint64_t timeout_ms, const char *what)
{
    struct resp_call_box *b = (struct resp_call_box *)c;
    struct resp_server *s = b->srv;
    if (resp_call_keep(c) < 0)
        return -ENOMEM;
    b->work = fn;
    b->wreq.data = b;
    atomic_store(&b->work_state, 1);
    if (uv_queue_work(&s->loop, &b->wreq, work_run, work_after) < 0) {
        atomic_store(&b->work_state, 0);
        return -ENOMEM;
    }
    if (timeout_ms) {
        b->deadline_ms = b->t0_ns / 1000000u + timeout_ms;
        b->what = what ? what : "still running";
        b->bounded = true;
        b->bprev = NULL;
        b->bnext = s->bounded;
        if (s->bounded)
            s->bounded->bprev = b;
        else {
            uint64_t every = timeout_ms / 8 ? timeout_ms / 8 : 1;
            if (every > 100)
                every = 100;
            uv_timer_start(&s->slow_timer, resp__slow_tick, every, every);
        }
        s->bounded = b;
    }
    flight_upgrade(b);
    return 0;
}

static const char *prefix_of(int code)
{
    switch (code) {
    case RESP_PERMISSION_DENIED: return "NOPERM";
    case RESP_UNAUTHENTICATED: return "NOAUTH";
    case RESP_RESOURCE_EXHAUSTED: return "OOM";
    case RESP_UNAVAILABLE: return "UNAVAILABLE";
    default: return "ERR";
    }
}

static void shape_error(struct resp_buf *o, const struct resp_call *c)
{
    if (c->code == RESP_NOT_FOUND) {
        if (c->msg[0])
            resp_add_errorf(o, "ERR", "not found: %s", c->msg);
        else
            resp_add_error(o, "ERR", "not found");
    } else if (c->code == RESP_ALREADY_EXISTS) {
        resp_add_error(o, "ERR", "item exists");
    } else {
        resp_add_error(o, prefix_of(c->code), c->msg[0] ? c->msg : "failed");
    }
}

static void shape_info(struct resp_buf *o, int proto, const struct resp_call_box *b)
{
    const struct resp_bf_info *in = &b->call.info;
    long long v[5] = {(long long)in->capacity, (long long)in->size,
                      (long long)in->filters, (long long)in->items, in->expansion};
    static const char *const names[] = {"Capacity", "Size", "Number of filters",
                                        "Number of items inserted", "Expansion rate"};
    if (b->info_field >= 0) {
        resp_add_array(o, 1);
        if (b->info_field == 4 && v[4] < 0)
            resp_add_null(o, proto);
        else
            resp_add_int(o, v[b->info_field]);
        return;
    }
    resp_add_map(o, proto, 5);
    for (int i = 0; i < 5; i++) {
        resp_add_simple(o, names[i]);
        if (i == 4 && v[4] < 0)
            resp_add_null(o, proto);
        else
            resp_add_int(o, v[i]);
    }
}

static size_t box_size(size_t n)
{
    return sizeof(struct resp_call_box) +
           n * (sizeof(uint8_t *) + sizeof(uint32_t) + sizeof(bool)) + 16;
}

/* A box no longer used: kept for the next small call, or freed. */
static void box_free(struct resp_server *s, struct resp_call_box *b)
{
    if (b->small && s->nbox_cache < RESP_BOX_CACHE) {
        b->qnext = s->box_cache;
        s->box_cache = b;
        s->nbox_cache++;
        return;
    }
    free(b);
}

void resp__call_finish(struct resp_call_box *b)
{
    struct resp_conn *c = b->conn;
    struct resp_server *s = b->srv;
    struct resp_call *call = &b->call;
    struct resp_buf *o = &b->slot->buf;

    if (call->code != RESP_OK) {
        shape_error(o, call);
        metric_add(b->cmd->m_errors, 1);
    } else {
        switch ((enum shape)b->shape) {
        case SH_INT1:
            resp_add_bool(o, c->proto, call->out[0]);
            break;
        case SH_ARRAY:
            resp_add_array(o, call->n);
            for (size_t i = 0; i < call->n; i++)
                resp_add_bool(o, c->proto, call->out[i]);
            break;
        case SH_OK:
            resp_add_simple(o, "OK");
            break;
        case SH_INFO:
            shape_info(o, c->proto, b);
            break;
        case SH_CARD:
            resp_add_int(o, call->count);
            break;
        case SH_DEL: {
            long long k = 0;
            for (size_t i = 0; i < call->n; i++)
                k += call->out[i];
            resp_add_int(o, k);
            break;
        }
        }
    }
    uint64_t end = s->finish_ns ? s->finish_ns : resp__now_ns();
    if (end < b->t0_ns)
        end = b->t0_ns;
    metric_observe(b->cmd->m_time, (double)(end - b->t0_ns) / 1e9);
    flight_done(b);
    resp__slot_ready(c, b->slot);
    resp__answered(c);
    bool resume = c->blocked;
    free(b->keep);
    b->keep = NULL;
    if (b->in_start)
        b->finished = true;   /* start() frees it once bf() returns */
    else
        box_free(s, b);
    s->calls--;
    resp__conn_release(c);   /* may free c when it was closed */
    resp__calls_changed(s);
    if (resume)
        resp__resume(c);
}

/* A call for n keys of command cmd, on filter argv[1] (none for DEL). */
static struct resp_call_box *box_new(struct resp_conn *c, const struct resp_command *cmd,
                                     enum resp_bf_op op, size_t n, enum shape sh)
{
    struct resp_server *s = c->srv;
    bool small = n <= RESP_BOX_KEYS;
    size_t sz = box_size(small ? RESP_BOX_KEYS : n);
    struct resp_call_box *b = NULL;
    if (small && s->box_cache) {
        b = s->box_cache;
        s->box_cache = b->qnext;
        s->nbox_cache--;
        /* What calloc would give, without the message's 512 bytes. */
        memset(b, 0, offsetof(struct resp_call_box, call.msg));
        b->call.msg[0] = 0;
        memset((char *)b + offsetof(struct resp_call_box, call.msg) + RESP_MSGLEN, 0,
               sz - offsetof(struct resp_call_box, call.msg) - RESP_MSGLEN);
    } else if (!(b = calloc(1, sz))) {
        metric_add(cmd->m_errors, 1);
        resp__err(c, "OOM", "out of memory");
        return NULL;
    }
    b->small = small;
    b->call.keys = (const uint8_t *const *)(b + 1);
    b->call.lens = (uint32_t *)((uint8_t **)(b + 1) + n);
    b->call.out = (bool *)((uint32_t *)b->call.lens + n);
    b->call.op = op;
    b->call.n = n;
    b->call.role = c->who.role;
    b->call.tokens = c->srv->be.auth != NULL;
    b->conn = c;
    b->srv = c->srv;
    b->cmd = cmd;
    b->shape = sh;
    b->info_field = -1;
    b->t0_ns = c->t0_ns;
    return b;
}

static void fail_now(struct resp_conn *c, const struct resp_command *cmd,
                     const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void fail_now(struct resp_conn *c, const struct resp_command *cmd,
                     const char *prefix, const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    metric_add(cmd->m_errors, 1);
    resp__err(c, prefix, "%s", msg);
}

/* Check and set the filter name. */
static bool set_filter(struct resp_conn *c, struct resp_call_box *b, const char *f,
                       size_t n)
{
    char err[RULES_ERRLEN];
    if (rules_filter_name_check(f, n, err) < 0) {
        fail_now(c, b->cmd, "ERR", "%s", err);
        return false;
    }
    memcpy(b->call.filter, f, n);
    b->call.filter[n] = 0;
    return true;
}

/* Keys (or names, for DEL) from argv[from ..]. */
static bool set_keys(struct resp_conn *c, struct resp_call_box *b,
                     const struct resp_args *a, size_t from, bool names)
{
    char err[RULES_ERRLEN];
    const uint8_t **keys = (const uint8_t **)b->call.keys;
    uint32_t *lens = (uint32_t *)b->call.lens;
    for (size_t i = 0; i < b->call.n; i++) {
        size_t len = a->argl[from + i];
        int rc = names ? rules_filter_name_check(a->argv[from + i], len, err)
                       : rules_key_check(i, len, c->srv->cfg.max_key, err);
        if (rc < 0) {
            fail_now(c, b->cmd, "ERR", "%s", err);
            return false;
        }
        keys[i] = (const uint8_t *)a->argv[from + i];
        lens[i] = (uint32_t)len;
    }
    return true;
}

/* Hand b to the backend: its reply waits in a slot of its own. */
static void start(struct resp_conn *c, struct resp_call_box *b, const struct resp_args *a,
                  int kind)
{
    struct resp_server *s = c->srv;
    b->slot = resp__slot_new(c);
    if (!b->slot) {
        fail_now(c, b->cmd, "OOM", "out of memory");
        free(b);
        return;
    }
    size_t bytes = sizeof *b + b->call.n * 16;
    for (size_t i = 0; i < a->argc; i++)
        bytes += a->argl[i];
    b->slot->charge = bytes;
    c->pending += bytes;
    c->inflight++;
    s->calls++;
    b->in_start = true;
    s->be.bf(s->be.arg, &b->call);
    b->in_start = false;
    if (b->finished) {
        box_free(s, b);   /* answered already: nothing to wait for */
        return;
    }
    /* Still in flight: later commands of the connection on its filter may
     * have to wait for it (an offloaded call holds them all back). */
    flight_add(b, b->call.filter, b->work ? FK_CATALOG : kind);
}

static void create_defaults(struct resp_conn *c, struct resp_bf_create *cr)
{
    const struct resp_server_config *cfg = &c->srv->cfg;
    cr->error_rate = cfg->autocreate_error_rate;
    cr->capacity = cfg->autocreate_capacity;
    cr->expansion = 2;
    if (!cfg->autocreate) {
        cr->why_not = "creating a filter on its first add is off here "
                      "(resp_autocreate = off): create it with BF.RESERVE";
    } else if (c->who.role < RESP_ROLE_ADMIN) {
        cr->why_not = "creating a filter on its first add needs an admin token: "
                      "create it with BF.RESERVE as an admin";
    } else {
        cr->allowed = true;
    }
}

/* ---- the commands ---- */

static void bf_add(struct resp_conn *c, const struct resp_args *a, bool multi,
                   const struct resp_command *cmd)
{
    size_t n = multi ? a->argc - 2 : 1;
    struct resp_call_box *b = box_new(c, cmd, RESP_BF_ADD, n, multi ? SH_ARRAY : SH_INT1);
    if (!b)
        return;
    if (!set_filter(c, b, a->argv[1], a->argl[1]) || !set_keys(c, b, a, 2, false)) {
        free(b);
        return;
    }
    create_defaults(c, &b->call.create);
    start(c, b, a, FK_ADD);
}

static void cmd_bf_add(struct resp_conn *c, const struct resp_args *a)
{
    bf_add(c, a, false, c->cur);
}

static void cmd_bf_madd(struct resp_conn *c, const struct resp_args *a)
{
    bf_add(c, a, true, c->cur);
}

static void bf_exists(struct resp_conn *c, const struct resp_args *a, bool multi,
                      const struct resp_command *cmd)
{
    size_t n = multi ? a->argc - 2 : 1;
    struct resp_call_box *b =
        box_new(c, cmd, RESP_BF_EXISTS, n, multi ? SH_ARRAY : SH_INT1);
    if (!b)
        return;
    if (!set_filter(c, b, a->argv[1], a->argl[1]) || !set_keys(c, b, a, 2, false)) {
        free(b);
        return;
    }
    start(c, b, a, FK_READ);
}

static void cmd_bf_exists(struct resp_conn *c, const struct resp_args *a)
{
    bf_exists(c, a, false, c->cur);
}

static void cmd_bf_mexists(struct resp_conn *c, const struct resp_args *a)
{
    bf_exists(c, a, true, c->cur);
}

/* SHARDS n at a->argv[i] (not one of RedisBloom's: the shard count of a
 * filter the command creates).  False once the error is sent. */
static bool shards_arg(struct resp_conn *c, const struct resp_command *cmd,
                       const struct resp_args *a, size_t i, struct resp_bf_create *cr)
{
    long long v;

    if (i + 1 == a->argc) {
        fail_now(c, cmd, "ERR", "no shard count after SHARDS");
        return false;
    }
    if (resp_arg_ll(a->argv[i + 1], a->argl[i + 1], &v) < 0 || v < 1 ||
        v > RULES_SHARDS_MAX) {
        fail_now(c, cmd, "ERR", "bad shard count (SHARDS takes 1 to %d)",
                 RULES_SHARDS_MAX);
        return false;
    }
    cr->shards = (unsigned)v;
    return true;
}

static void cmd_bf_insert(struct resp_conn *c, const struct resp_args *a)
{
    const struct resp_command *cmd = c->cur;
    struct resp_bf_create cr = {0};
    size_t items = 0;
    long long v;
    double d;

    create_defaults(c, &cr);
    for (size_t i = 2; i < a->argc && !items; i++) {
        const char *w = a->argv[i];
        size_t wl = a->argl[i];
        bool more = i + 1 < a->argc;
        if (resp_arg_is(w, wl, "ITEMS")) {
            items = i + 1;
        } else if (resp_arg_is(w, wl, "ERROR") || resp_arg_is(w, wl, "CAPACITY") ||
                   resp_arg_is(w, wl, "EXPANSION")) {
            if (!more) {
                fail_now(c, cmd, "ERR", "wrong number of arguments for 'bf.insert' "
                         "command");
                return;
            }
            i++;
            if (resp_arg_is(w, wl, "ERROR")) {
                if (resp_arg_double(a->argv[i], a->argl[i], &d) < 0) {
                    fail_now(c, cmd, "Bad", "error rate");
                    return;
                }
                cr.error_rate = d;
                cr.given = true;
            } else if (resp_arg_ll(a->argv[i], a->argl[i], &v) < 0) {
                fail_now(c, cmd, "Bad", resp_arg_is(w, wl, "CAPACITY") ? "capacity"
                                                                      : "expansion");
                return;
            } else if (resp_arg_is(w, wl, "CAPACITY")) {
                if (v < 1) {
                    fail_now(c, cmd, "Bad", "argument received");
                    return;
                }
                cr.capacity = (uint64_t)v;
                cr.given = true;
            } else {
                if (v < 1 || v > 0xffff) {
                    fail_now(c, cmd, "Bad", "argument received");
                    return;
                }
                cr.expansion = (unsigned)v;
                cr.expansion_given = true;
            }
        } else if (resp_arg_is(w, wl, "SHARDS")) {
            if (!shards_arg(c, cmd, a, i, &cr))
                return;
            cr.given = true;
            i++;
        } else if (resp_arg_is(w, wl, "NOCREATE")) {
            cr.allowed = false;
            cr.why_not = "NOCREATE was given";
        } else if (resp_arg_is(w, wl, "NONSCALING")) {
            cr.nonscaling = true;
        } else {
            fail_now(c, cmd, "Unknown", "argument received");
            return;
        }
    }
    if (!items || items >= a->argc) {
        fail_now(c, cmd, "ERR", "wrong number of arguments for 'bf.insert' command");
        return;
    }
    if (cr.error_rate <= 0 || cr.error_rate >= 1) {
        fail_now(c, cmd, "Bad", "argument received");
        return;
    }
    if (cr.nonscaling && cr.expansion_given) {
        fail_now(c, cmd, "ERR", "Nonscaling filters cannot expand");
        return;
    }
    struct resp_call_box *b = box_new(c, cmd, RESP_BF_ADD, a->argc - items, SH_ARRAY);
    if (!b)
        return;
    if (!set_filter(c, b, a->argv[1], a->argl[1]) || !set_keys(c, b, a, items, false)) {
        free(b);
        return;
    }
    b->call.create = cr;
    start(c, b, a, FK_ADD);
}

static void cmd_bf_reserve(struct resp_conn *c, const struct resp_args *a)
{
    const struct resp_command *cmd = c->cur;
    struct resp_bf_create cr = {.allowed = true, .given = true, .expansion = 2};
    double d;
    long long v;

    if (a->argc > 9) {
        fail_now(c, cmd, "ERR", "wrong number of arguments for 'bf.reserve' command");
        return;
    }
    if (resp_arg_double(a->argv[2], a->argl[2], &d) < 0) {
        fail_now(c, cmd, "ERR", "bad error rate");
        return;
    }
    if (d <= 0 || d >= 1) {
        fail_now(c, cmd, "ERR", "(0 < error rate range < 1) ");
        return;
    }
    if (resp_arg_ll(a->argv[3], a->argl[3], &v) < 0) {
        fail_now(c, cmd, "ERR", "bad capacity");
        return;
    }
    if (v <= 0) {
        fail_now(c, cmd, "ERR", "(capacity should be larger than 0)");
        return;
    }
    cr.error_rate = d;
    cr.capacity = (uint64_t)v;
    for (size_t i = 4; i < a->argc; i++) {
        if (resp_arg_is(a->argv[i], a->argl[i], "NONSCALING")) {
            cr.nonscaling = true;
        } else if (resp_arg_is(a->argv[i], a->argl[i], "EXPANSION")) {
            if (i + 1 == a->argc) {
                fail_now(c, cmd, "ERR", "no expansion");
                return;
            }
            if (resp_arg_ll(a->argv[i + 1], a->argl[i + 1], &v) < 0 || v < 1 ||
                v > 0xffff) {
                fail_now(c, cmd, "ERR", "bad expansion");
                return;
            }
            cr.expansion = (unsigned)v;
            cr.expansion_given = true;
            i++;
        } else if (resp_arg_is(a->argv[i], a->argl[i], "SHARDS")) {
            if (!shards_arg(c, cmd, a, i, &cr))
                return;
            i++;
        } else {
            char sh[64];
            snprintf(sh, sizeof sh, "%.*s", (int)(a->argl[i] < 40 ? a->argl[i] : 40),
                     a->argv[i]);
            fail_now(c, cmd, "ERR", "unknown argument '%s' (BF.RESERVE key "
                     "error_rate capacity [EXPANSION n] [NONSCALING] [SHARDS n])", sh);
            return;
        }
    }
    if (cr.nonscaling && cr.expansion_given) {
        fail_now(c, cmd, "Nonscaling", "filters cannot expand");
        return;
    }
    struct resp_call_box *b = box_new(c, cmd, RESP_BF_RESERVE, 0, SH_OK);
    if (!b)
        return;
    if (!set_filter(c, b, a->argv[1], a->argl[1])) {
        free(b);
        return;
    }
    b->call.create = cr;
    start(c, b, a, FK_CATALOG);
}

static void cmd_bf_info(struct resp_conn *c, const struct resp_args *a)
{
    const struct resp_command *cmd = c->cur;
    int field = -1;
    if (a->argc > 3) {
        fail_now(c, cmd, "ERR", "wrong number of arguments for 'bf.info' command");
        return;
    }
    if (a->argc == 3) {
        for (int i = 0; i < 5; i++)
            if (resp_arg_is(a->argv[2], a->argl[2], info_fields[i]))
                field = i;
        if (field < 0) {
            fail_now(c, cmd, "Invalid", "information value");
            return;
        }
    }
    struct resp_call_box *b = box_new(c, cmd, RESP_BF_INFO, 0, SH_INFO);
    if (!b)
        return;
    b->info_field = field;
    if (!set_filter(c, b, a->argv[1], a->argl[1])) {
        free(b);
        return;
    }
    start(c, b, a, FK_READ);
}

static void cmd_bf_card(struct resp_conn *c, const struct resp_args *a)
{
    const struct resp_command *cmd = c->cur;
    struct resp_call_box *b = box_new(c, cmd, RESP_BF_CARD, 0, SH_CARD);
    if (!b)
        return;
    if (!set_filter(c, b, a->argv[1], a->argl[1])) {
        free(b);
        return;
    }
    start(c, b, a, FK_READ);
}

static void cmd_del(struct resp_conn *c, const struct resp_args *a)
{
    const struct resp_command *cmd = c->cur;
    struct resp_call_box *b = box_new(c, cmd, RESP_BF_DEL, a->argc - 1, SH_DEL);
    if (!b)
        return;
    if (!set_keys(c, b, a, 1, true)) {
        free(b);
        return;
    }
    /* Each name is a filter in flight for the commands after it. */
    snprintf(b->call.filter, sizeof b->call.filter, "%.*s", (int)a->argl[1], a->argv[1]);
    start(c, b, a, FK_CATALOG);
}

#define BF (RESP_CMD_FILTER | RESP_CMD_CALL)
struct resp_command resp_bf_commands[] = {
    {"bf.reserve", -4, BF | RESP_CMD_WRITE, RESP_ROLE_ADMIN, cmd_bf_reserve, "bf",
     "Creates a filter.",
     "key error_rate capacity [EXPANSION expansion] [NONSCALING] [SHARDS shards]",
     NULL, NULL, NULL},
    {"bf.add", 3, BF | RESP_CMD_WRITE | RESP_CMD_FAST, RESP_ROLE_WRITE, cmd_bf_add,
     "bf", "Adds an item (1: newly added; 0: may have existed).", "key item", NULL,
     NULL, NULL},
    {"bf.madd", -3, BF | RESP_CMD_WRITE, RESP_ROLE_WRITE, cmd_bf_madd, "bf",
     "Adds items.", "key item [item ...]", NULL, NULL, NULL},
    {"bf.insert", -4, BF | RESP_CMD_WRITE, RESP_ROLE_WRITE, cmd_bf_insert, "bf",
     "Adds items, creating the filter with these options if it is missing.",
     "key [CAPACITY capacity] [ERROR error] [EXPANSION expansion] [NOCREATE] "
     "[NONSCALING] [SHARDS shards] ITEMS item [item ...]", NULL, NULL, NULL},
    {"bf.exists", 3, BF | RESP_CMD_READONLY | RESP_CMD_FAST, RESP_ROLE_READ,
     cmd_bf_exists, "bf", "1: the item may exist; 0: it definitely does not "
     "(a missing filter is an error).", "key item", NULL, NULL, NULL},
    {"bf.mexists", -3, BF | RESP_CMD_READONLY, RESP_ROLE_READ, cmd_bf_mexists, "bf",
     "BF.EXISTS for several items.", "key item [item ...]", NULL, NULL, NULL},
    {"bf.info", -2, BF | RESP_CMD_READONLY, RESP_ROLE_READ, cmd_bf_info, "bf",
     "Describes a filter.", "key [CAPACITY | SIZE | FILTERS | ITEMS | EXPANSION]",
     NULL, NULL, NULL},
    {"bf.card", 2, BF | RESP_CMD_READONLY, RESP_ROLE_READ, cmd_bf_card, "bf",
     "Items added to a filter (0 for a missing filter).", "key", NULL, NULL, NULL},
    {"del", -2, BF | RESP_CMD_WRITE, RESP_ROLE_ADMIN, cmd_del, "keyspace",
     "Drops filters.", "key [key ...]", NULL, NULL, NULL},
};
#undef BF
const size_t resp_bf_commands_count = sizeof resp_bf_commands / sizeof resp_bf_commands[0];
