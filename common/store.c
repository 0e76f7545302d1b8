/* store: named filters in a data directory, made durable by a WAL per filter
 * and periodic snapshots (see store.h for the contract and the ordering
 * rule between snapshots and the WAL).
 *
 * Locks, outermost first:
 *   store.mu          the catalog (the array of filters);
 *   filter.snap_mu    one snapshot, recovery or drop of a filter at a time;
 *   filter.lock       rwlock: shared for data operations (including the wait
 *                     for durability, so the WAL stays alive), exclusive for
 *                     state changes, imports and exact copies;
 *   filter.write_mu   counting kind: makes apply + WAL submit one step, so
 *                     the WAL order is the apply order.
 * The rwlock prefers writers so a snapshot cannot be starved by a stream of
 * adds; readers then wait at most for one exact copy.
 */
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
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "wal.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "WAL payloads store struct bf_hash as is: little-endian hosts only"
#endif

#define DEFAULT_INTERVAL_MS 60000u
#define DEFAULT_WAL_BYTES (UINT64_C(64) << 20)
#define DEFAULT_RETRY_MS 1000u
#define TICK_MS 200u
#define PATH_LEN 4096

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
    bool exact;                  /* copies need the exclusive lock */
    bool serial;                 /* mutations take write_mu */
    _Atomic uint64_t version;
    uint64_t snap_seq;           /* under snap_mu */
    uint64_t snap_time_ms;       /* under snap_mu */
    bool retry;                  /* FAILED by an I/O error: the snapshot
                                    thread re-runs recovery (under lock) */
    uint64_t failed_ms;          /* when; under lock */
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

/* snprintf that may truncate: messages are cut, and paths cannot be too
 * long because the directory length is checked when it is first given. */
static void strfmt(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void strfmt(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

static void seterr(char *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void seterr(char *err, const char *fmt, ...)
{
    va_list ap;

    if (!err)
        return;
    va_start(ap, fmt);
    vsnprintf(err, STORE_ERRLEN, fmt, ap);
    va_end(ap);
}

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int rc = 0;

    if (fd < 0)
        return -errno;
    if (fsync(fd) < 0)
        rc = -errno;
    close(fd);
    return rc;
}

static int rm_one(const char *path, const struct stat *st, int flag,
                  struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path) < 0 && errno != ENOENT ? -1 : 0;
}

static int rm_rf(const char *path)
{
    if (nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS) < 0 && errno != ENOENT)
        return -errno;
    return 0;
}

int store_name_check(const char *name, char *err)
{
    size_t len = name ? strlen(name) : 0;

    if (len == 0 || len > STORE_NAME_MAX) {
        seterr(err, "filter name must be 1 to %d characters long",
               STORE_NAME_MAX);
        return -EINVAL;
    }
    if (name[0] == '.') {
        seterr(err, "filter name must not start with a dot");
        return -EINVAL;
    }
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-')) {
            seterr(err, "filter name may contain only letters, digits, '.', "
                   "'_' and '-' (bad character at position %zu)", i);
            return -EINVAL;
        }
    }
    return 0;
}

/* ---- filter objects ---- */

static struct store_filter *filter_new(struct store *s, const char *name)
{
    struct store_filter *sf = calloc(1, sizeof(*sf));
    pthread_rwlockattr_t a;

    if (!sf)
        return NULL;
    sf->s = s;
    sf->name = strdup(name);
    if (!sf->name || asprintf(&sf->path, "%s/%s", s->dir, name) < 0) {
        free(sf->name);
        free(sf);
        return NULL;
    }
    atomic_init(&sf->refs, 1);
    atomic_init(&sf->version, 0);
    pthread_mutex_init(&sf->snap_mu, NULL);
    pthread_mutex_init(&sf->write_mu, NULL);
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(&a,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&sf->lock, &a);
    pthread_rwlockattr_destroy(&a);
    sf->state = STORE_RECOVERING;
    return sf;
}

static void filter_free(struct store_filter *sf)
{
    wal_close(sf->wal);
    bf_destroy(sf->bf);
    pthread_mutex_destroy(&sf->snap_mu);
    pthread_mutex_destroy(&sf->write_mu);
    pthread_rwlock_destroy(&sf->lock);
    free(sf->name);
    free(sf->path);
    free(sf);
}

void store_put(struct store_filter *sf)
{
    if (sf && atomic_fetch_sub(&sf->refs, 1) == 1)
        filter_free(sf);
}

static void version_raise(struct store_filter *sf, uint64_t seq)
{
    uint64_t v = atomic_load(&sf->version);

    while (v < seq && !atomic_compare_exchange_weak(&sf->version, &v, seq))
        ;
}

