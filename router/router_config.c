/* router_config: settings table, INI file (libinih) and flags. */
#include "router_config.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum setting_type { T_STRING, T_UINT, T_ENUM };

struct setting {
    const char *name;
    enum setting_type type;
    uint64_t min, max;            /* T_UINT */
    const char *choices;          /* T_ENUM: "a|b|c" */
    const char *def;
    size_t offset;
    size_t size;                  /* T_STRING / T_ENUM buffer size */
    const char *help;
};

#define FIELD(f) offsetof(struct router_config, f), sizeof(((struct router_config *)0)->f)

static const struct setting settings[] = {
    {"listen", T_STRING, 0, 0, NULL, "127.0.0.1:7500", FIELD(listen),
     "address to serve gRPC on, host:port (port 0 picks a free port)"},
    {"topology", T_STRING, 0, 0, NULL, "./topology.ini", FIELD(topology),
     "topology file naming the shard groups (docs/TOPOLOGY.md); SIGHUP "
     "re-reads it"},
    {"default_shards", T_UINT, 1, 4096, NULL, "64", FIELD(default_shards),
     "shards of a filter created with shards = 0"},
    {"node_timeout_ms", T_UINT, 10, 600000, NULL, "5000", FIELD(node_timeout_ms),
     "deadline of every call forwarded to a node"},
    {"secret_ttl_s", T_UINT, 1, 86400, NULL, "10", FIELD(secret_ttl_s),
     "how long a filter's secret and shard count are cached before they are "
     "checked again"},
    {"max_batch_keys", T_UINT, 1, 10000000, NULL, "100000", FIELD(max_batch_keys),
     "most keys in one request; more is RESOURCE_EXHAUSTED"},
    {"max_key_size", T_UINT, 1, 1 << 20, NULL, "4096", FIELD(max_key_size),
     "longest key in bytes; longer is INVALID_ARGUMENT"},
    {"max_message_size", T_UINT, 4096, 1u << 30, NULL, "67108864",
     FIELD(max_message_size), "largest gRPC message in bytes, both directions"},
    {"threads", T_UINT, 1, 256, NULL, "8", FIELD(threads),
     "RPC worker threads (each waits for its fan-out: more than cores)"},
    {"shutdown_grace_ms", T_UINT, 0, 600000, NULL, "3000", FIELD(shutdown_grace_ms),
     "on SIGTERM/SIGINT, how long in-flight calls may finish before cancel"},
    {"log_level", T_ENUM, 0, 0, "debug|info|warn|error", "info", FIELD(log_level),
     "least severe log level printed"},
};
#define NSETTINGS (sizeof settings / sizeof settings[0])

static const struct setting *find(const char *name)
{
    for (size_t i = 0; i < NSETTINGS; i++)
        if (strcmp(settings[i].name, name) == 0)
            return &settings[i];
    return NULL;
}

static bool enum_ok(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *e = strchr(p, '|');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return true;
        if (!e)
            break;
        p = e + 1;
    }
    return false;
}

/* Set one setting from text.  Returns 0 or -1 with a message in err. */
static int set_value(struct router_config *c, const struct setting *s,
                     const char *v, char *err, size_t errlen)
{
    char *dst = (char *)c + s->offset;
    if (s->type == T_UINT) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end || *v == '-' || x < s->min || x > s->max) {
            snprintf(err, errlen, "%s must be an integer in %" PRIu64 "..%" PRIu64
                     ", not \"%s\"", s->name, s->min, s->max, v);
            return -1;
        }
        memcpy(dst, &(uint64_t){x}, sizeof(uint64_t));
        return 0;
    }
    if (s->type == T_ENUM && !enum_ok(s->choices, v)) {
        snprintf(err, errlen, "%s must be one of %s, not \"%s\"", s->name,
                 s->choices, v);
        return -1;
    }
    if (strlen(v) >= s->size || !*v) {
        snprintf(err, errlen, "%s must be 1..%zu characters", s->name, s->size - 1);
        return -1;
    }
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

struct ini_ctx {
    struct router_config *c;
    char err[450];
    bool failed;
};

