/* cmd_canary: `bloomgrid canary FILTER --server R1[,R2...]`, the one check
 * of the service's promise that runs end to end.
 *
 * Each round adds one new canary key (common/cluster/canary.h) through one router,
 * the routers taking turns, and, once it is acknowledged, records it in the
 * state file; then it asks every router for the earlier keys (all of them,
 * or the newest half of --check and a sample of the rest, in requests of
 * CANARY_CHECK_BATCH keys).  An acknowledged key that reads "no" is a false
 * negative: it is printed with the router that said so and makes the exit
 * status 1.  A call that fails (a router unreachable, the filter missing,
 * a shard short of its quorum) is an error, counted apart: it proves
 * nothing either way, and makes the exit status 2 when no false negative
 * was seen.  In a loop (no --once or --rounds) SIGINT and SIGTERM end the
 * run after the round in progress.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "canary.h"
#include "cli.h"
#include "online.h"
#include "online_cmd.h"

#define DEFAULT_CHECK 1000
#define DEFAULT_INTERVAL_MS 60000
#define DEFAULT_NAME "cli"
#define MAX_ROUTERS 64

enum { OPT_ONCE = 0x300, OPT_ROUNDS, OPT_INTERVAL, OPT_CHECK, OPT_NAME,
       OPT_STATE, OPT_JSON };

static const struct option canary_longopts[] = {
    {"once", no_argument, NULL, OPT_ONCE},
    {"rounds", required_argument, NULL, OPT_ROUNDS},
    {"interval", required_argument, NULL, OPT_INTERVAL},
    {"check", required_argument, NULL, OPT_CHECK},
    {"name", required_argument, NULL, OPT_NAME},
    {"state", required_argument, NULL, OPT_STATE},
    {"json", no_argument, NULL, OPT_JSON},
    ONLINE_COMMON_LONGOPTS,
};

struct canary_run {
    struct online opts;         /* the common options; server: the list */
    char *servers;              /* a copy of the list, cut at the commas */
    struct online *o;           /* one open channel per router */
    size_t nr;
    const char *filter, *name, *state_path;
    char state_buf[RULES_FILTER_NAME_MAX + 32];
    uint64_t rounds;            /* 0: until a signal */
    bool once, json;
    int interval_ms;
    size_t check;
    struct canary_state st;
    uint64_t rng;
    uint64_t *pick;             /* check entries */
    struct online_batch *b;     /* enough for check keys */
    size_t nb;
    struct online_batch add;
    /* This round and the whole run. */
    uint64_t r_checked, r_fn, r_err;
    uint64_t round, checked, fn, err;
    bool json_sep;
};

static int parse_whole(const char *opt, const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] < '0' || s[0] > '9' || v == 0 || v > max)
        return cli_fail("canary: %s must be a whole number from 1 to %" PRIu64
                        ", got '%s'", opt, max, s);
    *out = v;
    return 0;
}

/* --interval: a number of seconds, or with a unit: 500ms, 30s, 5m, 1h. */
static int parse_interval(const char *s, int *out)
{
    static const struct { const char *unit; double ms; } units[] = {
        {"", 1000}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000},
    };
    char *end;
    double v;

    errno = 0;
    v = strtod(s, &end);
    if (!errno && end != s && s[0] >= '0' && s[0] <= '9')
        for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
            if (strcmp(end, units[i].unit) == 0) {
                double ms = v * units[i].ms;
                if (ms >= 1 && ms <= 86400000.0) {
                    *out = (int)ms;
                    return 0;
                }
            }
    return cli_fail("canary: --interval must be from 1ms to 24h: a number of "
                    "seconds or one with a unit (500ms, 30s, 5m, 1h), got '%s'", s);
}

