/* Tests of the durable store: catalog, recovery from checkpoints and the
 * node log, damage handling, asynchronous writes, the log's bound,
 * migration of an earlier release's directory, imports, failed fsyncs and
 * SIGKILL crashes. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bf_file.h"
#include "log.h"
#include "store.h"
#include "store_internal.h"
#include "wal.h"
#include "unit_tmpdir.h"
#include "unit_hashes.h"
#include "unit_wal.h"

static char tdir[4096];

static void setup(void)
{
    log_set_level(LOG_LEVEL_WARN);
    unit_tmpdir_make(tdir, sizeof(tdir), "store");
}

static void teardown(void)
{
    unit_tmpdir_remove(tdir);
}

static void hashes(uint64_t base, size_t n, struct bf_hash *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = unit_hash_of(base + i);
}

static struct store *open_store(int durability, unsigned interval_ms,
                                uint64_t wal_bytes)
{
    struct store_options o = {.dir = tdir, .durability = durability,
                             .snapshot_interval_ms = interval_ms,
                             .snapshot_wal_bytes = wal_bytes};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);

    ck_assert_msg(s != NULL, "store_open: %s", err);
    return s;
}

static void params(struct bf_params *p, enum bf_kind kind, uint64_t cap)
{
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    bf_params_default(p);
    p->capacity = cap;
    p->error_rate = 0.01;
}

static void create(struct store *s, const char *name, enum bf_kind kind,
                   uint64_t cap)
{
    struct bf_params p;
    char err[STORE_ERRLEN];

    params(&p, kind, cap);
    ck_assert_msg(store_create(s, name, &p, err) == 0, "create: %s", err);
}

static void add_range(struct store_filter *sf, uint64_t base, size_t n)
{
    struct bf_hash h[256];
    char err[STORE_ERRLEN];

    while (n) {
        size_t k = n < 256 ? n : 256;
        hashes(base, k, h);
        ck_assert_msg(store_add_hashes(sf, h, k, NULL, err) == 0, "add: %s",
                      err);
        base += k;
        n -= k;
    }
}

/* How many of [base, base+n) the filter does not contain. */
static size_t missing_range(struct store_filter *sf, uint64_t base, size_t n)
{
    struct bf_hash h[256];
    bool pr[256];
    size_t miss = 0;

    while (n) {
        size_t k = n < 256 ? n : 256;
        hashes(base, k, h);
        ck_assert_int_eq(store_may_contain_hashes(sf, h, k, pr), 0);
        for (size_t i = 0; i < k; i++)
            miss += !pr[i];
        base += k;
        n -= k;
    }
    return miss;
}

/* Run fn in a child that exits without closing the store: a crash as far
 * as the files are concerned. */
static void in_crashing_child(void (*fn)(void *), void *arg)
{
    int status;
    pid_t pid = fork();

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        fn(arg);
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "child failed");
}

static void filter_path(char *out, size_t len, const char *name,
                        const char *prefix, bool newest)
{
    char dir[4096], best[256] = "";
    struct dirent *de;
    DIR *d;

    ck_assert_int_lt(snprintf(dir, sizeof(dir), "%s/%s", tdir, name),
                     (int)sizeof(dir));
    ck_assert_ptr_nonnull(d = opendir(dir));
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, prefix, strlen(prefix)) &&
            (!best[0] || (strcmp(de->d_name, best) > 0) == newest))
            memcpy(best, de->d_name, strlen(de->d_name) + 1);
    closedir(d);
    ck_assert_msg(best[0], "no %s* in %s", prefix, dir);
    ck_assert_int_lt(snprintf(out, len, "%s/%s", dir, best), (int)len);
}

/* The newest (or oldest) segment of the node log. */
static void log_path(char *out, size_t len, bool newest)
{
    char dir[4096], best[256] = "";
    struct dirent *de;
    DIR *d;

    ck_assert_int_lt(snprintf(dir, sizeof(dir), "%s/%s", tdir, STORE_WAL_DIR),
                     (int)sizeof(dir));
    ck_assert_ptr_nonnull(d = opendir(dir));
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "wal-", 4) &&
            (!best[0] || (strcmp(de->d_name, best) > 0) == newest))
            memcpy(best, de->d_name, strlen(de->d_name) + 1);
    closedir(d);
    ck_assert_msg(best[0], "no log segment in %s", dir);
    ck_assert_int_lt(snprintf(out, len, "%s/%s", dir, best), (int)len);
}

static void flip_byte(const char *path, off_t off)
{
    int fd = open(path, O_RDWR);
    unsigned char c;

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pread(fd, &c, 1, off), 1);
    c ^= 0x5a;
    ck_assert_int_eq(pwrite(fd, &c, 1, off), 1);
    close(fd);
}

static off_t file_size(const char *path)
{
    struct stat st;

    ck_assert_int_eq(stat(path, &st), 0);
    return st.st_size;
}

/* ---- catalog ---- */

