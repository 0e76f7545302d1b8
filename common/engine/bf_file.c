/* bf_file: save, load, serialize and parse bloomgrid filter files.
 *
 * Layout (docs/FORMAT.md is the reference): a 128-byte header, one 48-byte
 * descriptor per layer, the layer bodies in order, and an XXH64 (seed 0) of
 * every preceding byte.  All integers are little-endian, error rates are
 * IEEE-754 binary64.  Version 3 is written for filters that record a
 * placement version, version 2 for the others; version 2 is version 3 with
 * the placement word reserved, and version 1 is version 2 with the count of
 * keys added reserved too.  All three are read.
 *
 * Reading is one routine over a "source" (a file descriptor or a memory
 * buffer), so save/load and write/parse cannot drift apart.  The header and
 * descriptors are checked completely, and the total size they imply is
 * compared with the real size, before anything is allocated; bodies are then
 * read in large chunks straight into the filter's own memory while the
 * checksum is computed.  The filter is handed out only after the checksum
 * matches and the padding past m is found clear, so a bad file is never
 * loaded in part.
 */
#include "errmsg.h"
#include "bf_file.h"
#include "durable.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* Bodies are stored as the host's 64-bit words; only little-endian hosts
 * can do that without a byte swap, and those are all we build for. */
#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "bf_file.c assumes a little-endian host"
#endif

#define CHUNK_BYTES (8u << 20)   /* large reads/writes run at disk speed */

/* Header field offsets (bytes).  Keep in step with docs/FORMAT.md. */
enum {
    OFF_MAGIC = 0,
    OFF_VERSION = 8,
    OFF_KIND = 12,
    OFF_HASH_ID = 16,
    OFF_NLAYERS = 20,
    OFF_SECRET = 24,
    OFF_CAPACITY = 56,
    OFF_ERROR_RATE = 64,
    OFF_M = 72,
    OFF_K = 80,
    OFF_SHARD_INDEX = 84,
    OFF_SHARD_COUNT = 88,
    OFF_PLACEMENT = 92,    /* version 3; reserved (0) before */
    OFF_INSERTS = 96,
    OFF_GROWTH = 104,
    OFF_TIGHTENING = 112,
    OFF_KEYS = 120,        /* version 2; reserved (0) in version 1 */
};

enum {
    LOFF_CAPACITY = 0,
    LOFF_ERROR_RATE = 8,
    LOFF_M = 16,
    LOFF_K = 24,
    LOFF_RESERVED = 28,
    LOFF_COUNT = 32,
    LOFF_BODY_BYTES = 40,
};

_Static_assert(OFF_SECRET + BF_SECRET_LEN == OFF_CAPACITY, "secret size");
_Static_assert(OFF_KEYS + 8 == BF_FILE_HEADER_BYTES, "header size");
_Static_assert(LOFF_BODY_BYTES + 8 == BF_FILE_LAYER_BYTES, "descriptor size");

/* BF_FILE_MAGIC spelled out: a char[8] initialized from the 9-byte literal
 * draws a warning on newer compilers. */
static const char file_magic[8] = {'B', 'L', 'O', 'O', 'M', 'G', 'R', 'D'};

