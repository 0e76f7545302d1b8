/* node_replicate_pull: the pullers of anti-entropy (node_replicate.c says
 * what anti-entropy does): one thread per other member of the group, each
 * with its channel, making a pass over the shards when the replicate
 * thread kicks it; the cursors (one per peer and shard) the passes keep;
 * the probes that pass over a member that does not answer; and the
 * pruning of peers and cursors that no longer belong.  A copy that hangs
 * in a pull delays only its own puller.  Locks: r->mu guards the cursors
 * and the pullers' work, is never held across a call, and is taken before
 * any lock of the store. */

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

#include "node_replicate_int.h"

/* Pages ORed in by one store_pages_merge of a pull (4 MiB of 64 KiB
 * pages): what the log record of a merge copies at most, and what a pull
 * from a node that names its fingerprint early holds at once. */
#define REPL_MERGE_PAGES 64

/* The receive window of a call to a peer (rpc_channel_create_window): at
 * most this much of a pull sent ahead of the puller is held by gRPC. */
#define REPL_PULL_WINDOW (1u << 20)

/* Keys' hashes added by one batch of a pull applied as it arrives (1 MiB
 * of them). */
#define REPL_MERGE_KEYS 65536

/* A pull as it is received.  The node pulled from names the shard's
 * fingerprint in its first message (node_client_pull_end.fp, read through
 * end): once it is this shard's, each page and key verified by its
 * checksum can only add bits this shard may hold, and the pull is applied
 * as it arrives, REPL_MERGE_PAGES pages or REPL_MERGE_KEYS keys at a time,
 * each piece a durable log record before the next is received
 * (store_pages_merge, store_add_hashes wait for their records).  The
 * cursor of the pull still moves only when the whole pull succeeded, and
 * a SYNCING copy still leaves SYNCING only after a whole, verified full
 * pull (node_sync.c): a pull cut short leaves ORed bits that are the
 * peer's (harmless: OR never removes a bit, the next pull brings the
 * rest).  From a node of an earlier release (fingerprint in the last
 * message only) the pull is held whole, as before, and applied once its
 * fingerprint is checked.
 *
 * The pages are copied into one buffer (v[i].data holds the page's offset
 * in it until buf_pages points them in): one allocation that grows,
 * mapped on its own once large and unmapped when the pull is done, rather
 * than a small allocation per page that the allocator's arenas would keep
 * after the pull.  And the keys' hashes a node may send instead (at most
 * the shard's body bytes of them in all: never more than the pages they
 * stand for). */
struct repl_buf {
    struct store_page *v;
    size_t n, cap;
    uint8_t *data;
    size_t used, dcap;
    struct bf_hash *keys;
    size_t nkeys, kcap, kmax;
    uint64_t ktotal;                      /* keys received in all */
    /* applying as it arrives */
    struct store_filter *sf;
    const char *want_fp;                  /* the shard's fingerprint id */
    const struct node_client_pull_end *end;   /* its fp, as soon as sent */
    bool early;                           /* the peer's fp matched: apply */
    uint64_t pages_applied, keys_applied, keys_added;
    char err[STORE_ERRLEN];               /* why a callback stopped */
};

/* Whether what arrives may be applied now: the peer named the shard's
 * fingerprint and it is this shard's.  -1 with b->err set when the peer
 * named another (the pull stops there, nothing of it applied). */
static int buf_vouched(struct repl_buf *b)
{
    if (b->early || !b->end || !b->end->fp[0])
        return b->early;
    if (strcmp(b->end->fp, b->want_fp) != 0) {
        snprintf(b->err, sizeof b->err, "pages of fingerprint \"%s\" refused: "
                 "the shard's is \"%s\"", b->end->fp, b->want_fp);
        return -1;
    }
    b->early = true;
    return 1;
}

/* Add the pulled keys' hashes to sf: only those it may not hold (the others
 * would change no bit, and logging them again would send them back to the
 * peer they came from at its next pull), a batch at a time, each an
 * ordinary durable add (its pages stamped for this copy's checkpoints and
 * pullers).  Returns 0, or store_add_hashes' error with err set. */
