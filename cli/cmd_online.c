/* cmd_online: the catalog commands against a server (`create`, `drop`,
 * `list`, `info`) and the option handling shared by every online command.
 *
 * Values the server checks itself (capacity 0, an error rate outside (0,1),
 * shard counts) are passed through, so the tool reports the server's own
 * rule, which may differ between a node and a router. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "online.h"
#include "online_cmd.h"

/* A global option, else the environment variable (unset or empty: NULL). */
static const char *option_or_env(const char *global, const char *var)
{
    const char *env = getenv(var);
    return global ? global : (env && env[0] ? env : NULL);
}

void online_cmd_init(struct online *o)
{
    memset(o, 0, sizeof *o);
    o->server = option_or_env(online_global.server, ONLINE_ENV_SERVER);
    o->deadline_ms = online_global.deadline_ms;
    o->tls_ca = option_or_env(online_global.tls_ca, ONLINE_ENV_TLS_CA);
    o->tls_cert = option_or_env(online_global.tls_cert, ONLINE_ENV_TLS_CERT);
    o->tls_key = option_or_env(online_global.tls_key, ONLINE_ENV_TLS_KEY);
    o->token_file = online_global.token_file;
}

int online_parse_deadline(const char *s, int *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v <= 0 || v > 86400000)
        return cli_fail("--deadline must be a number of milliseconds from 1 "
                        "to 86400000, got '%s'", s);
    *out = (int)v;
    return 0;
}

int online_common_opt(struct online *o, const char *cmd, int c, char **argv)
{
    switch (c) {
    case OPT_SERVER:
        o->server = optarg;
        return 0;
    case OPT_DEADLINE:
        return online_parse_deadline(optarg, &o->deadline_ms);
    case OPT_TLS_CA:
        o->tls_ca = optarg;
        return 0;
    case OPT_TLS_CERT:
        o->tls_cert = optarg;
        return 0;
    case OPT_TLS_KEY:
        o->tls_key = optarg;
        return 0;
    case OPT_TOKEN_FILE:
        o->token_file = optarg;
        return 0;
    case 'h':
        help_print(cmd);
        return CLI_HELP_SHOWN;
    }
    return cli_bad_option(cmd, c, argv);
}

int online_need_args(const char *cmd, int have, int want, const char *what)
{
    if (have < want)
        return cli_fail("%s: missing %s (see 'bloomgrid help %s')", cmd, what,
                        cmd);
    if (have > want)
        return cli_fail("%s: too many arguments (see 'bloomgrid help %s')",
                        cmd, cmd);
    return 0;
}

/* ---- printing FilterInfo -------------------------------------------- */

static void print_text(const struct online_info *f)
{
    printf("name:            %s\n", f->name);
    printf("state:           %s\n", f->state);
    if (f->reason[0])
        printf("reason:          %s\n", f->reason);
    printf("kind:            %s\n", f->kind);
    printf("capacity:        %llu\n", (unsigned long long)f->capacity);
    printf("error rate:      %g\n", f->error_rate);
    printf("shards:          %u\n", f->shards);
    if (f->shards > 1 && f->placement)
        printf("placement:       version %u\n", f->placement);
    if (f->layers)
        printf("layers:          %u\n", f->layers);
    printf("bits (m):        %llu\n", (unsigned long long)f->bits);
    printf("hashes (k):      %u\n", f->hashes);
    printf("bytes:           %llu\n", (unsigned long long)f->bytes);
    if (f->capacity)
        printf("bits/key:        %.3f\n", (double)f->bits / (double)f->capacity);
    printf("fill:            %.6f\n", f->fill_ratio);
    printf("estimated keys:  %.0f\n", f->estimated_count);
    printf("estimated FPR:   %.6g\n", f->estimated_error_rate);
    printf("over capacity:   %s\n", f->over_capacity ? "yes" : "no");
    printf("new-bit adds:    %llu (adds that set a bit: not repeats, not false "
           "positives)\n", (unsigned long long)f->insert_count);
    printf("version:         %llu\n", (unsigned long long)f->version);
    if (f->fingerprint[0])
        printf("fingerprint:     %s\n", f->fingerprint);
    for (size_t i = 0; i < f->nshard; i++) {
        const struct online_shard *s = &f->shard[i];
        printf("shard %-4u       %s%s%s, m %llu, %llu bytes, fill %.6f, "
               "estimated keys %.0f, version %llu%s%s\n", s->index, s->state,
               s->node[0] ? " on " : "", s->node, (unsigned long long)s->bits,
               (unsigned long long)s->bytes, s->fill_ratio,
               s->estimated_count, (unsigned long long)s->version,
               s->reason[0] ? ": " : "", s->reason);
    }
}