static int canary_parse(struct canary_run *c, int argc, char **argv)
{
    char err[CANARY_ERRLEN];
    uint64_t v;
    int ch, rc;

    online_cmd_init(&c->opts);
    c->check = DEFAULT_CHECK;
    c->interval_ms = DEFAULT_INTERVAL_MS;
    c->name = DEFAULT_NAME;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":h", canary_longopts, NULL)) != -1) {
        rc = 0;
        switch (ch) {
        case OPT_ONCE:
            c->once = true;
            break;
        case OPT_ROUNDS:
            rc = parse_whole("--rounds", optarg, UINT64_MAX / 2, &c->rounds);
            break;
        case OPT_INTERVAL:
            rc = parse_interval(optarg, &c->interval_ms);
            break;
        case OPT_CHECK:
            if (!(rc = parse_whole("--check", optarg, CANARY_CHECK_MAX, &v)))
                c->check = (size_t)v;
            break;
        case OPT_NAME:
            c->name = optarg;
            break;
        case OPT_STATE:
            c->state_path = optarg;
            break;
        case OPT_JSON:
            c->json = true;
            break;
        default:
            rc = online_common_opt(&c->opts, "canary", ch, argv);
        }
        if (rc)
            return rc;
    }
    if ((rc = online_need_args("canary", argc - optind, 1, "FILTER")))
        return rc;
    c->filter = argv[optind];
    if (rules_filter_name_check(c->filter, strlen(c->filter), err) < 0)
        return cli_fail("canary: %s", err);
    if (canary_name_check("--name", c->name, err) < 0)
        return cli_fail("canary: %s", err);
    if (c->once && c->rounds)
        return cli_fail("canary: give --once or --rounds N, not both");
    if (c->once)
        c->rounds = 1;
    if (!c->state_path) {
        snprintf(c->state_buf, sizeof c->state_buf, "canary-%s.state", c->filter);
        c->state_path = c->state_buf;
    }
    return 0;
}

/* Split the --server list and open a channel to each router. */
static int canary_open(struct canary_run *c)
{
    char *save = NULL;

    if (!c->opts.server || !c->opts.server[0])
        return cli_fail("canary: no router: give --server HOST:PORT[,HOST:PORT...] "
                        "or set %s", ONLINE_ENV_SERVER);
    if (!(c->servers = strdup(c->opts.server)) ||
        !(c->o = calloc(MAX_ROUTERS, sizeof *c->o)))
        return cli_fail("out of memory");
    for (char *a = strtok_r(c->servers, ",", &save); a; a = strtok_r(NULL, ",", &save)) {
        if (c->nr == MAX_ROUTERS)
            return cli_fail("canary: --server names more than %d routers",
                            MAX_ROUTERS);
        c->o[c->nr] = c->opts;
        c->o[c->nr].server = a;
        if (online_open(&c->o[c->nr]))
            return CLI_ERR;
        c->nr++;
    }
    if (c->nr == 0)
        return cli_fail("canary: --server '%s' names no router", c->opts.server);
    return 0;
}

/* The state file, or a new canary; a state of another filter or canary,
 * or one that does not parse, stops the run before any call. */
static int canary_load(struct canary_run *c)
{
    char err[CANARY_ERRLEN];
    int rc = canary_state_load(c->state_path, &c->st, err);

    if (rc == -ENOENT) {
        memset(&c->st, 0, sizeof c->st);
        snprintf(c->st.filter, sizeof c->st.filter, "%s", c->filter);
        snprintf(c->st.name, sizeof c->st.name, "%s", c->name);
        return 0;
    }
    if (rc < 0 || canary_state_match(c->state_path, &c->st, c->filter, c->name, err) < 0)
        return cli_fail("canary: %s", err);
    return 0;
}

static int canary_alloc(struct canary_run *c)
{
    c->nb = (c->check + CANARY_CHECK_BATCH - 1) / CANARY_CHECK_BATCH;
    c->pick = calloc(c->check, sizeof *c->pick);
    c->b = calloc(c->nb, sizeof *c->b);
    if (!c->pick || !c->b || online_batch_init(&c->add, c->filter) < 0)
        return cli_fail("out of memory");
    for (size_t i = 0; i < c->nb; i++)
        if (online_batch_init(&c->b[i], c->filter) < 0)
            return cli_fail("out of memory");
    c->rng = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    return 0;
}

static void canary_free(struct canary_run *c)
{
    for (size_t i = 0; i < c->nr; i++)
        online_close(&c->o[i]);
    for (size_t i = 0; c->b && i < c->nb; i++)
        online_batch_deinit(&c->b[i]);
    online_batch_deinit(&c->add);
    free(c->b);
    free(c->pick);
    free(c->o);
    free(c->servers);
}

/* ---- output ---------------------------------------------------------- */

