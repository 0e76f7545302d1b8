/* store_filter: one filter of the store: its state, data operations
 * (synchronous ones built on the asynchronous ones), imports, copies and
 * the replay of its log records.  See store.h for the ordering rule between
 * checkpoints and the log, store_internal.h for locks.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <xxhash.h>

#include "log.h"
#include "metrics.h"
#include "store_internal.h"
#include "wal.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "WAL payloads store struct bf_hash as is: little-endian hosts only"
#endif

struct store_filter *store__filter_new(struct store *s, const char *name)
{
    struct store_filter *sf = calloc(1, sizeof(*sf));
    pthread_rwlockattr_t a;

    if (!sf)
        return NULL;
    sf->s = s;
    sf->name = strdup(name);
    sf->chain = calloc(1, sizeof *sf->chain);
    if (!sf->name || !sf->chain ||
        asprintf(&sf->path, "%s/%s", s->dir, name) < 0) {
        free(sf->name);
        free(sf->chain);
        free(sf);
        return NULL;
    }
    atomic_init(&sf->refs, 1);
    atomic_init(&sf->version, 0);
    atomic_init(&sf->source_version, 0);
    atomic_init(&sf->ckpt_lsn, UINT64_MAX);   /* holds no log until loaded */
    pthread_mutex_init(&sf->snap_mu, NULL);
    pthread_mutex_init(&sf->marks_mu, NULL);
    pthread_mutex_init(&sf->write_mu, NULL);
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(
        &a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&sf->lock, &a);
    pthread_rwlockattr_destroy(&a);
    sf->state = STORE_RECOVERING;
    return sf;
}

void store__filter_free(struct store_filter *sf)
{
    atomic_fetch_sub(&sf->s->charged, atomic_load(&sf->charge));
    store__copy_reset(sf, 0);
    wal_stream_close(sf->stream);
    bf_destroy(sf->bf);
    pthread_mutex_destroy(&sf->snap_mu);
    pthread_mutex_destroy(&sf->marks_mu);
    pthread_mutex_destroy(&sf->write_mu);
    pthread_rwlock_destroy(&sf->lock);
    free(sf->name);
    free(sf->path);
    free(sf->chain);
    free(sf);
}

struct store_filter *store_ref(struct store_filter *sf)
{
    atomic_fetch_add(&sf->refs, 1);
    return sf;
}

void store_put(struct store_filter *sf)
{
    if (sf && atomic_fetch_sub(&sf->refs, 1) == 1)
        store__filter_free(sf);
}

void store__raise(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);

    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

int store__state_errno(enum store_state st)
{
    switch (st) {
    case STORE_READY:
        return 0;
    case STORE_RECOVERING:
        return -EAGAIN;
    case STORE_DROPPED:
        return -ENOENT;
    default:
        return -EIO;
    }
}

enum store_state store__state(struct store_filter *sf)
{
    if (sf->state == STORE_READY && wal_stream_failed(sf->stream, NULL))
        return STORE_FAILED;
    return sf->state;
}

int store__state_rc(struct store_filter *sf)
{
    if (sf->state == STORE_READY && wal_stream_failed(sf->stream, NULL))
        return wal_stream_error(sf->stream);
    if (sf->state == STORE_FAILED && sf->err)
        return sf->err;
    return store__state_errno(sf->state);
}

bool store__readable(struct store_filter *sf)
{
    return sf->bf && (sf->state == STORE_READY || sf->state == STORE_FAILED);
}

void store__state_err(struct store_filter *sf, char *err)
{
    char why[WAL_ERRLEN];

    if (sf->state == STORE_READY && wal_stream_failed(sf->stream, why)) {
        errmsg_set(err, "filter '%s' takes no writes: %s; " STORE_NO_WRITES,
                   sf->name, why);
        return;
    }
    switch (sf->state) {
    case STORE_RECOVERING:
        errmsg_set(err, "filter '%s' is recovering; retry shortly",
                      sf->name);
        break;
    case STORE_DROPPED:
        errmsg_set(err, "filter '%s' was dropped", sf->name);
        break;
    case STORE_FAILED:
        errmsg_set(err, sf->bf ? "filter '%s' takes no writes: %s"
                               : "filter '%s' is not served: %s",
                   sf->name, sf->why);
        break;
    default:
        break;
    }
}


void store__filter_fail(struct store_filter *sf, const char *why, bool retry)
{
    pthread_rwlock_wrlock(&sf->lock);
    sf->state = STORE_FAILED;
    store__strfmt(sf->why, sizeof(sf->why), "%s", why);
    sf->err = 0;
    sf->retry = retry;
    sf->failed_ms = store__now_ms();
    pthread_rwlock_unlock(&sf->lock);
}

