/* Tests of the store at its limits: a full disk (writes refused with
 * ENOSPC and its message, reads answered from the bits in memory, writes
 * back once there is room, nothing acknowledged lost) and the copies of
 * exports counted against the memory budget (store.h, "Failed writes" and
 * "Budgets"). */
#include <check.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "store.h"
#include "wal.h"
#include "unit_tmpdir.h"

static char tdir[4096];

static void setup(void)
{
    log_set_level(LOG_LEVEL_ERROR);
    unit_tmpdir_make(tdir, sizeof(tdir), "store-limits");
}

static void teardown(void)
{
    wal__write = write;
    unit_tmpdir_remove(tdir);
}

static struct bf_hash hash_of(uint64_t i)
{
    uint64_t a = (i + 1) * 0x9e3779b97f4a7c15ull, b = (i + 7) * 0xbf58476d1ce4e5b9ull;
    return (struct bf_hash){a ^ (a >> 29), b ^ (b >> 31)};
}

static void hashes(uint64_t base, size_t n, struct bf_hash *out)
{
    for (size_t i = 0; i < n; i++)
        out[i] = hash_of(base + i);
}

static void params(struct bf_params *p, enum bf_kind kind, uint64_t cap)
{
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    bf_params_default(p);
    p->capacity = cap;
    p->error_rate = 0.01;
}

static struct store *open_dir(uint64_t max_memory)
{
    struct store_options o = {.dir = tdir, .snapshot_interval_ms = 3600000,
                              .recover_retry_ms = 20,
                              .max_memory_bytes = max_memory};
    char err[STORE_ERRLEN];
    struct store *s = store_open(&o, err);

    ck_assert_msg(s != NULL, "store_open: %s", err);
    return s;
}

static void add_range(struct store_filter *sf, uint64_t base, size_t n)
{
    struct bf_hash h[100];
    char err[STORE_ERRLEN];

    while (n) {
        size_t k = n < 100 ? n : 100;
        hashes(base, k, h);
        ck_assert_msg(store_add_hashes(sf, h, k, NULL, err) == 0, "add: %s", err);
        base += k;
        n -= k;
    }
}

/* How many of [base, base + n) the filter does not contain; the query
 * must be answered. */
static size_t missing_range(struct store_filter *sf, uint64_t base, size_t n)
{
    struct bf_hash h[100];
    bool pr[100];
    size_t miss = 0;

    while (n) {
        size_t k = n < 100 ? n : 100;
        hashes(base, k, h);
        ck_assert_int_eq(store_may_contain_hashes(sf, h, k, pr), 0);
        for (size_t i = 0; i < k; i++)
            miss += !pr[i];
        base += k;
        n -= k;
    }
    return miss;
}

/* The log's writes on a full disk. */
static ssize_t full_write(int fd, const void *buf, size_t len)
{
    (void)fd;
    (void)buf;
    (void)len;
    errno = ENOSPC;
    return -1;
}

static void count_call(const struct bf *f, void *ctx)
{
    (void)f;
    atomic_fetch_add((atomic_int *)ctx, 1);
}

struct async_done {
    atomic_int calls;
    int rc;
};

static void async_done(void *ctx, int rc)
{
    struct async_done *d = ctx;
    d->rc = rc;
    atomic_fetch_add(&d->calls, 1);
}

