/* settings: one table of settings per binary, filled from defaults, an INI
 * file (libinih) and --flags, in that order of precedence.
 *
 * Each binary describes its settings once (name, type, bounds, default, the
 * field of its config struct they fill, help text) and calls settings_load.
 * The name is the INI key in the binary's section and, with '_' written as
 * '-', the --flag.  Not thread-safe; call once at start-up.
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
};

struct setting {
    const char *name;
    enum setting_type type;
    uint64_t min, max;      /* SETTING_UINT */
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

/* Print the --help text: the intro, then every setting with its bounds and
 * default. */
void settings_usage(const struct settings_spec *spec, FILE *out, const char *prog);

#endif
