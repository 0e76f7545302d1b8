/* metrics: registered series with lock-free updates, samplers, and the text
 * exposition format. */
#include "metrics.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

const double metrics_latency_bounds[] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
    25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5, 10.0,
};
const size_t metrics_latency_nbounds =
    sizeof metrics_latency_bounds / sizeof metrics_latency_bounds[0];

struct family;

struct metric {
    struct family *fam;
    char *labels;                 /* rendered: k="v",k2="v2" (or "") */
    _Atomic uint64_t count;       /* counter value; histogram observations */
    _Atomic uint64_t bits;        /* gauge value; histogram sum (double bits) */
    _Atomic uint64_t *buckets;    /* histogram: per-bucket (not cumulative) */
    struct metric *next;
};

struct family {
    char *name, *help;
    enum metric_type type;
    double *bounds;
    size_t nb;
    struct metric *first, *last;
    struct family *next;
};

struct sampler {
    void (*fn)(void *arg, struct metrics_out *out);
    void *arg;
};

struct metrics {
    pthread_mutex_t lock;
    struct family *first, *last;
    /* A fixed array: a scrape runs the samplers outside the lock (they take
     * locks of their own), so the array must never move. */
    struct sampler samplers[METRICS_MAX_SAMPLERS];
    _Atomic size_t nsamplers;
};

struct metrics_out {
    FILE *f;
    char last[128];               /* family of the previous emitted line */
    int err;
};