/* JSON has no NaN or infinity.  ind: spaces before each field. */
static void json_num(int ind, const char *name, double v)
{
    if (isfinite(v))
        printf(",\n%*s\"%s\": %.17g", ind, "", name, v);
    else
        printf(",\n%*s\"%s\": null", ind, "", name);
}

static void json_u64(int ind, const char *name, uint64_t v)
{
    printf(",\n%*s\"%s\": %llu", ind, "", name, (unsigned long long)v);
}

static void json_field_str(int ind, const char *name, const char *v)
{
    printf(",\n%*s\"%s\": ", ind, "", name);
    cli_json_str(v);
}

static void json_shard(const struct online_shard *s, int ind)
{
    int in2 = ind + 2;

    printf("%*s{\n%*s\"index\": %u", ind, "", in2, "", s->index);
    json_field_str(in2, "node", s->node);
    json_field_str(in2, "state", s->state);
    json_field_str(in2, "reason", s->reason);
    json_u64(in2, "bits", s->bits);
    json_u64(in2, "bytes", s->bytes);
    json_num(in2, "fill", s->fill_ratio);
    json_num(in2, "estimated_count", s->estimated_count);
    json_u64(in2, "version", s->version);
    printf("\n%*s}", ind, "");
}

/* One FilterInfo as a JSON object, indented by ind spaces. */
static void print_json(const struct online_info *f, int ind)
{
    int in2 = ind + 2;

    printf("%*s{\n%*s\"name\": ", ind, "", in2, "");
    cli_json_str(f->name);
    json_field_str(in2, "state", f->state);
    json_field_str(in2, "reason", f->reason);
    json_field_str(in2, "kind", f->kind);
    json_u64(in2, "capacity", f->capacity);
    json_num(in2, "error_rate", f->error_rate);
    json_u64(in2, "shards", f->shards);
    json_u64(in2, "placement", f->placement);
    json_u64(in2, "layers", f->layers);
    json_u64(in2, "m", f->bits);
    json_u64(in2, "k", f->hashes);
    json_u64(in2, "bytes", f->bytes);
    json_num(in2, "fill", f->fill_ratio);
    json_num(in2, "estimated_count", f->estimated_count);
    json_num(in2, "estimated_fpr", f->estimated_error_rate);
    printf(",\n%*s\"over_capacity\": %s", in2, "",
           f->over_capacity ? "true" : "false");
    json_u64(in2, "inserts", f->insert_count);
    json_u64(in2, "version", f->version);
    json_field_str(in2, "fingerprint", f->fingerprint);
    printf(",\n%*s\"shard_info\": [", in2, "");
    for (size_t i = 0; i < f->nshard; i++) {
        printf("%s\n", i ? "," : "");
        json_shard(&f->shard[i], in2 + 2);
    }
    if (f->nshard)
        printf("\n%*s", in2, "");
    printf("]\n%*s}", ind, "");
    if (ind == 0)
        putchar('\n');
}

static int finish_output(void)
{
    if (fflush(stdout) == EOF || ferror(stdout))
        return cli_fail("cannot write the output: %s", strerror(errno));
    return CLI_OK;
}

/* ---- create ------------------------------------------------------------ */

