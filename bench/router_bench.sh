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
echo "| workload | keys/call | direct keys/s | router keys/s | direct p50 µs | router p50 µs | direct p99 µs | router p99 µs | router/direct p50 |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -F'|' '
  FNR == 1 { file++ }
  $2 ~ /node/ {
    w = $3; gsub(/^ +| +$/, "", w)
    kc[w] = $4 + 0
    if (file == 1) { rk[w] = $5 + 0; r50[w] = $7 + 0; r99[w] = $8 + 0; order[++n] = w }
    else           { dk[w] = $5 + 0; d50[w] = $7 + 0; d99[w] = $8 + 0 }
  }
  END {
    for (i = 1; i <= n; i++) {
      w = order[i]
      printf "| %s | %d | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f | %.2f |\n", w, kc[w],
             dk[w], rk[w], d50[w], r50[w], d99[w], r99[w], d50[w] ? r50[w] / d50[w] : 0
    }
  }' "$TMP/router.txt" "$TMP/direct.txt"
