/* store: a data directory of named, durable filters (snapshots + WAL).
 *
 * A struct store owns one directory.  Each filter lives in DIR/<name>/ as
 *   snapshot-<C>.bf   the filter with every WAL record of seq <= C applied
 *                     (bf_file format, written atomically);
 *   wal-<F>.log       WAL segments, F = the first sequence number in it.
 * DIR/LOCK is flock'ed so two processes never open the same store.  Directories
 * whose names start with a dot are in-progress creations or drops and are
 * removed when the store is opened.
 *
 * Durability rule: store_add_hashes (and remove, import) returns only after
 * its WAL record is on disk (STORE_DURABLE_FSYNC: fdatasync, shared between
 * concurrent callers by group commit).  STORE_DURABLE_NONE only write()s the
 * record: it survives a crash of the process but not of the machine, so
 * acknowledged writes from the last moments before a power loss are lost
 * (and if the disk kept later pages but not earlier ones, the filter comes
 * back FAILED rather than served with holes).
 *
 * Snapshot vs WAL ordering: a mutation FIRST changes the bits in memory and
 * THEN appends its WAL record.  A snapshot rotates the WAL under its lock at
 * sequence C (records <= C in the old segments, > C in the new one) and only
 * then copies the bits, so every record <= C has its bits in the copy and
 * every record > C stays in the WAL: snapshot-C + WAL(> C) covers every
 * acknowledged change.  The copy of a blocked or classic filter, taken
 * while adds go on, may hold extra bits of records > C (or of writes that
 * later failed); replaying an OR twice is harmless.  For the counting kind a
 * record applied twice would decrement twice, and the scalable kind's layer
 * chain must not grow under the copy, so these hold mutations (not queries)
 * off during the rotation and the copy, which is then exactly "records
 * <= C".  Mutations of one filter are applied one at a time (the WAL order
 * is the apply order; the fsync wait is shared); queries never wait for a
 * snapshot.  Only the newest snapshot is kept once it is durable, with the
 * WAL segments after it.
 * A side effect of bits-first: a query may say "maybe" for a key whose add
 * has not been (or is never) acknowledged; it never says "absent" for an
 * acknowledged one.
 *
 * Recovery (store_open, store_filter_recover): the newest snapshot that
 * loads, then every WAL record after it.  A torn tail of the last segment
 * (unacknowledged records cut short or failing their checksum, with no
 * record committed after them) is truncated and the filter served.  Any
 * other damage (a bad record followed by records committed after it, a
 * missing segment or sequence gap, a snapshot that does not load with no
 * older snapshot plus complete WAL to fall back on) leaves the filter FAILED
 * with a reason naming the file and offset; it is never served with missing
 * bits.  Other filters are unaffected.
 *
 * Failed writes: if a WAL write or fdatasync fails the filter turns FAILED
 * (the fsync is never retried); every later mutation fails with -EIO and
 * nothing is acknowledged.  store_filter_recover() reloads it from disk, and
 * the store's thread does that by itself every recover_retry_ms for filters
 * FAILED by an I/O error (recovery re-reads the files, makes them durable
 * and starts a new WAL segment).  Filters FAILED by damaged files stay so
 * until store_filter_recover is called (e.g. after an operator's repair).
 *
 * Threads: every function may be called from any thread at once, except
 * store_close.  A background thread per store writes snapshots every
 * snapshot_interval_ms (if the filter changed) or once a filter's WAL grew
 * by snapshot_wal_bytes.
 *
 * Handles: store_get returns a counted reference; every store_get needs one
 * store_put.  A dropped filter's handle stays valid (its calls return
 * -ENOENT) until the last put.  All handles must be put before store_close.
 *
 * Errors: 0 or a negative errno; err buffers are STORE_ERRLEN bytes (may be
 * NULL) and receive a sentence a person can act on.
 */
#ifndef BLOOMGRID_STORE_H
#define BLOOMGRID_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bf.h"
#include "bf_file.h"
#include "rules.h"

