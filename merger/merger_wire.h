/* merger_wire: the client side of the internal page calls (PullPages,
 * PushPages) and of GetShard / CreateShard as the merger uses them (the
 * node links it too: a read replica pulls from its primary with mw_pull).
 *
 * Every function is a blocking call on a struct rpc_channel (thread-safe)
 * and returns 0 on OK or -1 with the status in *st (when st is not NULL).
 * Pages are verified here before the caller sees them: a page failing its
 * XXH64 checksum ends the pull with DATA_LOSS and nothing of it reaches the
 * callback after the bad page (callers apply pages only once the whole pull
 * succeeded, or OR them in as they come: OR is idempotent and a bad page is
 * never passed on).
 */
#ifndef BLOOMGRID_MERGER_WIRE_H
#define BLOOMGRID_MERGER_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bf.h"
#include "rpc_client.h"

#define MW_PATH_PULL "/bloomgrid.v1.Internal/PullPages"
#define MW_PATH_PUSH "/bloomgrid.v1.Internal/PushPages"

/* What the last message of a pull says. */
struct mw_pull_end {
    uint64_t version;         /* change counter: the next since_version */
    uint64_t store_version;   /* acknowledged writes covered */
    uint64_t epoch;
    char fp[17];              /* fingerprint id of the shard */
    uint64_t pages, bytes;    /* page data received */
};

/* Called for each verified page; a negative return cancels the pull. */
typedef int (*mw_page_fn)(void *ctx, uint64_t offset, const uint8_t *data,
                          size_t len);

int mw_pull(struct rpc_channel *ch, const char *filter, uint32_t shard,
            uint64_t since, uint64_t epoch, mw_page_fn fn, void *ctx,
            struct mw_pull_end *end, int timeout_ms, struct rpc_status *st);

struct mw_page {
    uint64_t offset;
    const void *data;
    size_t len;
};

/* Push n pages (n may be 0: only source_version travels).  *merged (may be
 * NULL) gets the node's count of pages merged. */
int mw_push(struct rpc_channel *ch, const char *filter, uint32_t shard,
            const char *fp, uint64_t source_version, const struct mw_page *pages,
            size_t n, uint64_t *merged, int timeout_ms, struct rpc_status *st);

/* Geometry and secret of a shard, as CreateShard takes them. */
struct mw_shard {
    uint32_t shard_index, shard_count;
    int kind;                  /* wire FilterKind */
    uint64_t capacity;
    double error_rate;
    uint8_t secret[BF_SECRET_LEN];
    uint64_t version;
};

/* GetShard with the secret.  NOT_FOUND when the node lacks the shard. */
int mw_get_shard(struct rpc_channel *ch, const char *filter, uint32_t shard,
                 struct mw_shard *out, int timeout_ms, struct rpc_status *st);
/* CreateShard with the same geometry and secret (for read replicas). */
int mw_create_shard(struct rpc_channel *ch, const char *filter,
                    const struct mw_shard *sh, int timeout_ms,
                    struct rpc_status *st);

/* An empty filter for shard sh (same geometry and secret as the nodes'). */
struct bf *mw_shard_filter(const struct mw_shard *sh, char *err);

#endif
