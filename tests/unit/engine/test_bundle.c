/* Unit tests of bundle: the shard bundle frame is pinned byte by byte, every
 * layout field is checked (magic, version, shard count, entry order,
 * lengths, trailer) and a bundle cut at any offset is refused with a message
 * naming the check; the shards inside must be the bundle's shards; a plain
 * filter file is a bundle of one and is saved as the same plain file; the
 * writer refuses to produce a bundle that would not parse. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "bf.h"
#include "bf_file.h"
#include "bundle.h"
#include "bytebuf.h"
#include "unit_tmpdir.h"

static const uint8_t secret_a[BF_SECRET_LEN] = {
    1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
    17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const uint8_t secret_b[BF_SECRET_LEN] = {
    32, 31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17,
    16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1};

static char dir[512];

static void setup(void)
{
    unit_tmpdir_make(dir, sizeof dir, "bundle");
}

static void teardown(void)
{
    unit_tmpdir_remove(dir);
}

/* ---- helpers -------------------------------------------------------------- */

/* Shard index of count, blocked, n = capacity, p = 0.1. */
static struct bf *make_shard(uint32_t index, uint32_t count, uint64_t capacity,
                             const uint8_t *secret)
{
    struct bf_params p = {.capacity = capacity, .error_rate = 0.1,
                          .shard_index = index, .shard_count = count,
                          .secret = secret};
    char err[BF_ERRLEN] = "";
    struct bf *f;

    bf_params_default(&p);
    f = bf_create(&p, err);
    ck_assert_msg(f != NULL, "%s", err);
    return f;
}

/* A sharded bundle of count shards (not plain), as a router exports it. */
static struct bundle *make_bundle(uint32_t count, uint64_t capacity)
{
    struct bundle *b = calloc(1, sizeof *b);

    ck_assert_ptr_nonnull(b);
    b->shard = calloc(count, sizeof *b->shard);
    b->count = count;
    for (uint32_t i = 0; i < count; i++)
        b->shard[i] = make_shard(i, count, capacity, secret_a);
    return b;
}

/* The serialized form of b, malloc'd to exactly *len bytes. */
static uint8_t *to_bytes(const struct bundle *b, size_t *len)
{
    struct bytebuf bb;
    uint8_t *out;

    bytebuf_init(&bb, SIZE_MAX);
    ck_assert_int_eq(bundle_write(b, bytebuf_write, &bb), 0);
    out = malloc(bb.len);
    memcpy(out, bb.p, bb.len);
    *len = bb.len;
    bytebuf_deinit(&bb);
    return out;
}

/* A filter file in memory. */
static uint8_t *file_bytes(const struct bf *f, size_t *len)
{
    struct bytebuf bb;

    bytebuf_init(&bb, SIZE_MAX);
    ck_assert_int_eq(bf_file_write(f, bytebuf_write, &bb), 0);
    *len = bb.len;
    return bb.p;
}

/* Frame shards[0..n) (as they are) into a bundle of count entries. */
static uint8_t *frame(struct bf *const *shards, uint32_t n, size_t *len)
{
    struct bundle_writer w;
    struct bytebuf bb;

    bytebuf_init(&bb, SIZE_MAX);
    ck_assert_int_eq(bundle_writer_begin(&w, n, bytebuf_write, &bb), 0);
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_int_eq(bundle_writer_entry(&w, i, bf_file_size(shards[i])), 0);
        ck_assert_int_eq(bf_file_write(shards[i], bundle_writer_data, &w), 0);
    }
    ck_assert_int_eq(bundle_writer_end(&w), 0);
    *len = bb.len;
    return bb.p;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
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

/* A valid trailer again after a field was changed on purpose. */
static void reseal(uint8_t *buf, size_t len)
{
    put64(buf + len - 8, XXH3_64bits(buf, len - 8));
}

/* The layout parser and the full parser both refuse buf, err starting with
 * prefix; returns the layout parser's code. */
static int refused(const uint8_t *buf, size_t len, const char *prefix)
{
    char err[BF_ERRLEN] = "";
    struct bundle_layout l;
    struct bundle *b;
    int rc = bundle_layout_parse(buf, len, &l, err);

    ck_assert_int_lt(rc, 0);
    ck_assert_ptr_null(l.entry);
    ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0,
                  "wanted \"%s...\", got \"%s\"", prefix, err);
    err[0] = 0;
    b = bundle_parse(buf, len, err);
    ck_assert_ptr_null(b);
    ck_assert_msg(strncmp(err, prefix, strlen(prefix)) == 0,
                  "bundle_parse: wanted \"%s...\", got \"%s\"", prefix, err);
    return rc;
}

/* The 2-shard bundle most tests tamper with; L is one shard file's size. */
static uint8_t *small_bundle(size_t *len, uint64_t *L)
{
    struct bundle *b = make_bundle(2, 10);
    uint8_t *buf = to_bytes(b, len);

    *L = bf_file_size(b->shard[0]);
    ck_assert_uint_eq(bf_file_size(b->shard[1]), *L);
    bundle_destroy(b);
    return buf;
}

static void key_of(char *buf, size_t cap, int i, size_t *len)
{
    *len = (size_t)snprintf(buf, cap, "key-%d", i);
}

/* ---- the frame ----------------------------------------------------------- */

