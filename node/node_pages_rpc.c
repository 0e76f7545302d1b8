/* node_pages_rpc: the internal PullPages / PushPages calls, used by the
 * merger (docs/MERGER.md) and by anti-entropy between the copies of a
 * group (node_replicate.c, docs/REPLICATION.md).  A pull skips the pages
 * whose hashes the puller sent (it holds them already) and says in its
 * last message whether the shard is SYNCING here.
 *
 * The change tracking behind them is the store's (store.h, "Change
 * tracking"): a pull is store_pages_since streamed as Page messages, a push
 * is checked here (shard and fingerprint on its first message, before any
 * page is kept; each page as it arrives), spooled to disk, and given to
 * store_pages_merge a piece at a time once its stream completed (see
 * PushPages below); keys' hashes a merger pushes
 * instead of pages are added as adds (store_add_hashes: add records in the
 * log, so the next pull of this copy can still be keys).  Only blocked
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
#include "metrics.h"
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
    const uint64_t *have;            /* the caller's page hashes */
    size_t nhave;
    uint64_t skipped;                /* pages the caller holds already */
    uint64_t skipped_bytes;          /* and their bytes */
    bool gone;                       /* the client went away */
};

static int send_page(void *ctx, const struct store_page *pg)
{
    struct pull_ctx *c = ctx;
    Bloomgrid__V1__Page m = BLOOMGRID__V1__PAGE__INIT;
    uint64_t i = pg->offset / RULES_PAGE_BYTES;

    m.checksum = XXH64(pg->data, pg->len, 0);
    if (pg->layer == 0 && i < c->nhave && c->have[i] == m.checksum) {
        c->skipped++;
        c->skipped_bytes += pg->len;
        return 0;
    }
    m.layer = pg->layer;
    m.offset = pg->offset;
    m.data.data = (uint8_t *)pg->data;
    m.data.len = pg->len;
    m.epoch = c->mark->epoch;
    /* The fingerprint in every message: the puller checks it on the first
     * page and may OR each page in as it arrives. */
    m.fingerprint = (char *)c->mark->fp;
    if (rpc_stream_write(c->st, &m.base) < 0) {
        c->gone = true;
        return -EPIPE;
    }
    return 0;
}

/* Keys' hashes of a pull, sent 64 KiB (4096 keys) a message. */
struct keys_ctx {
    struct rpc_stream *st;
    uint64_t epoch;
    const char *fp;                  /* the shard's fingerprint id */
    bool gone;
};

static int send_keys(void *ctx, const struct bf_hash *h, size_t n)
{
    enum { PER_MSG = RULES_PAGE_BYTES / 16 };
    struct keys_ctx *c = ctx;
    uint8_t *buf = malloc(PER_MSG * 16);

    if (!buf)
        return -ENOMEM;
    for (size_t i = 0; i < n; i += PER_MSG) {
        size_t k = n - i < PER_MSG ? n - i : PER_MSG;
        Bloomgrid__V1__Page m = BLOOMGRID__V1__PAGE__INIT;
        for (size_t j = 0; j < k; j++) {
            for (int b = 0; b < 8; b++) {
                buf[16 * j + b] = (uint8_t)(h[i + j].h1 >> (8 * b));
                buf[16 * j + 8 + b] = (uint8_t)(h[i + j].h2 >> (8 * b));
            }
        }
        m.key_hashes.data = buf;
        m.key_hashes.len = k * 16;
        m.checksum = XXH64(buf, k * 16, 0);
        m.epoch = c->epoch;
        m.fingerprint = (char *)c->fp;
        if (rpc_stream_write(c->st, &m.base) < 0) {
            c->gone = true;
            free(buf);
            return -EPIPE;
        }
    }
    free(buf);
    return 0;
}

/* What pulls sent, by kind (metrics.h). */
static void pull_bytes_add(const char *kind, uint64_t bytes)
{
    const char *labels[] = {"kind", kind, NULL};
    metric_add(metrics_counter(metrics_registry(), "bloomgrid_pull_bytes_total",
                               "bytes this node sent to pullers (other copies' "
                               "anti-entropy, the merger): kind=\"pages\" the "
                               "changed pages' data, kind=\"hashes\" the keys' "
                               "16-byte hashes of add-only log ranges",
                               labels), bytes);
}

