/* cmd_online_keys: `add`, `check` and `remove` against a server.
 *
 * Keys come from the arguments or one per line from stdin (the reader of the
 * offline commands).  They are packed into batches of --batch keys, and
 * --inflight batches at a time are sent as concurrent unary calls, so the
 * server works on several batches at once (a node shares one fsync among
 * concurrent adds).  Results are printed in input order once every batch of
 * the round has answered.  A failed call ends the command with the server's
 * status; results of the batches before it have been printed, and keys of
 * later batches of that round may have been applied (adding or removing is
 * then safe to repeat only for add: see the help of remove).
 */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "keys_input.h"
#include "online.h"
#include "online_cmd.h"
#include "progress.h"

#define DEFAULT_BATCH 1000
#define DEFAULT_INFLIGHT 8
#define MAX_BATCH 10000000
#define MAX_INFLIGHT 256
/* A batch is sent early when it reaches this many bytes, so requests stay
 * within gRPC's common 4 MiB message limit. */
#define BATCH_BYTES (3u << 20)

struct okeys {
    const char *cmd;
    enum online_op op;
    struct online o;
    size_t batch, inflight;
    bool verbose, count_only;
    const char *filter;
    char **keys;
    int nkeys;

    struct online_batch *b;
    size_t full;              /* batches ready to send */
    uint64_t yes, no;         /* maybe/added/removed vs no/present */
    struct progress prog;
};

static int parse_count(const char *opt, const char *s, size_t max, size_t *out)
{
    char *end;
    unsigned long long v;

    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v == 0 || v > max)
        return cli_fail("%s must be a whole number from 1 to %zu, got '%s'",
                        opt, max, s);
    *out = (size_t)v;
    return 0;
}

static const struct option okeys_longopts[] = {
    {"batch", required_argument, NULL, 'b'},
    {"inflight", required_argument, NULL, 'i'},
    {"count", no_argument, NULL, 'c'},
    {"verbose", no_argument, NULL, 'v'},
    ONLINE_COMMON_LONGOPTS,
};

static int okeys_parse(struct okeys *k, int argc, char **argv)
{
    int c, rc;

    online_cmd_init(&k->o);
    k->batch = DEFAULT_BATCH;
    k->inflight = DEFAULT_INFLIGHT;
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":b:i:cvh", okeys_longopts,
                            NULL)) != -1) {
        rc = 0;
        if (c == 'b')
            rc = parse_count("--batch", optarg, MAX_BATCH, &k->batch);
        else if (c == 'i')
            rc = parse_count("--inflight", optarg, MAX_INFLIGHT, &k->inflight);
        else if (c == 'c' && k->op == ONLINE_MAY_CONTAIN)
            k->count_only = true;
        else if (c == 'v' && k->op == ONLINE_ADD)
            k->verbose = true;
        else if (c == 'c' || c == 'v')
            rc = cli_fail("%s: unknown option '%s' (see 'bloomgrid help %s')",
                          k->cmd, argv[optind - 1], k->cmd);
        else
            rc = online_common_opt(&k->o, k->cmd, c, argv);
        if (rc)
            return rc;
    }
    if (optind >= argc)
        return cli_fail("%s: missing NAME (see 'bloomgrid help %s')", k->cmd,
                        k->cmd);
    k->filter = argv[optind];
    k->keys = argv + optind + 1;
    k->nkeys = argc - optind - 1;
    return 0;
}

static void print_key(const char *verdict, const char *key, size_t len)
{
    fputs(verdict, stdout);
    fwrite(key, 1, len, stdout);
    putchar('\n');
}

/* Count and print the answers of one batch. */
static void okeys_results(struct okeys *k, const struct online_batch *b)
{
    static const char *const yes_word[] = {"added\t", "maybe\t", "removed\t"};
    static const char *const no_word[] = {"present\t", "no\t", "no\t"};
    bool print = k->op == ONLINE_ADD ? k->verbose : !k->count_only;

    for (size_t i = 0; i < b->n; i++) {
        if (b->answer[i])
            k->yes++;
        else
            k->no++;
        if (print) {
            size_t len;
            const char *key = online_batch_key(b, i, &len);
            print_key(b->answer[i] ? yes_word[k->op] : no_word[k->op], key,
                      len);
        }
    }
}

