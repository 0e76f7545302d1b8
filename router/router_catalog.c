/* router_catalog: CreateFilter (all shards or none), DropFilter,
 * GetFilter and ListFilters over the nodes' internal service (see
 * router_nodes.h), which it calls through node_client (node_client.h: the
 * requests, and fan-outs of them); it reads the nodes' answers.
 *
 * Every catalog call goes to every copy of a shard's group (a fan: one
 * call per shard and copy, all at once).  A create must succeed on every
 * copy or is rolled back everywhere; a drop must reach every copy; a
 * describe or a list takes, per shard, the first copy (in topology order)
 * that answers.  Every request carries the router's topology version.
 * An undrop (CreateFilter with undrop) is a create that passes over copies
 * that are down while each shard keeps its write quorums: those copies
 * keep their tombstones until anti-entropy brings them the filter
 * (docs/REPLICATION.md, "Undoing a drop").
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "router_nodes.h"
#include "router_rpc.h"
#include "node_client.h"
#include "quorum.h"
#include "rpc_client.h"
#include "rules.h"
#include "store.h"
#include "topo.h"

#include <uthash.h>

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

/* One call per shard and copy of its group. */
struct fan {
    struct rpc_multi *calls;
    uint32_t *shard;            /* per call */
    const char **node;          /* per call: the copy's address */
    size_t n;
};

static void fan_free(struct fan *fn)
{
    if (fn->calls)
        node_client_multi_free(fn->calls, fn->n);
    free(fn->shard);
    free(fn->node);
    memset(fn, 0, sizeof *fn);
}

/* The request of one shard's calls. */
typedef grpc_slice (*fan_req_fn)(const void *ctx, uint32_t shard);

/* Send req(shard) to every copy of each shard in list[0..n) (list NULL:
 * shards 0..n-1) and collect.  Returns 0 or -ENOMEM (fn freed). */
static int fan_run(struct router *r, const struct topo *t, const struct router_filter *f,
                   const uint32_t *list, size_t n, enum node_client_method method,
                   fan_req_fn req,
                   const void *ctx, struct fan *fn)
{
    size_t total = 0;
    memset(fn, 0, sizeof *fn);
    for (size_t i = 0; i < n; i++)
        total += t->groups[f->group[list ? list[i] : i]].nmembers;
    fn->calls = calloc(total ? total : 1, sizeof *fn->calls);
    fn->shard = calloc(total ? total : 1, sizeof *fn->shard);
    fn->node = calloc(total ? total : 1, sizeof *fn->node);
    if (!fn->calls || !fn->shard || !fn->node)
        goto fail;
    for (size_t i = 0; i < n; i++) {
        uint32_t shard = list ? list[i] : (uint32_t)i;
        const struct topo_group *g = &t->groups[f->group[shard]];
        grpc_slice body = req(ctx, shard);
        /* Every member: a copy that joins a group holds its filters too. */
        for (unsigned c = 0; c < g->nmembers; c++) {
            node_client_multi_set(&fn->calls[fn->n], router_channel(r, topo_member(g, c)),
                                  method, grpc_slice_ref(body),
                                  (int)r->cfg.node_timeout_ms);
            fn->shard[fn->n] = shard;
            fn->node[fn->n] = topo_member(g, c);
            fn->n++;
        }
        grpc_slice_unref(body);
    }
    for (size_t i = 0; i < fn->n; i++)
        if (!fn->calls[i].ch)
            goto fail;
    node_client_multi_run(fn->calls, fn->n);
    return 0;
fail:
    fan_free(fn);
    return -ENOMEM;
}

struct ref_ctx {
    const struct router_filter *f;
    const struct topo *t;
    uint64_t secret_id;
    uint64_t generation;        /* DropShard: only shards of at least this */
    bool only_unwritten;        /* DropShard: only shards that took no key */
};

static grpc_slice get_req(const void *ctx, uint32_t s)
{
    const struct ref_ctx *x = ctx;
    struct node_client_ref ref = {.filter = x->f->name, .shard = s,
                                  .topology_version = x->t->version};
    return node_client_get_shard_req(&ref);
}

/* DropShard; secret_id (0: any) limits a drop to shards of that secret. */
static grpc_slice drop_req(const void *ctx, uint32_t s)
{
    const struct ref_ctx *x = ctx;
    struct node_client_ref ref = {.filter = x->f->name, .shard = s,
                                  .topology_version = x->t->version,
                                  .secret_id = x->secret_id, .generation = x->generation,
                                  .only_unwritten = x->only_unwritten};
    return node_client_drop_shard_req(&ref);
}

/* ListShards to every copy of every group: calls[] in group then copy
 * order, node[] their addresses, shard[] the group index. */
static int list_all(struct router *r, const struct topo *t, struct fan *fn)
{
    size_t total = 0;
    memset(fn, 0, sizeof *fn);
    for (unsigned g = 0; g < t->ngroups; g++)
        total += t->groups[g].ncopies;
    fn->calls = calloc(total, sizeof *fn->calls);
    fn->shard = calloc(total, sizeof *fn->shard);
    fn->node = calloc(total, sizeof *fn->node);
    if (!fn->calls || !fn->shard || !fn->node)
        goto fail;
    for (unsigned g = 0; g < t->ngroups; g++)
        for (unsigned c = 0; c < t->groups[g].ncopies; c++) {
            node_client_multi_set(&fn->calls[fn->n],
                                  router_channel(r, t->groups[g].copies[c]),
                                  NODE_CLIENT_LIST_SHARDS,
                                  node_client_list_shards_req(t->version),
                                  (int)r->cfg.node_timeout_ms);
            fn->shard[fn->n] = g;
            fn->node[fn->n] = t->groups[g].copies[c];
            fn->n++;
        }
    for (size_t i = 0; i < fn->n; i++)
        if (!fn->calls[i].ch)
            goto fail;
    node_client_multi_run(fn->calls, fn->n);
    return 0;
fail:
    fan_free(fn);
    return -ENOMEM;
}

