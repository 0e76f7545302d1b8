/* proc_malloc: the allocator settings of the serving processes (node,
 * router, merger), applied once at start.
 *
 * glibc's malloc gives freed memory back to the kernel as soon as 128 KiB
 * lie free at the top of a heap (brk, or madvise(MADV_DONTNEED) in a
 * thread's arena), and serves requests of more than its moving mmap
 * threshold with mmap/munmap.  With gRPC and TLS buffers freed and taken
 * again on every call, that is hundreds of madvise calls a second, each a
 * TLB shootdown of every thread of the process (measured on a router under
 * 1000-key reads over TLS: 476 madvise calls in 5 s, and a quarter of its
 * CPU in the kernel's cross-CPU calls and their spin locks; none with
 * these settings).  So: up to 16 MiB may stay free at the top of a heap,
 * and only requests of 4 MiB or more are mapped on their own (filters'
 * bits are mapped by bf.c anyway).
 *
 * A process started with GLIBC_TUNABLES naming glibc.malloc, or with any
 * MALLOC_*_ variable, keeps what it was given.
 */
#ifndef BLOOMGRID_PROC_MALLOC_H
#define BLOOMGRID_PROC_MALLOC_H

#define PROC_MALLOC_TRIM_BYTES (16u << 20)
#define PROC_MALLOC_MMAP_BYTES (4u << 20)

#include <stddef.h>

/* Apply the settings above (before any thread starts).  Returns 1 when
 * they were applied, 0 when the environment asked for its own. */
int proc_malloc_tune(void);

/* A process whose memory is bounded against its data (the node: its
 * filters' bits + 10 %) also caps its arenas.  glibc gives each thread
 * that meets a busy arena one of its own, up to 8 per core, and an
 * arena's heap keeps up to PROC_MALLOC_TRIM_BYTES free at its top (which
 * malloc_trim does not reach for arenas other than the main one): with
 * hundreds of threads (a node's stream pool) that is 16 MiB of resident
 * memory per arena, more than the filters on a small node.  Capped at
 * PROC_MALLOC_NODE_ARENAS, with the trim threshold at
 * PROC_MALLOC_NODE_TRIM_BYTES (a burst's heap top goes back on the next
 * free; the churn of small buffers stays below it).  Call after
 * proc_malloc_tune and before any thread starts; does nothing when the
 * environment asked for its own settings (as proc_malloc_tune).  Returns
 * 1 when applied. */
#define PROC_MALLOC_NODE_ARENAS 4
#define PROC_MALLOC_NODE_TRIM_BYTES (4u << 20)
int proc_malloc_bound(void);

/* What malloc holds from the system (mallinfo2 over every arena): held,
 * the bytes of its heaps and of its own mmaps; free, the bytes of those
 * heaps that are free (kept for reuse, resident where they were touched).
 * Walks every arena under its lock: for a metrics scrape, not a hot path. */
struct proc_malloc_stats {
    size_t held, free;
};
void proc_malloc_stats(struct proc_malloc_stats *out);

/* Give the free pages of every arena back to the system (malloc_trim(0):
 * madvise(MADV_DONTNEED) of whole free pages inside the heaps, not only at
 * their tops).  Returns 1 when some memory went back, 0 when none could.
 * Walks every arena under its lock: after a large transient use, not per
 * call. */
int proc_malloc_release(void);

#endif
