/* help: the overview and per-command help texts of `bloomgrid`. */
#include <string.h>

#include "cli.h"
#include "online_cmd.h"

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
    "                        filter file, so the two can be merged later; a\n" \
    "                        shard bundle (a router's export) gives a bundle\n" \
    "                        of empty shards, each key going to its shard\n" \
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
     "Add keys to an existing filter file (or shard bundle) and save it\n"
     "atomically.  Without KEY arguments, keys are read one per line from\n"
     "stdin.\n"
     "\n"
     "examples:\n"
     "  bloomgrid add users.bf alice bob\n"
     "  cut -f1 new-users.tsv | bloomgrid add users.bf\n"},
    {"query",
     "usage: bloomgrid query FILE [--count] [KEY...]\n"
     "\n"
     "Ask whether keys may be in the filter.  Prints one line per key:\n"
     "\"maybe<TAB>KEY\" (maybe present) or \"no<TAB>KEY\" (definitely absent).\n"
     "Without KEY arguments, keys are read one per line from stdin.  FILE may\n"
     "also be a shard bundle exported from a router.\n"
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
     "Shard bundles (a router's export, or partials built --like one) merge\n"
     "shard by shard, with bundles only.\n"
     "\n"
     "example:\n"
     "  bloomgrid merge all.bf part-0.bf part-1.bf part-2.bf\n"},
    {"inspect",
     "usage: bloomgrid inspect FILE [--json]\n"
     "\n"
     "Verify a filter file (checksum and geometry) and show its kind,\n"
     "capacity, error rate, size, bits/key, fill, estimated key count and\n"
     "false-positive rate, shard and fingerprint id (the secret itself is\n"
     "never shown), and two counts of adds: the keys added (every key added,\n"
     "repeats and false positives included; JSON keys_added, null for a file\n"
     "of format version 1, which did not record it) and the new-bit adds\n"
     "(those that set a bit; JSON inserts).  A merge adds both counts of its\n"
     "inputs.  A corrupt file is refused with exit status 2.  A shard bundle\n"
     "(a router's export) is shown shard by shard.\n"
     "\n"
     "  -j, --json    machine-readable output\n"
     "\n"
     "example:\n"
     "  bloomgrid inspect users.bf --json\n"},
    {"token",
     "usage: bloomgrid token new --role ROLE --name NAME [--out FILE [--force]]\n"
     "\n"
     "Make a token for the servers' tokens file (setting tokens_file): print\n"
     "the token on the first line and, on the second, the line that grants it\n"
     "ROLE: \"ROLE NAME SHA256HEX\".  The servers keep only the SHA-256, so\n"
     "the token is shown this once: hand it to its user as a credential.  Add\n"
     "the line to the tokens file and send the servers SIGHUP; delete the line\n"
     "(and SIGHUP) to revoke the token, open streams included.\n"
     "\n"
     "  -r, --role ROLE       read (MayContain, MayContainStream, GetFilter,\n"
     "                        ListFilters), write (+ Add, AddStream, Import)\n"
     "                        or admin (+ CreateFilter, DropFilter, Remove,\n"
     "                        Export, the Internal and Merger services)\n"
     "  -n, --name NAME       names the token in the servers' logs: 1 to 64\n"
     "                        letters, digits, '.', '_' or '-'\n"
     "  -o, --out FILE        write the token to FILE (mode 0600) instead and\n"
     "                        print only the line\n"
     "  -f, --force           replace FILE if it exists\n"
     "\n"
     "A client sends the token with --token-file FILE or $BLOOMGRID_TOKEN;\n"
     "a router, merger or node sends one to the nodes with token_file = FILE.\n"
     "\n"
     "examples:\n"
     "  bloomgrid token new --role write --name ci\n"
     "  bloomgrid token new --role admin --name router-1 --out router.token \\\n"
     "      >> /etc/bloomgrid/tokens\n"},
    {NULL, NULL},
};

