/* router_rpc_catalog: CreateFilter (all shards or none), DropFilter,
 * GetFilter and ListFilters over the internal service (see router_nodes.h).
 * An RPC edge file like router_rpc.c; messages use the generated protobuf-c
 * code.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "router_nodes.h"
#include "router_rpc.h"
#include "rpc_client.h"
#include "rules.h"

#define M_CREATE "/bloomgrid.v1.Internal/CreateShard"
#define M_DROP "/bloomgrid.v1.Internal/DropShard"
#define M_GET "/bloomgrid.v1.Internal/GetShard"
#define M_LIST "/bloomgrid.v1.Internal/ListShards"

/* ---- catalog ---- */

void router_filter_desc_free(struct router_filter_desc *d)
{
    free(d->shard);
    d->shard = NULL;
}

static void shard_desc_from(struct router_shard_desc *d,
                            const Bloomgrid__V1__InternalShardInfo *isi,
                            const char *node)
{
    const Bloomgrid__V1__FilterInfo *fi = isi->info;
    d->ok = true;
    d->index = isi->shard_index;
    snprintf(d->node, sizeof d->node, "%s", node);
    if (!fi) {
        d->state = BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED;
        snprintf(d->reason, sizeof d->reason, "node %s sent no shard info", node);
        return;
    }
    d->state = fi->state;
    snprintf(d->reason, sizeof d->reason, "%s", fi->reason ? fi->reason : "");
    d->kind = fi->kind;
    d->capacity = fi->capacity;
    d->error_rate = fi->error_rate;
    d->bits = fi->bits;
    d->bytes = fi->bytes;
    d->hashes = fi->hashes;
    d->layers = fi->layers;
    d->fill_ratio = fi->fill_ratio;
    d->estimated_count = fi->estimated_count;
    d->estimated_error_rate = fi->estimated_error_rate;
    d->over_capacity = fi->over_capacity;
    d->version = fi->version;
    d->insert_count = fi->insert_count;
    snprintf(d->fingerprint, sizeof d->fingerprint, "%s",
             fi->fingerprint ? fi->fingerprint : "");
}

static void shard_desc_failed(struct router_shard_desc *d, uint32_t index,
                              const char *node, const struct rpc_status *rs)
{
    memset(d, 0, sizeof *d);
    d->index = index;
    snprintf(d->node, sizeof d->node, "%s", node);
    d->state = BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED;
    snprintf(d->reason, sizeof d->reason, "node %.64s: %s: %.160s", node,
             rpc_status_name(rs->code), rs->message);
}

/* Send one ShardRef-like request per shard in list[0..n) and collect.
 * secret_id (ShardRef only; 0: any) limits a drop to shards of that
 * secret. */
static struct rpc_multi *shard_calls(struct router *r, const struct topo *t,
                                     const struct router_filter *f,
                                     const uint32_t *list, size_t n,
                                     const char *method, bool get,
                                     uint64_t secret_id)
{
    struct rpc_multi *calls = calloc(n ? n : 1, sizeof *calls);
    if (!calls)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = list[i];
        if (get) {
            Bloomgrid__V1__GetShardRequest m = BLOOMGRID__V1__GET_SHARD_REQUEST__INIT;
            m.filter = (char *)f->name;
            m.shard_index = s;
            calls[i].req = router_rpc__pack_slice(&m.base);
        } else {
            Bloomgrid__V1__ShardRef m = BLOOMGRID__V1__SHARD_REF__INIT;
            m.filter = (char *)f->name;
            m.shard_index = s;
            m.secret_id = secret_id;
            calls[i].req = router_rpc__pack_slice(&m.base);
        }
        calls[i].resp = grpc_empty_slice();
        calls[i].ch = router_channel(r, router_rpc__primary(t, f, s));
        calls[i].method = method;
        calls[i].timeout_ms = (int)r->cfg.node_timeout_ms;
    }
    for (size_t i = 0; i < n; i++)
        if (!calls[i].ch) {
            router_rpc__multi_free(calls, n);
            return NULL;
        }
    rpc_call_many(calls, n);
    return calls;
}

/* The failure of a CreateFilter that tells most: one from a node that
 * answered (a bad parameter, a name taken) before one of a node that is
 * down or slow. */
