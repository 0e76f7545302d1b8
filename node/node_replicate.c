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
 * passed over: shards are created through routers, never by this thread.
 * Queries never wait for this thread: it holds no lock of its own across a
 * pull, and the store's locks only for the OR itself.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bf.h"
#include "log.h"
#include "node.h"
#include "node_client.h"
#include "node_rpc.h"
#include "rpc_client.h"
#include "rules.h"
#include "store.h"
#include "topo.h"

#define REPL_PULL_TIMEOUT_MS 10000

/* What this node got last from one peer for one shard. */
struct repl_shard {
    char name[STORE_NAME_MAX + 1];   /* store name */
    char peer[TOPO_ADDR_MAX + 1];
    const void *sf_id;               /* the store filter it was got for */
    uint64_t epoch, version;         /* the peer's, for the next pull */
    bool failing;                    /* last pull failed (logged once) */
    char last_err[RPC_CLIENT_MSGLEN];
    struct repl_shard *next;
};

/* A channel per peer address, kept for the life of the thread. */
struct repl_peer {
    char addr[TOPO_ADDR_MAX + 1];
    struct rpc_channel *ch;
    struct repl_peer *next;
};

struct node_replicate {
    struct node *n;
    pthread_t thread;
    struct repl_peer *peers;
    struct repl_shard *shards;
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
    if (node_client_pull(ch, filter, id.index, rs->version, rs->epoch,
                         buf_page, &b, &end, REPL_PULL_TIMEOUT_MS, &st) < 0) {
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
out:
    buf_free(&b);
    return reachable;
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
    for (size_t i = 0; i < nn && !atomic_load(&r->n->stopping); i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        for (unsigned c = 0; c < grp->ncopies; c++)
            if (!down[c] && !node_rpc__is_self(grp->copies[c]))
                down[c] = !replicate_shard(r, sf, grp->copies[c]);
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
    free(r);
}
