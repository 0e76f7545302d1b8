/* progress: a one-line progress report on stderr while keys are added.
 *
 * Shown only when stderr is a terminal, refreshed about once a second: keys
 * read, keys per second, and the fill and false-positive rate predicted from
 * the insert counts (a bit scan per refresh would cost O(m) on filters of many
 * GB).  Without a local filter (online commands) only the counts and rates
 * are shown; a byte counter serves file transfers.  Single-threaded, like
 * the rest of the tool.
 */
#ifndef BLOOMGRID_PROGRESS_H
#define BLOOMGRID_PROGRESS_H

#include <stdbool.h>
#include <stdint.h>

#include "bf.h"

struct progress {
    const struct bf *f;      /* NULL: no fill or FPR to predict */
    bool on;                 /* stderr is a terminal */
    bool bytes;              /* counting bytes, not keys */
    uint64_t keys;
    double start, last;      /* seconds, monotonic */
};

void progress_init(struct progress *p, const struct bf *f);
/* A progress of bytes transferred (MiB and MiB/s). */
void progress_init_bytes(struct progress *p);
/* Count n more keys (or bytes); redraw if a second has passed. */
void progress_tick(struct progress *p, uint64_t n);
/* Draw the final line and end it with a newline (if shown at all). */
void progress_done(struct progress *p);
/* End a progress line left open, so an error message starts on its own
 * line.  Safe to call at any time. */
void progress_interrupt(void);

#endif