START_TEST(full_disk_refuses_writes_with_enospc_and_reads_go_on)
{
    struct store *s = open_dir(0);
    struct bf_params p;
    char err[STORE_ERRLEN], why[STORE_ERRLEN];
    struct bf_hash h[10];

    params(&p, BF_KIND_BLOCKED, 100000);
    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    add_range(sf, 0, 500);

    wal__write = full_write;
    hashes(1000, 10, h);
    ck_assert_int_eq(store_add_hashes(sf, h, 10, NULL, err), -ENOSPC);
    ck_assert_msg(strstr(err, "No space left on device"), "err: %s", err);
    ck_assert_int_eq(store_filter_state(sf, why), STORE_FAILED);
    ck_assert_msg(strstr(why, "No space left on device"), "why: %s", why);

    /* For as long as the disk is full (many retry intervals): every write
     * is refused with ENOSPC, every read answered from memory. */
    for (int i = 0; i < 25; i++) {
        struct async_done d = {0};
        hashes(2000 + 10 * (uint64_t)i, 10, h);
        int rc = store_add_hashes_async(sf, h, 10, NULL, async_done, &d, err);
        if (rc == 0) {
            while (atomic_load(&d.calls) == 0)
                usleep(1000);
            rc = d.rc;
        } else {
            ck_assert_msg(strstr(err, "No space left on device"), "err: %s", err);
        }
        ck_assert_int_eq(rc, -ENOSPC);
        ck_assert_uint_eq(missing_range(sf, 0, 500), 0);
        atomic_int calls = 0;
        ck_assert_int_eq(store_filter_read(sf, count_call, &calls), 0);
        ck_assert_int_eq(calls, 1);
        /* Not for writers: they get the disk's error. */
        ck_assert_int_eq(store_filter_inspect(sf, count_call, &calls), -ENOSPC);
        usleep(20000);
    }

    /* Room again: the store reloads the filter and writes go on. */
    wal__write = write;
    for (int i = 0; i < 500 && store_filter_state(sf, NULL) != STORE_READY; i++)
        usleep(10000);
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    add_range(sf, 5000, 500);
    ck_assert_uint_eq(missing_range(sf, 0, 500) + missing_range(sf, 5000, 500), 0);
    store_put(sf);
    store_close(s);

    s = open_dir(0);
    sf = store_get(s, "f");
    ck_assert_int_eq(store_filter_state(sf, NULL), STORE_READY);
    ck_assert_uint_eq(missing_range(sf, 0, 500) + missing_range(sf, 5000, 500), 0);
    store_put(sf);
    store_close(s);
}
END_TEST

/* Exports read the live bits a piece at a time: they take nothing from the
 * budget, so a filter that takes nearly all of it can be exported any
 * number of times at once, and the charge is its bits and their page
 * versions, not three copies. */
struct slow_writer {
    struct store_filter *other;      /* exported from inside this one */
    int depth;
    size_t len;
};

static int nested_write(void *ctx, const void *buf, size_t len)
{
    struct slow_writer *w = ctx;
    char err[STORE_ERRLEN];

    (void)buf;
    /* While this export is in its first write, others run to the end. */
    if (w->depth < 3 && w->len == 0) {
        struct slow_writer inner = {.other = w->other, .depth = w->depth + 1};
        ck_assert_int_eq(store_export(w->other, nested_write, &inner, NULL, err), 0);
    }
    w->len += len;
    return 0;
}

static int failing_write(void *ctx, const void *buf, size_t len)
{
    (void)ctx;
    (void)buf;
    (void)len;
    return -ECANCELED;
}

START_TEST(exports_take_nothing_from_the_budget)
{
    struct bf_params p;
    uint64_t charge, bits;
    char err[STORE_ERRLEN];
    struct store_budget b0, b;

    params(&p, BF_KIND_BLOCKED, 1000000);
    ck_assert_int_eq(store_charge(&p, &charge), 0);
    ck_assert_int_eq(bf_params_bytes(&p, &bits), 0);
    /* The bits and 8 bytes of version per 4 KiB page, nothing more. */
    ck_assert_uint_eq(charge, bits + (bits + 4095) / 4096 * 8);
    /* Room for the filter and a tenth of its bits more. */
    struct store *s = open_dir(charge + bits / 10);
    ck_assert_int_eq(store_create(s, "f", &p, err), 0);
    struct store_filter *sf = store_get(s, "f");
    add_range(sf, 0, 1000);
    store_budget(s, &b0);
    ck_assert_uint_eq(b0.charged_bytes, charge);

    struct slow_writer w = {.other = sf};
    uint64_t total = 0;
    ck_assert_int_eq(store_export(sf, nested_write, &w, &total, err), 0);
    ck_assert_uint_eq(w.len, total);
    ck_assert_uint_eq(total, bf_file_size(store_filter_bf(sf)));
    store_budget(s, &b);
    ck_assert_uint_eq(b.charged_bytes, b0.charged_bytes);
    /* A writer's error ends the export with it. */
    ck_assert_int_eq(store_export(sf, failing_write, NULL, NULL, err), -ECANCELED);
    store_put(sf);
    store_close(s);
}
END_TEST

Suite *store_limits_suite(void)
{
    Suite *s = suite_create("store_limits");
    TCase *tc = tcase_create("store_limits");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, full_disk_refuses_writes_with_enospc_and_reads_go_on);
    tcase_add_test(tc, exports_take_nothing_from_the_budget);
    suite_add_tcase(s, tc);
    return s;
}
