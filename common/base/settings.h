/* settings: one table of settings per binary, filled from defaults, an INI
 * file (libinih) and --flags, in that order of precedence.
 *
 * Each binary describes its settings once (name, type, bounds, default, the
 * field of its config struct they fill, help text) and calls settings_load.
 * The name is the INI key in the binary's section and, with '_' written as
 * '-', the --flag.  settings_load is not thread-safe: call it once at
 * start-up.
 *
 * Reload (SIGHUP): settings_reload reads the same file and flags again into
 * a fresh struct, and settings_apply copies into the running one only the
 * settings marked SETTING_LIVE; a changed setting without the mark is
 * logged as needing a restart and left as it is.  Other threads may read a
 * live number while it is stored: such a field must be _Atomic uint64_t.  A
 * live string is copied as is, so only the thread that reloads may read it
 * (it applies it, e.g. with log_set_level).
 */
#ifndef BLOOMGRID_SETTINGS_H
#define BLOOMGRID_SETTINGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum setting_type {
    SETTING_STRING,  /* a non-empty string that fits the field */
    SETTING_UINT,    /* a decimal uint64_t within [min, max] */
    SETTING_ENUM,    /* one of the '|'-separated choices */
    SETTING_ADDR,    /* host:port (rules_addr_check) with a port of min..65535:
                        min 0 for a listen address (0 picks a free port); ""
                        only where it is the default (meaning "off") */
    SETTING_FLAG,    /* a bool set by the flag alone (--name); command line
                        only: a config file naming it is refused, so that
                        what it allows is asked for at each start.  Default
                        "false" */
    SETTING_TYPE_MASK = 0xff,
    /* Or'ed into a type ("SETTING_UINT | SETTING_LIVE"): settings_apply takes
     * a new value at run time.  Without it a setting takes effect at start. */
    SETTING_LIVE = 0x100,
};

#define SETTINGS_ERRLEN 512

struct setting {
    const char *name;
    enum setting_type type;
    uint64_t min, max;      /* SETTING_UINT; SETTING_ADDR: min is the lowest port */
    const char *choices;    /* SETTING_ENUM: "a|b|c" */
    const char *def;        /* default, as text */
    size_t offset;          /* field in the config struct */
    size_t size;            /* field size (string buffer size) */
    const char *help;
};

/* offsetof + size of a field, for the table. */
#define SETTING_FIELD(type, f) offsetof(type, f), sizeof(((type *)0)->f)

struct settings_spec {
    const char *program;          /* e.g. "bloomgrid-node" (for --version) */
    const char *section;          /* INI section, e.g. "node" */
    const char *intro;            /* --help text before the settings list */
    const struct setting *table;
    size_t count;
};

/* Fill cfg from defaults, the file named by --config and the other flags.
 * Returns 0 to run, 1 after printing --help / --version (exit 0), or -1
 * after printing one error line naming the setting, file and line (exit 2). */
int settings_load(const struct settings_spec *spec, void *cfg, int argc, char **argv);

/* Read the settings again for a reload, as settings_load did at start
 * (defaults, the --config file of argv, then its flags), into next.
 * Prints nothing.  Returns 0, or -1 with one line naming the setting, file
 * and line in err (SETTINGS_ERRLEN bytes). */
int settings_reload(const struct settings_spec *spec, void *next, int argc,
                    char **argv, char *err);

/* Copy into cur (the running settings) every SETTING_LIVE setting whose
 * value differs in next, logging each change; log a warning for every
 * other setting that differs and leave it.  Only one thread may apply at a
 * time.  Returns the number of settings changed in cur. */
int settings_apply(const struct settings_spec *spec, void *cur, const void *next);

/* Print the --help text: the intro, then every setting with its bounds,
 * default and whether SIGHUP reloads it. */
void settings_usage(const struct settings_spec *spec, FILE *out, const char *prog);

#endif
