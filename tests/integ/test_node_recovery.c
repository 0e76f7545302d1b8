/* Integration tests of bloomgrid-node recovery: corrupt checkpoint, a
 * corrupt record in the middle of the node log (its payload, or its header),
 * torn log tail, a torn write of every unit of the log that an append in
 * flight touches, disk full, a crash test that kill -9s a node under write
 * load many times and checks that no acknowledged key is ever lost, and the
 * migration of a data directory of the previous release (a fixture).
 *
 * usage: test_node_recovery NODE_BINARY corrupt_snapshot|corrupt_wal|
 *        corrupt_log_header|torn_tail|crash|disk_full [ROUNDS]
 *        test_node_recovery NODE_BINARY migrate FIXTURE_DIR
 *        test_node_recovery NODE_BINARY torn_unit SLOW_FSYNC_LIBRARY
 */
#include <dirent.h>
#include <fcntl.h>
#include <grpc/grpc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define GS(c) GRPC_STATUS_##c

static const char *const slow_snapshots[] = {"--snapshot-interval", "3600", NULL};

static void key_of(char *buf, size_t len, unsigned t, uint64_t i)
{
    snprintf(buf, len, "k%u-%llu", t, (unsigned long long)i);
}

/* Add keys [from, from+n) of writer t in one batch. */
static int add_range(struct rpc_channel *ch, const char *filter, unsigned t,
                     uint64_t from, size_t n, const char *method, bool *out,
                     struct rpc_status *st)
{
    char **keys = malloc(n * sizeof *keys);
    char *buf = malloc(n * 32);
    for (size_t i = 0; i < n; i++) {
        keys[i] = buf + 32 * i;
        key_of(keys[i], 32, t, from + i);
    }
    int rc = t_keys(ch, method, filter, keys, n, out, st);
    free(buf);
    free(keys);
    return rc;
}

/* Check that keys [0, upto) of writer t are all present. */
static void check_present(struct rpc_channel *ch, const char *filter, unsigned t,
                          uint64_t upto)
{
    enum { B = 5000 };
    bool *out = malloc(B * sizeof *out);
    struct rpc_status st;
    for (uint64_t from = 0; from < upto; from += B) {
        size_t n = upto - from < B ? (size_t)(upto - from) : B;
        CHECK(add_range(ch, filter, t, from, n, "MayContain", out, &st) == 0,
              "MayContain: %s %s", rpc_status_name(st.code), st.message);
        for (size_t i = 0; i < n; i++)
            CHECK(out[i], "LOST acknowledged key k%u-%llu", t,
                  (unsigned long long)(from + i));
    }
    free(out);
}

/* Path of the file in dir whose name starts with prefix (the largest). */
static bool find_file(const char *dir, const char *prefix, char *out, size_t len)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    off_t best = -1;
    if (!d)
        return false;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char p[1024];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (stat(p, &sb) == 0 && sb.st_size > best) {
            best = sb.st_size;
            snprintf(out, len, "%s", p);
        }
    }
    closedir(d);
    return best >= 0;
}

static off_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

/* The write unit a node log segment names in its header (docs/STORAGE.md:
 * version 2, u32 at offset 12), 0 for one without (version 1). */
static uint32_t log_unit(const char *path)
{
    unsigned char h[32];
    int fd = open(path, O_RDONLY);

    CHECK(fd >= 0 && pread(fd, h, 32, 0) == 32, "read the header of %s", path);
    close(fd);
    if (h[8] == 1)
        return 0;
    return (uint32_t)(h[12] | h[13] << 8 | h[14] << 16 | (uint32_t)h[15] << 24);
}

/* The offset of the nth (from 0) record of filter name in the node log
 * segment at path (the record layout of docs/STORAGE.md: a 64-byte header
 * with the name length at 6 and the payload length at 8, then the name and
 * the payload; padding records have no name); -1 when there is none. */
