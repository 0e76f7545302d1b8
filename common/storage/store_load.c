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
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "log.h"
#include "store_internal.h"
#include "wal.h"

/* A checkpoint of a filter directory: a manifest, or a checkpoint file of
 * the previous release. */
struct ckpt_ent {
    struct store_fname n;
    char name[STORE_FNAME_MAX];
};

static int ckpt_cmp_desc(const void *a, const void *b)
{
    const struct ckpt_ent *x = a, *y = b;

    /* Manifests first (a migration's fold leaves the old file for a
     * moment), then newest first. */
    if ((x->n.kind == STORE_FILE_MANIFEST) != (y->n.kind == STORE_FILE_MANIFEST))
        return x->n.kind == STORE_FILE_MANIFEST ? -1 : 1;
    if (x->n.seq != y->n.seq)
        return x->n.seq > y->n.seq ? -1 : 1;
    return x->n.lsn > y->n.lsn ? -1 : x->n.lsn < y->n.lsn;
}

/* Checkpoints in dir, manifests first, newest first.  clean: also remove
 * temp files of writes a crash interrupted (only while nothing writes to
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
        if (!store__fname_parse(de->d_name, &e.n))
            continue;
        if (e.n.tmp) {
            if (clean)
                unlinkat(dirfd(d), de->d_name, 0);
            continue;
        }
        if (e.n.kind != STORE_FILE_MANIFEST && e.n.kind != STORE_FILE_CKPT)
            continue;
        store__fname(e.name, &e.n);   /* parsed: the same name */
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

/* ---- loading a chain (a manifest's base and deltas) ---- */

/* Apply one data page of entry type type to f: ORed in (bits: the live
 * page a checkpoint read holds every bit it had up to its seq, and maybe
 * later ones) or copied (counters, read exactly at its seq), stamped with
 * the entry's seq. */
static int apply_page(struct bf *f, uint32_t layer, uint32_t index,
                      const uint8_t *data, uint64_t seq)
{
    struct bf_layer_info li;

    if (bf_layer_info(f, layer, &li) < 0 ||
        (uint64_t)index * STORE_CKF_PAGE >= li.body_bytes)
        return -EBADMSG;
    uint64_t off = (uint64_t)index * STORE_CKF_PAGE;
    size_t len = li.body_bytes - off < STORE_CKF_PAGE
                     ? (size_t)(li.body_bytes - off) : STORE_CKF_PAGE;
    for (size_t i = len; i < STORE_CKF_PAGE; i++)
        if (data[i])
            return -EBADMSG;   /* past the body */
    uint64_t *body = bf_layer_body(f, layer) + off / 8;
    if (bf_kind(f) == BF_KIND_COUNTING) {
        memcpy(body, data, len);
    } else {
        for (size_t i = 0; i < len / 8; i++) {
            uint64_t w;
            memcpy(&w, data + 8 * i, 8);
            body[i] |= w;
        }
    }
    bf_set_stamp(f, seq ? seq : 1);   /* a set page's version is never 0 */
    bf_stamp_range(f, layer, off, len);
    return 0;
}

/* Hashes of consecutive add records of one filter gathered for one
 * bf_add_hashes_sweep_mt (a blocked filter's adds in block order on
 * replay_threads() threads over disjoint ranges of blocks): room for one
 * hash per 768 bytes of the first filter that gathers, at least
 * REPLAY_SWEEP_MIN and at most REPLAY_SWEEP_MAX.  A sweep of at least
 * REPLAY_SWEEP_ASYNC hashes runs on a thread of its own while the next
 * records are read and gathered into a second buffer of the same size:
 * three buffers with the sweep's scratch, 1/16 of the first filter's bits
 * and at most 64 MiB. */
#define REPLAY_SWEEP_MIN (1u << 12)
#define REPLAY_SWEEP_MAX ((64u << 20) / 3 / sizeof(struct bf_hash))
#define REPLAY_SWEEP_ASYNC (1u << 15)
#define REPLAY_THREADS_MAX 8

/* Threads a replay's sweeps and a base's first touch of memory run on:
 * the CPUs online, at most REPLAY_THREADS_MAX. */
static unsigned replay_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);

    return n < 1 ? 1 : n > REPLAY_THREADS_MAX ? REPLAY_THREADS_MAX : (unsigned)n;
}

