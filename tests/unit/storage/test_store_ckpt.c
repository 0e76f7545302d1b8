/* Incremental checkpoints (store_ckpt.c, store_ckfile.c, store_load.c):
 *   - a crash at every step of a checkpoint that writes a base (blocked and
 *     counting), a delta of records and a delta of pages: as a kill -9 (the
 *     page cache survives) and as a machine crash (the test's write, fsync
 *     and rename hooks drop every write not fsynced and every rename whose
 *     directory was not fsynced at the crash point): every acknowledged key
 *     is present after recovery, and the store checkpoints again;
 *   - torn or zeroed pages in a base, a delta and a manifest: the filter is
 *     repaired from the log while the log holds the records after the last
 *     good file, refused (FAILED, naming the file) otherwise, and never
 *     served with keys missing;
 *   - a record replayed at recovery has its page in the next delta of
 *     pages: once the log behind it is gone the key is still there;
 *   - two pullers and the checkpointer at different cursors each get every
 *     change;
 *   - a data directory of the previous release (whole-filter ckpt-*.bf
 *     checkpoints) opens with every key, and its next checkpoint replaces
 *     the old file by a base and a manifest.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "bf_file.h"
#include "durable.h"
#include "log.h"
#include "metrics.h"
#include "store.h"
#include "store_internal.h"
#include "unit_tmpdir.h"
#include "unit_hashes.h"
#include "unit_wal.h"
#include "wal.h"

static char tdir[4096];

static void disarm(void);
static struct store_ckpt_io real_io;   /* the store's own */

static void setup(void)
{
    log_set_level(LOG_LEVEL_ERROR);
    real_io = store__ckpt_io;
    unit_tmpdir_make(tdir, sizeof(tdir), "store-ckpt");
}

static void teardown(void)
{
    disarm();
    unit_tmpdir_remove(tdir);
}

/* A store in dir whose background thread checkpoints nothing by itself. */
static struct store *open_at(const char *dir)
{
    struct store_options o = {.dir = dir, .durability = STORE_DURABLE_FSYNC,
                              .snapshot_interval_ms = 3600000,
                              .checkpoint_log_percent = 10000};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);

    ck_assert_msg(s != NULL, "store_open: %s", err);
    return s;
}

static void create(struct store *s, const char *name, enum bf_kind kind,
                   uint64_t cap)
{
    struct bf_params p;
    char err[STORE_ERRLEN];

    memset(&p, 0, sizeof p);
    p.kind = kind;
    bf_params_default(&p);
    p.capacity = cap;
    p.error_rate = 0.01;
    ck_assert_msg(store_create(s, name, &p, err) == 0, "create: %s", err);
}

/* Keys [base, base + n) in records of per (at most 4096) hashes, each
 * acknowledged (durable) on return. */
static void add_records(struct store_filter *sf, uint64_t base, size_t n, size_t per)
{
    static struct bf_hash h[4096];
    char err[STORE_ERRLEN];

    ck_assert_uint_le(per, 4096);
    while (n) {
        size_t k = n < per ? n : per;
        for (size_t i = 0; i < k; i++)
            h[i] = unit_hash_of(base + i);
        ck_assert_msg(store_add_hashes(sf, h, k, NULL, err) == 0, "add: %s", err);
        base += k;
        n -= k;
    }
}

static void add_range(struct store_filter *sf, uint64_t base, size_t n)
{
    add_records(sf, base, n, 256);
}

static size_t missing_range(struct store_filter *sf, uint64_t base, size_t n)
{
    size_t miss = 0;

    for (size_t i = 0; i < n; i++) {
        struct bf_hash h = unit_hash_of(base + i);
        bool pr = false;
        ck_assert_int_eq(store_may_contain_hashes(sf, &h, 1, &pr), 0);
        miss += !pr;
    }
    return miss;
}

/* Import into sf a filter like it holding keys [base, base + n): one log
 * record as large as the filter, changing a page or so per key. */
static void import_range(struct store_filter *sf, uint64_t base, size_t n)
{
    struct bf *src = store_filter_copy(sf);
    char err[STORE_ERRLEN];

    ck_assert_ptr_nonnull(src);
    struct bf_layer_info li;
    ck_assert_int_eq(bf_layer_info(src, 0, &li), 0);
    memset(bf_layer_body(src, 0), 0, li.body_bytes);
    for (size_t i = 0; i < n; i++) {
        struct bf_hash h = unit_hash_of(base + i);
        bool added;
        bf_add_hashes(src, &h, 1, &added);
    }
    ck_assert_msg(store_import(sf, src, err) == 0, "import: %s", err);
    bf_destroy(src);
}

/* The log up to sf's newest checkpoint removed: a new segment, the
 * checkpoint moved into it (a barrier there and its manifest renamed to
 * it), and every segment before it goes. */
static void drop_covered_log(struct store *s, struct store_filter *sf)
{
    char err[STORE_ERRLEN];
    wal_rotate(s->wal);
    ck_assert_msg(store__filter_checkpoint(sf, STORE_CKPT_ADVANCE, err) == 0, "%s", err);
    ck_assert_int_eq(store__discard_log(s, false), 0);
    /* Nothing but the new segment's header is left. */
    ck_assert_uint_le(store_log_bytes(s), 64);
}

/* ---- crash hooks ---- */

/* What a machine crash would lose: file ranges written and not fsynced,
 * renames whose directory was not fsynced. */
#define MAXT 64
static struct dirty {
    int fd;
    char path[4096];
    off_t lo, hi;
} dirty[MAXT];
static int ndirty;
static struct pending_rename {
    char from[4096], to[4096];
} renames[MAXT];
static int nrenames;
static int crash_step;          /* the step to crash at */
static bool crash_drop;         /* a machine crash, else kill -9 */
static int steps_seen[STORE_STEPS];
static pthread_t armed_by;      /* steps of other threads are not counted */
static int types_seen[8];

static ssize_t hook_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    struct dirty *d = NULL;

    for (int i = 0; i < ndirty; i++)
        if (dirty[i].fd == fd)
            d = &dirty[i];
    if (!d && ndirty < MAXT) {
        char link[64];
        d = &dirty[ndirty++];
        memset(d, 0, sizeof *d);
        d->fd = fd;
        d->lo = off;
        d->hi = off;
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, d->path, sizeof d->path - 1);
        d->path[n > 0 ? n : 0] = 0;
    }
    if (d) {
        if (off < d->lo)
            d->lo = off;
        if (off + (off_t)len > d->hi)
            d->hi = off + (off_t)len;
    }
    return pwrite(fd, buf, len, off);
}

