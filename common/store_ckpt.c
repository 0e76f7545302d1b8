/* store_ckpt: checkpoints of filters, and keeping the node log under its
 * bound (store.h, "Checkpoint vs log ordering" and "The log's bound").
 *
 * The writer (ckpt_write) only turns a copy into a file; taking the copy
 * at a known (seq, LSN) is store__filter_checkpoint's job, so a writer of
 * only the pages changed since the last checkpoint can replace it.
 */
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "durable.h"
#include "log.h"
#include "metrics.h"
#include "store_internal.h"
#include "wal.h"

int store__ckpt_write(const char *dir, uint64_t id, uint64_t seq,
                      uint64_t lsn, const struct bf *f, char *err)
{
    char path[STORE_PATH_LEN];

    store__ckpt_path(path, sizeof(path), dir, id, seq, lsn);
    return bf_file_save(f, path, err);
}

/* Move the checkpoint (id, seq, old) to LSN lsn: the filter has no record
 * between, so the same bits cover the log further. */
static int ckpt_advance(const char *dir, uint64_t id, uint64_t seq,
                        uint64_t old, uint64_t lsn, char *err)
{
    char from[STORE_PATH_LEN], to[STORE_PATH_LEN];
    int rc;

    store__ckpt_path(from, sizeof(from), dir, id, seq, old);
    store__ckpt_path(to, sizeof(to), dir, id, seq, lsn);
    if ((rc = durable_rename(from, to)) < 0)
        errmsg_set(err, "cannot rename %s: %s", from, strerror(-rc));
    return rc;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const double ckpt_bounds[] = {0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5,
                                     10, 30, 60};

static struct {
    struct metric *failures, *duration, *bytes;
} cm;
static pthread_once_t cm_once = PTHREAD_ONCE_INIT;

static void ckpt_metrics_register(void)
{
    struct metrics *m = metrics_registry();
    cm.failures = metrics_counter(m, "bloomgrid_checkpoint_failures_total",
                                  "checkpoints that failed", NULL);
    cm.duration = metrics_histogram(m, "bloomgrid_checkpoint_duration_seconds",
                                    "time a filter's checkpoint took, from its "
                                    "log barrier to the file's rename", NULL,
                                    ckpt_bounds, sizeof ckpt_bounds / sizeof *ckpt_bounds);
    cm.bytes = metrics_counter(m, "bloomgrid_checkpoint_bytes_total",
                               "bytes of filter bits written by checkpoints", NULL);
}

void store_metrics_register(void)
{
    pthread_once(&cm_once, ckpt_metrics_register);
    store__keys_metrics_register();
    wal_metrics_register();
}

/* A checkpoint written (rc 0) or failed, with its duration and bytes. */
static void ckpt_metrics(int rc, double seconds, uint64_t bytes)
{
    pthread_once(&cm_once, ckpt_metrics_register);
    if (rc < 0) {
        metric_add(cm.failures, 1);
        return;
    }
    metric_observe(cm.duration, seconds);
    metric_add(cm.bytes, bytes);
}

int store__filter_checkpoint(struct store_filter *sf,
                             enum store_ckpt_mode mode, char *err)
{
    double t0 = mono_s();
    char e2[STORE_ERRLEN] = "";
    struct wal_waiter wt;
    struct bf *copy = NULL;
    uint64_t seq, lsn, old;
    bool changed, write;
    int rc;

    pthread_mutex_lock(&sf->snap_mu);
    store__lock_for_copy(sf);
    if (store__state(sf) != STORE_READY) {
        store__unlock_for_copy(sf);
        pthread_mutex_unlock(&sf->snap_mu);
        return 0;   /* nothing to checkpoint */
    }
    /* The seq and the barrier under write_mu: records <= seq are before
     * the barrier in the log, later ones after it. */
    if (!sf->exact)
        pthread_mutex_lock(&sf->write_mu);
    seq = wal_stream_last_seq(sf->stream);
    changed = seq != sf->ckpt_seq;
    write = changed || mode == STORE_CKPT_FORCE;
    if (!changed && mode == STORE_CKPT_IF_CHANGED) {
        if (!sf->exact)
            pthread_mutex_unlock(&sf->write_mu);
        store__unlock_for_copy(sf);
        pthread_mutex_unlock(&sf->snap_mu);
        return 0;
    }
    wal_waiter_init(&wt);
    if (wal_barrier(sf->stream, wal_waiter_done, &wt) < 0)
        wal_waiter_done(&wt, -ENOMEM, 0, 0);
    if (!sf->exact)
        pthread_mutex_unlock(&sf->write_mu);
    /* Every record <= seq set its bits before it was submitted, hence
     * before this copy starts. */
    if (write && !(copy = store__copy_locked(sf, e2)))
        store__strfmt(e2, sizeof(e2), "no memory for a copy of the filter");
    store__unlock_for_copy(sf);
    rc = wal_waiter_wait(&wt);
    lsn = wt.lsn;
    if (rc < 0) {
        errmsg_set(err, "checkpoint of '%s' failed: its log records are not "
                   "durable (%s)", sf->name, strerror(-rc));
        goto out;
    }
    if (write && !copy) {
        rc = -ENOMEM;
        errmsg_set(err, "checkpoint of '%s' failed: %s", sf->name, e2);
        goto out;
    }
    old = atomic_load(&sf->ckpt_lsn);
    rc = write ? store__ckpt_write(sf->path, sf->id, seq, lsn, copy, e2)
               : lsn == old ? 0
                            : ckpt_advance(sf->path, sf->id, seq, old, lsn, e2);
    sf->snap_time_ms = store__now_ms();
    if (rc < 0) {
        /* The old checkpoint and the log are still there; try again after
         * an interval rather than at every tick. */
        errmsg_set(err, "checkpoint of '%s' failed: %s", sf->name, e2);
        goto out;
    }
    sf->ckpt_seq = seq;
    atomic_store(&sf->ckpt_lsn, lsn);
    store__ckpt_prune(sf->path, sf->id, seq, lsn);
out:
    if (write)
        ckpt_metrics(rc, mono_s() - t0, copy ? bf_bytes(copy) : 0);
    bf_destroy(copy);
    pthread_mutex_unlock(&sf->snap_mu);
    return rc;
}

int store_filter_snapshot(struct store_filter *sf, char *err)
{
    return store__filter_checkpoint(sf, STORE_CKPT_FORCE, err);
}

int store__discard_log(struct store *s, bool ignore_failed)
{
    size_t n;
    uint64_t upto;
    struct store_filter **v = store__catalog_refs(s, &n, &upto);
    int rc;

    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        enum store_state st = store_filter_state(v[i], NULL);
        uint64_t l = atomic_load(&v[i]->ckpt_lsn);
        if (!(ignore_failed && st == STORE_FAILED) && l < upto)
            upto = l;
        store_put(v[i]);
    }
    free(v);
    rc = wal_discard(s->wal, upto);
    if (rc < 0)
        log_warn("store: cannot remove log segments up to LSN %" PRIu64
                 ": %s", upto, strerror(-rc));
    return rc < 0 ? rc : 0;
}