int store__filter_install(struct store_filter *sf, struct bf *f,
                          uint64_t next_seq)
{
    struct wal_stream *st = NULL;

    /* Every change is tracked from here on (store_pages.c, checkpoints).
     * Bits that come untracked (a filter given to store_create_from, a
     * migration) have their set pages stamped, so that no set page has
     * version 0 (a base skips those unread). */
    bool fresh = !bf_tracked(f);
    if (bf_track_pages(f, true) == 0 && fresh)
        store__stamp_nonzero(f, next_seq - 1);
    if (!bf_tracked(f) ||
        !(st = wal_stream_open(sf->s->wal, sf->id, sf->name, next_seq))) {
        bf_destroy(f);
        store__filter_fail(sf, st ? "no memory for the filter's log stream"
                                  : "no memory for the filter's page versions",
                           true);
        wal_stream_close(st);
        return -ENOMEM;
    }
    /* The charge follows the bits installed (a load, a recovery). */
    uint64_t charge = store__charge_of(f);
    uint64_t old = atomic_exchange(&sf->charge, charge);
    atomic_fetch_add(&sf->s->charged, charge);
    atomic_fetch_sub(&sf->s->charged, old);
    pthread_rwlock_wrlock(&sf->lock);
    sf->bf = f;
    /* The page versions are seqs.  A reload after a failed write gives
     * the seqs of records that never became durable to new ones: pullers
     * that saw the old stamps start over in a new epoch.  Otherwise the
     * reloaded bits carry the stamps they had (replayed records stamp
     * their own seqs), and pullers go on. */
    if (!atomic_load(&sf->pages_epoch) || next_seq <= sf->seq_hwm)
        atomic_store(&sf->pages_epoch, store__random_id());
    sf->stream = st;
    /* A copy of records begins with the new stream's next record. */
    store__copy_reset(sf, next_seq);
    sf->exact = bf_kind(f) == BF_KIND_COUNTING ||
                bf_kind(f) == BF_KIND_SCALABLE;
    /* Mutations are serialized by write_mu, so plain stores suffice. */
    bf_set_exclusive(f, true);
    sf->state = STORE_READY;
    sf->why[0] = 0;
    sf->err = 0;
    sf->retry = false;
    pthread_rwlock_unlock(&sf->lock);
    store__raise(&sf->version, next_seq - 1);
    return 0;
}

const char *store_filter_name(const struct store_filter *sf)
{
    return sf->name;
}

/* OR len bytes of words at byte offset off of layer `layer` of f; true
 * when that set a bit f lacked.  The caller has checked the geometry
 * (pages_check); the writer is exclusive (write_mu, or a replay), so no
 * bit appears meanwhile. */
static bool pages_or_one(struct bf *f, uint32_t layer, uint64_t off,
                         const uint8_t *data, size_t len)
{
    uint64_t *body = bf_layer_body(f, layer) + off / 8;
    bool added = false;

    for (size_t i = 0; i < len / 8; i++) {
        uint64_t w;
        memcpy(&w, data + 8 * i, 8);   /* payloads are not aligned */
        if (w && (w & ~__atomic_load_n(&body[i], __ATOMIC_RELAXED))) {
            bf_stamp_range(f, layer, off + 8 * i, 8);
            __atomic_fetch_or(&body[i], w, __ATOMIC_RELAXED);
            added = true;
        }
    }
    return added;
}

/* Is a page inside f's geometry (and f a kind whose bits OR)?  Returns 0,
 * -EOPNOTSUPP or -EINVAL. */
static int pages_check(const struct bf *f, uint32_t layer, uint64_t off,
                       uint64_t len)
{
    struct bf_layer_info li;

    if (bf_kind(f) != BF_KIND_BLOCKED && bf_kind(f) != BF_KIND_CLASSIC)
        return -EOPNOTSUPP;
    if (bf_layer_info(f, layer, &li) < 0 || off % 8 || len % 8 ||
        off > li.body_bytes || len > li.body_bytes - off)
        return -EINVAL;
    return 0;
}

/* Replay a WAL_REC_PAGES payload into f. */
static int replay_pages(struct bf *f, const uint8_t *p, uint64_t len)
{
    while (len) {
        uint32_t layer, plen;
        uint64_t off;
        if (len < 16)
            return -EBADMSG;
        memcpy(&layer, p, 4);
        memcpy(&plen, p + 4, 4);
        memcpy(&off, p + 8, 8);
        if (len - 16 < plen || pages_check(f, layer, off, plen) < 0)
            return -EBADMSG;
        pages_or_one(f, layer, off, p + 16, plen);
        p += 16 + (uint64_t)plen;
        len -= 16 + (uint64_t)plen;
    }
    return 0;
}

/* The payload of a WAL_REC_COUNTS record of an import's counts (ins,
 * keys, n layer counts) into p (COUNTS_BYTES(n) bytes). */
#define COUNTS_BYTES(n) (24 + 8 * (uint64_t)(n))

static void counts_encode(uint8_t *p, const struct store_import_counts *c)
{
    uint32_t zero = 0;

    memcpy(p, &c->inserts, 8);
    memcpy(p + 8, &c->keys, 8);
    memcpy(p + 16, &c->nlayers, 4);
    memcpy(p + 20, &zero, 4);
    memcpy(p + 24, c->layer_counts, 8 * (size_t)c->nlayers);
}

/* Replay a WAL_REC_COUNTS payload into f. */
static int replay_counts(struct bf *f, const uint8_t *p, uint64_t len)
{
    struct store_import_counts c;

    if (len < 24)
        return -EBADMSG;
    memcpy(&c.inserts, p, 8);
    memcpy(&c.keys, p + 8, 8);
    memcpy(&c.nlayers, p + 16, 4);
    if (c.nlayers > BF_MAX_LAYERS || len != COUNTS_BYTES(c.nlayers))
        return -EBADMSG;
    memcpy(c.layer_counts, p + 24, 8 * (size_t)c.nlayers);
    bf_merge_counts(f, c.inserts, c.keys, c.layer_counts, c.nlayers);
    return 0;
}

