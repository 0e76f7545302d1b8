/* Unit tests of the filter file format: round trips of every kind, memory
 * and file forms agree, every kind of corruption is refused by the check
 * that should catch it, and saving is atomic. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"

static const uint8_t test_secret[BF_SECRET_LEN] = {
    9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static const enum bf_kind all_kinds[] = {BF_KIND_BLOCKED, BF_KIND_CLASSIC,
                                         BF_KIND_COUNTING, BF_KIND_SCALABLE};

/* ---- helpers -------------------------------------------------------------- */

static size_t key_of(char *buf, uint64_t i)
{
    return (size_t)snprintf(buf, 32, "key-%llu", (unsigned long long)i);
}

/* A filter with keys in it; the scalable one is overfilled so it has
 * several layers, the counting one gets each key twice (counters of 2). */
static struct bf *make_filled(enum bf_kind kind, uint32_t shard_index,
                              uint32_t shard_count)
{
    struct bf_params p = {.kind = kind, .capacity = 500, .error_rate = 0.01,
                          .shard_index = shard_index, .shard_count = shard_count,
                          .secret = test_secret};
    char err[BF_ERRLEN] = "", key[32];
    struct bf *f;

    if (kind == BF_KIND_SCALABLE)
        p.capacity = 100;
    f = bf_create(&p, err);
    ck_assert_msg(f != NULL, "bf_create: %s", err);
    for (uint64_t i = 0; i < 1000; i++) {
        size_t len = key_of(key, i);
        bf_add(f, key, len);
        if (kind == BF_KIND_COUNTING)
            bf_add(f, key, len);
    }
    if (kind == BF_KIND_SCALABLE)
        ck_assert_uint_gt(bf_layer_count(f), 2);
    return f;
}

struct membuf {
    uint8_t *data;
    size_t len, cap;
    size_t fail_after;   /* writer fails once this many bytes were taken */
    bool slow;           /* pause before copying, to widen races */
};

static int mem_write(void *ctx, const void *buf, size_t len)
{
    struct membuf *m = ctx;

    if (m->fail_after && m->len + len > m->fail_after)
        return -EIO;
    if (m->slow)
        usleep(300);
    if (m->len + len > m->cap) {
        m->cap = (m->len + len) * 2;
        m->data = realloc(m->data, m->cap);
        ck_assert_ptr_nonnull(m->data);
    }
    memcpy(m->data + m->len, buf, len);
    m->len += len;
    return 0;
}

static struct membuf serialize(const struct bf *f)
{
    struct membuf m = {0};

    ck_assert_int_eq(bf_file_write(f, mem_write, &m), 0);
    ck_assert_uint_eq(m.len, bf_file_size(f));
    return m;
}

/* A fresh directory for this test. */
static char *make_tmpdir(void)
{
    const char *base = getenv("BLOOMGRID_TEST_TMP");
    char *path;

    if (!base || !*base)
        base = "/tmp";
    mkdir(base, 0755);
    ck_assert_int_gt(asprintf(&path, "%s/bf_file.XXXXXX", base), 0);
    ck_assert_ptr_nonnull(mkdtemp(path));
    return path;
}

static char *path_in(const char *dir, const char *name)
{
    char *p;

    ck_assert_int_gt(asprintf(&p, "%s/%s", dir, name), 0);
    return p;
}

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *fp = fopen(path, "wb");

    ck_assert_ptr_nonnull(fp);
    ck_assert_uint_eq(fwrite(buf, 1, len, fp), len);
    ck_assert_int_eq(fclose(fp), 0);
}

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    struct stat st;
    uint8_t *buf;

    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fstat(fileno(fp), &st), 0);
    *len = (size_t)st.st_size;
    buf = malloc(*len + 1);
    ck_assert_uint_eq(fread(buf, 1, *len, fp), *len);
    fclose(fp);
    return buf;
}

/* Entries of dir whose name contains ".tmp.". */
static int count_temp_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;

    ck_assert_ptr_nonnull(d);
    while ((e = readdir(d)))
        if (strstr(e->d_name, ".tmp."))
            n++;
    closedir(d);
    return n;
}

static void rm_tree(const char *dir)
{
    char *cmd;

    ck_assert_int_gt(asprintf(&cmd, "rm -rf '%s'", dir), 0);
    (void)system(cmd);
    free(cmd);
}

/* Every observable part of two filters is the same. */
static void assert_same_filter(const struct bf *a, const struct bf *b)
{
    char ida[17], idb[17];

    ck_assert_int_eq(bf_kind(a), bf_kind(b));
    ck_assert_uint_eq(bf_capacity(a), bf_capacity(b));
    ck_assert(bf_error_rate(a) == bf_error_rate(b));
    ck_assert_uint_eq(bf_shard_index(a), bf_shard_index(b));
    ck_assert_uint_eq(bf_shard_count(a), bf_shard_count(b));
    ck_assert(bf_growth(a) == bf_growth(b));
    ck_assert(bf_tightening(a) == bf_tightening(b));
    ck_assert_uint_eq(bf_insert_count(a), bf_insert_count(b));
    ck_assert_uint_eq(bf_keys_added(a), bf_keys_added(b));
    ck_assert_mem_eq(bf_secret(a), bf_secret(b), BF_SECRET_LEN);
    ck_assert_ptr_null(bf_mismatch(a, b));
    bf_fingerprint_id(a, ida);
    bf_fingerprint_id(b, idb);
    ck_assert_str_eq(ida, idb);
    ck_assert_uint_eq(bf_layer_count(a), bf_layer_count(b));
    for (uint32_t i = 0; i < bf_layer_count(a); i++) {
        struct bf_layer_info la, lb;
        ck_assert_int_eq(bf_layer_info(a, i, &la), 0);
        ck_assert_int_eq(bf_layer_info(b, i, &lb), 0);
        ck_assert_uint_eq(la.capacity, lb.capacity);
        ck_assert(la.error_rate == lb.error_rate);
        ck_assert_uint_eq(la.m, lb.m);
        ck_assert_uint_eq(la.k, lb.k);
        ck_assert_uint_eq(la.count, lb.count);
        ck_assert_uint_eq(la.body_bytes, lb.body_bytes);
        ck_assert_int_eq(memcmp(bf_layer_body_const(a, i),
                                bf_layer_body_const(b, i), la.body_bytes), 0);
    }
}

