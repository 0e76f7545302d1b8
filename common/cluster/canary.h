/* canary: the known keys a canary adds to a filter and checks again, and
 * the small state file that remembers how many it has added.
 *
 * A canary (`bloomgrid canary`, or a router with canary_filter set) adds one
 * key now and then and asks for every earlier one again: a key that was
 * acknowledged and now reads "no" is a false negative, the one answer the
 * service must never give.  Key seq of canary NAME is
 *
 *     bloomgrid-canary/NAME/SEQ          (SEQ in decimal, from 0)
 *
 * so the keys are recognisable in any filter and rebuilt from two numbers:
 * the state is the next SEQ (every SEQ below it was acknowledged), never a
 * list of keys.  Real keys must not start with CANARY_KEY_PREFIX.
 *
 * The state file is text, written whole through durable.h after each
 * acknowledged add (a crash between the acknowledgement and the write only
 * adds that key again, which is harmless):
 *
 *     # bloomgrid canary state: do not edit
 *     filter NAME
 *     canary NAME
 *     next SEQ
 *
 * It names its filter and canary so that a canary is never pointed at keys
 * that were added elsewhere (which would read as false negatives).
 *
 * No state of its own; any thread.  Errors: 0 or a negative errno with a
 * sentence in err (CANARY_ERRLEN bytes, may be NULL).
 */
#ifndef BLOOMGRID_CANARY_H
#define BLOOMGRID_CANARY_H

#include <stddef.h>
#include <stdint.h>

#include "errmsg.h"
#include "rules.h"

#define CANARY_ERRLEN ERRMSG_LEN
#define CANARY_KEY_PREFIX "bloomgrid-canary/"
#define CANARY_NAME_MAX 64
/* The prefix, a name, '/', 20 digits and a NUL. */
#define CANARY_KEY_MAX (sizeof CANARY_KEY_PREFIX + CANARY_NAME_MAX + 22)
/* Keys checked per round at most (a bound of the settings and options),
 * and per request. */
#define CANARY_CHECK_MAX 100000
#define CANARY_CHECK_BATCH 1000

struct canary_state {
    char filter[RULES_FILTER_NAME_MAX + 1];
    char name[CANARY_NAME_MAX + 1];
    uint64_t next;              /* keys 0 .. next-1 were acknowledged */
};

/* A canary name: 1..CANARY_NAME_MAX letters, digits, '.', '_' or '-'.
 * what names it in the message ("--name", "canary_name").  0 or -EINVAL. */
int canary_name_check(const char *what, const char *name, char *err);

/* Key seq of canary name into buf (CANARY_KEY_MAX bytes); returns its
 * length. */
size_t canary_key(char *buf, const char *name, uint64_t seq);

/* Read the state file at path into st.  -ENOENT when there is none (st is
 * left alone: a new canary), -EINVAL when it is malformed (err names the
 * line), another negative errno when it cannot be read. */
int canary_state_load(const char *path, struct canary_state *st, char *err);

/* Is the loaded state the state of this filter and canary?  0, or -EINVAL
 * with err naming path and what differs. */
int canary_state_match(const char *path, const struct canary_state *st,
                       const char *filter, const char *name, char *err);

/* Replace the state file at path with st (durable_write_file). */
int canary_state_save(const char *path, const struct canary_state *st, char *err);

/* Which of the keys 0 .. next-1 a round checks, into out (max entries,
 * max > 0), in increasing order, without repeats; returns the count.  All
 * of them when they are at most max; otherwise the newest max/2 and an
 * evenly spread sample of the older ones, the sample shifted by *rng
 * (advanced here) so that successive rounds cover every key. */
size_t canary_pick(uint64_t next, size_t max, uint64_t *out, uint64_t *rng);

#endif
