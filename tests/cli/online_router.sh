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
printf 'version = 1\n[group g0]\ncopies = %s\n[group g1]\ncopies = %s\n' "$N1" "$N2" > topo.ini
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

# The offline commands on bundles: one code path with filter files, and a
# bundle stays a bundle.  create, add and remove are offline without a server.
R=$BLOOMGRID_SERVER
unset BLOOMGRID_SERVER
magic() {
    head -c 8 "$1"
}
expect_ok "$BG" inspect --json slugs.bundle
python3 -c 'import json; d=json.load(open("out.txt")); assert d["format"]=="shard bundle" and d["shards"]==4 and [s["index"] for s in d["shard_list"]]==[0,1,2,3]' ||
    fail "inspect --json bundle: $(cat out.txt)"
cp part.bundle grow.bundle
chmod 600 grow.bundle
expect_ok "$BG" add grow.bundle extra-1 extra-2
[ "$(magic grow.bundle)" = BGSHARDS ] || fail "add turned a bundle into $(magic grow.bundle)"
[ "$(stat -c %a grow.bundle)" = 600 ] || fail "bundle mode changed to $(stat -c %a grow.bundle)"
expect_ok "$BG" query grow.bundle extra-1 extra-2 new-1
expect_ok "$BG" create empty.bundle --like slugs.bundle
[ "$(magic empty.bundle)" = BGSHARDS ] || fail "create --like bundle: $(magic empty.bundle)"
run "$BG" query --count empty.bundle < new.txt
[ "$rc" -eq 1 ] && [ "$(cat out.txt)" = "$(printf 'maybe 0\nno 5000')" ] ||
    fail "empty bundle: exit $rc: $(cat out.txt)"
expect_ok "$BG" merge merged.bundle empty.bundle grow.bundle
grep -q '^merge: + grow.bundle: 4 shards$' err.txt || fail "merge report: $(cat err.txt)"
expect_ok "$BG" query --count merged.bundle < new.txt
[ "$(cat out.txt)" = "$(printf 'maybe 5000\nno 0')" ] || fail "merged bundle: $(cat out.txt)"
[ "$(magic merged.bundle)" = BGSHARDS ] || fail "merge wrote $(magic merged.bundle)"
# Forms do not mix; a bundle of another shard count does not merge.
"$BG" create lone.bf -n 1000 -p 0.01
expect_err 2 'lone.bf: .*bundles merge only with bundles' \
    "$BG" merge x.bundle grow.bundle lone.bf
expect_err 2 'grow.bundle: a shard bundle' "$BG" merge x.bf lone.bf grow.bundle
expect_err 2 'grow.bundle: a shard bundle' "$BG" remove grow.bundle extra-1
expect_ok "$BG" --server "$R" create two -n 1000 -p 0.01 --shards 2
expect_ok "$BG" --server "$R" export two two.bundle
expect_err 2 'different shard_count \(2, not 4\)' "$BG" merge x.bundle grow.bundle two.bundle
[ ! -e x.bundle ] && [ ! -e x.bf ] || fail "a refused merge wrote its output"
# A filter of one shard exports as a bundle of one, which stays a bundle.
expect_ok "$BG" --server "$R" create uno -n 1000 -p 0.01 --shards 1
expect_ok "$BG" --server "$R" export uno uno.bundle
expect_ok "$BG" add uno.bundle solo-1
[ "$(magic uno.bundle)" = BGSHARDS ] || fail "a bundle of one became $(magic uno.bundle)"
expect_ok "$BG" --server "$R" import uno uno.bundle
expect_ok "$BG" --server "$R" check uno solo-1
# Damaged and truncated bundles are refused by every command, unchanged.
cp grow.bundle bad.bundle
flip_byte bad.bundle 3000
B=$(sum bad.bundle)
for cmd in "query bad.bundle k" "add bad.bundle k" "inspect bad.bundle" \
           "merge y.bundle grow.bundle bad.bundle" "create y.bundle --like bad.bundle"; do
    expect_err 2 'bad.bundle: checksum mismatch' "$BG" $cmd
done
same_file bad.bundle "$B"
head -c 20 grow.bundle > short.bundle
expect_err 2 'short.bundle: truncated' "$BG" query short.bundle k
[ ! -e y.bundle ] || fail "a refused command wrote y.bundle"
# A failed save leaves the bundle and no temp file.
G=$(sum grow.bundle)
run sh -c "ulimit -f 8; exec \"$BG\" add grow.bundle < new.txt"
[ "$rc" -ne 0 ] || fail "add under a 4 KiB file limit succeeded"
same_file grow.bundle "$G"
[ -z "$(ls | grep '\.tmp\.' || true)" ] || fail "temp file left: $(ls)"
BLOOMGRID_SERVER=$R
export BLOOMGRID_SERVER

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