/* The failure of a CreateFilter that tells most: one from a node that
 * answered (a bad parameter, a name taken) before one of a node that is
 * down or slow.  In an undrop (undrop set) ALREADY_EXISTS is no failure:
 * that copy holds the filter. */
static size_t telling_failure(const struct fan *fn, bool undrop)
{
    size_t first = SIZE_MAX;

    for (size_t i = 0; i < fn->n; i++) {
        if (fn->calls[i].rc == 0 ||
            (undrop && fn->calls[i].st.code == GRPC_STATUS_ALREADY_EXISTS))
            continue;
        if (first == SIZE_MAX || (router_node_down(fn->calls[first].st.code) &&
                                  !router_node_down(fn->calls[i].st.code)))
            first = i;
    }
    return first;
}

/* Undo a CreateFilter that failed on some copies: drop every shard on
 * every copy this call may have created (those that answered OK, and those
 * whose answer was lost with a node down or slow), each only if it has this
 * call's secret, so a shard of the same name that another call created
 * stays; an undrop's (generation set) only at that generation or later, so
 * a copy that held the filter before stays too; and only if it never took
 * a key (a client may have been told it is stored: such a shard stays, and
 * so does the filter, to be dropped by hand).  st gets the failure (and
 * its reason), and names any shard that could not be dropped. */
static void rollback(struct router *r, const struct topo *t,
                     const struct router_filter *f, const char *name,
                     const struct fan *made, uint32_t S, size_t failed,
                     uint64_t generation, struct rpc_status *st)
{
    size_t fi = telling_failure(made, generation != 0);
    const struct rpc_multi *first = &made->calls[fi];
    uint32_t fs = made->shard[fi];
    uint32_t *undo = calloc(S, sizeof *undo);
    struct fan drops = {0};
    struct ref_ctx x = {.f = f, .t = t, .secret_id = f->secret_id,
                        .generation = generation, .only_unwritten = true};
    char left[RPC_MSGLEN] = "";
    size_t nleft = 0, off = 0;
    bool asked = false;

    /* Every shard: one whose create failed may still have been created
     * (an answer lost to a deadline); a drop by secret leaves others' be. */
    for (uint32_t s = 0; undo && s < S; s++)
        undo[s] = s;
    if (undo)
        asked = fan_run(r, t, f, undo, S, NODE_CLIENT_DROP_SHARD, drop_req, &x,
                        &drops) == 0;
    for (size_t i = 0; asked && i < drops.n; i++) {
        grpc_status_code dc = drops.calls[i].st.code;
        /* NOT_FOUND: never created; SECRET_MISMATCH: another call's.  A
         * shard that took a key (FAILED_PRECONDITION without that reason)
         * stays and is named. */
        if (drops.calls[i].rc == 0 || dc == GRPC_STATUS_NOT_FOUND ||
            (dc == GRPC_STATUS_FAILED_PRECONDITION &&
             drops.calls[i].st.reason == RPC_REASON_SECRET_MISMATCH))
            continue;
        log_error("create %s: rollback cannot drop shard %u on %s: %s", name,
                  drops.shard[i], drops.node[i], drops.calls[i].st.message);
        if (off + 80 < sizeof left)
            off += (size_t)snprintf(left + off, sizeof left - off, "%s%u on %.64s",
                                    nleft ? ", " : "", drops.shard[i], drops.node[i]);
        nleft++;
    }
    if (!asked)
        snprintf(left, sizeof left, "all (out of memory)");
    grpc_status_code code = first->st.code;
    if (router_node_down(code))
        code = GRPC_STATUS_UNAVAILABLE;
    rpc_status_set(st, code, "CreateFilter \"%s\": shard %u on node %s (group "
                      "%s): %s: %s; %zu of %zu shard copies failed; %s%s%s", name, fs,
                      made->node[fi], t->groups[f->group[fs]].name,
                      rpc_status_name(first->st.code), first->st.message, failed,
                      made->n, nleft || !asked ? "shards this call may have created "
                                                 "could not be dropped: "
                                               : "the shards created by this call "
                                                 "were dropped",
                      left, nleft || !asked ? "; drop the filter once they are "
                                              "reachable" : "");
    if (!router_node_down(first->st.code))
        st->reason = first->st.reason;   /* DROPPED, SECRET_MISMATCH */
    log_warn("%s", st->message);
    fan_free(&drops);
    free(undo);
}

struct create_ctx {
    const struct router_create *c;
    const struct topo *t;
    const uint8_t *secret;
    uint64_t per_shard;
    uint64_t generation;        /* an undrop's, else 0 */
    uint32_t placement;         /* the filter's placement version */
};