/* Parse must refuse buf, with a message containing want. */
static void assert_refused(const uint8_t *buf, size_t len, const char *want,
                           const char *what)
{
    char err[BF_ERRLEN] = "";
    struct bf *f = bf_file_parse(buf, len, err);

    ck_assert_msg(f == NULL, "%s: accepted", what);
    ck_assert_msg(strstr(err, want) != NULL, "%s: wanted \"%s\", got \"%s\"",
                  what, want, err);
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static void putf64(uint8_t *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    put64(p, v);
}

/* Recompute the trailing checksum so that only the edited field is wrong. */
static void fix_checksum(uint8_t *buf, size_t len)
{
    put64(buf + len - 8, XXH64(buf, len - 8, 0));
}

/* ---- round trips ---------------------------------------------------------- */

START_TEST(round_trip_every_kind)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "f.bf");
    enum bf_kind kind = all_kinds[_i];
    struct bf *f = make_filled(kind, 0, 1), *g;
    char err[BF_ERRLEN] = "", key[32];
    int code = 1;

    ck_assert_msg(bf_file_save(f, path, err) == 0, "save: %s", err);
    g = bf_file_load(path, err, &code);
    ck_assert_msg(g != NULL, "load: %s", err);
    ck_assert_int_eq(code, 0);
    assert_same_filter(f, g);
    for (uint64_t i = 0; i < 1000; i++) {
        size_t len = key_of(key, i);
        ck_assert(bf_may_contain(g, key, len));
    }
    /* The loaded filter is a working one: new keys still go in. */
    ck_assert(bf_add(g, "fresh key", 9) || bf_may_contain(g, "fresh key", 9));
    if (kind == BF_KIND_COUNTING)
        ck_assert_int_eq(bf_remove(g, "key-1", 5), 0);
    bf_destroy(f);
    bf_destroy(g);
    rm_tree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(round_trip_keeps_shard_fields)
{
    struct bf *f = make_filled(BF_KIND_BLOCKED, 3, 7), *g;
    struct membuf m = serialize(f);
    char err[BF_ERRLEN] = "";

    g = bf_file_parse(m.data, m.len, err);
    ck_assert_msg(g != NULL, "parse: %s", err);
    ck_assert_uint_eq(bf_shard_index(g), 3);
    ck_assert_uint_eq(bf_shard_count(g), 7);
    assert_same_filter(f, g);
    bf_destroy(f);
    bf_destroy(g);
    free(m.data);
}
END_TEST

START_TEST(memory_form_equals_file_form)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "f.bf");
    struct bf *f = make_filled(all_kinds[_i], 0, 1), *g;
    struct membuf m = serialize(f);
    char err[BF_ERRLEN] = "";
    size_t flen;
    uint8_t *fbytes;

    ck_assert_msg(bf_file_save(f, path, err) == 0, "save: %s", err);
    fbytes = read_file(path, &flen);
    ck_assert_uint_eq(flen, m.len);
    ck_assert_int_eq(memcmp(fbytes, m.data, flen), 0);
    ck_assert_mem_eq(fbytes, BF_FILE_MAGIC, 8);
    g = bf_file_parse(m.data, m.len, err);
    ck_assert_msg(g != NULL, "parse: %s", err);
    assert_same_filter(f, g);
    bf_destroy(f);
    bf_destroy(g);
    free(fbytes);
    free(m.data);
    rm_tree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(writer_error_stops_serializing)
{
    struct bf *f = make_filled(BF_KIND_SCALABLE, 0, 1);
    struct membuf m = {.fail_after = BF_FILE_HEADER_BYTES + 10};

    ck_assert_int_eq(bf_file_write(f, mem_write, &m), -EIO);
    ck_assert_uint_le(m.len, BF_FILE_HEADER_BYTES + 10);
    bf_destroy(f);
    free(m.data);
}
END_TEST

struct adder {
    struct bf *f;
    volatile int stop;
};

static void *adder_run(void *arg)
{
    struct adder *a = arg;
    char key[32];

    for (uint64_t i = 1000000; !a->stop; i++) {
        size_t len = key_of(key, i);
        bf_add(a->f, key, len);
    }
    return NULL;
}

/* Serializing while another thread adds (and a scalable filter grows new
 * layers) still yields files that verify, holding every key added before
 * the write began. */
