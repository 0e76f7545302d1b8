/* store: a data directory of named, durable filters (checkpoints + one
 * write-ahead log for all of them).
 *
 * A struct store owns one directory (docs/STORAGE.md has the layout):
 *   .wal/wal-<F>.log       the node log (wal.h): every filter's changes,
 *                          each record naming its filter and incarnation
 *                          (a dot name: no filter can be called that);
 *   <name>/manifest-<I>-<C>-<L>.bgm, base-<I>-<C0>.bgc,
 *   delta-<I>-<F>-<C>.bgc  the checkpoint of filter <name> (store_names.h,
 *                          store_ckfile.h): incarnation id I (random, new
 *                          for every creation, so a filter dropped and
 *                          created again never gets the old one's
 *                          records), every record of seq <= C applied,
 *                          and none of its records of seq > C in the log
 *                          at LSN <= L; a base and deltas named by the
 *                          manifest, every page checksummed, nothing
 *                          overwritten in place ("Checkpoints" below);
 *                          ckpt-<I>-<C>-<L>.bf of the previous release is
 *                          read and replaced by the next checkpoint;
 *   .tombstones            the filters dropped ("Tombstones" below);
 *   .import-XXXXXX         an Import's file, or a push's pages, as it
 *                          arrives (store_spool_new: unlinked as soon as
 *                          it is made, so it has no name while used);
 *   LOCK                   flock'ed so two processes never open the store.
 * Directories .creating-* and .dropped-* are in-progress creations or
 * drops, and .import-* files spools a crash left named; all are removed
 * when the store is opened.  A directory written by
 * an earlier release (per-filter snapshot-*.bf and wal-*.log) is migrated
 * when the store opens it (crash-safe: docs/STORAGE.md).
 *
 * Durability rule: store_add_hashes (and remove, import, or_pages) returns
 * only after its log record is on disk (STORE_DURABLE_FSYNC: fdatasync,
 * one for every write that arrived while the previous one ran, from any
 * filter and any thread: the log's commit thread).  The _async forms
 * return once the bits are set and the record queued, and report
 * durability through a callback.  STORE_DURABLE_NONE only write()s the
 * record: it survives a crash of the process but not of the machine, so
 * acknowledged writes from the last moments before a power loss are lost
 * (and if the disk kept later pages but not earlier ones, the filters that
 * may have lost records come back FAILED rather than served with holes).
 *
 * Checkpoint vs log ordering: a mutation FIRST changes the bits in memory
 * and THEN queues its log record, under the filter's write lock, so a
 * filter's records are in the log in the order their changes were made.  A
 * checkpoint reads seq C (the last record queued) and queues a barrier
 * under that lock, then writes the bits from the live filter a page at a
 * time (no copy of the filter), then waits for the barrier: every record
 * <= C is then durable and has its bits in the pages written, and the
 * barrier gives L, the LSN below which the filter has no record > C.  The
 * pages of a blocked or classic filter, read while adds go on, may hold
 * extra bits of records > C (or of writes that later failed); replaying an
 * OR twice is harmless.  For the counting kind a record applied twice
 * would decrement twice, and the scalable kind's layer chain must not grow
 * meanwhile, so these hold mutations (not queries) off while their pages
 * are read, which are then exactly "records <= C".  Queries never wait for
 * a checkpoint.
 *
 * Checkpoints (store_ckpt.c; docs/STORAGE.md, "Checkpoints and the log's
 * bound"): a checkpoint writes a delta (the 4 KiB pages whose version is
 * above the previous checkpoint's C, or the filter's log records since
 * then, whichever is smaller: from a bounded copy of them kept in memory,
 * or read back from the log) or, when the deltas would weigh as much as
 * a new base or after 8 of them, a new base; then a manifest naming the
 * base and deltas.  Files are fsynced and renamed into place, then their
 * directory fsynced, the manifest last; files it no longer names are
 * removed after it is durable, the log it covers after that.  A filter is
 * checkpointed when its records in the log since the last checkpoint
 * reach checkpoint_log_percent of its bits' bytes, or every
 * snapshot_interval_ms when it changed and the checkpoint writes no more
 * than twice those records' bytes.
 * A side effect of bits-first: a query may say "maybe" for a key whose add
 * has not been (or is never) acknowledged; it never says "absent" for an
 * acknowledged one.
 *
 * The log's bound: a log segment is removed once every filter's checkpoint
 * covers it.  When the log's records (padding not counted, wal_bytes) grow
 * past snapshot_wal_bytes (or twice the sum of the filters' checkpoint
 * points, when that is more), or its files (padding counted) past 16 times
 * that, the store checkpoints the filters that pin its oldest segment: a
 * filter that changed gets a new checkpoint, one that did not only has its
 * manifest's L moved (a rename), and a FAILED one no longer holds the
 * log (it can then no longer be recovered from this node's files: it stays
 * FAILED, with a reason naming the missing records).
 *
 * Recovery (store_open, store_filter_recover): each filter's newest
 * manifest and the base and deltas it names (every page checked; a delta
 * that fails is dropped with those after it and the log after the last
 * good one replayed, which fails the filter if the log no longer holds
 * those records; an old whole-filter ckpt-*.bf is read as it is), then its
 * records after it, from one pass over the log.  A torn tail of the last segment (the commit group a crash
 * interrupted: records cut short or failing their checksum, with no record
 * committed after them) is truncated and the filters served; the log's
 * write units (wal.h) keep a torn write from reaching acknowledged
 * records.  Any other damage lost acknowledged records (a later commit
 * stamp vouches for them, or their segment was closed), and is logged as
 * such.  A damaged record whose header is intact names its filter: that
 * filter is FAILED, no other.  Damage that hides the owner (a damaged
 * header, a missing segment) FAILs the filters that may have had records
 * there: those with a gap in their own sequence, and those with no record
 * after the damage that their checkpoint does not cover; a filter with a
 * later record in sequence is served.  With in_group (a copy of a group of
 * N > 1) a blocked or classic filter that would be FAILED for lost log
 * records is instead loaded with every record left and counted as cut
 * (store_filter_recovery_cut): its node makes it SYNCING and fills it from
 * the other copies (docs/REPLICATION.md); store_filter_recover applies the
 * rule without in_group.  A checkpoint that does not load, with no older
 * checkpoint plus complete log to fall back on, leaves its filter FAILED.
 * A FAILED filter has a reason naming the file and offset; it is never
 * served with missing bits.  Other filters are unaffected.
 *
 * Failed writes: if a log write or fdatasync fails, no write of that batch
 * is acknowledged and every filter with a write in it turns FAILED (the
 * fsync is never retried); their later mutations fail with the error that
 * happened (-ENOSPC on a full disk, -EIO ...; err says which file).  Such
 * a filter keeps its bits in memory and goes on answering reads from them
 * (store_may_contain_hashes, store_filter_read): they hold every
 * acknowledged write, and the bits of the failed batch too, which only
 * ever make a "maybe" of an unacknowledged key (a counting filter's failed
 * remove reads as done until the reload, as any remove in flight does).
 * Filters with no write in the batch go on (the log continues in a new
 * segment).  store_filter_recover() reloads a filter from its files (reads
 * are refused while it runs: -EAGAIN), and the store's thread does that by
 * itself every recover_retry_ms for filters FAILED by an I/O error, once
 * the log can be written again (a full disk keeps the filter as it is,
 * reads served, writes refused).  Filters FAILED by damaged files have no
 * bits and stay so until store_filter_recover is called (e.g. after an
 * operator's repair).
 *
 * Threads: every function may be called from any thread at once, except
 * store_close.  A background thread per store writes checkpoints (above)
 * and retries failed filters; the log has its commit thread and, with
 * fsync, its completer (wal.h).  Recovery (store_open, a filter's reload)
 * runs a blocked filter's replayed adds, and a dense base's first touch of
 * its memory, on up to one thread per CPU online (at most 8), started and
 * joined within the call (docs/STORAGE.md, "Recovery").
 *
 * Handles: store_get returns a counted reference; every store_get needs one
 * store_put.  A dropped filter's handle stays valid (its calls return
 * -ENOENT) until the last put.  All handles must be put, and every
 * asynchronous call completed, before store_close.
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
    uint64_t snapshot_wal_bytes;     /* bound on the node log (see "The
                                        log's bound"); 0: default 64 MiB */
    unsigned checkpoint_log_percent; /* a filter is checkpointed once its
                                        records in the log reach this
                                        percent of its bits' bytes
                                        ("Checkpoints"); 0: default 50 */
    unsigned recover_retry_ms;       /* 0: default 1000; see "Failed
                                        writes" */
    uint64_t max_memory_bytes;       /* the memory budget ("Budgets"); 0:
                                        none */
    uint64_t max_filters;            /* the most filters; 0: none */
    uint32_t wal_block_bytes;        /* the log's least write unit
                                        (wal_open); 0: as detected */
    uint32_t commit_delay_us;        /* the log's commit delay
                                        (wal_set_commit_delay); 0: none */
    bool in_group;                   /* a copy of a group of N > 1: see
                                        "Recovery" */
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

