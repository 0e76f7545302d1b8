/* store_internal: what the store's files share: store.c (catalog, files,
 * the store's thread), store_filter.c (one filter's data operations),
 * store_load.c (checkpoints and log replay at open and on recovery, and
 * the names of checkpoint files), store_ckpt.c (the checkpoint writer and
 * when to run it), store_migrate.c (directories of earlier releases),
 * store_pages.c (change tracking), store_tomb.c (tombstones and the
 * generations of undropped filters) and store_charge.c (what a filter
 * costs the memory budget).  Not part of the store's interface; see
 * store.h for the contract.
 *
 * Locks, outermost first:
 *   store.mu          the catalog (the array of filters and its index by
 *                     name, store.names: name_index.h, whose stripe locks
 *                     are leaves, taken inside store.mu by changes and
 *                     alone by store_get);
 *   filter.snap_mu    one creation, checkpoint, recovery or drop of a
 *                     filter at a time;
 *   filter.lock       rwlock: shared for data operations and copies,
 *                     exclusive for state changes and imports;
 *   filter.write_mu   one mutation at a time: apply + log submit are one
 *                     step (the log order is the apply order, and the
 *                     engine runs in single-writer mode); copies of the
 *                     counting and scalable kinds hold it to stop mutations
 *                     (never queries).
 * Change tracking (store_pages.c) is the bits' page versions (bf.h), stamped
 * under write_mu (or the exclusive lock) with the seq of the log record
 * the change goes into; it has no lock of its own.  store.tomb_mu
 * (store_tomb.c) and filter.marks_mu (the scan marks, store_pages.c) are
 * leaves: nothing is taken while one is held.  The log's
 * own locks are taken inside all of these, and the log's threads (its
 * commit thread and the completer that runs completions) take none of
 * them: completions only touch atomics, so no lock of the store is ever
 * held while waiting for the log and the log never waits for the store.
 * The rwlock prefers writers so an import or a drop is not starved by a
 * stream of adds.
 */
#ifndef BLOOMGRID_STORE_INTERNAL_H
#define BLOOMGRID_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "errmsg.h"
#include "store.h"
#include "store_ckfile.h"
#include "store_names.h"
#include "wal.h"

#define STORE_PATH_LEN 4096
/* The log's files (padding to write units included) are held to this many
 * times its bound on records (store.h, "The log's bound"). */
#define STORE_LOG_FILES 16
/* Scan marks a filter keeps: a few pullers (the merger, each peer of a
 * group) and the checkpoints. */
#define STORE_SCAN_MARKS 8

struct store_filter {
    struct store *s;
    char *name;
    char *path;                  /* DIR/name */
    atomic_int refs;             /* the catalog holds one */
    bool dropping;               /* written under store.mu and its name's
                                    stripe of store.names; read under
                                    either */
    pthread_mutex_t snap_mu;
    pthread_rwlock_t lock;
    pthread_mutex_t write_mu;
    enum store_state state;      /* under lock; READY with a failed stream
                                    counts as FAILED (store__state) */
    atomic_bool creating;        /* a create's reserved name: RECOVERING
                                    until its files are in place
                                    (store_filter_creating) */
    char why[STORE_ERRLEN];      /* under lock */
    int err;                     /* under lock: what a FAILED filter's
                                    calls return (0: -EIO) */
    struct bf *bf;               /* under lock; set only to bits that hold
                                    every acknowledged write (a creation, a
                                    load), so a FAILED filter that still
                                    has them answers reads (store.h,
                                    "Failed writes") */
    struct wal_stream *stream;   /* under lock; this incarnation's records */
    uint64_t id;                 /* the incarnation id, under snap_mu */
    bool exact;                  /* counting, scalable: copies take
                                    write_mu too */
    _Atomic uint64_t version;
    uint64_t ckpt_seq;           /* seq the newest checkpoint covers, under
                                    snap_mu: the checkpoints' cursor (a
                                    delta holds the pages of versions
                                    above it) */
    _Atomic uint64_t ckpt_lsn;   /* and the LSN it covers the log up to */
    struct store_manifest *chain;   /* the manifest on disk, under snap_mu
                                       (n 0: none yet, as after loading a
                                       checkpoint of the previous release) */
    bool fold_next;              /* the next checkpoint writes a base (a
                                    migration, a chain cut short at load),
                                    under snap_mu */
    _Atomic uint64_t log_bytes;  /* of the records submitted (payload and
                                    24 bytes each), raised under write_mu */
    _Atomic uint64_t ckpt_log;   /* log_bytes at the newest checkpoint,
                                    under snap_mu */
    /* The records submitted since the last checkpoint began, as a delta
     * of records holds them (store_ckpt.c, "Copies of records"): under
     * write_mu (or the exclusive lock). */
    struct store_copy {
        uint8_t *buf;            /* each record's 24-byte head, then its
                                    payload */
        size_t len, cap;
        uint64_t from;           /* the seq of the first; 0: none kept
                                    until the next checkpoint begins */
        uint64_t n;              /* records */
    } copy;
    uint64_t snap_time_ms;       /* under snap_mu */
    bool retry;                  /* FAILED by an I/O error: the store's
                                    thread re-runs recovery (under lock) */
    uint64_t failed_ms;          /* when; under lock */
    _Atomic uint64_t pages_epoch;   /* of the page versions (store.h,
                                       "Change tracking"), never 0 once
                                       READY; new when an install may
                                       give a seq stamped already to
                                       another change */
    uint64_t seq_hwm;            /* the highest seq submitted by the
                                    streams this object had, under snap_mu */
    _Atomic uint64_t source_version;   /* store_pages_source_version */
    atomic_bool recovery_cut;    /* store_filter_recovery_cut */
    _Atomic uint64_t charge;     /* store_charge of the bits last installed
                                    (or reserved at creation), counted in
                                    store.charged until the filter is
                                    freed */
    /* Scan marks (store_pages.c): where the filter's records after a
     * cursor begin in the log, noted when a pull or a checkpoint takes its
     * cursor; the newest STORE_SCAN_MARKS, under marks_mu (a leaf). */
    pthread_mutex_t marks_mu;
    struct store_scan_mark {
        uint64_t id, epoch;      /* of the incarnation and its tracking */
        uint64_t seq, lsn;       /* every record of id with a seq above seq
                                    has an LSN >= lsn */
    } marks[STORE_SCAN_MARKS];
    unsigned marks_next;         /* the slot the next new mark takes */
};

