#!/bin/sh
# query output and exit statuses, add, build from stdin and from files.
set -eu
BG=$1
. "$CLI_TEST_LIB"
TAB=$(printf '\t')

# A tiny error rate makes a false positive among these few keys practically
# impossible, so "no" lines are deterministic enough to assert.
expect_ok "$BG" create f.bf --capacity 1000 --error-rate 1e-9
expect_ok "$BG" add f.bf alice bob "with space"

expect_ok "$BG" query f.bf alice bob "with space"
printf 'maybe\talice\nmaybe\tbob\nmaybe\twith space\n' > want.txt
cmp -s out.txt want.txt || fail "query output: $(cat out.txt)"

run "$BG" query f.bf alice carol bob
[ "$rc" -eq 1 ] || fail "query with an absent key exited $rc, wanted 1"
printf 'maybe\talice\nno\tcarol\nmaybe\tbob\n' > want.txt
cmp -s out.txt want.txt || fail "query output with absent key: $(cat out.txt)"
[ ! -s err.txt ] || fail "query printed on stderr: $(cat err.txt)"

run "$BG" query f.bf carol
[ "$rc" -eq 1 ] && [ "$(cat out.txt)" = "no${TAB}carol" ] || fail "absent only"

# --count prints only totals; statuses follow the same rule.
run "$BG" query --count f.bf alice carol dave bob
[ "$rc" -eq 1 ] || fail "--count exit $rc"
printf 'maybe 2\nno 2\n' > want.txt
cmp -s out.txt want.txt || fail "--count output: $(cat out.txt)"
expect_ok "$BG" query f.bf -c alice bob
[ "$(cat out.txt)" = "$(printf 'maybe 2\nno 0')" ] || fail "--count all present"

# Keys from stdin, CRLF line ends and a last line without a newline.
printf 'alice\r\nbob\nwith space' > in.txt
run "$BG" query f.bf < in.txt
[ "$rc" -eq 0 ] || fail "stdin query exit $rc"
printf 'maybe\talice\nmaybe\tbob\nmaybe\twith space\n' > want.txt
cmp -s out.txt want.txt || fail "stdin query output: $(cat out.txt)"

# Errors exit 2, even when some keys are absent.
run "$BG" query f.bf carol ""
[ "$rc" -eq 2 ] || fail "empty key exit $rc"

# add from stdin saves; the file changes only on success.
printf 'k1\nk2\nk3\n' | { expect_ok "$BG" add f.bf; }
expect_ok "$BG" query f.bf k1 k2 k3 alice
run "$BG" query --count f.bf k4 k5
[ "$rc" -eq 1 ] && grep -qx 'no 2' out.txt || fail "k4 k5 should be absent"
expect_ok "$BG" inspect f.bf
grep -q '^keys added: *6$' out.txt || fail "keys added: $(cat out.txt)"
grep -q '^new-bit adds: *6 ' out.txt || fail "new-bit adds: $(cat out.txt)"
# A repeated key ("a, b, a") is a key added that sets no bit: inspect
# counts it in "keys added" (keys_added) and not in the new-bit adds
# (inserts), and a merge adds both counts.
expect_ok "$BG" add f.bf alice k1 k1
expect_ok "$BG" inspect f.bf
grep -q '^keys added: *9$' out.txt && grep -q '^new-bit adds: *6 ' out.txt ||
    fail "keys added after repeats: $(cat out.txt)"
printf 'k1\nzed\nzed\n' > g.txt
expect_ok "$BG" build g.bf --like f.bf g.txt
expect_ok "$BG" merge fg.bf f.bf g.bf
expect_ok "$BG" inspect --json fg.bf
python3 -c 'import json; d = json.load(open("out.txt")); assert (d["keys_added"], d["inserts"]) == (12, 8), d' ||
    fail "merged counts: $(cat out.txt)"
# A file of format version 1 (an older bloomgrid's) records no keys added.
V1=$(dirname "$CLI_TEST_LIB")/../fixtures/legacy-node-dir/blk/snapshot-0000000000000001.bf
cp "$V1" v1.bf
expect_ok "$BG" inspect v1.bf
grep -q '^keys added: *not recorded (a file of format version 1)$' out.txt ||
    fail "version 1 keys added: $(cat out.txt)"