/* ---- little-endian encoding -------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_f64(uint8_t *p, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    put_u64(p, v);
}

static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static double get_f64(const uint8_t *p)
{
    uint64_t v = get_u64(p);
    double d;
    memcpy(&d, &v, sizeof d);
    return d;
}

static int refuse(char *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Set the message and return code, for one-line refusals. */
static int refuse(char *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, BF_ERRLEN, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* ---- serializing ------------------------------------------------------- */

uint64_t bf_file_size(const struct bf *f)
{
    uint32_t n = bf_layer_count(f);
    uint64_t size = BF_FILE_HEADER_BYTES + 8 +
                    (uint64_t)n * BF_FILE_LAYER_BYTES;

    for (uint32_t i = 0; i < n; i++) {
        struct bf_layer_info li;
        if (bf_layer_info(f, i, &li) == 0)
            size += li.body_bytes;
    }
    return size;
}

static void encode_header(const struct bf *f, uint32_t nlayers, uint8_t *h)
{
    struct bf_layer_info l0;
    struct bf_fingerprint fp;

    memset(h, 0, BF_FILE_HEADER_BYTES);
    memset(&l0, 0, sizeof l0);
    bf_layer_info(f, 0, &l0);
    bf_fingerprint(f, &fp);
    memcpy(h + OFF_MAGIC, file_magic, sizeof file_magic);
    /* Readers of version 2 still read what needs nothing newer. */
    put_u32(h + OFF_VERSION, bf_placement(f) ? BF_FILE_VERSION
                                             : BF_FILE_VERSION_PLAIN);
    put_u32(h + OFF_KIND, (uint32_t)bf_kind(f));
    put_u32(h + OFF_HASH_ID, fp.hash_id);
    put_u32(h + OFF_NLAYERS, nlayers);
    memcpy(h + OFF_SECRET, bf_secret(f), BF_SECRET_LEN);
    put_u64(h + OFF_CAPACITY, bf_capacity(f));
    put_f64(h + OFF_ERROR_RATE, bf_error_rate(f));
    put_u64(h + OFF_M, l0.m);
    put_u32(h + OFF_K, l0.k);
    put_u32(h + OFF_SHARD_INDEX, bf_shard_index(f));
    put_u32(h + OFF_SHARD_COUNT, bf_shard_count(f));
    put_u32(h + OFF_PLACEMENT, bf_placement(f));
    put_u64(h + OFF_INSERTS, bf_insert_count(f));
    put_f64(h + OFF_GROWTH, bf_growth(f));
    put_f64(h + OFF_TIGHTENING, bf_tightening(f));
    put_u64(h + OFF_KEYS, bf_keys_added(f));
}

static void encode_layer(const struct bf_layer_info *li, uint8_t *d)
{
    memset(d, 0, BF_FILE_LAYER_BYTES);
    put_u64(d + LOFF_CAPACITY, li->capacity);
    put_f64(d + LOFF_ERROR_RATE, li->error_rate);
    put_u64(d + LOFF_M, li->m);
    put_u32(d + LOFF_K, li->k);
    put_u64(d + LOFF_COUNT, li->count);
    put_u64(d + LOFF_BODY_BYTES, li->body_bytes);
}

/* Hash and emit one piece.  Hashing the same bytes that are handed to write
 * keeps the checksum right even if adds change the filter meanwhile. */
static int emit(XXH64_state_t *st, bf_file_writer write, void *ctx,
                const void *buf, size_t len)
{
    XXH64_update(st, buf, len);
    return write(ctx, buf, len);
}

/* Bodies go through a bounce buffer: concurrent adds may change a live
 * body between hashing and writing, and the file must still verify.  A
 * body nothing changes (bounce NULL) is emitted where it lies. */
static int emit_body(XXH64_state_t *st, bf_file_writer write, void *ctx,
                     const uint8_t *body, uint64_t len, uint8_t *bounce)
{
    while (len > 0) {
        size_t n = len < CHUNK_BYTES ? (size_t)len : CHUNK_BYTES;
        if (bounce)
            memcpy(bounce, body, n);
        int rc = emit(st, write, ctx, bounce ? bounce : body, n);
        if (rc < 0)
            return rc;
        body += n;
        len -= n;
    }
    return 0;
}

static int write_bodies(const struct bf *f, uint32_t nlayers, bool stable,
                        XXH64_state_t *st, bf_file_writer write, void *ctx)
{
    uint8_t *bounce = stable ? NULL : malloc(CHUNK_BYTES);
    int rc = 0;

    if (!stable && !bounce)
        return -ENOMEM;
    for (uint32_t i = 0; i < nlayers && rc == 0; i++) {
        struct bf_layer_info li;
        rc = bf_layer_info(f, i, &li);
        if (rc == 0)
            rc = emit_body(st, write, ctx,
                           (const uint8_t *)bf_layer_body_const(f, i),
                           li.body_bytes, bounce);
    }
    free(bounce);
    return rc;
}

static int write_descriptors(const struct bf *f, uint32_t nlayers,
                             XXH64_state_t *st, bf_file_writer write, void *ctx)
{
    uint8_t h[BF_FILE_HEADER_BYTES];
    uint8_t d[BF_FILE_LAYER_BYTES];
    int rc;

    encode_header(f, nlayers, h);
    rc = emit(st, write, ctx, h, sizeof h);
    for (uint32_t i = 0; i < nlayers && rc >= 0; i++) {
        struct bf_layer_info li;
        rc = bf_layer_info(f, i, &li);
        if (rc < 0)
            break;
        encode_layer(&li, d);
        rc = emit(st, write, ctx, d, sizeof d);
    }
    return rc < 0 ? rc : 0;
}

static int file_write(const struct bf *f, bool stable, bf_file_writer write,
                      void *ctx)
{
    XXH64_state_t *st = XXH64_createState();
    /* Counted once: a scalable filter may grow a layer meanwhile, and the
     * header, descriptors and bodies must agree. */
    uint32_t nlayers = bf_layer_count(f);
    uint8_t sum[8];
    int rc;

    if (!st)
        return -ENOMEM;
    XXH64_reset(st, 0);
    rc = write_descriptors(f, nlayers, st, write, ctx);
    if (rc < 0)
        goto out;
    rc = write_bodies(f, nlayers, stable, st, write, ctx);
    if (rc < 0)
        goto out;
    put_u64(sum, XXH64_digest(st));
    rc = write(ctx, sum, sizeof sum);
    if (rc > 0)
        rc = 0;
out:
    XXH64_freeState(st);
    return rc;
}

int bf_file_write(const struct bf *f, bf_file_writer write, void *ctx)
{
    return file_write(f, false, write, ctx);
}

int bf_file_write_stable(const struct bf *f, bf_file_writer write, void *ctx)
{
    return file_write(f, true, write, ctx);
}

/* ---- atomic save ------------------------------------------------------- */

/* Files are written sparse: a whole 4 KiB block of zeros is skipped (a
 * hole reads back as zeros), so an empty filter's file costs a few KiB of
 * writes and disk whatever its size, and a sparse one little more than its
 * set pages.  The bytes, and so the checksum, are the same. */
#define HOLE_BLOCK 4096u

struct sparse_out {
    int fd;
    uint64_t pos;        /* file offset of the next byte */
};

static bool all_zero(const uint8_t *p, size_t len)
{
    size_t i = 0;

    for (; i + 8 <= len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w)
            return false;
    }
    for (; i < len; i++)
        if (p[i])
            return false;
    return true;
}

