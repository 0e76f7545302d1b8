/* store_migrate: opening a filter directory of an earlier release (its own
 * snapshot-<C>.bf files and write-ahead log wal-<F>.log, wal_legacy.h) and
 * turning it into a filter of the node log (docs/STORAGE.md, "Migration").
 *
 * Steps, each safe to crash after:
 *   1. load the newest legacy snapshot that loads and replay the legacy
 *      log after it, in memory (a torn tail is cut, as that release did);
 *   2. write the first checkpoint (a base, then its manifest
 *      manifest-<I>-<C>-<L>.bgm, store__ckpt_first): a new incarnation
 *      id, C the legacy log's last seq (so versions keep growing) and L the
 *      node log's durable LSN (the filter has no record in it yet);
 *   3. remove the legacy files.
 * Until step 2 the directory is still legacy and the next open migrates it
 * again from the untouched files; from step 2 on it is a filter of the node
 * log, and whatever legacy files are left are swept when it is loaded.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "durable.h"
#include "log.h"
#include "store_internal.h"
#include "wal_legacy.h"

int store__migrate_crash_at;

/* A test child "crashes" after migration step `step`. */
static void crash_point(int step)
{
    if (store__migrate_crash_at == step)
        _exit(0);
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


bool store__is_legacy(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    bool found = false;
    uint64_t seq;

    while (d && !found && (de = readdir(d)))
        found = snap_parse_name(de->d_name, &seq) ||
                wal_legacy_is_segment(de->d_name);
    if (d)
        closedir(d);
    return found;
}

void store__legacy_sweep(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int removed = 0;
    uint64_t seq;

    if (!d)
        return;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (!snap_parse_name(n, &seq) && !wal_legacy_is_segment(n) &&
            strncmp(n, ".wal-", 5) != 0 &&
            !(strncmp(n, "snapshot-", 9) == 0 && strstr(n, ".bf.tmp.")))
            continue;
        if (unlinkat(dirfd(d), n, 0) == 0 && removed++ == 0)
            crash_point(3);
    }
    closedir(d);
    if (removed)
        durable_fsync_dir(dir);
}

static int replay_legacy(void *ctx, uint32_t type, uint64_t seq,
                         const void *payload, uint64_t len)
{
    return store__replay_apply(ctx, seq, type, payload, len);
}

/* Step 1: the filter as the legacy files hold it; *next_seq gets the seq
 * the legacy log would have given next.  NULL with why. */
static struct bf *legacy_load(struct store_filter *sf, uint64_t *next_seq,
                              char *why, int *rc)
{
    struct snap_ent *v = NULL;
    size_t n = 0;
    struct bf *f = NULL;
    struct wal_legacy_info rec;
    char e2[STORE_ERRLEN], path[STORE_PATH_LEN];
    uint64_t covered = 0;

    why[0] = 0;
    if ((*rc = snap_list(sf->path, true, &v, &n)) < 0) {
        store__strfmt(why, STORE_ERRLEN, "cannot list %s: %s", sf->path,
                      strerror(-*rc));
        return NULL;
    }
    for (size_t i = 0; i < n && !f; i++) {
        store__strfmt(path, sizeof(path), "%s/%s", sf->path, v[i].name);
        if ((f = bf_file_load(path, e2, NULL)))
            covered = v[i].seq;
        else if (!why[0])
            store__strfmt(why, STORE_ERRLEN, "snapshot %s is unusable: %.160s",
                          path, e2);
    }
    free(v);
    if (!f) {
        *rc = -EBADMSG;
        if (!why[0])
            store__strfmt(why, STORE_ERRLEN, "no snapshot in %s", sf->path);
        return NULL;
    }
    bf_set_exclusive(f, true);
    if ((*rc = wal_legacy_recover(sf->path, covered, replay_legacy, f, &rec,
                                  e2)) < 0) {
        size_t l = strlen(why);
        store__strfmt(why + l, STORE_ERRLEN - l, "%s%s", l ? "; then " : "",
                      e2);
        bf_destroy(f);
        return NULL;
    }
    if (rec.truncated)
        log_warn("store: filter '%s': cut a torn tail of %" PRIu64 " bytes "
                 "from its old write-ahead log (never acknowledged)",
                 sf->name, rec.truncated);
    *next_seq = rec.next_seq;
    log_info("store: filter '%s': migrating from its own write-ahead log "
             "(snapshot seq %" PRIu64 ", %" PRIu64 " records replayed)",
             sf->name, covered, rec.records);
    return f;
}

int store__migrate(struct store_filter *sf, char *err)
{
    char why[STORE_ERRLEN], e2[STORE_ERRLEN];
    uint64_t next_seq = 1, id, lsn;
    struct bf *f;
    int rc;

    if (!(f = legacy_load(sf, &next_seq, why, &rc)))
        goto fail;
    crash_point(1);
    id = store__random_id();
    lsn = store__claim_lsn(sf);
    if ((rc = store__ckpt_first(sf->path, id, next_seq - 1, lsn, f, sf->chain,
                                e2)) < 0) {
        store__strfmt(why, sizeof(why), "cannot write the first checkpoint "
                      "of the migrated filter: %s", e2);
        bf_destroy(f);
        goto fail;
    }
    crash_point(2);
    store__legacy_sweep(sf->path);
    crash_point(4);
    sf->id = id;
    sf->ckpt_seq = next_seq - 1;
    sf->snap_time_ms = store__now_ms();
    if ((rc = store__filter_install(sf, f, next_seq)) < 0) {
        errmsg_set(err, "out of memory");
        return rc;
    }
    log_info("store: filter '%s' migrated to the node's write-ahead log",
             sf->name);
    return 0;
fail:
    /* The legacy files are left as they are for the next try. */
    store__filter_fail(sf, why, rc != -EBADMSG);
    log_error("store: filter '%s' is not served: %s", sf->name, why);
    errmsg_set(err, "filter '%s' is not served: %s", sf->name, why);
    return rc < 0 ? rc : -EIO;
}
