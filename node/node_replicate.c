/* node_replicate: anti-entropy between the copies of a shard group
 * (setting topology; docs/REPLICATION.md).
 *
 * One thread wakes every replicate_interval_ms and has, for each other
 * copy of its group, that copy's puller (one thread per peer, made with
 * its channel) call PullPages for each blocked or classic shard this node
 * holds, with the epoch and version it got last from that copy (0 at
 * first, so the first pull after a start, or after the peer restarted
 * with a new epoch, ships every non-empty page): one cursor per peer and
 * shard.  The pull carries the hashes of this copy's pages
 * (store_pages_hashes), and the peer skips the pages that hash the same:
 * copies that took the same writes ship little; the merge of what came
 * (none included) returns once the bits here are durable.  The pages of a
 * pull are checked by their checksums
 * (node_client) and buffered; only when the whole pull succeeded and its
 * fingerprint is the shard's are they ORed in with store_pages_merge (the
 * durable path PushPages takes).  Nothing a peer claims is kept: no
 * version is reported from a pull, so a pull can only add bits.  A failed
 * pull changes nothing and is retried at the next wake-up; failures are
 * logged once per change of state.  A peer without the shard (NOT_FOUND) is
 * passed over.
 *
 * A peer that is down or hung (stopped, its port still open) must not hold
 * back the others: each round first asks every peer's health at once, with
 * a short deadline (REPL_PROBE_TIMEOUT_MS), and lists and pulls only from
 * those that answered; the pullers run side by side, so a peer that hangs
 * in the middle of a pull costs its own puller the pull's deadline and no
 * other peer anything; a puller still busy when a round starts is passed
 * over, and its pass ends at its first pull that finds the peer down.
 * Channels, pullers and cursors are dropped once their peer has left the
 * group (a topology reloaded by SIGHUP) or their shard is gone, so their
 * number follows the topology and the shards held.
 *
 * SYNCING shards (node_sync.h): each pull of a SYNCING shard from a peer
 * is a full one (since 0) until one succeeded that started after the shard
 * took writes and whose peer said it is not SYNCING itself; once N - W + 1
 * peers gave one, the shard leaves SYNCING (docs/REPLICATION.md says why
 * that number and that order).  Shards a peer holds and this node lacks
 * (ListShards, then GetShard with the secret) are created here SYNCING and
 * filled the same way, once a shard has been missing for
 * REPL_RECREATE_DELAY_MS (a router's CreateFilter reaches the copies one by
 * one) and unless it was dropped here: the store's durable tombstones, and
 * drops since start (repl_tombstoned).
 *
 * While the group changes its copies (copies_next or copies_prev), every
 * member is pulled from, but only full pulls from the group's copies
 * count towards leaving SYNCING (each version a member can meet needs W of
 * those copies for a write: docs/REPLICATION.md), and pulls carry the
 * topology version, so a peer under another version is not counted.  A
 * member that is not one of the copies (it joins) is held (reads refused,
 * NOT_SERVING) until N - W + 1 copies listed no shard it lacks and none of
 * its own is SYNCING: its health says when it may become a copy.
 *
 * Restored copies (node_sync.h, docs/REPLICATION.md): each listing
 * announces this directory's copy id and epoch to the copies, which answer
 * with the highest epoch of that id they heard before.  The epoch is bumped
 * (durably, then announced) every REPL_LIST_EVERY_MS and at a clean stop.
 * A peer's first answer since the start above the epoch the directory had
 * at the start (later ones: above the current epoch) means this node runs
 * on an older copy of its directory: every shard becomes SYNCING and the
 * epoch moves past what was heard.  Until the first answers of N - W + 1
 * copies are in, the node is held.
 *
 * Queries never wait for these threads: they hold no lock of their own
 * across a call (mu guards the cursors and the pullers' work; it may be
 * held while taking a store lock, never the reverse), and the store's
 * locks only for the OR itself.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <xxhash.h>

#include "bf.h"
#include "log.h"
#include "metrics.h"
#include "node.h"
#include "node_client.h"
#include "node_rpc.h"
#include "rpc_client.h"
#include "rules.h"
#include "store.h"
#include "topo.h"

#include "bloomgrid/v1/internal.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"

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
};

/* Pages of one pull, copied as they arrive. */
struct repl_buf {
    struct store_page *v;
    size_t n, cap;
};

static int buf_page(void *ctx, uint64_t offset, const uint8_t *data, size_t len)
{
    struct repl_buf *b = ctx;
    void *copy;

    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        void *nv = realloc(b->v, cap * sizeof *b->v);
        if (!nv)
            return -ENOMEM;
        b->v = nv;
        b->cap = cap;
    }
    if (!(copy = malloc(len ? len : 1)))
        return -ENOMEM;
    memcpy(copy, data, len);
    b->v[b->n++] = (struct store_page){.layer = 0, .offset = offset,
                                       .data = copy, .len = len};
    return 0;
}

static void buf_free(struct repl_buf *b)
{
    for (size_t i = 0; i < b->n; i++)
        free((void *)b->v[i].data);
    free(b->v);
}

static void *peer_main(void *arg);

/* The peer of address addr, with its channel and its puller (started
 * here), or NULL when out of memory.  Replicate thread only. */
