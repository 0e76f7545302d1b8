/* store_pages: change tracking of a filter's pages for pullers (store.h,
 * "Change tracking"): the page versions of the live bits (bf.h, "Page
 * versions"), read page by page; no copy of the bits is kept.
 *
 * Every change to the bits stamps the 4 KiB pages it changed with the seq
 * of the log record it goes into, under the filter's write lock
 * (store_filter.c, and the replay of records at recovery).  A walk takes
 * the cursor c (the seq of the last record submitted) under that lock:
 * every change up to c has stamped its pages and set its bits by then, and
 * every later one stamps a version above c.  The walk then reports each
 * RULES_PAGE_BYTES page one of whose 4 KiB pages has a version above the
 * puller's since, read from the live bits into a buffer of the walk's own
 * (under the shared lock, one page at a time, so writes go on); the page
 * holds every bit of every write up to c, and bits of later ones, which a
 * later walk reports again.  Nothing is cleared: any number of pullers
 * (the copies of a group, the merger), each with its own cursor, and the
 * checkpointer with its own, each get every change.
 *
 * The epoch is new for every install of bits (a creation, a load, a
 * reload after a failed write, which may give unacknowledged records'
 * seqs to new records): a puller naming another epoch gets every
 * non-empty page.  A walk that finds the bits replaced under it stops with
 * -EAGAIN.
 */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "rules.h"
#include "store_internal.h"
#include "wal_format.h"

#define SUB (RULES_PAGE_BYTES / BF_PAGE_BYTES)   /* 4 KiB pages a page */

static bool page_is_zero(const uint8_t *p, size_t len)
{
    const uint64_t *w = (const uint64_t *)p;

    for (size_t i = 0; i < len / 8; i++)
        if (w[i])
            return false;
    return true;
}

static bool tracked_kind(const struct bf *f)
{
    return (bf_kind(f) == BF_KIND_BLOCKED || bf_kind(f) == BF_KIND_CLASSIC) &&
           bf_layer_count(f) == 1;
}

/* Take sf's shared lock for a pull: 0 with it held, *f its bits and *li
 * their first layer; or, lock released, the state's error or -EOPNOTSUPP
 * for a kind that is not pulled page by page ("only blocked and classic
 * filters <what>"), err set. */
static int pull_begin(struct store_filter *sf, const struct bf **f,
                      struct bf_layer_info *li, const char *what, char *err)
{
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_errno(store__state(sf))) < 0) {
        store__state_err(sf, err);
        pthread_rwlock_unlock(&sf->lock);
        return rc;
    }
    *f = sf->bf;
    if (!tracked_kind(*f) || bf_layer_info(*f, 0, li) < 0) {
        errmsg_set(err, "filter '%s' is a %s filter; only blocked and "
                   "classic filters %s", sf->name, bf_kind_name(bf_kind(*f)), what);
        pthread_rwlock_unlock(&sf->lock);
        return -EOPNOTSUPP;
    }
    return 0;
}

/* The highest version of the 4 KiB pages of page p (RULES_PAGE_BYTES). */
static uint64_t page_version(const struct bf *f, uint64_t p)
{
    uint64_t v = 0;

    for (uint64_t i = p * SUB; i < (p + 1) * SUB; i++) {
        uint64_t x = bf_page_version(f, 0, i);
        if (x > v)
            v = x;
    }
    return v;
}

int store_pages_since(struct store_filter *sf, uint64_t epoch, uint64_t since,
                      store_page_fn fn, void *ctx,
                      struct store_pages_mark *mark, char *err)
{
    struct bf_layer_info li;
    uint8_t *buf = NULL;
    const struct bf *f;
    uint64_t my_epoch, npages;
    int rc;

    memset(mark, 0, sizeof *mark);
    if ((rc = pull_begin(sf, &f, &li, "merge page by page", err)) < 0)
        return rc;
    /* The cursor under the write lock: changes up to it are done, later
     * ones stamp above it.  The version read first: every write
     * acknowledged up to it has its record submitted, so <= the cursor. */
    pthread_mutex_lock(&sf->write_mu);
    /* The log's durable LSN before the cursor: a record after the cursor
     * is submitted later, so it takes a higher LSN (scan marks). */
    uint64_t durable = sf->s->wal ? wal_durable_lsn(sf->s->wal) : 0;
    mark->store_version = atomic_load(&sf->version);
    mark->version = wal_stream_last_seq(sf->stream);
    /* Pages changed up to the cursor read as the cursor from now on (not
     * as later versions, which would send them again next round). */
    bf_fold_versions(sf->bf, mark->version);
    uint64_t id = sf->id;
    pthread_mutex_unlock(&sf->write_mu);
    my_epoch = atomic_load(&sf->pages_epoch);
    if (sf->s->wal)
        store__scan_mark(sf, id, my_epoch, mark->version, durable + 1);
    mark->epoch = my_epoch;
    bf_fingerprint_id(f, mark->fp);
    pthread_rwlock_unlock(&sf->lock);

