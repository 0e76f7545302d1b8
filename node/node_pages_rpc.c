/* node_pages_rpc: change tracking per shard and the internal PullPages /
 * PushPages calls used by the merger and by read replicas pulling from
 * their primary (node_replicate.c, docs/MERGER.md).
 *
 * Change tracking diffs against a shadow copy at pull time: the add path is
 * untouched (no cost per key).  Each tracked shard has a shadow copy of its
 * layer body, a change counter `tag` and, per 64 KiB page, the tag at which
 * the page was last seen to change.  A pull first reads the store version V,
 * then compares every page of the live body with the shadow; a page that
 * differs is copied into the shadow and stamped with a new tag
 * (max(V, tag + 1), so tags only grow and follow the store's versions).
 * The pull streams every page whose stamp is above since_version, with the
 * shadow's bytes: those hold every bit of every write acknowledged up to V
 * (bits are set before the version is raised: store.h), which is what the
 * last message's store_version promises.  Bits that land during the compare
 * are either already in the copy or found by the next pull.
 *
 * Pushed pages are ORed into the live filter (store_or_pages, durable) AND
 * into the shadow: the merger already has them, so they are not pulled back
 * and a quiet round ships nothing.  Local bits set meanwhile still differ
 * from the shadow and are pulled next time.
 *
 * The cost is one extra copy of each pulled shard's memory and a compare of
 * the whole body per pull (memory bandwidth, no lock held against adds).
 * Trackers live in memory: after a restart (or a drop and re-create) a node
 * has a new random epoch, and a pull naming another epoch gets every
 * non-empty page.  Only blocked and classic shards (one layer whose bits
 * OR) are tracked; others answer FAILED_PRECONDITION.
 *
 * Threads: one mutex per tracker serializes its pulls and pushes (a pull
 * holds it while it streams); the registry has its own mutex.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <xxhash.h>

#include "bf.h"
#include "log.h"
#include "node.h"
#include "node_rpc.h"
#include "rpc_server.h"
#include "store.h"

#define PAGE_BYTES (64u << 10)

struct page_track {
    char name[STORE_NAME_MAX + 1];   /* store name of the shard */
    char fp[17];                     /* fingerprint id it was made for */
    pthread_mutex_t mu;
    uint64_t epoch;
    uint64_t tag;                    /* last stamp handed out */
    uint64_t body_bytes;
    uint64_t npages;
    uint64_t *stamp;                 /* per page */
    uint8_t *shadow;                 /* body_bytes, allocated on first pull */
    uint64_t replica_version;        /* highest source_version pushed */
    const void *sf_id;               /* the store filter it tracks */
    uint64_t last_v;                 /* its version when last seen */
    struct page_track *next;
};

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct page_track *reg;
static atomic_bool replica_mode;

void node_pages_set_replica(bool replica)
{
    atomic_store(&replica_mode, replica);
}

bool node_pages_is_replica(void)
{
    return atomic_load(&replica_mode);
}

bool node_rpc__refuse_on_replica(struct rpc_reply *r, const char *what)
{
    if (!atomic_load(&replica_mode))
        return false;
    rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                    "this node is a read replica (role = replica): %s goes to "
                    "the shard's primary", what);
    return true;
}

static uint64_t new_epoch(void)
{
    static _Atomic uint64_t fallback = 1;
    uint64_t e = 0;

    if (getrandom(&e, sizeof e, 0) != sizeof e)
        e = atomic_fetch_add(&fallback, 1);
    return e ? e : 1;
}

/* Facts about the live filter read under its shared lock. */
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

static void track_reset(struct page_track *t, const struct shard_geo *g)
{
    free(t->stamp);
    free(t->shadow);
    memcpy(t->fp, g->fp, sizeof t->fp);
    t->epoch = new_epoch();
    t->tag = 0;
    t->body_bytes = g->body_bytes;
    t->npages = (g->body_bytes + PAGE_BYTES - 1) / PAGE_BYTES;
    t->stamp = calloc(t->npages ? t->npages : 1, sizeof *t->stamp);
    t->shadow = NULL;
    t->replica_version = 0;
}

/* The tracker of a shard, locked, made (or reset) for the shard's current
 * fingerprint; NULL when out of memory.  Unlock with track_unlock.  A shard
 * dropped and created again (another store filter object, or a version
 * below the one last seen) gets a new tracker and epoch even with the same
 * secret, so a merger pushes it everything again. */
