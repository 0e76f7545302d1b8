/* merger_metrics: a round's report as Prometheus series (docs/METRICS.md):
 * rounds, their duration, pages and bytes pulled and pushed, errors, and
 * the lag of every copy the round saw.
 */
#ifndef BLOOMGRID_MERGER_METRICS_H
#define BLOOMGRID_MERGER_METRICS_H

struct mg_report;

/* Count a finished round (the round thread, after merger_round). */
void merger_metrics_round(const struct mg_report *rep);

#endif
