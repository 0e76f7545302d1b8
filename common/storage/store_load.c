/* store_load: loading filters from their checkpoints and the node log, at
 * store_open (every filter, one pass over the log) and on recovery (one
 * filter, store__filter_load).  See store.h, "Recovery".
 *
 * Each filter being loaded has a replay entry: its incarnation id, the seq
 * C and LSN L of its checkpoint, and the next seq it expects.  A record is
 * applied to the entry whose id it carries when its seq is the expected
 * one; records of unknown ids (dropped filters) and records <= C are
 * skipped; a seq past the expected one is a gap and fails the entry.
 * Damage whose owner is known fails that entry only; damage that hides the
 * owners (LSNs [a, b) lost) fails an entry when it may have held its
 * records: b > L + 1 (not covered by the checkpoint) and no record of the
 * entry was met at LSN >= b (a later record in sequence proves the entry
 * lost nothing there).  The part of the log before its first segment, and
 * after its end up to the highest checkpoint LSN, count as lost.
 *
 * In a copy of a group of N > 1 (store.h, in_group), an entry of a kind
 * whose pages merge (blocked, classic: OR is idempotent and commutes) that
 * the rules above would fail for lost records is lenient instead: it takes
 * every record of its id left in the log, in any order, and is installed
 * counted as cut, for its node to fill from the group (SYNCING).
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "store_internal.h"
#include "wal.h"

struct ckpt_ent {
    uint64_t id, seq, lsn;
    char name[64];
};

void store__ckpt_path(char *out, size_t len, const char *dir, uint64_t id,
                      uint64_t seq, uint64_t lsn)
{
    store__strfmt(out, len, "%s/ckpt-%016" PRIx64 "-%016" PRIx64 "-%016"
                  PRIx64 ".bf", dir, id, seq, lsn);
}

static bool hex16(const char *p, uint64_t *v)
{
    char buf[17], *end;

    for (int i = 0; i < 16; i++)
        if (!strchr("0123456789abcdef", p[i]) || !p[i])
            return false;
    memcpy(buf, p, 16);
    buf[16] = 0;
    *v = strtoull(buf, &end, 16);
    return end == buf + 16;
}

/* "ckpt-" I "-" C "-" L ".bf": 5 + 16 + 1 + 16 + 1 + 16 + 3 = 58 chars. */
static bool ckpt_parse_name(const char *name, struct ckpt_ent *e)
{
    if (strlen(name) != 58 || strncmp(name, "ckpt-", 5) != 0 ||
        name[21] != '-' || name[38] != '-' || strcmp(name + 55, ".bf") != 0)
        return false;
    if (!hex16(name + 5, &e->id) || !hex16(name + 22, &e->seq) ||
        !hex16(name + 39, &e->lsn) || e->id == 0)
        return false;
    memcpy(e->name, name, 59);
    return true;
}

static int ckpt_cmp_desc(const void *a, const void *b)
{
    const struct ckpt_ent *x = a, *y = b;

    if (x->seq != y->seq)
        return x->seq > y->seq ? -1 : 1;
    return x->lsn > y->lsn ? -1 : x->lsn < y->lsn;
}

/* Checkpoints in dir, newest first.  clean: also remove temp files of
 * checkpoint writes a crash interrupted (only while nothing writes to
 * dir). */
static int ckpt_list(const char *dir, bool clean, struct ckpt_ent **out,
                     size_t *n)
{
    DIR *d = opendir(dir);
    struct ckpt_ent *v = NULL, e;
    size_t len = 0, cap = 0;
    struct dirent *de;

    if (!d)
        return -errno;
    while ((de = readdir(d))) {
        if (clean && !strncmp(de->d_name, "ckpt-", 5) &&
            strstr(de->d_name, ".bf.tmp.")) {
            unlinkat(dirfd(d), de->d_name, 0);
            continue;
        }
        if (!ckpt_parse_name(de->d_name, &e))
            continue;
        if (len == cap) {
            cap = cap ? 2 * cap : 4;
            struct ckpt_ent *nv = realloc(v, cap * sizeof(*v));
            if (!nv) {
                free(v);
                closedir(d);
                return -ENOMEM;
            }
            v = nv;
        }
        v[len++] = e;
    }
    closedir(d);
    if (len)
        qsort(v, len, sizeof(*v), ckpt_cmp_desc);
    *out = v;
    *n = len;
    return 0;
}