static off_t log_record(const char *path, const char *name, int nth)
{
    int fd = open(path, O_RDONLY);
    uint32_t unit = log_unit(path);
    off_t off = unit ? unit : 32, found = -1;
    unsigned char h[64];
    char n[256];

    CHECK(fd >= 0, "open %s", path);
    while (found < 0 && pread(fd, h, 64, off) == 64) {
        uint16_t nl = (uint16_t)(h[6] | h[7] << 8);
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--)
            len = len << 8 | h[8 + i];
        if (memcmp(h, "BGWN", 4) != 0 || pread(fd, n, nl, off + 64) != nl)
            break;
        if (nl == strlen(name) && memcmp(n, name, nl) == 0 && nth-- == 0)
            found = off;
        off += 64 + nl + (off_t)len;
    }
    close(fd);
    return found;
}

static void flip_byte(const char *path, off_t at)
{
    int fd = open(path, O_RDWR);
    unsigned char c;
    CHECK(fd >= 0, "open %s", path);
    CHECK(pread(fd, &c, 1, at) == 1, "pread");
    c ^= 0x5a;
    CHECK(pwrite(fd, &c, 1, at) == 1, "pwrite");
    close(fd);
}

/* Two filters, keys in both; returns with the node stopped. */
static void prepare(struct node_proc *np, const char *dir, bool clean_stop)
{
    struct rpc_status st;
    bool out[100];
    node_start(np, dir, slow_snapshots);
    CHECK(node_wait_health(np, true, 10000), "SERVING");
    CHECK(t_create(np->ch, "a", 100000, 0.01, 0, &st) == 0, "create a");
    CHECK(t_create(np->ch, "b", 100000, 0.01, 0, &st) == 0, "create b");
    for (unsigned batch = 0; batch < 20; batch++) {
        CHECK(add_range(np->ch, "a", 0, batch * 100, 100, "Add", out, &st) == 0, "add a");
        CHECK(add_range(np->ch, "b", 0, batch * 100, 100, "Add", out, &st) == 0, "add b");
    }
    if (clean_stop)
        CHECK(node_stop(np, SIGTERM) == 0, "SIGTERM");
    else
        node_stop(np, SIGKILL);
}

static void expect_refused(struct node_proc *np, const char *what)
{
    struct rpc_status st;
    bool out[100];
    Bloomgrid__V1__FilterInfo *fi;

    /* While the store opens every call is UNAVAILABLE; wait for the end. */
    int rc = GS(UNAVAILABLE);
    for (int i = 0; i < 500 && rc == GS(UNAVAILABLE); i++) {
        rc = t_get(np->ch, "a", &fi, &st);
        if (rc == GS(UNAVAILABLE))
            usleep(20000);
    }
    CHECK(node_health(np, "") == 2, "%s: health NOT_SERVING", what);
    CHECK(rc == 0, "GetFilter of a refused filter: %s %s", rpc_status_name(st.code), st.message);
    CHECK(fi->state == BLOOMGRID__V1__FILTER_STATE__FILTER_STATE_FAILED &&
              fi->reason[0],
          "%s: state FAILED with a reason", what);
    printf("  %s: FAILED: %s\n", what, fi->reason);
    bloomgrid__v1__filter_info__free_unpacked(fi, NULL);
    CHECK(add_range(np->ch, "a", 0, 0, 10, "MayContain", out, &st) == GS(UNAVAILABLE),
          "%s: MayContain refused: %s", what, st.message);
    printf("  MayContain: UNAVAILABLE: %s\n", st.message);
    CHECK(add_range(np->ch, "a", 0, 0, 10, "Add", out, &st) == GS(UNAVAILABLE),
          "%s: Add refused", what);
    /* The other filter is unaffected. */
    check_present(np->ch, "b", 0, 2000);
}

