/* store_internal: what store.c (catalog, files, snapshot thread) and
 * store_filter.c (one filter: recovery, data operations, snapshots) share.
 * Not part of the store's interface; see store.h for the contract.
 *
 * Locks, outermost first:
 *   store.mu          the catalog (the array of filters);
 *   filter.snap_mu    one creation, snapshot, recovery or drop of a filter at
 *                     a time;
 *   filter.lock       rwlock: shared for data operations (including the wait
 *                     for durability, so the WAL stays alive) and copies,
 *                     exclusive for state changes and imports;
 *   filter.write_mu   one mutation at a time: apply + WAL submit are one
 *                     step (the WAL order is the apply order, and the engine
 *                     runs in single-writer mode); copies of the counting
 *                     and scalable kinds hold it to stop mutations (never
 *                     queries).
 * filter.pages_mu (change tracking, store_pages.c) is taken before
 * filter.lock and never while holding snap_mu or lock: a walk holds it while
 * its callback streams pages, and a merge across its durable write.
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
#include "wal.h"

#define STORE_PATH_LEN 4096

struct store_filter {
    struct store *s;
    char *name;
    char *path;                  /* DIR/name */
    atomic_int refs;             /* the catalog holds one */
    bool dropping;               /* under store.mu */
    pthread_mutex_t snap_mu;
    pthread_rwlock_t lock;
    pthread_mutex_t write_mu;
    enum store_state state;      /* under lock */
    char why[STORE_ERRLEN];      /* under lock */
    struct bf *bf;               /* under lock */
    struct wal *wal;             /* under lock */
    bool exact;                  /* counting, scalable: copies take
                                    write_mu too */
    _Atomic uint64_t version;
    uint64_t snap_seq;           /* under snap_mu */
    uint64_t snap_time_ms;       /* under snap_mu */
    bool retry;                  /* FAILED by an I/O error: the snapshot
                                    thread re-runs recovery (under lock) */
    uint64_t failed_ms;          /* when; under lock */
    pthread_mutex_t pages_mu;
    struct store_pages *pages;   /* change tracking, under pages_mu; NULL
                                    until first asked for */
    _Atomic uint64_t source_version;   /* store_pages_source_version */
};

struct store {
    char *dir;
    int durability;
    unsigned interval_ms;
    uint64_t wal_bytes;
    unsigned retry_ms;
    int lock_fd;
    pthread_mutex_t mu;
    struct store_filter **v;     /* catalog, under mu */
    size_t n, cap;
    uint64_t drops;              /* tombstone counter, under mu */
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

/* Raise *a to v unless it is already higher. */
void store__raise(_Atomic uint64_t *a, uint64_t v);

/* The error a data call returns in state st (0 for READY), and the
 * sentence that goes with it in err; the caller holds sf->lock. */
int store__state_errno(enum store_state st);
void store__state_err(struct store_filter *sf, char *err);

/* A filter object in state RECOVERING holding one reference; freed by the
 * last store_put. */
struct store_filter *store__filter_new(struct store *s, const char *name);
void store__filter_free(struct store_filter *sf);

/* Free the change tracking of a filter (NULL allowed). */
void store__pages_free(struct store_pages *t);

/* Make the filter READY with f and w (ownership moves to sf). */
void store__filter_install(struct store_filter *sf, struct bf *f,
                           struct wal *w);

/* Newest loadable snapshot + WAL replay; the caller holds snap_mu and the
 * filter has no bf/wal.  Leaves it READY (0) or FAILED (negative errno). */
int store__filter_load(struct store_filter *sf, char *err);

/* Rotate the WAL, copy, save snapshot-C, discard what it covers.  force:
 * even if nothing changed.  A filter that is not READY is skipped (0). */
int store__filter_snapshot(struct store_filter *sf, bool force, char *err);

/* For the snapshot thread: is a snapshot due (WAL size or interval), is a
 * recovery after a write error due. */
bool store__filter_due(struct store_filter *sf, uint64_t now);
bool store__filter_retry_due(struct store_filter *sf, uint64_t now);

#endif
