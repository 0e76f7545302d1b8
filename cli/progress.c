/* progress: see progress.h. */
#include "progress.h"

#include <math.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* A progress line is on the terminal without its newline yet. */
static bool line_open;

static double now_seconds(void)
{
    struct timespec ts;

    /* The coarse clock is a few ns to read; this runs once per batch. */
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Predicted fill and FPR of the whole filter from per-layer insert counts:
 * fill 1 - e^(-kn/m) per layer, and a key is a false positive when any
 * layer answers "maybe". */
static void predict(const struct bf *f, double *fill, double *fpr)
{
    double set = 0, bits = 0, pass = 1;

    for (uint32_t i = 0; i < bf_layer_count(f); i++) {
        struct bf_layer_info li;
        if (bf_layer_info(f, i, &li) < 0 || li.m == 0)
            continue;
        double n = (double)li.count, m = (double)li.m;
        set += m * (1 - exp(-(double)li.k * n / m));
        bits += m;
        pass *= 1 - bf_model_fpr(bf_kind(f), li.m, li.k, n);
    }
    *fill = bits > 0 ? set / bits : 0;
    *fpr = 1 - pass;
}

static void draw(struct progress *p, double t)
{
    double fill, fpr, dt = t - p->start;

    if (p->bytes || !p->f) {
        double v = (double)p->keys, rate = dt > 0 ? v / dt : 0.0;
        if (p->bytes)
            fprintf(stderr, "\r%12.1f MiB  %9.1f MiB/s   ", v / 1048576.0,
                    rate / 1048576.0);
        else
            fprintf(stderr, "\r%12llu keys  %7.2f M keys/s   ",
                    (unsigned long long)p->keys, rate / 1e6);
        fflush(stderr);
        line_open = true;
        return;
    }
    predict(p->f, &fill, &fpr);
    fprintf(stderr, "\r%12llu keys  %7.2f M keys/s  fill %.4f  est. FPR %.3g%s",
            (unsigned long long)p->keys,
            dt > 0 ? (double)p->keys / dt / 1e6 : 0.0, fill, fpr,
            fpr > bf_error_rate(p->f) ? "  (above target) " : "   ");
    fflush(stderr);
    line_open = true;
}

void progress_init(struct progress *p, const struct bf *f)
{
    p->f = f;
    p->bytes = false;
    p->on = isatty(STDERR_FILENO);
    p->keys = 0;
    p->start = p->last = now_seconds();
}

void progress_init_bytes(struct progress *p)
{
    progress_init(p, NULL);
    p->bytes = true;
}

void progress_tick(struct progress *p, uint64_t n)
{
    p->keys += n;
    if (!p->on)
        return;
    double t = now_seconds();
    if (t - p->last >= 1.0) {
        p->last = t;
        draw(p, t);
    }
}

void progress_done(struct progress *p)
{
    if (!p->on)
        return;
    draw(p, now_seconds());
    progress_interrupt();
}

void progress_interrupt(void)
{
    if (line_open)
        fputc('\n', stderr);
    line_open = false;
}