static struct page_track *track_lock(const char *sname,
                                     const struct shard_geo *g,
                                     struct store_filter *sf)
{
    struct page_track *t;

    pthread_mutex_lock(&reg_mu);
    for (t = reg; t && strcmp(t->name, sname); t = t->next)
        ;
    if (!t && (t = calloc(1, sizeof *t))) {
        snprintf(t->name, sizeof t->name, "%s", sname);
        pthread_mutex_init(&t->mu, NULL);
        t->next = reg;
        reg = t;
    }
    pthread_mutex_unlock(&reg_mu);
    if (!t)
        return NULL;
    pthread_mutex_lock(&t->mu);
    uint64_t v = store_filter_version(sf);
    if (strcmp(t->fp, g->fp) != 0 || t->body_bytes != g->body_bytes ||
        !t->stamp || t->sf_id != (const void *)sf || v < t->last_v) {
        track_reset(t, g);
        t->sf_id = sf;
    }
    t->last_v = v;
    if (!t->stamp) {
        pthread_mutex_unlock(&t->mu);
        return NULL;
    }
    return t;
}

static void track_unlock(struct page_track *t)
{
    pthread_mutex_unlock(&t->mu);
}

uint64_t node_pages_replica_version(const char *sname)
{
    struct page_track *t;
    uint64_t v = 0;

    pthread_mutex_lock(&reg_mu);
    for (t = reg; t && strcmp(t->name, sname); t = t->next)
        ;
    pthread_mutex_unlock(&reg_mu);
    if (t) {
        pthread_mutex_lock(&t->mu);
        v = t->replica_version;
        pthread_mutex_unlock(&t->mu);
    }
    return v;
}

/* Compare the live body with the shadow; stamp the pages that differ. */
struct diff_ctx {
    struct page_track *t;
    uint64_t stamp;
    uint64_t changed;
};

static void diff_run(const struct bf *f, void *ctx)
{
    struct diff_ctx *d = ctx;
    struct page_track *t = d->t;
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(f, 0);

    for (uint64_t p = 0; p < t->npages; p++) {
        uint64_t off = p * PAGE_BYTES;
        size_t len = t->body_bytes - off < PAGE_BYTES
                         ? (size_t)(t->body_bytes - off) : PAGE_BYTES;
        if (memcmp(body + off, t->shadow + off, len) != 0) {
            memcpy(t->shadow + off, body + off, len);
            t->stamp[p] = d->stamp;
            d->changed++;
        }
    }
}

static bool page_is_zero(const uint8_t *p, size_t len)
{
    const uint64_t *w = (const uint64_t *)p;

    for (size_t i = 0; i < len / 8; i++)
        if (w[i])
            return false;
    return true;
}

/* Resolve the shard and check it can be tracked.  Returns the handle (and
 * its store name and geometry) or NULL with r set. */
static struct store_filter *pages_shard(struct node *n, const char *filter,
                                        unsigned index, char *sname,
                                        struct shard_geo *g,
                                        struct rpc_reply *r)
{
    struct store *s = node_rpc__need_store(n, r);
    struct store_filter *sf;
    int rc;

    if (!s)
        return NULL;
    if (!(sf = node_rpc__get_shard(s, filter, index, r)))
        return NULL;
    snprintf(sname, STORE_NAME_MAX + 1, "%s", store_filter_name(sf));
    if ((rc = store_filter_inspect(sf, geo_read, g)) < 0) {
        node_rpc__store_error(r, sf, filter, rc, NULL);
        store_put(sf);
        return NULL;
    }
    if ((g->kind != BF_KIND_BLOCKED && g->kind != BF_KIND_CLASSIC) ||
        g->layers != 1) {
        rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                        "shard %u of filter \"%s\" is a %s filter; only "
                        "blocked and classic filters merge page by page",
                        index, filter, bf_kind_name(g->kind));
        store_put(sf);
        return NULL;
    }
    return sf;
}

static int send_page(struct rpc_stream *st, const struct page_track *t,
                     uint64_t off, size_t len)
{
    Bloomgrid__V1__Page pg = BLOOMGRID__V1__PAGE__INIT;

    pg.layer = 0;
    pg.offset = off;
    pg.data.data = t->shadow + off;
    pg.data.len = len;
    pg.checksum = XXH64(t->shadow + off, len, 0);
    pg.epoch = t->epoch;
    return rpc_stream_write(st, &pg.base);
}

