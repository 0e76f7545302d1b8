/* store_filter: one filter of the store: recovery from its snapshot and
 * WAL, data operations, imports, copies and snapshots.  See store.h for the
 * ordering rule between snapshots and the WAL, store_internal.h for locks.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "store_internal.h"
#include "wal.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "WAL payloads store struct bf_hash as is: little-endian hosts only"
#endif

struct store_filter *store__filter_new(struct store *s, const char *name)
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
    atomic_init(&sf->source_version, 0);
    pthread_mutex_init(&sf->snap_mu, NULL);
    pthread_mutex_init(&sf->pages_mu, NULL);
    pthread_mutex_init(&sf->write_mu, NULL);
    pthread_rwlockattr_init(&a);
    pthread_rwlockattr_setkind_np(
        &a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&sf->lock, &a);
    pthread_rwlockattr_destroy(&a);
    sf->state = STORE_RECOVERING;
    return sf;
}

void store__filter_free(struct store_filter *sf)
{
    wal_close(sf->wal);
    bf_destroy(sf->bf);
    store__pages_free(sf->pages);   /* the tracking dies with the filter */
    pthread_mutex_destroy(&sf->snap_mu);
    pthread_mutex_destroy(&sf->pages_mu);
    pthread_mutex_destroy(&sf->write_mu);
    pthread_rwlock_destroy(&sf->lock);
    free(sf->name);
    free(sf->path);
    free(sf);
}

void store_put(struct store_filter *sf)
{
    if (sf && atomic_fetch_sub(&sf->refs, 1) == 1)
        store__filter_free(sf);
}

void store__raise(_Atomic uint64_t *a, uint64_t v)
{
    uint64_t cur = atomic_load(a);

    while (cur < v && !atomic_compare_exchange_weak(a, &cur, v))
        ;
}

int store__state_errno(enum store_state st)
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

void store__state_err(struct store_filter *sf, char *err)
{
    switch (sf->state) {
    case STORE_RECOVERING:
        errmsg_set(err, "filter '%s' is recovering; retry shortly",
                      sf->name);
        break;
    case STORE_DROPPED:
        errmsg_set(err, "filter '%s' was dropped", sf->name);
        break;
    case STORE_FAILED:
        errmsg_set(err, "filter '%s' is not served: %s", sf->name, sf->why);
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
        sf->failed_ms = store__now_ms();
        store__strfmt(sf->why, sizeof(sf->why), "%s; writes are refused until "
                      "the filter is recovered", wal_error_text(w));
        log_error("store: filter '%s' failed: %s", sf->name, sf->why);
    }
    errmsg_set(err, "write to filter '%s' is not durable: %s", sf->name,
                  wal_error_text(w));
    pthread_rwlock_unlock(&sf->lock);
}

void store__filter_install(struct store_filter *sf, struct bf *f,
                           struct wal *w)
{
    pthread_rwlock_wrlock(&sf->lock);
    sf->bf = f;
    sf->wal = w;
    sf->exact = bf_kind(f) == BF_KIND_COUNTING ||
                bf_kind(f) == BF_KIND_SCALABLE;
    /* Mutations are serialized by write_mu, so plain stores suffice. */
    bf_set_exclusive(f, true);
    sf->state = STORE_READY;
    sf->why[0] = 0;
    sf->retry = false;
    pthread_rwlock_unlock(&sf->lock);
}

const char *store_filter_name(const struct store_filter *sf)
{
    return sf->name;
}

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
        char path[STORE_PATH_LEN];
        if (v[i].seq >= seq)
            continue;
        store__strfmt(path, sizeof(path), "%s/%s", dir, v[i].name);
        unlink(path);
    }
    free(v);
}

/* OR len bytes of words at byte offset off of layer `layer` of f.  The
 * caller has checked the geometry (pages_check); the writer is exclusive. */
static void pages_or_one(struct bf *f, uint32_t layer, uint64_t off,
                         const uint8_t *data, size_t len)
{
    uint64_t *body = bf_layer_body(f, layer) + off / 8;

    for (size_t i = 0; i < len / 8; i++) {
        uint64_t w;
        memcpy(&w, data + 8 * i, 8);   /* payloads are not aligned */
        if (w)
            __atomic_fetch_or(&body[i], w, __ATOMIC_RELAXED);
    }
}

