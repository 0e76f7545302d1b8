/* wal: the node log's writer: streams, the queue and the commit thread (see
 * wal.h; the reader is wal_scan.c).
 *
 * Submitters append to one queue under the log's mutex and signal the
 * commit thread.  The thread takes the whole queue, frames it into one
 * buffer without the mutex (LSNs are given here, so a record that is
 * dropped because its stream failed leaves no hole), writes and syncs it,
 * publishes the durable LSN and runs the completions.  While it does I/O
 * the queue fills again: group commit needs no leader election and is not
 * bounded by the number of threads that wait.  With fsync, the completions
 * (which send the answers) run on a second thread, in commit order, so
 * that the next batch's fdatasync starts at once instead of after them.
 *
 * Write units (fsync only): no byte of a commit group shares a unit of
 * the file (wal_unit_detect) with a later group, so that a torn write can
 * only damage the group being written, never one already acknowledged.
 * The commit thread ends each group with a padding record up to the next
 * unit boundary, and a segment's header has a unit to itself.  The bytes
 * the log's bound counts (wal_bytes) are those of records, not padding.
 *
 * Inline (durability none): when the commit thread is idle, a submitter
 * takes the writing state itself (w->writing), writes its record and
 * hands the completion back (wal_submit_now); the commit thread waits
 * while anyone holds the writing state.
 *
 * Led groups (wal_lead): a thread that held back the wake of the commit
 * thread for its records (an event loop's pass) takes the writing state
 * itself when the commit thread and the completer are idle, writes and
 * syncs the queue as one group and runs its completions; the completer
 * holds back what is handed to it meanwhile (led_completing), so that
 * completions keep commit order.
 *
 * Spares (fsync only): a discarded segment's file is kept and the next
 * segment made over it (seg_reuse): no zeros and no allocation to record.
 *
 * Room (fsync only): a fresh segment is made with its blocks allocated
 * (fallocate) as far as it may grow, so the file's size does not change as
 * records are written and an fdatasync has no growth of the file to write
 * (docs/STORAGE.md has the figures).  The room after the last record
 * reads as zeros; it is cut when the segment is closed or the log is
 * closed, and after a crash the scan cuts it as it cuts a torn tail,
 * without counting it as torn.  Since each group starts in a unit never
 * written, the commit thread writes zeros into the room a stretch ahead of
 * the groups (ZERO_AHEAD), synced with the group before them: the file
 * system then converts its allocated blocks to written ones once per
 * stretch, not at the fdatasync of every group.
 */
#include "durable.h"
#include "log.h"
#include "metrics.h"
#include "wal.h"
#include "wal_format.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#define BUF_KEEP (16u << 20)   /* larger batch buffers are freed */
#define ROOM_MAX (64u << 20)   /* the most room a segment is made with */
#define ROOM_FREE 4            /* room is made only if the file system has
                                  this many times as much free */
#define ZERO_AHEAD (256u << 10)  /* zeros written ahead of the groups */
#define IN_PLACE_MIN (256u << 10)  /* payloads this large are written from
                                      their records, not copied into the
                                      batch buffer (write_batch) */

int (*wal__fdatasync)(int fd) = fdatasync;
ssize_t (*wal__write)(int fd, const void *buf, size_t len) = write;
int (*wal__statvfs)(const char *path, struct statvfs *buf) = statvfs;
const char *wal__sysfs = "/sys";

struct wal_rec {
    struct wal_rec *next;
    struct wal_stream *st;
    uint32_t type;               /* 0: a barrier */
    int rc;
    uint64_t seq, lsn, len;
    wal_done_fn done;
    void *ctx;
    uint8_t payload[];
};

struct wal_stream {
    struct wal *w;
    uint64_t id;
    char *name;
    size_t name_len;
    atomic_int refs;             /* the owner's and one per queued record */
    uint64_t next_seq;           /* under w->mu */
    atomic_bool failed;          /* set by the commit thread only */
    char why[WAL_ERRLEN];        /* written before failed is set */
    int err;                     /* the error that failed it, likewise */
};

/* Seek marks (wal_format.h): where a record begins in a segment, one at
 * the start of a commit group every WAL_SEEK_STRIDE bytes or more, so that
 * a scan from an LSN starts near it (wal_rescan_from) instead of at its
 * segment's start: 16 bytes per 256 KiB of the log (64 KiB of marks for a
 * log of 1 GiB).  Kept as groups are written, and for the segments there
 * at wal_open as it reads their headers (wal__seg_read: the groups
 * recovery read, after wal_scan cut any torn tail).  A segment's marks go
 * with it (wal_discard); a segment made over a spare starts with none. */
struct seg {
    uint64_t first;
    uint64_t bytes;              /* of the file, padding included */
    uint64_t recs;               /* of the header and records */
    uint64_t start;              /* where its records begin */
    struct wal__marks seek;      /* by LSN and offset, rising */
};

struct wal {
    char *dir;
    int durability;
    uint64_t seg_target;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct wal_rec *head, *tail; /* the queue, under mu */
    bool held;                   /* under mu: the queue holds only records
                                    held for a leader (wal_hold): the commit
                                    thread leaves them to it */
    bool stop, rotate;           /* under mu */
    /* Under mu: the commit thread or a submitter writing inline holds the
     * log's writing state (the fields "commit thread only" below). */
    bool writing;
    uint64_t delay_ns;           /* wal_set_commit_delay, under mu */
    uint64_t last_sync_ns;       /* the last fdatasync's time; writing */
    pthread_t thread;
    bool started;
    /* Commit thread only: */
    int fd;
    bool broken;
    uint64_t next_lsn;
    uint8_t *buf;
    size_t cap;
    struct in_place {            /* a payload written from its record */
        size_t at;               /* where it goes between buf's bytes */
        const uint8_t *p;
        size_t n;
    } *in_place;
    size_t nin_place, in_place_cap;
    char errtext[WAL_ERRLEN];
    /* Under mu: */
    uint64_t durable_lsn;
    struct seg *segs;            /* oldest first; the last is being written */
    size_t nsegs, segcap;
    uint64_t bytes;              /* records (wal_bytes) */
    uint64_t file_bytes;         /* files (wal_file_bytes) */
    /* wal_discard (exclusive) against wal_rescan (shared: any number of
     * scans at once); prefers the discard, which is short. */
    pthread_rwlock_t seg_mu;
    /* The completer (fsync only): committed batches, oldest first. */
    pthread_mutex_t cmu;
    pthread_cond_t ccv;
    struct wal_rec *chead, *ctail;
    bool cstop, cstarted;
    bool cbusy;                  /* the completer runs a batch */
    bool led_completing;         /* a leader (wal_lead) runs its group's
                                    completions: the completer waits */
    pthread_t cthread;
    uint64_t room;               /* fsync: a segment's room; 0: none */
    uint32_t unit;               /* fsync: the write unit; 0: none */
    /* Commit thread only, of the segment being written: */
    uint64_t off;                /* where the next group goes */
    uint64_t seg_room;           /* the room it was made with; 0: none */
    uint64_t zeroed;             /* written (zeros or groups) up to here */
    uint8_t *zeros;              /* ZERO_AHEAD bytes of zeros, or NULL */
    /* Spare segments (fsync only), under mu: files of discarded segments
     * (.wal-spare-<n>) kept to be written over by the next segments, at
     * most as many as make the log's files as many as they once were. */
    uint64_t *spares;
    size_t nspares, sparecap, peak_segs;
    uint64_t spare_next;
    struct wal_stats stats;      /* under mu */
};