static const struct rpc_multi *telling_failure(const struct rpc_multi *calls,
                                               uint32_t S)
{
    const struct rpc_multi *first = NULL;

    for (uint32_t s = 0; s < S; s++) {
        if (calls[s].rc == 0)
            continue;
        if (!first || (router_node_down(first->st.code) &&
                       !router_node_down(calls[s].st.code)))
            first = &calls[s];
    }
    return first;
}

/* Undo a CreateFilter that failed on some shards: drop every shard this
 * call may have created (those that answered OK, and those whose answer
 * was lost with a node down or slow), each only if it has this call's
 * secret, so a shard of the same name that another call created stays.
 * st gets the failure, and names any shard that could not be dropped. */
static void rollback(struct router *r, const struct topo *t,
                     const struct router_filter *f, const char *name,
                     const struct rpc_multi *calls, uint32_t S, size_t failed,
                     struct rpc_status *st)
{
    const struct rpc_multi *first = telling_failure(calls, S);
    uint32_t fs = (uint32_t)(first - calls);
    uint32_t *undo = calloc(S, sizeof *undo), nundo = 0;
    struct rpc_multi *drops = NULL;
    char left[RPC_MSGLEN] = "";
    size_t nleft = 0, off = 0;

    /* Every shard: one whose create failed may still have been created
     * (an answer lost to a deadline); a drop by secret leaves others' be. */
    for (uint32_t s = 0; undo && s < S; s++)
        undo[nundo++] = s;
    if (undo && nundo)
        drops = shard_calls(r, t, f, undo, nundo, M_DROP, false, f->secret_id);
    for (uint32_t i = 0; i < nundo; i++) {
        grpc_status_code dc = drops ? drops[i].st.code : GRPC_STATUS_RESOURCE_EXHAUSTED;
        /* NOT_FOUND: never created; FAILED_PRECONDITION: another call's. */
        if (drops && (drops[i].rc == 0 || dc == GRPC_STATUS_NOT_FOUND ||
                      dc == GRPC_STATUS_FAILED_PRECONDITION))
            continue;
        const char *node = router_rpc__primary(t, f, undo[i]);
        log_error("create %s: rollback cannot drop shard %u on %s: %s", name,
                  undo[i], node, drops ? drops[i].st.message : "out of memory");
        if (off + 80 < sizeof left)
            off += (size_t)snprintf(left + off, sizeof left - off, "%s%u on %.64s",
                                    nleft ? ", " : "", undo[i], node);
        nleft++;
    }
    if (!undo)
        snprintf(left, sizeof left, "all (out of memory)");
    grpc_status_code code = first->st.code;
    if (router_node_down(code))
        code = GRPC_STATUS_UNAVAILABLE;
    rpc_status_set(st, code, "CreateFilter \"%s\": shard %u on node %s (group "
                      "%s): %s: %s; %zu of %u shards failed; %s%s%s", name, fs,
                      router_rpc__primary(t, f, fs), t->groups[f->group[fs]].name,
                      rpc_status_name(first->st.code), first->st.message, failed, S,
                      nleft || !undo ? "shards this call may have created could "
                                       "not be dropped: "
                                     : "the shards created by this call were "
                                       "dropped",
                      left, nleft || !undo ? "; drop the filter once they are "
                                             "reachable" : "");
    log_warn("%s", st->message);
    if (drops)
        router_rpc__multi_free(drops, nundo);
    free(undo);
}

int router_create_filter(struct router *r, const struct router_create *c,
                         struct router_filter_desc *out, struct rpc_status *st)
{
    struct topo *t = router_topo(r);
    uint8_t secret[BF_SECRET_LEN];
    struct rpc_multi *calls = NULL;
    struct router_filter *f = NULL;
    uint32_t S = c->shards;
    int rc = -1;

