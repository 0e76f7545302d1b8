/* Tests of the node log: framing, the commit loop (group commit across
 * threads and streams, completions), write units and padding, torn tails
 * (a torn write of every unit the next append touches), damage with and
 * without a known owner, segments, failed fsyncs and version 1 logs. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <xxhash.h>
#include <unistd.h>

#include "log.h"
#include "wal.h"
#include "wal_format.h"
#include "unit_tmpdir.h"
#include "unit_wal.h"

static char tdir[4096];

static void setup(void)
{
    log_set_level(LOG_LEVEL_WARN);
    unit_tmpdir_make(tdir, sizeof(tdir), "wal");
}

static void teardown(void)
{
    wal__fdatasync = fdatasync;
    wal__write = write;
    wal__statvfs = statvfs;
    wal__sysfs = "/sys";
    unit_tmpdir_remove(tdir);
}

/* What a scan met. */
#define MAXREC 20000
struct seen {
    uint64_t n, lsn[MAXREC], id[MAXREC], seq[MAXREC], val[MAXREC];
    uint64_t damages, known, lost_from, lost_to;
    uint64_t damaged_id, damaged_seq;
    char where[WAL_ERRLEN];
};

static struct seen seen;

static int on_rec(void *ctx, const struct wal_record *r)
{
    struct seen *s = ctx;
    uint64_t v = 0;

    ck_assert_uint_lt(s->n, MAXREC);
    if (r->len >= 8)
        memcpy(&v, r->payload, 8);
    s->lsn[s->n] = r->lsn;
    s->id[s->n] = r->id;
    s->seq[s->n] = r->seq;
    s->val[s->n] = v;
    s->n++;
    return 0;
}

static void on_damage(void *ctx, const struct wal_damage *d)
{
    struct seen *s = ctx;

    s->damages++;
    if (d->id) {
        s->known++;
        s->damaged_id = d->id;
        s->damaged_seq = d->seq;
    } else {
        s->lost_from = d->from;
        s->lost_to = d->to;
    }
    memcpy(s->where, d->where, sizeof(s->where));
}

static const struct wal_scan_ops ops = {on_rec, on_damage, NULL};

static int scan(struct wal_scan_info *info, char *err)
{
    memset(&seen, 0, sizeof(seen));
    return wal_scan(tdir, &ops, &seen, info, err);
}

static struct wal *open_log(uint64_t next, int durability)
{
    char err[WAL_ERRLEN];
    struct wal *w = wal_open(tdir, next, durability, 1 << 20, 0, err);

    ck_assert_msg(w != NULL, "wal_open: %s", err);
    return w;
}

/* Submit one 8-byte record v to s and wait for it; returns its rc. */
static int append(struct wal_stream *s, uint64_t v)
{
    struct wal_waiter wt;
    struct wal_rec *r = wal_rec_new(WAL_REC_ADD, &v, sizeof(v));

    ck_assert_ptr_nonnull(r);
    wal_waiter_init(&wt);
    wal_submit(s, r, wal_waiter_done, &wt);
    return wal_waiter_wait(&wt);
}

/* The newest segment's path. */
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

/* Records of stream "f" (1 byte name) with 8-byte payloads: 73 bytes. */
#define REC1 (WAL_REC_HDR + 1 + 8)
/* The write unit of the test directory's log (set by units_of). */
static uint32_t unit;

static uint32_t units_of(void)
{
    return unit = wal_unit_detect(tdir, 0, NULL, 0);
}

START_TEST(append_then_scan_in_order)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *a = wal_stream_open(w, 11, "a", 1);
    struct wal_stream *b = wal_stream_open(w, 22, "bb", 5);

    for (uint64_t i = 1; i <= 50; i++) {
        ck_assert_int_eq(append(a, i), 0);
        ck_assert_int_eq(append(b, 1000 + i), 0);
    }
    ck_assert_uint_eq(wal_stream_last_seq(a), 50);
    ck_assert_uint_eq(wal_stream_last_seq(b), 54);
    ck_assert_uint_eq(wal_durable_lsn(w), 100);
    wal_stream_close(a);
    wal_stream_close(b);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 100);
    ck_assert_uint_eq(info.first_lsn, 1);
    ck_assert_uint_eq(info.next_lsn, 101);
    ck_assert_uint_eq(seen.damages, 0);
    for (uint64_t i = 0; i < 100; i++) {
        ck_assert_uint_eq(seen.lsn[i], i + 1);
        ck_assert_uint_eq(seen.id[i], i % 2 ? 22 : 11);
        ck_assert_uint_eq(seen.seq[i], i / 2 + (i % 2 ? 5 : 1));
        ck_assert_uint_eq(seen.val[i], i / 2 + 1 + (i % 2 ? 1000 : 0));
    }
}
END_TEST

/* ---- the commit loop ---- */

static _Atomic int syncs_done;
static int slow_fdatasync(int fd)
{
    usleep(2000);   /* a slow disk: writers pile up behind the fsync */
    int rc = fdatasync(fd);
    atomic_fetch_add(&syncs_done, 1);
    return rc;
}

#define LOOP_THREADS 16
#define LOOP_STREAMS 8     /* per thread */
#define LOOP_EACH 40       /* records per stream */

struct job {
    _Atomic int calls;
    int rc;
    int syncs_at_submit;
    int bad;               /* completed before an fsync that covers it */
};

static void job_done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    struct job *j = ctx;

    (void)seq;
    (void)lsn;
    j->rc = rc;
    /* The fsync that made it durable ended after it was submitted. */
    if (atomic_load(&syncs_done) <= j->syncs_at_submit)
        j->bad = 1;
    atomic_fetch_add(&j->calls, 1);
}

struct loop_arg {
    struct wal_stream *st[LOOP_STREAMS];
    struct job *jobs;      /* LOOP_STREAMS * LOOP_EACH */
};

static void *loop_main(void *p)
{
    struct loop_arg *a = p;

    for (int i = 0; i < LOOP_EACH; i++) {
        /* One record on each stream, then wait for the last. */
        for (int k = 0; k < LOOP_STREAMS; k++) {
            struct job *j = &a->jobs[k * LOOP_EACH + i];
            uint64_t v = (uint64_t)i;
            j->syncs_at_submit = atomic_load(&syncs_done);
            wal_submit(a->st[k], wal_rec_new(WAL_REC_ADD, &v, 8), job_done, j);
        }
        while (!atomic_load(&a->jobs[(LOOP_STREAMS - 1) * LOOP_EACH + i].calls))
            usleep(100);
    }
    return NULL;
}

START_TEST(commit_loop_shares_fsyncs_across_threads_and_streams)
{
    char err[WAL_ERRLEN], name[32];
    struct wal_scan_info info;
    struct loop_arg a[LOOP_THREADS];
    pthread_t t[LOOP_THREADS];
    struct wal *w;
    const int total = LOOP_THREADS * LOOP_STREAMS * LOOP_EACH;

    wal__fdatasync = slow_fdatasync;
    w = open_log(1, WAL_SYNC_FSYNC);
    atomic_store(&syncs_done, 0);
    for (int i = 0; i < LOOP_THREADS; i++) {
        a[i].jobs = calloc(LOOP_STREAMS * LOOP_EACH, sizeof(struct job));
        for (int k = 0; k < LOOP_STREAMS; k++) {
            snprintf(name, sizeof(name), "f.shard-%d", i * LOOP_STREAMS + k);
            a[i].st[k] = wal_stream_open(w, (uint64_t)(i * LOOP_STREAMS + k + 1),
                                         name, 1);
        }
        pthread_create(&t[i], NULL, loop_main, &a[i]);
    }
    for (int i = 0; i < LOOP_THREADS; i++)
        pthread_join(t[i], NULL);
    int syncs = atomic_load(&syncs_done);
    wal_close(w);   /* waits for every completion */
    wal__fdatasync = fdatasync;
    for (int i = 0; i < LOOP_THREADS; i++) {
        for (int k = 0; k < LOOP_STREAMS * LOOP_EACH; k++) {
            ck_assert_int_eq(atomic_load(&a[i].jobs[k].calls), 1);
            ck_assert_int_eq(a[i].jobs[k].rc, 0);
            ck_assert_int_eq(a[i].jobs[k].bad, 0);
        }
        for (int k = 0; k < LOOP_STREAMS; k++)
            wal_stream_close(a[i].st[k]);
        free(a[i].jobs);
    }
    /* 5120 records from 16 threads on 128 streams: far fewer fsyncs (each
     * fsync takes the records of every thread that submitted meanwhile). */
    ck_assert_msg(syncs < total / 8, "%d fsyncs for %d records", syncs, total);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, (uint64_t)total);
    for (uint64_t i = 0; i < seen.n; i++)
        ck_assert_uint_eq(seen.lsn[i], i + 1);
}
END_TEST

/* fsync 1 waits for the test, fsync 2 fails, later ones work. */
static _Atomic int gate_calls;
static _Atomic bool gate_open;
static int gated_fdatasync(int fd)
{
    int k = atomic_fetch_add(&gate_calls, 1) + 1;

    if (k == 1)
        while (!atomic_load(&gate_open))
            usleep(1000);
    if (k == 2) {
        errno = EIO;
        return -1;
    }
    return fdatasync(fd);
}

/* fsync 1 waits for the test, later ones work. */
static int held_fdatasync(int fd)
{
    if (atomic_fetch_add(&gate_calls, 1) == 0)
        while (!atomic_load(&gate_open))
            usleep(1000);
    return fdatasync(fd);
}

struct res {
    int rc, calls;
};

static void res_done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    struct res *r = ctx;

    (void)seq;
    (void)lsn;
    r->rc = rc;
    __atomic_add_fetch(&r->calls, 1, __ATOMIC_SEQ_CST);
}

static void wait_calls(struct res *r)
{
    for (int i = 0; i < 5000 && !__atomic_load_n(&r->calls, __ATOMIC_SEQ_CST); i++)
        usleep(1000);
    ck_assert_int_eq(__atomic_load_n(&r->calls, __ATOMIC_SEQ_CST), 1);
}

static void submit_v(struct wal_stream *s, uint64_t v, struct res *r)
{
    wal_submit(s, wal_rec_new(WAL_REC_ADD, &v, 8), res_done, r);
}

START_TEST(failed_fsync_fails_exactly_the_batch)
{
    char err[WAL_ERRLEN], why[WAL_ERRLEN];
    struct wal_scan_info info;
    struct res ra = {0}, rb = {0}, rc = {0}, rd = {0}, re = {0}, rbar = {0};
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s1 = wal_stream_open(w, 1, "one", 1);
    struct wal_stream *s2 = wal_stream_open(w, 2, "two", 1);
    struct wal_stream *s3 = wal_stream_open(w, 3, "three", 1);
    struct wal_stream *s4 = wal_stream_open(w, 4, "four", 1);

    atomic_store(&gate_calls, 0);
    atomic_store(&gate_open, false);
    wal__fdatasync = gated_fdatasync;
    submit_v(s1, 100, &ra);                 /* batch 1, held in its fsync */
    while (atomic_load(&gate_calls) < 1)
        usleep(1000);
    submit_v(s2, 200, &rb);                 /* batch 2: fails */
    submit_v(s3, 300, &rc);
    ck_assert_int_eq(wal_barrier(s4, res_done, &rbar), 0);
    atomic_store(&gate_open, true);
    wait_calls(&ra);
    wait_calls(&rb);
    wait_calls(&rc);
    wait_calls(&rbar);
    ck_assert_int_eq(ra.rc, 0);
    ck_assert_int_eq(rb.rc, -EIO);
    ck_assert_int_eq(rc.rc, -EIO);
    ck_assert_int_eq(rbar.rc, 0);           /* s4 had nothing in it */
    ck_assert(!wal_stream_failed(s1, NULL));
    ck_assert(wal_stream_failed(s2, why));
    ck_assert_ptr_nonnull(strstr(why, "fdatasync"));
    ck_assert(wal_stream_failed(s3, NULL));
    ck_assert(!wal_stream_failed(s4, NULL));
    /* The log goes on for the others; the failed streams stay failed
     * (the fsync is never retried). */
    submit_v(s1, 101, &rd);
    submit_v(s2, 201, &re);
    wait_calls(&rd);
    wait_calls(&re);
    ck_assert_int_eq(rd.rc, 0);
    ck_assert_int_eq(re.rc, -EIO);
    ck_assert_uint_eq(wal_durable_lsn(w), 2);
    wal_stream_close(s1);
    wal_stream_close(s2);
    wal_stream_close(s3);
    wal_stream_close(s4);
    wal_close(w);
    wal__fdatasync = fdatasync;
    /* What the failed batch wrote is superseded by the next segment. */
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 2);
    ck_assert_uint_eq(seen.val[0], 100);
    ck_assert_uint_eq(seen.val[1], 101);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_ge(info.segments, 2);
}
END_TEST

static int failing_fdatasync(int fd)
{
    (void)fd;
    errno = EIO;
    return -1;
}

START_TEST(log_without_a_segment_fails_every_batch_until_one_can_be_made)
{
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s1 = wal_stream_open(w, 1, "one", 1);
    struct wal_stream *s2 = wal_stream_open(w, 2, "two", 1);
    struct res r1 = {0}, r2 = {0}, r3 = {0};

    ck_assert_int_eq(append(s1, 1), 0);
    wal__fdatasync = failing_fdatasync;   /* new segments cannot be made */
    submit_v(s1, 2, &r1);
    wait_calls(&r1);
    ck_assert_int_eq(r1.rc, -EIO);
    ck_assert_int_eq(wal_barrier(s2, res_done, &r2), 0);
    wait_calls(&r2);
    ck_assert_int_eq(r2.rc, -EIO);        /* broken: nothing is durable */
    wal__fdatasync = fdatasync;
    struct wal_stream *s3 = wal_stream_open(w, 3, "three", 1);
    submit_v(s3, 3, &r3);
    wait_calls(&r3);
    ck_assert_int_eq(r3.rc, 0);           /* the next batch made one */
    wal_stream_close(s1);
    wal_stream_close(s2);
    wal_stream_close(s3);
    wal_close(w);
}
END_TEST

START_TEST(durability_none_writes_without_fsync)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    struct wal_stream *s = wal_stream_open(w, 1, "f", 1);

    atomic_store(&syncs_done, 0);
    wal__fdatasync = slow_fdatasync;
    for (uint64_t i = 0; i < 20; i++)
        ck_assert_int_eq(append(s, i), 0);
    ck_assert_int_eq(atomic_load(&syncs_done), 0);
    wal__fdatasync = fdatasync;
    wal_stream_close(s);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 20);
}
END_TEST

START_TEST(barrier_splits_a_streams_records)
{
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    struct wal_stream *b = wal_stream_open(w, 2, "b", 1);
    struct wal_waiter wt;

    ck_assert_int_eq(append(a, 1), 0);
    ck_assert_int_eq(append(b, 2), 0);
    ck_assert_int_eq(append(a, 3), 0);
    wal_waiter_init(&wt);
    ck_assert_int_eq(wal_barrier(a, wal_waiter_done, &wt), 0);
    ck_assert_int_eq(wal_waiter_wait(&wt), 0);
    ck_assert_uint_ge(wt.lsn, 3);
    ck_assert_uint_eq(wt.seq, 2);   /* the stream's last record */
    wal_stream_close(a);
    wal_stream_close(b);
    wal_close(w);
}
END_TEST