static void test_corrupt_snapshot(const char *dir)
{
    struct node_proc np;
    char fdir[700], snap[1024];
    prepare(&np, dir, true);
    snprintf(fdir, sizeof fdir, "%s/a", dir);
    /* The base of a's checkpoint: nothing older to fall back on (a delta
     * that fails is repaired from the log while it holds the records:
     * tests/unit/storage, test_store_ckpt.c). */
    CHECK(find_file(fdir, "base-", snap, sizeof snap), "no checkpoint in %s", fdir);
    flip_byte(snap, file_size(snap) / 2);
    node_start(&np, dir, slow_snapshots);
    expect_refused(&np, "corrupt snapshot");
    CHECK(node_stop(&np, SIGTERM) == 0, "SIGTERM");
}

/* A record of filter a in the middle of the log is damaged: in its
 * payload (header: false), so the header still names a, or in its header,
 * so the scan learns whose it was from the gap in a's records.  Either way
 * a is refused and b, whose records follow in sequence, is served. */
static void corrupt_log(const char *dir, bool header, const char *what)
{
    struct node_proc np;
    char ldir[700], wal[1024];
    prepare(&np, dir, false);
    snprintf(ldir, sizeof ldir, "%s/.wal", dir);
    CHECK(find_file(ldir, "wal-", wal, sizeof wal), "no log segment in %s", ldir);
    off_t at = log_record(wal, "a", 8);
    CHECK(at > 0, "no 9th record of a in %s", wal);
    flip_byte(wal, header ? at + 40 : at + 64 + 1 + 500);
    node_start(&np, dir, slow_snapshots);
    expect_refused(&np, what);
    CHECK(node_stop(&np, SIGTERM) == 0, "SIGTERM");
}

static void test_torn_tail(const char *dir)
{
    struct node_proc np;
    char fdir[700], wal[1024];
    prepare(&np, dir, false);
    snprintf(fdir, sizeof fdir, "%s/.wal", dir);
    CHECK(find_file(fdir, "wal-", wal, sizeof wal), "no log segment in %s", fdir);
    off_t sz = file_size(wal);
    /* A record cut short: a plausible header and part of its payload. */
    int fd = open(wal, O_WRONLY | O_APPEND);
    unsigned char junk[70];
    memset(junk, 0xab, sizeof junk);
    memcpy(junk, "BGWN", 4);
    CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk, "append");
    close(fd);
    node_start(&np, dir, slow_snapshots);
    CHECK(node_wait_health(&np, true, 10000), "torn tail: SERVING");
    check_present(np.ch, "a", 0, 2000);
    check_present(np.ch, "b", 0, 2000);
    printf("  torn tail: served, %lld -> %lld bytes of log\n", (long long)(sz + 70),
           (long long)file_size(wal));
    CHECK(node_stop(&np, SIGTERM) == 0, "SIGTERM");
}

/* ---- a torn write of the log's last units ---- */

static char *read_file(const char *path, off_t *size)
{
    int fd = open(path, O_RDONLY);
    off_t n = file_size(path);
    char *buf = malloc(n > 0 ? (size_t)n : 1);

    CHECK(fd >= 0 && n >= 0 && buf, "read %s", path);
    CHECK(pread(fd, buf, (size_t)n, 0) == n, "read %s", path);
    close(fd);
    *size = n;
    return buf;
}

struct inflight {
    struct rpc_channel *ch;
    int rc;
};

/* An Add of 600 keys that the test holds in the log's fsync. */
static void *inflight_main(void *p)
{
    struct inflight *f = p;
    struct rpc_status st;
    bool *out = malloc(600 * sizeof *out);

    f->rc = add_range(f->ch, "a", 9, 0, 600, "Add", out, &st);
    free(out);
    return NULL;
}

/* A node acknowledges 20 Adds of 100 keys, then takes one more whose
 * fdatasync is held (slow_fsync.c) while the machine loses power: the
 * node is killed and each unit of the log the append touched (those that
 * differ from before it) is torn as a device that writes a unit only in
 * part may leave it: zeroed, its first sector garbled, half new and half
 * old either way.  On each such copy of the data directory the node
 * restarts serving, with every acknowledged key. */