static int keys_add(struct store_filter *sf, struct bf_hash *k, size_t n,
                    size_t *added, char *err)
{
    enum { BATCH = 4096 };
    bool have[BATCH];
    int rc;

    *added = 0;
    for (size_t i = 0; i < n; i += BATCH) {
        size_t m = n - i < BATCH ? n - i : BATCH, w = 0;
        if ((rc = store_may_contain_hashes(sf, k + i, m, have)) < 0) {
            snprintf(err, STORE_ERRLEN, "%s", strerror(-rc));
            return rc;
        }
        for (size_t j = 0; j < m; j++)
            if (!have[j])
                k[i + w++] = k[i + j];
        if (w && (rc = store_add_hashes(sf, k + i, w, NULL, err)) < 0)
            return rc;
        *added += w;
    }
    return 0;
}

/* Point the pages at their bytes (once the buffer no longer moves). */
static void buf_pages(struct repl_buf *b)
{
    for (size_t i = 0; i < b->n; i++)
        b->v[i].data = b->data + (uintptr_t)b->v[i].data;
}

/* OR in the pages held (in merges of REPL_MERGE_PAGES: each makes a log
 * record holding a copy of its pages, so a pull of a whole shard never
 * holds a second copy of it) and add the keys held; the buffers are then
 * empty.  Pages ORed in by a merge before a failed one stay (OR is
 * idempotent: the next pull brings the rest); no version is claimed (0).
 * Returns 0, or the store's error with b->err set. */
static int buf_apply(struct repl_buf *b)
{
    size_t i = 0, added = 0;
    int rc = 0;

    buf_pages(b);
    while (rc >= 0 && i < b->n) {
        size_t k = b->n - i < REPL_MERGE_PAGES ? b->n - i : REPL_MERGE_PAGES;
        rc = store_pages_merge(b->sf, b->v + i, k, 0, b->err);
        i += k;
    }
    b->pages_applied += i;
    b->n = 0;
    b->used = 0;
    if (rc >= 0 && b->nkeys) {
        rc = keys_add(b->sf, b->keys, b->nkeys, &added, b->err);
        b->keys_applied += b->nkeys;
        b->keys_added += added;
    }
    b->nkeys = 0;
    if (rc < 0 && !b->err[0])
        snprintf(b->err, sizeof b->err, "%s", strerror(-rc));
    return rc < 0 ? rc : 0;
}

static int buf_keys(void *ctx, const uint8_t *h, size_t n)
{
    struct repl_buf *b = ctx;
    int early = buf_vouched(b);

    if (early < 0)
        return -EINVAL;
    if (n > b->kmax - b->ktotal) {
        snprintf(b->err, sizeof b->err, "more keys' hashes than the shard's "
                 "%zu bytes of pages", b->kmax * sizeof(struct bf_hash));
        return -E2BIG;
    }
    if (b->nkeys + n > b->kcap) {
        size_t cap = b->kcap ? b->kcap : 4096;
        while (cap < b->nkeys + n)
            cap *= 2;
        if (cap > b->kmax)
            cap = b->kmax;
        void *nv = realloc(b->keys, cap * sizeof *b->keys);
        if (!nv)
            return -ENOMEM;
        b->keys = nv;
        b->kcap = cap;
    }
    for (size_t i = 0; i < n; i++) {
        const uint8_t *p = h + 16 * i;
        uint64_t h1 = 0, h2 = 0;
        for (int k = 7; k >= 0; k--) {
            h1 = h1 << 8 | p[k];
            h2 = h2 << 8 | p[8 + k];
        }
        b->keys[b->nkeys++] = (struct bf_hash){h1, h2};
    }
    b->ktotal += n;
    if (early && b->nkeys >= REPL_MERGE_KEYS)
        return buf_apply(b);
    return 0;
}

static int buf_page(void *ctx, uint64_t offset, const uint8_t *data, size_t len)
{
    struct repl_buf *b = ctx;
    int early = buf_vouched(b);

    if (early < 0)
        return -EINVAL;
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 64;
        void *nv = realloc(b->v, cap * sizeof *b->v);
        if (!nv)
            return -ENOMEM;
        b->v = nv;
        b->cap = cap;
    }
    if (len > b->dcap - b->used) {
        size_t dcap = b->dcap ? b->dcap : RULES_PAGE_BYTES * 16;
        while (len > dcap - b->used)
            dcap *= 2;
        void *nd = realloc(b->data, dcap);
        if (!nd)
            return -ENOMEM;
        b->data = nd;
        b->dcap = dcap;
    }
    memcpy(b->data + b->used, data, len);
    b->v[b->n++] = (struct store_page){.layer = 0, .offset = offset,
                                       .data = (const void *)(uintptr_t)b->used,
                                       .len = len};
    b->used += len;
    if (early && b->n >= REPL_MERGE_PAGES)
        return buf_apply(b);
    return 0;
}

