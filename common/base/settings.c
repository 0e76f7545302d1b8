/* settings: table-driven defaults, INI file (libinih) and flags. */
#include "settings.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "rules.h"
#include "version.h"


static enum setting_type setting_kind(const struct setting *s)
{
    return (enum setting_type)(s->type & SETTING_TYPE_MASK);
}

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

    if (setting_kind(s) == SETTING_FLAG) {
        if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0) {
            snprintf(err, errlen, "--%s takes no value (or =true, =false), not "
                     "\"%s\"", s->name, v);
            return -1;
        }
        *(bool *)(void *)dst = strcmp(v, "true") == 0;
        return 0;
    }
    if (setting_kind(s) == SETTING_UINT) {
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
    if (setting_kind(s) == SETTING_ENUM && !enum_ok(s->choices, v)) {
        snprintf(err, errlen, "%s must be one of %s, not \"%s\"", s->name, s->choices, v);
        return -1;
    }
    /* Empty is allowed only where it is the default (meaning "off"). */
    if (strlen(v) >= s->size || (!*v && s->def && *s->def)) {
        snprintf(err, errlen, "%s must be 1..%zu characters", s->name, s->size - 1);
        return -1;
    }
    if (setting_kind(s) == SETTING_ADDR && *v) {
        char why[RULES_ERRLEN];
        if (rules_addr_check(s->name, v, s->min == 0, why) < 0) {
            snprintf(err, errlen, "%s", why);
            return -1;
        }
    }
    memcpy(dst, v, strlen(v) + 1);
    return 0;
}

