/* metrics: registration, lock-free updates, the text format, samplers and
 * the HTTP endpoint. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "metrics.h"
#include "metrics_http.h"

static char *render(struct metrics *m)
{
    char *t;
    size_t n;
    ck_assert_int_eq(metrics_render_string(m, &t, &n), 0);
    ck_assert_uint_eq(strlen(t), n);
    return t;
}

static void has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)); p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return;
    ck_abort_msg("no line \"%s\" in:\n%s", line, text);
}

START_TEST(counter_and_gauge)
{
    struct metrics *m = metrics_create();
    const char *l1[] = {"method", "Add", "code", "OK", NULL};
    const char *l2[] = {"method", "Add", "code", "NOT_FOUND", NULL};
    struct metric *a = metrics_counter(m, "bg_calls_total", "Calls.", l1);
    struct metric *b = metrics_counter(m, "bg_calls_total", "ignored", l2);
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_eq(metrics_counter(m, "bg_calls_total", NULL, l1), a);
    metric_add(a, 3);
    metric_add(a, 4);
    metric_add(b, 1);
    metric_add(NULL, 1);
    ck_assert_uint_eq(metric_count(a), 7);
    struct metric *g = metrics_gauge(m, "bg_bytes", "Bytes held.", NULL);
    metric_set(g, 1.5);
    metric_gauge_add(g, 2);
    ck_assert(fabs(metric_value(g) - 3.5) < 1e-12);
    char *t = render(m);
    has_line(t, "# HELP bg_calls_total Calls.");
    has_line(t, "# TYPE bg_calls_total counter");
    has_line(t, "bg_calls_total{method=\"Add\",code=\"OK\"} 7");
    has_line(t, "bg_calls_total{method=\"Add\",code=\"NOT_FOUND\"} 1");
    has_line(t, "# TYPE bg_bytes gauge");
    has_line(t, "bg_bytes 3.5");
    /* One header per family. */
    ck_assert_ptr_null(strstr(strstr(t, "# TYPE bg_calls_total") + 1, "# TYPE bg_calls_total"));
    free(t);
    metrics_destroy(m);
}
END_TEST

START_TEST(refusals_and_escaping)
{
    struct metrics *m = metrics_create();
    ck_assert_ptr_null(metrics_counter(m, "9bad", "x", NULL));
    ck_assert_ptr_null(metrics_counter(m, "bad-name", "x", NULL));
    ck_assert_ptr_null(metrics_counter(m, "", "x", NULL));
    const char *badl[] = {"bad label", "v", NULL};
    ck_assert_ptr_null(metrics_counter(m, "ok_total", "x", badl));
    const char *resv[] = {"__name__", "v", NULL};
    ck_assert_ptr_null(metrics_counter(m, "ok_total", "x", resv));
    ck_assert_ptr_nonnull(metrics_counter(m, "ok_total", "x", NULL));
    ck_assert_ptr_null(metrics_gauge(m, "ok_total", "x", NULL));   /* type clash */
    double bad_bounds[] = {1, 1};
    ck_assert_ptr_null(metrics_histogram(m, "h_seconds", "x", NULL, bad_bounds, 2));
    const char *esc[] = {"filter", "a\"b\\c\nd", NULL};
    metric_add(metrics_counter(m, "esc_total", "line one\nline \\two", esc), 1);
    char *t = render(m);
    has_line(t, "esc_total{filter=\"a\\\"b\\\\c\\nd\"} 1");
    has_line(t, "# HELP esc_total line one\\nline \\\\two");
    free(t);
    metrics_destroy(m);
}
END_TEST

START_TEST(histogram_buckets)
{
    struct metrics *m = metrics_create();
    const double b[] = {0.001, 0.01, 0.1};
    const char *l[] = {"method", "Check", NULL};
    struct metric *h = metrics_histogram(m, "lat_seconds", "Latency.", l, b, 3);
    ck_assert_ptr_nonnull(h);
    metric_observe(h, 0.0005);
    metric_observe(h, 0.001);     /* le is inclusive */
    metric_observe(h, 0.05);
    metric_observe(h, 7);
    ck_assert_uint_eq(metric_count(h), 4);
    char *t = render(m);
    has_line(t, "# TYPE lat_seconds histogram");
    has_line(t, "lat_seconds_bucket{method=\"Check\",le=\"0.001\"} 2");
    has_line(t, "lat_seconds_bucket{method=\"Check\",le=\"0.01\"} 2");
    has_line(t, "lat_seconds_bucket{method=\"Check\",le=\"0.1\"} 3");
    has_line(t, "lat_seconds_bucket{method=\"Check\",le=\"+Inf\"} 4");
    has_line(t, "lat_seconds_count{method=\"Check\"} 4");
    const char *sum = strstr(t, "\nlat_seconds_sum{method=\"Check\"} ");
    ck_assert_ptr_nonnull(sum);
    ck_assert(fabs(atof(strchr(sum, '}') + 2) - 7.0515) < 1e-12);
    free(t);
    metrics_destroy(m);
}
END_TEST

struct hammer {
    struct metric *c, *h, *g;
};

static void *hammer_run(void *arg)
{
    struct hammer *x = arg;
    for (int i = 0; i < 100000; i++) {
        metric_add(x->c, 1);
        metric_observe(x->h, (i % 10) * 1e-4);
        metric_gauge_add(x->g, 1);
    }
    return NULL;
}