int store_snapshot_now(struct store *s, char *err)
{
    size_t n;
    struct store_filter **v = store__catalog_refs(s, &n, NULL);
    int rc = 0;

    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int r = store__filter_checkpoint(v[i], STORE_CKPT_IF_CHANGED,
                                         rc ? NULL : err);
        if (r < 0 && rc == 0)
            rc = r;
        store_put(v[i]);
    }
    free(v);
    store__discard_log(s, false);
    return rc;
}

uint64_t store_log_bytes(struct store *s)
{
    return wal_bytes(s->wal);
}

uint64_t store_log_file_bytes(struct store *s)
{
    return wal_file_bytes(s->wal);
}

/* A filter FAILED by an I/O error and due for another recovery?  A filter
 * whose stream failed turns FAILED here (the commit thread only marks the
 * stream), keeping its bits: they hold every acknowledged write, so reads
 * go on from them (store.h, "Failed writes"). */
static bool retry_due(struct store_filter *sf, uint64_t now)
{
    bool due;

    pthread_rwlock_wrlock(&sf->lock);
    if (sf->state == STORE_READY && store__state(sf) == STORE_FAILED) {
        char why[WAL_ERRLEN];
        wal_stream_failed(sf->stream, why);
        sf->state = STORE_FAILED;
        sf->err = wal_stream_error(sf->stream);
        sf->retry = true;
        sf->failed_ms = now;
        store__strfmt(sf->why, sizeof(sf->why), "%s; " STORE_NO_WRITES, why);
        log_error("store: filter '%s' takes no writes: %s", sf->name, sf->why);
    }
    due = sf->state == STORE_FAILED && sf->retry &&
          now - sf->failed_ms >= sf->s->retry_ms;
    pthread_rwlock_unlock(&sf->lock);
    return due;
}

