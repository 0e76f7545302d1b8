/* router_resp: BF.* commands through the router (router_resp.h). */
#include "router_resp.h"

#include <errno.h>
#include <stdatomic.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "log.h"
#include "router_nodes.h"
#include "rules.h"

#include <uthash.h>

/* How long a command waits for a filter that another call is creating. */
#define COMPLETE_WAIT_MS 10000
/* Filters remembered as complete; past it the table starts again (each
 * filter is then checked once more before its keys go out). */
#define VERIFIED_MAX 100000

/* A filter found complete, with the secret it had then. */
struct verified {
    UT_hash_handle hh;
    uint8_t secret[BF_SECRET_LEN];
    char name[];
};

/* A filter this router is creating over RESP. */
struct creating {
    UT_hash_handle hh;
    char name[];
};

struct router_resp {
    struct router *r;
    pthread_mutex_t mu;
    pthread_cond_t created;       /* a creation ended */
    struct verified *verified;    /* by name */
    size_t nverified;
    struct creating *creating;    /* by name */
    /* The loop thread's: the groups of this loop pass (pass_end). */
    struct pass_group *held;
    unsigned nheld;
};

static struct router *router_of(struct resp_call *c)
{
    return ((struct router_resp *)c->bctx[1])->r;
}

static struct router_resp *door_of(struct resp_call *c)
{
    return c->bctx[1];
}

/* Was name found complete with this secret?  Any thread. */
static bool is_verified(struct router_resp *d, const char *name, const uint8_t *secret)
{
    struct verified *v;
    pthread_mutex_lock(&d->mu);
    HASH_FIND_STR(d->verified, name, v);
    bool yes = v && memcmp(v->secret, secret, BF_SECRET_LEN) == 0;
    pthread_mutex_unlock(&d->mu);
    return yes;
}

static void verified_clear(struct router_resp *d)
{
    struct verified *v, *tmp;
    HASH_ITER(hh, d->verified, v, tmp) {
        HASH_DEL(d->verified, v);
        free(v);
    }
    d->nverified = 0;
}

static void set_verified(struct router_resp *d, const char *name, const uint8_t *secret)
{
    struct verified *v;
    pthread_mutex_lock(&d->mu);
    HASH_FIND_STR(d->verified, name, v);
    if (!v) {
        if (d->nverified >= VERIFIED_MAX)
            verified_clear(d);
        size_t len = strlen(name) + 1;
        v = calloc(1, sizeof *v + len);
        if (v) {
            memcpy(v->name, name, len);
            HASH_ADD_STR(d->verified, name, v);
            d->nverified++;
        }
    }
    if (v)
        memcpy(v->secret, secret, BF_SECRET_LEN);
    pthread_mutex_unlock(&d->mu);
}

/* Become the one creator of name in this router: true, or false after
 * waiting (at most until deadline_ms) for the creation under way to end. */
static bool create_begin(struct router_resp *d, const char *name, uint64_t deadline_ms);
static void create_end(struct router_resp *d, const char *name);

static void fail_st(struct resp_call *c, const struct rpc_status *st)
{
    resp_call_fail(c, (int)st->code, "%s", st->message);
}

/* What a key costs the router while it holds it, besides its bytes (the
 * gRPC key calls' KEY_COST, router_rpc.c). */
#define KEY_COST 96

/* Charge c's keys to the router's request budget (max_memory_mb), as a
 * gRPC key call's are: 0, or -1 with c failed (OOM naming the budget). */
static int charge(struct router *r, struct resp_call *c)
{
    size_t bytes = c->n * KEY_COST;
    for (size_t i = 0; i < c->n; i++)
        bytes += c->lens[i];
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    if (rpc_server_charge(r->srv, bytes, &st) < 0) {
        fail_st(c, &st);
        return -1;
    }
    c->bval[0] = bytes;
    return 0;
}

/* The call is finished: give its charge back. */
static void finish(struct resp_call *c)
{
    struct router *r = router_of(c);
    if (c->bval[0])
        rpc_server_uncharge(r->srv, (size_t)c->bval[0]);
    c->bval[0] = 0;
    resp_call_done(c);
}

static void keys_done(void *arg, int rc, const struct rpc_status *st)
{
    struct resp_call *c = arg;
    if (rc < 0)
        fail_st(c, st);
    finish(c);
}