void node_rpc__pull_bytes_register(void)
{
    pull_bytes_add("pages", 0);
    pull_bytes_add("hashes", 0);
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
    if (node_rpc__refuse_version(&r, m->topology_version) ||
        !(s = node_rpc__need_store(n, &r)) ||
        !(sf = node_rpc__get_shard(s, m->filter, m->shard_index, &r)))
        goto done;
    snprintf(label, sizeof label, "shard %u of \"%s\"", m->shard_index,
             m->filter);
    if (m->n_page_hashes) {
        struct shard_geo g = {0};
        uint64_t np;
        if ((rc = store_filter_inspect(sf, geo_read, &g)) < 0) {
            node_rpc__store_error(&r, sf, label, rc, NULL);
            goto done;
        }
        np = (g.body_bytes + RULES_PAGE_BYTES - 1) / RULES_PAGE_BYTES;
        if (m->n_page_hashes > np) {
            rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                            "%s: %zu page hashes for a shard of %" PRIu64
                            " pages", label, m->n_page_hashes, np);
            goto done;
        }
        c.have = m->page_hashes;
        c.nhave = m->n_page_hashes;
    }
    /* Read before the walk: a shard that was SYNCING when its pages were
     * read may lack acknowledged writes, and the puller must know. */
    bool syncing = node_rpc__shard_syncing(sf);
    /* Keys instead of pages when the caller takes them and they are
     * smaller (store_keys_since); pages otherwise, and also after keys
     * when the log lost a record under the pull. */
    bool keyed = false;
    uint64_t keys = 0;
    if (m->accept_key_hashes && m->since_version) {
        struct keys_ctx kc = {.st = st, .epoch = m->epoch, .fp = mark.fp};
        char kerr[STORE_ERRLEN] = "";
        rc = store_keys_since(sf, m->epoch, m->since_version, send_keys, &kc,
                              &mark, kerr);
        keys = mark.keys;
        if (keys)
            pull_bytes_add("hashes", mark.bytes);
        if (kc.gone)
            goto gone;
        if (rc == 0) {
            keyed = true;
        } else if (rc == 1) {
            log_debug("pull of %s since %" PRIu64 ": pages: %s",
                      store_filter_name(sf), m->since_version, kerr);
        } else if (rc == -EOPNOTSUPP) {
            rpc_reply_error(&r, GRPC_STATUS_FAILED_PRECONDITION, "%s: %s",
                            label, kerr);
            goto done;
        } else {
            node_rpc__store_error(&r, sf, label, rc, kerr);
            goto done;
        }
    }
    if (!keyed) {
        rc = store_pages_since(sf, m->epoch, m->since_version, send_page, &c,
                               &mark, err);
        pull_bytes_add("pages", mark.bytes - c.skipped_bytes);
    }
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
    log_debug("pulled %" PRIu64 " keys, %" PRIu64 " pages (%" PRIu64
              " bytes, %" PRIu64 " of them held by the caller) of %s since %"
              PRIu64 ": version %" PRIu64, keys, keyed ? 0 : mark.pages,
              keyed ? 0 : mark.bytes, c.skipped, store_filter_name(sf),
              m->since_version, mark.version);
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

/* PushPages: the first message names the shard, which is found and whose
 * fingerprint is checked before any page is kept; each page (or message of
 * keys' hashes) is then checked as it arrives and written to a spool file
 * in the data directory (store_spool, as an Import's file), up to
 * max_push_mb bytes per stream.  Memory holds where each message lies in
 * the spool (struct push_item, 32 bytes a message), never the pages: a
 * push of a whole shard to a copy that lacks it (the merger's, while the
 * copy re-syncs) costs the node a piece, not the shard.  Only a stream
 * that completed is applied (push_apply): its pages read back
 * PUSH_PIECE_PAGES at a time, each checked against its checksum again,
 * each piece ORed in as one durable store_pages_merge and the source
 * version claimed with the last, then the keys' hashes as adds
 * (push_add_keys).  A stream refused or cut short applies nothing. */

