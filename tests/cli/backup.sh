#!/bin/sh
# backup and restore (docs/BACKUP.md) between two clusters, each a router in
# front of two nodes.  Cluster A holds filters of every kind and several
# geometries with known keys; `backup` exports them all with a manifest;
# `restore` into the empty cluster B re-creates each (same geometry, same
# secret, so the fingerprints match), and every key reads "maybe" there; a
# second restore changes nothing (inserts stay, no import).  A damaged or
# missing file fails the restore before anything is created; a filter that
# exists with another secret or geometry is refused naming the field; a
# non-empty directory is refused; an export needs an admin token.  A filter
# dropped by mistake: a plain restore refuses it naming --undrop, `restore
# --undrop` brings it back with its secret and every key (through a router
# and straight to a node), needs an admin token, and is refused when the
# name was created again under another secret.
set -eu
BG=$(realpath "$1")
NODE=$(realpath "$2")
ROUTER=$(realpath "$3")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"
unset BLOOMGRID_TOKEN

# tokens: admin and write, for both clusters.
"$BG" token new --role admin --name ops --out admin.tok > tokens
"$BG" token new --role write --name app --out write.tok >> tokens

# cluster TAG: two nodes and a router (tokens at the router, the nodes on
# loopback without); sets R to the router's address.
cluster() {
    start_server "$1-n1" "$NODE" --data-dir "$WORK/$1-d1"
    a1=$ADDR
    start_server "$1-n2" "$NODE" --data-dir "$WORK/$1-d2"
    a2=$ADDR
    printf 'version = 1\n[group g0]\ncopies = %s\n[group g1]\ncopies = %s\n' "$a1" "$a2" > "$1-topo.ini"
    start_server "$1-router" "$ROUTER" --topology "$WORK/$1-topo.ini" --tokens-file "$WORK/tokens"
    R=$ADDR
}
cluster a
A=$R
cluster b
B=$R
export BLOOMGRID_SERVER=$A
adm="--token-file admin.tok"

# ---- cluster A: filters of every kind, known keys ----------------------------
# name kind capacity error-rate shards
cat > filters.txt <<'EOF'
users blocked 100000 0.01 4
urls blocked 20000 0.001 2
small classic 5000 0.05 1
counts counting 10000 0.01 1
grow scalable 1000 0.01 1
EOF
while read -r name kind n p s; do
    expect_ok "$BG" $adm create "$name" -n "$n" -p "$p" --kind "$kind" --shards "$s"
    seq -f "$name-%g" 1 3000 > "$name.keys"
    expect_ok "$BG" $adm add "$name" < "$name.keys"
done < filters.txt
# A filter with nothing in it travels too.
expect_ok "$BG" $adm create empty -n 1000 -p 0.01 --shards 3
: > empty.keys
expect_ok "$BG" $adm list --json
cp out.txt a-list.json

# ---- backup -------------------------------------------------------------------
expect_err 2 'PERMISSION_DENIED: .*Export needs role admin' \
    "$BG" --token-file write.tok backup wbak