static enum router_key_op key_op(const struct resp_call *c)
{
    return c->op == RESP_BF_ADD ? ROUTER_ADD : ROUTER_MAY_CONTAIN;
}

/* The largest group of the topology. */
static unsigned max_copies(struct router *r)
{
    struct topo *t = router_topo(r);
    unsigned n = 1;
    for (unsigned g = 0; g < t->ngroups; g++)
        if (t->groups[g].nmembers > n)
            n = t->groups[g].nmembers;
    topo_unref(t);
    return n;
}

/* The kind of filter c creates: 0, or -1 with st set. */
static int create_kind(struct router *r, const struct resp_call *c, int *kind,
                       struct rpc_status *st)
{
    unsigned n = max_copies(r);
    bool asked_scaling = c->op == RESP_BF_RESERVE ? !c->create.nonscaling
                                                  : c->create.expansion_given;
    if (c->create.nonscaling || (n > 1 && !asked_scaling)) {
        *kind = BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_BLOCKED;
        return 0;
    }
    if (n > 1) {
        rpc_status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "a scaling filter "
                       "(RedisBloom's default, EXPANSION) cannot be kept by a group "
                       "of %u copies (its layers are not merged page by page): give "
                       "NONSCALING", n);
        return -1;
    }
    if (c->create.expansion_given && c->create.expansion != 2) {
        rpc_status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "EXPANSION %u: a router "
                       "creates scaling filters with EXPANSION 2 only (or give "
                       "NONSCALING)", c->create.expansion);
        return -1;
    }
    *kind = BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_SCALABLE;
    return 0;
}

/* Create c's filter on every copy of every shard.  0, or -1 with st. */
static int create(struct router *r, const struct resp_call *c, struct rpc_status *st)
{
    struct router_filter_desc d;
    char err[RULES_ERRLEN];
    int kind;
    if (create_kind(r, c, &kind, st) < 0)
        return -1;
    if (rules_params_check(c->create.capacity, c->create.error_rate, err) < 0) {
        rpc_status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        return -1;
    }
    struct router_create cr = {.name = c->filter, .capacity = c->create.capacity,
                               .error_rate = c->create.error_rate, .kind = kind,
                               .shards = c->create.shards
                                             ? c->create.shards
                                             : router_default_shards(
                                                   r, kind, c->create.capacity,
                                                   c->create.error_rate)};
    int rc = router_create_filter(r, &cr, &d, st);
    router_filter_desc_free(&d);
    if (rc == 0) {
        /* Complete on every copy (router_create_filter), and cached with
         * the secret it was made with. */
        struct topo *t = router_topo(r);
        struct router_filter *stale = NULL;
        struct router_filter *f = router_filter_get(r, c->filter, t, &stale);
        if (f)
            set_verified(door_of((struct resp_call *)c), c->filter, f->secret);
        router_filter_unref(f);
        router_filter_unref(stale);
        topo_unref(t);
    }
    if (rc == 0)
        log_info("created filter %s over RESP (%s, capacity %llu, error_rate %g, "
                 "%u shards)", c->filter,
                 kind == BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_SCALABLE ? "scaling"
                                                                      : "non-scaling",
                 (unsigned long long)cr.capacity, cr.error_rate, cr.shards);
    return rc;
}