/* Make the series of every store of the process (docs/METRICS.md: keys
 * added, removed, queried and present, checkpoints and their failures, the
 * write-ahead log) in metrics_registry(), at 0: a counter served only after
 * its first increase hides that increase from a rate.  store_open calls it;
 * a process that serves metrics before it opens its store calls it first.
 * Any thread, any number of times. */
void store_metrics_register(void);

/* Stop the store's thread, checkpoint every changed READY filter, close
 * the log.  No handle may be held.  NULL is allowed. */
void store_close(struct store *s);

/* Is name acceptable as a store name (rules_store_name_check: a filter
 * name or a shard name of one)?  Returns 0 or -EINVAL with the reason in
 * err. */
int store_name_check(const char *name, char *err);

/* Budgets: a store may be given a bound on the memory its filters take
 * (max_memory_bytes) and on their number (max_filters).  A filter is
 * charged what it makes the store hold (store_charge): its bits and their
 * page versions (1/512 of the bits).  Nothing else grows with a filter:
 * checkpoints, exports and page pulls read the live bits a page at a time
 * into small buffers of their own, and change tracking is the versions.
 * A creation that would take the charges of all filters
 * past max_memory_bytes, or their number past max_filters, is refused with
 * -EDQUOT (err names the budget and what is taken) before the filter's
 * memory is allocated or any file written; filters already stored are
 * never touched, and a store opened with less budget than its filters
 * take keeps them all (it only refuses new ones).  A drop gives the
 * filter's charge back at once (a handle still held keeps the bits only
 * until its call ends).  Scalable filters are
 * charged the layers they have when created or loaded, and each layer as
 * they grow it. */

