/* router: topology, node channels and the filter cache (see router.h). */
#include "router.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include <xxhash.h>

#include "log.h"
#include "name_index.h"
#include "router_nodes.h"
#include "router_pool.h"

int router_init(struct router *r, const struct router_config *cfg, struct topo *t)
{
    memset(r, 0, sizeof *r);
    r->cfg = *cfg;
    r->topo = t;
    pthread_mutex_init(&r->lock, NULL);
    r->pool = router_pool_create();
    r->link_index = name_index_create();
    r->filters = name_index_create();
    router_keys_metrics_init();
    return r->pool && r->link_index && r->filters ? 0 : -ENOMEM;
}

void router_close_links(void *arg)
{
    struct router *r = arg;
    /* The pool's jobs call the links; the links' last batches may still
     * use the pool (refused now) and the filter cache. */
    router_pool_stop(r->pool);
    pthread_mutex_lock(&r->lock);
    r->links_closed = true;
    struct router_link **links = r->links;
    size_t n = r->nlinks;
    r->links = NULL;
    r->nlinks = r->links_cap = 0;
    if (r->link_index)
        name_index_clear(r->link_index, NULL, NULL);
    pthread_mutex_unlock(&r->lock);
    for (size_t i = 0; i < n; i++)
        router_link_destroy(links[i]);
    free(links);
}

static void filter_unref_fn(void *value, void *ctx)
{
    (void)ctx;
    router_filter_unref(value);
}

void router_deinit(struct router *r)
{
    router_close_links(r);
    router_pool_destroy(r->pool);
    if (r->filters)
        name_index_clear(r->filters, filter_unref_fn, NULL);
    name_index_destroy(r->filters);
    name_index_destroy(r->link_index);
    topo_unref(r->topo);
    pthread_mutex_destroy(&r->lock);
    memset(r, 0, sizeof *r);
}

struct topo *router_topo(struct router *r)
{
    pthread_mutex_lock(&r->lock);
    struct topo *t = topo_ref(r->topo);
    pthread_mutex_unlock(&r->lock);
    return t;
}

int router_reload(struct router *r, char *err)
{
    struct topo *t = topo_load(r->cfg.topology, err);
    if (!t)
        return -EINVAL;
    pthread_mutex_lock(&r->lock);
    struct topo *old = r->topo;
    r->topo = t;
    pthread_mutex_unlock(&r->lock);
    /* Calls that started on the old topology keep their own references. */
    topo_unref(old);
    return 0;
}

struct router_link *router_node_link(struct router *r, const char *addr)
{
    /* Every key batch asks: found without r->lock once it exists. */
    struct router_link *l = name_index_get(r->link_index, addr, NULL, NULL);
    if (l)
        return l;
    pthread_mutex_lock(&r->lock);
    if (r->links_closed)
        goto out;
    if ((l = name_index_get(r->link_index, addr, NULL, NULL)))
        goto out;
    if (r->nlinks == r->links_cap) {
        size_t cap = r->links_cap ? 2 * r->links_cap : 16;
        struct router_link **p = realloc(r->links, cap * sizeof *p);
        if (!p)
            goto out;
        r->links = p;
        r->links_cap = cap;
    }
    struct router_link_config lc = {
        .max_message = r->cfg.max_message_size,
        .max_queue_bytes = r->cfg.node_queue_mb << 20,
        .max_message_hashes = r->cfg.max_batch_keys,
    };
    int loops = r->srv ? rpc_server_loops(r->srv) : 0;
    if (loops > 0)
        lc.cq = rpc_server_loop_cq(r->srv, (int)(r->nlinks % (size_t)loops));
    l = router_link_create(addr, &lc);
    if (l && name_index_add(r->link_index, addr, l) < 0) {
        router_link_destroy(l);
        l = NULL;
    }
    if (l) {
        r->links[r->nlinks++] = l;
        log_info("link to node %s opened", addr);
    }
out:
    pthread_mutex_unlock(&r->lock);
    return l;
}

struct rpc_channel *router_channel(struct router *r, const char *addr)
{
    struct router_link *l = router_node_link(r, addr);
    return l ? router_link_channel(l) : NULL;
}

void router_filter_unref(struct router_filter *f)
{
    if (!f || atomic_fetch_sub(&f->refs, 1) != 1)
        return;
    bf_destroy(f->hasher);
    topo_unref(f->topo);
    free(f->group);
    free(f);
}

/* A reference to a cached entry, taken under its stripe's lock (so the
 * cache cannot drop its own meanwhile). */
static void take_ref(void *value, void *ctx)
{
    struct router_filter *f = value;
    atomic_fetch_add(&f->refs, 1);
    *(struct router_filter **)ctx = f;
}

struct router_filter *router_filter_get(struct router *r, const char *name,
                                        const struct topo *t,
                                        struct router_filter **stale)
{
    struct router_filter *c = NULL;
    if (stale)
        *stale = NULL;
    /* Entries are immutable: judged after the reference is taken. */
    name_index_get(r->filters, name, take_ref, &c);
    if (!c)
        return NULL;
    bool fresh = c->topo == t && time(NULL) - c->fetched < (time_t)r->cfg.secret_ttl_s;
    if (fresh)
        return c;
    if (stale)
        *stale = c;
    else
        router_filter_unref(c);
    return NULL;
}

struct router_filter *router_filter_add(struct router *r, const char *name,
                                        const uint8_t *secret, uint32_t shards,
                                        uint32_t placement, struct topo *t)
{
    char err[BF_ERRLEN];
    struct router_filter *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    atomic_init(&f->refs, 2);
    snprintf(f->name, sizeof f->name, "%s", name);
    f->shards = shards;
    f->placement = topo_placement_norm(placement);
    memcpy(f->secret, secret, BF_SECRET_LEN);
    f->secret_id = XXH3_64bits(secret, BF_SECRET_LEN);
    struct bf_params p = {.capacity = 1, .error_rate = 0.5, .secret = secret};
    f->hasher = bf_create(&p, err);
    f->group = calloc(shards, sizeof *f->group);
    if (!f->hasher || !f->group) {
        bf_destroy(f->hasher);
        free(f->group);
        free(f);
        return NULL;
    }
    if (topo_place(t, name, shards, f->placement, f->group) < 0) {
        bf_destroy(f->hasher);
        free(f->group);
        free(f);
        return NULL;
    }
    f->topo = topo_ref(t);
    f->fetched = time(NULL);

    int rc;
    struct router_filter *old = name_index_set(r->filters, name, f, &rc);
    if (rc < 0)
        atomic_fetch_sub(&f->refs, 1);   /* not cached */
    router_filter_unref(old);
    return f;
}

uint32_t router_filter_shards(struct router *r, const char *name,
                              uint32_t *placement)
{
    struct router_filter *c = NULL;
    name_index_get(r->filters, name, take_ref, &c);
    uint32_t n = c ? c->shards : 0;
    if (placement)
        *placement = c ? c->placement : 0;
    router_filter_unref(c);
    return n;
}

void router_filter_forget(struct router *r, const char *name)
{
    router_filter_unref(name_index_remove(r->filters, name, NULL));
}
