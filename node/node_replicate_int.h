/* node_replicate_int.h: what the parts of anti-entropy share
 * (node_replicate.c: the rounds, SYNCING, listings, re-creation, the
 * epoch check, the node as a whole; node_replicate_pull.c: the pullers,
 * their cursors and the probes; node_resync.c: an operator's Resync, run
 * on the replicate thread).  Not for other modules. */
#ifndef BLOOMGRID_NODE_REPLICATE_INT_H
#define BLOOMGRID_NODE_REPLICATE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "node.h"
#include "rpc_client.h"
#include "store.h"
#include "topo.h"

#define REPL_PULL_TIMEOUT_MS 10000
/* The health asked of every peer before a round lists or pulls: a peer
 * that does not answer within it is passed over for the round. */
#define REPL_PROBE_TIMEOUT_MS 500
/* The most page hashes a pull carries (8 bytes each; 64 Ki pages of 64 KiB
 * are a 4 GiB shard): a larger shard is pulled without them. */
#define REPL_HASHES_MAX 65536
#define REPL_RECREATE_DELAY_MS 2000
/* How often the peers' shards are listed to find missing ones (a listing
 * describes every shard, a count of its bits included: not every round). */
#define REPL_LIST_EVERY_MS 2000
#define REPL_LIST_TIMEOUT_MS 2000
/* While the epoch is not checked: how often the copies are asked. */
#define REPL_CHECK_EVERY_MS 200
/* A clean stop's last announcement, per peer. */
#define REPL_FAREWELL_TIMEOUT_MS 1000

/* What this node got last from one peer for one shard. */
struct repl_shard {
    char name[STORE_NAME_MAX + 1];   /* store name */
    char peer[TOPO_ADDR_MAX + 1];
    const void *sf_id;               /* the store filter it was got for */
    uint64_t epoch, version;         /* the peer's, for the next pull */
    uint64_t held;                   /* this copy's store version when the
                                        last pull started (it succeeded) */
    bool failing;                    /* last pull failed (logged once) */
    uint64_t full_ms;                /* start of the last full pull that
                                        counts towards leaving SYNCING (this
                                        sf_id; node_sync_now_ms), 0: none */
    char last_err[RPC_CLIENT_MSGLEN];
    struct repl_shard *next;
};

/* A member of the group: its channel and its puller, kept while it is a
 * member.  The list and the fields not under mu are the replicate
 * thread's. */
struct repl_peer {
    char addr[TOPO_ADDR_MAX + 1];
    struct rpc_channel *ch;
    struct node_replicate *r;
    pthread_t thread;                /* the puller (peer_main) */
    pthread_cond_t cond;             /* kicked or quit changed */
    bool kicked;                     /* under mu: a pass is due */
    bool busy;                       /* under mu: a pass runs */
    uint64_t topo_version;           /* under mu: the pass's */
    atomic_bool quit;                /* the puller is to end */
    bool answered;                   /* the last probe was answered */
    bool leaving;                    /* no longer a member: freed once idle */
    struct repl_peer *next;
};

/* A shard a peer holds and this node lacks, since first_ms. */
struct repl_missing {
    char name[STORE_NAME_MAX + 1];
    uint64_t first_ms;
    bool seen;                       /* in this round's listings */
    struct repl_missing *next;
};

struct node_replicate {
    struct node *n;
    pthread_t thread;
    pthread_mutex_t mu;              /* shards, and the peers' work */
    struct repl_peer *peers;
    struct repl_shard *shards;
    struct repl_missing *missing;
    uint64_t listed_ms;              /* last listing of the peers' shards */
    /* The epoch check (see the top of this file). */
    bool identity_read;              /* start_epoch and the group checked */
    bool verified;                   /* first answers of enough copies in */
    uint64_t start_epoch;            /* the directory's at the start */
    uint64_t bumped_ms;              /* last bump of the epoch */
    char heard[TOPO_MAX_COPIES][TOPO_ADDR_MAX + 1];   /* first answers in */
    unsigned nheard;
    bool joined;                     /* a joining member found complete */
    /* An operator's Resync (node_resync.c), queued under mu. */
    bool resync_queued;
    uint64_t resync_version;
    node_resync_done resync_done;
    void *resync_ctx;
};


/* node_replicate_pull.c.  Replicate thread only, unless said. */
/* The peer of address addr, with its channel and its puller (started
 * there), or NULL when out of memory. */
struct repl_peer *repl__peer_get(struct node_replicate *r, const char *addr);
struct rpc_channel *repl__peer_channel(struct node_replicate *r, const char *addr);
/* End p's puller (waiting for a pass that runs) and free p. */
void repl__peer_free(struct node_replicate *r, struct repl_peer *p);
/* Start a pass of p's puller, unless the last one still runs. */
void repl__peer_kick(struct node_replicate *r, struct repl_peer *p, uint64_t topo_version);
/* Ask every other member's health at once; down[m] for those that do not
 * answer. */
void repl__probe(struct node_replicate *r, const struct topo_group *grp, bool *down);
/* Drop the peers that left grp and the cursors of those peers and of
 * shards gone. */
void repl__prune(struct node_replicate *r, const struct topo_group *grp);
/* Set every peer's series (metrics.h). */
void repl__gauges_set(struct node_replicate *r);
/* (Any thread.)  A full pull of shard sf from peer on ch (since 0, with
 * the hashes of the pages held here when the shard is not too large), ORed
 * in through the durable path once it all came.  Returns 0 with *pages and
 * *bytes, 1 when there is nothing to pull (peer lacks the shard:
 * NOT_FOUND, or the shard's kind is not replicated), -1 with why. */
int repl__pull_full(struct rpc_channel *ch, const char *peer, struct store_filter *sf,
                    uint64_t topo_version, size_t *pages, uint64_t *bytes, char *why,
                    size_t whylen);

/* node_replicate.c (any thread). */
/* When shard sf was marked SYNCING, 0 when it is not listed. */
uint64_t repl__shard_listed(struct store_filter *sf);
/* Create shard sname (filter, index) as peer (on ch) describes it, SYNCING
 * (marked before it exists).  Returns 0 when created, 1 when not and
 * rightly so (dropped here, a kind that is not replicated, or created
 * meanwhile), -1 when peer's GetShard failed, -2 when this node could not
 * create it (why either way). */
int repl__create_shard(struct node *n, struct rpc_channel *ch, const char *peer,
                       const char *filter, unsigned index, const char *sname,
                       char *why, size_t whylen);
/* Every shard of the store SYNCING, durably (why is logged).  Returns 0 or
 * the first error. */
int repl__mark_all(struct node_replicate *r, const char *why);
/* N - W + 1 other copies of grp, or every other copy when fewer. */
unsigned repl__copies_needed(const struct topo_group *grp);

/* node_resync.c (replicate thread).  Run the queued Resync and call its
 * done; with stopping, only answer it UNAVAILABLE. */
void repl__resync_run(struct node_replicate *r, bool stopping);

#endif
