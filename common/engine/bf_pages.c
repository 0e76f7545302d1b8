/* bf_pages: page versions of a filter's bodies (bf.h, "Page versions").
 *
 * Each tracked layer has an array of 64-bit versions, one per 4 KiB page of
 * its body, in anonymous memory (untouched parts cost nothing).  The add,
 * remove and merge paths stamp through bf__stamp_word (bf_internal.h); this
 * file allocates the arrays and reads them.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "bf_internal.h"

int bf__layer_track(struct bf_layer *l)
{
    if (l->pver || !l->body)
        return 0;
    uint64_t pages = (l->words * 8 + BF_PAGE_BYTES - 1) >> BF_PAGE_SHIFT;
    /* Whole 2 MiB pages for big arrays, as for the bodies: an add stamps a
     * version at a random place in the array, and with 4 KiB pages that
     * store would miss the TLB on nearly every add of a large filter. */
    size_t bytes = (size_t)pages * 8;
    size_t map = bytes >= (2u << 20) ? (bytes + (2u << 20) - 1) & ~((size_t)(2u << 20) - 1)
                                     : bytes;
    void *mem = mmap(NULL, map, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return -ENOMEM;
    if (map >= (2u << 20))
        (void)madvise(mem, map, MADV_HUGEPAGE);
    uint64_t *dirty = calloc((pages + 63) / 64, 8);
    if (!dirty) {
        munmap(mem, map);
        return -ENOMEM;
    }
    l->dirty = dirty;
    l->npages = pages;
    __atomic_store_n(&l->pver, (uint64_t *)mem, __ATOMIC_RELEASE);
    return 0;
}

void bf__layer_untrack(struct bf_layer *l)
{
    if (l->pver) {
        size_t bytes = (size_t)l->npages * 8;
        munmap(l->pver, bytes >= (2u << 20)
                            ? (bytes + (2u << 20) - 1) & ~((size_t)(2u << 20) - 1) : bytes);
    }
    l->pver = NULL;
    free(l->dirty);
    l->dirty = NULL;
    l->npages = 0;
}

int bf_track_pages(struct bf *f, bool on)
{
    uint32_t n;

    pthread_mutex_lock(&f->grow_lock);   /* against a scalable layer append */
    n = bf__nlayers(f);
    f->track = on;
    for (uint32_t i = 0; i < n; i++) {
        if (!on) {
            bf__layer_untrack(&f->layers[i]);
        } else if (bf__layer_track(&f->layers[i]) < 0) {
            for (uint32_t j = 0; j < n; j++)
                bf__layer_untrack(&f->layers[j]);
            f->track = false;
            pthread_mutex_unlock(&f->grow_lock);
            return -ENOMEM;
        }
    }
    pthread_mutex_unlock(&f->grow_lock);
    return 0;
}

bool bf_tracked(const struct bf *f)
{
    return f->track;
}

void bf_set_stamp(struct bf *f, uint64_t version)
{
    __atomic_store_n(&f->stamp, version, __ATOMIC_RELAXED);
}

uint64_t bf_layer_pages(const struct bf *f, uint32_t i)
{
    if (i >= bf__nlayers(f))
        return 0;
    return (f->layers[i].words * 8 + BF_PAGE_BYTES - 1) >> BF_PAGE_SHIFT;
}

bool bf_page_unwritten(const struct bf *f, uint32_t i, uint64_t p)
{
    if (i >= bf__nlayers(f))
        return false;
    const struct bf_layer *l = &f->layers[i];
    const uint64_t *v = __atomic_load_n(&l->pver, __ATOMIC_ACQUIRE);
    if (!v || p >= l->npages)
        return false;
    return !(__atomic_load_n(&l->dirty[p >> 6], __ATOMIC_ACQUIRE) >> (p & 63) & 1) &&
           __atomic_load_n(&v[p], __ATOMIC_RELAXED) == 0;
}

uint64_t bf_page_version(const struct bf *f, uint32_t i, uint64_t p)
{
    if (i >= bf__nlayers(f))
        return 0;
    const struct bf_layer *l = &f->layers[i];
    const uint64_t *v = __atomic_load_n(&l->pver, __ATOMIC_ACQUIRE);
    if (!v || p >= l->npages)
        return 0;
    /* A page marked changed and not yet folded changed at a version no
     * higher than the writer's current one.  The mark is read first: a
     * fold writes the version before it clears the mark (release). */
    bool marked = __atomic_load_n(&l->dirty[p >> 6], __ATOMIC_ACQUIRE) >> (p & 63) & 1;
    uint64_t x = __atomic_load_n(&v[p], __ATOMIC_RELAXED);
    if (marked) {
        /* At least 1: a changed page never reads as never written. */
        uint64_t s = __atomic_load_n(&f->stamp, __ATOMIC_RELAXED);
        if (s > x)
            x = s;
        if (x == 0)
            x = 1;
    }
    return x;
}

uint64_t bf_fold_versions(struct bf *f, uint64_t version)
{
    uint32_t n = bf__nlayers(f);
    uint64_t folded = 0;

    for (uint32_t i = 0; i < n; i++) {
        struct bf_layer *l = &f->layers[i];
        if (!l->dirty)
            continue;
        for (uint64_t w = 0, nw = (l->npages + 63) / 64; w < nw; w++) {
            uint64_t bits = __atomic_load_n(&l->dirty[w], __ATOMIC_RELAXED);
            if (!bits)
                continue;
            for (uint64_t b = bits; b; b &= b - 1) {
                uint64_t p = w * 64 + (uint64_t)__builtin_ctzll(b);
                uint64_t v = version ? version : 1;   /* changed: never 0 */
                if (__atomic_load_n(&l->pver[p], __ATOMIC_RELAXED) < v)
                    __atomic_store_n(&l->pver[p], v, __ATOMIC_RELAXED);
                folded++;
            }
            __atomic_fetch_and(&l->dirty[w], ~bits, __ATOMIC_RELEASE);
        }
    }
    return folded;
}

void bf_stamp_range(struct bf *f, uint32_t i, uint64_t off, uint64_t len)
{
    if (i >= bf__nlayers(f) || len == 0)
        return;
    struct bf_layer *l = &f->layers[i];
    for (uint64_t p = off >> BF_PAGE_SHIFT;
         l->pver && p < l->npages && p <= (off + len - 1) >> BF_PAGE_SHIFT; p++)
        __atomic_store_n(&l->pver[p], f->stamp, __ATOMIC_RELAXED);
}

uint64_t bf_tracking_bytes(const struct bf *f)
{
    uint32_t n = bf__nlayers(f);
    uint64_t b = 0;

    for (uint32_t i = 0; i < n; i++)
        b += f->layers[i].npages * 8 + (f->layers[i].npages + 63) / 64 * 8;
    return b;
}
