/* help: the overview and per-command help texts of `bloomgrid`. */
#include <string.h>

#include "cli.h"

struct help_entry {
    const char *cmd;
    const char *text;
};

#define CREATE_OPTIONS \
    "  -n, --capacity N      keys the filter is sized for (> 0): 1000000, 1e6,\n" \
    "                        1M, 2.5G\n" \
    "  -p, --error-rate P    target false-positive rate, 0 < P < 1: 0.01, 1%\n" \
    "  -k, --kind KIND       blocked (default), classic, counting, scalable\n" \
    "  -l, --like TEMPLATE   copy kind, geometry and secret from another\n" \
    "                        filter file, so the two can be merged later\n" \
    "  -f, --force           replace FILE if it exists\n"

static const struct help_entry help_entries[] = {
    {"create",
     "usage: bloomgrid create FILE (--capacity N --error-rate P [--kind KIND]\n"
     "                              | --like TEMPLATE) [--force]\n"
     "\n"
     "Create an empty filter file.\n"
     "\n" CREATE_OPTIONS
     "\n"
     "examples:\n"
     "  bloomgrid create users.bf --capacity 10M --error-rate 0.01\n"
     "  bloomgrid create part-3.bf --like part-0.bf\n"},
    {"build",
     "usage: bloomgrid build FILE (--capacity N --error-rate P [--kind KIND]\n"
     "                             | --like TEMPLATE) [--force] [INPUT...]\n"
     "\n"
     "Create a filter file and add the keys read from the INPUT files, one key\n"
     "per line (\"-\" or no INPUT reads stdin).  A trailing \\r is stripped; an\n"
     "empty line is an error and nothing is written.  When stderr is a terminal\n"
     "a progress line shows keys/s, fill and the estimated false-positive rate.\n"
     "\n" CREATE_OPTIONS
     "\n"
     "examples:\n"
     "  bloomgrid build urls.bf --capacity 100M --error-rate 0.001 urls.txt\n"
     "  seq 1000000 | bloomgrid build nums.bf -n 1M -p 1%\n"
     "  bloomgrid build part-1.bf --like part-0.bf slice-1.txt\n"},
    {"add",
     "usage: bloomgrid add FILE [KEY...]\n"
     "\n"
     "Add keys to an existing filter file and save it atomically.  Without KEY\n"
     "arguments, keys are read one per line from stdin.\n"
     "\n"
     "examples:\n"
     "  bloomgrid add users.bf alice bob\n"
     "  cut -f1 new-users.tsv | bloomgrid add users.bf\n"},
    {"query",
     "usage: bloomgrid query FILE [--count] [KEY...]\n"
     "\n"
     "Ask whether keys may be in the filter.  Prints one line per key:\n"
     "\"maybe<TAB>KEY\" (maybe present) or \"no<TAB>KEY\" (definitely absent).\n"
     "Without KEY arguments, keys are read one per line from stdin.\n"
     "\n"
     "  -c, --count   print only the totals: \"maybe N\" and \"no M\"\n"
     "\n"
     "Exit status: 0 when every key may be present, 1 when at least one is\n"
     "definitely absent, 2 on error.\n"
     "\n"
     "examples:\n"
     "  bloomgrid query users.bf alice carol\n"
     "  bloomgrid query users.bf --count < candidates.txt\n"},
    {"remove",
     "usage: bloomgrid remove FILE [KEY...]\n"
     "\n"
     "Remove keys from a counting filter and save it atomically.  Prints\n"
     "\"removed<TAB>KEY\" or \"no<TAB>KEY\" (definitely absent, nothing changed).\n"
     "Exit status 1 when some key was absent.  Only remove keys that were\n"
     "added: removing a false positive can make other keys disappear.\n"
     "Saturated counters (15) never decrement.  Other kinds refuse (exit 2).\n"
     "\n"
     "example:\n"
     "  bloomgrid remove sessions.bf s-1234\n"},
    {"merge",
     "usage: bloomgrid merge [--force] OUT IN...\n"
     "\n"
     "OR-merge filter files into OUT.  The inputs must be compatible: same\n"
     "kind, geometry, secret and shard (create them with --like); otherwise\n"
     "the mismatching field is named and nothing is written.  The projected\n"
     "fill and false-positive rate are reported on stderr.  OUT may be new or\n"
     "one of the inputs; replacing another existing file needs --force.\n"
     "\n"
     "example:\n"
     "  bloomgrid merge all.bf part-0.bf part-1.bf part-2.bf\n"},
    {"inspect",
     "usage: bloomgrid inspect FILE [--json]\n"
     "\n"
     "Verify a filter file (checksum and geometry) and show its kind,\n"
     "capacity, error rate, size, bits/key, fill, estimated key count and\n"
     "false-positive rate, insert count, shard and fingerprint id (the secret\n"
     "itself is never shown).  A corrupt file is refused with exit status 2.\n"
     "\n"
     "  -j, --json    machine-readable output\n"
     "\n"
     "example:\n"
     "  bloomgrid inspect users.bf --json\n"},
    {NULL, NULL},
};

void help_overview(FILE *out)
{
    fputs("usage: bloomgrid COMMAND [ARGS...]\n"
          "\n"
          "Build, query and merge Bloom-filter files.\n"
          "\n"
          "commands:\n"
          "  create    create an empty filter file\n"
          "  build     create a filter file from keys, one per line\n"
          "  add       add keys to a filter file\n"
          "  query     ask whether keys may be present (exit 1 if one is absent)\n"
          "  remove    remove keys from a counting filter\n"
          "  merge     OR-merge compatible filter files\n"
          "  inspect   show a filter file's geometry and estimates\n"
          "  help      show help for a command\n"
          "\n"
          "  --help, --version\n"
          "\n"
          "Run 'bloomgrid help COMMAND' for a command's options and examples.\n"
          "Exit status: 0 success, 1 a queried key is definitely absent,\n"
          "2 error.\n", out);
}

const char *help_command(const char *cmd)
{
    for (const struct help_entry *e = help_entries; e->cmd; e++)
        if (strcmp(e->cmd, cmd) == 0)
            return e->text;
    return NULL;
}

int help_print(const char *cmd)
{
    const char *text = help_command(cmd);

    if (!text)
        return cli_fail("unknown command '%s' (see 'bloomgrid --help')", cmd);
    fputs(text, stdout);
    return CLI_OK;
}