static int hook_fsync(int fd)
{
    for (int i = 0; i < ndirty; i++)
        if (dirty[i].fd == fd)
            dirty[i] = dirty[--ndirty];
    return fdatasync(fd) < 0 ? -errno : 0;
}

static int hook_rename(const char *from, const char *to)
{
    if (rename(from, to) < 0)
        return -errno;
    for (int i = 0; i < ndirty; i++)
        if (!strcmp(dirty[i].path, from))
            snprintf(dirty[i].path, sizeof dirty[i].path, "%s", to);
    if (nrenames < MAXT) {
        snprintf(renames[nrenames].from, sizeof renames[nrenames].from, "%s", from);
        snprintf(renames[nrenames].to, sizeof renames[nrenames].to, "%s", to);
        nrenames++;
    }
    return 0;
}

static int hook_fsync_dir(const char *dir)
{
    size_t dl = strlen(dir);

    for (int i = 0; i < nrenames;)
        if (!strncmp(renames[i].to, dir, dl) && renames[i].to[dl] == '/' &&
            !strchr(renames[i].to + dl + 1, '/'))
            renames[i] = renames[--nrenames];
        else
            i++;
    return durable_fsync_dir(dir);
}

/* The crash: as the disk would be after a power cut at this point (the
 * unsynced writes zeroed, the unsynced renames undone), or a kill -9. */
static void crash_now(void)
{
    if (crash_drop) {
        static const uint8_t zero[65536];
        for (int i = 0; i < ndirty; i++) {
            int fd = open(dirty[i].path, O_WRONLY);
            if (fd < 0)
                continue;
            for (off_t o = dirty[i].lo; o < dirty[i].hi; o += (off_t)sizeof zero) {
                size_t n = dirty[i].hi - o < (off_t)sizeof zero
                               ? (size_t)(dirty[i].hi - o) : sizeof zero;
                if (pwrite(fd, zero, n, o) < 0)
                    break;
            }
            close(fd);
        }
        for (int i = nrenames - 1; i >= 0; i--)
            if (rename(renames[i].to, renames[i].from) < 0)
                _exit(3);
        _exit(42);
    }
    kill(getpid(), SIGKILL);
    _exit(4);
}

static void hook_step(int type, int step)
{
    if (!pthread_equal(pthread_self(), armed_by))
        return;   /* the store's thread, removing log segments */
    if (step > 0 && step < STORE_STEPS)
        steps_seen[step]++;
    if (type >= 0 && type < 8)
        types_seen[type]++;
    if (step == crash_step)
        crash_now();
}

static void arm(int step, bool drop)
{
    ndirty = nrenames = 0;
    crash_step = step;
    crash_drop = drop;
    memset(steps_seen, 0, sizeof steps_seen);
    memset(types_seen, 0, sizeof types_seen);
    armed_by = pthread_self();
    store__ckpt_io = (struct store_ckpt_io){hook_pwrite, hook_fsync, hook_rename,
                                            hook_fsync_dir};
    store__ckpt_step = hook_step;
}

static void disarm(void)
{
    store__ckpt_io = real_io;
    store__ckpt_step = NULL;
}

/* ---- the scenarios ---- */

enum scenario { SC_BASE, SC_BASE_COUNTING, SC_RECORDS, SC_PAGES, SC_N };

static const char *const sc_name[] = {"base", "base of a counting filter",
                                      "delta of records", "delta of pages"};
static const int sc_type[] = {STORE_CKF_BASE, STORE_CKF_BASE, STORE_CKF_RECORDS,
                              STORE_CKF_PAGES};

/* The state before the checkpoint under test (keys acknowledged: 0..1999
 * and, for the deltas, 2000..2199 added or 5000..5019 imported after a
 * first base). */
static struct store *scenario_prepare(const char *dir, enum scenario sc,
                                      struct store_filter **out)
{
    char err[STORE_ERRLEN];
    struct store *s = open_at(dir);

    create(s, "f", sc == SC_BASE_COUNTING ? BF_KIND_COUNTING : BF_KIND_BLOCKED,
           sc == SC_BASE || sc == SC_BASE_COUNTING ? 100000 : 300000);
    struct store_filter *sf = store_get(s, "f");
    add_range(sf, 0, 2000);
    if (sc == SC_RECORDS || sc == SC_PAGES) {
        ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
        if (sc == SC_RECORDS)
            add_range(sf, 2000, 200);     /* most pages, 3 KiB of records */
        else
            import_range(sf, 5000, 20);   /* 20 pages, a 360 KB record */
    }
    *out = sf;
    return s;
}

/* The checkpoint under test, then the removal of the log it covers. */
static void scenario_checkpoint(struct store *s, struct store_filter *sf,
                                enum scenario sc)
{
    char err[STORE_ERRLEN];

    wal_rotate(s->wal);
    if (sc == SC_BASE || sc == SC_BASE_COUNTING)
        ck_assert_msg(store_filter_snapshot(sf, err) == 0, "%s", err);
    else
        ck_assert_msg(store__filter_checkpoint(sf, STORE_CKPT_IF_CHANGED, err) == 0,
                      "%s", err);
    ck_assert_int_eq(store__discard_log(s, false), 0);
}

static void scenario_check(struct store *s, enum scenario sc, const char *what)
{
    struct store_filter *sf = store_get(s, "f");
    char why[STORE_ERRLEN];

    ck_assert_ptr_nonnull(sf);
    ck_assert_msg(store_filter_state(sf, why) == STORE_READY, "%s: %s", what, why);
    ck_assert_msg(missing_range(sf, 0, 2000) == 0, "%s: keys lost", what);
    if (sc == SC_RECORDS)
        ck_assert_msg(missing_range(sf, 2000, 200) == 0, "%s: keys lost", what);
    if (sc == SC_PAGES)
        ck_assert_msg(missing_range(sf, 5000, 20) == 0, "%s: keys lost", what);
    store_put(sf);
}