static void test_torn_unit(const char *dir, const char *preload)
{
    static const char *const modes[] = {"zeroed", "garbled", "first half new",
                                        "second half new"};
    struct node_proc np;
    struct rpc_status st;
    char gate[800], held[820], ldir[800], wal[1024], cmd[4000];
    bool out[100];
    off_t old_size, new_size;

    snprintf(gate, sizeof gate, "%s.gate", dir);
    harness_fsync_gate(gate, "/wal-", held, sizeof held);
    harness_preload_begin(preload);
    node_start(&np, dir, slow_snapshots);
    harness_preload_end();
    CHECK(node_wait_health(&np, true, 20000), "SERVING");
    CHECK(t_create(np.ch, "a", 100000, 0.01, 0, &st) == 0, "create: %s", st.message);
    for (unsigned b = 0; b < 20; b++)
        CHECK(add_range(np.ch, "a", 0, b * 100, 100, "Add", out, &st) == 0,
              "add: %s", st.message);
    snprintf(ldir, sizeof ldir, "%s/.wal", dir);
    CHECK(find_file(ldir, "wal-", wal, sizeof wal), "no log segment in %s", ldir);
    char *before = read_file(wal, &old_size);

    /* The next append, held in its fsync; then the power goes. */
    FILE *g = fopen(gate, "w");
    CHECK(g, "create %s", gate);
    fclose(g);
    struct inflight f = {rpc_channel_create(np.addr, 0), -1};
    pthread_t th;
    pthread_create(&th, NULL, inflight_main, &f);
    for (int i = 0; i < 2000 && access(held, F_OK) != 0; i++)
        harness_sleep_ms(10);
    CHECK(access(held, F_OK) == 0, "the append never reached the log's fsync");
    node_stop(&np, SIGKILL);
    pthread_join(th, NULL);
    rpc_channel_destroy(f.ch);
    CHECK(f.rc != 0, "the held Add was acknowledged");
    unlink(gate);
    unlink(held);
    char *after = read_file(wal, &new_size);
    CHECK(new_size == old_size, "the segment changed size (%lld -> %lld)",
          (long long)old_size, (long long)new_size);

    /* The units the append touched: the node's write unit, 4 KiB at least. */
    off_t u = log_unit(wal) > 4096 ? log_unit(wal) : 4096, lo = -1, hi = -1;
    for (off_t i = 0; i < new_size; i++)
        if (before[i] != after[i]) {
            if (lo < 0)
                lo = i;
            hi = i;
        }
    CHECK(lo >= 0, "the held append wrote nothing");
    off_t first = lo / u, last = hi / u;
    printf("  the append touched units %lld..%lld of %lld bytes\n",
           (long long)first, (long long)last, (long long)u);
    char *img = malloc((size_t)u);
    int runs = 0;
    for (off_t k = first; k <= last; k++) {
        for (int m = 0; m < 4; m++) {
            char copy[900], cwal[1100];
            off_t at = k * u, half = u / 2;
            snprintf(copy, sizeof copy, "%s-torn", dir);
            snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s.log' && cp -a '%s' '%s'", copy,
                     copy, dir, copy);
            CHECK(system(cmd) == 0, "%s", cmd);
            memcpy(img, after + at, (size_t)u);
            if (m == 0)
                memset(img, 0, (size_t)u);
            else if (m == 1)
                for (int i = 0; i < 512; i++)
                    img[i] = (char)(i * 131 + 17);
            else if (m == 2)
                memcpy(img + half, before + at + half, (size_t)half);
            else
                memcpy(img, before + at, (size_t)half);
            snprintf(cwal, sizeof cwal, "%s/.wal/%s", copy, strrchr(wal, '/') + 1);
            int fd = open(cwal, O_WRONLY);
            CHECK(fd >= 0 && pwrite(fd, img, (size_t)u, at) == u, "tear %s", cwal);
            close(fd);
            node_start(&np, copy, slow_snapshots);
            CHECK(node_wait_health(&np, true, 20000), "unit %lld %s: not SERVING "
                  "(log %s)", (long long)k, modes[m], np.log);
            check_present(np.ch, "a", 0, 2000);
            CHECK(node_stop(&np, SIGTERM) == 0, "SIGTERM");
            runs++;
        }
    }
    printf("  torn units: %d restarts, every acknowledged key present\n", runs);
    snprintf(cmd, sizeof cmd, "rm -rf '%s-torn'", dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    free(img);
    free(before);
    free(after);
}