/* Pages ORed in by one store_pages_merge of a push (1 MiB of 64 KiB
 * pages): the piece held in memory, and what its log record copies at
 * most.  Smaller than a pull's (REPL_MERGE_PAGES, 4 MiB): a merger pushes
 * from several workers at once, and its pushes are off the path of any
 * client's call. */
#define PUSH_PIECE_PAGES 16

struct push_item {
    uint64_t offset;             /* a page's offset in the layer body */
    uint64_t at;                 /* where its bytes lie in the spool */
    uint64_t checksum;           /* XXH64 of them, as sent */
    uint32_t len;
    bool keys;                   /* keys' hashes, not a page */
};

struct push_msgs {
    struct store_spool *sp;      /* made at the first page or keys */
    struct push_item *v;
    size_t n, cap;
    uint64_t bytes;              /* spooled */
    uint64_t keys;               /* keys' hashes among them */
    size_t pages;                /* pages among them */
    size_t maxlen;               /* the largest message's bytes */
    uint64_t vbytes;             /* v's, reserved in s (max_memory_mb) */
    struct store *s;
};

/* Read item it back from the spool into buf and check it against the
 * checksum it came with.  Returns 0, or a negative errno with err set. */
static int push_read(struct push_msgs *pm, const struct push_item *it, uint8_t *buf,
                     char *err)
{
    int rc = store_spool_read(pm->sp, it->at, buf, it->len, err);

    if (rc == 0 && XXH64(buf, it->len, 0) != it->checksum) {
        snprintf(err, STORE_ERRLEN, "the push's spool file changed on disk after "
                 "its pages were checked");
        rc = -EIO;
    }
    return rc;
}

/* Add the keys' hashes of a push, as adds (add records in the log: a later
 * pull of this copy may still be answered with keys), in calls of at most
 * STORE_KEYS_CHUNK keys (a buffer reserved against max_memory_mb), each
 * message read back into buf.  Returns 0, or the error of
 * store_add_hashes (or -ENOMEM, or a spool read's error with *spool set)
 * with err set; the keys added before an error stay (bits only add). */
static int push_add_keys(struct store_filter *sf, struct push_msgs *pm,
                         uint8_t *buf, bool *spool, char *err)
{
    size_t cap = pm->keys < STORE_KEYS_CHUNK ? (size_t)pm->keys
                                             : STORE_KEYS_CHUNK;
    uint64_t bytes = (uint64_t)cap * sizeof(struct bf_hash);
    struct bf_hash *h;
    size_t n = 0;
    int rc = 0;

    if (store_reserve(pm->s, bytes, "the keys of a push", err) < 0)
        return -ENOMEM;
    if (!(h = malloc(bytes ? bytes : 1))) {
        store_release(pm->s, bytes);
        snprintf(err, STORE_ERRLEN, "no memory for the keys of a push");
        return -ENOMEM;
    }
    for (size_t i = 0; i < pm->n && rc == 0; i++) {
        const struct push_item *it = &pm->v[i];
        if (!it->keys)
            continue;
        if ((rc = push_read(pm, it, buf, err)) < 0) {
            *spool = true;
            break;
        }
        for (size_t j = 0; j < it->len / 16; j++) {
            uint64_t h1 = 0, h2 = 0;
            for (int b = 7; b >= 0; b--) {
                h1 = h1 << 8 | buf[16 * j + b];
                h2 = h2 << 8 | buf[16 * j + 8 + b];
            }
            h[n++] = (struct bf_hash){h1, h2};
            if (n == cap) {
                if ((rc = store_add_hashes(sf, h, n, NULL, err)) < 0)
                    break;
                n = 0;
            }
        }
    }
    if (rc == 0 && n)
        rc = store_add_hashes(sf, h, n, NULL, err);
    free(h);
    store_release(pm->s, bytes);
    return rc;
}

/* Apply a completed push: its pages a piece at a time (the source version
 * with the last piece; with no page and no key, the durable no-op a pull
 * relies on), then its keys.  buf holds a piece (PUSH_PIECE_PAGES pages,
 * or the largest message if larger).  Returns 0, or a negative errno with
 * err set: of the store (its merge, its adds), -ENOMEM (the keys'
 * buffer), or of reading the spool back (*spool set).  Pieces applied
 * before an error stay (bits only add: the sender's retry completes it);
 * the source version is claimed only with every page. */
