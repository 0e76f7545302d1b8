/* router_resp: BF.* commands through the router (router_resp.h). */
#include "router_resp.h"

#include <errno.h>
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
                               .shards = (uint32_t)r->cfg.default_shards};
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
    uint64_t deadline = now_ms() + COMPLETE_WAIT_MS;
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
                           "copy after %d ms (a creation on the way or rolled back); "
                           "nothing was written; retry: %s", c->filter,
                           COMPLETE_WAIT_MS, st.message);
            goto done;
        }
        struct timespec ts = {0, (long)(backoff + (unsigned)rand() % backoff) * 1000000L};
        nanosleep(&ts, NULL);
        if (backoff < 200)
            backoff *= 2;
    }
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

static void router_bf(void *arg, struct resp_call *c)
{
    struct router_resp *d = arg;
    struct router *r = d->r;
    void (*work)(struct resp_call *) = NULL;
    c->bctx[1] = d;
    c->bval[0] = 0;    /* bytes charged to the request budget */
    switch (c->op) {
    case RESP_BF_ADD:
    case RESP_BF_EXISTS: {
        if (charge(r, c) < 0) {
            resp_call_done(c);
            return;
        }
        struct topo *t = router_topo(r);
        struct router_filter *stale = NULL;
        struct router_filter *f = router_filter_get(r, c->filter, t, &stale);
        router_filter_unref(stale);
        topo_unref(t);
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
        break;
    }
    case RESP_BF_RESERVE:
        work = reserve_work;
        break;
    case RESP_BF_INFO:
    case RESP_BF_CARD:
        work = info_work;
        break;
    case RESP_BF_DEL:
        work = del_work;
        break;
    }
    if (work && resp_call_offload(c, work) == 0)
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
    /* A write is acknowledged by W copies; a read may ask others. */
    be->reads_wait_writes = true;
}
