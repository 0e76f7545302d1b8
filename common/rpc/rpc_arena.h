/* rpc_arena: a bump allocator for protobuf-c, so that unpacking a message
 * of a thousand keys costs a few block allocations instead of a thousand
 * mallocs.
 *
 * protobuf_c_message_unpack(desc, rpc_arena_allocator(a), len, data) takes
 * every allocation of the message from the arena; freeing is a no-op, and
 * rpc_arena_reset() takes everything back at once (the message must not be
 * used after it; never call free_unpacked on it).  The arena keeps its
 * largest block between resets, so a thread or stream that decodes message
 * after message allocates nothing in the steady state.  Every arena has a
 * limit: an allocation past it fails (protobuf-c then reports the message
 * as unparseable), so a hostile message cannot make it grow without bound.
 *
 * One arena belongs to one thread at a time.
 */
#ifndef BLOOMGRID_RPC_ARENA_H
#define BLOOMGRID_RPC_ARENA_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

struct rpc_arena_chunk;

struct rpc_arena {
    ProtobufCAllocator pc;           /* what protobuf-c is given */
    unsigned char *block;            /* the kept block */
    size_t cap;                      /* of block */
    unsigned char *cur;              /* where allocations bump now: block, */
    size_t cur_cap, used;            /* or the newest extra chunk */
    struct rpc_arena_chunk *extra;   /* blocks added since the last reset */
    size_t total;                    /* bytes handed out since the reset */
    size_t max;                      /* limit of total */
};

/* Set a up with a limit of max bytes per message (0: 64 MiB). */
void rpc_arena_init(struct rpc_arena *a, size_t max);

/* The allocator to pass to protobuf-c. */
ProtobufCAllocator *rpc_arena_allocator(struct rpc_arena *a);

/* Take back everything handed out (keeping one block big enough for what
 * the last message needed, up to the limit). */
void rpc_arena_reset(struct rpc_arena *a);

/* Free every block.  a may be reused after rpc_arena_init. */
void rpc_arena_deinit(struct rpc_arena *a);

#endif
