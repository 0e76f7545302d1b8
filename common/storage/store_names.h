/* store_names: the names of a filter's checkpoint files (docs/STORAGE.md,
 * "Layout"), made and parsed in one place.  A leaf: it knows nothing of
 * the store, and every file that names a checkpoint file (the writer, the
 * loader, the migration, the creation of a filter) asks it.
 *
 * In a filter's directory DIR/<name>/ (16 lowercase hex digits each):
 *   base-<I>-<C>.bgc          a base: the filter's bits at seq C
 *   delta-<I>-<F>-<C>.bgc     a delta: what changed in seqs (F, C]
 *   manifest-<I>-<C>-<L>.bgm  the manifest: the base and deltas that make
 *                             the filter at seq C, covering the log to LSN L
 *   ckpt-<I>-<C>-<L>.bf       a checkpoint of the previous release (a whole
 *                             filter file), migrated when loaded
 * and any of these followed by ".tmp." and a suffix: a file being written
 * (removed when the filter is loaded).  I is the incarnation id.
 *
 * Pure functions; any thread.
 */
#ifndef BLOOMGRID_STORE_NAMES_H
#define BLOOMGRID_STORE_NAMES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum store_file_kind {
    STORE_FILE_BASE = 1,
    STORE_FILE_DELTA = 2,
    STORE_FILE_MANIFEST = 3,
    STORE_FILE_CKPT = 4,        /* the previous release's checkpoint */
};

struct store_fname {
    enum store_file_kind kind;
    uint64_t id;                /* incarnation, never 0 */
    uint64_t from;              /* delta: records after this seq */
    uint64_t seq;               /* the seq the file reaches */
    uint64_t lsn;               /* manifest, ckpt: the log covered */
    bool tmp;                   /* parse: a temp file of one of them */
};

/* The longest name (a manifest's) and its terminator. */
#define STORE_FNAME_MAX 64

/* DIR/<the file's name> into out (len bytes; truncated names are the
 * caller's to avoid: dir is bounded by the store). */
void store__fname_path(char *out, size_t len, const char *dir,
                       const struct store_fname *n);
/* The name alone (STORE_FNAME_MAX bytes). */
void store__fname(char out[STORE_FNAME_MAX], const struct store_fname *n);
/* Is name one of ours?  *out (may be NULL) gets what it says. */
bool store__fname_parse(const char *name, struct store_fname *out);

/* The directories and files of a data directory beside the filters'. */
#define STORE_WAL_DIR ".wal"
#define STORE_TOMB_FILE ".tombstones"
#define STORE_CREATING_PREFIX ".creating-"   /* + name: a creation in progress */
#define STORE_SPOOL_PREFIX ".import-"        /* + XXXXXX: an Import's spool */
#define STORE_DROPPED_PREFIX ".dropped-"     /* + N-name: a drop in progress */

#endif