    memset(out, 0, sizeof *out);
    if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL, "cannot read random bytes");
        goto out;
    }
    /* A placement entry, not cached until every shard exists. */
    f = router_filter_add(r, c->name, secret, S, t, NULL);
    if (!f) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    router_filter_forget(r, c->name);
    calls = calloc(S, sizeof *calls);
    out->shard = calloc(S, sizeof *out->shard);
    if (!calls || !out->shard) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    snprintf(out->name, sizeof out->name, "%s", c->name);
    out->shards = S;
    uint64_t per_shard = rules_shard_capacity(c->capacity, S);
    for (uint32_t s = 0; s < S; s++) {
        Bloomgrid__V1__CreateShardRequest m = BLOOMGRID__V1__CREATE_SHARD_REQUEST__INIT;
        m.filter = (char *)c->name;
        m.shard_index = s;
        m.shard_count = S;
        m.kind = c->kind;
        m.capacity = per_shard;
        m.error_rate = c->error_rate;
        m.secret.data = secret;
        m.secret.len = sizeof secret;
        calls[s].req = router_rpc__pack_slice(&m.base);
        calls[s].resp = grpc_empty_slice();
        calls[s].ch = router_channel(r, router_rpc__primary(t, f, s));
        calls[s].method = M_CREATE;
        calls[s].timeout_ms = (int)r->cfg.node_timeout_ms;
        if (!calls[s].ch) {
            rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            S = s + 1;
            goto out;
        }
    }
    size_t failed = rpc_call_many(calls, S);
    if (failed == 0) {
        for (uint32_t s = 0; s < S; s++) {
            Bloomgrid__V1__InternalShardInfo *isi =
                bloomgrid__v1__internal_shard_info__unpack(
                    NULL, GRPC_SLICE_LENGTH(calls[s].resp),
                    GRPC_SLICE_START_PTR(calls[s].resp));
            if (isi) {
                shard_desc_from(&out->shard[s], isi, router_rpc__primary(t, f, s));
                bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
            }
            out->shard[s].index = s;
        }
        router_filter_unref(router_filter_add(r, c->name, secret, S, t, NULL));
        log_info("created filter %s: %u shards over %u groups", c->name, S,
                 t->ngroups);
        rc = 0;
        goto out;
    }
    rollback(r, t, f, c->name, calls, S, failed, st);
out:
    if (rc < 0)
        router_filter_desc_free(out);
    if (calls)
        router_rpc__multi_free(calls, S);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

/* Drop every shard named filter on the groups' primaries, whatever its
 * shard count or secret: what is left of a filter whose shard 0 is gone (a
 * rollback that could not reach every node, a drop cut short).  Returns how
 * many were dropped, or -1 with st set when a node could not be asked. */
static int sweep(struct router *r, const struct topo *t, const char *name,
                 struct rpc_status *st)
{
    unsigned G = t->ngroups;
    struct rpc_multi *calls = calloc(G, sizeof *calls);
    Bloomgrid__V1__ListShardsRequest lreq = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    int dropped = 0, rc = 0;

    if (!calls) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    for (unsigned g = 0; g < G; g++) {
        calls[g].req = router_rpc__pack_slice(&lreq.base);
        calls[g].resp = grpc_empty_slice();
        calls[g].ch = router_channel(r, t->groups[g].primary);
        calls[g].method = M_LIST;
        calls[g].timeout_ms = (int)r->cfg.node_timeout_ms;
    }
    for (unsigned g = 0; g < G; g++)
        if (!calls[g].ch) {
            router_rpc__multi_free(calls, G);
            rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            return -1;
        }
    rpc_call_many(calls, G);
    for (unsigned g = 0; g < G && rc == 0; g++) {
        const char *node = t->groups[g].primary;
        if (calls[g].rc != 0) {
            rpc_status_set(st, GRPC_STATUS_UNAVAILABLE, "DropFilter \"%s\": node %s "
                              "(group %s) cannot list its shards: %s: %s; retry "
                              "DropFilter to finish", name, node, t->groups[g].name,
                              rpc_status_name(calls[g].st.code), calls[g].st.message);
            rc = -1;
            break;
        }
        Bloomgrid__V1__ListShardsResponse *lr = bloomgrid__v1__list_shards_response__unpack(
            NULL, GRPC_SLICE_LENGTH(calls[g].resp), GRPC_SLICE_START_PTR(calls[g].resp));
        for (size_t k = 0; lr && k < lr->n_shards; k++) {
            const Bloomgrid__V1__InternalShardInfo *isi = lr->shards[k];
            if (!isi->filter || strcmp(isi->filter, name) != 0)
                continue;
            Bloomgrid__V1__ShardRef ref = BLOOMGRID__V1__SHARD_REF__INIT;
            ref.filter = (char *)name;
            ref.shard_index = isi->shard_index;
            ProtobufCMessage *resp = NULL;
            struct rpc_status rs;
            if (rpc_call(calls[g].ch, M_DROP, &ref.base,
                         &bloomgrid__v1__drop_shard_response__descriptor, &resp,
                         (int)r->cfg.node_timeout_ms, &rs) == 0) {
                protobuf_c_message_free_unpacked(resp, NULL);
                dropped++;
            } else if (rs.code != GRPC_STATUS_NOT_FOUND) {
                rpc_status_set(st, GRPC_STATUS_UNAVAILABLE, "DropFilter \"%s\": "
                                  "shard %u on node %s: %s: %s; retry DropFilter to "
                                  "finish", name, isi->shard_index, node,
                                  rpc_status_name(rs.code), rs.message);
                rc = -1;
                break;
            }
        }
        if (lr)
            bloomgrid__v1__list_shards_response__free_unpacked(lr, NULL);
    }
    router_rpc__multi_free(calls, G);
    return rc < 0 ? -1 : dropped;
}

