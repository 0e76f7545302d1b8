/* cmd_token: `bloomgrid token new --role ROLE --name NAME [--out FILE]`:
 * make a token and the line of a tokens file that grants it ROLE.
 *
 * The token is 32 bytes from OpenSSL's RAND_bytes, written as "bgt_" and 64
 * hex digits.  It is shown once (or written to FILE, readable by its owner
 * only) and kept nowhere else: the servers keep its SHA-256 (common/
 * rpc_auth.h). */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "cli.h"
#include "durable.h"
#include "rpc_auth.h"

#define TOKEN_PREFIX "bgt_"
#define TOKEN_RANDOM 32

static const struct option token_longopts[] = {
    {"role", required_argument, NULL, 'r'},
    {"name", required_argument, NULL, 'n'},
    {"out", required_argument, NULL, 'o'},
    {"force", no_argument, NULL, 'f'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static void hex(char *out, const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static int token_new(int argc, char **argv)
{
    const char *role_s = NULL, *name = NULL, *out = NULL;
    bool force = false;
    enum rpc_role role;
    uint8_t rnd[TOKEN_RANDOM], digest[RPC_TOKEN_DIGEST];
    char token[sizeof TOKEN_PREFIX + 2 * TOKEN_RANDOM + 1];
    char dhex[2 * RPC_TOKEN_DIGEST + 1], err[DURABLE_ERRLEN];
    int c, rc = CLI_ERR;

    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, "r:n:o:fh", token_longopts, NULL)) != -1) {
        switch (c) {
        case 'r':
            role_s = optarg;
            break;
        case 'n':
            name = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'f':
            force = true;
            break;
        case 'h':
            help_print("token");
            return CLI_OK;
        default:
            return cli_bad_option("token new", c, argv);
        }
    }
    if (optind != argc)
        return cli_fail("token new: unexpected argument '%s' (see 'bloomgrid "
                        "help token')", argv[optind]);
    if (!role_s || rpc_role_parse(role_s, &role) < 0)
        return cli_fail("token new: --role must be read, write or admin%s%s%s",
                        role_s ? ", got '" : "", role_s ? role_s : "",
                        role_s ? "'" : "");
    if (!name || !rpc_token_name_ok(name, strlen(name)))
        return cli_fail("token new: --name must be 1 to %d bytes of letters, "
                        "digits, '.', '_' and '-'%s%s%s", RPC_TOKEN_NAME_MAX,
                        name ? ", got '" : "", name ? name : "", name ? "'" : "");
    if (out && !force && cli_exists(out))
        return cli_fail("token new: %s exists (--force replaces it)", out);
    if (RAND_bytes(rnd, sizeof rnd) != 1)
        return cli_fail("token new: no random bytes from OpenSSL");
    memcpy(token, TOKEN_PREFIX, strlen(TOKEN_PREFIX));
    hex(token + strlen(TOKEN_PREFIX), rnd, sizeof rnd);
    rpc_token_digest(token, strlen(token), digest);
    hex(dhex, digest, sizeof digest);

    if (out) {
        char line[sizeof token + 1];
        snprintf(line, sizeof line, "%s\n", token);
        int w = durable_write_file(out, line, strlen(line), 0600, err);
        OPENSSL_cleanse(line, sizeof line);
        if (w < 0) {
            cli_fail("token new: %s", err);
            goto out;
        }
    } else {
        printf("%s\n", token);
    }
    printf("%s %s %s\n", rpc_role_name(role), name, dhex);
    if (fflush(stdout) != 0) {
        cli_fail("token new: cannot write to stdout");
        goto out;
    }
    fprintf(stderr, "bloomgrid: %s; add the line \"%s %s ...\" to the servers' "
            "tokens file and send them SIGHUP\n",
            out ? "token written to the file, readable by you only"
                : "the token (first line) is shown only this once: keep it as "
                  "a credential",
            rpc_role_name(role), name);
    rc = CLI_OK;
out:
    OPENSSL_cleanse(token, sizeof token);
    OPENSSL_cleanse(rnd, sizeof rnd);
    return rc;
}

int cmd_token(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        help_print("token");
        return argc < 2 ? CLI_ERR : CLI_OK;
    }
    if (strcmp(argv[1], "new") == 0)
        return token_new(argc - 1, argv + 1);
    return cli_fail("token: unknown subcommand '%s' (see 'bloomgrid help token')",
                    argv[1]);
}
