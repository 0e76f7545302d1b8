/* merger_metrics: a round's report as Prometheus series (docs/METRICS.md):
 * rounds, their duration, pages and bytes pulled and pushed, errors, and
 * the lag of every copy the round saw.
 */
#ifndef BLOOMGRID_MERGER_METRICS_H
#define BLOOMGRID_MERGER_METRICS_H

struct mg_report;

/* Make the round series (all but the copies' lag) at 0, before the first
 * round: its failure is then an increase an alert sees.  Any thread, any
 * number of times. */
void merger_metrics_register(void);

/* Count a finished round (the round thread, after merger_round). */
void merger_metrics_round(const struct mg_report *rep);

#endif