START_TEST(header_bytes_are_pinned)
{
    static const uint8_t head[16] = {
        'B', 'G', 'S', 'H', 'A', 'R', 'D', 'S',   /* magic */
        0x01, 0x00, 0x00, 0x00,                   /* version 1 */
        0x02, 0x00, 0x00, 0x00};                  /* 2 shards */
    struct bundle *b = make_bundle(2, 10);
    size_t len, flen;
    uint8_t *buf = to_bytes(b, &len);
    uint64_t L = bf_file_size(b->shard[0]);

    ck_assert_uint_eq(len, 16 + 2 * (12 + L) + 8);
    ck_assert_mem_eq(buf, head, 16);
    for (uint32_t i = 0; i < 2; i++) {
        const uint8_t *e = buf + 16 + i * (12 + L);
        uint8_t *file = file_bytes(b->shard[i], &flen);
        const uint8_t index[4] = {(uint8_t)i, 0, 0, 0};
        ck_assert_mem_eq(e, index, 4);
        ck_assert_uint_eq(le64(e + 4), L);
        ck_assert_uint_eq(flen, L);
        ck_assert_int_eq(memcmp(e + 12, file, L), 0);   /* the file as is */
        free(file);
    }
    /* Trailer: XXH3-64, seed 0, of every byte before it, little-endian. */
    ck_assert_uint_eq(le64(buf + len - 8), XXH3_64bits(buf, len - 8));
    ck_assert_uint_eq(XXH3_64bits_withSeed(buf, len - 8, 0),
                      XXH3_64bits(buf, len - 8));
    free(buf);
    bundle_destroy(b);
}
END_TEST

START_TEST(layout_parse_gives_each_shard_in_place)
{
    char err[BF_ERRLEN] = "";
    struct bundle_layout l;
    size_t len;
    uint64_t L;
    uint8_t *buf = small_bundle(&len, &L);

    ck_assert_int_eq(bundle_layout_parse(buf, len, &l, err), 0);
    ck_assert_uint_eq(l.count, 2);
    ck_assert_ptr_eq(l.entry[0].file, buf + 28);
    ck_assert_ptr_eq(l.entry[1].file, buf + 28 + L + 12);
    ck_assert_uint_eq(l.entry[0].len, L);
    ck_assert_uint_eq(l.entry[1].len, L);
    bundle_layout_deinit(&l);
    ck_assert_ptr_null(l.entry);
    free(buf);
}
END_TEST

START_TEST(refuses_wrong_magic)
{
    size_t len;
    uint64_t L;
    uint8_t *buf = small_bundle(&len, &L);

    buf[3] ^= 0x20;
    reseal(buf, len);
    /* Not a bundle: to the full parser it is a filter file with a bad
     * magic too. */
    ck_assert_int_eq(refused(buf, len, "bad magic"), -EBADMSG);
    free(buf);
}
END_TEST

START_TEST(refuses_other_versions)
{
    size_t len;
    uint64_t L;
    uint8_t *buf = small_bundle(&len, &L);
    const uint32_t versions[] = {0, 2, 0x01000000};

    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        put32(buf + 8, versions[i]);
        reseal(buf, len);
        ck_assert_int_eq(refused(buf, len, "unsupported version"),
                         -EPROTONOSUPPORT);
    }
    free(buf);
}
END_TEST

START_TEST(refuses_shard_counts_that_do_not_match_the_entries)
{
    size_t len;
    uint64_t L;
    uint8_t *buf = small_bundle(&len, &L);
    const uint32_t counts[] = {0, 1, 3, 45, 0xFFFFFFFFu};

    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        put32(buf + 12, counts[i]);
        reseal(buf, len);
        ck_assert_int_eq(refused(buf, len, "bad bundle"), -EBADMSG);
    }
    free(buf);
}
END_TEST

START_TEST(refuses_entries_out_of_shard_order)
{
    char err[BF_ERRLEN] = "";
    struct bundle_layout l;
    size_t len;
    uint64_t L;
    uint8_t *buf = small_bundle(&len, &L);

    put32(buf + 16 + 12 + L, 0);           /* entry 1 says shard 0 */
    reseal(buf, len);
    ck_assert_int_eq(refused(buf, len, "bad bundle: entry 1 is for shard 0"),
                     -EBADMSG);
    put32(buf + 16 + 12 + L, 1);
    put32(buf + 16, 1);                    /* entry 0 says shard 1 */
    reseal(buf, len);
    ck_assert_int_eq(refused(buf, len, "bad bundle: entry 0 is for shard 1"),
                     -EBADMSG);
    put32(buf + 16, 0);
    reseal(buf, len);
    ck_assert_int_eq(bundle_layout_parse(buf, len, &l, err), 0);
    bundle_layout_deinit(&l);
    free(buf);
}
END_TEST

START_TEST(refuses_lengths_past_the_end)
{
    size_t len;
    uint64_t L;
    uint8_t *buf = small_bundle(&len, &L);
    const uint64_t first[] = {UINT64_MAX, (uint64_t)len, 2 * L + 12 + 1};

    for (size_t i = 0; i < sizeof first / sizeof first[0]; i++) {
        put64(buf + 20, first[i]);
        reseal(buf, len);
        ck_assert_int_eq(refused(buf, len, "bad bundle: shard 0 is"), -EBADMSG);
    }
    put64(buf + 20, L);
    put64(buf + 16 + 12 + L + 4, L + 1);   /* into the trailer */
    reseal(buf, len);
    ck_assert_int_eq(refused(buf, len, "bad bundle: shard 1 is"), -EBADMSG);
    put64(buf + 16 + 12 + L + 4, L - 1);   /* one byte left over */
    reseal(buf, len);
    ck_assert_int_eq(refused(buf, len, "bad bundle: 1 bytes after the last"),
                     -EBADMSG);
    free(buf);
}
END_TEST

