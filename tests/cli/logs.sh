#!/bin/sh
# log_format = json: every line a node, a router and a merger write on
# stderr is one JSON object with time, level, program, source and msg.
set -eu
BG=$(realpath "$1")
NODE=$(realpath "$2")
ROUTER=$(realpath "$3")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"

start_server node "$NODE" --data-dir "$WORK/d1" --log-format json
printf 'version = 1\n[group g0]\ncopies = %s\n' "$ADDR" > topo.ini
start_server router "$ROUTER" --topology "$WORK/topo.ini" --log-format json
expect_ok "$BG" --server "$ADDR" create f -n 1000 -p 0.01
expect_err 2 'ALREADY_EXISTS' "$BG" --server "$ADDR" create f -n 1000 -p 0.01
for p in $PIDS; do kill -TERM "$p"; wait "$p" || true; done
PIDS=""
for f in node.log router.log; do
    [ -s "$f" ] || fail "$f is empty"
    /usr/bin/python3 - "$f" <<'PY' || fail "$f: not JSON lines: $(head -3 "$f")"
import json, sys
n = 0
for line in open(sys.argv[1]):
    o = json.loads(line)
    assert set(o) == {"time", "level", "program", "source", "msg"}, o
    assert o["program"].startswith("bloomgrid-"), o
    assert o["level"] in ("debug", "info", "warn", "error"), o
    n += 1
assert n >= 2, n
PY
done
grep -q '"msg":"listening on' node.log || fail "no listening line in node.log"
"$NODE" --log-format xml 2>err.txt && fail "--log-format xml accepted"
grep -q 'text|json\|text, json' err.txt || fail "bad --log-format: $(cat err.txt)"
echo "logs OK"
