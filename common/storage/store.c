/* store: the catalog of a data directory, creation and drop of filters,
 * opening and closing, and the store's thread.  The per-filter work lives
 * in store_filter.c, loading in store_load.c, checkpoints in store_ckpt.c;
 * the locks are described in store_internal.h.
 */
#include "durable.h"
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "log.h"
#include "name_index.h"
#include "rules.h"

_Static_assert(BF_SECRET_LEN == RULES_SECRET_LEN, "one secret length for the engine and the rules");
#include "store_internal.h"
#include "wal.h"

#define DEFAULT_INTERVAL_MS 60000u
#define DEFAULT_WAL_BYTES (UINT64_C(64) << 20)
#define DEFAULT_RETRY_MS 1000u
#define DEFAULT_CKPT_PERCENT 50u
#define TICK_MS 200u

/* snprintf that may truncate: messages are cut, and paths cannot be too
 * long because the directory length is checked when it is first given. */
void store__strfmt(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

uint64_t store__now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}


static int rm_one(const char *path, const struct stat *st, int flag,
                  struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

uint64_t store__claim_lsn(struct store_filter *sf)
{
    pthread_mutex_lock(&sf->s->mu);
    uint64_t lsn = wal_durable_lsn(sf->s->wal);
    atomic_store(&sf->ckpt_lsn, lsn);
    pthread_mutex_unlock(&sf->s->mu);
    return lsn;
}

uint64_t store__random_id(void)
{
    static _Atomic uint64_t fallback = 1;
    uint64_t v = 0;

    if (getrandom(&v, sizeof v, 0) != sizeof v)
        v = atomic_fetch_add(&fallback, 1) * UINT64_C(0x9e3779b97f4a7c15) ^
            store__now_ms();
    return v ? v : 1;
}

int store__rm_rf(const char *path)
{
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}

int store_name_check(const char *name, char *err)
{
    return rules_store_name_check(name, name ? strlen(name) : 0, err);
}

/* The catalog: an array (for walks over every filter) and an index by
 * name (name_index.h) of the same filters.  Both change under s->mu; a
 * lookup by name takes only the name's stripe of the index, so store_get,
 * on every data call, shares no lock with the other readers. */

/* The entry of name, dropping or not; the caller holds s->mu. */
static struct store_filter *catalog_find(struct store *s, const char *name)
{
    return name_index_get(s->names, name, NULL, NULL);
}

static int catalog_add(struct store *s, struct store_filter *sf)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        struct store_filter **nv = realloc(s->v, cap * sizeof(*nv));
        if (!nv)
            return -ENOMEM;
        s->v = nv;
        s->cap = cap;
    }
    int rc = name_index_add(s->names, sf->name, sf);
    if (rc < 0)
        return rc;   /* -EEXIST: callers look the name up first */
    s->v[s->n++] = sf;
    return 0;
}

/* Returns whether sf was there; the caller then owns the catalog's
 * reference. */
static bool catalog_remove(struct store *s, struct store_filter *sf)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == sf) {
            s->v[i] = s->v[--s->n];
            name_index_remove(s->names, sf->name, sf);
            return true;
        }
    return false;
}

/* sf->dropping, set or cleared where store_get reads it (s->mu held). */
static void dropping_set(void *value, void *ctx)
{
    ((struct store_filter *)value)->dropping = *(const bool *)ctx;
}

static void catalog_dropping(struct store *s, struct store_filter *sf, bool v)
{
    name_index_update(s->names, sf->name, dropping_set, &v);
}

/* A reference to a filter that is not being dropped (under its stripe's
 * lock, so it cannot leave the catalog meanwhile). */
static void take_ref(void *value, void *ctx)
{
    struct store_filter *sf = value;

    if (!sf->dropping) {
        atomic_fetch_add(&sf->refs, 1);
        *(struct store_filter **)ctx = sf;
    }
}

struct store_filter *store_get(struct store *s, const char *name)
{
    struct store_filter *sf = NULL;