START_TEST(refuses_a_bad_checksum)
{
    size_t len;
    uint64_t L;
    uint8_t *buf = small_bundle(&len, &L);

    buf[len - 1] ^= 1;                     /* the trailer itself */
    ck_assert_int_eq(refused(buf, len, "checksum mismatch"), -EBADMSG);
    buf[len - 1] ^= 1;
    buf[16 + 12 + L + 12 + 200] ^= 4;      /* a byte of shard 1's body */
    ck_assert_int_eq(refused(buf, len, "checksum mismatch"), -EBADMSG);
    buf[16 + 12 + L + 12 + 200] ^= 4;
    buf[20] ^= 1;                          /* a length */
    ck_assert_int_eq(refused(buf, len, "checksum mismatch"), -EBADMSG);
    free(buf);
}
END_TEST

START_TEST(refuses_truncation_at_every_offset)
{
    size_t len;
    uint64_t L;
    uint8_t *whole = small_bundle(&len, &L);

    for (size_t n = 0; n < len; n++) {
        /* Exactly n bytes on the heap: any read past them is caught by the
         * sanitizer build. */
        uint8_t *cut = malloc(n ? n : 1);
        char err[BF_ERRLEN] = "";
        struct bundle_layout l;
        struct bundle *b;
        const char *want = n == 0 ? "bad magic"
                         : n < 16 + 12 + 8 ? "truncated" : "checksum mismatch";

        memcpy(cut, whole, n);
        ck_assert_int_eq(bundle_layout_parse(cut, n, &l, err), -EBADMSG);
        ck_assert_msg(strncmp(err, want, strlen(want)) == 0,
                      "cut at %zu: wanted \"%s...\", got \"%s\"", n, want, err);
        err[0] = 0;
        b = bundle_parse(cut, n, err);
        ck_assert_msg(b == NULL && err[0], "cut at %zu: parsed", n);
        free(cut);
    }
    free(whole);
}
END_TEST

/* The len bytes of buf as the file name in the test's directory (its path
 * in path): a new file each time, since truncating one just written makes
 * ext4 flush it at close (auto_da_alloc), a wait on the disk per case. */
static void write_case(char *path, size_t size, const char *name,
                       const uint8_t *buf, size_t len)
{
    FILE *fp;

    snprintf(path, size, "%s/%s", dir, name);
    unlink(path);
    ck_assert_ptr_nonnull(fp = fopen(path, "wb"));
    ck_assert_uint_eq(len ? fwrite(buf, 1, len, fp) : 0, len);
    fclose(fp);
}

/* bundle_file_verify on a file accepts exactly what bundle_parse accepts,
 * with the same message: a sound bundle and a plain filter file, every
 * truncation of a small bundle, a byte changed at every offset, and shards
 * of another filter or in the wrong entry. */
static void verify_agrees(const uint8_t *buf, size_t len, const char *what)
{
    char path[600], perr[BF_ERRLEN] = "", verr[BF_ERRLEN] = "";

    write_case(path, sizeof path, "verify.bin", buf, len);
    struct bundle *b = bundle_parse(buf, len, perr);
    if (!bundle_is(buf, len)) {
        /* A plain filter file: bundle_load reads it as bf_file_load. */
        bundle_destroy(b);
        b = bundle_load(path, perr);
    }
    int rc = bundle_file_verify(path, verr);
    ck_assert_msg((b != NULL) == (rc == 0), "%s: parse %s, verify %d (%s)", what,
                  b ? "accepts" : perr, rc, verr);
    if (!b)
        ck_assert_msg(strcmp(perr, verr) == 0, "%s: parse says \"%s\", verify \"%s\"",
                      what, perr, verr);
    bundle_destroy(b);
}

START_TEST(file_verify_accepts_exactly_what_parse_accepts)
{
    size_t len;
    uint64_t L;
    uint8_t *whole = small_bundle(&len, &L), *copy = malloc(len);
    char what[64];

    ck_assert_ptr_nonnull(copy);
    verify_agrees(whole, len, "the bundle");
    for (size_t n = 0; n < len; n++) {
        snprintf(what, sizeof what, "cut at %zu", n);
        verify_agrees(whole, n, what);
    }
    for (size_t at = 0; at < len; at++) {
        memcpy(copy, whole, len);
        copy[at] ^= 0x41;
        snprintf(what, sizeof what, "byte %zu changed", at);
        verify_agrees(copy, len, what);
    }
    /* A plain filter file, sound and damaged. */
    struct bf *one = make_shard(0, 1, 1000, secret_a);
    size_t flen;
    uint8_t *file = file_bytes(one, &flen);
    verify_agrees(file, flen, "a plain file");
    file[flen / 2] ^= 1;
    verify_agrees(file, flen, "a damaged plain file");
    /* Sound frames around shards of another filter or in the wrong entry. */
    struct bf *s[2] = {make_shard(0, 2, 10, secret_a), make_shard(1, 2, 10, secret_b)};
    size_t blen;
    uint8_t *b = frame(s, 2, &blen);
    verify_agrees(b, blen, "another secret");
    free(b);
    bf_destroy(s[1]);
    s[1] = make_shard(0, 2, 10, secret_a);
    b = frame(s, 2, &blen);
    verify_agrees(b, blen, "shard 0 in entry 1");
    free(b);
    bf_destroy(s[0]);
    bf_destroy(s[1]);
    bf_destroy(one);
    free(file);
    free(copy);
    free(whole);
}
END_TEST

/* bundle_file_describe: what each shard's callback saw, in order. */
struct seen {
    uint32_t calls, count, next;
    uint64_t capacity, inserts;
    bool in_order;
};

static int see_shard(void *ctx, uint32_t index, uint32_t count,
                     const struct bf *f)
{
    struct seen *s = ctx;

    s->in_order &= index == s->next++ && (s->calls == 0 || count == s->count);
    s->count = count;
    s->calls++;
    s->capacity += bf_capacity(f);
    s->inserts += bf_insert_count(f);
    return 0;
}

