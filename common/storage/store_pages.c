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
    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_errno(store__state(sf))) < 0) {
        store__state_err(sf, err);
        pthread_rwlock_unlock(&sf->lock);
        return rc;
    }
    f = sf->bf;
    if (!tracked_kind(f) || bf_layer_info(f, 0, &li) < 0) {
        errmsg_set(err, "filter '%s' is a %s filter; only blocked and "
                   "classic filters merge page by page", sf->name,
                   bf_kind_name(bf_kind(f)));
        pthread_rwlock_unlock(&sf->lock);
        return -EOPNOTSUPP;
    }
    /* The cursor under the write lock: changes up to it are done, later
     * ones stamp above it.  The version read first: every write
     * acknowledged up to it has its record submitted, so <= the cursor. */
    pthread_mutex_lock(&sf->write_mu);
    mark->store_version = atomic_load(&sf->version);
    mark->version = wal_stream_last_seq(sf->stream);
    /* Pages changed up to the cursor read as the cursor from now on (not
     * as later versions, which would send them again next round). */
    bf_fold_versions(sf->bf, mark->version);
    pthread_mutex_unlock(&sf->write_mu);
    my_epoch = atomic_load(&sf->pages_epoch);
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