int router_drop_filter(struct router *r, const char *name, struct rpc_status *st)
{
    struct topo *t = router_topo(r);
    struct router_filter *f = router_filter_lookup(r, t, name, st);
    uint32_t *list = NULL;
    int rc = -1;

    if (!f && st->code == GRPC_STATUS_NOT_FOUND) {
        /* No shard 0: sweep up any other shard of that name. */
        int n = sweep(r, t, name, st);
        if (n > 0) {
            log_info("dropped %d stray shards of filter %s", n, name);
            rc = 0;
        } else if (n == 0) {
            rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not "
                              "exist", name);
        }
        goto out;
    }
    if (!f)
        goto out;
    list = calloc(f->shards, sizeof *list);
    if (!list) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* Shard 0 last: while it exists, the filter can be found and dropped. */
    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0;
        if (pass == 0)
            for (uint32_t s = 1; s < f->shards; s++)
                list[n++] = s;
        else
            list[n++] = 0;
        if (!n)
            continue;
        struct rpc_multi *calls = shard_calls(r, t, f, list, n, M_DROP, false, 0);
        if (!calls) {
            rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < n; i++)
            if (calls[i].rc != 0 && calls[i].st.code != GRPC_STATUS_NOT_FOUND && !bad++)
                first = i;
        if (bad) {
            rpc_status_set(st, GRPC_STATUS_UNAVAILABLE,
                       "DropFilter \"%s\": shard %u on node %s: %s: %s; %zu shards "
                       "not dropped; retry DropFilter to finish", name, list[first],
                       router_rpc__primary(t, f, list[first]),
                       rpc_status_name(calls[first].st.code),
                       calls[first].st.message, bad);
            router_rpc__multi_free(calls, n);
            goto out;
        }
        router_rpc__multi_free(calls, n);
    }
    log_info("dropped filter %s (%u shards)", name, f->shards);
    rc = 0;
out:
    router_filter_forget(r, name);
    free(list);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

int router_describe_filter(struct router *r, const char *name,
                           struct router_filter_desc *out, struct rpc_status *st)
{
    struct topo *t = router_topo(r);
    struct router_filter *f = router_filter_lookup(r, t, name, st);
    uint32_t *list = NULL;
    struct rpc_multi *calls = NULL;
    int rc = -1;