/* ---- migration ---- */

/* How many of PREFIX-from .. PREFIX-to filter lacks. */
static size_t missing_keys(struct rpc_channel *ch, const char *filter,
                           const char *prefix, size_t from, size_t to)
{
    size_t n = to - from + 1, miss = 0;
    char **k = keys_make(prefix, from, n);
    bool *present = malloc(n * sizeof *present);
    keys_present(ch, filter, k, n, present);
    for (size_t i = 0; i < n; i++)
        miss += !present[i];
    free(present);
    keys_free(k, n);
    return miss;
}

/* A data directory of the previous release (per-filter logs): the node
 * migrates it and serves every key, also after a kill -9 right after the
 * migration and a restart. */
static void test_migrate(const char *dir, const char *fixture)
{
    const char *const plain[] = {"blk", "cls", "cnt", "scl"};
    struct node_proc np;
    char cmd[2000], path[900];

    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s' '%s'", dir, fixture, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
    for (int round = 0; round < 2; round++) {
        node_start(&np, dir, slow_snapshots);
        CHECK(node_wait_health(&np, true, 10000), "migrated directory: SERVING");
        for (int i = 0; i < 4; i++)
            CHECK(missing_keys(np.ch, plain[i], plain[i], 0, 999) == 0,
                  "keys of %s lost", plain[i]);
        CHECK(missing_keys(np.ch, "late", "late", 600, 999) == 0, "keys of late lost");
        CHECK(missing_keys(np.ch, "cls", "imp", 0, 199) == 0, "imported keys lost");
        CHECK(missing_keys(np.ch, "cnt", "gone", 0, 99) >= 95, "removed keys back");
        CHECK(t_shard_count(np.ch, "shd") == 4, "the 4 shards of shd");
        snprintf(path, sizeof path, "%s/blk/wal-0000000000000002.log", dir);
        CHECK(access(path, F_OK) != 0, "old log segment %s still there", path);
        if (round == 0) {
            char **k = keys_make("after", 0, 100);
            keys_call(np.ch, "Add", "blk", k, 100, 100, NULL);
            keys_free(k, 100);
            node_stop(&np, SIGKILL);
        }
    }
    CHECK(missing_keys(np.ch, "blk", "after", 0, 99) == 0, "keys added after the "
          "migration lost");
    printf("  migrated: every key of the fixture present, also after kill -9\n");
    CHECK(node_stop(&np, SIGTERM) == 0, "SIGTERM");
}

/* ---- disk full ---- */

static char mounted[700];
static pid_t disk_node_pid;

/* On any exit (a failed CHECK too): stop the node, unmount the tmpfs. */
static void disk_cleanup(void)
{
    char cmd[800];
    if (disk_node_pid > 0) {
        kill(disk_node_pid, SIGKILL);
        disk_node_pid = 0;
    }
    if (mounted[0]) {
        usleep(100000);
        snprintf(cmd, sizeof cmd, "umount -l %s", mounted);
        if (system(cmd) != 0)
            fprintf(stderr, "could not unmount %s\n", mounted);
        mounted[0] = 0;
    }
}