void store__stamp_nonzero(struct bf *f, uint64_t seq)
{
    uint32_t nl = bf_layer_count(f);

    bf_set_stamp(f, seq ? seq : 1);   /* a set page's version is never 0 */
    for (uint32_t l = 0; l < nl; l++) {
        struct bf_layer_info li;
        const uint64_t *body = bf_layer_body_const(f, l);
        if (bf_layer_info(f, l, &li) < 0)
            continue;
        for (uint64_t off = 0; off < li.body_bytes; off += BF_PAGE_BYTES) {
            uint64_t len = li.body_bytes - off < BF_PAGE_BYTES
                               ? li.body_bytes - off : BF_PAGE_BYTES;
            for (uint64_t w = 0; w < len / 8; w++)
                if (body[off / 8 + w]) {
                    bf_stamp_range(f, l, off, len);
                    break;
                }
        }
    }
}

void store__stamp_next(struct store_filter *sf)
{
    bf_set_stamp(sf->bf, wal_stream_last_seq(sf->stream) + 1);
}

int store__replay_apply(struct bf *f, uint64_t seq, uint32_t type,
                        const void *payload, uint64_t len)
{
    struct bf_hash h[512];
    const uint8_t *p = payload;
    char err[BF_ERRLEN];

    /* A replayed record's pages are changes after the checkpoint it is
     * replayed onto: the next checkpoint writes them. */
    bf_set_stamp(f, seq);
    switch (type) {
    case WAL_REC_ADD:
    case WAL_REC_REMOVE:
        if (len % sizeof(struct bf_hash))
            return -EBADMSG;
        /* Copy out: records are not aligned for struct access. */
        while (len) {
            size_t k = len / sizeof(h[0]);
            if (k > 512)
                k = 512;
            memcpy(h, p, k * sizeof(h[0]));
            if (type == WAL_REC_ADD)
                bf_add_hashes(f, h, k, NULL);
            else
                for (size_t i = 0; i < k; i++)
                    (void)bf_remove_hash(f, h[i]);
            p += k * sizeof(h[0]);
            len -= k * sizeof(h[0]);
        }
        return 0;
    case WAL_REC_IMPORT:
        /* Verified whole, then merged from the record's bytes a piece at
         * a time: the file is never held twice. */
        if (bf_file_scan_mem(payload, (size_t)len, NULL, NULL, NULL, err) < 0)
            return -EBADMSG;
        return bf_merge_file(f, payload, (size_t)len, NULL, err);
    case WAL_REC_PAGES:
        return replay_pages(f, payload, len);
    case WAL_REC_COUNTS:
        return replay_counts(f, payload, len);
    default:
        return -EBADMSG;
    }
}

int store_filter_recover(struct store_filter *sf, char *err)
{
    struct wal_stream *st;
    struct bf *f;
    int rc;

    pthread_mutex_lock(&sf->snap_mu);
    pthread_rwlock_wrlock(&sf->lock);
    if (sf->state == STORE_DROPPED) {
        store__state_err(sf, err);
        pthread_rwlock_unlock(&sf->lock);
        pthread_mutex_unlock(&sf->snap_mu);
        return -ENOENT;
    }
    f = sf->bf;
    st = sf->stream;
    if (st && wal_stream_last_seq(st) > sf->seq_hwm)
        sf->seq_hwm = wal_stream_last_seq(st);
    sf->bf = NULL;
    sf->stream = NULL;
    sf->state = STORE_RECOVERING;
    pthread_rwlock_unlock(&sf->lock);
    /* Records of the old stream still queued are written (or failed)
     * first: the reload reads what is durable, and the new stream goes on
     * from there. */
    if (st) {
        struct wal_waiter wt;
        wal_waiter_init(&wt);
        if (wal_barrier(st, wal_waiter_done, &wt) < 0)
            wal_waiter_done(&wt, -ENOMEM, 0, 0);
        wal_waiter_wait(&wt);
    }
    wal_stream_close(st);
    bf_destroy(f);
    rc = store__filter_load(sf, err);
    if (rc < 0) {
        /* A reload that could not write the log (a full disk) answers
         * with that error, not -EIO. */
        pthread_rwlock_wrlock(&sf->lock);
        if (sf->state == STORE_FAILED && sf->retry && rc != -EIO)
            sf->err = rc;
        pthread_rwlock_unlock(&sf->lock);
    }
    pthread_mutex_unlock(&sf->snap_mu);
    return rc;
}

bool store_filter_creating(struct store_filter *sf)
{
    return atomic_load(&sf->creating);
}

enum store_state store_filter_state(struct store_filter *sf, char *why)
{
    enum store_state st;
    char w2[WAL_ERRLEN];

    pthread_rwlock_rdlock(&sf->lock);
    st = store__state(sf);
    if (why) {
        if (st == STORE_FAILED && sf->state == STORE_READY) {
            wal_stream_failed(sf->stream, w2);
            store__strfmt(why, STORE_ERRLEN, "%s; " STORE_NO_WRITES, w2);
        } else {
            store__strfmt(why, STORE_ERRLEN, "%s",
                          st == STORE_FAILED ? sf->why : "");
        }
    }
    pthread_rwlock_unlock(&sf->lock);
    return st;
}

/* ---- mutations ---- */