static void json_sep(struct canary_run *c)
{
    if (c->json_sep)
        putchar(',');
    c->json_sep = true;
}

/* A failed call: one line on stderr, or an entry of the round's errors. */
static void report_error(struct canary_run *c, const char *what,
                         const struct online *o, const struct rpc_status *st)
{
    c->r_err++;
    if (c->json) {
        json_sep(c);
        printf("{\"router\":");
        cli_json_str(o->server);
        printf(",\"call\":");
        cli_json_str(what);
        printf(",\"code\":");
        cli_json_str(rpc_status_name(st->code));
        printf(",\"message\":");
        cli_json_str(st->message);
        putchar('}');
        return;
    }
    fflush(stdout);
    fprintf(stderr, "bloomgrid: canary: %s through %s failed: %s: %s\n", what,
            o->server, rpc_status_name(st->code),
            st->message[0] ? st->message : "(no message)");
}

static void report_fn(struct canary_run *c, const struct online *o,
                      const char *key, size_t len)
{
    char k[CANARY_KEY_MAX];

    /* The batch holds the keys one after another, without NULs. */
    snprintf(k, sizeof k, "%.*s", (int)len, key);
    c->r_fn++;
    if (c->json) {
        json_sep(c);
        printf("{\"router\":");
        cli_json_str(o->server);
        printf(",\"false_negative\":");
        cli_json_str(k);
        putchar('}');
        return;
    }
    printf("FALSE NEGATIVE\t%s\tthrough %s: acknowledged earlier, reads \"no\"\n",
           k, o->server);
}

/* ---- a round ---------------------------------------------------------- */

/* Add key st.next through one router; on its acknowledgement record it.
 * Returns whether it was acknowledged. */
