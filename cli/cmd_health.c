/* cmd_health: `bloomgrid health [HOST:PORT]`, one grpc.health.v1 Check of
 * one service of a node, router or merger, as a probe asks it: a
 * container's HEALTHCHECK (deploy/image/entrypoint.sh), a load balancer's
 * script, an operator.  Exit 0 when the answer is SERVING, 1 for any other
 * answer, 2 when the process cannot be asked (unreachable, the service
 * unknown, bad options).  Nothing is changed. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "grpc/health/v1/health.pb-c.h"
#include "online.h"
#include "online_cmd.h"
#include "rpc_client.h"

#define HEALTH_DEADLINE_MS 2000

const char cmd_health_help[] =
    "usage: bloomgrid health [HOST:PORT] [--service NAME] [--quiet]\n"
    "\n"
    "Ask a node, router or merger whether it serves (grpc.health.v1 Check),\n"
    "as a probe does, and print \"HOST:PORT SERVICE: STATUS\".  The service \"\"\n"
    "(the default) is liveness: SERVING while the process runs, a copy that\n"
    "is SYNCING included.  \"bloomgrid.v1.BloomGrid\" is readiness: a node\n"
    "serves reads, a router has every group readable (docs/ROUTER.md,\n"
    "\"Health\"); on a router \"bloomgrid.v1.BloomGrid/NAME\" asks whether filter\n"
    "NAME can be read.  Ask the health_listen address (plaintext, no token),\n"
    "or the public listener with the TLS and token options of every online\n"
    "command.\n"
    "\n"
    "  HOST:PORT             the process (default: --server, $BLOOMGRID_SERVER)\n"
    "  --service NAME        the service to ask for (default \"\")\n"
    "  -q, --quiet           print nothing but errors\n"
    "  --server, --deadline MS (default 2000), --tls-ca, --tls-cert, --tls-key,\n"
    "  --token-file          as for every online command ('bloomgrid --help')\n"
    "\n"
    "Exit status: 0 SERVING; 1 NOT_SERVING (or another answer); 2 when the\n"
    "process cannot be reached, does not know the service, or on bad options.\n"
    "\n"
    "examples:\n"
    "  bloomgrid health 127.0.0.1:7402\n"
    "  bloomgrid health localhost:7502 --service bloomgrid.v1.BloomGrid\n";

enum { OPT_SERVICE = 0x200 };

static const struct option health_longopts[] = {
    {"service", required_argument, NULL, OPT_SERVICE},
    {"quiet", no_argument, NULL, 'q'},
    ONLINE_COMMON_LONGOPTS,
};

static const char *status_name(int s)
{
    switch (s) {
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING:
        return "SERVING";
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING:
        return "NOT_SERVING";
    case GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN:
        return "SERVICE_UNKNOWN";
    default:
        return "UNKNOWN";
    }
}

int cmd_health(int argc, char **argv)
{
    struct online o;
    const char *service = "";
    bool quiet = false;
    int c, rc;

    online_cmd_init(&o);
    cli_getopt_reset();
    while ((c = getopt_long(argc, argv, ":hq", health_longopts, NULL)) != -1) {
        if (c == OPT_SERVICE)
            service = optarg;
        else if (c == 'q')
            quiet = true;
        else if ((rc = online_common_opt(&o, "health", c, argv)))
            return rc == CLI_HELP_SHOWN ? CLI_OK : rc;
    }
    if (argc - optind > 1)
        return cli_fail("health: one HOST:PORT at most (see 'bloomgrid help health')");
    if (argc - optind == 1)
        o.server = argv[optind];
    if (!o.deadline_ms)
        o.deadline_ms = HEALTH_DEADLINE_MS;
    if ((rc = online_open(&o)))
        return rc;

    Grpc__Health__V1__HealthCheckRequest rq = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    Grpc__Health__V1__HealthCheckResponse *resp = NULL;
    struct rpc_status st;
    rq.service = (char *)service;
    if (rpc_call(o.ch, "/grpc.health.v1.Health/Check", &rq.base,
                 &grpc__health__v1__health_check_response__descriptor,
                 (ProtobufCMessage **)&resp, o.deadline_ms, &st) < 0) {
        rc = online_report(&o, &st);
        online_close(&o);
        return rc;
    }
    int s = resp->status;
    grpc__health__v1__health_check_response__free_unpacked(resp, NULL);
    if (!quiet)
        printf("%s \"%s\": %s\n", o.server, service, status_name(s));
    online_close(&o);
    if (fflush(stdout) == EOF)
        return cli_fail("cannot write the output");
    return s == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? CLI_OK
                                                                                : CLI_NO;
}
