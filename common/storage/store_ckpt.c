/* store_ckpt: checkpoints of filters, and keeping the node log under its
 * bound (store.h, "Checkpoints", "The log's bound"; docs/STORAGE.md).
 *
 * A filter's checkpoint is a chain: a base (its bits at seq C0) and deltas
 * (what changed in (C0, C1], (C1, C2] ...), named by a manifest written
 * last.  A checkpoint takes seq C under the filter's write lock, with a
 * barrier in the log, and writes one of:
 *   - a delta of pages: every 4 KiB page whose version (bf.h, "Page
 *     versions") is above the previous checkpoint's seq, read from the live
 *     bits a page at a time;
 *   - a delta of records: the filter's log records after the previous
 *     checkpoint's seq up to C (for adds, their keys' 16-byte hashes), when
 *     that is smaller: from the filter's copy of them when it holds them
 *     all, read back from the log otherwise (see "Copies of records");
 *   - a new base (a fold): every non-zero page, when the deltas since the
 *     base (and this one) would weigh as much as the new base, or after
 *     STORE_FOLD_DELTAS deltas, or when there is no chain yet;
 * then a manifest naming base and deltas.  Order: the page file is written,
 * fsynced, renamed into place and its directory fsynced; then the manifest
 * the same way; only then are the files the manifest no longer names
 * removed, and the log the checkpoint covers may go (store__discard_log).
 * Nothing is overwritten in place, so a crash at any step leaves the
 * previous manifest and everything it names.
 *
 * Blocked and classic filters are read while adds go on (a page may hold
 * bits of records after C: replaying an OR twice is harmless).  Counting
 * and scalable filters hold their mutations off (write_mu) while their
 * pages are read, so a page file is exactly "every record <= C"; their
 * queries go on.  A delta of records needs no read of the bits.
 *
 * When: a filter whose records in the log since its last checkpoint reach
 * ckpt_percent of its bits' size (ckpt_due); one that changed and whose
 * checkpoint would write no more than twice those records' bytes, every
 * interval (STORE_CKPT_TIME); and, when the log passes its bound
 * (store__log_bound), the filters that hold its oldest segment (a filter
 * that did not change only has its manifest renamed to a later LSN).  At
 * full speed the checkpoints alternate a delta of records (the log since
 * the last one, L) and a new base (F): (L + F) / 2L times the log's bytes,
 * 1.5 at the default 50 %.
 *
 * Threads: the store's thread (housekeeping), store_snapshot_now and
 * store_filter_snapshot; one checkpoint of a filter at a time (snap_mu,
 * held throughout).  Locks: snap_mu, then the filter's shared lock, then
 * write_mu (store_internal.h); the log is waited for with only snap_mu
 * held.  Errors: a failed checkpoint leaves the previous manifest, what it
 * names and the log; it is counted, logged and tried again later.
 *
 * Copies of records: each record a filter submits is also appended, under
 * write_mu, to the filter's copy (store_filter.copy), as a delta of
 * records holds it (a 24-byte head of type, seq and length, then the
 * payload), from the first record after a checkpoint began.  A checkpoint
 * takes the copy with its seq C (under write_mu, a new one starting at
 * C + 1) and, when it writes a delta of records and the copy holds exactly
 * the records after its cursor up to C, writes the delta from it once they
 * are durable (its barrier) instead of reading the log back: under small
 * records of many filters (a router's single keys over 64 shards) reading
 * back was the largest part of the store's thread.  A copy is bounded
 * (STORE_COPY_*): past a bound the filter keeps none until its next
 * checkpoint begins, which then reads its records from the log, as does
 * any whose copy does not match its range (a failed checkpoint, a reload).
 */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <dirent.h>
#include <unistd.h>

#include "durable.h"
#include "log.h"
#include "metrics.h"
#include "store_ckfile.h"
#include "store_internal.h"
#include "wal.h"

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const double ckpt_bounds[] = {0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5,
                                     10, 30, 60};

static struct {
    struct metric *failures, *duration, *bytes, *folds, *read_back;
} cm;
static pthread_once_t cm_once = PTHREAD_ONCE_INIT;

static void ckpt_metrics_register(void)
{
    struct metrics *m = metrics_registry();
    cm.failures = metrics_counter(m, "bloomgrid_checkpoint_failures_total",
                                  "checkpoints that failed", NULL);
    cm.duration = metrics_histogram(m, "bloomgrid_checkpoint_duration_seconds",
                                    "time a filter's checkpoint took, from its "
                                    "log barrier to the file's rename", NULL,
                                    ckpt_bounds, sizeof ckpt_bounds / sizeof *ckpt_bounds);
    cm.bytes = metrics_counter(m, "bloomgrid_checkpoint_bytes_total",
                               "bytes of checkpoint files written (bases and "
                               "deltas)", NULL);
    cm.folds = metrics_counter(m, "bloomgrid_checkpoint_folds_total",
                               "checkpoints that wrote a new base", NULL);
    cm.read_back = metrics_counter(m, "bloomgrid_checkpoint_read_back_total",
                                   "checkpoints of records that read them back "
                                   "from the log (no whole copy of them was "
                                   "kept)", NULL);
}

