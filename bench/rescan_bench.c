/* rescan_bench: what a scan of the open node log costs when it wants one
 * stream's records among many, as a checkpoint of one shard among a
 * filter's 64 does (wal_rescan_from with a skip): the log holds RECORDS
 * one-key add records (16-byte payloads, names "slugs.shard-<i>") of
 * STREAMS streams in turn, written with durability none; the same scan,
 * from the log's first LSN, runs REPEAT times.  Prints each scan's CPU
 * time and the median, per record of the log.  No figure is checked.
 *
 * usage: rescan_bench DIR [RECORDS (600000)] [STREAMS (64)] [REPEAT (7)]
 * DIR: a new directory (left in place: remove it after).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wal.h"

static double cpu_s(void)
{
    struct timespec t;

    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int on_record(void *ctx, const struct wal_record *r)
{
    (void)r;
    (*(unsigned long *)ctx)++;
    return 0;
}

static void on_damage(void *ctx, const struct wal_damage *d)
{
    (void)ctx;
    fprintf(stderr, "rescan_bench: damage: %s\n", d->where);
}

static bool skip_others(void *ctx, const struct wal_record *h)
{
    (void)ctx;
    return h->id != 7;
}

static const struct wal_scan_ops ops = {on_record, on_damage, skip_others};

static void done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    (void)ctx, (void)seq, (void)lsn;
    if (rc < 0)
        fprintf(stderr, "rescan_bench: a record failed: %d\n", rc);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    char err[WAL_ERRLEN], name[32];
    unsigned long records = argc > 2 ? strtoul(argv[2], NULL, 10) : 600000;
    int streams = argc > 3 ? atoi(argv[3]) : 64, repeat = argc > 4 ? atoi(argv[4]) : 7;
    struct wal_stream *st[256];
    double v[64];

    if (argc < 2 || streams < 8 || streams > 256 || repeat < 1 || repeat > 64 || !records) {
        fprintf(stderr, "usage: rescan_bench DIR [RECORDS] [STREAMS (8..256)] [REPEAT (1..64)]\n");
        return 2;
    }
    struct wal *w = wal_open(argv[1], 1, WAL_SYNC_NONE, UINT64_C(64) << 20, 0, err);
    if (!w) {
        fprintf(stderr, "rescan_bench: %s\n", err);
        return 1;
    }
    for (int i = 0; i < streams; i++) {
        snprintf(name, sizeof name, "slugs.shard-%d", i);
        if (!(st[i] = wal_stream_open(w, (uint64_t)i, name, 1)))
            return 1;
    }
    for (unsigned long k = 0; k < records; k++) {
        uint8_t p[16];
        memcpy(p, &k, 8);
        memcpy(p + 8, &k, 8);
        struct wal_rec *r = wal_rec_new(WAL_REC_ADD, p, sizeof p);
        if (!r)
            return 1;
        wal_submit(st[k % (unsigned long)streams], r, done, NULL);
    }
    struct wal_waiter wt;
    wal_waiter_init(&wt);
    wal_barrier(st[0], wal_waiter_done, &wt);
    if (wal_waiter_wait(&wt) < 0)
        return 1;
    printf("a log of %lu one-key records of %d streams (%llu bytes); scans for one "
           "stream's\n", records, streams, (unsigned long long)wal_file_bytes(w));
    for (int i = 0; i < repeat; i++) {
        unsigned long n = 0;
        struct wal_scan_info info;
        double c0 = cpu_s();
        if (wal_rescan_from(w, 1, &ops, &n, &info, err) < 0) {
            fprintf(stderr, "rescan_bench: %s\n", err);
            return 1;
        }
        v[i] = cpu_s() - c0;
        printf("scan %d: %lu records met, %.1f ms CPU, %.1f ns a record of the log\n", i + 1,
               n, v[i] * 1e3, v[i] * 1e9 / (double)records);
    }
    qsort(v, (size_t)repeat, sizeof *v, cmp_double);
    double med = repeat % 2 ? v[repeat / 2] : (v[repeat / 2 - 1] + v[repeat / 2]) / 2;
    printf("median %.1f ms, %.1f ns a record of the log\n", med * 1e3,
           med * 1e9 / (double)records);
    for (int i = 0; i < streams; i++)
        wal_stream_close(st[i]);
    wal_close(w);
    return 0;
}