    npages = (li.body_bytes + RULES_PAGE_BYTES - 1) / RULES_PAGE_BYTES;
    bool all = since == 0 || epoch != my_epoch;
    if (fn && !(buf = malloc(RULES_PAGE_BYTES))) {
        errmsg_set(err, "no memory for a page of filter '%s'", sf->name);
        return -ENOMEM;
    }
    for (uint64_t p = 0; p < npages; p++) {
        uint64_t off = p * RULES_PAGE_BYTES;
        struct store_page pg = {.layer = 0, .offset = off,
                                .len = li.body_bytes - off < RULES_PAGE_BYTES
                                           ? (size_t)(li.body_bytes - off)
                                           : RULES_PAGE_BYTES};
        bool want;
        pthread_rwlock_rdlock(&sf->lock);
        if (sf->bf != f || atomic_load(&sf->pages_epoch) != my_epoch ||
            !store__readable(sf)) {
            pthread_rwlock_unlock(&sf->lock);
            errmsg_set(err, "filter '%s' was reloaded during the walk; "
                       "retry", sf->name);
            rc = -EAGAIN;
            goto out;
        }
        const uint8_t *body = (const uint8_t *)bf_layer_body_const(f, 0);
        if (all) {
            /* Version 0: never written, zeros, and not read (untouched
             * bits stay untouched: not resident). */
            want = (!bf_tracked(f) || page_version(f, p) != 0) &&
                   !page_is_zero(body + off, pg.len);
        } else {
            want = page_version(f, p) > since;
        }
        if (want && buf)
            memcpy(buf, body + off, pg.len);
        pthread_rwlock_unlock(&sf->lock);
        if (!want)
            continue;
        pg.data = buf;
        if (fn && (rc = fn(ctx, &pg)) < 0)
            goto out;
        mark->pages++;
        mark->bytes += pg.len;
    }
    rc = 0;
out:
    free(buf);
    return rc;
}

int store_pages_hashes(struct store_filter *sf, uint64_t *out, size_t max,
                       size_t *n)
{
    struct bf_layer_info li;
    int rc;

    *n = 0;
    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_errno(store__state(sf))) < 0)
        goto out;
    if (!tracked_kind(sf->bf) || bf_layer_info(sf->bf, 0, &li) < 0) {
        rc = -EOPNOTSUPP;
        goto out;
    }
    uint64_t np = (li.body_bytes + RULES_PAGE_BYTES - 1) / RULES_PAGE_BYTES;
    *n = (size_t)np;
    if (np > max) {
        rc = -ERANGE;
        goto out;
    }
    /* Writers set bits with atomic ORs under this shared lock: a hash may
     * see a write half done, which only makes a page look different (it is
     * then streamed, and ORing it is harmless). */
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(sf->bf, 0);
    /* A page never written (version 0) is zeros: its hash is the zero
     * page's, and its bits are not read (they stay untouched). */
    static const uint8_t zeros[RULES_PAGE_BYTES];
    uint64_t zero_full = XXH64(zeros, RULES_PAGE_BYTES, 0);
    for (uint64_t p = 0; p < np; p++) {
        uint64_t off = p * RULES_PAGE_BYTES;
        size_t len = li.body_bytes - off < RULES_PAGE_BYTES
                         ? (size_t)(li.body_bytes - off) : RULES_PAGE_BYTES;
        if (bf_tracked(sf->bf) && page_version(sf->bf, p) == 0)
            out[p] = len == RULES_PAGE_BYTES ? zero_full : XXH64(zeros, len, 0);
        else
            out[p] = XXH64(body + off, len, 0);
    }
out:
    pthread_rwlock_unlock(&sf->lock);
    return rc;
}

int store_pages_merge(struct store_filter *sf, const struct store_page *pages,
                      size_t n, uint64_t source_version, char *err)
{
    int rc;

    /* Nothing delivered, nothing claimed: a version travels only with the
     * pages it covers.  Still, the bits already here are made durable
     * first (store_or_pages with no page that adds a bit). */
    if (n == 0)
        return store_or_pages(sf, NULL, 0, err);
    if ((rc = store_or_pages(sf, pages, n, err)) == 0)
        store__raise(&sf->source_version, source_version);
    return rc;
}