static bool final_failure(grpc_status_code code)
{
    return code == GRPC_STATUS_INVALID_ARGUMENT || code == GRPC_STATUS_RESOURCE_EXHAUSTED ||
           code == GRPC_STATUS_PERMISSION_DENIED || code == GRPC_STATUS_UNAUTHENTICATED ||
           code == GRPC_STATUS_FAILED_PRECONDITION;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static bool create_begin(struct router_resp *d, const char *name, uint64_t deadline_ms)
{
    struct creating *k;
    pthread_mutex_lock(&d->mu);
    HASH_FIND_STR(d->creating, name, k);
    if (!k) {
        size_t len = strlen(name) + 1;
        k = calloc(1, sizeof *k + len);
        if (k) {
            memcpy(k->name, name, len);
            HASH_ADD_STR(d->creating, name, k);
        }
        pthread_mutex_unlock(&d->mu);
        return k != NULL;
    }
    /* Another connection's command creates it: wait for that to end. */
    struct timespec until = {(time_t)(deadline_ms / 1000),
                             (long)(deadline_ms % 1000) * 1000000L};
    while (k && now_ms() < deadline_ms) {
        if (pthread_cond_timedwait(&d->created, &d->mu, &until) != 0)
            break;
        HASH_FIND_STR(d->creating, name, k);
    }
    pthread_mutex_unlock(&d->mu);
    return false;
}

static void create_end(struct router_resp *d, const char *name)
{
    struct creating *k;
    pthread_mutex_lock(&d->mu);
    HASH_FIND_STR(d->creating, name, k);
    if (k) {
        HASH_DEL(d->creating, k);
        free(k);
    }
    pthread_cond_broadcast(&d->created);
    pthread_mutex_unlock(&d->mu);
}

/* Pool thread: wait until c's filter is complete (on every copy of every
 * shard that answers, and a write quorum of each), creating it when c may,
 * one creation at a time per filter in this router; then send its keys. */
static void slow_keys(struct resp_call *c)
{
    struct router_resp *d = door_of(c);
    struct router *r = d->r;
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    uint64_t wait = r->cfg.resp_slow_timeout_ms < COMPLETE_WAIT_MS
                        ? r->cfg.resp_slow_timeout_ms : COMPLETE_WAIT_MS;
    uint64_t deadline = now_ms() + wait;
    unsigned backoff = 10;
    uint8_t secret[BF_SECRET_LEN];

    for (;;) {
        int rc = router_filter_complete(r, c->filter, secret, &st);
        if (rc == 1) {
            set_verified(d, c->filter, secret);
            break;
        }
        if (rc < 0 && st.code == GRPC_STATUS_NOT_FOUND) {
            if (c->op != RESP_BF_ADD) {
                resp_call_fail(c, RESP_NOT_FOUND, "filter \"%s\" does not exist (a "
                               "read of a missing filter is an error here, never 0: "
                               "docs/RESP.md)", c->filter);
                goto done;
            }
            if (!c->create.allowed) {
                resp_call_fail(c, RESP_NOT_FOUND, "filter \"%s\" does not exist; %s",
                               c->filter, c->create.why_not ? c->create.why_not : "");
                goto done;
            }
            if (create_begin(d, c->filter, deadline)) {
                rc = create(r, c, &st);
                create_end(d, c->filter);
                if (rc < 0 && final_failure(st.code)) {
                    fail_st(c, &st);
                    goto done;
                }
                /* Made on every copy (router_create_filter), or another
                 * creation met this one (ALREADY_EXISTS) or a copy refused
                 * (the shards this call made are rolled back): look again,
                 * at once. */
                continue;
            }
            /* Another connection's creation ended: look again. */
            if (now_ms() <= deadline)
                continue;
        } else if (rc < 0 && final_failure(st.code)) {
            fail_st(c, &st);
            goto done;
        }
        if (now_ms() > deadline) {
            resp_call_fail(c, RESP_UNAVAILABLE, "filter \"%s\" is not complete on every "
                           "copy after %llu ms (a creation on the way or rolled back); "
                           "nothing was written; retry: %s", c->filter,
                           (unsigned long long)wait, st.message);
            goto done;
        }
        struct timespec ts = {0, (long)(backoff + (unsigned)rand() % backoff) * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff < 200)
            backoff *= 2;
    }
    /* Past the door's bound, the command was answered already: send
     * nothing. */
    if (!resp_call_claim(c))
        goto done;
    router_keys_start(r, c->filter, key_op(c), c->keys, c->lens, c->n, c->out, keys_done, c);
    return;
done:
    finish(c);
}

static void reserve_work(struct resp_call *c)
{
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    if (create(router_of(c), c, &st) < 0)
        fail_st(c, &st);
    resp_call_done(c);
}

static void info_work(struct resp_call *c)
{
    struct router *r = router_of(c);
    struct rpc_status st = {.code = GRPC_STATUS_OK};
    struct router_filter_desc d;
    if (router_describe_filter(r, c->filter, &d, &st) < 0) {
        if (st.code == GRPC_STATUS_NOT_FOUND && c->op == RESP_BF_CARD)
            c->count = 0;   /* RedisBloom's answer for a missing filter */
        else
            fail_st(c, &st);
        resp_call_done(c);
        return;
    }
    struct resp_bf_info *in = &c->info;
    memset(in, 0, sizeof *in);
    in->expansion = -1;
    for (uint32_t s = 0; s < d.shards; s++) {
        const struct router_shard_desc *sd = &d.shard[s];
        if (!sd->ok) {
            resp_call_fail(c, RESP_UNAVAILABLE, "filter \"%s\": shard %u: %s",
                           c->filter, s, sd->reason);
            break;
        }
        in->capacity += sd->capacity;
        in->size += sd->bytes;
        in->items += sd->insert_count;
        if (sd->layers > in->filters)
            in->filters = sd->layers;
        if (sd->kind == BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_SCALABLE)
            in->expansion = 2;
    }
    c->count = (long long)in->items;
    router_filter_desc_free(&d);
    resp_call_done(c);
}

static void del_work(struct resp_call *c)
{
    struct router *r = router_of(c);
    char name[RULES_FILTER_NAME_MAX + 1];
    for (size_t i = 0; i < c->n; i++) {
        struct rpc_status st = {.code = GRPC_STATUS_OK};
        snprintf(name, sizeof name, "%.*s", (int)c->lens[i], (const char *)c->keys[i]);
        if (router_drop_filter(r, name, &st) == 0) {
            c->out[i] = true;
            log_info("dropped filter %s over RESP", name);
        } else if (st.code != GRPC_STATUS_NOT_FOUND) {
            fail_st(c, &st);
            break;
        }
    }
    resp_call_done(c);
}

/* ---- the keys of one loop pass, joined ----
 *
 * BF.ADD/MADD/INSERT and BF.EXISTS/MEXISTS on a filter found complete are
 * not started one by one: their keys are copied into the door's group for
 * (filter, op) of this loop pass, and at the end of the pass (the
 * library's pass_end, before the loop waits for I/O again) each group is
 * one key batch (router_keys_start_nowait): one hashing pass, one call per
 * node on its stream, one answer, and one hand-back to the loop for every
 * command of the pass on that filter, from every connection.  Each command
 * gets its own keys' answers.  The order rules are the library's (a read
 * waits for its connection's earlier writes to the filter, so it is never
 * in the same group as them).  A group that fails (a shard short of its
 * quorum, a refusal) is not the answer of commands that would have gone
 * through alone: when it held more than one command, each runs again on
 * its own and gets its own outcome (a key the failed attempt wrote on
 * some copies may then answer 0, as on a client's retry). */

/* Groups held at once; one more starts every held group first. */
#define PASS_GROUPS 16

struct pass_group {
    struct router_resp *d;
    struct pass_group *next;
    char filter[sizeof ((struct resp_call *)0)->filter];
    enum router_key_op op;
    size_t n, kcap;              /* keys */
    uint8_t *kbuf;               /* the keys' bytes, one after the other */
    size_t kbytes, bcap;
    uint32_t *lens;
    const uint8_t **keys;        /* built when started, into kbuf */
    bool *out;
    size_t ncalls, ccap;
    struct resp_call **calls;
    atomic_size_t alone;         /* commands run again alone, not done */
};

static void group_free(struct pass_group *g)
{
    free(g->kbuf);
    free(g->lens);
    free(g->keys);
    free(g->out);
    free(g->calls);
    free(g);
}

/* Give back the request budget of every call of v (their charge). */
static void uncharge_all(struct router *r, struct resp_call *const *v, size_t n)
{
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        bytes += (size_t)v[i]->bval[0];
        v[i]->bval[0] = 0;
    }
    if (bytes)
        rpc_server_uncharge(r->srv, bytes);
}