/* Online commands.  Every one takes --server HOST:PORT (default: the
 * BLOOMGRID_SERVER environment variable), --token-file FILE (default: the
 * BLOOMGRID_TOKEN environment variable) and --deadline MS. */
#define SERVER_OPTIONS \
    "  --server HOST:PORT    the node or router (default: $BLOOMGRID_SERVER);\n" \
    "                        may also come before the command name\n" \
    "  --tls-ca FILE         talk TLS, trusting the CA certificates of FILE\n" \
    "                        (PEM; default: $BLOOMGRID_TLS_CA; unset: plaintext)\n" \
    "  --tls-cert FILE       client certificate chain, with --tls-key (default:\n" \
    "                        $BLOOMGRID_TLS_CERT)\n" \
    "  --tls-key FILE        its private key (default: $BLOOMGRID_TLS_KEY)\n" \
    "  --token-file FILE     send the token in FILE (default: the token in\n" \
    "                        $BLOOMGRID_TOKEN; none when unset)\n" \
    "  --deadline MS         give up on a call after MS milliseconds\n"

#define KEYS_OPTIONS \
    "  -b, --batch N         keys per call (default 1000)\n" \
    "  -i, --inflight N      calls in flight at once (default 8)\n" \
    SERVER_OPTIONS "                        (default 10000, per call)\n"

#define SERVER_ERRORS \
    "A failed call prints the server's status and message on one line,\n" \
    "\"bloomgrid: server: NOT_FOUND: filter \\\"x\\\" does not exist\", and\n" \
    "exits 2; an unreachable server gives \"bloomgrid: cannot reach server\n" \
    "HOST:PORT: ...\" and exit status 2.\n"