uint64_t store_pages_source_version(struct store_filter *sf)
{
    return atomic_load(&sf->source_version);
}

/* ---- keys' hashes since a cursor, read back from the log ---- */

/* One pass over the filter's records (seq expect..last) in the log. */
struct keys_scan {
    uint64_t id, expect, last;
    /* counting pass: stop once the keys weigh max_bytes or more */
    uint64_t keys, max_bytes;
    bool counting;
    /* streaming pass: the keys of the records go into buf (cap hashes);
     * a record that does not fit whole is resumed at key skip */
    struct bf_hash *buf;
    size_t n, cap;
    uint64_t skip;
    uint64_t first_lsn;   /* of record since + 1 (counting pass) */
    uint64_t resume_lsn;  /* where the next streaming pass starts */
    bool full;            /* buf is full: stopped */
    bool done;            /* every record up to last read */
    int why;              /* 0, or why the keys cannot be the answer */
    char *err;
};

enum { KEYS_STOP = -ECANCELED };   /* a scan stopped on purpose */

static int keys_record(void *ctx, const struct wal_record *r)
{
    struct keys_scan *sc = ctx;

    if (r->id != sc->id || r->seq < sc->expect)
        return 0;
    if (r->seq != sc->expect) {
        errmsg_set(sc->err, "record %" PRIu64 " is no longer in the log",
                   sc->expect);
        sc->why = -ENOENT;
        return KEYS_STOP;
    }
    if (r->type != WAL_REC_ADD || r->len % sizeof(struct bf_hash)) {
        errmsg_set(sc->err, "record %" PRIu64 " is not an add (type %u)",
                   r->seq, r->type);
        sc->why = -EMEDIUMTYPE;
        return KEYS_STOP;
    }
    uint64_t k = r->len / sizeof(struct bf_hash);
    const uint8_t *p = r->payload;
    if (sc->counting) {
        if (!sc->first_lsn)
            sc->first_lsn = r->lsn;   /* record since + 1 */
        sc->keys += k;
        if (sc->keys * sizeof(struct bf_hash) >= sc->max_bytes) {
            errmsg_set(sc->err, "%" PRIu64 "+ keys' hashes weigh as much as "
                       "the %" PRIu64 " bytes of pages changed", sc->keys,
                       sc->max_bytes);
            sc->why = -EFBIG;
            return KEYS_STOP;
        }
    } else {
        for (uint64_t i = sc->skip; i < k; i++) {
            if (sc->n == sc->cap) {
                sc->skip = i;
                sc->resume_lsn = r->lsn;
                sc->full = true;
                return KEYS_STOP;
            }
            sc->buf[sc->n].h1 = wal__get64(p + 16 * i);
            sc->buf[sc->n].h2 = wal__get64(p + 16 * i + 8);
            sc->n++;
        }
        sc->skip = 0;
    }
    if (sc->expect++ == sc->last) {
        sc->done = true;
        return KEYS_STOP;
    }
    return 0;
}

static void keys_damage(void *ctx, const struct wal_damage *d)
{
    struct keys_scan *sc = ctx;

    if (!sc->why && !sc->done && (d->id == sc->id || !d->id)) {
        errmsg_set(sc->err, "the log is damaged there: %s", d->where);
        sc->why = -EBADMSG;
    }
}

/* Other filters' records, and this one's before the range, are passed
 * over by their headers. */
static bool keys_skip(void *ctx, const struct wal_record *h)
{
    struct keys_scan *sc = ctx;

    return h->id != sc->id || h->seq < sc->expect;
}

static const struct wal_scan_ops keys_ops = {keys_record, keys_damage,
                                             keys_skip};

/* ---- scan marks ----
 *
 * A keyed pull since a cursor reads the log from where the filter's
 * records after it begin, not from the newest checkpoint: every pull
 * (pages or keys) and every checkpoint notes, when it takes its cursor c,
 * an LSN that every later record of the filter is at or above (the
 * log's durable LSN read before c, or the LSN of the barrier behind c;
 * records after c are submitted after it); a pull since s starts at the
 * highest LSN noted for a cursor <= s of its incarnation and epoch.  A
 * puller's next pull is since the cursor its last one took, so a few
 * marks (STORE_SCAN_MARKS: the merger, the peers of a group and the
 * checkpoints) find it. */
