/* merger_shard: one shard of the merger's global snapshot: its files (the
 * snapshot and the sidecar of what was pulled and which copies are
 * complete), pulls from the copies of its groups, partial files, and
 * pushes to every copy.  See merger.h for the round and
 * docs/MERGER.md for why each step is safe to interrupt.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"
#include "bundle.h"
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
bool merger__copy_synced(const struct mg_shard *s, const struct mg_copy *c)
{
    for (uint64_t p = 0; p < s->npages; p++)
        if (s->stamp[p] > c->acked)
            return false;
    return c->ready;
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

/* The sidecar (format MG_STATE_VERSION), one line each:
 *   bloomgrid-merger-state 2                        the format
 *   G hash                                          XXH3-64 of the snapshot
 *                                                   body it describes
 *   C dc addr epoch since store_version pulled_ms   a copy's pull cursor
 *   T dc addr data_ms                               a copy holding every
 *                                                   page of that snapshot
 * Written (durable_write_file: temp file, fsync, rename, fsync of the
 * directory) only after the snapshot it describes is on disk.  A merger
 * stopped between the two leaves a newer snapshot than the sidecar: its
 * cursors stay true (what they pulled is in the newer snapshot too), its
 * T lines do not, hence the hash. */
static uint64_t body_hash(const struct bf *g, uint64_t body_bytes)
{
    return XXH3_64bits(bf_layer_body_const(g, 0), (size_t)body_bytes);
}

/* body_hash of an empty snapshot, without reading (and so faulting in) the
 * untouched body of a blank filter. */
static uint64_t zero_hash(uint64_t body_bytes)
{
    static const uint8_t zeros[RULES_PAGE_BYTES];
    XXH3_state_t *st = XXH3_createState();
    uint64_t h;

    if (!st)
        return 0;   /* no T line will match: full pushes, always safe */
    XXH3_64bits_reset(st);
    for (uint64_t left = body_bytes; left > 0;) {
        size_t n = left < sizeof zeros ? (size_t)left : sizeof zeros;
        XXH3_64bits_update(st, zeros, n);
        left -= n;
    }
    h = XXH3_64bits_digest(st);
    XXH3_freeState(st);
    return h;
}

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
    if (s->g)
        s->hash = body_hash(s->g, s->body_bytes);
    fprintf(fp, "%s %d\nG %016" PRIx64 "\n", MG_STATE_MAGIC, MG_STATE_VERSION,
            s->hash);
    for (size_t i = 0; i < s->ncp; i++) {
        const struct mg_copy *c = &s->cp[i];
        if (c->epoch)
            fprintf(fp, "C %s %s %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
                    "\n", f->c.dc[c->dc], c->addr, c->epoch, c->since,
                    c->store_version, c->pulled_ms);
    }
    for (size_t i = 0; i < s->ncp; i++)
        if ((s->cp[i].was_synced = merger__copy_synced(s, &s->cp[i])))
            fprintf(fp, "T %s %s %" PRIu64 "\n", f->c.dc[s->cp[i].dc],
                    s->cp[i].addr, s->cp[i].data_ms);
    /* Last: a merger that does not know R lines stops reading there. */
    for (size_t i = 0; i < s->ncp; i++)
        if (s->cp[i].resynced)
            fprintf(fp, "R %s %s\n", f->c.dc[s->cp[i].dc], s->cp[i].addr);
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

static int dc_index(const struct mg_filter *f, const char *name)
{
    for (unsigned d = 0; d < f->c.ndc; d++)
        if (!strcmp(f->c.dc[d], name))
            return (int)d;
    return -1;
}

/* A copy holds every page of the saved snapshot: it comes back with
 * acked = 1, the stamp of every loaded page. */
static void state_synced(const struct mg_filter *f, struct mg_shard *s,
                         const char *addr, unsigned dc, uint64_t data_ms)
{
    struct mg_copy *c = merger__copy_get(s, addr, dc);

    log_debug("merger: \"%s\" shard %u: %s holds every page of the saved "
              "snapshot", f->c.name, s->index, addr);
    if (c) {
        c->ready = true;
        c->was_synced = true;
        c->acked = 1;
        c->data_ms = data_ms;
    }
}

/* One line of the first merger's sidecar, which had no format line:
 *   S dc epoch since store_version pulled_ms        one cursor per
 *                                                   datacenter
 *   T addr replica dc-index version data_ms         a copy holding every
 *                                                   page of the snapshot
 * Both are dropped: a datacenter's cursor names no copy, and the T lines
 * are not tied to the snapshot they describe (a merger stopped between
 * saving the snapshot and the sidecar left them wrong).  The next round
 * pulls every page of the copies it asks and pushes every copy all it
 * lacks: always safe, once. */
static bool state_line_v1(const char *line)
{
    return (line[0] == 'S' || line[0] == 'T') && line[1] == ' ';
}

/* A line of the current format; *t_ok: a G line matched the snapshot
 * (T lines before it or without it are not trusted). */
static bool state_line_v2(const struct mg_filter *f, struct mg_shard *s,
                          const char *line, uint64_t hash, bool *t_ok)
{
    char dcn[64], addr[TOPO_ADDR_MAX + 1];
    uint64_t e, since, sv, ms, g;
    int d;

    if (sscanf(line, "G %" SCNx64, &g) == 1) {
        if (!(*t_ok = g == hash))
            log_info("merger: \"%s\" shard %u: the sidecar describes "
                     "another snapshot than the one saved (the merger "
                     "stopped between the two): every copy gets what it "
                     "lacks pushed", f->c.name, s->index);
        return true;
    }
    if (sscanf(line, "C %63s %127s %" SCNu64 " %" SCNu64 " %" SCNu64
               " %" SCNu64, dcn, addr, &e, &since, &sv, &ms) == 6) {
        struct mg_copy *c;
        if ((d = dc_index(f, dcn)) >= 0 &&
            (c = merger__copy_get(s, addr, (unsigned)d))) {
            c->epoch = e;
            c->since = since;
            c->store_version = sv;
            c->pulled_ms = ms;
        }
        return true;
    }
    if (sscanf(line, "T %63s %127s %" SCNu64, dcn, addr, &ms) == 3) {
        if (*t_ok && (d = dc_index(f, dcn)) >= 0)
            state_synced(f, s, addr, (unsigned)d, ms);
        return true;
    }
    if (sscanf(line, "R %63s %127s", dcn, addr) == 2) {
        struct mg_copy *c;
        if ((d = dc_index(f, dcn)) >= 0 &&
            (c = merger__copy_get(s, addr, (unsigned)d)))
            c->resynced = true;
        return true;
    }
    return false;
}