/* The error a data call returns in a state other than READY. */
static int state_errno(enum store_state st)
{
    switch (st) {
    case STORE_READY:
        return 0;
    case STORE_RECOVERING:
        return -EAGAIN;
    case STORE_DROPPED:
        return -ENOENT;
    default:
        return -EIO;
    }
}

static void state_err(struct store_filter *sf, char *err)
{
    switch (sf->state) {
    case STORE_RECOVERING:
        seterr(err, "filter '%s' is recovering; retry shortly", sf->name);
        break;
    case STORE_DROPPED:
        seterr(err, "filter '%s' was dropped", sf->name);
        break;
    case STORE_FAILED:
        seterr(err, "filter '%s' is not served: %s", sf->name, sf->why);
        break;
    default:
        break;
    }
}

/* After a WAL failure seen by a data call: refuse the filter until it is
 * recovered.  w is the WAL the caller used, so a newer one is not blamed. */
static void filter_wal_failed(struct store_filter *sf, struct wal *w,
                              char *err)
{
    pthread_rwlock_wrlock(&sf->lock);
    if (sf->wal == w && sf->state == STORE_READY) {
        sf->state = STORE_FAILED;
        sf->retry = true;
        sf->failed_ms = now_ms();
        strfmt(sf->why, sizeof(sf->why), "%s; writes are refused until "
                 "the filter is recovered", wal_error_text(w));
        log_error("store: filter '%s' failed: %s", sf->name, sf->why);
    }
    seterr(err, "write to filter '%s' is not durable: %s", sf->name,
           wal_error_text(w));
    pthread_rwlock_unlock(&sf->lock);
}

/* ---- loading ---- */

struct snap_ent {
    uint64_t seq;
    char name[40];
};

static bool snap_parse_name(const char *name, uint64_t *seq)
{
    char *end;

    if (strlen(name) != 28 || strncmp(name, "snapshot-", 9) != 0 ||
        strcmp(name + 25, ".bf") != 0)
        return false;
    for (int i = 9; i < 25; i++)
        if (!strchr("0123456789abcdef", name[i]))
            return false;
    *seq = strtoull(name + 9, &end, 16);
    return end == name + 25;
}

static int snap_cmp_desc(const void *a, const void *b)
{
    const struct snap_ent *x = a, *y = b;

    return x->seq > y->seq ? -1 : x->seq < y->seq;
}

/* Snapshots in dir, newest first.  clean: also remove temp files of
 * snapshot saves a crash interrupted (only while nothing writes to dir). */
static int snap_list(const char *dir, bool clean, struct snap_ent **out,
                     size_t *n)
{
    DIR *d = opendir(dir);
    struct snap_ent *v = NULL;
    size_t len = 0, cap = 0;
    struct dirent *de;

    if (!d)
        return -errno;
    while ((de = readdir(d))) {
        uint64_t seq;
        if (clean && !strncmp(de->d_name, "snapshot-", 9) &&
            strstr(de->d_name, ".bf.tmp.")) {
            unlinkat(dirfd(d), de->d_name, 0);
            continue;
        }
        if (!snap_parse_name(de->d_name, &seq))
            continue;
        if (len == cap) {
            cap = cap ? 2 * cap : 4;
            struct snap_ent *nv = realloc(v, cap * sizeof(*v));
            if (!nv) {
                free(v);
                closedir(d);
                return -ENOMEM;
            }
            v = nv;
        }
        v[len].seq = seq;
        memcpy(v[len].name, de->d_name, 29);   /* 28 chars, checked */
        len++;
    }
    closedir(d);
    if (len)
        qsort(v, len, sizeof(*v), snap_cmp_desc);
    *out = v;
    *n = len;
    return 0;
}

/* Remove the snapshots older than seq (the newest one makes them useless). */
static void snap_prune(const char *dir, uint64_t seq)
{
    struct snap_ent *v;
    size_t n;

    if (snap_list(dir, false, &v, &n) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        char path[PATH_LEN];
        if (v[i].seq >= seq)
            continue;
        strfmt(path, sizeof(path), "%s/%s", dir, v[i].name);
        unlink(path);
    }
    free(v);
}

/* Apply one WAL record to the filter being recovered. */
static int replay_one(void *ctx, uint32_t type, uint64_t seq,
                      const void *payload, uint64_t len)
{
    struct bf *f = ctx;
    struct bf_hash h[512];
    const uint8_t *p = payload;
    char err[BF_ERRLEN];

    (void)seq;
    switch (type) {
    case WAL_REC_ADD:
    case WAL_REC_REMOVE:
        if (len % sizeof(struct bf_hash))
            return -EBADMSG;
        /* Copy out: records are not aligned for struct access. */
        while (len) {
            size_t k = len / sizeof(h[0]);
            if (k > 512)
                k = 512;
            memcpy(h, p, k * sizeof(h[0]));
            if (type == WAL_REC_ADD)
                bf_add_hashes(f, h, k, NULL);
            else
                for (size_t i = 0; i < k; i++)
                    (void)bf_remove_hash(f, h[i]);
            p += k * sizeof(h[0]);
            len -= k * sizeof(h[0]);
        }
        return 0;
    case WAL_REC_IMPORT: {
        struct bf *src = bf_file_parse(payload, (size_t)len, err);
        int rc;
        if (!src)
            return -EBADMSG;
        rc = bf_merge_from(f, src, err);
        bf_destroy(src);
        return rc;
    }
    default:
        return -EBADMSG;
    }
}