/* The charge of a filter created with p (store_create's parameters):
 * 0 with *bytes set, or -EINVAL when p cannot make a filter. */
int store_charge(const struct bf_params *p, uint64_t *bytes);

struct store_budget {
    uint64_t max_memory_bytes;   /* 0: none */
    uint64_t charged_bytes;      /* charges of the filters held */
    uint64_t max_filters;        /* 0: none */
    uint64_t filters;
};

/* What the store's budgets are and how much of them is taken. */
void store_budget(struct store *s, struct store_budget *out);

/* Memory held for a while beside the filters (an import's bytes as they
 * arrive, pushed pages until they are merged) is counted against
 * max_memory_bytes too, while held: reserve returns 0, or -EDQUOT with err
 * naming the budget and what (a short noun: "the import into 'x'") wanted
 * it; every reservation is given back with release. */
int store_reserve(struct store *s, uint64_t bytes, const char *what, char *err);
void store_release(struct store *s, uint64_t bytes);

/* Create an empty filter.  Returns 0 once it is durable; -EINVAL (bad name
 * or parameters, see bf_params_check), -EEXIST, -ESTALE (p->secret is
 * that of a dropped filter of this name: see "Tombstones"), -EDQUOT (over
 * a budget: "Budgets"), -ENOMEM or an I/O error.  The first checkpoint of
 * the empty filter is written sparse (bf_file_save), so creating a big
 * filter writes and fsyncs a few KiB, not its size. */
int store_create(struct store *s, const char *name, const struct bf_params *p,
                 char *err);

/* Adopt an existing filter f (e.g. a shard with a given secret) under name.
 * On success the store owns f; on failure the caller still does.  Errors
 * as store_create. */
int store_create_from(struct store *s, const char *name, struct bf *f,
                      char *err);

/* Remove a filter and its files (crash-safe: the directory is renamed away
 * first), leaving a tombstone.  Returns -ENOENT when there is no such
 * filter, or the error that kept the tombstone from being written (then
 * nothing is dropped). */
int store_drop(struct store *s, const char *name, char *err);

/* Drop the filter behind the handle sf, and only that one: -ENOENT when it
 * was dropped already, even if a filter of the same name exists again (a
 * caller that checked sf's secret never drops another incarnation).  The
 * handle stays the caller's (store_put). */
int store_drop_handle(struct store *s, struct store_filter *sf, char *err);

/* Tombstones: a drop first records the filter's name, secret id and
 * fingerprint id durably in DIR/.tombstones, so that peers holding its old
 * pages (a merger, another copy) cannot bring it back: store_create and
 * store_create_from refuse that name with that secret (-ESTALE), and
 * callers that take pages or files from peers ask store_dropped.  The name
 * with a new secret is a new filter and is accepted.  The newest
 * STORE_TOMBS_MAX drops are kept, the oldest expiring first; a FAILED
 * filter whose bits never loaded is dropped without one (its identity is
 * unknown).  A damaged .tombstones file makes store_open fail naming it. */
#define STORE_TOMBS_MAX 4096

/* Was a filter of this store name dropped with this secret id (when not
 * 0) or this fingerprint id (when not NULL)? */
bool store_dropped(struct store *s, const char *name, uint64_t secret_id,
                   const char *fp);

/* Undoing a drop.  Every filter has a generation: 0 until it is undropped.
 * A tombstone records the generation of the filter it dropped.  An undrop
 * creates the filter of a name and secret again although it was dropped:
 * in one durable write of .tombstones it lifts the tombstone and records
 * the new filter's generation, which is above the tombstone's.  So the
 * generations tell a copy of a group (docs/REPLICATION.md, "Undoing a
 * drop") whether a peer's filter of a dropped identity was undropped after
 * the drop (a higher generation than its tombstone: lift it and take the
 * filter) or is the filter as it was before the drop, which the drop has
 * not reached yet (the same generation or lower: keep the tombstone).  The
 * newest STORE_TOMBS_MAX generation records are kept, as tombstones. */

/* As store_dropped; *gen (may be NULL) gets the highest generation among
 * the matching tombstones (0 when there is none). */
bool store_dropped_gen(struct store *s, const char *name, uint64_t secret_id,
                       const char *fp, uint64_t *gen);

/* The generation of the filter of this name and secret id (0: never
 * undropped, or unknown). */
uint64_t store_generation(struct store *s, const char *name, uint64_t secret_id);

/* Create a filter of parameters p (p->secret set: the dropped filter's)
 * although a filter of this name and secret was dropped, lifting its
 * tombstone; its generation is gen, or the tombstone's generation + 1 when
 * that is higher (1 at least), returned in *out_gen (may be NULL).  The
 * tombstone stays when the creation fails.  Returns 0, -EINVAL (no secret,
 * bad name or parameters), -EEXIST (the name exists, with any secret: the
 * caller tells them apart), -EDQUOT, -ENOMEM or an I/O error. */