static const struct help_entry online_help_entries[] = {
    {"health", cmd_health_help},
    {"create",
     "usage: bloomgrid --server HOST:PORT create NAME --capacity N\n"
     "                 --error-rate P [--kind KIND] [--shards S]\n"
     "                 [--placement V] [--json]\n"
     "\n"
     "Create a filter on the server and print its description (as 'info').\n"
     "Capacity, error rate and shard count are checked by the server.\n"
     "\n"
     "  -n, --capacity N      keys the filter is sized for: 1000000, 1e6, 1M\n"
     "  -p, --error-rate P    target false-positive rate: 0.01, 1%\n"
     "  -k, --kind KIND       blocked (default), classic, counting, scalable\n"
     "  -s, --shards S        shards (0 or absent: the server's default; a\n"
     "                        router's is one per 64 MiB of bits, at least one\n"
     "                        per group, at most 64: its default_shard_mb and\n"
     "                        default_shards)\n"
     "  -P, --placement V     a router places the shards by placement version V:\n"
     "                        1 rendezvous, 2 (the default) rendezvous with at\n"
     "                        most ceil(S/G) + 1 shards per group; 1 while some\n"
     "                        node or router predates placement versions\n"
     "                        (docs/TOPOLOGY.md)\n"
     "  -j, --json            machine-readable output\n"
     SERVER_OPTIONS
     "\n" SERVER_ERRORS
     "\n"
     "examples:\n"
     "  bloomgrid --server localhost:7400 create users -n 10M -p 1%\n"
     "  BLOOMGRID_SERVER=router:7500 bloomgrid create slugs -n 1G -p 0.001 "
     "--shards 64\n"},
    {"drop",
     "usage: bloomgrid [--server HOST:PORT] drop NAME\n"
     "\n"
     "Drop a filter on the server and delete its data.\n"
     "\n" SERVER_OPTIONS
     "\n" SERVER_ERRORS
     "\n"
     "example:\n"
     "  bloomgrid --server localhost:7400 drop users\n"},
    {"list",
     "usage: bloomgrid [--server HOST:PORT] list [--json]\n"
     "\n"
     "List the server's filters, sorted by name: kind, capacity, error rate,\n"
     "shards, bytes, fill, estimated keys and state.\n"
     "\n"
     "  -j, --json            machine-readable output (an array of 'info')\n"
     SERVER_OPTIONS
     "\n"
     "example:\n"
     "  bloomgrid --server localhost:7400 list\n"},
    {"info",
     "usage: bloomgrid [--server HOST:PORT] info NAME [--json]\n"
     "\n"
     "Describe a filter: state, kind, geometry (bits, hashes, bytes), fill,\n"
     "estimated key count and false-positive rate, new-bit adds (adds that\n"
     "set a bit; JSON inserts), version, fingerprint id, and the state of\n"
     "each shard when the server reports them.\n"
     "\n"
     "  -j, --json            machine-readable output\n"
     SERVER_OPTIONS
     "\n" SERVER_ERRORS
     "\n"
     "example:\n"
     "  bloomgrid --server localhost:7400 info users --json\n"},
    {"add",
     "usage: bloomgrid --server HOST:PORT add NAME [--verbose] [--batch N]\n"
     "                 [--inflight N] [KEY...]\n"
     "\n"
     "Add keys to a filter on the server.  Without KEY arguments, keys are\n"
     "read one per line from stdin (a trailing \\r is stripped; an empty line\n"
     "is an error).  Keys travel in batches; the server acknowledges a batch\n"
     "once it is durable.  Prints nothing unless --verbose.  If an error\n"
     "stops a run, keys before it may already be added: adding is safe to\n"
     "repeat.\n"
     "\n"
     "  -v, --verbose         print \"added<TAB>KEY\" (was definitely absent) or\n"
     "                        \"present<TAB>KEY\" (may have been there already)\n"
     KEYS_OPTIONS
     "\n"
     "Exit status: 0 when every key was added, 2 on error.  A progress line\n"
     "is shown on stderr when it is a terminal.  Through a router a batch is\n"
     "split among the filter's shards: with many shards, larger batches\n"
     "(--batch 10000) go much faster.\n"
     "\n"
     "examples:\n"
     "  bloomgrid --server localhost:7400 add users alice bob\n"
     "  cut -f1 new-users.tsv | bloomgrid --server localhost:7400 add users\n"},
    {"status",
     "usage: bloomgrid status [--topology FILE] [--server ROUTER] [--merger HOST:PORT]\n"
     "\n"
     "Show the cluster as its processes report it (grpc.health.v1, the\n"
     "nodes' shard lists and the merger's Status; nothing is changed).  With\n"
     "--topology, every copy of every group of the file, each \"serving\",\n"
     "\"SYNCING\" (alive, refusing reads until it has pulled its group's\n"
     "pages; with why: an empty or lost data directory, its epoch being\n"
     "checked, or the shards it lacks), \"not ready\" (starting, its disk\n"
     "full) or \"unreachable\", and whether the group has its read quorum of\n"
     "serving copies.  A copy that lacks a shard another copy of its group\n"
     "holds is never shown serving; comparing the shard lists needs an admin\n"
     "token or a cluster certificate (without, a line says they were not\n"
     "compared).  A group stuck SYNCING: 'bloomgrid help resync'.  With\n"
     "--server, whether that router is ready (every group readable).  With\n"
     "--merger, the merger's last round: when, how long, pages and bytes\n"
     "pulled and pushed, errors, the largest lag.\n"
     "\n"
     "  --topology FILE       the cluster's topology file (docs/TOPOLOGY.md)\n"
     "  --merger HOST:PORT    a bloomgrid-merger\n"
     "\n"
     "Exit status: 0 when every group is readable, the router is ready and\n"
     "the merger's last round had no error; 1 otherwise; 2 on error.\n"
     "\n"
     "examples:\n"
     "  bloomgrid status --topology /etc/bloomgrid/topology.ini\n"
     "  bloomgrid --server localhost:7500 status --merger localhost:7600\n"},
    {"resync",
     "usage: bloomgrid --server COPY resync --accept-loss\n"
     "\n"
     "Let one copy of a group of copies leave SYNCING when the group cannot\n"
     "do it by itself, accepting that data is lost.  A SYNCING copy serves\n"
     "again once it has pulled every page from N - W + 1 copies of its group\n"
     "that are not SYNCING.  When more copies lost their data directories\n"
     "than that allows (two of three wiped in turn at W = 2), the group\n"
     "refuses reads for good: keys acknowledged only on the lost copies may\n"
     "be gone, and nothing can tell which.  resync is the operator saying\n"
     "so: the copy at COPY lists the other copies of its group, creates the\n"
     "shards they hold and it lacks, pulls every shard from every copy that\n"
     "answers (SYNCING ones included), and then leaves SYNCING and serves.\n"
     "Keys acknowledged only on copies that lost their data are gone for\n"
     "good: they read \"no\".  The command prints, and the node logs, the\n"
     "copies it used and those it could not reach.  Without --accept-loss\n"
     "nothing is called.\n"
     "\n"
     "COPY is the copy's address as the topology lists it (its\n"
     "internal_listen when it has one; with TLS, a client certificate of the\n"
     "cluster CA: --tls-cert, --tls-key).  Needs an admin token when the\n"
     "node has a tokens file.  Run it on one stuck copy: the others then\n"
     "leave SYNCING by themselves once enough copies are in sync (or run it\n"
     "on each).  'bloomgrid status --topology FILE' shows which are stuck.\n"
     "\n"
     "  --accept-loss         accept that keys acknowledged only on copies\n"
     "                        that lost their data are gone (required)\n"
     SERVER_OPTIONS
     "                        (default 600000: the whole resync)\n"
     "\n"
     "Exit status: 0 when every shard was pulled and the copy serves; 2 on\n"
     "error (refused, or a pull failed: those shards stay SYNCING, run it\n"
     "again).  See docs/REPLICATION.md, \"Accepting a loss\".\n"
     "\n"
     "example:\n"
     "  bloomgrid --server 10.0.1.1:7401 --token-file admin.tok \\\n"
     "      resync --accept-loss\n"},
    {"canary",
     "usage: bloomgrid canary FILTER --server ROUTER[,ROUTER...] [--once | --rounds N]\n"
     "                 [--interval D] [--check N] [--name NAME] [--state FILE] [--json]\n"
     "\n"
     "Watch the one promise of the service: an acknowledged key is never\n"
     "answered \"no\".  Each round adds one new canary key to FILTER through one\n"
     "router (the routers take turns) and records it in the state file once it\n"
     "is acknowledged; then it asks every router for the earlier canary keys.\n"
     "A key that reads \"no\" is a false negative: it is printed as\n"
     "\"FALSE NEGATIVE<TAB>KEY<TAB>through ROUTER...\".  A call that fails (a\n"
     "router unreachable, the filter missing, a shard short of its quorum) is\n"
     "an error, counted apart.  A summary line follows each round.\n"
     "\n"
     "Canary keys are \"bloomgrid-canary/NAME/SEQ\" (SEQ from 0): never use the\n"
     "prefix \"bloomgrid-canary/\" for real keys.  They count against FILTER's\n"
     "capacity (one per round); a filter of its own for the canary, created\n"
     "with the production filters' shard count, keeps them apart.  The state\n"
     "file holds the next SEQ, so a restarted canary checks every key of the\n"
     "runs before it; it names its filter and canary, and refuses others.\n"
     "Name the routers of one datacenter: another datacenter sees a key only\n"
     "after the next merger round.\n"
     "\n"
     "  --once                one round, then exit\n"
     "  --rounds N            N rounds, then exit (default: until SIGINT or\n"
     "                        SIGTERM, which end the run after its round)\n"
     "  --interval D          time between rounds: seconds, or with a unit\n"
     "                        (500ms, 30s, 5m, 1h; default 60s)\n"
     "  --check N             keys asked of each router per round at most\n"
     "                        (default 1000, up to 100000): every key while\n"
     "                        there are no more, then the newest N/2 and an\n"
     "                        evenly spread sample of the older ones, which\n"
     "                        moves each round\n"
     "  --name NAME           the canary's name in its keys (default cli):\n"
     "                        letters, digits, '.', '_', '-'\n"
     "  --state FILE          its state file (default canary-FILTER.state in\n"
     "                        the current directory)\n"
     "  --json                one JSON object per round: the false negatives\n"
     "                        and errors as \"events\", and the counts\n"
     SERVER_OPTIONS
     "                        (default 10000, per call); --server takes a\n"
     "                        comma-separated list of routers\n"
     "\n"
     "Exit status: 0 when every round added its key and every router said\n"
     "\"maybe\" to every key asked; 1 when some router answered \"no\" to an\n"
     "acknowledged key; 2 on errors (bad options or state file, failed calls).\n"
     "A router with canary_filter set runs the same check itself and counts\n"
     "it on /metrics (bloomgrid_canary_false_negatives_total, docs/METRICS.md).\n"
     "\n"
     "examples:\n"
     "  bloomgrid --server localhost:7501 create canary -n 1M -p 1%\n"
     "  bloomgrid canary canary --server localhost:7501 --once\n"
     "  bloomgrid canary canary --server r1:7500,r2:7500 --interval 30s \\\n"
     "      --state /var/lib/bloomgrid/canary.state\n"},
    {"check",
     "usage: bloomgrid [--server HOST:PORT] check NAME [--count] [--batch N]\n"
     "                 [--inflight N] [KEY...]\n"
     "\n"
     "Ask the server whether keys may be in a filter; the online 'query'.\n"
     "Prints one line per key, in input order: \"maybe<TAB>KEY\" (maybe\n"
     "present) or \"no<TAB>KEY\" (definitely absent).  Without KEY arguments,\n"
     "keys are read one per line from stdin.\n"
     "\n"
     "  -c, --count           print only the totals: \"maybe N\" and \"no M\"\n"
     KEYS_OPTIONS
     "\n"
     "Exit status: 0 when every key may be present, 1 when at least one is\n"
     "definitely absent, 2 on error.\n"
     "\n"
     "examples:\n"
     "  bloomgrid --server localhost:7400 check users alice carol\n"
     "  bloomgrid check users --count < candidates.txt\n"},
    {"remove",
     "usage: bloomgrid --server HOST:PORT remove NAME [--batch N] [--inflight N]\n"
     "                 [KEY...]\n"
     "\n"
     "Remove keys from a counting filter on the server.  Prints\n"
     "\"removed<TAB>KEY\" or \"no<TAB>KEY\" (definitely absent, nothing changed);\n"
     "exit status 1 when some key was absent.  Only remove keys that were\n"
     "added.  Other kinds refuse with FAILED_PRECONDITION (exit 2).\n"
     "\n" KEYS_OPTIONS
     "\n"
     "example:\n"
     "  bloomgrid --server localhost:7400 remove sessions s-1234\n"},
    {"export",
     "usage: bloomgrid [--server HOST:PORT] export NAME FILE [--force]\n"
     "\n"
     "Save a point-in-time copy of a server's filter as a filter file.  The\n"
     "bytes go to a temp file next to FILE, which is synced and verified\n"
     "(checksum and geometry) before it replaces FILE; on any failure FILE is\n"
     "left as it was.  A node sends a filter file, which works with every\n"
     "offline command; a router sends a shard bundle (every shard in one\n"
     "file), which 'query', 'add', 'inspect' and '--like' read.  Both work\n"
     "with 'build --like' to make partials that 'import' merges back.  A\n"
     "multi-shard filter is exported through a router, not a node.\n"
     "\n"
     "  -f, --force           replace FILE if it exists\n"
     SERVER_OPTIONS
     "                        (default 600000: the whole transfer)\n"
     "\n"
     "examples:\n"
     "  bloomgrid --server localhost:7400 export users users.bf\n"
     "  bloomgrid query users.bf alice\n"},
    {"import",
     "usage: bloomgrid [--server HOST:PORT] import NAME FILE\n"
     "\n"
     "OR-merge a filter file into a server's filter.  The file must be\n"
     "compatible (same kind, geometry, secret and shard: make it with\n"
     "'build --like' from an export of the filter; a router takes a shard\n"
     "bundle); otherwise the server refuses with FAILED_PRECONDITION naming\n"
     "the field, and nothing changes.  A damaged file is refused with\n"
     "INVALID_ARGUMENT.\n"
     "Reports the bytes sent and the projected fill and false-positive rate\n"
     "on stderr.\n"
     "\n" SERVER_OPTIONS
     "                        (default 600000: the whole transfer)\n"
     "\n"
     "example:\n"
     "  bloomgrid --server localhost:7400 export users users.bf\n"
     "  bloomgrid build batch.bf --like users.bf < todays-users.txt\n"
     "  bloomgrid --server localhost:7400 import users batch.bf\n"},
    {"backup",
     "usage: bloomgrid [--server HOST:PORT] backup DIR [--force]\n"
     "\n"
     "Export every filter of the server into DIR, one NAME.filter each, and\n"
     "write DIR/manifest.ini last (name, kind, geometry, inserts, fingerprint,\n"
     "size and XXH3-64 of each file).  DIR is made (mode 0700) when missing\n"
     "and must be empty unless --force.  The files hold the filters' secrets\n"
     "(mode 0600): keep DIR as a credential.  Export needs an admin token.\n"
     "Prints one line per filter; any failure exits 2 and leaves no manifest.\n"
     "See docs/BACKUP.md.\n"
     "\n"
     "  -f, --force           write into a DIR that is not empty\n"
     SERVER_OPTIONS
     "                        (default 600000 per export)\n"
     "\n"
     "example:\n"
     "  bloomgrid --server localhost:7500 --token-file admin.tok \\\n"
     "      backup /var/backups/bloomgrid/$(date +%F)\n"},
    {"restore",
     "usage: bloomgrid [--server HOST:PORT] restore DIR [--undrop]\n"
     "\n"
     "Restore the filters of a backup made by 'bloomgrid backup'.  First every\n"
     "file is checked against DIR/manifest.ini and every filter against the\n"
     "server's: a damaged or missing file, or a filter that exists with\n"
     "another kind, shard count, geometry or secret (the message names it),\n"
     "fails the restore before anything changes.  Then a filter that does not\n"
     "exist is created with the backup's geometry and secret and its file\n"
     "imported; one that exists gets the import only when it lacks some key\n"
     "of the backup, so running the same restore twice changes nothing.\n"
     "A filter dropped on the server (DropFilter, 'bloomgrid drop') is not\n"
     "created again unless --undrop is given: the servers keep a tombstone of\n"
     "its name and secret so that nothing brings it back by mistake.\n"
     "Needs an admin token.  Prints one line per filter; exit 2 on any\n"
     "failure.  See docs/BACKUP.md.\n"
     "\n"
     "      --undrop          undo the drop of the backup's filters that were\n"
     "                        dropped: lift their tombstones and restore them\n"
     "                        with their secret (through a router: on every\n"
     "                        copy that is up, the others follow by\n"
     "                        anti-entropy; a name created again since, under\n"
     "                        another secret, is refused)\n"
     SERVER_OPTIONS
     "                        (default 600000 per transfer)\n"
     "\n"
     "examples:\n"
     "  bloomgrid --server localhost:7500 --token-file admin.tok \\\n"
     "      restore /var/backups/bloomgrid/2024-05-01\n"
     "  bloomgrid --server localhost:7500 --token-file admin.tok \\\n"
     "      restore --undrop /var/backups/bloomgrid/2024-05-01   # after a drop\n"},
    {NULL, NULL},
};

