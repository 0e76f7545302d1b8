/* node_replicate: anti-entropy between the copies of a shard group
 * (setting topology; docs/REPLICATION.md).
 *
 * One thread wakes every replicate_interval_ms and, for each blocked or
 * classic shard this node holds and each other copy of its group, calls
 * PullPages on that copy with the epoch and version it got last from it
 * (0 at first, so the first pull after a start, or after the peer
 * restarted with a new epoch, ships every non-empty page): one cursor per
 * peer and shard.  The pages of a pull are checked by their checksums
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
 * one) and unless it was dropped here (repl_tombstoned).
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
#include "node.h"
#include "node_client.h"
#include "node_rpc.h"
#include "rpc_client.h"
#include "rules.h"
#include "store.h"
#include "topo.h"

#include "bloomgrid/v1/internal.pb-c.h"

#define REPL_PULL_TIMEOUT_MS 10000
#define REPL_RECREATE_DELAY_MS 2000
#define REPL_LIST_TIMEOUT_MS 2000

/* What this node got last from one peer for one shard. */
struct repl_shard {
    char name[STORE_NAME_MAX + 1];   /* store name */
    char peer[TOPO_ADDR_MAX + 1];
    const void *sf_id;               /* the store filter it was got for */
    uint64_t epoch, version;         /* the peer's, for the next pull */
    bool failing;                    /* last pull failed (logged once) */
    bool full_ok;                    /* a full pull that counts towards
                                        leaving SYNCING (this sf_id) */
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
        rs->full_ok = false;
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

/* Pull shard sf's changed pages from the copy peer.  Returns false when
 * the peer is down or slow (the round then passes over it). */
static bool replicate_shard(struct node_replicate *r, struct store_filter *sf,
                            const char *peer)
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
    bool full = node_rpc__shard_syncing(sf) && !rs->full_ok;
    uint64_t started = node_sync_now_ms();
    if (node_client_pull(ch, filter, id.index, full ? 0 : rs->version,
                         full ? 0 : rs->epoch, buf_page, &b, &end,
                         REPL_PULL_TIMEOUT_MS, &st) < 0) {
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
    if (b.n || end.epoch != rs->epoch)
        log_debug("anti-entropy %s from %s: %zu pages (%" PRIu64 " bytes)",
                  name, peer, b.n, end.bytes);
    rs->epoch = end.epoch;
    rs->version = end.version;
    if (full && !end.syncing &&
        started >= node_sync_since(node_rpc__sync_get(), name))
        rs->full_ok = true;
out:
    buf_free(&b);
    return reachable;
}

/* Has the shard left SYNCING?  It has when full pulls (full_ok) from
 * N - W + 1 peers succeeded for the shard object sf. */
static void sync_check(struct node_replicate *r, struct store_filter *sf,
                       const struct topo_group *grp)
{
    const char *name = store_filter_name(sf);
    char err[NODE_SYNC_ERRLEN] = "";
    unsigned need = grp->ncopies - grp->write_quorum + 1, got = 0;
    struct shard_facts facts;

    if (!node_rpc__shard_syncing(sf))
        return;
    for (struct repl_shard *rs = r->shards; rs; rs = rs->next)
        if (rs->sf_id == (const void *)sf && rs->full_ok && !strcmp(rs->name, name))
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
static bool repl_tombstoned(const char *name, uint64_t secret_id)
{
    return node_sync_dropped(node_rpc__sync_get(), name, secret_id);
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
        repl_tombstoned(sname, id))
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

/* Shards peer holds that this node lacks: noted, and re-created once they
 * have been missing long enough.  Returns false when peer is down. */
static bool recreate_from(struct node_replicate *r, const char *peer)
{
    struct store *s = node_store(r->n);
    struct rpc_channel *ch = peer_channel(r, peer);
    Bloomgrid__V1__ListShardsRequest req = BLOOMGRID__V1__LIST_SHARDS_REQUEST__INIT;
    Bloomgrid__V1__ListShardsResponse *resp = NULL;
    struct rpc_status st = {0};
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);

    req.topology_version = t ? t->version : 0;
    topo_unref(t);
    if (!ch || rpc_call(ch, "/bloomgrid.v1.Internal/ListShards", &req.base,
                        &bloomgrid__v1__list_shards_response__descriptor,
                        (ProtobufCMessage **)&resp, REPL_LIST_TIMEOUT_MS, &st) < 0)
        return st.code != GRPC_STATUS_UNAVAILABLE &&
               st.code != GRPC_STATUS_DEADLINE_EXCEEDED;
    for (size_t i = 0; i < resp->n_shards && !atomic_load(&r->n->stopping); i++) {
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
        struct repl_missing *m = missing_note(r, sname);
        if (m && node_sync_now_ms() - m->first_ms >= REPL_RECREATE_DELAY_MS)
            recreate_shard(r, ch, peer, isi->filter, isi->shard_index, sname);
    }
    protobuf_c_message_free_unpacked(&resp->base, NULL);
    return true;
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

static void replicate_round(struct node_replicate *r)
{
    struct store *s = node_store(r->n);
    char **names = NULL;
    size_t nn = 0;
    int g = -1;
    struct topo *t = node_rpc__topo_get(&g);

    if (!t || g < 0 || t->groups[g].ncopies < 2 || !s || store_list(s, &names, &nn) < 0)
        goto out;
    const struct topo_group *grp = &t->groups[g];
    /* A peer that is down or stopped costs one pull's deadline per round,
     * not one per shard: the rest of the round passes over it. */
    bool down[TOPO_MAX_COPIES] = {false};
    for (unsigned c = 0; c < grp->ncopies; c++)
        if (!node_rpc__is_self(grp->copies[c]))
            down[c] = !recreate_from(r, grp->copies[c]);
    missing_sweep(r);
    for (size_t i = 0; i < nn && !atomic_load(&r->n->stopping); i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        for (unsigned c = 0; c < grp->ncopies; c++)
            if (!down[c] && !node_rpc__is_self(grp->copies[c]))
                down[c] = !replicate_shard(r, sf, grp->copies[c]);
        sync_check(r, sf, grp);
        store_put(sf);
    }
    store_list_free(names, nn);
out:
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
        if (slept < r->n->cfg.replicate_interval_ms)
            continue;
        slept = 0;
        replicate_round(r);
    }
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