START_TEST(create_list_drop_and_reopen)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    char err[STORE_ERRLEN], **names;
    struct bf_params p;
    size_t n;

    create(s, "beta", BF_KIND_BLOCKED, 1000);
    create(s, "alpha", BF_KIND_CLASSIC, 1000);
    params(&p, BF_KIND_BLOCKED, 1000);
    ck_assert_int_eq(store_create(s, "alpha", &p, err), -EEXIST);
    ck_assert_ptr_nonnull(strstr(err, "already exists"));
    p.error_rate = 2;
    ck_assert_int_eq(store_create(s, "gamma", &p, err), -EINVAL);
    ck_assert_ptr_null(store_get(s, "gamma"));

    ck_assert_int_eq(store_list(s, &names, &n), 0);
    ck_assert_uint_eq(n, 2);
    ck_assert_str_eq(names[0], "alpha");
    ck_assert_str_eq(names[1], "beta");
    store_list_free(names, n);

    struct store_filter *held = store_get(s, "beta");
    ck_assert_ptr_nonnull(held);
    ck_assert_int_eq(store_filter_state(held, NULL), STORE_READY);
    ck_assert_int_eq(store_drop(s, "beta", err), 0);
    ck_assert_int_eq(store_drop(s, "beta", err), -ENOENT);
    ck_assert_ptr_null(store_get(s, "beta"));
    /* The held handle sees the drop and refuses work. */
    ck_assert_int_eq(store_filter_state(held, NULL), STORE_DROPPED);
    struct bf_hash h = unit_hash_of(1);
    ck_assert_int_eq(store_add_hashes(held, &h, 1, NULL, err), -ENOENT);
    store_put(held);
    /* The name can be used again at once. */
    create(s, "beta", BF_KIND_BLOCKED, 1000);
    ck_assert_int_eq(store_drop(s, "beta", err), 0);
    store_close(s);

    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    ck_assert_int_eq(store_list(s, &names, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(names[0], "alpha");
    store_list_free(names, n);
    struct store_filter *sf = store_get(s, "alpha");
    ck_assert_int_eq(bf_kind(store_filter_bf(sf)), BF_KIND_CLASSIC);
    store_put(sf);
    store_close(s);
}
END_TEST

/* Budgets: a creation past max_memory_bytes or max_filters is -EDQUOT
 * naming the budget, before anything is written; what a filter is charged
 * (store_charge) comes back when it is freed, and loaded filters are
 * charged again after a reopen. */
START_TEST(budgets_refuse_before_anything_is_written)
{
    struct bf_params p;
    uint64_t one;
    char err[STORE_ERRLEN];
    struct store_budget b;

    params(&p, BF_KIND_BLOCKED, 1000000);
    ck_assert_int_eq(store_charge(&p, &one), 0);
    uint64_t bits;
    ck_assert_int_eq(bf_params_bytes(&p, &bits), 0);
    /* The bits and their page versions: nothing grows with a filter but
     * what it holds. */
    ck_assert_uint_eq(one, bits + (bits + 4095) / 4096 * 8);
    struct store_options o = {.dir = tdir, .max_memory_bytes = 2 * one + one / 2,
                              .max_filters = 3};
    struct store *s = store_open(&o, err);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(store_create(s, "a", &p, err), 0);
    ck_assert_int_eq(store_create(s, "b", &p, err), 0);
    store_budget(s, &b);
    ck_assert_uint_eq(b.charged_bytes, 2 * one);
    ck_assert_uint_eq(b.filters, 2);
    ck_assert_int_eq(store_create(s, "c", &p, err), -EDQUOT);
    ck_assert_ptr_nonnull(strstr(err, "max_memory_mb"));
    ck_assert_ptr_null(store_get(s, "c"));
    char path[STORE_PATH_LEN + 8];
    struct stat st;
    snprintf(path, sizeof path, "%s/c", tdir);
    ck_assert_int_eq(stat(path, &st), -1);
    /* Transient reservations share the budget. */
    ck_assert_int_eq(store_reserve(s, one, "a test", err), -EDQUOT);
    ck_assert_int_eq(store_reserve(s, one / 4, "a test", err), 0);
    store_release(s, one / 4);
    /* The filter count is its own budget. */
    params(&p, BF_KIND_COUNTING, 1000);
    ck_assert_int_eq(store_create(s, "small", &p, err), 0);
    ck_assert_int_eq(store_create(s, "more", &p, err), -EDQUOT);
    ck_assert_ptr_nonnull(strstr(err, "max_filters"));
    ck_assert_int_eq(store_drop(s, "a", err), 0);
    params(&p, BF_KIND_BLOCKED, 1000000);
    ck_assert_int_eq(store_create(s, "c", &p, err), 0);
    store_close(s);

    s = store_open(&o, err);
    ck_assert_ptr_nonnull(s);
    store_budget(s, &b);
    ck_assert_uint_eq(b.filters, 3);
    ck_assert_uint_gt(b.charged_bytes, 2 * one);
    ck_assert_int_eq(store_create(s, "d", &p, err), -EDQUOT);
    store_close(s);
}
END_TEST

/* A scalable filter's charge follows the layers it grows as keys arrive,
 * so a later create is judged against what it holds now. */
START_TEST(scalable_growth_is_charged)
{
    struct bf_params p;
    char err[STORE_ERRLEN];
    struct store_budget b0, b1;
    struct store_options o = {.dir = tdir, .max_memory_bytes = 64u << 20};
    struct store *s = store_open(&o, err);
    ck_assert_ptr_nonnull(s);
    params(&p, BF_KIND_SCALABLE, 1000);
    ck_assert_int_eq(store_create(s, "g", &p, err), 0);
    store_budget(s, &b0);
    struct store_filter *sf = store_get(s, "g");
    ck_assert_uint_eq(bf_layer_count(store_filter_bf(sf)), 1);
    struct bf_hash h[500];
    for (uint64_t base = 0; bf_layer_count(store_filter_bf(sf)) < 3; base += 500) {
        ck_assert_uint_lt(base, 100000);
        hashes(base, 500, h);
        ck_assert_int_eq(store_add_hashes(sf, h, 500, NULL, err), 0);
    }
    store_budget(s, &b1);
    ck_assert_uint_eq(b1.charged_bytes, store__charge_of(store_filter_bf(sf)));
    ck_assert_uint_gt(b1.charged_bytes, b0.charged_bytes);
    store_put(sf);
    ck_assert_int_eq(store_drop(s, "g", err), 0);
    store_budget(s, &b1);
    ck_assert_uint_eq(b1.charged_bytes, 0);
    store_close(s);
}
END_TEST

/* An add that would grow a scalable filter a layer past max_memory_mb is
 * refused whole, before anything is applied; the filter keeps serving and
 * adds that fit its newest layer still go in. */
START_TEST(scalable_growth_past_budget_is_refused)
{
    struct bf_params p;
    char err[STORE_ERRLEN] = "";
    struct store_budget b;
    struct store_options o = {.dir = tdir, .max_memory_bytes = 1u << 20};
    struct store *s = store_open(&o, err);
    ck_assert_ptr_nonnull(s);
    params(&p, BF_KIND_SCALABLE, 1000);
    ck_assert_int_eq(store_create(s, "g", &p, err), 0);
    struct store_filter *sf = store_get(s, "g");
    const struct bf *f = store_filter_bf(sf);
    struct bf_hash h[500];
    uint64_t base = 0;
    int rc = 0;
    for (; rc == 0; base += 500) {
        ck_assert_msg(base < 1000000, "no add refused after %u layers",
                      bf_layer_count(f));
        hashes(base, 500, h);
        uint32_t layers = bf_layer_count(f);
        uint64_t inserts = bf_insert_count(f);
        rc = store_add_hashes(sf, h, 500, NULL, err);
        if (rc != 0) {
            /* Nothing of the refused batch is in. */
            ck_assert_uint_eq(bf_layer_count(f), layers);
            ck_assert_uint_eq(bf_insert_count(f), inserts);
        }
    }
    ck_assert_int_eq(rc, -EDQUOT);
    ck_assert_msg(strstr(err, "scalable filter 'g'") && strstr(err, "max_memory_mb"),
                  "%s", err);
    /* The reservation is given back: the charge is what the filter holds,
     * within the budget. */
    store_budget(s, &b);
    ck_assert_uint_eq(b.charged_bytes, store__charge_of(f));
    ck_assert_uint_le(b.charged_bytes, 1u << 20);
    bool out[1];
    hashes(0, 1, h);
    ck_assert_int_eq(store_may_contain_hashes(sf, h, 1, out), 0);
    ck_assert(out[0]);
    /* One key fits the newest layer's room (unless it is exactly full). */
    struct bf_layer_info li;
    ck_assert_int_eq(bf_layer_info(f, bf_layer_count(f) - 1, &li), 0);
    hashes(base + 1000000, 1, h);
    if (li.count + 1 < li.capacity)
        ck_assert_int_eq(store_add_hashes(sf, h, 1, NULL, err), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

/* A drop leaves a tombstone: the name with the old secret is refused,
 * across a restart, and the name with a new secret is a new filter. */
START_TEST(drop_leaves_a_tombstone)
{
    static const uint8_t old_secret[BF_SECRET_LEN] = {1, 2, 3};
    static const uint8_t new_secret[BF_SECRET_LEN] = {4, 5, 6};
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    char err[STORE_ERRLEN], fp[17];
    struct bf_params p;

    params(&p, BF_KIND_BLOCKED, 1000);
    p.secret = old_secret;
    ck_assert_int_eq(store_create(s, "t", &p, err), 0);
    struct store_filter *sf = store_get(s, "t");
    uint64_t old_id = store_secret_id(store_filter_bf(sf));
    bf_fingerprint_id(store_filter_bf(sf), fp);
    store_put(sf);
    ck_assert(!store_dropped(s, "t", old_id, fp));
    ck_assert_int_eq(store_drop(s, "t", err), 0);
    ck_assert(store_dropped(s, "t", old_id, NULL));
    ck_assert(store_dropped(s, "t", 0, fp));
    ck_assert(!store_dropped(s, "other", old_id, fp));

    /* Re-creating it with the old secret (a merger's template, a copy's
     * pages) is refused and leaves nothing behind. */
    err[0] = 0;
    ck_assert_int_eq(store_create(s, "t", &p, err), -ESTALE);
    ck_assert_ptr_nonnull(strstr(err, "dropped"));
    ck_assert_ptr_null(store_get(s, "t"));
    struct bf *f = bf_create(&p, err);
    ck_assert_int_eq(store_create_from(s, "t", f, err), -ESTALE);
    bf_destroy(f);
    store_close(s);

    /* The tombstone is on disk. */
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    ck_assert(store_dropped(s, "t", old_id, NULL));
    ck_assert_int_eq(store_create(s, "t", &p, err), -ESTALE);
    p.secret = new_secret;
    ck_assert_int_eq(store_create(s, "t", &p, err), 0);
    sf = store_get(s, "t");
    ck_assert_uint_ne(store_secret_id(store_filter_bf(sf)), old_id);
    struct bf_hash h = unit_hash_of(9);
    ck_assert_int_eq(store_add_hashes(sf, &h, 1, NULL, err), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

/* Only the newest STORE_TOMBS_MAX drops are remembered (8 here). */
START_TEST(tombstones_are_bounded)
{
    store__tombs_max = 8;
    struct store *s = open_store(STORE_DURABLE_NONE, 0, 0);
    char err[STORE_ERRLEN], name[32];
    struct bf_params p;
    uint64_t first = 0, last = 0;

    params(&p, BF_KIND_BLOCKED, 100);
    for (int i = 0; i < 10; i++) {
        snprintf(name, sizeof name, "d%d", i);
        ck_assert_int_eq(store_create(s, name, &p, err), 0);
        struct store_filter *sf = store_get(s, name);
        last = store_secret_id(store_filter_bf(sf));
        if (i == 0)
            first = last;
        store_put(sf);
        ck_assert_int_eq(store_drop(s, name, err), 0);
    }
    store_close(s);
    s = open_store(STORE_DURABLE_NONE, 0, 0);
    ck_assert(!store_dropped(s, "d0", first, NULL));
    ck_assert(store_dropped(s, "d9", last, NULL));
    store_close(s);
    store__tombs_max = STORE_TOMBS_MAX;
}
END_TEST

/* A damaged tombstone file is refused, never read in part. */
START_TEST(damaged_tombstones_refuse_the_open)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    char err[STORE_ERRLEN], path[4200];

    create(s, "x", BF_KIND_BLOCKED, 100);
    ck_assert_int_eq(store_drop(s, "x", err), 0);
    store_close(s);
    snprintf(path, sizeof path, "%s/.tombstones", tdir);
    FILE *f = fopen(path, "a");
    ck_assert_ptr_nonnull(f);
    fputs("zz not a line\n", f);
    fclose(f);
    struct store_options o = {.dir = tdir};
    ck_assert_ptr_null(store_open(&o, err));
    ck_assert_ptr_nonnull(strstr(err, ".tombstones"));
}
END_TEST

START_TEST(names_are_validated)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    char err[STORE_ERRLEN], longname[200];
    struct bf_params p;

    params(&p, BF_KIND_BLOCKED, 1000);
    memset(longname, 'a', sizeof(longname));
    longname[STORE_NAME_MAX + 1] = 0;
    const char *bad[] = {"", ".hidden", "a/b", "..", "x y", "caf\xc3\xa9",
                         longname};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        ck_assert_int_eq(store_create(s, bad[i], &p, err), -EINVAL);
        ck_assert(err[0]);
    }
    longname[STORE_NAME_MAX] = 0; /* the longest shard name */
    create(s, longname, BF_KIND_BLOCKED, 1000);
    create(s, "Ok-name_1.2", BF_KIND_BLOCKED, 1000);
    ck_assert_int_eq(store_drop(s, "../x", err), -ENOENT);
    store_close(s);
}
END_TEST

START_TEST(interrupted_create_and_drop_are_swept)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    char path[4200], **names;
    size_t n;

    create(s, "gone", BF_KIND_BLOCKED, 1000);
    create(s, "kept", BF_KIND_BLOCKED, 1000);
    store_close(s);
    /* A drop that crashed after its rename, and a half-made creation. */
    char from[4200];
    snprintf(from, sizeof(from), "%s/gone", tdir);
    snprintf(path, sizeof(path), "%s/.dropped-7-gone", tdir);
    ck_assert_int_eq(rename(from, path), 0);
    snprintf(path, sizeof(path), "%s/.creating-new", tdir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    ck_assert_int_eq(store_list(s, &names, &n), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(names[0], "kept");
    store_list_free(names, n);
    ck_assert_int_ne(access(path, F_OK), 0);
    snprintf(path, sizeof(path), "%s/.dropped-7-gone", tdir);
    ck_assert_int_ne(access(path, F_OK), 0);
    store_close(s);
}
END_TEST

START_TEST(second_open_of_a_directory_is_refused)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_options o = {.dir = tdir};
    char err[STORE_ERRLEN];
    int status;
    pid_t pid = fork();

    if (pid == 0)
        _exit(store_open(&o, err) == NULL ? 0 : 1);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    store_close(s);
}
END_TEST

/* ---- recovery ---- */

static void child_add_batches(void *arg)
{
    const char *name = arg;
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf = store_get(s, name);

    for (int b = 0; b < 10; b++)
        add_range(sf, (uint64_t)b * 100, 100);
    /* no store_close: the child "crashes" */
}

START_TEST(acknowledged_adds_survive_a_crash)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    uint64_t v;

    create(s, "f", BF_KIND_BLOCKED, 100000);
    store_close(s);
    in_crashing_child(child_add_batches, "f");
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 1000), 0);
    v = store_filter_version(sf);
    ck_assert_uint_eq(v, 10);
    add_range(sf, 5000, 10);
    ck_assert_uint_gt(store_filter_version(sf), v);
    store_put(sf);
    store_close(s);
    /* Closing snapshotted: the version carries over. */
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_uint_eq(store_filter_version(sf), v + 1);
    ck_assert_uint_eq(missing_range(sf, 0, 1000), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

START_TEST(torn_wal_tail_is_cut_and_the_filter_served)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    char wal[4096];
    int fd;

    create(s, "f", BF_KIND_BLOCKED, 100000);
    store_close(s);
    in_crashing_child(child_add_batches, "f");
    log_path(wal, sizeof(wal), true);
    /* The crash left the segment with its room (zeros) after the
     * records, the last commit group padded to a whole unit. */
    off_t size = unit_wal_end(wal);
    ck_assert_int_gt(file_size(wal), size);
    ck_assert_int_eq(size % unit_wal_unit(wal), 0);
    /* A record cut short by the crash, as a partial write leaves it: right
     * after the last record. */
    fd = open(wal, O_WRONLY);
    ck_assert_int_eq(pwrite(fd, "BGWN\1\0\1\0\0\1\0\0\0\0\0\0garbage", 23, size), 23);
    close(fd);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 1000), 0);
    ck_assert_int_eq(file_size(wal), size);
    store_put(sf);
    store_close(s);
}
END_TEST