int store_undrop(struct store *s, const char *name, const struct bf_params *p,
                 uint64_t gen, uint64_t *out_gen, char *err);

/* store_create_from for an undropped filter f of generation gen (gen > 0:
 * a peer's): a tombstone of its name and secret is lifted only when its
 * generation is below gen (-ESTALE otherwise: the peer's filter is the one
 * dropped here).  Ownership of f as store_create_from. */
int store_undrop_from(struct store *s, const char *name, struct bf *f,
                      uint64_t gen, char *err);

/* Record gen as the generation of the filter behind sf when it is higher
 * than its own (a peer's filter of the same fingerprint fp, when not NULL,
 * was undropped later than this copy heard of), durably; a tombstone of
 * its identity left by a crash goes with it.  Returns 0, -EINVAL (sf is not
 * of fingerprint fp, or has no bits loaded), or the write's error. */
int store_generation_raise(struct store *s, struct store_filter *sf,
                           const char *fp, uint64_t gen, char *err);

/* XXH3-64 (seed 0) of f's secret: the secret id of the wire. */
uint64_t store_secret_id(const struct bf *f);

/* Names of all filters (any state but dropped), sorted.  On success *names
 * is a
 * malloc'd array of *n malloc'd strings; free with store_list_free. */
int store_list(struct store *s, char ***names, size_t *n);
void store_list_free(char **names, size_t n);

/* A counted handle to a filter, or NULL when there is none. */
struct store_filter *store_get(struct store *s, const char *name);
/* One more reference to a handle already held; returns sf. */
struct store_filter *store_ref(struct store_filter *sf);
void store_put(struct store_filter *sf);

/* The filter's name (owned by the handle). */
const char *store_filter_name(const struct store_filter *sf);

/* Current state; for STORE_FAILED, why (STORE_ERRLEN bytes, may be NULL)
 * receives what failed and where (file and offset). */
enum store_state store_filter_state(struct store_filter *sf, char *why);

/* Is sf a name a create (store_create, store_create_from, an undrop) has
 * reserved and whose files are not yet in place?  It reads RECOVERING
 * meanwhile; once created it is READY (or FAILED when its bits could not
 * be installed) and this is false.  A health check counts such a name as
 * neither ready nor failing: the filters already served are what it
 * answers for. */
bool store_filter_creating(struct store_filter *sf);

/* Did this filter object's recovery cut records it may have acknowledged?
 * True when store_open cut a torn tail from the log (its records' owners
 * are unknown, so every filter is named), loaded the filter without
 * records the log lost (in_group, see "Recovery"), or the filter's newest
 * checkpoint did not load and an older one was used.  A copy that must vouch for
 * every write it acknowledged (docs/REPLICATION.md, SYNCING) reads it. */
bool store_filter_recovery_cut(struct store_filter *sf);

/* Reload a filter from its files (after a failed write, or to retry a
 * FAILED one).  Returns 0 when it is READY again, or the error that left it
 * FAILED (err says why). */
int store_filter_recover(struct store_filter *sf, char *err);

/* Add n hashes; added[i] (may be NULL) is true when hash i was definitely
 * absent before.  Returns 0 only after the log record is durable; the error
 * of the log (-ENOSPC on a full disk, -EIO ...) when it cannot be made
 * durable (nothing acknowledged, the filter turns FAILED: "Failed
 * writes"), and so for every write until the filter is recovered; -EIO for
 * a filter FAILED otherwise; -EAGAIN / -ENOENT for a filter recovering /
 * dropped. */
int store_add_hashes(struct store_filter *sf, const struct bf_hash *h,
                     size_t n, bool *added, char *err);

/* Completion of an asynchronous mutation: rc is what the synchronous call
 * would have returned (0 once durable, or the error). Called exactly once,
 * from the log's completion thread (wal.h: the completer with durability
 * fsync, the commit thread without), or with durability none when the log
 * was idle, in the calling thread before the _async call returns 0 (the
 * record written there, wal_submit_now); never with a store lock held; or
 * not at all when the _async call itself returns an error (then nothing
 * was applied). */
typedef void (*store_done_fn)(void *ctx, int rc);

/* store_add_hashes without the wait: the bits are set, added[] filled (it
 * is the caller's, and complete when the call returns) and the record
 * queued before it returns 0; done(ctx, rc) follows once the record is
 * durable (rc 0) or cannot be made so (the log's error, -ENOSPC on a full
 * disk; the filter turns FAILED).
 * h is copied: it may be freed on return.  A call with n == 0 completes
 * once the filter's earlier writes are durable.  done must not wait for
 * the store (it runs on the log's completion thread, which the completion
 * of every write waits for);
 * the handle must stay held until done ran.  Returns 0, or the errors of
 * store_add_hashes that come before any change (-EAGAIN, -ENOENT, the
 * error of a FAILED filter, -ENOMEM) with err set, and then done is never
 * called. */
int store_add_hashes_async(struct store_filter *sf, const struct bf_hash *h,
                           size_t n, bool *added, store_done_fn done,
                           void *ctx, char *err);