START_TEST(write_during_adds_verifies)
{
    enum bf_kind kind = all_kinds[_i];
    struct bf_params p = {.kind = kind, .error_rate = 0.01,
                          .capacity = kind == BF_KIND_SCALABLE ? 2000 : 200000};
    char err[BF_ERRLEN] = "", key[32];
    struct bf *f = bf_create(&p, err);
    struct adder a = {.f = f};
    pthread_t t;

    ck_assert_msg(f != NULL, "%s", err);
    for (uint64_t i = 0; i < 1000; i++) {
        size_t len = key_of(key, i);
        bf_add(f, key, len);
    }
    ck_assert_int_eq(pthread_create(&t, NULL, adder_run, &a), 0);
    for (int round = 0; round < 50; round++) {
        struct membuf m = {.slow = true};
        ck_assert_int_eq(bf_file_write(f, mem_write, &m), 0);
        struct bf *g = bf_file_parse(m.data, m.len, err);
        ck_assert_msg(g != NULL, "round %d: %s", round, err);
        for (uint64_t i = 0; i < 1000; i += 7) {
            size_t len = key_of(key, i);
            ck_assert(bf_may_contain(g, key, len));
        }
        bf_destroy(g);
        free(m.data);
    }
    a.stop = 1;
    pthread_join(t, NULL);
    bf_destroy(f);
}
END_TEST

/* ---- corruption ----------------------------------------------------------- */

/* Saved files are sparse: an empty filter of 64 MiB takes a few blocks of
 * disk, reads back whole, and a filter with keys keeps them. */
START_TEST(save_leaves_zero_blocks_as_holes)
{
    char dir[] = "/tmp/bf_file_sparse_XXXXXX", path[128], err[BF_ERRLEN];
    struct bf_params p = {.kind = BF_KIND_BLOCKED, .capacity = 50000000,
                          .error_rate = 0.01, .secret = test_secret};
    struct stat st;

    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/f.bf", dir);
    struct bf *f = bf_create(&p, err);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(bf_file_save(f, path, err), 0);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq((uint64_t)st.st_size, bf_file_size(f));
    ck_assert_uint_gt((uint64_t)st.st_size, 50u << 20);
    ck_assert_uint_lt((uint64_t)st.st_blocks * 512, 1u << 20);
    struct bf *g = bf_file_load(path, err, NULL);
    ck_assert_msg(g != NULL, "%s", err);
    bf_destroy(g);
    char key[32];
    for (uint64_t i = 0; i < 1000; i++)
        bf_add(f, key, key_of(key, i));
    ck_assert_int_eq(bf_file_save(f, path, err), 0);
    g = bf_file_load(path, err, NULL);
    ck_assert_msg(g != NULL, "%s", err);
    for (uint64_t i = 0; i < 1000; i++)
        ck_assert(bf_may_contain(g, key, key_of(key, i)));
    bf_destroy(g);
    bf_destroy(f);
    unlink(path);
    rmdir(dir);
}
END_TEST


/* bf_merge_file merges a file held in memory a piece (1 MiB) at a time,
 * exactly as bf_merge_from merges the filter parsed from it: bits (counters
 * added), appended layers, counts, for every kind, with layers of several
 * pieces.  A file of another secret: -EINVAL naming it, nothing changed.
 * A damaged file merged without being verified first fails, and the
 * layers it would have appended are not kept. */
static struct bf *merge_target(enum bf_kind kind, const uint8_t *secret)
{
    struct bf_params p = {.kind = kind, .capacity = 1500000, .error_rate = 0.01,
                          .shard_count = 1, .secret = secret};
    char err[BF_ERRLEN] = "", key[32];

    if (kind == BF_KIND_SCALABLE)
        p.capacity = 2000;
    struct bf *f = bf_create(&p, err);
    ck_assert_msg(f != NULL, "bf_create: %s", err);
    for (uint64_t i = 0; i < 1500; i++)
        bf_add(f, key, key_of(key, 3 * i));
    return f;
}

START_TEST(merge_file_merges_as_merge_from)
{
    enum bf_kind kind = all_kinds[_i];
    struct bf *a = merge_target(kind, test_secret), *b = merge_target(kind, test_secret);
    struct bf *src = merge_target(kind, test_secret);
    char err[BF_ERRLEN] = "", key[32];
    const char *field = "unset";

    for (uint64_t i = 0; i < 20000; i++) {
        size_t len = key_of(key, 2 * i);
        bf_add(src, key, len);
        if (kind == BF_KIND_COUNTING)
            bf_add(src, key, len);
    }
    if (kind == BF_KIND_SCALABLE)
        ck_assert_uint_gt(bf_layer_count(src), bf_layer_count(a));
    else {
        struct bf_layer_info li;
        ck_assert_int_eq(bf_layer_info(src, 0, &li), 0);
        ck_assert_uint_gt(li.body_bytes, 1u << 20);   /* several pieces */
    }
    struct membuf m = serialize(src);
    ck_assert_int_eq(bf_merge_from(a, src, err), 0);
    ck_assert_int_eq(bf_merge_file(b, m.data, m.len, &field, err), 0);
    ck_assert_ptr_null(field);
    assert_same_filter(a, b);
    /* Again: the inserts add up; the bits are the same (OR), the counters
     * of a counting filter add again, as a second bf_merge_from does. */
    uint64_t ins = bf_insert_count(b);
    ck_assert_int_eq(bf_merge_file(b, m.data, m.len, NULL, err), 0);
    ck_assert_int_eq(bf_merge_from(a, src, err), 0);
    ck_assert_uint_eq(bf_insert_count(b), ins + bf_insert_count(src));
    assert_same_filter(a, b);

    /* Another secret: refused before anything changes. */
    uint8_t other[BF_SECRET_LEN] = {1, 2, 3};
    struct bf *c = merge_target(kind, test_secret), *o = merge_target(kind, other);
    struct membuf before = serialize(c), mo = serialize(o);
    ck_assert_int_eq(bf_merge_file(c, mo.data, mo.len, &field, err), -EINVAL);
    ck_assert_str_eq(field, "secret");
    ck_assert_ptr_nonnull(strstr(err, "secret"));
    struct membuf after = serialize(c);
    ck_assert_uint_eq(before.len, after.len);
    ck_assert_int_eq(memcmp(before.data, after.data, before.len), 0);

    /* A damaged byte in the last body: the check finds it; merged without
     * it, the merge fails at the end and appends no layer. */
    m.data[m.len - 16] ^= 0x10;
    ck_assert_int_lt(bf_file_scan_mem(m.data, m.len, NULL, NULL, NULL, err), 0);
    uint32_t layers = bf_layer_count(c);
    ck_assert_int_lt(bf_merge_file(c, m.data, m.len, &field, err), 0);
    ck_assert_ptr_null(field);
    ck_assert_uint_eq(bf_layer_count(c), layers);

    free(m.data);
    free(mo.data);
    free(before.data);
    free(after.data);
    bf_destroy(a);
    bf_destroy(b);
    bf_destroy(c);
    bf_destroy(o);
    bf_destroy(src);
}
END_TEST