/* What a completion needs: the filter (a reference) and the caller's. */
struct pending {
    struct store_filter *sf;
    store_done_fn done;
    void *ctx;
};

/* Runs on the log's completion thread (wal.h), or in the submitting thread
 * once its locks are let go (wal_submit_now): only atomics of the filter
 * are touched (a failure shows through the stream, store__state). */
static void mutation_done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    struct pending *p = ctx;

    (void)lsn;
    if (rc == 0)
        store__raise(&p->sf->version, seq);
    p->done(p->ctx, rc);
    store_put(p->sf);
    free(p);
}

/* Submit rec (of payload bytes) for sf once the caller changed the bits,
 * both under write_mu with the shared lock held, or under the exclusive
 * lock (an import): the log order is the apply order.  rec and p move to
 * the log.  When the log wrote it at once (wal_submit_now), now holds the
 * completion: the caller runs it with wal_now_complete once its locks are
 * let go (the caller's done may submit again or take them). */
static void submit_locked(struct store_filter *sf, uint32_t type,
                          struct wal_rec *rec, uint64_t bytes,
                          struct pending *p, struct wal_now *now)
{
    /* What a delta of records would hold (store_ckpt.c), and its copy. */
    atomic_fetch_add(&sf->log_bytes, bytes + 24);
    store__copy_add(sf, type, wal_rec_payload(rec), bytes);
    atomic_fetch_add(&sf->refs, 1);
    p->sf = sf;
    wal_submit_now(sf->stream, rec, mutation_done, p, now);
}

void store_log_hold_begin(struct store *s)
{
    wal_hold_begin(s->wal);
}

void store_log_hold_end(struct store *s)
{
    wal_hold_end(s->wal);
}

/* ---- key counters (metrics.h), for every store of the process ---- */

static struct {
    struct metric *added, *removed, *queried, *present;
} keys;
static pthread_once_t keys_once = PTHREAD_ONCE_INIT;

static void keys_register(void);

void store__keys_metrics_register(void)
{
    pthread_once(&keys_once, keys_register);
}

static void keys_register(void)
{
    struct metrics *m = metrics_registry();
    keys.added = metrics_counter(m, "bloomgrid_keys_added_total",
                                 "keys (hashes) written to a filter", NULL);
    keys.removed = metrics_counter(m, "bloomgrid_keys_removed_total",
                                   "keys (hashes) removed from a counting filter", NULL);
    keys.queried = metrics_counter(m, "bloomgrid_keys_queried_total",
                                   "keys (hashes) looked up in a filter", NULL);
    keys.present = metrics_counter(m, "bloomgrid_keys_present_total",
                                   "of the keys looked up, those answered present "
                                   "(maybe in the filter)", NULL);
}

/* Bits first, then the log record (the order store.h relies on), both
 * under write_mu: one writer at a time lets the engine use plain stores,
 * and the log order is the apply order.  Everything that can fail is
 * checked before a bit changes. */
static int filter_mutate(struct store_filter *sf, uint32_t type,
                         const struct bf_hash *h, size_t n, bool *out,
                         store_done_fn done, void *ctx, char *err)
{
    struct wal_rec *rec = NULL;
    struct pending *p = malloc(sizeof(*p));
    int rc;

    if (!p || (n && !(rec = wal_rec_new(type, h, (uint64_t)n * sizeof(*h))))) {
        free(p);
        errmsg_set(err, "no memory to log a write of %zu hashes to '%s'", n,
                   sf->name);
        return -ENOMEM;
    }
    p->done = done;
    p->ctx = ctx;
    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_rc(sf)) < 0) {
        store__state_err(sf, err);
        goto fail;
    }
    if (type == WAL_REC_REMOVE && bf_kind(sf->bf) != BF_KIND_COUNTING) {
        errmsg_set(err, "filter '%s' is a %s filter; only counting filters "
                      "support remove", sf->name,
                      bf_kind_name(bf_kind(sf->bf)));
        rc = -EOPNOTSUPP;
        goto fail;
    }
    if (n == 0) {
        /* Nothing to log: done once what came before is durable. */
        atomic_fetch_add(&sf->refs, 1);
        p->sf = sf;
        if ((rc = wal_barrier(sf->stream, mutation_done, p)) < 0) {
            store_put(sf);
            errmsg_set(err, "out of memory");
            goto fail;
        }
        pthread_rwlock_unlock(&sf->lock);
        return 0;
    }
    pthread_mutex_lock(&sf->write_mu);
    store__stamp_next(sf);
    if (type == WAL_REC_ADD) {
        /* A scalable filter grows a layer as it fills: the layers this
         * batch could append are reserved against max_memory_mb before
         * anything is applied (refused whole otherwise), then its charge
         * follows what it holds. */
        bool scalable = bf_kind(sf->bf) == BF_KIND_SCALABLE;
        uint64_t grow = 0;
        if (scalable && sf->s->max_memory &&
            (grow = bf_growth_bytes(sf->bf, n))) {
            /* Each new layer rounds its versions up: a page more covers
             * that for any number of layers. */
            grow = store__charge_bytes(grow) + BF_PAGE_BYTES;
            char what[STORE_NAME_MAX + 96];
            snprintf(what, sizeof what, "an add of %zu keys to scalable filter '%s', "
                     "which would grow it a layer,", n, sf->name);
            if ((rc = store_reserve(sf->s, grow, what, err)) < 0) {
                pthread_mutex_unlock(&sf->write_mu);
                goto fail;
            }
        }
        bf_add_hashes(sf->bf, h, n, out);
        if (scalable) {
            uint64_t now = store__charge_of(sf->bf), was = atomic_load(&sf->charge);
            atomic_fetch_sub(&sf->s->charged, grow);
            if (now != was) {
                atomic_store(&sf->charge, now);
                atomic_fetch_add(&sf->s->charged, now - was);
            }
        }
    } else
        for (size_t i = 0; i < n; i++) {
            int r = bf_remove_hash(sf->bf, h[i]);
            if (out)
                out[i] = r == 0;
        }
    struct wal_now now;
    submit_locked(sf, type, rec, (uint64_t)n * sizeof(*h), p, &now);
    pthread_mutex_unlock(&sf->write_mu);
    pthread_rwlock_unlock(&sf->lock);
    pthread_once(&keys_once, keys_register);
    metric_add(type == WAL_REC_ADD ? keys.added : keys.removed, n);
    wal_now_complete(&now);   /* done, before the call returns */
    return 0;