/* ---- reading damaged logs ---- */

/* Ten records of stream "f" (id 7), each in its own batch. */
static void ten_records(void)
{
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);

    for (uint64_t i = 1; i <= 10; i++)
        ck_assert_int_eq(append(s, i), 0);
    wal_stream_close(s);
    wal_close(w);
}

START_TEST(torn_tail_is_cut_and_appends_continue)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;

    ten_records();
    seg_path(path, sizeof(path), true);
    /* Each record in a commit group of its own: a unit each, after the
     * header's. */
    ck_assert_int_eq(file_size(path), 11 * (off_t)units_of());
    off_t last = unit_wal_offset(path, 10);
    ck_assert_int_eq(last, 10 * (off_t)unit);
    /* Cut the last record in the middle of its payload. */
    ck_assert_int_eq(truncate(path, last + REC1 - 4), 0);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 9);
    ck_assert_uint_eq(info.next_lsn, 10);
    ck_assert_uint_eq(info.truncated, REC1 - 4);
    ck_assert_int_eq(file_size(path), last);
    /* Garbage that looks like the start of a record: torn too. */
    int fd = open(path, O_WRONLY | O_APPEND);
    ck_assert_int_eq(write(fd, "BGWN\1\0\1\0\7", 9), 9);
    close(fd);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 9);
    ck_assert_uint_eq(seen.damages, 0);

    struct wal *w = open_log(info.next_lsn, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 10);
    for (uint64_t i = 0; i < 5; i++)
        ck_assert_int_eq(append(s, 100 + i), 0);
    wal_stream_close(s);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 14);
    ck_assert_uint_eq(info.next_lsn, 15);
    for (uint64_t i = 0; i < 14; i++)
        ck_assert_uint_eq(seen.seq[i], i + 1);
}
END_TEST

START_TEST(damaged_payload_names_its_owner_and_the_rest_is_read)
{
    char err[WAL_ERRLEN], path[4096], where[64];
    struct wal_scan_info info;

    ten_records();
    seg_path(path, sizeof(path), true);
    /* The payload of record 4 (LSN 4); six records committed after it. */
    off_t at = unit_wal_offset(path, 4);
    flip_byte(path, at + WAL_REC_HDR + 1 + 3);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 9);
    ck_assert_uint_eq(seen.known, 1);
    ck_assert_uint_eq(seen.damaged_id, 7);
    ck_assert_uint_eq(seen.damaged_seq, 4);
    snprintf(where, sizeof(where), "offset %lld", (long long)at);
    ck_assert_ptr_nonnull(strstr(seen.where, where));
    ck_assert_uint_eq(seen.seq[3], 5);
    /* Nothing was cut from the file. */
    ck_assert_int_eq(file_size(path), 11 * (off_t)units_of());
}
END_TEST

START_TEST(damaged_header_loses_its_lsns_with_no_owner)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;

    ten_records();
    seg_path(path, sizeof(path), true);
    /* The id field of record 6: its header checksum no longer matches. */
    flip_byte(path, unit_wal_offset(path, 6) + 33);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 9);
    ck_assert_uint_eq(seen.known, 0);
    ck_assert_uint_eq(seen.lost_from, 6);
    ck_assert_uint_eq(seen.lost_to, 7);
    ck_assert_uint_eq(seen.lsn[5], 7);   /* read on after it */
    ck_assert_uint_eq(info.next_lsn, 11);
}
END_TEST

START_TEST(bad_record_inside_the_last_batch_counts_as_torn)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
    struct wal_waiter wt[5];
    struct res r3 = {0};

    for (uint64_t i = 1; i <= 2; i++)
        ck_assert_int_eq(append(s, i), 0);
    /* Record 3's fsync is held while five more queue: one batch (LSNs
     * 4..8), none committed before it ends. */
    atomic_store(&gate_calls, 0);
    atomic_store(&gate_open, false);
    wal__fdatasync = held_fdatasync;
    submit_v(s, 3, &r3);
    while (atomic_load(&gate_calls) < 1)
        usleep(1000);
    for (uint64_t i = 0; i < 5; i++) {
        wal_waiter_init(&wt[i]);
        wal_submit(s, wal_rec_new(WAL_REC_ADD, &i, 8), wal_waiter_done, &wt[i]);
    }
    atomic_store(&gate_open, true);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(wal_waiter_wait(&wt[i]), 0);
    wait_calls(&r3);
    wal__fdatasync = fdatasync;
    wal_stream_close(s);
    wal_close(w);
    seg_path(path, sizeof(path), true);
    /* The payload of the second record of the batch (LSN 5). */
    ck_assert_int_eq(unit_wal_offset(path, 5), unit_wal_offset(path, 4) + REC1);
    flip_byte(path, unit_wal_offset(path, 5) + WAL_REC_HDR + 2);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 4);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_eq(info.next_lsn, 5);
}
END_TEST

START_TEST(segments_rotate_discard_and_gaps_are_lost_lsns)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
    uint64_t upto = 0;

    for (uint64_t i = 1; i <= 5; i++)
        ck_assert_int_eq(append(s, i), 0);
    ck_assert(!wal_closed_upto(w, &upto));
    wal_rotate(w);
    ck_assert_int_eq(append(s, 6), 0);   /* after the rotation */
    for (int i = 0; i < 100 && !wal_closed_upto(w, &upto); i++)
        usleep(1000);
    ck_assert(wal_closed_upto(w, &upto));
    ck_assert_uint_eq(upto, 5);
    for (uint64_t i = 7; i <= 10; i++)
        ck_assert_int_eq(append(s, i), 0);
    wal_rotate(w);
    ck_assert_int_eq(append(s, 11), 0);
    uint64_t before = wal_bytes(w);
    /* Only segments wholly at or below the LSN go. */
    ck_assert_int_eq(wal_discard(w, 4), 0);
    ck_assert_int_eq(wal_discard(w, 5), 1);
    ck_assert_uint_eq(wal_bytes(w), before - (WAL_SEG_HDR + 5 * REC1));
    wal_stream_close(s);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(info.first_lsn, 6);
    ck_assert_uint_eq(seen.n, 6);
    ck_assert_uint_eq(info.segments, 2);
    /* A missing middle segment: its LSNs are lost. */
    struct wal *w2 = open_log(12, WAL_SYNC_FSYNC);
    struct wal_stream *s2 = wal_stream_open(w2, 7, "f", 12);
    ck_assert_int_eq(append(s2, 12), 0);
    wal_stream_close(s2);
    wal_close(w2);
    char p11[4300];
    snprintf(p11, sizeof(p11), "%s/wal-%016x.log", tdir, 11);
    ck_assert_int_eq(unlink(p11), 0);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(info.first_lsn, 6);
    ck_assert_uint_eq(seen.n, 6);
    ck_assert_uint_eq(seen.lost_from, 11);
    ck_assert_uint_eq(seen.lost_to, 12);
    ck_assert_ptr_nonnull(strstr(seen.where, "missing"));
}
END_TEST

START_TEST(empty_or_missing_directory_is_an_empty_log)
{
    char err[WAL_ERRLEN], sub[4200];
    struct wal_scan_info info;

    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(info.first_lsn, 1);
    ck_assert_uint_eq(info.next_lsn, 1);
    snprintf(sub, sizeof(sub), "%s/none", tdir);
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_scan(sub, &ops, &seen, &info, err), 0);
    ck_assert_uint_eq(info.segments, 0);
}
END_TEST

/* ---- completions off the commit thread ---- */

static _Atomic int counted_syncs;
static int counting_fdatasync(int fd)
{
    atomic_fetch_add(&counted_syncs, 1);
    return fdatasync(fd);
}

static _Atomic bool stuck_in, stuck_release;
static _Atomic int order_seen[2], order_n;

static void stuck_done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    (void)rc;
    (void)seq;
    (void)lsn;
    atomic_store(&stuck_in, true);
    while (!atomic_load(&stuck_release))
        usleep(1000);
    order_seen[atomic_fetch_add(&order_n, 1)] = (int)(intptr_t)ctx;
}

static void next_done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    (void)rc;
    (void)seq;
    (void)lsn;
    order_seen[atomic_fetch_add(&order_n, 1)] = (int)(intptr_t)ctx;
}

/* With fsync, a batch's completions (which send the answers) do not hold
 * the next batch's fdatasync back: while the first record's completion is
 * stuck, the second record is written and synced; the completions still
 * run in commit order. */
START_TEST(a_slow_completion_does_not_hold_the_next_fsync)
{
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 1, "one", 1);
    uint64_t v = 1;

    atomic_store(&counted_syncs, 0);
    atomic_store(&order_n, 0);
    wal__fdatasync = counting_fdatasync;
    wal_submit(s, wal_rec_new(WAL_REC_ADD, &v, 8), stuck_done, (void *)(intptr_t)1);
    for (int i = 0; i < 10000 && !atomic_load(&stuck_in); i++)
        usleep(1000);
    ck_assert(atomic_load(&stuck_in));
    int before = atomic_load(&counted_syncs);
    v = 2;
    wal_submit(s, wal_rec_new(WAL_REC_ADD, &v, 8), next_done, (void *)(intptr_t)2);
    /* The LSN is published after fdatasync returns: wait for it, not for
     * the call to start. */
    for (int i = 0; i < 10000 && wal_durable_lsn(w) < 2; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&counted_syncs), before + 1);
    ck_assert_int_eq(atomic_load(&order_n), 0);
    ck_assert_uint_eq(wal_durable_lsn(w), 2);
    atomic_store(&stuck_release, true);
    for (int i = 0; i < 10000 && atomic_load(&order_n) < 2; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&order_n), 2);
    ck_assert_int_eq(order_seen[0], 1);
    ck_assert_int_eq(order_seen[1], 2);
    wal_stream_close(s);
    wal_close(w);
}
END_TEST

/* ---- room ---- */

/* open_log's 1 MiB segments are made with 2 MiB of room (a segment's size
 * and a sixteenth, in whole MiB). */
#define ROOM (2u << 20)

/* With fsync, a segment is written into room allocated when it is made:
 * the file has its room's size, in allocated blocks, while the log is
 * open; closing a segment (a rotation, or closing the log) cuts the room
 * after its records. */
START_TEST(segments_are_written_into_allocated_room)
{
    char err[WAL_ERRLEN], path[4096], first[4096];
    struct wal_scan_info info;
    struct stat st;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);

    for (uint64_t i = 1; i <= 10; i++)
        ck_assert_int_eq(append(s, i), 0);
    seg_path(first, sizeof(first), true);
    ck_assert_int_eq(file_size(first), ROOM);
    ck_assert_int_eq(stat(first, &st), 0);
    ck_assert_int_ge((off_t)st.st_blocks * 512, ROOM);   /* allocated */
    wal_rotate(w);
    ck_assert_int_eq(append(s, 11), 0);
    /* Cut after its last commit group's unit (the header has one, and each
     * of the ten groups one). */
    ck_assert_int_eq(file_size(first), 11 * (off_t)units_of());
    seg_path(path, sizeof(path), true);
    ck_assert_str_ne(path, first);
    ck_assert_int_eq(file_size(path), ROOM);
    for (uint64_t i = 12; i <= 20; i++)
        ck_assert_int_eq(append(s, i), 0);
    wal_stream_close(s);
    wal_close(w);
    ck_assert_int_eq(file_size(path), 11 * (off_t)unit);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 20);
    ck_assert_uint_eq(info.truncated, 0);
    ck_assert_uint_eq(seen.damages, 0);
}
END_TEST

/* Append n records in a child that then exits without closing the log: a
 * crash as far as the files are concerned.  rotate: the first record in a
 * segment of its own, the others in the next. */
static void crash_after(uint64_t n, bool rotate)
{
    pid_t pid = fork();
    int status;

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct wal *w = open_log(1, WAL_SYNC_FSYNC);
        struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
        for (uint64_t i = 0; i < n; i++) {
            ck_assert_int_eq(append(s, i + 1), 0);
            if (rotate && i == 0)
                wal_rotate(w);
        }
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

/* After a crash the last segment ends in its room: the scan reads every
 * record, cuts the room and does not count it as torn; a record torn by the
 * crash, in the room right after the last one, is cut and counted. */
START_TEST(a_crash_leaves_room_that_the_scan_cuts_without_calling_it_torn)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;

    for (int rotate = 0; rotate <= 1; rotate++) {
        unit_tmpdir_remove(tdir);
        unit_tmpdir_make(tdir, sizeof(tdir), "wal");
        crash_after(10, rotate);
        seg_path(path, sizeof(path), true);
        ck_assert_int_eq(file_size(path), ROOM);
        ck_assert_int_eq(scan(&info, err), 0);
        ck_assert_uint_eq(seen.n, 10);
        ck_assert_uint_eq(seen.damages, 0);
        ck_assert_uint_eq(info.truncated, 0);
        ck_assert_uint_eq(info.next_lsn, 11);
        off_t end = file_size(path);
        ck_assert_int_eq(end, (1 + (rotate ? 9 : 10)) * (off_t)units_of());

        /* Again, with half a record after the last one. */
        unit_tmpdir_remove(tdir);
        unit_tmpdir_make(tdir, sizeof(tdir), "wal");
        crash_after(10, rotate);
        seg_path(path, sizeof(path), true);
        int fd = open(path, O_WRONLY);
        ck_assert_int_eq(pwrite(fd, "BGWN\1\0\1\0\7", 9, end), 9);
        close(fd);
        ck_assert_int_eq(scan(&info, err), 0);
        ck_assert_uint_eq(seen.n, 10);
        ck_assert_uint_eq(seen.damages, 0);
        ck_assert_uint_eq(info.truncated, 9);
        ck_assert_int_eq(file_size(path), end);
    }
}
END_TEST

static int nearly_full(const char *path, struct statvfs *buf)
{
    int rc = statvfs(path, buf);

    buf->f_bavail = 1;
    return rc;
}

/* On a nearly full file system, and with durability none, segments are
 * made without room: they grow as they are written. */
START_TEST(no_room_on_a_nearly_full_disk_or_without_fsync)
{
    char path[4096];

    for (int none = 0; none <= 1; none++) {
        wal__statvfs = none ? statvfs : nearly_full;
        struct wal *w = open_log(1 + 100 * (uint64_t)none,
                                 none ? WAL_SYNC_NONE : WAL_SYNC_FSYNC);
        struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
        for (int seg = 0; seg < 3; seg++) {
            for (uint64_t i = 0; i < 10; i++)
                ck_assert_int_eq(append(s, i), 0);
            seg_path(path, sizeof(path), true);
            ck_assert_int_eq(file_size(path),
                             none ? WAL_SEG_HDR + 10 * REC1
                                  : 11 * (off_t)units_of());
            wal_rotate(w);
        }
        wal_stream_close(s);
        wal_close(w);
    }
}
END_TEST

/* ---- write units ---- */

#define ACKED 8        /* records acknowledged before the torn append */
#define BIG 10000      /* payload bytes of the append in flight */