    name_index_get(s->names, name, take_ref, &sf);
    return sf;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int store_list(struct store *s, char ***names, size_t *n)
{
    char **v;
    size_t k = 0;

    pthread_mutex_lock(&s->mu);
    v = calloc(s->n ? s->n : 1, sizeof(*v));
    if (!v)
        goto nomem;
    for (size_t i = 0; i < s->n; i++) {
        if (s->v[i]->dropping)
            continue;
        if (!(v[k] = strdup(s->v[i]->name)))
            goto nomem;
        k++;
    }
    pthread_mutex_unlock(&s->mu);
    if (k > 1)
        qsort(v, k, sizeof(*v), name_cmp);
    *names = v;
    *n = k;
    return 0;
nomem:
    pthread_mutex_unlock(&s->mu);
    store_list_free(v, k);
    return -ENOMEM;
}

void store_list_free(char **names, size_t n)
{
    if (!names)
        return;
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* ---- budgets (store.h, "Budgets") ---- */

void store_budget(struct store *s, struct store_budget *out)
{
    pthread_mutex_lock(&s->mu);
    out->max_memory_bytes = s->max_memory;
    out->charged_bytes = atomic_load(&s->charged);
    out->max_filters = s->max_filters;
    out->filters = s->n;
    pthread_mutex_unlock(&s->mu);
}

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* May a filter of this charge be added?  s->mu held (creations reserve
 * under it, so two cannot both take the last room).  0 or -EDQUOT. */
static int budget_check_locked(struct store *s, const char *name,
                               enum bf_kind kind, uint64_t charge, char *err)
{
    uint64_t used = atomic_load(&s->charged);

    if (s->max_filters && s->n >= s->max_filters) {
        errmsg_set(err, "filter '%s' refused: the node holds %zu filters, "
                   "its budget (max_filters = %" PRIu64 "); drop one or raise "
                   "max_filters", name, s->n, s->max_filters);
        return -EDQUOT;
    }
    if (s->max_memory && (charge > s->max_memory ||
                          used > s->max_memory - charge)) {
        errmsg_set(err, "filter '%s' refused: it counts %.1f MiB (a %s "
                   "filter's bits and their page versions) and %.1f MiB of "
                   "max_memory_mb = %" PRIu64 " are taken",
                   name, mib(charge), bf_kind_name(kind), mib(used),
                   s->max_memory >> 20);
        return -EDQUOT;
    }
    return 0;
}

int store_reserve(struct store *s, uint64_t bytes, const char *what, char *err)
{
    int rc = 0;

    pthread_mutex_lock(&s->mu);
    uint64_t used = atomic_load(&s->charged);
    if (s->max_memory && (bytes > s->max_memory || used > s->max_memory - bytes)) {
        errmsg_set(err, "%s refused: %.1f MiB more would take the node past "
                   "max_memory_mb = %" PRIu64 " (%.1f MiB taken by filters and "
                   "transfers in flight)", what, mib(bytes), s->max_memory >> 20,
                   mib(used));
        rc = -EDQUOT;
    } else {
        atomic_fetch_add(&s->charged, bytes);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void store_release(struct store *s, uint64_t bytes)
{
    atomic_fetch_sub(&s->charged, bytes);
}

/* store_create_from, or with gen > 0 an undrop (store.h, "Undoing a
 * drop"): no tombstone refuses it, and once the filter's files are in
 * place its tombstone is lifted and generation gen recorded, before it is
 * served; when that write fails the files go again and nothing changed
 * (a crash between the two leaves the filter with its tombstone: a
 * rollback drops it, a retry or a peer's generation lifts it). */
static int create_from(struct store *s, const char *name, struct bf *f,
                       uint64_t gen, char *err)
{
    struct store_filter *sf = NULL;
    char tmp[STORE_PATH_LEN], e2[STORE_ERRLEN], fp[17];
    uint64_t id, lsn;
    int rc;

    if ((rc = store_name_check(name, err)) < 0)
        return rc;
    if (!gen && store_dropped(s, name, store_secret_id(f), NULL)) {
        errmsg_set(err, "filter '%s' with this secret was dropped; a create "
                        "does not undo a drop: create it with a new secret, "
                        "or undrop it", name);
        return -ESTALE;
    }
    /* Reserve the name in the catalog (RECOVERING) while the files are
     * written, so the catalog lock is not held across I/O. */
    uint64_t charge = store__charge_of(f);
    pthread_mutex_lock(&s->mu);
    if (catalog_find(s, name)) {
        pthread_mutex_unlock(&s->mu);
        errmsg_set(err, "filter '%s' already exists", name);
        return -EEXIST;
    }
    if ((rc = budget_check_locked(s, name, bf_kind(f), charge, err)) < 0) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    if ((sf = store__filter_new(s, name)))
        atomic_store(&sf->creating, true);
    if (!sf || catalog_add(s, sf) < 0) {
        pthread_mutex_unlock(&s->mu);
        if (sf)
            store__filter_free(sf);
        errmsg_set(err, "out of memory");
        return -ENOMEM;
    }
    /* Reserved now; store__filter_free gives it back. */
    atomic_store(&sf->charge, charge);
    atomic_fetch_add(&s->charged, charge);
    /* A drop of the reserved name waits for the files to be in place. */
    pthread_mutex_lock(&sf->snap_mu);
    pthread_mutex_unlock(&s->mu);

    /* Build the directory under a dot name and rename it into place, so a
     * crash never leaves a half-created filter (dot names are swept).  A
     * new incarnation id, and no record of it in the log up to now. */
    id = store__random_id();
    lsn = store__claim_lsn(sf);
    store__strfmt(tmp, sizeof(tmp), "%s/" STORE_CREATING_PREFIX "%s", s->dir, name);
    store__rm_rf(tmp);
    if (mkdir(tmp, 0755) < 0) {
        rc = -errno;
        errmsg_set(err, "cannot create %s: %s", tmp, strerror(-rc));
        goto fail;
    }
    if ((rc = store__ckpt_first(tmp, id, 0, lsn, f, sf->chain, e2)) < 0) {
        errmsg_set(err, "cannot write the first checkpoint of '%s': %s",
                      name, e2);
        goto fail;
    }
    if ((rc = durable_rename(tmp, sf->path)) < 0) {
        errmsg_set(err, "cannot publish %s: %s", sf->path, strerror(-rc));
        goto fail;
    }
    bf_fingerprint_id(f, fp);
    if (gen && (rc = store__tomb_lift(s, name, store_secret_id(f), fp, gen,
                                      err)) < 0) {
        /* Back out of place under the dot name, then away. */
        int back = durable_rename(sf->path, tmp);
        if (back < 0)
            log_error("store: undrop of '%s' failed, and %s stays: %s", name,
                      sf->path, strerror(-back));
        goto fail;
    }
    sf->id = id;
    sf->ckpt_seq = 0;
    sf->snap_time_ms = store__now_ms();
    rc = store__filter_install(sf, f, 1);
    atomic_store(&sf->creating, false);   /* READY, or FAILED for good */
    pthread_mutex_unlock(&sf->snap_mu);
    if (rc < 0)
        errmsg_set(err, "out of memory");
    /* On failure the filter is durable and kept FAILED; f is freed. */
    return rc < 0 ? -ENOMEM : 0;
fail:
    store__rm_rf(tmp);
    atomic_store(&sf->creating, false);
    pthread_mutex_unlock(&sf->snap_mu);
    pthread_mutex_lock(&s->mu);
    bool mine = catalog_remove(s, sf);
    pthread_mutex_unlock(&s->mu);
    if (mine)
        store_put(sf);
    return rc;
}

int store_create_from(struct store *s, const char *name, struct bf *f,
                      char *err)
{
    return create_from(s, name, f, 0, err);
}

int store_undrop_from(struct store *s, const char *name, struct bf *f,
                      uint64_t gen, char *err)
{
    uint64_t dropped_gen;

    if (!gen)
        return create_from(s, name, f, 0, err);
    if (store_dropped_gen(s, name, store_secret_id(f), NULL, &dropped_gen) &&
        dropped_gen >= gen) {
        errmsg_set(err, "filter '%s' of generation %" PRIu64 " was dropped "
                   "here at generation %" PRIu64 ": that drop is later",
                   name, gen, dropped_gen);
        return -ESTALE;
    }
    return create_from(s, name, f, gen, err);
}

/* store_create and store_undrop: gen 0 for a plain create. */
static int create(struct store *s, const char *name, const struct bf_params *p,
                  uint64_t gen, char *err)
{
    struct bf *f;
    int rc;

    if ((rc = store_name_check(name, err)) < 0)
        return rc;
    if ((rc = bf_params_check(p, err)) < 0)
        return rc;
    /* The budgets before the bits are allocated; store_create_from checks
     * again under the catalog lock, where the room is taken. */
    uint64_t charge;
    struct bf_params d = *p;
    bf_params_default(&d);
    if (store_charge(&d, &charge) == 0) {
        pthread_mutex_lock(&s->mu);
        rc = budget_check_locked(s, name, d.kind, charge, err);
        pthread_mutex_unlock(&s->mu);
        if (rc < 0)
            return rc;
    }
    if (!(f = bf_create(p, err)))
        return -ENOMEM;   /* the parameters passed the check above */
    /* Tracked from the start: a page never stamped is a page never set, so
     * the first checkpoint (a base of the non-zero pages) reads none of the
     * bits, which stay untouched (not resident) until keys set them. */
    if (bf_track_pages(f, true) < 0) {
        bf_destroy(f);
        errmsg_set(err, "no memory for the page versions of '%s'", name);
        return -ENOMEM;
    }
    if ((rc = create_from(s, name, f, gen, err)) < 0)
        bf_destroy(f);
    return rc;
}

int store_create(struct store *s, const char *name, const struct bf_params *p,
                 char *err)
{
    return create(s, name, p, 0, err);
}

int store_undrop(struct store *s, const char *name, const struct bf_params *p,
                 uint64_t gen, uint64_t *out_gen, char *err)
{
    uint64_t dropped_gen = 0;

    if (!p->secret) {
        errmsg_set(err, "an undrop needs the dropped filter's secret");
        return -EINVAL;
    }
    if (store_dropped_gen(s, name, XXH3_64bits(p->secret, BF_SECRET_LEN), NULL,
                          &dropped_gen) && dropped_gen >= gen)
        gen = dropped_gen + 1;
    if (!gen)
        gen = 1;
    if (out_gen)
        *out_gen = gen;
    return create(s, name, p, gen, err);
}

/* Drop sf, the catalog's entry for name (when it is NULL: whatever entry
 * name has now). */
static int drop(struct store *s, const char *name, struct store_filter *want,
                char *err)
{
    struct store_filter *sf;
    char tomb[STORE_PATH_LEN];
    int rc = 0;

    pthread_mutex_lock(&s->mu);
    sf = catalog_find(s, name);
    if (!sf || sf->dropping || (want && sf != want)) {
        pthread_mutex_unlock(&s->mu);
        errmsg_set(err, "no filter named '%s'", name);
        return -ENOENT;
    }
    catalog_dropping(s, sf, true);   /* hidden from get/list, name still reserved */
    store__strfmt(tomb, sizeof(tomb), "%s/" STORE_DROPPED_PREFIX "%" PRIu64 "-%s", s->dir,
                  s->drops++, name);
    pthread_mutex_unlock(&s->mu);

    /* snap_mu: no snapshot may write into the directory after it moves.
     * The tombstone goes first: once the files are gone, nobody may bring
     * this filter back. */
    pthread_mutex_lock(&sf->snap_mu);
    if ((rc = store__tomb_add(s, sf, err)) < 0) {
        pthread_mutex_unlock(&sf->snap_mu);
        pthread_mutex_lock(&s->mu);
        catalog_dropping(s, sf, false);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    pthread_rwlock_wrlock(&sf->lock);
    sf->state = STORE_DROPPED;
    pthread_rwlock_unlock(&sf->lock);
    /* ENOENT: a creation that failed left nothing on disk. */
    rc = durable_rename(sf->path, tomb);
    if (rc == -ENOENT)
        rc = durable_fsync_dir(s->dir);
    if (rc < 0) {
        errmsg_set(err, "cannot remove %s: %s", sf->path, strerror(-rc));
        log_error("store: drop of '%s' incomplete: %s", name, strerror(-rc));
    }
    pthread_mutex_unlock(&sf->snap_mu);

    pthread_mutex_lock(&s->mu);
    bool mine = catalog_remove(s, sf);
    pthread_mutex_unlock(&s->mu);
    if (rc == 0)
        store__rm_rf(tomb);
    /* The room is free at once: a handle still held only ends its call. */
    if (mine)
        atomic_fetch_sub(&s->charged, atomic_exchange(&sf->charge, 0));
    if (mine)
        store_put(sf);   /* the catalog's reference */
    return rc;
}

int store_drop(struct store *s, const char *name, char *err)
{
    return drop(s, name, NULL, err);
}

int store_drop_handle(struct store *s, struct store_filter *sf, char *err)
{
    return drop(s, sf->name, sf, err);
}

struct store_filter **store__catalog_refs(struct store *s, size_t *n,
                                          uint64_t *durable)
{
    struct store_filter **v;
    size_t k = 0;

    pthread_mutex_lock(&s->mu);
    if (durable)
        *durable = wal_durable_lsn(s->wal);
    v = malloc((s->n ? s->n : 1) * sizeof(*v));
    if (v)
        for (size_t i = 0; i < s->n; i++)
            if (!s->v[i]->dropping) {
                atomic_fetch_add(&s->v[i]->refs, 1);
                v[k++] = s->v[i];
            }
    pthread_mutex_unlock(&s->mu);
    *n = k;
    return v;
}

static void *store_main(void *arg)
{
    struct store *s = arg;
    unsigned tick = s->interval_ms < TICK_MS ? s->interval_ms : TICK_MS;

    if (s->retry_ms < tick)
        tick = s->retry_ms;

    pthread_mutex_lock(&s->tmu);
    while (!s->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)tick * 1000000L;
        ts.tv_sec += ts.tv_nsec / 1000000000L;
        ts.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&s->tcv, &s->tmu, &ts);
        if (s->stop)
            break;
        pthread_mutex_unlock(&s->tmu);

        store__housekeeping(s);
        pthread_mutex_lock(&s->tmu);
    }
    pthread_mutex_unlock(&s->tmu);
    return NULL;
}

/* Sweep dot directories (unfinished creations and drops), load every
 * filter directory and open the log. */
static int store_scan(struct store *s, char *err)
{
    DIR *d = opendir(s->dir);
    struct dirent *de;
    int rc = 0;

    if (!d) {
        rc = -errno;
        errmsg_set(err, "cannot read %s: %s", s->dir, strerror(-rc));
        return rc;
    }
    while ((de = readdir(d))) {
        char path[STORE_PATH_LEN];
        struct stat st;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        store__strfmt(path, sizeof(path), "%s/%s", s->dir, de->d_name);
        if (lstat(path, &st) < 0)
            continue;
        if (S_ISREG(st.st_mode) &&
            !strncmp(de->d_name, STORE_SPOOL_PREFIX, strlen(STORE_SPOOL_PREFIX))) {
            /* An Import's spool left by a crash between its creation and
             * its unlink (store_spool_new): never applied, not acked. */
            unlink(path);
            continue;
        }
        if (!S_ISDIR(st.st_mode))
            continue;
        if (!strncmp(de->d_name, STORE_CREATING_PREFIX, strlen(STORE_CREATING_PREFIX)) ||
            !strncmp(de->d_name, STORE_DROPPED_PREFIX, strlen(STORE_DROPPED_PREFIX))) {
            store__rm_rf(path);
            continue;
        }
        if (store_name_check(de->d_name, NULL) < 0)
            continue;
        struct store_filter *sf = store__filter_new(s, de->d_name);
        if (!sf || catalog_add(s, sf) < 0) {
            if (sf)
                store__filter_free(sf);
            errmsg_set(err, "out of memory");
            rc = -ENOMEM;
            break;
        }
    }
    closedir(d);
    if (rc < 0)
        return rc;
    return store__load_all(s, err);   /* FAILED filters stay listed */
}

struct store *store_open(const struct store_options *o, char *err)
{
    struct store *s = NULL;
    char path[STORE_PATH_LEN];

    if (!o || !o->dir || !o->dir[0]) {
        errmsg_set(err, "no data directory given");
        return NULL;
    }
    if (strlen(o->dir) > STORE_PATH_LEN - 512) {
        errmsg_set(err, "data directory path is too long");
        return NULL;
    }
    if (o->durability != STORE_DURABLE_FSYNC &&
        o->durability != STORE_DURABLE_NONE) {
        errmsg_set(err, "unknown durability mode %d", o->durability);
        return NULL;
    }
    if (mkdir(o->dir, 0755) < 0 && errno != EEXIST) {
        errmsg_set(err, "cannot create data directory %s: %s", o->dir,
                      strerror(errno));
        return NULL;
    }
    if (!(s = calloc(1, sizeof(*s))) || !(s->dir = strdup(o->dir)) ||
        !(s->names = name_index_create())) {
        errmsg_set(err, "out of memory");
        if (s)
            free(s->dir);
        free(s);
        return NULL;
    }
    store_metrics_register();
    s->lock_fd = -1;
    s->durability = o->durability;
    s->interval_ms = o->snapshot_interval_ms ? o->snapshot_interval_ms
                                             : DEFAULT_INTERVAL_MS;
    s->wal_bytes = o->snapshot_wal_bytes ? o->snapshot_wal_bytes
                                         : DEFAULT_WAL_BYTES;
    s->ckpt_percent = o->checkpoint_log_percent ? o->checkpoint_log_percent
                                                : DEFAULT_CKPT_PERCENT;
    s->retry_ms = o->recover_retry_ms ? o->recover_retry_ms
                                      : DEFAULT_RETRY_MS;
    s->max_memory = o->max_memory_bytes;
    /* Copies of records (store_ckpt.c): a sixteenth of a small budget. */
    s->copy_max = STORE_COPY_MAX;
    if (s->max_memory && s->max_memory / 16 < s->copy_max)
        s->copy_max = s->max_memory / 16;
    s->max_filters = o->max_filters;
    s->wal_unit = o->wal_block_bytes;
    s->in_group = o->in_group;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->tomb_mu, NULL);
    pthread_mutex_init(&s->tmu, NULL);
    pthread_cond_init(&s->tcv, NULL);

    store__strfmt(path, sizeof(path), "%s/LOCK", s->dir);
    s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s->lock_fd < 0) {
        errmsg_set(err, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        errmsg_set(err, "data directory %s is in use by another process "
                      "(%s)",
                      s->dir, strerror(errno));
        goto fail;
    }
    if (store__tombs_load(s, err) < 0 || store_scan(s, err) < 0)
        goto fail;
    wal_set_commit_delay(s->wal, o->commit_delay_us);
    if (pthread_create(&s->thread, NULL, store_main, s) != 0) {
        errmsg_set(err, "cannot start the store's thread");
        goto fail;
    }
    s->thread_started = true;
    return s;
fail:
    store_close(s);
    return NULL;
}

void store_close(struct store *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->tmu);
        s->stop = true;
        pthread_cond_broadcast(&s->tcv);
        pthread_mutex_unlock(&s->tmu);
        pthread_join(s->thread, NULL);
        /* A final checkpoint makes the next start quick. */
        store_snapshot_now(s, NULL);
    }
    name_index_destroy(s->names);
    for (size_t i = 0; i < s->n; i++)
        store_put(s->v[i]);
    free(s->v);
    wal_close(s->wal);   /* every stream is closed with its filter */
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    store__tombs_free(s);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->tomb_mu);
    pthread_mutex_destroy(&s->tmu);
    pthread_cond_destroy(&s->tcv);
    free(s->dir);
    free(s);
}