/* Describe the bytes buf as a file: the fingerprint id and sums of the
 * loaded file, every shard once in order; damaged: the verify's refusal. */
static void describe_agrees(const uint8_t *buf, size_t len, const char *what)
{
    char path[600], derr[BF_ERRLEN] = "", verr[BF_ERRLEN] = "", fp[17] = "";
    char want[17];
    struct seen s = {.in_order = true};

    write_case(path, sizeof path, "describe.bin", buf, len);
    int rc = bundle_file_describe(path, see_shard, &s, fp, derr);
    struct bundle *b = bundle_load(path, verr);
    ck_assert_msg((b != NULL) == (rc == 0), "%s: load %s, describe %d (%s)",
                  what, b ? "accepts" : verr, rc, derr);
    if (!b) {
        ck_assert_msg(strcmp(derr, verr) == 0, "%s: load says \"%s\", "
                      "describe \"%s\"", what, verr, derr);
        return;
    }
    uint64_t cap = 0, ins = 0;
    for (uint32_t i = 0; i < b->count; i++) {
        cap += bf_capacity(b->shard[i]);
        ins += bf_insert_count(b->shard[i]);
    }
    bundle_fingerprint_id(b, want);
    ck_assert_msg(strcmp(fp, want) == 0, "%s: id %s, loaded %s", what, fp, want);
    ck_assert_msg(s.in_order && s.calls == b->count && s.count == b->count,
                  "%s: %u calls of count %u for %u shards", what, s.calls,
                  s.count, b->count);
    ck_assert_uint_eq(s.capacity, cap);
    ck_assert_uint_eq(s.inserts, ins);
    bundle_destroy(b);
}

START_TEST(file_describe_tells_what_a_load_tells)
{
    size_t len, flen;
    uint64_t L;
    uint8_t *whole = small_bundle(&len, &L);
    struct bf *one = make_shard(0, 1, 1000, secret_a);
    uint8_t *file;

    describe_agrees(whole, len, "the bundle");
    whole[len / 2] ^= 0x41;
    describe_agrees(whole, len, "a damaged bundle");
    describe_agrees(whole, len - 1, "a cut bundle");
    bf_add(one, "a key", 5);
    file = file_bytes(one, &flen);
    describe_agrees(file, flen, "a plain file");
    file[flen - 1] ^= 1;
    describe_agrees(file, flen, "a damaged plain file");
    bf_destroy(one);
    free(file);
    free(whole);
}
END_TEST

START_TEST(empty_input_is_refused_without_a_buffer)
{
    char err[BF_ERRLEN] = "";
    struct bundle_layout l;

    ck_assert_int_eq(bundle_layout_parse(NULL, 0, &l, err), -EBADMSG);
    ck_assert_str_eq(err, "bad magic: not a shard bundle");
    ck_assert(!bundle_is(NULL, 0));
    ck_assert_ptr_null(bundle_parse(NULL, 0, err));
    ck_assert(err[0]);
}
END_TEST

/* ---- the shards inside ------------------------------------------------------ */

START_TEST(refuses_a_shard_of_another_filter)
{
    char err[BF_ERRLEN] = "";
    struct bundle_layout l;
    struct bf *s[2] = {make_shard(0, 2, 10, secret_a),
                       make_shard(1, 2, 10, secret_b)};
    size_t len;
    uint8_t *buf = frame(s, 2, &len);

    /* The frame is fine; the second shard has another secret. */
    ck_assert_int_eq(bundle_layout_parse(buf, len, &l, err), 0);
    bundle_layout_deinit(&l);
    ck_assert_ptr_null(bundle_parse(buf, len, err));
    ck_assert_str_eq(err, "bad bundle: shard 1 has another secret than shard 0");
    ck_assert_str_eq(bundle_shard_mismatch(s[1], 1, 2, secret_a), "secret");
    ck_assert_ptr_null(bundle_shard_mismatch(s[1], 1, 2, secret_b));
    free(buf);
    bf_destroy(s[0]);
    bf_destroy(s[1]);
}
END_TEST

START_TEST(refuses_shards_in_the_wrong_entry_or_of_another_count)
{
    char err[BF_ERRLEN] = "";
    struct bf *swapped[2] = {make_shard(1, 2, 10, secret_a),
                             make_shard(0, 2, 10, secret_a)};
    struct bf *of3[2] = {make_shard(0, 3, 10, secret_a),
                         make_shard(1, 3, 10, secret_a)};
    size_t len;
    uint8_t *buf = frame(swapped, 2, &len);

    ck_assert_ptr_null(bundle_parse(buf, len, err));
    ck_assert_str_eq(err, "bad bundle: entry 0 holds shard 1 of 2, not 0 of 2");
    ck_assert_str_eq(bundle_shard_mismatch(swapped[0], 0, 2, secret_a),
                     "shard_index");
    free(buf);
    buf = frame(of3, 2, &len);
    ck_assert_ptr_null(bundle_parse(buf, len, err));
    ck_assert_str_eq(err, "bad bundle: entry 0 holds shard 0 of 3, not 0 of 2");
    ck_assert_str_eq(bundle_shard_mismatch(of3[0], 0, 2, secret_a),
                     "shard_count");
    free(buf);
    for (int i = 0; i < 2; i++) {
        bf_destroy(swapped[i]);
        bf_destroy(of3[i]);
    }
}
END_TEST

