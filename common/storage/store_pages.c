/* store_pages: change tracking of a filter's pages (store.h, "Change
 * tracking"), kept in the filter object and freed with it.
 *
 * Changes are found by a diff at walk time, so the add path is untouched
 * (no cost per key).  The tracking holds a copy of the layer body as of the
 * last walk, a change counter `tag` and, per page, the tag at which the
 * page was last seen to differ.  A walk first reads the store version V,
 * then compares every page of the live body with the copy; a page that
 * differs is copied and stamped with a new tag (max(V, tag + 1), so tags
 * only grow and follow the store's versions).  The walk reports every page
 * whose stamp is above since, with the copy's bytes: those hold every bit
 * of every write acknowledged up to V (bits are set before the version is
 * raised: store.h), which is what the mark's store_version promises.  Bits
 * that land during the compare are either in the copy or found by the
 * next walk.
 *
 * Merged pages (store_pages_merge) are ORed into the live filter only: a
 * page a merge changed differs from the copy and is stamped by the next
 * walk like a local change.  Change tracking is per puller in effect:
 * several pullers (the other copies of a group, the merger) each keep
 * their own (epoch, version), and a page one sender pushed is still
 * reported to every puller whose version is before its stamp.  The sender
 * may get its own pages back once; ORing them again changes nothing, so
 * rounds still converge.
 *
 * The tracking survives store_filter_recover (the files, hence the
 * geometry and secret, are the same; pages that differ after the reload
 * are stamped again); should the geometry or fingerprint change under it,
 * it starts over with a new epoch.  Locks: store_internal.h (pages_mu
 * before lock).
 */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <xxhash.h>

#include "rules.h"
#include "store_internal.h"

struct store_pages {
    uint64_t epoch;
    uint64_t tag;                /* last stamp handed out */
    uint64_t walked;             /* store version of the last diff (0: none) */
    char fp[17];                 /* fingerprint id the copy is of */
    uint64_t body_bytes;
    uint64_t npages;
    uint64_t *stamp;             /* per page */
    uint8_t *copy;               /* body_bytes: the body as last walked */
};

void store__pages_free(struct store_pages *t)
{
    if (!t)
        return;
    free(t->stamp);
    free(t->copy);
    free(t);
}

void store__pages_reloaded(struct store_pages *t)
{
    if (t)
        t->walked = 0;
}

static uint64_t new_epoch(void)
{
    static _Atomic uint64_t fallback = 1;
    uint64_t e = 0;

    if (getrandom(&e, sizeof e, 0) != sizeof e)
        e = atomic_fetch_add(&fallback, 1);
    return e ? e : 1;
}

static size_t page_len(const struct store_pages *t, uint64_t p)
{
    uint64_t off = p * RULES_PAGE_BYTES;

    return t->body_bytes - off < RULES_PAGE_BYTES
               ? (size_t)(t->body_bytes - off) : RULES_PAGE_BYTES;
}

static bool page_is_zero(const uint8_t *p, size_t len)
{
    const uint64_t *w = (const uint64_t *)p;

    for (size_t i = 0; i < len / 8; i++)
        if (w[i])
            return false;
    return true;
}

/* The filter's tracking, made (or made again) for the live filter's
 * geometry and fingerprint.  Under pages_mu and the shared lock, READY.
 * Returns 0, -EOPNOTSUPP or -ENOMEM with err set. */
