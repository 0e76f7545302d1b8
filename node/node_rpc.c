/* node_rpc: the node's catalog handlers (CreateFilter, DropFilter,
 * GetFilter, ListFilters), FilterInfo, error translation and the handler
 * tables.  See node_rpc.h for how the handlers are split.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bf.h"
#include "bf_file.h"
#include "log.h"
#include "node.h"
#include "node_rpc.h"
#include "rpc_server.h"
#include "store.h"

/* Worker threads keep their scratch between calls; it is freed when the
 * thread exits (server shutdown). */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_destroy(void *p)
{
    node_rpc__scratch_free(p);
    free(p);
}

static void scratch_key_init(void)
{
    pthread_key_create(&scratch_key, scratch_destroy);
}

struct scratch *node_rpc__thread_scratch(void)
{
    pthread_once(&scratch_once, scratch_key_init);
    struct scratch *sc = pthread_getspecific(scratch_key);
    if (!sc) {
        sc = calloc(1, sizeof *sc);
        if (sc)
            pthread_setspecific(scratch_key, sc);
    }
    return sc;
}

int node_rpc__scratch_reserve(struct scratch *sc, size_t n)
{
    if (n <= sc->cap)
        return 0;
    size_t cap = sc->cap ? sc->cap : 1024;
    while (cap < n)
        cap *= 2;
    const uint8_t **kp = realloc(sc->key_ptr, cap * sizeof *kp);
    if (kp)
        sc->key_ptr = kp;
    uint32_t *kl = realloc(sc->key_len, cap * sizeof *kl);
    if (kl)
        sc->key_len = kl;
    struct bf_hash *h = realloc(sc->hashes, cap * sizeof *h);
    if (h)
        sc->hashes = h;
    bool *o = realloc(sc->out, cap * sizeof *o);
    if (o)
        sc->out = o;
    if (!kp || !kl || !h || !o)
        return -ENOMEM;
    sc->cap = cap;
    return 0;
}

void node_rpc__scratch_free(struct scratch *sc)
{
    free(sc->key_ptr);
    free(sc->key_len);
    free(sc->hashes);
    free(sc->out);
    memset(sc, 0, sizeof *sc);
}

/* ---- helpers ---- */

int node_shard_store_name(char *out, size_t outlen, const char *filter,
                          unsigned index, unsigned count)
{
    int n;
    if (count <= 1)
        n = snprintf(out, outlen, "%s", filter);
    else
        n = snprintf(out, outlen, "%s" SHARD_SUFFIX "%u", filter, index);
    if (n < 0 || (size_t)n >= outlen || n > STORE_NAME_MAX)
        return -EINVAL;
    return 0;
}

/* A public filter name: the store's rules, minus the shard suffix. */
bool node_rpc__public_name_ok(const char *name, struct rpc_reply *r)
{
    char err[STORE_ERRLEN];
    if (store_name_check(name, err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "filter name: %s", err);
        return false;
    }
    if (strstr(name, SHARD_SUFFIX)) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "filter name \"%s\": \"" SHARD_SUFFIX "\" is reserved "
                        "for shards", name);
        return false;
    }
    return true;
}

struct store *node_rpc__need_store(struct node *n, struct rpc_reply *r)
{
    struct store *s = node_store(n);
    if (!s)
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "node is recovering its data directory %s; retry shortly",
                        n->cfg.data_dir);
    return s;
}