    memset(out, 0, sizeof *out);
    if (!f)
        goto out;
    list = calloc(f->shards, sizeof *list);
    out->shard = calloc(f->shards, sizeof *out->shard);
    if (!list || !out->shard) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    for (uint32_t s = 0; s < f->shards; s++)
        list[s] = s;
    calls = shard_calls(r, t, f, list, f->shards, M_GET, true, 0);
    if (!calls) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    out->shards = f->shards;
    size_t notfound = 0;
    for (uint32_t s = 0; s < f->shards; s++) {
        const char *node = router_rpc__primary(t, f, s);
        Bloomgrid__V1__InternalShardInfo *isi = NULL;
        if (calls[s].rc == 0)
            isi = bloomgrid__v1__internal_shard_info__unpack(
                NULL, GRPC_SLICE_LENGTH(calls[s].resp),
                GRPC_SLICE_START_PTR(calls[s].resp));
        if (isi) {
            shard_desc_from(&out->shard[s], isi, node);
            bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
        } else {
            if (calls[s].rc == 0) {
                calls[s].st.code = GRPC_STATUS_INTERNAL;
                snprintf(calls[s].st.message, sizeof calls[s].st.message,
                         "shard info does not parse");
            }
            notfound += calls[s].st.code == GRPC_STATUS_NOT_FOUND;
            shard_desc_failed(&out->shard[s], s, node, &calls[s].st);
        }
    }
    if (notfound == f->shards) {
        router_filter_forget(r, name);
        rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist", name);
        goto out;
    }
    rc = 0;
out:
    if (rc < 0)
        router_filter_desc_free(out);
    if (calls)
        router_rpc__multi_free(calls, f->shards);
    free(list);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

static int desc_cmp(const void *a, const void *b)
{
    return strcmp(((const struct router_filter_desc *)a)->name,
                  ((const struct router_filter_desc *)b)->name);
}

int router_list_filters(struct router *r, struct router_filter_desc **out,
                        size_t *nout, struct rpc_status *st)
{
    struct topo *t = router_topo(r);
    unsigned G = t->ngroups;
    struct rpc_multi *calls = calloc(G, sizeof *calls);
    struct router_filter_desc *d = NULL;
    size_t nd = 0, cap = 0;
    int rc = -1;

    *out = NULL;
    *nout = 0;
    if (!calls) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    Bloomgrid__V1__ListShardsRequest lreq = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    for (unsigned g = 0; g < G; g++) {
        calls[g].req = router_rpc__pack_slice(&lreq.base);
        calls[g].resp = grpc_empty_slice();
        calls[g].ch = router_channel(r, t->groups[g].primary);
        calls[g].method = M_LIST;
        calls[g].timeout_ms = (int)r->cfg.node_timeout_ms;
        if (!calls[g].ch) {
            rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
    }
    rpc_call_many(calls, G);
    for (unsigned g = 0; g < G; g++) {
        if (calls[g].rc != 0) {
            log_warn("ListFilters: node %s (group %s): %s", t->groups[g].primary,
                     t->groups[g].name, calls[g].st.message);
            continue;
        }
        Bloomgrid__V1__ListShardsResponse *lr = bloomgrid__v1__list_shards_response__unpack(
            NULL, GRPC_SLICE_LENGTH(calls[g].resp), GRPC_SLICE_START_PTR(calls[g].resp));
        for (size_t k = 0; lr && k < lr->n_shards; k++) {
            const Bloomgrid__V1__InternalShardInfo *isi = lr->shards[k];
            if (!isi->filter || !isi->shard_count || isi->shard_count > ROUTER_MAX_SHARDS ||
                isi->shard_index >= isi->shard_count ||
                strlen(isi->filter) > ROUTER_NAME_MAX)
                continue;
            /* Only the group a shard is placed on counts (not strays). */
            if (topo_group_for(t, isi->filter, isi->shard_index) != g)
                continue;
            size_t j;
            for (j = 0; j < nd; j++)
                if (strcmp(d[j].name, isi->filter) == 0)
                    break;
            if (j == nd) {
                if (nd == cap) {
                    size_t nc = cap ? 2 * cap : 16;
                    struct router_filter_desc *p = realloc(d, nc * sizeof *p);
                    if (!p)
                        continue;
                    d = p;
                    cap = nc;
                }
                memset(&d[nd], 0, sizeof d[nd]);
                snprintf(d[nd].name, sizeof d[nd].name, "%s", isi->filter);
                d[nd].shards = isi->shard_count;
                d[nd].shard = calloc(isi->shard_count, sizeof *d[nd].shard);
                if (!d[nd].shard)
                    continue;
                nd++;
            }
            if (isi->shard_count != d[j].shards)
                continue;
            shard_desc_from(&d[j].shard[isi->shard_index], isi, t->groups[g].primary);
        }
        if (lr)
            bloomgrid__v1__list_shards_response__free_unpacked(lr, NULL);
    }
    /* Shards nobody reported. */
    for (size_t j = 0; j < nd; j++) {
        for (uint32_t s = 0; s < d[j].shards; s++) {
            struct router_shard_desc *sd = &d[j].shard[s];
            if (sd->ok)
                continue;
            unsigned g = topo_group_for(t, d[j].name, s);
            struct rpc_status rs = {.code = GRPC_STATUS_NOT_FOUND};
            if (calls[g].rc != 0)
                rs = calls[g].st;
            else
                snprintf(rs.message, sizeof rs.message, "shard %u is missing", s);
            shard_desc_failed(sd, s, t->groups[g].primary, &rs);
        }
    }
    qsort(d, nd, sizeof *d, desc_cmp);
    *out = d;
    *nout = nd;
    d = NULL;
    rc = 0;
out:
    if (calls)
        router_rpc__multi_free(calls, G);
    for (size_t j = 0; d && j < nd; j++)
        router_filter_desc_free(&d[j]);
    free(d);
    topo_unref(t);
    return rc;
}