static struct repl_peer *peer_get(struct node_replicate *r, const char *addr)
{
    struct repl_peer *p;

    for (p = r->peers; p && (p->leaving || strcmp(p->addr, addr)); p = p->next)
        ;
    if (p || !(p = calloc(1, sizeof *p)))
        return p;
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    p->r = r;
    pthread_cond_init(&p->cond, NULL);
    if (!(p->ch = rpc_channel_create(addr, r->n->cfg.max_message_size)))
        goto fail;
    if (pthread_create(&p->thread, NULL, peer_main, p) != 0) {
        log_warn("anti-entropy: no thread to pull from %s (retried next round)", addr);
        rpc_channel_destroy(p->ch);
        goto fail;
    }
    p->answered = true;    /* until a probe says otherwise (logged then) */
    p->next = r->peers;
    r->peers = p;
    return p;
fail:
    pthread_cond_destroy(&p->cond);
    free(p);
    return NULL;
}

static struct rpc_channel *peer_channel(struct node_replicate *r, const char *addr)
{
    struct repl_peer *p = peer_get(r, addr);
    return p ? p->ch : NULL;
}

/* End p's puller (waiting for a pass that runs: it ends at its next shard
 * or when its call does) and free p. */
static void peer_free(struct node_replicate *r, struct repl_peer *p)
{
    pthread_mutex_lock(&r->mu);
    atomic_store(&p->quit, true);
    pthread_cond_signal(&p->cond);
    pthread_mutex_unlock(&r->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cond);
    rpc_channel_destroy(p->ch);
    free(p);
}

/* The cursor of (name, peer) for the store filter sf, NULL when there is
 * none (pruned while a pull ran).  Caller holds mu. */
static struct repl_shard *shard_find(struct node_replicate *r, const char *name,
                                     const char *peer, const struct store_filter *sf)
{
    struct repl_shard *rs;

    for (rs = r->shards; rs && (strcmp(rs->name, name) || strcmp(rs->peer, peer));
         rs = rs->next)
        ;
    return rs && (!sf || rs->sf_id == (const void *)sf) ? rs : NULL;
}

/* The cursor of (name, peer), made (or reset, for another store filter
 * than it was got for) for sf.  Caller holds mu. */
static struct repl_shard *shard_state(struct node_replicate *r,
                                      const char *name, const char *peer,
                                      const struct store_filter *sf)
{
    struct repl_shard *rs = shard_find(r, name, peer, NULL);

    if (!rs && (rs = calloc(1, sizeof *rs))) {
        snprintf(rs->name, sizeof rs->name, "%s", name);
        snprintf(rs->peer, sizeof rs->peer, "%s", peer);
        rs->next = r->shards;
        r->shards = rs;
    }
    if (rs && rs->sf_id != (const void *)sf) {
        /* A new (or re-created) shard: start with a full pull. */
        rs->sf_id = sf;
        rs->epoch = rs->version = 0;
        rs->full_ms = 0;
    }
    return rs;
}

/* Log a failure only when it differs from the last one.  Caller holds mu. */
static void shard_fail(struct node_replicate *r, struct repl_shard *rs,
                       const char *msg)
{
    if (!rs->failing || strcmp(rs->last_err, msg) != 0)
        log_warn("anti-entropy %s from %s: %s (retrying every %" PRIu64 " ms)",
                 rs->name, rs->peer, msg,
                 r->n->cfg.replicate_interval_ms);
    rs->failing = true;
    snprintf(rs->last_err, sizeof rs->last_err, "%s", msg);
}

struct shard_id {
    uint32_t index, count;
    enum bf_kind kind;
    uint32_t layers;
    char fp[17];
};

static void id_read(const struct bf *f, void *ctx)
{
    struct shard_id *id = ctx;

    id->index = bf_shard_index(f);
    id->count = bf_shard_count(f);
    id->kind = bf_kind(f);
    id->layers = bf_layer_count(f);
    bf_fingerprint_id(f, id->fp);
}

/* When shard sf was marked SYNCING (node_sync_since), 0 when it is not
 * listed (a hold alone does not make pulls full). */
static uint64_t shard_listed(struct store_filter *sf)
{
    struct node_sync *ns = node_rpc__sync_get();
    struct shard_facts facts;

    if (!ns || node_sync_count(ns) == 0 || node_rpc__shard_facts(sf, &facts) < 0 ||
        !node_sync_listed(ns, store_filter_name(sf), facts.secret_id))
        return 0;
    return node_sync_since(ns, store_filter_name(sf));
}