/* Query n hashes.  Returns 0, also from a filter that takes no writes
 * after a failed log write ("Failed writes"); or -EIO / -EAGAIN / -ENOENT
 * when the filter has no bits it can vouch for (FAILED by damaged files,
 * being reloaded, dropped): it never answers from state it cannot vouch
 * for. */
int store_may_contain_hashes(struct store_filter *sf, const struct bf_hash *h,
                             size_t n, bool *present);

/* Counting filters only: remove n hashes; removed[i] (may be NULL) is true
 * when hash i's counters were decremented, false when it was definitely
 * absent.  -EOPNOTSUPP for other kinds; otherwise as store_add_hashes. */
int store_remove_hashes(struct store_filter *sf, const struct bf_hash *h,
                        size_t n, bool *removed, char *err);

/* store_remove_hashes without the wait, as store_add_hashes_async
 * (-EOPNOTSUPP too, before any change). */
int store_remove_hashes_async(struct store_filter *sf,
                              const struct bf_hash *h, size_t n,
                              bool *removed, store_done_fn done, void *ctx,
                              char *err);

/* Around many _async writes of one thread at once (a batch message that
 * writes to many shards): their log records are written with one write()
 * at store_log_hold_end, where their done functions then run, instead of
 * one each (wal_hold_begin: only with durability none while the log is
 * idle; otherwise nothing changes).  The thread must take no lock between
 * that a done function takes, wait for no write of the store, and call
 * store_log_hold_end soon: the log's commit thread waits meanwhile. */
void store_log_hold_begin(struct store *s);
void store_log_hold_end(struct store *s);

/* OR-merge src into the filter, durably (a log import record carrying src,
 * so the log holds a copy of src until the next checkpoint).  -EINVAL naming
 * the mismatching field (nothing changed) when the fingerprints differ; I/O
 * errors as store_add_hashes.  src stays the caller's.  Adds wait while
 * the merge runs. */
int store_import(struct store_filter *sf, const struct bf *src, char *err);

/* An Import as its file arrived: the file's bytes are the log record's
 * payload as they are (the log's import record holds a file, and replay
 * merges from it), so they are never serialized again.  For a caller that
 * holds a received file: store_import_file_new copies it into the record
 * (the caller then lets its own copy go), the caller verifies
 * store_import_file_bytes (bf_file_scan_mem: the very bytes the log will
 * hold) and checks it, and store_import_file merges those bytes, a piece
 * at a time, and logs the record (written from the record itself).  One
 * copy of the file is held, and a piece of it.  NULL (err set) when out of
 * memory. */
struct store_import_file;
struct store_import_file *store_import_file_new(const void *file, size_t len,
                                                char *err);
const void *store_import_file_bytes(const struct store_import_file *f);
size_t store_import_file_len(const struct store_import_file *f);
/* For a file not given to store_import_file (NULL: nothing). */
void store_import_file_free(struct store_import_file *f);
/* store_import of the file's bytes, which the caller verified; takes file,
 * whatever it returns: it goes to the log (freed once written) or is
 * freed.  Returns and errors as store_import. */
int store_import_file(struct store_filter *sf, struct store_import_file *file,
                      char *err);

/* The counts an Import merges besides its bits (bf_merge_counts): the
 * file's inserts and keys added (BF_KEYS_UNCOUNTED allowed) and the count
 * of each of its layers. */
struct store_import_counts {
    uint64_t inserts, keys;
    uint32_t nlayers;
    uint64_t layer_counts[BF_MAX_LAYERS];
};

/* Merge c into the filter's counts, durably: one log record of type
 * WAL_REC_COUNTS, applied and submitted under the filter's exclusive lock
 * (a moment: no bit is touched).  Returns 0 once the record is durable,
 * -EINVAL (more than BF_MAX_LAYERS layers), -ENOMEM, or the errors of
 * store_add_hashes. */
int store_import_counts(struct store_filter *sf,
                        const struct store_import_counts *c, char *err);

/* ---- Imports spooled to disk and applied in pieces ----
 *
 * An Import's file is written, as it arrives, to a spool file in the
 * store's directory (".import-XXXXXX", unlinked as soon as it is made, so
 * that no crash leaves it behind; store_open also removes any it finds),
 * then verified a piece at a time (bf_file_scan: every check of
 * bf_file_load, and the caller's own on its header), and only then applied
 * a piece at a time (store_import_spool).  Memory held: a piece, never the
 * file.
 *
 * A PushPages stream is spooled the same way (the node writes its checked
 * messages with store_spool_write and reads them back with
 * store_spool_read); its spool counts against the same bound.
 *
 * The spool's disk is bounded: each spool by its own max (the largest file
 * the caller accepts), the spools of all Imports (and pushes) in flight
 * together by max_memory_bytes (what memory held before Imports were
 * spooled; 0: none), and a write that would leave less than STORE_SPOOL_FREE_MIN bytes
 * free on the directory's file system is refused (the log needs room).
 * Threads: a spool is one caller's; the bound is shared (atomics). */