fail:
    pthread_rwlock_unlock(&sf->lock);
    wal_rec_free(rec);
    free(p);
    return rc;
}

/* The synchronous calls: the asynchronous one, then wait. */
struct sync_wait {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int rc;
};

static void sync_done(void *ctx, int rc)
{
    struct sync_wait *w = ctx;

    pthread_mutex_lock(&w->mu);
    w->rc = rc;
    w->done = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void sync_init(struct sync_wait *w)
{
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->done = false;
    w->rc = 0;
}

static void sync_deinit(struct sync_wait *w)
{
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

/* Wait for the completion of a call that returned rc, and explain an
 * error in err. */
static int sync_finish(struct store_filter *sf, struct sync_wait *w, int rc,
                       const char *what, char *err)
{
    if (rc == 0) {
        pthread_mutex_lock(&w->mu);
        while (!w->done)
            pthread_cond_wait(&w->cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
        rc = w->rc;
        if (rc < 0) {
            char why[WAL_ERRLEN] = "";
            pthread_rwlock_rdlock(&sf->lock);
            if (sf->stream)
                wal_stream_failed(sf->stream, why);
            pthread_rwlock_unlock(&sf->lock);
            errmsg_set(err, "%s '%s' is not durable: %s", what, sf->name,
                       why[0] ? why : strerror(-rc));
        }
    }
    sync_deinit(w);
    return rc;
}

int store_add_hashes_async(struct store_filter *sf, const struct bf_hash *h,
                           size_t n, bool *added, store_done_fn done,
                           void *ctx, char *err)
{
    return filter_mutate(sf, WAL_REC_ADD, h, n, added, done, ctx, err);
}

int store_remove_hashes_async(struct store_filter *sf,
                              const struct bf_hash *h, size_t n,
                              bool *removed, store_done_fn done, void *ctx,
                              char *err)
{
    return filter_mutate(sf, WAL_REC_REMOVE, h, n, removed, done, ctx, err);
}

int store_add_hashes(struct store_filter *sf, const struct bf_hash *h,
                     size_t n, bool *added, char *err)
{
    struct sync_wait w;

    sync_init(&w);
    return sync_finish(sf, &w, filter_mutate(sf, WAL_REC_ADD, h, n, added,
                                             sync_done, &w, err),
                       "write to filter", err);
}

int store_remove_hashes(struct store_filter *sf, const struct bf_hash *h,
                        size_t n, bool *removed, char *err)
{
    struct sync_wait w;

    sync_init(&w);
    return sync_finish(sf, &w, filter_mutate(sf, WAL_REC_REMOVE, h, n,
                                             removed, sync_done, &w, err),
                       "write to filter", err);
}

int store_may_contain_hashes(struct store_filter *sf, const struct bf_hash *h,
                             size_t n, bool *present)
{
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__readable(sf) ? 0 : store__state_rc(sf)) == 0)
        bf_may_contain_hashes(sf->bf, h, n, present);
    pthread_rwlock_unlock(&sf->lock);
    if (rc == 0) {
        uint64_t yes = 0;
        for (size_t i = 0; i < n; i++)
            yes += present[i];
        pthread_once(&keys_once, keys_register);
        metric_add(keys.queried, n);
        metric_add(keys.present, yes);
    }
    return rc;
}

struct membuf {
    uint8_t *p;
    size_t len, cap;
};

static int membuf_write(void *ctx, const void *buf, size_t len)
{
    struct membuf *m = ctx;

    if (m->len + len > m->cap)
        return -EOVERFLOW;
    memcpy(m->p + m->len, buf, len);
    m->len += len;
    return 0;
}

/* Merge the file rec holds (an import record of size bytes, the file
 * verified) into sf and log rec, taken: it goes to the log or is freed.
 * The file is merged from the record's own bytes a piece at a time
 * (bf_merge_file), so the bytes merged are the bytes logged and no second
 * copy of the file is made (the log writes a payload this large from the
 * record itself). */
static int import_rec(struct store_filter *sf, struct wal_rec *rec, uint64_t size,
                      char *err)
{
    const void *file = wal_rec_payload(rec);
    char berr[BF_ERRLEN] = "";
    struct pending *p;
    struct sync_wait w;
    const char *field;
    int rc;

    if (!(p = malloc(sizeof(*p)))) {
        errmsg_set(err, "cannot buffer an import of %" PRIu64 " bytes", size);
        wal_rec_free(rec);
        return -ENOMEM;
    }
    sync_init(&w);
    p->done = sync_done;
    p->ctx = &w;
    pthread_rwlock_wrlock(&sf->lock);   /* a merge needs exclusion */
    if ((rc = store__state_rc(sf)) < 0) {
        store__state_err(sf, err);
        goto fail;
    }
    /* write_mu too: a checkpoint of an exact kind holds it (and not the
     * shared lock) while it reads the bits. */
    pthread_mutex_lock(&sf->write_mu);
    store__stamp_next(sf);
    if ((rc = bf_merge_file(sf->bf, file, (size_t)size, &field, berr)) < 0) {
        /* A mismatch is found before anything changes. */
        pthread_mutex_unlock(&sf->write_mu);
        if (field)
            errmsg_set(err, "cannot import into '%s': the filters differ in %s",
                       sf->name, field);
        else
            errmsg_set(err, "cannot import into '%s': %s", sf->name, berr);
        goto fail;
    }
    struct wal_now now;
    submit_locked(sf, WAL_REC_IMPORT, rec, size, p, &now);   /* the exclusive lock orders it */
    pthread_mutex_unlock(&sf->write_mu);
    pthread_rwlock_unlock(&sf->lock);
    wal_now_complete(&now);
    return sync_finish(sf, &w, 0, "import into", err);
fail:
    pthread_rwlock_unlock(&sf->lock);
    wal_rec_free(rec);
    free(p);
    sync_deinit(&w);
    return rc;
}

int store_import(struct store_filter *sf, const struct bf *src, char *err)
{
    struct membuf m = {0};
    struct wal_rec *rec;
    uint64_t size;
    int rc;

    /* Serialize outside the lock, straight into the log record. */
    size = bf_file_size(src);
    if (!(rec = wal_rec_new(WAL_REC_IMPORT, NULL, size))) {
        errmsg_set(err, "cannot buffer an import of %" PRIu64 " bytes",
                      size);
        return -ENOMEM;
    }
    m.p = wal_rec_payload(rec);
    m.cap = size;
    if ((rc = bf_file_write(src, membuf_write, &m)) < 0 || m.len != size) {
        errmsg_set(err, "cannot serialize the imported filter");
        wal_rec_free(rec);
        return rc < 0 ? rc : -EINVAL;
    }
    return import_rec(sf, rec, size, err);
}

struct store_import_file {
    struct wal_rec *rec;        /* of type WAL_REC_IMPORT, the file's bytes */
    size_t len;
};

struct store_import_file *store_import_file_new(const void *file, size_t len,
                                                char *err)
{
    struct store_import_file *f = malloc(sizeof(*f));

    if (!f || !(f->rec = wal_rec_new(WAL_REC_IMPORT, file, len))) {
        free(f);
        errmsg_set(err, "cannot buffer an import of %zu bytes", len);
        return NULL;
    }
    f->len = len;
    return f;
}

const void *store_import_file_bytes(const struct store_import_file *f)
{
    return wal_rec_payload(f->rec);
}

size_t store_import_file_len(const struct store_import_file *f)
{
    return f->len;
}

void store_import_file_free(struct store_import_file *f)
{
    if (f) {
        wal_rec_free(f->rec);
        free(f);
    }
}

int store_import_file(struct store_filter *sf, struct store_import_file *file,
                      char *err)
{
    struct wal_rec *rec = file->rec;
    size_t len = file->len;

    free(file);
    return import_rec(sf, rec, len, err);
}

int store_or_pages(struct store_filter *sf, const struct store_page *pages,
                   size_t n, char *err)
{
    struct wal_rec *rec;
    struct pending *p;
    struct sync_wait w;
    uint64_t size = 0, used = 0;
    uint8_t *q;
    int rc;

    for (size_t i = 0; i < n; i++) {
        if (pages[i].len > UINT32_MAX) {
            errmsg_set(err, "page %zu is too large", i);
            return -EINVAL;
        }
        size += 16 + pages[i].len;
    }
    p = malloc(sizeof(*p));
    if (!p || !(rec = wal_rec_new(WAL_REC_PAGES, NULL, size))) {
        free(p);
        errmsg_set(err, "cannot buffer %" PRIu64 " bytes of pages", size);
        return -ENOMEM;
    }
    sync_init(&w);
    p->done = sync_done;
    p->ctx = &w;
    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_rc(sf)) < 0) {
        store__state_err(sf, err);
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        rc = pages_check(sf->bf, pages[i].layer, pages[i].offset,
                         pages[i].len);
        if (rc == -EOPNOTSUPP) {
            errmsg_set(err, "filter '%s' is a %s filter; only blocked and "
                          "classic filters merge page by page", sf->name,
                          bf_kind_name(bf_kind(sf->bf)));
            goto fail;
        }
        if (rc < 0) {
            errmsg_set(err, "page %zu (layer %" PRIu32 ", offset %" PRIu64
                          ", %zu bytes) is outside filter '%s'", i,
                          pages[i].layer, pages[i].offset, pages[i].len,
                          sf->name);
            goto fail;
        }
    }
    /* Only the pages that add a bit are ORed in and logged: the copies of a
     * group pull each other's changed pages, which they mostly hold
     * already, and logging those again would cost the log (and its fsync)
     * the whole changed part of the filter on every pull. */
    q = wal_rec_payload(rec);
    pthread_mutex_lock(&sf->write_mu);
    store__stamp_next(sf);
    for (size_t i = 0; i < n; i++) {
        uint32_t plen = (uint32_t)pages[i].len;
        if (!pages_or_one(sf->bf, pages[i].layer, pages[i].offset,
                          pages[i].data, pages[i].len))
            continue;
        memcpy(q, &pages[i].layer, 4);
        memcpy(q + 4, &plen, 4);
        memcpy(q + 8, &pages[i].offset, 8);
        memcpy(q + 16, pages[i].data, plen);
        q += 16 + (uint64_t)plen;
        used += 16 + (uint64_t)plen;
    }
    struct wal_now now = {.pending = false};
    if (used) {
        wal_rec_truncate(rec, used);
        submit_locked(sf, WAL_REC_PAGES, rec, used, p, &now);
    } else {
        /* Every bit was there: done once the records that set them are
         * durable (they may still be in flight). */
        wal_rec_free(rec);
        rec = NULL;
        atomic_fetch_add(&sf->refs, 1);
        p->sf = sf;
        if (wal_barrier(sf->stream, mutation_done, p) < 0) {
            store_put(sf);
            pthread_mutex_unlock(&sf->write_mu);
            errmsg_set(err, "out of memory");
            rc = -ENOMEM;
            goto fail;
        }
    }
    pthread_mutex_unlock(&sf->write_mu);
    pthread_rwlock_unlock(&sf->lock);
    wal_now_complete(&now);
    return sync_finish(sf, &w, 0, "the pages merged into", err);