static int push_apply(struct store_filter *sf, struct push_msgs *pm, uint8_t *buf,
                      size_t bufcap, uint64_t source_version, bool *spool, char *err)
{
    struct store_page pg[PUSH_PIECE_PAGES];
    size_t k = 0, used = 0, seen = 0;
    int rc = 0;

    *spool = false;
    if (!pm->pages && !pm->keys)
        return store_pages_merge(sf, NULL, 0, source_version, err);
    for (size_t i = 0; i < pm->n && pm->pages; i++) {
        const struct push_item *it = &pm->v[i];
        if (it->keys)
            continue;
        if (k == PUSH_PIECE_PAGES || it->len > bufcap - used) {
            if ((rc = store_pages_merge(sf, pg, k, 0, err)) < 0)
                return rc;
            k = used = 0;
        }
        if ((rc = push_read(pm, it, buf + used, err)) < 0) {
            *spool = true;
            return rc;
        }
        pg[k++] = (struct store_page){.layer = 0, .offset = it->offset,
                                      .data = buf + used, .len = it->len};
        used += it->len;
        if (++seen == pm->pages &&
            (rc = store_pages_merge(sf, pg, k, source_version, err)) < 0)
            return rc;
    }
    return pm->keys ? push_add_keys(sf, pm, buf, spool, err) : 0;
}

static void push_msgs_free(struct push_msgs *pm)
{
    store_spool_free(pm->sp);
    free(pm->v);
    if (pm->vbytes)
        store_release(pm->s, pm->vbytes);
}

/* Check one message of keys' hashes; false with r set. */
static bool push_keys_ok(const Bloomgrid__V1__PushPagesRequest *m,
                         const char *label, struct rpc_reply *r)
{
    if (m->data.len) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: a PushPagesRequest holds page data or keys' "
                        "hashes, not both; nothing was applied", label);
        return false;
    }
    if (m->key_hashes.len % 16 || m->key_hashes.len > RULES_PAGE_BYTES) {
        rpc_reply_error(r, GRPC_STATUS_INVALID_ARGUMENT,
                        "%s: %zu bytes of keys' hashes in a message (16 a "
                        "key, at most %u bytes); nothing was applied", label,
                        m->key_hashes.len, RULES_PAGE_BYTES);
        return false;
    }
    if (XXH64(m->key_hashes.data, m->key_hashes.len, 0) != m->checksum) {
        rpc_reply_error(r, GRPC_STATUS_DATA_LOSS,
                        "%s: %zu keys' hashes fail their checksum; nothing "
                        "was applied", label, m->key_hashes.len / 16);
        return false;
    }
    return true;
}

/* Check one page against the shard's body; false with r set. */
static bool push_page_ok(const Bloomgrid__V1__PushPagesRequest *m,
                         uint64_t body_bytes, const char *label,
                         struct rpc_reply *r)
{
    if (m->key_hashes.len)
        return push_keys_ok(m, label, r);
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
    return true;
}

/* Spool m's page or keys' hashes and note where they lie (m is freed
 * here); false with r set when the stream goes past its bound, the spool
 * cannot take it, or memory is short. */
