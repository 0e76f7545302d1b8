/* node_pages_rpc: the internal PullPages / PushPages calls used by the
 * merger and by read replicas pulling from their primary (node_replicate.c,
 * docs/MERGER.md), and the node's read-replica mode.
 *
 * The change tracking behind them is the store's (store.h, "Change
 * tracking"): a pull is store_pages_since streamed as Page messages, a push
 * is checked here whole and then given to store_pages_merge.  Only blocked
 * and classic shards are tracked; others answer FAILED_PRECONDITION.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "bf.h"
#include "log.h"
#include "node.h"
#include "node_rpc.h"
#include "rpc_server.h"
#include "rules.h"
#include "store.h"



/* Facts about the live shard a push is checked against. */
struct shard_geo {
    char fp[17];
    enum bf_kind kind;
    uint32_t layers;
    uint64_t body_bytes;
};

static void geo_read(const struct bf *f, void *ctx)
{
    struct shard_geo *g = ctx;
    struct bf_layer_info li;

    bf_fingerprint_id(f, g->fp);
    g->kind = bf_kind(f);
    g->layers = bf_layer_count(f);
    g->body_bytes = bf_layer_info(f, 0, &li) == 0 ? li.body_bytes : 0;
}

/* A pull's stream and what to tell the pages apart by. */
struct pull_ctx {
    struct rpc_stream *st;
    const struct store_pages_mark *mark;
    bool gone;                       /* the client went away */
};

static int send_page(void *ctx, const struct store_page *pg)
{
    struct pull_ctx *c = ctx;
    Bloomgrid__V1__Page m = BLOOMGRID__V1__PAGE__INIT;

    m.layer = pg->layer;
    m.offset = pg->offset;
    m.data.data = (uint8_t *)pg->data;
    m.data.len = pg->len;
    m.checksum = XXH64(pg->data, pg->len, 0);
    m.epoch = c->mark->epoch;
    if (rpc_stream_write(c->st, &m.base) < 0) {
        c->gone = true;
        return -EPIPE;
    }
    return 0;
}

void node_rpc__h_pull_pages(void *arg, struct rpc_stream *st)
{
    struct node *n = arg;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    Bloomgrid__V1__PullPagesRequest *m = NULL;
    struct store_filter *sf = NULL;
    struct store_pages_mark mark;
    struct pull_ctx c = {.st = st, .mark = &mark};
    char err[STORE_ERRLEN] = "", label[STORE_NAME_MAX + 48];
    struct store *s;
    const uint8_t *buf;
    size_t len;
    int rc = rpc_stream_read(st, &buf, &len);

    if (rc < 0)
        return;
    if (rc == 0 || !(m = bloomgrid__v1__pull_pages_request__unpack(NULL, len,
                                                                   buf))) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "PullPages needs one PullPagesRequest");
        goto done;
    }
    if (m->page_size != 0 && m->page_size != RULES_PAGE_BYTES) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "page_size %u: this node tracks pages of %u bytes "
                        "(send 0)", m->page_size, RULES_PAGE_BYTES);
        goto done;
    }
    if (!(s = node_rpc__need_store(n, &r)) ||
        !(sf = node_rpc__get_shard(s, m->filter, m->shard_index, &r)))
        goto done;
    snprintf(label, sizeof label, "shard %u of \"%s\"", m->shard_index,
             m->filter);
    /* Read before the walk: a shard that was SYNCING when its pages were
     * read may lack acknowledged writes, and the puller must know. */
    bool syncing = node_rpc__shard_syncing(sf);
    rc = store_pages_since(sf, m->epoch, m->since_version, send_page, &c,
                           &mark, err);
    if (c.gone)
        goto gone;
    if (rc == -EOPNOTSUPP) {
        rpc_reply_error(&r, GRPC_STATUS_FAILED_PRECONDITION, "%s: %s", label,
                        err);
        goto done;
    }
    if (rc < 0) {
        node_rpc__store_error(&r, sf, label, rc, err);
        goto done;
    }
    /* Let go of the shard before the client hears the end: a drop right
     * after it frees the shard and its tracking at once. */
    log_debug("pulled %" PRIu64 " pages (%" PRIu64 " bytes) of %s since %"
              PRIu64 ": version %" PRIu64, mark.pages, mark.bytes,
              store_filter_name(sf), m->since_version, mark.version);
    store_put(sf);
    sf = NULL;
    Bloomgrid__V1__Page last = BLOOMGRID__V1__PAGE__INIT;
    last.last = true;
    last.version = mark.version;
    last.epoch = mark.epoch;
    last.store_version = mark.store_version;
    last.syncing = syncing;
    last.fingerprint = mark.fp;
    last.checksum = XXH64(NULL, 0, 0);
    if (rpc_stream_write(st, &last.base) < 0)
        goto gone;
