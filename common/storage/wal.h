/* wal: the write-ahead log of a node, shared by every filter of its store,
 * with one commit thread (and its completer).
 *
 * One log holds the records of every filter (every shard) of a store.  Each
 * filter writes through a struct wal_stream that names it: its name and its
 * incarnation id (a random 64-bit number chosen when the filter is created,
 * so a filter dropped and created again under the same name is another
 * stream and replay never gives it the old one's records).  Records of a
 * stream carry its own sequence numbers (1, 2, 3 ... contiguous), and every
 * record carries the log's sequence number, the LSN (contiguous across the
 * whole log).
 *
 * Files: DIR/wal-<F>.log segments, F = the first LSN in it (16 hex digits).
 * A segment is a 32-byte header, the rest of its write unit U (zeros), and
 * records from offset U on (right after the header when U is 0):
 *
 *   header  0 magic "BGNODLOG"  8 u32 version (2)  12 u32 U
 *           16 u64 F  24 u64 XXH64(bytes 0..23)
 *   record  0 u32 magic "BGWN"  4 u16 type  6 u16 name length N
 *           8 u64 payload length P  16 u64 LSN  24 u64 commit
 *           32 u64 incarnation id  40 u64 stream seq  48 u64 XXH64(payload)
 *           56 u64 XXH64(bytes 0..55, then the name)
 *           64 the name (N bytes), then the payload (P bytes)
 *   padding a record of type 65535 with no name, id, seq or payload
 *           checksum (0), P zeros; LSN: the next record's; commit: that of
 *           its commit group
 *
 * all little-endian (docs/STORAGE.md has the same with the rules below).
 * Version 1 segments (U 0, no padding) are still read.  The header
 * checksum covers the payload's, so a record whose header is intact names
 * its owner even when its payload is damaged.  "commit" is the highest LSN
 * durable when the record was written: it tells a torn tail (a bad record
 * with no record after it written once it was durable: never acknowledged,
 * cut off) from acknowledged records lost (reported).  A segment ends
 * where the next one begins: after a failed write or fsync the log goes on
 * in a new segment that starts at the first LSN not acknowledged, and what
 * the old segment holds from that LSN on is ignored.
 *
 * Write units (fsync): each commit group starts at a multiple of U and
 * ends with padding to the next one, so no write rewrites a unit holding
 * an acknowledged record or the header, and a torn write (power lost on a
 * device that writes a unit only in part) damages only the group in
 * flight.  U is the largest of the page size, the file system's block size
 * and the device's physical block size, at least 4096 and at most 1 MiB
 * (wal_unit_detect).  With WAL_SYNC_NONE U is 0: no padding (a machine
 * crash may lose acknowledged writes anyway).
 *
 * Commit loop: wal_submit queues a record and returns at once; the commit
 * thread takes everything queued, frames it (LSNs, commit stamps,
 * checksums), writes it with one write() and one fdatasync(), then hands
 * the group to the completer, a second thread that calls each record's
 * completion in commit order while the commit thread starts the next
 * fsync (with WAL_SYNC_NONE there is no completer: the commit thread calls
 * them; and when it is idle wal_submit_now writes the record in the
 * submitting thread; a thread may also lead the group of its own records,
 * wal_lead).  Whatever is submitted during an fsync goes into the next one, so
 * one fsync serves every writer that arrived meanwhile, however many
 * threads they come from.
 *
 * Failure: if a write or fdatasync fails, nothing in the batch is
 * acknowledged (completions get the error that happened: -ENOSPC on a
 * full disk, -EIO ...), every stream with a record in it fails for good
 * (its later records get the same error; the owner recovers from the
 * files and opens a new stream) and the log continues in a new segment
 * (the fsync is never retried: after a failed fsync the kernel may have
 * dropped the dirty pages).  Streams with no record in the failed batch go
 * on.  If no new segment can be made the log is broken: every batch fails
 * until a new segment can be made (each batch tries again).
 *
 * Room: with fsync, a new segment is made over a spare when there is one:
 * the file of a segment wal_discard removed, kept (renamed .wal-spare-<n>)
 * while the log's files and spares are fewer than the most segments it
 * ever held at once.  Its blocks were written once, so records written
 * over them need no metadata update at their fdatasync, and nothing else
 * is written into it: each byte of the log is written about once.  Its
 * header's unit carries a mark (wal_format.h) that tells wal_scan that the
 * bytes after the last record may be an earlier segment's.  Without a
 * spare, a segment is made with its blocks allocated as far as it may grow
 * (fallocate; docs/STORAGE.md), and records overwrite that room, which
 * reads as zeros (written as zeros a stretch ahead of the records, so that
 * the file system marks its blocks written once per stretch: such a
 * segment is written twice, once as zeros).  The room after the last
 * record is cut when the segment is closed, and by wal_scan after a crash
 * (not counted as torn).  Spares are removed by wal_close and by wal_scan
 * (leftovers of a crash).
 *
 * Threads: every function may be called from any thread at once except
 * wal_scan (before wal_open) and wal_close.  wal_open starts the commit
 * thread and, with WAL_SYNC_FSYNC, the completer; completions run on the
 * completer (on the commit thread with WAL_SYNC_NONE; a led group's on its
 * leader), one at a time, in commit order, with no lock of the log held:
 * they may submit, but must not wait for the log.
 */