START_TEST(truncated_file_refused)
{
    struct bf *f = make_filled(all_kinds[_i], 0, 1);
    struct membuf m = serialize(f);
    uint32_t nl = bf_layer_count(f);
    size_t desc_end = BF_FILE_HEADER_BYTES + nl * BF_FILE_LAYER_BYTES;
    size_t cuts[] = {0, 1, 7, 8, 12, 64, 127, 128, 129, desc_end - 1, desc_end,
                     desc_end + 1, desc_end + 64, (desc_end + m.len) / 2,
                     m.len - 9, m.len - 8, m.len - 1};

    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char what[64];
        snprintf(what, sizeof what, "cut at %zu of %zu", cuts[i], m.len);
        assert_refused(m.data, cuts[i], "truncated", what);
    }
    bf_destroy(f);
    free(m.data);
}
END_TEST

START_TEST(truncated_file_on_disk_refused)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "cut.bf");
    struct bf *f = make_filled(BF_KIND_BLOCKED, 0, 1);
    struct membuf m = serialize(f);
    char err[BF_ERRLEN] = "";
    int code = 0;

    write_file(path, m.data, m.len - 100);
    ck_assert_ptr_null(bf_file_load(path, err, &code));
    ck_assert_int_eq(code, -EBADMSG);
    ck_assert_msg(strstr(err, "truncated"), "got \"%s\"", err);
    bf_destroy(f);
    free(m.data);
    rm_tree(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(trailing_bytes_refused)
{
    struct bf *f = make_filled(BF_KIND_CLASSIC, 0, 1);
    struct membuf m = serialize(f);

    mem_write(&m, "x", 1);
    assert_refused(m.data, m.len, "bad size", "one trailing byte");
    bf_destroy(f);
    free(m.data);
}
END_TEST

/* Flip one bit at every position in the header, descriptors and checksum,
 * and at many positions in the bodies: nothing is accepted, and where no
 * structural check applies, the checksum is what refuses it. */
START_TEST(flipped_byte_refused_everywhere)
{
    struct bf *f = make_filled(all_kinds[_i], 0, 1);
    struct membuf m = serialize(f);
    size_t desc_end = BF_FILE_HEADER_BYTES +
                      bf_layer_count(f) * BF_FILE_LAYER_BYTES;

    for (size_t pos = 0; pos < m.len; pos++) {
        bool body = pos >= desc_end && pos < m.len - 8;
        if (body && (pos - desc_end) % 37 != 0)
            continue;
        for (int bit = 0; bit < 8; bit += 7) {
            char what[64];
            snprintf(what, sizeof what, "bit %d of byte %zu", bit, pos);
            m.data[pos] ^= (uint8_t)(1u << bit);
            bool data_only = pos >= desc_end ||
                             (pos >= 24 && pos < 56) ||     /* secret */
                             (pos >= 96 && pos < 104);      /* insert count */
            assert_refused(m.data, m.len, data_only ? "checksum" : "",
                           what);
            m.data[pos] ^= (uint8_t)(1u << bit);
        }
    }
    /* Unflipped, it is still fine: the loop restored every byte. */
    char err[BF_ERRLEN];
    struct bf *g = bf_file_parse(m.data, m.len, err);
    ck_assert_msg(g != NULL, "%s", err);
    bf_destroy(g);
    bf_destroy(f);
    free(m.data);
}
END_TEST

START_TEST(wrong_magic_refused)
{
    struct bf *f = make_filled(BF_KIND_BLOCKED, 0, 1);
    struct membuf m = serialize(f);

    memcpy(m.data, "BLOOMGRX", 8);
    fix_checksum(m.data, m.len);
    assert_refused(m.data, m.len, "bad magic", "magic");
    bf_destroy(f);
    free(m.data);
}
END_TEST

START_TEST(wrong_version_refused)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "v2.bf");
    struct bf *f = make_filled(BF_KIND_BLOCKED, 0, 1);
    struct membuf m = serialize(f);
    char err[BF_ERRLEN] = "";
    int code = 0;

    put32(m.data + 8, BF_FILE_VERSION + 1);
    fix_checksum(m.data, m.len);
    assert_refused(m.data, m.len, "unsupported version", "version");
    write_file(path, m.data, m.len);
    ck_assert_ptr_null(bf_file_load(path, err, &code));
    ck_assert_int_eq(code, -EPROTONOSUPPORT);
    put32(m.data + 8, 0);
    fix_checksum(m.data, m.len);
    assert_refused(m.data, m.len, "unsupported version", "version 0");
    bf_destroy(f);
    free(m.data);
    rm_tree(dir);
    free(path);
    free(dir);
}
END_TEST