/* Acknowledged records of LSN 1..ACKED (values 1..ACKED; the last one of
 * 5000 bytes, so that the acknowledged records reach past the first 4 KiB
 * and do not end on a round offset), then one more whose write is torn:
 * the child never returns. */
static void torn_append_child(void)
{
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
    struct wal_waiter wt;
    struct wal_rec *r;

    for (uint64_t i = 1; i < ACKED; i++)
        ck_assert_int_eq(append(s, i), 0);
    r = wal_rec_new(WAL_REC_ADD, NULL, 5000);
    memset(wal_rec_payload(r), 0xa5, 5000);
    memcpy(wal_rec_payload(r), &(uint64_t){ACKED}, 8);
    wal_waiter_init(&wt);
    wal_submit(s, r, wal_waiter_done, &wt);
    ck_assert_int_eq(wal_waiter_wait(&wt), 0);
    wal__write = unit_wal_torn_write;
    r = wal_rec_new(WAL_REC_ADD, NULL, BIG);
    memset(wal_rec_payload(r), 0x5a, BIG);
    wal_waiter_init(&wt);
    wal_submit(s, r, wal_waiter_done, &wt);
    wal_waiter_wait(&wt);
    _exit(5);   /* the torn write never returns */
}

/* Every unit the next append touches, torn every way while that append's
 * fsync has not returned: after the crash every acknowledged record is
 * read, nothing is reported damaged, the torn group is cut as a torn tail,
 * and the log goes on. */
START_TEST(a_torn_write_of_any_unit_of_the_next_append_loses_no_acknowledged_record)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    int runs = 0;

    unit_wal_tear.u = units_of();
    for (int mode = 0; mode < UNIT_WAL_TEARS; mode++) {
        unit_wal_tear.mode = mode;
        for (unit_wal_tear.unit = 0;; unit_wal_tear.unit++) {
            int status;
            unit_tmpdir_remove(tdir);
            unit_tmpdir_make(tdir, sizeof(tdir), "wal");
            pid_t pid = fork();
            ck_assert_int_ge(pid, 0);
            if (pid == 0)
                torn_append_child();
            ck_assert_int_eq(waitpid(pid, &status, 0), pid);
            ck_assert(WIFEXITED(status));
            if (WEXITSTATUS(status) == 3)
                break;   /* past the units the append touches */
            ck_assert_int_eq(WEXITSTATUS(status), 0);
            runs++;
            ck_assert_int_eq(scan(&info, err), 0);
            ck_assert_msg(seen.n >= ACKED && seen.damages == 0,
                          "unit %d of the append %s: %llu records read, %llu "
                          "damaged (%s)", unit_wal_tear.unit, unit_wal_tear_name(mode),
                          (unsigned long long)seen.n,
                          (unsigned long long)seen.damages, seen.where);
            for (uint64_t i = 0; i < ACKED; i++) {
                ck_assert_uint_eq(seen.lsn[i], i + 1);
                ck_assert_uint_eq(seen.val[i], i + 1);
            }
            ck_assert(!info.truncated_shared);
            /* And the log goes on after the cut. */
            struct wal *w = open_log(info.next_lsn, WAL_SYNC_FSYNC);
            struct wal_stream *st = wal_stream_open(w, 7, "f", seen.n + 1);
            ck_assert_int_eq(append(st, 1000), 0);
            wal_stream_close(st);
            wal_close(w);
            uint64_t before = seen.n;
            ck_assert_int_eq(scan(&info, err), 0);
            ck_assert_uint_eq(seen.n, before + 1);
            ck_assert_uint_eq(seen.val[before], 1000);
            ck_assert_uint_eq(seen.damages, 0);
        }
        /* The append (BIG bytes) touches three units at least. */
        ck_assert_int_ge(unit_wal_tear.unit, 3);
    }
    ck_assert_int_ge(runs, 3 * UNIT_WAL_TEARS);
}
END_TEST

/* Zero the whole unit of the segment at path that holds offset off. */
static void zero_unit_at(const char *path, off_t off)
{
    off_t at = off / unit * unit;
    unsigned char *z = calloc(1, unit);
    int fd = open(path, O_WRONLY);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(pwrite(fd, z, unit, at), (ssize_t)unit);
    close(fd);
    free(z);
}

/* Damage that a later commit stamp vouches for was acknowledged: the
 * scan reports it (owners unknown: the record's header is gone too) and
 * reads on, and cuts nothing; the same damage in the last group is a torn
 * tail. */
START_TEST(damage_a_later_commit_stamp_vouches_for_is_reported_not_cut)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;

    ten_records();
    seg_path(path, sizeof(path), true);
    units_of();
    off_t size = file_size(path), last = unit_wal_offset(path, 10);
    zero_unit_at(path, unit_wal_offset(path, 5));
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 9);
    ck_assert_uint_eq(seen.damages, 1);
    ck_assert_uint_eq(seen.lost_from, 5);
    ck_assert_uint_eq(seen.lost_to, 6);
    ck_assert_ptr_nonnull(strstr(seen.where, "written after it was durable"));
    ck_assert_uint_eq(info.truncated, 0);
    ck_assert_uint_eq(info.next_lsn, 11);
    ck_assert_int_eq(file_size(path), size);

    /* The last group: nothing vouches for it. */
    zero_unit_at(path, last);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 8);
    ck_assert_uint_eq(seen.damages, 1);   /* LSN 5's, again */
    ck_assert_uint_eq(info.next_lsn, 10);
}
END_TEST

/* A padding record whose header is damaged hid no record: read on. */
START_TEST(damaged_padding_hides_no_record)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;
    struct unit_wal_rec v[64];

    ten_records();
    seg_path(path, sizeof(path), true);
    size_t n = unit_wal_records(path, true, v, 64);
    ck_assert_uint_eq(n, 20);   /* ten records, each padded */
    ck_assert_uint_eq(v[5].type, UNIT_WAL_PAD);
    flip_byte(path, v[5].off + 20);   /* its LSN: the checksum fails */
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 10);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_eq(info.truncated, 0);
}
END_TEST

/* Commit groups start on unit boundaries and end with padding that names
 * the next LSN and its group's commit stamp; a gap too short for a
 * padding record takes one more unit.  The log's bound counts records, not
 * padding. */
START_TEST(commit_groups_are_padded_to_whole_units)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
    struct unit_wal_rec v[64];
    uint64_t recs = WAL_SEG_HDR, sizes[4];

    units_of();
    /* 73 bytes; one unit less 10 bytes (no room for a padding header);
     * two units and a bit; exactly one unit. */
    sizes[0] = REC1;
    sizes[1] = unit - 10;
    sizes[2] = 2 * (uint64_t)unit + 100;
    sizes[3] = unit;
    for (int i = 0; i < 4; i++) {
        uint64_t len = sizes[i] - WAL_REC_HDR - 1;
        struct wal_rec *r = wal_rec_new(WAL_REC_ADD, NULL, len);
        struct wal_waiter wt;
        memset(wal_rec_payload(r), i, len);
        wal_waiter_init(&wt);
        wal_submit(s, r, wal_waiter_done, &wt);
        ck_assert_int_eq(wal_waiter_wait(&wt), 0);
        recs += sizes[i];
    }
    ck_assert_uint_eq(wal_unit(w), unit);
    ck_assert_uint_eq(wal_bytes(w), recs);
    /* The header's unit, then 1 + 2 + 3 + 1 units. */
    ck_assert_uint_eq(wal_file_bytes(w), 8 * (uint64_t)unit);
    seg_path(path, sizeof(path), true);
    ck_assert_uint_eq(unit_wal_unit(path), unit);
    size_t n = unit_wal_records(path, true, v, 64);
    ck_assert_uint_eq(n, 7);   /* four records, three paddings */
    uint16_t types[] = {1, UNIT_WAL_PAD, 1, UNIT_WAL_PAD, 1, UNIT_WAL_PAD, 1};
    off_t starts[] = {1, -1, 2, -1, 4, -1, 7};
    for (size_t i = 0; i < n; i++) {
        ck_assert_uint_eq(v[i].type, types[i]);
        if (starts[i] >= 0)
            ck_assert_int_eq(v[i].off, starts[i] * (off_t)unit);
        if (v[i].type == UNIT_WAL_PAD) {
            ck_assert_uint_eq(v[i].lsn, v[i - 1].lsn + 1);
            ck_assert_uint_eq(v[i].commit, v[i - 1].commit);
            ck_assert_int_eq((v[i].off + (off_t)v[i].size) % unit, 0);
        }
    }
    ck_assert_uint_eq(v[3].size, 10 + (uint64_t)unit);
    wal_stream_close(s);
    wal_close(w);
    ck_assert_int_eq(file_size(path), 8 * (off_t)unit);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 4);
    ck_assert_uint_eq(seen.damages, 0);
    /* A reopened log counts the records of the segments it finds. */
    w = open_log(info.next_lsn, WAL_SYNC_FSYNC);
    ck_assert_uint_eq(wal_bytes(w), recs + WAL_SEG_HDR);
    wal_close(w);
}
END_TEST

static uint64_t fake_bsize;
static int big_blocks(const char *path, struct statvfs *buf)
{
    int rc = statvfs(path, buf);

    buf->f_bsize = fake_bsize;
    return rc;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");

    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* The unit is the largest of the page size, the file system's block size,
 * the device's physical block size (a partition's disk's) and the setting,
 * at least 4096, a power of two, at most 1 MiB. */
START_TEST(write_unit_is_the_largest_block_size_and_the_setting_raises_it)
{
    char sys[4200], p[4400], err[WAL_ERRLEN], path[4096];
    struct statvfs sv;
    struct stat st;
    uint32_t u = wal_unit_detect(tdir, 0, NULL, 0);

    ck_assert_int_eq(statvfs(tdir, &sv), 0);
    ck_assert_uint_ge(u, 4096);
    ck_assert_uint_ge(u, (uint64_t)sysconf(_SC_PAGESIZE));
    ck_assert_uint_ge(u, sv.f_bsize);
    ck_assert_uint_eq(u & (u - 1), 0);
    ck_assert_uint_eq(wal_unit_detect(tdir, 65536, NULL, 0), 65536);
    ck_assert_uint_eq(wal_unit_detect(tdir, 3 << 12, NULL, 0), 16384);
    wal__statvfs = big_blocks;
    fake_bsize = 32768;
    ck_assert_uint_eq(wal_unit_detect(tdir, 0, NULL, 0), 32768);
    fake_bsize = 8u << 20;
    ck_assert_uint_eq(wal_unit_detect(tdir, 0, NULL, 0), 1u << 20);
    wal__statvfs = statvfs;

    /* A device's block size from sysfs: a partition's from its disk. */
    ck_assert_int_eq(stat(tdir, &st), 0);
    if (major(st.st_dev) != 0) {
        snprintf(sys, sizeof(sys), "%s/sys", tdir);
        mkdir(sys, 0755);
        snprintf(p, sizeof(p), "%s/dev", sys);
        mkdir(p, 0755);
        snprintf(p, sizeof(p), "%s/dev/block", sys);
        mkdir(p, 0755);
        snprintf(p, sizeof(p), "%s/disk", sys);
        mkdir(p, 0755);
        snprintf(p, sizeof(p), "%s/disk/queue", sys);
        mkdir(p, 0755);
        snprintf(p, sizeof(p), "%s/disk/part", sys);
        mkdir(p, 0755);
        snprintf(p, sizeof(p), "%s/disk/queue/physical_block_size", sys);
        write_text(p, "131072\n");
        char link[4400], target[4400];
        snprintf(link, sizeof(link), "%s/dev/block/%u:%u", sys, major(st.st_dev),
                 minor(st.st_dev));
        snprintf(target, sizeof(target), "%s/disk/part", sys);
        ck_assert_int_eq(symlink(target, link), 0);
        wal__sysfs = sys;
        ck_assert_uint_eq(wal_unit_detect(tdir, 0, NULL, 0), 131072);
        snprintf(p, sizeof(p), "%s/disk/part/queue", sys);
        mkdir(p, 0755);
        snprintf(p, sizeof(p), "%s/disk/part/queue/physical_block_size", sys);
        write_text(p, "262144\n");
        ck_assert_uint_eq(wal_unit_detect(tdir, 0, NULL, 0), 262144);
        wal__sysfs = "/sys";
    }

    /* The setting, through wal_open: the segment's header names it and its
     * groups start on its boundaries. */
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, 1 << 20, 16384, err);
    ck_assert_msg(w != NULL, "wal_open: %s", err);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
    ck_assert_uint_eq(wal_unit(w), u > 16384 ? u : 16384);
    for (uint64_t i = 1; i <= 3; i++)
        ck_assert_int_eq(append(s, i), 0);
    wal_stream_close(s);
    wal_close(w);
    seg_path(path, sizeof(path), true);
    ck_assert_uint_eq(unit_wal_unit(path), u > 16384 ? u : 16384);
    ck_assert_int_eq(unit_wal_offset(path, 3), 3 * (off_t)(u > 16384 ? u : 16384));
}
END_TEST

/* Write a version 1 segment by hand (docs/STORAGE.md): the 32-byte header,
 * then records of stream "f" (id 7) with LSN, seq and value first..last,
 * committed one by one. */
static void write_v1_segment(uint64_t first, uint64_t last, const char *tail,
                             size_t tail_len)
{
    char path[4300];
    unsigned char h[32], rec[REC1];
    int fd;

    snprintf(path, sizeof(path), "%s/wal-%016llx.log", tdir,
             (unsigned long long)first);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_int_ge(fd, 0);
    memset(h, 0, sizeof(h));
    memcpy(h, "BGNODLOG", 8);
    h[8] = 1;
    for (int i = 0; i < 8; i++)
        h[16 + i] = (unsigned char)(first >> (8 * i));
    uint64_t sum = XXH64(h, 24, 0);
    for (int i = 0; i < 8; i++)
        h[24 + i] = (unsigned char)(sum >> (8 * i));
    ck_assert_int_eq(write(fd, h, 32), 32);
    for (uint64_t lsn = first; lsn <= last; lsn++) {
        uint64_t f[8] = {0x4E574742 | (uint64_t)1 << 32 | (uint64_t)1 << 48, 8,
                         lsn, lsn - 1, 7, lsn, 0, 0};
        memcpy(rec, f, 56);   /* little-endian fields: this test runs on LE */
        rec[64] = 'f';
        memcpy(rec + 65, &lsn, 8);
        uint64_t psum = XXH64(rec + 65, 8, 0);
        memcpy(rec + 48, &psum, 8);
        uint64_t hsum = XXH64(rec + 64, 1, XXH64(rec, 56, 0));
        memcpy(rec + 56, &hsum, 8);
        ck_assert_int_eq(write(fd, rec, REC1), REC1);
    }
    if (tail_len)
        ck_assert_int_eq(write(fd, tail, tail_len), (ssize_t)tail_len);
    close(fd);
}

/* Logs of version 1 (no units, no padding) are read as before: a torn tail
 * is cut (and counted as one that may have reached acknowledged records),
 * and the log goes on in version 2 segments. */