fail:
    pthread_rwlock_unlock(&sf->lock);
    wal_rec_free(rec);
    free(p);
    sync_deinit(&w);
    return rc;
}

int store_import_counts(struct store_filter *sf,
                        const struct store_import_counts *c, char *err)
{
    struct wal_rec *rec;
    struct pending *p;
    struct sync_wait w;
    uint64_t size = COUNTS_BYTES(c->nlayers);
    int rc;

    if (c->nlayers > BF_MAX_LAYERS) {
        errmsg_set(err, "%" PRIu32 " layers' counts", c->nlayers);
        return -EINVAL;
    }
    p = malloc(sizeof(*p));
    if (!p || !(rec = wal_rec_new(WAL_REC_COUNTS, NULL, size))) {
        free(p);
        errmsg_set(err, "out of memory");
        return -ENOMEM;
    }
    counts_encode(wal_rec_payload(rec), c);
    sync_init(&w);
    p->done = sync_done;
    p->ctx = &w;
    pthread_rwlock_wrlock(&sf->lock);   /* as bf_merge_from: exclusion */
    if ((rc = store__state_rc(sf)) < 0) {
        store__state_err(sf, err);
        pthread_rwlock_unlock(&sf->lock);
        wal_rec_free(rec);
        free(p);
        sync_deinit(&w);
        return rc;
    }
    pthread_mutex_lock(&sf->write_mu);
    store__stamp_next(sf);
    bf_merge_counts(sf->bf, c->inserts, c->keys, c->layer_counts, c->nlayers);
    struct wal_now now;
    submit_locked(sf, WAL_REC_COUNTS, rec, size, p, &now);
    pthread_mutex_unlock(&sf->write_mu);
    pthread_rwlock_unlock(&sf->lock);
    wal_now_complete(&now);
    return sync_finish(sf, &w, 0, "the counts of an import into", err);
}

