/* merger_shard: one shard of the merger's global snapshot: its files (the
 * snapshot and the sidecar of what was pulled and which copies are
 * complete), pulls from the datacenters' primaries, partial files, and
 * pushes to every copy.  See merger.h for the round and
 * docs/MERGER.md for why each step is safe to interrupt.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bf.h"
#include "bf_file.h"
#include "durable.h"
#include "log.h"
#include "merger_internal.h"

/* ---- files: STATE_DIR/<filter>/shard-<i>.bf and .state ---- */

void merger__shard_path(const struct merger *m, const struct mg_filter *f,
                        uint32_t i, const char *ext, char *out, size_t len)
{
    merger__strfmt(out, len, "%s/%s/shard-%04u.%s", m->cfg.state_dir, f->c.name,
                   i, ext);
}

/* Is a copy known to hold every page of the snapshot? */
bool merger__target_synced(const struct mg_shard *s, const struct mg_target *t)
{
    for (uint64_t p = 0; p < s->npages; p++)
        if (s->stamp[p] > t->acked)
            return false;
    return t->ready;
}

int merger__dir_make(const char *dir, char *err)
{
    int rc;

    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        rc = -errno;
        merger__strfmt(err, MG_ERRLEN, "cannot create %s: %s", dir,
                       strerror(-rc));
        return rc;
    }
    /* Also when it exists: a run that crashed may have created it without
     * making the entry durable. */
    if ((rc = durable_fsync_parent(dir)) < 0) {
        merger__strfmt(err, MG_ERRLEN, "cannot fsync the directory holding "
                       "%s: %s", dir, strerror(-rc));
        return rc;
    }
    return 0;
}

/* The sidecar, one line each:
 *   S dc epoch since store_version pulled_ms       what was pulled
 *   T addr replica dc version data_ms              a copy holding every
 *                                                  page of the snapshot
 * Written (durable_write_file: temp file, fsync, rename, fsync of the
 * directory) only after the snapshot it describes is on disk. */
int merger__state_save(const struct merger *m, const struct mg_filter *f,
                       struct mg_shard *s, char *err)
{
    char path[MG_PATH_MAX + 64], derr[DURABLE_ERRLEN];
    char *text = NULL;
    size_t len = 0;
    FILE *fp;
    int rc;

    merger__shard_path(m, f, s->index, "state", path, sizeof path);
    if (!(fp = open_memstream(&text, &len))) {
        merger__strfmt(err, MG_ERRLEN, "out of memory for %s", path);
        return -ENOMEM;
    }
    for (unsigned d = 0; d < f->c.ndc; d++)
        fprintf(fp, "S %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
                f->c.dc[d], s->src[d].epoch, s->src[d].since,
                s->src[d].store_version, s->src[d].pulled_ms);
    for (size_t i = 0; i < s->ntg; i++)
        if ((s->tg[i].was_synced = merger__target_synced(s, &s->tg[i])))
            fprintf(fp, "T %s %d %u %" PRIu64 " %" PRIu64 "\n", s->tg[i].addr,
                    s->tg[i].replica, s->tg[i].dc, s->tg[i].version,
                    s->tg[i].data_ms);
    if (fclose(fp) != 0) {
        free(text);
        merger__strfmt(err, MG_ERRLEN, "out of memory for %s", path);
        return -ENOMEM;
    }
    rc = durable_write_file(path, text, len, 0644, derr);
    free(text);
    if (rc < 0)
        merger__strfmt(err, MG_ERRLEN, "%s", derr);
    return rc;
}

/* Synced copies come back with acked = 1: the stamp of every loaded page. */
static void state_load(const struct merger *m, const struct mg_filter *f,
                       struct mg_shard *s)
{
    char path[MG_PATH_MAX + 64], kind[4], name[TOPO_ADDR_MAX + 1];
    uint64_t e, since, sv, ms;
    unsigned dc;
    int repl;
    FILE *fp;