START_TEST(refuses_a_damaged_shard_file_in_a_sound_frame)
{
    char err[BF_ERRLEN] = "";
    size_t len;
    uint64_t L;
    uint8_t *buf = small_bundle(&len, &L);

    buf[16 + 12 + L + 12 + 200] ^= 4;      /* shard 1's body... */
    reseal(buf, len);                      /* ...under a fresh trailer */
    ck_assert_ptr_null(bundle_parse(buf, len, err));
    ck_assert_msg(strncmp(err, "shard 1: checksum mismatch", 26) == 0, "%s", err);
    free(buf);
}
END_TEST

/* ---- parsed level ------------------------------------------------------------ */

START_TEST(round_trip_keeps_every_shard_and_key)
{
    char path[600], err[BF_ERRLEN] = "", key[32];
    const void *keys[1];
    size_t lens[1], a_len, b_len;
    struct bundle *b = make_bundle(4, 1000), *back;
    bool out[1];

    for (int i = 0; i < 2000; i++) {
        key_of(key, sizeof key, i, &lens[0]);
        keys[0] = key;
        bundle_add_keys(b, keys, lens, 1);
        /* Each key went to the shard its hash names. */
        struct bf_hash h = bundle_hash(b, key, lens[0]);
        ck_assert(bf_may_contain(b->shard[bf_hash_shard(h, 4)], key, lens[0]));
    }
    for (uint32_t i = 0; i < 4; i++)
        ck_assert_uint_gt(bf_insert_count(b->shard[i]), 300);
    snprintf(path, sizeof path, "%s/four.bundle", dir);
    ck_assert_int_eq(bundle_save(b, path, err), 0);
    ck_assert(bundle_file_is(path));
    back = bundle_load(path, err);
    ck_assert_msg(back != NULL, "%s", err);
    ck_assert_uint_eq(back->count, 4);
    ck_assert(!back->plain);
    for (int i = 0; i < 2000; i++) {
        key_of(key, sizeof key, i, &lens[0]);
        keys[0] = key;
        bundle_may_contain_keys(back, keys, lens, 1, out);
        ck_assert_msg(out[0], "key %d lost", i);
    }
    uint8_t *x = to_bytes(b, &a_len), *y = to_bytes(back, &b_len);
    ck_assert_uint_eq(a_len, b_len);
    ck_assert_int_eq(memcmp(x, y, a_len), 0);
    free(x);
    free(y);
    bundle_destroy(back);
    bundle_destroy(b);
}
END_TEST

START_TEST(plain_file_loads_as_a_bundle_of_one)
{
    char path[600], err[BF_ERRLEN] = "";
    struct bf *f = make_shard(0, 1, 1000, secret_a);
    struct bundle *b;
    uint8_t *bytes;
    size_t len;
    bool out[2];
    const void *keys[2] = {"present", "absent-key"};
    size_t lens[2] = {7, 10};

    bf_add(f, "present", 7);
    snprintf(path, sizeof path, "%s/plain.bf", dir);
    ck_assert_int_eq(bf_file_save(f, path, err), 0);
    ck_assert(!bundle_file_is(path));
    b = bundle_load(path, err);
    ck_assert_msg(b != NULL, "%s", err);
    ck_assert_uint_eq(b->count, 1);
    ck_assert(b->plain);
    bundle_may_contain_keys(b, keys, lens, 2, out);
    ck_assert(out[0]);
    ck_assert(!out[1]);
    bundle_destroy(b);

    /* The same from memory. */
    bytes = file_bytes(f, &len);
    b = bundle_parse(bytes, len, err);
    ck_assert_msg(b != NULL, "%s", err);
    ck_assert(b->plain && b->count == 1);
    bundle_destroy(b);
    free(bytes);

    /* A missing file reads as bf_file_load says it. */
    snprintf(path, sizeof path, "%s/nope.bf", dir);
    ck_assert_ptr_null(bundle_load(path, err));
    ck_assert_str_eq(err, "cannot open: No such file or directory");
    bf_destroy(f);
}
END_TEST

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    uint8_t *buf;
    long n;

    ck_assert_ptr_nonnull(fp);
    fseek(fp, 0, SEEK_END);
    n = ftell(fp);
    rewind(fp);
    buf = malloc(n ? (size_t)n : 1);
    ck_assert_uint_eq(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return buf;
}

START_TEST(saving_a_plain_bundle_writes_the_plain_file)
{
    char a[600], b[600], err[BF_ERRLEN] = "";
    struct bf *f = make_shard(0, 1, 1000, secret_a);
    struct bundle *one;
    size_t alen, blen;
    uint8_t *x, *y;

    bf_add(f, "k1", 2);
    snprintf(a, sizeof a, "%s/via-bf.bf", dir);
    snprintf(b, sizeof b, "%s/via-bundle.bf", dir);
    ck_assert_int_eq(bf_file_save(f, a, err), 0);
    one = bundle_of_filter(f, err);   /* takes f */
    ck_assert_ptr_nonnull(one);
    ck_assert_int_eq(bundle_save(one, b, err), 0);
    x = slurp(a, &alen);
    y = slurp(b, &blen);
    ck_assert_uint_eq(alen, blen);
    ck_assert_int_eq(memcmp(x, y, alen), 0);
    ck_assert(!bundle_is(y, blen));
    free(x);
    free(y);
    bundle_destroy(one);
}
END_TEST