static int pwrite_all(int fd, const uint8_t *p, size_t len, uint64_t off)
{
    while (len > 0) {
        ssize_t n = pwrite(fd, p, len, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        p += n;
        len -= (size_t)n;
        off += (uint64_t)n;
    }
    return 0;
}

static int sparse_write(void *ctx, const void *buf, size_t len)
{
    struct sparse_out *o = ctx;
    const uint8_t *p = buf;
    size_t run = 0;      /* bytes of data waiting to be written at p */
    int rc;

    while (len > 0) {
        /* Pieces end on file block boundaries, so a hole is whole blocks. */
        size_t n = HOLE_BLOCK - (size_t)((o->pos + run) % HOLE_BLOCK);
        if (n > len)
            n = len;
        if (n == HOLE_BLOCK && all_zero(p + run, n)) {
            if (run && (rc = pwrite_all(o->fd, p, run, o->pos)) < 0)
                return rc;
            o->pos += run + n;
            p += run + n;
            run = 0;
        } else {
            run += n;
        }
        len -= n;
    }
    if (run && (rc = pwrite_all(o->fd, p, run, o->pos)) < 0)
        return rc;
    o->pos += run;
    return 0;
}

static int fill_file(int fd, void *ctx)
{
    struct sparse_out o = {.fd = fd};
    int rc = bf_file_write(ctx, sparse_write, &o);

    /* A hole at the end is not part of the file until its size says so. */
    if (rc == 0 && ftruncate(fd, (off_t)o.pos) < 0)
        rc = -errno;
    return rc;
}

int bf_file_save(const struct bf *f, const char *path, char *err)
{
    char derr[DURABLE_ERRLEN] = "";
    int rc = durable_write_with(path, fill_file, (void *)f, 0, derr);

    if (rc < 0)
        errmsg_set(err, "%s", derr);
    return rc;
}

/* ---- reading: one parser over a file descriptor or a memory buffer ---- */

struct source {
    int fd;                 /* >= 0: read from this file */
    const uint8_t *mem;     /* otherwise: from this buffer */
    uint64_t size;          /* total bytes available */
    uint64_t pos;
    bool at;                /* fd: pread from base + pos (bf_file_scan) */
    uint64_t base;
};

/* Read exactly len bytes; the caller has already checked the size. */
static int source_read(struct source *s, void *buf, size_t len)
{
    uint8_t *p = buf;

    if (!s->mem) {
        while (len > 0) {
            ssize_t n = s->at ? pread(s->fd, p, len, (off_t)(s->base + s->pos))
                              : read(s->fd, p, len);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0)
                return -errno;
            if (n == 0)
                return -EBADMSG;   /* the file shrank under us */
            p += n;
            len -= (size_t)n;
            s->pos += (uint64_t)n;
        }
        return 0;
    }
    memcpy(p, s->mem + s->pos, len);
    s->pos += len;
    return 0;
}