/* Read the sidecar.  What cannot be read is forgotten, with a warning:
 * a copy without a cursor gets a full pull, one not known to be complete a
 * full push, both always safe. */
static void state_load(const struct merger *m, const struct mg_filter *f,
                       struct mg_shard *s)
{
    char path[MG_PATH_MAX + 64], line[512], magic[32];
    int version = 0, v;
    bool t_ok = false;
    uint64_t hash = s->hash;
    FILE *fp;

    merger__shard_path(m, f, s->index, "state", path, sizeof path);
    if (!(fp = fopen(path, "r")))
        return;
    for (unsigned n = 1; fgets(line, sizeof line, fp); n++) {
        if (n == 1) {
            if (sscanf(line, "%31s %d", magic, &v) == 2 &&
                !strcmp(magic, MG_STATE_MAGIC)) {
                if (v != MG_STATE_VERSION) {
                    log_warn("merger: %s has format %d, this merger writes "
                             "%d: ignored (every copy gets a full pull and "
                             "push)", path, v, MG_STATE_VERSION);
                    break;
                }
                version = v;
                continue;
            }
            version = 1;
            log_info("merger: %s is in the first merger's format: it is "
                     "dropped (the next round pulls every page of the "
                     "copies it asks once, and pushes every copy what it "
                     "lacks)", path);
        }
        bool ok = version == 1 ? state_line_v1(line)
                               : state_line_v2(f, s, line, hash, &t_ok);
        if (!ok) {
            log_warn("merger: %s:%u cannot be read: the rest of the file is "
                     "ignored (full pulls and pushes)", path, n);
            break;
        }
    }
    fclose(fp);
}

/* ---- the global snapshot of one shard ---- */

/* An empty filter with the geometry and secret of shard i (its body is an
 * untouched anonymous mapping: it costs no memory until written). */
static struct bf *shard_blank(const struct mg_filter *f, uint32_t i, char *e2)
{
    struct node_client_shard t = f->tmpl;

    t.shard_index = i;
    return node_client_shard_filter(&t, e2);
}

/* The pages of g that hold a bit get stamp 1 (whatever was saved is new to
 * every copy of this run), the others 0. */
static void stamps_from(struct mg_shard *s, const struct bf *g)
{
    const uint64_t *w = bf_layer_body_const(g, 0);

    for (uint64_t p = 0; p < s->npages; p++) {
        uint64_t lo = p * RULES_PAGE_BYTES / 8;
        uint64_t hi = (p + 1) * RULES_PAGE_BYTES / 8;
        if (hi > s->body_bytes / 8)
            hi = s->body_bytes / 8;
        s->stamp[p] = 0;
        for (uint64_t i = lo; i < hi; i++)
            if (w[i]) {
                s->stamp[p] = 1;
                break;
            }
    }
}

void merger__shard_forget(struct mg_shard *s)
{
    for (size_t i = 0; i < s->ncp; i++)
        s->cp[i].epoch = s->cp[i].since = 0;
    for (unsigned i = 0; i < MG_MAX_PARTIALS; i++)
        s->part[i].merged = false;
}

/* A snapshot file that failed its checks: moved aside (shard-<i>.bf.damaged,
 * replacing an older one) so that it is never loaded or pushed, and the
 * shard rebuilt by full pulls. */
static void shard_damaged(struct merger *m, struct mg_filter *f,
                          struct mg_shard *s, const char *path, const char *why,
                          struct mg_report *rep)
{
    char aside[MG_PATH_MAX + 80];
    int rc;

    merger__shard_path(m, f, s->index, "bf.damaged", aside, sizeof aside);
    rc = rename(path, aside) == 0 ? 0 : -errno;
    /* The sidecar describes what is gone (its cursors would skip the pages
     * lost): it goes too, before anything else is written. */
    merger__shard_path(m, f, s->index, "state", aside, sizeof aside);
    if (unlink(aside) < 0 && errno != ENOENT && rc == 0)
        rc = -errno;
    if (rc == 0)
        rc = durable_fsync_parent(path);
    if (rep)
        merger__rep_msg(rep, true,
                        "saved snapshot %s refused: %s; %s, the shard is "
                        "rebuilt by full pulls", path, why,
                        rc == 0 ? "moved to .bf.damaged, its sidecar removed"
                                : strerror(-rc));
    else
        log_error("merger: saved snapshot %s refused: %s; %s, the shard is "
                  "rebuilt by full pulls", path, why,
                  rc == 0 ? "moved to .bf.damaged, its sidecar removed"
                          : strerror(-rc));
    merger__shard_forget(s);
    s->dirty = true;
    s->rebuilt = rep != NULL;
}

/* Load the saved snapshot of s, or a blank one when none was saved or it
 * is damaged (fails its checks: then moved aside, see shard_damaged).
 * NULL with err when it cannot be read (out of memory, a failed read,
 * another format version) or is of another geometry or secret. */
static struct bf *snapshot_read(struct merger *m, struct mg_filter *f,
                                struct mg_shard *s, struct mg_report *rep,
                                bool *damaged, bool *loaded, char *err)
{
    char path[MG_PATH_MAX + 64], e2[BF_ERRLEN];
    struct bf *g = shard_blank(f, s->index, e2);
    int code = 0;

    *damaged = *loaded = false;
    if (!g) {
        merger__strfmt(err, MG_ERRLEN, "filter \"%s\" shard %u: %s", f->c.name,
                       s->index, e2);
        return NULL;
    }
    merger__shard_path(m, f, s->index, "bf", path, sizeof path);
    if (access(path, F_OK) != 0)
        return g;
    struct bf *saved = bf_file_load(path, e2, &code);
    if (!saved) {
        /* Only a file that fails its checks is damaged; a failed read or
         * another format version is an error of the round (the file is
         * kept and read again next time). */
        if (code != -EBADMSG) {
            merger__strfmt(err, MG_ERRLEN, "saved snapshot %s: %s", path, e2);
            bf_destroy(g);
            return NULL;
        }
        shard_damaged(m, f, s, path, e2, rep);
        *damaged = true;
        return g;
    }
    const char *field = bf_mismatch(g, saved);
    if (field) {
        merger__strfmt(err, MG_ERRLEN, "saved snapshot %s differs from the "
                       "cluster's shard in %s (move it away to start over)",
                       path, field);
        bf_destroy(saved);
        bf_destroy(g);
        return NULL;
    }
    bf_destroy(g);
    *loaded = true;
    return saved;
}