/* A command of a failed group, run again on its own. */
static void alone_done(void *arg, int rc, const struct rpc_status *st)
{
    struct resp_call *c = arg;
    struct pass_group *g = c->bctx[2];
    if (rc < 0)
        fail_st(c, st);
    finish(c);
    if (atomic_fetch_sub(&g->alone, 1) == 1)
        group_free(g);
}

static void group_done(void *arg, int rc, const struct rpc_status *st)
{
    struct pass_group *g = arg;
    struct router *r = g->d->r;
    if (rc < 0 && g->ncalls > 1) {
        /* Each command on its own: the keys stay in g until the last. */
        size_t off = 0;
        atomic_store(&g->alone, g->ncalls);
        for (size_t i = 0; i < g->ncalls; i++) {
            struct resp_call *c = g->calls[i];
            c->bctx[2] = g;
            router_keys_start_nowait(r, g->filter, g->op, g->keys + off, g->lens + off,
                                     c->n, c->out, alone_done, c);
            off += c->n;
        }
        return;
    }
    size_t off = 0;
    for (size_t i = 0; i < g->ncalls; i++) {
        struct resp_call *c = g->calls[i];
        if (rc < 0)
            fail_st(c, st);
        else
            memcpy(c->out, g->out + off, c->n * sizeof *c->out);
        off += c->n;
    }
    uncharge_all(r, g->calls, g->ncalls);
    resp_calls_done(g->calls, g->ncalls);   /* one hand-back to the loop */
    group_free(g);
}