/* Load a filter from its directory: newest loadable snapshot + WAL replay.
 * Called with snap_mu held and the filter in RECOVERING with no bf/wal;
 * leaves it READY or FAILED. */
static int filter_load(struct store_filter *sf, char *err)
{
    struct snap_ent *v = NULL;
    size_t n = 0, i;
    struct bf *f = NULL;
    struct wal *w = NULL;
    struct wal_recovery rec;
    char why[STORE_ERRLEN] = "", e2[STORE_ERRLEN], path[PATH_LEN];
    uint64_t covered = 0;
    int rc;

    if ((rc = snap_list(sf->path, true, &v, &n)) < 0) {
        strfmt(why, sizeof(why), "cannot list %s: %s", sf->path,
                 strerror(-rc));
        goto fail;
    }
    for (i = 0; i < n && !f; i++) {
        strfmt(path, sizeof(path), "%s/%s", sf->path, v[i].name);
        f = bf_file_load(path, e2, NULL);
        if (f)
            covered = v[i].seq;
        else if (!why[0])
            strfmt(why, sizeof(why), "snapshot %s is unusable: %.160s", path,
                     e2);
    }
    if (!f) {
        rc = -EBADMSG;
        if (!why[0])
            strfmt(why, sizeof(why), "no snapshot in %s", sf->path);
        goto fail;
    }
    if (why[0])
        log_warn("store: %s; trying the older snapshot-%016" PRIx64 ".bf with "
                 "the WAL after it", why, covered);
    bf_set_exclusive(f, true);
    rc = wal_recover(sf->path, covered, replay_one, f, &rec, e2);
    bf_set_exclusive(f, false);
    if (rc < 0) {
        size_t l = strlen(why);
        strfmt(why + l, sizeof(why) - l, "%s%s", l ? "; then " : "", e2);
        goto fail;
    }
    if (rec.truncated)
        log_warn("store: filter '%s': cut a torn WAL tail of %" PRIu64
                 " bytes (never acknowledged)", sf->name, rec.truncated);
    if (!(w = wal_open(sf->path, rec.next_seq, sf->s->durability, e2))) {
        rc = -EIO;
        strfmt(why, sizeof(why), "%s", e2);
        goto fail;
    }
    free(v);
    pthread_rwlock_wrlock(&sf->lock);
    sf->bf = f;
    sf->wal = w;
    sf->exact = bf_kind(f) == BF_KIND_COUNTING || bf_kind(f) == BF_KIND_SCALABLE;
    sf->serial = bf_kind(f) == BF_KIND_COUNTING;
    sf->state = STORE_READY;
    sf->why[0] = 0;
    sf->retry = false;
    pthread_rwlock_unlock(&sf->lock);
    version_raise(sf, rec.next_seq - 1);
    sf->snap_seq = covered;
    sf->snap_time_ms = now_ms();
    log_info("store: filter '%s' ready: snapshot seq %" PRIu64 ", %" PRIu64
             " WAL records replayed", sf->name, covered, rec.records);
    return 0;
fail:
    free(v);
    bf_destroy(f);
    pthread_rwlock_wrlock(&sf->lock);
    sf->state = STORE_FAILED;
    strfmt(sf->why, sizeof(sf->why), "%s", why);
    /* Damaged files stay refused; a disk that failed may come back. */
    sf->retry = rc != -EBADMSG;
    sf->failed_ms = now_ms();
    pthread_rwlock_unlock(&sf->lock);
    log_error("store: filter '%s' is not served: %s", sf->name, why);
    seterr(err, "filter '%s' is not served: %s", sf->name, why);
    return rc < 0 ? rc : -EIO;
}

int store_filter_recover(struct store_filter *sf, char *err)
{
    struct bf *f;
    struct wal *w;
    int rc;

    pthread_mutex_lock(&sf->snap_mu);
    pthread_rwlock_wrlock(&sf->lock);
    if (sf->state == STORE_DROPPED) {
        state_err(sf, err);
        pthread_rwlock_unlock(&sf->lock);
        pthread_mutex_unlock(&sf->snap_mu);
        return -ENOENT;
    }
    f = sf->bf;
    w = sf->wal;
    sf->bf = NULL;
    sf->wal = NULL;
    sf->state = STORE_RECOVERING;
    pthread_rwlock_unlock(&sf->lock);
    wal_close(w);
    bf_destroy(f);
    rc = filter_load(sf, err);
    pthread_mutex_unlock(&sf->snap_mu);
    return rc;
}