bool store__has_checkpoint(const char *dir)
{
    struct ckpt_ent *v = NULL;
    size_t n = 0;

    if (ckpt_list(dir, false, &v, &n) < 0)
        return false;
    free(v);
    return n > 0;
}

void store__ckpt_prune(const char *dir, uint64_t id, uint64_t seq,
                       uint64_t lsn)
{
    struct ckpt_ent *v;
    size_t n;

    if (ckpt_list(dir, false, &v, &n) < 0)
        return;
    for (size_t i = 0; i < n; i++) {
        char path[STORE_PATH_LEN];
        if (v[i].id == id && v[i].seq == seq && v[i].lsn == lsn)
            continue;
        store__strfmt(path, sizeof(path), "%s/%s", dir, v[i].name);
        unlink(path);
    }
    free(v);
}

/* ---- replay ---- */

struct replay_ent {
    uint64_t id;
    struct store_filter *sf;
    struct bf *f;
    uint64_t ckpt_seq, ckpt_lsn;
    uint64_t expect;             /* next seq to apply */
    uint64_t last_lsn;           /* of the last record of the entry met */
    uint64_t records;
    int rc;                      /* 0, or why the entry failed */
    char why[STORE_ERRLEN];
    bool lenient;                /* in_group and a kind whose pages merge */
    bool lost;                   /* lenient: records were lost (why) */
};

struct lost {
    uint64_t from, to;
    char where[STORE_ERRLEN];
};

struct replay {
    struct replay_ent *v;        /* sorted by id */
    size_t n;
    struct lost *lost;
    size_t nlost, caplost;
};

static int ent_cmp(const void *a, const void *b)
{
    const struct replay_ent *x = a, *y = b;

    return x->id < y->id ? -1 : x->id > y->id;
}

static struct replay_ent *replay_find(struct replay *r, uint64_t id)
{
    struct replay_ent key = {.id = id};

    return r->n ? bsearch(&key, r->v, r->n, sizeof(*r->v), ent_cmp) : NULL;
}

static void ent_fail(struct replay_ent *e, int rc, const char *why)
{
    if (e->rc)
        return;
    e->rc = rc;
    store__strfmt(e->why, sizeof(e->why), "%s", why);
}

/* The log lost records of e: it fails, or when lenient goes on without
 * them. */
static void ent_lose(struct replay_ent *e, const char *why)
{
    if (!e->lenient) {
        ent_fail(e, -EBADMSG, why);
    } else if (!e->lost && !e->rc) {
        e->lost = true;
        store__strfmt(e->why, sizeof(e->why), "%s", why);
    }
}

static int on_record(void *ctx, const struct wal_record *rec)
{
    struct replay *r = ctx;
    struct replay_ent *e = replay_find(r, rec->id);
    char why[STORE_ERRLEN];
    int rc;

    if (!e || e->rc)
        return 0;   /* another incarnation's, or a failed filter's */
    e->last_lsn = rec->lsn;
    if (rec->seq <= e->ckpt_seq)
        return 0;   /* in the checkpoint */
    if (rec->seq != e->expect) {
        if (rec->seq > e->expect)
            store__strfmt(why, sizeof(why), "the write-ahead log lacks "
                          "records %" PRIu64 "..%" PRIu64 " of this filter "
                          "(record %" PRIu64 " is at LSN %" PRIu64 ")%s%.160s",
                          e->expect, rec->seq - 1, rec->seq, rec->lsn,
                          r->nlost ? "; " : "",
                          r->nlost ? r->lost[r->nlost - 1].where : "");
        else
            store__strfmt(why, sizeof(why), "record %" PRIu64 " of this "
                          "filter at LSN %" PRIu64 " of the write-ahead log "
                          "is out of sequence (%" PRIu64 " expected)",
                          rec->seq, rec->lsn, e->expect);
        ent_lose(e, why);
        if (e->rc)
            return 0;
    }
    if ((rc = store__replay_apply(e->f, rec->seq, rec->type, rec->payload,
                                  rec->len)) < 0) {
        store__strfmt(why, sizeof(why), "record %" PRIu64 " at LSN %" PRIu64
                      " of the write-ahead log cannot be applied: %s",
                      rec->seq, rec->lsn, strerror(-rc));
        ent_fail(e, -EBADMSG, why);
        return 0;
    }
    if (rec->seq >= e->expect)
        e->expect = rec->seq + 1;
    e->records++;
    return 0;
}