/* Fill the file system holding path until a write fails. */
static void fill_disk(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    static char block[4096];
    CHECK(fd >= 0, "create %s", path);
    memset(block, 0x5a, sizeof block);
    while (write(fd, block, sizeof block) > 0)
        ;
    fsync(fd);
    close(fd);
}

/* A refusal of a full disk: UNAVAILABLE, saying so. */
static void expect_no_space(int rc, const struct rpc_status *st, const char *what)
{
    CHECK(rc == GS(UNAVAILABLE), "disk full: %s: %s %s", what, rpc_status_name(rc),
          st->message);
    CHECK(strcasestr(st->message, "no space left on device") != NULL,
          "disk full: %s: the message does not say \"no space left on device\": %s",
          what, st->message);
}

/* A write that cannot reach the disk is not acknowledged, and its refusal
 * says "no space left on device"; for as long as the disk stays full (the
 * store tries the log again every second) adds are refused so and the
 * acknowledged keys keep reading "maybe", from the bits in memory; once
 * space returns writes work again, and every acknowledged key survives a
 * kill -9. */
static int test_disk_full(const char *base)
{
    char mnt[700], dir[800], filler[800], cmd[1600];
    struct rpc_status st;
    bool out[1000];
    snprintf(mnt, sizeof mnt, "%s/mnt", base);
    mkdir(mnt, 0755);
    snprintf(cmd, sizeof cmd, "mount -t tmpfs -o size=3m tmpfs %s 2>/dev/null", mnt);
    if (geteuid() != 0 || system(cmd) != 0) {
        printf("  disk_full: skipped (cannot mount a small tmpfs)\n");
        return 77;
    }
    snprintf(mounted, sizeof mounted, "%s", mnt);
    atexit(disk_cleanup);
    snprintf(dir, sizeof dir, "%s/data", mnt);
    snprintf(filler, sizeof filler, "%s/filler", mnt);
    struct node_proc np;
    node_start(&np, dir, slow_snapshots);
    disk_node_pid = np.pid;
    CHECK(node_wait_health(&np, true, 10000), "SERVING");
    CHECK(t_create(np.ch, "full", 100000, 0.01, 0, &st) == 0, "create: %s", st.message);
    CHECK(add_range(np.ch, "full", 0, 0, 1000, "Add", out, &st) == 0, "add");

    fill_disk(filler);
    /* Writer 1 adds until the log cannot grow: keys [0, acked1) are
     * acknowledged. */
    uint64_t acked1 = 0;
    int rc = 0;
    for (int i = 1; i < 50; i++) {
        rc = add_range(np.ch, "full", 1, acked1, 1000, "Add", out, &st);
        if (rc != 0)
            break;
        acked1 += 1000;
    }
    expect_no_space(rc, &st, "the Add that met the full disk");
    printf("  disk full after %llu more keys: Add UNAVAILABLE: %s\n",
           (unsigned long long)acked1, st.message);
    CHECK(node_wait_health(&np, false, 5000), "disk full: NOT_SERVING");

    /* Three seconds of a full disk: the store's retries find the log still
     * unwritable and leave the filter as it is. */
    char **k0 = keys_make("k0", 0, 1000);
    bool sout[1000];
    for (int round = 0; round < 30; round++) {
        check_present(np.ch, "full", 0, 1000);
        check_present(np.ch, "full", 1, acked1);
        CHECK(t_stream_keys(np.ch, "MayContainStream", "full", k0, 100, 10, sout, &st)
                  == 0, "disk full: MayContainStream: %s %s", rpc_status_name(st.code),
              st.message);
        for (int i = 0; i < 1000; i++)
            CHECK(sout[i], "LOST acknowledged key k0-%d (MayContainStream)", i);
        rc = add_range(np.ch, "full", 2, (uint64_t)round * 10, 10, "Add", out, &st);
        expect_no_space(rc, &st, "a later Add");
        harness_sleep_ms(100);
    }
    keys_free(k0, 1000);
    printf("  disk full for 3 s: every Add refused so, every acknowledged key read "
           "\"maybe\" (last refusal: %s)\n", st.message);

    unlink(filler);
    /* The store reloads the filter by itself once the log can be written. */
    rc = -1;
    for (int i = 0; i < 300 && rc != 0; i++) {
        rc = add_range(np.ch, "full", 0, 1000, 1000, "Add", out, &st);
        if (rc != 0)
            usleep(50000);
    }
    CHECK(rc == 0, "after space returns: Add works again: %s", st.message);
    CHECK(node_wait_health(&np, true, 10000), "SERVING again");
    CHECK(add_range(np.ch, "full", 1, acked1, 1000, "Add", out, &st) == 0,
          "add after space returned: %s", st.message);
    acked1 += 1000;
    check_present(np.ch, "full", 0, 2000);
    check_present(np.ch, "full", 1, acked1);
    printf("  space back: recovered, SERVING, acknowledged keys present\n");

    /* Nothing acknowledged was only in memory. */
    node_stop(&np, SIGKILL);
    node_start(&np, dir, slow_snapshots);
    disk_node_pid = np.pid;
    CHECK(node_wait_health(&np, true, 10000), "SERVING after kill -9");
    check_present(np.ch, "full", 0, 2000);
    check_present(np.ch, "full", 1, acked1);
    printf("  after kill -9: every acknowledged key present\n");
    disk_node_pid = 0;
    CHECK(node_stop(&np, SIGTERM) == 0, "SIGTERM");
    disk_cleanup();
    return 0;
}