/* ---- catalog ---- */

static struct store_filter *catalog_find(struct store *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i]->name, name) == 0)
            return s->v[i];
    return NULL;
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
            return true;
        }
    return false;
}

struct store_filter *store_get(struct store *s, const char *name)
{
    struct store_filter *sf;

    pthread_mutex_lock(&s->mu);
    sf = catalog_find(s, name);
    if (sf && sf->dropping)
        sf = NULL;
    if (sf)
        atomic_fetch_add(&sf->refs, 1);
    pthread_mutex_unlock(&s->mu);
    return sf;
}

const char *store_filter_name(const struct store_filter *sf)
{
    return sf->name;
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

/* ---- create and drop ---- */

int store_create_from(struct store *s, const char *name, struct bf *f,
                      char *err)
{
    struct store_filter *sf = NULL;
    struct wal *w = NULL;
    char tmp[PATH_LEN], snap[PATH_LEN], e2[STORE_ERRLEN];
    int rc;

    if ((rc = store_name_check(name, err)) < 0)
        return rc;
    /* Reserve the name in the catalog (RECOVERING) while the files are
     * written, so the catalog lock is not held across I/O. */
    pthread_mutex_lock(&s->mu);
    if (catalog_find(s, name)) {
        pthread_mutex_unlock(&s->mu);
        seterr(err, "filter '%s' already exists", name);
        return -EEXIST;
    }
    if (!(sf = filter_new(s, name)) || catalog_add(s, sf) < 0) {
        pthread_mutex_unlock(&s->mu);
        if (sf)
            filter_free(sf);
        seterr(err, "out of memory");
        return -ENOMEM;
    }
    /* A drop of the reserved name waits for the files to be in place. */
    pthread_mutex_lock(&sf->snap_mu);
    pthread_mutex_unlock(&s->mu);

    /* Build the directory under a dot name and rename it into place, so a
     * crash never leaves a half-created filter (dot names are swept). */
    strfmt(tmp, sizeof(tmp), "%s/.creating-%s", s->dir, name);
    strfmt(snap, sizeof(snap), "%s/snapshot-%016" PRIx64 ".bf", tmp,
             (uint64_t)0);
    rm_rf(tmp);
    if (mkdir(tmp, 0755) < 0) {
        rc = -errno;
        seterr(err, "cannot create %s: %s", tmp, strerror(-rc));
        goto fail;
    }
    if ((rc = bf_file_save(f, snap, e2)) < 0) {
        seterr(err, "cannot write the first snapshot of '%s': %s", name, e2);
        goto fail;
    }
    if (!(w = wal_open(tmp, 1, s->durability, e2))) {
        rc = -EIO;
        seterr(err, "%s", e2);
        goto fail;
    }
    wal_close(w);
    if (rename(tmp, sf->path) < 0 || fsync_dir(s->dir) < 0) {
        rc = -errno;
        seterr(err, "cannot publish %s: %s", sf->path, strerror(-rc));
        goto fail;
    }
    if (!(w = wal_open(sf->path, 1, s->durability, e2))) {
        /* The filter is durable but cannot take writes now: keep it,
         * FAILED, so a restart or store_filter_recover can serve it. */
        pthread_rwlock_wrlock(&sf->lock);
        sf->state = STORE_FAILED;
        strfmt(sf->why, sizeof(sf->why), "%s", e2);
        pthread_rwlock_unlock(&sf->lock);
        pthread_mutex_unlock(&sf->snap_mu);
        seterr(err, "%s", e2);
        return -EIO;
    }
    pthread_rwlock_wrlock(&sf->lock);
    sf->bf = f;
    sf->wal = w;
    sf->exact = bf_kind(f) == BF_KIND_COUNTING || bf_kind(f) == BF_KIND_SCALABLE;
    sf->serial = bf_kind(f) == BF_KIND_COUNTING;
    sf->state = STORE_READY;
    pthread_rwlock_unlock(&sf->lock);
    sf->snap_time_ms = now_ms();
    pthread_mutex_unlock(&sf->snap_mu);
    return 0;
fail:
    rm_rf(tmp);
    pthread_mutex_unlock(&sf->snap_mu);
    pthread_mutex_lock(&s->mu);
    bool mine = catalog_remove(s, sf);
    pthread_mutex_unlock(&s->mu);
    if (mine)
        store_put(sf);
    return rc;
}

int store_create(struct store *s, const char *name, const struct bf_params *p,
                 char *err)
{
    struct bf *f;
    int rc;

    if ((rc = store_name_check(name, err)) < 0)
        return rc;
    if ((rc = bf_params_check(p, err)) < 0)
        return rc;
    if (!(f = bf_create(p, err)))
        return -EINVAL;
    if ((rc = store_create_from(s, name, f, err)) < 0)
        bf_destroy(f);
    return rc;
}

int store_drop(struct store *s, const char *name, char *err)
{
    struct store_filter *sf;
    char tomb[PATH_LEN];
    int rc = 0;

    pthread_mutex_lock(&s->mu);
    sf = catalog_find(s, name);
    if (!sf || sf->dropping) {
        pthread_mutex_unlock(&s->mu);
        seterr(err, "no filter named '%s'", name);
        return -ENOENT;
    }
    sf->dropping = true;   /* hidden from get/list, name still reserved */
    strfmt(tomb, sizeof(tomb), "%s/.dropped-%" PRIu64 "-%s", s->dir,
             s->drops++, name);
    pthread_mutex_unlock(&s->mu);

    /* snap_mu: no snapshot may write into the directory after it moves. */
    pthread_mutex_lock(&sf->snap_mu);
    pthread_rwlock_wrlock(&sf->lock);
    sf->state = STORE_DROPPED;
    pthread_rwlock_unlock(&sf->lock);
    /* ENOENT: a creation that failed left nothing on disk. */
    if ((rename(sf->path, tomb) < 0 && errno != ENOENT) ||
        fsync_dir(s->dir) < 0) {
        rc = -errno;
        seterr(err, "cannot remove %s: %s", sf->path, strerror(-rc));
        log_error("store: drop of '%s' incomplete: %s", name, strerror(-rc));
    }
    pthread_mutex_unlock(&sf->snap_mu);

    pthread_mutex_lock(&s->mu);
    bool mine = catalog_remove(s, sf);
    pthread_mutex_unlock(&s->mu);
    if (rc == 0)
        rm_rf(tomb);
    if (mine)
        store_put(sf);   /* the catalog's reference */
    return rc;
}

/* ---- data operations ---- */

enum store_state store_filter_state(struct store_filter *sf, char *why)
{
    enum store_state st;

    pthread_rwlock_rdlock(&sf->lock);
    st = sf->state;
    if (why)
        strfmt(why, STORE_ERRLEN, "%s", st == STORE_FAILED ? sf->why : "");
    pthread_rwlock_unlock(&sf->lock);
    return st;
}

/* Apply a batch of hashes and log it.  Bits first, then the WAL record (the
 * order store.h relies on); the wait for durability happens under the shared
 * lock so the WAL cannot be swapped out by a recovery meanwhile. */
static int filter_mutate(struct store_filter *sf, uint32_t type,
                         const struct bf_hash *h, size_t n, bool *out,
                         char *err)
{
    struct wal *w;
    uint64_t seq;
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = state_errno(sf->state)) < 0) {
        state_err(sf, err);
        pthread_rwlock_unlock(&sf->lock);
        return rc;
    }
    if (type == WAL_REC_REMOVE && bf_kind(sf->bf) != BF_KIND_COUNTING) {
        seterr(err, "filter '%s' is a %s filter; only counting filters "
               "support remove", sf->name, bf_kind_name(bf_kind(sf->bf)));
        pthread_rwlock_unlock(&sf->lock);
        return -EOPNOTSUPP;
    }
    if (n == 0) {
        pthread_rwlock_unlock(&sf->lock);
        return 0;
    }
    w = sf->wal;
    if (sf->serial)
        pthread_mutex_lock(&sf->write_mu);
    if (type == WAL_REC_ADD)
        bf_add_hashes(sf->bf, h, n, out);
    else
        for (size_t i = 0; i < n; i++) {
            int r = bf_remove_hash(sf->bf, h[i]);
            if (out)
                out[i] = r == 0;
        }
    rc = wal_submit(w, type, h, (uint64_t)n * sizeof(*h), &seq);
    if (sf->serial)
        pthread_mutex_unlock(&sf->write_mu);
    if (rc == 0)
        rc = wal_wait(w, seq);
    pthread_rwlock_unlock(&sf->lock);
    if (rc == -EIO) {
        filter_wal_failed(sf, w, err);
        return rc;
    }
    if (rc < 0) {
        seterr(err, "cannot log the write to '%s': %s", sf->name,
               strerror(-rc));
        return rc;
    }
    version_raise(sf, seq);
    return 0;
}