#ifndef BLOOMGRID_WAL_H
#define BLOOMGRID_WAL_H

#include "errmsg.h"
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define WAL_ERRLEN ERRMSG_LEN
#define WAL_SEG_HDR 32
#define WAL_REC_HDR 64
#define WAL_NAME_MAX 255
#define WAL_MAX_PAYLOAD (UINT64_C(1) << 40)

enum wal_durability {
    WAL_SYNC_FSYNC = 0,   /* fdatasync every batch before acknowledging */
    WAL_SYNC_NONE = 1,    /* write() only: survives a process crash, not a
                             machine crash */
};

/* Record types (the log does not interpret payloads). */
enum wal_rec_type {
    WAL_REC_ADD = 1,      /* n * 16 bytes: struct bf_hash {h1, h2}, LE */
    WAL_REC_REMOVE = 2,   /* same layout, counting filters */
    WAL_REC_IMPORT = 3,   /* a complete filter file (bf_file format) */
    WAL_REC_PAGES = 4,    /* pages to OR in: per page u32 layer, u32 len,
                             u64 byte offset, len bytes (store_or_pages) */
    WAL_REC_COUNTS = 5,   /* counts merged in (an Import applied in pieces):
                             u64 inserts, u64 keys added, u32 layers n,
                             u32 0, n * u64 layer count (bf_merge_counts) */
};

struct wal;
struct wal_stream;
struct wal_rec;

/* ---- reading ---- */

/* One intact record met by a scan.  Pointers are valid during the call. */
struct wal_record {
    uint64_t lsn, id, seq;
    uint32_t type;
    const char *name;          /* not NUL-terminated */
    size_t name_len;
    const void *payload;
    uint64_t len;
};

/* Damage met by a scan.  id != 0: one record of stream id (seq, at lsn)
 * whose header is intact and whose payload is not.  id == 0: the records
 * of LSNs [from, to) are lost and their owners unknown (to is UINT64_MAX
 * when the damage reaches the end of the log). */
struct wal_damage {
    uint64_t id, seq, lsn;
    uint64_t from, to;
    char where[WAL_ERRLEN];    /* file and offset, and what is wrong */
};

struct wal_scan_ops {
    /* Each intact record, in LSN order; a negative return stops the scan
     * and is returned by it. */
    int (*record)(void *ctx, const struct wal_record *r);
    void (*damage)(void *ctx, const struct wal_damage *d);
    /* Optional, scans of the open log only (wal_rescan, wal_rescan_from):
     * called with each record's header (payload NULL, len its length)
     * before its payload is read; true passes the record over unread
     * (neither its payload checked nor record called, and damage to its
     * payload not reported).  A scan of one stream's records among many
     * then reads the others' headers only.  The header's checksum is
     * checked only for a record not passed over (records before from
     * likewise): a record passed over because of a damaged field is not
     * reported, so a caller that wants a stream's records checks that
     * their seqs have no gap. */
    bool (*skip)(void *ctx, const struct wal_record *hdr);
};