static grpc_slice create_req(const void *ctx, uint32_t s)
{
    const struct create_ctx *x = ctx;
    struct node_client_shard sh = {.shard_index = s, .shard_count = x->c->shards,
                                   .kind = x->c->kind, .capacity = x->per_shard,
                                   .error_rate = x->c->error_rate,
                                   .placement = x->placement};
    memcpy(sh.secret, x->secret, BF_SECRET_LEN);
    /* A new filter: no write was ever acknowledged for this shard, so no
     * copy starts SYNCING (docs/REPLICATION.md).  A secret the caller gave
     * is a new filter too: a dropped one's is refused by the node's
     * tombstone, a live one's by ALREADY_EXISTS. */
    struct node_client_create c = {.filter = x->c->name, .sh = &sh,
                                   .topology_version = x->t->version,
                                   .new_filter = true,
                                   .undrop_generation = x->generation};
    return node_client_create_shard_req(&c);
}

/* An undrop's calls (one per shard and member, members in order): does
 * every shard have its write quorums among the copies that hold it now
 * (undropped, or held before: ALREADY_EXISTS)?  *refused counts the copies
 * that refused, *down those passed over (down or slow), *made those it
 * undropped.  Returns the first shard short of a quorum, or UINT32_MAX. */
static uint32_t undrop_short(const struct topo *t, const struct router_filter *f,
                             const struct fan *fn, size_t *refused, size_t *down,
                             size_t *made)
{
    uint32_t first_short = UINT32_MAX;
    unsigned m = 0, hc = 0, ho = 0;

    *refused = *down = *made = 0;
    for (size_t i = 0; i < fn->n; i++) {
        const struct topo_group *g = &t->groups[f->group[fn->shard[i]]];
        grpc_status_code code = fn->calls[i].rc == 0 ? GRPC_STATUS_OK
                                                     : fn->calls[i].st.code;
        bool holds = code == GRPC_STATUS_OK || code == GRPC_STATUS_ALREADY_EXISTS;
        m = i > 0 && fn->shard[i - 1] == fn->shard[i] ? m + 1 : 0;
        if (m == 0)
            hc = ho = 0;
        *made += code == GRPC_STATUS_OK;
        *down += !holds && router_node_down(code);
        *refused += !holds && !router_node_down(code);
        hc += holds && m < g->ncopies;
        ho += holds && (g->other_mask >> m & 1u);
        bool last = i + 1 == fn->n || fn->shard[i + 1] != fn->shard[i];
        if (last && first_short == UINT32_MAX && !quorum_write_met(g, hc, ho))
            first_short = fn->shard[i];
    }
    return first_short;
}

/* An undrop of a name that exists under another secret (or shard count)
 * is refused before anything changes; so is one whose surviving shard 0
 * is placed by another version than *placement (0: none asked; then it
 * takes shard 0's).  Returns 0, or -1 with st set. */
static int undrop_precheck(struct router *r, const struct topo *t,
                           const struct router_create *c, uint32_t *placement,
                           struct rpc_status *st)
{
    struct rpc_status ls;
    struct router_filter *had;

    router_filter_forget(r, c->name);
    if (!(had = router_filter_lookup(r, t, c->name, &ls))) {
        if (ls.reason != RPC_REASON_PLACEMENT_UNKNOWN)
            return 0;   /* absent, or shard 0 unreachable: the fan decides */
        *st = ls;
        return -1;
    }
    bool other = memcmp(had->secret, c->secret, BF_SECRET_LEN) != 0 ||
                 had->shards != c->shards;
    uint32_t held = had->placement;
    router_filter_unref(had);
    router_filter_forget(r, c->name);
    if (!other && *placement && topo_placement_norm(*placement) != held) {
        rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, "filter \"%s\": its "
                       "shard 0 that the drop did not reach is placed by "
                       "placement version %u, not %u as asked: not undropped",
                       c->name, held, topo_placement_norm(*placement));
        return -1;
    }
    if (!other) {
        *placement = held;
        return 0;
    }
    rpc_status_set(st, GRPC_STATUS_FAILED_PRECONDITION, "filter \"%s\" exists "
                   "under another secret or shard count (it was created again "
                   "after the drop): not undropped; drop it first, or restore "
                   "elsewhere", c->name);
    st->reason = RPC_REASON_SECRET_MISMATCH;
    return -1;
}

/* Every copy that created its shard must have recorded the placement
 * version asked: a node from before placement versions drops the field and
 * answers 0, and routers would then place the filter's shards by
 * rendezvous.  Such a copy's call is turned into a failure (the creation
 * is then rolled back).  Returns how many were. */
static size_t placement_unrecorded(struct fan *fn, uint32_t placement)
{
    size_t bad = 0;

    for (size_t i = 0; i < fn->n; i++) {
        struct rpc_multi *m = &fn->calls[i];
        if (m->rc != 0)
            continue;
        Bloomgrid__V1__InternalShardInfo *isi = bloomgrid__v1__internal_shard_info__unpack(
            NULL, GRPC_SLICE_LENGTH(m->resp), GRPC_SLICE_START_PTR(m->resp));
        uint32_t got = isi ? topo_placement_norm(isi->placement) : 0;
        if (isi)
            bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
        if (!isi || got == placement)
            continue;
        m->rc = -1;
        rpc_status_set(&m->st, GRPC_STATUS_FAILED_PRECONDITION, "the node recorded "
                       "placement version %u, not %u: it predates placement "
                       "versions; upgrade every node first, or create the filter "
                       "with placement 1 (docs/TOPOLOGY.md)", got, placement);
        bad++;
    }
    return bad;
}