int store_add_hashes(struct store_filter *sf, const struct bf_hash *h,
                     size_t n, bool *added, char *err)
{
    return filter_mutate(sf, WAL_REC_ADD, h, n, added, err);
}

int store_remove_hashes(struct store_filter *sf, const struct bf_hash *h,
                        size_t n, bool *removed, char *err)
{
    return filter_mutate(sf, WAL_REC_REMOVE, h, n, removed, err);
}

int store_may_contain_hashes(struct store_filter *sf, const struct bf_hash *h,
                             size_t n, bool *present)
{
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = state_errno(sf->state)) == 0)
        bf_may_contain_hashes(sf->bf, h, n, present);
    pthread_rwlock_unlock(&sf->lock);
    return rc;
}

struct membuf {
    uint8_t *p;
    size_t len, cap;
};

static int membuf_write(void *ctx, const void *buf, size_t len)
{
    struct membuf *m = ctx;

    if (m->len + len > m->cap)
        return -EOVERFLOW;
    memcpy(m->p + m->len, buf, len);
    m->len += len;
    return 0;
}

int store_import(struct store_filter *sf, const struct bf *src, char *err)
{
    struct membuf m = {0};
    const char *field;
    uint64_t seq, size;
    int rc;

    /* Serialize outside the lock: the WAL record carries the whole file. */
    size = bf_file_size(src);
    if (size > WAL_MAX_PAYLOAD || !(m.p = malloc(size ? size : 1))) {
        seterr(err, "cannot buffer an import of %" PRIu64 " bytes", size);
        return -ENOMEM;
    }
    m.cap = size;
    if ((rc = bf_file_write(src, membuf_write, &m)) < 0 || m.len != size) {
        seterr(err, "cannot serialize the imported filter");
        free(m.p);
        return rc < 0 ? rc : -EINVAL;
    }
    pthread_rwlock_wrlock(&sf->lock);   /* bf_merge_from needs exclusion */
    if ((rc = state_errno(sf->state)) < 0) {
        state_err(sf, err);
        goto out;
    }
    if ((field = bf_mismatch(sf->bf, src))) {
        seterr(err, "cannot import into '%s': the filters differ in %s",
               sf->name, field);
        rc = -EINVAL;
        goto out;
    }
    if ((rc = bf_merge_from(sf->bf, src, err)) < 0)
        goto out;
    if ((rc = wal_submit(sf->wal, WAL_REC_IMPORT, m.p, m.len, &seq)) == 0)
        rc = wal_wait(sf->wal, seq);
    if (rc == -EIO) {
        sf->state = STORE_FAILED;
        sf->retry = true;
        sf->failed_ms = now_ms();
        strfmt(sf->why, sizeof(sf->why), "%s; writes are refused until the "
                 "filter is recovered", wal_error_text(sf->wal));
        seterr(err, "import into '%s' is not durable: %s", sf->name,
               wal_error_text(sf->wal));
    } else if (rc < 0) {
        seterr(err, "cannot log the import into '%s': %s", sf->name,
               strerror(-rc));
    } else {
        version_raise(sf, seq);
    }
out:
    pthread_rwlock_unlock(&sf->lock);
    free(m.p);
    return rc;
}