/* Note a scan mark of sf (store_pages.c): every record of incarnation id
 * with a seq above seq has an LSN >= lsn, for cursors of epoch.  Any
 * thread; takes only marks_mu. */
void store__scan_mark(struct store_filter *sf, uint64_t id, uint64_t epoch,
                      uint64_t seq, uint64_t lsn);

/* Copies of records (store_ckpt.c): at most STORE_COPY_MAX bytes a
 * store (less with a small max_memory_mb), STORE_COPY_FILTER a filter and
 * STORE_COPY_RECORD a record; past any of them a filter keeps none until
 * its next checkpoint begins, which then reads its records back from the
 * log. */
#define STORE_COPY_MAX (32u << 20)
#define STORE_COPY_FILTER (4u << 20)
#define STORE_COPY_RECORD (64u << 10)
/* Note record (type, payload of len bytes), submitted next, in sf's copy.
 * Under write_mu (or the exclusive lock). */
void store__copy_add(struct store_filter *sf, uint32_t type,
                     const void *payload, uint64_t len);
/* Free sf's copy and start a new one at seq from (0: none).  Under
 * write_mu (or the exclusive lock), or with sf unreachable. */
void store__copy_reset(struct store_filter *sf, uint64_t from);

/* A dropped filter, or the generation of an undropped one
 * (store_tomb.c). */
struct store_tomb {
    char name[STORE_NAME_MAX + 1];
    uint64_t secret_id;
    char fp[17];
    uint64_t gen;                /* the filter's generation (store.h) */
};

struct store {
    char *dir;
    int durability;
    unsigned interval_ms;
    uint64_t wal_bytes;          /* the bound on the node log (at least) */
    unsigned ckpt_percent;       /* store_options.checkpoint_log_percent */
    uint32_t wal_unit;           /* store_options.wal_block_bytes */
    bool in_group;               /* store_options.in_group */
    unsigned retry_ms;
    int lock_fd;
    struct wal *wal;             /* the node log, DIR/wal */
    pthread_mutex_t mu;
    struct store_filter **v;     /* catalog, under mu */
    size_t n, cap;
    struct name_index *names;    /* the catalog by name (the same filters);
                                    changed under mu, read without it */
    uint64_t drops;              /* .dropped-N counter, under mu */
    uint64_t max_memory;         /* budgets (store.h); 0: none */
    uint64_t max_filters;
    _Atomic uint64_t charged;    /* sum of the filters' charges; raised
                                    under mu by creations */
    _Atomic uint64_t spooled;    /* bytes of the Imports' spools (store.h) */
    uint64_t copy_max;           /* bytes all copies of records may hold
                                    (store_ckpt.c); 0: none kept */
    _Atomic uint64_t copied;     /* bytes they hold (their buffers) */
    _Atomic uint64_t copy_ckpts; /* checkpoints of records written from
                                    a copy, not read back from the log */
    pthread_mutex_t tomb_mu;     /* a leaf lock: tombs, gens */
    struct store_tomb *tombs;    /* STORE_TOMBS_MAX, oldest first; NULL
                                    until the first */
    size_t ntombs;
    struct store_tomb *gens;     /* generations of undropped filters, the
                                    same way */
    size_t ngens;
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t tmu;
    pthread_cond_t tcv;
    bool stop;                   /* under tmu */
};