void store_metrics_register(void)
{
    pthread_once(&cm_once, ckpt_metrics_register);
    store__keys_metrics_register();
    wal_metrics_register();
}

/* A checkpoint written (rc 0) or failed, with its duration and bytes. */
static void ckpt_metrics(int rc, double seconds, uint64_t bytes, bool fold)
{
    pthread_once(&cm_once, ckpt_metrics_register);
    if (rc < 0) {
        metric_add(cm.failures, 1);
        return;
    }
    metric_observe(cm.duration, seconds);
    metric_add(cm.bytes, bytes);
    if (fold)
        metric_add(cm.folds, 1);
}

/* ---- the pages of a checkpoint ---- */

/* Is a page all zeros? */
static bool page_zero(const uint8_t *p, size_t len)
{
    const uint64_t *w = (const uint64_t *)p;

    for (size_t i = 0; i < len / 8; i++)
        if (w[i])
            return false;
    return true;
}

/* Pages of f whose version is above v, in all layers. */
static uint64_t pages_above(const struct bf *f, uint64_t v)
{
    uint32_t nl = bf_layer_count(f);
    uint64_t n = 0;

    for (uint32_t l = 0; l < nl; l++)
        for (uint64_t p = 0, np = bf_layer_pages(f, l); p < np; p++)
            n += bf_page_version(f, l, p) > v;
    return n;
}

/* Write the pages of the first nl layers of f into w: those whose version
 * is above since (a delta), or every non-zero one (since UINT64_MAX: a
 * base).  In a tracked filter a page whose version is 0 was never set
 * (loaded pages carry a version of at least 1), so a base reads only the
 * pages ever stamped: the bits of an empty filter are never touched.  Each
 * page is copied into the writer's buffer and checksummed there
 * (store__ckw_page). */
static int write_pages(struct store_ckw *w, const struct bf *f, uint32_t nl,
                       uint64_t since, uint64_t *pages, char *err)
{
    bool tracked = bf_tracked(f);
    int rc;

    *pages = 0;
    for (uint32_t l = 0; l < nl; l++) {
        struct bf_layer_info li;
        const uint8_t *body = (const uint8_t *)bf_layer_body_const(f, l);
        if (bf_layer_info(f, l, &li) < 0)
            continue;
        for (uint64_t p = 0, np = bf_layer_pages(f, l); p < np; p++) {
            uint64_t off = p * BF_PAGE_BYTES;
            size_t len = li.body_bytes - off < BF_PAGE_BYTES
                             ? (size_t)(li.body_bytes - off) : BF_PAGE_BYTES;
            uint64_t v = tracked ? bf_page_version(f, l, p) : 1;
            if (since == UINT64_MAX ? v == 0 || page_zero(body + off, len)
                                    : v <= since)
                continue;
            if ((rc = store__ckw_page(w, l, (uint32_t)p, body + off, len,
                                      err)) < 0)
                return rc;
            (*pages)++;
        }
    }
    return 0;
}

/* ---- a delta of records, read back from the log ---- */

/* One checkpoint's records: seq expect..last of filter id, into w. */
struct rec_scan {
    struct store_ckw *w;
    uint64_t id, expect, last;
    int rc;
    char *err;
};

/* The checkpoints whose records one scan of the log reads (by id). */
struct rec_multi {
    struct rec_scan **v;
    size_t n;
};