/* Can the log take the filter's records again?  A barrier of a new stream
 * of its incarnation (nothing is written for it) fails while the log has
 * no segment it can write, as on a full disk; it proves no room for the
 * next write, which may fail again (then the filter comes back here). */
static int log_writable(struct store_filter *sf)
{
    struct wal_waiter wt;
    struct wal_stream *st;
    uint64_t id;

    pthread_mutex_lock(&sf->snap_mu);
    id = sf->id;
    pthread_mutex_unlock(&sf->snap_mu);
    if (!id || !(st = wal_stream_open(sf->s->wal, id, sf->name, 1)))
        return 0;   /* nothing to ask: the reload finds out */
    wal_waiter_init(&wt);
    if (wal_barrier(st, wal_waiter_done, &wt) < 0)
        wal_waiter_done(&wt, -ENOMEM, 0, 0);
    int rc = wal_waiter_wait(&wt);
    wal_stream_close(st);
    return rc;
}

/* Reload a filter FAILED by an I/O error from its files, once the log can
 * be written: until then it keeps the bits it has (if any) for reads,
 * rather than dropping them for a reload whose first write would fail. */
static void recover_logged(struct store_filter *sf)
{
    char err[STORE_ERRLEN];
    int rc = log_writable(sf);

    if (rc < 0) {
        pthread_rwlock_wrlock(&sf->lock);
        sf->failed_ms = store__now_ms();   /* the next try after retry_ms */
        pthread_rwlock_unlock(&sf->lock);
        return;
    }
    if (store_filter_recover(sf, err) == 0)
        log_info("store: filter '%s' recovered after a write error",
                 sf->name);
}

void store__housekeeping(struct store *s)
{
    size_t n;
    struct store_filter **v = store__catalog_refs(s, &n, NULL);
    char err[STORE_ERRLEN];
    uint64_t upto;
    bool over;

    if (!v)
        return;
    for (size_t i = 0; i < n; i++) {
        uint64_t now = store__now_ms();
        if (retry_due(v[i], now))
            recover_logged(v[i]);
        if (now - v[i]->snap_time_ms >= s->interval_ms &&
            store__filter_checkpoint(v[i], STORE_CKPT_IF_CHANGED, err) < 0)
            log_warn("store: %s", err);
    }
    /* Over the bound: every filter that holds a closed segment gets
     * checkpointed (or its checkpoint moved), so all of them can go.  The
     * bound counts records; the files, padded to write units, are held
     * to STORE_LOG_FILES times it. */
    over = wal_bytes(s->wal) >= s->wal_bytes ||
           wal_file_bytes(s->wal) / STORE_LOG_FILES >= s->wal_bytes;
    if (over && !wal_closed_upto(s->wal, &upto)) {
        wal_rotate(s->wal);
        over = false;
    }
    for (size_t i = 0; over && i < n; i++) {
        if (atomic_load(&v[i]->ckpt_lsn) >= upto)
            continue;
        pthread_rwlock_rdlock(&v[i]->lock);
        bool retry = store__state(v[i]) == STORE_FAILED && v[i]->retry;
        pthread_rwlock_unlock(&v[i]->lock);
        if (retry)
            recover_logged(v[i]);   /* it may come back and checkpoint */
        if (store__filter_checkpoint(v[i], STORE_CKPT_ADVANCE, err) < 0)
            log_warn("store: %s", err);
        if (store_filter_state(v[i], NULL) == STORE_FAILED &&
            atomic_load(&v[i]->ckpt_lsn) < upto) {
            log_warn("store: filter '%s' is FAILED and no longer holds the "
                     "write-ahead log: it cannot be recovered from this "
                     "node's files", v[i]->name);
            atomic_store(&v[i]->ckpt_lsn, UINT64_MAX);
        }
    }
    for (size_t i = 0; i < n; i++)
        store_put(v[i]);
    free(v);
    store__discard_log(s, over);
}
