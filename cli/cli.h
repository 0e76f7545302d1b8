/* cli: shared pieces of the bloomgrid command-line tool.
 *
 * Every command is a function taking the arguments after the program name
 * (argv[0] is the command's own name) and returning the process exit status:
 * CLI_OK (0), CLI_NO (1: a query found a key definitely absent) or CLI_ERR
 * (2: bad arguments, unreadable input, refused file).  Errors are reported as
 * one line on stderr starting with "bloomgrid: "; a command that fails never
 * replaces an existing file.  The tool is single-threaded.
 */
#ifndef BLOOMGRID_CLI_H
#define BLOOMGRID_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "bf.h"
#include "bundle.h"
#include "progress.h"

#define CLI_OK 0
#define CLI_NO 1
#define CLI_ERR 2
/* Returned by option parsers that printed help: the command exits 0. */
#define CLI_HELP_SHOWN (-1)

/* Print "bloomgrid: <message>" on stderr and return CLI_ERR. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Report the option getopt_long could not accept (c is '?' or ':'). */
int cli_bad_option(const char *cmd, int c, char **argv);

/* Reset getopt_long before parsing a command's arguments. */
void cli_getopt_reset(void);

/* Parse --capacity ("1000000", "1e6", "1M", "2.5G"; a whole number > 0) and
 * --error-rate (a number or percentage strictly between 0 and 1).  Print the
 * error and return CLI_ERR on bad input, else 0. */
int cli_parse_capacity(const char *s, uint64_t *out);
int cli_parse_rate(const char *s, double *out);

bool cli_exists(const char *path);
/* True when a and b name the same existing file. */
bool cli_same_file(const char *a, const char *b);

/* Load a filter file or a shard bundle (common/engine/bundle.h: a plain filter
 * file is a bundle of one shard), printing "bloomgrid: PATH: <reason>" on
 * failure. */
struct bundle *cli_load(const char *path);
/* Save atomically in the form it was loaded in, printing "bloomgrid: PATH:
 * cannot save: <reason>" on failure.  Returns 0 or CLI_ERR. */
int cli_save(const struct bundle *b, const char *path);
/* Keys added to a bundle with a progress line (add, build).
 * cli_adding_start switches the shards to single-writer mode (the tool is
 * single-threaded) and starts the progress; cli_add_batch is the
 * keys_batch_fn, ctx the struct cli_adding. */
struct cli_adding {
    struct bundle *b;
    struct progress prog;
};
void cli_adding_start(struct cli_adding *a, struct bundle *b);
int cli_add_batch(void *ctx, const void *const *keys, const size_t *lens,
                  size_t n);

/* For the commands that take one filter, not a shard bundle: print why path
 * is refused and return CLI_ERR. */
int cli_refuse_bundle(const char *path);

/* Commands. */
int cmd_create(int argc, char **argv);
int cmd_build(int argc, char **argv);
int cmd_add(int argc, char **argv);
int cmd_query(int argc, char **argv);
int cmd_remove(int argc, char **argv);
int cmd_merge(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_token(int argc, char **argv);

/* Help: the overview, and the text of one command (NULL if unknown; the
 * offline text when a command has both forms). */
void help_overview(FILE *out);
const char *help_command(const char *cmd);
/* Print the command's help on stdout and return CLI_OK. */
int help_print(const char *cmd);

/* Print s as a JSON string literal (quotes, escapes) to stdout. */
void cli_json_str(const char *s);

#endif