/* A copy of the live filter; the caller holds the lock (exclusive for the
 * exact kinds). */
static struct bf *filter_copy_locked(struct store_filter *sf, char *err)
{
    uint64_t counts[BF_MAX_LAYERS] = {0};
    struct bf *c = bf_create_like(sf->bf, err);
    uint32_t nl;

    if (!c)
        return NULL;
    if (bf_merge_from(c, sf->bf, err) < 0) {
        bf_destroy(c);
        return NULL;
    }
    nl = bf_layer_count(sf->bf);
    for (uint32_t i = 0; i < nl && i < BF_MAX_LAYERS; i++) {
        struct bf_layer_info li;
        if (bf_layer_info(sf->bf, i, &li) == 0)
            counts[i] = li.count;
    }
    bf_set_counts(c, bf_insert_count(sf->bf), counts);
    return c;
}

static void filter_lock_for_copy(struct store_filter *sf)
{
    if (sf->exact)
        pthread_rwlock_wrlock(&sf->lock);
    else
        pthread_rwlock_rdlock(&sf->lock);
}

struct bf *store_filter_copy(struct store_filter *sf)
{
    struct bf *c = NULL;

    /* exact is fixed once READY; read it under the lock to be sure. */
    pthread_rwlock_rdlock(&sf->lock);
    bool ready = sf->state == STORE_READY, exact = sf->exact;
    if (ready && !exact)
        c = filter_copy_locked(sf, NULL);
    pthread_rwlock_unlock(&sf->lock);
    if (ready && exact) {
        pthread_rwlock_wrlock(&sf->lock);
        if (sf->state == STORE_READY)
            c = filter_copy_locked(sf, NULL);
        pthread_rwlock_unlock(&sf->lock);
    }
    return c;
}