/* Is a page inside f's geometry (and f a kind whose bits OR)?  Returns 0,
 * -EOPNOTSUPP or -EINVAL. */
static int pages_check(const struct bf *f, uint32_t layer, uint64_t off,
                       uint64_t len)
{
    struct bf_layer_info li;

    if (bf_kind(f) != BF_KIND_BLOCKED && bf_kind(f) != BF_KIND_CLASSIC)
        return -EOPNOTSUPP;
    if (bf_layer_info(f, layer, &li) < 0 || off % 8 || len % 8 ||
        off > li.body_bytes || len > li.body_bytes - off)
        return -EINVAL;
    return 0;
}

/* Replay a WAL_REC_PAGES payload into f. */
static int replay_pages(struct bf *f, const uint8_t *p, uint64_t len)
{
    while (len) {
        uint32_t layer, plen;
        uint64_t off;
        if (len < 16)
            return -EBADMSG;
        memcpy(&layer, p, 4);
        memcpy(&plen, p + 4, 4);
        memcpy(&off, p + 8, 8);
        if (len - 16 < plen || pages_check(f, layer, off, plen) < 0)
            return -EBADMSG;
        pages_or_one(f, layer, off, p + 16, plen);
        p += 16 + (uint64_t)plen;
        len -= 16 + (uint64_t)plen;
    }
    return 0;
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
    case WAL_REC_PAGES:
        return replay_pages(f, payload, len);
    default:
        return -EBADMSG;
    }
}

/* Load a filter from its directory: newest loadable snapshot + WAL replay.
 * Called with snap_mu held and the filter in RECOVERING with no bf/wal;
 * leaves it READY or FAILED. */
int store__filter_load(struct store_filter *sf, char *err)
{
    struct snap_ent *v = NULL;
    size_t n = 0, i;
    struct bf *f = NULL;
    struct wal *w = NULL;
    struct wal_recovery rec;
    char why[STORE_ERRLEN] = "", e2[STORE_ERRLEN], path[STORE_PATH_LEN];
    uint64_t covered = 0;
    int rc;

    if ((rc = snap_list(sf->path, true, &v, &n)) < 0) {
        store__strfmt(why, sizeof(why), "cannot list %s: %s", sf->path,
                      strerror(-rc));
        goto fail;
    }
    for (i = 0; i < n && !f; i++) {
        store__strfmt(path, sizeof(path), "%s/%s", sf->path, v[i].name);
        f = bf_file_load(path, e2, NULL);
        if (f)
            covered = v[i].seq;
        else if (!why[0])
            store__strfmt(why, sizeof(why), "snapshot %s is unusable: %.160s",
                          path,
                          e2);
    }
    if (!f) {
        rc = -EBADMSG;
        if (!why[0])
            store__strfmt(why, sizeof(why), "no snapshot in %s", sf->path);
        goto fail;
    }
    if (why[0])
        log_warn("store: %s; trying the older snapshot-%016" PRIx64 ".bf with "
                 "the WAL after it", why, covered);
    bf_set_exclusive(f, true);
    rc = wal_recover(sf->path, covered, replay_one, f, &rec, e2);
    if (rc < 0) {
        size_t l = strlen(why);
        store__strfmt(why + l, sizeof(why) - l, "%s%s", l ? "; then " : "",
                      e2);
        goto fail;
    }
    if (rec.truncated)
        log_warn("store: filter '%s': cut a torn WAL tail of %" PRIu64
                 " bytes (never acknowledged)", sf->name, rec.truncated);
    if (!(w = wal_open(sf->path, rec.next_seq, sf->s->durability, e2))) {
        rc = -EIO;
        store__strfmt(why, sizeof(why), "%s", e2);
        goto fail;
    }
    free(v);
    store__filter_install(sf, f, w);
    store__raise(&sf->version, rec.next_seq - 1);
    sf->snap_seq = covered;
    sf->snap_time_ms = store__now_ms();
    log_info("store: filter '%s' ready: snapshot seq %" PRIu64 ", %" PRIu64
             " WAL records replayed", sf->name, covered, rec.records);
    return 0;
fail:
    free(v);
    bf_destroy(f);
    pthread_rwlock_wrlock(&sf->lock);
    sf->state = STORE_FAILED;
    store__strfmt(sf->why, sizeof(sf->why), "%s", why);
    /* Damaged files stay refused; a disk that failed may come back. */
    sf->retry = rc != -EBADMSG;
    sf->failed_ms = store__now_ms();
    pthread_rwlock_unlock(&sf->lock);
    log_error("store: filter '%s' is not served: %s", sf->name, why);
    errmsg_set(err, "filter '%s' is not served: %s", sf->name, why);
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
        store__state_err(sf, err);
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
    rc = store__filter_load(sf, err);
    pthread_mutex_unlock(&sf->snap_mu);
    return rc;
}

