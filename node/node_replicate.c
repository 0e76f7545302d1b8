/* node_replicate: anti-entropy between the copies of a shard group
 * (setting topology; docs/REPLICATION.md).
 *
 * One thread wakes every replicate_interval_ms and, for each blocked or
 * classic shard this node holds and each other copy of its group, calls
 * PullPages on that copy with the epoch and version it got last from it
 * (0 at first, so the first pull after a start, or after the peer
 * restarted with a new epoch, ships every non-empty page): one cursor per
 * peer and shard.  The pull carries the hashes of this copy's pages
 * (store_pages_hashes), and the peer skips the pages that hash the same:
 * copies that took the same writes ship little; the merge of what came
 * (none included) returns once the bits here are durable.  The pages of a pull are checked by their checksums
 * (node_client) and buffered; only when the whole pull succeeded and its
 * fingerprint is the shard's are they ORed in with store_pages_merge (the
 * durable path PushPages takes).  Nothing a peer claims is kept: no
 * version is reported from a pull, so a pull can only add bits.  A failed
 * pull changes nothing and is retried at the next wake-up; failures are
 * logged once per change of state.  A peer without the shard (NOT_FOUND) is
 * passed over.
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
 * Queries never wait for this thread: it holds no lock of its own across a
 * pull, and the store's locks only for the OR itself.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
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

#define REPL_PULL_TIMEOUT_MS 10000
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

/* A channel per peer address, kept for the life of the thread. */
struct repl_peer {
    char addr[TOPO_ADDR_MAX + 1];
    struct rpc_channel *ch;
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

static struct rpc_channel *peer_channel(struct node_replicate *r, const char *addr)
{
    struct repl_peer *p;

