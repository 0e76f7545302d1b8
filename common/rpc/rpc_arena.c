/* rpc_arena: bump allocation for protobuf-c (see rpc_arena.h). */
#include <stdint.h>
#include <stdlib.h>

#include "rpc_arena.h"

#define ALIGN 16
#define FIRST_BLOCK (64u << 10)
#define DEFAULT_MAX ((size_t)64 << 20)

struct rpc_arena_chunk {
    struct rpc_arena_chunk *next;
    max_align_t data[];
};

static size_t round_up(size_t n)
{
    return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1);
}

static void *arena_alloc(void *ctx, size_t size)
{
    struct rpc_arena *a = ctx;
    size_t n = round_up(size ? size : 1);

    if (n > a->max || a->total > a->max - n)
        return NULL;
    if (!a->block) {
        size_t cap = n > FIRST_BLOCK ? n : FIRST_BLOCK;
        if (!(a->block = malloc(cap)))
            return NULL;
        a->cap = cap;
        a->cur = a->block;
        a->cur_cap = cap;
        a->used = 0;
    }
    if (a->cur_cap - a->used < n) {
        /* A new chunk, twice the last region (or n), becomes the region
         * allocations bump in; reset folds them all into one block. */
        size_t want = 2 * a->cur_cap > n ? 2 * a->cur_cap : n;
        struct rpc_arena_chunk *c = malloc(sizeof *c + want);
        if (!c)
            return NULL;
        c->next = a->extra;
        a->extra = c;
        a->cur = (unsigned char *)c->data;
        a->cur_cap = want;
        a->used = 0;
    }
    void *p = a->cur + a->used;
    a->used += n;
    a->total += n;
    return p;
}

static void arena_free(void *ctx, void *p)
{
    (void)ctx;
    (void)p;
}

void rpc_arena_init(struct rpc_arena *a, size_t max)
{
    a->pc.alloc = arena_alloc;
    a->pc.free = arena_free;
    a->pc.allocator_data = a;
    a->block = a->cur = NULL;
    a->cap = a->cur_cap = a->used = a->total = 0;
    a->extra = NULL;
    a->max = max ? max : DEFAULT_MAX;
}

ProtobufCAllocator *rpc_arena_allocator(struct rpc_arena *a)
{
    return &a->pc;
}

void rpc_arena_reset(struct rpc_arena *a)
{
    size_t need = a->total;

    while (a->extra) {
        struct rpc_arena_chunk *c = a->extra;
        a->extra = c->next;
        free(c);
    }
    if (need > a->cap) {
        /* Next time one block holds it all. */
        size_t cap = a->cap;
        while (cap < need)
            cap *= 2;
        if (cap > round_up(a->max))
            cap = round_up(a->max);
        unsigned char *b = malloc(cap);
        if (b) {
            free(a->block);
            a->block = b;
            a->cap = cap;
        }
    }
    a->cur = a->block;
    a->cur_cap = a->cap;
    a->used = 0;
    a->total = 0;
}

void rpc_arena_deinit(struct rpc_arena *a)
{
    while (a->extra) {
        struct rpc_arena_chunk *c = a->extra;
        a->extra = c->next;
        free(c);
    }
    free(a->block);
    a->block = a->cur = NULL;
    a->cap = a->cur_cap = a->used = a->total = 0;
}