/* Everything the header and descriptors say, decoded. */
struct file_meta {
    uint32_t version;
    uint32_t hash_id;
    uint32_t nlayers;
    uint64_t inserts;
    uint64_t keys;      /* BF_KEYS_UNCOUNTED for version 1 */
    struct bf_params params;
    uint8_t secret[BF_SECRET_LEN];
    uint64_t m0;
    uint32_t k0;
    uint32_t flags;     /* before version 3: the bytes where it has the
                           placement */
    uint64_t reserved;  /* version 1: the bytes where version 2 has keys */
    struct bf_layer_info layers[BF_MAX_LAYERS];
    uint64_t total;   /* file size the header implies */
};

static void decode_header(const uint8_t *h, struct file_meta *fm)
{
    struct bf_params *p = &fm->params;

    memset(fm, 0, sizeof *fm);
    fm->version = get_u32(h + OFF_VERSION);
    p->kind = (enum bf_kind)get_u32(h + OFF_KIND);
    fm->hash_id = get_u32(h + OFF_HASH_ID);
    fm->nlayers = get_u32(h + OFF_NLAYERS);
    memcpy(fm->secret, h + OFF_SECRET, BF_SECRET_LEN);
    p->secret = fm->secret;
    p->capacity = get_u64(h + OFF_CAPACITY);
    p->error_rate = get_f64(h + OFF_ERROR_RATE);
    fm->m0 = get_u64(h + OFF_M);
    fm->k0 = get_u32(h + OFF_K);
    p->shard_index = get_u32(h + OFF_SHARD_INDEX);
    p->shard_count = get_u32(h + OFF_SHARD_COUNT);
    if (fm->version >= 3)
        p->placement = get_u32(h + OFF_PLACEMENT);
    else
        fm->flags = get_u32(h + OFF_PLACEMENT);
    fm->inserts = get_u64(h + OFF_INSERTS);
    p->growth = get_f64(h + OFF_GROWTH);
    p->tightening = get_f64(h + OFF_TIGHTENING);
    if (fm->version == 1) {
        fm->reserved = get_u64(h + OFF_KEYS);
        fm->keys = BF_KEYS_UNCOUNTED;
    } else {
        fm->keys = get_u64(h + OFF_KEYS);
    }
}

static bool rate_ok(double p)
{
    return isfinite(p) && p > 0.0 && p < 1.0;
}

static int check_header(const struct file_meta *fm, char *err)
{
    const struct bf_params *p = &fm->params;

    if (p->kind < BF_KIND_BLOCKED || p->kind > BF_KIND_SCALABLE)
        return refuse(err, -EBADMSG, "bad geometry: unknown kind %u",
                      (unsigned)p->kind);
    if (fm->hash_id != BF_HASH_XXH3_128)
        return refuse(err, -EBADMSG, "bad geometry: unknown hash id %u",
                      fm->hash_id);
    if (fm->nlayers == 0 || fm->nlayers > BF_MAX_LAYERS)
        return refuse(err, -EBADMSG,
                      "bad geometry: layer count %u not in 1..%d", fm->nlayers,
                      BF_MAX_LAYERS);
    if (p->kind != BF_KIND_SCALABLE && fm->nlayers != 1)
        return refuse(err, -EBADMSG,
                      "bad geometry: a %s filter has 1 layer, not %u",
                      bf_kind_name(p->kind), fm->nlayers);
    if (p->capacity == 0 || !rate_ok(p->error_rate))
        return refuse(err, -EBADMSG,
                      "bad geometry: capacity %llu / error rate %g",
                      (unsigned long long)p->capacity, p->error_rate);
    if (p->shard_count == 0 || p->shard_index >= p->shard_count)
        return refuse(err, -EBADMSG,
                      "bad geometry: shard index %u of %u shards",
                      p->shard_index, p->shard_count);
    if (p->kind == BF_KIND_SCALABLE &&
        (!(p->growth >= 1.0 && p->growth <= BF_GROWTH_MAX) ||
         !rate_ok(p->tightening)))
        return refuse(err, -EBADMSG,
                      "bad geometry: growth %.17g (1..%g) / tightening %g",
                      p->growth, BF_GROWTH_MAX, p->tightening);
    if (p->placement > BF_PLACEMENT_MAX)
        return refuse(err, -EBADMSG,
                      "bad geometry: placement version %u above %u",
                      p->placement, BF_PLACEMENT_MAX);
    if (fm->flags != 0 || fm->reserved != 0)
        return refuse(err, -EBADMSG,
                      "bad geometry: reserved header fields are not zero");
    return 0;
}