int merger__shard_init(struct merger *m, struct mg_filter *f,
                       struct mg_shard *s, struct mg_report *rep, char *err)
{
    struct bf_layer_info li;
    bool damaged, loaded;
    struct bf *g = snapshot_read(m, f, s, rep, &damaged, &loaded, err);

    if (!g)
        return -EINVAL;
    bf_layer_info(g, 0, &li);
    bf_fingerprint_id(g, s->fp);
    s->body_bytes = li.body_bytes;
    s->npages = (li.body_bytes + RULES_PAGE_BYTES - 1) / RULES_PAGE_BYTES;
    s->stamp = calloc(s->npages ? s->npages : 1, sizeof *s->stamp);
    if (!s->stamp) {
        bf_destroy(g);
        merger__strfmt(err, MG_ERRLEN, "out of memory");
        return -ENOMEM;
    }
    if (loaded) {
        stamps_from(s, g);
        s->hash = body_hash(g, s->body_bytes);
    } else {
        s->hash = zero_hash(s->body_bytes);
    }
    /* The snapshot is read once here and not kept: a round loads it again
     * when it needs its bits. */
    bf_destroy(g);
    /* A damaged snapshot's sidecar describes what is gone: its cursors
     * would skip the pages lost, its T lines claim copies complete. */
    if (!damaged)
        state_load(m, f, s);
    return 0;
}

int merger__shard_load(struct merger *m, struct mg_filter *f,
                       struct mg_shard *s, struct mg_report *rep)
{
    char err[MG_ERRLEN];
    bool damaged, loaded;

    if (s->g)
        return 0;
    if (!(s->g = snapshot_read(m, f, s, rep, &damaged, &loaded, err))) {
        merger__rep_msg(rep, true, "%s", err);
        return -1;
    }
    if (damaged) {
        /* Pages stamped before stay stamped (copies that got them keep
         * them); what the full pulls bring back is stamped anew. */
        s->hash = zero_hash(s->body_bytes);
    }
    return 0;
}

void merger__shard_unload(struct mg_shard *s)
{
    bf_destroy(s->g);
    s->g = NULL;
    free(s->have);
    s->have = NULL;
    s->rebuilt = false;
    if (s->kfp)
        fclose(s->kfp);
    s->kfp = NULL;
    s->kkeys = 0;
    memset(s->kslot, 0, sizeof s->kslot);
    s->kbad = s->paged = false;
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
            s->paged = true;
            uint64_t p = (off + 8 * i) / RULES_PAGE_BYTES;
            s->have[p] = 0;    /* no copy pulled before holds it whole */
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

/* An unlinked temp file dir/<what>.tmp.XXXXXX (gone with the last
 * descriptor, even on a crash); NULL with *err a negative errno. */
static FILE *temp_open(const char *dir, const char *what, int *err)
{
    char tmp[MG_PATH_MAX + 220];
    FILE *fp;

    merger__strfmt(tmp, sizeof tmp, "%s/%s.tmp.XXXXXX", dir, what);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        *err = -errno;
        return NULL;
    }
    unlink(tmp);
    if (!(fp = fdopen(fd, "w+"))) {
        *err = -errno;
        close(fd);
    }
    return fp;
}

/* Buffer a pulled page on disk: applied only once the pull completed.  A
 * node sends each changed page once, so a pull of more bytes than the body
 * is refused rather than buffered without end. */
static int pulled_write(struct pulled *p, uint64_t off, const uint8_t *data,
                        uint64_t len)
{
    uint64_t hdr[2] = {off, len};

    if (!p->fp && !(p->fp = temp_open(p->dir, "pull", &p->err)))
        return -1;
    if (fwrite(hdr, sizeof hdr, 1, p->fp) != 1 ||
        (len && fwrite(data, len, 1, p->fp) != 1)) {
        p->err = -(errno ? errno : EIO);
        return -1;
    }
    p->data += len;
    return 0;
}

static int pulled_page(void *ctx, uint64_t off, const uint8_t *data, size_t len)
{
    struct pulled *p = ctx;

    if (off % 8 || len % 8 || off > p->s->body_bytes ||
        len > p->s->body_bytes - off || len > p->s->body_bytes - p->data)
        return -1;
    return pulled_write(p, off, data, len);
}

/* Buffer keys' hashes a node sent instead of pages, in the same temp
 * file, under offset UINT64_MAX; never more bytes than the body. */
#define PULLED_KEYS UINT64_MAX

static int pulled_keys(void *ctx, const uint8_t *h, size_t n)
{
    struct pulled *p = ctx;
    uint64_t len = (uint64_t)n * 16;

    if (len > p->s->body_bytes - p->data)
        return -1;
    return pulled_write(p, PULLED_KEYS, h, len);
}

static void pulled_free(struct pulled *p)
{
    if (p->fp)
        fclose(p->fp);
    p->fp = NULL;
}

/* Is the node at ch a copy that is re-syncing as a whole (ListShards'
 * copy_state: its epoch not yet checked, a new directory, or refilling a
 * lost one: docs/REPLICATION.md, "Re-created copies")?  Such a copy
 * re-creates by itself every shard its group holds, SYNCING, and fills it
 * by full pulls.  False when the node does not say (an older node, a
 * stand-alone one, a failed call). */
static bool copy_resyncing(struct merger *m, struct rpc_channel *ch)
{
    Bloomgrid__V1__ListShardsResponse *ls = NULL;
    struct rpc_status st;
    bool r;

    if (node_client_list_shards(ch, 0, NULL, &ls, (int)m->cfg.node_timeout_ms,
                                &st) < 0)
        return false;
    r = ls->copy_state == BLOOMGRID__V1__COPY_STATE__COPY_STATE_CHECKING ||
        ls->copy_state == BLOOMGRID__V1__COPY_STATE__COPY_STATE_NEW ||
        ls->copy_state == BLOOMGRID__V1__COPY_STATE__COPY_STATE_REFILLING;
    bloomgrid__v1__list_shards_response__free_unpacked(ls, NULL);
    return r;
}

/* shard_ensure's flags and answers. */
enum {
    ENSURE_CREATE = 1,        /* create the shard from the template when the
                                 node lacks it */
    ENSURE_LATER_MISSING = 2, /* not when the node re-syncs as a whole */
    ENSURE_LATER_SYNCING = 4, /* a shard there that is SYNCING: later */
};
#define ENSURE_OK 0
#define ENSURE_RESYNC_MISSING 1   /* lacks it and re-syncs: not created */
#define ENSURE_RESYNC_SYNCING 2   /* holds it, SYNCING */