static uint64_t d2u(double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

static double u2d(uint64_t u)
{
    double v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static bool name_ok(const char *s, bool colon)
{
    if (!s || !*s || strlen(s) >= 128)
        return false;
    for (const char *p = s; *p; p++) {
        bool ok = isalpha((unsigned char)*p) || *p == '_' || (colon && *p == ':') ||
                  (p > s && isdigit((unsigned char)*p));
        if (!ok)
            return false;
    }
    return true;
}

/* Render labels as k="v",... with \\, \" and \n escaped; NULL on a bad
 * name or out of memory. */
static char *labels_render(const char *const *kv, const char *extra)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return NULL;
    bool ok = true, first = true;
    for (size_t i = 0; kv && kv[i]; i += 2) {
        if (!kv[i + 1] || !name_ok(kv[i], false) || strncmp(kv[i], "__", 2) == 0) {
            ok = false;
            break;
        }
        fprintf(f, "%s%s=\"", first ? "" : ",", kv[i]);
        first = false;
        for (const char *p = kv[i + 1]; *p; p++) {
            if (*p == '\\' || *p == '"')
                fputc('\\', f), fputc(*p, f);
            else if (*p == '\n')
                fputs("\\n", f);
            else
                fputc(*p, f);
        }
        fputc('"', f);
    }
    if (extra)
        fprintf(f, "%s%s", first ? "" : ",", extra);
    if (fclose(f) != 0 || !ok) {
        free(buf);
        return NULL;
    }
    return buf;
}

struct metrics *metrics_create(void)
{
    struct metrics *m = calloc(1, sizeof *m);
    if (m)
        pthread_mutex_init(&m->lock, NULL);
    return m;
}

static struct metrics *registry;
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;

static void registry_make(void)
{
    registry = metrics_create();
}

struct metrics *metrics_registry(void)
{
    pthread_once(&registry_once, registry_make);
    return registry;
}

void metrics_destroy(struct metrics *m)
{
    if (!m)
        return;
    for (struct family *f = m->first, *fn; f; f = fn) {
        fn = f->next;
        for (struct metric *s = f->first, *sn; s; s = sn) {
            sn = s->next;
            free(s->labels);
            free(s->buckets);
            free(s);
        }
        free(f->name);
        free(f->help);
        free(f->bounds);
        free(f);
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static struct family *family_get(struct metrics *m, const char *name,
                                 const char *help, enum metric_type type,
                                 const double *bounds, size_t nb)
{
    for (struct family *f = m->first; f; f = f->next)
        if (strcmp(f->name, name) == 0)
            return f->type == type ? f : NULL;
    struct family *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->name = strdup(name);
    f->help = strdup(help ? help : "");
    f->type = type;
    if (type == METRIC_HISTOGRAM) {
        f->nb = nb;
        f->bounds = malloc((nb ? nb : 1) * sizeof *f->bounds);
        if (f->bounds && nb)
            memcpy(f->bounds, bounds, nb * sizeof *bounds);
    }
    if (!f->name || !f->help || (type == METRIC_HISTOGRAM && !f->bounds)) {
        free(f->name);
        free(f->help);
        free(f->bounds);
        free(f);
        return NULL;
    }
    if (m->last)
        m->last->next = f;
    else
        m->first = f;
    m->last = f;
    return f;
}

static struct metric *series_get(struct metrics *m, const char *name,
                                 const char *help, const char *const *labels,
                                 enum metric_type type, const double *bounds,
                                 size_t nb)
{
    if (!m || !name_ok(name, true))
        return NULL;
    if (type == METRIC_HISTOGRAM) {
        if (nb && !bounds)
            return NULL;
        for (size_t i = 0; i < nb; i++)
            if (!isfinite(bounds[i]) || (i && bounds[i] <= bounds[i - 1]))
                return NULL;
    }
    char *lab = labels_render(labels, NULL);
    if (!lab)
        return NULL;
    struct metric *s = NULL;
    pthread_mutex_lock(&m->lock);
    struct family *f = family_get(m, name, help, type, bounds, nb);
    if (!f)
        goto out;
    for (s = f->first; s; s = s->next)
        if (strcmp(s->labels, lab) == 0)
            goto out;
    s = calloc(1, sizeof *s);
    if (!s)
        goto out;
    if (type == METRIC_HISTOGRAM) {
        s->buckets = calloc(f->nb + 1, sizeof *s->buckets);
        if (!s->buckets) {
            free(s);
            s = NULL;
            goto out;
        }
    }
    s->fam = f;
    s->labels = lab;
    lab = NULL;
    if (f->last)
        f->last->next = s;
    else
        f->first = s;
    f->last = s;
out:
    pthread_mutex_unlock(&m->lock);
    free(lab);
    return s;
}

struct metric *metrics_counter(struct metrics *m, const char *name,
                               const char *help, const char *const *labels)
{
    return series_get(m, name, help, labels, METRIC_COUNTER, NULL, 0);
}

struct metric *metrics_gauge(struct metrics *m, const char *name,
                             const char *help, const char *const *labels)
{
    return series_get(m, name, help, labels, METRIC_GAUGE, NULL, 0);
}

struct metric *metrics_histogram(struct metrics *m, const char *name,
                                 const char *help, const char *const *labels,
                                 const double *bounds, size_t nb)
{
    return series_get(m, name, help, labels, METRIC_HISTOGRAM, bounds, nb);
}

void metric_add(struct metric *c, uint64_t n)
{
    if (c)
        atomic_fetch_add_explicit(&c->count, n, memory_order_relaxed);
}

void metric_set(struct metric *g, double v)
{
    if (g)
        atomic_store_explicit(&g->bits, d2u(v), memory_order_relaxed);
}

static void add_double(_Atomic uint64_t *bits, double d)
{
    uint64_t old = atomic_load_explicit(bits, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(bits, &old, d2u(u2d(old) + d),
                                                  memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

void metric_gauge_add(struct metric *g, double d)
{
    if (g)
        add_double(&g->bits, d);
}

void metric_observe(struct metric *h, double v)
{
    if (!h || !h->buckets)
        return;
    const struct family *f = h->fam;
    size_t lo = 0, hi = f->nb;           /* first bound >= v, or nb (+Inf) */
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (f->bounds[mid] >= v)
            hi = mid;
        else
            lo = mid + 1;
    }
    atomic_fetch_add_explicit(&h->buckets[lo], 1, memory_order_relaxed);
    add_double(&h->bits, v);
    atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

uint64_t metric_count(const struct metric *c)
{
    return c ? atomic_load_explicit(&((struct metric *)c)->count, memory_order_relaxed) : 0;
}

double metric_value(const struct metric *g)
{
    return g ? u2d(atomic_load_explicit(&((struct metric *)g)->bits, memory_order_relaxed))
             : 0;
}

int metrics_add_sampler(struct metrics *m,
                        void (*fn)(void *arg, struct metrics_out *out), void *arg)
{
    if (!m || !fn)
        return -EINVAL;
    int rc = 0;
    pthread_mutex_lock(&m->lock);
    size_t n = atomic_load(&m->nsamplers);
    if (n == METRICS_MAX_SAMPLERS) {
        rc = -ENOSPC;
    } else {
        m->samplers[n] = (struct sampler){fn, arg};
        atomic_store(&m->nsamplers, n + 1);   /* publishes the entry */
    }
    pthread_mutex_unlock(&m->lock);
    return rc;
}

static const char *type_name(enum metric_type t)
{
    return t == METRIC_COUNTER ? "counter" : t == METRIC_GAUGE ? "gauge" : "histogram";
}

/* HELP text escapes only \\ and \n. */
static void put_help(FILE *f, const char *name, const char *help, enum metric_type t)
{
    fprintf(f, "# HELP %s ", name);
    for (const char *p = help; *p; p++) {
        if (*p == '\\')
            fputs("\\\\", f);
        else if (*p == '\n')
            fputs("\\n", f);
        else
            fputc(*p, f);
    }
    fprintf(f, "\n# TYPE %s %s\n", name, type_name(t));
}

/* The shortest of %.15g..%.17g that reads back as v. */
static void fmt_double(char *buf, size_t n, double v)
{
    if (isnan(v)) {
        snprintf(buf, n, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, n, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int p = 15; p <= 17; p++) {
        snprintf(buf, n, "%.*g", p, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

static void put_value(FILE *f, double v)
{
    char buf[40];
    fmt_double(buf, sizeof buf, v);
    fputs(buf, f);
}

static void put_series(FILE *f, const char *name, const char *suffix,
                       const char *labels, double v)
{
    fprintf(f, "%s%s", name, suffix);
    if (labels && *labels)
        fprintf(f, "{%s}", labels);
    fputc(' ', f);
    put_value(f, v);
    fputc('\n', f);
}

static void render_histogram(FILE *f, const struct family *fam, struct metric *s)
{
    uint64_t cum = 0;
    char le[40];
    for (size_t i = 0; i <= fam->nb; i++) {
        cum += atomic_load_explicit(&s->buckets[i], memory_order_relaxed);
        fmt_double(le, sizeof le, i < fam->nb ? fam->bounds[i] : INFINITY);
        fprintf(f, "%s_bucket{%s%sle=\"%s\"} %" PRIu64 "\n", fam->name, s->labels,
                *s->labels ? "," : "", le, cum);
    }
    put_series(f, fam->name, "_sum", s->labels, metric_value(s));
    /* The count equals the +Inf bucket, read in the same pass, so a scrape
     * during updates never shows a count below a bucket. */
    put_series(f, fam->name, "_count", s->labels, (double)cum);
}

void metrics_emit(struct metrics_out *out, enum metric_type type,
                  const char *name, const char *help,
                  const char *const *labels, double value)
{
    if (!out || type == METRIC_HISTOGRAM || !name_ok(name, true))
        return;
    char *lab = labels_render(labels, NULL);
    if (!lab) {
        out->err = -ENOMEM;
        return;
    }
    if (strcmp(out->last, name) != 0) {
        put_help(out->f, name, help ? help : "", type);
        snprintf(out->last, sizeof out->last, "%s", name);
    }
    put_series(out->f, name, "", lab, value);
    free(lab);
}

int metrics_render(struct metrics *m, FILE *f)
{
    struct metrics_out out = {.f = f};
    pthread_mutex_lock(&m->lock);
    for (struct family *fam = m->first; fam; fam = fam->next) {
        put_help(f, fam->name, fam->help, fam->type);
        for (struct metric *s = fam->first; s; s = s->next) {
            if (fam->type == METRIC_HISTOGRAM)
                render_histogram(f, fam, s);
            else if (fam->type == METRIC_COUNTER)
                put_series(f, fam->name, "", s->labels, (double)metric_count(s));
            else
                put_series(f, fam->name, "", s->labels, metric_value(s));
        }
    }
    pthread_mutex_unlock(&m->lock);
    size_t ns = atomic_load(&m->nsamplers);
    for (size_t i = 0; i < ns; i++) {
        out.last[0] = '\0';
        m->samplers[i].fn(m->samplers[i].arg, &out);
    }
    if (ferror(f))
        return -EIO;
    return out.err;
}

int metrics_render_string(struct metrics *m, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    FILE *f = open_memstream(text, len);
    if (!f)
        return -ENOMEM;
    int rc = metrics_render(m, f);
    if (fclose(f) != 0 && rc == 0)
        rc = -ENOMEM;
    if (rc != 0) {
        free(*text);
        *text = NULL;
        *len = 0;
    }
    return rc;
}

/* /proc/self readings for the process sampler. */
static double proc_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0, res = 0;
    if (!f)
        return NAN;
    int n = fscanf(f, "%lu %lu", &size, &res);
    fclose(f);
    return n == 2 ? (double)res * (double)sysconf(_SC_PAGESIZE) : NAN;
}

static double proc_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return NAN;
    double n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1;   /* the directory's own descriptor */
}

/* Fields of /proc/self/stat after the command: state is field 3; utime 14,
 * stime 15, num_threads 20, starttime 22 (clock ticks after boot). */
static int proc_stat(double *cpu_s, double *threads, double *start_s)
{
    char buf[1024];
    FILE *f = fopen("/proc/self/stat", "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p)
        return -1;
    p += 2;
    unsigned long long v[24] = {0};
    int field = 3;
    char *save = NULL;
    for (char *t = strtok_r(p, " ", &save); t && field <= 22; t = strtok_r(NULL, " ", &save), field++)
        v[field] = strtoull(t, NULL, 10);
    double hz = (double)sysconf(_SC_CLK_TCK);
    *cpu_s = (double)(v[14] + v[15]) / hz;
    *threads = (double)v[20];
    double boot = NAN;
    FILE *s = fopen("/proc/stat", "r");
    if (s) {
        char line[256];
        while (fgets(line, sizeof line, s))
            if (strncmp(line, "btime ", 6) == 0)
                boot = strtod(line + 6, NULL);
        fclose(s);
    }
    *start_s = boot + (double)v[22] / hz;
    return 0;
}

void metrics_process_sampler(void *arg, struct metrics_out *out)
{
    (void)arg;
    struct rlimit rl;
    double cpu = NAN, threads = NAN, start = NAN;
    proc_stat(&cpu, &threads, &start);
    metrics_emit(out, METRIC_COUNTER, "process_cpu_seconds_total",
                 "User and system CPU time spent, seconds.", NULL, cpu);
    metrics_emit(out, METRIC_GAUGE, "process_resident_memory_bytes",
                 "Resident memory size, bytes.", NULL, proc_rss_bytes());
    metrics_emit(out, METRIC_GAUGE, "process_open_fds",
                 "Open file descriptors.", NULL, proc_open_fds());
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0)
        metrics_emit(out, METRIC_GAUGE, "process_max_fds",
                     "Maximum open file descriptors (soft limit).", NULL,
                     rl.rlim_cur == RLIM_INFINITY ? INFINITY : (double)rl.rlim_cur);
    metrics_emit(out, METRIC_GAUGE, "process_threads", "Threads of the process.",
                 NULL, threads);
    metrics_emit(out, METRIC_GAUGE, "process_start_time_seconds",
                 "Start time of the process since the epoch, seconds.", NULL, start);
}