static struct rec_scan *rec_find(const struct rec_multi *mu, uint64_t id)
{
    size_t lo = 0, hi = mu->n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (mu->v[mid]->id == id)
            return mu->v[mid];
        if (mu->v[mid]->id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static int rec_cmp(const void *a, const void *b)
{
    uint64_t x = (*(struct rec_scan *const *)a)->id;
    uint64_t y = (*(struct rec_scan *const *)b)->id;

    return x < y ? -1 : x > y;
}

/* A record's head in a delta of records: type (4 bytes), 4 zero bytes,
 * seq and payload length (8 each), little-endian. */
static void rec_head(uint8_t h[24], uint32_t type, uint64_t seq, uint64_t len)
{
    memset(h, 0, 24);
    for (int i = 0; i < 4; i++)
        h[i] = (uint8_t)(type >> (8 * i));
    for (int i = 0; i < 8; i++) {
        h[8 + i] = (uint8_t)(seq >> (8 * i));
        h[16 + i] = (uint8_t)(len >> (8 * i));
    }
}

static int rec_one(void *ctx, const struct wal_record *r)
{
    struct rec_scan *sc = rec_find(ctx, r->id);
    uint8_t h[24];

    if (!sc || sc->rc || r->seq < sc->expect || r->seq > sc->last)
        return 0;
    if (r->seq != sc->expect) {
        errmsg_set(sc->err, "record %" PRIu64 " is missing from the log",
                   sc->expect);
        sc->rc = -EBADMSG;
        return 0;
    }
    rec_head(h, r->type, r->seq, r->len);
    if ((sc->rc = store__ckw_stream(sc->w, h, sizeof h, sc->err)) == 0)
        sc->rc = store__ckw_stream(sc->w, r->payload, (size_t)r->len, sc->err);
    sc->expect++;
    return 0;
}

static void rec_damage(void *ctx, const struct wal_damage *d)
{
    struct rec_multi *mu = ctx;

    for (size_t i = 0; i < mu->n; i++) {
        struct rec_scan *sc = mu->v[i];
        if (!sc->rc && (d->id == sc->id || !d->id)) {
            errmsg_set(sc->err, "%s", d->where);
            sc->rc = -EBADMSG;
        }
    }
}

/* Records of filters not asked for, and those outside a checkpoint's
 * range, are passed over unread. */
static bool rec_skip(void *ctx, const struct wal_record *h)
{
    struct rec_scan *sc = rec_find(ctx, h->id);

    return !sc || sc->rc || h->seq < sc->expect || h->seq > sc->last;
}

static const struct wal_scan_ops rec_ops = {rec_one, rec_damage, rec_skip};

/* Every checkpoint's records, from the log at LSN > after (at most the
 * last checkpoint of each), in one scan: each sc gets its rc and err. */
static void read_records(struct wal *wal, struct rec_scan **v, size_t n,
                         uint64_t after)
{
    struct rec_multi mu = {v, n};
    struct wal_scan_info info;
    char err[STORE_ERRLEN] = "";

    qsort(v, n, sizeof(*v), rec_cmp);
    int rc = wal_rescan_from(wal, after + 1, &rec_ops, &mu, &info, err);
    for (size_t i = 0; i < n; i++) {
        struct rec_scan *sc = v[i];
        if (sc->rc)
            continue;
        if (rc < 0) {
            errmsg_set(sc->err, "%s", err);
            sc->rc = rc;
        } else if (sc->expect != sc->last + 1) {
            errmsg_set(sc->err, "records %" PRIu64 "..%" PRIu64
                       " are not in the log", sc->expect, sc->last);
            sc->rc = -EBADMSG;
        }
    }
}

/* ---- copies of records ---- */

void store__copy_reset(struct store_filter *sf, uint64_t from)
{
    struct store_copy *c = &sf->copy;

    if (c->cap)
        atomic_fetch_sub(&sf->s->copied, c->cap);
    free(c->buf);
    *c = (struct store_copy){.from = from};
}

void store__copy_add(struct store_filter *sf, uint32_t type,
                     const void *payload, uint64_t len)
{
    struct store_copy *c = &sf->copy;
    struct store *s = sf->s;
    uint64_t seq = c->from + c->n;

    if (!c->from)
        return;
    if (len > STORE_COPY_RECORD || c->len + 24 + len > STORE_COPY_FILTER) {
        store__copy_reset(sf, 0);
        return;
    }
    size_t need = c->len + 24 + (size_t)len;
    if (need > c->cap) {
        size_t cap = c->cap ? c->cap : 4096;
        while (cap < need)
            cap *= 2;
        if (cap > STORE_COPY_FILTER)
            cap = STORE_COPY_FILTER;
        uint8_t *b;
        if (atomic_fetch_add(&s->copied, cap - c->cap) + (cap - c->cap) >
                s->copy_max ||
            !(b = realloc(c->buf, cap))) {
            atomic_fetch_sub(&s->copied, cap - c->cap);
            store__copy_reset(sf, 0);
            return;
        }
        c->buf = b;
        c->cap = cap;
    }
    uint8_t *h = c->buf + c->len;
    rec_head(h, type, seq, len);
    if (len)
        memcpy(h + 24, payload, (size_t)len);
    c->len = need;
    c->n++;
}

/* ---- the checkpoint ---- */

/* Bytes of the deltas of a chain, and its base. */
static uint64_t chain_deltas(const struct store_manifest *m)
{
    uint64_t d = 0;

    for (uint32_t i = 1; i < m->n; i++)
        d += m->e[i].bytes;
    return d;
}

/* What a checkpoint writes. */
enum ckpt_kind { CK_NONE, CK_ADVANCE, CK_RECORDS, CK_PAGES, CK_FOLD };

/* Remove every checkpoint file of dir the manifest m (at lsn) does not
 * name: older manifests, bases and deltas, checkpoints of the previous
 * release, temp files (no checkpoint of this filter is being written). */
static void prune(const char *dir, const struct store_manifest *m,
                  uint64_t lsn)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    bool removed = false;

    if (!d)
        return;
    while ((de = readdir(d))) {
        struct store_fname n;
        bool keep = false;
        if (!store__fname_parse(de->d_name, &n))
            continue;
        if (!n.tmp && n.id == m->id) {
            if (n.kind == STORE_FILE_MANIFEST)
                keep = n.seq == m->seq && n.lsn == lsn;
            for (uint32_t i = 0; !keep && i < m->n; i++) {
                struct store_fname e;
                store__manifest_fname(m, i, &e);
                keep = e.kind == n.kind && e.seq == n.seq && e.from == n.from;
            }
        }
        if (!keep && unlinkat(dirfd(d), de->d_name, 0) == 0)
            removed = true;
    }
    closedir(d);
    if (removed)
        durable_fsync_dir(dir);
}

void store__ckpt_prune(struct store_filter *sf)
{
    if (sf->chain && sf->chain->n)
        prune(sf->path, sf->chain, atomic_load(&sf->ckpt_lsn));
}

/* A checkpoint between its start (ckpt_start: what it writes decided, its
 * pages written, its log barrier durable) and its end (ckpt_end: the
 * manifest).  Between them it holds its filter's snap_mu; a checkpoint of
 * records has its file open, and its records are read from the log in
 * between (read_records), one scan for every checkpoint that runs at
 * once. */
struct ckpt_job {
    struct store_filter *sf;
    enum ckpt_kind kind;
    int type;
    struct store_fname fn;
    struct rec_scan rs;          /* CK_RECORDS: its file, its records */
    uint64_t after;              /* CK_RECORDS: its last checkpoint's LSN */
    bool copied;                 /* CK_RECORDS: written from the copy */
    uint8_t meta[BF_FILE_META_MAX];
    size_t mlen;
    uint64_t seq, lsn, logb, bytes;
    double t0;
    char e2[STORE_ERRLEN];
};

/* The end of a failed checkpoint: its filter as before. */
static int ckpt_fail(struct ckpt_job *j, int rc, char *err)
{
    struct store_filter *sf = j->sf;

    /* The old manifest, what it names, and the log are all still there;
     * try again after an interval rather than at every tick. */
    sf->snap_time_ms = store__now_ms();
    errmsg_set(err, "checkpoint of '%s' failed: %s", sf->name, j->e2);
    ckpt_metrics(rc, mono_s() - j->t0, 0, false);
    pthread_mutex_unlock(&sf->snap_mu);
    return rc;
}

/* Start a checkpoint of sf: 1 when it goes on (ckpt_end must follow; for
 * CK_RECORDS, after its records were read), 0 when there is nothing to
 * write, or a negative errno with err (its filter as before). */
static int ckpt_start(struct ckpt_job *j, struct store_filter *sf,
                      enum store_ckpt_mode mode, char *err)
{
    struct wal_waiter wt;
    struct store_ckw *w = NULL;
    struct store_manifest *m = sf->chain;
    enum ckpt_kind kind = CK_NONE;
    uint64_t seq, pages = 0;
    bool exact, held = false;
    int rc = 0;