/* Does a shard on a node have the snapshot's fingerprint?  Creates it from
 * the template (ENSURE_CREATE) when the node lacks it, unless
 * ENSURE_LATER_MISSING and the node re-syncs (copy_resyncing: it creates
 * the shard itself).  Returns ENSURE_OK, ENSURE_RESYNC_MISSING,
 * ENSURE_RESYNC_SYNCING (only with ENSURE_LATER_SYNCING), or -1 with the
 * reason in why. */
static int shard_ensure(struct merger *m, struct mg_filter *f,
                        struct mg_shard *s, struct rpc_channel *ch, int how,
                        char *why, size_t whylen)
{
    struct rpc_status st;
    struct node_client_shard theirs, t = f->tmpl;
    char e2[BF_ERRLEN];
    int to = (int)m->cfg.node_timeout_ms;

    if (node_client_get_shard(ch, f->c.name, s->index, &theirs, to, &st) < 0) {
        if (st.code != GRPC_STATUS_NOT_FOUND || !(how & ENSURE_CREATE)) {
            merger__strfmt(why, whylen, "%s: %s", rpc_status_name(st.code),
                           st.message);
            return -1;
        }
        if ((how & ENSURE_LATER_MISSING) && copy_resyncing(m, ch)) {
            merger__strfmt(why, whylen, "lacks the shard and re-syncs from "
                           "its group (it re-creates the shard itself)");
            return ENSURE_RESYNC_MISSING;
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
        return ENSURE_OK;
    }
    struct bf *b = node_client_shard_filter(&theirs, e2);
    struct bf *ours = shard_blank(f, s->index, e2);
    const char *field = b && ours ? bf_mismatch(ours, b) : "geometry";
    bf_destroy(b);
    bf_destroy(ours);
    if (field) {
        merger__strfmt(why, whylen,
                       "its shard differs from the global snapshot in "
                       "%s; refused",
                       field);
        return -1;
    }
    if ((how & ENSURE_LATER_SYNCING) && theirs.syncing) {
        merger__strfmt(why, whylen, "its shard is SYNCING (it fills from "
                       "its group)");
        return ENSURE_RESYNC_SYNCING;
    }
    return ENSURE_OK;
}

bool merger__copy_back(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                       struct mg_copy *c)
{
    struct rpc_channel *ch;
    char why[300];

    if (!c->resynced || !(ch = merger__chan(m, c->addr)))
        return false;
    /* No ENSURE_CREATE: a copy that lacks the shard is still re-creating it. */
    return shard_ensure(m, f, s, ch, ENSURE_LATER_SYNCING, why, sizeof why) ==
           ENSURE_OK;
}

/* Keep the keys of a pull from the copy with slot that set a bit the
 * snapshot lacked (16 bytes each, as pulled) in s->kfp, for the pushes of
 * the round.  A key that set no bit adds nothing to the snapshot as it
 * then was (its bits are those of the snapshot before the round and of
 * keys kept before it), so a copy that held the snapshot when the round
 * began and adds the kept keys holds the snapshot the keys made.  When the
 * file cannot be written, the round pushes pages (s->kbad). */
static void keys_keep(struct mg_shard *s, const char *dir, int slot,
                      const uint8_t *h, const bool *added, size_t n)
{
    uint8_t buf[16 * 1024];
    uint32_t hdr[2] = {(uint32_t)slot, 0};
    int err = 0;

    if (slot < 0 || slot >= 64)
        s->kbad = true;   /* not kept: what a copy lacks is then pages */
    if (s->kbad)
        return;
    for (size_t i = 0; i < n; i++)
        if (added[i])
            memcpy(buf + 16 * hdr[1]++, h + 16 * i, 16);
    if (!hdr[1])
        return;
    if (!s->kfp && !(s->kfp = temp_open(dir, "keys", &err))) {
        log_warn("merger: shard %u: cannot keep the round's keys in %s (%s): "
                 "pages are pushed", s->index, dir, strerror(-err));
        s->kbad = true;
        return;
    }
    if (fwrite(hdr, sizeof hdr, 1, s->kfp) != 1 ||
        fwrite(buf, 16, hdr[1], s->kfp) != hdr[1]) {
        log_warn("merger: shard %u: cannot keep the round's keys in %s (%s): "
                 "pages are pushed", s->index, dir, strerror(errno));
        s->kbad = true;
        return;
    }
    s->kkeys += hdr[1];
    s->kslot[slot] += hdr[1];
}

/* Add n keys' hashes (16 bytes each, little-endian {h1, h2}) pulled from
 * the copy with slot to the snapshot, its page versions stamped with *kst
 * (a new one for the first keys of a pull: the snapshot is tracked from
 * then on); those that set a bit are kept for the pushes (keys_keep).
 * Returns 0 or -ENOMEM. */
static int keys_apply(struct mg_shard *s, const char *dir, int slot,
                      const uint8_t *h, size_t n, uint64_t *kst)
{
    enum { BATCH = 1024 };
    struct bf_hash v[BATCH];
    bool added[BATCH];

    if (!*kst) {
        if (!bf_tracked(s->g) && bf_track_pages(s->g, true) < 0)
            return -ENOMEM;
        *kst = ++s->kstamp;
        bf_set_stamp(s->g, *kst);
    }
    for (size_t i = 0; i < n; i += BATCH) {
        size_t m = n - i < BATCH ? n - i : BATCH;
        for (size_t j = 0; j < m; j++) {
            const uint8_t *p = h + 16 * (i + j);
            uint64_t h1 = 0, h2 = 0;
            for (int k = 7; k >= 0; k--) {
                h1 = h1 << 8 | p[k];
                h2 = h2 << 8 | p[8 + k];
            }
            v[j] = (struct bf_hash){h1, h2};
        }
        bf_add_hashes(s->g, v, m, added);
        keys_keep(s, dir, slot, h + 16 * i, added, m);
    }
    return 0;
}

/* The pages the keys of a pull from the copy with slot changed (page
 * versions kst): stamped with the round, and held whole by no copy pulled
 * before (as shard_or), but for the copy the keys came from when it held
 * the page whole before (no change to it since the last round it acked:
 * it holds the snapshot's page and its own keys, which is now the whole
 * page), so the push does not send it back.  Returns how many changed. */
static uint64_t keys_stamped(struct mg_shard *s, uint64_t kst, uint64_t round,
                             int slot, uint64_t acked)
{
    const uint64_t sub = RULES_PAGE_BYTES / BF_PAGE_BYTES;
    uint64_t changed = 0, n4 = bf_layer_pages(s->g, 0);

    for (uint64_t p = 0; p < s->npages; p++) {
        bool hit = false;
        for (uint64_t i = p * sub; i < (p + 1) * sub && i < n4 && !hit; i++)
            hit = bf_page_version(s->g, 0, i) == kst;
        if (!hit)
            continue;
        bool held = acked && s->stamp[p] <= acked;
        s->have[p] = held ? 1ull << slot : 0;
        if (s->stamp[p] != round) {
            s->stamp[p] = round;
            changed++;
        }
    }
    /* The next pull's keys stamp another version: only the pages they
     * mark read as it. */
    bf_fold_versions(s->g, kst);
    return changed;
}

/* OR in the pages of a complete pull from the copy with slot, read back
 * from the temp file a page at a time, and add the keys' hashes it brought
 * instead of pages (keys_apply, keys_stamped); a whole page the snapshot now
 * equals is one that copy needs no push of (unless a later pull or partial
 * of the round changes it: shard_or clears it).  Returns 0, or a negative
 * errno when the file cannot be read back (the bits applied so far stay:
 * they only add). */
static int pulled_apply(struct mg_shard *s, struct pulled *p, int slot,
                        uint64_t acked, uint64_t round, struct mg_report *rep)
{
    const uint8_t *body = (const uint8_t *)bf_layer_body_const(s->g, 0);
    uint8_t *page = NULL;
    size_t cap = 0;
    uint64_t hdr[2], kst = 0;
    int rc = 0;

    if (!p->fp)
        return 0;
    if (fflush(p->fp) != 0 || fseeko(p->fp, 0, SEEK_SET) != 0)
        return -(errno ? errno : EIO);
    while (fread(hdr, sizeof hdr, 1, p->fp) == 1) {
        uint64_t off = hdr[0], len = hdr[1];
        if (len > cap) {
            uint8_t *nb = realloc(page, len);
            if (!nb) {
                rc = -ENOMEM;
                break;
            }
            page = nb;
            cap = len;
        }
        if (len && fread(page, len, 1, p->fp) != 1) {
            rc = -EIO;
            break;
        }
        if (off == PULLED_KEYS) {
            if ((rc = keys_apply(s, p->dir, slot, page, len / 16, &kst)) < 0)
                break;
            continue;
        }
        rep->pages_changed += shard_or(s, off, page, len, round);
        if (off % RULES_PAGE_BYTES == 0 &&
            (len == RULES_PAGE_BYTES || off + len == s->body_bytes) &&
            memcmp(page, body + off, len) == 0)
            s->have[off / RULES_PAGE_BYTES] |= 1ull << slot;
    }
    if (rc == 0 && ferror(p->fp))
        rc = -EIO;
    if (kst)
        rep->pages_changed += keys_stamped(s, kst, round, slot, acked);
    free(page);
    return rc;
}

int merger__pull_one(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                     struct mg_copy *c, int slot, uint64_t round,
                     struct mg_report *rep)
{
    struct rpc_channel *ch = merger__chan(m, c->addr);
    char dir[MG_PATH_MAX + 200];
    struct pulled p = {.s = s, .dir = dir};
    struct node_client_pull_end end;
    struct rpc_status st;
    const char *dc = f->c.dc[c->dc];
    char why[300];
    uint64_t t0 = merger__now_ms();
    bool full = c->since == 0;
    int rc;

    merger__strfmt(dir, sizeof dir, "%s/%s", m->cfg.state_dir, f->c.name);
    if (!ch) {
        merger__rep_msg(rep, true, "out of memory for a channel to %s", c->addr);
        return -1;
    }
    /* A copy that lacks the shard because it re-syncs as a whole (a wiped
     * directory) is not given one: it re-creates its shards itself and
     * fills them from its group.  It counts as SYNCING (not towards R). */
    if (c->epoch == 0 &&
        (rc = shard_ensure(m, f, s, ch, ENSURE_CREATE | ENSURE_LATER_MISSING,
                           why, sizeof why)) != ENSURE_OK) {
        if (rc < 0) {
            merger__rep_msg(rep, true, "filter \"%s\" shard %u in %s (%s): %s",
                            f->c.name, s->index, dc, c->addr, why);
            return -1;
        }
        log_debug("merger: \"%s\" shard %u in %s (%s) %s: not pulled",
                  f->c.name, s->index, dc, c->addr, why);
        c->since = 0;
        c->ready = false;
        c->acked = 0;
        c->in_sync = false;
        return 0;
    }
    /* Keys' hashes instead of pages when the node finds them smaller
     * (docs/MERGER.md); a full pull is pages. */
    if (node_client_pull_keys(ch, 0, NULL, 0, f->c.name, s->index, c->since,
                              c->epoch, pulled_page,
                              c->since ? pulled_keys : NULL, &p, &end,
                              (int)m->cfg.node_timeout_ms * 4, &st) < 0) {
        if (p.err)
            merger__rep_msg(rep, true, "pull of \"%s\" shard %u from %s (%s): "
                            "cannot buffer its pages in %s: %s", f->c.name,
                            s->index, dc, c->addr, dir, strerror(-p.err));
        else
            merger__rep_msg(rep, true,
                            "pull of \"%s\" shard %u from %s (%s): %s: %s",
                            f->c.name, s->index, dc, c->addr,
                            rpc_status_name(st.code), st.message);
        /* The copy lost the shard: the push creates it again, and the
         * next pull starts from nothing. */
        if (st.code == GRPC_STATUS_NOT_FOUND) {
            c->epoch = c->since = 0;
            c->ready = false;
            c->acked = 0;
        }
        pulled_free(&p);
        return -1;
    }
    if (strcmp(end.fp, s->fp) != 0) {
        merger__rep_msg(
            rep, true,
            "pull of \"%s\" shard %u from %s (%s) refused: "
            "fingerprint %s, the global snapshot's is %s (another secret "
            "or geometry)",
            f->c.name, s->index, dc, c->addr, end.fp, s->fp);
        pulled_free(&p);
        return -1;
    }
    /* The snapshot comes into memory only when the pull brought pages. */
    if (p.fp && merger__shard_load(m, f, s, rep) < 0) {
        pulled_free(&p);
        return -1;
    }
    if (p.fp && (rc = pulled_apply(s, &p, slot, c->acked, round, rep)) < 0) {
        merger__rep_msg(rep, true, "pull of \"%s\" shard %u from %s (%s): "
                        "cannot read its pages back from %s: %s", f->c.name,
                        s->index, dc, c->addr, dir, strerror(-rc));
        pulled_free(&p);
        return -1;
    }
    pulled_free(&p);
    rep->pages_pulled += end.pages;
    rep->keys_pulled += end.keys;
    rep->bytes_pulled += end.bytes + 16 * end.keys;
    /* Another epoch: the node restarted, or its shard was re-created (and
     * may have lost what it had): push it every page again. */
    if (c->epoch && c->epoch != end.epoch) {
        c->acked = 0;
        c->ready = false;
    }
    c->epoch = end.epoch;
    c->since = end.version;
    /* The snapshot was found damaged in this round: only a full pull's
     * cursor may stand (shard_damaged dropped the others). */
    if (s->rebuilt && !full)
        c->epoch = c->since = 0;
    c->store_version = end.store_version;
    c->pulled_ms = t0;
    c->slot = slot;
    /* A SYNCING copy may lack acknowledged writes: its pages are kept (bits
     * only add), but it does not count towards the read quorum. */
    c->in_sync = !end.syncing;
    return 0;
}

/* A partial file's shard, read a piece at a time (bf_file_scan) into a
 * temp file of the state directory, and ORed in only once the whole of it
 * was verified: the merger holds a piece of it (1 MiB), never the file. */
struct part_scan {
    struct mg_shard *s;
    struct pulled *p;
    bool bundle;              /* an entry of a shard bundle */
    bool other;               /* a plain file of another shard */
    const char *field;        /* the field it differs in */
};

static int part_meta(void *ctx, const struct bf *b)
{
    struct part_scan *ps = ctx;
    const struct bf *g = ps->s->g;

    if (!ps->bundle && bf_shard_count(b) == bf_shard_count(g) &&
        bf_shard_index(b) != ps->s->index) {
        ps->other = true;
        return -ECANCELED;
    }
    if ((ps->field = bf_mismatch(g, b)))
        return -ECANCELED;
    return 0;
}

static int part_body(void *ctx, uint32_t layer, uint64_t off,
                     const void *data, size_t len)
{
    struct part_scan *ps = ctx;

    (void)layer;   /* the kinds that merge have one layer (part_meta) */
    return pulled_write(ps->p, off, data, len) < 0 ? -EIO : 0;
}

/* OR in the pieces a verified scan left in p's temp file.  Returns 0 or a
 * negative errno (the pieces applied so far stay: they only add). */
static int part_apply(struct mg_shard *s, struct pulled *p, uint64_t round,
                      struct mg_report *rep)
{
    uint8_t *buf = NULL;
    size_t cap = 0;
    uint64_t hdr[2];
    int rc = 0;

    if (!p->fp)
        return 0;
    if (fflush(p->fp) != 0 || fseeko(p->fp, 0, SEEK_SET) != 0)
        return -(errno ? errno : EIO);
    while (fread(hdr, sizeof hdr, 1, p->fp) == 1) {
        if (hdr[1] > cap) {
            uint8_t *nb = realloc(buf, hdr[1]);
            if (!nb) {
                rc = -ENOMEM;
                break;
            }
            buf = nb;
            cap = hdr[1];
        }
        if (hdr[1] && fread(buf, hdr[1], 1, p->fp) != 1) {
            rc = -EIO;
            break;
        }
        rep->pages_changed += shard_or(s, hdr[0], buf, hdr[1], round);
    }
    if (rc == 0 && ferror(p->fp))
        rc = -EIO;
    free(buf);
    return rc;
}

/* OR in a partial file when it changed since it was last merged: a filter
 * file of the shard (or of an unsharded filter), or a shard bundle of the
 * whole filter, of which only this shard's bytes are read. */
void merger__partial_one(struct merger *m, struct mg_filter *f,
                         struct mg_shard *s, unsigned i, uint64_t round,
                         struct mg_report *rep)
{
    const char *path = f->c.part[i];
    struct mg_part *ps = &s->part[i];
    char e2[BF_ERRLEN], dir[MG_PATH_MAX + 200];
    struct pulled p = {.s = s, .dir = dir};
    struct part_scan sc = {.s = s, .p = &p};
    uint64_t off = 0, len;
    uint32_t count = 0;
    struct stat sb;
    int fd, rc;

    merger__strfmt(dir, sizeof dir, "%s/%s", m->cfg.state_dir, f->c.name);
    if (stat(path, &sb) < 0) {
        merger__rep_msg(rep, true, "partial %s: %s", path, strerror(errno));
        return;
    }
    if (ps->merged && ps->mtime == sb.st_mtime && ps->size == sb.st_size)
        return;
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(fd, &sb) < 0 ||
        !S_ISREG(sb.st_mode)) {
        merger__rep_msg(rep, true, "partial %s refused: cannot open: %s", path,
                        fd < 0 || errno ? strerror(errno)
                                        : "not a regular file");
        if (fd >= 0)
            close(fd);
        return;
    }
    if (merger__shard_load(m, f, s, rep) < 0) {
        close(fd);
        return;
    }
    len = (uint64_t)sb.st_size;
    if (bundle_file_is(path)) {
        sc.bundle = true;
        rc = bundle_file_entry(fd, (uint64_t)sb.st_size, s->index, &count,
                               &off, &len, e2);
        if ((rc == 0 || rc == -ERANGE) && count != bf_shard_count(s->g)) {
            sc.field = "shard_count";
        } else if (rc < 0) {
            merger__rep_msg(rep, true, "partial %s refused: %s", path, e2);
            close(fd);
            return;
        }
    }
    (void)posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_SEQUENTIAL);
    rc = sc.field ? -ECANCELED
                  : bf_file_scan(fd, off, len, part_meta, part_body, &sc, e2);
    close(fd);
    if (sc.other) {
        pulled_free(&p);   /* another shard's file */
        return;
    }
    if (sc.field) {
        merger__rep_msg(rep, true,
                        "partial %s refused for filter \"%s\" shard %u: "
                        "field \"%s\" differs",
                        path, f->c.name, s->index, sc.field);
        pulled_free(&p);
        ps->merged = true; /* reported once per change of the file */
        ps->mtime = sb.st_mtime;
        ps->size = sb.st_size;
        return;
    }
    if (rc < 0) {
        if (p.err)
            merger__strfmt(e2, sizeof e2, "cannot keep its pages in %s: %s",
                           dir, strerror(-p.err));
        merger__rep_msg(rep, true, "partial %s refused: %s%s", path,
                        sc.bundle ? "shard entry: " : "", e2);
        pulled_free(&p);
        return;
    }
    /* Verified whole: only now does a bit of it reach the snapshot. */
    if ((rc = part_apply(s, &p, round, rep)) < 0) {
        merger__rep_msg(rep, true, "partial %s: cannot read its pages back "
                        "from %s: %s", path, dir, strerror(-rc));
        pulled_free(&p);
        return;
    }
    pulled_free(&p);
    struct bf_stats bs;
    bf_stats(s->g, &bs);
    if (bs.estimated_fpr > bf_error_rate(s->g))
        merger__rep_msg(rep, false,
                        "partial %s: merged estimated FPR %.4g exceeds "
                        "the target %.4g of \"%s\" shard %u",
                        path, bs.estimated_fpr, bf_error_rate(s->g),
                        f->c.name, s->index);
    ps->merged = true;
    ps->mtime = sb.st_mtime;
    ps->size = sb.st_size;
    log_info("merger: merged partial %s into \"%s\" shard %u", path, f->c.name,
             s->index);
}