/* ---- crash test ---- */

#define WRITERS 4
#define BATCH 200

struct writer {
    unsigned id;
    struct rpc_channel *ch;
    _Atomic uint64_t acked;     /* keys [0, acked) acknowledged */
    atomic_bool *stop;
    pthread_t thr;
};

static void *writer_main(void *p)
{
    struct writer *w = p;
    bool out[BATCH];
    struct rpc_status st;
    while (!atomic_load(w->stop)) {
        uint64_t from = atomic_load(&w->acked);
        if (add_range(w->ch, "crash", w->id, from, BATCH, "Add", out, &st) != 0)
            break; /* node gone: this batch is not acknowledged */
        atomic_store(&w->acked, from + BATCH);
    }
    return NULL;
}

static void test_crash(const char *dir, int rounds)
{
    struct node_proc np;
    struct writer w[WRITERS];
    struct rpc_status st;
    const char *const flags[] = {"--snapshot-interval", "1", "--snapshot-wal-mb", "1",
                                 NULL};
    memset(w, 0, sizeof w);
    srand((unsigned)time(NULL));
    uint64_t total_checked = 0;
    int refused_during_recovery = 0, not_serving_seen = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    for (int round = 0; round <= rounds; round++) {
        node_start(&np, dir, flags);
        bool early = round > 0 && round < rounds && round % 7 == 3;
        if (early) {
            /* Kill during recovery / before any write. */
            struct timespec ts = {0, (long)(rand() % 20) * 1000000};
            nanosleep(&ts, NULL);
            node_stop(&np, SIGKILL);
            continue;
        }
        /* Straight after start the node may still be recovering: it must
         * then refuse (UNAVAILABLE), never answer "absent". */
        if (round > 0 && atomic_load(&w[0].acked) > 0) {
            uint64_t n = atomic_load(&w[0].acked);
            size_t q = n < 2000 ? (size_t)n : 2000;
            bool *early_out = malloc(q * sizeof *early_out);
            int hc = node_health(&np, "");
            int qc = add_range(np.ch, "crash", 0, 0, q, "MayContain", early_out, &st);
            if (qc == 0) {
                for (size_t i = 0; i < q; i++)
                    CHECK(early_out[i], "round %d: key k0-%zu absent during start-up",
                          round, i);
            } else {
                CHECK(qc == GS(UNAVAILABLE), "round %d: start-up query: %s %s", round,
                      rpc_status_name(qc), st.message);
                refused_during_recovery++;
            }
            if (hc == 2)
                not_serving_seen++;
            free(early_out);
        }
        CHECK(node_wait_health(&np, true, 30000), "round %d: never SERVING (log %s)",
              round, np.log);
        if (round == 0)
            CHECK(t_create(np.ch, "crash", 4000000, 0.01, 0, &st) == 0, "create: %s",
                  st.message);
        /* Every key acknowledged before any earlier kill must be here. */
        for (unsigned t = 0; t < WRITERS; t++) {
            check_present(np.ch, "crash", t, atomic_load(&w[t].acked));
            total_checked += atomic_load(&w[t].acked);
        }
        if (round == rounds)
            break;
        atomic_bool stop = false;
        for (unsigned t = 0; t < WRITERS; t++) {
            w[t].id = t;
            w[t].ch = np.ch;
            w[t].stop = &stop;
            pthread_create(&w[t].thr, NULL, writer_main, &w[t]);
        }
        struct timespec ts = {0, (long)(30 + rand() % 1200) * 1000000};
        nanosleep(&ts, NULL);
        kill(np.pid, SIGKILL);
        atomic_store(&stop, true);
        for (unsigned t = 0; t < WRITERS; t++)
            pthread_join(w[t].thr, NULL);
        node_stop(&np, SIGKILL);
    }
    CHECK(node_stop(&np, SIGTERM) == 0, "final SIGTERM");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    uint64_t acked = 0;
    for (unsigned t = 0; t < WRITERS; t++)
        acked += atomic_load(&w[t].acked);
    printf("  %d kill -9 rounds, %llu acknowledged keys, %llu key checks, 0 lost "
           "(%.1f s)\n", rounds, (unsigned long long)acked,
           (unsigned long long)total_checked,
           (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    printf("  start-up: health NOT_SERVING seen in %d rounds, queries refused "
           "(UNAVAILABLE) in %d rounds, never a wrong answer\n", not_serving_seen,
           refused_during_recovery);
    CHECK(not_serving_seen > 0, "health never said NOT_SERVING while recovering");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s NODE_BINARY corrupt_snapshot|corrupt_wal|"
                        "torn_tail|crash [ROUNDS] | torn_unit SLOW_FSYNC_LIBRARY | "
                        "migrate FIXTURE_DIR\n", argv[0]);
        return 2;
    }
    harness_node_bin = argv[1];
    signal(SIGPIPE, SIG_IGN);
    grpc_init();
    char dir[512];
    harness_tmpdir(dir, sizeof dir, argv[2]);
    strncat(dir, "/data", sizeof dir - strlen(dir) - 1);
    if (strcmp(argv[2], "corrupt_snapshot") == 0)
        test_corrupt_snapshot(dir);
    else if (strcmp(argv[2], "corrupt_wal") == 0)
        corrupt_log(dir, false, "corrupt log record");
    else if (strcmp(argv[2], "corrupt_log_header") == 0)
        corrupt_log(dir, true, "corrupt log record header");
    else if (strcmp(argv[2], "torn_tail") == 0)
        test_torn_tail(dir);
    else if (strcmp(argv[2], "crash") == 0)
        test_crash(dir, argc > 3 ? atoi(argv[3]) : 24);
    else if (strcmp(argv[2], "migrate") == 0 && argc > 3)
        test_migrate(dir, argv[3]);
    else if (strcmp(argv[2], "torn_unit") == 0 && argc > 3)
        test_torn_unit(dir, argv[3]);
    else if (strcmp(argv[2], "disk_full") == 0) {
        dir[strlen(dir) - 5] = 0; /* the test mounts its own file system */
        if (test_disk_full(dir) == 77) {
            grpc_shutdown();
            return 77;
        }
    }
    else
        CHECK(0, "unknown test %s", argv[2]);
    grpc_shutdown();
    printf("%s: ok\n", argv[2]);
    return 0;
}
