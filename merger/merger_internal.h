/* merger_internal: what merger.c (rounds, workers, reports) and
 * merger_shard.c (one shard: its snapshot and sidecar, pulls, partials,
 * pushes) share.  Not part of the merger's interface (merger.h).
 *
 * A struct mg_shard is touched by one worker thread at a time (the one
 * running its round); struct merger's channel cache has its own mutex.
 */
#ifndef BLOOMGRID_MERGER_INTERNAL_H
#define BLOOMGRID_MERGER_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

#include "bf.h"
#include "merger.h"
#include "node_client.h"
#include "rpc_client.h"
#include "rules.h"
#include "topo.h"

_Static_assert(MG_MAX_COPIES == TOPO_MAX_COPIES, "a group pull lists every copy");


/* One copy of a shard's group in one datacenter: the cursor of the
 * merger's pulls from it and what it has received of the pushes. */
struct mg_copy {
    char addr[TOPO_ADDR_MAX + 1];
    unsigned dc;
    /* Pulls: the node's epoch and change counter after the last complete
     * pull (0, 0: none, the next pull ships every non-empty page), its
     * store version then, and when that pull started (wall clock). */
    uint64_t epoch, since, store_version, pulled_ms;
    /* Pushes. */
    bool ready;       /* the shard is known to exist there */
    uint64_t acked;   /* last round received in full */
    uint64_t data_ms; /* what every datacenter had acknowledged by then is
                         on it (0: not known) */
    bool was_synced;  /* as last written to the sidecar */
    bool resynced;    /* its acked round was dropped while it re-synced:
                         pulled once it serves again (merger__copy_back) */
    char error[256];  /* the last push's error */
    bool no_keys;     /* refused a push of keys' hashes (a node of an
                         earlier release): pages only, until the merger
                         restarts */
    /* This round. */
    int slot;         /* its bit in mg_shard.have, -1: not pulled */
    bool in_sync;     /* pulled, and not SYNCING: counts towards R */
};

struct mg_part {
    time_t mtime;
    off_t size;
    bool merged;
};

/* A shard's global snapshot lives on disk (STATE_DIR/<filter>/
 * shard-<i>.bf); g holds it in memory only while the shard's round needs
 * its bits (pages pulled, a partial, a push), and is freed at the end of
 * that round, so the merger holds at most one snapshot per worker. */
struct mg_shard {
    uint32_t index;
    struct bf *g;   /* the global snapshot, during the shard's round only
                       (NULL otherwise: see merger__shard_load) */
    char fp[17];
    uint64_t body_bytes, npages;
    uint64_t hash;   /* XXH3-64 of the snapshot body, as last saved or
                        loaded (the sidecar's G line) */
    uint64_t *stamp; /* per page: round of the last change (8 bytes per
                        page, kept between rounds) */
    uint64_t kstamp; /* the page version the last keys' hashes added to g
                        stamped (pulled_apply) */
    bool dirty;      /* changed this round, or rebuilt: to be saved */
    bool rebuilt;    /* this round found the saved snapshot damaged */
    uint64_t *have;  /* this round, per page: bit k when the copy pulled
                        with slot k sent the page and holds it whole
                        (allocated for the shard's round only) */
    /* This round: the keys' hashes pulled that set a bit the snapshot
     * lacked (keys_apply), kept in an unlinked temp file of the filter's
     * state directory as (u32 slot, u32 n, n × 16 bytes) pieces, so that
     * a copy whose only lack is them is pushed them instead of pages. */
    FILE *kfp;
    uint64_t kkeys;          /* keys in kfp */
    uint64_t kslot[64];      /* of them, pulled from the copy with slot k */
    bool kbad;               /* kfp could not be written: pages only */
    bool paged;              /* a pulled page or a partial set a bit this
                                round: what copies lack is not all keys */
    uint64_t prev_max;       /* the highest page stamp when the round began:
                                a copy that acked it held the snapshot
                                whole then */
    /* Per datacenter: when the pulls of the last round that reached R
     * in-sync copies there started (0: none since the merger started). */
    uint64_t covered_ms[MG_MAX_DC];
    struct mg_pull_rep gp[MG_MAX_DC];   /* the last round's pulls */
    struct mg_copy *cp;
    size_t ncp, capcp;
    struct mg_part part[MG_MAX_PARTIALS];
};

struct mg_filter {
    struct mg_filter_conf c;
    struct node_client_shard tmpl; /* geometry, secret and placement
                                      version of shard 0 */
    bool have_tmpl;
    uint32_t nshards;
    /* The group (index into the round's topology of datacenter d) of
     * every shard, placed by the filter's placement version: made anew
     * every round. */
    uint16_t *place[MG_MAX_DC];
    struct mg_shard *sh;
};

struct mg_chan {
    char addr[TOPO_ADDR_MAX + 1];
    struct rpc_channel *ch;
};

struct merger {
    struct merger_config cfg;
    struct mg_filter *f;
    size_t nf;
    struct mg_chan *chans;
    size_t nchans, capchans;
    uint64_t round;
    pthread_mutex_t chan_mu; /* chans */
    pthread_mutex_t mu;      /* last, rounds_done, total */
    struct mg_report last;
    uint64_t rounds_done, total;
};