void node_rpc__h_pull_pages(void *arg, struct rpc_stream *st)
{
    struct node *n = arg;
    struct rpc_reply r = {.code = GRPC_STATUS_OK};
    Bloomgrid__V1__PullPagesRequest *m = NULL;
    struct store_filter *sf = NULL;
    struct page_track *t = NULL;
    char sname[STORE_NAME_MAX + 1];
    struct shard_geo g;
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
    if (m->page_size != 0 && m->page_size != PAGE_BYTES) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "page_size %u: this node tracks pages of %u bytes "
                        "(send 0)", m->page_size, PAGE_BYTES);
        goto done;
    }
    if (!(sf = pages_shard(n, m->filter, m->shard_index, sname, &g, &r)))
        goto done;
    if (!(t = track_lock(sname, &g, sf))) {
        rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    if (!t->shadow && !(t->shadow = calloc(1, t->body_bytes ? t->body_bytes
                                                            : 1))) {
        rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                        "no memory for the change-tracking copy of shard %u "
                        "of \"%s\" (%" PRIu64 " bytes)", m->shard_index,
                        m->filter, t->body_bytes);
        goto done;
    }
    uint64_t v = store_filter_version(sf);
    struct diff_ctx d = {.t = t, .stamp = v > t->tag ? v : t->tag + 1};
    if ((rc = store_filter_inspect(sf, diff_run, &d)) < 0) {
        node_rpc__store_error(&r, sf, m->filter, rc, NULL);
        goto done;
    }
    if (d.changed)
        t->tag = d.stamp;
    bool all = m->since_version == 0 || m->epoch != t->epoch;
    uint64_t pages = 0, bytes = 0;
    for (uint64_t p = 0; p < t->npages; p++) {
        uint64_t off = p * PAGE_BYTES;
        size_t plen = t->body_bytes - off < PAGE_BYTES
                          ? (size_t)(t->body_bytes - off) : PAGE_BYTES;
        if (all ? page_is_zero(t->shadow + off, plen)
                : t->stamp[p] <= m->since_version)
            continue;
        if (send_page(st, t, off, plen) < 0)
            goto gone;
        pages++;
        bytes += plen;
    }
    Bloomgrid__V1__Page last = BLOOMGRID__V1__PAGE__INIT;
    last.last = true;
    last.version = t->tag;
    last.epoch = t->epoch;
    last.store_version = v;
    last.fingerprint = t->fp;
    last.checksum = XXH64(NULL, 0, 0);
    if (rpc_stream_write(st, &last.base) < 0)
        goto gone;
    log_debug("pulled %" PRIu64 " pages (%" PRIu64 " bytes) of %s since %"
              PRIu64 ": version %" PRIu64, pages, bytes, sname,
              m->since_version, t->tag);
done:
    if (t)
        track_unlock(t);
    t = NULL;
    node_rpc__finish_reply(st, &r);
gone:
    if (t)
        track_unlock(t);
    if (sf)
        store_put(sf);
    if (m)
        bloomgrid__v1__pull_pages_request__free_unpacked(m, NULL);
}

/* After pages from elsewhere were ORed into the live filter: OR them into
 * the shadow too (the sender has them: do not pull them back) and raise
 * the primary version the shard covers.  t is locked. */
static void track_absorb(struct page_track *t, const struct store_page *pages,
                         size_t np, uint64_t source_version)
{
    for (size_t i = 0; t->shadow && i < np; i++) {
        uint64_t *sh = (uint64_t *)(t->shadow + pages[i].offset);
        const uint8_t *d = pages[i].data;
        for (size_t w = 0; w < pages[i].len / 8; w++) {
            uint64_t x;
            memcpy(&x, d + 8 * w, 8);
            sh[w] |= x;
        }
    }
    if (source_version > t->replica_version)
        t->replica_version = source_version;
}