/* ---- pushes ---- */

struct mg_copy *merger__copy_get(struct mg_shard *s, const char *addr,
                                 unsigned dc)
{
    for (size_t i = 0; i < s->ncp; i++)
        if (s->cp[i].dc == dc && !strcmp(s->cp[i].addr, addr))
            return &s->cp[i];
    if (s->ncp == s->capcp) {
        size_t cap = s->capcp ? 2 * s->capcp : 4;
        void *nv = realloc(s->cp, cap * sizeof *s->cp);
        if (!nv)
            return NULL;
        s->cp = nv;
        s->capcp = cap;
    }
    struct mg_copy *c = &s->cp[s->ncp++];
    memset(c, 0, sizeof *c);
    merger__strfmt(c->addr, sizeof c->addr, "%s", addr);
    c->dc = dc;
    c->slot = -1;
    return c;
}

/* Every write a datacenter acknowledged before its last covering pull is
 * in the snapshot: a copy holding the snapshot holds what every datacenter
 * had acknowledged by the oldest of those (0: a datacenter not covered
 * since the merger started). */
static uint64_t shard_data_ms(const struct mg_filter *f,
                              const struct mg_shard *s)
{
    uint64_t ms = UINT64_MAX;

    for (unsigned d = 0; d < f->c.ndc; d++)
        if (s->covered_ms[d] < ms)
            ms = s->covered_ms[d];
    return ms == UINT64_MAX ? 0 : ms;
}