/* Pages merged by one pull from peer (metrics.h). */
static void ae_metrics(const char *peer, size_t pages, uint64_t bytes)
{
    struct metrics *m = metrics_registry();
    const char *labels[] = {"peer", peer, NULL};
    metric_add(metrics_counter(m, "bloomgrid_antientropy_pages_total",
                               "pages pulled from the other copies of the group "
                               "and merged", labels), pages);
    metric_add(metrics_counter(m, "bloomgrid_antientropy_bytes_total",
                               "bytes of the pages pulled from the other copies",
                               labels), bytes);
    /* The lag of this copy behind peer: time() minus this, in a query. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    metric_set(metrics_gauge(m, "bloomgrid_antientropy_last_pull_timestamp_seconds",
                             "when a pull of a shard's changed pages from the peer "
                             "last succeeded (Unix time)", labels),
               (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
}

/* Pull shard sf's changed pages from peer p (on p's puller).  Returns
 * false when the peer is down or slow (the pass then ends). */
static bool replicate_shard(struct node_replicate *r, struct store_filter *sf,
                            struct repl_peer *p, uint64_t topo_version)
{
    const char *name = store_filter_name(sf), *peer = p->addr;
    char filter[STORE_NAME_MAX + 1], err[STORE_ERRLEN] = "";
    char msg[RPC_CLIENT_MSGLEN + STORE_ERRLEN] = "";
    struct rpc_status st = {0};
    struct node_client_pull_end end;
    struct repl_buf b = {0};
    struct shard_id id;
    struct repl_shard *rs;
    int rc;

    if (store_filter_inspect(sf, id_read, &id) < 0)
        return true;   /* not ready: the next wake-up tries again */
    if ((id.kind != BF_KIND_BLOCKED && id.kind != BF_KIND_CLASSIC) ||
        id.layers != 1)
        return true;   /* only kinds whose pages OR are replicated */
    unsigned index;
    if (rules_shard_split(name, filter, sizeof filter, &index) != (id.count > 1))
        return true;
    pthread_mutex_lock(&r->mu);
    uint64_t epoch = 0, version = 0, full_ms = 0;
    if ((rs = shard_state(r, name, peer, sf))) {
        epoch = rs->epoch;
        version = rs->version;
        full_ms = rs->full_ms;
    }
    pthread_mutex_unlock(&r->mu);
    if (!rs)
        return true;
    /* The shard was READY above, so it took writes before this pull
     * starts: a full pull now holds every write the peer acknowledged. */
    uint64_t since = shard_listed(sf);
    bool full = since && full_ms < since;
    uint64_t started = node_sync_now_ms();
    /* What this copy holds (taken before the pull: the peer's pages that
     * hash the same are held here), so that only the others travel. */
    size_t nhave = 0;
    uint64_t *have = NULL;
    if (store_pages_hashes(sf, NULL, 0, &nhave) == -ERANGE &&
        nhave <= REPL_HASHES_MAX && (have = malloc(nhave * sizeof *have)) &&
        store_pages_hashes(sf, have, nhave, &nhave) < 0)
        nhave = 0;
    int pulled = node_client_pull_holding(p->ch, topo_version, have, have ? nhave : 0,
                                          filter, id.index, full ? 0 : version,
                                          full ? 0 : epoch, buf_page, &b, &end,
                                          REPL_PULL_TIMEOUT_MS, &st);
    free(have);
    if (pulled < 0)
        snprintf(msg, sizeof msg, "PullPages: %s: %s", rpc_status_name(st.code),
                 st.message);
    else if (strcmp(end.fp, id.fp) != 0)
        snprintf(msg, sizeof msg, "pages of fingerprint \"%s\" refused: the "
                 "shard's is \"%s\"", end.fp, id.fp);
    /* Source version 0: a copy never reports what a peer covers. */
    else if ((rc = store_pages_merge(sf, b.v, b.n, 0, err)) < 0)
        snprintf(msg, sizeof msg, "%s", err[0] ? err : strerror(-rc));
    else
        ae_metrics(peer, b.n, end.bytes);

    pthread_mutex_lock(&r->mu);
    /* Gone while the pull ran (shard dropped, peer left): nothing to keep. */
    rs = shard_find(r, name, peer, sf);
    if (rs && msg[0]) {
        shard_fail(r, rs, msg);
        /* The peer restarted or re-created it: start again from 0. */
        if (st.code == GRPC_STATUS_NOT_FOUND)
            rs->epoch = rs->version = 0;
    } else if (rs) {
        if (rs->failing)
            log_info("anti-entropy %s from %s: resumed", name, peer);
        rs->failing = false;
        if (b.n || end.epoch != rs->epoch)
            log_debug("anti-entropy %s from %s: %zu pages (%" PRIu64 " bytes)",
                      name, peer, b.n, end.bytes);
        rs->epoch = end.epoch;
        rs->version = end.version;
        if (full && !end.syncing && started >= since)
            rs->full_ms = started;
    }
    pthread_mutex_unlock(&r->mu);
    buf_free(&b);
    return st.code != GRPC_STATUS_UNAVAILABLE && st.code != GRPC_STATUS_DEADLINE_EXCEEDED;
}

/* One pass of p's puller: every shard held, until the peer is found down
 * (the rest waits for the next round). */
static void peer_pass(struct node_replicate *r, struct repl_peer *p, uint64_t topo_version)
{
    struct store *s = node_store(r->n);
    char **names = NULL;
    size_t nn = 0;

    if (!s || store_list(s, &names, &nn) < 0)
        return;
    bool reachable = true;
    for (size_t i = 0; i < nn && reachable && !atomic_load(&r->n->stopping) &&
                       !atomic_load(&p->quit); i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        reachable = replicate_shard(r, sf, p, topo_version);
        store_put(sf);
    }
    store_list_free(names, nn);
}

/* p's puller: a pass each time the replicate thread kicks it. */
static void *peer_main(void *arg)
{
    struct repl_peer *p = arg;
    struct node_replicate *r = p->r;

    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!p->kicked && !atomic_load(&p->quit))
            pthread_cond_wait(&p->cond, &r->mu);
        if (atomic_load(&p->quit))
            break;
        p->kicked = false;
        p->busy = true;
        uint64_t v = p->topo_version;
        pthread_mutex_unlock(&r->mu);
        peer_pass(r, p, v);
        pthread_mutex_lock(&r->mu);
        p->busy = false;
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Start a pass of p's puller, unless the last one still runs (a slow
 * peer is not waited for). */