/* Pages of one pull, buffered on disk until the pull completed: (u64
 * offset, u64 length, bytes) each, in an unlinked temp file of the
 * filter's state directory (created at the first page), so a pull of a
 * whole shard costs disk, not memory. */
struct pulled {
    struct mg_shard *s;
    const char *dir;  /* where the temp file goes */
    FILE *fp;         /* NULL until the first page */
    uint64_t data;    /* page and key bytes buffered: at most the shard's
                         body */
    int err;          /* a write failed (negative errno) */
};

/* The sidecar's format: the first line is MG_STATE_MAGIC and a version. */
#define MG_STATE_MAGIC "bloomgrid-merger-state"
#define MG_STATE_VERSION 2

/* Formatting that may be cut short (messages, paths). */
void merger__strfmt(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
uint64_t merger__now_ms(void);
/* Make s valid UTF-8 in place (the report's strings are proto3 strings):
 * every byte that starts no valid sequence (a node's status message, a
 * character cut by truncation) becomes '?'. */
void merger__text_clean(char *s);
/* Record an error (counted) or a warning in the report and the log. */
void merger__rep_msg(struct mg_report *rep, bool error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The channel to a node, kept for the merger's life; NULL when out of
 * memory.  Thread-safe. */
struct rpc_channel *merger__chan(struct merger *m, const char *addr);

/* merger_shard.c */
/* Create a directory of the state (if missing) and make its entry durable
 * (fsync of the parent).  Returns 0 or a negative errno with err
 * (MG_ERRLEN bytes). */
int merger__dir_make(const char *dir, char *err);
void merger__shard_path(const struct merger *m, const struct mg_filter *f,
                        uint32_t i, const char *ext, char *out, size_t len);
bool merger__copy_synced(const struct mg_shard *s, const struct mg_copy *c);
/* Write the sidecar of s durably.  Returns 0 or a negative errno with err
 * (MG_ERRLEN bytes). */
int merger__state_save(const struct merger *m, const struct mg_filter *f,
                       struct mg_shard *s, char *err);
/* Read the saved snapshot once (its page stamps and hash; it is not
 * kept) and the sidecar.  A snapshot file that fails its checks (checksum,
 * size, ...) is refused: moved aside to shard-<i>.bf.damaged, and the
 * shard starts empty with no cursor, so the next round pulls every page
 * of the copies it asks (rebuilt by a full pull; nothing of the damaged
 * file is ever pushed); an error in rep says so.  Returns 0 or a
 * negative errno with err (MG_ERRLEN bytes): a snapshot that cannot be
 * read (out of memory, a failed read, another format version: kept for
 * the next round) or is of another geometry or secret (not damage: the
 * operator moves it away). */
int merger__shard_init(struct merger *m, struct mg_filter *f,
                       struct mg_shard *s, struct mg_report *rep, char *err);
/* Bring the snapshot into s->g for this round (from disk, or empty when
 * none was saved).  A damaged file is handled as at start (moved aside,
 * cursors dropped, an error in the report) and the round goes on from an
 * empty snapshot.  Returns 0, or -1 (reported) when it cannot be read or
 * is of another geometry. */
int merger__shard_load(struct merger *m, struct mg_filter *f,
                       struct mg_shard *s, struct mg_report *rep);
/* Forget every pull cursor of s and which partials were merged: the next
 * round pulls every page of the copies it asks and merges every partial
 * again (the snapshot on disk lacks what the cursors say was pulled). */
void merger__shard_forget(struct mg_shard *s);
/* Free what the shard's round held (s->g, s->have). */
void merger__shard_unload(struct mg_shard *s);
/* The copy addr of datacenter dc (created, with no cursor, when new); NULL
 * when out of memory.  The pointer is good until the next call. */
struct mg_copy *merger__copy_get(struct mg_shard *s, const char *addr,
                                 unsigned dc);
/* Pull from copy c (changed pages since its cursor; buffered on disk) and
 * OR the pages in, giving them the have bit slot; the snapshot is loaded
 * only when the pull brought pages.  Returns 0 (c->in_sync tells whether it
 * counts), or -1 (reported) when the pull failed. */
int merger__pull_one(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                     struct mg_copy *c, int slot, uint64_t round,
                     struct mg_report *rep);
/* Does copy c, whose acked round was dropped while it re-synced
 * (c->resynced), hold its shard again and serve it (not SYNCING)? */
bool merger__copy_back(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                       struct mg_copy *c);
void merger__partial_one(struct merger *m, struct mg_filter *f,
                         struct mg_shard *s, unsigned i, uint64_t round,
                         struct mg_report *rep);
/* Push to copy c what it lacks: every page stamped after the round it
 * last received in full, but those it sent whole this round; or, when it
 * held the whole snapshot when the round began and the round's changes all
 * came as keys' hashes, those keys (but its own) when they are fewer
 * bytes.  Nothing when it lacks nothing. */
void merger__push_one(struct merger *m, struct mg_filter *f, struct mg_shard *s,
                      struct mg_copy *c, uint64_t round, struct mg_report *rep);

#endif
