/* Tests of the node log: framing, the commit loop (group commit across
 * threads and streams, completions), write units and padding, torn tails
 * (a torn write of every unit the next append touches), damage with and
 * without a known owner, segments, failed fsyncs and version 1 logs. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "wal.h"
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

static const struct wal_scan_ops ops = {on_rec, on_damage};

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
    suite_add_tcase(s, tc);
    return s;
}
