/* store_tomb: tombstones of dropped filters and the generations of
 * undropped ones (store.h, "Tombstones" and "Undoing a drop").
 *
 * A drop writes (name, secret id, fingerprint id, generation) to
 * DIR/.tombstones before the filter's directory goes, so a peer holding
 * the old filter's pages (a merger, another copy) cannot bring it back:
 * creations with that name and secret are refused, and callers check
 * pushes and imports with store_dropped.  An undrop (store_undrop) lifts
 * the tombstone of its name and secret and records the generation of the
 * filter it creates in the same file, in one atomic rewrite: a generation
 * record.  A filter's generation is 0 until it is undropped; a drop of an
 * undropped filter carries its generation into the tombstone, so that the
 * next undrop is of a higher one, and a copy can tell a peer's filter that
 * was undropped after its drop (a higher generation) from one the drop has
 * not reached yet (the same generation).
 *
 * The file is rewritten whole on each change (durable.h) and read at open;
 * each list keeps its newest STORE_TOMBS_MAX entries, oldest first.  While
 * no entry has a generation the file keeps the format of releases before
 * undrops, so they can still read it:
 *
 *   bloomgrid-tombstones 1
 *   <secret id, 16 hex> <fingerprint id, 16 hex> <store name>
 *
 * and otherwise
 *
 *   bloomgrid-tombstones 2
 *   d <secret id> <fingerprint id> <generation, 16 hex> <store name>
 *   u <secret id> <fingerprint id> <generation, 16 hex> <store name>
 *
 * (d: a tombstone; u: the generation of a filter that was undropped).
 *
 * The lists are under tomb_mu, a leaf lock (no other lock is taken while
 * it is held; the file is written under it, one change at a time).
 */
#include "durable.h"
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "store_internal.h"

#define TOMB_FILE STORE_TOMB_FILE

size_t store__tombs_max = STORE_TOMBS_MAX;
#define TOMB_MAGIC_1 "bloomgrid-tombstones 1"
#define TOMB_MAGIC_2 "bloomgrid-tombstones 2"

uint64_t store_secret_id(const struct bf *f)
{
    return XXH3_64bits(bf_secret(f), BF_SECRET_LEN);
}

static void tomb_path(const struct store *s, char *out, size_t len)
{
    store__strfmt(out, len, "%s/%s", s->dir, TOMB_FILE);
}

/* A field of 16 lower-case hex digits ending at a space: its value, and p
 * moved past the space.  false when it is not one. */
static bool hex16(char **p, uint64_t *v)
{
    char *s = *p, *end;

    if (strspn(s, "0123456789abcdef") != 16 || s[16] != ' ')
        return false;
    s[16] = 0;
    *v = strtoull(s, &end, 16);
    *p = s + 17;
    return end == s + 16;
}

/* One line of the file (format 1, or 2 with *gen_rec set for a "u"
 * line) into t; false when it is not one. */
static bool tomb_parse(char *line, int format, struct store_tomb *t,
                       bool *gen_rec)
{
    uint64_t fp;

    *gen_rec = false;
    t->gen = 0;
    if (format == 2) {
        if ((line[0] != 'd' && line[0] != 'u') || line[1] != ' ')
            return false;
        *gen_rec = line[0] == 'u';
        line += 2;
    }
    if (!hex16(&line, &t->secret_id) || !hex16(&line, &fp) ||
        (format == 2 && !hex16(&line, &t->gen)))
        return false;
    if (store_name_check(line, NULL) < 0)
        return false;
    snprintf(t->fp, sizeof t->fp, "%016" PRIx64, fp);
    snprintf(t->name, sizeof t->name, "%s", line);
    return true;
}

static int tombs_alloc(struct store *s)
{
    if (!s->tombs && !(s->tombs = calloc(STORE_TOMBS_MAX, sizeof *s->tombs)))
        return -ENOMEM;
    if (!s->gens && !(s->gens = calloc(STORE_TOMBS_MAX, sizeof *s->gens)))
        return -ENOMEM;
    return 0;
}