static void buf_free(struct repl_buf *b)
{
    free(b->data);
    free(b->v);
    free(b->keys);
}

static void *peer_main(void *arg);

/* The peer of address addr, with its channel and its puller (started
 * here), or NULL when out of memory.  Replicate thread only. */
struct repl_peer *repl__peer_get(struct node_replicate *r, const char *addr)
{
    struct repl_peer *p;

    for (p = r->peers; p && (p->leaving || strcmp(p->addr, addr)); p = p->next)
        ;
    if (p || !(p = calloc(1, sizeof *p)))
        return p;
    snprintf(p->addr, sizeof p->addr, "%s", addr);
    p->r = r;
    pthread_cond_init(&p->cond, NULL);
    /* The pulls on it apply each piece durably before reading on: the
     * pages the peer sends ahead are held to one window, not to what a
     * fast link's BDP probes would let it send. */
    if (!(p->ch = rpc_channel_create_window(addr, r->n->cfg.max_message_size,
                                            REPL_PULL_WINDOW)))
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

struct rpc_channel *repl__peer_channel(struct node_replicate *r, const char *addr)
{
    struct repl_peer *p = repl__peer_get(r, addr);
    return p ? p->ch : NULL;
}

/* End p's puller (waiting for a pass that runs: it ends at its next shard
 * or when its call does) and free p. */
void repl__peer_free(struct node_replicate *r, struct repl_peer *p)
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
    uint64_t body_bytes;
};

static void id_read(const struct bf *f, void *ctx)
{
    struct shard_id *id = ctx;
    struct bf_layer_info li;

    id->body_bytes = bf_layer_info(f, 0, &li) == 0 ? li.body_bytes : 0;

    id->index = bf_shard_index(f);
    id->count = bf_shard_count(f);
    id->kind = bf_kind(f);
    id->layers = bf_layer_count(f);
    bf_fingerprint_id(f, id->fp);
}

/* The pull counters of peer (metrics.h), labels {"peer", peer}. */
static struct metric *ae_pages(const char *const *labels)
{
    return metrics_counter(metrics_registry(), "bloomgrid_antientropy_pages_total",
                           "pages pulled from the other copies of the group "
                           "and merged", labels);
}

static struct metric *ae_bytes(const char *const *labels)
{
    return metrics_counter(metrics_registry(), "bloomgrid_antientropy_bytes_total",
                           "bytes of the pages pulled from the other copies", labels);
}

static struct metric *ae_keys(const char *const *labels)
{
    return metrics_counter(metrics_registry(), "bloomgrid_antientropy_keys_total",
                           "keys' hashes pulled from the other copies instead "
                           "of pages (16 bytes each; added here)", labels);
}

/* Pages merged and keys added by one pull from peer (metrics.h). */
static void ae_metrics(const char *peer, size_t pages, uint64_t bytes,
                       uint64_t keys)
{
    struct metrics *m = metrics_registry();
    const char *labels[] = {"peer", peer, NULL};
    metric_add(ae_pages(labels), pages);
    metric_add(ae_bytes(labels), bytes);
    metric_add(ae_keys(labels), keys);
    /* The lag of this copy behind peer: time() minus this, in a query. */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    metric_set(metrics_gauge(m, "bloomgrid_antientropy_last_pull_timestamp_seconds",
                             "when a pull of a shard's changed pages from the peer "
                             "last succeeded (Unix time)", labels),
               (double)ts.tv_sec + (double)ts.tv_nsec / 1e9);
}

/* The XXH64 of each page sf holds (store_pages_hashes), for a pull to
 * carry: malloc'd (the caller frees), NULL with *n 0 when the shard is too
 * large for them (REPL_HASHES_MAX) or they cannot be read. */
static uint64_t *hashes_held(struct store_filter *sf, size_t *n)
{
    uint64_t *have = NULL;

    *n = 0;
    if (store_pages_hashes(sf, NULL, 0, n) != -ERANGE || *n > REPL_HASHES_MAX ||
        !(have = malloc(*n ? *n * sizeof *have : 1)) ||
        store_pages_hashes(sf, have, *n, n) < 0) {
        free(have);
        *n = 0;
        return NULL;
    }
    return have;
}