    memset(j, 0, sizeof(*j));
    j->sf = sf;
    j->t0 = mono_s();
    pthread_mutex_lock(&sf->snap_mu);
    pthread_rwlock_rdlock(&sf->lock);
    if (store__state(sf) != STORE_READY) {
        pthread_rwlock_unlock(&sf->lock);
        pthread_mutex_unlock(&sf->snap_mu);
        return 0;   /* nothing to checkpoint */
    }
    const struct bf *f = sf->bf;
    bool chain = m->n > 0 && !sf->fold_next;
    /* What each kind would cost, from the page versions, before write_mu
     * (a walk of 8 bytes per page that adds need not wait for): pages
     * changed since then only make the estimate low. */
    uint64_t dirty = pages_above(f, sf->ckpt_seq);
    uint64_t grown = chain ? pages_above(f, m->e[0].to) : 0;
    uint64_t all = 0;
    for (uint32_t l = 0, nl0 = bf_layer_count(f); l < nl0; l++)
        all += bf_layer_pages(f, l);
    /* The seq and the barrier under write_mu: records <= seq are before
     * the barrier in the log, later ones after it, and every change up to
     * seq has stamped its pages. */
    pthread_mutex_lock(&sf->write_mu);
    held = true;
    exact = sf->exact;
    seq = wal_stream_last_seq(sf->stream);
    /* Pages changed up to seq read as seq from now on, so that the next
     * delta (pages above seq) leaves them out. */
    bf_fold_versions(sf->bf, seq);
    j->logb = atomic_load(&sf->log_bytes);
    bool changed = seq != sf->ckpt_seq;
    if (!changed && chain && mode != STORE_CKPT_FORCE) {
        kind = mode == STORE_CKPT_ADVANCE ? CK_ADVANCE : CK_NONE;
    } else {
        uint64_t since = j->logb - atomic_load(&sf->ckpt_log);
        uint64_t recs = since + 2 * STORE_CKF_PAGE;
        uint64_t pg = (dirty + dirty / STORE_CKF_GROUP + 2) * STORE_CKF_PAGE;
        uint64_t base = chain ? m->e[0].bytes : 0;
        /* The new base holds the base's pages and those changed since,
         * at most every page. */
        uint64_t fold_cost = base + grown * STORE_CKF_PAGE;
        uint64_t whole = (all + all / STORE_CKF_GROUP + 2) * STORE_CKF_PAGE;
        if (fold_cost > whole)
            fold_cost = whole;
        bool recs_ok = chain && bf_kind(f) != BF_KIND_SCALABLE && recs < pg;
        uint64_t delta = recs_ok ? recs : pg;
        bool fold = !chain || mode == STORE_CKPT_FORCE ||
                    chain_deltas(m) + delta >= fold_cost ||
                    m->n >= STORE_MANIFEST_MAX ||
                    (m->n > STORE_FOLD_DELTAS && mode != STORE_CKPT_TIME);
        kind = fold ? CK_FOLD : recs_ok ? CK_RECORDS : CK_PAGES;
        /* By time only when it writes no more than twice the bytes of the
         * records it covers (with the log's own, three times in all). */
        if (mode == STORE_CKPT_TIME && (fold ? fold_cost : delta) > 2 * since)
            kind = CK_NONE;
        if (!changed && mode == STORE_CKPT_IF_CHANGED && chain)
            kind = CK_NONE;
    }
    if (kind == CK_NONE) {
        pthread_mutex_unlock(&sf->write_mu);
        pthread_rwlock_unlock(&sf->lock);
        if (mode == STORE_CKPT_TIME)
            sf->snap_time_ms = store__now_ms();   /* asked again next interval */
        pthread_mutex_unlock(&sf->snap_mu);
        return 0;
    }
    j->kind = kind;
    j->seq = seq;
    /* The copy of the records up to seq; the next begins after it. */
    struct store_copy cp = sf->copy;
    sf->copy = (struct store_copy){.from = seq + 1};
    wal_waiter_init(&wt);
    if (wal_barrier(sf->stream, wal_waiter_done, &wt) < 0)
        wal_waiter_done(&wt, -ENOMEM, 0, 0);
    uint32_t nl = bf_layer_count(f);
    j->mlen = bf_file_meta_encode(f, nl, j->meta);
    /* snap_mu keeps the bits in place (a reload or a drop waits for it):
     * no lock is needed to read them but, for the exact kinds, write_mu. */
    pthread_rwlock_unlock(&sf->lock);
    if (!exact || kind == CK_ADVANCE || kind == CK_RECORDS) {
        pthread_mutex_unlock(&sf->write_mu);
        held = false;
    }