static int pages_for(struct store_filter *sf, char *err)
{
    struct store_pages *t = sf->pages;
    struct bf_layer_info li;
    char fp[17];

    if ((bf_kind(sf->bf) != BF_KIND_BLOCKED &&
         bf_kind(sf->bf) != BF_KIND_CLASSIC) ||
        bf_layer_count(sf->bf) != 1 || bf_layer_info(sf->bf, 0, &li) < 0) {
        errmsg_set(err, "filter '%s' is a %s filter; only blocked and "
                      "classic filters merge page by page", sf->name,
                      bf_kind_name(bf_kind(sf->bf)));
        return -EOPNOTSUPP;
    }
    bf_fingerprint_id(sf->bf, fp);
    if (t && t->body_bytes == li.body_bytes && strcmp(t->fp, fp) == 0)
        return 0;
    store__pages_free(t);
    sf->pages = NULL;
    if (!(t = calloc(1, sizeof *t)))
        goto nomem;
    t->epoch = new_epoch();
    memcpy(t->fp, fp, sizeof fp);
    t->body_bytes = li.body_bytes;
    t->npages = (li.body_bytes + RULES_PAGE_BYTES - 1) / RULES_PAGE_BYTES;
    /* Zeroed: the first walk stamps every non-empty page. */
    if (!(t->stamp = calloc(t->npages ? t->npages : 1, sizeof *t->stamp)) ||
        !(t->copy = calloc(1, li.body_bytes ? li.body_bytes : 1)))
        goto nomem;
    sf->pages = t;
    return 0;
nomem:
    store__pages_free(t);
    errmsg_set(err, "no memory for the change tracking of filter '%s' "
                  "(%" PRIu64 " bytes)", sf->name, li.body_bytes);
    return -ENOMEM;
}

/* Copy and stamp the pages of the live body that differ from the copy.
 * Under the shared lock. */
static void pages_diff(struct store_pages *t, const struct bf *f,
                       uint64_t stamp)
{
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(f, 0);
    bool changed = false;

    for (uint64_t p = 0; p < t->npages; p++) {
        uint64_t off = p * RULES_PAGE_BYTES;
        size_t len = page_len(t, p);
        if (memcmp(body + off, t->copy + off, len) != 0) {
            memcpy(t->copy + off, body + off, len);
            t->stamp[p] = stamp;
            changed = true;
        }
    }
    if (changed)
        t->tag = stamp;
}

int store_pages_since(struct store_filter *sf, uint64_t epoch, uint64_t since,
                      store_page_fn fn, void *ctx,
                      struct store_pages_mark *mark, char *err)
{
    struct store_pages *t;
    int rc;

    pthread_mutex_lock(&sf->pages_mu);
    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_errno(store__state(sf))) < 0)
        store__state_err(sf, err);
    else
        rc = pages_for(sf, err);
    if (rc < 0) {
        pthread_rwlock_unlock(&sf->lock);
        goto out;
    }
    t = sf->pages;
    /* The version first: every write acknowledged up to v set its bits
     * before v was raised, so the compare below sees them. */
    uint64_t v = atomic_load(&sf->version);
    /* Every change of the bits raises the version after it: an unchanged
     * version means nothing to find, and an idle filter costs no compare
     * of its body however often its copies and the merger ask. */
    if (v != t->walked || v == 0) {
        pages_diff(t, sf->bf, v > t->tag ? v : t->tag + 1);
        t->walked = v;
    }
    pthread_rwlock_unlock(&sf->lock);

    memset(mark, 0, sizeof *mark);
    mark->epoch = t->epoch;
    mark->version = t->tag;
    mark->store_version = v;
    memcpy(mark->fp, t->fp, sizeof mark->fp);
    bool all = since == 0 || epoch != t->epoch;
    for (uint64_t p = 0; p < t->npages; p++) {
        struct store_page pg = {.layer = 0, .offset = p * RULES_PAGE_BYTES,
                                .len = page_len(t, p)};
        pg.data = t->copy + pg.offset;
        if (all ? page_is_zero(pg.data, pg.len) : t->stamp[p] <= since)
            continue;
        if (fn && (rc = fn(ctx, &pg)) < 0)
            goto out;
        mark->pages++;
        mark->bytes += pg.len;
    }
    rc = 0;
out:
    pthread_mutex_unlock(&sf->pages_mu);
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
    if ((bf_kind(sf->bf) != BF_KIND_BLOCKED &&
         bf_kind(sf->bf) != BF_KIND_CLASSIC) ||
        bf_layer_count(sf->bf) != 1 || bf_layer_info(sf->bf, 0, &li) < 0) {
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
    for (uint64_t p = 0; p < np; p++) {
        uint64_t off = p * RULES_PAGE_BYTES;
        size_t len = li.body_bytes - off < RULES_PAGE_BYTES
                         ? (size_t)(li.body_bytes - off) : RULES_PAGE_BYTES;
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