static void peer_kick(struct node_replicate *r, struct repl_peer *p, uint64_t topo_version)
{
    pthread_mutex_lock(&r->mu);
    if (!p->busy && !p->kicked) {
        p->kicked = true;
        p->topo_version = topo_version;
        pthread_cond_signal(&p->cond);
    }
    pthread_mutex_unlock(&r->mu);
}

/* Is addr one of grp's copies (not only a member of its other set)? */
static bool is_copy(const struct topo_group *grp, const char *addr)
{
    for (unsigned c = 0; c < grp->ncopies; c++)
        if (strcmp(grp->copies[c], addr) == 0)
            return true;
    return false;
}

/* How many copies other than this node answer for the group: N - W + 1,
 * or every other copy when there are fewer (W = 1). */
static unsigned copies_needed(const struct topo_group *grp)
{
    unsigned others = 0;
    for (unsigned c = 0; c < grp->ncopies; c++)
        others += !node_rpc__is_self(grp->copies[c]);
    unsigned need = grp->ncopies - grp->write_quorum + 1;
    return need < others ? need : others;
}

/* Has the shard left SYNCING?  It has when full pulls (full_ms) from
 * N - W + 1 of the group's copies succeeded for the shard object sf since
 * it was marked. */
static void sync_check(struct node_replicate *r, struct store_filter *sf,
                       const struct topo_group *grp)
{
    const char *name = store_filter_name(sf);
    char err[NODE_SYNC_ERRLEN] = "";
    unsigned need = grp->ncopies - grp->write_quorum + 1, got = 0;
    struct shard_facts facts;

    uint64_t since = shard_listed(sf);
    if (!since)
        return;
    pthread_mutex_lock(&r->mu);
    for (struct repl_shard *rs = r->shards; rs; rs = rs->next)
        if (rs->sf_id == (const void *)sf && rs->full_ms >= since &&
            !strcmp(rs->name, name) && is_copy(grp, rs->peer))
            got++;
    pthread_mutex_unlock(&r->mu);
    if (got < need || node_rpc__shard_facts(sf, &facts) < 0)
        return;
    if (node_sync_clear(node_rpc__sync_get(), name, facts.secret_id, err) < 0)
        log_warn("shard %s filled but still SYNCING: %s", name, err);
    else
        log_info("shard %s left SYNCING: every page pulled from %u copies "
                 "that are not syncing", name, got);
}

/* Is (store name, secret id) a dropped shard that must not come back?
 * Until the store keeps durable tombstones, only drops made on this node
 * since it started are known. */
static bool repl_tombstoned(struct node_replicate *r, const char *name,
                            uint64_t secret_id)
{
    return store_dropped(node_store(r->n), name, secret_id, NULL) ||
           node_sync_dropped(node_rpc__sync_get(), name, secret_id);
}

/* Create shard (filter, index) as peer holds it, SYNCING. */
static void recreate_shard(struct node_replicate *r, struct rpc_channel *ch,
                           const char *peer, const char *filter, unsigned index,
                           const char *sname)
{
    struct store *s = node_store(r->n);
    struct node_client_shard sh;
    struct rpc_status st = {0};
    char err[STORE_ERRLEN] = "";
    struct bf *f;

    if (node_client_get_shard(ch, filter, index, &sh, REPL_LIST_TIMEOUT_MS, &st) < 0)
        return;
    uint64_t id = XXH3_64bits(sh.secret, BF_SECRET_LEN);
    if ((sh.kind != BF_KIND_BLOCKED && sh.kind != BF_KIND_CLASSIC) ||
        repl_tombstoned(r, sname, id))
        return;
    if (!(f = node_client_shard_filter(&sh, err))) {
        log_warn("anti-entropy: shard %s of %s not re-created: %s", sname, peer, err);
        return;
    }
    /* SYNCING before it exists: it never answers a read it cannot vouch for. */
    if (node_sync_mark(node_rpc__sync_get(), sname, id, err) < 0) {
        log_warn("anti-entropy: shard %s not re-created: %s", sname, err);
        bf_destroy(f);
        return;
    }
    if (store_create_from(s, sname, f, err) < 0) {
        bf_destroy(f);
        node_sync_clear(node_rpc__sync_get(), sname, id, NULL);
        log_warn("anti-entropy: shard %s not re-created: %s", sname, err);
        return;
    }
    log_info("anti-entropy: re-created shard %s, which %s holds, SYNCING "
             "until it has pulled its group's pages", sname, peer);
}