START_TEST(a_version_1_log_is_read_and_continued)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;

    write_v1_segment(1, 5, NULL, 0);
    write_v1_segment(6, 9, "BGWN\1\0\1\0\7", 9);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 9);
    ck_assert_uint_eq(seen.damages, 0);
    for (uint64_t i = 0; i < 9; i++) {
        ck_assert_uint_eq(seen.lsn[i], i + 1);
        ck_assert_uint_eq(seen.val[i], i + 1);
    }
    ck_assert_uint_eq(info.truncated, 9);
    ck_assert(info.truncated_shared);
    struct wal *w = open_log(info.next_lsn, WAL_SYNC_FSYNC);
    ck_assert_uint_eq(wal_bytes(w), 2 * WAL_SEG_HDR + 9 * REC1 + WAL_SEG_HDR);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 10);
    ck_assert_int_eq(append(s, 10), 0);
    wal_stream_close(s);
    wal_close(w);
    seg_path(path, sizeof(path), true);
    ck_assert_uint_eq(unit_wal_unit(path), units_of());
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 10);
    ck_assert_uint_eq(seen.val[9], 10);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_eq(info.segments, 3);
}
END_TEST

/* ---- spare segments: each byte of the log written about once ---- */

/* Bytes this process has caused to be written to storage (pages it
 * dirtied, /proc/self/io write_bytes), or -1 when that cannot be read. */
static long long io_write_bytes(void)
{
    FILE *f = fopen("/proc/self/io", "re");
    char line[128];
    long long v = -1;

    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "write_bytes: %lld", &v) == 1)
            break;
    fclose(f);
    return v;
}

#define SPARE_SEG (256u << 10)

/* A record of nearly 4 units (one group, padded to 4 units with little
 * padding), payload i in its first 8 bytes. */
static int append_big(struct wal_stream *s, uint64_t i)
{
    uint64_t len = 4 * (uint64_t)unit - WAL_REC_HDR - 1 - 2 * WAL_REC_HDR;
    struct wal_rec *r = wal_rec_new(WAL_REC_ADD, NULL, len);
    struct wal_waiter wt;

    ck_assert_ptr_nonnull(r);
    memset(wal_rec_payload(r), 0xa5, len);
    memcpy(wal_rec_payload(r), &i, 8);
    wal_waiter_init(&wt);
    wal_submit(s, r, wal_waiter_done, &wt);
    return wal_waiter_wait(&wt);
}

/* append_big's record whose payload holds, at offset 64, an intact header
 * of a record that would come long after every real one (LSN and commit
 * 10^12, its checksum right): bytes a client's payload may hold. */
static int append_forged(struct wal_stream *s, uint64_t i)
{
    uint64_t len = 4 * (uint64_t)unit - WAL_REC_HDR - 1 - 2 * WAL_REC_HDR;
    struct wal_rec *r = wal_rec_new(WAL_REC_ADD, NULL, len);
    struct wal_waiter wt;
    uint8_t h[WAL_REC_HDR + 1] = {0};
    uint32_t magic = WAL_REC_MAGIC;
    uint16_t type = WAL_REC_ADD, nlen = 1;
    uint64_t far = 1000000000000ull, plen = 0, sum;

    ck_assert_ptr_nonnull(r);
    memcpy(h + WAL_O_MAGIC, &magic, 4);
    memcpy(h + WAL_O_TYPE, &type, 2);
    memcpy(h + WAL_O_NAMELEN, &nlen, 2);
    memcpy(h + WAL_O_LEN, &plen, 8);
    memcpy(h + WAL_O_LSN, &far, 8);
    memcpy(h + WAL_O_COMMIT, &far, 8);
    memcpy(h + WAL_O_SEQ, &far, 8);
    h[WAL_REC_HDR] = 'f';
    sum = wal__hdr_sum(h, 1);
    memcpy(h + WAL_O_HSUM, &sum, 8);
    ck_assert_uint_eq(wal__get32(h), WAL_REC_MAGIC);
    memset(wal_rec_payload(r), 0xa5, len);
    memcpy(wal_rec_payload(r), &i, 8);
    memcpy((uint8_t *)wal_rec_payload(r) + 64, h, sizeof(h));
    wal_waiter_init(&wt);
    wal_submit(s, r, wal_waiter_done, &wt);
    return wal_waiter_wait(&wt);
}

/* One checkpoint cycle: 4 segments' worth of records appended by add,
 * then every closed segment discarded.  *next: the payload of the next
 * record. */
static void spare_cycle_of(struct wal *w, struct wal_stream *s, uint64_t *next,
                           int (*add)(struct wal_stream *, uint64_t))
{
    uint64_t last = 0;

    for (int i = 0; i < 64; i++)
        ck_assert_int_eq(add(s, (*next)++), 0);
    /* The commit thread closes the full segment after the completion. */
    for (int i = 0; i < 10000 && (!wal_closed_upto(w, &last) ||
                                  last != wal_durable_lsn(w)); i++)
        usleep(1000);
    ck_assert_uint_eq(last, wal_durable_lsn(w));
    ck_assert_int_eq(wal_discard(w, last), 4);
}

static void spare_cycle(struct wal *w, struct wal_stream *s, uint64_t *next)
{
    spare_cycle_of(w, s, next, append_big);
}

static int count_spares(void)
{
    DIR *d = opendir(tdir);
    struct dirent *de;
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d)))
        n += strncmp(de->d_name, ".wal-spare-", 11) == 0;
    closedir(d);
    return n;
}

/* Once the log has discarded segments, new ones are made over their files:
 * nothing but the records, their padding and the headers' units is
 * written, and the bytes the process writes to storage are about the
 * records' (about twice as many when the room is written as zeros first).
 * Spares are no more than the segments the log once held, and are gone
 * after wal_close. */
START_TEST(segments_made_over_spares_write_each_byte_about_once)
{
    char err[WAL_ERRLEN];
    struct wal_stats a, b;
    struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, SPARE_SEG, 0, err);
    uint64_t next = 1;

    ck_assert_msg(w != NULL, "wal_open: %s", err);
    units_of();
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
    for (int c = 0; c < 2; c++)   /* the spares come from these */
        spare_cycle(w, s, &next);
    wal_stats(w, &a);
    ck_assert_uint_ge(a.spares, 1);
    ck_assert_int_eq(count_spares(), (int)a.spares);
    long long io0 = io_write_bytes();
    for (int c = 0; c < 3; c++)
        spare_cycle(w, s, &next);
    long long io1 = io_write_bytes();
    wal_stats(w, &b);
    uint64_t recs = b.record_bytes - a.record_bytes;
    ck_assert_uint_eq(b.zero_bytes, a.zero_bytes);
    ck_assert_uint_eq(b.segments_fresh, a.segments_fresh);
    ck_assert_uint_ge(b.segments_reused - a.segments_reused, 10);
    ck_assert_uint_le(b.padding_bytes - a.padding_bytes, recs / 20);
    ck_assert_uint_le(b.spares, 4);
    if (io0 >= 0 && io1 > io0) {
        /* Dirtied pages: records, padding, the headers' units (and the
         * file system's own, which it does not count here). */
        ck_assert_msg((uint64_t)(io1 - io0) <= recs + recs / 4,
                      "wrote %lld bytes for %llu bytes of records",
                      io1 - io0, (unsigned long long)recs);
    } else {
        fprintf(stderr, "segments_made_over_spares: this file system does "
                "not count written bytes; only the log's counters checked\n");
    }
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(append(s, next++), 0);
    wal_stream_close(s);
    wal_close(w);
    ck_assert_int_eq(count_spares(), 0);

    /* Every record of the segments kept reads back, none damaged. */
    struct wal_scan_info info;
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_eq(info.truncated, 0);
    ck_assert_uint_eq(info.next_lsn, next);
    ck_assert_uint_eq(seen.n, 3);
    for (uint64_t i = 0; i < seen.n; i++)
        ck_assert_uint_eq(seen.val[i], next - seen.n + i);
}
END_TEST

/* A process writes two checkpoint cycles of records appended by add, then
 * k records in the segment made over a spare (two small ones for k = 2,
 * ending mid-way through the spare's first record), and ends without
 * closing the log. */
static void crash_over_a_spare(int (*add)(struct wal_stream *, uint64_t), int k)
{
    char err[WAL_ERRLEN];
    int status;
    pid_t pid = fork();

    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct wal *w = wal_open(tdir, 1, WAL_SYNC_FSYNC, SPARE_SEG, 0, err);
        uint64_t next = 1;
        units_of();
        struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
        spare_cycle_of(w, s, &next, add);
        spare_cycle_of(w, s, &next, add);
        for (int i = 0; i < k; i++)
            ck_assert_int_eq(k == 2 ? append(s, next++) : append_big(s, next++), 0);
        struct wal_stats st;
        wal_stats(w, &st);
        ck_assert_uint_eq(st.segments_reused, 4);
        _exit(0);
    }
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    units_of();
}

/* A crash in a segment made over a spare: the bytes after the last record
 * are the spare's (an earlier segment's records, from anywhere in them);
 * the scan reads every acknowledged record and cuts the rest as room, not
 * as a torn tail, whatever record of the earlier segment they start in.
 * A torn record of the segment's own after the last one is still cut and
 * counted. */
START_TEST(a_crash_in_a_segment_made_over_a_spare_loses_nothing_and_is_not_torn)
{
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;

    for (int k = 1; k <= 3; k++) {
        unit_tmpdir_remove(tdir);
        unit_tmpdir_make(tdir, sizeof(tdir), "wal");
        crash_over_a_spare(append_big, k);
        seg_path(path, sizeof(path), true);
        off_t before = file_size(path);
        ck_assert_int_ge(before, (off_t)SPARE_SEG);   /* the spare's bytes */
        ck_assert_int_eq(scan(&info, err), 0);
        ck_assert_uint_eq(seen.damages, 0);
        ck_assert_uint_eq(info.truncated, 0);
        ck_assert_uint_eq(info.next_lsn, 129 + (uint64_t)k);
        ck_assert_uint_eq(seen.val[seen.n - 1], 128 + (uint64_t)k);
        off_t end = file_size(path);
        ck_assert_int_eq(end, (off_t)unit * (k == 2 ? 1 + 2 : 1 + 4 * k));

        /* The log goes on from there, and reads back whole. */
        struct wal *w = open_log(info.next_lsn, WAL_SYNC_FSYNC);
        struct wal_stream *s = wal_stream_open(w, 7, "f", 129 + (uint64_t)k);
        ck_assert_int_eq(append(s, 100), 0);
        wal_stream_close(s);
        wal_close(w);
        ck_assert_int_eq(scan(&info, err), 0);
        ck_assert_uint_eq(seen.damages, 0);
        ck_assert_uint_eq(seen.val[seen.n - 1], 100);
    }

    /* Half a record of the segment's own right after the last one, over
     * the spare's bytes: torn, cut and counted. */
    unit_tmpdir_remove(tdir);
    unit_tmpdir_make(tdir, sizeof(tdir), "wal");
    crash_over_a_spare(append_big, 1);
    seg_path(path, sizeof(path), true);
    off_t end = 5 * (off_t)unit;
    unsigned char h[WAL_REC_HDR];
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    /* A copy of the last record's header with the next LSN, its payload
     * not written. */
    ck_assert_int_eq(pread(fd, h, sizeof(h), unit), (ssize_t)sizeof(h));
    uint64_t lsn = 130, seq = 130;
    memcpy(h + 16, &lsn, 8);
    memcpy(h + 40, &seq, 8);
    unsigned char name = 'f';
    uint64_t sum = XXH64(&name, 1, XXH64(h, 56, 0));
    memcpy(h + 56, &sum, 8);
    ck_assert_int_eq(pwrite(fd, h, sizeof(h), end), (ssize_t)sizeof(h));
    ck_assert_int_eq(pwrite(fd, &name, 1, end + WAL_REC_HDR), 1);
    close(fd);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_eq(info.next_lsn, 130);
    ck_assert_uint_gt(info.truncated, 0);
    ck_assert_int_eq(file_size(path), end);
}
END_TEST

/* A segment made over a spare whose older records carry, in their
 * payloads, headers of records far ahead: a crash after one record of its
 * own loses nothing, is neither torn nor damage, and the scan past the
 * last record takes none of those payload bytes for a record (each older
 * record intact to its last byte is passed over whole).  Reading byte by
 * byte, it found them and reported acknowledged records lost. */
START_TEST(headers_inside_an_older_records_payload_are_not_records)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;

    unit_tmpdir_remove(tdir);
    unit_tmpdir_make(tdir, sizeof(tdir), "wal");
    crash_over_a_spare(append_forged, 1);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_msg(seen.damages == 0, "%" PRIu64 " damages: %s", seen.damages,
                  seen.where);
    ck_assert_uint_eq(info.truncated, 0);
    ck_assert_uint_eq(info.next_lsn, 130);
    ck_assert_uint_eq(seen.val[seen.n - 1], 129);
}
END_TEST

/* ---- writing in the submitting thread (wal_submit_now) ---- */

struct now_done {
    atomic_int calls;
    int rc;
    uint64_t seq, lsn;
    pthread_t thread;
};

static void now_done_fn(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    struct now_done *d = ctx;

    d->rc = rc;
    d->seq = seq;
    d->lsn = lsn;
    d->thread = pthread_self();
    atomic_fetch_add(&d->calls, 1);
}

static struct wal_rec *rec8(uint64_t v)
{
    struct wal_rec *r = wal_rec_new(WAL_REC_ADD, &v, sizeof(v));

    ck_assert_ptr_nonnull(r);
    return r;
}

/* With durability none and the log idle, the record is written by the
 * submitting thread before wal_submit_now returns: true, and its
 * completion runs when the caller runs it, exactly once, in the caller's
 * thread, with its seq and LSN; the records read back in order.  With
 * fsync it is queued: false, and the log calls done once. */
START_TEST(durability_none_writes_in_the_submitting_thread)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal_stats st;
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);

    for (uint64_t i = 1; i <= 100; i++) {
        struct now_done d = {0};
        struct wal_now now;
        ck_assert(wal_submit_now(s, rec8(i), now_done_fn, &d, &now));
        ck_assert_int_eq(atomic_load(&d.calls), 0);
        ck_assert_uint_eq(wal_durable_lsn(w), i);   /* written already */
        wal_now_complete(&now);
        ck_assert_int_eq(atomic_load(&d.calls), 1);
        wal_now_complete(&now);
        ck_assert_int_eq(atomic_load(&d.calls), 1);
        ck_assert_int_eq(d.rc, 0);
        ck_assert_uint_eq(d.seq, i);
        ck_assert_uint_eq(d.lsn, i);
        ck_assert(pthread_equal(d.thread, pthread_self()));
    }
    wal_stats(w, &st);
    ck_assert_uint_eq(st.inline_records, 100);
    ck_assert_uint_eq(st.syncs, 0);
    wal_stream_close(s);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 100);
    ck_assert_uint_eq(seen.damages, 0);
    for (uint64_t i = 0; i < 100; i++) {
        ck_assert_uint_eq(seen.lsn[i], i + 1);
        ck_assert_uint_eq(seen.val[i], i + 1);
    }

    /* With fsync: queued, completed by the log. */
    w = open_log(101, WAL_SYNC_FSYNC);
    s = wal_stream_open(w, 7, "f", 101);
    struct now_done d = {0};
    struct wal_now now;
    ck_assert(!wal_submit_now(s, rec8(101), now_done_fn, &d, &now));
    wal_now_complete(&now);   /* holds nothing */
    for (int i = 0; i < 20000 && atomic_load(&d.calls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&d.calls), 1);
    ck_assert_int_eq(d.rc, 0);
    ck_assert_uint_eq(d.lsn, 101);
    ck_assert(!pthread_equal(d.thread, pthread_self()));
    wal_stats(w, &st);
    ck_assert_uint_eq(st.inline_records, 0);
    wal_stream_close(s);
    wal_close(w);
    ck_assert_int_eq(atomic_load(&d.calls), 1);
}
END_TEST