/* Tests: BLOOMGRID_MERGER_TEST_KILL_AFTER_STREAMS=N makes the process kill
 * itself (SIGKILL) once N push streams have been acknowledged, to cut a
 * push of several streams in the middle. */
static void test_kill_point(void)
{
    static atomic_uint streams;
    const char *k = getenv("BLOOMGRID_MERGER_TEST_KILL_AFTER_STREAMS");

    if (k && *k && atomic_fetch_add(&streams, 1) + 1 >= (unsigned)atoi(k))
        raise(SIGKILL);
}

/* A failed push: the error kept on the copy and reported. */
static void push_failed(struct mg_filter *f, struct mg_shard *s,
                        struct mg_copy *c, const struct rpc_status *st,
                        struct mg_report *rep)
{
    merger__strfmt(c->error, sizeof c->error, "%s: %s",
                   rpc_status_name(st->code), st->message);
    merger__text_clean(c->error);
    merger__rep_msg(rep, true, "push of \"%s\" shard %u to %s (%s): %s",
                    f->c.name, s->index, c->addr, f->c.dc[c->dc], c->error);
    if (st->code == GRPC_STATUS_NOT_FOUND) {
        c->ready = false;
        c->acked = 0;
    }
}

/* Push to c the round's kept keys (s->kfp) but those pulled from c itself,
 * in streams of at most MG_KEYS_STREAM keys.  Returns 0 when every stream
 * was acknowledged; 1 when the first was refused as a node of an earlier
 * release refuses keys (nothing applied: the caller pushes pages); -1
 * (reported) otherwise. */