static bool round_add(struct canary_run *c, const struct online *via, char *key)
{
    struct rpc_status st;
    char err[CANARY_ERRLEN];
    size_t len = canary_key(key, c->name, c->st.next);

    online_batch_clear(&c->add);
    if (online_batch_add(&c->add, key, len) < 0) {
        rpc_status_set(&st, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s", "out of memory");
        report_error(c, "Add", via, &st);
        return false;
    }
    if (online_keys_call((struct online *)via, ONLINE_ADD, &c->add, 1, &st) != 1) {
        report_error(c, "Add", via, &st);
        return false;
    }
    c->st.next++;
    /* A state that cannot be saved lags: the next run adds its keys again. */
    if (canary_state_save(c->state_path, &c->st, err) < 0) {
        rpc_status_set(&st, GRPC_STATUS_INTERNAL, "%s", err);
        report_error(c, "saving the state", via, &st);
    }
    return true;
}

/* Ask one router for the picked keys (in c->b[0..nb)). */
static void round_check(struct canary_run *c, struct online *o, size_t nb)
{
    struct rpc_status st;
    size_t done = online_keys_call(o, ONLINE_MAY_CONTAIN, c->b, nb, &st);

    for (size_t i = 0; i < done; i++) {
        c->r_checked += c->b[i].n;
        for (size_t k = 0; k < c->b[i].n; k++)
            if (!c->b[i].answer[k]) {
                size_t len;
                const char *key = online_batch_key(&c->b[i], k, &len);
                report_fn(c, o, key, len);
            }
    }
    if (done < nb)
        report_error(c, "MayContain", o, &st);
}

/* Fill the check batches with this round's picks; returns how many. */
static size_t round_pick(struct canary_run *c, size_t *nkeys)
{
    char key[CANARY_KEY_MAX];
    size_t n = canary_pick(c->st.next, c->check, c->pick, &c->rng), nb = 0;

    for (size_t i = 0; i < c->nb; i++)
        online_batch_clear(&c->b[i]);
    for (size_t i = 0; i < n; i++) {
        size_t len = canary_key(key, c->name, c->pick[i]);
        nb = i / CANARY_CHECK_BATCH + 1;
        if (online_batch_add(&c->b[nb - 1], key, len) < 0) {
            cli_fail("out of memory");
            exit(CLI_ERR);
        }
    }
    *nkeys = n;
    return nb;
}

static void canary_round(struct canary_run *c)
{
    char key[CANARY_KEY_MAX];
    const struct online *via = &c->o[c->round % c->nr];
    size_t nkeys, nb;
    bool added;

    c->round++;
    c->r_checked = c->r_fn = c->r_err = 0;
    c->json_sep = false;
    if (c->json) {
        printf("{\"round\":%" PRIu64 ",\"filter\":", c->round);
        cli_json_str(c->filter);
        printf(",\"events\":[");
    }
    added = round_add(c, via, key);
    nb = round_pick(c, &nkeys);
    for (size_t r = 0; nb && r < c->nr; r++)
        round_check(c, &c->o[r], nb);
    c->checked += c->r_checked;
    c->fn += c->r_fn;
    c->err += c->r_err;
    if (c->json) {
        printf("],\"added\":");
        if (added)
            cli_json_str(key);
        else
            printf("null");
        printf(",\"added_through\":");
        cli_json_str(via->server);
        printf(",\"keys\":%" PRIu64 ",\"picked\":%zu,\"routers\":%zu,\"checked\":%" PRIu64
               ",\"false_negatives\":%" PRIu64 ",\"errors\":%" PRIu64
               ",\"total_checked\":%" PRIu64 ",\"total_false_negatives\":%" PRIu64
               ",\"total_errors\":%" PRIu64 "}\n",
               c->st.next, nkeys, c->nr, c->r_checked, c->r_fn, c->r_err,
               c->checked, c->fn, c->err);
    } else {
        printf("round %" PRIu64 ": %s%s through %s; %zu of %" PRIu64 " keys asked "
               "of %zu router%s: %" PRIu64 " false negative%s, %" PRIu64
               " error%s\n", c->round, added ? "added " : "could not add ",
               added ? key : "a key", via->server, nkeys, c->st.next, c->nr,
               c->nr == 1 ? "" : "s", c->r_fn, c->r_fn == 1 ? "" : "s",
               c->r_err, c->r_err == 1 ? "" : "s");
    }
    fflush(stdout);
}

/* Sleep between rounds; false when SIGINT or SIGTERM came (blocked, so a
 * signal during a round waits for its end). */
static bool canary_sleep(const sigset_t *stop, int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    siginfo_t si;

    for (;;) {
        int sig = sigtimedwait(stop, &si, &ts);
        if (sig > 0)
            return false;
        if (errno == EAGAIN)
            return true;
        /* EINTR: another signal; sleeping the whole interval again is fine. */
    }
}

static int canary_exit(const struct canary_run *c)
{
    if (c->fn) {
        cli_fail("canary: %" PRIu64 " false negative%s in %" PRIu64 " round%s "
                 "(see above): acknowledged keys read \"no\"", c->fn,
                 c->fn == 1 ? "" : "s", c->round, c->round == 1 ? "" : "s");
        return CLI_NO;
    }
    if (c->err)
        return cli_fail("canary: %" PRIu64 " failed call%s in %" PRIu64 " round%s "
                        "(see above)", c->err, c->err == 1 ? "" : "s", c->round,
                        c->round == 1 ? "" : "s");
    return CLI_OK;
}

int cmd_canary(int argc, char **argv)
{
    static struct canary_run c;
    sigset_t stop;
    int rc;

    memset(&c, 0, sizeof c);
    rc = canary_parse(&c, argc, argv);
    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    /* Blocked before the channels exist, so gRPC's threads inherit it. */
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    if (c.rounds != 1)
        sigprocmask(SIG_BLOCK, &stop, NULL);
    if ((rc = canary_load(&c)) || (rc = canary_alloc(&c)) || (rc = canary_open(&c)))
        goto out;
    for (;;) {
        canary_round(&c);
        if (c.rounds && c.round >= c.rounds)
            break;
        if (!canary_sleep(&stop, c.interval_ms))
            break;
    }
    if (!c.json && c.rounds != 1)
        printf("total: %" PRIu64 " rounds, %" PRIu64 " keys acknowledged, %" PRIu64
               " checks, %" PRIu64 " false negatives, %" PRIu64 " errors\n", c.round,
               c.st.next, c.checked, c.fn, c.err);
    if (fflush(stdout) == EOF || ferror(stdout))
        rc = cli_fail("cannot write the output: %s", strerror(errno));
    else
        rc = canary_exit(&c);
out:
    canary_free(&c);
    return rc;
}