/* Send the batches gathered so far (the partly filled one too when last). */
static int okeys_send(struct okeys *k, bool last)
{
    struct rpc_status st;
    size_t n = k->full, done, keys = 0;

    if (last && n < k->inflight && k->b[n].n)
        n++;
    if (n == 0)
        return 0;
    done = online_keys_call(&k->o, k->op, k->b, n, &st);
    for (size_t i = 0; i < done; i++) {
        okeys_results(k, &k->b[i]);
        keys += k->b[i].n;
    }
    for (size_t i = 0; i < n; i++)
        online_batch_clear(&k->b[i]);
    k->full = 0;
    if (done < n)
        return online_report(&k->o, &st);
    progress_tick(&k->prog, keys);
    return 0;
}

static int okeys_batch(void *ctx, const void *const *keys, const size_t *lens,
                       size_t n)
{
    struct okeys *k = ctx;

    for (size_t i = 0; i < n; i++) {
        struct online_batch *b = &k->b[k->full];
        if (online_batch_add(b, keys[i], lens[i]) < 0)
            return cli_fail("out of memory");
        if (b->n == k->batch || b->len >= BATCH_BYTES) {
            if (++k->full == k->inflight) {
                int rc = okeys_send(k, false);
                if (rc)
                    return rc;
            }
        }
    }
    return 0;
}

static int flush_stdout(void)
{
    if (fflush(stdout) == EOF || ferror(stdout))
        return cli_fail("cannot write the output: %s", strerror(errno));
    return 0;
}

static int okeys_run(struct okeys *k, int argc, char **argv)
{
    static char outbuf[1 << 20];
    int rc = okeys_parse(k, argc, argv);

    if (rc)
        return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    for (int i = 0; i < k->nkeys; i++)
        if (k->keys[i][0] == '\0')
            return cli_fail("empty key (argument %d); keys cannot be empty",
                            i + 1);
    k->b = calloc(k->inflight, sizeof *k->b);
    if (!k->b)
        return cli_fail("out of memory");
    for (size_t i = 0; i < k->inflight; i++) {
        if (online_batch_init(&k->b[i], k->filter) < 0) {
            rc = cli_fail("out of memory");
            goto out;
        }
    }
    if ((rc = online_open(&k->o)))
        goto out;
    setvbuf(stdout, outbuf, _IOFBF, sizeof outbuf);
    progress_init(&k->prog, NULL);
    if (k->nkeys)
        rc = keys_from_args(k->keys, k->nkeys, okeys_batch, k);
    else
        rc = keys_read_path("-", okeys_batch, k);
    if (rc == 0)
        rc = okeys_send(k, true);
    if (rc == 0)
        progress_done(&k->prog);
    if (rc == 0 && k->count_only)
        printf("maybe %llu\nno %llu\n", (unsigned long long)k->yes,
               (unsigned long long)k->no);
    if (rc == 0)
        rc = flush_stdout();
    if (rc == 0 && k->op != ONLINE_ADD && k->no)
        rc = CLI_NO;
    online_close(&k->o);
out:
    for (size_t i = 0; i < k->inflight; i++)
        online_batch_deinit(&k->b[i]);
    free(k->b);
    return rc;
}

int cmd_online_add(int argc, char **argv)
{
    struct okeys k = {.cmd = "add", .op = ONLINE_ADD};
    return okeys_run(&k, argc, argv);
}

int cmd_online_check(int argc, char **argv)
{
    struct okeys k = {.cmd = "check", .op = ONLINE_MAY_CONTAIN};
    return okeys_run(&k, argc, argv);
}

int cmd_online_remove(int argc, char **argv)
{
    struct okeys k = {.cmd = "remove", .op = ONLINE_REMOVE};
    return okeys_run(&k, argc, argv);
}