#define STORE_SPOOL_FREE_MIN (UINT64_C(64) << 20)
struct store_spool;
/* A new, empty spool for a file of at most max bytes.  Returns 0 with *out
 * set, or a negative errno (of mkstemp, unlink) with err set. */
int store_spool_new(struct store *s, uint64_t max, struct store_spool **out,
                    char *err);
/* Append len bytes.  Returns 0; -E2BIG past the spool's max; -EDQUOT past
 * the store's bound; -ENOSPC when the file system would be left with less
 * than STORE_SPOOL_FREE_MIN free (or is full); or another write error.
 * err says which.  The spool keeps what it had before a failed write. */
int store_spool_write(struct store_spool *sp, const void *buf, size_t len,
                      char *err);
uint64_t store_spool_len(const struct store_spool *sp);
/* Read len bytes at offset at of what was written (a caller that spooled
 * records of its own, as PushPages does, reads them back).  Returns 0, or
 * -EINVAL past what was written, or the read's negative errno (-EIO for a
 * file cut short), with err set. */
int store_spool_read(struct store_spool *sp, uint64_t at, void *buf, size_t len,
                     char *err);
/* Close it (its disk is freed: the file has no name) and give its bytes
 * back to the bound.  NULL: nothing. */
void store_spool_free(struct store_spool *sp);

/* Called with the file's header and descriptors parsed (an empty filter of
 * the file's geometry, secret and counts, bodies not resident) before any
 * bit is read or applied: 0 goes on, a negative value stops the import
 * (nothing applied) and is returned by store_import_spool. */
typedef int (*store_import_check_fn)(void *ctx, const struct bf *src);

/* OR-merge the filter file held by sp into sf.  First the whole file is
 * verified a piece at a time (bf_file_scan; check called on its header;
 * the XXH64 of each 1 MiB piece kept): a bad file changes nothing.  Then:
 * - blocked and classic filters: the file is read again and applied
 *   STORE_IMPORT_PIECE bytes at a time, each piece compared with its
 *   checked hash and ORed in as one durable log record of pages
 *   (store_or_pages: only the 64 KiB pages that add a bit are logged;
 *   adds and queries go on between pieces), then the file's counts
 *   (store_import_counts).  Memory held: a piece, its record (written
 *   from where it is) and the 1 MiB read (reserved against
 *   max_memory_bytes while held: 9 MiB).  A failure after the first piece leaves
 *   the pieces applied before it (bits of the verified file: OR is
 *   idempotent, so the caller's retry completes it) and returns the error:
 *   the Import is not acknowledged;
 * - counting and scalable filters (a counting merge adds, so it must be
 *   applied once, whole): the file is read into one log import record and
 *   merged from it as store_import_file does (one copy of the file held,
 *   and a piece: reserved against max_memory_bytes).
 * Returns 0 once every record is durable, with *proj (may be NULL) the
 * filter's fill and estimated error after the merge; -EBADMSG,
 * -EPROTONOSUPPORT or another errno of bf_file_scan for a bad or unreadable
 * file (err: bf_file_load's message; nothing changed); check's negative
 * value; -EIO when the spool's bytes changed between the check and the
 * merge; -EDQUOT (memory budget); -EINVAL when the filter's geometry no
 * longer matches (recreated meanwhile); or the errors of store_or_pages
 * and store_import.  The spool stays the caller's. */
#define STORE_IMPORT_PIECE (4u << 20)
int store_import_spool(struct store_filter *sf, struct store_spool *sp,
                       store_import_check_fn check, void *ctx,
                       struct bf_merge_projection *proj, char *err);

/* One page of a layer body to OR in (store_or_pages).  offset and len are
 * multiples of 8; data holds len bytes of little-endian 64-bit words. */
struct store_page {
    uint32_t layer;
    uint64_t offset;
    const void *data;
    size_t len;
};

/* OR n pages into the filter's bits, durably: one log record of type
 * WAL_REC_PAGES holding the pages that add a bit the filter lacks (bits
 * first, then the record, as every mutation); when none does, no record,
 * and the call returns once every record submitted before it is durable
 * (the bits it found may be a write's still in flight); so too
 * for n == 0.  Blocked and
 * classic filters only (-EOPNOTSUPP otherwise: counters do not OR).
 * Every page is checked against the geometry before any bit changes
 * (-EINVAL naming the page); I/O errors as store_add_hashes.  Idempotent:
 * applying the same pages again changes nothing, not even the version. */
int store_or_pages(struct store_filter *sf, const struct store_page *pages,
                   size_t n, char *err);