/* Pull the pages of shard sf (id, public name filter) from ch since
 * (since, epoch), carrying have, and OR them in (store_pages_merge, source
 * version 0: a copy never reports what a peer covers): as they arrive once
 * the peer named the shard's fingerprint, else once the whole pull
 * succeeded and its fingerprint is the shard's (struct repl_buf).  Returns
 * 0 with *end and *npages (pages received) set when the whole pull
 * succeeded and every piece of it is applied and durable, or -1 with msg
 * set (pieces applied before stay: only the caller's cursor says what is
 * covered); *st has the call's status either way. */
static int pull_merge(struct rpc_channel *ch, struct store_filter *sf,
                      const struct shard_id *id, const char *filter,
                      uint64_t topo_version, const uint64_t *have, size_t nhave,
                      uint64_t since, uint64_t epoch, struct node_client_pull_end *end,
                      struct rpc_status *st, size_t *npages, char *msg, size_t msglen)
{
    struct repl_buf b = {.kmax = id->body_bytes / sizeof(struct bf_hash),
                         .sf = sf, .want_fp = id->fp, .end = end};

    memset(end, 0, sizeof *end);
    *npages = 0;
    msg[0] = 0;
    /* Keys' hashes are taken for an incremental pull (docs/REPLICATION.md,
     * "Keys instead of pages"); a full pull is pages only.  What arrives is
     * applied as it arrives once the peer named this shard's fingerprint
     * (struct repl_buf). */
    if (node_client_pull_keys(ch, topo_version, have, nhave, filter, id->index,
                              since, epoch, buf_page, since ? buf_keys : NULL,
                              &b, end, REPL_PULL_TIMEOUT_MS, st) < 0)
        snprintf(msg, msglen, "PullPages: %s: %s%s%s", rpc_status_name(st->code),
                 st->message, b.err[0] ? ": " : "", b.err);
    else if (strcmp(end->fp, id->fp) != 0)
        snprintf(msg, msglen, "pages of fingerprint \"%s\" refused: the "
                 "shard's is \"%s\"", end->fp, id->fp);
    else if (buf_apply(&b) < 0)
        /* The rest; or, from a node that named its fingerprint last, the
         * whole pull.  Then the keys' hashes, if any. */
        snprintf(msg, msglen, "%s", b.err);
    else if (b.keys_applied)
        log_debug("anti-entropy %s: %" PRIu64 " keys' hashes pulled, %" PRIu64
                  " of them new here", store_filter_name(sf), b.keys_applied,
                  b.keys_added);
    *npages = (size_t)end->pages;
    buf_free(&b);
    return msg[0] ? -1 : 0;
}

/* Read what a pull of sf needs: its id and public name.  Returns false for
 * a shard that is not replicated (another kind, several layers) or not
 * ready. */
static bool pull_target(struct store_filter *sf, struct shard_id *id, char *filter,
                        size_t flen)
{
    unsigned index;

    if (store_filter_inspect(sf, id_read, id) < 0)
        return false;
    if ((id->kind != BF_KIND_BLOCKED && id->kind != BF_KIND_CLASSIC) || id->layers != 1)
        return false;
    return rules_shard_split(store_filter_name(sf), filter, flen, &index) ==
           (id->count > 1);
}

int repl__pull_full(struct rpc_channel *ch, const char *peer, struct store_filter *sf,
                    uint64_t topo_version, size_t *pages, uint64_t *bytes, char *why,
                    size_t whylen)
{
    char filter[STORE_NAME_MAX + 1];
    struct node_client_pull_end end;
    struct rpc_status st = {0};
    struct shard_id id;
    size_t nhave = 0;

    *pages = 0;
    *bytes = 0;
    if (!pull_target(sf, &id, filter, sizeof filter))
        return 1;
    uint64_t *have = hashes_held(sf, &nhave);
    int rc = pull_merge(ch, sf, &id, filter, topo_version, have, nhave, 0, 0, &end,
                        &st, pages, why, whylen);
    free(have);
    if (rc < 0)
        return st.code == GRPC_STATUS_NOT_FOUND ? 1 : -1;
    ae_metrics(peer, *pages, end.bytes, end.keys);
    *bytes = end.bytes;
    return 0;
}

/* Pull shard sf's changed pages from peer p (on p's puller).  Returns
 * false when the peer is down or slow (the pass then ends). */
