/* Tests of the write-ahead log: framing, group commit, torn tails,
 * corruption, rotation and failed fsyncs. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wal.h"
#include "unit_tmpdir.h"

static char tdir[4096];

static void setup(void)
{
    unit_tmpdir_make(tdir, sizeof(tdir), "wal");
}

static void teardown(void)
{
    unit_tmpdir_remove(tdir);
}

/* Records seen by a replay. */
struct seen {
    uint64_t n;
    uint64_t first, last;
    uint64_t sum;      /* of the payload's first u64 */
    bool ordered;
};

static int collect(void *ctx, uint32_t type, uint64_t seq, const void *p,
                   uint64_t len)
{
    struct seen *s = ctx;
    uint64_t v = 0;

    (void)type;
    if (s->n == 0)
        s->first = seq;
    else if (seq != s->last + 1)
        s->ordered = false;
    s->last = seq;
    s->n++;
    if (len >= 8)
        memcpy(&v, p, 8);
    s->sum += v;
    return 0;
}

static int recover(uint64_t after, struct seen *s, struct wal_recovery *r,
                   char *err)
{
    memset(s, 0, sizeof(*s));
    s->ordered = true;
    return wal_recover(tdir, after, collect, s, r, err);
}

/* The path of the newest (or oldest) segment. */
static void seg_path(char *out, size_t len, bool newest)
{
    DIR *d = opendir(tdir);
    struct dirent *de;
    char best[256] = "";

    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "wal-", 4) &&
            (!best[0] || (strcmp(de->d_name, best) > 0) == newest))
            memcpy(best, de->d_name, strlen(de->d_name) + 1);
    closedir(d);
    ck_assert(best[0]);
    ck_assert_int_lt(snprintf(out, len, "%s/%s", tdir, best), (int)len);
}