/* Start g (loop thread); its calls finish later, or now. */
static void group_start(struct pass_group *g)
{
    struct router *r = g->d->r;
    g->keys = malloc((g->n ? g->n : 1) * sizeof *g->keys);
    g->out = malloc((g->n ? g->n : 1) * sizeof *g->out);
    if (!g->keys || !g->out) {
        struct rpc_status st;
        rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        for (size_t i = 0; i < g->ncalls; i++)
            fail_st(g->calls[i], &st);
        uncharge_all(r, g->calls, g->ncalls);
        resp_calls_done(g->calls, g->ncalls);
        group_free(g);
        return;
    }
    const uint8_t *p = g->kbuf;
    for (size_t i = 0; i < g->n; i++) {
        g->keys[i] = p;
        p += g->lens[i];
    }
    router_keys_start_nowait(r, g->filter, g->op, g->keys, g->lens, g->n, g->out,
                             group_done, g);
}

/* Start every held group (loop thread), those that calls finished on the
 * way hold included. */
static void pass_flush(struct router_resp *d)
{
    while (d->held) {
        struct pass_group *g = d->held;
        d->held = NULL;
        d->nheld = 0;
        while (g) {
            struct pass_group *next = g->next;
            group_start(g);
            g = next;
        }
    }
}

static void router_pass_end(void *arg)
{
    pass_flush(arg);
}

static bool grow_to(void *pp, size_t *cap, size_t need, size_t size)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*(void **)pp, n * size);
    if (!q)
        return false;
    *(void **)pp = q;
    *cap = n;
    return true;
}

/* The held group of (filter, op), or NULL. */
static struct pass_group *group_find(struct router_resp *d, const char *filter,
                                     enum router_key_op op)
{
    for (struct pass_group *g = d->held; g; g = g->next)
        if (g->op == op && strcmp(g->filter, filter) == 0)
            return g;
    return NULL;
}

/* Join c to g: 0, or -ENOMEM (g unchanged). */
static int group_join(struct pass_group *g, struct resp_call *c)
{
    size_t bytes = 0;
    for (size_t i = 0; i < c->n; i++)
        bytes += c->lens[i];
    size_t bcap = g->bcap, kcap = g->kcap, ccap = g->ccap;
    if (!grow_to(&g->kbuf, &bcap, g->kbytes + bytes + 1, 1))
        return -ENOMEM;
    g->bcap = bcap;
    if (!grow_to(&g->lens, &kcap, g->n + c->n, sizeof *g->lens))
        return -ENOMEM;
    g->kcap = kcap;
    if (!grow_to(&g->calls, &ccap, g->ncalls + 1, sizeof *g->calls))
        return -ENOMEM;
    g->ccap = ccap;
    for (size_t i = 0; i < c->n; i++) {
        memcpy(g->kbuf + g->kbytes, c->keys[i], c->lens[i]);
        g->kbytes += c->lens[i];
        g->lens[g->n++] = c->lens[i];
    }
    g->calls[g->ncalls++] = c;
    return 0;
}

/* Hold c (a cached, complete filter's keys) for the end of the pass: 0,
 * or -1 when it must go on its own (too many keys, out of memory). */