/* Change tracking: which pages of a filter's bits changed since a point,
 * for pullers that keep copies in step (the merger, the other copies of a
 * group).  Any number of pullers share it: each keeps its own (epoch,
 * version), and every page is reported to each of them.
 *
 * Pages are RULES_PAGE_BYTES of the layer body at offsets that are
 * multiples of it (the last one may be shorter).  Only blocked and classic
 * filters are pulled (one layer whose bits OR).  A puller keeps the
 * (epoch, version) a walk returned and asks for what changed since; a page
 * is reported when its bits may have changed after that version, so a
 * puller that ORs every page it got has every bit the filter had at the
 * walk's store_version.  Versions only grow within an epoch.
 *
 * The tracking is the page versions of the live bits (bf.h, "Page
 * versions"): every change (add, remove, import, merged or ORed pages,
 * and records replayed at recovery) stamps the 4 KiB pages it changed
 * with the seq of its log record, under the filter's write lock, and a
 * walk's version is the seq of the last record submitted, taken under
 * that lock.  Nothing is ever cleared on a puller's behalf, and no copy of
 * the bits is kept.  The epoch is random and new for every filter object
 * (so after a restart, or a drop and a create under the same name, a
 * puller naming an older epoch gets every non-empty page), and new again
 * when a reload after a failed write gives new records the seqs of
 * records that never became durable; a reload that does not keeps it
 * (the pages loaded from the checkpoint carry its seq).
 *
 * Costs: 8 bytes per 4 KiB of bits for the versions (counted in
 * store_charge), one store per page-changing add; a walk reads the
 * versions of every page and copies the pages it reports, one at a time,
 * into a buffer of its own (RULES_PAGE_BYTES).
 *
 * Threads: walks run concurrently with each other and with adds, merges,
 * queries and checkpoints; each page is read under the shared lock, which
 * is not held while the callback runs. */

/* Where a walk left a filter's tracking (store_pages_since). */
struct store_pages_mark {
    uint64_t epoch;           /* of the filter object's tracking, never 0 */
    uint64_t version;         /* pass as since next time, with epoch */
    uint64_t store_version;   /* every write acknowledged up to this
                                 store_filter_version has its bits in the
                                 pages reported by this walk or by earlier
                                 ones of the epoch */
    char fp[17];              /* bf_fingerprint_id of the filter */
    uint64_t pages, bytes;    /* reported by this walk so far */
    uint64_t keys;            /* store_keys_since: keys reported so far
                                 (bytes counts their 16 bytes each) */
};

/* Called for each page of a walk.  pg->data is the store's and valid only
 * during the call.  A negative return stops the walk. */
typedef int (*store_page_fn)(void *ctx, const struct store_page *pg);

/* Report every page changed after version since of epoch through fn (may
 * be NULL: only count), in offset order; every non-empty page when since
 * is 0 or epoch is not the filter's.  *mark is filled before fn is first
 * called (pages and bytes then count up).  fn runs with no lock of the
 * store held, so it may be slow (a network stream) without holding up
 * writes.  Returns 0; -EOPNOTSUPP for a kind that is not pulled;
 * -ENOMEM (no page buffer); -EAGAIN / -ENOENT / -EIO when the filter is
 * not READY, -EAGAIN too when its bits are reloaded during the walk; or
 * fn's negative return.  err (STORE_ERRLEN bytes, may be NULL) says
 * why. */
int store_pages_since(struct store_filter *sf, uint64_t epoch, uint64_t since,
                      store_page_fn fn, void *ctx,
                      struct store_pages_mark *mark, char *err);

/* The keys' hashes of a filter's log records after a cursor, when they
 * are the smaller answer to a puller (PullPagesRequest.accept_key_hashes,
 * docs/REPLICATION.md, "Keys instead of pages").
 *
 * When since is nonzero and epoch is the filter's, the cursor c (the seq of
 * the last record submitted) is taken as store_pages_since takes it and a
 * barrier waited for behind it; then, when the log still holds every
 * record of the filter in (since, c], every one of them an add, and their
 * keys weigh 16 bytes each fewer bytes than the pages store_pages_since
 * would report (RULES_PAGE_BYTES each, changed after since), their hashes
 * go through fn in log order, at most STORE_KEYS_CHUNK at a time (held in
 * a buffer reserved against max_memory_mb, with none of the store's or
 * the log's locks held while fn runs).  A puller that adds every one of
 * them has every bit the filter had at mark->store_version, as after a
 * page walk, and passes mark->version as since next time.
 *
 * The log is read twice, with wal_rescan_from: once to count (stopping at
 * the first record that is not an add, missing or damaged, or when the
 * keys reach the pages' bytes), then to stream, STORE_KEYS_CHUNK keys a
 * scan; other filters' records are passed over by their headers (their
 * payloads are not read).  It is read from where the filter's records
 * after since begin, as far as the filter knows it: every pull and every
 * checkpoint notes, for the cursor it takes, an LSN every later record of
 * the filter is at or above (the last STORE_SCAN_MARKS of them are kept),
 * and a pull since s starts at the highest one noted for a cursor at or
 * before s (the cursor a puller's previous pull took, typically), or
 * after the newest checkpoint when since is at or past its seq; else from
 * the log's start.  When reading the log from there would cost more than
 * STORE_KEYS_SCAN_RATIO times the bytes of the pages changed (its bytes
 * from there, or STORE_KEYS_RECORD_COST for each record there when that
 * is less: wal_span_from), it is not read and 1 is returned: no pull
 * costs more than a bounded multiple of its pages, whatever the other
 * filters wrote.
 *
 * Returns 0 when the keys are the answer (all of them went through fn;
 * none when nothing was written since); 1 when they are not, with err
 * saying why (no cursor of this epoch, a record that is not an add, the
 * log no longer holding a record, the pages being smaller, more of the
 * log to read than the bound, no memory for the buffer): the caller then
 * walks the pages (store_pages_since), which also covers any keys fn got
 * before the log lost a record mid-way (mark->keys says how many);
 * -EOPNOTSUPP for a kind that is not pulled; -EAGAIN / -ENOENT / -EIO when
 * the filter is not READY; or fn's negative return.  Threads: as
 * store_pages_since. */