struct ini_ctx {
    const struct settings_spec *spec;
    void *cfg;
    char err[SETTINGS_ERRLEN - 64];
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
    if (setting_kind(s) == SETTING_FLAG) {
        snprintf(x->err, sizeof x->err, "\"%s\" is a command-line flag (--%s), "
                 "not a setting of the file", name, name);
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
    for (size_t i = 0; i < spec->count; i++)
        if (spec->table[i].type & SETTING_LIVE) {
            fprintf(out, "Settings marked \"SIGHUP reloads\" take a new value from the "
                    "config file\non SIGHUP (flags still override it); a change "
                    "of any other setting\nis logged and waits for a restart.\n\n");
            break;
        }
    for (size_t i = 0; i < spec->count; i++) {
        const struct setting *s = &spec->table[i];
        char flag[64], range[96];
        snprintf(flag, sizeof flag, "--%s", s->name);
        for (char *p = flag + 2; *p; p++)
            if (*p == '_')
                *p = '-';
        if (setting_kind(s) == SETTING_UINT)
            snprintf(range, sizeof range, "%" PRIu64 "..%" PRIu64, s->min, s->max);
        else if (setting_kind(s) == SETTING_ENUM)
            snprintf(range, sizeof range, "%s", s->choices);
        else if (setting_kind(s) == SETTING_FLAG)
            snprintf(range, sizeof range, "command-line flag, no value");
        else if (setting_kind(s) == SETTING_ADDR)
            snprintf(range, sizeof range, "host:port, port %" PRIu64 "..%d", s->min,
                     RULES_PORT_MAX);
        else
            snprintf(range, sizeof range, "text");
        fprintf(out, "  %-24s %s\n  %24s [%s; default %s%s]\n", flag, s->help, "",
                range, *s->def ? s->def : "\"\"",
                s->type & SETTING_LIVE ? "; SIGHUP reloads" : "");
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

static int load_file(const struct settings_spec *spec, void *cfg, const char *path,
                     char *err)
{
    struct ini_ctx x = {.spec = spec, .cfg = cfg};
    int rc = ini_parse(path, on_ini_entry, &x);

    if (x.failed) {
        snprintf(err, SETTINGS_ERRLEN, "%s:%d: %s", path, rc, x.err);
        return -1;
    }
    if (rc < 0) {
        snprintf(err, SETTINGS_ERRLEN, "cannot read config file %s: %s", path,
                 rc == -1 ? strerror(errno) : "out of memory");
        return -1;
    }
    if (rc > 0) {
        snprintf(err, SETTINGS_ERRLEN, "%s:%d: syntax error", path, rc);
        return -1;
    }
    return 0;
}

/* First pass over argv: --help, --version (acted on only when act is set)
 * and --config. */
static int scan_meta(const struct settings_spec *spec, int argc, char **argv,
                     bool act, const char **config_path, char *err)
{
    for (int i = 1; i < argc; i++) {
        if (act && (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)) {
            settings_usage(spec, stdout, argv[0]);
            return 1;
        }
        if (act && strcmp(argv[i], "--version") == 0) {
            printf("%s %s\n", spec->program, bloomgrid_version);
            return 1;
        }
        if (strcmp(argv[i], "--config") == 0) {
            if (i + 1 >= argc) {
                snprintf(err, SETTINGS_ERRLEN, "--config needs a file name");
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
static int apply_flags(const struct settings_spec *spec, void *cfg, int argc, char **argv,
                       char *err)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--config") == 0) {
            i++;
            continue;
        }
        if (strncmp(a, "--config=", 9) == 0)
            continue;
        if (strncmp(a, "--", 2) != 0) {
            snprintf(err, SETTINGS_ERRLEN, "unexpected argument \"%s\" (see --help)", a);
            return -1;
        }
        const struct setting *s = flag_setting(spec, a + 2);
        if (!s) {
            snprintf(err, SETTINGS_ERRLEN, "unknown flag %s (see --help)", a);
            return -1;
        }
        const char *v = strchr(a, '=');
        if (v) {
            v++;
        } else if (setting_kind(s) == SETTING_FLAG) {
            v = "true";
        } else {
            if (i + 1 >= argc) {
                snprintf(err, SETTINGS_ERRLEN, "%s needs a value", a);
                return -1;
            }
            v = argv[++i];
        }
        if (set_value(cfg, s, v, err, SETTINGS_ERRLEN) < 0)
            return -1;
    }
    return 0;
}

/* Defaults, then the file, then the flags.  Returns 0, 1 (--help or
 * --version printed; only when act is set) or -1 with err set. */
static int load_all(const struct settings_spec *spec, void *cfg, int argc, char **argv,
                    bool act, char *err)
{
    const char *config_path = NULL;
    int rc;

    for (size_t i = 0; i < spec->count; i++)
        if (set_value(cfg, &spec->table[i], spec->table[i].def, err, SETTINGS_ERRLEN) < 0)
            abort(); /* a bad default is a bug */
    rc = scan_meta(spec, argc, argv, act, &config_path, err);
    if (rc != 0)
        return rc;
    if (config_path && load_file(spec, cfg, config_path, err) < 0)
        return -1;
    return apply_flags(spec, cfg, argc, argv, err);
}

int settings_load(const struct settings_spec *spec, void *cfg, int argc, char **argv)
{
    char err[SETTINGS_ERRLEN];
    int rc = load_all(spec, cfg, argc, argv, true, err);

    if (rc < 0)
        fprintf(stderr, "%s: %s\n", argv[0], err);
    return rc;
}

int settings_reload(const struct settings_spec *spec, void *next, int argc,
                    char **argv, char *err)
{
    return load_all(spec, next, argc, argv, false, err) < 0 ? -1 : 0;
}

/* A number setting's value.  Loaded atomically: in a running config,
 * handlers may read a live one while it is stored (it is then _Atomic). */
static uint64_t uint_value(const struct setting *s, const void *cfg)
{
    return atomic_load((const _Atomic uint64_t *)((const char *)cfg + s->offset));
}

/* The value of s in cfg as text, for comparisons and messages. */
static const char *value_text(const struct setting *s, const void *cfg, char *buf,
                              size_t len)
{
    if (setting_kind(s) == SETTING_FLAG)
        return *(const bool *)(const void *)((const char *)cfg + s->offset) ? "true"
                                                                           : "false";
    if (setting_kind(s) != SETTING_UINT)
        return (const char *)cfg + s->offset;
    snprintf(buf, len, "%" PRIu64, uint_value(s, cfg));
    return buf;
}

int settings_apply(const struct settings_spec *spec, void *cur, const void *next)
{
    int changed = 0;

    for (size_t i = 0; i < spec->count; i++) {
        const struct setting *s = &spec->table[i];
        char was[32], now[32];
        const char *a = value_text(s, cur, was, sizeof was);
        const char *b = value_text(s, next, now, sizeof now);
        if (strcmp(a, b) == 0)
            continue;
        if (!(s->type & SETTING_LIVE)) {
            log_warn("setting %s changed (\"%s\" -> \"%s\") but takes effect only "
                     "at a restart: not applied", s->name, a, b);
            continue;
        }
        log_info("setting %s: %s -> %s", s->name, a, b);
        char *dst = (char *)cur + s->offset;
        if (setting_kind(s) == SETTING_UINT)
            atomic_store((_Atomic uint64_t *)(void *)dst, uint_value(s, next));
        else
            memcpy(dst, b, strlen(b) + 1);
        changed++;
    }
    return changed;
}