    j->fn = (struct store_fname){.kind = kind == CK_FOLD ? STORE_FILE_BASE
                                                         : STORE_FILE_DELTA,
                                 .id = sf->id,
                                 .from = kind == CK_FOLD ? 0 : sf->ckpt_seq,
                                 .seq = seq};
    j->type = kind == CK_FOLD ? STORE_CKF_BASE
            : kind == CK_RECORDS ? STORE_CKF_RECORDS : STORE_CKF_PAGES;
    if (kind == CK_FOLD || kind == CK_PAGES) {
        /* Every record <= seq set its bits before it was submitted, hence
         * before they are read here. */
        if ((rc = store__ckw_open(&w, sf->path, &j->fn, j->type, j->e2)) == 0 &&
            (rc = write_pages(w, f, nl, kind == CK_FOLD ? UINT64_MAX
                                                        : sf->ckpt_seq,
                              &pages, j->e2)) < 0) {
            store__ckw_abort(w);
            w = NULL;
        }
        if (held) {
            pthread_mutex_unlock(&sf->write_mu);
            held = false;
        }
        if (rc == 0) {
            rc = store__ckw_finish(w, j->meta, j->mlen, &j->bytes, j->e2);
            w = NULL;
        }
    }
    int brc = wal_waiter_wait(&wt);
    j->lsn = wt.lsn;
    if (brc < 0 && rc == 0) {
        rc = brc;
        snprintf(j->e2, sizeof j->e2, "its log records are not durable (%s)",
                 strerror(-rc));
    }
    if (rc == 0 && kind == CK_RECORDS) {
        /* The records are durable now: they go into this file from the
         * copy when it holds exactly those after the cursor, or are read
         * back (read_records). */
        if ((rc = store__ckw_open(&w, sf->path, &j->fn, j->type, j->e2)) == 0) {
            j->rs = (struct rec_scan){w, sf->id, sf->ckpt_seq + 1, seq, 0, j->e2};
            j->after = atomic_load(&sf->ckpt_lsn);
            if (cp.from && cp.from == sf->ckpt_seq + 1 && cp.n == seq - sf->ckpt_seq) {
                j->rs.rc = store__ckw_stream(w, cp.buf, cp.len, j->e2);
                j->rs.expect = seq + 1;
                j->copied = true;
                atomic_fetch_add(&sf->s->copy_ckpts, 1);
            } else {
                pthread_once(&cm_once, ckpt_metrics_register);
                metric_add(cm.read_back, 1);
            }
        } else {
            log_warn("store: checkpoint of '%s' could not open its file (%s); "
                     "the next one writes a base", sf->name, j->e2);
            sf->fold_next = true;
        }
    }
    if (cp.cap)
        atomic_fetch_sub(&sf->s->copied, cp.cap);
    free(cp.buf);
    if (rc < 0)
        return ckpt_fail(j, rc, err);
    return 1;
}

/* The end of a started checkpoint: a checkpoint of records closes its file
 * (its records read by now, j->rs.rc says how), then the manifest. */
static int ckpt_end(struct ckpt_job *j, char *err)
{
    struct store_filter *sf = j->sf;
    struct store_manifest *m = sf->chain, next;
    enum ckpt_kind kind = j->kind;
    int rc = 0;

    if (kind == CK_RECORDS) {
        rc = j->rs.rc;
        if (rc == 0)
            rc = store__ckw_finish(j->rs.w, j->meta, j->mlen, &j->bytes, j->e2);
        else
            store__ckw_abort(j->rs.w);
        j->rs.w = NULL;
        if (rc < 0) {
            /* Next time from the bits: a fold (the exact kinds' bits are
             * past seq by now). */
            log_warn("store: checkpoint of '%s' could not read its records "
                     "back from the log (%s); the next one writes a base",
                     sf->name, j->e2);
            sf->fold_next = true;
            return ckpt_fail(j, rc, err);
        }
    }

    /* The manifest last: the new chain, or the same one further along the
     * log. */
    if (kind == CK_ADVANCE) {
        uint64_t old = atomic_load(&sf->ckpt_lsn);
        if (j->lsn != old &&
            (rc = store__manifest_advance(sf->path, sf->id, j->seq, old, j->lsn,
                                          j->e2)) < 0)
            return ckpt_fail(j, rc, err);
    } else {
        if (kind == CK_FOLD) {
            memset(&next, 0, sizeof next);
            next.id = sf->id;
        } else {
            next = *m;
        }
        struct store_manifest_ent *e = &next.e[next.n++];
        e->type = (uint32_t)j->type;
        e->from = j->fn.from;
        e->to = j->seq;
        e->lsn = j->lsn;
        e->bytes = j->bytes;
        next.seq = j->seq;
        if ((rc = store__manifest_write(sf->path, &next, j->lsn, j->e2)) < 0)
            return ckpt_fail(j, rc, err);
        *m = next;
    }
    sf->ckpt_seq = j->seq;
    atomic_store(&sf->ckpt_log, j->logb);
    sf->fold_next = false;
    atomic_store(&sf->ckpt_lsn, j->lsn);
    /* Records after seq come after the barrier: a pull since seq or later
     * reads the log from there (store_keys_since). */
    store__scan_mark(sf, sf->id, atomic_load(&sf->pages_epoch), j->seq,
                     j->lsn + 1);
    sf->snap_time_ms = store__now_ms();
    prune(sf->path, m, j->lsn);
    store__ckpt_step_at(kind == CK_ADVANCE ? 0 : j->type, STORE_STEP_PRUNED);
    if (kind != CK_ADVANCE)
        ckpt_metrics(0, mono_s() - j->t0, j->bytes, kind == CK_FOLD);
    pthread_mutex_unlock(&sf->snap_mu);
    return 0;
}

/* Checkpoints of n filters at once (modes[i] for v[i]), each failure
 * logged: the records of those that write records are read from the log
 * in one scan, which passes over every other filter's records by their
 * headers (a scan for each would read the log once per filter). */
static void checkpoint_many(struct store *s, struct store_filter **v,
                            const enum store_ckpt_mode *modes, size_t n)
{
    struct ckpt_job *jobs = calloc(n ? n : 1, sizeof(*jobs));
    struct rec_scan **rs = calloc(n ? n : 1, sizeof(*rs));
    bool *on = calloc(n ? n : 1, sizeof(*on));
    char err[STORE_ERRLEN];
    size_t nrs = 0;
    uint64_t after = UINT64_MAX;

    if (!jobs || !rs || !on) {
        /* One at a time, each reading its own records. */
        for (size_t i = 0; i < n; i++)
            if (store__filter_checkpoint(v[i], modes[i], err) < 0)
                log_warn("store: %s", err);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        int rc = ckpt_start(&jobs[i], v[i], modes[i], err);
        if (rc < 0)
            log_warn("store: %s", err);
        on[i] = rc == 1;
        if (on[i] && jobs[i].kind == CK_RECORDS && !jobs[i].copied) {
            rs[nrs++] = &jobs[i].rs;
            if (jobs[i].after < after)
                after = jobs[i].after;
        }
    }
    if (nrs)
        read_records(s->wal, rs, nrs, after);
    for (size_t i = 0; i < n; i++)
        if (on[i] && ckpt_end(&jobs[i], err) < 0)
            log_warn("store: %s", err);
out:
    free(jobs);
    free(rs);
    free(on);
}

int store__filter_checkpoint(struct store_filter *sf,
                             enum store_ckpt_mode mode, char *err)
{
    struct ckpt_job j;
    int rc = ckpt_start(&j, sf, mode, err);