/* Make the memory of f's bits present (MADV_POPULATE_WRITE) on up to
 * replay_threads() threads, each over its own part: the kernel zeroes a
 * new page at its first touch, which in one thread is a good part of
 * loading a large base that the next step overwrites whole.  Nothing when
 * the kernel does not know the advice (then the first touches do it). */
struct populate {
    uint8_t *p;
    size_t len;
};

static void *populate_run(void *arg)
{
    struct populate *w = arg;

    if (w->len)
        (void)madvise(w->p, w->len, MADV_POPULATE_WRITE);
    return NULL;
}

static void populate_bits(struct bf *f)
{
    unsigned nt = replay_threads();
    struct populate w[REPLAY_THREADS_MAX];
    pthread_t tid[REPLAY_THREADS_MAX];
    bool started[REPLAY_THREADS_MAX] = {false};

    for (uint32_t l = 0; l < bf_layer_count(f); l++) {
        struct bf_layer_info li;
        if (bf_layer_info(f, l, &li) < 0 || !li.body_bytes)
            continue;
        /* Parts of whole 2 MiB (huge) pages; the body is page aligned. */
        size_t len = (size_t)li.body_bytes, step = (size_t)1 << 21;
        size_t per = (len / nt + step - 1) / step * step;
        uint8_t *p = (uint8_t *)bf_layer_body(f, l);
        for (unsigned t = 0; t < nt; t++) {
            size_t a = per * t < len ? per * t : len;
            size_t b = per * (t + 1) < len ? per * (t + 1) : len;
            w[t] = (struct populate){p + a, b - a};
        }
        for (unsigned t = 1; t < nt; t++)
            started[t] = pthread_create(&tid[t], NULL, populate_run, &w[t]) == 0;
        populate_run(&w[0]);
        for (unsigned t = 1; t < nt; t++) {
            if (started[t])
                pthread_join(tid[t], NULL);
            else
                populate_run(&w[t]);
        }
    }
}

struct sweep {
    struct bf_hash *v;           /* the hashes being gathered (cap), or NULL */
    struct bf_hash *spare;       /* the other buffer (cap) */
    struct bf_hash *tmp;         /* a sweep's scratch (cap) */
    void *mem;                   /* the three */
    size_t n, cap;
    struct bf *f;                /* whose hashes v holds */
    uint64_t seq;                /* the seq of the last record in it */
    bool off;                    /* no memory for it: add in order */
    unsigned threads;            /* replay_threads(), once v is made */
    /* The sweep running on its own thread (sweep_wait ends it): its
     * filter, hashes and seq. */
    bool running;
    pthread_t tid;
    struct bf *jf;
    struct bf_hash *jv;
    size_t jn;
    uint64_t jseq;
};

/* Apply the hashes of the sweep's job.  Their pages are stamped with the
 * seq of the last record among them: at or past each one's, so still after
 * the checkpoint they are replayed onto, and in its next delta. */
static void *sweep_job(void *arg)
{
    struct sweep *sw = arg;

    bf_set_stamp(sw->jf, sw->jseq);
    bf_add_hashes_sweep_mt(sw->jf, sw->jv, sw->jn, sw->tmp, sw->threads);
    return NULL;
}

/* The sweep under way is over: its filter may be touched again. */
static void sweep_wait(struct sweep *sw)
{
    if (sw->running)
        pthread_join(sw->tid, NULL);
    sw->running = false;
}

/* Apply the gathered hashes: a large gathering on a thread of its own
 * (after the sweep before it), the next records going into the other
 * buffer meanwhile; a small one here, once the one before it is over. */
static void sweep_flush(struct sweep *sw)
{
    if (sw->n) {
        sweep_wait(sw);
        sw->jf = sw->f;
        sw->jv = sw->v;
        sw->jn = sw->n;
        sw->jseq = sw->seq;
        if (sw->n >= REPLAY_SWEEP_ASYNC &&
            pthread_create(&sw->tid, NULL, sweep_job, sw) == 0) {
            sw->running = true;
            sw->v = sw->spare;
            sw->spare = sw->jv;
        } else {
            sweep_job(sw);
        }
    }
    sw->n = 0;
    sw->f = NULL;
}

/* Wait for the sweep under way and let go of the memory; what was
 * gathered and not applied is dropped. */
static void sweep_drop(struct sweep *sw)
{
    sweep_wait(sw);
    free(sw->mem);
    *sw = (struct sweep){.off = sw->off};
}

