/* node_replicate: a read replica's pull of changed pages from its primary
 * (settings role = replica, primary = HOST:PORT; docs/MERGER.md).
 *
 * One thread wakes every replicate_interval_ms and, for each blocked or
 * classic shard the replica holds, calls PullPages on the primary with the
 * epoch and version it got last (0 at first, so the first pull after a
 * start, or after the primary restarted with a new epoch, ships every
 * non-empty page).  The pages of a pull are checked by their checksums
 * (node_client) and buffered; only when the whole pull succeeded and its
 * fingerprint is the shard's are they ORed in with store_pages_merge (the
 * durable path PushPages takes), and only then does the shard report the
 * primary's store version the pull covers.  A failed pull changes nothing
 * and is retried at the next wake-up; failures are logged once per change
 * of state.  Queries never wait for this thread: it holds no lock of its
 * own across a pull, and the store's locks only for the OR itself.
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

#define REPL_PULL_TIMEOUT_MS 10000

/* What this replica got last from the primary for one shard. */
struct repl_shard {
    char name[STORE_NAME_MAX + 1];   /* store name */
    const void *sf_id;               /* the store filter it was got for */
    uint64_t epoch, version;         /* the primary's, for the next pull */
    bool failing;                    /* last pull failed (logged once) */
    char last_err[RPC_CLIENT_MSGLEN];
    struct repl_shard *next;
};

struct node_replicate {
    struct node *n;
    pthread_t thread;
    struct rpc_channel *ch;
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

static struct repl_shard *shard_state(struct node_replicate *r,
                                      const char *name,
                                      const struct store_filter *sf)
{
    struct repl_shard *rs;

    for (rs = r->shards; rs && strcmp(rs->name, name); rs = rs->next)
        ;
    if (!rs && (rs = calloc(1, sizeof *rs))) {
        snprintf(rs->name, sizeof rs->name, "%s", name);
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
        log_warn("replicate %s from %s: %s (retrying every %" PRIu64 " ms)",
                 rs->name, r->n->cfg.primary, msg,
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

static void replicate_shard(struct node_replicate *r, struct store_filter *sf)
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

    if (store_filter_inspect(sf, id_read, &id) < 0)
        return;   /* not ready: the next wake-up tries again */
    if ((id.kind != BF_KIND_BLOCKED && id.kind != BF_KIND_CLASSIC) ||
        id.layers != 1)
        return;   /* only kinds whose pages OR are replicated */
    unsigned index;
    if (rules_shard_split(name, filter, sizeof filter, &index) != (id.count > 1))
        return;
    if (!(rs = shard_state(r, name, sf)))
        return;
    if (node_client_pull(r->ch, filter, id.index, rs->version, rs->epoch,
                         buf_page, &b, &end, REPL_PULL_TIMEOUT_MS, &st) < 0) {
        snprintf(msg, sizeof msg, "PullPages: %s: %s",
                 rpc_status_name(st.code), st.message);
        shard_fail(r, rs, msg);
        goto out;
    }
    if (strcmp(end.fp, id.fp) != 0) {
        snprintf(msg, sizeof msg, "pages of fingerprint \"%s\" refused: the "
                 "shard's is \"%s\"", end.fp, id.fp);
        shard_fail(r, rs, msg);
        goto out;
    }
    if ((rc = store_pages_merge(sf, b.v, b.n, end.store_version, err)) < 0) {
        snprintf(msg, sizeof msg, "%s", err[0] ? err : strerror(-rc));
        shard_fail(r, rs, msg);
        goto out;
    }
    if (rs->failing)
        log_info("replicate %s from %s: resumed", name, r->n->cfg.primary);
    rs->failing = false;
    if (b.n || end.epoch != rs->epoch)
        log_debug("replicate %s: %zu pages (%" PRIu64 " bytes), primary "
                  "version %" PRIu64, name, b.n, end.bytes,
                  end.store_version);
    rs->epoch = end.epoch;
    rs->version = end.version;
out:
    buf_free(&b);
}

static void replicate_round(struct node_replicate *r)
{
    struct store *s = node_store(r->n);
    char **names = NULL;
    size_t nn = 0;

    if (!s || store_list(s, &names, &nn) < 0)
        return;
    for (size_t i = 0; i < nn && !atomic_load(&r->n->stopping); i++) {
        struct store_filter *sf = store_get(s, names[i]);
        if (!sf)
            continue;
        replicate_shard(r, sf);
        store_put(sf);
    }
    store_list_free(names, nn);
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
    if (!(r->ch = rpc_channel_create(n->cfg.primary, n->cfg.max_message_size)))
        goto fail;
    if (pthread_create(&r->thread, NULL, replicate_main, r) != 0)
        goto fail;
    log_info("replicating from primary %s every %" PRIu64 " ms",
             n->cfg.primary, n->cfg.replicate_interval_ms);
    return r;
fail:
    if (r->ch)
        rpc_channel_destroy(r->ch);
    free(r);
    return NULL;
}

void node_replicate_stop(struct node_replicate *r)
{
    if (!r)
        return;
    pthread_join(r->thread, NULL);
    rpc_channel_destroy(r->ch);
    while (r->shards) {
        struct repl_shard *next = r->shards->next;
        free(r->shards);
        r->shards = next;
    }
    free(r);
}