START_TEST(corrupt_wal_middle_fails_only_that_filter)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf, *other;
    char wal[4096], why[STORE_ERRLEN], err[STORE_ERRLEN];
    struct bf_hash h = unit_hash_of(1);
    bool pr;

    create(s, "f", BF_KIND_BLOCKED, 100000);
    create(s, "other", BF_KIND_BLOCKED, 100000);
    other = store_get(s, "other");
    add_range(other, 0, 500);
    store_put(other);
    store_close(s);
    in_crashing_child(child_add_batches, "f");
    log_path(wal, sizeof(wal), true);
    /* First record's payload (after its 64-byte header and the name "f");
     * nine records committed after it follow. */
    struct unit_wal_rec first;
    char where[64];
    ck_assert_uint_ge(unit_wal_records(wal, false, &first, 1), 1);
    flip_byte(wal, first.off + 64 + 1 + 700);
    snprintf(where, sizeof(where), "offset %lld ", (long long)first.off);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, why), STORE_FAILED);
    ck_assert_ptr_nonnull(strstr(why, where));
    ck_assert_ptr_nonnull(strstr(why, wal));
    ck_assert_int_eq(store_may_contain_hashes(sf, &h, 1, &pr), -EIO);
    ck_assert_int_eq(store_add_hashes(sf, &h, 1, NULL, err), -EIO);
    ck_assert_ptr_null(store_filter_bf(sf));
    /* Still refused on a retry: the file is untouched. */
    ck_assert_int_lt(store_filter_recover(sf, err), 0);
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_FAILED);
    store_put(sf);
    other = store_get(s, "other");
    ck_assert_int_eq(store_filter_state(other, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(other, 0, 500), 0);
    store_put(other);
    store_close(s);
}
END_TEST

START_TEST(corrupt_snapshot_fails_the_filter)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    char snap[4096], why[STORE_ERRLEN], err[STORE_ERRLEN];

    create(s, "f", BF_KIND_BLOCKED, 100000);
    sf = store_get(s, "f");
    add_range(sf, 0, 1000);
    /* A new base, and the log up to it gone. */
    ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
    ck_assert_int_eq(store_snapshot_now(s, err), 0);
    store_put(sf);
    store_close(s);
    filter_path(snap, sizeof(snap), "f", "base-", true);
    /* base-<id>-<seq>.bgc: a checkpoint after the adds (seq > 0). */
    ck_assert(strncmp(strrchr(snap, '/') + 22, "0000000000000000", 16) != 0);
    flip_byte(snap, file_size(snap) / 2);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, why), STORE_FAILED);
    ck_assert_ptr_nonnull(strstr(why, snap));
    store_put(sf);
    store_close(s);
}
END_TEST

static void copy_file(const char *from, const char *to)
{
    char buf[65536];
    int in = open(from, O_RDONLY), out;
    ssize_t n;

    ck_assert_int_ge(in, 0);
    out = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(out, 0);
    while ((n = read(in, buf, sizeof(buf))) > 0)
        ck_assert_int_eq(write(out, buf, (size_t)n), n);
    close(in);
    close(out);
}

static void child_snapshot_then_add(void *arg)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf = store_get(s, "f");
    char err[STORE_ERRLEN];

    (void)arg;
    ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
    add_range(sf, 5000, 300);
}

START_TEST(corrupt_snapshot_falls_back_to_older_one_with_full_wal)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    char man0[4096], base0[4096], wal1[4096], keep0[4096], keep1[4096],
        keep2[4096], snap[4096];

    create(s, "f", BF_KIND_BLOCKED, 100000);
    store_close(s);
    in_crashing_child(child_add_batches, "f");   /* 0..999 in the log */
    filter_path(man0, sizeof(man0), "f", "manifest-", true);
    filter_path(base0, sizeof(base0), "f", "base-", true);
    log_path(wal1, sizeof(wal1), false);
    ck_assert_int_lt(snprintf(keep0, sizeof(keep0), "%s/k0", tdir), 4096);
    ck_assert_int_lt(snprintf(keep1, sizeof(keep1), "%s/k1", tdir), 4096);
    ck_assert_int_lt(snprintf(keep2, sizeof(keep2), "%s/k2", tdir), 4096);
    copy_file(man0, keep0);
    copy_file(wal1, keep1);
    copy_file(base0, keep2);
    /* A newer checkpoint (a new base) replaces the first; then more adds. */
    in_crashing_child(child_snapshot_then_add, NULL);
    filter_path(snap, sizeof(snap), "f", "base-", true);
    ck_assert_str_ne(snap, base0);
    /* As if the old files had survived, and the new base rots. */
    copy_file(keep0, man0);
    copy_file(keep1, wal1);
    copy_file(keep2, base0);
    flip_byte(snap, file_size(snap) / 2);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 1000), 0);
    ck_assert_uint_eq(missing_range(sf, 5000, 300), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

/* ---- snapshots racing with adds ---- */

struct race {
    struct store *s;
    struct store_filter *sf;
    int id;
    _Atomic bool stop;
    _Atomic uint64_t acked;   /* batches acknowledged */
    int wfd;          /* pipe for acknowledged batch ids, or -1 */
    uint64_t max;     /* stop after this many batches (0: no limit) */
    unsigned pause_us;  /* between batches */
};

#define RACE_BATCH 64

static uint64_t batch_base(uint64_t id)
{
    return id * RACE_BATCH;
}

static void *race_adder(void *p)
{
    struct race *r = p;
    struct bf_hash h[RACE_BATCH];
    char err[STORE_ERRLEN];

    for (uint64_t k = 0; !r->stop && (!r->max || k < r->max); k++) {
        uint64_t id = (uint64_t)r->id * 100000000ull + k;
        hashes(batch_base(id), RACE_BATCH, h);
        if (store_add_hashes(r->sf, h, RACE_BATCH, NULL, err) != 0)
            break;
        r->acked = k + 1;
        if (r->wfd >= 0 && write(r->wfd, &id, sizeof(id)) != sizeof(id))
            break;
        if (r->pause_us)
            usleep(r->pause_us);
    }
    return NULL;
}

static void child_race(void *arg)
{
    /* Only the snapshots below, all taken while adds run, so recovery
     * starts from one taken in the middle of them. */
    struct store *s = open_store(STORE_DURABLE_NONE, 3600000, 1ull << 40);
    struct store_filter *sf = store_get(s, "f");
    struct race r[2];
    pthread_t t[2];
    char err[STORE_ERRLEN];

    for (int i = 0; i < 2; i++) {
        r[i] = (struct race){s, sf, i + 1, false, 0, -1, 0, 100};
        pthread_create(&t[i], NULL, race_adder, &r[i]);
    }
    for (int i = 0; i < 40; i++) {
        ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
        usleep(3000);
    }
    for (int i = 0; i < 2; i++) {
        r[i].stop = true;
        pthread_join(t[i], NULL);
    }
    /* Report through a file: the parent reads it after the "crash". */
    char path[4200];
    snprintf(path, sizeof(path), "%s/acked", tdir);
    FILE *f = fopen(path, "w");
    fprintf(f, "%llu %llu\n", (unsigned long long)r[0].acked,
            (unsigned long long)r[1].acked);
    fclose(f);
    (void)arg;
}

static void race_check(enum bf_kind kind)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    unsigned long long a[2];
    char path[4200];
    size_t miss = 0;

    create(s, "f", kind, 500000);
    store_close(s);
    in_crashing_child(child_race, NULL);
    snprintf(path, sizeof(path), "%s/acked", tdir);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fscanf(f, "%llu %llu", &a[0], &a[1]), 2);
    fclose(f);
    ck_assert_uint_gt(a[0] + a[1], 10);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    for (int i = 0; i < 2; i++)
        for (uint64_t k = 0; k < a[i]; k++)
            miss += missing_range(
                sf, batch_base((uint64_t)(i + 1) * 100000000ull + k),
                RACE_BATCH);
    ck_assert_uint_eq(miss, 0);
    store_put(sf);
    store_close(s);
}

START_TEST(snapshots_during_adds_lose_nothing_blocked)
{
    race_check(BF_KIND_BLOCKED);
}
END_TEST

START_TEST(snapshots_during_adds_lose_nothing_counting)
{
    race_check(BF_KIND_COUNTING);
}
END_TEST

START_TEST(snapshots_during_adds_lose_nothing_scalable)
{
    race_check(BF_KIND_SCALABLE);
}
END_TEST

/* Counting filter: anchors stay while other keys are added and removed
 * under concurrent snapshots.  A change counted both in a snapshot and in
 * the WAL replayed after it would leave counters off by one (a remove
 * counted twice can lose keys). */
#define ANCHORS 500

static void *churn_main(void *p)
{
    struct race *r = p;
    struct bf_hash h[RACE_BATCH];
    char err[STORE_ERRLEN];

    for (uint64_t k = 0; !r->stop && (!r->max || k < r->max); k++) {
        hashes(((uint64_t)r->id << 32) + k * RACE_BATCH, RACE_BATCH, h);
        if (store_add_hashes(r->sf, h, RACE_BATCH, NULL, err) != 0 ||
            store_remove_hashes(r->sf, h, RACE_BATCH, NULL, err) != 0)
            break;
        r->acked = k + 1;
    }
    return NULL;
}