/* Translate a store error about filter name into a status. */
void node_rpc__store_error(struct rpc_reply *r, struct store_filter *sf,
                        const char *name, int rc, const char *err)
{
    char why[STORE_ERRLEN] = "";
    switch (rc) {
    case -ENOENT:
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                        name);
        break;
    case -EAGAIN:
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "filter \"%s\" is recovering; retry shortly", name);
        break;
    case -EIO:
        if (sf)
            store_filter_state(sf, why);
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "filter \"%s\" is not serving: %s", name,
                        why[0] ? why : (err && err[0] ? err : "I/O error"));
        break;
    case -EEXIST:
        rpc_reply_error(r, GRPC_STATUS_ALREADY_EXISTS,
                        "filter \"%s\" already exists", name);
        break;
    case -EINVAL:
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "filter \"%s\": %s", name,
                        err && err[0] ? err : "invalid argument");
        break;
    case -EOPNOTSUPP:
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "filter \"%s\" is not a COUNTING filter: Remove needs one",
                        name);
        break;
    case -ENOMEM:
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "filter \"%s\": %s", name,
                        err && err[0] ? err : "out of memory");
        break;
    case -ENOSPC:
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE,
                        "filter \"%s\": disk full (%s); nothing was acknowledged",
                        name, err && err[0] ? err : "ENOSPC");
        break;
    default:
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "filter \"%s\": %s (%s)",
                        name, err && err[0] ? err : "store error", strerror(-rc));
        break;
    }
}

/* A handle on a READY filter, or NULL with the reply set. */
struct store_filter *node_rpc__get_filter(struct store *s, const char *name,
                                       struct rpc_reply *r)
{
    struct store_filter *sf = store_get(s, name);
    if (!sf) {
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                        name);
        return NULL;
    }
    return sf;
}

int node_rpc__state_errno(enum store_state st)
{
    switch (st) {
    case STORE_READY: return 0;
    case STORE_RECOVERING: return -EAGAIN;
    case STORE_FAILED: return -EIO;
    default: return -ENOENT;
    }
}

/* ---- FilterInfo ---- */

static void info_from_bf(const struct bf *f, void *ctx);

static Bloomgrid__V1__FilterState state_to_wire(enum store_state st)
{
    switch (st) {
    case STORE_READY: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_READY;
    case STORE_RECOVERING: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_RECOVERING;
    default: return BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED;
    }
}

void node_rpc__info_fill(struct node *n, struct info_buf *ib, struct store_filter *sf,
                      const char *public_name)
{
    bloomgrid__v1__filter_info__init(&ib->fi);
    bloomgrid__v1__shard_info__init(&ib->si);
    snprintf(ib->name, sizeof ib->name, "%s", public_name);
    ib->reason[0] = 0;
    ib->fp[0] = 0;
    ib->fi.name = ib->name;
    ib->fi.reason = ib->reason;
    ib->fi.fingerprint = ib->fp;
    ib->si.node = n->cfg.listen;
    ib->si.reason = ib->reason;
    ib->sip = &ib->si;
    ib->fi.n_shard_info = 1;
    ib->fi.shard_info = &ib->sip;

    enum store_state st = store_filter_state(sf, ib->reason);
    if (st == STORE_RECOVERING && !ib->reason[0])
        snprintf(ib->reason, sizeof ib->reason, "recovering");
    ib->fi.state = state_to_wire(st);
    ib->si.state = ib->fi.state;
    ib->fi.version = store_filter_version(sf);
    ib->si.version = ib->fi.version;
    ib->fi.shards = 1;
    if (st == STORE_READY)
        store_filter_inspect(sf, info_from_bf, ib);
}

/* Geometry and estimates, read under the filter's shared lock. */
static void info_from_bf(const struct bf *f, void *ctx)
{
    struct info_buf *ib = ctx;
    struct bf_stats stats;
    struct bf_layer_info li;
    bf_stats(f, &stats);
    ib->fi.kind = (Bloomgrid__V1__FilterKind)bf_kind(f);
    ib->fi.capacity = bf_capacity(f);
    ib->fi.error_rate = bf_error_rate(f);
    ib->fi.shards = bf_shard_count(f);
    ib->fi.bits = stats.bits;
    if (bf_layer_info(f, 0, &li) == 0)
        ib->fi.hashes = li.k;
    ib->fi.bytes = stats.bytes;
    ib->fi.fill_ratio = stats.fill_ratio;
    ib->fi.estimated_count = stats.estimated_count;
    ib->fi.estimated_error_rate = stats.estimated_fpr;
    ib->fi.over_capacity = stats.over_capacity;
    ib->fi.layers = stats.layers;
    ib->fi.insert_count = bf_insert_count(f);
    bf_fingerprint_id(f, ib->fp);
    ib->si.index = bf_shard_index(f);
    ib->si.bits = stats.bits;
    ib->si.bytes = stats.bytes;
    ib->si.fill_ratio = stats.fill_ratio;
    ib->si.estimated_count = stats.estimated_count;
}