static void rm_rf(const char *dir)
{
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Each scenario once without a crash: the checkpoint is of the kind
 * wanted, and every step happens. */
START_TEST(every_step_happens_in_each_scenario)
{
    for (int sc = 0; sc < SC_N; sc++) {
        char dir[4200];
        struct store_filter *sf;
        snprintf(dir, sizeof dir, "%s/sc%d", tdir, sc);
        struct store *s = scenario_prepare(dir, sc, &sf);
        arm(0, false);
        scenario_checkpoint(s, sf, sc);
        disarm();
        ck_assert_msg(types_seen[sc_type[sc]] > 0, "%s: no file of type %d written",
                      sc_name[sc], sc_type[sc]);
        for (int k = 1; k < STORE_STEPS; k++)
            ck_assert_msg(steps_seen[k] > 0, "%s: step %d never happened",
                          sc_name[sc], k);
        store_put(sf);
        store_close(s);
        s = open_at(dir);
        scenario_check(s, sc, sc_name[sc]);
        store_close(s);
        rm_rf(dir);
    }
}
END_TEST

static void crash_case(int sc, int step, bool drop)
{
    char dir[4200], what[256];
    int status;

    snprintf(dir, sizeof dir, "%s/c%d-%d-%d", tdir, sc, step, drop);
    snprintf(what, sizeof what, "%s, %s at step %d", sc_name[sc],
             drop ? "unsynced writes lost" : "kill -9", step);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct store_filter *sf;
        struct store *s = scenario_prepare(dir, sc, &sf);
        arm(step, drop);
        scenario_checkpoint(s, sf, sc);
        _exit(1);   /* the step never came */
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    if (drop)
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 42,
                      "%s: the child did not crash (status %d)", what, status);
    else
        ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                      "%s: the child did not crash (status %d)", what, status);
    /* Recovery: every acknowledged key; then it checkpoints again. */
    struct store *s = open_at(dir);
    scenario_check(s, sc, what);
    struct store_filter *sf = store_get(s, "f");
    add_range(sf, 9000, 50);
    char err[STORE_ERRLEN];
    ck_assert_msg(store_filter_snapshot(sf, err) == 0, "%s: %s", what, err);
    drop_covered_log(s, sf);
    store_put(sf);
    store_close(s);
    s = open_at(dir);
    scenario_check(s, sc, what);
    sf = store_get(s, "f");
    ck_assert_msg(missing_range(sf, 9000, 50) == 0, "%s: later keys lost", what);
    store_put(sf);
    store_close(s);
    rm_rf(dir);
}

START_TEST(a_crash_at_any_step_keeps_every_acknowledged_key)
{
    int sc = _i / 2;
    bool drop = _i % 2;

    for (int step = 1; step < STORE_STEPS; step++)
        crash_case(sc, step, drop);
}
END_TEST

/* ---- damaged files ---- */

/* The newest file of dir whose name starts with prefix. */
static void find_newest(const char *dir, const char *prefix, char *out, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char best[256] = "";

    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, prefix, strlen(prefix)) &&
            !strstr(de->d_name, ".tmp.") && strcmp(de->d_name, best) > 0)
            snprintf(best, sizeof best, "%s", de->d_name);
    closedir(d);
    ck_assert_msg(best[0], "no %s* in %s", prefix, dir);
    snprintf(out, len, "%s/%s", dir, best);
}

/* Overwrite len bytes at off of path: zeros, or a torn write of junk. */
static void damage(const char *path, off_t off, size_t len, bool zero)
{
    uint8_t buf[4096];
    int fd = open(path, O_WRONLY);

    ck_assert_int_ge(fd, 0);
    memset(buf, zero ? 0 : 0xab, sizeof buf);
    ck_assert_int_eq(pwrite(fd, buf, len, off), (ssize_t)len);
    close(fd);
}

/* A chain of a base and two deltas (records, then pages) over keys 0..1999,
 * 2000..2199 and 5000..5019 imported; with the log they cover gone or
 * kept. */
static void make_chain(const char *dir, bool log_gone)
{
    char err[STORE_ERRLEN];
    struct store *s = open_at(dir);

    create(s, "f", BF_KIND_BLOCKED, 1000000);
    struct store_filter *sf = store_get(s, "f");
    add_range(sf, 0, 2000);
    ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
    add_range(sf, 2000, 200);
    arm(0, false);
    ck_assert_int_eq(store__filter_checkpoint(sf, STORE_CKPT_IF_CHANGED, err), 0);
    ck_assert_int_gt(types_seen[STORE_CKF_RECORDS], 0);
    import_range(sf, 5000, 20);
    arm(0, false);
    ck_assert_int_eq(store__filter_checkpoint(sf, STORE_CKPT_IF_CHANGED, err), 0);
    ck_assert_int_gt(types_seen[STORE_CKF_PAGES], 0);
    disarm();
    if (log_gone)
        drop_covered_log(s, sf);
    store_put(sf);
    store_close(s);
}

struct damage_case {
    const char *file;        /* prefix of the file damaged */
    const char *delta_kind;  /* for a delta: "records" (the older) or "pages" */
    off_t off;               /* where: a page */
    size_t len;
    bool zero;
};

START_TEST(damaged_pages_are_refused_or_repaired_never_served)
{
    static const struct damage_case cases[] = {
        {"base-", NULL, 2 * 4096, 4096, true},        /* a data page zeroed */
        {"base-", NULL, 4096 + 100, 1000, false},     /* a directory page torn */
        {"base-", NULL, 0, 4096, true},               /* the header zeroed */
        {"delta-", "records", 2 * 4096, 4096, true},
        {"delta-", "records", 0, 512, false},
        {"delta-", "pages", 2 * 4096 + 2048, 2048, false},
        {"delta-", "pages", 4096, 4096, true},
        {"manifest-", NULL, 64, 40, true},             /* an entry zeroed */
        {"manifest-", NULL, 0, 4096, true},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        for (int gone = 0; gone < 2; gone++) {
            const struct damage_case *dc = &cases[c];
            char dir[4200], fdir[4300], path[4600], why[STORE_ERRLEN];
            snprintf(dir, sizeof dir, "%s/d%zu-%d", tdir, c, gone);
            make_chain(dir, gone);
            snprintf(fdir, sizeof fdir, "%s/f", dir);
            if (dc->delta_kind) {
                /* Two deltas: the records one is the older (from the
                 * base's seq), the pages one the newer. */
                DIR *d = opendir(fdir);
                struct dirent *de;
                char names[2][256] = {"", ""};
                int nd = 0;
                while ((de = readdir(d)))
                    if (!strncmp(de->d_name, "delta-", 6) && nd < 2)
                        snprintf(names[nd++], 256, "%s", de->d_name);
                closedir(d);
                ck_assert_int_eq(nd, 2);
                int older = strcmp(names[0], names[1]) < 0 ? 0 : 1;
                int pick = !strcmp(dc->delta_kind, "records") ? older : !older;
                snprintf(path, sizeof path, "%s/%s", fdir, names[pick]);
            } else {
                find_newest(fdir, dc->file, path, sizeof path);
            }
            damage(path, dc->off, dc->len, dc->zero);
            struct store *s = open_at(dir);
            struct store_filter *sf = store_get(s, "f");
            enum store_state st = store_filter_state(sf, why);
            if (st == STORE_READY) {
                /* Served: then with every key. */
                ck_assert_uint_eq(missing_range(sf, 0, 2000), 0);
                ck_assert_uint_eq(missing_range(sf, 2000, 200), 0);
                ck_assert_uint_eq(missing_range(sf, 5000, 20), 0);
            } else {
                ck_assert_int_eq(st, STORE_FAILED);
                ck_assert_msg(strstr(why, strrchr(path, '/') + 1),
                              "case %zu: the reason does not name %s: %s", c, path, why);
            }
            /* A damaged delta is repaired from the log while it holds the
             * records; without them, and for a base or manifest, refused. */
            bool want_ready = dc->delta_kind && !gone;
            ck_assert_msg((st == STORE_READY) == want_ready,
                          "case %zu (%s%s, log %s): state %d: %s", c, dc->file,
                          dc->delta_kind ? dc->delta_kind : "", gone ? "gone" : "kept",
                          st, why);
            if (st == STORE_READY) {
                /* The next checkpoint is a new base: the damaged file goes. */
                char err[STORE_ERRLEN];
                ck_assert_int_eq(store_snapshot_now(s, err), 0);
                ck_assert_int_eq(access(path, F_OK), -1);
            }
            store_put(sf);
            store_close(s);
            rm_rf(dir);
        }
    }
}
END_TEST