#define STORE_ERRLEN BF_ERRLEN
#define STORE_NAME_MAX RULES_STORE_NAME_MAX

enum store_durability {
    STORE_DURABLE_FSYNC = 0,   /* default: acknowledge after fdatasync */
    STORE_DURABLE_NONE = 1,    /* acknowledge after write(): loses recent
                                  writes on a machine crash */
};

struct store_options {
    const char *dir;                 /* data directory (created if missing) */
    int durability;                  /* enum store_durability */
    unsigned snapshot_interval_ms;   /* 0: default 60000 */
    uint64_t snapshot_wal_bytes;     /* 0: default 64 MiB */
    unsigned recover_retry_ms;       /* 0: default 1000; see "Failed
                                        writes" */
};

enum store_state {
    STORE_READY = 0,        /* serving */
    STORE_RECOVERING = 1,   /* being loaded; calls return -EAGAIN */
    STORE_FAILED = 2,       /* refused: corrupt files or a failed write;
                               calls return -EIO */
    STORE_DROPPED = 3,      /* dropped while the handle was held: -ENOENT */
};

struct store;
struct store_filter;

/* Open (creating if needed) the data directory and recover every filter in
 * it.  A filter that cannot be recovered is kept in the catalog in state
 * STORE_FAILED; that does not fail the open.  Returns NULL with err when the
 * directory cannot be used (missing parent, permissions, already open by
 * another process, bad options). */
struct store *store_open(const struct store_options *o, char *err);

/* Stop the snapshot thread, snapshot every changed READY filter, close
 * everything.  No handle may be held.  NULL is allowed. */
void store_close(struct store *s);

/* Is name acceptable as a store name (rules_store_name_check: a filter
 * name or a shard name of one)?  Returns 0 or -EINVAL with the reason in
 * err. */
int store_name_check(const char *name, char *err);

/* Create an empty filter.  Returns 0 once it is durable; -EINVAL (bad name
 * or parameters, see bf_params_check), -EEXIST, -ENOMEM or an I/O error. */
int store_create(struct store *s, const char *name, const struct bf_params *p,
                 char *err);

/* Adopt an existing filter f (e.g. a shard with a given secret) under name.
 * On success the store owns f; on failure the caller still does. */
int store_create_from(struct store *s, const char *name, struct bf *f,
                      char *err);

/* Remove a filter and its files (crash-safe: the directory is renamed away
 * first).  Returns -ENOENT when there is no such filter. */
int store_drop(struct store *s, const char *name, char *err);

/* Drop the filter behind the handle sf, and only that one: -ENOENT when it
 * was dropped already, even if a filter of the same name exists again (a
 * caller that checked sf's secret never drops another incarnation).  The
 * handle stays the caller's (store_put). */
int store_drop_handle(struct store *s, struct store_filter *sf, char *err);

/* Names of all filters (any state but dropped), sorted.  On success *names
 * is a
 * malloc'd array of *n malloc'd strings; free with store_list_free. */
int store_list(struct store *s, char ***names, size_t *n);
void store_list_free(char **names, size_t n);

/* A counted handle to a filter, or NULL when there is none. */
struct store_filter *store_get(struct store *s, const char *name);
void store_put(struct store_filter *sf);

/* The filter's name (owned by the handle). */
const char *store_filter_name(const struct store_filter *sf);

/* Current state; for STORE_FAILED, why (STORE_ERRLEN bytes, may be NULL)
 * receives what failed and where (file and offset). */
enum store_state store_filter_state(struct store_filter *sf, char *why);

/* Reload a filter from its files (after a failed write, or to retry a
 * FAILED one).  Returns 0 when it is READY again, or the error that left it
 * FAILED (err says why). */
int store_filter_recover(struct store_filter *sf, char *err);