/* Formatting that may truncate (messages; paths are bounded by the checked
 * directory length), and err buffers of STORE_ERRLEN bytes (NULL allowed). */
void store__strfmt(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
uint64_t store__now_ms(void);
int store__rm_rf(const char *path);
/* A random 64-bit number, never 0 (incarnation ids, epochs). */
uint64_t store__random_id(void);

/* Raise *a to v unless it is already higher. */
void store__raise(_Atomic uint64_t *a, uint64_t v);

/* The filter's state as callers see it (READY with a failed stream is
 * FAILED); the caller holds sf->lock. */
enum store_state store__state(struct store_filter *sf);
/* The error a data call returns in state st (0 for READY), and the
 * sentence that goes with it in err; the caller holds sf->lock. */
int store__state_errno(enum store_state st);
void store__state_err(struct store_filter *sf, char *err);
/* The error a write to sf returns now (0 when it is taken): that of
 * store__state_errno, or the one its log failed with (-ENOSPC on a full
 * disk); the caller holds sf->lock. */
int store__state_rc(struct store_filter *sf);
/* May reads be answered from sf's bits now (READY, or refusing writes
 * after a failed log write with every acknowledged bit still in memory)?
 * The caller holds sf->lock. */
bool store__readable(struct store_filter *sf);
/* The end of the reason of a filter whose log could not be written. */
#define STORE_NO_WRITES "writes are refused (reads go on) until the log " \
                        "can be written again"

/* References to every filter in the catalog (dropping ones excluded);
 * store_put each and free the array.  durable (may be NULL) gets the log's
 * durable LSN read under the catalog lock, so that with store__claim_lsn
 * a filter is either among the references or claims no lower LSN. */
struct store_filter **store__catalog_refs(struct store *s, size_t *n,
                                          uint64_t *durable);
/* The LSN a new checkpoint of a filter with no record in the log takes
 * (the durable one), set as its ckpt_lsn at once (see above). */
uint64_t store__claim_lsn(struct store_filter *sf);

/* The charge of f against the memory budget (store.h, "Budgets"). */
uint64_t store__charge_of(const struct bf *f);
/* The charge of layers of body bytes in all (an upper bound for several
 * layers: each rounds its versions up to a page). */
uint64_t store__charge_bytes(uint64_t body);

/* A filter object in state RECOVERING holding one reference; freed by the
 * last store_put. */
struct store_filter *store__filter_new(struct store *s, const char *name);
/* The key counters' series (store_metrics_register). */
void store__keys_metrics_register(void);
void store__filter_free(struct store_filter *sf);

/* Tombstones (store_tomb.c): read DIR/.tombstones at open (0, or
 * -EBADMSG / an I/O error with err: the store does not open); record the
 * drop of sf durably before its files go, with its generation (0 when it
 * has no identity to record: no bits loaded); free the lists at close. */
int store__tombs_load(struct store *s, char *err);
int store__tomb_add(struct store *s, struct store_filter *sf, char *err);
void store__tombs_free(struct store *s);
/* An undrop: the tombstone of (name, secret_id) lifted and generation gen
 * recorded for the filter of that identity, durably in one write.  0 or
 * -ENOMEM / the write's error with err (nothing changed). */
int store__tomb_lift(struct store *s, const char *name, uint64_t secret_id,
                     const char *fp, uint64_t gen, char *err);
/* Test hook: the bound on tombstones (STORE_TOMBS_MAX, 1 at least). */
extern size_t store__tombs_max;

/* Make the filter READY with f and a new stream of its incarnation whose
 * next record takes next_seq (ownership of f moves to sf).  Returns 0 or
 * -ENOMEM (then sf is FAILED, to be retried, and f freed). */
int store__filter_install(struct store_filter *sf, struct bf *f,
                          uint64_t next_seq);
/* Leave the filter FAILED with why; retry: by the store's thread. */
void store__filter_fail(struct store_filter *sf, const char *why, bool retry);

/* Copies: queries go on during one; the exact kinds also stop mutations
 * (write_mu) so a copy is exactly "every record submitted so far".  The
 * copy is the caller's (bf_destroy); NULL when memory is short. */
void store__lock_for_copy(struct store_filter *sf);
void store__unlock_for_copy(struct store_filter *sf);
struct bf *store__copy_locked(struct store_filter *sf, char *err);

/* Stamp every page of f's bits that is not all zeros with version seq
 * (bits loaded from a checkpoint of seq seq). */
void store__stamp_nonzero(struct bf *f, uint64_t seq);

/* The version the next change of sf stamps on the pages it changes: the
 * seq its log record will take.  Under write_mu (or the exclusive lock). */
void store__stamp_next(struct store_filter *sf);

/* Apply one log record (add, remove, import, pages) of seq seq to f, the
 * pages it changes stamped with seq.  0 or -EBADMSG. */
int store__replay_apply(struct bf *f, uint64_t seq, uint32_t type,
                        const void *payload, uint64_t len);

/* Checkpoints (store_ckpt.c; files: store_ckfile.h, names:
 * store_names.h).  The first checkpoint of a filter nothing else holds
 * yet (a creation, a migration): f as a base of seq seq and a manifest
 * covering the log to lsn, in dir; *out gets the manifest.  0 or a
 * negative errno with err. */
int store__ckpt_first(const char *dir, uint64_t id, uint64_t seq,
                      uint64_t lsn, const struct bf *f,
                      struct store_manifest *out, char *err);
/* Remove the files of sf's directory that its manifest does not name
 * (after a load: leftovers of an interrupted checkpoint).  Under snap_mu. */
void store__ckpt_prune(struct store_filter *sf);
/* The bound on the node log's records: snapshot_wal_bytes, or twice the
 * sum of the filters' checkpoint points when that is more (the filters v
 * of the catalog, n of them). */
uint64_t store__log_bound(struct store *s, struct store_filter **v, size_t n);
/* Deltas after which the next checkpoint folds them into a new base. */
#define STORE_FOLD_DELTAS 8
/* Checkpoints that housekeeping runs at once, their records read from the
 * log in one scan (store_ckpt.c, checkpoint_many). */
#define STORE_CKPT_BATCH 64

/* Load every filter of a store being opened (the catalog is filled,
 * filters RECOVERING): checkpoints, then one pass over the node log, then
 * the log is opened for appending (s->wal) and directories of earlier
 * releases are migrated.  Filters that cannot be loaded are left FAILED.
 * Returns 0, or a negative errno with err when the log cannot be used. */
int store__load_all(struct store *s, char *err);

/* Reload one filter from its files on an open store: the caller holds
 * snap_mu, the filter is RECOVERING with no bf/stream.  Leaves it READY (0)
 * or FAILED (negative errno). */
int store__filter_load(struct store_filter *sf, char *err);

/* The files of a directory of an earlier release: does dir hold them, and
 * load such a filter into sf and write its first checkpoint (the caller
 * holds snap_mu; sf RECOVERING).  Leaves it READY (0) or FAILED. */
bool store__is_legacy(const char *dir);
/* Does dir hold a checkpoint (a manifest, or a checkpoint file of the
 * previous release)? */
bool store__has_checkpoint(const char *dir);
int store__migrate(struct store_filter *sf, char *err);
/* Remove a migrated directory's legacy files (a crash may have left some
 * after the first checkpoint was written). */
void store__legacy_sweep(const char *dir);
/* Test hook: the migration step after which a test child exits as if it
 * crashed (0: none). */
extern int store__migrate_crash_at;

/* Checkpoint the filter (store_ckpt.c): take seq C and a log barrier under
 * its write lock, write a delta or a new base from the live bits (or the
 * log's records), then a manifest.  A filter that is not READY is skipped
 * (0). */
enum store_ckpt_mode {
    STORE_CKPT_IF_CHANGED,   /* only if it changed since the last one */
    STORE_CKPT_FORCE,        /* a new base in any case */
    STORE_CKPT_ADVANCE,      /* cover the log up to now: a new checkpoint
                                if it changed, else the manifest renamed
                                to a later LSN */
    STORE_CKPT_TIME,         /* its interval passed: a checkpoint if it
                                changed and costs no more than the bytes
                                of the records it covers */
};
int store__filter_checkpoint(struct store_filter *sf,
                             enum store_ckpt_mode mode, char *err);

/* One round of the store's thread: failed filters retried, checkpoints of
 * filters due (interval), and the log kept under its bound (store_ckpt.c). */
void store__housekeeping(struct store *s);

/* Remove the log segments every filter's checkpoint covers.  Returns 0 or
 * a negative errno. */
int store__discard_log(struct store *s, bool ignore_failed);

#endif