/* Every churn key was added and removed again: the counters must be
 * exactly those of the anchors alone, not one more, not one less. */
static void same_as_anchors_only(const struct bf *f, void *ctx)
{
    struct bf_params p;
    char err[BF_ERRLEN];
    struct bf *want;
    struct bf_layer_info li;

    params(&p, BF_KIND_COUNTING, bf_capacity(f));
    p.error_rate = bf_error_rate(f);
    p.secret = bf_secret(f);
    ck_assert_ptr_nonnull(want = bf_create(&p, err));
    for (uint64_t i = 0; i < ANCHORS; i++)
        bf_add_hash(want, unit_hash_of(i));
    ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
    *(bool *)ctx = memcmp(bf_layer_body_const(f, 0),
                          bf_layer_body_const(want, 0), li.body_bytes) == 0;
    bf_destroy(want);
}

static void child_churn(void *arg)
{
    /* Only the snapshots below, all taken while the churn runs. */
    struct store *s = open_store(STORE_DURABLE_NONE, 3600000, 1ull << 40);
    struct store_filter *sf = store_get(s, "f");
    struct race r[2];
    char err[STORE_ERRLEN];
    pthread_t t[2];

    (void)arg;
    add_range(sf, 0, ANCHORS);
    for (int i = 0; i < 2; i++) {
        r[i] = (struct race){s, sf, i + 1, false, 0, -1, 0, 0};
        pthread_create(&t[i], NULL, churn_main, &r[i]);
    }
    /* The churn runs until after the last snapshot, so the WAL replayed
     * on recovery starts in the middle of it. */
    for (int i = 0; i < 30; i++) {
        ck_assert_int_eq(store_filter_snapshot(sf, err), 0);
        usleep(2000);
    }
    for (int i = 0; i < 2; i++) {
        r[i].stop = true;
        pthread_join(t[i], NULL);
        ck_assert_uint_gt(r[i].acked, 10);
    }
    ck_assert_uint_eq(missing_range(sf, 0, ANCHORS), 0);
    bool same = false;
    ck_assert_int_eq(store_filter_inspect(sf, same_as_anchors_only, &same), 0);
    ck_assert(same);
}

START_TEST(counting_removes_under_snapshots_keep_other_keys)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    bool same = false;

    /* Large enough that a copy takes a while, so mutations would land in
     * the middle of one if they were not held off. */
    create(s, "f", BF_KIND_COUNTING, 1000000);
    store_close(s);
    in_crashing_child(child_churn, NULL);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, ANCHORS), 0);
    ck_assert_int_eq(store_filter_inspect(sf, same_as_anchors_only, &same), 0);
    ck_assert_msg(same, "recovered counters differ from the acknowledged "
                  "history");
    store_put(sf);
    store_close(s);
}
END_TEST

/* ---- import, export, remove ---- */

START_TEST(import_mismatch_changes_nothing)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *a, *b;
    char err[STORE_ERRLEN];
    struct bf *src, *other;

    create(s, "a", BF_KIND_BLOCKED, 10000);
    a = store_get(s, "a");
    /* Same secret, other size: the bits differ. */
    struct bf_params p;
    params(&p, BF_KIND_BLOCKED, 20000);
    p.secret = bf_secret(store_filter_bf(a));
    ck_assert_int_eq(store_create(s, "b", &p, err), 0);
    b = store_get(s, "b");
    add_range(a, 0, 100);
    add_range(b, 1000, 100);
    uint64_t v = store_filter_version(a);
    ck_assert_ptr_nonnull(other = store_filter_copy(b));
    ck_assert_int_eq(store_import(a, other, err), -EINVAL);
    ck_assert_msg(strstr(err, "bits") != NULL, "%s", err);
    bf_destroy(other);

    /* Same geometry, different secret. */
    create(s, "c", BF_KIND_BLOCKED, 10000);
    struct store_filter *c = store_get(s, "c");
    add_range(c, 2000, 100);
    ck_assert_ptr_nonnull(other = store_filter_copy(c));
    ck_assert_int_eq(store_import(a, other, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "secret"));
    bf_destroy(other);
    store_put(c);

    ck_assert_uint_eq(store_filter_version(a), v);
    ck_assert_uint_eq(missing_range(a, 1000, 100), 100);
    ck_assert_uint_eq(missing_range(a, 2000, 100), 100);

    /* A compatible import merges, and survives a restart from the WAL. */
    ck_assert_ptr_nonnull(src = store_filter_copy(a));
    ck_assert_ptr_nonnull(other = bf_create_like(src, err));
    for (uint64_t i = 0; i < 100; i++)
        bf_add_hash(other, unit_hash_of(3000 + i));
    ck_assert_int_eq(store_import(a, other, err), 0);
    ck_assert_uint_gt(store_filter_version(a), v);
    ck_assert_uint_eq(missing_range(a, 3000, 100), 0);
    bf_destroy(src);
    bf_destroy(other);
    store_put(a);
    store_put(b);
    store_close(s);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    a = store_get(s, "a");
    ck_assert_uint_eq(missing_range(a, 0, 100), 0);
    ck_assert_uint_eq(missing_range(a, 3000, 100), 0);
    store_put(a);
    store_close(s);
}
END_TEST

static void child_import(void *arg)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf = store_get(s, "f");
    struct bf *copy = store_filter_copy(sf), *src;
    char err[STORE_ERRLEN];

    (void)arg;
    src = bf_create_like(copy, err);
    for (uint64_t i = 0; i < 500; i++)
        bf_add_hash(src, unit_hash_of(7000 + i));
    ck_assert_int_eq(store_import(sf, src, err), 0);
    bf_destroy(src);
    bf_destroy(copy);
}

START_TEST(import_is_replayed_from_the_wal)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;

    create(s, "f", BF_KIND_COUNTING, 10000);
    store_close(s);
    in_crashing_child(child_import, NULL);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 7000, 500), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

struct membuf {
    uint8_t *p;
    size_t len, cap;
};

static int membuf_write(void *ctx, const void *buf, size_t len)
{
    struct membuf *m = ctx;

    if (m->len + len > m->cap) {
        m->cap = (m->len + len) * 2;
        m->p = realloc(m->p, m->cap);
    }
    memcpy(m->p + m->len, buf, len);
    m->len += len;
    return 0;
}

/* store_import_file of a file of src's bits (7000.. 500 keys) into f: the
 * file's bytes are the log record, and are what is merged. */
static void child_import_file(void *arg)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf = store_get(s, "f");
    struct bf *copy = store_filter_copy(sf), *src;
    struct membuf m = {0};
    char err[STORE_ERRLEN];

    (void)arg;
    src = bf_create_like(copy, err);
    for (uint64_t i = 0; i < 500; i++)
        bf_add_hash(src, unit_hash_of(7000 + i));
    ck_assert_int_eq(bf_file_write(src, membuf_write, &m), 0);
    bf_destroy(src);
    struct store_import_file *file = store_import_file_new(m.p, m.len, err);
    ck_assert_ptr_nonnull(file);
    free(m.p);
    ck_assert_uint_eq(store_import_file_len(file), m.len);
    ck_assert_int_eq(bf_file_scan_mem(store_import_file_bytes(file),
                                      store_import_file_len(file), NULL, NULL,
                                      NULL, err), 0);
    ck_assert_int_eq(store_import_file(sf, file, err), 0);
    ck_assert_uint_eq(missing_range(sf, 7000, 500), 0);
    bf_destroy(copy);
}

START_TEST(import_file_is_logged_as_received_and_replayed)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;

    create(s, "f", BF_KIND_BLOCKED, 10000);
    store_close(s);
    in_crashing_child(child_import_file, NULL);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 7000, 500), 0);

    /* Another secret: refused, nothing changed, the file taken all the
     * same (no leak under the sanitizers). */
    char err[STORE_ERRLEN];
    create(s, "g", BF_KIND_BLOCKED, 10000);
    struct store_filter *g = store_get(s, "g");
    add_range(g, 9000, 50);
    struct bf *other = store_filter_copy(g);
    struct membuf m = {0};
    ck_assert_int_eq(bf_file_write(other, membuf_write, &m), 0);
    bf_destroy(other);
    struct store_import_file *file = store_import_file_new(m.p, m.len, err);
    free(m.p);
    ck_assert_ptr_nonnull(file);
    uint64_t v = store_filter_version(sf);
    ck_assert_int_eq(store_import_file(sf, file, err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "secret"));
    ck_assert_uint_eq(store_filter_version(sf), v);
    /* One never given to store_import_file. */
    store_import_file_free(store_import_file_new("abc", 3, err));
    store_import_file_free(NULL);
    store_put(g);
    store_put(sf);
    store_close(s);
}
END_TEST

/* ---- Imports spooled and applied in pieces (store_import_spool) ---- */

/* The file of a filter like sf's holding keys [base, base + n), into *m. */
static void file_like(struct store_filter *sf, uint64_t base, size_t n,
                      struct membuf *m, uint64_t *inserts)
{
    struct bf *copy = store_filter_copy(sf), *src;
    char err[STORE_ERRLEN];

    ck_assert_ptr_nonnull(copy);
    src = bf_create_like(copy, err);
    ck_assert_ptr_nonnull(src);
    bf_destroy(copy);
    for (uint64_t i = 0; i < n; i++)
        bf_add_hash(src, unit_hash_of(base + i));
    memset(m, 0, sizeof(*m));
    ck_assert_int_eq(bf_file_write(src, membuf_write, m), 0);
    if (inserts)
        *inserts = bf_insert_count(src);
    bf_destroy(src);
}

/* A spool of m's first len bytes, written in pieces of odd sizes. */
static struct store_spool *spool_of(struct store *s, const struct membuf *m,
                                    size_t len)
{
    struct store_spool *sp;
    char err[STORE_ERRLEN];

    ck_assert_int_eq(store_spool_new(s, m->len + 4096, &sp, err), 0);
    for (size_t off = 0; off < len;) {
        size_t k = len - off < 77777 ? len - off : 77777;
        ck_assert_msg(store_spool_write(sp, m->p + off, k, err) == 0, "%s", err);
        off += k;
    }
    ck_assert_uint_eq(store_spool_len(sp), len);
    return sp;
}