/* ---- a replayed record's page reaches the next delta ---- */

START_TEST(a_replayed_record_reaches_the_next_delta)
{
    char dir[4200], err[STORE_ERRLEN];
    int status;

    snprintf(dir, sizeof dir, "%s/replay", tdir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct store *s = open_at(dir);
        create(s, "f", BF_KIND_BLOCKED, 1000000);
        struct store_filter *sf = store_get(s, "f");
        add_range(sf, 0, 2000);
        ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
        import_range(sf, 5000, 20);   /* acknowledged, only in the log */
        kill(getpid(), SIGKILL);
        _exit(1);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFSIGNALED(status));
    /* The import is replayed; the next checkpoint writes the pages it
     * changed (a delta of pages: its record is a whole filter), and then
     * the log that held it goes. */
    struct store *s = open_at(dir);
    struct store_filter *sf = store_get(s, "f");
    ck_assert_uint_eq(missing_range(sf, 5000, 20), 0);
    arm(0, false);
    wal_rotate(s->wal);
    ck_assert_int_eq(store__filter_checkpoint(sf, STORE_CKPT_IF_CHANGED, err), 0);
    disarm();
    ck_assert_int_gt(types_seen[STORE_CKF_PAGES], 0);
    ck_assert_int_eq(store__discard_log(s, false), 0);
    /* Nothing of the import is left in the log. */
    ck_assert_uint_lt(store_log_bytes(s), 1000000);
    store_put(sf);
    store_close(s);
    s = open_at(dir);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 2000), 0);
    ck_assert_uint_eq(missing_range(sf, 5000, 20), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

/* The child pid killed itself (SIGKILL) rather than exit, which it does
 * with a code saying what failed. */
static void killed(pid_t pid)
{
    int status;

    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFSIGNALED(status), "the child exited with %d",
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* The bits of sf's layer 0 equal those of the filter file at path, and so
 * do its counts of keys added, of inserts and of bits set. */
static void same_bits(struct store_filter *sf, const char *path)
{
    char err[STORE_ERRLEN];
    struct bf *got = store_filter_copy(sf), *want = bf_file_load(path, err, NULL);
    struct bf_layer_info a, b;

    ck_assert_ptr_nonnull(got);
    ck_assert_msg(want != NULL, "%s", err);
    ck_assert_int_eq(bf_layer_info(got, 0, &a), 0);
    ck_assert_int_eq(bf_layer_info(want, 0, &b), 0);
    ck_assert_uint_eq(a.body_bytes, b.body_bytes);
    ck_assert_msg(memcmp(bf_layer_body_const(got, 0), bf_layer_body_const(want, 0),
                         a.body_bytes) == 0, "the recovered bits of %s differ", path);
    ck_assert_uint_eq(bf_keys_added(got), bf_keys_added(want));
    ck_assert_uint_eq(bf_insert_count(got), bf_insert_count(want));
    ck_assert_uint_eq(a.count, b.count);
    bf_destroy(got);
    bf_destroy(want);
}

/* Deltas of records after checkpoints, then the log, replayed at recovery
 * (sorted by block, on every CPU) give the filter the bits and counts it
 * had when it was killed: the export of the recovered filter is byte for
 * byte the one saved just before the kill -9. */
START_TEST(records_deltas_after_checkpoints_replay_to_the_same_bits)
{
    char dir[4200], saved[4300], err[STORE_ERRLEN];

    snprintf(dir, sizeof dir, "%s/deltas", tdir);
    snprintf(saved, sizeof saved, "%s/before-kill.bf", tdir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct store *s = open_at(dir);
        /* 7.2 MB of bits: a replay gathers 9 300 hashes (one per 768
         * bytes), enough for two threads of the sort. */
        create(s, "f", BF_KIND_BLOCKED, 6000000);
        struct store_filter *sf = store_get(s, "f");
        add_range(sf, 0, 20000);
        if (store_filter_snapshot(sf, err) < 0)
            _exit(5);
        arm(0, false);   /* counts the kinds of checkpoint, crashes never */
        for (uint64_t r = 1; r <= 3; r++) {
            add_range(sf, r * 20000, 20000);
            /* Re-adds of keys already in: they count as keys added. */
            add_range(sf, r * 20000 - 5000, 5000);
            wal_rotate(s->wal);
            if (store__filter_checkpoint(sf, STORE_CKPT_IF_CHANGED, err) < 0)
                _exit(6);
        }
        disarm();
        if (types_seen[STORE_CKF_RECORDS] < 3)
            _exit(7);   /* not the case under test */
        add_range(sf, 80000, 30000);   /* only in the log */
        struct bf *c = store_filter_copy(sf);
        if (!c || bf_file_save(c, saved, err) < 0)
            _exit(8);
        kill(getpid(), SIGKILL);
        _exit(1);
    }
    killed(pid);
    struct store *s = open_at(dir);
    struct store_filter *sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    same_bits(sf, saved);
    struct bf *got = store_filter_copy(sf);
    ck_assert_ptr_nonnull(got);
    ck_assert_uint_eq(bf_keys_added(got), 110000 + 3 * 5000);
    bf_destroy(got);
    ck_assert_uint_eq(missing_range(sf, 0, 110000), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

static void add_batches(struct store_filter *sf, uint64_t base, size_t n)
{
    add_records(sf, base, n, 4096);
}

/* A replay's adds gathered by the tens of thousands are swept on a thread
 * of their own while the log is read on (store_load.c): a 36 MB filter
 * (about 47 000 hashes a sweep) whose adds take turns with another filter's
 * and with an import into it (applied once the sweep before it is over)
 * recovers, like the other, the bits and counts it had at the kill. */
START_TEST(large_replay_sweeps_run_beside_the_reading)
{
    char dir[4200], big_f[4300], small_f[4300], err[STORE_ERRLEN];

    snprintf(dir, sizeof dir, "%s/sweeps", tdir);
    snprintf(big_f, sizeof big_f, "%s/sweeps-big.bf", tdir);
    snprintf(small_f, sizeof small_f, "%s/sweeps-small.bf", tdir);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct store *s = open_at(dir);
        create(s, "big", BF_KIND_BLOCKED, 30000000);
        create(s, "small", BF_KIND_BLOCKED, 100000);
        struct store_filter *big = store_get(s, "big"), *small = store_get(s, "small");
        add_batches(big, 0, 160000);
        add_batches(small, 1000000000, 5000);
        add_batches(big, 160000, 20000);
        import_range(big, 2000000000, 3000);
        add_batches(big, 180000, 200000);
        add_batches(small, 1000005000, 5000);
        struct bf *cb = store_filter_copy(big), *cs = store_filter_copy(small);
        if (!cb || !cs || bf_file_save(cb, big_f, err) < 0 ||
            bf_file_save(cs, small_f, err) < 0)
            _exit(8);
        kill(getpid(), SIGKILL);
        _exit(1);
    }
    killed(pid);
    struct store *s = open_at(dir);
    struct store_filter *big = store_get(s, "big"), *small = store_get(s, "small");
    ck_assert_int_eq(store_filter_state(big, NULL), STORE_READY);
    ck_assert_int_eq(store_filter_state(small, NULL), STORE_READY);
    same_bits(big, big_f);
    same_bits(small, small_f);
    ck_assert_uint_eq(missing_range(big, 0, 380000), 0);
    ck_assert_uint_eq(missing_range(big, 2000000000, 3000), 0);
    ck_assert_uint_eq(missing_range(small, 1000000000, 10000), 0);
    store_put(big);
    store_put(small);
    store_close(s);
}
END_TEST

/* Records of 16 keys, n shards taking turns, rounds r0..r1-1: shard i's
 * keys are i * 1000000 + r * 16 + k. */
static void shard_rounds(struct store_filter **sf, int n, uint64_t r0, uint64_t r1)
{
    struct bf_hash h[16];
    char err[STORE_ERRLEN];

    for (uint64_t r = r0; r < r1; r++)
        for (int i = 0; i < n; i++) {
            for (int k = 0; k < 16; k++)
                h[k] = unit_hash_of((uint64_t)i * 1000000 + r * 16 + (uint64_t)k);
            ck_assert_msg(store_add_hashes(sf[i], h, 16, NULL, err) == 0, "add: %s",
                          err);
        }
}

/* XXH64 of a filter's bits (its layer 0). */
static uint64_t bits_hash(struct store_filter *sf)
{
    struct bf *c = store_filter_copy(sf);
    struct bf_layer_info li;

    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(bf_layer_info(c, 0, &li), 0);
    uint64_t v = XXH64(bf_layer_body_const(c, 0), (size_t)li.body_bytes, 0);
    bf_destroy(c);
    return v;
}

/* Reopen the store at dir: shards shard-0 .. shard-(n-1) are READY and
 * hold and count the keys of shard_rounds' rounds 0 .. rounds-1; bits[i]
 * gets the XXH64 of shard i's bits when bits is not NULL. */
static void shards_come_back(const char *dir, int n, uint64_t rounds, uint64_t *bits)
{
    struct store *s = open_at(dir);
    char name[32];

    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "shard-%d", i);
        struct store_filter *f = store_get(s, name);
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(store_filter_state(f, NULL), STORE_READY);
        ck_assert_uint_eq(missing_range(f, (uint64_t)i * 1000000, rounds * 16), 0);
        struct bf *c = store_filter_copy(f);
        ck_assert_ptr_nonnull(c);
        ck_assert_uint_eq(bf_keys_added(c), rounds * 16);
        bf_destroy(c);
        if (bits)
            bits[i] = bits_hash(f);
        store_put(f);
    }
    store_close(s);
}

/* Shards of one filter under even load fall due together: their
 * checkpoints of records read the log once between them, not once each
 * (each read passes over the others' records), and what they wrote is
 * what the log held: with the log deleted, a restart has every key. */
#define TOGETHER 16
START_TEST(checkpoints_due_together_read_the_log_once)
{
    char dir[4200], name[16];
    struct store *s;
    struct store_filter *sf[TOGETHER];
    struct wal_stats st0, st1;

    snprintf(dir, sizeof dir, "%s/together", tdir);
    s = open_at(dir);
    s->copy_max = 0;   /* no copies of records: they are read back */
    for (int i = 0; i < TOGETHER; i++) {
        snprintf(name, sizeof name, "shard-%d", i);
        create(s, name, BF_KIND_BLOCKED, 100000);
        sf[i] = store_get(s, name);
    }
    /* Records of 16 keys, the shards taking turns: 3 200 keys each. */
    shard_rounds(sf, TOGETHER, 0, 200);
    wal_rotate(s->wal);
    uint64_t logged = wal_bytes(s->wal);
    /* Due now (the store was opened with checkpoints never due). */
    s->ckpt_percent = 25;
    wal_stats(s->wal, &st0);
    store__housekeeping(s);
    wal_stats(s->wal, &st1);
    for (int i = 0; i < TOGETHER; i++) {
        const struct store_manifest *m = sf[i]->chain;
        ck_assert_msg(m->n == 2 && m->e[1].type == STORE_CKF_RECORDS,
                      "shard %d: a chain of %u, its last of type %u (want a delta "
                      "of records)", i, m->n, m->n ? m->e[m->n - 1].type : 0);
    }
    /* One scan (two when the store's own round ran beside this one); one
     * per shard before. */
    ck_assert_msg(st1.rescans - st0.rescans <= 2, "%" PRIu64 " scans of the log "
                  "for %d checkpoints", st1.rescans - st0.rescans, TOGETHER);
    ck_assert_msg(st1.rescan_bytes - st0.rescan_bytes <= 2 * logged,
                  "%" PRIu64 " bytes read from a log of %" PRIu64,
                  st1.rescan_bytes - st0.rescan_bytes, logged);
    /* The log the checkpoints cover goes; each shard's keys come back from
     * its base and its delta alone. */
    ck_assert_int_eq(store__discard_log(s, false), 0);
    ck_assert_uint_lt(wal_bytes(s->wal), logged / 16);
    for (int i = 0; i < TOGETHER; i++)
        store_put(sf[i]);
    store_close(s);
    shards_come_back(dir, TOGETHER, 200, NULL);
}
END_TEST

#define COPIED 8

/* Checkpoints due together write their deltas of records from the
 * filters' copies, without reading the log; reloaded from base and delta
 * alone, each shard has every key and the very bits of the same shard in
 * a store that read its records back from the log (copies off). */
START_TEST(a_delta_of_records_is_written_from_the_copy)
{
    char dir[2][4200], name[16];
    struct store *s[2];
    struct store_filter *sf[2][COPIED];
    struct wal_stats st0, st1;
    uint64_t scans[2], copies[2], bits[2][COPIED];

    for (int k = 0; k < 2; k++) {
        snprintf(dir[k], sizeof dir[k], "%s/copy-%d", tdir, k);
        s[k] = open_at(dir[k]);
        if (k == 1)
            s[k]->copy_max = 0;
        for (int i = 0; i < COPIED; i++) {
            snprintf(name, sizeof name, "shard-%d", i);
            create(s[k], name, BF_KIND_BLOCKED, 100000);
            sf[k][i] = store_get(s[k], name);
        }
        shard_rounds(sf[k], COPIED, 0, 200);
        /* Held: 200 records of 280 bytes a shard, within the bound. */
        if (k == 0)
            ck_assert_uint_ge(atomic_load(&s[k]->copied), COPIED * 200 * 280);
        ck_assert_uint_le(atomic_load(&s[k]->copied), s[k]->copy_max);
        wal_rotate(s[k]->wal);
        uint64_t c0 = atomic_load(&s[k]->copy_ckpts);
        s[k]->ckpt_percent = 25;   /* due now */
        wal_stats(s[k]->wal, &st0);
        store__housekeeping(s[k]);
        wal_stats(s[k]->wal, &st1);
        scans[k] = st1.rescans - st0.rescans;
        copies[k] = atomic_load(&s[k]->copy_ckpts) - c0;
        for (int i = 0; i < COPIED; i++) {
            const struct store_manifest *m = sf[k][i]->chain;
            ck_assert_msg(m->n == 2 && m->e[1].type == STORE_CKF_RECORDS,
                          "store %d shard %d: a chain of %u (want a delta of "
                          "records)", k, i, m->n);
        }
        ck_assert_int_eq(store__discard_log(s[k], false), 0);
        for (int i = 0; i < COPIED; i++)
            store_put(sf[k][i]);
        store_close(s[k]);
    }
    ck_assert_uint_eq(copies[0], COPIED);
    ck_assert_uint_eq(scans[0], 0);
    ck_assert_uint_eq(copies[1], 0);
    ck_assert_uint_ge(scans[1], 1);
    shards_come_back(dir[0], COPIED, 200, bits[0]);
    shards_come_back(dir[1], COPIED, 200, bits[1]);
    for (int i = 0; i < COPIED; i++)
        ck_assert_msg(bits[0][i] == bits[1][i], "shard %d: other bits from the copy", i);
}
END_TEST

/* The manifest's fsync fails (the delta's file is written and kept). */
static bool manifest_written;

static void note_manifest(int type, int step)
{
    (void)type;
    if (step == STORE_STEP_MANIFEST_WRITTEN)
        manifest_written = true;
}

static int fail_manifest_fsync(int fd)
{
    return manifest_written ? -EIO : real_io.fsync(fd);
}

/* bloomgrid_checkpoint_read_back_total, as the process serves it. */
static double read_backs(void)
{
    char *t, *at;
    size_t n;
    double v = -1;

    ck_assert_int_eq(metrics_render_string(metrics_registry(), &t, &n), 0);
    if ((at = strstr(t, "\nbloomgrid_checkpoint_read_back_total ")))
        v = strtod(at + strlen("\nbloomgrid_checkpoint_read_back_total "), NULL);
    free(t);
    ck_assert_msg(v >= 0, "bloomgrid_checkpoint_read_back_total is not served");
    return v;
}

/* A copy is used only when it holds exactly the records after the
 * checkpoint's cursor: after a failed checkpoint (its copy taken, its
 * cursor unmoved) the next one reads its records back, the one after it
 * writes from the copy.  Copies stay within the store's bound, past which
 * filters keep none and read back. */
START_TEST(a_copy_is_used_only_for_exactly_its_range_and_within_its_bound)
{
    char dir[4200], name[16];
    struct store *s;
    struct store_filter *sf[COPIED];
    struct wal_stats st0, st1;

    snprintf(dir, sizeof dir, "%s/copy-range", tdir);
    s = open_at(dir);
    create(s, "f", BF_KIND_BLOCKED, 100000);
    sf[0] = store_get(s, "f");
    uint32_t n0 = sf[0]->chain->n;
    shard_rounds(sf, 1, 0, 100);
    uint64_t c0 = atomic_load(&s->copy_ckpts);
    manifest_written = false;
    store__ckpt_io.fsync = fail_manifest_fsync;
    store__ckpt_step = note_manifest;
    s->ckpt_percent = 5;   /* due now */
    store__housekeeping(s);
    disarm();
    s->ckpt_percent = 10000;
    ck_assert(manifest_written);
    ck_assert_uint_eq(sf[0]->chain->n, n0);   /* failed */
    ck_assert_uint_eq(atomic_load(&s->copy_ckpts), c0 + 1);   /* its copy taken */
    c0++;
    shard_rounds(sf, 1, 100, 200);
    s->ckpt_percent = 5;
    double rb = read_backs();
    wal_stats(s->wal, &st0);
    store__housekeeping(s);
    wal_stats(s->wal, &st1);
    ck_assert_uint_eq(sf[0]->chain->n, n0 + 1);
    ck_assert_uint_eq(atomic_load(&s->copy_ckpts), c0);   /* read back */
    ck_assert_uint_ge(st1.rescans - st0.rescans, 1);
    ck_assert(read_backs() == rb + 1);
    s->ckpt_percent = 10000;
    shard_rounds(sf, 1, 200, 300);
    s->ckpt_percent = 5;
    store__housekeeping(s);
    ck_assert_uint_eq(sf[0]->chain->n, n0 + 2);
    ck_assert_uint_eq(atomic_load(&s->copy_ckpts), c0 + 1);   /* from the copy */
    ck_assert(read_backs() == rb + 1);
    ck_assert_int_eq(store__discard_log(s, false), 0);
    store_put(sf[0]);
    store_close(s);
    s = open_at(dir);
    sf[0] = store_get(s, "f");
    ck_assert_uint_eq(missing_range(sf[0], 0, 300 * 16), 0);
    struct bf *c = store_filter_copy(sf[0]);
    ck_assert_ptr_nonnull(c);
    ck_assert_uint_eq(bf_keys_added(c), 300 * 16);
    bf_destroy(c);
    store_put(sf[0]);
    store_close(s);

    /* Room for about three shards' copies of eight. */
    snprintf(dir, sizeof dir, "%s/copy-bound", tdir);
    s = open_at(dir);
    s->copy_max = 3 * 65536;
    for (int i = 0; i < COPIED; i++) {
        snprintf(name, sizeof name, "shard-%d", i);
        create(s, name, BF_KIND_BLOCKED, 100000);
        sf[i] = store_get(s, name);
    }
    for (uint64_t r = 0; r < 200; r += 20) {
        shard_rounds(sf, COPIED, r, r + 20);
        ck_assert_uint_le(atomic_load(&s->copied), s->copy_max);
    }
    ck_assert_uint_gt(atomic_load(&s->copied), 0);
    c0 = atomic_load(&s->copy_ckpts);
    s->ckpt_percent = 25;
    store__housekeeping(s);
    uint64_t used = atomic_load(&s->copy_ckpts) - c0;
    ck_assert_msg(used >= 1 && used < COPIED, "%" PRIu64 " of %d checkpoints from "
                  "copies", used, COPIED);
    ck_assert_int_eq(store__discard_log(s, false), 0);
    for (int i = 0; i < COPIED; i++)
        store_put(sf[i]);
    store_close(s);
    shards_come_back(dir, COPIED, 200, NULL);
}
END_TEST

/* A checkpoint's scan of the log passes the other filters' records over
 * by their headers without their checksums: one of x's records whose id
 * was damaged is passed over as another filter's, and x's checkpoint sees
 * the gap in x's records and does not happen (its log stays), while y's,
 * read from the same scan, does. */
START_TEST(a_record_passed_over_by_a_damaged_header_stops_its_checkpoint)
{
    char dir[4200], seg[4400] = "";
    struct store *s;
    struct store_filter *x, *y;
    struct bf_hash h[16];
    char err[STORE_ERRLEN];

    snprintf(dir, sizeof dir, "%s/passed", tdir);
    s = open_at(dir);
    s->copy_max = 0;   /* no copies of records: they are read back */
    create(s, "x", BF_KIND_BLOCKED, 100000);
    create(s, "y", BF_KIND_BLOCKED, 100000);
    x = store_get(s, "x");
    y = store_get(s, "y");
    for (uint64_t r = 0; r < 200; r++) {
        for (int k = 0; k < 16; k++)
            h[k] = unit_hash_of(r * 16 + (uint64_t)k);
        ck_assert_msg(store_add_hashes(x, h, 16, NULL, err) == 0, "add: %s", err);
        for (int k = 0; k < 16; k++)
            h[k] = unit_hash_of(1000000 + r * 16 + (uint64_t)k);
        ck_assert_msg(store_add_hashes(y, h, 16, NULL, err) == 0, "add: %s", err);
    }
    wal_rotate(s->wal);
    /* x's 100th record: its incarnation id damaged (the header's checksum
     * no longer holds). */
    DIR *d = opendir(wal_dir(s->wal));
    struct dirent *de;
    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "wal-", 4) && (!seg[0] || strcmp(de->d_name, seg) < 0))
            snprintf(seg, sizeof seg, "%s", de->d_name);
    closedir(d);
    char path[8600];
    snprintf(path, sizeof path, "%s/%s", wal_dir(s->wal), seg);
    static struct unit_wal_rec recs[4096];
    size_t n = unit_wal_records(path, false, recs, 4096), xs = 0;
    off_t at = -1;
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    for (size_t i = 0; i < n && i < 4096 && at < 0; i++) {
        char name[2] = "";
        ck_assert_int_eq(pread(fd, name, 1, recs[i].off + 64), 1);
        if (recs[i].size == 64 + 1 + 16 * 16 && name[0] == 'x' && ++xs == 100)
            at = recs[i].off + 32;
    }
    ck_assert_int_ge(at, 0);
    unsigned char c;
    ck_assert_int_eq(pread(fd, &c, 1, at), 1);
    c ^= 0x5a;
    ck_assert_int_eq(pwrite(fd, &c, 1, at), 1);
    close(fd);

    uint64_t x_lsn = atomic_load(&x->ckpt_lsn), logged = wal_bytes(s->wal);
    s->ckpt_percent = 25;   /* due now */
    store__housekeeping(s);
    ck_assert_msg(y->chain->n == 2 && y->chain->e[1].type == STORE_CKF_RECORDS,
                  "y: a chain of %u", y->chain->n);
    ck_assert_msg(x->chain->n == 1, "x: a chain of %u, with one of its records "
                  "passed over", x->chain->n);
    ck_assert_uint_eq(atomic_load(&x->ckpt_lsn), x_lsn);
    ck_assert_int_eq(store__discard_log(s, false), 0);
    ck_assert_uint_ge(wal_bytes(s->wal), logged);   /* x's records stay */
    store_put(x);
    store_put(y);
    store_close(s);
}
END_TEST