struct wal_scan_info {
    uint64_t first_lsn;   /* the first LSN the log holds (next_lsn when
                             it holds none) */
    uint64_t next_lsn;    /* the LSN the next record must take */
    uint64_t records;     /* intact records met */
    uint64_t bytes;       /* bytes of segments read */
    uint64_t read_bytes;  /* bytes of records read: the header and name of
                             every record met, the payload of every record
                             checked */
    uint64_t truncated;   /* bytes of torn tail cut from the last segment */
    bool truncated_shared; /* that tail was in a segment written without
                              write units (version 1, or durability none):
                              a torn write there may also have damaged
                              acknowledged records */
    uint32_t segments;    /* segments present */
};

/* Read the log in dir before it is opened for appending: every record and
 * every damage in LSN order, through ops.  A torn tail of the last segment
 * is cut (durably) and the last segment made durable; leftover temp files
 * are removed.  A missing dir or one with no segment is an empty log
 * (first_lsn = next_lsn = 1).  Returns 0; a negative errno with err for
 * I/O errors (the log cannot be read) or ops->record's error. */
int wal_scan(const char *dir, const struct wal_scan_ops *ops, void *ctx,
             struct wal_scan_info *out, char *err);

/* The same on an open log, for one owner reloading from the files: reads
 * what was durable when the call started, cuts nothing, and holds off
 * wal_discard meanwhile. */
int wal_rescan(struct wal *w, const struct wal_scan_ops *ops, void *ctx,
               struct wal_scan_info *out, char *err);
/* wal_rescan from LSN from on: segments whose records are all before it
 * are not read, and in the one holding it the reading starts at the seek
 * mark nearest before it (the log keeps in memory, for each of its
 * segments, where a commit group's first record begins every 256 KiB or
 * more: 16 bytes each; see wal_open for those it found), or at the
 * segment's start;
 * records before from are passed over by their headers (not given to ops,
 * their payloads not read).  info's first_lsn is where the reading began.
 * Any number of scans may run at once; wal_discard waits for those
 * running. */
int wal_rescan_from(struct wal *w, uint64_t from, const struct wal_scan_ops *ops,
                    void *ctx, struct wal_scan_info *out, char *err);

/* ---- appending ---- */

/* Open the log in dir (created if missing) for appending from LSN next_lsn
 * in a new segment, and start the commit thread.  segment_bytes: a segment
 * whose file grew past it (16 write units at least) is closed and a new one
 * started.  unit_bytes: with WAL_SYNC_FSYNC, the least write unit (0: as
 * detected, see wal_unit_detect).  The segments already in dir (which
 * wal_scan read, cutting any torn tail, before) count in the log's bytes
 * until discarded; their record headers are read here, and their seek
 * marks (wal_rescan_from) kept: at the commit groups whose records follow
 * one another up to the next segment (or next_lsn), none past a bad
 * header or a record out of place, none in a segment whose header is bad
 * or that starts at or after next_lsn (it is replaced).  Returns NULL
 * with err. */
struct wal *wal_open(const char *dir, uint64_t next_lsn, int durability,
                     uint64_t segment_bytes, uint32_t unit_bytes, char *err);

/* The write unit for a log in dir: the largest of the page size, the block
 * size of dir's file system (statvfs f_bsize), the physical block size of
 * its device (sysfs queue/physical_block_size, a partition's disk's),
 * 4096 and at_least, rounded up to a power of two, at most 1 MiB.  how
 * (howlen bytes, may be NULL) gets the figures it came from. */
uint32_t wal_unit_detect(const char *dir, uint32_t at_least, char *how,
                         size_t howlen);

/* The commit delay (WAL_SYNC_FSYNC only; 0: none, the default of a log):
 * when records were submitted while the last commit group was being
 * written and synced (writers keep coming), the next group is started no
 * sooner than us microseconds, and no sooner than the last fdatasync
 * took if that is less, after the last one's fdatasync returned, so that
 * the writers its answers let go (which submit again) join it: more
 * records per fdatasync, each waiting at most that much longer.  A writer
 * alone (nothing submitted during the last group) never waits.  At most
 * WAL_COMMIT_DELAY_MAX_US (larger values are cut to it); any thread. */