/* libinih returns the line of the first entry the handler refused. */
static int on_ini_entry(void *user, const char *section, const char *name,
                        const char *value)
{
    struct ini_ctx *x = user;
    char msg[400];
    if (x->failed)
        return 0;
    if (strcmp(section, "router") != 0) {
        snprintf(x->err, sizeof x->err,
                 "unknown section [%s] (expected [router])", section);
        x->failed = true;
        return 0;
    }
    const struct setting *s = find(name);
    if (!s) {
        snprintf(x->err, sizeof x->err, "unknown setting \"%s\"", name);
        x->failed = true;
        return 0;
    }
    if (set_value(x->c, s, value, msg, sizeof msg) < 0) {
        snprintf(x->err, sizeof x->err, "%s", msg);
        x->failed = true;
        return 0;
    }
    return 1;
}

void router_config_usage(FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s [--config FILE] [--SETTING VALUE ...]\n\n"
            "bloomgrid-router serves the public bloomgrid.v1.BloomGrid API (and\n"
            "grpc.health.v1.Health) in front of the nodes named by a topology file.\n"
            "It hashes every key once with the filter's secret, sends one batched\n"
            "call per shard to the shard's node in parallel and answers in request\n"
            "order.  It keeps no state of its own: any number of routers may serve\n"
            "one cluster.\n\n"
            "Every setting may be given in the [router] section of an INI file\n"
            "(name = value) or as a flag (--name value or --name=value, '_' may be\n"
            "written '-'); flags override the file.\n\n"
            "Signals: SIGHUP re-reads the topology file (a malformed file is refused\n"
            "and the old topology stays); SIGTERM or SIGINT stop accepting calls, let\n"
            "in-flight calls finish and exit 0.\n\n"
            "  --config FILE            read settings from FILE first\n"
            "  --help                   print this text\n\n",
            prog);
    for (size_t i = 0; i < NSETTINGS; i++) {
        const struct setting *s = &settings[i];
        char flag[64], range[96];
        snprintf(flag, sizeof flag, "--%s", s->name);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_')
                *p = '-';
        if (s->type == T_UINT)
            snprintf(range, sizeof range, "%" PRIu64 "..%" PRIu64, s->min, s->max);
        else if (s->type == T_ENUM)
            snprintf(range, sizeof range, "%s", s->choices);
        else
            snprintf(range, sizeof range, "text");
        fprintf(out, "  %-24s %s\n  %24s [%s; default %s]\n", flag, s->help, "",
                range, s->def);
    }
}

static const struct setting *flag_setting(const char *flag)
{
    char name[64];
    size_t n = strcspn(flag, "=");
    if (n >= sizeof name)
        return NULL;
    memcpy(name, flag, n);
    name[n] = 0;
    for (char *p = name; *p; p++)
        if (*p == '-')
            *p = '_';
    return find(name);
}

int router_config_load(struct router_config *c, int argc, char **argv)
{
    char err[512];
    const char *config_path = NULL;

    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NSETTINGS; i++)
        if (set_value(c, &settings[i], settings[i].def, err, sizeof err) < 0)
            abort(); /* a bad default is a bug */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            router_config_usage(stdout, argv[0]);
            return 1;
        }
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: --config needs a file name\n", argv[0]);
                return -1;
            }
            config_path = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            config_path = argv[i] + 9;
        }
    }
    if (config_path) {
        struct ini_ctx x = {.c = c};
        int rc = ini_parse(config_path, on_ini_entry, &x);
        if (x.failed) {
            fprintf(stderr, "%s: %s:%d: %s\n", argv[0], config_path, rc, x.err);
            return -1;
        }
        if (rc < 0) {
            fprintf(stderr, "%s: cannot read config file %s\n", argv[0], config_path);
            return -1;
        }
        if (rc > 0) {
            fprintf(stderr, "%s: %s:%d: syntax error\n", argv[0], config_path, rc);
            return -1;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0)
            continue;
        if (strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "%s: unexpected argument \"%s\" (see --help)\n", argv[0], a);
            return -1;
        }
        const struct setting *s = flag_setting(a + 2);
        if (!s) {
            fprintf(stderr, "%s: unknown flag %s (see --help)\n", argv[0], a);
            return -1;
        }
        const char *v = strchr(a, '=');
        if (v) {
            v++;
        } else {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: %s needs a value\n", argv[0], a);
                return -1;
            }
            v = argv[++i];
        }
        if (set_value(c, s, v, err, sizeof err) < 0) {
            fprintf(stderr, "%s: %s\n", argv[0], err);
            return -1;
        }
    }
    return 0;
}