void store__scan_mark(struct store_filter *sf, uint64_t id, uint64_t epoch,
                      uint64_t seq, uint64_t lsn)
{
    struct store_scan_mark *slot = NULL;

    if (!id || !epoch)
        return;
    pthread_mutex_lock(&sf->marks_mu);
    for (unsigned i = 0; i < STORE_SCAN_MARKS && !slot; i++)
        if (sf->marks[i].id == id && sf->marks[i].epoch == epoch &&
            sf->marks[i].seq == seq)
            slot = &sf->marks[i];
    if (slot) {
        if (lsn > slot->lsn)
            slot->lsn = lsn;
    } else {
        slot = &sf->marks[sf->marks_next++ % STORE_SCAN_MARKS];
        *slot = (struct store_scan_mark){id, epoch, seq, lsn};
    }
    pthread_mutex_unlock(&sf->marks_mu);
}

/* Where the records of id after since begin at the latest, by the marks
 * (0: none known). */
static uint64_t scan_mark_find(struct store_filter *sf, uint64_t id,
                               uint64_t epoch, uint64_t since)
{
    uint64_t from = 0;

    pthread_mutex_lock(&sf->marks_mu);
    for (unsigned i = 0; i < STORE_SCAN_MARKS; i++) {
        const struct store_scan_mark *m = &sf->marks[i];
        if (m->id == id && m->epoch == epoch && m->seq <= since &&
            m->lsn > from)
            from = m->lsn;
    }
    pthread_mutex_unlock(&sf->marks_mu);
    return from;
}

/* Scan the log from LSN from; 0, or a negative errno of the log. */
static int keys_pass(struct store_filter *sf, uint64_t from,
                     struct keys_scan *sc, char *err)
{
    struct wal_scan_info info;
    char werr[STORE_ERRLEN] = "";
    int rc = wal_rescan_from(sf->s->wal, from, &keys_ops, sc, &info, werr);

    if (rc == KEYS_STOP)
        return 0;    /* sc says why, in its own err */
    if (rc < 0)
        errmsg_set(err, "%s", werr);
    return rc;
}

int store_keys_since(struct store_filter *sf, uint64_t epoch, uint64_t since,
                     store_keys_fn fn, void *ctx,
                     struct store_pages_mark *mark, char *err)
{
    struct keys_scan sc = {.err = err};
    struct wal_waiter wt;
    uint64_t my_epoch, id, pages_bytes = 0, from = 0;
    struct bf_layer_info li;
    const struct bf *f;
    bool barrier = false;
    int rc;