/* snprintf that may truncate: paths are bounded by the checked dir. */
static void strfmt(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void strfmt(char *buf, size_t size, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;

    while (len) {
        ssize_t n = wal__write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int sync_fd(int fd)
{
    return wal__fdatasync(fd) < 0 ? (errno ? -errno : -EIO) : 0;
}

/* ---- write units ---- */

/* The device's physical block size under the file system holding dir
 * (sysfs; a partition's is its disk's), or 0 when there is none to read
 * (tmpfs, overlay, a network file system). */
static uint64_t device_block(const char *dir)
{
    static const char *const where[] = {
        "%s/dev/block/%u:%u/queue/physical_block_size",
        "%s/dev/block/%u:%u/../queue/physical_block_size",   /* partition */
    };
    struct stat st;
    unsigned long long v = 0;

    if (stat(dir, &st) < 0 || major(st.st_dev) == 0)
        return 0;
    for (size_t i = 0; i < sizeof(where) / sizeof(where[0]) && !v; i++) {
        char path[WAL_PATH_LEN];
        strfmt(path, sizeof(path), where[i], wal__sysfs, major(st.st_dev),
               minor(st.st_dev));
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        if (fscanf(f, "%llu", &v) != 1)
            v = 0;
        fclose(f);
    }
    return v;
}

static uint64_t pow2_at_least(uint64_t v)
{
    uint64_t p = 1;

    while (p < v && p < WAL_UNIT_MAX)
        p <<= 1;
    return p;
}

uint32_t wal_unit_detect(const char *dir, uint32_t at_least, char *how,
                         size_t howlen)
{
    long page = sysconf(_SC_PAGESIZE);
    struct statvfs sv;
    uint64_t fs = wal__statvfs(dir, &sv) == 0 ? sv.f_bsize : 0;
    uint64_t dev = device_block(dir), u = WAL_UNIT_MIN;

    if (page > 0 && (uint64_t)page > u)
        u = (uint64_t)page;
    if (fs > u)
        u = fs;
    if (dev > u)
        u = dev;
    if (at_least > u)
        u = at_least;
    u = pow2_at_least(u);
    if (how)
        strfmt(how, howlen, "page %ld, file system block %llu, device block "
               "%llu, wal_block_bytes %u%s", page, (unsigned long long)fs,
               (unsigned long long)dev, at_least,
               u == WAL_UNIT_MAX ? ", at most 1 MiB" : "");
    return (uint32_t)u;
}

/* ---- room ---- */

/* Is there plenty of space for room?  When the file system is nearly
 * full, segments grow as they are written. */
static bool room_fits(struct wal *w)
{
    struct statvfs sv;

    return w->room && wal__statvfs(w->dir, &sv) == 0 &&
           (uint64_t)sv.f_bavail * sv.f_frsize / ROOM_FREE >= w->room;
}

/* Close the segment being written, its room after the last record cut
 * (a no-op for one made without room, which ends there).  A broken one
 * keeps what its failed batch wrote, which the next segment supersedes.
 * The cut need not be durable: a scan after a crash cuts the room too. */
static void seg_close(struct wal *w)
{
    off_t end = lseek(w->fd, 0, SEEK_CUR);

    if (!w->broken && end > 0 && ftruncate(w->fd, end) < 0)
        log_warn("wal: cannot cut the unused room of a log segment: %s",
                 strerror(errno));
    close(w->fd);
    w->fd = -1;
}

/* ---- segments ---- */

static void spare_path(const struct wal *w, char *buf, size_t len, uint64_t n)
{
    strfmt(buf, len, "%s/.wal-spare-%016llx", w->dir, (unsigned long long)n);
}

/* Create segment wal-<first>.log durably (temp file, room, header and the
 * rest of its unit, sync, rename, directory sync); *fd stays open,
 * positioned where the first record goes; *room is the room it was made
 * with (0: none). */
static int seg_fresh(struct wal *w, uint64_t first, int *fd, uint64_t *room,
                     char *err)
{
    struct durable_file df;
    char name[32], path[WAL_PATH_LEN];
    size_t start = wal__seg_start(w->unit);
    uint8_t *h = calloc(1, start);   /* the header, then zeros: its unit */
    int rc;

    if (!h) {
        errmsg_set(err, "out of memory");
        return -ENOMEM;
    }
    wal__seg_name(name, sizeof(name), first);
    strfmt(path, sizeof(path), "%s/%s", w->dir, name);
    if ((rc = durable_open(&df, path, ".wal-new.tmp", 0644, err)) < 0) {
        free(h);
        return rc;
    }
    *room = 0;
    if (room_fits(w)) {
        if (fallocate(df.fd, 0, 0, (off_t)w->room) == 0)
            *room = w->room;
        else if (ftruncate(df.fd, 0) < 0)   /* what a failed one allocated */
            log_warn("wal: cannot cut a segment's room: %s", strerror(errno));
    }
    df.sync = wal__fdatasync;
    wal__seg_header(h, first, w->unit);
    rc = write_all(df.fd, h, start);
    free(h);
    if (rc < 0) {
        errmsg_set(err, "cannot write the header of %s: %s", path,
                   strerror(-rc));
        durable_abort(&df);
        return rc;
    }
    if ((rc = durable_publish(&df, err)) < 0) {
        durable_abort(&df);
        return rc;
    }
    *fd = df.fd;
    return 0;
}

/* Make segment wal-<first>.log from spare n: its blocks were written
 * once, so records written over them need no change of the file's
 * metadata at their fdatasync (as blocks allocated but never written
 * would), and no zeros are written ahead of them.  Its header's unit is
 * written (the header and the mark saying that the room after the records
 * may hold an earlier segment's bytes, wal_format.h) and synced before the
 * rename, then the directory is synced.  The room is the spare's size
 * (*room and *written; a segment is closed once it holds seg_target bytes,
 * so only its last group may go past it, growing the file).  Returns -1
 * when the spare cannot be used (it is removed): the caller makes a fresh
 * segment. */
static int seg_reuse(struct wal *w, uint64_t n, uint64_t first, int *fd,
                     uint64_t *room, uint64_t *written)
{
    char sp[WAL_PATH_LEN], name[32], path[WAL_PATH_LEN];
    struct stat st;
    uint8_t *h = calloc(1, w->unit);
    int f;

    spare_path(w, sp, sizeof(sp), n);
    f = open(sp, O_RDWR | O_CLOEXEC);
    if (!h || f < 0 || fstat(f, &st) < 0 ||
        (uint64_t)st.st_size < 2 * (uint64_t)w->unit)
        goto fail;
    *written = (uint64_t)st.st_size;
    *room = *written;
    /* Its pages are clean (synced before it was discarded): drop them, so
     * that the page cache makes new ones as the groups are written, none
     * larger than a group.  A large one left from earlier writes would be
     * dirtied (and written) whole by each group written into part of it. */
    posix_fadvise(f, 0, 0, POSIX_FADV_DONTNEED);
    wal__seg_header(h, first, w->unit);
    wal__seg_reuse_mark(h, w->unit);
    wal__seg_name(name, sizeof(name), first);
    strfmt(path, sizeof(path), "%s/%s", w->dir, name);
    if (pwrite(f, h, w->unit, 0) != (ssize_t)w->unit || sync_fd(f) < 0 ||
        rename(sp, path) < 0)
        goto fail;
    if (durable_fsync_dir(w->dir) < 0 ||
        lseek(f, (off_t)w->unit, SEEK_SET) < 0) {
        /* Published but not known durable: it is a segment now, so it
         * cannot go back to the spares.  Cut it to its header. */
        log_warn("wal: cannot sync %s after making %s: %s", w->dir, name,
                 strerror(errno));
        if (ftruncate(f, 0) < 0 || unlink(path) < 0)
            log_warn("wal: cannot remove %s: %s", path, strerror(errno));
        free(h);
        close(f);
        return -1;
    }
    free(h);
    *fd = f;
    return 0;
fail:
    log_warn("wal: cannot reuse the spare segment %s: %s", sp,
             h ? strerror(errno) : "out of memory");
    free(h);
    if (f >= 0)
        close(f);
    unlink(sp);
    return -1;
}

/* Switch to a new segment starting at w->next_lsn: a spare written over,
 * or a fresh one.  Commit thread. */
static int seg_switch(struct wal *w, char *err)
{
    uint64_t room = 0, written = 0, spare = 0;
    bool have = false, reused = false;
    int fd = -1, rc;

    pthread_mutex_lock(&w->mu);
    if (w->nspares) {
        spare = w->spares[--w->nspares];
        have = true;
    }
    pthread_mutex_unlock(&w->mu);
    if (have && w->unit)
        reused = seg_reuse(w, spare, w->next_lsn, &fd, &room, &written) == 0;
    if (!reused &&
        (rc = seg_fresh(w, w->next_lsn, &fd, &room, err)) < 0)
        return rc;
    pthread_mutex_lock(&w->mu);
    if (reused)
        w->stats.segments_reused++;
    else
        w->stats.segments_fresh++;
    w->stats.header_bytes += wal__seg_start(w->unit);
    if (w->nsegs == w->segcap) {
        size_t cap = w->segcap ? 2 * w->segcap : 16;
        struct seg *v = realloc(w->segs, cap * sizeof(*v));
        if (!v) {
            pthread_mutex_unlock(&w->mu);
            close(fd);
            errmsg_set(err, "out of memory");
            return -ENOMEM;
        }
        w->segs = v;
        w->segcap = cap;
    }
    /* A new segment may start at an LSN an abandoned one holds: the old
     * one's records from there on are ignored (wal.h). */
    w->segs[w->nsegs++] = (struct seg){w->next_lsn, wal__seg_start(w->unit),
                                       WAL_SEG_HDR, wal__seg_start(w->unit),
                                       {NULL, 0, 0}};
    if (w->nsegs > w->peak_segs)
        w->peak_segs = w->nsegs;
    w->bytes += WAL_SEG_HDR;
    w->file_bytes += wal__seg_start(w->unit);
    pthread_mutex_unlock(&w->mu);
    if (w->fd >= 0)
        seg_close(w);
    w->fd = fd;
    w->broken = false;
    w->off = wal__seg_start(w->unit);
    w->zeroed = written > w->off ? written : w->off;
    w->seg_room = room;
    return 0;
}

/* Groups start in units never written: keep zeros written into the room
 * at least half a stretch ahead of end (where the next group goes), so
 * that the fdatasync of a group does not wait for the file system to mark
 * its blocks written (they are, from the zeros).  Only inside the room
 * made with the segment: past it the zeros would grow the file, and the
 * scan would count them as a torn tail.  A failed write only stops it. */
static void zero_ahead(struct wal *w, uint64_t end)
{
    uint64_t from = end > w->zeroed ? end : w->zeroed, to;

    if (!w->unit || !w->seg_room || end + ZERO_AHEAD / 2 <= w->zeroed)
        return;
    to = end + ZERO_AHEAD < w->seg_room ? end + ZERO_AHEAD : w->seg_room;
    if (from >= to || (!w->zeros && !(w->zeros = calloc(1, ZERO_AHEAD))))
        return;
    /* A unit per write: the page cache makes its folios as large as the
     * writes that create them (within alignment), and a later group
     * written into part of a large folio would make the whole folio dirty
     * (and written) again. */
    while (from < to) {
        size_t len = to - from < w->unit ? (size_t)(to - from) : w->unit;
        ssize_t n = pwrite(w->fd, w->zeros, len, (off_t)from);
        if (n <= 0) {
            if (n < 0 && errno == EINTR)
                continue;
            log_warn("wal: cannot write zeros ahead into a segment's room: "
                     "%s", n < 0 ? strerror(errno) : "nothing written");
            w->seg_room = 0;
            return;
        }
        from += (uint64_t)n;
    }
    pthread_mutex_lock(&w->mu);
    w->stats.zero_bytes += to - (end > w->zeroed ? end : w->zeroed);
    pthread_mutex_unlock(&w->mu);
    w->zeroed = to;
}

/* ---- the commit thread ---- */

static int buf_reserve(struct wal *w, size_t need)
{
    if (need <= w->cap)
        return 0;
    size_t cap = w->cap ? w->cap : 64 * 1024;
    while (cap < need)
        cap *= 2;
    uint8_t *p = realloc(w->buf, cap);
    if (!p)
        return -ENOMEM;
    w->buf = p;
    w->cap = cap;
    return 0;
}

/* The header and name of e at r, then its payload unless copy is false
 * (the caller writes it from the record after them). */
static void frame(uint8_t *r, const struct wal_rec *e, uint64_t commit,
                  bool copy)
{
    const struct wal_stream *s = e->st;

    wal__put32(r + WAL_O_MAGIC, WAL_REC_MAGIC);
    wal__put16(r + WAL_O_TYPE, (uint16_t)e->type);
    wal__put16(r + WAL_O_NAMELEN, (uint16_t)s->name_len);
    wal__put64(r + WAL_O_LEN, e->len);
    wal__put64(r + WAL_O_LSN, e->lsn);
    wal__put64(r + WAL_O_COMMIT, commit);
    wal__put64(r + WAL_O_ID, s->id);
    wal__put64(r + WAL_O_SEQ, e->seq);
    wal__put64(r + WAL_O_PSUM, XXH64(e->payload, (size_t)e->len, 0));
    memcpy(r + WAL_REC_HDR, s->name, s->name_len);
    wal__put64(r + WAL_O_HSUM, wal__hdr_sum(r, s->name_len));
    if (copy)
        memcpy(r + WAL_REC_HDR + s->name_len, e->payload, (size_t)e->len);
}

/* End a group of *len bytes, *blen of them in w->buf (the rest payloads
 * written in place), with a padding record up to the next unit boundary
 * (one unit more when the gap is shorter than a record header), added to
 * both.  0, or -ENOMEM. */
static int pad_group(struct wal *w, size_t *blen, size_t *len,
                     uint64_t commit)
{
    size_t pad = (w->unit - *len % w->unit) % w->unit;
    uint8_t *r;

    if (pad == 0)
        return 0;
    if (pad < WAL_REC_HDR)
        pad += w->unit;
    if (buf_reserve(w, *blen + pad) < 0)
        return -ENOMEM;
    r = w->buf + *blen;
    *blen += pad;
    *len += pad;
    memset(r, 0, pad);
    wal__put32(r + WAL_O_MAGIC, WAL_REC_MAGIC);
    wal__put16(r + WAL_O_TYPE, WAL_REC_PAD);
    wal__put64(r + WAL_O_LEN, pad - WAL_REC_HDR);
    wal__put64(r + WAL_O_LSN, w->next_lsn);
    wal__put64(r + WAL_O_COMMIT, commit);
    wal__put64(r + WAL_O_HSUM, wal__hdr_sum(r, 0));
    return 0;
}

static void stream_fail(struct wal_stream *s, const char *why)
{
    if (atomic_load(&s->failed))
        return;
    strfmt(s->why, sizeof(s->why), "%s", why);
    atomic_store(&s->failed, true);
}

static void complete(struct wal_rec *list)
{
    while (list) {
        struct wal_rec *e = list;
        list = e->next;
        e->done(e->ctx, e->rc, e->seq, e->lsn);
        wal_stream_close(e->st);   /* the record's reference */
        free(e);
    }
}

/* Hand a committed batch (list ... last) to the completer, behind the ones
 * before it. */
static void complete_later(struct wal *w, struct wal_rec *list, struct wal_rec *last)
{
    pthread_mutex_lock(&w->cmu);
    if (w->ctail)
        w->ctail->next = list;
    else
        w->chead = list;
    w->ctail = last;
    pthread_cond_signal(&w->ccv);
    pthread_mutex_unlock(&w->cmu);
}

static void *completer_main(void *arg)
{
    struct wal *w = arg;
    pthread_mutex_lock(&w->cmu);
    for (;;) {
        /* A leader's group (wal_lead) was committed before anything
         * queued here meanwhile: its completions run first. */
        while ((!w->chead || w->led_completing) && !w->cstop)
            pthread_cond_wait(&w->ccv, &w->cmu);
        struct wal_rec *list = w->chead;
        w->chead = w->ctail = NULL;
        if (!list)
            break;
        w->cbusy = true;
        pthread_mutex_unlock(&w->cmu);
        complete(list);
        pthread_mutex_lock(&w->cmu);
        w->cbusy = false;
    }
    pthread_mutex_unlock(&w->cmu);
    return NULL;
}

/* ---- metrics (metrics.h): one series per process, whatever the logs ---- */

static struct {
    struct metric *fsync, *group, *bytes, *padding, *rescans, *rescan_bytes;
} wm;
static pthread_once_t wm_once = PTHREAD_ONCE_INIT;

static const double group_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

static void wm_register(void)
{
    struct metrics *m = metrics_registry();
    wm.fsync = metrics_histogram(m, "bloomgrid_wal_fsync_duration_seconds",
                                 "time of the write-ahead log's fdatasync of one "
                                 "commit group", NULL, metrics_latency_bounds,
                                 metrics_latency_nbounds);
    wm.group = metrics_histogram(m, "bloomgrid_wal_group_records",
                                 "log records written by one commit group", NULL,
                                 group_bounds, sizeof group_bounds / sizeof *group_bounds);
    wm.bytes = metrics_counter(m, "bloomgrid_wal_written_bytes_total",
                               "bytes appended to the write-ahead log", NULL);
    wm.padding = metrics_counter(m, "bloomgrid_wal_padding_bytes_total",
                                 "of the bytes appended to the write-ahead "
                                 "log, those padding commit groups to whole "
                                 "write units", NULL);
    wm.rescans = metrics_counter(m, "bloomgrid_wal_rescans_total",
                                 "scans of the open write-ahead log (keyed "
                                 "pulls, checkpoints of records, reloads)",
                                 NULL);
    wm.rescan_bytes = metrics_counter(m, "bloomgrid_wal_rescan_bytes_total",
                                      "bytes of log records those scans read: "
                                      "every header met, the payloads "
                                      "checked", NULL);
}

void wal_metrics_register(void)
{
    pthread_once(&wm_once, wm_register);
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Room for one more payload written in place.  0, or -ENOMEM. */
static int in_place_reserve(struct wal *w)
{
    if (w->nin_place < w->in_place_cap)
        return 0;
    size_t cap = w->in_place_cap ? 2 * w->in_place_cap : 4;
    struct in_place *v = realloc(w->in_place, cap * sizeof(*v));
    if (!v)
        return -ENOMEM;
    w->in_place = v;
    w->in_place_cap = cap;
    return 0;
}

/* Write a group: blen bytes of w->buf with the payloads written in place
 * between them, in order, as consecutive writes. */
static int write_group(struct wal *w, size_t blen)
{
    size_t at = 0;
    int rc;

    for (size_t i = 0; i < w->nin_place; i++) {
        const struct in_place *x = &w->in_place[i];
        if ((rc = write_all(w->fd, w->buf + at, x->at - at)) < 0 ||
            (rc = write_all(w->fd, x->p, x->n)) < 0)
            return rc;
        at = x->at;
    }
    return write_all(w->fd, w->buf + at, blen - at);
}

/* Write one batch (list, linked by next): frame, write, sync, and set each
 * record's rc and lsn.  Holder of the writing state.  The batch is framed
 * into w->buf and written as one group; a large payload (an Import's
 * whole file, a piece of pages) is not copied into the buffer but written
 * from its record between the buffer's bytes, so the log never holds a
 * second copy of it. */
static void write_batch(struct wal *w, struct wal_rec *list)
{
    uint64_t commit, first = w->next_lsn;
    size_t len = 0, blen = 0, recs = 0;
    char why[WAL_ERRLEN];
    int rc = 0;

    if (w->broken && (rc = seg_switch(w, why)) < 0)
        strfmt(w->errtext, sizeof(w->errtext), "the write-ahead log in %s "
               "has no usable segment: %s", w->dir, why);
    pthread_mutex_lock(&w->mu);
    commit = w->durable_lsn;
    pthread_mutex_unlock(&w->mu);
    w->nin_place = 0;
    for (struct wal_rec *e = list; e && rc == 0; e = e->next) {
        if (atomic_load(&e->st->failed)) {
            e->rc = e->st->err;
            continue;
        }
        if (!e->type) {
            e->lsn = w->next_lsn - 1;
            continue;
        }
        size_t sz = WAL_REC_HDR + e->st->name_len + (size_t)e->len;
        bool copy = e->len < IN_PLACE_MIN;
        size_t bsz = copy ? sz : sz - (size_t)e->len;
        if (buf_reserve(w, blen + bsz) < 0 ||
            (!copy && in_place_reserve(w) < 0)) {
            strfmt(w->errtext, sizeof(w->errtext), "no memory for a batch of "
                   "%zu bytes of the write-ahead log", len + sz);
            rc = -EIO;
            break;
        }
        e->lsn = w->next_lsn++;
        frame(w->buf + blen, e, commit, copy);
        blen += bsz;
        if (!copy)
            w->in_place[w->nin_place++] = (struct in_place){
                .at = blen, .p = e->payload, .n = (size_t)e->len};
        len += sz;
    }
    recs = len;
    if (rc == 0 && len && w->unit && pad_group(w, &blen, &len, commit) < 0) {
        strfmt(w->errtext, sizeof(w->errtext), "no memory for a batch of "
               "%zu bytes of the write-ahead log", recs + 2 * w->unit);
        rc = -EIO;
    }
    if (rc == 0 && len) {
        rc = write_group(w, blen);
        pthread_once(&wm_once, wm_register);
        if (rc == 0)
            zero_ahead(w, w->off + len);
        if (rc == 0 && w->durability == WAL_SYNC_FSYNC) {
            double t0 = mono_s();
            rc = sync_fd(w->fd);
            double took = mono_s() - t0;
            metric_observe(wm.fsync, took);
            w->last_sync_ns = (uint64_t)(took * 1e9);
        }
        metric_observe(wm.group, (double)(w->next_lsn - first));
        metric_add(wm.bytes, len);
        metric_add(wm.padding, len - recs);
        if (rc < 0) {
            char name[32];
            wal__seg_name(name, sizeof(name), w->segs[w->nsegs - 1].first);
            strfmt(w->errtext, sizeof(w->errtext), "%s of %s/%s failed: %s",
                   w->durability == WAL_SYNC_FSYNC ? "write/fdatasync"
                                                   : "write",
                   w->dir, name, strerror(-rc));
        }
    }
    if (rc == 0) {
        pthread_mutex_lock(&w->mu);
        w->durable_lsn = w->next_lsn - 1;
        struct seg *cur = &w->segs[w->nsegs - 1];
        if (recs)
            wal__marks_add(&cur->seek, cur->start, first, w->off);
        w->segs[w->nsegs - 1].bytes += len;
        w->segs[w->nsegs - 1].recs += recs;
        w->bytes += recs;
        w->file_bytes += len;
        if (len) {
            w->stats.record_bytes += recs;
            w->stats.padding_bytes += len - recs;
            w->stats.groups++;
            w->stats.syncs += w->durability == WAL_SYNC_FSYNC;
        }
        pthread_mutex_unlock(&w->mu);
        w->off += len;
    } else {
        /* Nothing of the batch is acknowledged; its LSNs are given again
         * in a new segment, and its streams fail with the error that
         * happened (-ENOSPC on a full disk). */
        w->next_lsn = first;
        for (struct wal_rec *e = list; e; e = e->next)
            if (e->type && !atomic_load(&e->st->failed)) {
                e->st->err = rc;   /* before failed, as why */
                stream_fail(e->st, w->errtext);
            }
        if (!w->broken) {
            w->broken = true;
            if (seg_switch(w, why) == 0)
                w->broken = false;
        }
        /* Barriers of other streams hold: their records are durable. */
        for (struct wal_rec *e = list; e; e = e->next) {
            e->rc = atomic_load(&e->st->failed) ? e->st->err
                    : w->broken ? rc : 0;
            e->lsn = first - 1;
        }
    }
    if (w->cap > BUF_KEEP) {
        free(w->buf);
        w->buf = NULL;
        w->cap = 0;
    }
}

/* Commit one batch (the queue as it was taken: list ... last). */
static void commit_batch(struct wal *w, struct wal_rec *list, struct wal_rec *last)
{
    write_batch(w, list);
    if (w->cstarted)
        complete_later(w, list, last);
    else
        complete(list);
}

static void rotate_now(struct wal *w)
{
    char why[WAL_ERRLEN];

    if (seg_switch(w, why) < 0)
        log_warn("wal: cannot start a new segment: %s", why);
}

static void *commit_main(void *arg)
{
    struct wal *w = arg;

    /* The commit delay: when records came in during the last group's
     * write and fsync (writers keep coming: the answers of that group are
     * going out and bring the next writes), the next group starts no
     * sooner than delay after the last one ended, so that it takes those
     * writes too; never longer than the last fdatasync took, so that a
     * group waits at most as long as it is written (on a fast disk a few
     * writers in flight would otherwise wait longer than their sync).  A
     * writer alone never waits: its next write comes after the answer, to
     * an empty queue. */
    struct timespec ended = {0, 0};
    bool busy = false;

    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->writing || ((!w->head || w->held) && !w->stop && !w->rotate))
            pthread_cond_wait(&w->cv, &w->mu);
        if (busy && w->delay_ns && !w->stop && w->head) {
            struct timespec until = ended;
            uint64_t d = w->delay_ns < w->last_sync_ns ? w->delay_ns
                                                       : w->last_sync_ns;
            uint64_t ns = (uint64_t)until.tv_nsec + d;
            until.tv_sec += (time_t)(ns / 1000000000u);
            until.tv_nsec = (long)(ns % 1000000000u);
            while (!w->stop &&
                   pthread_cond_timedwait(&w->cv, &w->mu, &until) != ETIMEDOUT)
                ;
        }
        struct wal_rec *list = w->head, *last = w->tail;
        bool rotate = w->rotate;
        w->head = w->tail = NULL;
        w->held = false;
        w->rotate = false;
        if (!list && w->stop)
            break;
        bool holds = w->segs[w->nsegs - 1].recs > WAL_SEG_HDR;
        w->writing = true;
        pthread_mutex_unlock(&w->mu);
        /* A rotation asked for comes before what was submitted after it;
         * a full segment (its file's bytes) is closed between batches.
         * Failing to start the next one only delays that. */
        if (rotate && !w->broken && holds)
            rotate_now(w);
        if (list)
            commit_batch(w, list, last);
        pthread_mutex_lock(&w->mu);
        busy = list && w->head;   /* writes came during this group */
        clock_gettime(CLOCK_MONOTONIC, &ended);
        uint64_t cur = w->segs[w->nsegs - 1].bytes;
        pthread_mutex_unlock(&w->mu);
        if (!w->broken && cur >= w->seg_target)
            rotate_now(w);
        pthread_mutex_lock(&w->mu);
        w->writing = false;
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* ---- the interface ---- */

struct wal *wal_open(const char *dir, uint64_t next_lsn, int durability,
                     uint64_t segment_bytes, uint32_t unit_bytes, char *err)
{
    struct wal *w = calloc(1, sizeof(*w));

    if (!w) {
        errmsg_set(err, "out of memory");
        return NULL;
    }
    w->fd = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);   /* the commit delay */
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra,
                                  PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&w->seg_mu, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_mutex_init(&w->cmu, NULL);
    pthread_cond_init(&w->ccv, NULL);
    if (strlen(dir) > 3800) {
        errmsg_set(err, "write-ahead log directory path is too long");
        goto fail;
    }
    if (!(w->dir = strdup(dir))) {
        errmsg_set(err, "out of memory");
        goto fail;
    }
    if (mkdir(dir, 0755) < 0 && errno != EEXIST) {
        errmsg_set(err, "cannot create %s: %s", dir, strerror(errno));
        goto fail;
    }
    w->durability = durability;
    w->seg_target = segment_bytes ? segment_bytes : UINT64_C(16) << 20;
    w->next_lsn = next_lsn ? next_lsn : 1;
    w->durable_lsn = w->next_lsn - 1;
    /* Segments already there (read by wal_scan) count until discarded. */
    struct wal__seg *v = NULL;
    size_t n = 0;
    if (wal__seg_list(dir, false, &v, &n) < 0 ||
        !(w->segs = calloc(n + 16, sizeof(*w->segs)))) {
        free(v);
        errmsg_set(err, "cannot list the segments in %s", dir);
        goto fail;
    }
    w->segcap = n + 16;
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        char path[WAL_PATH_LEN];
        strfmt(path, sizeof(path), "%s/%s", dir, v[i].name);
        if (v[i].first >= w->next_lsn || stat(path, &st) < 0)
            continue;   /* one at next_lsn is empty and replaced below */
        /* Its records as recovery read them: up to where the next segment
         * (or the next record) begins. */
        uint64_t below = i + 1 < n && v[i + 1].first < w->next_lsn
                             ? v[i + 1].first : w->next_lsn;
        struct wal__seg_info si;
        wal__seg_read(path, (uint64_t)st.st_size, v[i].first, below, &si);
        w->segs[w->nsegs++] = (struct seg){
            v[i].first, (uint64_t)st.st_size, si.record_bytes, si.start,
            si.marks};
        w->bytes += w->segs[w->nsegs - 1].recs;
        w->file_bytes += (uint64_t)st.st_size;
    }
    free(v);
    if (durability == WAL_SYNC_FSYNC) {
        char how[WAL_ERRLEN];
        w->unit = wal_unit_detect(dir, unit_bytes, how, sizeof(how));
        log_info("wal: %s is written in units of %u bytes (%s)", dir, w->unit,
                 how);
        /* A segment holds a fair number of commit groups. */
        if (w->seg_target < 16 * (uint64_t)w->unit)
            w->seg_target = 16 * (uint64_t)w->unit;
        /* Room as large as a segment grows, within reason. */
        uint64_t room = w->seg_target + w->seg_target / 16;
        room = room > ROOM_MAX ? ROOM_MAX : room;
        w->room = (room + WAL_ROOM_UNIT - 1) / WAL_ROOM_UNIT * WAL_ROOM_UNIT;
    }
    if (seg_switch(w, err) < 0)
        goto fail;
    if (durability == WAL_SYNC_FSYNC) {
        if (pthread_create(&w->cthread, NULL, completer_main, w) != 0) {
            errmsg_set(err, "cannot start the commit thread's completer");
            goto fail;
        }
        w->cstarted = true;
    }
    if (pthread_create(&w->thread, NULL, commit_main, w) != 0) {
        errmsg_set(err, "cannot start the commit thread");
        goto fail;
    }
    w->started = true;
    return w;
fail:
    wal_close(w);
    return NULL;
}

void wal_close(struct wal *w)
{
    if (!w)
        return;
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    if (w->cstarted) {   /* after the commit thread: its last batch too */
        pthread_mutex_lock(&w->cmu);
        w->cstop = true;
        pthread_cond_signal(&w->ccv);
        pthread_mutex_unlock(&w->cmu);
        pthread_join(w->cthread, NULL);
    }
    if (w->fd >= 0)
        seg_close(w);
    for (size_t i = 0; i < w->nspares; i++) {
        char sp[WAL_PATH_LEN];
        spare_path(w, sp, sizeof(sp), w->spares[i]);
        unlink(sp);
    }
    free(w->spares);
    free(w->zeros);
    free(w->buf);
    free(w->in_place);
    for (size_t i = 0; i < w->nsegs; i++)
        free(w->segs[i].seek.v);
    free(w->segs);
    free(w->dir);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    pthread_rwlock_destroy(&w->seg_mu);
    pthread_mutex_destroy(&w->cmu);
    pthread_cond_destroy(&w->ccv);
    free(w);
}

struct wal_stream *wal_stream_open(struct wal *w, uint64_t id,
                                   const char *name, uint64_t next_seq)
{
    struct wal_stream *s = calloc(1, sizeof(*s));
    size_t len = strlen(name);

    if (!s || len == 0 || len > WAL_NAME_MAX || !(s->name = strdup(name))) {
        free(s);
        return NULL;
    }
    s->w = w;
    s->id = id;
    s->name_len = len;
    s->next_seq = next_seq ? next_seq : 1;
    atomic_init(&s->refs, 1);
    atomic_init(&s->failed, false);
    return s;
}

void wal_stream_close(struct wal_stream *s)
{
    if (s && atomic_fetch_sub(&s->refs, 1) == 1) {
        free(s->name);
        free(s);
    }
}

bool wal_stream_failed(struct wal_stream *s, char *why)
{
    bool f = atomic_load(&s->failed);

    if (why)
        strfmt(why, WAL_ERRLEN, "%s", f ? s->why : "");
    return f;
}

int wal_stream_error(struct wal_stream *s)
{
    return atomic_load(&s->failed) ? s->err : 0;
}

uint64_t wal_stream_last_seq(struct wal_stream *s)
{
    pthread_mutex_lock(&s->w->mu);
    uint64_t v = s->next_seq - 1;
    pthread_mutex_unlock(&s->w->mu);
    return v;
}

struct wal_rec *wal_rec_new(uint32_t type, const void *payload, uint64_t len)
{
    struct wal_rec *r;

    if (len > WAL_MAX_PAYLOAD || len > SIZE_MAX - sizeof(*r) ||
        !(r = malloc(sizeof(*r) + (size_t)len)))
        return NULL;
    memset(r, 0, sizeof(*r));
    r->type = type;
    r->len = len;
    if (payload && len)
        memcpy(r->payload, payload, (size_t)len);
    return r;
}

void *wal_rec_payload(struct wal_rec *r)
{
    return r->payload;
}

void wal_rec_free(struct wal_rec *r)
{
    free(r);
}

void wal_rec_truncate(struct wal_rec *r, uint64_t len)
{
    if (len < r->len)
        r->len = len;
}

/* wal_hold / wal_lead: does this thread hold back the wake of the commit
 * thread, and for which log it did (records of a second log wake it). */
static __thread bool hold_on;
static __thread struct wal *held_w;

/* Queue r as the next record (or barrier) of s.  Under mu. */
static uint64_t enqueue_locked(struct wal_stream *s, struct wal_rec *r,
                               wal_done_fn done, void *ctx)
{
    struct wal *w = s->w;
    uint64_t seq;

    r->st = s;
    r->done = done;
    r->ctx = ctx;
    r->next = NULL;
    atomic_fetch_add(&s->refs, 1);
    seq = r->type ? s->next_seq++ : s->next_seq - 1;
    r->seq = seq;
    bool was_empty = !w->head;
    if (w->tail)
        w->tail->next = r;
    else
        w->head = r;
    w->tail = r;
    if (hold_on && (!held_w || held_w == w)) {
        /* wal_lead commits it, or wakes the commit thread; until then the
         * commit thread leaves a queue of held records alone */
        held_w = w;
        if (was_empty)
            w->held = true;
    } else {
        w->held = false;
        pthread_cond_signal(&w->cv);
    }
    return seq;
}

static uint64_t enqueue(struct wal_stream *s, struct wal_rec *r,
                        wal_done_fn done, void *ctx)
{
    pthread_mutex_lock(&s->w->mu);
    uint64_t seq = enqueue_locked(s, r, done, ctx);
    pthread_mutex_unlock(&s->w->mu);
    return seq;
}

uint64_t wal_submit(struct wal_stream *s, struct wal_rec *r, wal_done_fn done,
                    void *ctx)
{
    if (r->type == 0)
        r->type = WAL_REC_ADD;   /* 0 is the barrier's */
    return enqueue(s, r, done, ctx);
}

/* May a submitter write now, in its own thread?  Under mu. */
static bool inline_ok(const struct wal *w)
{
    return w->durability == WAL_SYNC_NONE && !w->writing && !w->head &&
           !w->rotate && !w->stop && !w->broken;
}

/* This thread's held records (wal_hold_begin): written together by
 * wal_hold_end. */
static __thread struct {
    struct wal *w;               /* whose writing state the thread holds */
    unsigned depth;
    struct wal_rec *head, *tail;
} hold;

bool wal_hold_begin(struct wal *w)
{
    if (hold.depth++ > 0)
        return hold.w == w;
    pthread_mutex_lock(&w->mu);
    if (inline_ok(w)) {
        w->writing = true;
        hold.w = w;
    }
    pthread_mutex_unlock(&w->mu);
    return hold.w == w;
}

void wal_hold_end(struct wal *w)
{
    if (hold.depth == 0 || --hold.depth > 0 || hold.w != w)
        return;
    struct wal_rec *list = hold.head;
    uint64_t n = 0;
    hold.w = NULL;
    hold.head = hold.tail = NULL;
    for (struct wal_rec *e = list; e; e = e->next)
        n++;
    if (list)
        write_batch(w, list);
    pthread_mutex_lock(&w->mu);
    w->writing = false;
    if (w->segs[w->nsegs - 1].bytes >= w->seg_target && !w->broken)
        w->rotate = true;   /* the commit thread starts the next segment */
    if (w->head || w->rotate)
        pthread_cond_signal(&w->cv);
    w->stats.inline_records += n;
    pthread_mutex_unlock(&w->mu);
    complete(list);
}

bool wal_submit_now(struct wal_stream *s, struct wal_rec *r, wal_done_fn done,
                    void *ctx, struct wal_now *now)
{
    struct wal *w = s->w;
    bool full;

    if (r->type == 0)
        r->type = WAL_REC_ADD;   /* 0 is the barrier's */
    memset(now, 0, sizeof(*now));
    pthread_mutex_lock(&w->mu);
    if (hold.w == w) {
        /* Held: framed and written with the others at wal_hold_end; this
         * thread holds the writing state, so nothing is written between. */
        r->st = s;
        r->done = done;
        r->ctx = ctx;
        r->next = NULL;
        atomic_fetch_add(&s->refs, 1);
        r->seq = s->next_seq++;
        pthread_mutex_unlock(&w->mu);
        if (hold.tail)
            hold.tail->next = r;
        else
            hold.head = r;
        hold.tail = r;
        return false;
    }
    if (!inline_ok(w)) {
        enqueue_locked(s, r, done, ctx);
        pthread_mutex_unlock(&w->mu);
        return false;
    }
    w->writing = true;
    r->st = s;
    r->next = NULL;
    r->seq = s->next_seq++;
    pthread_mutex_unlock(&w->mu);
    write_batch(w, r);
    pthread_mutex_lock(&w->mu);
    full = w->segs[w->nsegs - 1].bytes >= w->seg_target;
    w->writing = false;
    if (full && !w->broken)
        w->rotate = true;   /* the commit thread starts the next segment */
    if (w->head || w->rotate)
        pthread_cond_signal(&w->cv);
    w->stats.inline_records++;
    pthread_mutex_unlock(&w->mu);
    *now = (struct wal_now){done, ctx, r->rc, r->seq, r->lsn, true};
    free(r);
    return true;
}

void wal_now_complete(struct wal_now *now)
{
    if (!now->pending)
        return;
    now->pending = false;
    now->done(now->ctx, now->rc, now->seq, now->lsn);
}

int wal_barrier(struct wal_stream *s, wal_done_fn done, void *ctx)
{
    struct wal_rec *r = wal_rec_new(0, NULL, 0);

    if (!r)
        return -ENOMEM;
    enqueue(s, r, done, ctx);
    return 0;
}

void wal_hold(bool on)
{
    hold_on = on;
}

size_t wal_lead(void)
{
    struct wal *w = held_w;
    size_t n = 0;

    if (!w)
        return 0;
    held_w = NULL;
    pthread_mutex_lock(&w->mu);
    bool lead = w->head && !w->writing && !w->rotate && !w->stop && !w->broken;
    if (lead && w->cstarted) {
        /* Completions in commit order: none of an earlier group may be
         * waiting or running on the completer (nor another leader's). */
        pthread_mutex_lock(&w->cmu);
        lead = !w->chead && !w->cbusy && !w->led_completing;
        if (lead)
            w->led_completing = true;
        pthread_mutex_unlock(&w->cmu);
    }
    if (!lead) {
        w->held = false;
        if (w->head || w->rotate)
            pthread_cond_signal(&w->cv);   /* the commit thread takes them */
        pthread_mutex_unlock(&w->mu);
        return 0;
    }
    struct wal_rec *list = w->head;
    w->head = w->tail = NULL;
    w->held = false;
    w->writing = true;
    pthread_mutex_unlock(&w->mu);
    write_batch(w, list);
    for (struct wal_rec *e = list; e; e = e->next)
        n++;
    pthread_mutex_lock(&w->mu);
    bool full = w->segs[w->nsegs - 1].bytes >= w->seg_target;
    w->writing = false;
    if (full && !w->broken)
        w->rotate = true;   /* the commit thread starts the next segment */
    if (w->head || w->rotate)
        pthread_cond_signal(&w->cv);
    w->stats.led_groups++;
    w->stats.led_records += n;
    pthread_mutex_unlock(&w->mu);
    complete(list);
    if (w->cstarted) {
        pthread_mutex_lock(&w->cmu);
        w->led_completing = false;
        if (w->chead)
            pthread_cond_signal(&w->ccv);
        pthread_mutex_unlock(&w->cmu);
    }
    return n;
}

/* ---- waiting ---- */

void wal_waiter_init(struct wal_waiter *wt)
{
    memset(wt, 0, sizeof(*wt));
    pthread_mutex_init(&wt->mu, NULL);
    pthread_cond_init(&wt->cv, NULL);
}

void wal_waiter_done(void *ctx, int rc, uint64_t seq, uint64_t lsn)
{
    struct wal_waiter *wt = ctx;

    pthread_mutex_lock(&wt->mu);
    wt->rc = rc;
    wt->seq = seq;
    wt->lsn = lsn;
    wt->done = true;
    pthread_cond_signal(&wt->cv);
    pthread_mutex_unlock(&wt->mu);
}

int wal_waiter_wait(struct wal_waiter *wt)
{
    pthread_mutex_lock(&wt->mu);
    while (!wt->done)
        pthread_cond_wait(&wt->cv, &wt->mu);
    pthread_mutex_unlock(&wt->mu);
    pthread_mutex_destroy(&wt->mu);
    pthread_cond_destroy(&wt->cv);
    return wt->rc;
}

/* ---- segments ---- */

uint64_t wal_bytes(struct wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->bytes;
    pthread_mutex_unlock(&w->mu);
    return v;
}

uint64_t wal_file_bytes(struct wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->file_bytes;
    pthread_mutex_unlock(&w->mu);
    return v;
}

void wal_set_commit_delay(struct wal *w, uint32_t us)
{
    if (us > WAL_COMMIT_DELAY_MAX_US)
        us = WAL_COMMIT_DELAY_MAX_US;
    pthread_mutex_lock(&w->mu);
    w->delay_ns = w->durability == WAL_SYNC_FSYNC ? (uint64_t)us * 1000u : 0;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

uint32_t wal_unit(const struct wal *w)
{
    return w->unit;
}

bool wal_closed_upto(struct wal *w, uint64_t *last_lsn)
{
    bool any;

    pthread_mutex_lock(&w->mu);
    any = w->nsegs > 1;
    if (any)
        *last_lsn = w->segs[w->nsegs - 1].first - 1;
    pthread_mutex_unlock(&w->mu);
    return any;
}

void wal_rotate(struct wal *w)
{
    pthread_mutex_lock(&w->mu);
    w->rotate = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Keep one more spare?  With fsync only, while the log's files and its
 * spares are fewer than the most segments it held at once, and the file
 * system has plenty of space.  Under mu. */
static bool spare_wanted(struct wal *w)
{
    return w->unit && w->nsegs + w->nspares < w->peak_segs;
}

/* A discarded segment's file: renamed to a spare (see seg_reuse), or
 * unlinked.  Returns 0 or a negative errno. */
static int seg_retire(struct wal *w, const char *path)
{
    char sp[WAL_PATH_LEN];
    uint64_t n = 0;
    bool keep;

    pthread_mutex_lock(&w->mu);
    keep = spare_wanted(w);
    if (keep && w->nspares == w->sparecap) {
        size_t cap = w->sparecap ? 2 * w->sparecap : 8;
        uint64_t *v = realloc(w->spares, cap * sizeof(*v));
        if (v) {
            w->spares = v;
            w->sparecap = cap;
        } else {
            keep = false;
        }
    }
    if (keep)
        n = w->spare_next++;
    pthread_mutex_unlock(&w->mu);
    if (keep && room_fits(w)) {
        spare_path(w, sp, sizeof(sp), n);
        if (rename(path, sp) == 0) {
            pthread_mutex_lock(&w->mu);
            w->spares[w->nspares++] = n;
            pthread_mutex_unlock(&w->mu);
            return 0;
        }
    }
    return unlink(path) < 0 && errno != ENOENT ? -errno : 0;
}

int wal_discard(struct wal *w, uint64_t upto)
{
    struct seg *gone = NULL;
    size_t n = 0;
    int rc = 0;

    pthread_rwlock_wrlock(&w->seg_mu);
    pthread_mutex_lock(&w->mu);
    while (n + 1 < w->nsegs && w->segs[n + 1].first <= upto + 1)
        n++;
    if (n && (gone = malloc(n * sizeof(*gone)))) {
        memcpy(gone, w->segs, n * sizeof(*gone));
        for (size_t i = 0; i < n; i++) {
            w->bytes -= w->segs[i].recs;
            w->file_bytes -= w->segs[i].bytes;
        }
        memmove(w->segs, w->segs + n, (w->nsegs - n) * sizeof(*w->segs));
        w->nsegs -= n;
    } else {
        n = 0;
    }
    pthread_mutex_unlock(&w->mu);
    for (size_t i = 0; i < n; i++) {
        char name[32], path[WAL_PATH_LEN];
        wal__seg_name(name, sizeof(name), gone[i].first);
        strfmt(path, sizeof(path), "%s/%s", w->dir, name);
        int r = seg_retire(w, path);
        if (r < 0 && rc == 0)
            rc = r;
    }
    if (n) {
        int r2 = durable_fsync_dir(w->dir);
        if (rc == 0)
            rc = r2;
    }
    pthread_rwlock_unlock(&w->seg_mu);
    for (size_t i = 0; i < n; i++)
        free(gone[i].seek.v);
    free(gone);
    return rc < 0 ? rc : (int)n;
}

void wal_stats(struct wal *w, struct wal_stats *out)
{
    pthread_mutex_lock(&w->mu);
    *out = w->stats;
    out->spares = w->nspares;
    pthread_mutex_unlock(&w->mu);
}

uint64_t wal_durable_lsn(struct wal *w)
{
    pthread_mutex_lock(&w->mu);
    uint64_t v = w->durable_lsn;
    pthread_mutex_unlock(&w->mu);
    return v;
}

const char *wal_dir(const struct wal *w)
{
    return w->dir;
}

/* The segment holding LSN lsn among w's (under mu), or NULL. */
static const struct seg *seg_of(const struct wal *w, uint64_t lsn)
{
    for (size_t i = w->nsegs; i-- > 0;)
        if (w->segs[i].first <= lsn)
            return &w->segs[i];
    return NULL;
}

/* The seek mark of s nearest before lsn, or s's start. */
static struct wal__seek seek_in(const struct seg *s, uint64_t lsn)
{
    struct wal__seek at = {s->first, s->start};

    size_t lo = 0, hi = s->seek.n;   /* the first mark past lsn: hi */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->seek.v[mid].lsn <= lsn)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (hi)
        at = s->seek.v[hi - 1];
    return at;
}

void wal_span_from(struct wal *w, uint64_t lsn, uint64_t *bytes,
                   uint64_t *records)
{
    uint64_t n = 0, start = 0;

    pthread_mutex_lock(&w->mu);
    const struct seg *s = seg_of(w, lsn);
    for (size_t i = 0; i < w->nsegs; i++) {
        const struct seg *e = &w->segs[i];
        if (e == s) {
            struct wal__seek at = seek_in(e, lsn);
            n += e->bytes > at.off ? e->bytes - at.off : 0;
            start = at.lsn;
        } else if (!s || e > s) {
            n += e->bytes;
        }
    }
    if (!s)
        start = w->nsegs ? w->segs[0].first : w->durable_lsn + 1;
    *bytes = n;
    *records = w->durable_lsn >= start ? w->durable_lsn - start + 1 : 0;
    pthread_mutex_unlock(&w->mu);
}

/* For wal_rescan (wal_scan.c): hold off discards, and the durable LSN. */
uint64_t wal__rescan_begin(struct wal *w)
{
    pthread_rwlock_rdlock(&w->seg_mu);
    return wal_durable_lsn(w);
}

bool wal__rescan_seek(struct wal *w, uint64_t seg_first, uint64_t lsn,
                      uint64_t *at_lsn, uint64_t *at_off)
{
    bool found = false;

    pthread_mutex_lock(&w->mu);
    const struct seg *s = seg_of(w, lsn);
    if (s && s->first == seg_first && s->seek.n && s->seek.v[0].lsn <= lsn) {
        struct wal__seek at = seek_in(s, lsn);
        *at_lsn = at.lsn;
        *at_off = at.off;
        found = true;
    }
    pthread_mutex_unlock(&w->mu);
    return found;
}

void wal__rescan_end(struct wal *w, uint64_t read_bytes)
{
    pthread_mutex_lock(&w->mu);
    w->stats.rescans++;
    w->stats.rescan_bytes += read_bytes;
    pthread_mutex_unlock(&w->mu);
    pthread_once(&wm_once, wm_register);
    metric_add(wm.rescans, 1);
    metric_add(wm.rescan_bytes, read_bytes);
    pthread_rwlock_unlock(&w->seg_mu);
}
