#!/usr/bin/env bash
# Merger benchmark on a loopback cluster: one datacenter of 2 groups behind a
# router that writes to one node of each ("p"), while the merger's topology
# lists a second copy of each ("r") that only the merger fills, a filter of
# 8 shards, and bloomgrid-merger rounds (--once):
#   1. bytes shipped per round as a function of the keys added since the
#      previous round (pulled from the primaries, pushed to the replicas and
#      primaries), beside the filter's size, and how many keys came as their
#      16-byte hashes instead of pages, pulled and pushed ("-": a merger
#      that does not report them);
#   2. replica lag under a steady add load: the merger daemon with a round
#      every second while keys are added continuously; the lag of the
#      replicas as each round reports it (age of the data they hold).
#
# usage: bench/merger_bench.sh [BUILD_DIR] [CAPACITY (default 20000000)]
# Environment: BLOOMGRID_DURABILITY (fsync|none, default fsync),
#              LAG_SECONDS (default 15), LAG_RATE (keys per 0.1 s, default 5000),
#              STEPS (keys added before each round, default
#              "0 10 100 1000 10000 100000 1000000")
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
CAP=${2:-20000000}
DUR=${BLOOMGRID_DURABILITY:-fsync}
LAG_SECONDS=${LAG_SECONDS:-15}
LAG_RATE=${LAG_RATE:-5000}
STEPS=${STEPS:-0 10 100 1000 10000 100000 1000000}
BG=$BUILD/cli/bloomgrid
NODE=$BUILD/node/bloomgrid-node
ROUTER=$BUILD/router/bloomgrid-router
MERGER=$BUILD/merger/bloomgrid-merger
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bloomgrid-merger-bench.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

start() {   # TAG BIN ARGS...: sets ADDR
  local tag=$1; shift
  "$@" --listen 127.0.0.1:0 >"$TMP/$tag.out" 2>"$TMP/$tag.log" &
  PIDS+=($!)
  for _ in $(seq 200); do
    grep -q 'listening on ' "$TMP/$tag.out" && break
    sleep 0.05
  done
  ADDR=$(sed -n 's/.*listening on //p' "$TMP/$tag.out")
  [ -n "$ADDR" ] || { echo "$tag did not start: $(cat "$TMP/$tag.log")" >&2; exit 1; }
}

for g in 0 1; do
  start p$g "$NODE" --data-dir "$TMP/p$g" --durability "$DUR"; P[$g]=$ADDR
  start r$g "$NODE" --data-dir "$TMP/r$g" --durability "$DUR"; R[$g]=$ADDR
done
printf 'version = 1\n[group g0]\ncopies = %s\n[group g1]\ncopies = %s\n' \
  "${P[0]}" "${P[1]}" > "$TMP/topo.ini"
printf 'version = 1\n[group g0]\ncopies = %s %s\n[group g1]\ncopies = %s %s\n' \
  "${P[0]}" "${R[0]}" "${P[1]}" "${R[1]}" > "$TMP/topo-merger.ini"
start router "$ROUTER" --topology "$TMP/topo.ini"; RT=$ADDR
"$BG" --server "$RT" create f -n "$CAP" -p 0.01 --shards 8 >/dev/null
printf '[filter f]\ndatacenter = dc1 %s\n' "$TMP/topo-merger.ini" > "$TMP/sources.ini"
printf '[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s\nsources = %s\ninterval_s = 1\n' \
  "$TMP/state" "$TMP/sources.ini" > "$TMP/merger.ini"
once() { "$MERGER" --config "$TMP/merger.ini" --once 2>>"$TMP/merger.log" | head -1; }
once >/dev/null   # creates the replicas' shards
BYTES=$("$BG" --server "$RT" info f | sed -n 's/^bytes: *//p' | awk '{print $1}')

echo "filter: capacity $CAP, 8 shards, $BYTES bytes of bits, durability $DUR"
echo
printf '%12s %14s %14s %10s %12s %12s %12s\n' "keys added" "bytes pulled" "bytes pushed" "pages" "% of filter" "keys pulled" "keys pushed"
next=1
for k in $STEPS; do
  if [ "$k" -gt 0 ]; then
    seq -f "k-%.0f" "$next" $((next + k - 1)) | "$BG" --server "$RT" add f >/dev/null
    next=$((next + k))
  fi
  line=$(once)
  pulled=$(sed -n 's/.*bytes_pulled \([0-9]*\).*/\1/p' <<<"$line")
  pushed=$(sed -n 's/.*bytes_pushed \([0-9]*\).*/\1/p' <<<"$line")
  pages=$(sed -n 's/.*pages_changed \([0-9]*\).*/\1/p' <<<"$line")
  keys=$(sed -n 's/.*keys_pulled \([0-9]*\).*/\1/p' <<<"$line")
  kpush=$(sed -n 's/.*keys_pushed \([0-9]*\).*/\1/p' <<<"$line")
  pct=$(awk -v p="$pulled" -v b="$BYTES" 'BEGIN { if (b > 0) printf "%.2f", 100 * p / b; else print "?" }')
  printf '%12s %14s %14s %10s %12s %12s %12s\n' "$k" "$pulled" "$pushed" "$pages" "$pct" "${keys:--}" "${kpush:--}"
done

echo
echo "replica lag: a round every 1 s while $((LAG_RATE * 10)) keys/s are added for ${LAG_SECONDS} s"
start merger "$MERGER" --config "$TMP/merger.ini"
end=$((SECONDS + LAG_SECONDS))
while [ $SECONDS -lt $end ]; do
  seq -f "lag-$next-%.0f" 1 "$LAG_RATE" | "$BG" --server "$RT" add f >/dev/null
  next=$((next + 1))
  sleep 0.1
done
sleep 2
grep -o 'round [0-9]*: [0-9]* ms.*replica lag max [0-9]* ms' "$TMP/merger.log" | tail -n +2 |
  awk '{ gsub(":", "", $2); d=$3; l=$(NF-1); n++; sd+=d; sl+=l; if (l>ml) ml=l; if (d>md) md=d }
       END { if (n) printf "rounds %d: duration mean %.0f ms (max %d); replica lag mean %.0f ms, max %d ms\n", n, sd/n, md, sl/n, ml }'
