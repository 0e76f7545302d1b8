/* bf_mem: the memory of filters' bodies.
 *
 * A body of 2 MiB or more is a mapping of its own, in whole 2 MiB pages
 * advised for transparent huge pages.  A smaller body (a shard of a
 * filter of many shards, a small filter) is cut from a 2 MiB chunk shared
 * with other small bodies and advised the same way: as a mapping of its
 * own it could only have 4 KiB pages, and a node holding many small shards
 * would miss the TLB on nearly every key it reads or adds (a walk of the
 * page tables, costlier still in a virtual machine).  Sharing chunks also
 * keeps a node of thousands of small shards far from the system's limit on
 * mappings (vm.max_map_count).
 *
 * Chunks are cut in units of 4 KiB, first fit.  A freed body's memory goes
 * back to the system at once (MADV_DONTNEED: it reads as zeros when it is
 * cut again, so every body starts zeroed as a new mapping does), and a
 * chunk that holds no body is unmapped.  One mutex guards the chunks:
 * bodies are made and freed when filters are, never on a key's path.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "bf_internal.h"

#define HUGE_BYTES ((size_t)2 << 20)
#define UNIT_SHIFT 12
#define UNIT_BYTES ((size_t)1 << UNIT_SHIFT)
#define UNITS (HUGE_BYTES >> UNIT_SHIFT)    /* 512 a chunk */

struct chunk {
    struct chunk *next;
    uint8_t *base;                          /* HUGE_BYTES, aligned to them */
    uint64_t used[UNITS / 64];              /* a bit per unit cut */
    unsigned bodies;
};

static struct {
    pthread_mutex_t mu;
    struct chunk *head;
    size_t n;
} pool = {.mu = PTHREAD_MUTEX_INITIALIZER};

static bool unit_used(const struct chunk *c, size_t u)
{
    return c->used[u / 64] >> (u % 64) & 1;
}

static void units_mark(struct chunk *c, size_t first, size_t n, bool used)
{
    for (size_t u = first; u < first + n; u++) {
        if (used)
            c->used[u / 64] |= (uint64_t)1 << (u % 64);
        else
            c->used[u / 64] &= ~((uint64_t)1 << (u % 64));
    }
}

/* The first run of n free units in c, or -1. */
static long run_find(const struct chunk *c, size_t n)
{
    size_t run = 0;
    for (size_t u = 0; u < UNITS; u++) {
        run = unit_used(c, u) ? 0 : run + 1;
        if (run == n)
            return (long)(u + 1 - n);
    }
    return -1;
}

/* A new chunk: map twice its size and keep the aligned middle, so that
 * its 2 MiB can be one huge page. */
static struct chunk *chunk_new(void)
{
    struct chunk *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    uint8_t *m = mmap(NULL, 2 * HUGE_BYTES, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        free(c);
        return NULL;
    }
    uint8_t *base = (uint8_t *)(((uintptr_t)m + HUGE_BYTES - 1) & ~(uintptr_t)(HUGE_BYTES - 1));
    if (base > m)
        munmap(m, (size_t)(base - m));
    if (base + HUGE_BYTES < m + 2 * HUGE_BYTES)
        munmap(base + HUGE_BYTES, (size_t)(m + 2 * HUGE_BYTES - (base + HUGE_BYTES)));
    (void)madvise(base, HUGE_BYTES, MADV_HUGEPAGE);
    c->base = base;
    return c;
}

static void *small_alloc(size_t units)
{
    pthread_mutex_lock(&pool.mu);
    struct chunk *c;
    long at = -1;
    for (c = pool.head; c; c = c->next)
        if ((at = run_find(c, units)) >= 0)
            break;
    if (!c && (c = chunk_new()) != NULL) {
        c->next = pool.head;
        pool.head = c;
        pool.n++;
        at = 0;
    }
    void *p = NULL;
    if (c) {
        units_mark(c, (size_t)at, units, true);
        c->bodies++;
        p = c->base + ((size_t)at << UNIT_SHIFT);
    }
    pthread_mutex_unlock(&pool.mu);
    return p;
}

static void small_free(void *p, size_t units)
{
    uint8_t *b = p;
    pthread_mutex_lock(&pool.mu);
    struct chunk **pc = &pool.head, *c;
    while ((c = *pc) != NULL && !(b >= c->base && b < c->base + HUGE_BYTES))
        pc = &c->next;
    if (c) {
        units_mark(c, (size_t)(b - c->base) >> UNIT_SHIFT, units, false);
        if (--c->bodies == 0) {
            *pc = c->next;
            pool.n--;
            munmap(c->base, HUGE_BYTES);
            free(c);
        } else {
            (void)madvise(b, units << UNIT_SHIFT, MADV_DONTNEED);
        }
    }
    pthread_mutex_unlock(&pool.mu);
}

int bf__body_alloc(struct bf_layer *l, uint64_t bytes)
{
    if (bytes < HUGE_BYTES) {
        size_t units = (size_t)((bytes + UNIT_BYTES - 1) >> UNIT_SHIFT);
        void *p = small_alloc(units);
        if (!p)
            return -ENOMEM;
        l->body = p;
        l->map_bytes = units << UNIT_SHIFT;
        l->cut = true;
        return 0;
    }
    size_t map = (size_t)((bytes + HUGE_BYTES - 1) & ~((uint64_t)HUGE_BYTES - 1));
    void *mem = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return -errno;
    (void)madvise(mem, map, MADV_HUGEPAGE);
    l->body = mem;
    l->map_bytes = map;
    l->cut = false;
    return 0;
}

void bf__body_free(struct bf_layer *l)
{
    if (!l->body)
        return;
    if (l->cut)
        small_free(l->body, l->map_bytes >> UNIT_SHIFT);
    else
        munmap(l->body, l->map_bytes);
    l->body = NULL;
    l->map_bytes = 0;
    l->cut = false;
}

size_t bf_body_chunks(void)
{
    pthread_mutex_lock(&pool.mu);
    size_t n = pool.n;
    pthread_mutex_unlock(&pool.mu);
    return n;
}