void help_overview(FILE *out)
{
    fputs("usage: bloomgrid COMMAND [ARGS...]\n"
          "\n"
          "Build, query and merge Bloom-filter files, and use filters on a\n"
          "bloomgrid server (node or router).\n"
          "\n"
          "offline commands (filter files):\n"
          "  create    create an empty filter file\n"
          "  build     create a filter file from keys, one per line\n"
          "  add       add keys to a filter file\n"
          "  query     ask whether keys may be present (exit 1 if one is absent)\n"
          "  remove    remove keys from a counting filter\n"
          "  merge     OR-merge compatible filter files\n"
          "  inspect   show a filter file's geometry and estimates\n"
          "\n"
          "online commands (bloomgrid --server HOST:PORT COMMAND ...):\n"
          "  create    create a filter on the server\n"
          "  drop      drop a filter\n"
          "  list      list the filters\n"
          "  info      show a filter's geometry, fill, estimates and shards\n"
          "  add       add keys (arguments or stdin)\n"
          "  check     ask whether keys may be present (exit 1 if one is absent)\n"
          "  remove    remove keys from a counting filter\n"
          "  export    save a server's filter as a filter file\n"
          "  status    the cluster: copies serving, SYNCING or unreachable\n"
          "  resync    let a copy of a group stuck SYNCING serve again,\n"
          "            accepting lost keys (--accept-loss)\n"
          "  import    OR-merge a filter file into a server's filter\n"
          "  backup    export every filter into a directory, with a manifest\n"
          "  restore   re-create and fill the filters of a backup\n"
          "  canary    add a known key now and then, check every earlier one\n"
          "            through every router (exit 1 on a false negative)\n"
          "  health    ask a process's grpc.health.v1 (exit 0 SERVING, as a probe)\n"
          "\n"
          "tokens:\n"
          "  token new make a token and its line for the servers' tokens file\n"
          "\n"
          "  help      show help for a command\n"
          "\n"
          "  --help, --version\n"
          "  --server HOST:PORT  the server (default: $BLOOMGRID_SERVER); create,\n"
          "                      add and remove work on a FILE when no server is\n"
          "                      named (BLOOMGRID_SERVER= to force file mode)\n"
          "  --deadline MS       per-call deadline of online commands\n"
          "  --tls-ca FILE       TLS to the server, verified with the CA certificates\n"
          "                      of FILE (default: $BLOOMGRID_TLS_CA; none: plaintext)\n"
          "  --tls-cert FILE     a client certificate to present, with --tls-key\n"
          "  --tls-key FILE      (default: $BLOOMGRID_TLS_CERT, $BLOOMGRID_TLS_KEY)\n"
          "  --token-file FILE   the token online commands send (default: the\n"
          "                      token in $BLOOMGRID_TOKEN): servers with a\n"
          "                      tokens file ask for one\n"
          "\n"
          "Run 'bloomgrid help COMMAND' for a command's options and examples.\n"
          "Exit status: 0 success, 1 a queried key is definitely absent,\n"
          "2 error.\n", out);
}

static const char *find(const struct help_entry *table, const char *cmd)
{
    for (const struct help_entry *e = table; e->cmd; e++)
        if (strcmp(e->cmd, cmd) == 0)
            return e->text;
    return NULL;
}

const char *help_command(const char *cmd)
{
    const char *text = find(help_entries, cmd);

    return text ? text : find(online_help_entries, cmd);
}

int help_print(const char *cmd)
{
    const char *offline = find(help_entries, cmd),
               *online = find(online_help_entries, cmd);

    if (!offline && !online)
        return cli_fail("unknown command '%s' (see 'bloomgrid --help')", cmd);
    if (offline)
        fputs(offline, stdout);
    if (offline && online)
        fputs("\nOn a server (--server HOST:PORT or BLOOMGRID_SERVER):\n\n",
              stdout);
    if (online)
        fputs(online, stdout);
    return CLI_OK;
}
