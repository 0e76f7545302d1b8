/* node_sync: which shards of this node are SYNCING (docs/REPLICATION.md).
 *
 * A shard on a copy of a group of N > 1 is SYNCING while the node cannot
 * vouch that it holds every write it acknowledged: it was created by
 * anything but a router's CreateFilter of a new filter (the merger, the CLI,
 * anti-entropy re-creating a lost shard), its recovery cut records of it
 * (store_filter_recovery_cut), or the list below could not be read.  It
 * takes writes and refuses reads until anti-entropy (node_replicate.c) has
 * pulled every page from N - W + 1 copies that are not SYNCING themselves.
 *
 * The list is durable: DIR/SYNCING (written whole through common/durable.h
 * on every change, before the change is used), one line per shard,
 *   bloomgrid-syncing 1
 *   <store name> <secret id: 16 hex digits, 0 for any secret>
 * and at most one line for the node as a whole (docs/REPLICATION.md,
 * "Re-created copies"): "* new" (started on an empty data directory, not
 * yet told by its peers whether its group holds anything) or "* refilling"
 * (lost or replaced data directory: creating and filling its group's
 * shards).  "*" is no store name: a node of an earlier version finds such
 * a list in doubt.  A file that does not parse (any doubt) marks every
 * shard of the store, and the node refilling.  A missing file is an empty
 * list; a copy of a group of N > 1 whose store holds no filter when it
 * starts is new.  Entries of shards the store no longer holds, or holds
 * with another secret, are dropped when the node starts.
 *
 * It also remembers, for the life of the process, the shards dropped on
 * this node, so anti-entropy does not bring one back from a peer the drop
 * has not reached yet (node_sync_dropped; durable tombstones replace it).
 *
 * The data directory's identity as a copy (docs/REPLICATION.md, "Restored
 * copies"): DIR/COPY holds a random copy id drawn when the directory got
 * its first COPY file, the group it is a copy of, and an epoch that only
 * grows and is durable before any peer hears of it,
 *   bloomgrid-copy 1
 *   <copy id: 16 hex digits> <epoch> <group>
 * and DIR/PEERS the highest epoch heard from each peer's copy id, and the
 * address it last announced it from,
 *   bloomgrid-peers 1
 *   <copy id: 16 hex digits> <epoch> [<address>]
 * (no address: not known, or superseded by another copy at that address).
 * A COPY that does not parse is doubt (every shard SYNCING, a new id).  A
 * copy that hears from a peer an epoch of its own id above its own was
 * started on an older copy of its directory, and one whose peer recorded
 * another copy id at its address runs on a replaced directory
 * (node_replicate.c decides).
 *
 * Holds: reasons for which every shard of the node answers as SYNCING
 * (reads refused) without being listed: its epoch is not yet checked
 * against its peers' (set from the start), it joins a group and lacks
 * shards its peers hold, or the node as a whole is new or refilling (those
 * two follow the durable line above: node_sync_whole_set).
 *
 * Threads: every function may be called from any thread at once; a mark or
 * clear writes the file under the list's lock.  node_sync_is costs one
 * atomic load while nothing is SYNCING.  Errors: 0 or a negative errno with
 * a sentence in err (NODE_SYNC_ERRLEN bytes, may be NULL).
 */
#ifndef BLOOMGRID_NODE_SYNC_H
#define BLOOMGRID_NODE_SYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "durable.h"
#include "store.h"

#define NODE_SYNC_ERRLEN DURABLE_ERRLEN
#define NODE_SYNC_FILE "SYNCING"

struct node_sync;

/* Read DIR/SYNCING.  A file that does not parse leaves the list in doubt
 * (node_sync_adopt then marks every shard) and *doubt (may be NULL) true.
 * Returns the list, or NULL (out of memory, an unreadable file: err). */
struct node_sync *node_sync_open(const char *dir, bool *doubt, char *err);
void node_sync_close(struct node_sync *ns);

/* Once the store is open, before it serves: mark every shard of s when in
 * doubt, and the shards whose recovery was cut, when mark (the node is a
 * copy of a group of N > 1); then, when mark, the node as a whole is
 * refilling when in doubt, and new when s holds no filter and the list
 * said nothing of the whole; drop entries of shards s lacks or holds with
 * another secret; write the file.  Every entry's "taking writes since" is
 * now.  Returns 0 or the file's write error. */
int node_sync_adopt(struct node_sync *ns, struct store *s, bool mark, char *err);

/* Is store name (with secret id, 0 if unknown) SYNCING: listed, or the
 * node held (node_sync_hold)? */
bool node_sync_is(struct node_sync *ns, const char *name, uint64_t secret_id);

/* Is it listed (holds aside)? */
bool node_sync_listed(struct node_sync *ns, const char *name, uint64_t secret_id);

/* How many shards are SYNCING. */
size_t node_sync_count(struct node_sync *ns);

/* Mark name (secret id, 0: any) SYNCING, durably, replacing an entry of
 * the same name; its "taking writes since" is now. */
