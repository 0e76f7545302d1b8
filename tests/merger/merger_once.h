/* merger_once: run "bloomgrid-merger --once" for the merger's integration
 * tests and read back what it printed (the round's report).
 *
 * Single-threaded use (it forks); failures to fork die (CHECK).
 */
#ifndef BLOOMGRID_TEST_MERGER_ONCE_H
#define BLOOMGRID_TEST_MERGER_ONCE_H

struct round_out {
    int status;                 /* exit status, or 128 + signal */
    unsigned long long pulled, pushed, changed, errors;   /* bytes, pages */
    unsigned long long pages_pushed;
    char text[65536];           /* stdout: the report */
};

/* Run bin --config cfg --once with stdout in dir/merger-once.out and stderr
 * appended to dir/merger.log; env (may be NULL) is a NULL-terminated list
 * of name, value pairs set for it.  kill_after_ms > 0 kills it (SIGKILL)
 * after that long; kill_when (may be NULL) kills it once that file exists.
 * Fills *o and prints a line of totals. */
void merger_once_run(const char *bin, const char *cfg, const char *dir,
                     struct round_out *o, const char *const *env,
                     int kill_after_ms, const char *kill_when);

#endif
