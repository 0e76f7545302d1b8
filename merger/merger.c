/* merger: one round of pulls, ORs and pushes over every configured filter
 * (see merger.h for what is kept and docs/MERGER.md for why it is safe).
 *
 * OR is idempotent, commutative and associative, so every step may be
 * repeated or reordered: a round interrupted anywhere leaves every copy a
 * subset of the union, and the next round completes it.  The only thing
 * that must never happen is forgetting a page that a node will not send
 * again; hence the order: pull, OR into the snapshot, save the snapshot,
 * and only then save the since_version of that pull (the sidecar) and push.
 */
#include "merger.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bf.h"
#include "bf_file.h"
#include "log.h"
#include "merger_wire.h"
#include "rpc_client.h"
#include "topo.h"

#define PAGE_BYTES (64u << 10)

struct mg_src {
    uint64_t epoch, since, store_version;
    uint64_t pulled_ms;        /* wall clock of the last complete pull */
};

struct mg_target {
    char addr[TOPO_ADDR_MAX + 1];
    unsigned dc;
    bool replica;
    bool ready;                /* the shard is known to exist there */
    uint64_t acked;            /* last round received in full */
    uint64_t version;          /* replicas: source store version held */
    uint64_t data_ms;          /* replicas: when that pull was taken */
    bool was_synced;           /* as last written to the sidecar */
    char error[256];
};

struct mg_part {
    time_t mtime;
    off_t size;
    bool merged;
};

struct mg_shard {
    uint32_t index;
    struct bf *g;              /* the global snapshot of this shard */
    char fp[17];
    uint64_t body_bytes, npages;
    uint64_t *stamp;           /* per page: round of the last change */
    uint8_t *have;             /* this round, per page: bit d when the
                                  primary of datacenter d sent it whole */
    struct mg_src src[MG_MAX_DC];
    struct mg_target *tg;
    size_t ntg, captg;
    struct mg_part part[MG_MAX_PARTIALS];
};

struct mg_filter {
    struct mg_filter_conf c;
    struct mw_shard tmpl;      /* geometry and secret of shard 0 */
    bool have_tmpl;
    uint32_t nshards;
    struct mg_shard *sh;
};

struct mg_chan {
    char addr[TOPO_ADDR_MAX + 1];
    struct rpc_channel *ch;
};

struct merger {
    struct merger_config cfg;
    struct mg_filter *f;
    size_t nf;
    struct mg_chan *chans;
    size_t nchans, capchans;
    uint64_t round;
    pthread_mutex_t chan_mu;   /* chans */
    pthread_mutex_t mu;        /* last, rounds_done, total */
    struct mg_report last;
    uint64_t rounds_done, total;
};