int store__tombs_load(struct store *s, char *err)
{
    char path[STORE_PATH_LEN], line[STORE_NAME_MAX + 128];
    unsigned no = 0;
    int rc = 0, format = 0;
    FILE *f;

    tomb_path(s, path, sizeof path);
    if (!(f = fopen(path, "r"))) {
        if (errno == ENOENT)
            return 0;
        rc = -errno;
        errmsg_set(err, "cannot read %s: %s", path, strerror(-rc));
        return rc;
    }
    if (tombs_alloc(s) < 0) {
        errmsg_set(err, "out of memory");
        fclose(f);
        return -ENOMEM;
    }
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        struct store_tomb t;
        bool gen_rec;
        no++;
        if (len == 0 || line[len - 1] != '\n')
            goto bad;
        line[len - 1] = 0;
        if (no == 1) {
            format = strcmp(line, TOMB_MAGIC_1) == 0   ? 1
                     : strcmp(line, TOMB_MAGIC_2) == 0 ? 2 : 0;
            if (!format)
                goto bad;
            continue;
        }
        if (!tomb_parse(line, format, &t, &gen_rec))
            goto bad;
        size_t *n = gen_rec ? &s->ngens : &s->ntombs;
        if (*n == STORE_TOMBS_MAX)
            goto bad;
        (gen_rec ? s->gens : s->tombs)[(*n)++] = t;
    }
    if (ferror(f) || no == 0)
        goto bad;
    fclose(f);
    return 0;
bad:
    /* Written atomically, so this is damage or a hand edit: refuse rather
     * than forget what was dropped. */
    errmsg_set(err, "%s is damaged at line %u (remove it to forget every "
                    "dropped filter)", path, no);
    fclose(f);
    return -EBADMSG;
}

void store__tombs_free(struct store *s)
{
    free(s->tombs);
    free(s->gens);
    s->tombs = s->gens = NULL;
    s->ntombs = s->ngens = 0;
}

/* One change of the lists: the entries of an identity leave them (the
 * tombstones of name with secret_id, and every generation record of name:
 * a name holds one filter at a time), then tomb and gen (each may be
 * NULL) join them, newest; past the bound the oldest expire. */
struct tomb_change {
    const char *name;
    uint64_t secret_id;
    const struct store_tomb *tomb;
    const struct store_tomb *gen;
};

static bool tomb_goes(const struct store_tomb *t, const struct tomb_change *c)
{
    return strcmp(t->name, c->name) == 0 && t->secret_id == c->secret_id;
}

static bool gen_goes(const struct store_tomb *t, const struct tomb_change *c)
{
    return strcmp(t->name, c->name) == 0;
}

/* How many of v[0, n) stay, and how many of those expire first (the
 * oldest) so that the list, with add, holds at most the bound. */
static void plan(const struct store_tomb *v, size_t n, const struct tomb_change *c,
                 bool (*goes)(const struct store_tomb *, const struct tomb_change *),
                 const struct store_tomb *add, size_t *expire)
{
    size_t kept = 0;

    for (size_t i = 0; i < n; i++)
        kept += !goes(&v[i], c);
    kept += add != NULL;
    *expire = kept > store__tombs_max ? kept - store__tombs_max : 0;
}

/* Calls fn for each entry the list has after the change (oldest first). */
static int walk(const struct store_tomb *v, size_t n, const struct tomb_change *c,
                bool (*goes)(const struct store_tomb *, const struct tomb_change *),
                const struct store_tomb *add, size_t expire,
                int (*fn)(const struct store_tomb *t, void *ctx), void *ctx)
{
    int rc = 0;

    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (goes(&v[i], c))
            continue;
        if (expire) {
            expire--;
            continue;
        }
        rc = fn(&v[i], ctx);
    }
    if (rc == 0 && add && !expire)
        rc = fn(add, ctx);
    return rc;
}

struct tomb_writer {
    const struct store *s;
    const struct tomb_change *c;
    size_t expire_tombs, expire_gens;
    int format;
    int fd;
    char kind;                  /* 'd' or 'u' while writing each list */
};

static int line_out(const struct store_tomb *t, void *ctx)
{
    struct tomb_writer *w = ctx;
    char line[STORE_NAME_MAX + 128];
    int len;

    if (w->format == 1)
        len = snprintf(line, sizeof line, "%016" PRIx64 " %s %s\n",
                       t->secret_id, t->fp, t->name);
    else
        len = snprintf(line, sizeof line, "%c %016" PRIx64 " %s %016" PRIx64
                       " %s\n", w->kind, t->secret_id, t->fp, t->gen, t->name);
    return durable_write_all(w->fd, line, (size_t)len);
}

