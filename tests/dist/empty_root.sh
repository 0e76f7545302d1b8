#!/bin/sh
# The relocatable tarball (make dist, deploy/dist/) in a root that holds
# nothing but that tarball, unpacked as Hadoop and Spark unpack an archive
# (WORKDIR/bg/): no /lib, no /usr, no /bin/sh, no /proc, no /etc.  chroot
# into it and run the programs: --version of each (from an absolute path, a
# relative one, a symlink, a moved tree); build from a file and from stdin,
# inspect, query, merge of two partials built --like a template, and the
# errors of a corrupt file and a foreign partial; a node run from the
# tarball on loopback and the CLI talking to it; a name resolved once the
# root has an /etc/hosts.  Skips (exit 77) when not root or when chroot is
# refused.
# usage: empty_root.sh BUILD DISTDIR   (DISTDIR: where make-dist.sh put it)
set -eu
BUILD=$(realpath "$1")
DIST=$(realpath "$2")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"
TAB=$(printf '\t')

skip() {
    echo "SKIP: $*"
    exit 77
}
[ "$(id -u)" -eq 0 ] || skip "chroot needs root (running as uid $(id -u))"
mkdir probe
set +e
chroot probe /nothing 2>probe.err
rc=$?
set -e
# 127: chroot worked and found no /nothing; 125: chroot itself failed.
[ "$rc" -eq 127 ] || skip "chroot is refused here (exit $rc: $(cat probe.err))"

# ---- the tarball ------------------------------------------------------------
set -- "$DIST"/bloomgrid-*.tar.gz
[ $# -eq 1 ] && [ -f "$1" ] || fail "wanted one tarball in $DIST, found: $*"
TB=$1
host_version=$("$BUILD/cli/bloomgrid" --version)
want=$(printf '%s\n' "$host_version" | sed -n '1s/^bloomgrid \([^ ]*\) (\([^)]*\)).*/\1-\2/p')
[ -n "$want" ] || want=$(printf '%s\n' "$host_version" | sed -n '1s/^bloomgrid \([^ ]*\).*/\1/p')
[ "$TB" = "$DIST/bloomgrid-$want-linux-$(uname -m).tar.gz" ] ||
    fail "tarball $TB, wanted bloomgrid-$want-linux-$(uname -m).tar.gz"
tar -tzvf "$TB" > list.txt
tar -tzf "$TB" > names.txt
grep -q '^/' names.txt && fail "absolute names in the tarball: $(grep '^/' names.txt)"
grep -q -- '-> /' list.txt && fail "absolute symlinks in the tarball: $(grep -- '-> /' list.txt)"
for p in bloomgrid bloomgrid-node bloomgrid-router bloomgrid-merger; do
    for f in bin/$p libexec/bloomgrid/$p libexec/bloomgrid/loader/$p; do
        grep -qx "$f" names.txt || fail "$f is not in the tarball"
    done
done
for f in share/doc/bloomgrid/NOTICE share/bloomgrid/batch/reduce.sh \
         share/bloomgrid/batch/hadoop-map.sh share/bloomgrid/batch/spark_partials.py; do
    grep -qx "$f" names.txt || fail "$f is not in the tarball"
done
grep -Eq '^lib/ld-linux[^/]*\.so\.[0-9]+$' names.txt || fail "no dynamic loader in lib/"

# ---- an empty root, and the tarball in it -----------------------------------
ROOT=$WORK/root
mkdir "$ROOT"
mkdir -p "$ROOT/work/bg"
tar -C "$ROOT/work/bg" -xzf "$TB"
[ "$(ls -A "$ROOT")" = work ] || fail "the root holds more than work/: $(ls -A "$ROOT")"
[ "$(ls -A "$ROOT/work")" = bg ] || fail "work/ holds more than bg/"
BG=/work/bg/bin/bloomgrid
in_root() { chroot "$ROOT" "$@"; }

# The programs carry no RPATH (to the build tree or anywhere); every bundled
# library is accounted for in NOTICE with its Debian package.
for p in "$ROOT"/work/bg/libexec/bloomgrid/bloomgrid*; do
    readelf -d "$p" | grep -Eq '\((RPATH|RUNPATH)\)' && fail "$p has an RPATH or RUNPATH"
done
NOTICE=$ROOT/work/bg/share/doc/bloomgrid/NOTICE
for l in "$ROOT"/work/bg/lib/*; do
    pkg=$(awk -v f="lib/$(basename "$l")" '$1 == f && $3 ~ /^[0-9]/ { sub(/:.*/, "", $2); print $2 }' \
        "$NOTICE")
    [ -n "$pkg" ] || fail "$(basename "$l") has no Debian package and version in NOTICE"
    [ -s "$ROOT/work/bg/share/doc/bloomgrid/licenses/$pkg" ] || fail "no copyright file of $pkg"
done

# ---- --version, wherever it is run from -------------------------------------
for p in cli/bloomgrid node/bloomgrid-node router/bloomgrid-router merger/bloomgrid-merger; do
    expect_ok in_root /work/bg/bin/"${p#*/}" --version
    [ "$(cat out.txt)" = "$("$BUILD/$p" --version)" ] ||
        fail "${p#*/} --version in the root: $(cat out.txt) $(cat err.txt)"
