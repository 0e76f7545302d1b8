/* cmd_resync: `bloomgrid resync --accept-loss`, an operator's way out of a
 * group of copies that lost more data directories than its write quorum
 * can vouch for (docs/REPLICATION.md, "Accepting a loss").  It calls the
 * node's internal Resync (an admin token) on one copy, at its address as
 * the topology lists it, and prints what the node did: which copies it
 * pulled from, which it could not reach, the shards it created and took
 * off SYNCING, and every failure.  Without --accept-loss it refuses before
 * calling anything. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "bloomgrid/v1/internal.pb-c.h"
#include "cli.h"
#include "node_client.h"
#include "online.h"
#include "online_cmd.h"
#include "rpc_client.h"

enum { OPT_ACCEPT_LOSS = 0x200 };

static const struct option resync_longopts[] = {
    {"accept-loss", no_argument, NULL, OPT_ACCEPT_LOSS},
    ONLINE_COMMON_LONGOPTS,
};

/* "a, b" of n strings, or none. */
static void print_list(const char *what, char **v, size_t n)
{
    printf("  %s: ", what);
    for (size_t i = 0; i < n; i++)
        printf("%s%s", i ? ", " : "", v[i]);
    printf("%s\n", n ? "" : "none");
}

int cmd_online_resync(int argc, char **argv)
{
    struct online o;
    bool accept = false;
    int c, rc;

    online_cmd_init(&o);
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":h", resync_longopts, NULL)) != -1) {
        if (c == OPT_ACCEPT_LOSS)
            accept = true;
        else if ((rc = online_common_opt(&o, "resync", c, argv)))
            return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    }
    if ((rc = online_need_args("resync", argc - optind, 0, "")))
        return rc;
    if (!accept)
        return cli_fail("resync: refused without --accept-loss.  A resync makes the "
                        "copy%s%s serve what the copies of its group that answer hold "
                        "now: keys acknowledged only on copies that lost their data "
                        "are gone for good and will read \"no\".  Use it only when "
                        "the group cannot leave SYNCING by itself (see 'bloomgrid "
                        "help resync' and docs/REPLICATION.md, \"Accepting a "
                        "loss\"), then run it again with --accept-loss",
                        o.server ? " at " : "", o.server ? o.server : "");
    if (!o.deadline_ms)
        o.deadline_ms = ONLINE_TRANSFER_DEADLINE_MS;
    if ((rc = online_open(&o)))
        return rc;

    Bloomgrid__V1__ResyncResponse *resp = NULL;
    struct rpc_status st;
    if (node_client_resync(o.ch, &resp, o.deadline_ms, &st) < 0) {
        if (st.code == GRPC_STATUS_UNIMPLEMENTED)
            rc = cli_fail("server: UNIMPLEMENTED: %s does not serve the internal "
                          "service: give the copy's address as the topology lists it "
                          "(its internal_listen, when it has one), not a router's",
                          o.server);
        else
            rc = online_report(&o, &st);
        online_close(&o);
        return rc;
    }
    printf("resync of copy %s (group %s), loss accepted\n",
           resp->copy[0] ? resp->copy : o.server, resp->group);
    print_list("pulled every shard from", resp->used, resp->n_used);
    print_list("not reachable, not used", resp->unreachable, resp->n_unreachable);
    printf("  %u shards pulled (%u created here), %u taken off SYNCING; %llu pages, "
           "%llu bytes\n", resp->shards, resp->created, resp->left_syncing,
           (unsigned long long)resp->pages, (unsigned long long)resp->bytes);
    for (size_t i = 0; i < resp->n_failures; i++)
        printf("  failed: %s\n", resp->failures[i]);
    if (resp->n_failures) {
        printf("  those shards stay SYNCING and the copy stays held: run the resync "
               "again once the copies named answer (or are stopped)\n");
        rc = CLI_ERR;
    } else {
        printf("  the copy serves again; keys acknowledged only on copies that lost "
               "their data are gone\n");
        rc = CLI_OK;
    }
    bloomgrid__v1__resync_response__free_unpacked(resp, NULL);
    online_close(&o);
    if (fflush(stdout) == EOF)
        return cli_fail("cannot write the output");
    return rc;
}