/* Does the list hold an entry with a generation after the change? */
static int has_gen(const struct store_tomb *t, void *ctx)
{
    (void)ctx;
    return t->gen ? 1 : 0;
}

static int tomb_fill(int fd, void *ctx)
{
    struct tomb_writer *w = ctx;
    const struct store *s = w->s;
    const struct tomb_change *c = w->c;
    int rc;

    w->fd = fd;
    rc = durable_write_all(fd, w->format == 1 ? TOMB_MAGIC_1 "\n" : TOMB_MAGIC_2 "\n",
                           strlen(TOMB_MAGIC_1) + 1);
    w->kind = 'd';
    if (rc == 0)
        rc = walk(s->tombs, s->ntombs, c, tomb_goes, c->tomb, w->expire_tombs,
                  line_out, w);
    w->kind = 'u';
    if (rc == 0)
        rc = walk(s->gens, s->ngens, c, gen_goes, c->gen, w->expire_gens,
                  line_out, w);
    return rc;
}

/* The list v[0, *n) after the change, in place. */
static void apply(struct store_tomb *v, size_t *n, const struct tomb_change *c,
                  bool (*goes)(const struct store_tomb *, const struct tomb_change *),
                  const struct store_tomb *add, size_t expire)
{
    size_t k = 0;

    for (size_t i = 0; i < *n; i++) {
        if (goes(&v[i], c))
            continue;
        if (expire) {
            expire--;
            continue;
        }
        v[k++] = v[i];
    }
    if (add && !expire)
        v[k++] = *add;
    *n = k;
}

/* Make change c durable, then apply it.  The caller holds tomb_mu.
 * Returns 0 (also when c changes nothing: nothing written), or -ENOMEM /
 * the write's error with err (nothing changed). */
static int tomb_change_locked(struct store *s, const struct tomb_change *c,
                              const char *what, char *err)
{
    char path[STORE_PATH_LEN], e2[DURABLE_ERRLEN];
    struct tomb_writer w = {.s = s, .c = c};
    size_t before = s->ntombs + s->ngens, after = 0;
    int rc;

    if (tombs_alloc(s) < 0) {
        errmsg_set(err, "out of memory");
        return -ENOMEM;
    }
    plan(s->tombs, s->ntombs, c, tomb_goes, c->tomb, &w.expire_tombs);
    plan(s->gens, s->ngens, c, gen_goes, c->gen, &w.expire_gens);
    for (size_t i = 0; i < s->ntombs; i++)
        after += !tomb_goes(&s->tombs[i], c);
    for (size_t i = 0; i < s->ngens; i++)
        after += !gen_goes(&s->gens[i], c);
    if (!c->tomb && !c->gen && after == before)
        return 0;
    /* Format 1 while nothing needs 2: earlier releases read it. */
    w.format = s->ngens || c->gen ||
               walk(s->tombs, s->ntombs, c, tomb_goes, c->tomb, w.expire_tombs,
                    has_gen, NULL) ? 2 : 1;
    tomb_path(s, path, sizeof path);
    if ((rc = durable_write_with(path, tomb_fill, &w, 0644, e2)) < 0) {
        errmsg_set(err, "cannot record the %s of '%s': %s", what, c->name, e2);
        return rc;
    }
    apply(s->tombs, &s->ntombs, c, tomb_goes, c->tomb, w.expire_tombs);
    apply(s->gens, &s->ngens, c, gen_goes, c->gen, w.expire_gens);
    return 0;
}

/* The generation record of name with secret_id, under tomb_mu. */
static const struct store_tomb *gen_find(struct store *s, const char *name,
                                         uint64_t secret_id)
{
    for (size_t i = s->ngens; i-- > 0;)
        if (strcmp(s->gens[i].name, name) == 0 && s->gens[i].secret_id == secret_id)
            return &s->gens[i];
    return NULL;
}

/* The identity of the filter behind sf, read under its lock: false when
 * it has no bits loaded (a FAILED filter whose files did not load). */