/* Like cli_parse_capacity, but 0 is passed on for the server to judge. */
static int parse_capacity(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);

    if (end != s && *end == '\0' && v == 0) {
        *out = 0;
        return 0;
    }
    return cli_parse_capacity(s, out);
}

/* A number or percentage; its range is the server's to check. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);

    if (end != s && strcmp(end, "%") == 0)
        v /= 100;
    else if (end == s || *end != '\0' || !isfinite(v))
        return cli_fail("--error-rate must be a number (e.g. 0.01 or 1%%), "
                        "got '%s'", s);
    *out = v;
    return 0;
}

static const struct option create_longopts[] = {
    {"capacity", required_argument, NULL, 'n'},
    {"error-rate", required_argument, NULL, 'p'},
    {"kind", required_argument, NULL, 'k'},
    {"shards", required_argument, NULL, 's'},
    {"placement", required_argument, NULL, 'P'},
    {"json", no_argument, NULL, 'j'},
    ONLINE_COMMON_LONGOPTS,
};

/* Print a filter's info as text or JSON, then release it. */
static int show_info(struct online_info *info, bool json)
{
    if (json)
        print_json(info, 0);
    else
        print_text(info);
    online_info_deinit(info);
    return finish_output();
}

int cmd_online_create(int argc, char **argv)
{
    struct online o;
    struct online_info info;
    struct rpc_status st;
    bool have_n = false, have_p = false, json = false;
    uint64_t capacity = 0;
    double rate = 0;
    int kind = 0, c, rc;
    unsigned long shards = 0, placement = 0;
    char *end;

    online_cmd_init(&o);
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":n:p:k:s:P:jh", create_longopts,
                            NULL)) != -1) {
        rc = 0;
        switch (c) {
        case 'n':
            have_n = true;
            rc = parse_capacity(optarg, &capacity);
            break;
        case 'p':
            have_p = true;
            rc = parse_rate(optarg, &rate);
            break;
        case 'k':
            if (!online_kind_parse(optarg, &kind))
                rc = cli_fail("create: unknown kind '%s' (blocked, classic, "
                              "counting or scalable)", optarg);
            break;
        case 's':
            errno = 0;
            shards = strtoul(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-' ||
                shards > UINT32_MAX)
                rc = cli_fail("--shards must be a whole number, got '%s'",
                              optarg);
            break;
        case 'P':
            errno = 0;
            placement = strtoul(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-' ||
                placement < 1 || placement > 255)
                rc = cli_fail("--placement must be a placement version (1 or "
                              "more; docs/TOPOLOGY.md), got '%s'", optarg);
            break;
        case 'j':
            json = true;
            break;
        default:
            rc = online_common_opt(&o, "create", c, argv);
        }
        if (rc)
            return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    }
    if ((rc = online_need_args("create", argc - optind, 1, "NAME")))
        return rc;
    if (!have_n || !have_p)
        return cli_fail("create: --capacity and --error-rate are required");
    if ((rc = online_open(&o)))
        return rc;
    if (online_create(&o, argv[optind], capacity, rate, kind,
                      (uint32_t)shards, NULL, (uint32_t)placement, &info, &st) < 0)
        rc = online_report(&o, &st);
    else
        rc = show_info(&info, json);
    online_close(&o);
    return rc;
}

/* ---- drop, info, list -------------------------------------------------- */

static const struct option plain_longopts[] = {
    ONLINE_COMMON_LONGOPTS,
};

static const struct option json_longopts[] = {
    {"json", no_argument, NULL, 'j'},
    ONLINE_COMMON_LONGOPTS,
};

/* Parse the options of drop, info and list; *json is NULL for drop. */
static int simple_parse(struct online *o, const char *cmd, int argc,
                        char **argv, bool *json)
{
    int c, rc;

    online_cmd_init(o);
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, json ? ":jh" : ":h",
                            json ? json_longopts : plain_longopts,
                            NULL)) != -1) {
        if (c == 'j' && json) {
            *json = true;
            continue;
        }
        if ((rc = online_common_opt(o, cmd, c, argv)))
            return rc;
    }
    return 0;
}