/* Add n hashes; added[i] (may be NULL) is true when hash i was definitely
 * absent before.  Returns 0 only after the WAL record is durable; -EIO when
 * it cannot be made durable (nothing acknowledged, the filter turns FAILED),
 * -EAGAIN / -ENOENT for a filter recovering / dropped. */
int store_add_hashes(struct store_filter *sf, const struct bf_hash *h,
                     size_t n, bool *added, char *err);

/* Query n hashes.  Returns 0, or -EIO / -EAGAIN / -ENOENT when the filter
 * is not READY (never answers from state it cannot vouch for). */
int store_may_contain_hashes(struct store_filter *sf, const struct bf_hash *h,
                             size_t n, bool *present);

/* Counting filters only: remove n hashes; removed[i] (may be NULL) is true
 * when hash i's counters were decremented, false when it was definitely
 * absent.  -EOPNOTSUPP for other kinds; otherwise as store_add_hashes. */
int store_remove_hashes(struct store_filter *sf, const struct bf_hash *h,
                        size_t n, bool *removed, char *err);

/* OR-merge src into the filter, durably (a WAL import record carrying src,
 * so the WAL holds a copy of src until the next snapshot).  -EINVAL naming
 * the mismatching field (nothing changed) when the fingerprints differ; I/O
 * errors as store_add_hashes.  src stays the caller's.  Adds wait while
 * the merge runs. */
int store_import(struct store_filter *sf, const struct bf *src, char *err);

/* One page of a layer body to OR in (store_or_pages).  offset and len are
 * multiples of 8; data holds len bytes of little-endian 64-bit words. */
struct store_page {
    uint32_t layer;
    uint64_t offset;
    const void *data;
    size_t len;
};

/* OR n pages into the filter's bits, durably: one WAL record of type
 * WAL_REC_PAGES (bits first, then the record, as every mutation).  Blocked
 * and classic filters only (-EOPNOTSUPP otherwise: counters do not OR).
 * Every page is checked against the geometry before any bit changes
 * (-EINVAL naming the page); I/O errors as store_add_hashes.  Idempotent:
 * applying the same pages again changes nothing but the version. */
int store_or_pages(struct store_filter *sf, const struct store_page *pages,
                   size_t n, char *err);

/* Serialize a consistent copy of the filter (every change acknowledged
 * before the call is in it) through w, outside the filter's lock.  Returns
 * 0, w's error, -ENOMEM, or -EAGAIN / -ENOENT / -EIO when not READY. */
int store_export(struct store_filter *sf, bf_file_writer w, void *ctx);

/* A point-in-time copy of the filter, owned by the caller (bf_destroy).
 * NULL when the filter is not READY or memory is short. */
struct bf *store_filter_copy(struct store_filter *sf);

/* The live filter, for read-only inspection (bf_stats, accessors), or NULL
 * when not READY.  The pointer is valid while the handle is held and until
 * the filter is dropped or recovered (store_filter_recover, or the store's
 * own retry after a write error, replace it); prefer store_filter_inspect
 * where that matters. */
const struct bf *store_filter_bf(struct store_filter *sf);

/* Call fn(f, ctx) with the live filter under the filter's shared lock, so f
 * cannot be replaced meanwhile.  fn must only read f and must not call back
 * into the store for this filter; adds run concurrently.  Returns 0, or
 * -EAGAIN / -ENOENT / -EIO when the filter is not READY (fn not called). */
int store_filter_inspect(struct store_filter *sf,
                         void (*fn)(const struct bf *f, void *ctx), void *ctx);

/* Monotonically increasing (also across restarts): the sequence number of
 * the filter's latest WAL record; bumps on every change. */
uint64_t store_filter_version(struct store_filter *sf);

/* Snapshot every changed READY filter now (and discard the WAL it covers).
 * Returns 0 or the first error. */
int store_snapshot_now(struct store *s, char *err);

/* Snapshot one filter now. */
int store_filter_snapshot(struct store_filter *sf, char *err);

#endif