expect_ok "$BG" add v1.bf one-more
expect_ok "$BG" inspect --json v1.bf
python3 -c 'import json; d = json.load(open("out.txt")); assert d["keys_added"] is None and d["inserts"] > 0, d' ||
    fail "version 1 keys_added after an add: $(cat out.txt)"

# build from stdin, from files, and "-" among files.
seq 1 5000 > a.txt
seq 5001 10000 > b.txt
seq 10001 15000 > c.txt
expect_ok "$BG" build s.bf -n 20000 -p 0.001 < a.txt
expect_ok "$BG" query --count s.bf < a.txt
[ "$(head -1 out.txt)" = "maybe 5000" ] || fail "stdin build: $(cat out.txt)"
[ ! -s err.txt ] || fail "build wrote on stderr that is not a terminal: $(cat err.txt)"
cat b.txt | { expect_ok "$BG" build m.bf -n 20000 -p 0.001 a.txt - c.txt; }
seq 1 15000 | { expect_ok "$BG" query --count m.bf; }
[ "$(head -1 out.txt)" = "maybe 15000" ] || fail "file build: $(cat out.txt)"
seq 20001 30000 > absent.txt
run "$BG" query --count m.bf < absent.txt
[ "$rc" -eq 1 ] || fail "absent keys exit $rc"
no=$(sed -n 's/^no //p' out.txt)
[ "$no" -ge 9900 ] || fail "too many false positives at p=0.001: $(cat out.txt)"

# On a terminal, build shows a progress line (script(1) provides the tty).
if command -v script > /dev/null; then
    script -qec "\"$BG\" build tty.bf -n 20000 -p 0.01 a.txt" /dev/null > tty.txt
    grep -q 'keys/s.*fill.*est. FPR' tty.txt || fail "no progress line: $(cat tty.txt)"
    grep -q ' 5000 keys' tty.txt || fail "progress lacks the key count: $(cat tty.txt)"
fi

# Every kind builds, answers and inspects; inspect --json is valid JSON.
for kind in blocked classic counting scalable; do
    expect_ok "$BG" build "$kind.bf" --kind "$kind" -n 2000 -p 0.01 a.txt
    expect_ok "$BG" query --count "$kind.bf" < a.txt
    [ "$(head -1 out.txt)" = "maybe 5000" ] || fail "$kind build"
    expect_ok "$BG" inspect --json "$kind.bf"
    python3 -m json.tool out.txt > /dev/null || fail "$kind: invalid JSON"
    python3 - "$kind" out.txt <<'PY' || fail "$kind: JSON fields wrong"
import json, sys
kind, path = sys.argv[1], sys.argv[2]
d = json.load(open(path))
assert d["kind"] == kind, d["kind"]
assert d["checksum"] == "ok"
assert d["capacity"] == 2000 and d["error_rate"] == 0.01
assert len(d["fingerprint"]) == 16
assert d["layers"] == len(d["layer_list"]) >= 1
assert (d["layers"] > 1) == (kind == "scalable"), d["layers"]
assert 0 < d["fill"] < 1 and d["estimated_count"] > 0
assert "secret" not in json.dumps(d)
PY
done
expect_ok "$BG" inspect counting.bf
grep -q '^kind: *counting$' out.txt && grep -q '^checksum: *ok$' out.txt \
    || fail "inspect text: $(cat out.txt)"

# remove on a counting filter.
expect_ok "$BG" create c.bf --kind counting -n 1000 -p 1e-9
expect_ok "$BG" add c.bf x y
expect_ok "$BG" remove c.bf x
[ "$(cat out.txt)" = "removed${TAB}x" ] || fail "remove output: $(cat out.txt)"
run "$BG" query c.bf x y
[ "$rc" -eq 1 ] && grep -qx "no${TAB}x" out.txt && grep -qx "maybe${TAB}y" out.txt \
    || fail "after remove: $(cat out.txt)"
C=$(sum c.bf)
run "$BG" remove c.bf never-added
[ "$rc" -eq 1 ] && [ "$(cat out.txt)" = "no${TAB}never-added" ] || fail "remove absent"
same_file c.bf "$C"

echo "query: ok"
