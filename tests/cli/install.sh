#!/bin/sh
# `cmake --install` into a staging directory (DESTDIR), then the installed
# files: every program, the systemd units naming the installed programs,
# manual pages, examples and docs; and the installed programs at work: a node
# and a router answer, the CLI builds, queries and talks to them.
# Usage: install.sh CMAKE BUILD_DIR
set -eu
CMAKE=$1
BUILD=$(realpath "$2")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"

STAGE=$WORK/stage
DESTDIR=$STAGE "$CMAKE" --install "$BUILD" >install.log 2>&1 || fail "install: $(cat install.log)"
PREFIX=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
[ -n "$PREFIX" ] || fail "no CMAKE_INSTALL_PREFIX in the cache"
ROOT=$STAGE$PREFIX

for p in bloomgrid bloomgrid-node bloomgrid-router bloomgrid-merger; do
    [ -x "$ROOT/bin/$p" ] || fail "not installed: bin/$p"
    grep -q '^\.TH ' "$ROOT/share/man/man1/$p.1" 2>/dev/null || fail "no manual page for $p"
    "$ROOT/bin/$p" --version >/dev/null || fail "installed $p --version failed"
done
for u in bloomgrid-node bloomgrid-router bloomgrid-merger; do
    f=$ROOT/lib/systemd/system/$u.service
    [ -f "$f" ] || fail "no unit $u.service"
    grep -q '@[A-Z]*@' "$f" && fail "$u.service has unsubstituted names: $(grep '@[A-Z]*@' "$f")"
    exe=$(sed -n 's/^ExecStart=\([^ ]*\).*/\1/p' "$f")
    [ "$exe" = "$PREFIX/bin/$u" ] || fail "$u.service runs '$exe', installed as $PREFIX/bin/$u"
    [ -x "$STAGE$exe" ] || fail "$u.service runs $exe, which is not installed"
    # The programs say READY=1 (tests/integ/test_notify.py): a unit of
    # another type would start its dependents too early or time out.
    grep -qx 'Type=notify' "$f" || fail "$u.service is not Type=notify"
    grep -qx 'ExecReload=/bin/kill -HUP $MAINPID' "$f" || fail "$u.service has no ExecReload"
done
for e in node.ini router.ini merger.ini merger-sources.ini topology-three-machines.ini; do
    [ -s "$ROOT/share/bloomgrid/examples/$e" ] || fail "example $e not installed"
done
for e in prometheus/alerts.yml grafana/bloomgrid.json; do
    [ -s "$ROOT/share/bloomgrid/$e" ] || fail "$e not installed"
done
for d in README.md docs/FORMAT.md docs/REPLICATION.md docs/METRICS.md docs/SECURITY.md; do
    [ -s "$ROOT/share/doc/bloomgrid/$d" ] || fail "doc $d not installed"
done
[ -e "$ROOT/etc" ] && fail "install wrote under etc/ (settings are the operator's)"

# The installed programs at work.
BG=$ROOT/bin/bloomgrid
seq 1 1000 | "$BG" build nums.bf --capacity 10000 --error-rate 0.01 >/dev/null 2>&1 ||
    fail "installed CLI cannot build a file"
run "$BG" query nums.bf 5 5000000
[ "$rc" -eq 1 ] && [ "$(cat out.txt)" = "$(printf 'maybe\t5\nno\t5000000')" ] ||
    fail "installed CLI query: exit $rc: $(cat out.txt)"

start_server node "$ROOT/bin/bloomgrid-node" --data-dir "$WORK/data"
printf 'version = 1\n[group g0]\ncopies = %s\n' "$ADDR" > topo.ini
start_server router "$ROOT/bin/bloomgrid-router" --topology "$WORK/topo.ini"
BLOOMGRID_SERVER=$ADDR
export BLOOMGRID_SERVER
expect_ok "$BG" create slugs --capacity 10000 --error-rate 0.01 --shards 2
expect_ok "$BG" add slugs alice bob
run "$BG" check slugs alice carol
[ "$rc" -eq 1 ] && [ "$(cat out.txt)" = "$(printf 'maybe\talice\nno\tcarol')" ] ||
    fail "check through the installed router: exit $rc: $(cat out.txt)"
all_alive
echo "install OK ($ROOT)"
