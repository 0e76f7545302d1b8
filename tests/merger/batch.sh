#!/bin/sh
# Batch build-locally / merge-globally: 4 partial shard bundles built in
# parallel (xargs -P) from splits of one input with 'build --like' an export
# of the live filter, reduced with 'merge', imported through a router.  The
# merged bundle answers exactly like one built from the whole input, and so
# does the live filter afterwards.
set -eu
BG=$(realpath "$1")
NODE=$(realpath "$2")
ROUTER=$(realpath "$3")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"

start_server node1 "$NODE" --data-dir "$WORK/d1" --durability none
N1=$ADDR
start_server node2 "$NODE" --data-dir "$WORK/d2" --durability none
N2=$ADDR
printf 'version = 1\n[group g0]\ncopies = %s\n[group g1]\ncopies = %s\n' "$N1" "$N2" > topo.ini
start_server router "$ROUTER" --topology "$WORK/topo.ini"
R=$ADDR

expect_ok "$BG" --server "$R" create users -n 400000 -p 0.01 --shards 4
expect_ok "$BG" --server "$R" export users template.bundle

seq -f 'user-%g' 1 200000 > all.txt
seq -f 'other-%g' 1 50000 > probe.txt
split -n l/4 -d all.txt split-
[ "$(ls split-* | wc -l)" -eq 4 ] || fail "split: $(ls)"

# One worker per split, in parallel, any order.
ls split-* | xargs -P 4 -I{} "$BG" build part-{}.bundle --like template.bundle {} \
    2>build.log || fail "parallel build: $(cat build.log)"
[ "$(ls part-split-*.bundle | wc -l)" -eq 4 ] || fail "partials: $(ls)"

# The reduce step, in an arbitrary tree: (0+3) then (+1, +2).
expect_ok "$BG" merge left.bundle part-split-00.bundle part-split-03.bundle
expect_ok "$BG" merge global.bundle left.bundle part-split-01.bundle part-split-02.bundle

# The reference: one filter built from the whole input.
expect_ok "$BG" build whole.bundle --like template.bundle all.txt
run "$BG" query global.bundle < all.txt
[ "$rc" -eq 0 ] || fail "merged bundle misses keys (exit $rc)"
run "$BG" query global.bundle < probe.txt
cp out.txt merged-probe.txt
run "$BG" query whole.bundle < probe.txt
cmp -s out.txt merged-probe.txt || fail "merged and whole-input answers differ"

# A partial of another filter (other secret) is refused naming the field.
expect_ok "$BG" --server "$R" create other -n 400000 -p 0.01 --shards 4
expect_ok "$BG" --server "$R" export other other-template.bundle
expect_ok "$BG" build other.bundle --like other-template.bundle split-00
expect_err 2 'different secret' "$BG" merge bad.bundle global.bundle other.bundle
[ ! -e bad.bundle ] || fail "a refused merge wrote its output"
expect_err 2 'FAILED_PRECONDITION.*secret' "$BG" --server "$R" import users other.bundle

# Import the result; the live filter answers as the whole-input filter.
expect_ok "$BG" --server "$R" import users global.bundle
run "$BG" --server "$R" check users --count < all.txt
[ "$(cat out.txt)" = "$(printf 'maybe 200000\nno 0')" ] || fail "imported: $(cat out.txt)"
run "$BG" --server "$R" check users < probe.txt
cmp -s out.txt merged-probe.txt || fail "live filter answers differ from the whole-input filter"
all_alive
echo ok