/* A copy of the live filter; the caller holds store__lock_for_copy. */
struct bf *store__copy_locked(struct store_filter *sf, char *err)
{
    uint64_t counts[BF_MAX_LAYERS] = {0};
    struct bf *c = bf_create_like(sf->bf, err);
    uint32_t nl;

    if (!c)
        return NULL;
    if (bf_merge_from(c, sf->bf, err) < 0) {
        bf_destroy(c);
        return NULL;
    }
    nl = bf_layer_count(sf->bf);
    for (uint32_t i = 0; i < nl && i < BF_MAX_LAYERS; i++) {
        struct bf_layer_info li;
        if (bf_layer_info(sf->bf, i, &li) == 0)
            counts[i] = li.count;
    }
    bf_set_counts(c, bf_insert_count(sf->bf), bf_keys_added(sf->bf), counts);
    return c;
}

void store__lock_for_copy(struct store_filter *sf)
{
    pthread_rwlock_rdlock(&sf->lock);
    if (sf->exact)
        pthread_mutex_lock(&sf->write_mu);
}

void store__unlock_for_copy(struct store_filter *sf)
{
    if (sf->exact)
        pthread_mutex_unlock(&sf->write_mu);
    pthread_rwlock_unlock(&sf->lock);
}

struct bf *store_filter_copy(struct store_filter *sf)
{
    struct bf *c = NULL;

    store__lock_for_copy(sf);
    if (store__state(sf) == STORE_READY)
        c = store__copy_locked(sf, NULL);
    store__unlock_for_copy(sf);
    return c;
}

/* Exports read the live bits a piece at a time into a buffer of their
 * own, under the shared lock (and, for the exact kinds, write_mu, so that
 * no mutation is half applied in a piece), and hand each piece to the
 * writer with no lock held. */