    if (rc <= 0)
        return rc;
    if (j.kind == CK_RECORDS && !j.copied) {
        struct rec_scan *one = &j.rs;
        read_records(sf->s->wal, &one, 1, j.after);
    }
    return ckpt_end(&j, err);
}

/* The first checkpoint of a filter nothing else holds yet (a creation, a
 * migration): f as a base of seq seq and a manifest covering the log to
 * lsn, in dir.  0 or a negative errno with err. */
int store__ckpt_first(const char *dir, uint64_t id, uint64_t seq,
                      uint64_t lsn, const struct bf *f,
                      struct store_manifest *out, char *err)
{
    struct store_fname fn = {.kind = STORE_FILE_BASE, .id = id, .seq = seq};
    uint8_t meta[BF_FILE_META_MAX];
    struct store_ckw *w;
    uint64_t bytes = 0, pages;
    uint32_t nl = bf_layer_count(f);
    size_t mlen = bf_file_meta_encode(f, nl, meta);
    int rc;

    if ((rc = store__ckw_open(&w, dir, &fn, STORE_CKF_BASE, err)) < 0)
        return rc;
    if ((rc = write_pages(w, f, nl, UINT64_MAX, &pages, err)) < 0) {
        store__ckw_abort(w);
        return rc;
    }
    if ((rc = store__ckw_finish(w, meta, mlen, &bytes, err)) < 0)
        return rc;
    memset(out, 0, sizeof *out);
    out->id = id;
    out->seq = seq;
    out->n = 1;
    out->e[0] = (struct store_manifest_ent){STORE_CKF_BASE, 0, seq, lsn, bytes};
    if ((rc = store__manifest_write(dir, out, lsn, err)) < 0)
        return rc;
    prune(dir, out, lsn);
    return 0;
}

int store_filter_snapshot(struct store_filter *sf, char *err)
{
    return store__filter_checkpoint(sf, STORE_CKPT_FORCE, err);
}

int store__discard_log(struct store *s, bool ignore_failed)
{
    size_t n;
    uint64_t upto;
    struct store_filter **v = store__catalog_refs(s, &n, &upto);
    int rc;

    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        enum store_state st = store_filter_state(v[i], NULL);
        uint64_t l = atomic_load(&v[i]->ckpt_lsn);
        if (!(ignore_failed && st == STORE_FAILED) && l < upto)
            upto = l;
        store_put(v[i]);
    }
    free(v);
    rc = wal_discard(s->wal, upto);
    if (rc < 0)
        log_warn("store: cannot remove log segments up to LSN %" PRIu64
                 ": %s", upto, strerror(-rc));
    else
        store__ckpt_step_at(0, STORE_STEP_LOG_DISCARDED);
    return rc < 0 ? rc : 0;
}