START_TEST(a_bundle_of_one_shard_stays_a_bundle)
{
    char path[600], err[BF_ERRLEN] = "";
    struct bundle *one = make_bundle(1, 100), *back;
    size_t len, blen;
    uint8_t *bytes = to_bytes(one, &len), *again;

    ck_assert(bundle_is(bytes, len));
    back = bundle_parse(bytes, len, err);
    ck_assert_msg(back != NULL, "%s", err);
    ck_assert_uint_eq(back->count, 1);
    ck_assert(!back->plain);
    snprintf(path, sizeof path, "%s/one.bundle", dir);
    ck_assert_int_eq(bundle_save(back, path, err), 0);
    again = slurp(path, &blen);
    ck_assert_uint_eq(blen, len);
    ck_assert_int_eq(memcmp(again, bytes, len), 0);
    free(again);
    free(bytes);
    bundle_destroy(back);
    bundle_destroy(one);
}
END_TEST

START_TEST(create_like_keeps_form_geometry_and_secret)
{
    char err[BF_ERRLEN] = "";
    struct bundle *b = make_bundle(3, 500), *like;
    const void *keys[1] = {"k"};
    size_t lens[1] = {1};

    bundle_add_keys(b, keys, lens, 1);
    like = bundle_create_like(b, err);
    ck_assert_ptr_nonnull(like);
    ck_assert_uint_eq(like->count, 3);
    ck_assert(!like->plain);
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert_ptr_null(bf_mismatch(b->shard[i], like->shard[i]));
        ck_assert_uint_eq(bf_insert_count(like->shard[i]), 0);
    }
    bundle_destroy(like);
    bundle_destroy(b);

    b = bundle_of_filter(make_shard(0, 1, 500, secret_a), err);
    like = bundle_create_like(b, err);
    ck_assert(like->plain && like->count == 1);
    bundle_destroy(like);
    bundle_destroy(b);
}
END_TEST

/* Batches of keys (lengths crossing the chunks the bundle hashes ahead)
 * leave every shard with the bits and counts of adding the keys one by
 * one in order, and queries in batches answer as one key at a time. */
START_TEST(batched_adds_and_queries_match_one_key_at_a_time)
{
    static const size_t sizes[] = {1, 15, 16, 17, 255, 256, 257, 1000, 3000};
    struct bundle *b = make_bundle(7, 20000), *one = make_bundle(7, 20000);
    char (*names)[24] = malloc(3000 * sizeof *names);
    const void **keys = malloc(3000 * sizeof *keys);
    size_t *lens = malloc(3000 * sizeof *lens);
    bool *out = malloc(3000 * sizeof *out);
    unsigned next = 0;

    ck_assert(names && keys && lens && out);
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        for (size_t i = 0; i < n; i++, next++) {
            lens[i] = (size_t)snprintf(names[i], sizeof names[i], "key-%u", next);
            keys[i] = names[i];
        }
        bundle_add_keys(b, keys, lens, n);
        for (size_t i = 0; i < n; i++) {
            struct bf_hash h = bundle_hash(one, keys[i], lens[i]);
            bf_add_hash(bundle_shard_of(one, h), h);
        }
        for (uint32_t i = 0; i < b->count; i++) {
            struct bf_layer_info li;
            ck_assert_int_eq(bf_layer_info(b->shard[i], 0, &li), 0);
            ck_assert_msg(memcmp(bf_layer_body_const(b->shard[i], 0),
                                 bf_layer_body_const(one->shard[i], 0), li.body_bytes) == 0,
                          "shard %u differs after a batch of %zu", i, n);
            ck_assert_uint_eq(bf_insert_count(b->shard[i]), bf_insert_count(one->shard[i]));
            ck_assert_uint_eq(bf_keys_added(b->shard[i]), bf_keys_added(one->shard[i]));
        }
    }
    /* Queries: half the keys added, half never. */
    for (size_t i = 0; i < 3000; i++) {
        unsigned k = (unsigned)(i % 2 ? i : next + i);
        lens[i] = (size_t)snprintf(names[i], sizeof names[i], "key-%u", k);
        keys[i] = names[i];
    }
    bundle_may_contain_keys(b, keys, lens, 3000, out);
    size_t present = 0;
    for (size_t i = 0; i < 3000; i++) {
        struct bf_hash h = bundle_hash(b, keys[i], lens[i]);
        ck_assert_int_eq(out[i], bf_may_contain_hash(bundle_shard_of(b, h), h));
        if (i % 2)
            ck_assert_msg(out[i], "key %zu added but not found", i);
        present += out[i];
    }
    ck_assert_uint_lt(present, 1500 + 150);   /* the absent half mostly absent */
    free(names);
    free(keys);
    free(lens);
    free(out);
    bundle_destroy(b);
    bundle_destroy(one);
}
END_TEST

START_TEST(a_failed_save_leaves_the_old_file)
{
    char path[600], bad[700], err[BF_ERRLEN] = "";
    struct bundle *b = make_bundle(2, 100);
    struct stat st;
    size_t len;
    uint8_t *before, *after;

    snprintf(path, sizeof path, "%s/keep.bundle", dir);
    ck_assert_int_eq(bundle_save(b, path, err), 0);
    ck_assert_int_eq(chmod(path, 0600), 0);
    before = slurp(path, &len);
    snprintf(bad, sizeof bad, "%s/no/such/dir.bundle", dir);
    ck_assert_int_lt(bundle_save(b, bad, err), 0);
    ck_assert_msg(strstr(err, "cannot create temp file") != NULL, "%s", err);
    /* A second save keeps the mode of the file it replaces. */
    ck_assert_int_eq(bundle_save(b, path, err), 0);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    after = slurp(path, &len);
    ck_assert_int_eq(memcmp(before, after, len), 0);
    free(before);
    free(after);
    bundle_destroy(b);
}
END_TEST

/* ---- one shard of a file, a piece at a time (the merger's partials) ------ */

/* What bf_file_scan handed out: the geometry, and layer 0's body as the
 * pieces arrived (checked for order). */