static int check_layer(const struct file_meta *fm, uint32_t i, char *err)
{
    const struct bf_layer_info *li = &fm->layers[i];
    enum bf_kind kind = fm->params.kind;

    if (li->m == 0 || li->k == 0 || li->k > 64)
        return refuse(err, -EBADMSG, "bad geometry: layer %u has m=%llu, k=%u",
                      i, (unsigned long long)li->m, li->k);
    if (li->capacity == 0 || !rate_ok(li->error_rate))
        return refuse(err, -EBADMSG,
                      "bad geometry: layer %u has capacity %llu, error "
                      "rate %g", i, (unsigned long long)li->capacity,
                      li->error_rate);
    if (li->body_bytes != bf_body_bytes(kind, li->m))
        return refuse(err, -EBADMSG,
                      "bad geometry: layer %u body is %llu bytes, "
                      "m=%llu needs %llu",
                      i, (unsigned long long)li->body_bytes,
                      (unsigned long long)li->m,
                      (unsigned long long)bf_body_bytes(kind, li->m));
    if (i == 0 && (li->m != fm->m0 || li->k != fm->k0))
        return refuse(err, -EBADMSG,
                      "bad geometry: header m/k differ from layer 0");
    return 0;
}

static int decode_layers(const uint8_t *d, struct file_meta *fm, char *err)
{
    uint64_t total =
        BF_FILE_HEADER_BYTES + 8 + (uint64_t)fm->nlayers * BF_FILE_LAYER_BYTES;

    for (uint32_t i = 0; i < fm->nlayers; i++, d += BF_FILE_LAYER_BYTES) {
        struct bf_layer_info *li = &fm->layers[i];
        li->capacity = get_u64(d + LOFF_CAPACITY);
        li->error_rate = get_f64(d + LOFF_ERROR_RATE);
        li->m = get_u64(d + LOFF_M);
        li->k = get_u32(d + LOFF_K);
        li->count = get_u64(d + LOFF_COUNT);
        li->body_bytes = get_u64(d + LOFF_BODY_BYTES);
        if (get_u32(d + LOFF_RESERVED) != 0)
            return refuse(err, -EBADMSG,
                          "bad geometry: layer %u reserved field is not "
                          "zero", i);
        int rc = check_layer(fm, i, err);
        if (rc < 0)
            return rc;
        if (li->body_bytes > UINT64_MAX / 2 - total)
            return refuse(err, -EBADMSG, "bad geometry: layer sizes overflow");
        total += li->body_bytes;
    }
    fm->total = total;
    return 0;
}

static int check_size(const struct file_meta *fm, uint64_t size, char *err)
{
    if (size < fm->total)
        return refuse(err, -EBADMSG,
                      "truncated: %llu bytes, the header describes %llu",
                      (unsigned long long)size, (unsigned long long)fm->total);
    if (size > fm->total)
        return refuse(err, -EBADMSG,
                      "bad size: %llu bytes, the header describes %llu "
                      "(trailing data)",
                      (unsigned long long)size, (unsigned long long)fm->total);
    return 0;
}

/* Read the header; check magic and version first, so that a file of some
 * other kind is reported as such rather than as bad geometry. */
static int read_header(struct source *s, XXH64_state_t *st,
                       struct file_meta *fm, char *err)
{
    uint8_t h[BF_FILE_HEADER_BYTES];
    int rc;

