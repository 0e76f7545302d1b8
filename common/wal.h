/* wal: a write-ahead log of one filter's changes, with group commit.
 *
 * A WAL is a directory's sequence of segment files wal-<F>.log (F = the first
 * sequence number in it, 16 hex digits).  A segment is a 32-byte header
 * (magic "BGWALSEG", version, F, XXH64 of the header) followed by records:
 *
 *   0  u32 magic "BGWR"   4  u32 type     8  u64 payload length
 *   16 u64 seq            24 u64 commit   32 u64 XXH64(bytes 0..31, payload)
 *   40 payload
 *
 * all little-endian.  Sequence numbers are contiguous across segments.
 * "commit" is the highest seq known durable when the record was written: it
 * lets recovery tell a torn tail (a bad record with nothing committed after
 * it: never acknowledged, truncated) from corruption (a bad record followed
 * by a record written after the bad one was durable: refused).  A bad record
 * inside the last batch written before a crash cannot be told from a torn
 * write and is truncated as one.
 *
 * Group commit: wal_submit frames a record into an in-memory batch and
 * returns its seq at once; wal_wait(seq) returns when it is durable.  The
 * first waiter to find no write in progress becomes the leader: it takes the
 * whole batch, writes it with one write() and one fdatasync() outside the
 * lock, and wakes every waiter its batch covers; the others sleep on the
 * condition variable and appenders keep filling the next batch meanwhile.
 *
 * Failure: if a write or fdatasync fails the WAL turns failed for good:
 * wal_submit and wal_wait return -EIO and nothing more is acknowledged (the
 * fsync is never retried: after a failed fsync the kernel may have dropped
 * the dirty pages).  The owner must re-run recovery from the files.
 *
 * Threads: wal_submit, wal_wait, wal_rotate and the accessors may be called
 * from any thread at once; wal_recover, wal_open and wal_close not.
 */
#ifndef BLOOMGRID_WAL_H
#define BLOOMGRID_WAL_H

#include "errmsg.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WAL_ERRLEN ERRMSG_LEN
#define WAL_SEG_HDR 32
#define WAL_REC_HDR 40
#define WAL_MAX_PAYLOAD (UINT64_C(1) << 40)

enum wal_durability {
    WAL_SYNC_FSYNC = 0,   /* fdatasync every batch before acknowledging */
    WAL_SYNC_NONE = 1,    /* write() only: survives a process crash, not a
                             machine crash */
};

/* Record types (the WAL does not interpret payloads). */
enum wal_rec_type {
    WAL_REC_ADD = 1,      /* n * 16 bytes: struct bf_hash {h1, h2}, LE */
    WAL_REC_REMOVE = 2,   /* same layout, counting filters */
    WAL_REC_IMPORT = 3,   /* a complete filter file (bf_file format) */
    WAL_REC_PAGES = 4,    /* pages to OR in: per page u32 layer, u32 len,
                             u64 byte offset, len bytes (store_or_pages) */
};

struct wal;

/* Called for each record replayed; a negative return stops the replay and
 * is returned by wal_recover. */
typedef int (*wal_replay_fn)(void *ctx, uint32_t type, uint64_t seq,
                             const void *payload, uint64_t len);

struct wal_recovery {
    uint64_t next_seq;     /* seq the next record must take */
    uint64_t records;      /* records replayed (seq > after) */
    uint64_t bytes;        /* bytes of segments read */
    uint64_t truncated;    /* bytes of torn tail cut from the last segment */
    uint32_t segments;     /* segments present */
};

/* Replay the WAL in dir: call fn for every record with seq > after, in seq
 * order.  A torn tail of the last segment is truncated (and the truncation
 * made durable).  Returns 0; -EBADMSG with file and offset in err for
 * corruption, a gap or a missing segment (no segment at all counts as
 * missing); another negative errno for I/O errors or fn's error. */
int wal_recover(const char *dir, uint64_t after, wal_replay_fn fn, void *ctx,
                struct wal_recovery *out, char *err);

/* Start appending in dir: creates segment wal-<next_seq>.log (durably,
 * replacing an empty segment of that name).  Returns NULL with err. */
struct wal *wal_open(const char *dir, uint64_t next_seq, int durability,
                     char *err);

/* Flush what was submitted (best effort) and free.  NULL is allowed.
 * No other thread may be using the WAL. */
void wal_close(struct wal *w);

/* Frame a record into the current batch; *seq gets its sequence number.
 * Returns 0, -EIO when the WAL has failed, -EINVAL for an oversize payload,
 * -ENOMEM.  The record is not durable until wal_wait(seq) returns 0. */
int wal_submit(struct wal *w, uint32_t type, const void *payload, uint64_t len,
               uint64_t *seq);

/* Wait until every record up to seq is durable.  Returns 0, -EIO if the
 * WAL failed before that (then nothing from seq on is acknowledged), or
 * -EINVAL for a seq not yet submitted. */
int wal_wait(struct wal *w, uint64_t seq);

/* wal_submit + wal_wait. */
int wal_append(struct wal *w, uint32_t type, const void *payload, uint64_t len,
               uint64_t *seq);

/* Close the current segment and start a new one.  *upto gets C: every record
 * submitted before the call has seq <= C and is durable in the old
 * segments; every later record has seq > C and goes to wal-<C+1>.log.
 * Returns 0 or -EIO (the WAL has then failed). */
int wal_rotate(struct wal *w, uint64_t *upto, char *err);

/* Delete the segments whose records all have seq <= upto (never the current
 * one), and make that durable.  Returns 0 or a negative errno. */
int wal_discard(const char *dir, uint64_t upto);

/* Accessors. */
uint64_t wal_last_seq(struct wal *w);       /* last seq submitted */
uint64_t wal_durable_seq(struct wal *w);    /* last seq durable */
uint64_t wal_bytes(struct wal *w);          /* bytes written since open or
                                               the last rotation */
int wal_error(struct wal *w);               /* 0 or the failure (-EIO) */
const char *wal_error_text(struct wal *w);  /* what failed, or "" */

/* Test hooks: replace fdatasync / write to inject failures.  Process-wide;
 * only tests may change them, while no WAL is in use. */
extern int (*wal__fdatasync)(int fd);
extern ssize_t (*wal__write)(int fd, const void *buf, size_t len);

#endif