/* ---- format versions and the count of keys added --------------------- */

/* The version-1 form of a serialized filter: version 1 and the keys-added
 * field (reserved there) zero, checksum fixed up. */
static void make_version_1(struct membuf *m)
{
    put32(m->data + 8, 1);
    put64(m->data + 120, 0);
    fix_checksum(m->data, m->len);
}

START_TEST(keys_added_round_trip_in_version_2)
{
    struct bf *f = make_filled(all_kinds[_i], 0, 1), *g;
    struct membuf m = serialize(f);
    char err[BF_ERRLEN] = "";
    /* make_filled adds 1000 keys, twice each for counting. */
    uint64_t keys = all_kinds[_i] == BF_KIND_COUNTING ? 2000 : 1000;

    ck_assert_uint_eq(bf_keys_added(f), keys);
    ck_assert_uint_lt(bf_insert_count(f), keys + 1);
    /* No placement recorded: version 2, which readers of 2 still read. */
    ck_assert_uint_eq(m.data[8], BF_FILE_VERSION_PLAIN);
    ck_assert_uint_eq(BF_FILE_VERSION_PLAIN, 2);
    ck_assert_uint_eq(get64(m.data + 96), bf_insert_count(f));
    ck_assert_uint_eq(get64(m.data + 120), keys);
    g = bf_file_parse(m.data, m.len, err);
    ck_assert_msg(g != NULL, "parse: %s", err);
    assert_same_filter(f, g);
    bf_destroy(f);
    bf_destroy(g);
    free(m.data);
}
END_TEST

/* A file of format version 1 (no count of keys) still loads, bits and
 * insert count as they were, its keys added BF_KEYS_UNCOUNTED; adds and
 * a save keep it so. */
START_TEST(version_1_file_loads_uncounted)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "v1.bf");
    struct bf *f = make_filled(BF_KIND_BLOCKED, 2, 4), *g, *h;
    struct membuf m = serialize(f), m2;
    struct bf_layer_info li;
    char err[BF_ERRLEN] = "";
    int code = 1;

    make_version_1(&m);
    write_file(path, m.data, m.len);
    g = bf_file_load(path, err, &code);
    ck_assert_msg(g != NULL, "load: %s", err);
    ck_assert_int_eq(code, 0);
    ck_assert_uint_eq(bf_keys_added(g), BF_KEYS_UNCOUNTED);
    ck_assert_uint_eq(bf_insert_count(g), bf_insert_count(f));
    ck_assert_uint_eq(bf_shard_index(g), 2);
    ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
    ck_assert_int_eq(memcmp(bf_layer_body_const(f, 0), bf_layer_body_const(g, 0),
                            li.body_bytes), 0);
    bf_add(g, "one more", 8);
    ck_assert_uint_eq(bf_keys_added(g), BF_KEYS_UNCOUNTED);
    m2 = serialize(g);
    ck_assert_uint_eq(m2.data[8], BF_FILE_VERSION_PLAIN);
    ck_assert_uint_eq(get64(m2.data + 120), UINT64_MAX);
    h = bf_file_parse(m2.data, m2.len, err);
    ck_assert_msg(h != NULL, "parse: %s", err);
    ck_assert_uint_eq(bf_keys_added(h), BF_KEYS_UNCOUNTED);
    bf_destroy(f);
    bf_destroy(g);
    bf_destroy(h);
    free(m.data);
    free(m2.data);
    rm_tree(dir);
    free(path);
    free(dir);
}
END_TEST

/* In version 1 the bytes of the keys-added field are reserved: non-zero,
 * the file is refused as before. */
START_TEST(version_1_reserved_field_refused)
{
    struct bf *f = make_filled(BF_KIND_CLASSIC, 0, 1);
    struct membuf m = serialize(f);

    make_version_1(&m);
    put64(m.data + 120, 1);
    fix_checksum(m.data, m.len);
    assert_refused(m.data, m.len, "bad geometry: reserved", "version 1 reserved");
    bf_destroy(f);
    free(m.data);
}
END_TEST

/* One impossible-geometry edit: a header or descriptor field rewritten and the
 * checksum fixed up, so the geometry check is what must catch it. */
struct geometry_edit {
    const char *what;
    size_t off;           /* from the start; descriptor edits add 128 */
    int width;            /* 4 or 8 bytes, or 'd' for a double */
    uint64_t value;
    double dvalue;
};

#define D0 BF_FILE_HEADER_BYTES   /* layer 0 descriptor */

