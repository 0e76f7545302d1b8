/* name_index: names to pointers, for tables that many threads read at once
 * (a node's filters, a router's filter cache and node links).
 *
 * A lookup costs a hash of the name and a bucket walk, whatever the number
 * of names, and takes no lock that every reader shares: the names are
 * spread over NAME_INDEX_STRIPES tables (uthash), each behind its own
 * read-write lock, chosen by the high bits of the name's hash (uthash's
 * buckets use the low ones).  Readers of one stripe share its lock; a
 * writer holds one stripe, never the others.
 *
 * The index owns copies of the names, never the values: a value must stay
 * valid while it is in the index, and a reader that keeps one beyond the
 * lookup takes its own hold (a reference) inside the lookup's callback,
 * which runs under the stripe's lock, so a writer cannot remove the value
 * between the lookup and the hold.
 *
 * Threads: every function may be called from any thread at once, except
 * name_index_destroy.  Errors: 0 or a negative errno.
 */
#ifndef BLOOMGRID_NAME_INDEX_H
#define BLOOMGRID_NAME_INDEX_H

#include <stdbool.h>
#include <stddef.h>

#define NAME_INDEX_STRIPES 64

struct name_index;

/* An empty index, or NULL when out of memory. */
struct name_index *name_index_create(void);

/* Free the index and its copies of the names (not the values).  NULL is
 * allowed. */
void name_index_destroy(struct name_index *ix);

/* Called on a value under its stripe's lock (read lock for lookups, write
 * lock for name_index_update): it must not call the index. */
typedef void (*name_index_fn)(void *value, void *ctx);

/* The value of name, or NULL.  take (may be NULL) runs on it before the
 * stripe's lock is released. */
void *name_index_get(struct name_index *ix, const char *name, name_index_fn take,
                     void *ctx);

/* Add name -> value (value not NULL).  Returns 0, -EEXIST (name is there:
 * nothing changed) or -ENOMEM. */
int name_index_add(struct name_index *ix, const char *name, void *value);

/* Set name -> value, adding it or replacing what it had.  Returns the
 * value replaced (the caller's to release), NULL when there was none; on
 * -ENOMEM (nothing changed) *rc gets it, else 0. */
void *name_index_set(struct name_index *ix, const char *name, void *value, int *rc);

/* Remove name when its value is want (NULL: whatever it is).  Returns the
 * value removed, or NULL when nothing was. */
void *name_index_remove(struct name_index *ix, const char *name, const void *want);

/* Run fn on the value of name under its stripe's write lock (so readers
 * never see a change half made).  Returns whether name was there. */
bool name_index_update(struct name_index *ix, const char *name, name_index_fn fn,
                       void *ctx);

/* Remove every name, calling fn (may be NULL) on each value.  Not
 * alongside other calls on the same stripes' values that fn frees. */
void name_index_clear(struct name_index *ix, name_index_fn fn, void *ctx);

/* How many names it holds (a snapshot). */
size_t name_index_count(struct name_index *ix);

#endif