static int hold(struct router_resp *d, struct resp_call *c)
{
    size_t max = d->r->cfg.max_batch_keys;
    enum router_key_op op = key_op(c);
    if (c->n == 0 || c->n > max)
        return -1;
    struct pass_group *g = group_find(d, c->filter, op);
    if (g && g->n + c->n > max) {
        /* Full: it goes now, c opens the next one. */
        struct pass_group **pp = &d->held;
        while (*pp != g)
            pp = &(*pp)->next;
        *pp = g->next;
        d->nheld--;
        group_start(g);
        g = NULL;
    }
    if (!g) {
        if (d->nheld >= PASS_GROUPS)
            pass_flush(d);
        g = calloc(1, sizeof *g);
        if (!g)
            return -1;
        g->d = d;
        g->op = op;
        snprintf(g->filter, sizeof g->filter, "%s", c->filter);
        if (group_join(g, c) < 0) {
            group_free(g);
            return -1;
        }
        g->next = d->held;
        d->held = g;
        d->nheld++;
        return 0;
    }
    return group_join(g, c) < 0 ? -1 : 0;
}

/* Is (filter, op) held in this pass?  Then its filter was found complete
 * when the group opened. */
static bool held_verified(struct router_resp *d, const struct resp_call *c)
{
    return group_find(d, c->filter, key_op(c)) != NULL;
}

static void router_bf(void *arg, struct resp_call *c)
{
    struct router_resp *d = arg;
    struct router *r = d->r;
    void (*work)(struct resp_call *) = NULL;
    const char *what = NULL;
    c->bctx[1] = d;
    c->bval[0] = 0;    /* bytes charged to the request budget */
    switch (c->op) {
    case RESP_BF_ADD:
    case RESP_BF_EXISTS: {
        if (charge(r, c) < 0) {
            resp_call_done(c);
            return;
        }
        /* A filter already held in this pass was found complete: join. */
        if (held_verified(d, c) && hold(d, c) == 0)
            return;
        struct topo *t = router_topo(r);
        struct router_filter *stale = NULL;
        struct router_filter *f = router_filter_get(r, c->filter, t, &stale);
        router_filter_unref(stale);
        topo_unref(t);
        if (f && is_verified(d, c->filter, f->secret) && hold(d, c) == 0) {
            router_filter_unref(f);
            return;
        }
        if (resp_call_keep(c) < 0) {
            router_filter_unref(f);
            break;
        }
        if (f && is_verified(d, c->filter, f->secret)) {
            /* Cached, and found complete with this secret: its keys join
             * the links' streams now (a fetch on expiry goes to the
             * pool).  A filter cached by another path (a gRPC call, a
             * creation on the way) is checked first. */
            router_filter_unref(f);
            router_keys_start_nowait(r, c->filter, key_op(c), c->keys, c->lens, c->n,
                                     c->out, keys_done, c);
            return;
        }
        router_filter_unref(f);
        work = slow_keys;
        what = "its filter is still being checked on every copy, or created; "
               "nothing of it was written";
        break;
    }
    case RESP_BF_RESERVE:
        work = reserve_work;
        what = "the filter is still being created on its copies and may yet be "
               "(BF.INFO tells)";
        break;
    case RESP_BF_INFO:
    case RESP_BF_CARD:
        work = info_work;
        what = "the filter's shards are still being asked";
        break;
    case RESP_BF_DEL:
        work = del_work;
        what = "the filters are still being dropped on their copies and may yet "
               "be (BF.INFO tells)";
        break;
    }
    if (work && resp_call_offload_bounded(c, work, r->cfg.resp_slow_timeout_ms,
                                          what) == 0)
        return;
    resp_call_fail(c, RESP_RESOURCE_EXHAUSTED, "out of memory");
    finish(c);
}

struct router_resp *router_resp_new(struct router *r)
{
    struct router_resp *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->r = r;
    pthread_mutex_init(&d->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->created, &ca);
    pthread_condattr_destroy(&ca);
    return d;
}

void router_resp_free(struct router_resp *d)
{
    if (!d)
        return;
    verified_clear(d);
    struct creating *k, *tmp;
    HASH_ITER(hh, d->creating, k, tmp) {
        HASH_DEL(d->creating, k);
        free(k);
    }
    pthread_cond_destroy(&d->created);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

void router_resp_backend(struct router_resp *d, struct resp_backend *be)
{
    memset(be, 0, sizeof *be);
    be->arg = d;
    be->bf = router_bf;
    be->pass_end = router_pass_end;
    /* A write is acknowledged by W copies; a read may ask others. */
    be->reads_wait_writes = true;
    be->answer_in_place = true;
}