enum store_state store_filter_state(struct store_filter *sf, char *why)
{
    enum store_state st;

    pthread_rwlock_rdlock(&sf->lock);
    st = sf->state;
    if (why)
        store__strfmt(why, STORE_ERRLEN, "%s",
                      st == STORE_FAILED ? sf->why : "");
    pthread_rwlock_unlock(&sf->lock);
    return st;
}

/* Apply a batch of hashes and log it.  Bits first, then the WAL record (the
 * order store.h relies on), both under write_mu: one writer at a time lets
 * the engine use plain stores, and the WAL order is the apply order.  The
 * wait for durability happens outside write_mu, so batches share fsyncs,
 * but under the shared lock, so a recovery cannot swap the WAL meanwhile. */
static int filter_mutate(struct store_filter *sf, uint32_t type,
                         const struct bf_hash *h, size_t n, bool *out,
                         char *err)
{
    struct wal *w;
    uint64_t seq;
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_errno(sf->state)) < 0) {
        store__state_err(sf, err);
        pthread_rwlock_unlock(&sf->lock);
        return rc;
    }
    if (type == WAL_REC_REMOVE && bf_kind(sf->bf) != BF_KIND_COUNTING) {
        errmsg_set(err, "filter '%s' is a %s filter; only counting filters "
                      "support remove", sf->name,
                      bf_kind_name(bf_kind(sf->bf)));
        pthread_rwlock_unlock(&sf->lock);
        return -EOPNOTSUPP;
    }
    if (n == 0) {
        pthread_rwlock_unlock(&sf->lock);
        return 0;
    }
    w = sf->wal;
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
    pthread_mutex_unlock(&sf->write_mu);
    if (rc == 0)
        rc = wal_wait(w, seq);
    pthread_rwlock_unlock(&sf->lock);
    if (rc == -EIO) {
        filter_wal_failed(sf, w, err);
        return rc;
    }
    if (rc < 0) {
        errmsg_set(err, "cannot log the write to '%s': %s", sf->name,
                      strerror(-rc));
        return rc;
    }
    store__raise(&sf->version, seq);
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
    if ((rc = store__state_errno(sf->state)) == 0)
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
        errmsg_set(err, "cannot buffer an import of %" PRIu64 " bytes",
                      size);
        return -ENOMEM;
    }
    m.cap = size;
    if ((rc = bf_file_write(src, membuf_write, &m)) < 0 || m.len != size) {
        errmsg_set(err, "cannot serialize the imported filter");
        free(m.p);
        return rc < 0 ? rc : -EINVAL;
    }
    pthread_rwlock_wrlock(&sf->lock);   /* bf_merge_from needs exclusion */
    if ((rc = store__state_errno(sf->state)) < 0) {
        store__state_err(sf, err);
        goto out;
    }
    if ((field = bf_mismatch(sf->bf, src))) {
        errmsg_set(err, "cannot import into '%s': the filters differ in %s",
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
        sf->failed_ms = store__now_ms();
        store__strfmt(sf->why, sizeof(sf->why), "%s; writes are refused "
                      "until the filter is recovered",
                      wal_error_text(sf->wal));
        errmsg_set(err, "import into '%s' is not durable: %s", sf->name,
                      wal_error_text(sf->wal));
    } else if (rc < 0) {
        errmsg_set(err, "cannot log the import into '%s': %s", sf->name,
                      strerror(-rc));
    } else {
        store__raise(&sf->version, seq);
    }
out:
    pthread_rwlock_unlock(&sf->lock);
    free(m.p);
    return rc;
}

