#!/bin/sh
# bloomgrid status --merger: the merger's last round after one has run
# (exit 0 when it had no error), and the merger's health_listen, which
# serves health alone: Merger.Status there is UNIMPLEMENTED (exit 1).
set -eu
BG=$(realpath "$1")
NODE=$(realpath "$2")
ROUTER=$(realpath "$3")
MERGER=$(realpath "$4")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"

start_server node "$NODE" --data-dir "$WORK/d1" --durability none
N1=$ADDR
printf 'version = 1\n[group g0]\ncopies = %s\n' "$N1" > topo.ini
start_server router "$ROUTER" --topology "$WORK/topo.ini"
R=$ADDR
expect_ok "$BG" --server "$R" create f -n 10000 -p 0.01 --shards 2
printf '[filter f]\ndatacenter = dc1 %s/topo.ini\n' "$WORK" > sources.ini
start_server merger "$MERGER" --sources "$WORK/sources.ini" --state-dir "$WORK/m" \
    --interval-s 1 --health-listen 127.0.0.1:0
M=${ADDR%% *}
H=${ADDR##* health }

n=0
while :; do
    run "$BG" status --merger "$M"
    grep -q 'last round' out.txt && break
    n=$((n + 1))
    [ $n -lt 200 ] || fail "no merger round reported: $(cat out.txt err.txt)"
    sleep 0.05
done
[ "$rc" -eq 0 ] || fail "status --merger exited $rc: $(cat out.txt)"
grep -q 'pages pulled' out.txt || fail "status --merger: $(cat out.txt)"
grep -q ' 0 errors' out.txt || fail "status --merger: $(cat out.txt)"

run "$BG" status --merger "$H"
[ "$rc" -eq 1 ] || fail "status on the merger's health_listen exited $rc"
grep -q 'UNIMPLEMENTED' out.txt || fail "merger health_listen served Status: $(cat out.txt)"
echo ok