static off_t file_size(const char *path)
{
    struct stat st;

    ck_assert_int_eq(stat(path, &st), 0);
    return st.st_size;
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

/* Append n records of 32 bytes, each waited for on its own. */
static void append_n(struct wal *w, uint64_t n, uint64_t base)
{
    for (uint64_t i = 0; i < n; i++) {
        uint64_t p[4] = {base + i, 1, 2, 3}, seq;
        ck_assert_int_eq(wal_append(w, WAL_REC_ADD, p, sizeof(p), &seq), 0);
    }
}

START_TEST(append_then_recover_in_order)
{
    char err[WAL_ERRLEN];
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, err);
    struct wal_recovery r;
    struct seen s;

    ck_assert_ptr_nonnull(w);
    append_n(w, 100, 1);
    ck_assert_uint_eq(wal_last_seq(w), 100);
    ck_assert_int_eq(wal_wait(w, 101), -EINVAL);
    ck_assert_uint_eq(wal_durable_seq(w), 100);
    wal_close(w);
    ck_assert_int_eq(recover(0, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 100);
    ck_assert(s.ordered);
    ck_assert_uint_eq(s.first, 1);
    ck_assert_uint_eq(s.sum, 100 * 101 / 2);
    ck_assert_uint_eq(r.next_seq, 101);
    ck_assert_uint_eq(r.truncated, 0);
    /* Records at or below "after" are skipped. */
    ck_assert_int_eq(recover(60, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 40);
    ck_assert_uint_eq(s.first, 61);
}
END_TEST

static int slow_syncs;
static int slow_fdatasync(int fd)
{
    __atomic_add_fetch(&slow_syncs, 1, __ATOMIC_SEQ_CST);
    usleep(2000);   /* a slow disk: followers pile up behind the leader */
    return fdatasync(fd);
}

#define GC_THREADS 8
#define GC_EACH 100

struct gc_arg {
    struct wal *w;
    int id;
    int fails;
};

static void *gc_main(void *p)
{
    struct gc_arg *a = p;

    for (int i = 0; i < GC_EACH; i++) {
        uint64_t v = (uint64_t)a->id * 1000 + (uint64_t)i + 1;
        if (wal_append(a->w, WAL_REC_ADD, &v, sizeof(v), NULL) != 0)
            a->fails++;
    }
    return NULL;
}

START_TEST(group_commit_shares_fsyncs_and_keeps_every_record)
{
    char err[WAL_ERRLEN];
    struct wal *w;
    struct gc_arg a[GC_THREADS];
    pthread_t t[GC_THREADS];
    struct wal_recovery r;
    struct seen s;
    uint64_t want = 0;

    wal__fdatasync = slow_fdatasync;
    w = wal_open(tdir, 1, WAL_SYNC_FSYNC, err);
    ck_assert_ptr_nonnull(w);
    slow_syncs = 0;
    for (int i = 0; i < GC_THREADS; i++) {
        a[i] = (struct gc_arg){w, i, 0};
        pthread_create(&t[i], NULL, gc_main, &a[i]);
    }
    for (int i = 0; i < GC_THREADS; i++) {
        pthread_join(t[i], NULL);
        ck_assert_int_eq(a[i].fails, 0);
        for (int j = 0; j < GC_EACH; j++)
            want += (uint64_t)i * 1000 + (uint64_t)j + 1;
    }
    wal_close(w);
    wal__fdatasync = fdatasync;
    /* 800 acknowledged records, far fewer fsyncs. */
    ck_assert_int_lt(slow_syncs, GC_THREADS * GC_EACH / 2);
    ck_assert_int_eq(recover(0, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, GC_THREADS * GC_EACH);
    ck_assert(s.ordered);
    ck_assert_uint_eq(s.sum, want);
}
END_TEST

START_TEST(torn_tail_is_truncated_and_appends_continue)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, err);
    struct wal_recovery r;
    struct seen s;
    off_t size;

    ck_assert_ptr_nonnull(w);
    append_n(w, 10, 1);
    wal_close(w);
    seg_path(path, sizeof(path), true);
    size = file_size(path);
    /* Cut the last record (40 + 32 bytes) in the middle of its payload. */
    ck_assert_int_eq(truncate(path, size - 20), 0);
    ck_assert_int_eq(recover(0, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 9);
    ck_assert_uint_eq(r.next_seq, 10);
    ck_assert_uint_eq(r.truncated, 72 - 20);
    ck_assert_int_eq(file_size(path), size - 72);

    /* Half a header of garbage at the end: also a torn tail. */
    int fd = open(path, O_WRONLY | O_APPEND);
    ck_assert_int_eq(write(fd, "BGWR\1\0\0\0\7", 9), 9);
    close(fd);
    ck_assert_int_eq(recover(0, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 9);

    w = wal_open(tdir, r.next_seq, WAL_SYNC_FSYNC, err);
    ck_assert_ptr_nonnull(w);
    append_n(w, 5, 100);
    wal_close(w);
    ck_assert_int_eq(recover(0, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 14);
    ck_assert(s.ordered);
    ck_assert_uint_eq(r.next_seq, 15);
}
END_TEST

START_TEST(corrupt_middle_record_is_refused_with_offset)
{
    char err[WAL_ERRLEN], path[4096], where[64];
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, err);
    struct wal_recovery r;
    struct seen s;

    ck_assert_ptr_nonnull(w);
    append_n(w, 10, 1);   /* ten batches: each later one commits the last */
    wal_close(w);
    seg_path(path, sizeof(path), true);
    /* Record 4 (seq 4) starts at 32 + 3 * 72; flip a payload byte. */
    flip_byte(path, 32 + 3 * 72 + 45);
    ck_assert_int_eq(recover(0, &s, &r, err), -EBADMSG);
    snprintf(where, sizeof(where), "offset %d", 32 + 3 * 72);
    ck_assert_ptr_nonnull(strstr(err, where));
    ck_assert_ptr_nonnull(strstr(err, path));
    /* Nothing was cut from the file. */
    ck_assert_int_eq(file_size(path), 32 + 10 * 72);
}
END_TEST

START_TEST(bad_record_inside_the_last_batch_counts_as_torn)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, err);
    struct wal_recovery r;
    struct seen s;
    uint64_t seq = 0;

    ck_assert_ptr_nonnull(w);
    append_n(w, 3, 1);
    /* One batch of five records: none committed before the batch ends. */
    for (uint64_t i = 0; i < 5; i++)
        ck_assert_int_eq(wal_submit(w, WAL_REC_ADD, &i, sizeof(i), &seq), 0);
    ck_assert_int_eq(wal_wait(w, seq), 0);
    wal_close(w);
    seg_path(path, sizeof(path), true);
    /* The second record of the batch (seq 5). */
    flip_byte(path, 32 + 3 * 72 + 48 + 45);
    ck_assert_int_eq(recover(0, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 4);
    ck_assert_uint_eq(r.next_seq, 5);
}
END_TEST

START_TEST(rotation_cut_discard_and_gaps)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, err);
    struct wal_recovery r;
    struct seen s;
    uint64_t upto = 0, seq;

    ck_assert_ptr_nonnull(w);
    append_n(w, 5, 1);
    uint64_t v = 6;
    ck_assert_int_eq(wal_submit(w, WAL_REC_ADD, &v, 8, &seq), 0);
    /* Submitted but not waited for: still below the cut. */
    ck_assert_int_eq(wal_rotate(w, &upto, err), 0);
    ck_assert_uint_eq(upto, 6);
    ck_assert_uint_eq(wal_durable_seq(w), 6);
    ck_assert_uint_eq(wal_bytes(w), 0);
    append_n(w, 4, 7);
    ck_assert_int_eq(wal_rotate(w, &upto, err), 0);
    ck_assert_uint_eq(upto, 10);
    append_n(w, 2, 11);
    wal_close(w);

    ck_assert_int_eq(recover(0, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 12);
    ck_assert_uint_eq(r.segments, 3);
    ck_assert_int_eq(recover(6, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 6);
    ck_assert_uint_eq(s.first, 7);

    /* Discarding up to 6 removes only the first segment. */
    ck_assert_int_eq(wal_discard(tdir, 6), 0);
    ck_assert_int_eq(recover(6, &s, &r, err), 0);
    ck_assert_uint_eq(r.segments, 2);
    ck_assert_uint_eq(s.n, 6);
    /* Records 1..6 are gone: replaying from 0 is a gap. */
    ck_assert_int_eq(recover(0, &s, &r, err), -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "missing"));

    /* A missing middle segment is a gap too. */
    seg_path(path, sizeof(path), false);
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(recover(6, &s, &r, err), -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "missing"));
}
END_TEST