#define NOW_THREADS 4
#define NOW_RECS 2000

struct now_thread {
    struct wal *w;
    int t;
    struct now_done d[NOW_RECS];
};

/* Half the records through wal_submit_now (run at once when written
 * inline), half through wal_submit, every 100th a barrier. */
static void *now_thread_main(void *arg)
{
    struct now_thread *nt = arg;
    char name[8];

    snprintf(name, sizeof(name), "t%d", nt->t);
    struct wal_stream *s = wal_stream_open(nt->w, 100 + (uint64_t)nt->t,
                                           name, 1);
    ck_assert_ptr_nonnull(s);
    for (uint64_t i = 0; i < NOW_RECS; i++) {
        struct wal_rec *r = rec8((uint64_t)nt->t << 32 | i);
        if (i % 2 == 0) {
            struct wal_now now;
            wal_submit_now(s, r, now_done_fn, &nt->d[i], &now);
            wal_now_complete(&now);
        } else {
            wal_submit(s, r, now_done_fn, &nt->d[i]);
        }
        if (i % 100 == 99) {
            struct wal_waiter wt;
            wal_waiter_init(&wt);
            ck_assert_int_eq(wal_barrier(s, wal_waiter_done, &wt), 0);
            ck_assert_int_eq(wal_waiter_wait(&wt), 0);
        }
    }
    struct wal_waiter wt;
    wal_waiter_init(&wt);
    ck_assert_int_eq(wal_barrier(s, wal_waiter_done, &wt), 0);
    ck_assert_int_eq(wal_waiter_wait(&wt), 0);
    wal_stream_close(s);
    return NULL;
}

/* Threads writing inline and through the queue at once, with durability
 * none: every completion runs exactly once with rc 0, each stream's
 * records take LSNs in the order they were submitted (seq order), the
 * LSNs of the log are contiguous and the scan reads every record. */
START_TEST(inline_and_queued_records_keep_order_and_complete_once)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal_stats st;
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    static struct now_thread nt[NOW_THREADS];
    pthread_t th[NOW_THREADS];

    memset(nt, 0, sizeof(nt));
    for (int t = 0; t < NOW_THREADS; t++) {
        nt[t].w = w;
        nt[t].t = t;
        ck_assert_int_eq(pthread_create(&th[t], NULL, now_thread_main, &nt[t]), 0);
    }
    for (int t = 0; t < NOW_THREADS; t++)
        pthread_join(th[t], NULL);
    wal_stats(w, &st);
    ck_assert_uint_gt(st.inline_records, 0);
    ck_assert_uint_le(st.inline_records, NOW_THREADS * NOW_RECS / 2);
    wal_close(w);
    for (int t = 0; t < NOW_THREADS; t++)
        for (uint64_t i = 0; i < NOW_RECS; i++) {
            ck_assert_int_eq(atomic_load(&nt[t].d[i].calls), 1);
            ck_assert_int_eq(nt[t].d[i].rc, 0);
            ck_assert_uint_eq(nt[t].d[i].seq, i + 1);
            if (i)
                ck_assert_uint_gt(nt[t].d[i].lsn, nt[t].d[i - 1].lsn);
        }
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, NOW_THREADS * NOW_RECS);
    ck_assert_uint_eq(seen.damages, 0);
    uint64_t next[NOW_THREADS] = {0};
    for (uint64_t k = 0; k < seen.n; k++) {
        ck_assert_uint_eq(seen.lsn[k], k + 1);
        int t = (int)(seen.id[k] - 100);
        ck_assert_int_ge(t, 0);
        ck_assert_int_lt(t, NOW_THREADS);
        ck_assert_uint_eq(seen.seq[k], next[t] + 1);
        ck_assert_uint_eq(seen.val[k], (uint64_t)t << 32 | next[t]);
        ck_assert_uint_eq(nt[t].d[next[t]].lsn, seen.lsn[k]);
        next[t]++;
    }
}
END_TEST

static int write_fails;          /* the next this many writes fail */
static const void *fail_buf;     /* and every write of these bytes */

static ssize_t failing_once_write(int fd, const void *buf, size_t len)
{
    if (write_fails || (fail_buf && buf == fail_buf)) {
        if (write_fails)
            write_fails--;
        errno = ENOSPC;
        return -1;
    }
    return write(fd, buf, len);
}

/* A failed write of a record written inline: its completion gets the
 * error (once), its stream fails for good, nothing of it is read back;
 * another stream goes on in a new segment, inline again. */
START_TEST(an_inline_write_that_fails_fails_its_record_and_stream_only)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    struct wal_stream *b = wal_stream_open(w, 2, "b", 1);
    struct now_done d1 = {0}, d2 = {0}, d3 = {0}, d4 = {0};
    struct wal_now now;

    ck_assert(wal_submit_now(a, rec8(1), now_done_fn, &d1, &now));
    wal_now_complete(&now);
    ck_assert_int_eq(d1.rc, 0);
    write_fails = 1;
    wal__write = failing_once_write;
    ck_assert(wal_submit_now(a, rec8(2), now_done_fn, &d2, &now));
    ck_assert_int_eq(atomic_load(&d2.calls), 0);
    wal_now_complete(&now);
    ck_assert_int_eq(atomic_load(&d2.calls), 1);
    ck_assert_int_eq(d2.rc, -ENOSPC);
    ck_assert(wal_stream_failed(a, NULL));
    ck_assert_int_eq(wal_stream_error(a), -ENOSPC);
    /* The failed stream's later records fail too. */
    wal_submit_now(a, rec8(3), now_done_fn, &d3, &now);
    wal_now_complete(&now);
    for (int i = 0; i < 20000 && atomic_load(&d3.calls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&d3.calls), 1);
    ck_assert_int_eq(d3.rc, -ENOSPC);
    /* Another stream goes on. */
    wal_submit_now(b, rec8(4), now_done_fn, &d4, &now);
    wal_now_complete(&now);
    for (int i = 0; i < 20000 && atomic_load(&d4.calls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&d4.calls), 1);
    ck_assert_int_eq(d4.rc, 0);
    ck_assert(!wal_stream_failed(b, NULL));
    wal_stream_close(a);
    wal_stream_close(b);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 2);
    ck_assert_uint_eq(seen.val[0], 1);
    ck_assert_uint_eq(seen.val[1], 4);
    ck_assert_uint_eq(seen.lsn[1], 2);
}
END_TEST

/* ---- holding a thread's records (wal_hold_begin) ---- */

static atomic_int write_calls;

static ssize_t counting_write(int fd, const void *buf, size_t len)
{
    atomic_fetch_add(&write_calls, 1);
    return write(fd, buf, len);
}

struct hold_other {
    struct wal_stream *s;
    struct now_done d;
    bool inline_written;
};

static void *hold_other_main(void *arg)
{
    struct hold_other *o = arg;
    struct wal_now now;

    o->inline_written = wal_submit_now(o->s, rec8(1000), now_done_fn, &o->d, &now);
    wal_now_complete(&now);
    return NULL;
}

/* Records of three streams submitted during a hold: none written, none
 * completed until wal_hold_end, then one write() for all and their
 * completions in submission order, in this thread, LSNs in that order;
 * another thread's record meanwhile is queued and written after them.
 * Nested holds count as one; with fsync a hold is not taken and records
 * go as before. */
START_TEST(held_records_of_many_streams_are_written_with_one_write)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal_stats st;
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    struct wal_stream *s[3];
    struct now_done d[6];
    struct wal_now now;

    memset(d, 0, sizeof(d));
    for (int i = 0; i < 3; i++)
        s[i] = wal_stream_open(w, 10 + (uint64_t)i, i == 0 ? "a" : i == 1 ? "b" : "c", 1);
    atomic_store(&write_calls, 0);
    wal__write = counting_write;
    ck_assert(wal_hold_begin(w));
    ck_assert(wal_hold_begin(w));   /* nested */
    for (int i = 0; i < 6; i++) {
        ck_assert(!wal_submit_now(s[i % 3], rec8((uint64_t)i + 1), now_done_fn, &d[i], &now));
        wal_now_complete(&now);   /* holds nothing */
    }
    /* Another thread's record waits for the held ones. */
    struct hold_other o = {.s = s[1]};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, hold_other_main, &o), 0);
    pthread_join(th, NULL);
    ck_assert(!o.inline_written);
    wal_hold_end(w);                /* the inner one: still held */
    usleep(20000);
    ck_assert_int_eq(atomic_load(&write_calls), 0);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(atomic_load(&d[i].calls), 0);
    ck_assert_int_eq(atomic_load(&o.d.calls), 0);
    ck_assert_uint_eq(wal_durable_lsn(w), 0);
    wal_hold_end(w);
    ck_assert_int_ge(atomic_load(&write_calls), 1);
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(atomic_load(&d[i].calls), 1);
        ck_assert_int_eq(d[i].rc, 0);
        ck_assert_uint_eq(d[i].lsn, (uint64_t)i + 1);
        ck_assert_uint_eq(d[i].seq, (uint64_t)i / 3 + 1);
        ck_assert(pthread_equal(d[i].thread, pthread_self()));
    }
    for (int i = 0; i < 20000 && atomic_load(&o.d.calls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&o.d.calls), 1);
    ck_assert_int_eq(o.d.rc, 0);
    ck_assert_uint_eq(o.d.lsn, 7);
    ck_assert_uint_eq(o.d.seq, 3);
    /* The held records were one write; the other thread's its own. */
    ck_assert_int_eq(atomic_load(&write_calls), 2);
    wal_stats(w, &st);
    ck_assert_uint_eq(st.inline_records, 6);

    /* Without a hold: one write per record, as before. */
    atomic_store(&write_calls, 0);
    struct now_done e = {0};
    ck_assert(wal_submit_now(s[2], rec8(8), now_done_fn, &e, &now));
    wal_now_complete(&now);
    ck_assert_int_eq(atomic_load(&write_calls), 1);
    ck_assert_uint_eq(e.lsn, 8);
    for (int i = 0; i < 3; i++)
        wal_stream_close(s[i]);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 8);
    static const uint64_t vals[8] = {1, 2, 3, 4, 5, 6, 1000, 8};
    for (uint64_t k = 0; k < 8; k++) {
        ck_assert_uint_eq(seen.lsn[k], k + 1);
        ck_assert_uint_eq(seen.val[k], vals[k]);
    }

    /* With fsync: no hold; the record is queued and completed by the log. */
    w = open_log(101, WAL_SYNC_FSYNC);
    struct wal_stream *f = wal_stream_open(w, 7, "f", 1);
    struct now_done g = {0};
    ck_assert(!wal_hold_begin(w));
    ck_assert(!wal_submit_now(f, rec8(101), now_done_fn, &g, &now));
    for (int i = 0; i < 20000 && atomic_load(&g.calls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&g.calls), 1);   /* not held */
    wal_hold_end(w);
    ck_assert_int_eq(g.rc, 0);
    ck_assert(!pthread_equal(g.thread, pthread_self()));
    wal_stream_close(f);
    wal_close(w);
}
END_TEST

/* A held group whose write fails: every held record's completion gets the
 * error, once, and their streams fail; nothing of them is read back, and
 * another stream goes on. */
START_TEST(a_held_write_that_fails_fails_every_held_record)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    struct wal_stream *b = wal_stream_open(w, 2, "b", 1);
    struct wal_stream *c = wal_stream_open(w, 3, "c", 1);
    struct now_done d[3], e = {0};
    struct wal_now now;

    memset(d, 0, sizeof(d));
    write_fails = 1;
    wal__write = failing_once_write;
    ck_assert(wal_hold_begin(w));
    ck_assert(!wal_submit_now(a, rec8(1), now_done_fn, &d[0], &now));
    ck_assert(!wal_submit_now(b, rec8(2), now_done_fn, &d[1], &now));
    ck_assert(!wal_submit_now(a, rec8(3), now_done_fn, &d[2], &now));
    wal_hold_end(w);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(atomic_load(&d[i].calls), 1);
        ck_assert_int_eq(d[i].rc, -ENOSPC);
    }
    ck_assert(wal_stream_failed(a, NULL));
    ck_assert(wal_stream_failed(b, NULL));
    wal_submit_now(c, rec8(4), now_done_fn, &e, &now);
    wal_now_complete(&now);
    for (int i = 0; i < 20000 && atomic_load(&e.calls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(e.rc, 0);
    wal_stream_close(a);
    wal_stream_close(b);
    wal_stream_close(c);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 1);
    ck_assert_uint_eq(seen.val[0], 4);
}
END_TEST

/* ---- the commit delay ---- */

/* fsync 1 waits for the test, then takes 300 ms more (the commit delay is
 * at most as long as the last fsync took); later ones work. */
static int held_slow_fdatasync(int fd)
{
    if (atomic_fetch_add(&gate_calls, 1) == 0) {
        while (!atomic_load(&gate_open))
            usleep(1000);
        usleep(300000);
    }
    return fdatasync(fd);
}

/* Records queued during a group's fdatasync (writers keep coming) and one
 * submitted right after that group was answered go into one group when a
 * commit delay is set: three records, two fdatasyncs (the queued record's
 * group waited for the writer the first answer let go).  A delay past the
 * bound is cut to it; the records read back in order. */
START_TEST(a_commit_delay_lets_the_writers_an_answer_frees_join_the_next_group)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal_stats st;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
    struct wal_waiter a, b, c;

    wal_set_commit_delay(w, 10 * WAL_COMMIT_DELAY_MAX_US);   /* cut: 100 ms */
    atomic_store(&gate_calls, 0);
    atomic_store(&gate_open, false);
    wal__fdatasync = held_slow_fdatasync;   /* the first waits for the test */
    wal_waiter_init(&a);
    wal_submit(s, rec8(1), wal_waiter_done, &a);
    while (atomic_load(&gate_calls) == 0)   /* record 1 is being synced */
        usleep(200);
    wal_waiter_init(&b);
    wal_submit(s, rec8(2), wal_waiter_done, &b);   /* queued behind it */
    atomic_store(&gate_open, true);
    ck_assert_int_eq(wal_waiter_wait(&a), 0);
    wal_waiter_init(&c);
    wal_submit(s, rec8(3), wal_waiter_done, &c);   /* the freed writer */
    ck_assert_int_eq(wal_waiter_wait(&b), 0);
    ck_assert_int_eq(wal_waiter_wait(&c), 0);
    wal_stats(w, &st);
    ck_assert_uint_eq(st.syncs, 2);
    ck_assert_uint_eq(st.groups, 2);
    wal_stream_close(s);
    wal_close(w);
    wal__fdatasync = fdatasync;
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 3);
    for (uint64_t i = 0; i < 3; i++)
        ck_assert_uint_eq(seen.val[i], i + 1);
}
END_TEST