int store_snapshot_now(struct store *s, char *err)
{
    size_t n;
    struct store_filter **v = store__catalog_refs(s, &n, NULL);
    int rc = 0;

    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int r = store__filter_checkpoint(v[i], STORE_CKPT_IF_CHANGED,
                                         rc ? NULL : err);
        if (r < 0 && rc == 0)
            rc = r;
        store_put(v[i]);
    }
    free(v);
    store__discard_log(s, false);
    return rc;
}

uint64_t store_log_bytes(struct store *s)
{
    return wal_bytes(s->wal);
}

uint64_t store_log_file_bytes(struct store *s)
{
    return wal_file_bytes(s->wal);
}

/* A filter FAILED by an I/O error and due for another recovery?  A filter
 * whose stream failed turns FAILED here (the commit thread only marks the
 * stream), keeping its bits: they hold every acknowledged write, so reads
 * go on from them (store.h, "Failed writes"). */
static bool retry_due(struct store_filter *sf, uint64_t now)
{
    bool due;

    pthread_rwlock_wrlock(&sf->lock);
    if (sf->state == STORE_READY && store__state(sf) == STORE_FAILED) {
        char why[WAL_ERRLEN];
        wal_stream_failed(sf->stream, why);
        sf->state = STORE_FAILED;
        sf->err = wal_stream_error(sf->stream);
        sf->retry = true;
        sf->failed_ms = now;
        store__strfmt(sf->why, sizeof(sf->why), "%s; " STORE_NO_WRITES, why);
        log_error("store: filter '%s' takes no writes: %s", sf->name, sf->why);
    }
    due = sf->state == STORE_FAILED && sf->retry &&
          now - sf->failed_ms >= sf->s->retry_ms;
    pthread_rwlock_unlock(&sf->lock);
    return due;
}

/* Can the log take the filter's records again?  A barrier of a new stream
 * of its incarnation (nothing is written for it) fails while the log has
 * no segment it can write, as on a full disk; it proves no room for the
 * next write, which may fail again (then the filter comes back here). */