done:
    if (sf)
        store_put(sf);
    sf = NULL;
    node_rpc__finish_reply(st, &r);
gone:
    if (sf)
        store_put(sf);
    if (m)
        bloomgrid__v1__pull_pages_request__free_unpacked(m, NULL);
}

/* PushPages: every message is collected and every page checked before any
 * bit changes; then one durable store_or_pages. */
struct push_msgs {
    Bloomgrid__V1__PushPagesRequest **v;
    size_t n, cap;
    uint64_t bytes;
};

static void push_msgs_free(struct push_msgs *pm)
{
    for (size_t i = 0; i < pm->n; i++)
        bloomgrid__v1__push_pages_request__free_unpacked(pm->v[i], NULL);
    free(pm->v);
}

static int push_collect(struct rpc_stream *st, struct push_msgs *pm,
                        struct rpc_reply *r)
{
    const uint8_t *buf;
    size_t len;
    int rc;

    while ((rc = rpc_stream_read(st, &buf, &len)) > 0) {
        Bloomgrid__V1__PushPagesRequest *m =
            bloomgrid__v1__push_pages_request__unpack(NULL, len, buf);
        if (!m) {
            rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                            "malformed PushPagesRequest message %zu", pm->n);
            return 0;
        }
        if (pm->n == pm->cap) {
            size_t cap = pm->cap ? 2 * pm->cap : 64;
            void *nv = realloc(pm->v, cap * sizeof *pm->v);
            if (!nv) {
                bloomgrid__v1__push_pages_request__free_unpacked(m, NULL);
                rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                                "out of memory");
                return 0;
            }
            pm->v = nv;
            pm->cap = cap;
        }
        pm->v[pm->n++] = m;
        pm->bytes += m->data.len;
        /* Every page at most twice over: a bound on a bad sender. */
        if (pm->bytes > (8ull << 30)) {
            rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                            "PushPages stream larger than 8 GiB");
            return 0;
        }
    }
    return rc;
}

/* Check every page against the shard's body; fill pages.  Returns false
 * with r set. */
static bool push_check(struct push_msgs *pm, uint64_t body_bytes,
                       const char *label, struct store_page *pages,
                       size_t *npages, struct rpc_reply *r)
{
    size_t k = 0;

    for (size_t i = 0; i < pm->n; i++) {
        Bloomgrid__V1__PushPagesRequest *m = pm->v[i];
        if (i > 0 && m->shard) {
            rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                            "only the first PushPagesRequest names the shard");
            return false;
        }
        if (i == 0 && m->data.len == 0)
            continue;   /* a header without a page */
        if (XXH64(m->data.data, m->data.len, 0) != m->checksum) {
            rpc_reply_error(r, GRPC_STATUS_DATA_LOSS,
                            "%s: page at offset %" PRIu64 " (%zu bytes) fails "
                            "its checksum; nothing was applied", label,
                            m->offset, m->data.len);
            return false;
        }
        if (m->layer != 0 || m->offset % 8 || m->data.len % 8 ||
            m->offset > body_bytes || m->data.len > body_bytes - m->offset) {
            rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                            "%s: page (layer %u, offset %" PRIu64 ", %zu bytes) "
                            "is outside the shard's %" PRIu64 "-byte body; "
                            "nothing was applied", label, m->layer, m->offset,
                            m->data.len, body_bytes);
            return false;
        }
        pages[k++] = (struct store_page){.layer = 0, .offset = m->offset,
                                         .data = m->data.data,
                                         .len = m->data.len};
    }
    *npages = k;
    return true;
}