int node_pages_apply(struct store_filter *sf, const char *fp,
                     const struct store_page *pages, size_t n,
                     uint64_t source_version, char *err)
{
    struct shard_geo g;
    struct page_track *t;
    int rc;

    if ((rc = store_filter_inspect(sf, geo_read, &g)) < 0)
        return rc;
    if ((g.kind != BF_KIND_BLOCKED && g.kind != BF_KIND_CLASSIC) ||
        g.layers != 1) {
        if (err)
            snprintf(err, STORE_ERRLEN, "a %s filter does not merge page by "
                     "page", bf_kind_name(g.kind));
        return -EOPNOTSUPP;
    }
    if (strcmp(fp, g.fp) != 0) {
        if (err)
            snprintf(err, STORE_ERRLEN, "pages of fingerprint \"%s\" refused: "
                     "the shard's is \"%s\"", fp, g.fp);
        return -ESTALE;
    }
    for (size_t i = 0; i < n; i++) {
        if (pages[i].layer != 0 || pages[i].offset % 8 || pages[i].len % 8 ||
            pages[i].offset > g.body_bytes ||
            pages[i].len > g.body_bytes - pages[i].offset) {
            if (err)
                snprintf(err, STORE_ERRLEN, "page at offset %" PRIu64 " (%zu "
                         "bytes) is outside the %" PRIu64 "-byte body",
                         pages[i].offset, pages[i].len, g.body_bytes);
            return -EINVAL;
        }
    }
    if (!(t = track_lock(store_filter_name(sf), &g, sf)))
        return -ENOMEM;
    if (n && (rc = store_or_pages(sf, pages, n, err)) < 0) {
        track_unlock(t);
        return rc;
    }
    track_absorb(t, pages, n, source_version);
    t->last_v = store_filter_version(sf);
    track_unlock(t);
    return 0;
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

/* Check every page; fill pages.  Returns false with r set. */
static bool push_check(struct push_msgs *pm, const struct page_track *t,
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
            m->offset > t->body_bytes ||
            m->data.len > t->body_bytes - m->offset) {
            rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                            "%s: page (layer %u, offset %" PRIu64 ", %zu bytes) "
                            "is outside the shard's %" PRIu64 "-byte body; "
                            "nothing was applied", label, m->layer, m->offset,
                            m->data.len, t->body_bytes);
            return false;
        }
        pages[k++] = (struct store_page){.layer = 0, .offset = m->offset,
                                         .data = m->data.data,
                                         .len = m->data.len};
    }
    *npages = k;
    return true;
}

void node_rpc__h_push_pages(void *arg, struct rpc_stream *st)
{
    struct node *n = arg;
    struct rpc_reply r = {.code = GRPC_STATUS_OK};
    struct push_msgs pm = {0};
    struct store_filter *sf = NULL;
    struct page_track *t = NULL;
    struct store_page *pages = NULL;
    char sname[STORE_NAME_MAX + 1], label[STORE_NAME_MAX + 48];
    char err[STORE_ERRLEN] = "";
    struct shard_geo g;
    size_t np = 0;
    int rc = push_collect(st, &pm, &r);

    if (rc < 0)
        goto gone;
    if (r.code != GRPC_STATUS_OK)
        goto done;
    if (pm.n == 0 || !pm.v[0]->shard || !pm.v[0]->shard->filter[0]) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "the first PushPagesRequest must name the shard");
        goto done;
    }
    Bloomgrid__V1__PushPagesRequest *h = pm.v[0];
    if (!(sf = pages_shard(n, h->shard->filter, h->shard->shard_index, sname,
                           &g, &r)))
        goto done;
    snprintf(label, sizeof label, "shard %u of \"%s\"", h->shard->shard_index,
             h->shard->filter);
    if (strcmp(h->fingerprint, g.fp) != 0) {
        rpc_reply_error(&r, GRPC_STATUS_FAILED_PRECONDITION,
                        "%s: pages of fingerprint \"%s\" refused: the shard's "
                        "is \"%s\" (another filter, geometry or secret)",
                        label, h->fingerprint, g.fp);
        goto done;
    }
    if (!(t = track_lock(sname, &g, sf)) ||
        !(pages = calloc(pm.n, sizeof *pages))) {
        rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    if (!push_check(&pm, t, label, pages, &np, &r))
        goto done;
    if (np && (rc = store_or_pages(sf, pages, np, err)) < 0) {
        node_rpc__store_error(&r, sf, label, rc, err);
        goto done;
    }
    track_absorb(t, pages, np, h->source_version);
    Bloomgrid__V1__PushPagesResponse resp =
        BLOOMGRID__V1__PUSH_PAGES_RESPONSE__INIT;
    resp.pages_merged = np;
    resp.version = store_filter_version(sf);
    t->last_v = resp.version;
    track_unlock(t);
    t = NULL;
    if (np)
        log_debug("merged %zu pushed pages into %s", np, sname);
    if (rpc_stream_write(st, &resp.base) < 0)
        goto gone;
done:
    if (t)
        track_unlock(t);
    t = NULL;
    node_rpc__finish_reply(st, &r);
gone:
    if (t)
        track_unlock(t);
    free(pages);
    if (sf)
        store_put(sf);
    push_msgs_free(&pm);
}
