#!/usr/bin/env python3
"""The Redis door of a node through redis-cli (Debian's redis-tools), one
table: every command the door serves, its exact reply as redis-cli prints
it (types shown: --no-raw), in RESP2 and RESP3, and the error strings of
RedisBloom's command reference.

usage: test_resp_cli.py NODE_BIN [--against-redisbloom MODULE.so]

With --against-redisbloom the same table runs against redis-server with
RedisBloom loaded (a test of the table itself): every row must match
RedisBloom's reply too, except the rows marked as a difference (bloomgrid's
own commands' texts, and the deliberate ones: docs/RESP.md), which must
then differ."""
import re
import sys

import resplib

SAME = None       # RedisBloom answers the same
OURS = "ours"     # bloomgrid's own text (HELLO, INFO, COMMAND DOCS ...): not compared
DIFF = "diff"     # a deliberate difference: RedisBloom answers otherwise

# (what, lines sent on one connection, RESP3?, expected output, RedisBloom)
# An expected output starting with "~" is a regular expression (fullmatch).
TABLE = [
    ("ping", ["PING", "PING hello"], False, 'PONG\n"hello"\n', SAME),
    ("echo", ["ECHO hi"], False, '"hi"\n', SAME),
    ("select", ["SELECT 0", "SELECT 1", "SELECT x"], False,
     "OK\n(error) ERR DB index is out of range (bloomgrid serves database 0 only)\n"
     "(error) ERR value is not an integer or out of range\n", OURS),
    ("reserve", ["BF.RESERVE r1 0.01 1000", "BF.RESERVE r1 0.01 1000"], False,
     "OK\n(error) ERR item exists\n", SAME),
    ("reserve errors", ["BF.RESERVE r2 x 100", "BF.RESERVE r2 1.5 100",
                        "BF.RESERVE r2 0.01 x", "BF.RESERVE r2 0.01 0",
                        "BF.RESERVE r2 0.01 100 EXPANSION",
                        "BF.RESERVE r2 0.01 100 EXPANSION x",
                        "BF.RESERVE r2 0.01 100 NONSCALING EXPANSION 2",
                        "BF.RESERVE r2 0.01"], False,
     "(error) ERR bad error rate\n(error) ERR (0 < error rate range < 1) \n"
     "(error) ERR bad capacity\n(error) ERR (capacity should be larger than 0)\n"
     "(error) ERR no expansion\n(error) ERR bad expansion\n"
     "(error) Nonscaling filters cannot expand\n"
     "(error) ERR wrong number of arguments for 'bf.reserve' command\n", SAME),
    ("reserve shards", ["BF.RESERVE s1 0.01 100 NONSCALING SHARDS 1",
                        "BF.RESERVE s2 0.01 100 SHARDS 2", "BF.RESERVE s2 0.01 100 SHARDS 0",
                        "BF.RESERVE s2 0.01 100 SHARDS 4097",
                        "BF.RESERVE s2 0.01 100 SHARDS", "BF.INSERT s2 SHARDS 3 ITEMS a",
                        "BF.INSERT s1 SHARDS 3 ITEMS a", "BF.INSERT s1 SHARDS x ITEMS a",
                        "BF.EXISTS s2 a"], False,
     "OK\n(error) ERR SHARDS 2: a node's door makes filters of one shard (a filter "
     "of many shards is made through a router)\n"
     "(error) ERR bad shard count (SHARDS takes 1 to 4096)\n"
     "(error) ERR bad shard count (SHARDS takes 1 to 4096)\n"
     "(error) ERR no shard count after SHARDS\n"
     "(error) ERR SHARDS 3: a node's door makes filters of one shard (a filter "
     "of many shards is made through a router)\n"
     "1) (integer) 1\n(error) ERR bad shard count (SHARDS takes 1 to 4096)\n"
     "(error) ERR not found: filter \"s2\" does not exist (a read of a missing "
     "filter is an error here, never 0: docs/RESP.md)\n", OURS),
    ("add and exists", ["BF.RESERVE a1 0.01 1000", "BF.ADD a1 k1", "BF.ADD a1 k1",
                        "BF.EXISTS a1 k1", "BF.EXISTS a1 k2"], False,
     "OK\n(integer) 1\n(integer) 0\n(integer) 1\n(integer) 0\n", SAME),
    ("madd and mexists", ["BF.RESERVE m1 0.01 1000", "BF.MADD m1 a b a",
                          "BF.MEXISTS m1 a z b"], False,
     "OK\n1) (integer) 1\n2) (integer) 1\n3) (integer) 0\n"
     "1) (integer) 1\n2) (integer) 0\n3) (integer) 1\n", SAME),
    ("add creates a scaling filter", ["BF.ADD c1 x", "BF.INFO c1 EXPANSION",
                                      "BF.INFO c1 FILTERS", "BF.CARD c1"], False,
     "(integer) 1\n1) (integer) 2\n1) (integer) 1\n(integer) 1\n", SAME),
    ("arity", ["BF.ADD a1", "BF.EXISTS a1", "BF.MADD a1", "BF.INFO", "BF.CARD",
               "BF.INFO a1 SIZE x"], False,
     "(error) ERR wrong number of arguments for 'bf.add' command\n"
     "(error) ERR wrong number of arguments for 'bf.exists' command\n"
     "(error) ERR wrong number of arguments for 'bf.madd' command\n"
     "(error) ERR wrong number of arguments for 'bf.info' command\n"
     "(error) ERR wrong number of arguments for 'bf.card' command\n"
     "(error) ERR wrong number of arguments for 'bf.info' command\n", SAME),
    ("insert", ["BF.INSERT i1 CAPACITY 1000 ERROR 0.001 ITEMS a b",
                "BF.INSERT i1 NOCREATE ITEMS b c", "BF.INFO i1 CAPACITY"], False,
     "1) (integer) 1\n2) (integer) 1\n1) (integer) 0\n2) (integer) 1\n"
     "1) (integer) 1000\n", SAME),
    ("insert nonscaling", ["BF.INSERT i2 NONSCALING CAPACITY 50 ITEMS a",
                           "BF.INFO i2 EXPANSION"], False,
     "1) (integer) 1\n1) (nil)\n", SAME),
    ("insert errors", ["BF.INSERT i3 ITEMS", "BF.INSERT i3 CAPACITY x ITEMS a",
                       "BF.INSERT i3 ERROR x ITEMS a", "BF.INSERT i3 EXPANSION x ITEMS a",
                       "BF.INSERT i3 ERROR 2 ITEMS a", "BF.INSERT i3 FOO ITEMS a",
                       "BF.INSERT i3 a b"], False,
     "(error) ERR wrong number of arguments for 'bf.insert' command\n"
     "(error) Bad capacity\n(error) Bad error rate\n(error) Bad expansion\n"
     "(error) Bad argument received\n(error) Unknown argument received\n"
     "(error) Unknown argument received\n", SAME),
    ("insert nocreate on a missing filter", ["BF.INSERT i4 NOCREATE ITEMS a"], False,
     '(error) ERR not found: filter "i4" does not exist; NOCREATE was given\n',
     "(error) ERR not found\n"),
    ("info", ["BF.RESERVE f1 0.01 1000 NONSCALING", "BF.MADD f1 a b c", "BF.INFO f1"],
     False,
     "~OK\n1\\) \\(integer\\) 1\n2\\) \\(integer\\) 1\n3\\) \\(integer\\) 1\n"
     " 1\\) Capacity\n 2\\) \\(integer\\) 1000\n 3\\) Size\n 4\\) \\(integer\\) \\d+\n"
     " 5\\) Number of filters\n 6\\) \\(integer\\) 1\n"
     " 7\\) Number of items inserted\n 8\\) \\(integer\\) 3\n"
     " 9\\) Expansion rate\n10\\) \\(nil\\)\n", SAME),
    ("info fields", ["BF.RESERVE f2 0.01 500 EXPANSION 4", "BF.ADD f2 x",
                     "BF.INFO f2 CAPACITY", "BF.INFO f2 FILTERS", "BF.INFO f2 ITEMS",
                     "BF.INFO f2 EXPANSION", "BF.INFO f2 size", "BF.INFO f2 BOGUS"], False,
     "~OK\n\\(integer\\) 1\n1\\) \\(integer\\) 500\n1\\) \\(integer\\) 1\n"
     "1\\) \\(integer\\) 1\n1\\) \\(integer\\) 4\n1\\) \\(integer\\) \\d+\n"
     "\\(error\\) Invalid information value\n", SAME),
    ("info of a missing filter", ["BF.INFO nosuch"], False,
     '(error) ERR not found: filter "nosuch" does not exist\n',
     "(error) ERR not found\n"),
    ("card", ["BF.RESERVE k1 0.01 100", "BF.MADD k1 a b", "BF.CARD k1",
              "BF.CARD nosuch"], False,
     "OK\n1) (integer) 1\n2) (integer) 1\n(integer) 2\n(integer) 0\n", SAME),
    # The deliberate difference: a read of a missing filter is an error.
    ("exists on a missing filter", ["BF.EXISTS nosuch a", "BF.MEXISTS nosuch a b"],
     False,
     '(error) ERR not found: filter "nosuch" does not exist (a read of a missing '
     'filter is an error here, never 0: docs/RESP.md)\n'
     '(error) ERR not found: filter "nosuch" does not exist (a read of a missing '
     'filter is an error here, never 0: docs/RESP.md)\n',
     "(integer) 0\n1) (integer) 0\n2) (integer) 0\n"),
    ("filter names follow the rule", ["BF.ADD bf:slugs x"], False,
     "(error) ERR filter name \"bf:slugs\" may contain only letters, digits, '.', '_' "
     "and '-' (bad byte 0x3a at position 2)\n", DIFF),
    ("del", ["BF.ADD d1 x", "BF.ADD d2 x", "DEL d1 d2 d3", "BF.EXISTS d1 x"], False,
     '(integer) 1\n(integer) 1\n(integer) 2\n(error) ERR not found: filter "d1" '
     'does not exist (a read of a missing filter is an error here, never 0: '
     'docs/RESP.md)\n', DIFF),
    ("unknown command", ["FOO bar baz"], False,
     "(error) ERR unknown command 'FOO', with args beginning with: 'bar' 'baz' \n", SAME),
    ("multi exec", ["MULTI", "BF.ADD t1 x", "BF.EXISTS t1 x", "PING", "EXEC"], False,
     "OK\nQUEUED\nQUEUED\nQUEUED\n1) (integer) 1\n2) (integer) 1\n3) PONG\n", SAME),
    ("multi errors", ["EXEC", "DISCARD", "MULTI", "MULTI", "BF.ADD t2", "EXEC",
                      "MULTI", "PING", "DISCARD"], False,
     "(error) ERR EXEC without MULTI\n(error) ERR DISCARD without MULTI\nOK\n"
     "(error) ERR MULTI calls can not be nested\n"
     "(error) ERR wrong number of arguments for 'bf.add' command\n"
     "(error) EXECABORT Transaction discarded because of previous errors.\n"
     "OK\nQUEUED\nOK\n",
     # RedisBloom's commands check their arity when they run; the door checks
     # it when it queues, as Redis does for its own commands.
     DIFF),
    ("client", ["CLIENT SETNAME web-1", "CLIENT GETNAME", "CLIENT SETNAME a b",
                "CLIENT SETINFO LIB-NAME redis-py", "CLIENT SETINFO LIB-VER 4.3.4",
                "CLIENT NOPE"], False,
     'OK\n"web-1"\n(error) ERR unknown subcommand or wrong number of arguments '
     "for 'SETNAME'. Try CLIENT HELP.\n"
     "OK\nOK\n(error) ERR unknown subcommand or wrong number of arguments for "
     "'NOPE'. Try CLIENT HELP.\n", OURS),
    ("client id", ["CLIENT ID"], False, "~\\(integer\\) \\d+\n", SAME),
    ("auth without tokens", ["AUTH secret"], False,
     "(error) ERR AUTH <password> called without any password configured for the "
     "default user. Are you sure your configuration is correct?\n", SAME),
    ("hello", ["HELLO 2", "HELLO 4"], False,
     '~ 1\\) "server"\n 2\\) "bloomgrid"\n 3\\) "version"\n 4\\) "[^"]+"\n'
     ' 5\\) "proto"\n 6\\) \\(integer\\) 2\n 7\\) "id"\n 8\\) \\(integer\\) \\d+\n'
     ' 9\\) "mode"\n10\\) "standalone"\n11\\) "role"\n12\\) "master"\n'
     '13\\) "modules"\n14\\) \\(empty array\\)\n'
     "\\(error\\) NOPROTO unsupported protocol version\n", OURS),
    ("command count and info", ["COMMAND COUNT", "COMMAND INFO bf.exists nosuch"],
     False,
     "(integer) 23\n1)  1) \"bf.exists\"\n    2) (integer) 3\n    3) 1) readonly\n"
     "       2) fast\n    4) (integer) 1\n    5) (integer) 1\n    6) (integer) 1\n"
     "    7) (empty array)\n    8) (empty array)\n    9) (empty array)\n"
     "   10) (empty array)\n2) (nil)\n", OURS),
    ("command docs", ["COMMAND DOCS bf.card"], False,
     '1) "bf.card"\n2) 1) "summary"\n   2) "Items added to a filter (0 for a '
     'missing filter)."\n   3) "since"\n   4) "1.0.0"\n   5) "group"\n   6) "bf"\n'
     '   7) "complexity"\n   8) "O(N) for N keys"\n', OURS),
    ("info server", ["INFO server"], False,
     "~# Server\nredis_version:7\\.0\\.0\nbloomgrid_version:.*\n"
     "server_name:bloomgrid-node\nredis_mode:standalone\ntcp_port:\\d+\n"
     "uptime_in_seconds:\\d+\n\n", OURS),
    ("reset and quit", ["RESET", "QUIT", "PING"], False, "RESET\n", SAME),
    # RESP3
    ("resp3 info", ["HELLO 3", "BF.RESERVE g1 0.01 100 NONSCALING", "BF.INFO g1"], True,
     '~1# "server" => "bloomgrid"\n.*7# "modules" => \\(empty array\\)\nOK\n'
     "1# Capacity => \\(integer\\) 100\n2# Size => \\(integer\\) \\d+\n"
     "3# Number of filters => \\(integer\\) 1\n"
     "4# Number of items inserted => \\(integer\\) 0\n5# Expansion rate => \\(nil\\)\n",
     OURS),
    ("resp3 shapes", ["BF.ADD g2 x", "BF.MEXISTS g2 x y", "BF.INFO g2 EXPANSION",
                      "CLIENT GETNAME"], True,
     "(true)\n1) (true)\n2) (false)\n1) (integer) 2\n(nil)\n",
     # RedisBloom 2.4 answers integers in RESP3 too; newer ones (and the
     # clients that speak RESP3, node-redis) booleans, as here.
     DIFF),
]