#define WAL_COMMIT_DELAY_MAX_US 100000u
void wal_set_commit_delay(struct wal *w, uint32_t us);

/* The unit w writes in (0: none, WAL_SYNC_NONE). */
uint32_t wal_unit(const struct wal *w);

/* Make the log's series (metrics.h: fsync and group histograms, bytes
 * written) in the process registry, at 0 until the first commit; the
 * first commit makes them otherwise.  Any thread, any number of times. */
void wal_metrics_register(void);

/* Commit everything submitted, stop the commit thread, free.  Every stream
 * must have been closed.  NULL is allowed. */
void wal_close(struct wal *w);

/* A stream for filter incarnation id (not 0) named name (1..WAL_NAME_MAX
 * bytes), whose next record takes seq next_seq.  NULL when memory is
 * short. */
struct wal_stream *wal_stream_open(struct wal *w, uint64_t id,
                                   const char *name, uint64_t next_seq);

/* The owner is done with s (records still queued keep it alive until they
 * complete).  NULL is allowed. */
void wal_stream_close(struct wal_stream *s);

/* Has s failed (a batch holding one of its records could not be made
 * durable)?  why (WAL_ERRLEN bytes, may be NULL) gets what failed. */
bool wal_stream_failed(struct wal_stream *s, char *why);
/* The error s failed with (a negative errno: -ENOSPC for a full disk), or 0
 * while it has not failed. */
int wal_stream_error(struct wal_stream *s);

/* The seq of the last record submitted to s (next_seq - 1 before any). */
uint64_t wal_stream_last_seq(struct wal_stream *s);

/* A record to submit: payload (len bytes) is copied in, or when payload is
 * NULL the record's buffer is left for the caller to fill through
 * wal_rec_payload.  NULL for len above WAL_MAX_PAYLOAD or no memory. */
struct wal_rec *wal_rec_new(uint32_t type, const void *payload, uint64_t len);
void *wal_rec_payload(struct wal_rec *r);
/* Free a record that was never submitted.  NULL is allowed. */
void wal_rec_free(struct wal_rec *r);
/* Keep only the first len bytes of the payload of a record not yet
 * submitted (len above the record's length changes nothing). */
void wal_rec_truncate(struct wal_rec *r, uint64_t len);

/* Completion of a record or barrier: rc 0 once durable (after write() only
 * with WAL_SYNC_NONE), or the error that kept it from being so (-ENOSPC,
 * -EIO ...); seq is the record's stream seq; lsn the
 * record's LSN (for a barrier: every record of the stream submitted before
 * it has an LSN <= lsn and every record submitted after it a higher one). */
typedef void (*wal_done_fn)(void *ctx, int rc, uint64_t seq, uint64_t lsn);

/* Queue r (the log owns it from now) as the next record of s and return
 * its seq.  done(ctx, ...) is called exactly once, from the completer (the
 * commit thread with WAL_SYNC_NONE).
 * Records of one stream are written in the order of their wal_submit
 * calls; a caller that needs the order of its changes in memory to be the
 * log's order submits under its own lock. */
uint64_t wal_submit(struct wal_stream *s, struct wal_rec *r, wal_done_fn done,
                    void *ctx);

/* A completion not yet run: wal_submit_now's. */
struct wal_now {
    wal_done_fn done;
    void *ctx;
    int rc;
    uint64_t seq, lsn;
    bool pending;
};