/* ---- large payloads written from their records ---- */

/* The buffers write() was given, and their lengths. */
#define MAXWRITES 64
static const void *write_bufs[MAXWRITES];
static size_t write_lens[MAXWRITES];
static atomic_int nwrites;

static ssize_t noting_write(int fd, const void *buf, size_t len)
{
    int i = atomic_fetch_add(&nwrites, 1);

    if (i < MAXWRITES) {
        write_bufs[i] = buf;
        write_lens[i] = len;
    }
    return write(fd, buf, len);
}

/* Was payload p of len bytes handed to write() as it is, in one call? */
static bool written_from(const void *p, size_t len)
{
    int n = atomic_load(&nwrites);

    for (int i = 0; i < n && i < MAXWRITES; i++)
        if (write_bufs[i] == p && write_lens[i] == len)
            return true;
    return false;
}

static uint8_t pattern(uint64_t rec, uint64_t i)
{
    return (uint8_t)(rec * 131 + i * 7 + (i >> 9));
}

/* A record of len bytes whose payload is rec's pattern. */
static struct wal_rec *rec_pattern(uint64_t rec, uint64_t len)
{
    struct wal_rec *r = wal_rec_new(WAL_REC_ADD, NULL, len);

    ck_assert_ptr_nonnull(r);
    uint8_t *p = wal_rec_payload(r);
    for (uint64_t i = 0; i < len; i++)
        p[i] = pattern(rec, i);
    return r;
}

/* What a scan of pattern records read: their lengths, and whether every
 * byte was its record's. */
struct pattern_seen {
    uint64_t n, len[16];
    bool intact[16];
    uint64_t damages;
};

static int pattern_rec(void *ctx, const struct wal_record *r)
{
    struct pattern_seen *s = ctx;
    const uint8_t *p = r->payload;
    bool ok = true;

    ck_assert_uint_lt(s->n, 16);
    for (uint64_t i = 0; i < r->len && ok; i++)
        ok = p[i] == pattern(s->n, i);
    s->len[s->n] = r->len;
    s->intact[s->n] = ok;
    s->n++;
    return 0;
}

static void pattern_damage(void *ctx, const struct wal_damage *d)
{
    (void)d;
    ((struct pattern_seen *)ctx)->damages++;
}

static const struct wal_scan_ops pattern_ops = {pattern_rec, pattern_damage, NULL};

/* The log in tdir holds n pattern records of lens[i] bytes, every byte
 * intact, and nothing damaged or cut. */
static void expect_patterns(const uint64_t *lens, uint64_t n)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct pattern_seen ps = {0};

    ck_assert_int_eq(wal_scan(tdir, &pattern_ops, &ps, &info, err), 0);
    ck_assert_uint_eq(ps.damages, 0);
    ck_assert_uint_eq(info.truncated, 0);
    ck_assert_uint_eq(ps.n, n);
    for (uint64_t i = 0; i < n; i++) {
        ck_assert_uint_eq(ps.len[i], lens[i]);
        ck_assert_msg(ps.intact[i], "record %" PRIu64 " read back changed", i);
    }
}

/* A payload of 256 KiB or more is written from its record, not copied
 * into the log's batch buffer first (the log holds no second copy of an
 * Import's file): write() gets the record's own bytes.  With write units
 * (fsync), each group, a large payload among its bytes, still starts and
 * ends on a unit (padding counted on the whole group); every byte reads
 * back, in order, small records around the large ones intact. */
START_TEST(large_payloads_are_written_from_their_records_in_whole_units)
{
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 7, "f", 1);
    /* Small; large; large by a unit and a bit; exactly the threshold less
     * one (copied); small. */
    uint64_t lens[] = {100, 300 << 10, (256 << 10) + 4096 + 33,
                       (256 << 10) - 1, 8};
    bool in_place[] = {false, true, true, false, false};
    uint64_t recs = WAL_SEG_HDR;

    units_of();
    atomic_store(&nwrites, 0);
    wal__write = noting_write;
    for (uint64_t i = 0; i < 5; i++) {
        struct wal_rec *r = rec_pattern(i, lens[i]);
        const void *p = wal_rec_payload(r);
        struct wal_waiter wt;
        atomic_store(&nwrites, 0);
        wal_waiter_init(&wt);
        wal_submit(s, r, wal_waiter_done, &wt);
        ck_assert_int_eq(wal_waiter_wait(&wt), 0);
        /* The record is freed once completed: p is only compared. */
        ck_assert_msg(written_from(p, (size_t)lens[i]) == in_place[i],
                      "record %" PRIu64 " of %" PRIu64 " bytes: written from "
                      "its record %d, expected %d", i, lens[i],
                      (int)written_from(p, (size_t)lens[i]), (int)in_place[i]);
        recs += WAL_REC_HDR + 1 + lens[i];
        ck_assert_uint_eq(wal_file_bytes(w) % unit, 0);
    }
    ck_assert_uint_eq(wal_bytes(w), recs);
    wal__write = write;
    wal_stream_close(s);
    wal_close(w);
    expect_patterns(lens, 5);
}
END_TEST

/* The write of a large payload fails (ENOSPC) after the group's first
 * bytes went out: its record and its stream fail, nothing of it is read
 * back (the next segment starts at its LSN, so the abandoned bytes are
 * passed over, not reported as damage), and another stream goes on. */
START_TEST(a_large_payload_whose_write_fails_is_not_read_back)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    struct wal_stream *b = wal_stream_open(w, 2, "b", 1);
    struct wal_waiter wt;

    ck_assert_int_eq(append(a, 1), 0);
    struct wal_rec *r = rec_pattern(0, 400 << 10);
    fail_buf = wal_rec_payload(r);
    wal__write = failing_once_write;
    wal_waiter_init(&wt);
    wal_submit(b, r, wal_waiter_done, &wt);
    ck_assert_int_eq(wal_waiter_wait(&wt), -ENOSPC);
    ck_assert(wal_stream_failed(b, NULL));
    wal__write = write;
    fail_buf = NULL;
    ck_assert_int_eq(append(a, 2), 0);
    wal_stream_close(a);
    wal_stream_close(b);
    wal_close(w);
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_eq(seen.n, 2);
    ck_assert_uint_eq(seen.val[0], 1);
    ck_assert_uint_eq(seen.val[1], 2);
    ck_assert_uint_eq(seen.id[1], 1);
    ck_assert_uint_eq(seen.lsn[1], 2);
}
END_TEST

/* Records held by one thread (durability none: one group): large payloads
 * between small records of other streams are written from their records,
 * in the group's order, and read back whole with their LSNs in that
 * order. */
START_TEST(a_group_of_small_and_large_records_reads_back_in_order)
{
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    struct wal_stream *s[2] = {wal_stream_open(w, 1, "a", 1),
                               wal_stream_open(w, 2, "bb", 1)};
    uint64_t lens[] = {16, 512 << 10, 40, 260 << 10, 16};
    const void *p[5];
    struct now_done d[5];
    struct wal_now now;

    memset(d, 0, sizeof(d));
    atomic_store(&nwrites, 0);
    wal__write = noting_write;
    ck_assert(wal_hold_begin(w));
    for (uint64_t i = 0; i < 5; i++) {
        struct wal_rec *r = rec_pattern(i, lens[i]);
        p[i] = wal_rec_payload(r);
        ck_assert(!wal_submit_now(s[i % 2], r, now_done_fn, &d[i], &now));
        wal_now_complete(&now);
    }
    /* Written (and so compared) before the records are completed and
     * freed. */
    wal_hold_end(w);
    ck_assert_msg(written_from(p[1], (size_t)lens[1]) &&
                  written_from(p[3], (size_t)lens[3]),
                  "large payloads copied before they were written");
    ck_assert(!written_from(p[0], (size_t)lens[0]));
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(atomic_load(&d[i].calls), 1);
        ck_assert_int_eq(d[i].rc, 0);
        if (i)
            ck_assert_uint_eq(d[i].lsn, d[i - 1].lsn + 1);
    }
    wal__write = write;
    wal_stream_close(s[0]);
    wal_stream_close(s[1]);
    wal_close(w);
    expect_patterns(lens, 5);
}
END_TEST

/* ---- a thread leading its own group commit (wal_hold, wal_lead) ---- */

struct led {
    atomic_int calls;          /* completions run */
    int rc[32];
    uint64_t lsn[32];
    bool in_leader[32];        /* ran in the thread that led */
    int done_at_sync;          /* completions run when the fdatasync began */
    pthread_t leader;
};
static struct led led;
static _Atomic int led_syncs, led_fail_at;

/* Counts fdatasyncs, notes how many completions had run when it began,
 * and fails call number led_fail_at (1-based; 0: none) with EIO. */
static int led_fdatasync(int fd)
{
    int k = atomic_fetch_add(&led_syncs, 1) + 1;

    if (k == 1)
        led.done_at_sync = atomic_load(&led.calls);
    if (k == atomic_load(&led_fail_at)) {
        errno = EIO;
        return -1;
    }
    return fdatasync(fd);
}

static void led_done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    int i = (int)(intptr_t)ctx;

    (void)seq;
    led.rc[i] = rc;
    led.lsn[i] = lsn;
    led.in_leader[i] = pthread_equal(pthread_self(), led.leader);
    atomic_fetch_add(&led.calls, 1);
}

static void led_reset(void)
{
    memset(&led, 0, sizeof(led));
    led.leader = pthread_self();
    atomic_store(&led_syncs, 0);
    atomic_store(&led_fail_at, 0);
}

/* Records held by a thread (two streams, a barrier among them) do not
 * wake the commit thread: nothing is written until the thread leads.
 * wal_lead then commits them all as one group with one fdatasync, before
 * which no completion ran, and runs every completion once, in the
 * leading thread, in submission order (LSNs 1..n); a second wal_lead has
 * nothing to do.  The records read back in order. */
START_TEST(a_led_group_commits_the_held_records_once_after_its_sync)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal_stats st;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s1 = wal_stream_open(w, 1, "one", 1);
    struct wal_stream *s2 = wal_stream_open(w, 2, "two", 1);

    led_reset();
    wal__fdatasync = led_fdatasync;
    wal_hold(true);
    for (int i = 0; i < 10; i++) {
        uint64_t v = 100 + (uint64_t)i;
        if (i == 5)
            ck_assert_int_eq(wal_barrier(s1, led_done, (void *)(intptr_t)10), 0);
        wal_submit(i % 2 ? s2 : s1, wal_rec_new(WAL_REC_ADD, &v, 8), led_done,
                   (void *)(intptr_t)i);
    }
    wal_hold(false);
    usleep(50000);   /* a commit thread woken would have written them */
    ck_assert_int_eq(atomic_load(&led_syncs), 0);
    ck_assert_int_eq(atomic_load(&led.calls), 0);
    ck_assert_uint_eq(wal_durable_lsn(w), 0);
    ck_assert_uint_eq(wal_lead(), 11);
    ck_assert_int_eq(atomic_load(&led_syncs), 1);
    ck_assert_int_eq(led.done_at_sync, 0);   /* nothing answered before it */
    ck_assert_int_eq(atomic_load(&led.calls), 11);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(led.rc[i], 0);
        ck_assert_uint_eq(led.lsn[i], (uint64_t)i + 1);
        ck_assert(led.in_leader[i]);
    }
    ck_assert_int_eq(led.rc[10], 0);
    ck_assert_uint_eq(led.lsn[10], 5);   /* after s1's records 0, 2, 4 */
    ck_assert(led.in_leader[10]);
    ck_assert_uint_eq(wal_durable_lsn(w), 10);
    ck_assert_uint_eq(wal_lead(), 0);
    usleep(20000);
    ck_assert_int_eq(atomic_load(&led.calls), 11);   /* once each */
    ck_assert_int_eq(atomic_load(&led_syncs), 1);
    wal_stats(w, &st);
    ck_assert_uint_eq(st.led_groups, 1);
    ck_assert_uint_eq(st.led_records, 11);
    ck_assert_uint_eq(st.syncs, 1);
    /* Not held: the commit thread writes as before. */
    ck_assert_int_eq(append(s1, 200), 0);
    wal_stats(w, &st);
    ck_assert_uint_eq(st.led_groups, 1);
    ck_assert_uint_eq(st.syncs, 2);
    wal_stream_close(s1);
    wal_stream_close(s2);
    wal_close(w);
    wal__fdatasync = fdatasync;
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 11);
    for (uint64_t i = 0; i < 10; i++)
        ck_assert_uint_eq(seen.val[i], 100 + i);
    ck_assert_uint_eq(seen.val[10], 200);
}
END_TEST

/* The fdatasync of a led group fails: every record of the group (of both
 * its streams) completes with the error, in the leading thread, none
 * with 0; both streams fail; the log goes on in a new segment for a
 * stream with nothing in the group, and the failed records are not read
 * back. */
START_TEST(a_failed_led_sync_fails_every_record_of_its_group)
{
    char err[WAL_ERRLEN];
    struct wal_scan_info info;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s1 = wal_stream_open(w, 1, "one", 1);
    struct wal_stream *s2 = wal_stream_open(w, 2, "two", 1);
    struct wal_stream *s3 = wal_stream_open(w, 3, "three", 1);

    led_reset();
    uint64_t one = 1;
    wal_hold(true);   /* durable before (led: the commit thread stays idle) */
    wal_submit(s3, wal_rec_new(WAL_REC_ADD, &one, 8), led_done, (void *)(intptr_t)31);
    wal_hold(false);
    ck_assert_uint_eq(wal_lead(), 1);
    ck_assert_int_eq(led.rc[31], 0);
    led_reset();
    atomic_store(&led_fail_at, 1);
    wal__fdatasync = led_fdatasync;
    wal_hold(true);
    for (int i = 0; i < 6; i++) {
        uint64_t v = 10 + (uint64_t)i;
        wal_submit(i % 2 ? s2 : s1, wal_rec_new(WAL_REC_ADD, &v, 8), led_done,
                   (void *)(intptr_t)i);
    }
    wal_hold(false);
    ck_assert_uint_eq(wal_lead(), 6);
    ck_assert_int_eq(atomic_load(&led.calls), 6);
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(led.rc[i], -EIO);
        ck_assert(led.in_leader[i]);
    }
    ck_assert(wal_stream_failed(s1, NULL));
    ck_assert(wal_stream_failed(s2, NULL));
    ck_assert_int_eq(wal_stream_error(s1), -EIO);
    ck_assert(!wal_stream_failed(s3, NULL));
    ck_assert_uint_eq(wal_durable_lsn(w), 1);
    ck_assert_int_eq(append(s3, 2), 0);   /* the log goes on */
    struct res r = {0};
    submit_v(s1, 99, &r);                 /* a failed stream stays failed */
    wait_calls(&r);
    ck_assert_int_eq(r.rc, -EIO);
    wal_stream_close(s1);
    wal_stream_close(s2);
    wal_stream_close(s3);
    wal_close(w);
    wal__fdatasync = fdatasync;
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 2);
    ck_assert_uint_eq(seen.val[0], 1);
    ck_assert_uint_eq(seen.val[1], 2);
    ck_assert_uint_eq(seen.damages, 0);
}
END_TEST