#define MG_KEYS_STREAM (1u << 20)   /* 16 MiB of hashes a stream */
static int push_keys(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                     struct mg_copy *c, struct rpc_channel *ch,
                     struct mg_report *rep)
{
    uint64_t want = s->kkeys - (c->slot >= 0 ? s->kslot[c->slot] : 0);
    size_t cap = want < MG_KEYS_STREAM ? (size_t)want : MG_KEYS_STREAM;
    int to = (int)m->cfg.node_timeout_ms * 4;
    uint8_t *buf = NULL;
    uint32_t hdr[2];
    struct rpc_status st;
    uint64_t sent = 0;
    size_t n = 0;

    if (!want)
        return 0;
    if (!(buf = malloc(16 * cap)) || fflush(s->kfp) != 0 ||
        fseeko(s->kfp, 0, SEEK_SET) != 0)
        goto unreadable;
    while (fread(hdr, sizeof hdr, 1, s->kfp) == 1) {
        if ((int)hdr[0] == c->slot) {
            if (fseeko(s->kfp, (off_t)16 * hdr[1], SEEK_CUR) != 0)
                goto unreadable;
            continue;
        }
        for (uint32_t left = hdr[1]; left > 0;) {
            size_t k = left < cap - n ? left : cap - n;
            if (fread(buf + 16 * n, 16, k, s->kfp) != k)
                goto unreadable;
            n += k;
            left -= (uint32_t)k;
            if (n < cap)
                continue;
            if (node_client_push_keys(ch, f->c.name, s->index, s->fp, buf, n,
                                      to, &st) < 0)
                goto failed;
            rep->keys_pushed += n;
            rep->bytes_pushed += 16 * n;
            sent += n;
            n = 0;
            test_kill_point();
        }
    }
    if (n) {
        if (node_client_push_keys(ch, f->c.name, s->index, s->fp, buf, n, to,
                                  &st) < 0)
            goto failed;
        rep->keys_pushed += n;
        rep->bytes_pushed += 16 * n;
        sent += n;
        test_kill_point();
    }
    if (ferror(s->kfp) || sent != want)
        goto unreadable;
    free(buf);
    return 0;
unreadable:
    merger__rep_msg(rep, true, "push of \"%s\" shard %u to %s (%s): cannot "
                    "read the round's keys back (%" PRIu64 " of %" PRIu64
                    " sent)%s", f->c.name, s->index, c->addr, f->c.dc[c->dc],
                    sent, want, buf ? "" : ": out of memory");
    free(buf);
    return -1;
failed:
    free(buf);
    /* A node of an earlier release finds the keys' checksum does not
     * match their (empty) data, or answers without counting them. */
    if (sent == 0 && (st.code == GRPC_STATUS_DATA_LOSS ||
                      st.code == GRPC_STATUS_INTERNAL)) {
        log_warn("merger: %s does not take keys' hashes for \"%s\" shard "
                 "%u (%s): pages are pushed to it", c->addr, f->c.name,
                 s->index, st.message);
        c->no_keys = true;
        return 1;
    }
    push_failed(f, s, c, &st, rep);
    return -1;
}