/* wal_submit, written at once in the calling thread when it can be: with
 * WAL_SYNC_NONE, when nothing is queued or being written (the commit
 * thread is idle) and the log is not broken.  Then the record is framed,
 * given its LSN and written (write()) before the call returns, and true is
 * returned with done not called: now holds the completion (rc, seq, lsn as
 * done would get them), which the caller runs with wal_now_complete
 * exactly once, after letting go of the locks it submitted under (done
 * may then run anything, e.g. the next submit).  No thread is woken: the
 * commit thread is signalled only when records were queued meanwhile or
 * the segment is full (it starts the next one).  Otherwise r is queued as
 * wal_submit does, false is returned and done is called by the log later
 * (now holds nothing; wal_now_complete does nothing).
 * Order: r's LSN is after every record submitted before the call, and a
 * record submitted after it returns gets a later one.  An inline
 * completion runs when the caller runs it, so completions of records of
 * different submitting threads may run out of LSN order; those of one
 * thread (and of the commit thread) run in order.
 * Errors: as for wal_submit (a failed write fails r's stream, rc is the
 * error, the log goes on in a new segment). */
bool wal_submit_now(struct wal_stream *s, struct wal_rec *r, wal_done_fn done,
                    void *ctx, struct wal_now *now);
/* Run now's completion if it holds one (once; later calls do nothing). */
void wal_now_complete(struct wal_now *now);

/* ---- a thread that leads its own group commit ----
 *
 * An event loop that takes the writes of many clients in one pass (the
 * node's Redis door) may commit them itself when the pass ends, as Redis
 * does with appendfsync always (it fsyncs before its loop sleeps, then
 * writes the replies): the pass's records make one group, written and
 * synced in the loop's thread, and their completions (which answer the
 * clients) run there at once, with no wake of the commit thread, of the
 * completer or of the loop between the fdatasync and the replies.  The
 * loop does not serve its other clients meanwhile (an fdatasync long).
 *
 * wal_hold(true): the records and barriers the calling thread submits
 * from then on (wal_submit, wal_submit_now, wal_barrier, through the
 * store) are queued as usual but do not wake the commit thread (those of
 * a second log do); wal_hold(false) ends that.  The thread must call
 * wal_lead before it sleeps or waits for anything: until then its held
 * records wait for it, or for the next record another thread submits
 * (the commit thread then takes them along).
 *
 * wal_lead: if this thread held records since its last wal_lead, and the
 * log's writing state is free (no group being written by the commit
 * thread or another submitter, no completion of an earlier group waiting
 * or running, no rotation asked for, the log not broken), take everything
 * queued (the held records and any other thread's, in submission order),
 * write it as one group, fdatasync it (WAL_SYNC_FSYNC) and run every
 * completion of the group in this thread before returning, in commit
 * order: a later group's completions (the commit thread's) wait on the
 * completer meanwhile.  Otherwise wake the commit thread: the records go
 * with its next group and complete on the completer as wal_submit's.
 * Returns how many records and barriers completed here (0: nothing held,
 * or handed to the commit thread).  A write or fdatasync that fails fails
 * every record of the group as the commit thread's do (each completion
 * gets the error, their streams fail, the log goes on in a new segment).
 * Completions run here may submit; a wal_lead made inside one hands its
 * records to the commit thread.  With WAL_SYNC_NONE (no completer) a
 * leader's completions and the commit thread's may run at once, as with
 * wal_submit_now.  Any thread; not during wal_close. */
void wal_hold(bool on);
size_t wal_lead(void);

/* Hold this thread's wal_submit_now records of w and write them with one
 * write() at wal_hold_end: a submitter of many records at once (a node's
 * batch message of writes to many shards) pays one system call, not one
 * per record.  Taken only as wal_submit_now would write inline (durability
 * none, nothing queued, the commit thread idle): then the thread holds the
 * log's writing state until wal_hold_end, so other threads' records are
 * queued meanwhile and written after the held ones, and true is returned.
 * A held wal_submit_now frames nothing yet: it gives the record its seq,
 * returns false (now holds nothing) and done runs in wal_hold_end, after
 * the write, in submission order, with no lock of the log held (the caller
 * must hold none of its own that done takes).  Otherwise false: records go
 * as without a hold.  Calls nest (the outermost pair counts); every
 * wal_hold_begin needs its wal_hold_end on the same thread and log, soon:
 * the commit thread waits meanwhile.  Errors: as for wal_submit_now (a
 * failed write fails the held records' streams; each done gets the
 * error). */
bool wal_hold_begin(struct wal *w);
void wal_hold_end(struct wal *w);

