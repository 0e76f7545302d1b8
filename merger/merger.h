/* merger: the rounds of bloomgrid-merger (docs/MERGER.md).
 *
 * A struct merger owns, per configured filter and shard, the global
 * snapshot (a struct bf kept on its own disk, STATE_DIR/<filter>/
 * shard-<i>.bf, saved atomically with bf_file_save), a stamp per 64 KiB page
 * (the round in which the page last changed), what it last pulled from each
 * datacenter (epoch, since_version, store_version, in a sidecar
 * shard-<i>.state written after the snapshot) and, per copy it pushes to,
 * the last round that copy received in full.
 *
 * A round, per filter and shard: pull from every datacenter (the first copy
 * of the shard's group that answers) the
 * pages changed since the last pull (every page is verified, and applied
 * only once the whole pull succeeded and its fingerprint matched), OR in
 * the imported partial files that changed, save the snapshot if anything
 * changed, then push to every copy of the group in every datacenter the pages stamped after the round it last received.  Shards
 * missing in a datacenter or on a copy are created with the geometry
 * and secret of the first datacenter that has them.
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

/* Per-copy lag, as RoundReport.targets. */
struct mg_lag {
    char filter[129];
    uint32_t shard;
    char dc[64];
    char node[128];
    bool replica;
    uint64_t version, primary_version, lag_ms;
    char error[256];
};

struct mg_report {
    uint64_t round;
    uint64_t started_ms, duration_ms;
    uint64_t bytes_pulled, bytes_pushed;
    uint64_t pages_pulled, pages_pushed, pages_changed;
    unsigned errors;
    unsigned nmsg;
    char msg[MG_REPORT_MSGS][MG_ERRLEN];
    size_t nlag;
    struct mg_lag *lag;       /* owned by the report */
};

struct merger;

/* Create from a config and its filters; loads saved snapshots and state
 * from state_dir (created if missing).  NULL with err on failure. */
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