static void add_lost(struct replay *r, uint64_t from, uint64_t to,
                     const char *where)
{
    if (r->nlost == r->caplost) {
        size_t cap = r->caplost ? 2 * r->caplost : 8;
        struct lost *nv = realloc(r->lost, cap * sizeof(*nv));
        if (!nv) {
            /* Cannot remember it: count everything as lost. */
            for (size_t i = 0; i < r->n; i++)
                ent_fail(&r->v[i], -ENOMEM, "out of memory while reading "
                         "damage in the write-ahead log");
            return;
        }
        r->lost = nv;
        r->caplost = cap;
    }
    r->lost[r->nlost].from = from;
    r->lost[r->nlost].to = to;
    store__strfmt(r->lost[r->nlost].where, STORE_ERRLEN, "%s", where);
    r->nlost++;
}

static void on_damage(void *ctx, const struct wal_damage *d)
{
    struct replay *r = ctx;

    log_error("store: %s: acknowledged records may be lost", d->where);
    if (d->id) {
        struct replay_ent *e = replay_find(r, d->id);
        if (e && d->seq > e->ckpt_seq) {
            ent_lose(e, d->where);
            if (d->seq >= e->expect)
                e->expect = d->seq + 1;   /* lenient: its seq is taken */
        }
        return;
    }
    add_lost(r, d->from, d->to, d->where);
}

static const struct wal_scan_ops replay_ops = {on_record, on_damage};

/* Apply the rule for lost LSNs once the scan is over (see the top). */
static void replay_finish(struct replay *r)
{
    for (size_t i = 0; i < r->n; i++) {
        struct replay_ent *e = &r->v[i];
        for (size_t k = 0; k < r->nlost && !e->rc && !e->lost; k++) {
            const struct lost *l = &r->lost[k];
            if (l->to > e->ckpt_lsn + 1 && e->last_lsn < l->to) {
                char why[STORE_ERRLEN];
                store__strfmt(why, sizeof(why), "%.150s; records of this "
                              "filter after its checkpoint (LSN %" PRIu64
                              ") may be among them", l->where, e->ckpt_lsn);
                ent_lose(e, why);
            }
        }
    }
}

static void replay_free(struct replay *r)
{
    for (size_t i = 0; i < r->n; i++)
        bf_destroy(r->v[i].f);
    free(r->v);
    free(r->lost);
}

/* Load sf's newest checkpoint that loads into e.  Returns 0 or -EBADMSG
 * (why set). */
static int load_checkpoint(struct store_filter *sf, struct replay_ent *e,
                           char *why)
{
    struct ckpt_ent *v = NULL;
    size_t n = 0;
    char e2[STORE_ERRLEN], path[STORE_PATH_LEN];
    int rc;

    why[0] = 0;
    if ((rc = ckpt_list(sf->path, true, &v, &n)) < 0) {
        store__strfmt(why, STORE_ERRLEN, "cannot list %s: %s", sf->path,
                      strerror(-rc));
        return rc;
    }
    if (n) {
        /* What the filter holds of the log even if nothing loads. */
        sf->id = v[0].id;
        atomic_store(&sf->ckpt_lsn, v[0].lsn);
    }
    for (size_t i = 0; i < n && !e->f; i++) {
        if (v[i].id != v[0].id)
            continue;   /* not this incarnation's */
        store__strfmt(path, sizeof(path), "%s/%s", sf->path, v[i].name);
        if ((e->f = bf_file_load(path, e2, NULL))) {
            e->id = v[i].id;
            e->ckpt_seq = v[i].seq;
            e->ckpt_lsn = v[i].lsn;
        } else if (!why[0]) {
            store__strfmt(why, STORE_ERRLEN, "checkpoint %s is unusable: "
                          "%.160s", path, e2);
        }
    }
    free(v);
    if (!e->f) {
        if (!why[0])
            store__strfmt(why, STORE_ERRLEN, "no checkpoint in %s", sf->path);
        return -EBADMSG;
    }
    if (why[0]) {
        log_warn("store: %s; using the older ckpt seq %" PRIu64 " with the "
                 "log after it", why, e->ckpt_seq);
        atomic_store(&sf->recovery_cut, true);
        why[0] = 0;
    }
    bf_set_exclusive(e->f, true);
    /* Replayed records stamp their pages (the next checkpoint's); the
     * pages loaded carry the checkpoint's seq, so that a puller whose
     * cursor is older, in an epoch a reload keeps, gets them. */
    if (bf_track_pages(e->f, true) < 0 ||
        (store__stamp_nonzero(e->f, e->ckpt_seq), false)) {
        bf_destroy(e->f);
        e->f = NULL;
        store__strfmt(why, STORE_ERRLEN, "no memory for the page versions "
                      "of the filter");
        return -ENOMEM;
    }
    e->expect = e->ckpt_seq + 1;
    e->sf = sf;
    e->lenient = sf->s->in_group && (bf_kind(e->f) == BF_KIND_BLOCKED ||
                                     bf_kind(e->f) == BF_KIND_CLASSIC);
    return 0;
}