[ ! -e wbak/manifest.ini ] || fail "a refused backup wrote a manifest"
expect_ok "$BG" $adm backup bak
[ "$(grep -c '^backup: [a-z]*: ' out.txt)" -eq 6 ] || fail "backup lines: $(cat out.txt)"
grep -q '^backup: 6 filters in bak (manifest.ini)$' out.txt || fail "backup: $(cat out.txt)"
[ "$(stat -c %a bak)" = 700 ] || fail "backup dir mode $(stat -c %a bak)"
for f in bak/*; do
    [ "$(stat -c %a "$f")" = 600 ] || fail "$f mode $(stat -c %a "$f")"
done
[ -z "$(ls bak | grep '\.tmp\.' || true)" ] || fail "temp file left: $(ls bak)"
# The manifest agrees with `inspect --json` of each file and with the
# server's list (fingerprint, inserts, kind, shards).
python3 - a-list.json bak "$BG" <<'PY' || fail "manifest does not match"
import configparser, json, subprocess, sys
lst = {f["name"]: f for f in json.load(open(sys.argv[1]))}
m = configparser.ConfigParser(interpolation=None)
m.read(sys.argv[2] + "/manifest.ini")
assert m["backup"]["format"] == "1"
secs = [s for s in m.sections() if s.startswith("filter ")]
assert sorted(s[7:] for s in secs) == sorted(lst), secs
for s in secs:
    e, f = m[s], lst[s[7:]]
    assert e["fingerprint"] == f["fingerprint"], (s, e["fingerprint"], f["fingerprint"])
    assert int(e["inserts"]) == f["inserts"] and e["kind"] == f["kind"], s
    assert int(e["shards"]) == f["shards"] and int(e["capacity"]) == f["capacity"], s
    d = json.loads(subprocess.check_output([sys.argv[3], "inspect", "--json",
                                            sys.argv[2] + "/" + e["file"]]))
    if "shard_list" in d:
        assert len(d["shard_list"]) == int(e["shards"])
        assert sum(x["inserts"] for x in d["shard_list"]) == int(e["inserts"])
    else:
        assert d["inserts"] == int(e["inserts"]) and d["kind"] == e["kind"]
PY
# A directory that is not empty is refused, and left as it was.
mkdir busy
echo keep > busy/notes.txt
expect_err 2 'busy is not empty .*--force' "$BG" $adm backup busy
[ "$(ls busy)" = notes.txt ] || fail "refused backup wrote into busy: $(ls busy)"
expect_err 2 'bak is not empty' "$BG" $adm backup bak
expect_ok "$BG" $adm backup busy --force
[ -e busy/manifest.ini ] && [ -e busy/notes.txt ] || fail "--force: $(ls busy)"

# ---- restore refused before any change -------------------------------------
# expect_fail REGEX CMD...: exit 2, each problem on a line of its own and
# the last line, matching REGEX, the verdict.
expect_fail() {
    pat=$1
    shift
    run "$@"
    [ "$rc" -eq 2 ] || fail "$* exited $rc, wanted 2; stderr: $(cat err.txt)"
    tail -n 1 err.txt | grep -Eq -- "^bloomgrid: .*$pat" ||
        fail "$*: the last stderr line does not match /$pat/: $(cat err.txt)"
}
# check_empty: cluster B has no filter.
check_empty() {
    expect_ok "$BG" --server "$B" $adm list --json
    [ "$(cat out.txt)" = "[]" ] || fail "$1: cluster B holds filters: $(cat out.txt)"
}
cp -a bak bad
flip_byte bad/urls.filter 200
expect_fail 'restore: 1 of 6 files of bad do not verify .*nothing was changed' \
    "$BG" --server "$B" $adm restore bad
grep -q '^bloomgrid: bad/urls.filter: checksum mismatch' err.txt ||
    fail "corrupt file not named: $(cat err.txt)"
check_empty "a corrupt file"
# A file replaced by another valid filter file: the manifest's digest.
rm -rf bad && cp -a bak bad && cp bak/users.filter bad/urls.filter
expect_fail 'restore: 1 of 6 files' "$BG" --server "$B" $adm restore bad
grep -q '^bloomgrid: bad/urls.filter: does not match the manifest: bytes' err.txt ||
    fail "swapped file not named: $(cat err.txt)"
check_empty "a swapped file"
rm -rf bad && cp -a bak bad && rm bad/counts.filter bad/empty.filter
expect_fail 'restore: 2 of 6 files of bad do not verify' "$BG" --server "$B" $adm restore bad
grep -q 'bad/counts.filter: cannot open' err.txt && grep -q 'bad/empty.filter: cannot open' err.txt ||
    fail "missing files not named: $(cat err.txt)"
check_empty "a missing file"
rm -rf bad && cp -a bak bad && head -c 1000 bak/grow.filter > bad/grow.filter
expect_fail 'restore: 1 of 6 files' "$BG" --server "$B" $adm restore bad
grep -q 'bad/grow.filter: ' err.txt || fail "truncated: $(cat err.txt)"
check_empty "a truncated file"
rm -rf bad && cp -a bak bad && rm bad/manifest.ini
expect_err 2 'manifest.ini: cannot open: .*not a backup' "$BG" --server "$B" $adm restore bad
check_empty "no manifest"
expect_fail 'restore: stopped at [a-z]+ .*after 0 of 6 filters' \
    "$BG" --server "$B" --token-file write.tok restore bak
grep -q 'PERMISSION_DENIED: .*CreateFilter needs role admin' err.txt ||
    fail "write token: $(cat err.txt)"
check_empty "a write token"

# A filter of B that exists with another secret, then another geometry.
expect_ok "$BG" --server "$B" $adm create users -n 100000 -p 0.01 --shards 4
expect_fail 'restore: 1 of 6 filters cannot be restored .*nothing was changed' \
    "$BG" --server "$B" $adm restore bak
grep -q '^bloomgrid: restore: users exists with another secret' err.txt ||
    fail "other secret: $(cat err.txt)"
expect_ok "$BG" --server "$B" $adm drop users
expect_ok "$BG" --server "$B" $adm create users -n 100000 -p 0.01 --shards 2
expect_fail 'nothing was changed' "$BG" --server "$B" $adm restore bak
grep -q 'users exists with another shard count (2 on the server, 4 in the backup)' err.txt ||
    fail "other shards: $(cat err.txt)"
expect_ok "$BG" --server "$B" $adm list
[ "$(grep -vc '^NAME' out.txt)" -eq 1 ] || fail "a refused restore created filters: $(cat out.txt)"
expect_ok "$BG" --server "$B" $adm drop users
check_empty "after the refusals"

# ---- restore into the empty cluster B ---------------------------------------
expect_ok "$BG" --server "$B" $adm restore bak
[ "$(grep -c ': created and imported, ' out.txt)" -eq 6 ] || fail "restore: $(cat out.txt)"
grep -q '^restore: 6 filters from bak$' out.txt || fail "restore: $(cat out.txt)"
expect_ok "$BG" --server "$B" $adm list --json
cp out.txt b-list.json
python3 - a-list.json b-list.json <<'PY' || fail "cluster B differs from cluster A"
import json, sys
a = {f["name"]: f for f in json.load(open(sys.argv[1]))}
b = {f["name"]: f for f in json.load(open(sys.argv[2]))}
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for n in a:
    for k in ("kind", "capacity", "error_rate", "shards", "m", "k", "inserts",
              "fingerprint", "layers", "bytes"):
        assert a[n][k] == b[n][k], (n, k, a[n][k], b[n][k])
    assert b[n]["state"] == "ready", n
PY
while read -r name kind n p s; do
    expect_ok "$BG" --server "$B" $adm check "$name" --count < "$name.keys"
    [ "$(cat out.txt)" = "$(printf 'maybe 3000\nno 0')" ] || fail "$name on B: $(cat out.txt)"
done < filters.txt
# The restored counting filter keeps its counters: a key removed once is gone.
expect_ok "$BG" --server "$B" $adm remove counts counts-1
run "$BG" --server "$B" $adm check counts counts-1
[ "$rc" -eq 1 ] || fail "counts-1 after one remove: exit $rc"

# A second restore changes nothing: every filter unchanged, inserts the same.
expect_ok "$BG" --server "$B" $adm list --json
cp out.txt b-before.json
expect_ok "$BG" --server "$B" $adm restore bak
[ "$(grep -c ': unchanged (it holds every key of the backup)$' out.txt)" -eq 5 ] ||
    fail "second restore: $(cat out.txt)"
# counts lost counts-1's counters above, so it takes the backup back.
grep -q '^restore: counts: imported into the existing filter' out.txt ||
    fail "second restore, counts: $(cat out.txt)"
expect_ok "$BG" --server "$B" $adm list --json
python3 - b-before.json out.txt <<'PY' || fail "a second restore changed filters"
import json, sys
a = {f["name"]: f for f in json.load(open(sys.argv[1]))}
b = {f["name"]: f for f in json.load(open(sys.argv[2]))}
for n in a:
    if n == "counts":
        continue
    for k in ("inserts", "fill", "estimated_count", "m", "fingerprint"):
        assert a[n][k] == b[n][k], (n, k, a[n][k], b[n][k])
PY
expect_ok "$BG" --server "$B" $adm restore bak
[ "$(grep -c ': unchanged ' out.txt)" -eq 6 ] || fail "third restore: $(cat out.txt)"

# Keys added to B after the restore stay; a restore into a filter that lacks
# some of the backup's keys (here: A's filter with keys B never had) adds them.
seq -f 'late-%g' 1 500 > late.keys
expect_ok "$BG" $adm add urls < late.keys
expect_ok "$BG" $adm backup bak2
expect_ok "$BG" --server "$B" $adm restore bak2
grep -q '^restore: urls: imported into the existing filter' out.txt || fail "bak2: $(cat out.txt)"
expect_ok "$BG" --server "$B" $adm check urls --count < late.keys
[ "$(cat out.txt)" = "$(printf 'maybe 500\nno 0')" ] || fail "late keys on B: $(cat out.txt)"

# ---- undoing a drop (docs/BACKUP.md, "Undoing a drop") -----------------------
# fp_of SERVER NAME: the fingerprint `list --json` shows for NAME.
fp_of() {
    expect_ok "$BG" --server "$1" $adm list --json
    python3 -c 'import json,sys; print({f["name"]: f["fingerprint"] for f in json.load(open("out.txt"))}[sys.argv[1]])' "$2"
}
users_fp=$(fp_of "$A" users)
# users dropped by mistake through the router of A.  A plain restore does
# not bring it back (the nodes' tombstones refuse its secret) and names
# --undrop; nothing is created.
expect_ok "$BG" $adm drop users
expect_fail 'restore: stopped at users \(above\) after 5 of 6 filters' "$BG" $adm restore bak
grep -q 'FAILED_PRECONDITION: .*dropped' err.txt && grep -q 'restore --undrop bak (admin)' err.txt ||
    fail "plain restore of a dropped filter: $(cat err.txt)"
run "$BG" $adm info users
[ "$rc" -eq 2 ] && grep -q NOT_FOUND err.txt || fail "a refused restore made users: $(cat out.txt err.txt)"
# A backup of users alone: an undrop needs an admin token (CreateFilter).
mkdir -m 700 bak-users
cp bak/users.filter bak-users/
python3 - bak/manifest.ini > bak-users/manifest.ini <<'PY'
import sys
keep = True
for line in open(sys.argv[1]):
    if line.startswith("[filter "):
        keep = line.strip() == "[filter users]"
    if keep:
        sys.stdout.write(line)
PY
expect_fail 'restore: stopped at users \(above\) after 0 of 1 filters' \
    "$BG" --token-file write.tok restore --undrop bak-users
grep -q 'PERMISSION_DENIED: .*CreateFilter needs role admin' err.txt ||
    fail "undrop with a write token: $(cat err.txt)"
# --undrop brings it back: its secret (the same fingerprint), every key.
expect_ok "$BG" $adm restore --undrop bak
grep -q '^restore: users: created (undropped where it was dropped) and imported, 3000 inserts now' out.txt ||
    fail "restore --undrop: $(cat out.txt)"
[ "$(grep -c ': unchanged ' out.txt)" -eq 5 ] || fail "restore --undrop, the others: $(cat out.txt)"
expect_ok "$BG" $adm check users --count < users.keys
[ "$(cat out.txt)" = "$(printf 'maybe 3000\nno 0')" ] || fail "users after the undrop: $(cat out.txt)"
[ "$(fp_of "$A" users)" = "$users_fp" ] || fail "users came back with another secret"
# It is a filter like any other: dropped again, a plain restore refuses it
# again, and --undrop brings it back again.
expect_ok "$BG" $adm drop users
expect_fail 'restore: stopped at users ' "$BG" $adm restore bak-users
expect_ok "$BG" $adm restore --undrop bak-users
expect_ok "$BG" $adm check users --count < users.keys
[ "$(cat out.txt)" = "$(printf 'maybe 3000\nno 0')" ] || fail "users after a second undrop: $(cat out.txt)"
# A name created again after the drop (another secret) is refused, and
# nothing changes; once that filter is dropped, the undrop goes through.
expect_ok "$BG" $adm drop small
expect_ok "$BG" $adm create small -n 5000 -p 0.05 --kind classic --shards 1
seq -f 'other-%g' 1 10 > other.keys
expect_ok "$BG" $adm add small < other.keys
other_fp=$(fp_of "$A" small)
expect_fail 'restore: 1 of 6 filters cannot be restored .*nothing was changed' \
    "$BG" $adm restore --undrop bak
grep -q '^bloomgrid: restore: small exists with another secret' err.txt ||
    fail "undrop over a new secret: $(cat err.txt)"
[ "$(fp_of "$A" small)" = "$other_fp" ] || fail "a refused undrop changed small"
expect_ok "$BG" $adm drop small
expect_ok "$BG" $adm restore --undrop bak
grep -q '^restore: small: created (undropped' out.txt || fail "small: $(cat out.txt)"
expect_ok "$BG" $adm check small --count < small.keys
[ "$(cat out.txt)" = "$(printf 'maybe 3000\nno 0')" ] || fail "small after the undrop: $(cat out.txt)"

# Straight to a node (no router): the same.
start_server solo "$NODE" --data-dir "$WORK/solo-d"
S=$ADDR
expect_ok "$BG" --server "$S" $adm create solo -n 10000 -p 0.01
seq -f 'solo-%g' 1 2000 > solo.keys
expect_ok "$BG" --server "$S" $adm add solo < solo.keys
solo_fp=$(fp_of "$S" solo)
expect_ok "$BG" --server "$S" $adm backup solobak
expect_ok "$BG" --server "$S" $adm drop solo
expect_fail 'restore: stopped at solo \(above\) after 0 of 1 filters' \
    "$BG" --server "$S" $adm restore solobak
grep -q 'restore --undrop solobak (admin)' err.txt || fail "node, plain restore: $(cat err.txt)"
expect_ok "$BG" --server "$S" $adm restore --undrop solobak
grep -q '^restore: solo: created (undropped' out.txt || fail "node undrop: $(cat out.txt)"
expect_ok "$BG" --server "$S" $adm check solo --count < solo.keys
[ "$(cat out.txt)" = "$(printf 'maybe 2000\nno 0')" ] || fail "solo after the undrop: $(cat out.txt)"
[ "$(fp_of "$S" solo)" = "$solo_fp" ] || fail "solo came back with another secret"

# A large filter is described a piece at a time: backup's memory stays far
# below the export's size (it held the whole export to fingerprint it).
expect_ok "$BG" --server "$S" $adm create big -n 80000000 -p 0.01
seq -f 'big-%g' 1 1000 > big.keys
expect_ok "$BG" --server "$S" $adm add big < big.keys
expect_ok "$BG" --server "$S" $adm drop solo
python3 - "$BG" "$S" bigbak <<'PY' > rss.txt || fail "backup of big: $(cat rss.txt)"
import resource, subprocess, sys
bg, server, out = sys.argv[1:]
r = subprocess.run([bg, "--server", server, "--token-file", "admin.tok",
                    "backup", out], capture_output=True, text=True)
if r.returncode != 0:
    sys.exit(r.stderr)
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
PY
size=$(stat -c %s bigbak/big.filter)
rss=$(cat rss.txt)
[ "$size" -gt 90000000 ] || fail "the export of big is only $size bytes"
# (A sanitized CLI's allocator keeps what it frees: not measured there.)
[ "${CLI_TEST_SANITIZED:-0}" = 1 ] || [ "$rss" -lt $((size * 3 / 4)) ] ||
    fail "backup held $rss bytes for a $size-byte export"
grep -q "^fingerprint = $(fp_of "$S" big)\$" bigbak/manifest.ini ||
    fail "big's manifest: $(cat bigbak/manifest.ini)"

all_alive
echo "backup: ok"