int cmd_online_drop(int argc, char **argv)
{
    struct online o;
    struct rpc_status st;
    int rc = simple_parse(&o, "drop", argc, argv, NULL);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if ((rc = online_need_args("drop", argc - optind, 1, "NAME")))
        return rc;
    if ((rc = online_open(&o)))
        return rc;
    rc = CLI_OK;
    if (online_drop(&o, argv[optind], &st) < 0)
        rc = online_report(&o, &st);
    online_close(&o);
    return rc;
}

/* Shards that failed or could not be asked (their copies unreachable),
 * each named on stderr.  Returns how many. */
static size_t shards_failed(const struct online_info *f)
{
    size_t bad = 0;
    for (size_t i = 0; i < f->nshard; i++) {
        const struct online_shard *s = &f->shard[i];
        if (strcmp(s->state, "failed") != 0 && strcmp(s->state, "unknown") != 0)
            continue;
        bad++;
        fprintf(stderr, "bloomgrid: %s: shard %u%s%s %s%s%s\n", f->name, s->index,
                s->node[0] ? " on " : "", s->node, s->state,
                s->reason[0] ? ": " : "", s->reason);
    }
    return bad;
}

int cmd_online_info(int argc, char **argv)
{
    struct online o;
    struct online_info info;
    struct rpc_status st;
    bool json = false;
    int rc = simple_parse(&o, "info", argc, argv, &json);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if ((rc = online_need_args("info", argc - optind, 1, "NAME")))
        return rc;
    if ((rc = online_open(&o)))
        return rc;
    if (online_get(&o, argv[optind], &info, &st) < 0) {
        rc = online_report(&o, &st);
    } else {
        uint32_t shards = info.shards;
        size_t bad = shards_failed(&info);
        rc = show_info(&info, json);
        if (rc == CLI_OK && bad)
            rc = cli_fail("%s: %zu of %u shards failed or unreachable (above)",
                          argv[optind], bad, shards);
    }
    online_close(&o);
    return rc;
}

static void print_list(const struct online_info *list, size_t n)
{
    if (n)
        printf("%-24s %-9s %12s %10s %6s %14s %8s %12s %s\n", "NAME", "KIND",
               "CAPACITY", "ERROR", "SHARDS", "BYTES", "FILL", "EST.KEYS",
               "STATE");
    for (size_t i = 0; i < n; i++) {
        const struct online_info *f = &list[i];
        printf("%-24s %-9s %12llu %10g %6u %14llu %8.4f %12.0f %s\n", f->name,
               f->kind, (unsigned long long)f->capacity, f->error_rate,
               f->shards, (unsigned long long)f->bytes, f->fill_ratio,
               f->estimated_count, f->state);
    }
}

int cmd_online_list(int argc, char **argv)
{
    struct online o;
    struct online_info *list;
    struct rpc_status st;
    size_t n = 0;
    bool json = false;
    int rc = simple_parse(&o, "list", argc, argv, &json);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    if ((rc = online_need_args("list", argc - optind, 0, "")))
        return rc;
    if ((rc = online_open(&o)))
        return rc;
    if (online_list(&o, &list, &n, &st) < 0) {
        rc = online_report(&o, &st);
    } else {
        if (json) {
            printf("[");
            for (size_t i = 0; i < n; i++) {
                printf("%s\n", i ? "," : "");
                print_json(&list[i], 2);
            }
            printf("%s]\n", n ? "\n" : "");
        } else {
            print_list(list, n);
        }
        size_t bad = 0, filters = 0;
        for (size_t i = 0; i < n; i++) {
            size_t b = shards_failed(&list[i]);
            bad += b;
            filters += b > 0;
        }
        online_info_list_free(list, n);
        rc = finish_output();
        if (rc == CLI_OK && bad)
            rc = cli_fail("%zu shards of %zu filters failed or unreachable (above)",
                          bad, filters);
    }
    online_close(&o);
    return rc;
}