struct spool_check {
    int calls, refuse;
};

static int spool_check(void *ctx, const struct bf *src)
{
    struct spool_check *c = ctx;

    (void)src;
    c->calls++;
    return c->refuse;
}

static uint64_t inserts_of(struct store_filter *sf)
{
    struct bf *c = store_filter_copy(sf);
    uint64_t n = bf_insert_count(c);
    bf_destroy(c);
    return n;
}

/* Keys 100000.. 200000 of a file like "f" (about 6 MiB of bits: two
 * pieces) and 7000.. 500 of one like "c" (counting: merged whole). */
static void child_import_spool(void *arg)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf = store_get(s, "f"), *sc = store_get(s, "c");
    struct spool_check chk = {0};
    struct bf_merge_projection proj;
    struct membuf m;
    uint64_t *ins = arg, before = inserts_of(sf);
    char err[STORE_ERRLEN] = "";

    file_like(sf, 100000, 100000, &m, ins);
    ck_assert_uint_gt(m.len, STORE_IMPORT_PIECE + (1u << 20));
    struct store_spool *sp = spool_of(s, &m, m.len);
    free(m.p);
    ck_assert_msg(store_import_spool(sf, sp, spool_check, &chk, &proj, err) == 0,
                  "%s", err);
    store_spool_free(sp);
    ck_assert_int_eq(chk.calls, 1);
    ck_assert_uint_eq(missing_range(sf, 100000, 100000), 0);
    ck_assert_uint_eq(inserts_of(sf), before + *ins);
    ck_assert(proj.fill_ratio > 0.0 && proj.estimated_fpr > 0.0);

    file_like(sc, 7000, 500, &m, NULL);
    sp = spool_of(s, &m, m.len);
    free(m.p);
    ck_assert_msg(store_import_spool(sc, sp, NULL, NULL, NULL, err) == 0, "%s", err);
    store_spool_free(sp);
    ck_assert_uint_eq(missing_range(sc, 7000, 500), 0);
}

START_TEST(import_spool_applies_in_pieces_and_replays)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    uint64_t *ins = mmap(NULL, sizeof(uint64_t), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    ck_assert_ptr_ne(ins, MAP_FAILED);
    create(s, "f", BF_KIND_BLOCKED, 5000000);
    create(s, "c", BF_KIND_COUNTING, 10000);
    sf = store_get(s, "f");
    add_range(sf, 1, 100);
    uint64_t before = inserts_of(sf);
    store_put(sf);
    store_close(s);
    in_crashing_child(child_import_spool, ins);
    /* The pieces' records and the counts' record replay. */
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 1, 100), 0);
    ck_assert_uint_eq(missing_range(sf, 100000, 100000), 0);
    ck_assert_uint_eq(inserts_of(sf), before + *ins);
    store_put(sf);
    sf = store_get(s, "c");
    ck_assert_uint_eq(missing_range(sf, 7000, 500), 0);
    store_put(sf);
    store_close(s);
    munmap(ins, sizeof(uint64_t));
}
END_TEST

START_TEST(import_spool_refuses_bad_files_changing_nothing)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    struct store_spool *sp;
    struct spool_check chk = {0};
    struct membuf m;
    char err[STORE_ERRLEN];

    create(s, "f", BF_KIND_BLOCKED, 5000000);
    sf = store_get(s, "f");
    add_range(sf, 1, 100);
    uint64_t v = store_filter_version(sf), ins = inserts_of(sf);
    file_like(sf, 100000, 20000, &m, NULL);

    /* The checksum's last byte: found once every piece was read. */
    m.p[m.len - 1] ^= 1;
    sp = spool_of(s, &m, m.len);
    err[0] = '\0';
    ck_assert_int_eq(store_import_spool(sf, sp, spool_check, &chk, NULL, err), -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "checksum"));
    store_spool_free(sp);
    m.p[m.len - 1] ^= 1;
    /* Cut short. */
    sp = spool_of(s, &m, m.len - 9);
    err[0] = '\0';
    ck_assert_int_eq(store_import_spool(sf, sp, spool_check, &chk, NULL, err), -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "truncated"));
    store_spool_free(sp);
    /* Refused by the caller's check on the header. */
    chk.refuse = -ECANCELED;
    sp = spool_of(s, &m, m.len);
    ck_assert_int_eq(store_import_spool(sf, sp, spool_check, &chk, NULL, err), -ECANCELED);
    store_spool_free(sp);
    /* The short file was refused on its size, before the check. */
    ck_assert_int_eq(chk.calls, 2);
    /* Nothing applied, nothing logged. */
    ck_assert_uint_eq(store_filter_version(sf), v);
    ck_assert_uint_eq(inserts_of(sf), ins);
    ck_assert_uint_gt(missing_range(sf, 100000, 20000), 19000);

    /* A spool takes no more than its max. */
    ck_assert_int_eq(store_spool_new(s, 100, &sp, err), 0);
    ck_assert_int_eq(store_spool_write(sp, m.p, 60, err), 0);
    ck_assert_int_eq(store_spool_write(sp, m.p, 41, err), -E2BIG);
    ck_assert_uint_eq(store_spool_len(sp), 60);
    /* What was written reads back at any offset, and nothing past it. */
    uint8_t back[60];
    ck_assert_int_eq(store_spool_read(sp, 0, back, 60, err), 0);
    ck_assert_mem_eq(back, m.p, 60);
    ck_assert_int_eq(store_spool_read(sp, 20, back, 40, err), 0);
    ck_assert_mem_eq(back, (const uint8_t *)m.p + 20, 40);
    ck_assert_int_eq(store_spool_read(sp, 20, back, 41, err), -EINVAL);
    ck_assert_int_eq(store_spool_read(sp, 61, back, 0, err), -EINVAL);
    store_spool_free(sp);
    store_spool_free(NULL);
    free(m.p);
    store_put(sf);
    store_close(s);
}
END_TEST

/* The spools of the Imports in flight together stay within
 * max_memory_bytes; one left by a crash between its creation and its
 * unlink is removed by store_open. */
START_TEST(import_spools_are_bounded_and_swept)
{
    struct store_options o = {.dir = tdir, .durability = STORE_DURABLE_FSYNC,
                              .max_memory_bytes = 4u << 20};
    struct store_spool *a, *b;
    char err[STORE_ERRLEN], path[4200];
    static uint8_t mib[1u << 20];
    struct stat st;

    snprintf(path, sizeof path, "%s/.import-x1Y2z3", tdir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    struct store *s = store_open(&o, err);
    ck_assert_msg(s != NULL, "%s", err);
    ck_assert_int_ne(stat(path, &st), 0);
    ck_assert_int_eq(store_spool_new(s, 8u << 20, &a, err), 0);
    ck_assert_int_eq(store_spool_new(s, 8u << 20, &b, err), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(store_spool_write(a, mib, sizeof mib, err), 0);
    ck_assert_int_eq(store_spool_write(b, mib, sizeof mib, err), 0);
    ck_assert_int_eq(store_spool_write(b, mib, sizeof mib, err), -EDQUOT);
    ck_assert_ptr_nonnull(strstr(err, "max_memory_mb"));
    store_spool_free(a);   /* its bytes back */
    ck_assert_int_eq(store_spool_write(b, mib, sizeof mib, err), 0);
    store_spool_free(b);
    store_close(s);
}
END_TEST

static void stats_of(const struct bf *f, void *ctx)
{
    bf_stats(f, ctx);
}

START_TEST(export_writes_a_loadable_file)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    struct membuf m = {0};
    char err[STORE_ERRLEN];
    struct bf *f;

    create(s, "f", BF_KIND_BLOCKED, 10000);
    sf = store_get(s, "f");
    add_range(sf, 0, 1000);
    uint64_t total = 0;
    ck_assert_int_eq(store_export(sf, membuf_write, &m, &total, err), 0);
    ck_assert_uint_eq(m.len, bf_file_size(store_filter_bf(sf)));
    ck_assert_uint_eq(total, m.len);
    ck_assert_ptr_nonnull(f = bf_file_parse(m.p, m.len, err));
    ck_assert_ptr_null(bf_mismatch(f, store_filter_bf(sf)));
    for (uint64_t i = 0; i < 1000; i++)
        ck_assert(bf_may_contain_hash(f, unit_hash_of(i)));
    bf_destroy(f);
    free(m.p);
    struct bf_stats st;
    ck_assert_int_eq(store_filter_inspect(sf, stats_of, &st), 0);
    ck_assert_double_gt(st.estimated_count, 900);
    ck_assert_double_lt(st.estimated_count, 1100);
    store_put(sf);
    store_close(s);
}
END_TEST

static void child_remove(void *arg)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf = store_get(s, "f");
    struct bf_hash h[100];
    bool rm[100];
    char err[STORE_ERRLEN];

    (void)arg;
    add_range(sf, 0, 200);
    hashes(0, 100, h);
    ck_assert_int_eq(store_remove_hashes(sf, h, 100, rm, err), 0);
    for (int i = 0; i < 100; i++)
        ck_assert(rm[i]);
}

START_TEST(remove_is_counting_only_and_durable)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    struct bf_hash h = unit_hash_of(1);
    char err[STORE_ERRLEN];

    create(s, "b", BF_KIND_BLOCKED, 10000);
    create(s, "f", BF_KIND_COUNTING, 100000);
    sf = store_get(s, "b");
    ck_assert_int_eq(store_remove_hashes(sf, &h, 1, NULL, err), -EOPNOTSUPP);
    ck_assert_ptr_nonnull(strstr(err, "counting"));
    store_put(sf);
    store_close(s);
    in_crashing_child(child_remove, NULL);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_uint_eq(missing_range(sf, 100, 100), 0);
    /* Removed keys are gone again (a shared counter would be rare). */
    ck_assert_uint_ge(missing_range(sf, 0, 100), 95);
    store_put(sf);
    store_close(s);
}
END_TEST

/* ---- failed fsync ---- */

static int failing_fdatasync(int fd)
{
    (void)fd;
    errno = EIO;
    return -1;
}