static struct repl_missing *missing_note(struct node_replicate *r, const char *name)
{
    struct repl_missing *m;

    for (m = r->missing; m && strcmp(m->name, name); m = m->next)
        ;
    if (!m && (m = calloc(1, sizeof *m))) {
        snprintf(m->name, sizeof m->name, "%s", name);
        m->first_ms = node_sync_now_ms();
        m->next = r->missing;
        r->missing = m;
    }
    if (m)
        m->seen = true;
    return m;
}

/* Mark every shard of the store SYNCING, durably.  Returns 0 or the
 * first error (logged). */
static int mark_all(struct node_replicate *r, const char *why)
{
    struct store *s = node_store(r->n);
    char **names = NULL, err[NODE_SYNC_ERRLEN] = "";
    size_t nn = 0;
    int rc = 0;

    if (store_list(s, &names, &nn) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < nn && rc == 0; i++) {
        struct store_filter *sf = store_get(s, names[i]);
        struct shard_facts facts;
        if (!sf)
            continue;
        if (node_rpc__shard_facts(sf, &facts) == 0 &&
            (rc = node_sync_mark(node_rpc__sync_get(), names[i], facts.secret_id,
                                 err)) < 0)
            log_error("shard %s: cannot mark it SYNCING: %s", names[i], err);
        store_put(sf);
    }
    store_list_free(names, nn);
    if (rc == 0 && nn)
        log_warn("every shard (%zu) is SYNCING: %s", nn, why);
    return rc;
}

/* Once the store is open: the directory's epoch at the start, and the
 * group it was a copy of (another group's directory vouches for nothing
 * here).  Returns false until it could be done. */
static bool identity_read(struct node_replicate *r, const struct topo_group *grp)
{
    struct node_sync *ns = node_rpc__sync_get();
    struct node_sync_copy c;
    char err[NODE_SYNC_ERRLEN] = "", why[256];

    if (r->identity_read)
        return true;
    if (!ns || !node_store(r->n))
        return false;
    node_sync_copy_get(ns, &c);
    if (c.group[0] && strcmp(c.group, grp->name) != 0) {
        snprintf(why, sizeof why, "the data directory was a copy of group %s, "
                 "this node is one of group %s", c.group, grp->name);
        if (mark_all(r, why) < 0)
            return false;
    }
    if (node_sync_copy_set(ns, c.epoch, grp->name, err) < 0) {
        log_warn("cannot record this copy's group: %s", err);
        return false;
    }
    r->start_epoch = c.epoch;
    r->identity_read = true;
    return true;
}

/* Raise this copy's epoch by one, durably (before any peer hears of it). */
static void epoch_bump(struct node_replicate *r, const struct topo_group *grp)
{
    struct node_sync *ns = node_rpc__sync_get();
    struct node_sync_copy c;
    char err[NODE_SYNC_ERRLEN] = "";

    node_sync_copy_get(ns, &c);
    if (node_sync_copy_set(ns, c.epoch + 1, grp->name, err) < 0)
        log_warn("cannot raise this copy's epoch: %s", err);
    r->bumped_ms = node_sync_now_ms();
}

/* What copy peer answered about this directory's epoch: heard, the highest
 * epoch of its id it had heard before the call. */
static void epoch_heard(struct node_replicate *r, const struct topo_group *grp,
                        const char *peer, uint64_t heard)
{
    struct node_sync *ns = node_rpc__sync_get();
    struct node_sync_copy c;
    char err[NODE_SYNC_ERRLEN] = "", why[256];
    unsigned i;

    for (i = 0; i < r->nheard && strcmp(r->heard[i], peer); i++)
        ;
    bool first = i == r->nheard;
    node_sync_copy_get(ns, &c);
    /* A first answer may know epochs of the runs before this one only;
     * later ones also those this run announced, which are <= c.epoch. */
    if (heard > (first ? r->start_epoch : c.epoch)) {
        snprintf(why, sizeof why, "copy %s heard epoch %" PRIu64 " of this data "
                 "directory, which started at %" PRIu64 ": it runs on an older "
                 "copy of its directory (a restored backup)", peer, heard,
                 r->start_epoch);
        log_error("%s", why);
        if (mark_all(r, why) < 0)
            return;    /* the next answer tries again */
        /* From here the directory is current again (every shard SYNCING). */
        if (node_sync_copy_set(ns, heard + 1, grp->name, err) < 0) {
            log_warn("cannot raise this copy's epoch: %s", err);
            return;
        }
        r->start_epoch = heard + 1;
    }
    if (first && r->nheard < TOPO_MAX_COPIES)
        snprintf(r->heard[r->nheard++], TOPO_ADDR_MAX + 1, "%s", peer);
    if (!r->verified && r->nheard >= copies_needed(grp)) {
        r->verified = true;
        node_sync_hold(ns, NODE_SYNC_HOLD_EPOCH, false);
        log_info("epoch %" PRIu64 " of this copy checked with %u copies: it "
                 "holds what it acknowledged", c.epoch, r->nheard);
    }
}

/* ListShards on peer, announcing this copy; *resp (freed by the caller)
 * or NULL.  Returns false when peer is down. */
