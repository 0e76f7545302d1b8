/* router: the state of one bloomgrid-router process shared by its handlers.
 *
 * The router owns
 *   - the current topology (swapped whole on SIGHUP; calls hold a reference
 *     to the one they started with, so a reload never disturbs them);
 *   - one link per node address (router_link.h: its gRPC channel and the
 *     batch streams), created on first use and kept for the life of the
 *     process (it reconnects after a node restarts); its answers are read
 *     by one of the server's loops, so a key call is served start to
 *     finish on its loop's thread when its nodes' links are on that loop;
 *   - a cache of filters it has seen: secret, shard count, placement version
 *     and the group of every shard under a topology.  Entries are immutable and reference
 *     counted; a stale one (older than secret_ttl_s, or computed for an older
 *     topology) is replaced, never changed in place;
 *   - a small pool of threads for the slow paths of key batches that may
 *     block (router_pool.h), never run on a link's thread.
 * Every function may be called from any thread.
 */
#ifndef BLOOMGRID_ROUTER_H
#define BLOOMGRID_ROUTER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "bf.h"
#include "router_config.h"
#include "router_link.h"
#include "rpc_client.h"
#include "rpc_server.h"
#include "rules.h"
#include "topo.h"

#define ROUTER_NAME_MAX RULES_FILTER_NAME_MAX     /* common/base/rules.h */
#define ROUTER_MAX_SHARDS RULES_SHARDS_MAX

/* One filter as the router knows it. */
struct router_filter {
    atomic_int refs;
    char name[ROUTER_NAME_MAX + 1];
    uint32_t shards;
    uint32_t placement;         /* the filter's placement version (topo.h),
                                   one this router knows, >= 1 */
    uint8_t secret[BF_SECRET_LEN];
    uint64_t secret_id;         /* XXH3-64 of the secret, checked by nodes */
    struct bf *hasher;          /* a one-bit-sized filter holding the secret */
    struct topo *topo;          /* the topology the placement is for (a ref) */
    uint16_t *group;            /* shards entries: index into topo->groups */
    time_t fetched;
};

struct router {
    struct router_config cfg;
    struct rpc_server *srv;
    struct router_pool *pool;   /* blocking slow paths (router_pool.h) */
    pthread_mutex_t lock;       /* guards the fields below up to filters */
    struct topo *topo;
    struct router_link **links;     /* one per node address */
    size_t nlinks, links_cap;
    bool links_closed;          /* router_close_links: no new ones */
    /* The links and the filter cache by name (name_index.h), looked up on
     * every key batch without r->lock: links are added under it, cache
     * entries replaced whole without it. */
    struct name_index *link_index;
    struct name_index *filters;     /* name -> struct router_filter (a ref) */
    atomic_uint read_rotation;  /* which copy a read asks first */
};

/* Set up with cfg (copied) and the topology already loaded (takes over its
 * reference, also on failure).  Returns 0 or -ENOMEM. */
int router_init(struct router *r, const struct router_config *cfg, struct topo *t);
/* Free channels, cache and topology.  No call may be running. */
void router_deinit(struct router *r);

/* Stop the pool and close every link (their streams end on the server's
 * loops, which must still run); router_node_link returns NULL from now on.
 * The server's drain hook (rpc_server_on_drain); router_deinit calls it
 * too.  arg: the router. */
void router_close_links(void *arg);

/* The current topology with a reference for the caller (topo_unref). */
struct topo *router_topo(struct router *r);

/* Re-read the topology file.  On error the old topology stays and err
 * (TOPO_ERRLEN) says why, naming the line.  Returns 0 or -EINVAL. */
int router_reload(struct router *r, char *err);

/* The link to a node address (created on first use, on one of the server's
 * loops in turn when it has loops; owned by the router, valid until
 * router_close_links).  NULL when out of memory or closing. */
struct router_link *router_node_link(struct router *r, const char *addr);

/* The channel of a node address: its link's (see router_node_link). */
struct rpc_channel *router_channel(struct router *r, const char *addr);

/* A cached filter with a reference for the caller, or NULL when it is not
 * cached, is older than secret_ttl_s, or was placed under another topology
 * than t (then *stale gets the old entry with a reference, or NULL). */
struct router_filter *router_filter_get(struct router *r, const char *name,
                                        const struct topo *t,
                                        struct router_filter **stale);

/* Build an entry for name (secret, shards) placed under t by placement
 * version placement (0 reads as 1; the caller checked that this router
 * knows it: topo_placement_known); the caller gets one reference and the
 * cache another.  NULL when out of memory. */
struct router_filter *router_filter_add(struct router *r, const char *name,
                                        const uint8_t *secret, uint32_t shards,
                                        uint32_t placement, struct topo *t);

/* The shard count of a cached filter, stale or not, with its placement
 * version in *placement (may be NULL); 0 when not cached.  Takes no
 * reference and makes no call. */
uint32_t router_filter_shards(struct router *r, const char *name,
                              uint32_t *placement);

/* Forget a filter (dropped, or a node said it does not exist). */
void router_filter_forget(struct router *r, const char *name);

void router_filter_unref(struct router_filter *f);

#endif