START_TEST(failed_fsync_refuses_writes_until_recovered)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf;
    char err[STORE_ERRLEN], why[STORE_ERRLEN];
    struct bf_hash h[10];

    create(s, "f", BF_KIND_BLOCKED, 100000);
    sf = store_get(s, "f");
    add_range(sf, 0, 100);
    uint64_t v = store_filter_version(sf);
    hashes(500, 10, h);
    wal__fdatasync = failing_fdatasync;
    ck_assert_int_eq(store_add_hashes(sf, h, 10, NULL, err), -EIO);
    ck_assert_ptr_nonnull(strstr(err, "fdatasync"));
    ck_assert_int_eq(store_filter_state(sf, why), STORE_FAILED);
    ck_assert_ptr_nonnull(strstr(why, "fdatasync"));
    ck_assert_uint_eq(store_filter_version(sf), v);   /* nothing acked */
    wal__fdatasync = fdatasync;
    /* Never retried by itself, even with a healthy disk again; reads go
     * on from the bits in memory, which hold every acknowledged write. */
    ck_assert_int_eq(store_add_hashes(sf, h, 10, NULL, err), -EIO);
    ck_assert_uint_eq(missing_range(sf, 0, 100), 0);
    ck_assert_int_eq(store_filter_recover(sf, err), 0);
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 100), 0);
    add_range(sf, 1000, 100);
    store_put(sf);
    store_close(s);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_uint_eq(missing_range(sf, 0, 100), 0);
    ck_assert_uint_eq(missing_range(sf, 1000, 100), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

START_TEST(write_failed_filter_is_recovered_by_the_store)
{
    struct store_options o = {.dir = tdir, .snapshot_interval_ms = 3600000,
                             .recover_retry_ms = 50};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);
    struct store_filter *sf;
    struct bf_hash h = unit_hash_of(999999);
    int i;

    ck_assert_ptr_nonnull(s);
    create(s, "f", BF_KIND_BLOCKED, 100000);
    sf = store_get(s, "f");
    add_range(sf, 0, 100);
    wal__fdatasync = failing_fdatasync;
    ck_assert_int_eq(store_add_hashes(sf, &h, 1, NULL, err), -EIO);
    /* While the disk still fails, nothing is acknowledged, whether or not
     * a retry has reloaded the filter meanwhile (reloading needs no
     * fsync of the log; the next write does). */
    usleep(200000);
    struct bf_hash h2 = unit_hash_of(999998);
    ck_assert_int_lt(store_add_hashes(sf, &h2, 1, NULL, err), 0);
    wal__fdatasync = fdatasync;
    for (i = 0; i < 100 && store_filter_state(sf, NULL) != STORE_READY; i++)
        usleep(20000);
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 100), 0);
    add_range(sf, 200, 100);
    store_put(sf);
    store_close(s);
}
END_TEST

/* ---- asynchronous writes ---- */

struct done_count {
    _Atomic int calls;
    int rc;
};

static void count_done(void *ctx, int rc)
{
    struct done_count *d = ctx;

    d->rc = rc;
    atomic_fetch_add(&d->calls, 1);
}

static void wait_done(struct done_count *d, int n)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 5000 && atomic_load(&d[i].calls) == 0; k++)
            usleep(1000);
}

START_TEST(async_writes_complete_once_after_the_bits_are_set)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf, *b;
    char err[STORE_ERRLEN];
    enum { N = 300 };
    static struct done_count d[N + 1];
    struct bf_hash h[2];
    bool added[2], pr;

    memset(d, 0, sizeof(d));
    create(s, "f", BF_KIND_COUNTING, 100000);
    create(s, "b", BF_KIND_BLOCKED, 1000);
    sf = store_get(s, "f");
    b = store_get(s, "b");
    for (int i = 0; i < N; i++) {
        hashes((uint64_t)i * 2, 2, h);
        h[1] = h[0];   /* the same key twice: new, then not new */
        ck_assert_int_eq(store_add_hashes_async(sf, h, 2, added, count_done,
                                                &d[i], err), 0);
        /* Filled before the call returns, and queries see the bits. */
        ck_assert(added[0]);
        ck_assert(!added[1]);
        ck_assert_int_eq(store_may_contain_hashes(sf, h, 1, &pr), 0);
        ck_assert(pr);
    }
    /* No hashes: completes once what came before is durable. */
    ck_assert_int_eq(store_add_hashes_async(sf, h, 0, NULL, count_done, &d[N],
                                            err), 0);
    wait_done(d, N + 1);
    for (int i = 0; i <= N; i++) {
        ck_assert_int_eq(atomic_load(&d[i].calls), 1);
        ck_assert_int_eq(d[i].rc, 0);
    }
    ck_assert_uint_eq(store_filter_version(sf), N);
    /* Errors before any change: no completion. */
    struct done_count none = {0};
    ck_assert_int_eq(store_remove_hashes_async(b, h, 1, NULL, count_done,
                                               &none, err), -EOPNOTSUPP);
    ck_assert_int_eq(store_drop(s, "b", err), 0);
    ck_assert_int_eq(store_add_hashes_async(b, h, 1, NULL, count_done, &none,
                                            err), -ENOENT);
    store_put(b);
    struct done_count rm = {0};
    ck_assert_int_eq(store_remove_hashes_async(sf, h, 1, added, count_done,
                                               &rm, err), 0);
    ck_assert(added[0]);
    wait_done(&rm, 1);
    ck_assert_int_eq(atomic_load(&rm.calls), 1);
    ck_assert_int_eq(rm.rc, 0);
    usleep(20000);
    ck_assert_int_eq(atomic_load(&none.calls), 0);
    store_put(sf);
    store_close(s);
    /* Every acknowledged write is in the log. */
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_uint_eq(store_filter_version(sf), N + 1);
    for (int i = 1; i < N; i++)
        ck_assert_uint_eq(missing_range(sf, (uint64_t)i * 2, 1), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

static void child_drop_and_create_again(void *arg)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf = store_get(s, "x");
    char err[STORE_ERRLEN];

    (void)arg;
    add_range(sf, 0, 1000);
    store_put(sf);
    ck_assert_int_eq(store_drop(s, "x", err), 0);
    create(s, "x", BF_KIND_BLOCKED, 100000);
    sf = store_get(s, "x");
    add_range(sf, 5000, 100);
    /* no store_close: the records of both incarnations are in the log */
}

START_TEST(recreated_filter_never_gets_the_old_ones_records)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;

    create(s, "x", BF_KIND_BLOCKED, 100000);
    store_close(s);
    in_crashing_child(child_drop_and_create_again, NULL);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "x");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 5000, 100), 0);
    /* The old incarnation's keys: absent but for false positives. */
    ck_assert_uint_ge(missing_range(sf, 0, 1000), 950);
    store_put(sf);
    store_close(s);
}
END_TEST

static void add_one(struct store *s, const char *name, uint64_t key)
{
    struct store_filter *sf = store_get(s, name);

    add_range(sf, key, 1);
    store_put(sf);
}

static void child_interleave(void *arg)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);

    (void)arg;
    add_one(s, "a", 1);   /* LSN order in the new segment: a b a c a */
    add_one(s, "b", 2);
    add_one(s, "a", 3);
    add_one(s, "c", 4);
    add_one(s, "a", 5);
}

START_TEST(damage_that_hides_its_owner_fails_only_filters_that_may_have_lost)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    const char *names[] = {"a", "b", "c", "d"};
    enum store_state want[] = {STORE_READY, STORE_FAILED, STORE_READY,
                               STORE_FAILED};
    char wal[4096], why[STORE_ERRLEN];

    for (int i = 0; i < 4; i++)
        create(s, names[i], BF_KIND_BLOCKED, 1000);
    store_close(s);
    in_crashing_child(child_interleave, NULL);
    log_path(wal, sizeof(wal), true);
    /* The id field of the second record (b's) is hit, so its header no
     * longer says whose it is. */
    struct unit_wal_rec v[2];
    ck_assert_uint_ge(unit_wal_records(wal, false, v, 2), 2);
    flip_byte(wal, v[1].off + 33);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    for (int i = 0; i < 4; i++) {
        struct store_filter *sf = store_get(s, names[i]);
        /* a and c have records after the damage, in sequence: served.  b
         * lost its record.  d had none, but nothing proves it: refused. */
        ck_assert_msg(store_filter_state(sf, why) == want[i], "%s: %s",
                      names[i], why);
        if (want[i] == STORE_READY)
            ck_assert_uint_eq(missing_range(sf, i == 0 ? 1 : 4, 1), 0);
        else
            ck_assert_ptr_nonnull(strstr(why, "LSN"));
        store_put(sf);
    }
    store_close(s);
}
END_TEST

START_TEST(failed_fsync_fails_only_the_filters_in_the_batch)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *a, *b;
    char err[STORE_ERRLEN];
    struct bf_hash h = unit_hash_of(77);

    create(s, "a", BF_KIND_BLOCKED, 10000);
    create(s, "b", BF_KIND_BLOCKED, 10000);
    a = store_get(s, "a");
    b = store_get(s, "b");
    add_range(a, 0, 10);
    add_range(b, 0, 10);
    wal__fdatasync = failing_fdatasync;
    ck_assert_int_eq(store_add_hashes(a, &h, 1, NULL, err), -EIO);
    wal__fdatasync = fdatasync;
    ck_assert_int_eq(store_filter_state(a, NULL), STORE_FAILED);
    ck_assert_int_eq(store_filter_state(b, NULL), STORE_READY);
    add_range(b, 100, 10);   /* the log goes on in a new segment */
    ck_assert_int_eq(store_add_hashes(a, &h, 1, NULL, err), -EIO);
    ck_assert_int_eq(store_filter_recover(a, err), 0);
    add_range(a, 100, 10);
    store_put(a);
    store_put(b);
    store_close(s);
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    a = store_get(s, "a");
    b = store_get(s, "b");
    ck_assert_uint_eq(missing_range(a, 0, 10) + missing_range(a, 100, 10), 0);
    ck_assert_uint_eq(missing_range(b, 0, 10) + missing_range(b, 100, 10), 0);
    store_put(a);
    store_put(b);
    store_close(s);
}
END_TEST

/* ---- the log's bound ---- */

/* The bound counts the log's records, not the padding of write units, so
 * single-key commit groups (a unit of file each) do not make checkpoints
 * more frequent; the files are held to 16 times the bound all the same,
 * even while an idle filter holds the oldest segment. */
