/* quorum: the rule that keeps reads free of false negatives, defined once.
 *
 * A shard lives on a group of N copies (topo.h) with a write quorum W and
 * a read quorum R, R + W > N.  A write is acknowledged once W copies hold
 * it durably; a read may say "no" only from the answers of R copies that
 * serve (a SYNCING copy answers with an error and does not count).  Every
 * read quorum then meets every write quorum in at least one copy, and that
 * copy says "maybe" for every acknowledged key: this is the whole of the
 * no-false-negative promise inside a datacenter.
 *
 * The consequences that other modules need, each asked of this module
 * rather than recomputed:
 *
 *   - a write of a group in a joint phase (copies_next / copies_prev) also
 *     needs W' acknowledgements from the other set (quorum_write_met);
 *   - a read asks as many copies as answers are still missing, and more
 *     when some failed or were too slow (quorum_read_ask);
 *   - a SYNCING shard serves again once it has pulled every page from
 *     N - W + 1 other copies that are not SYNCING (every write quorum holds
 *     at least one of them; quorum_shard_sync_met).  With W = 1 that is
 *     more than the others: a write may have been on the lost copy alone,
 *     and only an operator's resync takes the shard out;
 *   - a copy that may hold less than it acknowledged (its directory's
 *     epoch not yet checked, new or refilling, or joining the copies) is
 *     held until N - W + 1 other copies answered, or every other copy when
 *     there are fewer (quorum_sync_need);
 *   - a group is readable while R of its copies serve (quorum_readable),
 *     and a merger round covers a shard once R copies were pulled in sync
 *     (quorum_covered): the same rule as a read, seen from outside.
 *
 * The module is pure: no state, no locks, no allocation; every function
 * may be called from any thread.  Counts above N are treated as N.
 */
#ifndef BLOOMGRID_QUORUM_H
#define BLOOMGRID_QUORUM_H

#include <stdbool.h>

#include "topo.h"

/* ---- writes ---- */

/* W: copies of the group's own set that must acknowledge a write. */
unsigned quorum_write_need(const struct topo_group *g);

/* W' of the other set in a joint phase, 0 without one. */
unsigned quorum_write_need_other(const struct topo_group *g);

/* Is a write acknowledged by acked copies of the group's set and
 * acked_other members of its other set enough to acknowledge? */
bool quorum_write_met(const struct topo_group *g, unsigned acked,
                      unsigned acked_other);

/* Can a write still be acknowledged once failed copies of the set and
 * failed_other members of the other set have refused it? */
bool quorum_write_reachable(const struct topo_group *g, unsigned failed,
                            unsigned failed_other);

/* ---- reads ---- */

/* R: copies whose answers a read needs before it may say "no". */
unsigned quorum_read_need(const struct topo_group *g);

/* May a read decide from the answers of answered serving copies? */
bool quorum_read_met(const struct topo_group *g, unsigned answered);

/* How many more copies a read should ask now: answered copies have
 * answered, pending were asked and have not (a slow copy counts as pending
 * until the caller gives up on it and counts it failed), untried were
 * never asked.  0 when the answers in hand or on their way can decide, or
 * when nothing is left to ask. */
unsigned quorum_read_ask(const struct topo_group *g, unsigned answered,
                         unsigned pending, unsigned untried);

/* Can a read still decide with failed copies out of the N? */
bool quorum_read_reachable(const struct topo_group *g, unsigned failed);

/* Is the group readable while serving copies serve (health, status)? */
bool quorum_readable(const struct topo_group *g, unsigned serving);

/* ---- leaving SYNCING ---- */

/* Full pulls from how many other copies that are not SYNCING a SYNCING
 * shard of g needs before it serves: N - W + 1, never fewer (with W = 1,
 * N: more than the N - 1 others, so it cannot leave by itself). */
unsigned quorum_shard_sync_need(const struct topo_group *g);

/* May a SYNCING shard of g that completed full pulls from pulled other
 * copies (not SYNCING) serve again? */
bool quorum_shard_sync_met(const struct topo_group *g, unsigned pulled);

/* Answers from how many other copies a copy of g that may hold less than
 * it acknowledged waits for before it is vouched for: N - W + 1, or all of
 * the others when there are fewer (others: the copies of g other than this
 * one). */
unsigned quorum_sync_need(const struct topo_group *g, unsigned others);

/* Has such a copy heard from (or pulled in full from) pulled of its others
 * other copies, enough to have seen every acknowledged write that any other
 * copy holds? */
bool quorum_sync_met(const struct topo_group *g, unsigned pulled, unsigned others);

/* ---- the merger ---- */

/* Does a merger round that pulled in_sync copies of the group in sync
 * cover the shard (every write acknowledged before the round is in it)? */
bool quorum_covered(const struct topo_group *g, unsigned in_sync);

#endif