/* snprintf for messages and paths that may be cut short. */
static void strfmt(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void strfmt(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void rep_msg(struct mg_report *rep, bool error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void rep_msg(struct mg_report *rep, bool error, const char *fmt, ...)
{
    char buf[MG_ERRLEN];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (error) {
        rep->errors++;
        log_error("merger: %s", buf);
    } else {
        log_warn("merger: %s", buf);
    }
    if (rep->nmsg < 16)
        strfmt(rep->msg[rep->nmsg++], MG_ERRLEN, "%s", buf);
}

/* The channel to a node (kept for the merger's life); thread-safe. */
static struct rpc_channel *chan(struct merger *m, const char *addr)
{
    struct rpc_channel *ch = NULL;

    pthread_mutex_lock(&m->chan_mu);
    for (size_t i = 0; i < m->nchans && !ch; i++)
        if (!strcmp(m->chans[i].addr, addr))
            ch = m->chans[i].ch;
    if (!ch && m->nchans == m->capchans) {
        size_t cap = m->capchans ? 2 * m->capchans : 16;
        void *nv = realloc(m->chans, cap * sizeof *m->chans);
        if (!nv)
            goto out;
        m->chans = nv;
        m->capchans = cap;
    }
    if (!ch && (ch = rpc_channel_create(addr, m->cfg.max_message_size))) {
        strfmt(m->chans[m->nchans].addr, TOPO_ADDR_MAX + 1, "%s", addr);
        m->chans[m->nchans++].ch = ch;
    }
out:
    pthread_mutex_unlock(&m->chan_mu);
    return ch;
}

/* ---- files: STATE_DIR/<filter>/shard-<i>.bf and .state ---- */

static void shard_path(const struct merger *m, const struct mg_filter *f,
                       uint32_t i, const char *ext, char *out, size_t len)
{
    strfmt(out, len, "%s/%s/shard-%04u.%s", m->cfg.state_dir, f->c.name, i,
             ext);
}

/* Is a copy known to hold every page of the snapshot? */
static bool target_synced(const struct mg_shard *s, const struct mg_target *t)
{
    for (uint64_t p = 0; p < s->npages; p++)
        if (s->stamp[p] > t->acked)
            return false;
    return t->ready;
}

/* The sidecar, one line each:
 *   S dc epoch since store_version pulled_ms       what was pulled
 *   T addr replica dc version data_ms              a copy holding every
 *                                                  page of the snapshot
 * Written (temp file, fsync, rename) only after the snapshot it describes
 * is on disk. */
static int state_save(const struct merger *m, const struct mg_filter *f,
                      struct mg_shard *s)
{
    char path[MG_PATH_MAX + 64], tmp[MG_PATH_MAX + 80];
    FILE *fp;
    int fd;

    shard_path(m, f, s->index, "state", path, sizeof path);
    strfmt(tmp, sizeof tmp, "%s.tmp", path);
    if (!(fp = fopen(tmp, "w")))
        return -errno;
    for (unsigned d = 0; d < f->c.ndc; d++)
        fprintf(fp, "S %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
                f->c.dc[d], s->src[d].epoch, s->src[d].since,
                s->src[d].store_version, s->src[d].pulled_ms);
    for (size_t i = 0; i < s->ntg; i++)
        if ((s->tg[i].was_synced = target_synced(s, &s->tg[i])))
            fprintf(fp, "T %s %d %u %" PRIu64 " %" PRIu64 "\n", s->tg[i].addr,
                    s->tg[i].replica, s->tg[i].dc, s->tg[i].version,
                    s->tg[i].data_ms);
    fflush(fp);
    fd = fileno(fp);
    if (ferror(fp) || fdatasync(fd) < 0) {
        fclose(fp);
        unlink(tmp);
        return -EIO;
    }
    fclose(fp);
    return rename(tmp, path) < 0 ? -errno : 0;
}

static struct mg_target *target_get(struct mg_shard *s, const char *addr,
                                    unsigned dc, bool replica);

/* Synced copies come back with acked = 1: the stamp of every loaded page. */
static void state_load(const struct merger *m, const struct mg_filter *f,
                       struct mg_shard *s)
{
    char path[MG_PATH_MAX + 64], kind[4], name[TOPO_ADDR_MAX + 1];
    uint64_t e, since, sv, ms;
    unsigned dc;
    int repl;
    FILE *fp;

    shard_path(m, f, s->index, "state", path, sizeof path);
    if (!(fp = fopen(path, "r")))
        return;
    while (fscanf(fp, "%3s", kind) == 1) {
        if (!strcmp(kind, "S") &&
            fscanf(fp, "%127s %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64,
                   name, &e, &since, &sv, &ms) == 5) {
            for (unsigned d = 0; d < f->c.ndc; d++)
                if (!strcmp(f->c.dc[d], name))
                    s->src[d] = (struct mg_src){e, since, sv, ms};
        } else if (!strcmp(kind, "T") &&
                   fscanf(fp, "%127s %d %u %" SCNu64 " %" SCNu64, name, &repl,
                          &dc, &sv, &ms) == 5 && dc < f->c.ndc) {
            struct mg_target *t = target_get(s, name, dc, repl != 0);
            log_debug("merger: \"%s\" shard %u: %s holds every page of the "
                      "saved snapshot", f->c.name, s->index, name);
            if (t) {
                t->ready = true;
                t->was_synced = true;
                t->acked = 1;
                t->version = sv;
                t->data_ms = ms;
            }
        } else {
            break;
        }
    }
    fclose(fp);
}

/* ---- the global snapshot of one shard ---- */

static int shard_init(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                      char *err)
{
    char path[MG_PATH_MAX + 64], e2[BF_ERRLEN];
    struct mw_shard t = f->tmpl;
    struct bf_layer_info li;
    struct bf *g;

    t.shard_index = s->index;
    g = mw_shard_filter(&t, e2);
    if (!g) {
        strfmt(err, MG_ERRLEN, "filter \"%s\" shard %u: %s", f->c.name,
                 s->index, e2);
        return -EINVAL;
    }
    shard_path(m, f, s->index, "bf", path, sizeof path);
    if (access(path, F_OK) == 0) {
        struct bf *saved = bf_file_load(path, e2, NULL);
        const char *field = saved ? bf_mismatch(g, saved) : NULL;
        if (!saved || field) {
            strfmt(err, MG_ERRLEN, "saved snapshot %s %s%s%s", path,
                     saved ? "differs from the cluster's shard in " : "is "
                     "unusable: ", saved ? field : e2,
                     saved ? " (move it away to start over)" : "");
            bf_destroy(saved);
            bf_destroy(g);
            return -EINVAL;
        }
        bf_destroy(g);
        g = saved;
    }
    bf_layer_info(g, 0, &li);
    s->g = g;
    bf_fingerprint_id(g, s->fp);
    s->body_bytes = li.body_bytes;
    s->npages = (li.body_bytes + PAGE_BYTES - 1) / PAGE_BYTES;
    s->stamp = calloc(s->npages ? s->npages : 1, sizeof *s->stamp);
    s->have = calloc(s->npages ? s->npages : 1, 1);
    if (!s->stamp || !s->have) {
        strfmt(err, MG_ERRLEN, "out of memory");
        return -ENOMEM;
    }
    /* Whatever was saved is new to every copy of this run. */
    const uint64_t *w = bf_layer_body_const(g, 0);
    for (uint64_t p = 0; p < s->npages; p++) {
        uint64_t lo = p * PAGE_BYTES / 8, hi = (p + 1) * PAGE_BYTES / 8;
        if (hi > li.body_bytes / 8)
            hi = li.body_bytes / 8;
        for (uint64_t i = lo; i < hi; i++)
            if (w[i]) {
                s->stamp[p] = 1;
                break;
            }
    }
    state_load(m, f, s);
    return 0;
}

/* OR len bytes at off into the snapshot; stamp the pages that changed.
 * Returns the number of pages that changed. */
static uint64_t shard_or(struct mg_shard *s, uint64_t off, const uint8_t *data,
                         size_t len, uint64_t round)
{
    uint64_t *w = bf_layer_body(s->g, 0) + off / 8;
    uint64_t changed = 0, last = UINT64_MAX;

    for (size_t i = 0; i < len / 8; i++) {
        uint64_t x;
        memcpy(&x, data + 8 * i, 8);
        if ((w[i] | x) != w[i]) {
            w[i] |= x;
            uint64_t p = (off + 8 * i) / PAGE_BYTES;
            if (p != last && s->stamp[p] != round) {
                s->stamp[p] = round;
                changed++;
            }
            last = p;
        }
    }
    return changed;
}

/* ---- pulls ---- */

struct pulled {
    struct mg_shard *s;
    uint8_t *buf;
    size_t len, cap;
};

/* Buffer a pulled page: applied only once the pull completed. */
static int pulled_page(void *ctx, uint64_t off, const uint8_t *data, size_t len)
{
    struct pulled *p = ctx;

    if (off % 8 || len % 8 || off > p->s->body_bytes ||
        len > p->s->body_bytes - off)
        return -1;
    if (p->len + 16 + len > p->cap) {
        size_t cap = p->cap ? p->cap : (1u << 20);
        while (cap < p->len + 16 + len)
            cap *= 2;
        uint8_t *nb = realloc(p->buf, cap);
        if (!nb)
            return -1;
        p->buf = nb;
        p->cap = cap;
    }
    uint64_t l = len;
    memcpy(p->buf + p->len, &off, 8);
    memcpy(p->buf + p->len + 8, &l, 8);
    memcpy(p->buf + p->len + 16, data, len);
    p->len += 16 + len;
    return 0;
}

/* Does a shard on a node have the snapshot's fingerprint?  Creates it from
 * the template when create and the node lacks it.  Returns 0, or -1 with
 * the reason in why. */
static int shard_ensure(struct merger *m, struct mg_filter *f,
                        struct mg_shard *s, struct rpc_channel *ch,
                        bool create, char *why, size_t whylen)
{
    struct rpc_status st;
    struct mw_shard theirs, t = f->tmpl;
    char e2[BF_ERRLEN];
    int to = (int)m->cfg.node_timeout_ms;

    if (mw_get_shard(ch, f->c.name, s->index, &theirs, to, &st) < 0) {
        if (st.code != GRPC_STATUS_NOT_FOUND || !create) {
            strfmt(why, whylen, "%s: %s", rpc_status_name(st.code), st.message);
            return -1;
        }
        t.shard_index = s->index;
        if (mw_create_shard(ch, f->c.name, &t, to, &st) < 0 &&
            st.code != GRPC_STATUS_ALREADY_EXISTS) {
            strfmt(why, whylen, "cannot create the shard: %s: %s",
                     rpc_status_name(st.code), st.message);
            return -1;
        }
        log_info("merger: created shard %u of \"%s\" from the template",
                 s->index, f->c.name);
        return 0;
    }
    struct bf *b = mw_shard_filter(&theirs, e2);
    const char *field = b ? bf_mismatch(s->g, b) : "geometry";
    bf_destroy(b);
    if (field) {
        strfmt(why, whylen, "its shard differs from the global snapshot in "
                 "%s; refused", field);
        return -1;
    }
    return 0;
}

/* Pull from one datacenter's primary and OR the pages in.  The pages stay
 * in *pp (the caller frees pp->buf) to tell later which of them the source
 * already holds in full. */
static void pull_one(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                     unsigned d, const char *addr, uint64_t round,
                     struct mg_report *rep, struct pulled *pp)
{
    struct rpc_channel *ch = chan(m, addr);
    struct pulled p = {.s = s};
    struct mw_pull_end end;
    struct rpc_status st;
    char why[300];
    uint64_t t0 = now_ms();

    if (!ch) {
        rep_msg(rep, true, "out of memory for a channel to %s", addr);
        return;
    }
    if (s->src[d].epoch == 0 &&
        shard_ensure(m, f, s, ch, true, why, sizeof why) < 0) {
        rep_msg(rep, true, "filter \"%s\" shard %u in %s (%s): %s", f->c.name,
                s->index, f->c.dc[d], addr, why);
        return;
    }
    if (mw_pull(ch, f->c.name, s->index, s->src[d].since, s->src[d].epoch,
                pulled_page, &p, &end, (int)m->cfg.node_timeout_ms * 4,
                &st) < 0) {
        rep_msg(rep, true, "pull of \"%s\" shard %u from %s (%s): %s: %s",
                f->c.name, s->index, f->c.dc[d], addr, rpc_status_name(st.code),
                st.message);
        free(p.buf);
        return;
    }
    if (strcmp(end.fp, s->fp) != 0) {
        rep_msg(rep, true, "pull of \"%s\" shard %u from %s (%s) refused: "
                "fingerprint %s, the global snapshot's is %s (another secret "
                "or geometry)", f->c.name, s->index, f->c.dc[d], addr, end.fp,
                s->fp);
        free(p.buf);
        return;
    }
    for (size_t o = 0; o < p.len;) {
        uint64_t off, len;
        memcpy(&off, p.buf + o, 8);
        memcpy(&len, p.buf + o + 8, 8);
        rep->pages_changed += shard_or(s, off, p.buf + o + 16, len, round);
        o += 16 + len;
    }
    *pp = p;
    rep->pages_pulled += end.pages;
    rep->bytes_pulled += end.bytes;
    /* Another epoch: the node restarted, or its shard was re-created (and
     * may have lost what it had): push it every page again. */
    if (s->src[d].epoch && s->src[d].epoch != end.epoch)
        for (size_t i = 0; i < s->ntg; i++)
            if (!strcmp(s->tg[i].addr, addr)) {
                s->tg[i].acked = 0;
                s->tg[i].ready = false;
            }
    s->src[d] = (struct mg_src){end.epoch, end.version, end.store_version, t0};
}

/* OR in a partial file when it changed since it was last merged. */
static void partial_one(struct mg_filter *f, struct mg_shard *s, unsigned i,
                        uint64_t round, struct mg_report *rep)
{
    const char *path = f->c.part[i];
    struct mg_part *ps = &s->part[i];
    char e2[BF_ERRLEN];
    struct stat sb;

    if (stat(path, &sb) < 0) {
        rep_msg(rep, true, "partial %s: %s", path, strerror(errno));
        return;
    }
    if (ps->merged && ps->mtime == sb.st_mtime && ps->size == sb.st_size)
        return;
    struct bf *b = bf_file_load(path, e2, NULL);
    if (!b) {
        rep_msg(rep, true, "partial %s refused: %s", path, e2);
        return;
    }
    if (bf_shard_count(b) == bf_shard_count(s->g) &&
        bf_shard_index(b) != s->index) {
        bf_destroy(b);   /* another shard's file */
        return;
    }
    const char *field = bf_mismatch(s->g, b);
    if (field) {
        rep_msg(rep, true, "partial %s refused for filter \"%s\" shard %u: "
                "field \"%s\" differs", path, f->c.name, s->index, field);
        bf_destroy(b);
        ps->merged = true;   /* reported once per change of the file */
        ps->mtime = sb.st_mtime;
        ps->size = sb.st_size;
        return;
    }
    struct bf_merge_projection proj;
    if (bf_merge_project(s->g, b, &proj, e2) == 0 && proj.over_target)
        rep_msg(rep, false, "partial %s: merged estimated FPR %.4g exceeds "
                "the target %.4g of \"%s\" shard %u", path,
                proj.estimated_fpr, bf_error_rate(s->g), f->c.name, s->index);
    rep->pages_changed += shard_or(s, 0, (const uint8_t *)bf_layer_body(b, 0),
                                   (size_t)s->body_bytes, round);
    bf_destroy(b);
    ps->merged = true;
    ps->mtime = sb.st_mtime;
    ps->size = sb.st_size;
    log_info("merger: merged partial %s into \"%s\" shard %u", path,
             f->c.name, s->index);
}

/* ---- pushes ---- */

static struct mg_target *target_get(struct mg_shard *s, const char *addr,
                                    unsigned dc, bool replica)
{
    for (size_t i = 0; i < s->ntg; i++)
        if (!strcmp(s->tg[i].addr, addr) && s->tg[i].replica == replica)
            return &s->tg[i];
    if (s->ntg == s->captg) {
        size_t cap = s->captg ? 2 * s->captg : 4;
        void *nv = realloc(s->tg, cap * sizeof *s->tg);
        if (!nv)
            return NULL;
        s->tg = nv;
        s->captg = cap;
    }
    struct mg_target *t = &s->tg[s->ntg++];
    memset(t, 0, sizeof *t);
    strfmt(t->addr, sizeof t->addr, "%s", addr);
    t->dc = dc;
    t->replica = replica;
    return t;
}

static void push_one(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                     struct mg_target *t, uint64_t round, struct mg_report *rep)
{
    struct rpc_channel *ch = chan(m, t->addr);
    struct mw_page *pg = NULL;
    struct rpc_status st;
    size_t n = 0;
    uint64_t bytes = 0;
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(s->g, 0);

    if (!ch)
        return;
    if (!t->ready) {
        if (shard_ensure(m, f, s, ch, true, t->error, sizeof t->error) < 0) {
            rep_msg(rep, true, "push of \"%s\" shard %u to %s (%s %s): %s",
                    f->c.name, s->index, t->addr, f->c.dc[t->dc],
                    t->replica ? "replica" : "primary", t->error);
            return;
        }
        t->ready = true;
    }
    pg = calloc(s->npages ? s->npages : 1, sizeof *pg);
    if (!pg)
        return;
    for (uint64_t p = 0; p < s->npages; p++) {
        if (s->stamp[p] <= t->acked ||
            (!t->replica && (s->have[p] & (1u << t->dc))))
            continue;
        uint64_t off = p * PAGE_BYTES;
        size_t len = s->body_bytes - off < PAGE_BYTES
                         ? (size_t)(s->body_bytes - off) : PAGE_BYTES;
        pg[n++] = (struct mw_page){off, body + off, len};
        bytes += len;
    }
    /* A primary needs nothing when nothing changed; a replica still hears
     * the version it covers every round (it forgets it when it restarts). */
    if (n == 0 && !t->replica) {
        t->acked = round;
        free(pg);
        return;
    }
    /* Large shards go in several streams of at most 64 MiB of pages. */
    size_t first = 0;
    while (first < n || (n == 0 && first == 0)) {
        size_t last = first;
        uint64_t chunk = 0;
        while (last < n && chunk < (64u << 20))
            chunk += pg[last++].len;
        if (mw_push(ch, f->c.name, s->index, s->fp,
                    t->replica ? s->src[t->dc].store_version : 0, pg + first,
                    last - first, NULL, (int)m->cfg.node_timeout_ms * 4,
                    &st) < 0) {
            strfmt(t->error, sizeof t->error, "%s: %s",
                     rpc_status_name(st.code), st.message);
            rep_msg(rep, true, "push of \"%s\" shard %u to %s (%s %s): %s",
                    f->c.name, s->index, t->addr, f->c.dc[t->dc],
                    t->replica ? "replica" : "primary", t->error);
            if (st.code == GRPC_STATUS_NOT_FOUND) {
                t->ready = false;
                t->acked = 0;
            }
            free(pg);
            return;
        }
        rep->pages_pushed += last - first;
        rep->bytes_pushed += chunk;
        if (n == 0)
            break;
        first = last;
    }
    (void)bytes;
    t->acked = round;
    t->error[0] = 0;
    if (t->replica) {
        t->version = s->src[t->dc].store_version;
        t->data_ms = s->src[t->dc].pulled_ms;
    }
    free(pg);
}

/* ---- a round ---- */

/* The template (shard 0's geometry and secret) from the first datacenter
 * that has the filter. */
static int filter_prepare(struct merger *m, struct mg_filter *f,
                          struct topo **topos, struct mg_report *rep)
{
    char err[MG_ERRLEN];

    if (!f->have_tmpl) {
        for (unsigned d = 0; d < f->c.ndc && !f->have_tmpl; d++) {
            struct rpc_status st;
            unsigned g = topo_group_for(topos[d], f->c.name, 0);
            struct rpc_channel *ch = chan(m, topos[d]->groups[g].primary);
            if (ch && mw_get_shard(ch, f->c.name, 0, &f->tmpl,
                                   (int)m->cfg.node_timeout_ms, &st) == 0)
                f->have_tmpl = true;
            else if (st.code != GRPC_STATUS_NOT_FOUND)
                rep_msg(rep, true, "filter \"%s\" in %s: %s: %s", f->c.name,
                        f->c.dc[d], rpc_status_name(st.code), st.message);
        }
        if (!f->have_tmpl) {
            rep_msg(rep, true, "filter \"%s\" exists in no datacenter yet",
                    f->c.name);
            return -1;
        }
    }
    if (!f->sh) {
        char dir[MG_PATH_MAX + 200];
        strfmt(dir, sizeof dir, "%s/%s", m->cfg.state_dir, f->c.name);
        mkdir(dir, 0755);
        f->nshards = f->tmpl.shard_count;
        f->sh = calloc(f->nshards, sizeof *f->sh);
        if (!f->sh)
            return -1;
        for (uint32_t i = 0; i < f->nshards; i++) {
            f->sh[i].index = i;
            if (shard_init(m, f, &f->sh[i], err) < 0) {
                rep_msg(rep, true, "%s", err);
                for (uint32_t j = 0; j <= i; j++) {
                    bf_destroy(f->sh[j].g);
                    free(f->sh[j].stamp);
                    free(f->sh[j].have);
                }
                free(f->sh);
                f->sh = NULL;
                return -1;
            }
        }
    }
    return 0;
}

static void shard_round(struct merger *m, struct mg_filter *f,
                        struct mg_shard *s, struct topo **topos, uint64_t round,
                        struct mg_report *rep)
{
    uint64_t before = rep->pages_changed;
    char path[MG_PATH_MAX + 64], e2[BF_ERRLEN];
    struct mg_src old[MG_MAX_DC];

    memcpy(old, s->src, sizeof old);

    struct pulled pl[MG_MAX_DC] = {{0}};
    for (unsigned d = 0; d < f->c.ndc; d++) {
        unsigned g = topo_group_for(topos[d], f->c.name, s->index);
        pull_one(m, f, s, d, topos[d]->groups[g].primary, round, rep, &pl[d]);
    }
    for (unsigned i = 0; i < f->c.npart; i++)
        partial_one(f, s, i, round, rep);
    /* A page a primary sent that equals the merged page needs no push back
     * to that primary. */
    memset(s->have, 0, s->npages);
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(s->g, 0);
    for (unsigned d = 0; d < f->c.ndc; d++) {
        for (size_t o = 0; o < pl[d].len;) {
            uint64_t off, len;
            memcpy(&off, pl[d].buf + o, 8);
            memcpy(&len, pl[d].buf + o + 8, 8);
            if (off % PAGE_BYTES == 0 &&
                (len == PAGE_BYTES || off + len == s->body_bytes) &&
                memcmp(pl[d].buf + o + 16, body + off, len) == 0)
                s->have[off / PAGE_BYTES] |= (uint8_t)(1u << d);
            o += 16 + len;
        }
        free(pl[d].buf);
    }
    if (rep->pages_changed != before) {
        struct bf_stats bs;
        bf_stats(s->g, &bs);
        if (bs.estimated_fpr > bf_error_rate(s->g))
            rep_msg(rep, false, "filter \"%s\" shard %u: merged fill %.3f "
                    "gives an estimated FPR of %.4g, past the target %.4g",
                    f->c.name, s->index, bs.fill_ratio, bs.estimated_fpr,
                    bf_error_rate(s->g));
        shard_path(m, f, s->index, "bf", path, sizeof path);
        if (bf_file_save(s->g, path, e2) < 0) {
            /* Without the snapshot on disk, nothing may be acknowledged:
             * the sidecar keeps the old since_versions. */
            rep_msg(rep, true, "cannot save %s: %s", path, e2);
            return;
        }
    }
    if (memcmp(old, s->src, sizeof old) != 0 && state_save(m, f, s) < 0)
        rep_msg(rep, true, "cannot save the state of \"%s\" shard %u",
                f->c.name, s->index);
    const char *pause = getenv("BLOOMGRID_MERGER_TEST_PAUSE_MS");
    if (pause && *pause)
        usleep((useconds_t)atoi(pause) * 1000);
    for (unsigned d = 0; d < f->c.ndc; d++) {
        struct topo_group *grp =
            &topos[d]->groups[topo_group_for(topos[d], f->c.name, s->index)];
        struct mg_target *t = target_get(s, grp->primary, d, false);
        if (t)
            push_one(m, f, s, t, round, rep);
        for (unsigned r = 0; r < grp->nreplicas; r++)
            if ((t = target_get(s, grp->replicas[r], d, true)))
                push_one(m, f, s, t, round, rep);
    }
    /* Record which copies are now complete (a restart then pushes them
     * only what changes later). */
    bool changed = false;
    for (size_t i = 0; i < s->ntg; i++)
        changed |= target_synced(s, &s->tg[i]) != s->tg[i].was_synced;
    if (changed && state_save(m, f, s) < 0)
        rep_msg(rep, true, "cannot save the state of \"%s\" shard %u",
                f->c.name, s->index);
}

static void report_lag(struct merger *m, struct mg_report *rep)
{
    size_t n = 0, k = 0;
    uint64_t now = now_ms();

    for (size_t i = 0; i < m->nf; i++)
        for (uint32_t j = 0; m->f[i].sh && j < m->f[i].nshards; j++)
            n += m->f[i].sh[j].ntg;
    rep->lag = calloc(n ? n : 1, sizeof *rep->lag);
    if (!rep->lag)
        return;
    for (size_t i = 0; i < m->nf; i++) {
        struct mg_filter *f = &m->f[i];
        for (uint32_t j = 0; f->sh && j < f->nshards; j++)
            for (size_t t = 0; t < f->sh[j].ntg; t++) {
                struct mg_target *tg = &f->sh[j].tg[t];
                struct mg_lag *l = &rep->lag[k++];
                strfmt(l->filter, sizeof l->filter, "%s", f->c.name);
                l->shard = j;
                strfmt(l->dc, sizeof l->dc, "%s", f->c.dc[tg->dc]);
                strfmt(l->node, sizeof l->node, "%s", tg->addr);
                l->replica = tg->replica;
                l->version = tg->version;
                l->primary_version = f->sh[j].src[tg->dc].store_version;
                l->lag_ms = tg->data_ms ? now - tg->data_ms : 0;
                strfmt(l->error, sizeof l->error, "%s", tg->error);
            }
    }
    rep->nlag = k;
}

/* Shards of one filter are independent: workers take them in turn from one
 * counter, each with a report of its own, added up at the end. */
struct shard_pool {
    struct merger *m;
    struct mg_filter *f;
    struct topo **topos;
    uint64_t round;
    atomic_uint next;
};

struct shard_work {
    struct shard_pool *pool;
    pthread_t th;
    bool started;
    struct mg_report rep;
};

static void rep_add(struct mg_report *to, const struct mg_report *from)
{
    to->bytes_pulled += from->bytes_pulled;
    to->bytes_pushed += from->bytes_pushed;
    to->pages_pulled += from->pages_pulled;
    to->pages_pushed += from->pages_pushed;
    to->pages_changed += from->pages_changed;
    to->errors += from->errors;
    for (unsigned i = 0; i < from->nmsg && to->nmsg < 16; i++)
        memcpy(to->msg[to->nmsg++], from->msg[i], MG_ERRLEN);
}

static void *shard_worker(void *arg)
{
    struct shard_work *w = arg;
    struct shard_pool *p = w->pool;
    unsigned j;

    while ((j = atomic_fetch_add(&p->next, 1)) < p->f->nshards)
        shard_round(p->m, p->f, &p->f->sh[j], p->topos, p->round, &w->rep);
    return NULL;
}

static void filter_round(struct merger *m, struct mg_filter *f,
                         struct topo **topos, struct mg_report *rep)
{
    struct shard_pool pool = {.m = m, .f = f, .topos = topos,
                              .round = rep->round};
    unsigned nw = (unsigned)m->cfg.workers;
    struct shard_work *w;

    if (nw < 1)
        nw = 1;
    if (nw > f->nshards)
        nw = f->nshards;
    atomic_init(&pool.next, 0);
    if (!(w = calloc(nw, sizeof *w))) {
        rep_msg(rep, true, "out of memory for %u workers", nw);
        return;
    }
    for (unsigned i = 0; i < nw; i++) {
        w[i].pool = &pool;
        w[i].rep.round = rep->round;
        /* Worker 0 is this thread; a worker that cannot start is not
         * needed (the others take its shards). */
        if (i > 0)
            w[i].started = pthread_create(&w[i].th, NULL, shard_worker,
                                          &w[i]) == 0;
    }
    shard_worker(&w[0]);
    for (unsigned i = 0; i < nw; i++) {
        if (w[i].started)
            pthread_join(w[i].th, NULL);
        rep_add(rep, &w[i].rep);
    }
    free(w);
}

/* A datacenter is a topology file, or the address of its one node (a
 * single-node deployment: one group, no replicas). */
static struct topo *dc_topology(const char *where, char *err)
{
    char text[TOPO_ADDR_MAX + 64];

    if (strchr(where, '/') || topo_addr_check(where) != 0)
        return topo_load(where, err);
    strfmt(text, sizeof text, "[group single]\nprimary = %s\n", where);
    return topo_parse(text, where, err);
}

int merger_round(struct merger *m, struct mg_report *rep)
{
    char err[TOPO_ERRLEN];

    memset(rep, 0, sizeof *rep);
    rep->round = ++m->round;
    rep->started_ms = now_ms();
    for (size_t i = 0; i < m->nf; i++) {
        struct mg_filter *f = &m->f[i];
        struct topo *topos[MG_MAX_DC] = {0};
        bool ok = true;
        /* Topologies are read every round: a changed file takes effect. */
        for (unsigned d = 0; d < f->c.ndc; d++)
            if (!(topos[d] = dc_topology(f->c.topo[d], err))) {
                rep_msg(rep, true, "datacenter %s: %s", f->c.dc[d], err);
                ok = false;
            }
        if (ok && filter_prepare(m, f, topos, rep) == 0)
            filter_round(m, f, topos, rep);
        for (unsigned d = 0; d < f->c.ndc; d++)
            topo_unref(topos[d]);
    }
    rep->duration_ms = now_ms() - rep->started_ms;
    report_lag(m, rep);
    pthread_mutex_lock(&m->mu);
    mg_report_free(&m->last);
    m->last = *rep;
    m->last.lag = NULL;
    if (rep->nlag && (m->last.lag = malloc(rep->nlag * sizeof *rep->lag)))
        memcpy(m->last.lag, rep->lag, rep->nlag * sizeof *rep->lag);
    else
        m->last.nlag = 0;
    m->rounds_done++;
    m->total += rep->bytes_pulled + rep->bytes_pushed;
    pthread_mutex_unlock(&m->mu);
    return (int)rep->errors;
}

void merger_last_report(struct merger *m, struct mg_report *rep,
                        uint64_t *rounds, uint64_t *total)
{
    pthread_mutex_lock(&m->mu);
    *rep = m->last;
    rep->lag = NULL;
    if (m->last.nlag && (rep->lag = malloc(m->last.nlag * sizeof *rep->lag)))
        memcpy(rep->lag, m->last.lag, m->last.nlag * sizeof *rep->lag);
    else
        rep->nlag = 0;
    if (rounds)
        *rounds = m->rounds_done;
    if (total)
        *total = m->total;
    pthread_mutex_unlock(&m->mu);
}

void mg_report_free(struct mg_report *rep)
{
    free(rep->lag);
    rep->lag = NULL;
    rep->nlag = 0;
}

void mg_report_log(const struct mg_report *rep)
{
    uint64_t worst = 0;

    for (size_t i = 0; i < rep->nlag; i++)
        if (rep->lag[i].replica && rep->lag[i].lag_ms > worst)
            worst = rep->lag[i].lag_ms;
    log_info("merger: round %" PRIu64 ": %" PRIu64 " ms, pulled %" PRIu64
             " pages (%" PRIu64 " bytes), %" PRIu64 " pages changed, pushed %"
             PRIu64 " pages (%" PRIu64 " bytes), %u errors, replica lag max %"
             PRIu64 " ms", rep->round, rep->duration_ms, rep->pages_pulled,
             rep->bytes_pulled, rep->pages_changed, rep->pages_pushed,
             rep->bytes_pushed, rep->errors, worst);
}

struct merger *merger_create(const struct merger_config *cfg,
                             const struct mg_filter_conf *filters, size_t n,
                             char *err)
{
    struct merger *m = calloc(1, sizeof *m);

    if (!m || !(m->f = calloc(n ? n : 1, sizeof *m->f))) {
        free(m);
        strfmt(err, MG_ERRLEN, "out of memory");
        return NULL;
    }
    m->cfg = *cfg;
    if (mkdir(cfg->state_dir, 0755) < 0 && errno != EEXIST) {
        strfmt(err, MG_ERRLEN, "cannot create state_dir %s: %s",
                 cfg->state_dir, strerror(errno));
        free(m->f);
        free(m);
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        m->f[i].c = filters[i];
    m->nf = n;
    pthread_mutex_init(&m->chan_mu, NULL);
    /* Round 1 is what was loaded from disk: the first round is 2. */
    m->round = 1;
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void merger_destroy(struct merger *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nf; i++) {
        for (uint32_t j = 0; m->f[i].sh && j < m->f[i].nshards; j++) {
            bf_destroy(m->f[i].sh[j].g);
            free(m->f[i].sh[j].stamp);
            free(m->f[i].sh[j].have);
            free(m->f[i].sh[j].tg);
        }
        free(m->f[i].sh);
    }
    for (size_t i = 0; i < m->nchans; i++)
        rpc_channel_destroy(m->chans[i].ch);
    free(m->chans);
    mg_report_free(&m->last);
    pthread_mutex_destroy(&m->mu);
    pthread_mutex_destroy(&m->chan_mu);
    free(m->f);
    free(m);
}