/* A thread cannot lead while the commit thread writes a group, nor while
 * an earlier group's completions are pending: its held records then go
 * with the commit thread's next group and complete on the completer,
 * after the earlier ones (commit order), once each and never before
 * their fdatasync. */
START_TEST(a_lead_while_the_log_is_busy_hands_the_records_to_the_commit_thread)
{
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 1, "one", 1);
    struct wal_stats st;
    uint64_t v = 1;

    /* The commit thread is in an fdatasync. */
    led_reset();
    atomic_store(&gate_calls, 0);
    atomic_store(&gate_open, false);
    wal__fdatasync = held_fdatasync;
    struct res ra = {0};
    submit_v(s, 1, &ra);
    while (atomic_load(&gate_calls) < 1)
        usleep(1000);
    wal_hold(true);
    wal_submit(s, wal_rec_new(WAL_REC_ADD, &v, 8), led_done, (void *)(intptr_t)0);
    wal_hold(false);
    ck_assert_uint_eq(wal_lead(), 0);
    ck_assert_int_eq(atomic_load(&led.calls), 0);
    atomic_store(&gate_open, true);
    wait_calls(&ra);
    for (int i = 0; i < 10000 && atomic_load(&led.calls) == 0; i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&led.calls), 1);
    ck_assert_int_eq(led.rc[0], 0);
    ck_assert_uint_eq(led.lsn[0], 2);
    ck_assert(!led.in_leader[0]);

    /* An earlier group's completion is running (stuck) on the completer. */
    wal__fdatasync = fdatasync;
    atomic_store(&stuck_in, false);
    atomic_store(&stuck_release, false);
    atomic_store(&order_n, 0);
    v = 3;
    wal_submit(s, wal_rec_new(WAL_REC_ADD, &v, 8), stuck_done, (void *)(intptr_t)1);
    for (int i = 0; i < 10000 && !atomic_load(&stuck_in); i++)
        usleep(1000);
    ck_assert(atomic_load(&stuck_in));
    v = 4;
    wal_hold(true);
    wal_submit(s, wal_rec_new(WAL_REC_ADD, &v, 8), next_done, (void *)(intptr_t)2);
    wal_hold(false);
    ck_assert_uint_eq(wal_lead(), 0);
    for (int i = 0; i < 10000 && wal_durable_lsn(w) < 4; i++)
        usleep(1000);
    ck_assert_uint_eq(wal_durable_lsn(w), 4);   /* the commit thread wrote it */
    ck_assert_int_eq(atomic_load(&order_n), 0);
    atomic_store(&stuck_release, true);
    for (int i = 0; i < 10000 && atomic_load(&order_n) < 2; i++)
        usleep(1000);
    ck_assert_int_eq(order_seen[0], 1);
    ck_assert_int_eq(order_seen[1], 2);
    wal_stats(w, &st);
    ck_assert_uint_eq(st.led_groups, 0);
    wal_stream_close(s);
    wal_close(w);
}
END_TEST

/* While a leader runs its group's completions, a later group the commit
 * thread commits meanwhile completes only after them (commit order): a
 * completion of the led group submits a record (not held) and waits until
 * it is durable; that record's completion has not run when the led
 * completion returns, and runs after. */
static struct wal_stream *later_s;
static struct res later_r;
static _Atomic bool later_ran_early;

static void led_then_submit_done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    struct wal *w = ctx;

    (void)seq;
    (void)lsn;
    ck_assert_int_eq(rc, 0);
    submit_v(later_s, 77, &later_r);
    for (int i = 0; i < 10000 && wal_durable_lsn(w) < 2; i++)
        usleep(1000);
    ck_assert_uint_eq(wal_durable_lsn(w), 2);
    usleep(20000);   /* a completer not held back would run it now */
    atomic_store(&later_ran_early, __atomic_load_n(&later_r.calls, __ATOMIC_SEQ_CST) != 0);
}

START_TEST(a_later_group_completes_after_the_led_one)
{
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);
    struct wal_stream *s = wal_stream_open(w, 1, "one", 1);
    uint64_t v = 1;

    later_s = s;
    memset(&later_r, 0, sizeof(later_r));
    atomic_store(&later_ran_early, true);
    wal_hold(true);
    wal_submit(s, wal_rec_new(WAL_REC_ADD, &v, 8), led_then_submit_done, w);
    wal_hold(false);
    ck_assert_uint_eq(wal_lead(), 1);
    ck_assert(!atomic_load(&later_ran_early));
    wait_calls(&later_r);
    ck_assert_int_eq(later_r.rc, 0);
    wal_stream_close(s);
    wal_close(w);
}
END_TEST

/* Submit one record of len bytes (v in its first 8) and wait; its LSN. */
static uint64_t append_len(struct wal_stream *s, uint64_t v, size_t len)
{
    struct wal_waiter wt;
    struct wal_rec *r = wal_rec_new(WAL_REC_ADD, NULL, len);

    ck_assert_ptr_nonnull(r);
    memset(wal_rec_payload(r), 0xAB, len);
    memcpy(wal_rec_payload(r), &v, 8);
    wal_waiter_init(&wt);
    wal_submit(s, r, wal_waiter_done, &wt);
    ck_assert_int_eq(wal_waiter_wait(&wt), 0);
    return wt.lsn;
}

static bool skip_other(void *ctx, const struct wal_record *h)
{
    (void)ctx;
    return h->id != 1;
}

static const struct wal_scan_ops ops_one = {on_rec, on_damage, skip_other};

/* A scan of the open log checks the header checksum of each record it
 * reads, not of those it passes over (a checkpoint of one shard among 64
 * passes over most of what it reads): b's record with a damaged checksum
 * costs a scan of a's records nothing, and a scan that reads it reports
 * it.  a's record whose id was damaged is passed over as another
 * stream's: the scan of a's records shows the gap in their seqs, which is
 * what its callers check (wal.h, skip). */
START_TEST(a_rescan_checks_the_headers_it_reads_not_those_it_passes)
{
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    struct wal_stream *b = wal_stream_open(w, 2, "b", 1);
    struct wal_scan_info info;
    char err[WAL_ERRLEN], path[4200];

    /* a's records at odd LSNs (seq 1..20), b's at even ones. */
    for (uint64_t i = 1; i <= 20; i++) {
        ck_assert_int_eq(append(a, i), 0);
        ck_assert_int_eq(append(b, 100 + i), 0);
    }
    seg_path(path, sizeof path, true);
    flip_byte(path, unit_wal_offset(path, 10) + 56);   /* b's header checksum */

    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan_from(w, 1, &ops_one, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.n, 20);
    ck_assert_uint_eq(seen.damages, 0);
    for (uint64_t i = 0; i < 20; i++)
        ck_assert_uint_eq(seen.seq[i], i + 1);
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan(w, &ops, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.n, 39);
    ck_assert_uint_ge(seen.damages, 1);

    flip_byte(path, unit_wal_offset(path, 21) + 32);   /* a's seq 11: its id */
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan_from(w, 1, &ops_one, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.n, 19);
    ck_assert_uint_eq(seen.seq[9], 10);
    ck_assert_uint_eq(seen.seq[10], 12);   /* the gap */
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan(w, &ops, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.n, 38);
    ck_assert_uint_ge(seen.damages, 2);
    wal_stream_close(a);
    wal_stream_close(b);
    wal_close(w);
}
END_TEST

/* A scan of the open log from an LSN starts at the seek mark nearest
 * before it, not at its segment's start, and passes records before it
 * over by their headers; a skip passes another stream's records over
 * unread: what it reads follows the stream's records after the LSN, not
 * the log's bytes.  Every record of the stream from the LSN on is met,
 * in order, and no other. */
START_TEST(a_rescan_from_an_lsn_reads_near_it_and_skips_by_header)
{
    struct wal *w = open_log(1, WAL_SYNC_NONE);   /* segments of 1 MiB */
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    struct wal_stream *b = wal_stream_open(w, 2, "b", 1);
    struct wal_scan_info info;
    struct wal_stats st0, st1;
    char err[WAL_ERRLEN];
    uint64_t lsn_a[1500], from = 0;
    int na = 0;

    /* 3 000 records, every other one 1 KiB of b's: about 1.7 MB, two
     * segments. */
    for (int i = 0; i < 1500; i++) {
        lsn_a[na++] = append_len(a, (uint64_t)i, 8);
        append_len(b, (uint64_t)i, 1024);
    }
    from = lsn_a[1400];
    ck_assert_uint_gt(wal_file_bytes(w), UINT64_C(3) << 19);
    uint64_t span, nrec;
    wal_span_from(w, from, &span, &nrec);
    ck_assert_uint_gt(span, UINT64_C(100) << 10);   /* b's 100 KiB at least */
    ck_assert_uint_lt(span, UINT64_C(200) << 10);   /* a seek mark near */
    ck_assert_uint_ge(nrec, 200);
    ck_assert_uint_lt(nrec, 300);
    /* From the first LSN: every segment but its header, every record. */
    wal_span_from(w, 1, &span, &nrec);
    ck_assert_uint_le(span, wal_file_bytes(w));
    ck_assert_uint_ge(span + 3 * WAL_SEG_HDR, wal_file_bytes(w));
    ck_assert_uint_eq(nrec, 3000);

    /* a's records from lsn_a[1400]: headers of the records since the mark
     * before it, a's payloads, none of b's. */
    memset(&seen, 0, sizeof(seen));
    wal_stats(w, &st0);
    ck_assert_int_eq(wal_rescan_from(w, from, &ops_one, &seen, &info, err), 0);
    wal_stats(w, &st1);
    ck_assert_uint_eq(seen.n, 100);
    for (uint64_t i = 0; i < seen.n; i++) {
        ck_assert_uint_eq(seen.lsn[i], lsn_a[1400 + i]);
        ck_assert_uint_eq(seen.id[i], 1);
        ck_assert_uint_eq(seen.val[i], 1400 + i);
    }
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_lt(info.read_bytes, UINT64_C(32) << 10);
    ck_assert_uint_eq(st1.rescans, st0.rescans + 1);
    ck_assert_uint_eq(st1.rescan_bytes - st0.rescan_bytes, info.read_bytes);

    /* Without the skip, b's payloads after from are read too, and met. */
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan_from(w, from, &ops, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.n, 200);
    ck_assert_uint_eq(seen.lsn[0], from);
    ck_assert_uint_gt(info.read_bytes, UINT64_C(100) << 10);
    ck_assert_uint_lt(info.read_bytes, UINT64_C(160) << 10);

    /* From the start: every record. */
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan(w, &ops, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.n, 3000);
    ck_assert_uint_gt(info.read_bytes, UINT64_C(3) << 19);
    wal_stream_close(a);
    wal_stream_close(b);
    wal_close(w);
}
END_TEST

/* The log keeps a seek mark every 256 KiB of a segment or more (wal.h). */
#define SEEK_STRIDE (256u << 10)

/* The log's segments (wal-*.log) by first LSN, rising: how many; their
 * first LSNs in firsts (at most max). */
static size_t seg_firsts(uint64_t *firsts, size_t max)
{
    DIR *d = opendir(tdir);
    struct dirent *de;
    size_t n = 0;

    ck_assert_ptr_nonnull(d);
    while ((de = readdir(d))) {
        unsigned long long f;
        char tail[8];
        if (sscanf(de->d_name, "wal-%16llx%7s", &f, tail) != 2 ||
            strcmp(tail, ".log") != 0)
            continue;
        size_t i = n < max ? n : max;
        while (i > 0 && firsts[i - 1] > f) {
            if (i < max)
                firsts[i] = firsts[i - 1];
            i--;
        }
        if (i < max)
            firsts[i] = f;
        n++;
    }
    closedir(d);
    return n;
}

/* After a restart the segments an earlier run wrote have seek marks too
 * (wal_open reads their records' headers): a scan from an LSN deep in one
 * starts at the mark nearest before it, as it did in the run that wrote
 * it, and reads exactly as much, not the segment from its start; the
 * records met are the same. */
START_TEST(a_rescan_after_a_restart_starts_at_an_old_segments_seek_mark)
{
    struct wal *w = open_log(1, WAL_SYNC_NONE);   /* segments of 1 MiB */
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    struct wal_stream *b = wal_stream_open(w, 2, "b", 1);
    struct wal_scan_info info, live;
    struct wal_stats st0, st1;
    char err[WAL_ERRLEN];
    uint64_t lsn_a[1500], firsts[8], span_live, nrec_live, span, nrec;

    /* As above: 3 000 records, every other one 1 KiB of b's, two
     * segments; from deep in the second. */
    for (int i = 0; i < 1500; i++) {
        lsn_a[i] = append_len(a, (uint64_t)i, 8);
        append_len(b, (uint64_t)i, 1024);
    }
    uint64_t from = lsn_a[1400];
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan_from(w, from, &ops_one, &seen, &live, err), 0);
    ck_assert_uint_eq(seen.n, 100);
    wal_span_from(w, from, &span_live, &nrec_live);
    wal_stream_close(a);
    wal_stream_close(b);
    wal_close(w);
    ck_assert_uint_eq(seg_firsts(firsts, 8), 2);
    ck_assert_uint_lt(firsts[1], lsn_a[1000]);   /* from is deep in it */

    /* The restart: recovery reads the log, which is opened after it. */
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, 3000);
    ck_assert_uint_eq(seen.damages, 0);
    w = open_log(info.next_lsn, WAL_SYNC_NONE);
    a = wal_stream_open(w, 1, "a", 1501);

    memset(&seen, 0, sizeof(seen));
    wal_stats(w, &st0);
    ck_assert_int_eq(wal_rescan_from(w, from, &ops_one, &seen, &info, err), 0);
    wal_stats(w, &st1);
    ck_assert_uint_eq(seen.n, 100);
    for (uint64_t i = 0; i < seen.n; i++) {
        ck_assert_uint_eq(seen.lsn[i], lsn_a[1400 + i]);
        ck_assert_uint_eq(seen.val[i], 1400 + i);
    }
    ck_assert_uint_eq(seen.damages, 0);
    /* As in the run that wrote it (19 650 bytes); from the segment's
     * start it would read the headers of the 1 000 records before from in
     * it too (78 410 bytes). */
    ck_assert_uint_eq(info.read_bytes, live.read_bytes);
    ck_assert_uint_lt(info.read_bytes, UINT64_C(32) << 10);
    ck_assert_uint_eq(st1.rescan_bytes - st0.rescan_bytes, info.read_bytes);

    /* What wal_span_from says it walks: from the same mark as before. */
    wal_span_from(w, from, &span, &nrec);
    ck_assert_uint_eq(span, span_live + WAL_SEG_HDR);   /* the new segment */
    ck_assert_uint_eq(nrec, nrec_live);
    ck_assert_uint_lt(span, UINT64_C(200) << 10);

    /* Records written since read on from there, in the new segment. */
    for (uint64_t i = 0; i < 10; i++)
        append_len(a, 1500 + i, 8);
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan_from(w, from, &ops_one, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.n, 110);
    for (uint64_t i = 0; i < seen.n; i++)
        ck_assert_uint_eq(seen.val[i], 1400 + i);
    ck_assert_uint_eq(info.read_bytes,
                      live.read_bytes + 10 * (WAL_REC_HDR + 1 + 8));

    /* From the first LSN, every record. */
    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan(w, &ops, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.n, 3010);
    ck_assert_uint_eq(seen.damages, 0);
    wal_stream_close(a);
    wal_close(w);
}
END_TEST