START_TEST(corrupt_closed_segment_is_refused)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, err);
    struct wal_recovery r;
    struct seen s;
    uint64_t upto;

    ck_assert_ptr_nonnull(w);
    append_n(w, 3, 1);
    ck_assert_int_eq(wal_rotate(w, &upto, err), 0);
    append_n(w, 3, 4);
    wal_close(w);
    seg_path(path, sizeof(path), false);
    /* Even the last record of a closed segment is not a torn tail. */
    flip_byte(path, 32 + 2 * 72 + 50);
    ck_assert_int_eq(recover(0, &s, &r, err), -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "closed segment"));
}
END_TEST

static int failing_fdatasync(int fd)
{
    (void)fd;
    errno = EIO;
    return -1;
}

START_TEST(failed_fsync_fails_the_wal_for_good)
{
    char err[WAL_ERRLEN];
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, err);
    uint64_t v = 1, seq;

    ck_assert_ptr_nonnull(w);
    append_n(w, 2, 1);
    wal__fdatasync = failing_fdatasync;
    ck_assert_int_eq(wal_append(w, WAL_REC_ADD, &v, 8, &seq), -EIO);
    wal__fdatasync = fdatasync;
    /* Not retried, even though the disk "works" again. */
    ck_assert_int_eq(wal_error(w), -EIO);
    ck_assert_ptr_nonnull(strstr(wal_error_text(w), "fdatasync"));
    ck_assert_int_eq(wal_submit(w, WAL_REC_ADD, &v, 8, &seq), -EIO);
    ck_assert_int_eq(wal_wait(w, 3), -EIO);
    ck_assert_int_eq(wal_wait(w, 2), 0);   /* durable before the failure */
    ck_assert_uint_eq(wal_durable_seq(w), 2);
    ck_assert_int_ne(wal_rotate(w, &seq, err), 0);
    wal_close(w);
}
END_TEST

static int counted_syncs;
static int counting_fdatasync(int fd)
{
    counted_syncs++;
    return fdatasync(fd);
}

START_TEST(durability_none_writes_without_fsync)
{
    char err[WAL_ERRLEN];
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_NONE, err);
    struct wal_recovery r;
    struct seen s;

    ck_assert_ptr_nonnull(w);
    wal__fdatasync = counting_fdatasync;
    counted_syncs = 0;
    append_n(w, 20, 1);
    ck_assert_int_eq(counted_syncs, 0);
    ck_assert_uint_eq(wal_durable_seq(w), 20);
    wal__fdatasync = fdatasync;
    wal_close(w);
    /* write() alone is enough for another process to see the records. */
    ck_assert_int_eq(recover(0, &s, &r, err), 0);
    ck_assert_uint_eq(s.n, 20);
}
END_TEST

START_TEST(no_segment_is_an_error)
{
    char err[WAL_ERRLEN];
    struct wal_recovery r;
    struct seen s;

    ck_assert_int_eq(recover(0, &s, &r, err), -EBADMSG);
    ck_assert_ptr_nonnull(strstr(err, "no WAL segment"));
}
END_TEST

Suite *wal_suite(void)
{
    Suite *s = suite_create("wal");
    TCase *tc = tcase_create("wal");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, append_then_recover_in_order);
    tcase_add_test(tc, group_commit_shares_fsyncs_and_keeps_every_record);
    tcase_add_test(tc, torn_tail_is_truncated_and_appends_continue);
    tcase_add_test(tc, corrupt_middle_record_is_refused_with_offset);
    tcase_add_test(tc, bad_record_inside_the_last_batch_counts_as_torn);
    tcase_add_test(tc, rotation_cut_discard_and_gaps);
    tcase_add_test(tc, corrupt_closed_segment_is_refused);
    tcase_add_test(tc, failed_fsync_fails_the_wal_for_good);
    tcase_add_test(tc, durability_none_writes_without_fsync);
    tcase_add_test(tc, no_segment_is_an_error);
    suite_add_tcase(s, tc);
    return s;
}