    if (s->size < BF_FILE_HEADER_BYTES)
        return refuse(err, -EBADMSG,
                      "truncated: %llu bytes, shorter than the %d-byte "
                      "header", (unsigned long long)s->size,
                      BF_FILE_HEADER_BYTES);
    rc = source_read(s, h, sizeof h);
    if (rc < 0)
        return refuse(err, rc, "read failed: %s", strerror(-rc));
    XXH64_update(st, h, sizeof h);
    if (memcmp(h + OFF_MAGIC, file_magic, sizeof file_magic) != 0)
        return refuse(err, -EBADMSG, "bad magic: not a bloomgrid filter file");
    decode_header(h, fm);
    if (fm->version < BF_FILE_VERSION_MIN || fm->version > BF_FILE_VERSION)
        return refuse(err, -EPROTONOSUPPORT,
                      "unsupported version: format version %u, this "
                      "build reads versions %d to %d", fm->version,
                      BF_FILE_VERSION_MIN, BF_FILE_VERSION);
    return check_header(fm, err);
}

static int read_meta(struct source *s, XXH64_state_t *st, struct file_meta *fm,
                     bool whole, char *err)
{
    uint8_t d[BF_MAX_LAYERS * BF_FILE_LAYER_BYTES];
    size_t dlen;
    int rc = read_header(s, st, fm, err);

    if (rc < 0)
        return rc;
    dlen = (size_t)fm->nlayers * BF_FILE_LAYER_BYTES;
    if (s->size < BF_FILE_HEADER_BYTES + dlen)
        return refuse(err, -EBADMSG,
                      "truncated: %llu bytes, the layer descriptors "
                      "end at %llu", (unsigned long long)s->size,
                      (unsigned long long)(BF_FILE_HEADER_BYTES + dlen));
    rc = source_read(s, d, dlen);
    if (rc < 0)
        return refuse(err, rc, "read failed: %s", strerror(-rc));
    XXH64_update(st, d, dlen);
    rc = decode_layers(d, fm, err);
    if (rc < 0)
        return rc;
    return whole ? check_size(fm, s->size, err) : 0;
}

static int read_bodies(struct source *s, XXH64_state_t *st, struct bf *f,
                       const struct file_meta *fm, char *err)
{
    for (uint32_t i = 0; i < fm->nlayers; i++) {
        uint8_t *body = (uint8_t *)bf_layer_body(f, i);
        uint64_t left = fm->layers[i].body_bytes;

        while (left > 0) {
            size_t n = left < CHUNK_BYTES ? (size_t)left : CHUNK_BYTES;
            int rc = source_read(s, body, n);
            if (rc == -EBADMSG)
                return refuse(err, rc, "truncated: the file shrank while "
                              "it was read");
            if (rc < 0)
                return refuse(err, rc, "read failed: %s", strerror(-rc));
            XXH64_update(st, body, n);
            body += n;
            left -= n;
        }
    }
    return 0;
}

static int read_checksum(struct source *s, XXH64_state_t *st, char *err)
{
    uint8_t sum[8];
    int rc = source_read(s, sum, sizeof sum);
    uint64_t want, got;

    if (rc < 0)
        return refuse(err, rc, "read failed: %s", strerror(-rc));
    want = get_u64(sum);
    got = XXH64_digest(st);
    if (want != got)
        return refuse(err, -EBADMSG,
                      "checksum mismatch: stored %016llx, computed "
                      "%016llx (the file is corrupt)",
                      (unsigned long long)want, (unsigned long long)got);
    return 0;
}

/* The refusal of a layer whose word j (pad: its bits past m) has a bit
 * set past the m bits it uses. */
static int bad_padding(char *err, uint32_t i, uint64_t j, uint64_t pad, uint64_t used,
                       uint64_t words)
{
    uint64_t bit = j * 64 + (uint64_t)__builtin_ctzll(pad);

    return refuse(err, -EBADMSG,
                  "bad padding: bits set past m in layer %u (bit %llu; "
                  "the layer uses bits 0..%llu of %llu)", i,
                  (unsigned long long)bit, (unsigned long long)(used - 1),
                  (unsigned long long)(words * 64));
}


/* Bits past the last bit or counter in use are zero in every file a writer
 * makes.  Set ones would count in the fill and n-hat (a fill above 1, an
 * infinite n-hat) and survive every merge, so a file with any is refused,
 * not masked.  Only classic and counting layers have such bits: blocked m
 * is a whole number of blocks. */