static bool push_keep(struct push_msgs *pm, Bloomgrid__V1__PushPagesRequest *m,
                      uint64_t limit, const char *label, struct rpc_reply *r)
{
    bool keys = m->key_hashes.len > 0;
    const uint8_t *data = keys ? m->key_hashes.data : m->data.data;
    size_t len = keys ? m->key_hashes.len : m->data.len;
    char err[STORE_ERRLEN];
    int rc;

    if (pm->bytes + len > limit) {
        rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED,
                        "%s: PushPages stream past max_push_mb (%" PRIu64
                        " MiB); nothing was applied: push in smaller streams",
                        label, limit >> 20);
        goto refuse;
    }
    if (pm->n == pm->cap) {
        /* Where the messages lie is memory (32 bytes each, however small
         * the message): reserved against max_memory_mb as it grows. */
        size_t cap = pm->cap ? 2 * pm->cap : 64;
        uint64_t more = (uint64_t)(cap - pm->cap) * sizeof *pm->v;
        if (store_reserve(pm->s, more, "PushPages", err) < 0) {
            rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: %s; nothing "
                            "was applied", label, err);
            goto refuse;
        }
        void *nv = realloc(pm->v, cap * sizeof *pm->v);
        if (!nv) {
            store_release(pm->s, more);
            rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            goto refuse;
        }
        pm->v = nv;
        pm->cap = cap;
        pm->vbytes += more;
    }
    if ((!pm->sp && (rc = store_spool_new(pm->s, limit, &pm->sp, err)) < 0) ||
        (rc = store_spool_write(pm->sp, data, len, err)) < 0) {
        if (rc == -EDQUOT)
            rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: the pushes "
                            "and Imports waiting on disk would pass "
                            "max_memory_mb; nothing was applied", label);
        else if (rc == -ENOSPC)
            rpc_reply_error(r, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: the push "
                            "would leave less than %" PRIu64 " MiB free on the "
                            "data directory's file system; nothing was applied",
                            label, STORE_SPOOL_FREE_MIN >> 20);
        else
            rpc_reply_error(r, GRPC_STATUS_INTERNAL, "%s: cannot spool the "
                            "push (%s); nothing was applied", label,
                            strerror(-rc));
        if (rc != -EDQUOT && rc != -ENOSPC)
            log_warn("PushPages of %s: %s", label, err);
        goto refuse;
    }
    pm->v[pm->n++] = (struct push_item){.offset = m->offset,
                                        .at = pm->bytes,
                                        .checksum = m->checksum,
                                        .len = (uint32_t)len,
                                        .keys = keys};
    pm->bytes += len;
    if (keys)
        pm->keys += len / 16;
    else
        pm->pages++;
    if (len > pm->maxlen)
        pm->maxlen = len;
    bloomgrid__v1__push_pages_request__free_unpacked(m, NULL);
    return true;
refuse:
    bloomgrid__v1__push_pages_request__free_unpacked(m, NULL);
    return false;
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

/* Was (filter, index) with fingerprint fp dropped on this node?  Under
 * either store name the shard may have had. */
static bool push_dropped(struct store *s, const char *filter, unsigned index,
                         const char *fp)
{
    char sname[STORE_NAME_MAX + 1];

    if (index < RULES_SHARDS_MAX &&
        rules_shard_name(sname, sizeof sname, filter, index, RULES_SHARDS_MAX,
                         NULL) == 0 &&
        store_dropped(s, sname, 0, fp))
        return true;
    return index == 0 && store_dropped(s, filter, 0, fp);
}

static void push_refuse_dropped(struct rpc_reply *r, const char *label)
{
    rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                    "%s was dropped on this node: pages of that filter are "
                    "refused (only an undrop brings it back; a filter created "
                    "again under the name has a new secret)", label);
}

/* The first message: the shard found and its fingerprint checked.  Returns
 * the shard (a reference) or NULL with r set. */
static struct store_filter *push_open(struct node *n,
                                      const Bloomgrid__V1__PushPagesRequest *h,
                                      const char *label, struct shard_geo *g,
                                      struct rpc_reply *r)
{
    struct store_filter *sf = NULL;
    struct store *s;

    if (!(s = node_rpc__need_store(n, r)))
        return NULL;
    if (!(sf = node_rpc__get_shard(s, h->shard->filter, h->shard->shard_index,
                                   r))) {
        if (push_dropped(s, h->shard->filter, h->shard->shard_index,
                         h->fingerprint))
            push_refuse_dropped(r, label);
        return NULL;
    }
    if (!push_geo(sf, label, g, r))
        goto fail;
    if (strcmp(h->fingerprint, g->fp) != 0) {
        if (store_dropped(s, store_filter_name(sf), 0, h->fingerprint))
            push_refuse_dropped(r, label);
        else
            rpc_reply_error(r, GRPC_STATUS_FAILED_PRECONDITION,
                            "%s: pages of fingerprint \"%s\" refused: the "
                            "shard's is \"%s\" (another filter, geometry or "
                            "secret)", label, h->fingerprint, g->fp);
        goto fail;
    }
    return sf;
fail:
    store_put(sf);
    return NULL;
}

