/* pagepull: pullers of a node's pages for memory benchmarks
 * (bench/ckpt_bench.sh --pullers).  Each puller is one thread with its own
 * channel that calls the internal PullPages of one shard over and over, as
 * the cluster's pullers do: a copy's anti-entropy and the merger ask for
 * the pages changed since their last pull (--mode changed, the default);
 * --mode full asks for every non-empty page each time (a re-sync, the
 * merger's first round).  Pages are counted and dropped, never kept: what
 * is measured is the node that serves them.
 *
 *   pagepull --target ADDR --filter NAME [--shard N] [--pullers K]
 *            [--duration S] [--mode changed|full] [--interval-ms MS]
 *
 * Prints one line when done,
 *   RESULT pullers=K mode=M pulls=.. pages=.. bytes=.. errors=.. secs=..
 * and exits 1 when any pull failed.
 */
#include <getopt.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/grpc.h>

#include "node_client.h"
#include "rpc_status.h"
#include "rpc_client.h"

#define PULL_TIMEOUT_MS 120000
#define MAX_PULLERS 64

static struct {
    const char *target, *filter;
    unsigned shard, pullers;
    double duration;
    bool full;
    unsigned interval_ms;
} o = {.pullers = 2, .duration = 10};

static atomic_uint_fast64_t n_pulls, n_pages, n_bytes, n_errors;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int count_page(void *ctx, uint64_t offset, const uint8_t *data, size_t len)
{
    (void)ctx;
    (void)offset;
    (void)data;
    atomic_fetch_add(&n_pages, 1);
    atomic_fetch_add(&n_bytes, len);
    return 0;
}

static void *puller(void *arg)
{
    double end = *(const double *)arg;
    struct rpc_channel *ch = rpc_channel_create(o.target, 64u << 20);
    uint64_t since = 0, epoch = 0;

    if (!ch) {
        fprintf(stderr, "pagepull: no channel to %s\n", o.target);
        atomic_fetch_add(&n_errors, 1);
        return NULL;
    }
    while (now_s() < end) {
        struct node_client_pull_end e;
        struct rpc_status st = {0};
        if (node_client_pull(ch, o.filter, o.shard, o.full ? 0 : since,
                             o.full ? 0 : epoch, count_page, NULL, &e,
                             PULL_TIMEOUT_MS, &st) < 0) {
            if (atomic_fetch_add(&n_errors, 1) < 5)
                fprintf(stderr, "pagepull: PullPages: %s: %s\n",
                        rpc_status_name(st.code), st.message);
            since = epoch = 0;
        } else {
            atomic_fetch_add(&n_pulls, 1);
            since = e.version;
            epoch = e.epoch;
        }
        if (o.interval_ms) {
            struct timespec ts = {.tv_sec = o.interval_ms / 1000,
                                  .tv_nsec = (long)(o.interval_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    rpc_channel_destroy(ch);
    return NULL;
}

static void usage(FILE *f)
{
    fputs("usage: pagepull --target ADDR --filter NAME [options]\n"
          "Pull a node's pages continuously (internal PullPages), as a copy's\n"
          "anti-entropy and the merger do, and count them; nothing is kept.\n"
          "  --target ADDR       the node (host:port)\n"
          "  --filter NAME       the filter (its store name without the shard)\n"
          "  --shard N           shard index [0]\n"
          "  --pullers K         pullers at once, each its own channel [2, at most 64]\n"
          "  --duration S        seconds to pull for [10]\n"
          "  --mode changed|full changed: the pages changed since the puller's\n"
          "                      last pull; full: every non-empty page each time [changed]\n"
          "  --interval-ms MS    pause between a puller's pulls [0]\n"
          "Prints: RESULT pullers= mode= pulls= pages= bytes= errors= secs=\n"
          "Exit status 1 when any pull failed, 2 on bad arguments.\n", f);
}

int main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"target", required_argument, NULL, 't'}, {"filter", required_argument, NULL, 'f'},
        {"shard", required_argument, NULL, 's'}, {"pullers", required_argument, NULL, 'p'},
        {"duration", required_argument, NULL, 'd'}, {"mode", required_argument, NULL, 'm'},
        {"interval-ms", required_argument, NULL, 'i'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c;
    char *e;

    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        switch (c) {
        case 't': o.target = optarg; break;
        case 'f': o.filter = optarg; break;
        case 's': o.shard = (unsigned)strtoul(optarg, &e, 10);
            if (*e || !*optarg) goto bad;
            break;
        case 'p': o.pullers = (unsigned)strtoul(optarg, &e, 10);
            if (*e || !*optarg || !o.pullers || o.pullers > MAX_PULLERS) goto bad;
            break;
        case 'd': o.duration = strtod(optarg, &e);
            if (*e || !*optarg || !(o.duration > 0)) goto bad;
            break;
        case 'm':
            if (!strcmp(optarg, "full")) o.full = true;
            else if (strcmp(optarg, "changed")) goto bad;
            break;
        case 'i': o.interval_ms = (unsigned)strtoul(optarg, &e, 10);
            if (*e || !*optarg) goto bad;
            break;
        case 'h': usage(stdout); return 0;
        default: goto bad;
        }
    }
    if (!o.target || !o.filter || optind != argc)
        goto bad;
    grpc_init();
    pthread_t th[MAX_PULLERS];
    double t0 = now_s(), end = t0 + o.duration;
    unsigned started = 0;
    for (unsigned i = 0; i < o.pullers; i++) {
        if (pthread_create(&th[i], NULL, puller, &end) != 0) {
            fprintf(stderr, "pagepull: cannot start puller %u\n", i);
            atomic_fetch_add(&n_errors, 1);
            break;
        }
        started++;
    }
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    printf("RESULT pullers=%u mode=%s pulls=%llu pages=%llu bytes=%llu errors=%llu secs=%.2f\n",
           o.pullers, o.full ? "full" : "changed",
           (unsigned long long)atomic_load(&n_pulls), (unsigned long long)atomic_load(&n_pages),
           (unsigned long long)atomic_load(&n_bytes), (unsigned long long)atomic_load(&n_errors),
           now_s() - t0);
    grpc_shutdown();
    return atomic_load(&n_errors) ? 1 : 0;
bad:
    fprintf(stderr, "pagepull: bad arguments (--help)\n");
    return 2;
}