static bool list_peer(struct node_replicate *r, const struct topo_group *grp,
                      uint64_t topo_version, const char *peer, int timeout_ms,
                      Bloomgrid__V1__ListShardsResponse **resp)
{
    Bloomgrid__V1__ListShardsRequest req = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    struct rpc_channel *ch = peer_channel(r, peer);
    struct rpc_status st = {0};
    struct node_sync_copy c;

    *resp = NULL;
    node_sync_copy_get(node_rpc__sync_get(), &c);
    req.topology_version = topo_version;
    req.group = (char *)grp->name;
    req.copy_id = c.id;
    req.copy_epoch = c.epoch;
    if (!ch || rpc_call(ch, "/bloomgrid.v1.Internal/ListShards", &req.base,
                        &bloomgrid__v1__list_shards_response__descriptor,
                        (ProtobufCMessage **)resp, timeout_ms, &st) < 0) {
        log_debug("ListShards of %s: %s: %s", peer, rpc_status_name(st.code),
                  st.message);
        *resp = NULL;
        return st.code != GRPC_STATUS_UNAVAILABLE &&
               st.code != GRPC_STATUS_DEADLINE_EXCEEDED;
    }
    epoch_heard(r, grp, peer, (*resp)->heard_epoch);
    return true;
}

/* Shards a listing of peer holds that this node lacks: noted, re-created
 * once they have been missing long enough.  Returns how many are missing. */
static unsigned recreate_from(struct node_replicate *r, const char *peer,
                              const Bloomgrid__V1__ListShardsResponse *resp)
{
    struct store *s = node_store(r->n);
    struct rpc_channel *ch = peer_channel(r, peer);
    unsigned missing = 0;

    for (size_t i = 0; ch && i < resp->n_shards && !atomic_load(&r->n->stopping); i++) {
        const Bloomgrid__V1__InternalShardInfo *isi = resp->shards[i];
        char sname[STORE_NAME_MAX + 1];
        struct store_filter *sf;
        if (!isi->filter || rules_shard_name(sname, sizeof sname, isi->filter,
                                             isi->shard_index,
                                             isi->shard_count ? isi->shard_count : 1,
                                             NULL) < 0)
            continue;
        if ((sf = store_get(s, sname))) {
            store_put(sf);
            continue;
        }
        /* Dropped here (the drop has not reached peer yet): not missing,
         * never re-created. */
        const char *fp = isi->info && isi->info->fingerprint ? isi->info->fingerprint
                                                             : NULL;
        if (fp && fp[0] && store_dropped(s, sname, 0, fp))
            continue;
        missing++;
        struct repl_missing *m = missing_note(r, sname);
        if (m && node_sync_now_ms() - m->first_ms >= REPL_RECREATE_DELAY_MS)
            recreate_shard(r, ch, peer, isi->filter, isi->shard_index, sname);
    }
    return missing;
}
/* Forget shards no peer listed this round (created here or dropped). */
static void missing_sweep(struct node_replicate *r)
{
    for (struct repl_missing **p = &r->missing; *p;) {
        struct repl_missing *m = *p;
        if (!m->seen) {
            *p = m->next;
            free(m);
            continue;
        }
        m->seen = false;
        p = &m->next;
    }
}

/* Is a listing of the copies' shards due: every REPL_LIST_EVERY_MS, or
 * every REPL_CHECK_EVERY_MS while the epoch is not checked? */
static bool list_due(const struct node_replicate *r)
{
    return node_sync_now_ms() - r->listed_ms >=
           (r->verified ? REPL_LIST_EVERY_MS : REPL_CHECK_EVERY_MS);
}

/* List the shards of the group's copies that are not down (announcing
 * this copy); down[m] is set for members found down. */
static void list_round(struct node_replicate *r, const struct topo *t,
                       const struct topo_group *grp, bool *down)
{
    struct node_sync *ns = node_rpc__sync_get();
    uint64_t now = node_sync_now_ms();
    bool self_copy = false;
    unsigned listed = 0, missing = 0;

    r->listed_ms = now;
    for (unsigned c = 0; c < grp->ncopies; c++)
        self_copy |= node_rpc__is_self(grp->copies[c]);
    if (!self_copy && !r->joined)
        node_sync_hold(ns, NODE_SYNC_HOLD_JOINING, true);
    if (now - r->bumped_ms >= REPL_LIST_EVERY_MS)
        epoch_bump(r, grp);
    for (unsigned c = 0; c < grp->ncopies; c++) {
        Bloomgrid__V1__ListShardsResponse *resp = NULL;
        /* Copies come first among the members: down[c] is copy c's. */
        if (down[c] || node_rpc__is_self(grp->copies[c]))
            continue;
        down[c] = !list_peer(r, grp, t->version, grp->copies[c], REPL_LIST_TIMEOUT_MS,
                             &resp);
        if (!resp)
            continue;
        listed++;
        missing += recreate_from(r, grp->copies[c], resp);
        protobuf_c_message_free_unpacked(&resp->base, NULL);
    }
    missing_sweep(r);
    /* A member joining the copies may become one once enough copies listed
     * nothing it lacks and none of its shards is SYNCING. */
    bool ready = self_copy || (listed >= copies_needed(grp) && missing == 0 &&
                               node_sync_count(ns) == 0);
    if (ready != r->joined && !self_copy)
        log_info("joining group %s: %s", grp->name,
                 ready ? "every shard of its copies is here and in sync: it may "
                         "become a copy"
                       : "shards missing or SYNCING");
    r->joined = ready;
    node_sync_hold(ns, NODE_SYNC_HOLD_JOINING, !ready);
}