/* A create of a name a filter has already: ALREADY_EXISTS before anything
 * changes.  The creation alone would find only shards of the same names (a
 * filter of one shard is named as the filter, the shards of one of more by
 * ".shard-i"), and so would make a second filter of another shard count
 * under the same name.  Two creations of one name with different counts
 * at once both pass it; the copies of shard 0's group, which is the same
 * group for every count, then take only one of them (a node refuses shard
 * 0 in the other form: node_rpc__create_begin) and the other rolls back.
 * Returns 0 (absent, or its shard 0 unreachable: the creation decides), or
 * -1 with st set. */
static int create_precheck(struct router *r, const struct topo *t,
                           const struct router_create *c, struct rpc_status *st)
{
    struct rpc_status ls;
    router_filter_forget(r, c->name);
    struct router_filter *had = router_filter_lookup(r, t, c->name, &ls);
    if (!had)
        return 0;
    rpc_status_set(st, GRPC_STATUS_ALREADY_EXISTS, "filter \"%s\" exists (%u shards)",
                   c->name, had->shards);
    router_filter_unref(had);
    return -1;
}

/* The time in microseconds: an undrop's generation, above those of the
 * undrops before it (each node also takes one above its tombstone's). */
static uint64_t undrop_generation(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* What one node of the groups would take of a new filter. */
struct node_need {
    const char *addr;
    const char *group;
    uint64_t bytes;             /* charges of its shards (store_charge) */
    uint32_t shards;
};

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* Does node i's answer leave room for what it would take?  Returns true,
 * or false with st set (RESOURCE_EXHAUSTED naming the node's budget). */
static bool need_fits(const char *name, const struct node_need *nd,
                      const Bloomgrid__V1__NodeInfoResponse *ni,
                      struct rpc_status *st)
{
    if (ni->max_memory_bytes &&
        (nd->bytes > ni->max_memory_bytes ||
         ni->charged_bytes > ni->max_memory_bytes - nd->bytes)) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "CreateFilter \"%s\": node %s (group %s) would exceed its "
                       "budget max_memory_mb = %llu: its %u shards of this filter "
                       "count %.1f MiB (bits and the copies the node keeps: "
                       "docs/SECURITY.md, Budgets) "
                       "and %.1f MiB are taken; ask for a smaller filter or add "
                       "groups; nothing was created", name, nd->addr, nd->group,
                       (unsigned long long)(ni->max_memory_bytes >> 20), nd->shards,
                       mib(nd->bytes), mib(ni->charged_bytes));
        return false;
    }
    if (ni->max_filters && ni->filters + nd->shards > ni->max_filters) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED,
                       "CreateFilter \"%s\": node %s (group %s) holds %llu "
                       "filters and shards of its budget max_filters = %llu, "
                       "and this filter would add %u; nothing was created",
                       name, nd->addr, nd->group, (unsigned long long)ni->filters,
                       (unsigned long long)ni->max_filters, nd->shards);
        return false;
    }
    return true;
}

/* The whole filter against the budgets of every node that would hold a
 * shard of it, before any shard is created: each node's NodeInfo says its
 * bounds and what is taken, store_charge what a shard of c would take
 * there.  A node that does not answer is left to the creation itself
 * (which then fails on it and is rolled back).  Returns 0, or -1 with st
 * set. */
static int budget_check(struct router *r, const struct topo *t,
                        const struct router_filter *f, const struct router_create *c,
                        uint64_t per_shard, struct rpc_status *st)
{
    struct bf_params p = {.kind = c->kind == 0 ? BF_KIND_BLOCKED : (enum bf_kind)c->kind,
                          .capacity = per_shard, .error_rate = c->error_rate,
                          .shard_count = c->shards};
    struct node_need *need = NULL;
    struct rpc_multi *calls = NULL;
    size_t nn = 0, cap = 0;
    uint64_t charge;
    int rc = 0;

    if (store_charge(&p, &charge) < 0)
        return 0;   /* the nodes refuse the parameters themselves */
    for (uint32_t s = 0; s < c->shards; s++) {
        const struct topo_group *g = &t->groups[f->group[s]];
        for (unsigned k = 0; k < g->ncopies; k++) {
            size_t i = 0;
            while (i < nn && strcmp(need[i].addr, g->copies[k]) != 0)
                i++;
            if (i == nn) {
                if (nn == cap) {
                    struct node_need *nv = realloc(need, (cap ? 2 * cap : 8) * sizeof *nv);
                    if (!nv)
                        goto nomem;
                    need = nv;
                    cap = cap ? 2 * cap : 8;
                }
                need[nn++] = (struct node_need){.addr = g->copies[k], .group = g->name};
            }
            need[i].bytes += charge;
            need[i].shards++;
        }
    }
    if (!(calls = calloc(nn ? nn : 1, sizeof *calls)))
        goto nomem;
    for (size_t i = 0; i < nn; i++) {
        node_client_multi_set(&calls[i], router_channel(r, need[i].addr),
                              NODE_CLIENT_NODE_INFO, node_client_node_info_req(),
                              (int)r->cfg.node_timeout_ms);
        if (!calls[i].ch) {
            node_client_multi_free(calls, i + 1);
            calls = NULL;
            goto nomem;
        }
    }
    node_client_multi_run(calls, nn);
    for (size_t i = 0; i < nn && rc == 0; i++) {
        if (calls[i].rc != 0)
            continue;
        Bloomgrid__V1__NodeInfoResponse *ni = bloomgrid__v1__node_info_response__unpack(
            NULL, GRPC_SLICE_LENGTH(calls[i].resp), GRPC_SLICE_START_PTR(calls[i].resp));
        if (ni && !need_fits(c->name, &need[i], ni, st))
            rc = -1;
        if (ni)
            bloomgrid__v1__node_info_response__free_unpacked(ni, NULL);
    }
    if (rc < 0)
        log_warn("%s", st->message);
    node_client_multi_free(calls, nn);
    free(need);
    return rc;
nomem:
    free(need);
    rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
}