static bool replicate_shard(struct node_replicate *r, struct store_filter *sf,
                            struct repl_peer *p, uint64_t topo_version)
{
    const char *name = store_filter_name(sf), *peer = p->addr;
    char filter[STORE_NAME_MAX + 1];
    char msg[RPC_CLIENT_MSGLEN + STORE_ERRLEN] = "";
    struct rpc_status st = {0};
    struct node_client_pull_end end;
    struct shard_id id;
    struct repl_shard *rs;
    size_t npages = 0;

    /* Not ready: the next wake-up tries again; only kinds whose pages OR
     * are replicated. */
    if (!pull_target(sf, &id, filter, sizeof filter))
        return true;
    pthread_mutex_lock(&r->mu);
    uint64_t epoch = 0, version = 0, full_ms = 0, held = 0;
    if ((rs = shard_state(r, name, peer, sf))) {
        epoch = rs->epoch;
        version = rs->version;
        full_ms = rs->full_ms;
        held = rs->held;
    }
    pthread_mutex_unlock(&r->mu);
    if (!rs)
        return true;
    /* The shard was READY above, so it took writes before this pull
     * starts: a full pull now holds every write the peer acknowledged. */
    uint64_t since = repl__shard_listed(sf);
    bool full = since && full_ms < since;
    uint64_t started = node_sync_now_ms();
    /* What this copy holds (taken before the pull: the peer's pages that
     * hash the same are held here), so that only the others travel.  Not
     * when nothing changed here since the last pull from this peer: then
     * what changed there is not here (but for pages of this copy's own
     * that came back), and an idle shard is not hashed every round. */
    uint64_t local = store_filter_version(sf);
    size_t nhave = 0;
    uint64_t *have = NULL;
    if (full || version == 0 || local != held)
        have = hashes_held(sf, &nhave);
    int rc = pull_merge(p->ch, sf, &id, filter, topo_version, have, nhave,
                        full ? 0 : version, full ? 0 : epoch, &end, &st, &npages,
                        msg, sizeof msg);
    free(have);
    if (rc == 0)
        ae_metrics(peer, npages, end.bytes, end.keys);

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
        if (npages || end.keys || end.epoch != rs->epoch)
            log_debug("anti-entropy %s from %s: %zu pages (%" PRIu64 " bytes), "
                      "%" PRIu64 " keys", name, peer, npages, end.bytes,
                      end.keys);
        rs->epoch = end.epoch;
        rs->version = end.version;
        rs->held = local;
        if (full && !end.syncing && started >= since)
            rs->full_ms = started;
    }
    pthread_mutex_unlock(&r->mu);
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
void repl__peer_kick(struct node_replicate *r, struct repl_peer *p, uint64_t topo_version)
{
    pthread_mutex_lock(&r->mu);
    if (!p->busy && !p->kicked) {
        p->kicked = true;
        p->topo_version = topo_version;
        pthread_cond_signal(&p->cond);
    }
    pthread_mutex_unlock(&r->mu);
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
 * how many cursors this node keeps for it; its counters, at 0 from its
 * first probe on. */
static void peer_gauges(const char *peer, bool answered, size_t cursors)
{
    struct metrics *m = metrics_registry();
    const char *labels[] = {"peer", peer, NULL};
    ae_pages(labels);
    ae_bytes(labels);
    ae_keys(labels);
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
void repl__probe(struct node_replicate *r, const struct topo_group *grp, bool *down)
{
    struct node_client_probe calls[TOPO_MAX_COPIES];
    struct repl_peer *peer[TOPO_MAX_COPIES];
    unsigned member[TOPO_MAX_COPIES];
    size_t n = 0;

    for (unsigned m = 0; m < grp->nmembers && m < TOPO_MAX_COPIES; m++) {
        const char *addr = topo_member(grp, m);
        if (node_rpc__is_self(addr))
            continue;
        if (!(peer[n] = repl__peer_get(r, addr))) {
            down[m] = true;
            continue;
        }
        calls[n] = (struct node_client_probe){.ch = peer[n]->ch};
        member[n++] = m;
    }
    /* At most TOPO_MAX_COPIES: nothing to allocate, nothing fails. */
    node_client_probe_many(calls, n, NULL, REPL_PROBE_TIMEOUT_MS);
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
    }
}

/* Drop what no longer belongs to the group grp: the peers that left it
 * (their pullers ended and channels closed once idle) and the cursors of
 * those peers and of shards gone (dropped, or re-created: another store
 * filter). */
void repl__prune(struct node_replicate *r, const struct topo_group *grp)
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
            repl__peer_free(r, p);
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
void repl__gauges_set(struct node_replicate *r)
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