/* Apply what was gathered, wait for it, and let go of the memory. */
static void sweep_end(struct sweep *sw)
{
    sweep_flush(sw);
    sweep_drop(sw);
}

/* Apply record seq (type, payload, len) to f, as store__replay_apply.
 * Adds to a blocked filter are gathered (the order of adds does not change
 * the bits); anything else first applies what was gathered, so each
 * filter's records still take effect in order. */
static int sweep_apply(struct sweep *sw, struct bf *f, uint64_t seq,
                       uint32_t type, const void *payload, uint64_t len)
{
    uint64_t k = len / sizeof(struct bf_hash);

    if (type == WAL_REC_ADD && len % sizeof(struct bf_hash) == 0 &&
        bf_kind(f) == BF_KIND_BLOCKED && !sw->off) {
        if (!sw->v) {
            uint64_t cap = bf_bytes(f) / 768;
            cap = cap < REPLAY_SWEEP_MIN ? REPLAY_SWEEP_MIN
                  : cap > REPLAY_SWEEP_MAX ? REPLAY_SWEEP_MAX : cap;
            if (!(sw->mem = malloc(3 * cap * sizeof(struct bf_hash)))) {
                sw->off = true;
                goto direct;
            }
            sw->v = sw->mem;
            sw->spare = sw->v + cap;
            sw->tmp = sw->v + 2 * cap;
            sw->cap = (size_t)cap;
            sw->threads = replay_threads();
        }
        if (k > sw->cap)
            goto direct;
        if (sw->f != f || sw->n + k > sw->cap)
            sweep_flush(sw);
        /* Copied out: records are not aligned for struct access. */
        memcpy(sw->v + sw->n, payload, (size_t)len);
        sw->n += (size_t)k;
        sw->f = f;
        sw->seq = seq;
        return 0;
    }
direct:
    sweep_flush(sw);
    sweep_wait(sw);
    return store__replay_apply(f, seq, type, payload, len);
}

/* Records of a records delta, reassembled from its stream pages. */
struct rec_stream {
    uint8_t hdr[24];
    size_t hlen;
    uint8_t *payload;
    uint64_t len, have;
    uint64_t type, seq, expect, last;
    uint64_t left;               /* stream bytes still to come */
    struct sweep sw;             /* the adds gathered, when applied */
};

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

/* Feed a data page of the stream; whole records are applied to f when f
 * is not NULL (else only checked). */
static int stream_feed(struct rec_stream *rs, struct bf *f, const uint8_t *p,
                       char *why)
{
    size_t n = rs->left < STORE_CKF_PAGE ? (size_t)rs->left : STORE_CKF_PAGE;

    for (size_t i = n; i < STORE_CKF_PAGE; i++)
        if (p[i])
            goto bad;
    rs->left -= n;
    while (n) {
        if (rs->hlen < sizeof rs->hdr) {
            size_t k = sizeof rs->hdr - rs->hlen < n ? sizeof rs->hdr - rs->hlen : n;
            memcpy(rs->hdr + rs->hlen, p, k);
            rs->hlen += k;
            p += k;
            n -= k;
            if (rs->hlen < sizeof rs->hdr)
                break;
            rs->type = le64(rs->hdr) & 0xffffffffu;
            rs->seq = le64(rs->hdr + 8);
            rs->len = le64(rs->hdr + 16);
            if (le64(rs->hdr) >> 32 || rs->seq != rs->expect ||
                rs->seq > rs->last || rs->len > WAL_MAX_PAYLOAD ||
                rs->len > rs->left + n)
                goto bad;
            free(rs->payload);
            rs->payload = NULL;
            rs->have = 0;
            if (f && rs->len && !(rs->payload = malloc(rs->len))) {
                errmsg_set(why, "no memory for a record of %" PRIu64 " bytes",
                           rs->len);
                return -ENOMEM;
            }
        }
        size_t k = rs->len - rs->have < n ? (size_t)(rs->len - rs->have) : n;
        if (f)
            memcpy(rs->payload + rs->have, p, k);
        rs->have += k;
        p += k;
        n -= k;
        if (rs->have == rs->len) {
            if (f && sweep_apply(&rs->sw, f, rs->seq, (uint32_t)rs->type,
                                 rs->payload, rs->len) < 0)
                goto bad;
            rs->expect++;
            rs->hlen = 0;
        }
    }
    return 0;
bad:
    errmsg_set(why, "a record in the delta is malformed or out of sequence "
               "(record %" PRIu64 " expected)", rs->expect);
    return -EBADMSG;
}