/* Scan a from LSN from and check it meets, in order and undamaged, the
 * records of LSNs want_lsn[0..n) with payloads want_val[0..n). */
static void rescan_expect(struct wal *w, uint64_t from, const uint64_t *want_lsn,
                          const uint64_t *want_val, uint64_t n)
{
    struct wal_scan_info info;
    char err[WAL_ERRLEN];

    memset(&seen, 0, sizeof(seen));
    ck_assert_int_eq(wal_rescan_from(w, from, &ops, &seen, &info, err), 0);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_eq(seen.n, n);
    for (uint64_t i = 0; i < n; i++) {
        ck_assert_uint_eq(seen.lsn[i], want_lsn[i]);
        ck_assert_uint_eq(seen.val[i], want_val[i]);
    }
}

/* Seek marks of old segments hold only what recovery kept.  A torn tail
 * (a commit group of 600 KiB, two strides long, cut in its middle) is cut
 * at the restart before the marks are taken: scans from LSNs before the
 * cut (deep in the old segment, from a mark), at it and after it (the new
 * segment, whose records took the cut LSNs again) meet exactly the records
 * kept and written since.  Then the old segments are discarded (their
 * files become spares, written over by the next segments, which start
 * with no marks of their own) and scans stay right, and again after
 * another restart. */
START_TEST(seek_marks_of_old_segments_hold_only_what_recovery_kept)
{
    static uint64_t want_lsn[400], want_val[400];
    char err[WAL_ERRLEN], path[4096];
    struct wal_scan_info info;
    struct unit_wal_rec recs[200];
    uint64_t lsn[200], firsts[16], s_old, s_cut, nrec;
    struct wal *w = open_log(1, WAL_SYNC_FSYNC);   /* segments of 1 MiB */
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    size_t nseg = 0;
    int nr = 0;

    units_of();
    /* Records of 16 KiB (a commit group of 5 units each) until the third
     * segment or later holds 30 (600 KiB), then the tail group: one of 320
     * KiB, which leaves the segment below 1 MiB (none started after it). */
    for (;;) {
        lsn[nr] = append_len(a, (uint64_t)nr, 16u << 10);
        nr++;
        nseg = seg_firsts(firsts, 16);
        if (nseg >= 3 && lsn[nr - 1] + 1 - firsts[nseg - 1] >= 30)
            break;
        ck_assert_int_lt(nr, 200);
    }
    uint64_t big = append_len(a, 999, 320u << 10);
    ck_assert_uint_eq(big, lsn[nr - 1] + 1);
    wal_stream_close(a);
    wal_close(w);
    ck_assert_uint_eq(seg_firsts(firsts, 16), nseg);
    /* f: 27 records into the last segment, 540 KiB in: marks before it. */
    int f = (int)(firsts[nseg - 1] - lsn[0]) + 27, g = f - 40;
    ck_assert_int_ge(g, 0);
    ck_assert_uint_lt(lsn[g], firsts[nseg - 1]);   /* g: an earlier one */
    seg_path(path, sizeof(path), true);
    size_t n = unit_wal_records(path, false, recs, 200);
    ck_assert_uint_le(n, 200);
    ck_assert_uint_eq(recs[n - 1].lsn, big);
    off_t big_off = recs[n - 1].off, off_f = unit_wal_offset(path, lsn[f]);
    ck_assert_int_ge(off_f, (off_t)(512u << 10));
    /* The crash: half of the last group written. */
    ck_assert_int_eq(truncate(path, big_off + (160 << 10)), 0);

    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.n, (uint64_t)nr);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_gt(info.truncated, 0);
    ck_assert_uint_eq(info.next_lsn, big);
    ck_assert_int_eq(file_size(path), big_off);
    w = open_log(info.next_lsn, WAL_SYNC_FSYNC);
    a = wal_stream_open(w, 1, "a", (uint64_t)nr + 1);
    uint64_t nl[20];
    for (int i = 0; i < 20; i++)
        nl[i] = append_len(a, 2000 + (uint64_t)i, 16u << 10);
    ck_assert_uint_eq(nl[0], big);   /* the cut LSNs, taken again */

    /* Before the cut, deep in the old segment: from a mark there, not its
     * start. */
    wal_span_from(w, lsn[f], &s_old, &nrec);
    wal_span_from(w, big, &s_cut, &nrec);
    ck_assert_uint_gt(s_old, s_cut);
    ck_assert_uint_le(s_old - s_cut, (uint64_t)(big_off - off_f) +
                      SEEK_STRIDE + (20u << 10));
    ck_assert_uint_lt(s_old - s_cut, (uint64_t)(big_off - (256u << 10)));
    uint64_t k = 0;
    for (int i = f; i < nr; i++, k++) {
        want_lsn[k] = lsn[i];
        want_val[k] = (uint64_t)i;
    }
    uint64_t kept = k;
    for (int i = 0; i < 20; i++, k++) {
        want_lsn[k] = nl[i];
        want_val[k] = 2000 + (uint64_t)i;
    }
    rescan_expect(w, lsn[f], want_lsn, want_val, k);
    rescan_expect(w, lsn[nr - 1], want_lsn + kept - 1, want_val + kept - 1,
                  21);                                          /* the last kept */
    rescan_expect(w, big, want_lsn + kept, want_val + kept, 20);  /* the cut */
    rescan_expect(w, nl[10], want_lsn + kept + 10, want_val + kept + 10, 10);
    k = 0;
    for (int i = g; i < nr; i++, k++) {   /* and from an earlier segment */
        want_lsn[k] = lsn[i];
        want_val[k] = (uint64_t)i;
    }
    for (int i = 0; i < 20; i++, k++) {
        want_lsn[k] = nl[i];
        want_val[k] = 2000 + (uint64_t)i;
    }
    rescan_expect(w, lsn[g], want_lsn, want_val, k);

    /* The old segments discarded: their files become spares, written over
     * by the next segments (made with no marks); 120 records more, about
     * 2.4 MB, two or three segments made over spares. */
    wal_rotate(w);
    uint64_t closed = 0;
    for (int i = 0; i < 10000 && (!wal_closed_upto(w, &closed) ||
                                  closed != wal_durable_lsn(w)); i++)
        usleep(1000);
    ck_assert_uint_eq(closed, nl[19]);
    ck_assert_int_ge(wal_discard(w, closed), 4);
    struct wal_stats st;
    wal_stats(w, &st);
    ck_assert_uint_ge(st.spares, 2);
    uint64_t more[120];
    for (int i = 0; i < 120; i++)
        more[i] = append_len(a, 3000 + (uint64_t)i, 16u << 10);
    wal_stats(w, &st);
    ck_assert_uint_ge(st.segments_reused, 2);
    for (int i = 0; i < 120; i++) {
        want_lsn[i] = more[i];
        want_val[i] = 3000 + (uint64_t)i;
    }
    for (int i = 0; i < 120; i += 7)
        rescan_expect(w, more[i], want_lsn + i, want_val + i,
                      120 - (uint64_t)i);
    wal_stream_close(a);
    wal_close(w);

    /* Another restart: the segments made over spares have marks now. */
    ck_assert_int_eq(scan(&info, err), 0);
    ck_assert_uint_eq(seen.damages, 0);
    ck_assert_uint_eq(info.truncated, 0);
    ck_assert_uint_eq(info.next_lsn, more[119] + 1);
    w = open_log(info.next_lsn, WAL_SYNC_FSYNC);
    for (int i = 0; i < 120; i += 7)
        rescan_expect(w, more[i], want_lsn + i, want_val + i,
                      120 - (uint64_t)i);
    /* From 20 records into a segment made over a spare: from a mark,
     * not its start (20 records of 16 KiB are 400 KiB in). */
    nseg = seg_firsts(firsts, 16);
    size_t i = 0;
    while (i + 1 < nseg && firsts[i + 1] <= more[40])
        i++;
    ck_assert_uint_lt(i + 1, nseg);
    ck_assert_uint_lt(firsts[i] + 20, firsts[i + 1]);
    char name[64];
    snprintf(name, sizeof(name), "/wal-%016llx.log",
             (unsigned long long)firsts[i]);
    ck_assert_int_lt(snprintf(path, sizeof(path), "%s%s", tdir, name),
                     (int)sizeof(path));
    wal_span_from(w, firsts[i] + 20, &s_old, &nrec);
    wal_span_from(w, firsts[i + 1], &s_cut, &nrec);
    ck_assert_uint_lt(s_old - s_cut, (uint64_t)file_size(path) -
                                     (200u << 10));
    rescan_expect(w, firsts[i] + 20, want_lsn + (firsts[i] + 20 - more[0]),
                  want_val + (firsts[i] + 20 - more[0]),
                  more[119] - (firsts[i] + 20) + 1);
    wal_close(w);
}
END_TEST

/* A scan run from inside another scan's callback, on another thread. */
struct nested {
    struct wal *w;
    uint64_t outer, inner;   /* records met */
    bool ran;
    int rc;
};

static int count_rec(void *ctx, const struct wal_record *r)
{
    (void)r;
    (*(uint64_t *)ctx)++;
    return 0;
}

static void no_damage(void *ctx, const struct wal_damage *d)
{
    (void)ctx;
    (void)d;
}

static void *inner_scan(void *arg)
{
    struct nested *n = arg;
    static const struct wal_scan_ops o = {count_rec, no_damage, NULL};
    struct wal_scan_info info;
    char err[WAL_ERRLEN];

    n->rc = wal_rescan(n->w, &o, &n->inner, &info, err);
    return NULL;
}

static int outer_rec(void *ctx, const struct wal_record *r)
{
    struct nested *n = ctx;
    pthread_t t;

    (void)r;
    if (!n->ran) {
        n->ran = true;
        ck_assert_int_eq(pthread_create(&t, NULL, inner_scan, n), 0);
        ck_assert_int_eq(pthread_join(t, NULL), 0);
    }
    n->outer++;
    return 0;
}

/* Scans of the open log do not wait for each other: a scan started while
 * another is in its callback (a pull streaming keys, a checkpoint writing
 * records) runs to its end meanwhile. */
START_TEST(scans_of_the_open_log_run_at_once)
{
    struct wal *w = open_log(1, WAL_SYNC_NONE);
    struct wal_stream *a = wal_stream_open(w, 1, "a", 1);
    static const struct wal_scan_ops o = {outer_rec, no_damage, NULL};
    struct nested n = {.w = w};
    struct wal_scan_info info;
    char err[WAL_ERRLEN];

    for (uint64_t i = 0; i < 10; i++)
        ck_assert_int_eq(append(a, i), 0);
    ck_assert_int_eq(wal_rescan(w, &o, &n, &info, err), 0);
    ck_assert(n.ran);
    ck_assert_int_eq(n.rc, 0);
    ck_assert_uint_eq(n.inner, 10);
    ck_assert_uint_eq(n.outer, 10);
    wal_stream_close(a);
    wal_close(w);
}
END_TEST

Suite *wal_suite(void)
{
    Suite *s = suite_create("wal");
    TCase *tc = tcase_create("wal");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, append_then_scan_in_order);
    tcase_add_test(tc, commit_loop_shares_fsyncs_across_threads_and_streams);
    tcase_add_test(tc, failed_fsync_fails_exactly_the_batch);
    tcase_add_test(tc, log_without_a_segment_fails_every_batch_until_one_can_be_made);
    tcase_add_test(tc, durability_none_writes_without_fsync);
    tcase_add_test(tc, barrier_splits_a_streams_records);
    tcase_add_test(tc, torn_tail_is_cut_and_appends_continue);
    tcase_add_test(tc, damaged_payload_names_its_owner_and_the_rest_is_read);
    tcase_add_test(tc, damaged_header_loses_its_lsns_with_no_owner);
    tcase_add_test(tc, bad_record_inside_the_last_batch_counts_as_torn);
    tcase_add_test(tc, segments_rotate_discard_and_gaps_are_lost_lsns);
    tcase_add_test(tc, empty_or_missing_directory_is_an_empty_log);
    tcase_add_test(tc, a_slow_completion_does_not_hold_the_next_fsync);
    tcase_add_test(tc, segments_are_written_into_allocated_room);
    tcase_add_test(tc, a_crash_leaves_room_that_the_scan_cuts_without_calling_it_torn);
    tcase_add_test(tc, no_room_on_a_nearly_full_disk_or_without_fsync);
    tcase_add_test(tc, a_torn_write_of_any_unit_of_the_next_append_loses_no_acknowledged_record);
    tcase_add_test(tc, damage_a_later_commit_stamp_vouches_for_is_reported_not_cut);
    tcase_add_test(tc, damaged_padding_hides_no_record);
    tcase_add_test(tc, commit_groups_are_padded_to_whole_units);
    tcase_add_test(tc, write_unit_is_the_largest_block_size_and_the_setting_raises_it);
    tcase_add_test(tc, a_version_1_log_is_read_and_continued);
    tcase_add_test(tc, segments_made_over_spares_write_each_byte_about_once);
    tcase_add_test(tc, a_crash_in_a_segment_made_over_a_spare_loses_nothing_and_is_not_torn);
    tcase_add_test(tc, headers_inside_an_older_records_payload_are_not_records);
    tcase_add_test(tc, durability_none_writes_in_the_submitting_thread);
    tcase_add_test(tc, inline_and_queued_records_keep_order_and_complete_once);
    tcase_add_test(tc, an_inline_write_that_fails_fails_its_record_and_stream_only);
    tcase_add_test(tc, held_records_of_many_streams_are_written_with_one_write);
    tcase_add_test(tc, large_payloads_are_written_from_their_records_in_whole_units);
    tcase_add_test(tc, a_group_of_small_and_large_records_reads_back_in_order);
    tcase_add_test(tc, a_large_payload_whose_write_fails_is_not_read_back);
    tcase_add_test(tc, a_held_write_that_fails_fails_every_held_record);
    tcase_add_test(tc, a_commit_delay_lets_the_writers_an_answer_frees_join_the_next_group);
    tcase_add_test(tc, a_led_group_commits_the_held_records_once_after_its_sync);
    tcase_add_test(tc, a_failed_led_sync_fails_every_record_of_its_group);
    tcase_add_test(tc, a_lead_while_the_log_is_busy_hands_the_records_to_the_commit_thread);
    tcase_add_test(tc, a_later_group_completes_after_the_led_one);
    tcase_add_test(tc, a_rescan_from_an_lsn_reads_near_it_and_skips_by_header);
    tcase_add_test(tc, a_rescan_checks_the_headers_it_reads_not_those_it_passes);
    tcase_add_test(tc, scans_of_the_open_log_run_at_once);
    tcase_add_test(tc, a_rescan_after_a_restart_starts_at_an_old_segments_seek_mark);
    tcase_add_test(tc, seek_marks_of_old_segments_hold_only_what_recovery_kept);
    suite_add_tcase(s, tc);
    return s;
}
