/* settings: table-driven defaults, INI file (libinih) and flags. */
#include "settings.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifndef BLOOMGRID_VERSION
#define BLOOMGRID_VERSION "unknown"
#endif

static const struct setting *find(const struct settings_spec *spec, const char *name)
{
    for (size_t i = 0; i < spec->count; i++)
        if (strcmp(spec->table[i].name, name) == 0)
            return &spec->table[i];
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
static int set_value(void *cfg, const struct setting *s, const char *v, char *err,
                     size_t errlen)
{
    char *dst = (char *)cfg + s->offset;

    if (s->type == SETTING_UINT) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || end == v || *end || *v == '-' || x < s->min || x > s->max) {
            snprintf(err, errlen, "%s must be an integer in %" PRIu64 "..%" PRIu64
                     ", not \"%s\"", s->name, s->min, s->max, v);
            return -1;
        }
        uint64_t u = x;
        memcpy(dst, &u, sizeof(u));
        return 0;
    }
    if (s->type == SETTING_ENUM && !enum_ok(s->choices, v)) {
        snprintf(err, errlen, "%s must be one of %s, not \"%s\"", s->name, s->choices, v);
        return -1;
    }
    /* Empty is allowed only where it is the default (meaning "off"). */
    if (strlen(v) >= s->size || (!*v && s->def && *s->def)) {
        snprintf(err, errlen, "%s must be 1..%zu characters", s->name, s->size - 1);
        return -1;
    }
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

struct ini_ctx {
    const struct settings_spec *spec;
    void *cfg;
    char err[450];
    bool failed;
};

/* libinih returns the line of the first entry a handler refused; the handler
 * keeps the reason. */
static int on_ini_entry(void *user, const char *section, const char *name,
                        const char *value)
{
    struct ini_ctx *x = user;
    char msg[400];
    const struct setting *s;

    if (x->failed)
        return 0;
    if (strcmp(section, x->spec->section) != 0) {
        snprintf(x->err, sizeof x->err, "unknown section [%s] (expected [%s])", section,
                 x->spec->section);
        x->failed = true;
        return 0;
    }
    s = find(x->spec, name);
    if (!s) {
        snprintf(x->err, sizeof x->err, "unknown setting \"%s\"", name);
        x->failed = true;
        return 0;
    }
    if (set_value(x->cfg, s, value, msg, sizeof msg) < 0) {
        snprintf(x->err, sizeof x->err, "%s", msg);
        x->failed = true;
        return 0;
    }
    return 1;
}

void settings_usage(const struct settings_spec *spec, FILE *out, const char *prog)
{
    fprintf(out,
            "usage: %s [--config FILE] [--SETTING VALUE ...]\n\n%s\n"
            "Every setting may be given in the [%s] section of an INI file\n"
            "(name = value) or as a flag (--name value or --name=value, '_' may be\n"
            "written '-'); flags override the file.\n\n"
            "  --config FILE            read settings from FILE first\n"
            "  --help                   print this text\n"
            "  --version                print the version\n\n",
            prog, spec->intro, spec->section);
    for (size_t i = 0; i < spec->count; i++) {
        const struct setting *s = &spec->table[i];
        char flag[64], range[96];
        snprintf(flag, sizeof flag, "--%s", s->name);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_')
                *p = '-';
        if (s->type == SETTING_UINT)
            snprintf(range, sizeof range, "%" PRIu64 "..%" PRIu64, s->min, s->max);
        else if (s->type == SETTING_ENUM)
            snprintf(range, sizeof range, "%s", s->choices);
        else
            snprintf(range, sizeof range, "text");
        fprintf(out, "  %-24s %s\n  %24s [%s; default %s]\n", flag, s->help, "", range,
                s->def);
    }
}

static const struct setting *flag_setting(const struct settings_spec *spec,
                                          const char *flag)
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
    return find(spec, name);
}

static int load_file(const struct settings_spec *spec, void *cfg, const char *prog,
                     const char *path)
{
    struct ini_ctx x = {.spec = spec, .cfg = cfg};
    int rc = ini_parse(path, on_ini_entry, &x);

    if (x.failed) {
        fprintf(stderr, "%s: %s:%d: %s\n", prog, path, rc, x.err);
        return -1;
    }
    if (rc < 0) {
        fprintf(stderr, "%s: cannot read config file %s: %s\n", prog, path,
                rc == -1 ? strerror(errno) : "out of memory");
        return -1;
    }
    if (rc > 0) {
        fprintf(stderr, "%s: %s:%d: syntax error\n", prog, path, rc);
        return -1;
    }
    return 0;
}

/* First pass over argv: --help, --version and --config. */
static int scan_meta(const struct settings_spec *spec, int argc, char **argv,
                     const char **config_path)
{
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            settings_usage(spec, stdout, argv[0]);
            return 1;
        }
        if (strcmp(argv[i], "--version") == 0) {
            printf("%s %s\n", spec->program, BLOOMGRID_VERSION);
            return 1;
        }
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                fprintf(stderr, "%s: --config needs a file name\n", argv[0]);
                return -1;
            }
            *config_path = argv[++i];
        } else if (strncmp(argv[i], "--config=", 9) == 0) {
            *config_path = argv[i] + 9;
        }
    }
    return 0;
}

/* Second pass: every other flag, overriding the file. */
static int apply_flags(const struct settings_spec *spec, void *cfg, int argc, char **argv)
{
    char err[512];

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
        const struct setting *s = flag_setting(spec, a + 2);
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
        if (set_value(cfg, s, v, err, sizeof err) < 0) {
            fprintf(stderr, "%s: %s\n", argv[0], err);
            return -1;
        }
    }
    return 0;
}

int settings_load(const struct settings_spec *spec, void *cfg, int argc, char **argv)
{
    char err[512];
    const char *config_path = NULL;
    int rc;

    for (size_t i = 0; i < spec->count; i++)
        if (set_value(cfg, &spec->table[i], spec->table[i].def, err, sizeof err) < 0)
            abort(); /* a bad default is a bug */
    rc = scan_meta(spec, argc, argv, &config_path);
    if (rc != 0)
        return rc;
    if (config_path && load_file(spec, cfg, argv[0], config_path) < 0)
        return -1;
    return apply_flags(spec, cfg, argc, argv);
}