/* Read page file (entry i of m) and apply it to *fp (NULL: check only).
 * For entry 0, *fp is made from the file's header.  0 or a negative errno
 * with why. */
static int entry_apply(const char *dir, const struct store_manifest *m,
                       uint32_t i, struct bf **fp, bool apply, char *why)
{
    const struct store_manifest_ent *e = &m->e[i];
    struct store_fname n;
    struct store_ckr *r = NULL;
    struct rec_stream rs = {0};
    char path[STORE_PATH_LEN], e2[STORE_ERRLEN];
    const uint8_t *meta, *data;
    uint32_t layer, index;
    size_t mlen;
    int rc;

    store__manifest_fname(m, i, &n);
    store__fname_path(path, sizeof path, dir, &n);
    if ((rc = store__ckr_open(&r, path, &n, (int)e->type, why)) < 0)
        return rc;
    meta = store__ckr_meta(r, &mlen);
    struct bf *g = bf_file_meta_parse(meta, mlen, NULL, e2);
    if (!g) {
        errmsg_set(why, "checkpoint file %s is unusable: its filter header: "
                   "%.160s", path, e2);
        rc = -EBADMSG;
        goto out;
    }
    if (i == 0 && apply) {
        /* The base makes the filter. */
        if (bf_track_pages(g, true) < 0) {
            bf_destroy(g);
            errmsg_set(why, "no memory for the page versions of the filter");
            rc = -ENOMEM;
            goto out;
        }
        bf_set_exclusive(g, true);
        /* A base of at least half the bits: their memory first, on every
         * CPU (a sparse base leaves untouched pages unbacked). */
        if (store__ckr_pages(r) * STORE_CKF_PAGE >= bf_bytes(g) / 2)
            populate_bits(g);
        *fp = g;
        g = NULL;
    } else if (apply) {
        const char *field = bf_mismatch(*fp, g);
        if (field) {
            errmsg_set(why, "checkpoint file %s is not of this filter: its %s "
                       "differs", path, field);
            rc = -EBADMSG;
            goto out;
        }
        /* A scalable filter's later layers, empty for now. */
        if (bf_layer_count(g) > bf_layer_count(*fp) &&
            (rc = bf_merge_from(*fp, g, e2)) < 0) {
            errmsg_set(why, "cannot grow the filter to the layers of %s: %.160s",
                       path, e2);
            goto out;
        }
    }
    rs.expect = e->from + 1;
    rs.last = e->to;
    rs.left = store__ckr_stream_bytes(r);
    while ((rc = store__ckr_next(r, &layer, &index, &data, why)) > 0) {
        if (e->type == STORE_CKF_RECORDS) {
            if (layer != STORE_CKF_STREAM)
                rc = -EBADMSG;
            else
                rc = stream_feed(&rs, apply ? *fp : NULL, data, why);
        } else if (layer == STORE_CKF_STREAM) {
            rc = -EBADMSG;
        } else if (apply) {
            rc = apply_page(*fp, layer, index, data, e->to);
        } else {
            struct bf_layer_info li;
            rc = bf_layer_info(g, layer, &li) < 0 ||
                 (uint64_t)index * STORE_CKF_PAGE >= li.body_bytes ? -EBADMSG : 0;
        }
        if (rc < 0) {
            if (rc == -EBADMSG && !strstr(why ? why : "", path))
                errmsg_set(why, "checkpoint file %s is unusable: page %u of "
                           "layer %u is outside the filter or malformed", path,
                           index, layer);
            goto out;
        }
    }
    if (rc == 0 && e->type == STORE_CKF_RECORDS &&
        (rs.expect != e->to + 1 || rs.hlen || rs.left)) {
        errmsg_set(why, "checkpoint file %s is unusable: its records end at "
                   "%" PRIu64 ", not %" PRIu64, path, rs.expect - 1, e->to);
        rc = -EBADMSG;
    }
out:
    sweep_end(&rs.sw);   /* what was read before any damage, as in order */
    free(rs.payload);
    bf_destroy(g);
    store__ckr_close(r);
    return rc;
}

/* Load the chain m names: the base, then each delta in order.  *loaded
 * gets the entries applied whole; *fp the filter (with their bits) when
 * at least the base loaded, with the counts of the last one.  A counting
 * filter's delta is checked whole before any of it is applied (its pages
 * replace pages, its records are not idempotent); bits are ORed and a
 * delta cut short leaves a superset of the entries before it.  0 when all
 * loaded, or the error of the first that did not (why). */
