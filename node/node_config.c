/* node_config: settings table, INI file (libinih) and flags. */
#include "node_config.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#ifndef BLOOMGRID_VERSION
#define BLOOMGRID_VERSION "unknown"
#endif

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

#define FIELD(f) offsetof(struct node_config, f), sizeof(((struct node_config *)0)->f)

static const struct setting settings[] = {
    {"listen", T_STRING, 0, 0, NULL, "127.0.0.1:7400", FIELD(listen),
     "address to serve gRPC on, host:port (port 0 picks a free port)"},
    {"data_dir", T_STRING, 0, 0, NULL, "./bloomgrid-data", FIELD(data_dir),
     "directory holding the filters (snapshots and write-ahead logs)"},
    {"durability", T_ENUM, 0, 0, "fsync|none", "fsync", FIELD(durability),
     "fsync: acknowledge writes once on disk (group commit); none: "
     "acknowledge after write(): a machine crash loses recent writes"},
    {"snapshot_interval", T_UINT, 1, 86400, NULL, "60", FIELD(snapshot_interval_s),
     "seconds between snapshots of changed filters"},
    {"snapshot_wal_mb", T_UINT, 1, 1 << 20, NULL, "64", FIELD(snapshot_wal_mb),
     "also snapshot a filter once its write-ahead log grew by this many MiB"},
    {"max_batch_keys", T_UINT, 1, 10000000, NULL, "100000", FIELD(max_batch_keys),
     "most keys (or hashes) in one request; more is RESOURCE_EXHAUSTED"},
    {"max_key_size", T_UINT, 1, 1 << 20, NULL, "4096", FIELD(max_key_size),
     "longest key in bytes; longer is INVALID_ARGUMENT"},
    {"max_message_size", T_UINT, 4096, 1u << 30, NULL, "67108864",
     FIELD(max_message_size), "largest gRPC message in bytes, both directions"},
    {"threads", T_UINT, 1, 256, NULL, "8", FIELD(threads),
     "RPC worker threads (handlers may wait for fsync: more than cores)"},
    {"max_streams", T_UINT, 1, 100000, NULL, "256", FIELD(max_streams),
     "streaming calls open at once (each has a thread); more get "
     "RESOURCE_EXHAUSTED"},
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
    const char *p = choices;
    while (*p) {
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
static int set_value(struct node_config *c, const struct setting *s,
                     const char *v, char *err, size_t errlen)
{
    char *dst = (char *)c + s->offset;
    switch (s->type) {
    case T_STRING:
    case T_ENUM:
        if (s->type == T_ENUM && !enum_ok(s->choices, v)) {
            snprintf(err, errlen, "%s must be one of %s, not \"%s\"", s->name,
                     s->choices, v);
            return -1;
        }
        if (strlen(v) >= s->size || (s->type == T_STRING && !*v)) {
            snprintf(err, errlen, "%s must be 1..%zu characters", s->name,
                     s->size - 1);
            return -1;
        }
        memcpy(dst, v, strlen(v) + 1);
        return 0;
    case T_UINT: {
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
    }
    return -1;
}

struct ini_ctx {
    struct node_config *c;
    const char *path;
    char err[450];
    bool failed;
};

/* libinih reports the line of the first entry a handler refused as the
 * return value of ini_parse; the handler keeps the reason. */
static int on_ini_entry(void *user, const char *section, const char *name,
                        const char *value)
{
    struct ini_ctx *x = user;
    char msg[400];
    if (x->failed)
        return 0;
    if (strcmp(section, "node") != 0) {
        snprintf(x->err, sizeof x->err, "unknown section [%s] (expected [node])",
                 section);
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

void node_config_usage(FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s [--config FILE] [--SETTING VALUE ...]\n\n"
            "bloomgrid-node serves named Bloom filters over gRPC (bloomgrid.v1.BloomGrid,\n"
            "bloomgrid.v1.Internal and grpc.health.v1.Health).  Every setting may be\n"
            "given in the [node] section of an INI file (name = value) or as a flag\n"
            "(--name value or --name=value, '_' may be written '-'); flags override\n"
            "the file.  SIGTERM or SIGINT: stop accepting calls, let in-flight calls\n"
            "finish, snapshot, exit 0.\n\n"
            "  --config FILE            read settings from FILE first\n"
            "  --help                   print this text\n"
            "  --version                print the version\n\n",
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

int node_config_load(struct node_config *c, int argc, char **argv)
{
    char err[512];
    const char *config_path = NULL;

    memset(c, 0, sizeof *c);
    for (size_t i = 0; i < NSETTINGS; i++)
        if (set_value(c, &settings[i], settings[i].def, err, sizeof err) < 0)
            abort(); /* a bad default is a bug */

    /* First pass: --help and --config. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            node_config_usage(stdout, argv[0]);
            return 1;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("bloomgrid-node %s\n", BLOOMGRID_VERSION);
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
        struct ini_ctx x = {.c = c, .path = config_path};
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
    /* Second pass: every other flag overrides the file. */
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