bool node_rpc__kind_from_wire(int k, enum bf_kind *out, struct rpc_reply *r)
{
    switch (k) {
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_UNSPECIFIED:
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_BLOCKED:
        *out = BF_KIND_BLOCKED;
        return true;
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_CLASSIC:
        *out = BF_KIND_CLASSIC;
        return true;
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_COUNTING:
        *out = BF_KIND_COUNTING;
        return true;
    case BLOOMGRID__V1__FILTER_KIND__FILTER_KIND_SCALABLE:
        *out = BF_KIND_SCALABLE;
        return true;
    }
    rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                    "unknown filter kind %d (BLOCKED=1, CLASSIC=2, COUNTING=3, "
                    "SCALABLE=4)", k);
    return false;
}

bool node_rpc__params_ok(uint64_t capacity, double error_rate, struct rpc_reply *r)
{
    if (capacity == 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "capacity must be > 0 (the number of keys the filter "
                        "is sized for)");
        return false;
    }
    if (!(error_rate > 0.0 && error_rate < 1.0)) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "error_rate must be strictly between 0 and 1 (e.g. "
                        "0.01), not %g", error_rate);
        return false;
    }
    return true;
}

static void reply_info(struct node *n, struct store_filter *sf, const char *name,
                       struct rpc_reply *r)
{
    struct info_buf ib;
    node_rpc__info_fill(n, &ib, sf, name);
    rpc_reply_pack(r, &ib.fi.base);
}

static void h_create_filter(void *arg, const uint8_t *req, size_t len,
                            struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__CreateFilterRequest,
                   bloomgrid__v1__create_filter_request, m, req, len, r);
    struct bf_params p = {0};
    char err[STORE_ERRLEN] = "";
    if (!node_rpc__public_name_ok(m->name, r) ||
        !node_rpc__params_ok(m->capacity, m->error_rate, r) ||
        !node_rpc__kind_from_wire(m->kind, &p.kind, r))
        goto out;
    if (m->shards > 1) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "shards = %u: a node serves single-shard filters; create "
                        "sharded filters through bloomgrid-router", m->shards);
        goto out;
    }
    p.capacity = m->capacity;
    p.error_rate = m->error_rate;
    bf_params_default(&p);
    int rc = store_create(s, m->name, &p, err);
    if (rc < 0) {
        node_rpc__store_error(r, NULL, m->name, rc, err);
        goto out;
    }
    log_info("created filter %s (%s, capacity %llu, error_rate %g)", m->name,
             bf_kind_name(p.kind), (unsigned long long)p.capacity, p.error_rate);
    struct store_filter *sf = store_get(s, m->name);
    if (!sf) {
        rpc_reply_error(r, GRPC_STATUS_NOT_FOUND,
                        "filter \"%s\" was dropped right after creation", m->name);
        goto out;
    }
    reply_info(n, sf, m->name, r);
    store_put(sf);
out:
    bloomgrid__v1__create_filter_request__free_unpacked(m, NULL);
}

static void h_drop_filter(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__DropFilterRequest,
                   bloomgrid__v1__drop_filter_request, m, req, len, r);
    char err[STORE_ERRLEN] = "";
    if (node_rpc__public_name_ok(m->name, r)) {
        int rc = store_drop(s, m->name, err);
        if (rc < 0) {
            node_rpc__store_error(r, NULL, m->name, rc, err);
        } else {
            log_info("dropped filter %s", m->name);
            Bloomgrid__V1__DropFilterResponse resp =
                BLOOMGRID__V1__DROP_FILTER_RESPONSE__INIT;
            rpc_reply_pack(r, &resp.base);
        }
    }
    bloomgrid__v1__drop_filter_request__free_unpacked(m, NULL);
}