/* A barrier: done runs once every record of s submitted before it is
 * durable (rc 0), or with the error when s has failed or the log is broken.
 * Returns 0 or -ENOMEM (done is then never called). */
int wal_barrier(struct wal_stream *s, wal_done_fn done, void *ctx);

/* Waiting for one completion (the synchronous calls built on the loop). */
struct wal_waiter {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int rc;
    uint64_t seq, lsn;
};
void wal_waiter_init(struct wal_waiter *wt);
/* A wal_done_fn; ctx is the struct wal_waiter. */
void wal_waiter_done(void *ctx, int rc, uint64_t seq, uint64_t lsn);
/* Block until wal_waiter_done ran, free the waiter's resources and return
 * its rc (seq and lsn are filled).  Exactly once per wal_waiter_init. */
int wal_waiter_wait(struct wal_waiter *wt);

/* ---- segments ---- */

/* Bytes of the records (and segment headers) of every segment of the log:
 * what its bound counts.  Padding is not counted. */
uint64_t wal_bytes(struct wal *w);

/* Bytes of the log's files, padding included (room not counted). */
uint64_t wal_file_bytes(struct wal *w);

/* What wal_rescan_from(w, lsn) would walk now: *bytes of the log's files
 * from the seek mark it would start at to the end of the log (padding
 * included; every segment's when lsn is before the log), holding *records
 * records (durable ones, padding records not counted). */
void wal_span_from(struct wal *w, uint64_t lsn, uint64_t *bytes,
                   uint64_t *records);

/* The last LSN of the segments that are not the one being written, or
 * false when there is none. */
bool wal_closed_upto(struct wal *w, uint64_t *last_lsn);

/* Ask the commit thread to start a new segment (when the current one holds
 * a record), so that the current one can be discarded later. */
void wal_rotate(struct wal *w);

/* Delete the segments (never the one being written) whose records all
 * have LSN <= upto, durably (with fsync, a segment's file may be kept as a
 * spare instead, see Room).  Returns how many, or a negative errno. */
int wal_discard(struct wal *w, uint64_t upto);

/* What the log has written since wal_open (every byte it wrote into its
 * files, by kind) and how. */
struct wal_stats {
    uint64_t record_bytes;    /* records as framed (header, name, payload) */
    uint64_t padding_bytes;   /* padding records ending commit groups */
    uint64_t zero_bytes;      /* zeros written into new segments' room */
    uint64_t header_bytes;    /* segment headers, with the rest of their unit */
    uint64_t groups;          /* commit groups written */
    uint64_t syncs;           /* fdatasyncs of commit groups */
    uint64_t segments_fresh;  /* segments made new (fallocate, zeros) */
    uint64_t segments_reused; /* segments made over a spare */
    uint64_t spares;          /* spares held now */
    uint64_t inline_records;  /* written by their submitter (wal_submit_now) */
    uint64_t led_groups;      /* commit groups written by a leader (wal_lead) */
    uint64_t led_records;     /* records and barriers in them */
    /* Reading the open log (wal_rescan, wal_rescan_from): */
    uint64_t rescans;         /* scans done */
    uint64_t rescan_bytes;    /* bytes of records they read (read_bytes) */
};
void wal_stats(struct wal *w, struct wal_stats *out);

/* The highest LSN acknowledged; every record submitted later gets a higher
 * one. */
uint64_t wal_durable_lsn(struct wal *w);

/* The log's directory. */
const char *wal_dir(const struct wal *w);

/* Test hooks: replace fdatasync / write to inject failures or count
 * fsyncs.  Process-wide; only tests may change them, while no log is in
 * use (or, for counting, with a function that calls fdatasync). */
extern int (*wal__fdatasync)(int fd);
extern ssize_t (*wal__write)(int fd, const void *buf, size_t len);
/* How the log learns the free space of its file system (room for the next
 * segment is made only when there is plenty) and its block size (the write
 * unit). */
struct statvfs;
extern int (*wal__statvfs)(const char *path, struct statvfs *buf);
/* Where wal_unit_detect reads the device's block size ("/sys"). */
extern const char *wal__sysfs;

#endif