def norm(text):
    return text.replace("\r\n", "\n")


def matches(want, have):
    if want.startswith("~"):
        return re.fullmatch(want[1:], have, re.S) is not None
    return want == have


def run(port, against_rb):
    failed = 0
    for what, lines, resp3, want, rb in TABLE:
        if against_rb and rb == OURS:
            continue
        have = norm(resplib.cli(port, lines, resp3=resp3))
        if against_rb and rb not in (SAME, DIFF):
            want = rb
        ok = matches(want, have)
        if against_rb and rb == DIFF:
            ok = not ok
        if not ok:
            failed += 1
            print("FAIL %s: sent %r\n--- want%s\n%s--- have\n%s" %
                  (what, lines, " something else than" if rb == DIFF and against_rb else "",
                   want, have), file=sys.stderr)
    return failed


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    work = resplib.workdir("resp-cli-")
    if "--against-redisbloom" in sys.argv:
        module = sys.argv[sys.argv.index("--against-redisbloom") + 1]
        srv = resplib.Redis(module, work)
        against = True
    else:
        srv = resplib.start_node(sys.argv[1], work)
        against = False
    try:
        failed = run(srv.port, against)
    finally:
        srv.stop()
    n = len([r for r in TABLE if not (against and r[4] == OURS)])
    print("%d passed, %d failed" % (n - failed, failed))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
