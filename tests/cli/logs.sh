#!/bin/sh
# log_format = json: every line a node, a router and a merger write on
# stderr is one JSON object with time, level, program, source and msg, and
# so are the lines each writes on stdout, "PROGRAM listening on HOST:PORT"
# and "PROGRAM metrics on HOST:PORT", from which scripts read the addresses.
set -eu
BG=$(realpath "$1")
NODE=$(realpath "$2")
ROUTER=$(realpath "$3")
MERGER=$(realpath "$4")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"

start_server node "$NODE" --data-dir "$WORK/d1" --log-format json \
    --metrics-listen 127.0.0.1:0
N=$ADDR
printf 'version = 1\n[group g0]\ncopies = %s\n' "$N" > topo.ini
start_server router "$ROUTER" --topology "$WORK/topo.ini" --log-format json
R=$ADDR
expect_ok "$BG" --server "$R" create f -n 1000 -p 0.01
expect_err 2 'ALREADY_EXISTS' "$BG" --server "$R" create f -n 1000 -p 0.01
printf '[filter f]\ndatacenter = dc1 %s/topo.ini\n' "$WORK" > sources.ini
start_server merger "$MERGER" --sources "$WORK/sources.ini" --state-dir "$WORK/m" \
    --log-format json
M=$ADDR
for p in $PIDS; do kill -TERM "$p"; wait "$p" || true; done
PIDS=""
check_json() {   # FILE [PROGRAM ADDR [METRICS]]: JSON lines; with PROGRAM, its
                 # listening line (and with METRICS its metrics line) and no other
    /usr/bin/python3 - "$@" <<'PY'
import json, sys
n = 0
lines = open(sys.argv[1]).read().splitlines()
for line in lines:
    o = json.loads(line)
    assert set(o) == {"time", "level", "program", "source", "msg"}, o
    assert o["program"].startswith("bloomgrid-"), o
    assert o["level"] in ("debug", "info", "warn", "error"), o
    n += 1
if len(sys.argv) > 2:
    prog, addr = sys.argv[2:4]
    want = ["%s listening on %s" % (prog, addr)]
    if len(sys.argv) > 4:
        want.insert(0, "%s metrics on 127.0.0.1:" % prog)
    assert n == len(want), lines
    for line, w in zip(lines, want):
        o = json.loads(line)
        assert o["program"] == prog and o["level"] == "info", o
        if w.endswith(":"):     # the metrics line: its port follows
            assert o["msg"].startswith(w) and o["msg"][len(w):].isdigit(), (o, w)
        else:
            assert o["msg"] == w, (o, w)
else:
    assert n >= 2, n
PY
}
for f in node.log router.log merger.log; do
    [ -s "$f" ] || fail "$f is empty"
    check_json "$f" || fail "$f: not JSON lines: $(head -3 "$f")"
done
case $N$R$M in *[!0-9.:]*) fail "addresses read from the JSON lines: $N $R $M" ;; esac
check_json node.out bloomgrid-node "$N" metrics || fail "node.out: $(cat node.out)"
check_json router.out bloomgrid-router "$R" || fail "router.out: $(cat router.out)"
check_json merger.out bloomgrid-merger "$M" || fail "merger.out: $(cat merger.out)"
grep -q '"msg":"listening on' node.log || fail "no listening line in node.log"
"$NODE" --log-format xml 2>err.txt && fail "--log-format xml accepted"
grep -q 'text|json\|text, json' err.txt || fail "bad --log-format: $(cat err.txt)"
echo "logs OK"