uint32_t router_default_shards(struct router *r, int kind, uint64_t capacity,
                               double error_rate)
{
    uint64_t most = r->cfg.default_shards, per = r->cfg.default_shard_mb << 20;
    enum bf_kind k = kind == 0 ? BF_KIND_BLOCKED : (enum bf_kind)kind;
    struct bf_params p = {.kind = k, .capacity = capacity, .error_rate = error_rate};
    uint64_t bytes;

    if (!per || k == BF_KIND_SCALABLE || bf_params_bytes(&p, &bytes) < 0)
        return (uint32_t)most;   /* bad parameters: the creation says why */
    uint64_t n = bytes / per + (bytes % per != 0);
    struct topo *t = router_topo(r);
    if (n < t->ngroups)   /* a topology has at least one group */
        n = t->ngroups;
    topo_unref(t);
    return (uint32_t)(n < most ? n : most);
}

int router_create_filter(struct router *r, const struct router_create *c,
                         struct router_filter_desc *out, struct rpc_status *st)
{
    struct topo *t = router_topo(r);
    uint8_t secret[BF_SECRET_LEN];
    struct fan fn = {0};
    struct router_filter *f = NULL;
    uint32_t *list = NULL;
    uint32_t S = c->shards;
    int rc = -1;

    memset(out, 0, sizeof *out);
    uint32_t placement = c->placement;
    if (placement && !topo_placement_known(placement)) {
        rpc_status_set(st, GRPC_STATUS_INVALID_ARGUMENT, "placement version %u: "
                       "this router knows versions 1 to %u (docs/TOPOLOGY.md, "
                       "\"Placement versions\")", placement, TOPO_PLACEMENT_NEWEST);
        goto out;
    }
    if (c->undrop ? undrop_precheck(r, t, c, &placement, st) < 0
                  : create_precheck(r, t, c, st) < 0)
        goto out;
    if (!placement)
        placement = TOPO_PLACEMENT_NEWEST;
    if (c->secret) {
        memcpy(secret, c->secret, sizeof secret);
    } else if (getrandom(secret, sizeof secret, 0) != (ssize_t)sizeof secret) {
        rpc_status_set(st, GRPC_STATUS_INTERNAL, "cannot read random bytes");
        goto out;
    }
    /* A placement entry, not cached until every shard exists. */
    f = router_filter_add(r, c->name, secret, S, placement, t);
    if (!f) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    router_filter_forget(r, c->name);
    list = calloc(S, sizeof *list);
    out->shard = calloc(S, sizeof *out->shard);
    if (!list || !out->shard) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    snprintf(out->name, sizeof out->name, "%s", c->name);
    out->shards = S;
    out->placement = placement;
    for (uint32_t s = 0; s < S; s++)
        list[s] = s;
    struct create_ctx x = {.c = c, .t = t, .secret = secret,
                           .per_shard = rules_shard_capacity(c->capacity, S),
                           .generation = c->undrop ? undrop_generation() : 0,
                           .placement = placement};
    if (budget_check(r, t, f, c, x.per_shard, st) < 0)
        goto out;
    if (fan_run(r, t, f, list, S, NODE_CLIENT_CREATE_SHARD, create_req, &x, &fn) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    placement_unrecorded(&fn, placement);
    size_t failed = 0;
    for (size_t i = 0; i < fn.n; i++)
        failed += fn.calls[i].rc != 0;
    if (c->undrop) {
        size_t refused, down, made;
        uint32_t sh = undrop_short(t, f, &fn, &refused, &down, &made);
        if (refused || sh != UINT32_MAX) {
            rollback(r, t, f, c->name, &fn, S, refused + down, x.generation, st);
            goto out;
        }
        if (!made) {
            rpc_status_set(st, GRPC_STATUS_ALREADY_EXISTS, "filter \"%s\" exists "
                           "with this secret on every copy that answered: "
                           "nothing to undrop", c->name);
            goto out;
        }
        router_filter_unref(router_filter_add(r, c->name, secret, S, placement, t));
        log_info("undropped filter %s: %u shards, generation %llu, on %zu shard "
                 "copies; %zu held it already, %zu down (they keep their "
                 "tombstones until anti-entropy brings them the filter)",
                 c->name, S, (unsigned long long)x.generation, made,
                 fn.n - made - down, down);
        router_filter_desc_free(out);
        rc = router_describe_filter(r, c->name, out, st);
        goto out;
    }
    if (failed) {
        rollback(r, t, f, c->name, &fn, S, failed, 0, st);
        goto out;
    }
    for (size_t i = 0; i < fn.n; i++) {
        uint32_t s = fn.shard[i];
        if (out->shard[s].ok)
            continue;   /* described by an earlier copy */
        Bloomgrid__V1__InternalShardInfo *isi = bloomgrid__v1__internal_shard_info__unpack(
            NULL, GRPC_SLICE_LENGTH(fn.calls[i].resp), GRPC_SLICE_START_PTR(fn.calls[i].resp));
        if (isi) {
            shard_desc_from(&out->shard[s], isi, fn.node[i]);
            bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
        }
        out->shard[s].index = s;
    }
    router_filter_unref(router_filter_add(r, c->name, secret, S, placement, t));
    log_info("created filter %s: %u shards over %u groups (%zu shard copies), "
             "placement version %u", c->name, S, t->ngroups, fn.n, placement);
    rc = 0;
out:
    if (rc < 0)
        router_filter_desc_free(out);
    fan_free(&fn);
    free(list);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

/* Drop every shard named filter on every copy of every group, whatever its
 * shard count or secret: what is left of a filter whose shard 0 is gone (a
 * rollback that could not reach every node, a drop cut short).  Returns how
 * many were dropped, or -1 with st set when a node could not be asked. */
static int sweep(struct router *r, const struct topo *t, const char *name,
                 struct rpc_status *st)
{
    struct fan fn;
    int dropped = 0, rc = 0;

    if (list_all(r, t, &fn) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < fn.n && rc == 0; i++) {
        const char *node = fn.node[i];
        if (fn.calls[i].rc != 0) {
            rpc_status_set(st, GRPC_STATUS_UNAVAILABLE, "DropFilter \"%s\": node %s "
                              "(group %s) cannot list its shards: %s: %s; retry "
                              "DropFilter to finish", name, node,
                              t->groups[fn.shard[i]].name,
                              rpc_status_name(fn.calls[i].st.code),
                              fn.calls[i].st.message);
            rc = -1;
            break;
        }
        Bloomgrid__V1__ListShardsResponse *lr = bloomgrid__v1__list_shards_response__unpack(
            NULL, GRPC_SLICE_LENGTH(fn.calls[i].resp), GRPC_SLICE_START_PTR(fn.calls[i].resp));
        for (size_t k = 0; lr && k < lr->n_shards; k++) {
            const Bloomgrid__V1__InternalShardInfo *isi = lr->shards[k];
            if (!isi->filter || strcmp(isi->filter, name) != 0)
                continue;
            struct node_client_ref ref = {.filter = name, .shard = isi->shard_index,
                                          .topology_version = t->version};
            struct rpc_status rs;
            if (node_client_drop_shard(fn.calls[i].ch, &ref, (int)r->cfg.node_timeout_ms,
                                       &rs) == 0) {
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
    fan_free(&fn);
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
    struct ref_ctx x = {.f = f, .t = t};
    /* Shard 0 last: while it exists, the filter can be found and dropped. */
    for (int pass = 0; pass < 2; pass++) {
        size_t n = 0;
        struct fan fn;
        if (pass == 0)
            for (uint32_t s = 1; s < f->shards; s++)
                list[n++] = s;
        else
            list[n++] = 0;
        if (!n)
            continue;
        if (fan_run(r, t, f, list, n, NODE_CLIENT_DROP_SHARD, drop_req, &x, &fn) < 0) {
            rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto out;
        }
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < fn.n; i++)
            if (fn.calls[i].rc != 0 && fn.calls[i].st.code != GRPC_STATUS_NOT_FOUND &&
                !bad++)
                first = i;
        if (bad) {
            rpc_status_set(st, GRPC_STATUS_UNAVAILABLE,
                       "DropFilter \"%s\": shard %u on node %s: %s: %s; %zu shard "
                       "copies not dropped; retry DropFilter to finish", name,
                       fn.shard[first], fn.node[first],
                       rpc_status_name(fn.calls[first].st.code),
                       fn.calls[first].st.message, bad);
            fan_free(&fn);
            goto out;
        }
        fan_free(&fn);
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
    struct fan fn = {0};
    int rc = -1;

    memset(out, 0, sizeof *out);
    if (!f)
        goto out;
    out->shard = calloc(f->shards, sizeof *out->shard);
    if (!out->shard) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    struct ref_ctx x = {.f = f, .t = t};
    if (fan_run(r, t, f, NULL, f->shards, NODE_CLIENT_GET_SHARD, get_req, &x, &fn) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    snprintf(out->name, sizeof out->name, "%s", name);
    out->shards = f->shards;
    out->placement = f->placement;
    /* Per shard the first copy that answers; else the first copy's error,
     * NOT_FOUND when a copy said so and none has the shard. */
    bool *nf = calloc(f->shards, sizeof *nf);
    for (size_t i = 0; i < fn.n; i++) {
        uint32_t s = fn.shard[i];
        struct router_shard_desc *d = &out->shard[s];
        Bloomgrid__V1__InternalShardInfo *isi = NULL;
        if (d->ok)
            continue;
        if (fn.calls[i].rc == 0)
            isi = bloomgrid__v1__internal_shard_info__unpack(
                NULL, GRPC_SLICE_LENGTH(fn.calls[i].resp),
                GRPC_SLICE_START_PTR(fn.calls[i].resp));
        if (isi) {
            shard_desc_from(d, isi, fn.node[i]);
            bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
            continue;
        }
        if (fn.calls[i].rc == 0) {
            fn.calls[i].st.code = GRPC_STATUS_INTERNAL;
            snprintf(fn.calls[i].st.message, sizeof fn.calls[i].st.message,
                     "shard info does not parse");
        }
        if (nf && fn.calls[i].st.code == GRPC_STATUS_NOT_FOUND)
            nf[s] = true;
        if (!d->reason[0])
            shard_desc_failed(d, s, fn.node[i], &fn.calls[i].st);
    }
    size_t notfound = 0;
    for (uint32_t s = 0; nf && s < f->shards; s++)
        notfound += !out->shard[s].ok && nf[s];
    free(nf);
    if (notfound == f->shards) {
        router_filter_forget(r, name);
        rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist", name);
        goto out;
    }
    rc = 0;
out:
    if (rc < 0)
        router_filter_desc_free(out);
    fan_free(&fn);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}

/* The groups of a filter's shards as a listing meets them, one entry per
 * (name, shard count, placement version) reported. */
struct list_place {
    char key[ROUTER_NAME_MAX + 24];   /* name '/' shards '/' placement */
    uint16_t *group;            /* NULL: a version this router does not know */
    size_t desc;                /* its entry in the list, SIZE_MAX: none yet */
    UT_hash_handle hh;
};

static void list_place_free(struct list_place **tab)
{
    struct list_place *e, *tmp;

    HASH_ITER(hh, *tab, e, tmp) {
        HASH_DEL(*tab, e);
        free(e->group);
        free(e);
    }
}

/* The entry of isi's filter (made on first sight), or NULL when out of
 * memory. */
static struct list_place *list_place_get(struct list_place **tab, const struct topo *t,
                                         const Bloomgrid__V1__InternalShardInfo *isi)
{
    struct list_place *e;
    char key[sizeof e->key];

    snprintf(key, sizeof key, "%s/%u/%u", isi->filter, isi->shard_count,
             topo_placement_norm(isi->placement));
    HASH_FIND_STR(*tab, key, e);
    if (e)
        return e;
    if (!(e = calloc(1, sizeof *e)))
        return NULL;
    snprintf(e->key, sizeof e->key, "%s", key);
    e->desc = SIZE_MAX;
    if (topo_placement_known(isi->placement)) {
        e->group = malloc(isi->shard_count * sizeof *e->group);
        if (!e->group || topo_place(t, isi->filter, isi->shard_count,
                                    isi->placement, e->group) < 0) {
            free(e->group);
            free(e);
            return NULL;
        }
    }
    HASH_ADD_STR(*tab, key, e);
    return e;
}

/* The group of shard s of the listed filter d. */
static unsigned list_group(struct list_place *tab, const struct router_filter_desc *d,
                           uint32_t s)
{
    struct list_place *e;
    char key[sizeof e->key];

    snprintf(key, sizeof key, "%s/%u/%u", d->name, d->shards, d->placement);
    HASH_FIND_STR(tab, key, e);
    return e && e->group ? e->group[s] : 0;
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
    struct fan fn = {0};
    struct router_filter_desc *d = NULL;
    struct list_place *places = NULL;
    size_t nd = 0, cap = 0;
    int rc = -1;

    *out = NULL;
    *nout = 0;
    if (list_all(r, t, &fn) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* A group no copy of which answered would leave its filters out of
     * the list unseen: refuse instead, naming it. */
    for (unsigned g = 0; g < t->ngroups; g++) {
        size_t answered = 0, first = SIZE_MAX;
        for (size_t i = 0; i < fn.n; i++)
            if (fn.shard[i] == g) {
                answered += fn.calls[i].rc == 0;
                if (first == SIZE_MAX && fn.calls[i].rc != 0)
                    first = i;
            }
        if (!answered && first != SIZE_MAX) {
            rpc_status_set(st, GRPC_STATUS_UNAVAILABLE,
                           "cannot list every filter: no copy of group %s answered "
                           "(node %s: %s: %s)", t->groups[g].name, fn.node[first],
                           rpc_status_name(fn.calls[first].st.code),
                           fn.calls[first].st.message);
            goto out;
        }
    }
    for (size_t i = 0; i < fn.n; i++) {
        unsigned g = fn.shard[i];
        if (fn.calls[i].rc != 0) {
            log_warn("ListFilters: node %s (group %s): %s", fn.node[i],
                     t->groups[g].name, fn.calls[i].st.message);
            continue;
        }
        Bloomgrid__V1__ListShardsResponse *lr = bloomgrid__v1__list_shards_response__unpack(
            NULL, GRPC_SLICE_LENGTH(fn.calls[i].resp), GRPC_SLICE_START_PTR(fn.calls[i].resp));
        for (size_t k = 0; lr && k < lr->n_shards; k++) {
            const Bloomgrid__V1__InternalShardInfo *isi = lr->shards[k];
            if (!isi->filter || !isi->shard_count || isi->shard_count > ROUTER_MAX_SHARDS ||
                isi->shard_index >= isi->shard_count ||
                strlen(isi->filter) > ROUTER_NAME_MAX)
                continue;
            /* Only the group a shard is placed on counts (not strays).
             * Of a filter placed by a version this router does not know,
             * only shard 0 is found: it is on one group under every
             * version. */
            struct list_place *pl = list_place_get(&places, t, isi);
            if (!pl)
                continue;
            if (pl->group ? pl->group[isi->shard_index] != g
                          : isi->shard_index != 0 ||
                                topo_group_for(t, isi->filter, 0) != g)
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
                d[nd].placement = topo_placement_norm(isi->placement);
                d[nd].shard = calloc(isi->shard_count, sizeof *d[nd].shard);
                if (!d[nd].shard)
                    continue;
                pl->desc = nd++;
            }
            /* The first copy (in topology order) that reports it. */
            if (pl->desc != j || d[j].shard[isi->shard_index].ok)
                continue;
            shard_desc_from(&d[j].shard[isi->shard_index], isi, fn.node[i]);
        }
        if (lr)
            bloomgrid__v1__list_shards_response__free_unpacked(lr, NULL);
    }
    /* Shards nobody reported: the error of their group's first copy that
     * failed, or "missing" when every copy answered. */
    for (size_t j = 0; j < nd; j++) {
        if (!topo_placement_known(d[j].placement)) {
            struct rpc_status rs = {.code = GRPC_STATUS_FAILED_PRECONDITION};
            snprintf(rs.message, sizeof rs.message, "placement version %u is not "
                     "known to this router: upgrade it", d[j].placement);
            for (uint32_t s = 0; s < d[j].shards; s++)
                if (!d[j].shard[s].ok)
                    shard_desc_failed(&d[j].shard[s], s, d[j].shard[0].node, &rs);
            continue;
        }
        for (uint32_t s = 0; s < d[j].shards; s++) {
            struct router_shard_desc *sd = &d[j].shard[s];
            if (sd->ok)
                continue;
            unsigned g = list_group(places, &d[j], s);
            struct rpc_status rs = {.code = GRPC_STATUS_NOT_FOUND};
            const char *node = t->groups[g].copies[0];
            snprintf(rs.message, sizeof rs.message, "shard %u is missing", s);
            for (size_t i = 0; i < fn.n; i++)
                if (fn.shard[i] == g && fn.calls[i].rc != 0) {
                    rs = fn.calls[i].st;
                    node = fn.node[i];
                    break;
                }
            shard_desc_failed(sd, s, node, &rs);
        }
    }
    if (nd > 1)   /* d is NULL when there is nothing */
        qsort(d, nd, sizeof *d, desc_cmp);
    *out = d;
    *nout = nd;
    d = NULL;
    rc = 0;
out:
    fan_free(&fn);
    list_place_free(&places);
    for (size_t j = 0; d && j < nd; j++)
        router_filter_desc_free(&d[j]);
    free(d);
    topo_unref(t);
    return rc;
}

/* GetShard with the secret, for router_filter_complete. */
static grpc_slice get_secret_req(const void *ctx, uint32_t s)
{
    const struct ref_ctx *x = ctx;
    struct node_client_ref ref = {.filter = x->f->name, .shard = s,
                                  .topology_version = x->t->version,
                                  .placement_known = TOPO_PLACEMENT_NEWEST};
    return node_client_get_shard_secret_req(&ref);
}

int router_filter_complete(struct router *r, const char *name, uint8_t *secret,
                           struct rpc_status *st)
{
    struct topo *t = router_topo(r);
    struct router_filter *f = router_filter_lookup(r, t, name, st);
    unsigned *have = NULL, *have_other = NULL;
    struct fan fn = {0};
    int rc = -1;

    if (!f)
        goto out;
    have = calloc(f->shards, sizeof *have);
    have_other = calloc(f->shards, sizeof *have_other);
    if (!have || !have_other) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    struct ref_ctx x = {.f = f, .t = t};
    if (fan_run(r, t, f, NULL, f->shards, NODE_CLIENT_GET_SHARD, get_secret_req, &x, &fn) < 0) {
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto out;
    }
    /* The calls come shard by shard, each in member order (fan_run). */
    rc = 1;
    for (size_t i = 0, m = 0; i < fn.n && rc == 1; i++, m++) {
        const struct topo_group *g = &t->groups[f->group[fn.shard[i]]];
        if (i > 0 && fn.shard[i] != fn.shard[i - 1])
            m = 0;
        Bloomgrid__V1__InternalShardInfo *isi = NULL;
        if (fn.calls[i].rc == 0)
            isi = bloomgrid__v1__internal_shard_info__unpack(
                NULL, GRPC_SLICE_LENGTH(fn.calls[i].resp),
                GRPC_SLICE_START_PTR(fn.calls[i].resp));
        bool same = isi && isi->secret.len == BF_SECRET_LEN &&
                    memcmp(isi->secret.data, f->secret, BF_SECRET_LEN) == 0 &&
                    isi->shard_count == f->shards;
        bool down = !isi && fn.calls[i].rc != 0 &&
                    router_node_down(fn.calls[i].st.code);
        if (same) {
            if (m < g->ncopies)
                have[fn.shard[i]]++;
            if (g->other_mask & (1u << m))
                have_other[fn.shard[i]]++;
        } else if (!down) {
            rpc_status_set(st, GRPC_STATUS_UNAVAILABLE, "filter \"%s\" is not "
                           "complete: shard %u on %s %s", name, fn.shard[i],
                           fn.node[i], !isi ? fn.calls[i].st.message
                                            : "has another secret or shard count");
            rc = 0;
        }
        if (isi)
            bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
        bool last = i + 1 == fn.n || fn.shard[i + 1] != fn.shard[i];
        if (rc == 1 && last &&
            !quorum_write_met(g, have[fn.shard[i]], have_other[fn.shard[i]])) {
            rpc_status_set(st, GRPC_STATUS_UNAVAILABLE, "filter \"%s\": shard %u "
                           "is held by %u of the %u copies of group %s, fewer than "
                           "its write quorum (the others are down)", name,
                           fn.shard[i], have[fn.shard[i]], g->ncopies, g->name);
            rc = 0;
        }
    }
    if (rc == 0)
        router_filter_forget(r, name);
    else if (secret)
        memcpy(secret, f->secret, BF_SECRET_LEN);
out:
    fan_free(&fn);
    free(have);
    free(have_other);
    router_filter_unref(f);
    topo_unref(t);
    return rc;
}
