/* store_tomb: tombstones of dropped filters (store.h, "Tombstones").
 *
 * A drop writes (name, secret id, fingerprint id) to DIR/.tombstones
 * before the filter's directory goes, so a peer holding the old filter's
 * pages (a merger, another copy) cannot bring it back: creations with that
 * name and secret are refused, and callers check pushes and imports with
 * store_dropped.  The file is rewritten whole on each drop (durable.h) and
 * read at open; it keeps the newest STORE_TOMBS_MAX entries, oldest first:
 *
 *   bloomgrid-tombstones 1
 *   <secret id, 16 hex> <fingerprint id, 16 hex> <store name>
 *
 * The list is under tomb_mu, a leaf lock (no other lock is taken while it
 * is held; the file is written under it, one drop at a time).
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

#define TOMB_FILE ".tombstones"

size_t store__tombs_max = STORE_TOMBS_MAX;
#define TOMB_MAGIC "bloomgrid-tombstones 1"

uint64_t store_secret_id(const struct bf *f)
{
    return XXH3_64bits(bf_secret(f), BF_SECRET_LEN);
}

static void tomb_path(const struct store *s, char *out, size_t len)
{
    store__strfmt(out, len, "%s/%s", s->dir, TOMB_FILE);
}

/* One line of the file into t; false when it is not one. */
static bool tomb_parse(char *line, struct store_tomb *t)
{
    char *sp1 = strchr(line, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    char *end;

    if (!sp1 || !sp2 || sp1 - line != 16 || sp2 - sp1 - 1 != 16)
        return false;
    *sp1 = *sp2 = 0;
    t->secret_id = strtoull(line, &end, 16);
    if (*end || strspn(sp1 + 1, "0123456789abcdef") != 16 ||
        store_name_check(sp2 + 1, NULL) < 0)
        return false;
    memcpy(t->fp, sp1 + 1, 17);
    snprintf(t->name, sizeof t->name, "%s", sp2 + 1);
    return true;
}

int store__tombs_load(struct store *s, char *err)
{
    char path[STORE_PATH_LEN], line[STORE_NAME_MAX + 64];
    unsigned no = 0;
    int rc = 0;
    FILE *f;

    tomb_path(s, path, sizeof path);
    if (!(f = fopen(path, "r"))) {
        if (errno == ENOENT)
            return 0;
        rc = -errno;
        errmsg_set(err, "cannot read %s: %s", path, strerror(-rc));
        return rc;
    }
    if (!(s->tombs = calloc(STORE_TOMBS_MAX, sizeof *s->tombs))) {
        errmsg_set(err, "out of memory");
        fclose(f);
        return -ENOMEM;
    }
    while (fgets(line, sizeof line, f)) {
        size_t len = strlen(line);
        no++;
        if (len == 0 || line[len - 1] != '\n')
            goto bad;
        line[len - 1] = 0;
        if (no == 1) {
            if (strcmp(line, TOMB_MAGIC) != 0)
                goto bad;
            continue;
        }
        if (s->ntombs == STORE_TOMBS_MAX ||
            !tomb_parse(line, &s->tombs[s->ntombs]))
            goto bad;
        s->ntombs++;
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
    s->tombs = NULL;
    s->ntombs = 0;
}

/* What a rewrite of the file holds: v[0, n), then one more. */
struct tomb_list {
    const struct store_tomb *v;
    size_t n;
    const struct store_tomb *last;
};

static int tomb_line(int fd, const struct store_tomb *t)
{
    char line[STORE_NAME_MAX + 64];
    int len = snprintf(line, sizeof line, "%016" PRIx64 " %s %s\n",
                       t->secret_id, t->fp, t->name);

    return durable_write_all(fd, line, (size_t)len);
}

static int tomb_fill(int fd, void *ctx)
{
    const struct tomb_list *l = ctx;
    int rc = durable_write_all(fd, TOMB_MAGIC "\n", strlen(TOMB_MAGIC) + 1);

    for (size_t i = 0; rc == 0 && i < l->n; i++)
        rc = tomb_line(fd, &l->v[i]);
    return rc < 0 ? rc : tomb_line(fd, l->last);
}

/* The identity of the filter behind sf, read under its lock: false when
 * it has no bits loaded (a FAILED filter whose files did not load). */
static bool tomb_of(struct store_filter *sf, struct store_tomb *t)
{
    bool have = false;

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
    char path[STORE_PATH_LEN], e2[DURABLE_ERRLEN];
    struct store_tomb t;
    int rc = 0;

    if (!tomb_of(sf, &t))
        return 0;
    tomb_path(s, path, sizeof path);
    pthread_mutex_lock(&s->tomb_mu);
    if (!s->tombs && !(s->tombs = calloc(STORE_TOMBS_MAX, sizeof *s->tombs))) {
        errmsg_set(err, "out of memory");
        rc = -ENOMEM;
        goto out;
    }
    /* Past the bound the oldest expire.  The list changes only once the
     * file holding the new one is durable. */
    size_t expire = s->ntombs + 1 > store__tombs_max
                        ? s->ntombs + 1 - store__tombs_max : 0;
    struct tomb_list l = {.v = s->tombs + expire, .n = s->ntombs - expire,
                          .last = &t};
    if ((rc = durable_write_with(path, tomb_fill, &l, 0644, e2)) < 0) {
        errmsg_set(err, "cannot record the drop of '%s': %s", sf->name, e2);
        goto out;
    }
    memmove(s->tombs, s->tombs + expire, l.n * sizeof *s->tombs);
    s->tombs[l.n] = t;
    s->ntombs = l.n + 1;
out:
    pthread_mutex_unlock(&s->tomb_mu);
    return rc;
}

bool store_dropped(struct store *s, const char *name, uint64_t secret_id,
                   const char *fp)
{
    bool found = false;

    pthread_mutex_lock(&s->tomb_mu);
    for (size_t i = s->ntombs; i-- > 0 && !found;) {
        const struct store_tomb *t = &s->tombs[i];
        found = strcmp(t->name, name) == 0 &&
                ((secret_id && t->secret_id == secret_id) ||
                 (fp && strcmp(t->fp, fp) == 0));
    }
    pthread_mutex_unlock(&s->tomb_mu);
    return found;
}