/* Is addr a member of grp (a copy, or in its other set)? */
static bool is_member(const struct topo_group *grp, const char *addr)
{
    for (unsigned m = 0; m < grp->nmembers; m++)
        if (strcmp(topo_member(grp, m), addr) == 0)
            return true;
    return false;
}

/* The series of peer (metrics.h): whether it answered the last probe, and
 * how many cursors this node keeps for it. */
static void peer_gauges(const char *peer, bool answered, size_t cursors)
{
    struct metrics *m = metrics_registry();
    const char *labels[] = {"peer", peer, NULL};
    metric_set(metrics_gauge(m, "bloomgrid_antientropy_peer_up",
                             "1 when the other copy answered this copy's last "
                             "probe (it is pulled from), 0 when it did not or has "
                             "left the group", labels), answered);
    metric_set(metrics_gauge(m, "bloomgrid_antientropy_cursors",
                             "shards this copy keeps a pull cursor for from the "
                             "other copy", labels), (double)cursors);
}

/* Ask every other member's health at once; down[m] is set for those that
 * do not answer within REPL_PROBE_TIMEOUT_MS (any answer, even an error,
 * says the peer runs).  A change of a peer's state is logged once. */
static void probe(struct node_replicate *r, const struct topo_group *grp, bool *down)
{
    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    size_t len = grpc__health__v1__health_check_request__get_packed_size(&rq);
    struct rpc_multi calls[TOPO_MAX_COPIES];
    struct repl_peer *peer[TOPO_MAX_COPIES];
    unsigned member[TOPO_MAX_COPIES];
    size_t n = 0;

    for (unsigned m = 0; m < grp->nmembers && m < TOPO_MAX_COPIES; m++) {
        const char *addr = topo_member(grp, m);
        if (node_rpc__is_self(addr))
            continue;
        if (!(peer[n] = peer_get(r, addr))) {
            down[m] = true;
            continue;
        }
        calls[n] = (struct rpc_multi){.ch = peer[n]->ch,
                                      .method = "/grpc.health.v1.Health/Check",
                                      .req = grpc_slice_malloc(len),
                                      .timeout_ms = REPL_PROBE_TIMEOUT_MS};
        grpc__health__v1__health_check_request__pack(&rq,
                                                     GRPC_SLICE_START_PTR(calls[n].req));
        member[n++] = m;
    }
    if (n)
        rpc_call_many(calls, n);
    for (size_t k = 0; k < n; k++) {
        struct repl_peer *p = peer[k];
        int code = calls[k].rc == 0 ? GRPC_STATUS_OK : (int)calls[k].st.code;
        bool answered = code != GRPC_STATUS_UNAVAILABLE &&
                        code != GRPC_STATUS_DEADLINE_EXCEEDED;
        down[member[k]] = !answered;
        if (answered && !p->answered)
            log_info("anti-entropy: %s answers again: pulled from", p->addr);
        else if (!answered && p->answered)
            log_warn("anti-entropy: %s does not answer (%s: %s): passed over until "
                     "it does", p->addr, rpc_status_name(calls[k].st.code),
                     calls[k].st.message);
        p->answered = answered;
        grpc_slice_unref(calls[k].req);
        grpc_slice_unref(calls[k].resp);
    }
}

/* Drop what no longer belongs to the group grp: the peers that left it
 * (their pullers ended and channels closed once idle) and the cursors of
 * those peers and of shards gone (dropped, or re-created: another store
 * filter). */