#define STORE_KEYS_CHUNK 65536u   /* keys a pull holds at once: 1 MiB */
#define STORE_KEYS_SCAN_RATIO 8u  /* log bytes a keyed pull may read, per
                                     byte of pages changed */
#define STORE_KEYS_RECORD_COST 8192u   /* what another filter's record costs
                                          a scan at most (its header's and
                                          padding's 4 KiB pages) */
typedef int (*store_keys_fn)(void *ctx, const struct bf_hash *h, size_t n);
int store_keys_since(struct store_filter *sf, uint64_t epoch, uint64_t since,
                     store_keys_fn fn, void *ctx,
                     struct store_pages_mark *mark, char *err);

/* XXH64 (seed 0) of each page of the live bits (layer 0, pages of
 * RULES_PAGE_BYTES, the last one shorter), what a copy tells a peer it
 * holds when it pulls (PullPagesRequest.page_hashes).  Writes at most max
 * hashes; *n is the number of pages.  Returns 0, -EOPNOTSUPP for a kind
 * that is not tracked, -ERANGE when max is short (*n says how many), or
 * -EAGAIN / -ENOENT / -EIO when the filter is not READY. */
int store_pages_hashes(struct store_filter *sf, uint64_t *out, size_t max,
                       size_t *n);

/* OR n pages from a peer (a merger's push, another copy's pages) into the
 * filter with store_or_pages (same checks, same errors, durable).  Pages
 * the merge changed are reported by later walks like local changes, to
 * every puller whose version is before them (the sender may get its own
 * pages back once: ORing them again changes nothing).  On success with
 * n > 0 the source version rises to source_version; n == 0 changes
 * nothing and claims nothing (0 when the filter is READY, once every
 * record submitted before the call is durable: a pull that skipped the
 * pages this copy holds relies on their bits being durable).  pages stay
 * the caller's. */
int store_pages_merge(struct store_filter *sf, const struct store_page *pages,
                      size_t n, uint64_t source_version, char *err);

/* The highest source_version store_pages_merge took for this filter object
 * (0 before the first: since the start or since the filter was created).
 * Kept, not reported: the copies of a group have no primary whose version
 * they could report, and the merger pushes with source_version 0. */
uint64_t store_pages_source_version(struct store_filter *sf);

/* Serialize the filter in the file format (docs/FORMAT.md) through w,
 * from the live bits: read a piece (64 KiB) at a time into a buffer of the
 * call's own under the filter's shared lock (for the counting and
 * scalable kinds also its write lock, so no mutation is half applied in a
 * piece), and handed to w with no lock held, so a slow w holds up nothing.
 * Every change acknowledged before the call is in the file; changes made
 * during it may be (a key added meanwhile may read "maybe"; a counting
 * filter's remove made meanwhile may show in some of its counters): no
 * acknowledged key is missing.  The header's counts and the layers are
 * those at the start.  No copy of the filter is made, so the call holds
 * 64 KiB whatever the filter's size.  *total (may be NULL) gets the
 * file's size before w is first called.  Returns 0, w's error, -ENOMEM,
 * the error of a filter that is not READY, or -EAGAIN when the filter was
 * reloaded during the call; err (may be NULL) says which. */
int store_export(struct store_filter *sf, bf_file_writer w, void *ctx,
                 uint64_t *total, char *err);

/* A point-in-time copy of the filter, owned by the caller (bf_destroy),
 * not counted against the budget (for tests and tools: the node exports
 * with store_export).  NULL when the filter is not READY or memory is
 * short. */
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
 * the error of a filter that is not READY (-EAGAIN / -ENOENT / -EIO, or
 * its log's, e.g. -ENOSPC; fn not called). */
int store_filter_inspect(struct store_filter *sf,
                         void (*fn)(const struct bf *f, void *ctx), void *ctx);

/* store_filter_inspect for readers of the bits (queries, hashing keys,
 * geometry): fn is also called for a filter that takes no writes after a
 * failed log write, whose bits hold every acknowledged write ("Failed
 * writes"); never for one being loaded.  Errors as store_may_contain_hashes. */
int store_filter_read(struct store_filter *sf,
                      void (*fn)(const struct bf *f, void *ctx), void *ctx);

/* Monotonically increasing (also across restarts): the sequence number of
 * the filter's latest durable log record; bumps on every change. */
uint64_t store_filter_version(struct store_filter *sf);

/* Checkpoint every changed READY filter now (and discard the log segments
 * every checkpoint covers).  Returns 0 or the first error. */
int store_snapshot_now(struct store *s, char *err);

/* Checkpoint one filter now (even if it did not change). */
int store_filter_snapshot(struct store_filter *sf, char *err);

/* Bytes of the node log's records (every segment; what the log's bound
 * counts), and of its files on disk (padding to write units included). */
uint64_t store_log_bytes(struct store *s);
uint64_t store_log_file_bytes(struct store *s);

#endif