static int check_padding(const struct bf *f, const struct file_meta *fm, char *err)
{
    for (uint32_t i = 0; i < fm->nlayers; i++) {
        const struct bf_layer_info *li = &fm->layers[i];
        const uint64_t *w = bf_layer_body_const(f, i);
        uint64_t used = fm->params.kind == BF_KIND_COUNTING ? li->m * BF_COUNTER_BITS
                                                             : li->m;
        uint64_t words = li->body_bytes / 8;

        for (uint64_t j = used / 64; j < words; j++) {
            uint64_t pad = w[j];
            if (j == used / 64)
                pad &= ~0ULL << (used % 64);
            if (!pad)
                continue;
            return bad_padding(err, i, j, pad, used, words);
        }
    }
    return 0;
}

/* An empty filter of the checked metadata, or NULL with err. */
static struct bf *assemble(const struct file_meta *fm, char *err)
{
    char aerr[BF_ERRLEN] = "";
    struct bf *f = bf_assemble(&fm->params, fm->hash_id, fm->nlayers, fm->layers, aerr);

    if (!f) {
        /* The engine's own messages already start "impossible geometry: ". */
        const char *why = aerr;
        if (strncmp(why, "impossible geometry: ", 21) == 0)
            why += 21;
        errmsg_set(err, "bad geometry: %s", why[0] ? why : "refused by engine");
    }
    return f;
}

size_t bf_file_meta_encode(const struct bf *f, uint32_t nlayers, uint8_t *buf)
{
    encode_header(f, nlayers, buf);
    for (uint32_t i = 0; i < nlayers; i++) {
        struct bf_layer_info li;
        if (bf_layer_info(f, i, &li) < 0)
            memset(&li, 0, sizeof li);
        encode_layer(&li, buf + BF_FILE_HEADER_BYTES + (size_t)i * BF_FILE_LAYER_BYTES);
    }
    return BF_FILE_HEADER_BYTES + (size_t)nlayers * BF_FILE_LAYER_BYTES;
}

struct bf *bf_file_meta_parse(const void *buf, size_t len, size_t *used, char *err)
{
    static const uint8_t empty[1];
    struct source s = {.fd = -1, .mem = buf ? buf : empty, .size = len};
    XXH64_state_t *st = XXH64_createState();
    struct file_meta *fm = malloc(sizeof *fm);
    uint64_t counts[BF_MAX_LAYERS];
    struct bf *f = NULL;

    if (!st || !fm) {
        errmsg_set(err, "out of memory");
        goto out;
    }
    XXH64_reset(st, 0);
    if (read_meta(&s, st, fm, false, err) < 0 || !(f = assemble(fm, err)))
        goto out;
    for (uint32_t i = 0; i < fm->nlayers; i++)
        counts[i] = fm->layers[i].count;
    bf_set_counts(f, fm->inserts, fm->keys, counts);
    if (used)
        *used = (size_t)s.pos;
out:
    if (st)
        XXH64_freeState(st);
    free(fm);
    return f;
}

/* Build a filter from the checked metadata and fill it from the source. */
static struct bf *load_from(struct source *s, char *err, int *code)
{
    XXH64_state_t *st = XXH64_createState();
    struct file_meta *fm = malloc(sizeof *fm);
    uint64_t counts[BF_MAX_LAYERS];
    struct bf *f = NULL;
    int rc = -ENOMEM;

    if (!st || !fm) {
        errmsg_set(err, "out of memory");
        goto fail;
    }
    XXH64_reset(st, 0);
    rc = read_meta(s, st, fm, true, err);
    if (rc < 0)
        goto fail;
    if (!(f = assemble(fm, err))) {
        rc = -EBADMSG;
        goto fail;
    }
    rc = read_bodies(s, st, f, fm, err);
    if (rc == 0)
        rc = read_checksum(s, st, err);
    if (rc == 0)
        rc = check_padding(f, fm, err);
    if (rc < 0)
        goto fail;
    for (uint32_t i = 0; i < fm->nlayers; i++)
        counts[i] = fm->layers[i].count;
    bf_set_counts(f, fm->inserts, fm->keys, counts);
    XXH64_freeState(st);
    free(fm);
    if (code)
        *code = 0;
    return f;

fail:
    bf_destroy(f);
    if (st)
        XXH64_freeState(st);
    free(fm);
    if (code)
        *code = rc;
    return NULL;
}

struct bf *bf_file_load(const char *path, char *err, int *code)
{
    struct source s = {.fd = -1};
    struct stat st;
    struct bf *f;

