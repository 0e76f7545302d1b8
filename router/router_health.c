/* router_health: the probe thread and the health answers (router_health.h). */
#include "router_health.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "node_client.h"
#include "quorum.h"

#define READY_NAME "bloomgrid.v1.BloomGrid"

struct router_health {
    struct router *r;
    pthread_t thread;
    pthread_mutex_t lock;       /* guards everything below */
    pthread_cond_t cond;
    bool stop;
    struct topo *topo;          /* the topology of the last round (a ref) */
    unsigned *serving;          /* per group of topo: copies SERVING */
    char (*state)[16];          /* per address of the last round, for logs */
    size_t nstate;
};

/* 1 when every shard of the filter (every group when shards is 0) has its
 * read quorum of serving copies, the shards placed by placement version
 * placement.  Caller holds h->lock; h->topo is set. */
static int judge(const struct router_health *h, const char *name, uint32_t shards,
                 uint32_t placement)
{
    const struct topo *t = h->topo;
    uint16_t *group = shards ? malloc(shards * sizeof *group) : NULL;
    int v = 1;

    if (!group || topo_place(t, name, shards, placement, group) < 0) {
        for (unsigned g = 0; g < t->ngroups; g++)
            if (!quorum_readable(&t->groups[g], h->serving[g]))
                v = 0;
        free(group);
        return v;
    }
    for (uint32_t s = 0; s < shards && v; s++)
        if (group[s] >= t->ngroups || !quorum_readable(&t->groups[group[s]], h->serving[group[s]]))
            v = 0;
    free(group);
    return v;
}

/* rpc_health_fn: the per-filter names. */
static int health_of(void *arg, const char *service)
{
    struct router_health *h = arg;
    size_t plen = strlen(ROUTER_HEALTH_FILTER_PREFIX);
    if (strncmp(service, ROUTER_HEALTH_FILTER_PREFIX, plen) != 0 || !service[plen])
        return -1;
    const char *name = service + plen;
    uint32_t placement = 0;
    uint32_t shards = router_filter_shards(h->r, name, &placement);
    pthread_mutex_lock(&h->lock);
    int v = h->topo ? judge(h, name, shards, placement) : 0;
    pthread_mutex_unlock(&h->lock);
    return v;
}

/* One round: every copy of t asked at once. */
static void probe(struct router_health *h, struct topo *t, int timeout_ms)
{
    struct router *r = h->r;
    size_t n = 0;
    for (unsigned g = 0; g < t->ngroups; g++)
        n += t->groups[g].ncopies;
    struct node_client_probe *calls = calloc(n ? n : 1, sizeof *calls);
    unsigned *serving = calloc(t->ngroups ? t->ngroups : 1, sizeof *serving);
    char (*state)[16] = calloc(n ? n : 1, sizeof *state);
    size_t k = 0;
    if (!calls || !serving || !state)
        goto out;
    for (unsigned g = 0; g < t->ngroups; g++)
        for (unsigned c = 0; c < t->groups[g].ncopies; c++, k++)
            if (!(calls[k].ch = router_channel(r, t->groups[g].copies[c])))
                goto out;   /* out of memory: this round is skipped */
    if (node_client_probe_many(calls, n, READY_NAME, timeout_ms) < 0)
        goto out;
    k = 0;
    for (unsigned g = 0; g < t->ngroups; g++)
        for (unsigned c = 0; c < t->groups[g].ncopies; c++, k++) {
            const char *what = calls[k].rc != 0 ? "unreachable"
                               : calls[k].serving ? "serving" : "not serving";
            serving[g] += strcmp(what, "serving") == 0;
            snprintf(state[k], sizeof state[k], "%s", what);
        }

    pthread_mutex_lock(&h->lock);
    /* A change of a copy's state is logged once, when it is seen. */
    bool same = h->topo == t && h->nstate == n;
    k = 0;
    for (unsigned g = 0; g < t->ngroups; g++)
        for (unsigned c = 0; c < t->groups[g].ncopies; c++, k++) {
            if (same && strcmp(h->state[k], state[k]) == 0)
                continue;
            if (strcmp(state[k], "serving") == 0)
                log_info("health: node %s (group %s): serving",
                         t->groups[g].copies[c], t->groups[g].name);
            else
                log_warn("health: node %s (group %s): %s%s%s",
                         t->groups[g].copies[c], t->groups[g].name, state[k],
                         calls[k].rc ? ": " : "", calls[k].rc ? calls[k].st.message : "");
        }
    if (h->topo != t) {
        topo_unref(h->topo);
        h->topo = topo_ref(t);
    }
    free(h->serving);
    free(h->state);
    h->serving = serving;
    h->state = state;
    h->nstate = n;
    serving = NULL;
    state = NULL;
    int ready = judge(h, "", 0, 0);
    pthread_mutex_unlock(&h->lock);
    rpc_server_set_health(r->srv, READY_NAME, ready);
out:
    free(calls);
    free(serving);
    free(state);
}

static void *probe_main(void *arg)
{
    struct router_health *h = arg;
    int every = (int)h->r->cfg.health_probe_ms;
    int timeout = every < (int)h->r->cfg.node_timeout_ms ? every
                                                         : (int)h->r->cfg.node_timeout_ms;

    pthread_mutex_lock(&h->lock);
    while (!h->stop) {
        pthread_mutex_unlock(&h->lock);
        struct topo *t = router_topo(h->r);
        probe(h, t, timeout);
        topo_unref(t);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += every / 1000;
        ts.tv_nsec += (long)(every % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&h->lock);
        while (!h->stop &&
               pthread_cond_timedwait(&h->cond, &h->lock, &ts) != ETIMEDOUT)
            ;
    }
    pthread_mutex_unlock(&h->lock);
    return NULL;
}

struct router_health *router_health_start(struct router *r)
{
    struct router_health *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->r = r;
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->cond, NULL);
    rpc_server_set_health(r->srv, READY_NAME, false);
    rpc_server_set_health_fn(r->srv, health_of, h);
    if (pthread_create(&h->thread, NULL, probe_main, h) != 0) {
        pthread_mutex_destroy(&h->lock);
        pthread_cond_destroy(&h->cond);
        free(h);
        return NULL;
    }
    return h;
}

void router_health_stop(struct router_health *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->lock);
    h->stop = true;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    pthread_join(h->thread, NULL);
    rpc_server_set_health(h->r->srv, READY_NAME, false);
    rpc_server_set_health_fn(h->r->srv, NULL, NULL);
    topo_unref(h->topo);
    free(h->serving);
    free(h->state);
    pthread_mutex_destroy(&h->lock);
    pthread_cond_destroy(&h->cond);
    free(h);
}
