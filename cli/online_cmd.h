/* online_cmd: option handling shared by the online commands (cmd_online*.c).
 *
 * Every online command accepts --server HOST:PORT, --deadline MS, --tls-ca,
 * --tls-cert, --tls-key FILE, --token-file FILE and --help after its name,
 * on top of the same options given before the command name (online_global)
 * and the BLOOMGRID_SERVER, BLOOMGRID_TLS_CA/CERT/KEY and BLOOMGRID_TOKEN
 * environment variables, in that order of precedence: command option,
 * global option, environment.
 */
#ifndef BLOOMGRID_ONLINE_CMD_H
#define BLOOMGRID_ONLINE_CMD_H

#include "online.h"

/* getopt_long codes of the long-only common options. */
#define OPT_SERVER 0x100
#define OPT_DEADLINE 0x101
#define OPT_TLS_CA 0x102
#define OPT_TLS_CERT 0x103
#define OPT_TLS_KEY 0x104
#define OPT_TOKEN_FILE 0x105

#define ONLINE_COMMON_LONGOPTS                                  \
    {"server", required_argument, NULL, OPT_SERVER},            \
    {"deadline", required_argument, NULL, OPT_DEADLINE},        \
    {"tls-ca", required_argument, NULL, OPT_TLS_CA},            \
    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},        \
    {"tls-key", required_argument, NULL, OPT_TLS_KEY},          \
    {"token-file", required_argument, NULL, OPT_TOKEN_FILE},    \
    {"help", no_argument, NULL, 'h'},                           \
    {NULL, 0, NULL, 0}

/* Fill o from online_global and the environment (no channel yet). */
void online_cmd_init(struct online *o);

/* Handle a common option (or report c as unknown).  Returns 0, CLI_ERR, or
 * CLI_HELP_SHOWN after printing the command's help. */
int online_common_opt(struct online *o, const char *cmd, int c, char **argv);

/* Parse --deadline: milliseconds > 0.  Returns 0 or CLI_ERR (printed). */
int online_parse_deadline(const char *s, int *out);

/* Check the count of positional arguments; what names the missing ones. */
int online_need_args(const char *cmd, int have, int want, const char *what);

/* Export filter name into the file at path (mode for a new file), through
 * common/durable.h: the whole file is received and verified before it
 * replaces path; on any failure path is unchanged.  Returns 0 or CLI_ERR
 * (printed). */
int online_export_file(struct online *o, const char *name, const char *path,
                       mode_t mode);

/* Import the file at path into filter name (the server verifies it whole
 * before merging).  Returns 0 with *res filled (online_info_deinit(&res->info)),
 * or CLI_ERR (printed). */
int online_import_file(struct online *o, const char *name, const char *path,
                       struct online_import_result *res);

/* Commands. */
int cmd_online_create(int argc, char **argv);
int cmd_online_drop(int argc, char **argv);
int cmd_online_list(int argc, char **argv);
int cmd_online_info(int argc, char **argv);
int cmd_online_add(int argc, char **argv);
int cmd_online_check(int argc, char **argv);
int cmd_online_remove(int argc, char **argv);
int cmd_online_export(int argc, char **argv);
int cmd_online_import(int argc, char **argv);
int cmd_online_status(int argc, char **argv);
int cmd_online_resync(int argc, char **argv);     /* cmd_resync.c */
int cmd_backup(int argc, char **argv);
int cmd_restore(int argc, char **argv);
int cmd_canary(int argc, char **argv);     /* cmd_canary.c */
int cmd_health(int argc, char **argv);     /* cmd_health.c, with its help: */
extern const char cmd_health_help[];

#endif