int store_export(struct store_filter *sf, bf_file_writer w, void *ctx)
{
    struct bf *c = store_filter_copy(sf);
    int rc;

    if (!c) {
        enum store_state st = store_filter_state(sf, NULL);
        return st == STORE_READY ? -ENOMEM : state_errno(st);
    }
    rc = bf_file_write(c, w, ctx);
    bf_destroy(c);
    return rc;
}

const struct bf *store_filter_bf(struct store_filter *sf)
{
    const struct bf *f;

    pthread_rwlock_rdlock(&sf->lock);
    f = sf->state == STORE_READY ? sf->bf : NULL;
    pthread_rwlock_unlock(&sf->lock);
    return f;
}

uint64_t store_filter_version(struct store_filter *sf)
{
    return atomic_load(&sf->version);
}

/* ---- snapshots ---- */

/* Write snapshot-C (C from a WAL rotation), then drop the WAL and the
 * snapshots it makes redundant.  force: even if nothing changed. */
static int filter_snapshot(struct store_filter *sf, bool force, char *err)
{
    char path[PATH_LEN], e2[STORE_ERRLEN];
    struct bf *copy = NULL;
    struct wal *w;
    uint64_t upto;
    int rc;

    pthread_mutex_lock(&sf->snap_mu);
    filter_lock_for_copy(sf);
    if (sf->state != STORE_READY) {
        pthread_rwlock_unlock(&sf->lock);
        pthread_mutex_unlock(&sf->snap_mu);
        return 0;   /* nothing to snapshot */
    }
    w = sf->wal;
    if (!force && wal_last_seq(w) == sf->snap_seq) {
        pthread_rwlock_unlock(&sf->lock);
        pthread_mutex_unlock(&sf->snap_mu);
        return 0;
    }
    /* Rotate first, copy second: every record <= upto set its bits before
     * it was submitted, hence before this copy starts. */
    rc = wal_rotate(w, &upto, e2);
    if (rc == 0 && !(copy = filter_copy_locked(sf, e2)))
        rc = -ENOMEM;
    pthread_rwlock_unlock(&sf->lock);
    if (rc < 0) {
        seterr(err, "snapshot of '%s' failed: %s", sf->name, e2);
        if (wal_error(w))
            filter_wal_failed(sf, w, NULL);
        pthread_mutex_unlock(&sf->snap_mu);
        return rc;
    }
    strfmt(path, sizeof(path), "%s/snapshot-%016" PRIx64 ".bf", sf->path,
             upto);
    rc = bf_file_save(copy, path, e2);
    bf_destroy(copy);
    if (rc < 0) {
        /* The old snapshot and every WAL segment are still there; try again
         * after an interval rather than at every tick. */
        seterr(err, "snapshot of '%s' failed: %s", sf->name, e2);
        sf->snap_time_ms = now_ms();
        pthread_mutex_unlock(&sf->snap_mu);
        return rc;
    }
    sf->snap_seq = upto;
    sf->snap_time_ms = now_ms();
    snap_prune(sf->path, upto);
    if ((rc = wal_discard(sf->path, upto)) < 0)
        log_warn("store: cannot discard WAL of '%s' up to %" PRIu64 ": %s",
                 sf->name, upto, strerror(-rc));
    pthread_mutex_unlock(&sf->snap_mu);
    return 0;
}

int store_filter_snapshot(struct store_filter *sf, char *err)
{
    return filter_snapshot(sf, true, err);
}

/* References to every filter in the catalog (dropping ones excluded). */
static struct store_filter **catalog_refs(struct store *s, size_t *n)
{
    struct store_filter **v;
    size_t k = 0;

    pthread_mutex_lock(&s->mu);
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

int store_snapshot_now(struct store *s, char *err)
{
    size_t n;
    struct store_filter **v = catalog_refs(s, &n);
    int rc = 0;

    if (!v)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++) {
        int r = filter_snapshot(v[i], false, rc ? NULL : err);
        if (r < 0 && rc == 0)
            rc = r;
        store_put(v[i]);
    }
    free(v);
    return rc;
}

/* Does a filter need a snapshot: its WAL grew past the limit, or it changed
 * and the interval passed. */
static bool filter_due(struct store_filter *sf, uint64_t now)
{
    struct store *s = sf->s;
    bool due = false;

    pthread_mutex_lock(&sf->snap_mu);
    pthread_rwlock_rdlock(&sf->lock);
    if (sf->state == STORE_READY)
        due = wal_last_seq(sf->wal) != sf->snap_seq &&
              (wal_bytes(sf->wal) >= s->wal_bytes ||
               now - sf->snap_time_ms >= s->interval_ms);
    pthread_rwlock_unlock(&sf->lock);
    pthread_mutex_unlock(&sf->snap_mu);
    return due;
}

