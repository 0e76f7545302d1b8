/* router_canary: the canary thread of bloomgrid-router (router_canary.h). */
#include "router_canary.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "metrics.h"
#include "router_nodes.h"

/* False negatives and failed calls logged one by one per round, at most. */
#define LOG_PER_ROUND 10

struct router_canary {
    struct router *r;
    const char *filter, *name, *state_path;    /* r->cfg's; "" path: none */
    int interval_ms;
    size_t check;
    pthread_t thread;
    pthread_mutex_t lock;       /* guards stop */
    pthread_cond_t cond;
    bool stop;

    /* The canary thread's alone. */
    struct canary_state st;
    uint64_t rng;
    uint64_t *pick;             /* check entries */
    char keys[CANARY_CHECK_BATCH][CANARY_KEY_MAX];
    const uint8_t *kp[CANARY_CHECK_BATCH];
    uint32_t lens[CANARY_CHECK_BATCH];
    bool out[CANARY_CHECK_BATCH];
    struct metric *m_adds, *m_checks, *m_fn, *m_err;

    /* The batch in flight, ended by batch_done on another thread. */
    pthread_mutex_t wait_mu;
    pthread_cond_t wait_cv;
    bool done;
    int rc;
    struct rpc_status status;
};

static void batch_done(void *arg, int rc, const struct rpc_status *st)
{
    struct router_canary *c = arg;

    pthread_mutex_lock(&c->wait_mu);
    c->rc = rc;
    if (rc)
        c->status = *st;
    c->done = true;
    pthread_cond_signal(&c->wait_cv);
    pthread_mutex_unlock(&c->wait_mu);
}

/* Keys kp[0..n) through the router's key path, waited for here.  Returns
 * 0 (out[] filled) or -1 with c->status. */
static int run_batch(struct router_canary *c, enum router_key_op op, size_t n)
{
    c->done = false;
    router_keys_start(c->r, c->filter, op, c->kp, c->lens, n, c->out, batch_done, c);
    pthread_mutex_lock(&c->wait_mu);
    while (!c->done)
        pthread_cond_wait(&c->wait_cv, &c->wait_mu);
    pthread_mutex_unlock(&c->wait_mu);
    return c->rc;
}

static void set_key(struct router_canary *c, size_t i, uint64_t seq)
{
    c->lens[i] = (uint32_t)canary_key(c->keys[i], c->name, seq);
    c->kp[i] = (const uint8_t *)c->keys[i];
}

/* Add key st.next; on its acknowledgement count it and record it. */
static void round_add(struct router_canary *c)
{
    char err[CANARY_ERRLEN];

    set_key(c, 0, c->st.next);
    if (run_batch(c, ROUTER_ADD, 1) < 0) {
        metric_add(c->m_err, 1);
        log_warn("canary: Add of %s to filter %s failed: %s: %s", c->keys[0],
                 c->filter, rpc_status_name(c->status.code), c->status.message);
        return;
    }
    metric_add(c->m_adds, 1);
    c->st.next++;
    /* A state that cannot be saved lags: a restart adds its keys again. */
    if (c->state_path[0] && canary_state_save(c->state_path, &c->st, err) < 0) {
        metric_add(c->m_err, 1);
        log_error("canary: %s", err);
    }
}

/* Ask for this round's picks, CANARY_CHECK_BATCH keys a batch. */
static void round_check(struct router_canary *c)
{
    size_t n = canary_pick(c->st.next, c->check, c->pick, &c->rng);
    uint64_t fn = 0, failed = 0;

    for (size_t i = 0; i < n; i += CANARY_CHECK_BATCH) {
        size_t m = n - i < CANARY_CHECK_BATCH ? n - i : CANARY_CHECK_BATCH;
        for (size_t k = 0; k < m; k++)
            set_key(c, k, c->pick[i + k]);
        if (run_batch(c, ROUTER_MAY_CONTAIN, m) < 0) {
            if (failed++ < LOG_PER_ROUND)
                log_warn("canary: MayContain of %zu keys of filter %s failed: %s: %s",
                         m, c->filter, rpc_status_name(c->status.code),
                         c->status.message);
            continue;
        }
        metric_add(c->m_checks, m);
        for (size_t k = 0; k < m; k++) {
            if (c->out[k])
                continue;
            if (fn++ < LOG_PER_ROUND)
                log_error("canary: FALSE NEGATIVE: key \"%s\" of filter %s was "
                          "acknowledged and now reads \"no\"", c->keys[k], c->filter);
        }
    }
    metric_add(c->m_fn, fn);
    metric_add(c->m_err, failed);
    if (fn > LOG_PER_ROUND)
        log_error("canary: %" PRIu64 " false negatives in filter %s this round",
                  fn, c->filter);
}