done
expect_ok in_root work/bg/bin/bloomgrid --version
[ "$(cat out.txt)" = "$host_version" ] || fail "relative path: $(cat out.txt)"
ln -s bg/bin/bloomgrid "$ROOT/work/bloomgrid-link"
expect_ok in_root /work/bloomgrid-link --version
[ "$(cat out.txt)" = "$host_version" ] || fail "through a symlink: $(cat out.txt)"
rm "$ROOT/work/bloomgrid-link"
mv "$ROOT/work/bg" "$ROOT/work/moved"
expect_ok in_root /work/moved/bin/bloomgrid --version
[ "$(cat out.txt)" = "$host_version" ] || fail "moved tree: $(cat out.txt)"
mv "$ROOT/work/moved" "$ROOT/work/bg"

# ---- offline: build, inspect, query, merge ----------------------------------
seq 1 300 | sed 's/^/a-/' > "$ROOT/work/keys-1.txt"
seq 1 200 | sed 's/^/b-/' > "$WORK/keys-2.txt"

# json FILE FIELD: the first "FIELD": value of inspect --json's answer.
json() {
    expect_ok in_root "$BG" inspect "$1" --json
    sed -n "s/.*\"$2\": \"*\([0-9a-f.]*\)\"*,*\$/\1/p" out.txt | head -1
}

expect_ok in_root "$BG" build /work/template.bf --capacity 10000 --error-rate 0.01 </dev/null
run in_root "$BG" query /work/template.bf alice
[ "$rc" -eq 1 ] && [ "$(cat out.txt)" = "no${TAB}alice" ] ||
    fail "query of the empty template: exit $rc: $(cat out.txt) $(cat err.txt)"
fp=$(json /work/template.bf fingerprint)
[ -n "$fp" ] || fail "no fingerprint in: $(cat out.txt)"

expect_ok in_root "$BG" build /work/p1.bf --like /work/template.bf /work/keys-1.txt
expect_ok in_root "$BG" build /work/p2.bf --like /work/template.bf - <keys-2.txt
[ "$(json /work/p1.bf inserts)" = 300 ] || fail "p1 inserts: $(cat out.txt)"
[ "$(json /work/p2.bf inserts)" = 200 ] || fail "p2 inserts: $(cat out.txt)"
[ "$(json /work/p2.bf fingerprint)" = "$fp" ] || fail "p2 is not a partial of the template"
expect_ok in_root "$BG" inspect /work/p1.bf
grep -q '^checksum: *ok$' out.txt || fail "inspect p1: $(cat out.txt)"

expect_ok in_root "$BG" merge /work/all.bf /work/p1.bf /work/p2.bf
[ "$(json /work/all.bf inserts)" = 500 ] || fail "merged inserts: $(cat out.txt)"
[ "$(json /work/all.bf fingerprint)" = "$fp" ] || fail "merged fingerprint: $(cat out.txt)"
cat "$ROOT/work/keys-1.txt" keys-2.txt > every.txt
expect_ok in_root "$BG" query /work/all.bf --count <every.txt
[ "$(cat out.txt)" = "$(printf 'maybe 500\nno 0')" ] || fail "query --count: $(cat out.txt)"
expect_ok in_root "$BG" query /work/all.bf a-1 b-200
[ "$(cat out.txt)" = "$(printf 'maybe\ta-1\nmaybe\tb-200')" ] || fail "query: $(cat out.txt)"

# Errors still read as errors (the messages need no locale or gconv data).
cp "$ROOT/work/p1.bf" "$ROOT/work/bad.bf"
flip_byte "$ROOT/work/bad.bf" 200
expect_err 2 'bad\.bf' in_root "$BG" inspect /work/bad.bf
expect_ok in_root "$BG" build /work/other.bf -n 10000 -p 0.01 /work/keys-1.txt
expect_err 2 'secret' in_root "$BG" merge /work/mixed.bf /work/p1.bf /work/other.bf
[ ! -e "$ROOT/work/mixed.bf" ] || fail "a refused merge wrote its output"

# ---- online: a node from the tarball, on loopback ---------------------------
start_server node chroot "$ROOT" /work/bg/bin/bloomgrid-node --data-dir /work/data \
    --max-memory-mb 64
case $ADDR in 127.0.0.1:[0-9]*) ;; *) fail "node address $ADDR" ;; esac
expect_ok in_root "$BG" --server "$ADDR" create users --capacity 10000 --error-rate 0.01
expect_ok in_root "$BG" --server "$ADDR" add users <keys-2.txt
run in_root "$BG" --server "$ADDR" check users b-1 b-200 zz-absent
[ "$rc" -eq 1 ] && [ "$(cat out.txt)" = "$(printf 'maybe\tb-1\nmaybe\tb-200\nno\tzz-absent')" ] ||
    fail "check through the node: exit $rc: $(cat out.txt) $(cat err.txt)"
expect_ok in_root "$BG" --server "$ADDR" export users /work/users.bf
expect_ok in_root "$BG" query /work/users.bf --count <keys-2.txt
[ "$(cat out.txt)" = "$(printf 'maybe 200\nno 0')" ] || fail "exported: $(cat out.txt)"

# Names: gRPC resolves them with its own resolver (c-ares), from the root's
# /etc/hosts and /etc/resolv.conf; a bare root has neither, so addresses
# are given as IPs above.  With an /etc/hosts, localhost resolves.
mkdir "$ROOT/etc"
echo "127.0.0.1 localhost" > "$ROOT/etc/hosts"
expect_ok in_root "$BG" --server "localhost:${ADDR##*:}" list
grep -q '^users ' out.txt || fail "list through localhost: $(cat out.txt)"
all_alive
echo "dist OK: $(basename "$TB") runs in an empty root"