/* Is a filter FAILED by an I/O error and due for another recovery? */
static bool filter_retry_due(struct store_filter *sf, uint64_t now)
{
    bool due;

    pthread_rwlock_rdlock(&sf->lock);
    due = sf->state == STORE_FAILED && sf->retry &&
          now - sf->failed_ms >= sf->s->retry_ms;
    pthread_rwlock_unlock(&sf->lock);
    return due;
}

static void *snapshot_main(void *arg)
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

        size_t n;
        struct store_filter **v = catalog_refs(s, &n);
        for (size_t i = 0; v && i < n; i++) {
            char err[STORE_ERRLEN];
            if (filter_due(v[i], now_ms()) &&
                filter_snapshot(v[i], false, err) < 0)
                log_warn("store: %s", err);
            if (filter_retry_due(v[i], now_ms()) &&
                store_filter_recover(v[i], err) == 0)
                log_info("store: filter '%s' recovered after a write error",
                         v[i]->name);
            store_put(v[i]);
        }
        free(v);
        pthread_mutex_lock(&s->tmu);
    }
    pthread_mutex_unlock(&s->tmu);
    return NULL;
}

/* ---- open and close ---- */

/* Sweep dot directories (unfinished creations and drops) and load every
 * filter directory. */
static int store_scan(struct store *s, char *err)
{
    DIR *d = opendir(s->dir);
    struct dirent *de;
    int rc = 0;

    if (!d) {
        rc = -errno;
        seterr(err, "cannot read %s: %s", s->dir, strerror(-rc));
        return rc;
    }
    while ((de = readdir(d))) {
        char path[PATH_LEN];
        struct stat st;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        strfmt(path, sizeof(path), "%s/%s", s->dir, de->d_name);
        if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
            continue;
        if (!strncmp(de->d_name, ".creating-", 10) ||
            !strncmp(de->d_name, ".dropped-", 9)) {
            rm_rf(path);
            continue;
        }
        if (store_name_check(de->d_name, NULL) < 0)
            continue;
        struct store_filter *sf = filter_new(s, de->d_name);
        if (!sf || catalog_add(s, sf) < 0) {
            if (sf)
                filter_free(sf);
            seterr(err, "out of memory");
            rc = -ENOMEM;
            break;
        }
    }
    closedir(d);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < s->n; i++) {
        pthread_mutex_lock(&s->v[i]->snap_mu);
        filter_load(s->v[i], NULL);   /* FAILED filters stay listed */
        pthread_mutex_unlock(&s->v[i]->snap_mu);
    }
    return 0;
}

struct store *store_open(const struct store_options *o, char *err)
{
    struct store *s = NULL;
    char path[PATH_LEN];

    if (!o || !o->dir || !o->dir[0]) {
        seterr(err, "no data directory given");
        return NULL;
    }
    if (strlen(o->dir) > PATH_LEN - 512) {
        seterr(err, "data directory path is too long");
        return NULL;
    }
    if (o->durability != STORE_DURABLE_FSYNC &&
        o->durability != STORE_DURABLE_NONE) {
        seterr(err, "unknown durability mode %d", o->durability);
        return NULL;
    }
    if (mkdir(o->dir, 0755) < 0 && errno != EEXIST) {
        seterr(err, "cannot create data directory %s: %s", o->dir,
               strerror(errno));
        return NULL;
    }
    if (!(s = calloc(1, sizeof(*s))) || !(s->dir = strdup(o->dir))) {
        seterr(err, "out of memory");
        free(s);
        return NULL;
    }
    s->lock_fd = -1;
    s->durability = o->durability;
    s->interval_ms = o->snapshot_interval_ms ? o->snapshot_interval_ms
                                             : DEFAULT_INTERVAL_MS;
    s->wal_bytes = o->snapshot_wal_bytes ? o->snapshot_wal_bytes
                                         : DEFAULT_WAL_BYTES;
    s->retry_ms = o->recover_retry_ms ? o->recover_retry_ms
                                      : DEFAULT_RETRY_MS;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->tmu, NULL);
    pthread_cond_init(&s->tcv, NULL);

    strfmt(path, sizeof(path), "%s/LOCK", s->dir);
    s->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (s->lock_fd < 0) {
        seterr(err, "cannot open %s: %s", path, strerror(errno));
        goto fail;
    }
    if (flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        seterr(err, "data directory %s is in use by another process (%s)",
               s->dir, strerror(errno));
        goto fail;
    }
    if (store_scan(s, err) < 0)
        goto fail;
    if (pthread_create(&s->thread, NULL, snapshot_main, s) != 0) {
        seterr(err, "cannot start the snapshot thread");
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
        /* A final snapshot makes the next start quick. */
        store_snapshot_now(s, NULL);
    }
    for (size_t i = 0; i < s->n; i++)
        store_put(s->v[i]);
    free(s->v);
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->tmu);
    pthread_cond_destroy(&s->tcv);
    free(s->dir);
    free(s);
}