static void *canary_main(void *arg)
{
    struct router_canary *c = arg;

    pthread_mutex_lock(&c->lock);
    for (;;) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += c->interval_ms / 1000;
        ts.tv_nsec += (long)(c->interval_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!c->stop && pthread_cond_timedwait(&c->cond, &c->lock, &ts) != ETIMEDOUT)
            ;
        if (c->stop)
            break;
        pthread_mutex_unlock(&c->lock);
        round_add(c);
        round_check(c);
        pthread_mutex_lock(&c->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* The state file's keys, or a new canary's. */
static int state_init(struct router_canary *c, char *err)
{
    int rc = -ENOENT;

    if (c->state_path[0])
        rc = canary_state_load(c->state_path, &c->st, err);
    if (rc == -ENOENT) {
        memset(&c->st, 0, sizeof c->st);
        snprintf(c->st.filter, sizeof c->st.filter, "%s", c->filter);
        snprintf(c->st.name, sizeof c->st.name, "%s", c->name);
        return 0;
    }
    if (rc < 0)
        return -1;
    return canary_state_match(c->state_path, &c->st, c->filter, c->name, err) < 0 ? -1 : 0;
}

static struct metric *counter(const struct router_canary *c, const char *name,
                              const char *help)
{
    const char *labels[] = {"filter", c->filter, NULL};
    return metrics_counter(metrics_registry(), name, help, labels);
}

int router_canary_start(struct router *r, struct router_canary **out, char *err)
{
    struct router_canary *c;

    *out = NULL;
    if (!r->cfg.canary_filter[0])
        return 0;
    if (!(c = calloc(1, sizeof *c)) ||
        !(c->pick = calloc(r->cfg.canary_check_keys, sizeof *c->pick))) {
        free(c);
        errmsg_set(err, "canary: out of memory");
        return -1;
    }
    c->r = r;
    c->filter = r->cfg.canary_filter;
    c->name = r->cfg.canary_name;
    c->state_path = r->cfg.canary_state_file;
    c->interval_ms = (int)r->cfg.canary_interval_ms;
    c->check = (size_t)r->cfg.canary_check_keys;
    c->rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    if (state_init(c, err) < 0)
        goto fail;
    c->m_adds = counter(c, "bloomgrid_canary_adds_total",
                        "canary keys added and acknowledged");
    c->m_checks = counter(c, "bloomgrid_canary_checks_total",
                          "acknowledged canary keys asked for again");
    c->m_fn = counter(c, "bloomgrid_canary_false_negatives_total",
                      "acknowledged canary keys that read \"no\": must stay 0");
    c->m_err = counter(c, "bloomgrid_canary_errors_total",
                       "canary calls that failed (an Add or a MayContain batch)");
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cond, NULL);
    pthread_mutex_init(&c->wait_mu, NULL);
    pthread_cond_init(&c->wait_cv, NULL);
    if (pthread_create(&c->thread, NULL, canary_main, c) != 0) {
        errmsg_set(err, "canary: cannot start its thread");
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->cond);
        pthread_mutex_destroy(&c->wait_mu);
        pthread_cond_destroy(&c->wait_cv);
        goto fail;
    }
    log_info("canary: a key to filter %s every %d ms (keys bloomgrid-canary/%s/SEQ, "
             "%" PRIu64 " acknowledged before, %s)", c->filter, c->interval_ms,
             c->name, c->st.next, c->state_path[0] ? c->state_path : "kept in memory");
    *out = c;
    return 0;
fail:
    free(c->pick);
    free(c);
    return -1;
}

void router_canary_stop(struct router_canary *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    pthread_join(c->thread, NULL);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    pthread_mutex_destroy(&c->wait_mu);
    pthread_cond_destroy(&c->wait_cv);
    free(c->pick);
    free(c);
}