/* ---- pullers and the checkpointer ---- */

struct walked {
    struct bf *into;
    size_t pages;
};

static int walk_page(void *ctx, const struct store_page *pg)
{
    struct walked *w = ctx;
    uint64_t *body = bf_layer_body(w->into, pg->layer) + pg->offset / 8;
    const uint64_t *d = pg->data;

    for (size_t i = 0; i < pg->len / 8; i++)
        body[i] |= d[i];
    w->pages++;
    return 0;
}

static size_t bf_missing(const struct bf *f, uint64_t base, size_t n)
{
    size_t miss = 0;

    for (size_t i = 0; i < n; i++) {
        struct bf_hash h = unit_hash_of(base + i);
        bool pr = false;
        bf_may_contain_hashes(f, &h, 1, &pr);
        miss += !pr;
    }
    return miss;
}

static struct bf *empty_copy(struct store_filter *sf)
{
    struct bf *c = store_filter_copy(sf);
    struct bf_layer_info li;

    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(bf_layer_info(c, 0, &li), 0);
    memset(bf_layer_body(c, 0), 0, li.body_bytes);
    return c;
}

START_TEST(pullers_and_the_checkpointer_each_get_every_change)
{
    char dir[4200], err[STORE_ERRLEN];
    struct store_pages_mark a, b, m;

    snprintf(dir, sizeof dir, "%s/pull", tdir);
    struct store *s = open_at(dir);
    create(s, "f", BF_KIND_BLOCKED, 200000);
    struct store_filter *sf = store_get(s, "f");
    struct walked wa = {.into = empty_copy(sf)}, wb = {.into = empty_copy(sf)};
    /* Both pullers start (every page so far: none). */
    ck_assert_int_eq(store_pages_since(sf, 0, 0, walk_page, &wa, &a, err), 0);
    b = a;
    add_range(sf, 0, 1000);                                  /* change 1 */
    ck_assert_int_eq(store_snapshot_now(s, err), 0);         /* checkpoint */
    ck_assert_int_eq(store_pages_since(sf, a.epoch, a.version, walk_page, &wa,
                                       &m, err), 0);         /* A pulls */
    a = m;
    add_range(sf, 1000, 1000);                               /* change 2 */
    import_range(sf, 5000, 20);                              /* change 3 */
    ck_assert_int_eq(store_pages_since(sf, a.epoch, a.version, walk_page, &wa,
                                       &m, err), 0);         /* A pulls */
    a = m;
    ck_assert_int_eq(store_snapshot_now(s, err), 0);         /* checkpoint */
    add_range(sf, 2000, 500);                                /* change 4 */
    ck_assert_int_eq(store_pages_since(sf, b.epoch, b.version, walk_page, &wb,
                                       &m, err), 0);         /* B, first time */
    ck_assert_int_eq(store_pages_since(sf, a.epoch, a.version, walk_page, &wa,
                                       &m, err), 0);         /* A again */
    ck_assert_int_eq(store_snapshot_now(s, err), 0);         /* checkpoint */
    /* Each puller holds every change, whatever the others pulled and the
     * checkpointer wrote meanwhile. */
    ck_assert_uint_eq(bf_missing(wa.into, 0, 2500), 0);
    ck_assert_uint_eq(bf_missing(wa.into, 5000, 20), 0);
    ck_assert_uint_eq(bf_missing(wb.into, 0, 2500), 0);
    ck_assert_uint_eq(bf_missing(wb.into, 5000, 20), 0);
    /* And so do the checkpoints, once the log is gone. */
    drop_covered_log(s, sf);
    store_put(sf);
    store_close(s);
    s = open_at(dir);
    sf = store_get(s, "f");
    ck_assert_uint_eq(missing_range(sf, 0, 2500), 0);
    ck_assert_uint_eq(missing_range(sf, 5000, 20), 0);
    store_put(sf);
    store_close(s);
    bf_destroy(wa.into);
    bf_destroy(wb.into);
}
END_TEST