static void prune(struct node_replicate *r, const struct topo_group *grp)
{
    struct store *s = node_store(r->n);

    for (struct repl_peer **pp = &r->peers; *pp;) {
        struct repl_peer *p = *pp;
        if (!p->leaving && (!is_member(grp, p->addr) || node_rpc__is_self(p->addr))) {
            log_info("anti-entropy: %s is no longer a member of group %s: not "
                     "pulled from any more", p->addr, grp->name);
            peer_gauges(p->addr, false, 0);
            p->leaving = true;
        }
        /* Under mu with busy: no pass starts once quit is set. */
        pthread_mutex_lock(&r->mu);
        bool idle = p->leaving && !p->busy;
        if (p->leaving) {
            atomic_store(&p->quit, true);
            pthread_cond_signal(&p->cond);
        }
        pthread_mutex_unlock(&r->mu);
        if (idle) {
            *pp = p->next;
            peer_free(r, p);
        } else {
            pp = &p->next;
        }
    }
    pthread_mutex_lock(&r->mu);
    for (struct repl_shard **pp = &r->shards; *pp;) {
        struct repl_shard *rs = *pp;
        struct store_filter *sf = s && is_member(grp, rs->peer) ? store_get(s, rs->name)
                                                                : NULL;
        bool keep = sf && (const void *)sf == rs->sf_id;
        if (sf)
            store_put(sf);
        if (keep) {
            pp = &rs->next;
        } else {
            *pp = rs->next;
            free(rs);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

/* Set every peer's series. */
static void gauges_set(struct node_replicate *r)
{
    for (struct repl_peer *p = r->peers; p; p = p->next) {
        if (p->leaving)
            continue;
        size_t n = 0;
        pthread_mutex_lock(&r->mu);
        for (struct repl_shard *rs = r->shards; rs; rs = rs->next)
            n += strcmp(rs->peer, p->addr) == 0;
        pthread_mutex_unlock(&r->mu);
        peer_gauges(p->addr, p->answered, n);
    }
}

static void replicate_round(struct node_replicate *r, bool pull)
{
    struct store *s = node_store(r->n);
    char **names = NULL;
    size_t nn = 0;
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);

    if (!t || g < 0)
        goto out;
    const struct topo_group *grp = &t->groups[g];
    prune(r, grp);
    if (grp->nmembers < 2 || !s || !identity_read(r, grp))
        goto out;
    bool listing = list_due(r);
    if (!pull && !listing)
        goto out;
    /* A peer that is down or stopped costs the round one short probe, and
     * pulls from the others never wait for it (they run on each peer's
     * puller). */
    bool down[TOPO_MAX_COPIES] = {false};
    probe(r, grp, down);
    if (listing)
        list_round(r, t, grp, down);
    if (!pull)
        goto out;
    for (unsigned m = 0; m < grp->nmembers; m++) {
        struct repl_peer *p;
        if (!down[m] && !node_rpc__is_self(topo_member(grp, m)) &&
            (p = peer_get(r, topo_member(grp, m))))
            peer_kick(r, p, t->version);
    }
    /* What the pullers' passes up to now brought: SYNCING shards filled. */
    if (store_list(s, &names, &nn) == 0) {
        for (size_t i = 0; i < nn && !atomic_load(&r->n->stopping); i++) {
            struct store_filter *sf = store_get(s, names[i]);
            if (!sf)
                continue;
            sync_check(r, sf, grp);
            store_put(sf);
        }
        store_list_free(names, nn);
    }
    gauges_set(r);
out:
    topo_unref(t);
}

/* A clean stop: a last epoch, announced to the copies, so that a copy of
 * the directory taken before it is known as older (docs/REPLICATION.md). */
static void farewell(struct node_replicate *r)
{
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);

    if (t && g >= 0 && t->groups[g].nmembers > 1 && r->identity_read) {
        const struct topo_group *grp = &t->groups[g];
        epoch_bump(r, grp);
        for (unsigned c = 0; c < grp->ncopies; c++) {
            Bloomgrid__V1__ListShardsResponse *resp = NULL;
            struct repl_peer *p;
            /* A peer that did not answer the last probe would only cost
             * the stop its deadline. */
            if (node_rpc__is_self(grp->copies[c]) || !(p = peer_get(r, grp->copies[c])) ||
                !p->answered)
                continue;
            list_peer(r, grp, t->version, grp->copies[c], REPL_FAREWELL_TIMEOUT_MS,
                      &resp);
            if (resp)
                protobuf_c_message_free_unpacked(&resp->base, NULL);
        }
    }
    topo_unref(t);
}

static void *replicate_main(void *arg)
{
    struct node_replicate *r = arg;
    uint64_t slept = 0;

    while (!atomic_load(&r->n->stopping)) {
        /* Sleep in short steps so shutdown does not wait a whole interval. */
        struct timespec ts = {.tv_sec = 0, .tv_nsec = 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
        slept += 10;
        bool pull = slept >= r->n->cfg.replicate_interval_ms;
        /* The epoch is checked at once, whatever the interval of pulls. */
        if (!pull && (r->verified || slept % REPL_CHECK_EVERY_MS))
            continue;
        if (pull)
            slept = 0;
        replicate_round(r, pull);
    }
    farewell(r);
    return NULL;
}

struct node_replicate *node_replicate_start(struct node *n)
{
    struct node_replicate *r = calloc(1, sizeof *r);

    if (!r)
        return NULL;
    r->n = n;
    pthread_mutex_init(&r->mu, NULL);
    if (pthread_create(&r->thread, NULL, replicate_main, r) != 0) {
        pthread_mutex_destroy(&r->mu);
        free(r);
        return NULL;
    }
    log_info("anti-entropy: pulling changed pages from the other copies of "
             "this node's group every %" PRIu64 " ms", n->cfg.replicate_interval_ms);
    return r;
}

void node_replicate_stop(struct node_replicate *r)
{
    if (!r)
        return;
    pthread_join(r->thread, NULL);
    while (r->peers) {
        struct repl_peer *next = r->peers->next;
        peer_free(r, r->peers);
        r->peers = next;
    }
    while (r->shards) {
        struct repl_shard *next = r->shards->next;
        free(r->shards);
        r->shards = next;
    }
    while (r->missing) {
        struct repl_missing *next = r->missing->next;
        free(r->missing);
        r->missing = next;
    }
    pthread_mutex_destroy(&r->mu);
    free(r);
}