/* Make the filter of e READY or FAILED as the replay left it. */
static int replay_install(struct replay_ent *e, char *err)
{
    struct store_filter *sf = e->sf;
    struct bf *f = e->f;

    e->f = NULL;
    atomic_store(&sf->ckpt_lsn, e->ckpt_lsn);
    if (e->rc) {
        bf_destroy(f);
        store__filter_fail(sf, e->why, e->rc != -EBADMSG);
        log_error("store: filter '%s' is not served: %s", sf->name, e->why);
        errmsg_set(err, "filter '%s' is not served: %s", sf->name, e->why);
        return e->rc;
    }
    sf->id = e->id;
    sf->ckpt_seq = e->ckpt_seq;
    atomic_store(&sf->ckpt_lsn, e->ckpt_lsn);
    sf->snap_time_ms = store__now_ms();
    if (store__filter_install(sf, f, e->expect) < 0) {
        errmsg_set(err, "out of memory");
        return -ENOMEM;
    }
    if (e->lost) {
        atomic_store(&sf->recovery_cut, true);
        log_error("store: filter '%s' lost acknowledged records (%s): loaded "
                  "with the rest, to be filled from the other copies of its "
                  "group before it serves reads", sf->name, e->why);
    }
    log_info("store: filter '%s' ready: checkpoint seq %" PRIu64 ", %" PRIu64
             " log records replayed", sf->name, e->ckpt_seq, e->records);
    return 0;
}

/* After a reload: can the log take the filter's writes again (a new
 * segment could be made after a failure)?  If not, FAILED, retried. */
static int log_probe(struct store_filter *sf, char *err)
{
    struct wal_waiter wt;
    int rc;

    wal_waiter_init(&wt);
    pthread_rwlock_rdlock(&sf->lock);
    if (wal_barrier(sf->stream, wal_waiter_done, &wt) < 0)
        wal_waiter_done(&wt, -ENOMEM, 0, 0);
    pthread_rwlock_unlock(&sf->lock);
    if ((rc = wal_waiter_wait(&wt)) < 0) {
        char why[STORE_ERRLEN];
        store__strfmt(why, sizeof(why), "the write-ahead log in %s cannot be "
                      "written (%s)", wal_dir(sf->s->wal), strerror(-rc));
        store__filter_fail(sf, why, true);
        errmsg_set(err, "filter '%s' is not served: %s", sf->name, why);
    }
    return rc;
}

int store__filter_load(struct store_filter *sf, char *err)
{
    struct replay r = {0};
    struct replay_ent e = {0};
    struct wal_scan_info info;
    char why[STORE_ERRLEN], e2[STORE_ERRLEN];
    int rc;

    if (store__is_legacy(sf->path) && !store__has_checkpoint(sf->path))
        return store__migrate(sf, err);
    if ((rc = load_checkpoint(sf, &e, why)) < 0) {
        store__filter_fail(sf, why, rc != -EBADMSG);
        errmsg_set(err, "filter '%s' is not served: %s", sf->name, why);
        return rc;
    }
    e.lenient = false;   /* no node hears of a reload's cut: FAILED */
    store__legacy_sweep(sf->path);
    r.v = &e;
    r.n = 1;
    if ((rc = wal_rescan(sf->s->wal, &replay_ops, &r, &info, e2)) < 0) {
        /* The log cannot be read now: an I/O error, retried. */
        ent_fail(&e, rc, e2);
    }
    if (info.first_lsn > 1)
        add_lost(&r, 0, info.first_lsn, "the write-ahead log's older "
                 "segments were removed");
    replay_finish(&r);
    rc = replay_install(&e, err);
    free(r.lost);
    if (rc == 0)
        rc = log_probe(sf, err);
    return rc;
}

/* ---- store_open ---- */