void node_rpc__h_push_pages(void *arg, struct rpc_stream *st)
{
    struct node *n = arg;
    struct rpc_reply r = {.st.code = GRPC_STATUS_OK};
    struct push_msgs pm = {0};
    struct store_filter *sf = NULL;
    uint8_t *pbuf = NULL;
    uint64_t reserved = 0;
    Bloomgrid__V1__PushPagesRequest *h = NULL;
    char label[STORE_NAME_MAX + 48];
    char err[STORE_ERRLEN] = "";
    uint64_t limit = n->cfg.max_push_mb << 20;
    struct shard_geo g;
    const uint8_t *buf;
    size_t len, np = 0;
    int rc = rpc_stream_read(st, &buf, &len);

    if (rc < 0)
        goto gone;
    if (rc == 0 || !(h = bloomgrid__v1__push_pages_request__unpack(NULL, len,
                                                                   buf)) ||
        !h->shard || !h->shard->filter[0]) {
        rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                        "the first PushPagesRequest must name the shard");
        goto done;
    }
    snprintf(label, sizeof label, "shard %u of \"%s\"", h->shard->shard_index,
             h->shard->filter);
    /* Nothing is kept before the shard and its identity are known. */
    if (!(sf = push_open(n, h, label, &g, &r)))
        goto done;
    pm.s = node_store(n);
    uint64_t source_version = h->source_version;
    if (h->data.len || h->key_hashes.len) {
        if (!push_page_ok(h, g.body_bytes, label, &r) ||
            !push_keep(&pm, h, limit, label, &r))
            goto done;
    } else {
        bloomgrid__v1__push_pages_request__free_unpacked(h, NULL);
    }
    h = NULL;
    while ((rc = rpc_stream_read(st, &buf, &len)) > 0) {
        Bloomgrid__V1__PushPagesRequest *m =
            bloomgrid__v1__push_pages_request__unpack(NULL, len, buf);
        if (!m) {
            rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                            "malformed PushPagesRequest message %zu",
                            pm.n + 1);
            goto done;
        }
        if (m->shard) {
            bloomgrid__v1__push_pages_request__free_unpacked(m, NULL);
            rpc_reply_error(&r, GRPC_STATUS_INVALID_ARGUMENT,
                            "only the first PushPagesRequest names the shard");
            goto done;
        }
        if (!push_page_ok(m, g.body_bytes, label, &r)) {
            bloomgrid__v1__push_pages_request__free_unpacked(m, NULL);
            goto done;
        }
        if (!push_keep(&pm, m, limit, label, &r))
            goto done;
    }
    if (rc < 0)
        goto gone;   /* cut short: nothing applied, nothing claimed */
    /* The piece buffer, reserved while held (the spool is on disk). */
    size_t piece = (size_t)PUSH_PIECE_PAGES * RULES_PAGE_BYTES;
    if (pm.maxlen > piece)
        piece = pm.maxlen;
    if (!pm.n)
        piece = 0;
    if (piece && store_reserve(pm.s, piece, "a push's piece", err) < 0) {
        rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: %s", label, err);
        goto done;
    }
    reserved = piece;
    if (piece && !(pbuf = malloc(piece))) {
        rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        goto done;
    }
    bool spool_err = false;
    if ((rc = push_apply(sf, &pm, pbuf, piece, source_version, &spool_err, err)) < 0) {
        if (spool_err) {
            log_warn("PushPages of %s: %s", label, err);
            rpc_reply_error(&r, GRPC_STATUS_INTERNAL, "%s: %s", label, err);
        } else if (rc == -ENOMEM) {
            rpc_reply_error(&r, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: %s",
                            label, err);
        } else {
            node_rpc__store_error(&r, sf, label, rc, err);
        }
        goto done;
    }
    np = pm.pages;
    Bloomgrid__V1__PushPagesResponse resp =
        BLOOMGRID__V1__PUSH_PAGES_RESPONSE__INIT;
    resp.pages_merged = np;
    resp.keys_added = pm.keys;
    resp.version = store_filter_version(sf);
    if (np || pm.keys)
        log_debug("merged %zu pushed pages and %" PRIu64 " keys into %s", np,
                  pm.keys, store_filter_name(sf));
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
    if (h)
        bloomgrid__v1__push_pages_request__free_unpacked(h, NULL);
    free(pbuf);
    if (reserved)
        store_release(pm.s, reserved);
    push_msgs_free(&pm);
}