struct scanned {
    struct bf *meta;      /* a filter of the geometry, to compare */
    uint8_t *body;
    uint64_t next, len, pieces;
};

static int scan_meta(void *ctx, const struct bf *f)
{
    struct scanned *sc = ctx;
    struct bf_layer_info li;

    ck_assert_int_eq(bf_layer_info(f, 0, &li), 0);
    sc->len = li.body_bytes;
    sc->body = calloc(1, li.body_bytes);
    char err[BF_ERRLEN];
    sc->meta = bf_create_like(f, err);
    ck_assert_ptr_nonnull(sc->meta);
    return 0;
}

static int scan_body(void *ctx, uint32_t layer, uint64_t off, const void *data,
                     size_t len)
{
    struct scanned *sc = ctx;

    ck_assert_uint_eq(layer, 0);
    ck_assert_uint_eq(off, sc->next);
    ck_assert_uint_le(len, 1u << 20);
    memcpy(sc->body + off, data, len);
    sc->next += len;
    sc->pieces++;
    return 0;
}

static void scanned_free(struct scanned *sc)
{
    bf_destroy(sc->meta);
    free(sc->body);
    memset(sc, 0, sizeof *sc);
}

/* Open path (a file saved by the test) read-only; its size in *size. */
static int open_ro(const char *path, uint64_t *size)
{
    struct stat st;
    int fd = open(path, O_RDONLY);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fstat(fd, &st), 0);
    *size = (uint64_t)st.st_size;
    return fd;
}

START_TEST(each_shard_of_a_bundle_file_scans_to_the_bits_of_a_whole_load)
{
    char path[600], err[BF_ERRLEN] = "";
    /* 3 shards of about 2.4 MB: several pieces each. */
    struct bundle *b = make_bundle(3, 2000000);
    for (int i = 0; i < 30000; i++) {
        char key[32];
        size_t len;
        key_of(key, sizeof key, i, &len);
        const void *k[1] = {key};
        bundle_add_keys(b, k, &len, 1);
    }
    snprintf(path, sizeof path, "%s/whole.bundle", dir);
    ck_assert_int_eq(bundle_save(b, path, err), 0);
    struct bundle *whole = bundle_load(path, err);
    ck_assert_msg(whole != NULL, "%s", err);
    uint64_t size, off, len;
    uint32_t count;
    int fd = open_ro(path, &size);
    for (uint32_t i = 0; i < 3; i++) {
        struct scanned sc = {0};
        ck_assert_int_eq(bundle_file_entry(fd, size, i, &count, &off, &len,
                                           err), 0);
        ck_assert_uint_eq(count, 3);
        ck_assert_uint_eq(len, bf_file_size(b->shard[i]));
        ck_assert_int_eq(bf_file_scan(fd, off, len, scan_meta, scan_body, &sc,
                                      err), 0);
        ck_assert_ptr_null(bf_mismatch(sc.meta, whole->shard[i]));
        ck_assert_uint_eq(sc.next, sc.len);
        ck_assert_uint_gt(sc.pieces, 1);
        ck_assert_int_eq(memcmp(sc.body, bf_layer_body_const(whole->shard[i], 0),
                                sc.len), 0);
        scanned_free(&sc);
    }
    ck_assert_int_eq(bundle_file_entry(fd, size, 3, &count, &off, &len, err),
                     -ERANGE);
    ck_assert_uint_eq(count, 3);
    close(fd);

    /* A plain file scans whole, as bf_file_load reads it. */
    snprintf(path, sizeof path, "%s/plain.bf", dir);
    ck_assert_int_eq(bf_file_save(b->shard[1], path, err), 0);
    fd = open_ro(path, &size);
    struct scanned sc = {0};
    ck_assert_int_eq(bf_file_scan(fd, 0, size, scan_meta, scan_body, &sc, err),
                     0);
    ck_assert_int_eq(memcmp(sc.body, bf_layer_body_const(b->shard[1], 0),
                            sc.len), 0);
    scanned_free(&sc);
    /* Not a bundle. */
    ck_assert_int_eq(bundle_file_entry(fd, size, 0, &count, &off, &len, err),
                     -EBADMSG);
    ck_assert_msg(strncmp(err, "bad magic", 9) == 0, "%s", err);
    close(fd);
    bundle_destroy(whole);
    bundle_destroy(b);
}
END_TEST

