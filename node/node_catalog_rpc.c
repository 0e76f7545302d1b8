/* node_catalog_rpc: the public catalog handlers CreateFilter, DropFilter,
 * GetFilter and ListFilters of single-shard filters (sharded filters are
 * created through a router, shard by shard, on the internal service), and
 * the undrop both CreateFilter and the internal CreateShard make
 * (docs/BACKUP.md, "Undoing a drop").
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "bf.h"
#include "log.h"
#include "node.h"
#include "node_rpc.h"
#include "rpc_server.h"
#include "rules.h"
#include "store.h"

static void reply_info(struct node *n, struct store_filter *sf, const char *name,
                       struct rpc_reply *r)
{
    struct info_buf ib;
    node_rpc__info_fill(n, &ib, sf, name);
    rpc_reply_pack(r, &ib.fi.base);
}

int node_rpc__undrop(struct store *s, const char *sname, const char *label,
                     const struct bf_params *p, uint64_t gen, uint64_t *out_gen,
                     struct rpc_reply *r)
{
    char err[STORE_ERRLEN] = "";
    struct shard_facts facts;
    int rc = store_undrop(s, sname, p, gen, out_gen, err);

    if (rc != -EEXIST) {
        if (rc < 0)
            node_rpc__store_error(r, NULL, sname, rc, err);
        return rc < 0 ? -1 : 0;
    }
    struct store_filter *sf = store_get(s, sname);
    bool known = sf && node_rpc__shard_facts(sf, &facts) == 0;
    if (sf)
        store_put(sf);
    if (!known)
        rpc_reply_error(r, GRPC_STATUS_UNAVAILABLE, "%s exists but is not "
                        "serving (recovering or failed), so its secret cannot "
                        "be checked: not undropped; retry", label);
    else if (facts.secret_id != XXH3_64bits(p->secret, BF_SECRET_LEN))
        rpc_reply_fail(r, GRPC_STATUS_FAILED_PRECONDITION, RPC_REASON_SECRET_MISMATCH,
                       "%s exists under another secret (it was created again "
                       "after the drop): not undropped; drop it first, or "
                       "restore elsewhere", label);
    else
        rpc_reply_error(r, GRPC_STATUS_ALREADY_EXISTS, "%s exists with this "
                        "secret: nothing to undrop", label);
    return -1;
}

/* A generation for an undrop made here: the time in microseconds, above
 * every earlier one (store_undrop also puts it above the tombstone's). */
static uint64_t undrop_generation(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

void node_rpc__h_create_filter(void *arg, const uint8_t *req, size_t len,
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
    if (node_rpc__refuse_public_catalog(r, "CreateFilter") ||
        !node_rpc__public_name_ok(m->name, r) ||
        !node_rpc__params_ok(m->capacity, m->error_rate, r) ||
        !node_rpc__kind_from_wire(m->kind, &p.kind, r))
        goto out;
    if (rules_secret_check(m->secret.len, err) < 0) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "%s", err);
        goto out;
    }
    if (m->shards > 1) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "shards = %u: a node serves single-shard filters; create "
                        "sharded filters through bloomgrid-router", m->shards);
        goto out;
    }
    if (m->undrop && !m->secret.len) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT, "filter \"%s\": an "
                        "undrop needs the dropped filter's secret (a backup's "
                        "file holds it: bloomgrid restore --undrop)", m->name);
        goto out;
    }
    p.capacity = m->capacity;
    p.error_rate = m->error_rate;
    p.secret = m->secret.len ? m->secret.data : NULL;
    bf_params_default(&p);
    if (!node_rpc__create_begin(s, m->name, 0, 1, r))
        goto out;
    if (m->undrop) {
        char label[STORE_NAME_MAX + 16];
        uint64_t gen = 0;
        snprintf(label, sizeof label, "filter \"%s\"", m->name);
        int rc = node_rpc__undrop(s, m->name, label, &p, undrop_generation(), &gen, r);
        node_rpc__create_end();
        if (rc < 0)
            goto out;
        log_info("undropped filter %s (%s, capacity %llu, error_rate %g): "
                 "generation %" PRIu64, m->name, bf_kind_name(p.kind),
                 (unsigned long long)p.capacity, p.error_rate, gen);
    } else {
        int rc = store_create(s, m->name, &p, err);
        node_rpc__create_end();
        if (rc < 0) {
            node_rpc__store_error(r, NULL, m->name, rc, err);
            goto out;
        }
        log_info("created filter %s (%s, capacity %llu, error_rate %g)", m->name,
                 bf_kind_name(p.kind), (unsigned long long)p.capacity, p.error_rate);
    }
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

void node_rpc__h_drop_filter(void *arg, const uint8_t *req, size_t len,
                          struct rpc_reply *r)
{
    struct node *n = arg;
    struct store *s = node_rpc__need_store(n, r);
    if (!s)
        return;
    UNPACK_OR_FAIL(Bloomgrid__V1__DropFilterRequest,
                   bloomgrid__v1__drop_filter_request, m, req, len, r);
    char err[STORE_ERRLEN] = "";
    if (!node_rpc__refuse_public_catalog(r, "DropFilter") &&
        node_rpc__public_name_ok(m->name, r)) {
        int rc = store_drop(s, m->name, err);
        if (rc < 0) {
            node_rpc__store_error(r, NULL, m->name, rc, err);
        } else {
            log_info("dropped filter %s", m->name);
            node_sync_forget(node_rpc__sync_get(), m->name, 0);
            Bloomgrid__V1__DropFilterResponse resp =
                BLOOMGRID__V1__DROP_FILTER_RESPONSE__INIT;
            rpc_reply_pack(r, &resp.base);
        }
    }
    bloomgrid__v1__drop_filter_request__free_unpacked(m, NULL);
}

void node_rpc__h_get_filter(void *arg, const uint8_t *req, size_t len,
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

void node_rpc__h_list_filters(void *arg, const uint8_t *req, size_t len,
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
        if (rules_is_shard_name(names[i]))
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