int node_sync_mark(struct node_sync *ns, const char *name, uint64_t secret_id,
                   char *err);

/* Take name off the list, durably, when its entry has secret_id (0: any).
 * Returns 0 (also when it was not listed). */
int node_sync_clear(struct node_sync *ns, const char *name, uint64_t secret_id,
                    char *err);

/* When name's entry was marked or adopted (a CLOCK_MONOTONIC time in ms),
 * or 0 when it is not listed: a pull that counts towards leaving SYNCING
 * must start after it. */
uint64_t node_sync_since(struct node_sync *ns, const char *name);

/* A shard dropped on this node: remember (name, secret id) for the life of
 * the process and take it off the list. */
void node_sync_forget(struct node_sync *ns, const char *name, uint64_t secret_id);

/* Was (name, secret id) dropped on this node since it started? */
bool node_sync_dropped(struct node_sync *ns, const char *name, uint64_t secret_id);

/* CLOCK_MONOTONIC in ms (the clock of node_sync_since). */
uint64_t node_sync_now_ms(void);

#define NODE_SYNC_COPY_FILE "COPY"
#define NODE_SYNC_PEERS_FILE "PEERS"
#define NODE_SYNC_GROUP_MAX 63

/* This directory's identity (read or drawn by node_sync_open). */
struct node_sync_copy {
    uint64_t id;
    uint64_t epoch;
    char group[NODE_SYNC_GROUP_MAX + 1];   /* "" until first recorded */
};

void node_sync_copy_get(struct node_sync *ns, struct node_sync_copy *out);

/* Record epoch (not below the current one) and group in DIR/COPY,
 * durably.  Returns 0 or the write error. */
int node_sync_copy_set(struct node_sync *ns, uint64_t epoch, const char *group,
                       char *err);

#define NODE_SYNC_ADDR_MAX 127    /* TOPO_ADDR_MAX */

/* What a peer announces of its data directory (ListShardsRequest). */
struct node_sync_announce {
    const char *group;
    uint64_t id, epoch;
    const char *addr;       /* its address, a member of mine; NULL or "": none */
    bool settled;           /* it is refilling or checked: it knows it is
                               not the copy that was at addr before */
};

/* A peer of group a->group announces copy a->id at a->epoch from a->addr.
 * Returns the highest epoch of that id heard before this call (0: never);
 * *replaced (may be NULL) says whether another copy id was recorded at
 * a->addr before this call.  Records, durably, the epoch when it is
 * higher and the address; when a->settled, the other ids recorded at that
 * address lose it (superseded).  A peer of another group than mine (this
 * node's) is neither answered (0, not replaced) nor recorded; a record
 * that cannot be written is logged and tried again at the next call. */
uint64_t node_sync_peer_heard(struct node_sync *ns, const char *mine,
                              const struct node_sync_announce *a, bool *replaced);

/* Draw a new copy id for this directory (epoch 1, group), durably: it is
 * not the copy its peers knew at this address.  Returns 0 or an error. */
int node_sync_copy_renew(struct node_sync *ns, const char *group, char *err);

enum node_sync_hold {
    NODE_SYNC_HOLD_EPOCH = 1,      /* epoch not yet checked with peers */
    NODE_SYNC_HOLD_JOINING = 2,    /* a joining member lacks shards */
    NODE_SYNC_HOLD_NEW = 4,        /* whole: NODE_SYNC_WHOLE_NEW */
    NODE_SYNC_HOLD_REFILL = 8,     /* whole: NODE_SYNC_WHOLE_REFILLING */
};

/* Set or clear one hold (EPOCH or JOINING: the other two follow
 * node_sync_whole_set). */
void node_sync_hold(struct node_sync *ns, enum node_sync_hold why, bool on);

/* The node as a whole (the durable line of DIR/SYNCING). */
enum node_sync_whole {
    NODE_SYNC_WHOLE_NONE = 0,
    NODE_SYNC_WHOLE_NEW,           /* empty directory, group not yet heard */
    NODE_SYNC_WHOLE_REFILLING,     /* lost or replaced directory, filling */
};

/* Read it (NONE without a list). */
enum node_sync_whole node_sync_whole_get(struct node_sync *ns);

/* Set it, durably, and its hold.  Returns 0 or the file's write error (then
 * nothing changed). */
int node_sync_whole_set(struct node_sync *ns, enum node_sync_whole w, char *err);

/* Where the copy stands, in the order its holds are lifted
 * (ListShardsResponse.copy_state). */
enum node_sync_standing {
    NODE_SYNC_CHECKING = 1,        /* its epoch not yet checked */
    NODE_SYNC_NEW = 2,
    NODE_SYNC_REFILLING = 3,
    NODE_SYNC_CHECKED = 4,         /* none of the three */
};
enum node_sync_standing node_sync_standing(struct node_sync *ns);

/* Is any hold set? */
bool node_sync_held(struct node_sync *ns);

/* Is anything SYNCING or held (one atomic load each)? */
bool node_sync_any(struct node_sync *ns);

#endif