START_TEST(the_bound_counts_records_and_holds_the_files_to_16_times_it)
{
    const uint64_t bound = 128 << 10;
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, bound);
    struct store_filter *busy;
    char err[STORE_ERRLEN];

    create(s, "idle", BF_KIND_BLOCKED, 1000);
    add_one(s, "idle", 1);
    create(s, "busy", BF_KIND_BLOCKED, 100000);
    ck_assert_int_eq(store_snapshot_now(s, err), 0);
    busy = store_get(s, "busy");
    for (uint64_t i = 0; i < 200; i++)
        add_range(busy, i, 1);
    ck_assert_uint_lt(store_log_bytes(s), bound / 4);
    ck_assert_uint_ge(store_log_file_bytes(s), 200 * 4096);
    for (uint64_t i = 200; i < 700; i++)
        add_range(busy, i, 1);
    ck_assert_uint_lt(store_log_bytes(s), bound);
    uint64_t files = store_log_file_bytes(s);
    for (int i = 0; i < 200 && (files = store_log_file_bytes(s)) >= 16 * bound; i++)
        usleep(50000);
    ck_assert_msg(files < 16 * bound, "log files of %llu bytes",
                  (unsigned long long)files);
    ck_assert_uint_eq(missing_range(busy, 0, 700), 0);
    store_put(busy);
    store_close(s);
}
END_TEST

START_TEST(idle_filters_do_not_pin_the_log)
{
    const uint64_t bound = 256 << 10;
    struct store *s = open_store(STORE_DURABLE_NONE, 3600000, bound);
    struct store_filter *busy;
    /* Checkpoints due at 1 % of each filter's bits (4 KiB at least): the
     * log's bound is then the one set, not twice the filters' due points
     * (store.h, "The log's bound"). */
    struct store_options lo = {.dir = tdir, .durability = STORE_DURABLE_NONE,
                               .snapshot_interval_ms = 3600000,
                               .snapshot_wal_bytes = bound,
                               .checkpoint_log_percent = 1};
    char name[32], err[STORE_ERRLEN], snap[4096];

    for (int i = 0; i < 20; i++) {
        snprintf(name, sizeof(name), "idle-%d", i);
        create(s, name, BF_KIND_BLOCKED, 1000);
        add_one(s, name, (uint64_t)i);
    }
    create(s, "bad", BF_KIND_BLOCKED, 1000);
    create(s, "busy", BF_KIND_BLOCKED, 1000000);
    /* Checkpointed now, the idle filters never change again; "bad" is
     * FAILED after the reopen (its checkpoint rots). */
    ck_assert_int_eq(store_snapshot_now(s, err), 0);
    store_close(s);
    filter_path(snap, sizeof(snap), "bad", "base-", true);
    flip_byte(snap, file_size(snap) / 2);
    ck_assert_ptr_nonnull(s = store_open(&lo, err));
    busy = store_get(s, "busy");
    add_range(busy, 0, 300000);   /* about 4.8 MB of log */
    /* The store's thread checkpoints what holds the closed segments (the
     * idle filters by a rename, the FAILED one not at all) and removes
     * them. */
    uint64_t bytes = store_log_bytes(s);
    for (int i = 0; i < 200 && (bytes = store_log_bytes(s)) >= bound; i++)
        usleep(50000);
    ck_assert_msg(bytes < bound, "log of %llu bytes", (unsigned long long)bytes);
    store_put(busy);
    store_close(s);
    s = open_store(STORE_DURABLE_FSYNC, 3600000, bound);
    for (int i = 0; i < 20; i++) {
        snprintf(name, sizeof(name), "idle-%d", i);
        struct store_filter *sf = store_get(s, name);
        ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
        ck_assert_uint_eq(missing_range(sf, (uint64_t)i, 1), 0);
        store_put(sf);
    }
    busy = store_get(s, "busy");
    ck_assert_uint_eq(missing_range(busy, 0, 300000), 0);
    store_put(busy);
    busy = store_get(s, "bad");
    ck_assert_int_eq(store_filter_state(busy, NULL), STORE_FAILED);
    store_put(busy);
    store_close(s);
}
END_TEST

/* ---- migration of a directory of the previous release ---- */

static void fixture_copy(void)
{
    char src[4096], cmd[9000];

    /* tests/fixtures/legacy-node-dir, two folders up from this file's. */
    snprintf(src, sizeof(src), "%s", __FILE__);
    *strrchr(src, '/') = 0;
    ck_assert_int_lt(snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r "
                              "'%s/../../fixtures/legacy-node-dir' '%s'", tdir,
                              src, tdir), (int)sizeof(cmd));
    ck_assert_int_eq(system(cmd), 0);
}

/* How many of keys PREFIX-from .. PREFIX-to the store misses (a sharded
 * filter's key is looked for in its shard). */
static size_t fixture_missing(struct store *s, const char *filter,
                              uint32_t shards, const char *prefix,
                              unsigned from, unsigned to)
{
    char key[64], name[64];
    size_t miss = 0;

    for (unsigned i = from; i <= to; i++) {
        struct store_filter *sf;
        struct bf_hash h;
        bool pr = false;
        snprintf(key, sizeof(key), "%s-%u", prefix, i);
        snprintf(name, sizeof(name), shards > 1 ? "%s.shard-0" : "%s", filter);
        ck_assert_ptr_nonnull(sf = store_get(s, name));
        h = bf_hash_key(store_filter_bf(sf), key, strlen(key));
        if (shards > 1) {
            store_put(sf);
            snprintf(name, sizeof(name), "%s.shard-%u", filter,
                     bf_hash_shard(h, shards));
            ck_assert_ptr_nonnull(sf = store_get(s, name));
        }
        ck_assert_int_eq(store_may_contain_hashes(sf, &h, 1, &pr), 0);
        miss += !pr;
        store_put(sf);
    }
    return miss;
}

static void fixture_check(struct store *s)
{
    const char *all[] = {"blk", "cls", "cnt", "scl"};

    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(fixture_missing(s, all[i], 1, all[i], 0, 999), 0);
    ck_assert_uint_eq(fixture_missing(s, "shd", 4, "shd", 0, 999), 0);
    ck_assert_uint_eq(fixture_missing(s, "late", 1, "late", 600, 999), 0);
    ck_assert_uint_eq(fixture_missing(s, "cls", 1, "imp", 0, 199), 0);
    /* Removed from the counting filter (replayed remove records). */
    ck_assert_uint_ge(fixture_missing(s, "cnt", 1, "gone", 0, 99), 95);
}

START_TEST(previous_release_directory_is_migrated)
{
    char path[4200], **names;
    struct store *s;
    size_t n;

    fixture_copy();
    s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    ck_assert_int_eq(store_list(s, &names, &n), 0);
    ck_assert_uint_eq(n, 9);
    for (size_t i = 0; i < n; i++) {
        struct store_filter *sf = store_get(s, names[i]);
        char why[STORE_ERRLEN];
        ck_assert_msg(store_filter_state(sf, why) == STORE_READY, "%s: %s",
                      names[i], why);
        /* Versions go on from the old log's sequence numbers. */
        ck_assert_uint_gt(store_filter_version(sf), 0);
        store_put(sf);
    }
    store_list_free(names, n);
    fixture_check(s);
    /* The old files are gone; new writes go to the node log. */
    snprintf(path, sizeof(path), "%s/blk/wal-0000000000000002.log", tdir);
    ck_assert_int_ne(access(path, F_OK), 0);
    snprintf(path, sizeof(path), "%s/blk/snapshot-0000000000000001.bf", tdir);
    ck_assert_int_ne(access(path, F_OK), 0);
    struct store_filter *sf = store_get(s, "blk");
    add_range(sf, 1 << 20, 100);
    store_put(sf);
    store_close(s);
    s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    fixture_check(s);
    sf = store_get(s, "blk");
    ck_assert_uint_eq(missing_range(sf, 1 << 20, 100), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

static void child_migrate_and_crash(void *arg)
{
    store__migrate_crash_at = *(int *)arg;
    open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    _exit(1);   /* the crash point was not reached */
}

START_TEST(migration_interrupted_at_any_step_is_done_again)
{
    for (int step = 1; step <= 4; step++) {
        fixture_copy();
        in_crashing_child(child_migrate_and_crash, &step);
        struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
        fixture_check(s);
        store_close(s);
        /* And once more, from what that open left. */
        s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
        fixture_check(s);
        store_close(s);
    }
}
END_TEST

/* ---- SIGKILL at random moments ---- */

#define KILL_ROUNDS 24

START_TEST(sigkill_loses_no_acknowledged_add)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    uint64_t *ids = NULL;
    size_t nids = 0, cap = 0;
    unsigned seed = (unsigned)time(NULL) ^ (unsigned)getpid();

    srand(seed);
    create(s, "f", BF_KIND_BLOCKED, 4000000);
    store_close(s);
    for (int round = 0; round < KILL_ROUNDS; round++) {
        int fd[2], status;
        uint64_t id;
        pid_t pid;

        ck_assert_int_eq(pipe(fd), 0);
        pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            close(fd[0]);
            /* Distinct ids per round: thread ids 2*round+1, 2*round+2. */
            struct store *cs = open_store(STORE_DURABLE_FSYNC, 20, 32768);
            struct store_filter *sf = store_get(cs, "f");
            struct race r[2];
            pthread_t t[2];
            for (int i = 0; i < 2; i++) {
                r[i] = (struct race){cs, sf, round * 2 + i + 1, false, 0,
                                     fd[1], 0, 0};
                pthread_create(&t[i], NULL, race_adder, &r[i]);
            }
            for (;;)
                pause();
        }
        close(fd[1]);
        /* Kill at a random moment once adds are flowing. */
        ck_assert_int_eq(read(fd[0], &id, sizeof(id)), sizeof(id));
        if (nids == cap) {
            cap = cap ? cap * 2 : 4096;
            ids = realloc(ids, cap * sizeof(*ids));
        }
        ids[nids++] = id;
        usleep((useconds_t)(rand() % 150000));
        kill(pid, SIGKILL);
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFSIGNALED(status));
        while (read(fd[0], &id, sizeof(id)) == sizeof(id)) {
            if (nids == cap) {
                cap = cap ? cap * 2 : 4096;
                ids = realloc(ids, cap * sizeof(*ids));
            }
            ids[nids++] = id;
        }
        close(fd[0]);

        s = open_store(STORE_DURABLE_FSYNC, 0, 0);
        struct store_filter *sf = store_get(s, "f");
        char why[STORE_ERRLEN];
        ck_assert_msg(store_filter_state(sf, why) == STORE_READY,
                      "round %d (seed %u): %s", round, seed, why);
        size_t lost = 0;
        for (size_t i = 0; i < nids; i++)
            lost += missing_range(sf, batch_base(ids[i]), RACE_BATCH);
        ck_assert_msg(lost == 0, "round %d (seed %u): %zu hashes lost", round,
                      seed, lost);
        store_put(sf);
        store_close(s);
    }
    ck_assert_uint_gt(nids, KILL_ROUNDS);
    free(ids);
}
END_TEST