START_TEST(concurrent_updates_lose_nothing)
{
    struct metrics *m = metrics_create();
    struct hammer x = {
        metrics_counter(m, "n_total", "n", NULL),
        metrics_histogram(m, "d_seconds", "d", NULL, metrics_latency_bounds,
                          metrics_latency_nbounds),
        metrics_gauge(m, "g", "g", NULL),
    };
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, hammer_run, &x);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    ck_assert_uint_eq(metric_count(x.c), 400000);
    ck_assert_uint_eq(metric_count(x.h), 400000);
    ck_assert(fabs(metric_value(x.g) - 400000) < 1e-6);
    /* sum of (i % 10) * 1e-4 over 100000 i, four times: 4 * 10000 * 45e-4 */
    ck_assert(fabs(metric_value(x.h) - 180.0) < 1e-6);
    metrics_destroy(m);
}
END_TEST

static void sample_two(void *arg, struct metrics_out *out)
{
    int *calls = arg;
    (*calls)++;
    const char *a[] = {"filter", "a", NULL}, *b[] = {"filter", "b", NULL};
    metrics_emit(out, METRIC_GAUGE, "filter_bytes", "Bytes of a filter.", a, 1024);
    metrics_emit(out, METRIC_GAUGE, "filter_bytes", "Bytes of a filter.", b, 2048);
    metrics_emit(out, METRIC_COUNTER, "filter_inserts_total", "Inserts.", a, 5);
}

START_TEST(samplers)
{
    struct metrics *m = metrics_create();
    int calls = 0;
    ck_assert_int_eq(metrics_add_sampler(m, sample_two, &calls), 0);
    ck_assert_int_eq(metrics_add_sampler(m, metrics_process_sampler, NULL), 0);
    char *t = render(m);
    ck_assert_int_eq(calls, 1);
    has_line(t, "# TYPE filter_bytes gauge");
    has_line(t, "filter_bytes{filter=\"a\"} 1024");
    has_line(t, "filter_bytes{filter=\"b\"} 2048");
    has_line(t, "# TYPE filter_inserts_total counter");
    has_line(t, "filter_inserts_total{filter=\"a\"} 5");
    const char *fds = strstr(t, "\nprocess_open_fds ");
    ck_assert_ptr_nonnull(fds);
    ck_assert(atof(fds + strlen("\nprocess_open_fds ")) >= 3);
    const char *rss = strstr(t, "\nprocess_resident_memory_bytes ");
    ck_assert_ptr_nonnull(rss);
    ck_assert(atof(rss + strlen("\nprocess_resident_memory_bytes ")) > 1e5);
    free(t);
    for (int i = 2; i < METRICS_MAX_SAMPLERS; i++)
        ck_assert_int_eq(metrics_add_sampler(m, sample_two, &calls), 0);
    ck_assert_int_eq(metrics_add_sampler(m, sample_two, &calls), -ENOSPC);
    metrics_destroy(m);
}
END_TEST

/* One HTTP request on a fresh connection; returns the whole response. */
static char *http(int port, const char *req)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(write(fd, req, strlen(req)), (ssize_t)strlen(req));
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t n;
    while ((n = read(fd, buf + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    buf[len] = '\0';
    close(fd);
    return buf;
}

START_TEST(http_endpoint)
{
    struct metrics *m = metrics_create();
    metric_add(metrics_counter(m, "served_total", "Served.", NULL), 42);
    char err[256];
    int port = 0;
    struct metrics_http *h =
        metrics_http_start("127.0.0.1:0", m, NULL, NULL, &port, err, sizeof err);
    ck_assert_msg(h != NULL, "%s", err);
    ck_assert_int_gt(port, 0);
    char *r = http(port, "GET /metrics HTTP/1.0\r\n\r\n");
    ck_assert_msg(strncmp(r, "HTTP/1.0 200", 12) == 0 || strncmp(r, "HTTP/1.1 200", 12) == 0, "%s", r);
    ck_assert_ptr_nonnull(strstr(r, "text/plain; version=0.0.4"));
    ck_assert_ptr_nonnull(strstr(r, "\nserved_total 42\n"));
    free(r);
    r = http(port, "GET /nothing HTTP/1.0\r\n\r\n");
    ck_assert_ptr_nonnull(strstr(r, " 404 "));
    free(r);
    r = http(port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
    ck_assert_ptr_nonnull(strstr(r, " 405 "));
    free(r);
    /* The port is taken: a second server on it fails, naming the address. */
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    ck_assert_ptr_null(metrics_http_start(addr, m, NULL, NULL, &port, err, sizeof err));
    ck_assert_ptr_nonnull(strstr(err, addr));
    ck_assert_ptr_null(metrics_http_start("nonsense", m, NULL, NULL, &port, err, sizeof err));
    ck_assert_ptr_null(metrics_http_start("127.0.0.1:70000", m, NULL, NULL, &port, err, sizeof err));
    metrics_http_stop(h);
    metrics_destroy(m);
}
END_TEST

Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, counter_and_gauge);
    tcase_add_test(tc, refusals_and_escaping);
    tcase_add_test(tc, histogram_buckets);
    tcase_add_test(tc, concurrent_updates_lose_nothing);
    tcase_add_test(tc, samplers);
    tcase_add_test(tc, http_endpoint);
    suite_add_tcase(s, tc);
    return s;
}