static void h_get_filter(void *arg, const uint8_t *req, size_t len,
                         struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__GetFilterRequest,
                   bloomgrid__v1__get_filter_request, m, req, len, r);
    if (node_rpc__public_name_ok(m->name, r)) {
        struct store_filter *sf = node_rpc__get_filter(s, m->name, r);
        if (sf) {
            reply_info(n, sf, m->name, r);
            store_put(sf);
        }
    }
    bloomgrid__v1__get_filter_request__free_unpacked(m, NULL);
}

static void h_list_filters(void *arg, const uint8_t *req, size_t len,
                           struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__ListFiltersRequest,
                   bloomgrid__v1__list_filters_request, m, req, len, r);
    bloomgrid__v1__list_filters_request__free_unpacked(m, NULL);
    char **names = NULL;
    size_t nn = 0;
    if (store_list(s, &names, &nn) < 0) {
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "cannot list the filters");
        return;
    }
    struct info_buf *ibs = calloc(nn ? nn : 1, sizeof *ibs);
    Bloomgrid__V1__FilterInfo **fis = calloc(nn ? nn : 1, sizeof *fis);
    size_t k = 0;
    if (!ibs || !fis) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nn; i++) {
        if (strstr(names[i], SHARD_SUFFIX))
            continue; /* shards of router-managed filters: see ListShards */
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        node_rpc__info_fill(n, &ibs[k], sf, names[i]);
        store_put(sf);
        ibs[k].fi.shard_info = &ibs[k].sip; /* fix the self-pointer */
        fis[k] = &ibs[k].fi;
        k++;
    }
    Bloomgrid__V1__ListFiltersResponse resp = BLOOMGRID__V1__LIST_FILTERS_RESPONSE__INIT;
    resp.n_filters = k;
    resp.filters = fis;
    rpc_reply_pack(r, &resp.base);
out:
    free(fis);
    free(ibs);
    store_list_free(names, nn);
}

/* Descriptor order: CreateFilter, DropFilter, ListFilters, GetFilter, Add,
 * MayContain, Remove, AddStream, MayContainStream, Export, Import. */
const struct rpc_handler node_rpc_public[] = {
    {.unary = h_create_filter},
    {.unary = h_drop_filter},
    {.unary = h_list_filters},
    {.unary = h_get_filter},
    {.unary = node_rpc__h_add},
    {.unary = node_rpc__h_may_contain},
    {.unary = node_rpc__h_remove},
    {.stream = node_rpc__h_add_stream},
    {.stream = node_rpc__h_may_contain_stream},
    {.stream = node_rpc__h_export},
    {.stream = node_rpc__h_import},
};

/* CreateShard, DropShard, GetShard, ListShards, AddHashes, MayContainHashes,
 * RemoveHashes, PullPages, PushPages, ExportShard,
 * ImportShard, AddMultiHashes, MayContainMultiHashes, RemoveMultiHashes. */
const struct rpc_handler node_rpc_internal[] = {
    {.unary = node_rpc__h_create_shard},
    {.unary = node_rpc__h_drop_shard},
    {.unary = node_rpc__h_get_shard},
    {.unary = node_rpc__h_list_shards},
    {.unary = node_rpc__h_add_hashes},
    {.unary = node_rpc__h_may_contain_hashes},
    {.unary = node_rpc__h_remove_hashes},
    {.stream = node_rpc__h_pull_pages},
    {.stream = node_rpc__h_push_pages},
    {.stream = node_rpc__h_export_shard},
    {.stream = node_rpc__h_import_shard},
    {.unary = node_rpc__h_add_multi_hashes},
    {.unary = node_rpc__h_may_contain_multi_hashes},
    {.unary = node_rpc__h_remove_multi_hashes},
    {.unary = node_rpc__h_node_info},
};

const size_t node_rpc_public_count = sizeof node_rpc_public / sizeof node_rpc_public[0];
const size_t node_rpc_internal_count =
    sizeof node_rpc_internal / sizeof node_rpc_internal[0];
