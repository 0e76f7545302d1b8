/* merger_runner: the thread that runs the merger's rounds, one at a time:
 * every interval, or at once when asked (SIGUSR1, Merger.RunRound).
 *
 * A struct merger_runner owns its thread and drives one struct merger (which
 * it does not own).  Every function may be called from any thread;
 * merger_runner_wait may block for a whole round.
 */
#ifndef BLOOMGRID_MERGER_RUNNER_H
#define BLOOMGRID_MERGER_RUNNER_H

#include <stdbool.h>
#include <stdint.h>

#include "merger.h"

struct merger_runner;

/* Start the round thread; the first round starts at once.  NULL when out of
 * memory or the thread cannot be created. */
struct merger_runner *merger_runner_start(struct merger *m,
                                          uint64_t interval_ms);

/* Ask for a round now (a round running meanwhile is followed by another). */
void merger_runner_ask(struct merger_runner *r);

/* Ask for a round and wait until a round that started after the ask has
 * finished.  Returns 0, or -ECANCELED when the runner stopped first. */
int merger_runner_wait(struct merger_runner *r);

/* Is a round in progress? */
bool merger_runner_busy(struct merger_runner *r);

/* Stop: let a running round finish, wake every waiter (-ECANCELED), join
 * the thread.  Afterwards the other calls still work (a wait returns
 * -ECANCELED at once), so the RPC server may be stopped after the runner.
 * Idempotent. */
void merger_runner_stop(struct merger_runner *r);

/* Stop if needed and free.  NULL is allowed. */
void merger_runner_destroy(struct merger_runner *r);

#endif