void merger__push_one(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                      struct mg_copy *c, uint64_t round, struct mg_report *rep)
{
    struct rpc_channel *ch = merger__chan(m, c->addr);
    struct node_client_page *pg = NULL;
    struct rpc_status st;
    size_t n = 0;
    uint64_t pbytes = 0;
    const uint8_t *body;

    if (!ch)
        return;
    /* What the copy lacks, as pages: those stamped after the round it last
     * received in full, but those it sent whole this round. */
    for (uint64_t p = 0; p < s->npages; p++)
        if (s->stamp[p] > c->acked &&
            !(c->slot >= 0 && s->have && (s->have[p] >> c->slot) & 1)) {
            uint64_t off = p * RULES_PAGE_BYTES;
            pbytes += s->body_bytes - off < RULES_PAGE_BYTES
                          ? s->body_bytes - off : RULES_PAGE_BYTES;
            n++;
        }
    /* A copy that re-syncs (its shard SYNCING, or the node refilling and
     * without the shard yet) is pushed nothing while R copies of its group
     * answered in sync this round: it leaves SYNCING only after full pulls
     * from N - W + 1 (<= R) copies that are not SYNCING, which hold what
     * the merger pushed them, and what it was not pushed stays past its
     * acked round, for a push once it has left SYNCING (docs/MERGER.md,
     * "Copies that re-sync").  A group not covered (every copy SYNCING, a
     * datacenter the merger alone fills) is pushed as before. */
    int how = ENSURE_CREATE;
    if (s->gp[c->dc].covered)
        how |= ENSURE_LATER_MISSING | ENSURE_LATER_SYNCING;
    int rc = ENSURE_OK;
    if (c->slot >= 0 && !c->in_sync && n && (how & ENSURE_LATER_SYNCING)) {
        rc = ENSURE_RESYNC_SYNCING;   /* its pull said so this round */
        merger__strfmt(c->error, sizeof c->error,
                       "its shard is SYNCING (it fills from its group)");
    } else if (c->slot < 0 && (!c->ready || (n && (how & ENSURE_LATER_SYNCING)))) {
        rc = shard_ensure(m, f, s, ch, how, c->error, sizeof c->error);
        if (rc < 0) {
            merger__text_clean(c->error);
            merger__rep_msg(rep, true, "push of \"%s\" shard %u to %s (%s): %s",
                            f->c.name, s->index, c->addr, f->c.dc[c->dc],
                            c->error);
            return;
        }
    }
    if (rc != ENSURE_OK) {
        /* Not pulled this round, it may have lost the shard and taken it
         * again from its group: what it holds is not known, so what it
         * acknowledged before counts for nothing. */
        if (rc == ENSURE_RESYNC_MISSING || c->slot < 0) {
            c->ready = false;
            c->acked = 0;
            c->data_ms = 0;
            c->resynced = true;
        }
        merger__text_clean(c->error);
        merger__strfmt(c->error + strlen(c->error),
                       sizeof c->error - strlen(c->error),
                       ": not pushed until it has left SYNCING");
        log_debug("merger: \"%s\" shard %u to %s (%s): %s", f->c.name,
                  s->index, c->addr, f->c.dc[c->dc], c->error);
        rep->pushes_later++;
        return;
    }
    c->ready = true;
    /* Or as keys: when the copy held the whole snapshot as the round began
     * (it acked every stamp then) and the round changed it only by keys'
     * hashes, it lacks only those keys (but its own), and gets them when
     * they weigh less than the pages.  Added there as adds, they keep
     * the copy's next pull one of keys too. */
    if (n && !s->paged && !s->kbad && !c->no_keys && c->acked >= s->prev_max) {
        uint64_t k = s->kkeys - (c->slot >= 0 ? s->kslot[c->slot] : 0);
        if (16 * k < pbytes) {
            int rc = push_keys(m, f, s, c, ch, rep);
            if (rc < 0)
                return;
            if (rc == 0)
                goto done;
        }
    }
    /* Nothing to send: the snapshot need not come into memory. */
    if (n && merger__shard_load(m, f, s, rep) < 0)
        return;
    n = 0;
    pg = calloc(s->npages ? s->npages : 1, sizeof *pg);
    if (!pg)
        return;
    body = s->g ? (const uint8_t *)bf_layer_body_const(s->g, 0) : NULL;
    for (uint64_t p = 0; p < s->npages && body; p++) {
        if (s->stamp[p] <= c->acked ||
            (c->slot >= 0 && (s->have[p] >> c->slot) & 1))
            continue;
        uint64_t off = p * RULES_PAGE_BYTES;
        size_t len = s->body_bytes - off < RULES_PAGE_BYTES
                         ? (size_t)(s->body_bytes - off)
                         : RULES_PAGE_BYTES;
        pg[n++] = (struct node_client_page){off, body + off, len};
    }
    /* Large shards go in several streams of at most 64 MiB of pages.  A
     * push claims nothing (source_version 0): a copy that got part of it
     * only has more bits. */
    for (size_t first = 0; first < n;) {
        size_t last = first;
        uint64_t chunk = 0;
        while (last < n && chunk < (64u << 20))
            chunk += pg[last++].len;
        if (node_client_push(ch, f->c.name, s->index, s->fp, 0, pg + first,
                             last - first, NULL,
                             (int)m->cfg.node_timeout_ms * 4, &st) < 0) {
            push_failed(f, s, c, &st, rep);
            free(pg);
            return;
        }
        rep->pages_pushed += last - first;
        rep->bytes_pushed += chunk;
        test_kill_point();
        first = last;
    }
    free(pg);
done:
    c->acked = round;
    c->resynced = false;
    c->error[0] = 0;
    c->data_ms = shard_data_ms(f, s);
}