int store_or_pages(struct store_filter *sf, const struct store_page *pages,
                   size_t n, char *err)
{
    uint8_t *rec = NULL, *q;
    uint64_t size = 0, seq;
    struct wal *w;
    int rc;

    for (size_t i = 0; i < n; i++) {
        if (pages[i].len > UINT32_MAX) {
            errmsg_set(err, "page %zu is too large", i);
            return -EINVAL;
        }
        size += 16 + pages[i].len;
    }
    if (size > WAL_MAX_PAYLOAD || !(rec = malloc(size ? size : 1))) {
        errmsg_set(err, "cannot buffer %" PRIu64 " bytes of pages", size);
        return -ENOMEM;
    }
    q = rec;
    for (size_t i = 0; i < n; i++) {
        uint32_t plen = (uint32_t)pages[i].len;
        memcpy(q, &pages[i].layer, 4);
        memcpy(q + 4, &plen, 4);
        memcpy(q + 8, &pages[i].offset, 8);
        memcpy(q + 16, pages[i].data, plen);
        q += 16 + (uint64_t)plen;
    }
    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_errno(sf->state)) < 0) {
        store__state_err(sf, err);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        rc = pages_check(sf->bf, pages[i].layer, pages[i].offset,
                         pages[i].len);
        if (rc == -EOPNOTSUPP) {
            errmsg_set(err, "filter '%s' is a %s filter; only blocked and "
                          "classic filters merge page by page", sf->name,
                          bf_kind_name(bf_kind(sf->bf)));
            goto out;
        }
        if (rc < 0) {
            errmsg_set(err, "page %zu (layer %" PRIu32 ", offset %" PRIu64
                          ", %zu bytes) is outside filter '%s'", i,
                          pages[i].layer, pages[i].offset, pages[i].len,
                          sf->name);
            goto out;
        }
    }
    if (n == 0)
        goto out;
    w = sf->wal;
    pthread_mutex_lock(&sf->write_mu);
    for (size_t i = 0; i < n; i++)
        pages_or_one(sf->bf, pages[i].layer, pages[i].offset, pages[i].data,
                     pages[i].len);
    rc = wal_submit(w, WAL_REC_PAGES, rec, size, &seq);
    pthread_mutex_unlock(&sf->write_mu);
    if (rc == 0)
        rc = wal_wait(w, seq);
    pthread_rwlock_unlock(&sf->lock);
    free(rec);
    if (rc == -EIO) {
        filter_wal_failed(sf, w, err);
        return rc;
    }
    if (rc < 0) {
        errmsg_set(err, "cannot log the pages merged into '%s': %s",
                      sf->name, strerror(-rc));
        return rc;
    }
    store__raise(&sf->version, seq);
    return 0;
out:
    pthread_rwlock_unlock(&sf->lock);
    free(rec);
    return rc;
}

/* A copy of the live filter; the caller holds filter_lock_for_copy. */
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

/* Queries go on during a copy.  The exact kinds also stop mutations
 * (write_mu) so the copy is exactly "every record submitted so far". */
static void filter_lock_for_copy(struct store_filter *sf)
{
    pthread_rwlock_rdlock(&sf->lock);
    if (sf->exact)
        pthread_mutex_lock(&sf->write_mu);
}

static void filter_unlock_for_copy(struct store_filter *sf)
{
    if (sf->exact)
        pthread_mutex_unlock(&sf->write_mu);
    pthread_rwlock_unlock(&sf->lock);
}

struct bf *store_filter_copy(struct store_filter *sf)
{
    struct bf *c = NULL;