    memset(mark, 0, sizeof *mark);
    if ((rc = pull_begin(sf, &f, &li, "are pulled", err)) < 0)
        return rc;
    my_epoch = atomic_load(&sf->pages_epoch);
    if (since == 0 || epoch != my_epoch || !sf->s->wal) {
        errmsg_set(err, "no cursor in this epoch: every page");
        pthread_rwlock_unlock(&sf->lock);
        return 1;
    }
    /* As store_pages_since: the cursor under the write lock; and a barrier
     * behind the last record, so that every record up to it can be read
     * back once the barrier completed. */
    pthread_mutex_lock(&sf->write_mu);
    uint64_t durable = wal_durable_lsn(sf->s->wal);   /* as store_pages_since */
    mark->store_version = atomic_load(&sf->version);
    mark->version = wal_stream_last_seq(sf->stream);
    /* As store_pages_since: pages changed up to the cursor read as the
     * cursor from now on. */
    bf_fold_versions(sf->bf, mark->version);
    id = sf->id;
    if (mark->version > since) {
        wal_waiter_init(&wt);
        if (wal_barrier(sf->stream, wal_waiter_done, &wt) < 0)
            wal_waiter_done(&wt, -ENOMEM, 0, 0);
        barrier = true;
    }
    pthread_mutex_unlock(&sf->write_mu);
    mark->epoch = my_epoch;
    bf_fingerprint_id(f, mark->fp);
    /* What the page walk would send (its pages changed since, at most). */
    uint64_t npages = (li.body_bytes + RULES_PAGE_BYTES - 1) / RULES_PAGE_BYTES;
    for (uint64_t p = 0; barrier && p < npages; p++)
        if (page_version(f, p) > since) {
            uint64_t off = p * RULES_PAGE_BYTES;
            pages_bytes += li.body_bytes - off < RULES_PAGE_BYTES
                               ? li.body_bytes - off : RULES_PAGE_BYTES;
        }
    pthread_rwlock_unlock(&sf->lock);
    if (!barrier) {
        store__scan_mark(sf, id, my_epoch, mark->version, durable + 1);
        return mark->version < since ? 1 : 0;   /* nothing since */
    }
    if ((rc = wal_waiter_wait(&wt)) < 0) {
        errmsg_set(err, "the log failed: %s", strerror(-rc));
        return 1;
    }
    /* Records after the cursor come after the barrier. */
    store__scan_mark(sf, id, my_epoch, mark->version,
                     (wt.lsn > durable ? wt.lsn : durable) + 1);
    /* Where the records after since begin: by the scan marks (the cursor
     * a pull or a checkpoint took at or before since); or after the
     * newest checkpoint's LSN when since is at or past its seq (a
     * checkpoint running now is not waited for); otherwise the whole log
     * is read. */
    from = scan_mark_find(sf, id, my_epoch, since);
    if (pthread_mutex_trylock(&sf->snap_mu) == 0) {
        if (sf->id == id && since >= sf->ckpt_seq &&
            atomic_load(&sf->ckpt_lsn) != UINT64_MAX &&
            atomic_load(&sf->ckpt_lsn) + 1 > from)
            from = atomic_load(&sf->ckpt_lsn) + 1;
        pthread_mutex_unlock(&sf->snap_mu);
    }
    /* Counting pass: every record there, all adds, and fewer bytes of
     * keys than of pages. */
    sc.id = id;
    sc.expect = since + 1;
    sc.last = mark->version;
    sc.counting = true;
    sc.max_bytes = pages_bytes;
    if (pages_bytes == 0) {
        errmsg_set(err, "no page changed");
        return 1;
    }
    /* Bounded: a scan that would read more of the log than a multiple of
     * the pages' bytes is not started (the pages are the answer).  What
     * it reads: its own records, which the counting pass stops at the
     * pages' bytes, and the header of every other record, each on at most
     * two 4 KiB pages of the files with its padding record's: at most
     * the bytes from where it starts, and at most 8 KiB a record (an
     * import of another filter costs its header, not its bits). */
    uint64_t span, nrec;
    wal_span_from(sf->s->wal, from, &span, &nrec);
    uint64_t cost = nrec < span / STORE_KEYS_RECORD_COST
                        ? nrec * STORE_KEYS_RECORD_COST : span;
    if (cost / STORE_KEYS_SCAN_RATIO > pages_bytes) {
        errmsg_set(err, "the log from LSN %" PRIu64 " (%s) holds %" PRIu64
                   " records in %" PRIu64 " bytes, more to read than %u "
                   "times the %" PRIu64 " bytes of pages changed", from,
                   from ? "where the records after the cursor begin"
                        : "its start: no mark of the cursor",
                   nrec, span, STORE_KEYS_SCAN_RATIO, pages_bytes);
        return 1;
    }
    if ((rc = keys_pass(sf, from, &sc, err)) < 0)
        return 1;
    if (sc.why)
        return 1;
    if (!sc.done) {
        errmsg_set(err, "records %" PRIu64 "..%" PRIu64 " are not in the "
                   "log", sc.expect, sc.last);
        return 1;
    }
    /* Streaming passes: at most STORE_KEYS_CHUNK keys held at once,
     * reserved against max_memory_mb; none of the log's locks is held
     * while fn runs. */
    size_t cap = sc.keys < STORE_KEYS_CHUNK ? (size_t)sc.keys : STORE_KEYS_CHUNK;
    uint64_t bytes = (uint64_t)cap * sizeof(struct bf_hash);
    if (store_reserve(sf->s, bytes, "the keys of a pull", err) < 0)
        return 1;
    struct keys_scan ss = {.err = err, .id = id, .expect = since + 1,
                           .last = mark->version, .cap = cap,
                           .resume_lsn = sc.first_lsn};
    if (!(ss.buf = malloc(bytes ? bytes : 1))) {
        store_release(sf->s, bytes);
        errmsg_set(err, "no memory for the keys of a pull");
        return 1;
    }
    rc = 0;
    while (!ss.done) {
        ss.n = 0;
        ss.full = false;
        if ((rc = keys_pass(sf, ss.resume_lsn, &ss, err)) < 0 || ss.why) {
            rc = 1;   /* gone since the counting pass: pages */
            break;
        }
        if (!ss.full && !ss.done) {
            errmsg_set(err, "records %" PRIu64 "..%" PRIu64 " left the log "
                       "during the pull", ss.expect, ss.last);
            rc = 1;
            break;
        }
        if (ss.n && fn && (rc = fn(ctx, ss.buf, ss.n)) < 0)
            break;
        mark->keys += ss.n;
        mark->bytes += ss.n * sizeof(struct bf_hash);
        rc = 0;
    }
    free(ss.buf);
    store_release(sf->s, bytes);
    return rc;
}
