#!/bin/sh
# Online commands through a bloomgrid-router in front of two nodes: the same
# commands as against a node, with a sharded filter; export gives a shard
# bundle that the offline commands read, and a partial built --like it
# imports back.
set -eu
BG=$(realpath "$1")
NODE=$(realpath "$2")
ROUTER=$(realpath "$3")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"

start_server node1 "$NODE" --data-dir "$WORK/d1"
N1=$ADDR
start_server node2 "$NODE" --data-dir "$WORK/d2"
N2=$ADDR
printf '[group g0]\nprimary = %s\n[group g1]\nprimary = %s\n' "$N1" "$N2" > topo.ini
start_server router "$ROUTER" --topology "$WORK/topo.ini"
BLOOMGRID_SERVER=$ADDR
export BLOOMGRID_SERVER

expect_ok "$BG" create slugs -n 100000 -p 0.001 --shards 4
grep -q '^shards: *4$' out.txt || fail "create: $(cat out.txt)"
[ "$(grep -c '^shard ' out.txt)" -eq 4 ] || fail "create shards: $(cat out.txt)"
expect_err 2 '^bloomgrid: server: ALREADY_EXISTS: ' "$BG" create slugs -n 10 -p 0.1
expect_err 2 '^bloomgrid: server: INVALID_ARGUMENT: ' "$BG" create z -n 0 -p 0.1
expect_ok "$BG" list
grep -q '^slugs  *blocked  *100000 ' out.txt || fail "list: $(cat out.txt)"

seq -f 'slug-%g' 1 20000 > added.txt
seq -f 'slug-%g' 15001 30000 > probe.txt
expect_ok "$BG" add slugs < added.txt
expect_ok "$BG" check slugs --count < added.txt
[ "$(cat out.txt)" = "$(printf 'maybe 20000\nno 0')" ] || fail "check: $(cat out.txt)"
run "$BG" check slugs alice
[ "$rc" -eq 1 ] || fail "absent key exit $rc"
expect_err 2 '^bloomgrid: server: NOT_FOUND: ' "$BG" check nope a
expect_err 2 '^bloomgrid: server: FAILED_PRECONDITION: ' "$BG" remove slugs slug-1
expect_ok "$BG" info slugs --json
grep -q '"shards": 4' out.txt || fail "info: $(cat out.txt)"

# Export: a shard bundle; the offline query agrees with the online check.
expect_ok "$BG" export slugs slugs.bundle
expect_ok "$BG" inspect slugs.bundle
grep -q '^shards: *4$' out.txt || fail "inspect bundle: $(cat out.txt)"
run "$BG" query slugs.bundle < probe.txt
cp out.txt offline.txt
offline_rc=$rc
run "$BG" check slugs < probe.txt
[ "$rc" -eq "$offline_rc" ] || fail "online check exit $rc, offline $offline_rc"
cmp -s out.txt offline.txt || fail "online check differs from the offline query of the bundle"

# A partial bundle built offline imports through the router.
seq -f 'new-%g' 1 5000 > new.txt
expect_ok "$BG" build part.bundle --like slugs.bundle < new.txt
expect_ok "$BG" query part.bundle --count < new.txt
expect_ok "$BG" import slugs part.bundle
expect_ok "$BG" check slugs --count < new.txt
[ "$(cat out.txt)" = "$(printf 'maybe 5000\nno 0')" ] || fail "imported: $(cat out.txt)"

# Another filter's bundle, and a node's single file, are refused.
expect_ok "$BG" create other -n 100000 -p 0.001 --shards 4
expect_err 2 '^bloomgrid: server: FAILED_PRECONDITION: .*secret' \
    "$BG" import other part.bundle
BLOOMGRID_SERVER= "$BG" create single.bf -n 1000 -p 0.01
expect_err 2 '^bloomgrid: server: INVALID_ARGUMENT: ' "$BG" import slugs single.bf

expect_ok "$BG" drop slugs
expect_err 2 '^bloomgrid: server: NOT_FOUND: ' "$BG" info slugs
all_alive
echo "online_router: ok"