    s.fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s.fd < 0) {
        if (code)
            *code = -errno;
        errmsg_set(err, "cannot open: %s", strerror(errno));
        return NULL;
    }
    if (fstat(s.fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        if (code)
            *code = -EINVAL;
        errmsg_set(err, "cannot open: not a regular file");
        close(s.fd);
        return NULL;
    }
    s.size = (uint64_t)st.st_size;
    (void)posix_fadvise(s.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    f = load_from(&s, err, code);
    close(s.fd);
    return f;
}

/* check_padding for the piece [off, off + n) of layer i's body. */
static int check_padding_piece(const struct file_meta *fm, uint32_t i,
                               uint64_t off, const uint8_t *p, size_t n,
                               char *err)
{
    const struct bf_layer_info *li = &fm->layers[i];
    uint64_t used = fm->params.kind == BF_KIND_COUNTING ? li->m * BF_COUNTER_BITS
                                                         : li->m;
    uint64_t words = li->body_bytes / 8;

    for (uint64_t j = used / 64; j < words; j++) {
        if (j * 8 < off || j * 8 + 8 > off + n)
            continue;
        uint64_t pad = get_u64(p + (j * 8 - off));
        if (j == used / 64)
            pad &= ~0ULL << (used % 64);
        if (!pad)
            continue;
        return bad_padding(err, i, j, pad, used, words);
    }
    return 0;
}

static int scan_source(struct source *s, bf_file_meta_fn meta,
                       bf_file_body_fn body, void *ctx, char *err)
{
    enum { PIECE = 1 << 20 };
    XXH64_state_t *st = XXH64_createState();
    struct file_meta *fm = malloc(sizeof *fm);
    uint8_t *buf = malloc(PIECE);
    uint64_t counts[BF_MAX_LAYERS];
    struct bf *f = NULL;
    int rc = -ENOMEM;

    if (!st || !fm || !buf) {
        errmsg_set(err, "out of memory");
        goto out;
    }
    XXH64_reset(st, 0);
    if ((rc = read_meta(s, st, fm, true, err)) < 0)
        goto out;
    if (!(f = assemble(fm, err))) {
        rc = -EBADMSG;
        goto out;
    }
    for (uint32_t i = 0; i < fm->nlayers; i++)
        counts[i] = fm->layers[i].count;
    bf_set_counts(f, fm->inserts, fm->keys, counts);
    if (meta && (rc = meta(ctx, f)) < 0)
        goto out;
    /* Only the geometry was wanted: the bodies were never touched. */
    bf_destroy(f);
    f = NULL;
    for (uint32_t i = 0; i < fm->nlayers; i++) {
        for (uint64_t at = 0; at < fm->layers[i].body_bytes;) {
            uint64_t left = fm->layers[i].body_bytes - at;
            size_t n = left < PIECE ? (size_t)left : PIECE;
            if ((rc = source_read(s, buf, n)) < 0) {
                if (rc == -EBADMSG)
                    refuse(err, rc, "truncated: the file shrank while it "
                           "was read");
                else
                    refuse(err, rc, "read failed: %s", strerror(-rc));
                goto out;
            }
            XXH64_update(st, buf, n);
            if ((rc = check_padding_piece(fm, i, at, buf, n, err)) < 0)
                goto out;
            if (body && (rc = body(ctx, i, at, buf, n)) < 0)
                goto out;
            at += n;
        }
    }
    rc = read_checksum(s, st, err);
out:
    bf_destroy(f);
    if (st)
        XXH64_freeState(st);
    free(fm);
    free(buf);
    return rc;
}

int bf_file_scan(int fd, uint64_t off, uint64_t len, bf_file_meta_fn meta,
                 bf_file_body_fn body, void *ctx, char *err)
{
    struct source s = {.fd = fd, .size = len, .at = true, .base = off};

    return scan_source(&s, meta, body, ctx, err);
}

int bf_file_scan_mem(const void *buf, size_t len, bf_file_meta_fn meta,
                     bf_file_body_fn body, void *ctx, char *err)
{
    static const uint8_t empty[1];
    struct source s = {.fd = -1, .mem = buf ? buf : empty, .size = len};

    return scan_source(&s, meta, body, ctx, err);
}

struct bf *bf_file_parse(const void *buf, size_t len, char *err)
{
    static const uint8_t empty[1];
    struct source s = {.fd = -1, .mem = buf ? buf : empty, .size = len};

    return load_from(&s, err, NULL);
}