/* ---- torn writes and acknowledged damage ---- */

/* Ten acknowledged adds of 100 keys (about 16 KiB of log, one commit group
 * each), then one of 600 keys whose write is torn (unit_wal_tear): the
 * child never returns from it. */
static void child_torn_append(void *arg)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 3600000, 0);
    struct store_filter *sf = store_get(s, "f");
    struct bf_hash h[600];
    char err[STORE_ERRLEN];

    (void)arg;
    for (int b = 0; b < 10; b++)
        add_range(sf, (uint64_t)b * 100, 100);
    hashes(5000, 600, h);
    wal__write = unit_wal_torn_write;
    store_add_hashes(sf, h, 600, NULL, err);
    _exit(5);
}

/* Every unit the next append touches, torn every way with that append in
 * flight (its fsync never returns): after the crash the filter is served
 * and holds every acknowledged key. */
START_TEST(a_torn_unit_of_the_next_append_loses_no_acknowledged_key)
{
    char logdir[4200];
    int runs = 0;

    for (int mode = 0; mode < UNIT_WAL_TEARS; mode++) {
        unit_wal_tear.mode = mode;
        for (unit_wal_tear.unit = 0;; unit_wal_tear.unit++) {
            unit_tmpdir_remove(tdir);
            unit_tmpdir_make(tdir, sizeof(tdir), "store");
            struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
            create(s, "f", BF_KIND_BLOCKED, 100000);
            store_close(s);
            snprintf(logdir, sizeof(logdir), "%s/%s", tdir, STORE_WAL_DIR);
            unit_wal_tear.u = wal_unit_detect(logdir, 0, NULL, 0);
            int status;
            pid_t pid = fork();
            ck_assert_int_ge(pid, 0);
            if (pid == 0)
                child_torn_append(NULL);
            ck_assert_int_eq(waitpid(pid, &status, 0), pid);
            ck_assert(WIFEXITED(status));
            if (WEXITSTATUS(status) == 3)
                break;   /* past the units the append touches */
            ck_assert_int_eq(WEXITSTATUS(status), 0);
            runs++;
            s = open_store(STORE_DURABLE_FSYNC, 0, 0);
            struct store_filter *sf = store_get(s, "f");
            char why[STORE_ERRLEN];
            ck_assert_msg(store_filter_state(sf, why) == STORE_READY,
                          "unit %d of the append %s: %s", unit_wal_tear.unit,
                          unit_wal_tear_name(mode), why);
            ck_assert_msg(missing_range(sf, 0, 1000) == 0,
                          "unit %d of the append %s: %zu acknowledged keys "
                          "missing", unit_wal_tear.unit,
                          unit_wal_tear_name(mode), missing_range(sf, 0, 1000));
            /* The filter takes writes again. */
            add_range(sf, 9000, 10);
            ck_assert_uint_eq(missing_range(sf, 9000, 10), 0);
            store_put(sf);
            store_close(s);
        }
        ck_assert_int_ge(unit_wal_tear.unit, 3);
    }
    ck_assert_int_ge(runs, 3 * UNIT_WAL_TEARS);
}
END_TEST

/* Zero the unit of the newest log segment that holds its third commit
 * group (seven acknowledged groups follow it). */
static void zero_third_group(void)
{
    char wal[4096];
    struct unit_wal_rec v[3];

    log_path(wal, sizeof(wal), true);
    uint32_t u = unit_wal_unit(wal);
    ck_assert_uint_gt(u, 0);
    ck_assert_uint_eq(unit_wal_records(wal, false, v, 3), 10);
    unsigned char *z = calloc(1, u);
    int fd = open(wal, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, z, u, v[2].off / u * u), (ssize_t)u);
    close(fd);
    free(z);
}

/* Damage that a later commit stamp vouches for lost acknowledged keys: on
 * a single copy the filter is refused (FAILED, naming the log), never
 * served without them. */
START_TEST(damage_a_later_commit_stamp_vouches_for_is_refused_not_served)
{
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;
    char why[STORE_ERRLEN];
    struct bf_hash h = unit_hash_of(1);
    bool pr;

    create(s, "f", BF_KIND_BLOCKED, 100000);
    store_close(s);
    in_crashing_child(child_add_batches, "f");
    zero_third_group();
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, why), STORE_FAILED);
    ck_assert_msg(strstr(why, "wal-") && strstr(why, "offset"), "%s", why);
    ck_assert_int_eq(store_may_contain_hashes(sf, &h, 1, &pr), -EIO);
    store_put(sf);
    store_close(s);
}
END_TEST

/* The same damage in a copy of a group of N > 1: a blocked or classic
 * filter is loaded with every record left and counted as cut (its node
 * makes it SYNCING and fills it from the other copies); a counting filter
 * cannot be filled from pages and is FAILED. */
START_TEST(acknowledged_damage_in_a_group_copy_is_loaded_and_counted_as_cut)
{
    struct store_options o = {.dir = tdir, .durability = STORE_DURABLE_FSYNC,
                              .in_group = true};
    char err[STORE_ERRLEN], why[STORE_ERRLEN];
    struct store *s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    struct store_filter *sf;

    create(s, "f", BF_KIND_BLOCKED, 100000);
    store_close(s);
    in_crashing_child(child_add_batches, "f");
    zero_third_group();
    s = store_open(&o, err);
    ck_assert_msg(s != NULL, "store_open: %s", err);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, why), STORE_READY);
    ck_assert(store_filter_recovery_cut(sf));
    /* Every key but the lost group's: the later records were applied. */
    ck_assert_uint_eq(missing_range(sf, 0, 200), 0);
    ck_assert_uint_gt(missing_range(sf, 200, 100), 0);
    ck_assert_uint_eq(missing_range(sf, 300, 700), 0);
    add_range(sf, 9000, 10);
    store_put(sf);
    store_close(s);

    unit_tmpdir_remove(tdir);
    unit_tmpdir_make(tdir, sizeof(tdir), "store");
    s = open_store(STORE_DURABLE_FSYNC, 0, 0);
    create(s, "f", BF_KIND_COUNTING, 100000);
    store_close(s);
    in_crashing_child(child_add_batches, "f");
    zero_third_group();
    s = store_open(&o, err);
    ck_assert_msg(s != NULL, "store_open: %s", err);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, why), STORE_FAILED);
    store_put(sf);
    store_close(s);
}
END_TEST

Suite *store_suite(void)
{
    Suite *s = suite_create("store");
    TCase *tc = tcase_create("store");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, create_list_drop_and_reopen);
    tcase_add_test(tc, budgets_refuse_before_anything_is_written);
    tcase_add_test(tc, scalable_growth_is_charged);
    tcase_add_test(tc, scalable_growth_past_budget_is_refused);
    tcase_add_test(tc, drop_leaves_a_tombstone);
    tcase_add_test(tc, tombstones_are_bounded);
    tcase_add_test(tc, damaged_tombstones_refuse_the_open);
    tcase_add_test(tc, names_are_validated);
    tcase_add_test(tc, interrupted_create_and_drop_are_swept);
    tcase_add_test(tc, second_open_of_a_directory_is_refused);
    tcase_add_test(tc, acknowledged_adds_survive_a_crash);
    tcase_add_test(tc, torn_wal_tail_is_cut_and_the_filter_served);
    tcase_add_test(tc, corrupt_wal_middle_fails_only_that_filter);
    tcase_add_test(tc, a_torn_unit_of_the_next_append_loses_no_acknowledged_key);
    tcase_add_test(tc, damage_a_later_commit_stamp_vouches_for_is_refused_not_served);
    tcase_add_test(tc, acknowledged_damage_in_a_group_copy_is_loaded_and_counted_as_cut);
    tcase_add_test(tc, corrupt_snapshot_fails_the_filter);
    tcase_add_test(tc, corrupt_snapshot_falls_back_to_older_one_with_full_wal);
    tcase_add_test(tc, snapshots_during_adds_lose_nothing_blocked);
    tcase_add_test(tc, snapshots_during_adds_lose_nothing_counting);
    tcase_add_test(tc, snapshots_during_adds_lose_nothing_scalable);
    tcase_add_test(tc, counting_removes_under_snapshots_keep_other_keys);
    tcase_add_test(tc, import_mismatch_changes_nothing);
    tcase_add_test(tc, import_is_replayed_from_the_wal);
    tcase_add_test(tc, import_file_is_logged_as_received_and_replayed);
    tcase_add_test(tc, import_spool_applies_in_pieces_and_replays);
    tcase_add_test(tc, import_spool_refuses_bad_files_changing_nothing);
    tcase_add_test(tc, import_spools_are_bounded_and_swept);
    tcase_add_test(tc, export_writes_a_loadable_file);
    tcase_add_test(tc, remove_is_counting_only_and_durable);
    tcase_add_test(tc, failed_fsync_refuses_writes_until_recovered);
    tcase_add_test(tc, write_failed_filter_is_recovered_by_the_store);
    tcase_add_test(tc, sigkill_loses_no_acknowledged_add);
    tcase_add_test(tc, async_writes_complete_once_after_the_bits_are_set);
    tcase_add_test(tc, recreated_filter_never_gets_the_old_ones_records);
    tcase_add_test(tc, damage_that_hides_its_owner_fails_only_filters_that_may_have_lost);
    tcase_add_test(tc, failed_fsync_fails_only_the_filters_in_the_batch);
    tcase_add_test(tc, idle_filters_do_not_pin_the_log);
    tcase_add_test(tc, the_bound_counts_records_and_holds_the_files_to_16_times_it);
    tcase_add_test(tc, previous_release_directory_is_migrated);
    tcase_add_test(tc, migration_interrupted_at_any_step_is_done_again);
    suite_add_tcase(s, tc);
    return s;
}
