#!/usr/bin/env bash
# Router benchmark: the node load generator (bench/loadgen) run in one go
# against a loopback cluster through bloomgrid-router (3 nodes, 1 router,
# filters of 64 shards) and straight against one stand-alone node, with the
# same options; prints both tables side by side (keys/s and latency).
#
# usage: bench/router_bench.sh [BUILD_DIR] [loadgen options...]
#   default loadgen options: --no-redis --duration 3 --threads 4 --batch 10000
# Environment: BLOOMGRID_DURABILITY (fsync|none, default fsync),
#              BLOOMGRID_BENCH_PORT (first port, default 7800).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
[ $# -gt 0 ] && shift
OPTS=("$@")
[ ${#OPTS[@]} -eq 0 ] && OPTS=(--duration 3 --threads 4 --batch 10000)
DUR=${BLOOMGRID_DURABILITY:-fsync}
PORT=${BLOOMGRID_BENCH_PORT:-7800}
LOADGEN=$BUILD/bench/loadgen
NODE_BIN=$BUILD/node/bloomgrid-node
[ -x "$LOADGEN" ] || { echo "router_bench: $LOADGEN not built" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/bloomgrid-router-bench.XXXXXX")
export BLOOMGRID_STATE=$TMP/cluster BLOOMGRID_BUILD=$BUILD BLOOMGRID_PORT=$PORT \
  BLOOMGRID_NODES=3 BLOOMGRID_ROUTERS=1 BLOOMGRID_DURABILITY=$DUR
solo_pid=
cleanup() {
  ./deploy/local/stop.sh >/dev/null 2>&1 || true
  if [ -n "$solo_pid" ]; then kill -TERM "$solo_pid" 2>/dev/null; wait "$solo_pid" 2>/dev/null || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

./deploy/local/start.sh >/dev/null
router=127.0.0.1:$((PORT + 101))
solo=127.0.0.1:$((PORT + 200))
mkdir -p "$TMP/solo"
"$NODE_BIN" --listen "$solo" --data-dir "$TMP/solo" --durability "$DUR" \
  --log-level warn >/dev/null 2>"$TMP/solo.log" &
solo_pid=$!

echo "router bench: $(nproc) cores, everything on this machine; durability $DUR; loadgen ${OPTS[*]}"
"$LOADGEN" --no-redis --node "$router" "${OPTS[@]}" > "$TMP/router.txt"
"$LOADGEN" --no-redis --node "$solo" "${OPTS[@]}" > "$TMP/direct.txt"

echo
echo "| workload | client threads | keys/call | direct keys/s | router keys/s | direct p50 µs | router p50 µs | direct p99 µs | router p99 µs | router/direct p50 |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
# Columns are found by their header names, so loadgen may add columns.
awk -F'|' '
  function trim(x) { gsub(/^ +| +$/, "", x); return x }
  FNR == 1 { file++ }
  $2 ~ /system/ { for (i = 2; i < NF; i++) col[trim($i)] = i; next }
  $2 ~ /node/ {
    w = trim($col["workload"]); th = ("threads" in col) ? trim($col["threads"]) : "-"
    id = w SUBSEP th
    kc[id] = trim($col["keys/call"])
    if (file == 1) { rk[id] = $col["keys/s"]; r50[id] = $col["p50 µs"]; r99[id] = $col["p99 µs"]; order[++n] = id; name[id] = w; thr[id] = th }
    else           { dk[id] = $col["keys/s"]; d50[id] = $col["p50 µs"]; d99[id] = $col["p99 µs"] }
  }
  END {
    for (i = 1; i <= n; i++) {
      id = order[i]
      printf "| %s | %s | %s | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", name[id], thr[id],
             kc[id], dk[id], rk[id], d50[id], r50[id], d99[id], r99[id], d50[id] ? r50[id] / d50[id] : 0
    }
  }' "$TMP/router.txt" "$TMP/direct.txt"