    for (p = r->peers; p && strcmp(p->addr, addr); p = p->next)
        ;
    if (!p && (p = calloc(1, sizeof *p))) {
        snprintf(p->addr, sizeof p->addr, "%s", addr);
        if (!(p->ch = rpc_channel_create(addr, r->n->cfg.max_message_size))) {
            free(p);
            return NULL;
        }
        p->next = r->peers;
        r->peers = p;
    }
    return p ? p->ch : NULL;
}

static struct repl_shard *shard_state(struct node_replicate *r,
                                      const char *name, const char *peer,
                                      const struct store_filter *sf)
{
    struct repl_shard *rs;

    for (rs = r->shards; rs && (strcmp(rs->name, name) || strcmp(rs->peer, peer));
         rs = rs->next)
        ;
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

/* Log a failure only when it differs from the last one. */
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

/* Pull shard sf's changed pages from the copy peer.  Returns false when
 * the peer is down or slow (the round then passes over it). */
static bool replicate_shard(struct node_replicate *r, struct store_filter *sf,
                            const char *peer, uint64_t topo_version)
{
    const char *name = store_filter_name(sf);
    char filter[STORE_NAME_MAX + 1], err[STORE_ERRLEN] = "";
    char msg[RPC_CLIENT_MSGLEN + STORE_ERRLEN];
    struct rpc_status st = {0};
    struct node_client_pull_end end;
    struct repl_buf b = {0};
    struct shard_id id;
    struct repl_shard *rs;
    int rc;

    bool reachable = true;
    if (store_filter_inspect(sf, id_read, &id) < 0)
        return true;   /* not ready: the next wake-up tries again */
    if ((id.kind != BF_KIND_BLOCKED && id.kind != BF_KIND_CLASSIC) ||
        id.layers != 1)
        return true;   /* only kinds whose pages OR are replicated */
    unsigned index;
    if (rules_shard_split(name, filter, sizeof filter, &index) != (id.count > 1))
        return true;
    struct rpc_channel *ch = peer_channel(r, peer);
    if (!ch || !(rs = shard_state(r, name, peer, sf)))
        return true;
    /* The shard was READY above, so it took writes before this pull
     * starts: a full pull now holds every write the peer acknowledged. */
    uint64_t since = shard_listed(sf);
    bool full = since && rs->full_ms < since;
    uint64_t started = node_sync_now_ms();
    /* What this copy holds (taken before the pull: the peer's pages that
     * hash the same are held here), so that only the others travel. */
    size_t nhave = 0;
    uint64_t *have = NULL;
    if (store_pages_hashes(sf, NULL, 0, &nhave) == -ERANGE &&
        nhave <= REPL_HASHES_MAX && (have = malloc(nhave * sizeof *have)) &&
        store_pages_hashes(sf, have, nhave, &nhave) < 0)
        nhave = 0;
    int pulled = node_client_pull_holding(ch, topo_version, have, have ? nhave : 0,
                                          filter, id.index, full ? 0 : rs->version,
                                          full ? 0 : rs->epoch, buf_page, &b, &end,
                                          REPL_PULL_TIMEOUT_MS, &st);
    free(have);
    if (pulled < 0) {
        snprintf(msg, sizeof msg, "PullPages: %s: %s",
                 rpc_status_name(st.code), st.message);
        shard_fail(r, rs, msg);
        /* The peer restarted or re-created it: start again from 0. */
        if (st.code == GRPC_STATUS_NOT_FOUND)
            rs->epoch = rs->version = 0;
        reachable = st.code != GRPC_STATUS_UNAVAILABLE &&
                    st.code != GRPC_STATUS_DEADLINE_EXCEEDED;
        goto out;
    }
    if (strcmp(end.fp, id.fp) != 0) {
        snprintf(msg, sizeof msg, "pages of fingerprint \"%s\" refused: the "
                 "shard's is \"%s\"", end.fp, id.fp);
        shard_fail(r, rs, msg);
        goto out;
    }
    /* Source version 0: a copy never reports what a peer covers. */
    if ((rc = store_pages_merge(sf, b.v, b.n, 0, err)) < 0) {
        snprintf(msg, sizeof msg, "%s", err[0] ? err : strerror(-rc));
        shard_fail(r, rs, msg);
        goto out;
    }
    if (rs->failing)
        log_info("anti-entropy %s from %s: resumed", name, peer);
    rs->failing = false;
    ae_metrics(peer, b.n, end.bytes);
    if (b.n || end.epoch != rs->epoch)
        log_debug("anti-entropy %s from %s: %zu pages (%" PRIu64 " bytes)",
                  name, peer, b.n, end.bytes);
    rs->epoch = end.epoch;
    rs->version = end.version;
    if (full && !end.syncing && started >= since)
        rs->full_ms = started;
out:
    buf_free(&b);
    return reachable;
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
    for (struct repl_shard *rs = r->shards; rs; rs = rs->next)
        if (rs->sf_id == (const void *)sf && rs->full_ms >= since &&
            !strcmp(rs->name, name) && is_copy(grp, rs->peer))
            got++;
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

    if (node_client_get_shard(ch, filter, index, &sh, REPL_PULL_TIMEOUT_MS, &st) < 0)
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

/* List the shards of the group's copies (announcing this copy), every
 * REPL_LIST_EVERY_MS, or every REPL_CHECK_EVERY_MS while the epoch is not
 * checked; down[m] is set for members that are down. */
static void list_round(struct node_replicate *r, const struct topo *t,
                       const struct topo_group *grp, bool *down)
{
    struct node_sync *ns = node_rpc__sync_get();
    uint64_t now = node_sync_now_ms();
    bool self_copy = false;
    unsigned listed = 0, missing = 0;

    if (now - r->listed_ms < (r->verified ? REPL_LIST_EVERY_MS : REPL_CHECK_EVERY_MS))
        return;
    r->listed_ms = now;
    for (unsigned c = 0; c < grp->ncopies; c++)
        self_copy |= node_rpc__is_self(grp->copies[c]);
    if (!self_copy && !r->joined)
        node_sync_hold(ns, NODE_SYNC_HOLD_JOINING, true);
    if (now - r->bumped_ms >= REPL_LIST_EVERY_MS)
        epoch_bump(r, grp);
    for (unsigned c = 0; c < grp->ncopies; c++) {
        Bloomgrid__V1__ListShardsResponse *resp = NULL;
        if (node_rpc__is_self(grp->copies[c]))
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

static void replicate_round(struct node_replicate *r, bool pull)
{
    struct store *s = node_store(r->n);
    char **names = NULL;
    size_t nn = 0;
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);

    if (!t || g < 0 || t->groups[g].nmembers < 2 || !s)
        goto out;
    const struct topo_group *grp = &t->groups[g];
    if (!identity_read(r, grp))
        goto out;
    /* A peer that is down or stopped costs one pull's deadline per round,
     * not one per shard: the rest of the round passes over it. */
    bool down[TOPO_MAX_COPIES] = {false};
    list_round(r, t, grp, down);
    if (!pull || store_list(s, &names, &nn) < 0)
        goto out;
    for (size_t i = 0; i < nn && !atomic_load(&r->n->stopping); i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        for (unsigned m = 0; m < grp->nmembers; m++)
            if (!down[m] && !node_rpc__is_self(topo_member(grp, m)))
                down[m] = !replicate_shard(r, sf, topo_member(grp, m), t->version);
        sync_check(r, sf, grp);
        store_put(sf);
    }
    store_list_free(names, nn);
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
            if (node_rpc__is_self(grp->copies[c]))
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
    if (pthread_create(&r->thread, NULL, replicate_main, r) != 0) {
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
        rpc_channel_destroy(r->peers->ch);
        free(r->peers);
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
    free(r);
}