static int chain_load(const char *dir, const struct store_manifest *m,
                      struct bf **fp, uint32_t *loaded, char *why)
{
    struct bf *f = NULL;
    int rc = 0;

    *loaded = 0;
    *fp = NULL;
    for (uint32_t i = 0; i < m->n; i++) {
        if (i > 0 && bf_kind(f) == BF_KIND_COUNTING &&
            (rc = entry_apply(dir, m, i, &f, false, why)) < 0)
            break;
        if ((rc = entry_apply(dir, m, i, &f, true, why)) < 0)
            break;
        *loaded = i + 1;
    }
    if (f && *loaded) {
        /* The counts of the last entry loaded. */
        struct store_fname n;
        struct store_ckr *r;
        char path[STORE_PATH_LEN], e2[STORE_ERRLEN];
        uint32_t last = *loaded - 1;
        store__manifest_fname(m, last, &n);
        store__fname_path(path, sizeof path, dir, &n);
        if (store__ckr_open(&r, path, &n, (int)m->e[last].type, e2) == 0) {
            size_t mlen;
            const uint8_t *meta = store__ckr_meta(r, &mlen);
            struct bf *g = bf_file_meta_parse(meta, mlen, NULL, e2);
            if (g) {
                uint64_t counts[BF_MAX_LAYERS] = {0};
                uint32_t nl = bf_layer_count(f);
                for (uint32_t l = 0; l < nl && l < BF_MAX_LAYERS; l++) {
                    struct bf_layer_info li;
                    if (bf_layer_info(l < bf_layer_count(g) ? g : f, l, &li) == 0)
                        counts[l] = li.count;
                }
                bf_set_counts(f, bf_insert_count(g), bf_keys_added(g), counts);
                bf_destroy(g);
            }
            store__ckr_close(r);
        }
    }
    if (!*loaded) {
        bf_destroy(f);
        f = NULL;
    }
    *fp = f;
    return rc;
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
    uint64_t rec_bytes;          /* of the records replayed (as log_bytes) */
    int rc;                      /* 0, or why the entry failed */
    char why[STORE_ERRLEN];
    bool lenient;                /* in_group and a kind whose pages merge */
    bool lost;                   /* lenient: records were lost (why) */
    char cut[STORE_ERRLEN];      /* the delta a load stopped at, if any */
};

struct lost {
    uint64_t from, to;
    char where[STORE_ERRLEN];
};