static bool tomb_of(struct store_filter *sf, struct store_tomb *t)
{
    bool have = false;

    memset(t, 0, sizeof *t);
    pthread_rwlock_rdlock(&sf->lock);
    if (sf->bf) {
        t->secret_id = store_secret_id(sf->bf);
        bf_fingerprint_id(sf->bf, t->fp);
        have = true;
    }
    pthread_rwlock_unlock(&sf->lock);
    snprintf(t->name, sizeof t->name, "%s", sf->name);
    return have;
}

int store__tomb_add(struct store *s, struct store_filter *sf, char *err)
{
    struct store_tomb t;
    int rc;

    bool have = tomb_of(sf, &t);
    pthread_mutex_lock(&s->tomb_mu);
    /* A filter without an identity leaves no tombstone; a generation
     * record of its name goes all the same (it named that filter). */
    struct tomb_change c = {.name = t.name, .secret_id = t.secret_id,
                            .tomb = have ? &t : NULL};
    if (have) {
        const struct store_tomb *g = gen_find(s, t.name, t.secret_id);
        t.gen = g ? g->gen : 0;
    }
    rc = tomb_change_locked(s, &c, "drop", err);
    pthread_mutex_unlock(&s->tomb_mu);
    return rc;
}

int store__tomb_lift(struct store *s, const char *name, uint64_t secret_id,
                     const char *fp, uint64_t gen, char *err)
{
    struct store_tomb g = {.secret_id = secret_id, .gen = gen};
    int rc;

    snprintf(g.name, sizeof g.name, "%s", name);
    snprintf(g.fp, sizeof g.fp, "%s", fp);
    struct tomb_change c = {.name = name, .secret_id = secret_id, .gen = &g};
    pthread_mutex_lock(&s->tomb_mu);
    rc = tomb_change_locked(s, &c, "undrop", err);
    pthread_mutex_unlock(&s->tomb_mu);
    return rc;
}

bool store_dropped_gen(struct store *s, const char *name, uint64_t secret_id,
                       const char *fp, uint64_t *gen)
{
    bool found = false;
    uint64_t g = 0;

    pthread_mutex_lock(&s->tomb_mu);
    for (size_t i = s->ntombs; i-- > 0;) {
        const struct store_tomb *t = &s->tombs[i];
        if (strcmp(t->name, name) == 0 &&
            ((secret_id && t->secret_id == secret_id) ||
             (fp && strcmp(t->fp, fp) == 0))) {
            if (!found || t->gen > g)
                g = t->gen;
            found = true;
        }
    }
    pthread_mutex_unlock(&s->tomb_mu);
    if (gen)
        *gen = found ? g : 0;
    return found;
}

bool store_dropped(struct store *s, const char *name, uint64_t secret_id,
                   const char *fp)
{
    return store_dropped_gen(s, name, secret_id, fp, NULL);
}

uint64_t store_generation(struct store *s, const char *name, uint64_t secret_id)
{
    pthread_mutex_lock(&s->tomb_mu);
    const struct store_tomb *g = s->gens ? gen_find(s, name, secret_id) : NULL;
    uint64_t gen = g ? g->gen : 0;
    pthread_mutex_unlock(&s->tomb_mu);
    return gen;
}

int store_generation_raise(struct store *s, struct store_filter *sf,
                           const char *fp, uint64_t gen, char *err)
{
    struct store_tomb t;
    int rc = 0;

    if (!tomb_of(sf, &t) || (fp && strcmp(fp, t.fp) != 0)) {
        errmsg_set(err, "filter '%s' is not the filter of fingerprint %s",
                   sf->name, fp ? fp : "(none)");
        return -EINVAL;
    }
    pthread_mutex_lock(&s->tomb_mu);
    const struct store_tomb *g = s->gens ? gen_find(s, t.name, t.secret_id) : NULL;
    if (gen > (g ? g->gen : 0)) {
        t.gen = gen;
        struct tomb_change c = {.name = t.name, .secret_id = t.secret_id, .gen = &t};
        rc = tomb_change_locked(s, &c, "generation", err);
    }
    pthread_mutex_unlock(&s->tomb_mu);
    return rc;
}