int store__load_all(struct store *s, char *err)
{
    struct replay r = {0};
    struct wal_scan_info info;
    char logdir[STORE_PATH_LEN], why[STORE_ERRLEN];
    bool *legacy = calloc(s->n ? s->n : 1, sizeof(*legacy));
    uint64_t next, max_lsn = 0;
    int rc = 0;

    if (!legacy || !(r.v = calloc(s->n ? s->n : 1, sizeof(*r.v)))) {
        free(legacy);
        errmsg_set(err, "out of memory");
        return -ENOMEM;
    }
    /* Checkpoints first; directories of earlier releases wait for the
     * log. */
    for (size_t i = 0; i < s->n; i++) {
        struct store_filter *sf = s->v[i];
        if (store__is_legacy(sf->path) && !store__has_checkpoint(sf->path)) {
            legacy[i] = true;
            continue;
        }
        struct replay_ent *e = &r.v[r.n];
        memset(e, 0, sizeof(*e));
        if ((rc = load_checkpoint(sf, e, why)) < 0) {
            store__filter_fail(sf, why, rc != -EBADMSG);
            log_error("store: filter '%s' is not served: %s", sf->name, why);
            if (atomic_load(&sf->ckpt_lsn) > max_lsn &&
                atomic_load(&sf->ckpt_lsn) != UINT64_MAX)
                max_lsn = atomic_load(&sf->ckpt_lsn);
            continue;
        }
        store__legacy_sweep(sf->path);
        if (e->ckpt_lsn > max_lsn)
            max_lsn = e->ckpt_lsn;
        r.n++;
    }
    if (r.n > 1)
        qsort(r.v, r.n, sizeof(*r.v), ent_cmp);
    for (size_t i = 1; i < r.n; i++)
        if (r.v[i].id == r.v[i - 1].id) {
            ent_fail(&r.v[i], -EBADMSG, "another filter has the same "
                     "incarnation id");
            ent_fail(&r.v[i - 1], -EBADMSG, "another filter has the same "
                     "incarnation id");
        }

    store__strfmt(logdir, sizeof(logdir), "%s/%s", s->dir, STORE_WAL_DIR);
    if ((rc = wal_scan(logdir, &replay_ops, &r, &info, why)) < 0) {
        errmsg_set(err, "%s", why);
        goto out;
    }
    if (info.truncated && (info.truncated_shared ||
                           s->durability == STORE_DURABLE_NONE)) {
        log_warn("store: cut a torn tail of %" PRIu64 " bytes from the "
                 "write-ahead log; %s, so acknowledged records may be lost",
                 info.truncated, s->durability == STORE_DURABLE_NONE
                     ? "with durability none writes are acknowledged "
                       "before they are on disk"
                     : "it was written without write units (by an earlier "
                       "release, or with durability none), where a torn "
                       "write may reach back into acknowledged records");
    } else if (info.truncated) {
        log_warn("store: cut a torn tail of %" PRIu64 " bytes from the "
                 "write-ahead log: the commit group a crash interrupted "
                 "(never acknowledged)", info.truncated);
    }
    if (info.truncated) {
        /* Its owners are unknown: any filter may have had records there. */
        for (size_t i = 0; i < s->n; i++)
            atomic_store(&s->v[i]->recovery_cut, true);
    }
    if (info.first_lsn > 1)
        add_lost(&r, 0, info.first_lsn, "the write-ahead log's older "
                 "segments were removed");
    if (max_lsn >= info.next_lsn)
        add_lost(&r, info.next_lsn, max_lsn + 1, "the write-ahead log ends "
                 "before the newest checkpoint");
    replay_finish(&r);
    /* New records never take an LSN a checkpoint already covers. */
    next = info.next_lsn > max_lsn + 1 ? info.next_lsn : max_lsn + 1;
    if (!(s->wal = wal_open(logdir, next, s->durability,
                            s->wal_bytes / 4 > (64u << 10)
                                ? s->wal_bytes / 4 : 64u << 10,
                            s->wal_unit, why))) {
        errmsg_set(err, "%s", why);
        rc = -EIO;
        goto out;
    }
    for (size_t i = 0; i < r.n; i++)
        replay_install(&r.v[i], NULL);
    for (size_t i = 0; i < s->n; i++)
        if (legacy[i])
            store__migrate(s->v[i], NULL);
    rc = 0;
out:
    replay_free(&r);
    free(legacy);
    return rc;
}