#define EXPORT_PIECE (64u << 10)

/* Bytes [off, off + n) of layer i into buf.  On a tracked filter a page of
 * version 0 was never written: it is zeros and is not read, so that an
 * Export leaves untouched bits untouched (not resident: on kernels that
 * back a read fault of anonymous memory with a new page, reading the whole
 * body of a mostly empty filter would make all of it resident). */
static void export_piece(const struct bf *f, uint32_t i, uint64_t off, size_t n,
                         uint8_t *buf)
{
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(f, i);

    for (size_t done = 0; done < n;) {
        uint64_t at = off + done, p = at / BF_PAGE_BYTES;
        size_t len = (size_t)((p + 1) * BF_PAGE_BYTES - at);
        if (len > n - done)
            len = n - done;
        if (bf_page_unwritten(f, i, p))
            memset(buf + done, 0, len);
        else
            memcpy(buf + done, body + at, len);
        done += len;
    }
}

int store_export(struct store_filter *sf, bf_file_writer w, void *ctx,
                 uint64_t *total, char *err)
{
    uint8_t meta[BF_FILE_META_MAX], sum[8];
    uint64_t bodies[BF_MAX_LAYERS], size, epoch;
    XXH64_state_t *st = NULL;
    uint8_t *buf = NULL;
    const struct bf *f;
    uint32_t nl;
    size_t mlen;
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_rc(sf)) < 0) {
        store__state_err(sf, err);
        pthread_rwlock_unlock(&sf->lock);
        return rc;
    }
    if (sf->exact)
        pthread_mutex_lock(&sf->write_mu);
    f = sf->bf;
    epoch = atomic_load(&sf->pages_epoch);
    nl = bf_layer_count(f);   /* once: a scalable filter may grow meanwhile */
    mlen = bf_file_meta_encode(f, nl, meta);
    size = mlen + 8;
    for (uint32_t i = 0; i < nl; i++) {
        struct bf_layer_info li;
        bf_layer_info(f, i, &li);
        bodies[i] = li.body_bytes;
        size += li.body_bytes;
    }
    if (sf->exact)
        pthread_mutex_unlock(&sf->write_mu);
    pthread_rwlock_unlock(&sf->lock);
    if (total)
        *total = size;
    if (!(st = XXH64_createState()) || !(buf = malloc(EXPORT_PIECE))) {
        errmsg_set(err, "no memory for an export of '%s'", sf->name);
        rc = -ENOMEM;
        goto out;
    }
    XXH64_reset(st, 0);
    XXH64_update(st, meta, mlen);
    if ((rc = w(ctx, meta, mlen)) < 0)
        goto wfail;
    for (uint32_t i = 0; i < nl; i++) {
        for (uint64_t off = 0; off < bodies[i]; off += EXPORT_PIECE) {
            size_t n = bodies[i] - off < EXPORT_PIECE ? (size_t)(bodies[i] - off)
                                                      : EXPORT_PIECE;
            pthread_rwlock_rdlock(&sf->lock);
            if (sf->bf != f || atomic_load(&sf->pages_epoch) != epoch ||
                !store__readable(sf)) {
                pthread_rwlock_unlock(&sf->lock);
                errmsg_set(err, "filter '%s' was reloaded or dropped during "
                           "the export; retry", sf->name);
                rc = -EAGAIN;
                goto out;
            }
            if (sf->exact)
                pthread_mutex_lock(&sf->write_mu);
            export_piece(f, i, off, n, buf);
            if (sf->exact)
                pthread_mutex_unlock(&sf->write_mu);
            pthread_rwlock_unlock(&sf->lock);
            XXH64_update(st, buf, n);
            if ((rc = w(ctx, buf, n)) < 0)
                goto wfail;
        }
    }
    uint64_t d = XXH64_digest(st);
    for (int i = 0; i < 8; i++)
        sum[i] = (uint8_t)(d >> (8 * i));
    if ((rc = w(ctx, sum, 8)) < 0)
        goto wfail;
    rc = 0;
    goto out;
wfail:
    errmsg_set(err, "the export of '%s' could not be written: %s", sf->name,
               strerror(-rc));
out:
    if (st)
        XXH64_freeState(st);
    free(buf);
    return rc;
}

const struct bf *store_filter_bf(struct store_filter *sf)
{
    const struct bf *f;

    pthread_rwlock_rdlock(&sf->lock);
    f = store__state(sf) == STORE_READY ? sf->bf : NULL;
    pthread_rwlock_unlock(&sf->lock);
    return f;
}

int store_filter_inspect(struct store_filter *sf,
                         void (*fn)(const struct bf *f, void *ctx), void *ctx)
{
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_rc(sf)) == 0)
        fn(sf->bf, ctx);
    pthread_rwlock_unlock(&sf->lock);
    return rc;
}

int store_filter_read(struct store_filter *sf,
                      void (*fn)(const struct bf *f, void *ctx), void *ctx)
{
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__readable(sf) ? 0 : store__state_rc(sf)) == 0)
        fn(sf->bf, ctx);
    pthread_rwlock_unlock(&sf->lock);
    return rc;
}


uint64_t store_filter_version(struct store_filter *sf)
{
    return atomic_load(&sf->version);
}

bool store_filter_recovery_cut(struct store_filter *sf)
{
    return atomic_load(&sf->recovery_cut);
}
