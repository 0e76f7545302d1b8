/* store_ckfile: the files of a filter's checkpoints (docs/FORMAT.md,
 * "Checkpoint files"): page files (a base, a delta of pages, a delta of
 * log records) and the manifest that names them, written and read with
 * every page checksummed.  Not part of the store's interface.
 *
 * A page file is a header page, then groups of a directory page and the up
 * to STORE_CKF_GROUP data pages it describes (layer, page index and XXH64
 * of each).  Every page is STORE_CKF_PAGE bytes.  The writer copies each
 * data page into a buffer of its own, checksums it there and writes it
 * from there, so a page of live bits that adds change meanwhile is written
 * as one consistent image; the header (written last) holds the counts and
 * a hash of every directory page, so a file cut short, a zeroed page or a
 * page of another file is refused.
 *
 * Files are written to a temp name in the final directory, fsynced,
 * renamed into place and the directory fsynced (nothing is ever
 * overwritten in place).  Every write, fsync and rename goes through
 * store__ckpt_io, and each step of a checkpoint calls store__ckpt_step:
 * test hooks for crashes and lost writes.
 *
 * Threads: a writer or reader belongs to one thread.  Errors: 0 or a
 * negative errno, with a sentence naming the file in err / why
 * (STORE_ERRLEN bytes).
 */
#ifndef BLOOMGRID_STORE_CKFILE_H
#define BLOOMGRID_STORE_CKFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "store_names.h"

#define STORE_CKF_PAGE 4096u
#define STORE_CKF_GROUP 255u            /* data pages per directory page */
#define STORE_CKF_STREAM 0xffffffffu    /* the layer of a records delta's pages */
#define STORE_MANIFEST_MAX 16           /* a base and up to 15 deltas */

enum store_ckf_type {
    STORE_CKF_BASE = 1,      /* the non-zero pages of every layer */
    STORE_CKF_PAGES = 2,     /* the pages changed after its from seq */
    STORE_CKF_RECORDS = 3,   /* the filter's log records after from, in order */
};

/* ---- test hooks ---- */

struct store_ckpt_io {
    ssize_t (*pwrite)(int fd, const void *buf, size_t len, off_t off);
    int (*fsync)(int fd);
    int (*rename)(const char *from, const char *to);
    int (*fsync_dir)(const char *dir);
};
extern struct store_ckpt_io store__ckpt_io;

/* The steps of a checkpoint, in order.  A page file (base or delta) is
 * written, fsynced, renamed into place, its directory fsynced; then the
 * manifest the same way; then the files the new manifest no longer names
 * are removed; then the log the checkpoint covers. */
enum store_ckpt_step {
    STORE_STEP_FILE_WRITTEN = 1,
    STORE_STEP_FILE_SYNCED,
    STORE_STEP_FILE_RENAMED,
    STORE_STEP_FILE_DURABLE,
    STORE_STEP_MANIFEST_WRITTEN,
    STORE_STEP_MANIFEST_SYNCED,
    STORE_STEP_MANIFEST_RENAMED,
    STORE_STEP_MANIFEST_DURABLE,
    STORE_STEP_PRUNED,
    STORE_STEP_LOG_DISCARDED,
    STORE_STEPS
};
/* Called after each step with the type of the page file being written
 * (STORE_CKF_BASE for a fold or a first checkpoint, or a delta's type; 0
 * for a checkpoint that only moves its manifest).  NULL: nothing. */
extern void (*store__ckpt_step)(int type, int step);
void store__ckpt_step_at(int type, int step);

/* ---- page files ---- */

struct store_ckw;

/* Start writing page file (the name n says kind, id, from and seq) of
 * type type in dir.  0 with *out, or a negative errno with err. */
int store__ckw_open(struct store_ckw **out, const char *dir,
                    const struct store_fname *n, int type, char *err);
/* Add a data page: len <= STORE_CKF_PAGE bytes of data (zeros after it),
 * copied first.  0 or a negative errno (the write's) with err. */
int store__ckw_page(struct store_ckw *w, uint32_t layer, uint32_t index,
                    const void *data, size_t len, char *err);
/* Records delta: append len bytes to the record stream. */
int store__ckw_stream(struct store_ckw *w, const void *data, size_t len,
                      char *err);
/* Write the header with meta (the filter's header and layer descriptors,
 * bf_file_meta_encode), fsync, rename into place, fsync the directory.
 * *bytes gets the file's size.  w is freed in every case. */
int store__ckw_finish(struct store_ckw *w, const uint8_t *meta, size_t mlen,
                      uint64_t *bytes, char *err);
/* Throw the file away (w freed; NULL allowed). */
void store__ckw_abort(struct store_ckw *w);

struct store_ckr;

/* Open page file path and check its header against the name n and type.
 * 0 with *out; -ENOENT when it is missing; -EBADMSG (a corrupt or foreign
 * file), -EPROTONOSUPPORT (another version) or an I/O error with why. */
int store__ckr_open(struct store_ckr **out, const char *path,
                    const struct store_fname *n, int type, char *why);
/* The filter's header and layer descriptors the file carries. */
const uint8_t *store__ckr_meta(struct store_ckr *r, size_t *len);
/* Records delta: the stream's bytes. */
uint64_t store__ckr_stream_bytes(struct store_ckr *r);
/* The data pages the file's header says it holds. */
uint64_t store__ckr_pages(struct store_ckr *r);
/* The next data page, checked: 1 with layer, index and data
 * (STORE_CKF_PAGE bytes, valid until the next call); 0 after the last
 * one, once the file proved whole; or -EBADMSG / an I/O error with why. */
int store__ckr_next(struct store_ckr *r, uint32_t *layer, uint32_t *index,
                    const uint8_t **data, char *why);
void store__ckr_close(struct store_ckr *r);

/* ---- manifests ---- */

struct store_manifest_ent {
    uint32_t type;           /* enum store_ckf_type */
    uint64_t from, to;       /* seqs: the file holds (from, to] */
    uint64_t lsn;            /* the log it covered when written */
    uint64_t bytes;          /* its size */
};

struct store_manifest {
    uint64_t id;             /* incarnation */
    uint64_t seq;            /* the seq the whole reaches */
    uint32_t n;              /* entries: e[0] the base, then deltas */
    struct store_manifest_ent e[STORE_MANIFEST_MAX];
};

/* Write m as manifest-<id>-<seq>-<lsn>.bgm in dir, durably (temp file,
 * fsync, rename, directory fsync).  0 or a negative errno with err. */
int store__manifest_write(const char *dir, const struct store_manifest *m,
                          uint64_t lsn, char *err);
/* Read and check manifest path (named n).  0, -ENOENT, or -EBADMSG /
 * -EPROTONOSUPPORT / an I/O error with why. */
int store__manifest_read(const char *path, const struct store_fname *n,
                         struct store_manifest *m, char *why);
/* Move the manifest of (id, seq) from LSN old to lsn: a rename, durable. */
int store__manifest_advance(const char *dir, uint64_t id, uint64_t seq,
                            uint64_t old, uint64_t lsn, char *err);
/* The name of entry i's file. */
void store__manifest_fname(const struct store_manifest *m, uint32_t i,
                           struct store_fname *out);

#endif
