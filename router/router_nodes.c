/* router_nodes: what every call of the router to the nodes shares (see
 * router_nodes.h): whether a node is down, and the filter's secret, shard
 * count and placement, fetched from shard 0's group (GetShard, through
 * node_client.h) and cached.  The key path is router_keys.c, the catalog
 * calls router_catalog.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bloomgrid/v1/bloomgrid.pb-c.h"
#include "bloomgrid/v1/internal.pb-c.h"
#include "log.h"
#include "node_client.h"
#include "router_link.h"
#include "router_nodes.h"
#include "router_pool.h"
#include "router_rpc.h"
#include "rpc_client.h"

bool router_node_down(grpc_status_code c)
{
    return c == GRPC_STATUS_UNAVAILABLE || c == GRPC_STATUS_DEADLINE_EXCEEDED ||
           c == GRPC_STATUS_CANCELLED || c == GRPC_STATUS_UNKNOWN ||
           c == GRPC_STATUS_INTERNAL;
}

/* ---- filters: secret and shard count ---- */

/* Ask one node for shard 0 of name with its secret, shard count and
 * placement version. */
static int fetch_secret(struct router *r, const struct topo *t, const char *addr,
                        const char *name, uint8_t *secret, uint32_t *shards,
                        uint32_t *placement, struct rpc_status *rs)
{
    struct node_client_ref ref = {.filter = name, .shard = 0,
                                  .topology_version = t->version,
                                  .placement_known = TOPO_PLACEMENT_NEWEST};
    Bloomgrid__V1__InternalShardInfo *isi = NULL;
    struct rpc_channel *ch = router_channel(r, addr);
    if (!ch) {
        rs->code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(rs->message, sizeof rs->message, "out of memory");
        return -1;
    }
    if (node_client_get_shard_info(ch, &ref, &isi, (int)r->cfg.node_timeout_ms, rs) < 0)
        return -1;
    int rc = 0;
    if (isi->secret.len != BF_SECRET_LEN || isi->shard_count < 1 ||
        isi->shard_count > ROUTER_MAX_SHARDS ||
        (isi->hash_id && isi->hash_id != BF_HASH_XXH3_128)) {
        rs->code = GRPC_STATUS_UNAVAILABLE;
        snprintf(rs->message, sizeof rs->message,
                 "node %s describes shard 0 of filter \"%s\" without a usable "
                 "secret (%zu bytes, %u shards, hash %u); it is not ready", addr,
                 name, isi->secret.len, isi->shard_count, isi->hash_id);
        rc = -1;
    } else if (!topo_placement_known(isi->placement)) {
        /* Its other shards are not where this router would look: their
         * NOT_FOUND would read as "no such filter". */
        rpc_status_set(rs, GRPC_STATUS_FAILED_PRECONDITION,
                       "filter \"%s\" places its shards by placement version %u; "
                       "this router knows versions 1 to %u: upgrade it "
                       "(docs/TOPOLOGY.md, \"Placement versions\")", name,
                       isi->placement, TOPO_PLACEMENT_NEWEST);
        rs->reason = RPC_REASON_PLACEMENT_UNKNOWN;
        rc = -1;
    } else {
        memcpy(secret, isi->secret.data, BF_SECRET_LEN);
        *shards = isi->shard_count;
        *placement = isi->placement;
    }
    bloomgrid__v1__internal_shard_info__free_unpacked(isi, NULL);
    return rc;
}

/* The filter as this router knows it, fetching its secret from shard 0's
 * group (its copies in topology order, until one has it) when it is not
 * cached or is stale.  Shard 0 is on the same group under every placement
 * version (topo.h), so it is found before the version is known.  A copy
 * that answers NOT_FOUND may have lost its data: the filter does not exist
 * only when no copy has it and one said so.  A stale entry still serves
 * when no copy of that group answers.  A filter placed by a version this
 * router does not know is refused (FAILED_PRECONDITION, reason
 * PLACEMENT_UNKNOWN), never looked for elsewhere. */
struct router_filter *router_filter_lookup(struct router *r, const struct topo *t,
                                          const char *name, struct rpc_status *st)
{
    struct router_filter *stale = NULL;
    struct router_filter *f = router_filter_get(r, name, t, &stale);
    if (f)
        return f;
    const struct topo_group *g = &t->groups[topo_group_for(t, name, 0)];
    struct rpc_status rs = {0};
    uint8_t secret[BF_SECRET_LEN];
    uint32_t shards = 0, placement = 0;
    const char *addr = g->copies[0];
    int rc = -1;
    for (unsigned i = 0; rc < 0 && i < g->ncopies; i++) {
        struct rpc_status cs = {0};
        rc = fetch_secret(r, t, g->copies[i], name, secret, &shards, &placement,
                          &cs);
        /* Keep the error that tells most: NOT_FOUND only when every copy
         * said so. */
        if (rc < 0 && (i == 0 || rs.code == GRPC_STATUS_NOT_FOUND)) {
            rs = cs;
            addr = g->copies[i];
        }
    }
    if (rc < 0) {
        if (rs.code == GRPC_STATUS_NOT_FOUND) {
            router_filter_forget(r, name);
            router_filter_unref(stale);
            rpc_status_set(st, GRPC_STATUS_NOT_FOUND, "filter \"%s\" does not exist",
                       name);
            return NULL;
        }
        if (stale && router_node_down(rs.code)) {
            log_warn("cannot re-check filter %s on %s (%s); using the cached secret",
                     name, addr, rs.message);
            f = router_filter_add(r, name, stale->secret, stale->shards,
                                  stale->placement, (struct topo *)t);
            router_filter_unref(stale);
            if (!f)
                rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            return f;
        }
        router_filter_unref(stale);
        rpc_status_set(st, router_node_down(rs.code) ? GRPC_STATUS_UNAVAILABLE : rs.code,
                   "filter \"%s\": shard 0 on node %s (group %s): %s: %s", name,
                   addr, g->name, rpc_status_name(rs.code), rs.message);
        if (rs.reason == RPC_REASON_PLACEMENT_UNKNOWN) {
            /* Not cached, not forgotten: this router cannot use it. */
            st->reason = rs.reason;
            router_filter_forget(r, name);
        }
        return NULL;
    }
    if (stale && memcmp(stale->secret, secret, BF_SECRET_LEN) != 0)
        log_info("filter %s was re-created: new secret", name);
    if (stale && stale->placement != topo_placement_norm(placement))
        log_info("filter %s was re-created: placement version %u", name,
                 topo_placement_norm(placement));
    f = router_filter_add(r, name, secret, shards, placement, (struct topo *)t);
    router_filter_unref(stale);
    if (!f)
        rpc_status_set(st, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    return f;
}