static const struct geometry_edit geometry_edits[] = {
    {"kind 0", 12, 4, 0, 0},
    {"kind 9", 12, 4, 9, 0},
    {"hash id 7", 16, 4, 7, 0},
    {"layer count 0", 20, 4, 0, 0},
    {"layer count 49", 20, 4, BF_MAX_LAYERS + 1, 0},
    {"layer count 2 for blocked", 20, 4, 2, 0},
    {"capacity 0", 56, 8, 0, 0},
    {"error rate 0", 64, 'd', 0, 0.0},
    {"error rate 1.5", 64, 'd', 0, 1.5},
    {"error rate NaN", 64, 'd', 0, NAN},
    {"header m differs", 72, 8, 512, 0},
    {"header k differs", 80, 4, 1, 0},
    {"shard index = count", 84, 4, 1, 0},
    {"shard count 0", 88, 4, 0, 0},
    {"flags", 92, 4, 1, 0},
    {"layer m 0", D0 + 16, 8, 0, 0},
    {"layer k 0", D0 + 24, 4, 0, 0},
    {"layer k 65", D0 + 24, 4, 65, 0},
    {"layer capacity 0", D0 + 0, 8, 0, 0},
    {"layer error rate -1", D0 + 8, 'd', 0, -1.0},
    {"layer reserved", D0 + 28, 4, 1, 0},
    {"body bytes +64", D0 + 40, 8, 0, 0},   /* value set from the file */
};

START_TEST(impossible_geometry_refused)
{
    const struct geometry_edit *e = &geometry_edits[_i];
    struct bf *f = make_filled(BF_KIND_BLOCKED, 0, 1);
    struct membuf m = serialize(f);
    uint64_t v = e->value;

    if (strcmp(e->what, "body bytes +64") == 0)
        v = get64(m.data + e->off) + 64;
    if (e->width == 4)
        put32(m.data + e->off, (uint32_t)v);
    else if (e->width == 8)
        put64(m.data + e->off, v);
    else
        putf64(m.data + e->off, e->dvalue);
    fix_checksum(m.data, m.len);
    assert_refused(m.data, m.len, "bad geometry", e->what);
    bf_destroy(f);
    free(m.data);
}
END_TEST

/* m changed consistently in header and descriptor, body size kept: the body
 * no longer fits m. */
START_TEST(body_size_not_matching_m_refused)
{
    struct bf *f = make_filled(BF_KIND_CLASSIC, 0, 1);
    struct membuf m = serialize(f);
    uint64_t m2 = get64(m.data + 72) * 2;

    put64(m.data + 72, m2);
    put64(m.data + D0 + 16, m2);
    fix_checksum(m.data, m.len);
    assert_refused(m.data, m.len, "bad geometry", "m doubled");
    bf_destroy(f);
    free(m.data);
}
END_TEST

/* A blocked m that is not a whole number of blocks but rounds to the stored
 * body size: only the engine's own check (bf_assemble) can refuse it. */
START_TEST(engine_geometry_check_applies)
{
    struct bf *f = make_filled(BF_KIND_BLOCKED, 0, 1);
    struct membuf m = serialize(f);
    uint64_t m2 = get64(m.data + 72) - 64;

    ck_assert_uint_eq(bf_body_bytes(BF_KIND_BLOCKED, m2),
                      get64(m.data + D0 + 40));
    put64(m.data + 72, m2);
    put64(m.data + D0 + 16, m2);
    fix_checksum(m.data, m.len);
    assert_refused(m.data, m.len, "bad geometry", "m not a block multiple");
    bf_destroy(f);
    free(m.data);
}
END_TEST

/* A huge m with a matching body size must be refused by the size check
 * before anything is allocated. */
START_TEST(huge_geometry_refused_before_allocating)
{
    struct bf *f = make_filled(BF_KIND_BLOCKED, 0, 1);
    struct membuf m = serialize(f);
    uint64_t big = 1ull << 50;   /* 128 TiB of bits */

    put64(m.data + 72, big);
    put64(m.data + D0 + 16, big);
    put64(m.data + D0 + 40, bf_body_bytes(BF_KIND_BLOCKED, big));
    fix_checksum(m.data, m.len);
    assert_refused(m.data, m.len, "truncated", "huge m");
    bf_destroy(f);
    free(m.data);
}
END_TEST

/* Byte offset of layer i's body in a serialized filter. */
static size_t body_offset(const struct bf *f, uint32_t i)
{
    size_t off = BF_FILE_HEADER_BYTES + (size_t)bf_layer_count(f) * BF_FILE_LAYER_BYTES;
    for (uint32_t j = 0; j < i; j++) {
        struct bf_layer_info li;
        ck_assert_int_eq(bf_layer_info(f, j, &li), 0);
        off += li.body_bytes;
    }
    return off;
}

/* A copy of m with bit b of layer i's body set and the checksum fixed up,
 * so that only the padding check can tell. */
static struct membuf with_body_bit(const struct membuf *m, const struct bf *f,
                                   uint32_t i, uint64_t b)
{
    struct membuf c = {.data = malloc(m->len), .len = m->len};
    ck_assert_ptr_nonnull(c.data);
    memcpy(c.data, m->data, m->len);
    c.data[body_offset(f, i) + b / 8] |= (uint8_t)(1u << (b % 8));
    fix_checksum(c.data, c.len);
    return c;
}

/* Bits past m (past 4m counter bits) gave a fill above 1 and n-hat = inf;
 * no writer sets them, so a file with one is refused.  Blocked and
 * scalable layers have no such bits. */