static int log_writable(struct store_filter *sf)
{
    struct wal_waiter wt;
    struct wal_stream *st;
    uint64_t id;

    pthread_mutex_lock(&sf->snap_mu);
    id = sf->id;
    pthread_mutex_unlock(&sf->snap_mu);
    if (!id || !(st = wal_stream_open(sf->s->wal, id, sf->name, 1)))
        return 0;   /* nothing to ask: the reload finds out */
    wal_waiter_init(&wt);
    if (wal_barrier(st, wal_waiter_done, &wt) < 0)
        wal_waiter_done(&wt, -ENOMEM, 0, 0);
    int rc = wal_waiter_wait(&wt);
    wal_stream_close(st);
    return rc;
}

/* Reload a filter FAILED by an I/O error from its files, once the log can
 * be written: until then it keeps the bits it has (if any) for reads,
 * rather than dropping them for a reload whose first write would fail. */
static void recover_logged(struct store_filter *sf)
{
    char err[STORE_ERRLEN];
    int rc = log_writable(sf);

    if (rc < 0) {
        pthread_rwlock_wrlock(&sf->lock);
        sf->failed_ms = store__now_ms();   /* the next try after retry_ms */
        pthread_rwlock_unlock(&sf->lock);
        return;
    }
    if (store_filter_recover(sf, err) == 0)
        log_info("store: filter '%s' recovered after a write error",
                 sf->name);
}

/* Records of sf in the log since its last checkpoint, and the point at
 * which a checkpoint is due: ckpt_percent of its charge (its bits). */
static bool ckpt_due(struct store_filter *sf, uint64_t *due)
{
    uint64_t since = atomic_load(&sf->log_bytes) - atomic_load(&sf->ckpt_log);

    *due = atomic_load(&sf->charge) / 100 * sf->s->ckpt_percent;
    if (*due < STORE_CKF_PAGE)
        *due = STORE_CKF_PAGE;
    return since >= *due;
}

uint64_t store__log_bound(struct store *s, struct store_filter **v, size_t n)
{
    uint64_t sum = 0, due;

    for (size_t i = 0; i < n; i++) {
        ckpt_due(v[i], &due);
        sum += due;
    }
    /* Twice what the filters hold before they are due: a filter's own
     * point comes first, unless the others' records fill its segments. */
    return 2 * sum > s->wal_bytes ? 2 * sum : s->wal_bytes;
}

void store__housekeeping(struct store *s)
{
    size_t n;
    struct store_filter **v = store__catalog_refs(s, &n, NULL);
    char err[STORE_ERRLEN];
    uint64_t upto, due, bound;
    bool over;

    if (!v)
        return;
    struct store_filter *batch[STORE_CKPT_BATCH];
    enum store_ckpt_mode modes[STORE_CKPT_BATCH];
    size_t nb = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t now = store__now_ms();
        if (retry_due(v[i], now))
            recover_logged(v[i]);
        /* Due by the log's records since the last checkpoint (the bytes
         * written stay a bounded multiple of the log's), or by time when
         * that is cheap (a sparse filter's log stays short).  Those due
         * together share one read of the log (checkpoint_many). */
        if (ckpt_due(v[i], &due))
            modes[nb] = STORE_CKPT_IF_CHANGED;
        else if (now - v[i]->snap_time_ms >= s->interval_ms)
            modes[nb] = STORE_CKPT_TIME;
        else
            continue;
        batch[nb++] = v[i];
        if (nb == STORE_CKPT_BATCH) {
            checkpoint_many(s, batch, modes, nb);
            nb = 0;
        }
    }
    if (nb)
        checkpoint_many(s, batch, modes, nb);
    /* Over the bound: every filter that holds a closed segment gets
     * checkpointed (or its checkpoint moved), so all of them can go.  The
     * bound counts records; the files, padded to write units, are held
     * to STORE_LOG_FILES times it. */
    bound = store__log_bound(s, v, n);
    over = wal_bytes(s->wal) >= bound ||
           wal_file_bytes(s->wal) / STORE_LOG_FILES >= bound;
    if (over && !wal_closed_upto(s->wal, &upto)) {
        wal_rotate(s->wal);
        over = false;
    }
    for (size_t i = 0; over && i < n; i++) {
        if (atomic_load(&v[i]->ckpt_lsn) >= upto)
            continue;
        pthread_rwlock_rdlock(&v[i]->lock);
        bool retry = store__state(v[i]) == STORE_FAILED && v[i]->retry;
        pthread_rwlock_unlock(&v[i]->lock);
        if (retry)
            recover_logged(v[i]);   /* it may come back and checkpoint */
        if (store__filter_checkpoint(v[i], STORE_CKPT_ADVANCE, err) < 0)
            log_warn("store: %s", err);
        if (store_filter_state(v[i], NULL) == STORE_FAILED &&
            atomic_load(&v[i]->ckpt_lsn) < upto) {
            log_warn("store: filter '%s' is FAILED and no longer holds the "
                     "write-ahead log: it cannot be recovered from this "
                     "node's files", v[i]->name);
            atomic_store(&v[i]->ckpt_lsn, UINT64_MAX);
        }
    }
    for (size_t i = 0; i < n; i++)
        store_put(v[i]);
    free(v);
    store__discard_log(s, over);
}