    merger__shard_path(m, f, s->index, "state", path, sizeof path);
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
                          &dc, &sv, &ms) == 5 &&
                   dc < f->c.ndc) {
            struct mg_target *t = merger__target_get(s, name, dc, repl != 0);
            log_debug("merger: \"%s\" shard %u: %s holds every page of the "
                      "saved snapshot",
                      f->c.name, s->index, name);
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

int merger__shard_init(struct merger *m, struct mg_filter *f,
                       struct mg_shard *s, char *err)
{
    char path[MG_PATH_MAX + 64], e2[BF_ERRLEN];
    struct node_client_shard t = f->tmpl;
    struct bf_layer_info li;
    struct bf *g;

    t.shard_index = s->index;
    g = node_client_shard_filter(&t, e2);
    if (!g) {
        merger__strfmt(err, MG_ERRLEN, "filter \"%s\" shard %u: %s", f->c.name,
                       s->index, e2);
        return -EINVAL;
    }
    merger__shard_path(m, f, s->index, "bf", path, sizeof path);
    if (access(path, F_OK) == 0) {
        struct bf *saved = bf_file_load(path, e2, NULL);
        const char *field = saved ? bf_mismatch(g, saved) : NULL;
        if (!saved || field) {
            merger__strfmt(err, MG_ERRLEN, "saved snapshot %s %s%s%s", path,
                           saved ? "differs from the cluster's shard in "
                                 : "is unusable: ",
                           saved ? field : e2,
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
    s->npages = (li.body_bytes + RULES_PAGE_BYTES - 1) / RULES_PAGE_BYTES;
    s->stamp = calloc(s->npages ? s->npages : 1, sizeof *s->stamp);
    s->have = calloc(s->npages ? s->npages : 1, 1);
    if (!s->stamp || !s->have) {
        merger__strfmt(err, MG_ERRLEN, "out of memory");
        return -ENOMEM;
    }
    /* Whatever was saved is new to every copy of this run. */
    const uint64_t *w = bf_layer_body_const(g, 0);
    for (uint64_t p = 0; p < s->npages; p++) {
        uint64_t lo = p * RULES_PAGE_BYTES / 8, hi = (p + 1) * RULES_PAGE_BYTES / 8;
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
            uint64_t p = (off + 8 * i) / RULES_PAGE_BYTES;
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

/* Buffer a pulled page: applied only once the pull completed.  A node
 * sends each changed page once, so a pull of more bytes than the body is
 * refused rather than buffered without end. */
static int pulled_page(void *ctx, uint64_t off, const uint8_t *data, size_t len)
{
    struct pulled *p = ctx;

    if (off % 8 || len % 8 || off > p->s->body_bytes ||
        len > p->s->body_bytes - off || len > p->s->body_bytes - p->data)
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
    p->data += len;
    return 0;
}

/* Does a shard on a node have the snapshot's fingerprint?  Creates it from
 * the template when create and the node lacks it.  Returns 0, or -1 with
 * the reason in why. */
static int shard_ensure(struct merger *m, struct mg_filter *f,
                        struct mg_shard *s, struct rpc_channel *ch, bool create,
                        char *why, size_t whylen)
{
    struct rpc_status st;
    struct node_client_shard theirs, t = f->tmpl;
    char e2[BF_ERRLEN];
    int to = (int)m->cfg.node_timeout_ms;

    if (node_client_get_shard(ch, f->c.name, s->index, &theirs, to, &st) < 0) {
        if (st.code != GRPC_STATUS_NOT_FOUND || !create) {
            merger__strfmt(why, whylen, "%s: %s", rpc_status_name(st.code),
                           st.message);
            return -1;
        }
        t.shard_index = s->index;
        if (node_client_create_shard(ch, f->c.name, &t, to, &st) < 0 &&
            st.code != GRPC_STATUS_ALREADY_EXISTS) {
            merger__strfmt(why, whylen, "cannot create the shard: %s: %s",
                           rpc_status_name(st.code), st.message);
            return -1;
        }
        log_info("merger: created shard %u of \"%s\" from the template",
                 s->index, f->c.name);
        return 0;
    }
    struct bf *b = node_client_shard_filter(&theirs, e2);
    const char *field = b ? bf_mismatch(s->g, b) : "geometry";
    bf_destroy(b);
    if (field) {
        merger__strfmt(why, whylen,
                       "its shard differs from the global snapshot in "
                       "%s; refused",
                       field);
        return -1;
    }
    return 0;
}

/* Pull from one copy (addr) of a datacenter's group and OR the pages in.
 * Returns 0, or -1 (reported) when the pull failed.  The pages stay
 * in *pp (the caller frees pp->buf) to tell later which of them the source
 * already holds in full. */
int merger__pull_one(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                      unsigned d, const char *addr, uint64_t round,
                      struct mg_report *rep, struct pulled *pp)
{
    struct rpc_channel *ch = merger__chan(m, addr);
    struct pulled p = {.s = s};
    struct node_client_pull_end end;
    struct rpc_status st;
    char why[300];
    uint64_t t0 = merger__now_ms();

    if (!ch) {
        merger__rep_msg(rep, true, "out of memory for a channel to %s", addr);
        return -1;
    }
    if (s->src[d].epoch == 0 &&
        shard_ensure(m, f, s, ch, true, why, sizeof why) < 0) {
        merger__rep_msg(rep, true, "filter \"%s\" shard %u in %s (%s): %s",
                        f->c.name, s->index, f->c.dc[d], addr, why);
        return -1;
    }
    if (node_client_pull(ch, f->c.name, s->index, s->src[d].since,
                         s->src[d].epoch, pulled_page, &p, &end,
                         (int)m->cfg.node_timeout_ms * 4, &st) < 0) {
        merger__rep_msg(rep, true,
                        "pull of \"%s\" shard %u from %s (%s): %s: %s",
                        f->c.name, s->index, f->c.dc[d], addr,
                        rpc_status_name(st.code), st.message);
        free(p.buf);
        return -1;
    }
    if (strcmp(end.fp, s->fp) != 0) {
        merger__rep_msg(
            rep, true,
            "pull of \"%s\" shard %u from %s (%s) refused: "
            "fingerprint %s, the global snapshot's is %s (another secret "
            "or geometry)",
            f->c.name, s->index, f->c.dc[d], addr, end.fp, s->fp);
        free(p.buf);
        return -1;
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
    return 0;
}

/* OR in a partial file when it changed since it was last merged. */
void merger__partial_one(struct mg_filter *f, struct mg_shard *s, unsigned i,
                         uint64_t round, struct mg_report *rep)
{
    const char *path = f->c.part[i];
    struct mg_part *ps = &s->part[i];
    char e2[BF_ERRLEN];
    struct stat sb;

    if (stat(path, &sb) < 0) {
        merger__rep_msg(rep, true, "partial %s: %s", path, strerror(errno));
        return;
    }
    if (ps->merged && ps->mtime == sb.st_mtime && ps->size == sb.st_size)
        return;
    struct bf *b = bf_file_load(path, e2, NULL);
    if (!b) {
        merger__rep_msg(rep, true, "partial %s refused: %s", path, e2);
        return;
    }
    if (bf_shard_count(b) == bf_shard_count(s->g) &&
        bf_shard_index(b) != s->index) {
        bf_destroy(b); /* another shard's file */
        return;
    }
    const char *field = bf_mismatch(s->g, b);
    if (field) {
        merger__rep_msg(rep, true,
                        "partial %s refused for filter \"%s\" shard %u: "
                        "field \"%s\" differs",
                        path, f->c.name, s->index, field);
        bf_destroy(b);
        ps->merged = true; /* reported once per change of the file */
        ps->mtime = sb.st_mtime;
        ps->size = sb.st_size;
        return;
    }
    struct bf_merge_projection proj;
    if (bf_merge_project(s->g, b, &proj, e2) == 0 && proj.over_target)
        merger__rep_msg(rep, false,
                        "partial %s: merged estimated FPR %.4g exceeds "
                        "the target %.4g of \"%s\" shard %u",
                        path, proj.estimated_fpr, bf_error_rate(s->g),
                        f->c.name, s->index);
    rep->pages_changed += shard_or(s, 0, (const uint8_t *)bf_layer_body(b, 0),
                                   (size_t)s->body_bytes, round);
    bf_destroy(b);
    ps->merged = true;
    ps->mtime = sb.st_mtime;
    ps->size = sb.st_size;
    log_info("merger: merged partial %s into \"%s\" shard %u", path, f->c.name,
             s->index);
}

/* ---- pushes ---- */

struct mg_target *merger__target_get(struct mg_shard *s, const char *addr,
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
    merger__strfmt(t->addr, sizeof t->addr, "%s", addr);
    t->dc = dc;
    t->replica = replica;
    return t;
}

void merger__push_one(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                      struct mg_target *t, uint64_t round,
                      struct mg_report *rep)
{
    struct rpc_channel *ch = merger__chan(m, t->addr);
    struct node_client_page *pg = NULL;
    struct rpc_status st;
    size_t n = 0;
    uint64_t bytes = 0;
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(s->g, 0);

    if (!ch)
        return;
    if (!t->ready) {
        if (shard_ensure(m, f, s, ch, true, t->error, sizeof t->error) < 0) {
            merger__text_clean(t->error);
            merger__rep_msg(rep, true,
                            "push of \"%s\" shard %u to %s (%s %s): %s",
                            f->c.name, s->index, t->addr, f->c.dc[t->dc],
                            t->replica ? "copy" : "source copy", t->error);
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
        uint64_t off = p * RULES_PAGE_BYTES;
        size_t len = s->body_bytes - off < RULES_PAGE_BYTES
                         ? (size_t)(s->body_bytes - off)
                         : RULES_PAGE_BYTES;
        pg[n++] = (struct node_client_page){off, body + off, len};
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
        if (node_client_push(ch, f->c.name, s->index, s->fp,
                             t->replica ? s->src[t->dc].store_version : 0,
                             pg + first, last - first, NULL,
                             (int)m->cfg.node_timeout_ms * 4, &st) < 0) {
            merger__strfmt(t->error, sizeof t->error, "%s: %s",
                           rpc_status_name(st.code), st.message);
            merger__text_clean(t->error);
            merger__rep_msg(rep, true,
                            "push of \"%s\" shard %u to %s (%s %s): %s",
                            f->c.name, s->index, t->addr, f->c.dc[t->dc],
                            t->replica ? "copy" : "source copy", t->error);
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