START_TEST(padding_bits_past_m_refused)
{
    enum bf_kind kind = all_kinds[_i];
    struct bf *f = make_filled(kind, 0, 1);
    struct membuf m = serialize(f);
    char err[BF_ERRLEN] = "";
    unsigned padded = 0;

    for (uint32_t i = 0; i < bf_layer_count(f); i++) {
        struct bf_layer_info li;
        ck_assert_int_eq(bf_layer_info(f, i, &li), 0);
        uint64_t used = kind == BF_KIND_COUNTING ? li.m * BF_COUNTER_BITS : li.m;
        uint64_t total = li.body_bytes * 8;
        if (used == total)
            continue;
        padded++;
        uint64_t bad[] = {used, used + 1, total - 1};
        for (size_t j = 0; j < sizeof bad / sizeof bad[0]; j++) {
            struct membuf c = with_body_bit(&m, f, i, bad[j]);
            assert_refused(c.data, c.len, "bad padding: bits set past m", "padding bit");
            free(c.data);
        }
        /* The last bit in use is data, not padding. */
        struct membuf c = with_body_bit(&m, f, i, used - 1);
        struct bf *g = bf_file_parse(c.data, c.len, err);
        ck_assert_msg(g != NULL, "last bit in use refused: %s", err);
        struct bf_stats st;
        bf_stats(g, &st);
        ck_assert(st.fill_ratio <= 1.0);
        bf_destroy(g);
        free(c.data);
    }
    if (kind == BF_KIND_CLASSIC || kind == BF_KIND_COUNTING)
        ck_assert_uint_eq(padded, 1);   /* the test file has padding to set */
    else
        ck_assert_uint_eq(padded, 0);

    /* bf_file_load runs the same check. */
    if (padded) {
        char *dir = make_tmpdir(), *path = path_in(dir, "pad.bf");
        struct bf_layer_info li;
        int code = 0;
        bf_layer_info(f, 0, &li);
        struct membuf c = with_body_bit(&m, f, 0, li.body_bytes * 8 - 1);
        write_file(path, c.data, c.len);
        ck_assert_ptr_null(bf_file_load(path, err, &code));
        ck_assert_int_eq(code, -EBADMSG);
        ck_assert_msg(strstr(err, "bad padding"), "got \"%s\"", err);
        free(c.data);
        rm_tree(dir);
        free(path);
        free(dir);
    }
    bf_destroy(f);
    free(m.data);
}
END_TEST

/* One growth limit for bf_create, bf_params_check and the reader. */
START_TEST(growth_limit_is_one_limit)
{
    struct bf_params p = {.kind = BF_KIND_SCALABLE, .capacity = 100,
                          .error_rate = 0.01, .secret = test_secret};
    char err[BF_ERRLEN] = "";
    const double above = nextafter(BF_GROWTH_MAX, INFINITY);

    bf_params_default(&p);
    p.growth = BF_GROWTH_MAX;
    ck_assert_int_eq(bf_params_check(&p, err), 0);
    p.growth = 1.0;
    ck_assert_int_eq(bf_params_check(&p, err), 0);
    p.growth = above;
    ck_assert_int_eq(bf_params_check(&p, err), -EINVAL);
    p.growth = nextafter(1.0, 0.0);
    ck_assert_int_eq(bf_params_check(&p, err), -EINVAL);

    /* The writer at the limit: its file reads back. */
    p.growth = BF_GROWTH_MAX;
    struct bf *f = bf_create(&p, err);
    ck_assert_msg(f != NULL, "%s", err);
    struct membuf m = serialize(f);
    struct bf *g = bf_file_parse(m.data, m.len, err);
    ck_assert_msg(g != NULL, "growth %g refused: %s", BF_GROWTH_MAX, err);
    ck_assert(bf_growth(g) == BF_GROWTH_MAX);
    bf_destroy(g);

    /* Past it the header check refuses, before the engine is asked. */
    const double bad[] = {above, 17.0, 1e6, nextafter(1.0, 0.0), NAN};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        putf64(m.data + 104, bad[i]);
        fix_checksum(m.data, m.len);
        char want[64];
        snprintf(want, sizeof want, "bad geometry: growth %.17g (1..%g)", bad[i],
                 BF_GROWTH_MAX);
        assert_refused(m.data, m.len, want, "growth");
    }
    bf_destroy(f);
    free(m.data);
}
END_TEST

START_TEST(missing_file_refused)
{
    char err[BF_ERRLEN] = "";
    int code = 0;

    ck_assert_ptr_null(bf_file_load("/nonexistent/dir/f.bf", err, &code));
    ck_assert_int_eq(code, -ENOENT);
    ck_assert_msg(strstr(err, "cannot open"), "got \"%s\"", err);
    assert_refused(NULL, 0, "truncated", "empty buffer");
}
END_TEST

/* ---- atomic save ---------------------------------------------------------- */

static uint8_t *save_old_file(const char *path, size_t *len)
{
    struct bf *old = make_filled(BF_KIND_CLASSIC, 0, 1);
    char err[BF_ERRLEN] = "";

    ck_assert_msg(bf_file_save(old, path, err) == 0, "%s", err);
    bf_destroy(old);
    return read_file(path, len);
}

static void assert_file_is(const char *path, const uint8_t *want, size_t len)
{
    size_t got_len;
    uint8_t *got = read_file(path, &got_len);

    ck_assert_uint_eq(got_len, len);
    ck_assert_int_eq(memcmp(got, want, len), 0);
    free(got);
}

START_TEST(save_replaces_atomically)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "f.bf");
    struct bf *f = make_filled(BF_KIND_COUNTING, 0, 1), *g;
    char err[BF_ERRLEN] = "";
    size_t old_len;
    uint8_t *old = save_old_file(path, &old_len);

    ck_assert_msg(bf_file_save(f, path, err) == 0, "%s", err);
    g = bf_file_load(path, err, NULL);
    ck_assert_msg(g != NULL, "%s", err);
    ck_assert_int_eq(bf_kind(g), BF_KIND_COUNTING);
    ck_assert_int_eq(count_temp_files(dir), 0);
    bf_destroy(f);
    bf_destroy(g);
    free(old);
    rm_tree(dir);
    free(path);
    free(dir);
}
END_TEST