/* ---- the previous release's checkpoints ---- */

START_TEST(a_previous_release_checkpoint_opens_and_is_migrated)
{
    char dir[4200], fdir[4300], path[4600], err[STORE_ERRLEN];
    struct store_fname n;

    snprintf(dir, sizeof dir, "%s/old", tdir);
    snprintf(fdir, sizeof fdir, "%s/f", dir);
    /* A filter with keys 0..1999 in a checkpoint and 2000..2099 in the log
     * after it; then its directory as the previous release wrote it: one
     * whole-filter file ckpt-<id>-<seq>-<lsn>.bf (the file format of
     * docs/FORMAT.md), no manifest. */
    struct store *s = open_at(dir);
    create(s, "f", BF_KIND_BLOCKED, 100000);
    struct store_filter *sf = store_get(s, "f");
    add_range(sf, 0, 2000);
    ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
    struct bf *old = store_filter_copy(sf);
    add_range(sf, 2000, 100);
    store_put(sf);
    /* No final checkpoint: the store is abandoned as by a crash, after
     * its files are read. */
    find_newest(fdir, "manifest-", path, sizeof path);
    ck_assert(store__fname_parse(strrchr(path, '/') + 1, &n));
    store_close(s);
    DIR *d = opendir(fdir);
    struct dirent *de;
    while ((de = readdir(d))) {
        char p[4600];
        if (de->d_name[0] == '.')
            continue;
        snprintf(p, sizeof p, "%s/%s", fdir, de->d_name);
        ck_assert_int_eq(unlink(p), 0);
    }
    closedir(d);
    struct store_fname o = {.kind = STORE_FILE_CKPT, .id = n.id, .seq = n.seq,
                            .lsn = n.lsn};
    char opath[4600];
    store__fname_path(opath, sizeof opath, fdir, &o);
    ck_assert_int_eq(bf_file_save(old, opath, err), 0);
    bf_destroy(old);

    s = open_at(dir);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 2100), 0);
    /* The next checkpoint writes a base and a manifest; the old file goes. */
    ck_assert_int_eq(store_snapshot_now(s, err), 0);
    ck_assert_int_eq(access(opath, F_OK), -1);
    find_newest(fdir, "manifest-", path, sizeof path);
    find_newest(fdir, "base-", path, sizeof path);
    drop_covered_log(s, sf);
    store_put(sf);
    store_close(s);
    s = open_at(dir);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 2100), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

Suite *store_ckpt_suite(void)
{
    Suite *s = suite_create("store_ckpt");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_step_happens_in_each_scenario);
    tcase_add_loop_test(tc, a_crash_at_any_step_keeps_every_acknowledged_key, 0, 2 * SC_N);
    tcase_add_test(tc, damaged_pages_are_refused_or_repaired_never_served);
    tcase_add_test(tc, a_replayed_record_reaches_the_next_delta);
    tcase_add_test(tc, records_deltas_after_checkpoints_replay_to_the_same_bits);
    tcase_add_test(tc, large_replay_sweeps_run_beside_the_reading);
    tcase_add_test(tc, checkpoints_due_together_read_the_log_once);
    tcase_add_test(tc, a_record_passed_over_by_a_damaged_header_stops_its_checkpoint);
    tcase_add_test(tc, a_delta_of_records_is_written_from_the_copy);
    tcase_add_test(tc, a_copy_is_used_only_for_exactly_its_range_and_within_its_bound);
    tcase_add_test(tc, pullers_and_the_checkpointer_each_get_every_change);
    tcase_add_test(tc, a_previous_release_checkpoint_opens_and_is_migrated);
    suite_add_tcase(s, tc);
    return s;
}