START_TEST(a_scan_refuses_what_a_load_refuses)
{
    char path[600], err[BF_ERRLEN] = "";
    struct bundle *b = make_bundle(2, 200000);
    const void *k[1] = {"x"};
    size_t kl = 1;
    bundle_add_keys(b, k, &kl, 1);
    snprintf(path, sizeof path, "%s/damaged.bundle", dir);
    ck_assert_int_eq(bundle_save(b, path, err), 0);
    uint64_t size, off, len;
    uint32_t count;
    int fd = open_ro(path, &size);
    ck_assert_int_eq(bundle_file_entry(fd, size, 1, &count, &off, &len, err), 0);
    close(fd);

    /* A bit flipped inside shard 1's body: its own checksum fails. */
    uint8_t *buf = slurp(path, &(size_t){0});
    buf[off + BF_FILE_HEADER_BYTES + BF_FILE_LAYER_BYTES + 100] ^= 4;
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, size, f), size);
    fclose(f);
    fd = open_ro(path, &size);
    struct scanned sc = {0};
    ck_assert_int_eq(bf_file_scan(fd, off, len, scan_meta, scan_body, &sc, err),
                     -EBADMSG);
    ck_assert_msg(strncmp(err, "checksum mismatch", 17) == 0, "%s", err);
    scanned_free(&sc);
    /* Shard 0 is untouched: its entry still scans (the bundle's own
     * trailer is not read). */
    uint64_t off0, len0;
    ck_assert_int_eq(bundle_file_entry(fd, size, 0, &count, &off0, &len0, err),
                     0);
    ck_assert_int_eq(bf_file_scan(fd, off0, len0, scan_meta, scan_body, &sc,
                                  err), 0);
    scanned_free(&sc);
    /* A range cut short or too long is refused before any body. */
    ck_assert_int_eq(bf_file_scan(fd, off0, len0 - 8, scan_meta, scan_body,
                                  &sc, err), -EBADMSG);
    ck_assert_msg(strncmp(err, "truncated", 9) == 0, "%s", err);
    ck_assert_ptr_null(sc.meta);
    ck_assert_int_eq(bf_file_scan(fd, off0, len0 + 8, scan_meta, scan_body,
                                  &sc, err), -EBADMSG);
    ck_assert_msg(strncmp(err, "bad size", 8) == 0, "%s", err);
    ck_assert_ptr_null(sc.meta);
    close(fd);

    /* A frame whose entry runs past the end, or with bytes after the last
     * shard, is refused. */
    put64(buf + BUNDLE_HEAD_BYTES + 4, (uint64_t)size);
    f = fopen(path, "w");
    fwrite(buf, 1, size, f);
    fclose(f);
    fd = open_ro(path, &size);
    ck_assert_int_eq(bundle_file_entry(fd, size, 1, &count, &off, &len, err),
                     -EBADMSG);
    ck_assert_msg(strncmp(err, "bad bundle", 10) == 0, "%s", err);
    close(fd);
    free(buf);
    bundle_destroy(b);
}
END_TEST

/* ---- writer ------------------------------------------------------------------ */

START_TEST(writer_refuses_a_bundle_that_would_not_parse)
{
    struct bundle_writer w;
    struct bytebuf bb;
    const uint8_t four[4] = {1, 2, 3, 4};

    bytebuf_init(&bb, SIZE_MAX);
    ck_assert_int_eq(bundle_writer_begin(&w, 0, bytebuf_write, &bb), -EINVAL);
    ck_assert_uint_eq(bb.len, 0);

    ck_assert_int_eq(bundle_writer_begin(&w, 2, bytebuf_write, &bb), 0);
    ck_assert_int_eq(bundle_writer_entry(&w, 1, 4), -EINVAL);  /* not next */
    ck_assert_int_eq(bundle_writer_data(&w, four, 1), -EINVAL); /* no entry */
    ck_assert_int_eq(bundle_writer_entry(&w, 0, 4), 0);
    ck_assert_int_eq(bundle_writer_data(&w, four, 3), 0);
    ck_assert_int_eq(bundle_writer_entry(&w, 1, 4), -EINVAL);  /* 1 owed */
    ck_assert_int_eq(bundle_writer_data(&w, four, 2), -EINVAL); /* too many */
    ck_assert_int_eq(bundle_writer_data(&w, NULL, 0), 0);
    ck_assert_int_eq(bundle_writer_data(&w, four + 3, 1), 0);
    ck_assert_int_eq(bundle_writer_end(&w), -EINVAL);          /* 1 missing */
    ck_assert_ptr_null(w.xx);
    bytebuf_deinit(&bb);

    /* A writer's own error comes back. */
    bytebuf_init(&bb, 10);
    ck_assert_int_eq(bundle_writer_begin(&w, 1, bytebuf_write, &bb), -E2BIG);
    ck_assert_ptr_null(w.xx);
    bytebuf_deinit(&bb);
}
END_TEST

Suite *bundle_suite(void)
{
    Suite *s = suite_create("bundle");
    TCase *tc = tcase_create("bundle");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, header_bytes_are_pinned);
    tcase_add_test(tc, each_shard_of_a_bundle_file_scans_to_the_bits_of_a_whole_load);
    tcase_add_test(tc, a_scan_refuses_what_a_load_refuses);
    tcase_add_test(tc, layout_parse_gives_each_shard_in_place);
    tcase_add_test(tc, refuses_wrong_magic);
    tcase_add_test(tc, refuses_other_versions);
    tcase_add_test(tc, refuses_shard_counts_that_do_not_match_the_entries);
    tcase_add_test(tc, refuses_entries_out_of_shard_order);
    tcase_add_test(tc, refuses_lengths_past_the_end);
    tcase_add_test(tc, refuses_a_bad_checksum);
    tcase_add_test(tc, refuses_truncation_at_every_offset);
    tcase_add_test(tc, empty_input_is_refused_without_a_buffer);
    tcase_add_test(tc, refuses_a_shard_of_another_filter);
    tcase_add_test(tc, refuses_shards_in_the_wrong_entry_or_of_another_count);
    tcase_add_test(tc, refuses_a_damaged_shard_file_in_a_sound_frame);
    tcase_add_test(tc, round_trip_keeps_every_shard_and_key);
    tcase_add_test(tc, plain_file_loads_as_a_bundle_of_one);
    tcase_add_test(tc, saving_a_plain_bundle_writes_the_plain_file);
    tcase_add_test(tc, a_bundle_of_one_shard_stays_a_bundle);
    tcase_add_test(tc, create_like_keeps_form_geometry_and_secret);
    tcase_add_test(tc, a_failed_save_leaves_the_old_file);
    tcase_add_test(tc, batched_adds_and_queries_match_one_key_at_a_time);
    tcase_add_test(tc, file_verify_accepts_exactly_what_parse_accepts);
    tcase_add_test(tc, file_describe_tells_what_a_load_tells);
    tcase_add_test(tc, writer_refuses_a_bundle_that_would_not_parse);
    suite_add_tcase(s, tc);
    return s;
}