    filter_lock_for_copy(sf);
    if (sf->state == STORE_READY)
        c = filter_copy_locked(sf, NULL);
    filter_unlock_for_copy(sf);
    return c;
}

int store_export(struct store_filter *sf, bf_file_writer w, void *ctx)
{
    struct bf *c = store_filter_copy(sf);
    int rc;

    if (!c) {
        enum store_state st = store_filter_state(sf, NULL);
        return st == STORE_READY ? -ENOMEM : store__state_errno(st);
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

int store_filter_inspect(struct store_filter *sf,
                         void (*fn)(const struct bf *f, void *ctx), void *ctx)
{
    int rc;

    pthread_rwlock_rdlock(&sf->lock);
    if ((rc = store__state_errno(sf->state)) == 0)
        fn(sf->bf, ctx);
    pthread_rwlock_unlock(&sf->lock);
    return rc;
}

uint64_t store_filter_version(struct store_filter *sf)
{
    return atomic_load(&sf->version);
}

/* Write snapshot-C (C from a WAL rotation), then drop the WAL and the
 * snapshots it makes redundant.  force: even if nothing changed. */
int store__filter_snapshot(struct store_filter *sf, bool force, char *err)
{
    char path[STORE_PATH_LEN], e2[STORE_ERRLEN];
    struct bf *copy = NULL;
    struct wal *w;
    uint64_t upto;
    int rc;

    pthread_mutex_lock(&sf->snap_mu);
    filter_lock_for_copy(sf);
    if (sf->state != STORE_READY) {
        filter_unlock_for_copy(sf);
        pthread_mutex_unlock(&sf->snap_mu);
        return 0;   /* nothing to snapshot */
    }
    w = sf->wal;
    if (!force && wal_last_seq(w) == sf->snap_seq) {
        filter_unlock_for_copy(sf);
        pthread_mutex_unlock(&sf->snap_mu);
        return 0;
    }
    /* Rotate first, copy second: every record <= upto set its bits before
     * it was submitted, hence before this copy starts. */
    rc = wal_rotate(w, &upto, e2);
    if (rc == 0 && !(copy = filter_copy_locked(sf, e2)))
        rc = -ENOMEM;
    filter_unlock_for_copy(sf);
    if (rc < 0) {
        errmsg_set(err, "snapshot of '%s' failed: %s", sf->name, e2);
        if (wal_error(w))
            filter_wal_failed(sf, w, NULL);
        pthread_mutex_unlock(&sf->snap_mu);
        return rc;
    }
    store__strfmt(path, sizeof(path), "%s/snapshot-%016" PRIx64 ".bf",
                  sf->path,
                  upto);
    rc = bf_file_save(copy, path, e2);
    bf_destroy(copy);
    if (rc < 0) {
        /* The old snapshot and every WAL segment are still there; try again
         * after an interval rather than at every tick. */
        errmsg_set(err, "snapshot of '%s' failed: %s", sf->name, e2);
        sf->snap_time_ms = store__now_ms();
        pthread_mutex_unlock(&sf->snap_mu);
        return rc;
    }
    sf->snap_seq = upto;
    sf->snap_time_ms = store__now_ms();
    snap_prune(sf->path, upto);
    if ((rc = wal_discard(sf->path, upto)) < 0)
        log_warn("store: cannot discard WAL of '%s' up to %" PRIu64 ": %s",
                 sf->name, upto, strerror(-rc));
    pthread_mutex_unlock(&sf->snap_mu);
    return 0;
}

int store_filter_snapshot(struct store_filter *sf, char *err)
{
    return store__filter_snapshot(sf, true, err);
}

/* Does a filter need a snapshot: its WAL grew past the limit, or it changed
 * and the interval passed. */
bool store__filter_due(struct store_filter *sf, uint64_t now)
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
bool store__filter_retry_due(struct store_filter *sf, uint64_t now)
{
    bool due;

    pthread_rwlock_rdlock(&sf->lock);
    due = sf->state == STORE_FAILED && sf->retry &&
          now - sf->failed_ms >= sf->s->retry_ms;
    pthread_rwlock_unlock(&sf->lock);
    return due;
}