/* A write that fails halfway (file size limit) leaves the old file and no
 * temp file. */
START_TEST(failed_save_keeps_old_file)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "f.bf");
    struct bf *f = make_filled(BF_KIND_SCALABLE, 0, 1);
    char err[BF_ERRLEN] = "";
    size_t old_len;
    uint8_t *old = save_old_file(path, &old_len);
    struct rlimit rl = {.rlim_cur = 1024, .rlim_max = RLIM_INFINITY};
    struct rlimit saved;

    getrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    ck_assert_int_lt(bf_file_save(f, path, err), 0);
    setrlimit(RLIMIT_FSIZE, &saved);
    ck_assert_msg(strstr(err, "write failed"), "got \"%s\"", err);
    assert_file_is(path, old, old_len);
    ck_assert_int_eq(count_temp_files(dir), 0);
    bf_destroy(f);
    free(old);
    rm_tree(dir);
    free(path);
    free(dir);
}
END_TEST

/* A read-only directory (when not root, who may write anyway), a missing
 * directory, an empty path and a target that is a directory all fail
 * without leaving anything behind. */
START_TEST(save_to_bad_place_fails_cleanly)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "f.bf");
    char *sub = path_in(dir, "sub"), *missing = path_in(dir, "no/such/f.bf");
    struct bf *f = make_filled(BF_KIND_BLOCKED, 0, 1);
    char err[BF_ERRLEN] = "";
    size_t old_len;
    uint8_t *old = save_old_file(path, &old_len);

    ck_assert_int_lt(bf_file_save(f, missing, err), 0);
    ck_assert_msg(strstr(err, "temp file"), "got \"%s\"", err);
    ck_assert_int_lt(bf_file_save(f, "", err), 0);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    ck_assert_int_lt(bf_file_save(f, sub, err), 0);
    ck_assert_msg(strstr(err, "rename"), "got \"%s\"", err);
    ck_assert_int_eq(count_temp_files(dir), 0);
    if (geteuid() != 0) {
        ck_assert_int_eq(chmod(dir, 0555), 0);
        ck_assert_int_lt(bf_file_save(f, path, err), 0);
        ck_assert_int_eq(chmod(dir, 0755), 0);
        ck_assert_int_eq(count_temp_files(dir), 0);
    }
    assert_file_is(path, old, old_len);
    bf_destroy(f);
    free(old);
    rm_tree(dir);
    free(path);
    free(sub);
    free(missing);
    free(dir);
}
END_TEST

START_TEST(save_keeps_file_mode)
{
    char *dir = make_tmpdir(), *path = path_in(dir, "f.bf");
    struct bf *f = make_filled(BF_KIND_BLOCKED, 0, 1);
    char err[BF_ERRLEN] = "";
    struct stat st;

    ck_assert_int_eq(bf_file_save(f, path, err), 0);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0644);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(bf_file_save(f, path, err), 0);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    bf_destroy(f);
    rm_tree(dir);
    free(path);
    free(dir);
}
END_TEST

Suite *bf_file_suite(void)
{
    Suite *s = suite_create("bf_file");
    TCase *tc = tcase_create("format");
    int nkinds = (int)(sizeof all_kinds / sizeof all_kinds[0]);
    int nedits = (int)(sizeof geometry_edits / sizeof geometry_edits[0]);

    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, round_trip_every_kind, 0, nkinds);
    tcase_add_test(tc, round_trip_keeps_shard_fields);
    tcase_add_loop_test(tc, memory_form_equals_file_form, 0, nkinds);
    tcase_add_test(tc, writer_error_stops_serializing);
    tcase_add_loop_test(tc, write_during_adds_verifies, 0, nkinds);
    tcase_add_test(tc, save_leaves_zero_blocks_as_holes);
    tcase_add_loop_test(tc, merge_file_merges_as_merge_from, 0, nkinds);
    tcase_add_loop_test(tc, truncated_file_refused, 0, nkinds);
    tcase_add_test(tc, truncated_file_on_disk_refused);
    tcase_add_test(tc, trailing_bytes_refused);
    tcase_add_loop_test(tc, flipped_byte_refused_everywhere, 0, nkinds);
    tcase_add_test(tc, wrong_magic_refused);
    tcase_add_test(tc, wrong_version_refused);
    tcase_add_loop_test(tc, keys_added_round_trip_in_version_2, 0, nkinds);
    tcase_add_test(tc, version_1_file_loads_uncounted);
    tcase_add_test(tc, version_1_reserved_field_refused);
    tcase_add_loop_test(tc, impossible_geometry_refused, 0, nedits);
    tcase_add_test(tc, body_size_not_matching_m_refused);
    tcase_add_test(tc, engine_geometry_check_applies);
    tcase_add_test(tc, huge_geometry_refused_before_allocating);
    tcase_add_loop_test(tc, padding_bits_past_m_refused, 0, nkinds);
    tcase_add_test(tc, growth_limit_is_one_limit);
    tcase_add_test(tc, missing_file_refused);
    tcase_add_test(tc, save_replaces_atomically);
    tcase_add_test(tc, failed_save_keeps_old_file);
    tcase_add_test(tc, save_to_bad_place_fails_cleanly);
    tcase_add_test(tc, save_keeps_file_mode);
    suite_add_tcase(s, tc);
    return s;
}
