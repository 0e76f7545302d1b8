/* merger: the rounds of bloomgrid-merger (docs/MERGER.md).
 *
 * A struct merger owns, per configured filter and shard, the global
 * snapshot (kept on its own disk, STATE_DIR/<filter>/shard-<i>.bf, saved
 * atomically and checksummed by bf_file_save; in memory only while the
 * shard's round needs its bits, so the merger holds at most one snapshot
 * per worker whatever the number and size of filters), a stamp per 64 KiB
 * page (the round in which the page last changed) and, per copy of the shard's
 * group in each datacenter, the cursor of its last pull (epoch,
 * since_version, store_version) and the last round that copy received in
 * full; the cursors and the complete copies go in a sidecar
 * (shard-<i>.state, versioned) written after the snapshot.  A snapshot
 * file that fails its checks is refused (moved to shard-<i>.bf.damaged,
 * its sidecar removed) and the shard rebuilt by full pulls: nothing of it
 * is ever pushed.
 *
 * A round, per filter and shard: pull, in every datacenter, from copies of
 * the shard's group in topology order until R (the group's read quorum)
 * that are not SYNCING have answered, each the pages changed since its own
 * cursor (every page is verified, and a pull is applied only once it
 * succeeded whole and its fingerprint matched); fewer than R: the pages are
 * kept but the round does not cover that datacenter for the shard (an
 * error, and the report says so).  Then OR in the imported partial files
 * that changed (read a piece at a time, this shard's bytes only: a
 * filter file of the shard or a shard bundle's entry), save the snapshot
 * if anything changed, and push to every copy of the group in every
 * datacenter what it lacks: the pages stamped after the round it last
 * received (but those it sent whole), or, when the round's changes all
 * came as keys' hashes and the copy held the whole snapshot before, those
 * keys (but its own) when fewer bytes.  Shards missing in a
 * datacenter or on a copy are created with the geometry and secret of the
 * first datacenter that has them.
 *
 * Threads: merger_round is called by one thread at a time (the caller
 * serializes); it runs the shards of a filter on `workers` threads (each
 * shard's state is touched by one of them only).  merger_last_report may be
 * called from any thread.
 */
#ifndef BLOOMGRID_MERGER_H
#define BLOOMGRID_MERGER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "merger_config.h"

#define MG_MAX_DC 8
#define MG_MAX_PARTIALS 64
#define MG_MAX_FILTERS 64
#define MG_ERRLEN 512
#define MG_REPORT_MSGS 16         /* messages kept in a report */

/* A filter's sources, from the sources file. */
struct mg_filter_conf {
    char name[129];
    unsigned ndc;
    char dc[MG_MAX_DC][64];
    char topo[MG_MAX_DC][MG_PATH_MAX];
    unsigned npart;
    char part[MG_MAX_PARTIALS][MG_PATH_MAX];
};

/* Parse the sources file: sections [filter NAME] with repeatable keys
 * "datacenter = NAME TOPOLOGY-FILE" and "partial = FILE".  Returns the
 * number of filters (>= 1) or -1 with a message naming file and line. */
int merger_sources_load(const char *path, struct mg_filter_conf *out,
                        size_t max, char *err);

/* Per copy, as RoundReport.targets. */
struct mg_lag {
    char filter[129];
    uint32_t shard;
    char dc[64];
    char node[128];
    bool replica;         /* not pulled in sync this round */
    uint64_t version;     /* its store version at the merger's last pull */
    uint64_t lag_ms;      /* age of the data it is known to hold (0: not
                             known) */
    char error[256];
};

/* What a round's pulls of one shard reached in one datacenter, as
 * RoundReport.pulls: the copies of its group, in the order asked. */
#define MG_MAX_COPIES 8
enum mg_pull_state {
    MG_NOT_ASKED,   /* R in-sync copies had answered before */
    MG_PULLED,      /* pulled, not SYNCING: counts towards R */
    MG_SYNCING,     /* pulled (its pages kept), but SYNCING: does not count */
    MG_FAILED       /* asked; the pull failed (the messages say why) */
};

struct mg_pull_rep {
    uint64_t round;
    char filter[129];
    uint32_t shard;
    char dc[64];
    char group[64];
    unsigned read_quorum, ncopies, in_sync;
    bool covered;                   /* in_sync copies cover the shard (quorum.h) */
    char copy[MG_MAX_COPIES][128];
    uint8_t state[MG_MAX_COPIES];   /* enum mg_pull_state */
};

struct mg_report {
    uint64_t round;
    uint64_t started_ms, duration_ms;
    uint64_t bytes_pulled, bytes_pushed;
    uint64_t pages_pulled, pages_pushed, pages_changed;
    uint64_t keys_pulled;     /* keys' hashes pulled instead of pages (their
                                 16 bytes each are in bytes_pulled) */
    uint64_t keys_pushed;     /* keys' hashes pushed instead of pages (their
                                 16 bytes each are in bytes_pushed) */
    unsigned errors;
    unsigned nmsg;
    char msg[MG_REPORT_MSGS][MG_ERRLEN];
    size_t nlag;
    struct mg_lag *lag;       /* owned by the report */
    size_t npull;
    struct mg_pull_rep *pull; /* owned by the report */
    unsigned uncovered;       /* pulls short of R in-sync copies */
    unsigned pushes_later;    /* copies not pushed: they re-sync from their
                                 group (merger__push_one) */
};

struct merger;

/* Create from a config and its filters; state_dir is created if missing.
 * The saved snapshots and sidecars are read at the first round that
 * reaches each filter (each snapshot once, one at a time, and not kept).
 * NULL with err on failure. */
struct merger *merger_create(const struct merger_config *cfg,
                             const struct mg_filter_conf *filters, size_t n,
                             char *err);
void merger_destroy(struct merger *m);

/* Run one round; fills *rep (free with mg_report_free).  Returns the number
 * of errors (0: every source pulled and every copy pushed). */
int merger_round(struct merger *m, struct mg_report *rep);

/* A copy of the last finished round's report (zeroed before the first);
 * *rounds and *total (may be NULL) get the round count and the bytes
 * shipped by every round so far. */
void merger_last_report(struct merger *m, struct mg_report *rep,
                        uint64_t *rounds, uint64_t *total);

void mg_report_free(struct mg_report *rep);
/* Log a round's report (one line). */
void mg_report_log(const struct mg_report *rep);
/* Print a round's report as text (--once): one line of totals, then one
 * per message and one per copy. */
void mg_report_print(FILE *out, const struct mg_report *rep);

#endif