struct replay {
    struct replay_ent *v;        /* sorted by id */
    size_t n;
    struct sweep sw;
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
    if ((rc = sweep_apply(&r->sw, e->f, rec->seq, rec->type, rec->payload,
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
    e->rec_bytes += rec->len + 24;
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

static const struct wal_scan_ops replay_ops = {on_record, on_damage, NULL};

/* Apply the rule for lost LSNs once the scan is over (see the top). */
static void replay_finish(struct replay *r)
{
    sweep_end(&r->sw);
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
    sweep_drop(&r->sw);
    for (size_t i = 0; i < r->n; i++)
        bf_destroy(r->v[i].f);
    free(r->v);
    free(r->lost);
}

/* Load the checkpoint of sf: the newest manifest of its incarnation and
 * the base and deltas it names, or a checkpoint file of the previous
 * release (migrated by the next checkpoint, which writes a base).  A chain
 * whose base loads but a later delta does not (a torn or zeroed page) is
 * used up to the last delta that loaded, with the log after it: the replay
 * then finds the records it needs, or fails the filter when the log no
 * longer holds them; the next checkpoint writes a new base.  Returns 0 or
 * -EBADMSG / -ENOMEM / an I/O error (why set). */
static int load_checkpoint(struct store_filter *sf, struct replay_ent *e,
                           char *why)
{
    struct ckpt_ent *v = NULL;
    size_t n = 0;
    char e2[STORE_ERRLEN], path[STORE_PATH_LEN];
    struct store_manifest m;
    bool older = false, fold = false;
    int rc;

    why[0] = 0;
    memset(sf->chain, 0, sizeof *sf->chain);
    sf->fold_next = false;
    if ((rc = ckpt_list(sf->path, true, &v, &n)) < 0) {
        store__strfmt(why, STORE_ERRLEN, "cannot list %s: %s", sf->path,
                      strerror(-rc));
        return rc;
    }
    if (n) {
        /* What the filter holds of the log even if nothing loads. */
        sf->id = v[0].n.id;
        atomic_store(&sf->ckpt_lsn, v[0].n.lsn);
    }
    for (size_t i = 0; i < n && !e->f; i++) {
        if (v[i].n.id != v[0].n.id)
            continue;   /* not this incarnation's */
        store__strfmt(path, sizeof(path), "%s/%s", sf->path, v[i].name);
        if (v[i].n.kind == STORE_FILE_CKPT) {
            if ((e->f = bf_file_load(path, e2, NULL))) {
                e->ckpt_seq = v[i].n.seq;
                e->ckpt_lsn = v[i].n.lsn;
                fold = true;   /* migrated: the next checkpoint is a base */
            } else if (!why[0]) {
                store__strfmt(why, STORE_ERRLEN, "checkpoint %s is unusable: "
                              "%.160s", path, e2);
            }
            older = true;
            continue;
        }
        uint32_t loaded = 0;
        rc = store__manifest_read(path, &v[i].n, &m, e2);
        if (rc == 0)
            rc = chain_load(sf->path, &m, &e->f, &loaded, e2);
        if (rc < 0 && rc != -EBADMSG && rc != -EPROTONOSUPPORT &&
            !loaded) {
            /* An I/O error or no memory: retried, never an older state. */
            store__strfmt(why, STORE_ERRLEN, "%.200s", e2);
            bf_destroy(e->f);
            e->f = NULL;
            free(v);
            return rc;
        }
        if (rc < 0 && !why[0])
            store__strfmt(why, STORE_ERRLEN, "%.200s", e2);
        if (!e->f) {
            older = true;
            continue;
        }
        e->ckpt_seq = m.e[loaded - 1].to;
        e->ckpt_lsn = loaded == m.n ? v[i].n.lsn : m.e[loaded - 1].lsn;
        *sf->chain = m;
        if (loaded < m.n) {
            /* The chain up to the delta that failed, then the log. */
            sf->chain->n = loaded;
            sf->chain->seq = e->ckpt_seq;
            fold = true;
            log_warn("store: %s; loaded the checkpoint up to seq %" PRIu64
                     " with the log after it, and the next checkpoint "
                     "writes a new base", e2, e->ckpt_seq);
            store__strfmt(e->cut, sizeof e->cut, "%.300s", e2);
        }
    }
    free(v);
    if (!e->f) {
        if (!why[0])
            store__strfmt(why, STORE_ERRLEN, "no checkpoint in %s", sf->path);
        return -EBADMSG;
    }
    e->id = sf->id;
    if (older && why[0]) {
        log_warn("store: %s; using the older checkpoint seq %" PRIu64
                 " with the log after it", why, e->ckpt_seq);
        atomic_store(&sf->recovery_cut, true);
    }
    why[0] = 0;
    sf->fold_next = fold;
    bf_set_exclusive(e->f, true);
    /* Replayed records stamp their pages (the next checkpoint's); the
     * pages loaded carry the seq of the file they came from, so that a
     * puller whose cursor is older, in an epoch a reload keeps, gets
     * them. */
    if (!bf_tracked(e->f)) {
        if (bf_track_pages(e->f, true) < 0) {
            bf_destroy(e->f);
            e->f = NULL;
            store__strfmt(why, STORE_ERRLEN, "no memory for the page "
                          "versions of the filter");
            return -ENOMEM;
        }
        store__stamp_nonzero(e->f, e->ckpt_seq);
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
        if (e->cut[0]) {
            /* The log cannot make up for the delta that did not load. */
            char why[STORE_ERRLEN];
            store__strfmt(why, sizeof why, "%.250s; %.250s", e->cut, e->why);
            store__strfmt(e->why, sizeof e->why, "%s", why);
        }
        store__filter_fail(sf, e->why, e->rc != -EBADMSG);
        log_error("store: filter '%s' is not served: %s", sf->name, e->why);
        errmsg_set(err, "filter '%s' is not served: %s", sf->name, e->why);
        return e->rc;
    }
    sf->id = e->id;
    sf->ckpt_seq = e->ckpt_seq;
    atomic_store(&sf->ckpt_lsn, e->ckpt_lsn);
    /* The records after the checkpoint count toward the next one. */
    atomic_store(&sf->log_bytes, e->rec_bytes);
    atomic_store(&sf->ckpt_log, 0);
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