/* The geometry of a shard pages are pushed into; false with r set when it
 * is not READY or not a kind whose pages merge. */
static bool push_geo(struct store_filter *sf, const char *label,
                     struct shard_geo *g, struct rpc_reply *r)
{
    int rc = store_filter_inspect(sf, geo_read, g);

    if (rc < 0) {
        node_rpc__store_error(r, sf, label, rc, NULL);
        return false;
    }
    if ((g->kind != BF_KIND_BLOCKED && g->kind != BF_KIND_CLASSIC) ||
        g->layers != 1) {
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "%s is a %s filter; only blocked and classic filters "
                        "merge page by page", label, bf_kind_name(g->kind));
        return false;
    }
    return true;
}

void node_rpc__h_push_pages(void *arg, struct rpc_stream *st)
{
    struct node *n = arg;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    struct push_msgs pm = {0};
    struct store_filter *sf = NULL;
    struct store_page *pages = NULL;
    char label[STORE_NAME_MAX + 48];
    char err[STORE_ERRLEN] = "";
    struct shard_geo g;
    struct store *s;
    size_t np = 0;
    int rc = push_collect(st, &pm, &r);

    if (rc < 0)
        goto gone;
    if (r.st.code != GRPC_STATUS_OK)
        goto done;
    if (pm.n == 0 || !pm.v[0]->shard || !pm.v[0]->shard->filter[0]) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "the first PushPagesRequest must name the shard");
        goto done;
    }
    Bloomgrid__V1__PushPagesRequest *h = pm.v[0];
    snprintf(label, sizeof label, "shard %u of \"%s\"", h->shard->shard_index,
             h->shard->filter);
    if (!(s = node_rpc__need_store(n, &r)) ||
        !(sf = node_rpc__get_shard(s, h->shard->filter, h->shard->shard_index,
                                   &r)) ||
        !push_geo(sf, label, &g, &r))
        goto done;
    if (strcmp(h->fingerprint, g.fp) != 0) {
        rpc_reply_error(&r, GRPC_STATUS_FAILED_PRECONDITION,
                        "%s: pages of fingerprint \"%s\" refused: the shard's "
                        "is \"%s\" (another filter, geometry or secret)",
                        label, h->fingerprint, g.fp);
        goto done;
    }
    if (!(pages = calloc(pm.n, sizeof *pages))) {
        rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    if (!push_check(&pm, g.body_bytes, label, pages, &np, &r))
        goto done;
    if ((rc = store_pages_merge(sf, pages, np, h->source_version, err)) < 0) {
        node_rpc__store_error(&r, sf, label, rc, err);
        goto done;
    }
    Bloomgrid__V1__PushPagesResponse resp =
        BLOOMGRID__V1__PUSH_PAGES_RESPONSE__INIT;
    resp.pages_merged = np;
    resp.version = store_filter_version(sf);
    if (np)
        log_debug("merged %zu pushed pages into %s", np,
                  store_filter_name(sf));
    store_put(sf);
    sf = NULL;
    if (rpc_stream_write(st, &resp.base) < 0)
        goto gone;
done:
    if (sf)
        store_put(sf);
    sf = NULL;
    node_rpc__finish_reply(st, &r);
gone:
    if (sf)
        store_put(sf);
    free(pages);
    push_msgs_free(&pm);
}
