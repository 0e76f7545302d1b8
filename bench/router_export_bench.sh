#!/usr/bin/env bash
# A router's Export of a sharded filter: the router's peak memory and the
# Export's time, for two routers side by side in front of the same nodes
# (e.g. this build's and another release's), alternating round by round.
#
# NODES nodes (one group each, durability none) hold a filter of SIZE_MB
# MiB of bits in SHARDS shards with KEYS keys added; each round runs
# `bloomgrid export` (this build's CLI) through router A, then router B,
# resetting the router's VmHWM (/proc/PID/clear_refs) before each and
# reading it after.  Printed per Export: seconds (the whole command, its
# read-back verification included), the router's VmRSS before and VmHWM
# during, in MiB; then the medians and whether every file was the same
# bytes (cmp).  The routers run with max_memory_mb = ROUTER_MB (a router
# that assembles the bundle before sending it counts its buffer's room,
# which doubles as it grows: 512 MiB for a 256 MiB filter).
#
# usage: bench/router_export_bench.sh [BUILD_DIR] [ROUTER_B_BIN]
#   BUILD_DIR     default build (its node, CLI and router A)
#   ROUTER_B_BIN  default: router A again
# Environment: SIZE_MB (256), SHARDS (16), KEYS (1000000), ROUNDS (5),
#              NODES (3), ROUTER_MB (1024), COPIES (1).  Needs about 2 x
#              SIZE_MB of memory for the nodes and a router that holds the
#              bundle, and 2 x SIZE_MB of disk under TMPDIR.
#   COPIES > 1: the NODES nodes form groups of COPIES copies (durability
#              fsync, each node reading the topology) with read_quorum =
#              write_quorum = COPIES / 2 + 1, so each shard is exported from
#              R copies and ORed; memory and disk: COPIES x SIZE_MB for
#              the nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
SIZE_MB=${SIZE_MB:-256}
SHARDS=${SHARDS:-16}
KEYS=${KEYS:-1000000}
ROUNDS=${ROUNDS:-5}
NODES=${NODES:-3}
ROUTER_MB=${ROUTER_MB:-1024}
COPIES=${COPIES:-1}
BG=$BUILD/cli/bloomgrid
NODE=$BUILD/node/bloomgrid-node
RA=$BUILD/router/bloomgrid-router
RB=$(realpath "${2:-$RA}")
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bloomgrid-export-bench.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT
start() {   # TAG BIN ARGS...: sets ADDR and PID
  local tag=$1; shift
  "$@" --listen 127.0.0.1:0 >"$TMP/$tag.out" 2>"$TMP/$tag.log" &
  PID=$!
  PIDS+=($PID)
  for _ in $(seq 200); do
    grep -q 'listening on ' "$TMP/$tag.out" 2>/dev/null && break
    sleep 0.05
  done
  ADDR=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$TMP/$tag.out")
  [ -n "$ADDR" ] || { echo "$tag did not start: $(cat "$TMP/$tag.log")" >&2; exit 1; }
}
topo="version = 1"$'\n'
if [ "$COPIES" -le 1 ]; then
  for i in $(seq 0 $((NODES - 1))); do
    start n$i "$NODE" --data-dir "$TMP/n$i" --durability none
    topo+="[group g$i]"$'\n'"copies = $ADDR"$'\n'
  done
  printf '%s' "$topo" > "$TMP/topo.ini"
else
  # Copies read the topology, which needs their ports: each node starts
  # once on a free port, which it keeps when it starts again reading it.
  Q=$((COPIES / 2 + 1))
  topo+="write_quorum = $Q"$'\n'"read_quorum = $Q"$'\n'
  ADDRS=()
  for i in $(seq 0 $((NODES - 1))); do
    start p$i "$NODE" --data-dir "$TMP/n$i"
    ADDRS+=("$ADDR")
    kill "$PID"; wait "$PID" 2>/dev/null || true
  done
  for g in $(seq 0 $((NODES / COPIES - 1))); do
    topo+="[group g$g]"$'\n'"copies ="
    for c in $(seq 0 $((COPIES - 1))); do topo+=" ${ADDRS[$((g * COPIES + c))]}"; done
    topo+=$'\n'
  done
  printf '%s' "$topo" > "$TMP/topo.ini"
  for i in $(seq 0 $((NODES - 1))); do
    "$NODE" --data-dir "$TMP/n$i" --topology "$TMP/topo.ini" \
      --listen "${ADDRS[$i]}" >"$TMP/n$i.out" 2>"$TMP/n$i.log" &
    PIDS+=($!)
  done
  for i in $(seq 0 $((NODES - 1))); do
    for _ in $(seq 400); do
      grep -q 'listening on ' "$TMP/n$i.out" 2>/dev/null && break
      sleep 0.05
    done
  done
fi
start ra "$RA" --topology "$TMP/topo.ini" --max-memory-mb "$ROUTER_MB"; A=$ADDR; PA=$PID
start rb "$RB" --topology "$TMP/topo.ini" --max-memory-mb "$ROUTER_MB"; B=$ADDR; PB=$PID
# Keys for SIZE_MB MiB of bits at 1 %: 9.585 bits a key.
CAP=$(awk -v m="$SIZE_MB" 'BEGIN { printf "%.0f", m * 1048576 * 8 / 9.585 }')
# (Copies answer once they have heard from each other: try for 30 s.)
for t in $(seq 60); do
  "$BG" --server "$A" create f -n "$CAP" -p 0.01 --shards "$SHARDS" >/dev/null 2>"$TMP/create.err" && break
  [ "$t" -lt 60 ] || { cat "$TMP/create.err" >&2; exit 1; }
  sleep 0.5
done
seq -f "k-%.0f" 1 "$KEYS" | "$BG" --server "$A" add f >/dev/null
echo "filter: capacity $CAP, $SHARDS shards, $("$BG" --server "$A" info f | sed -n 's/^bytes: *//p'), $KEYS keys; $NODES nodes, $COPIES copies a group"
echo "router A: $RA"
echo "router B: $RB"
echo "load before: $(uptime | sed 's/.*load average/load average/')"
kb() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; }
export_one() {   # TAG ADDR PID ROUND
  local f="$TMP/$1-$4.bundle"
  echo 5 > "/proc/$3/clear_refs"
  local rss=$(kb "$3" VmRSS) t0=$(date +%s.%N)
  "$BG" --server "$2" export f "$f" >/dev/null
  local t1=$(date +%s.%N)
  local hwm=$(kb "$3" VmHWM)
  printf '%s %d %.2f %.0f %.0f %d\n' "$1" "$4" "$(echo "$t1 - $t0" | bc)" \
    "$((rss / 1024))" "$((hwm / 1024))" "$(stat -c %s "$f")" | tee -a "$TMP/rows"
}
printf '%s %s %s %s %s %s\n' router round seconds rss_before_mib hwm_mib bytes
for r in $(seq 1 "$ROUNDS"); do
  export_one A "$A" "$PA" "$r"
  export_one B "$B" "$PB" "$r"
  same=yes
  cmp -s "$TMP/A-$r.bundle" "$TMP/B-$r.bundle" || same=no
  echo "round $r: A and B files identical: $same"
  rm -f "$TMP/A-$r.bundle" "$TMP/B-$r.bundle"
done
echo "load after: $(uptime | sed 's/.*load average/load average/')"
for t in A B; do
  awk -v t="$t" 'BEGIN { n = 0 } $1 == t { s[n] = $3; h[n] = $5; g[n] = $5 - $4; n++ }
    function med(a, n,   i, j, x) { for (i = 1; i < n; i++) for (j = i; j > 0 && a[j-1] > a[j]; j--) { x = a[j]; a[j] = a[j-1]; a[j-1] = x } return n % 2 ? a[int(n/2)] : (a[n/2-1] + a[n/2]) / 2 }
    END { printf "router %s: median %.2f s (%s..%s), VmHWM median %d MiB (growth over VmRSS before: median %d MiB)\n", t, med(s, n), s[0], s[n-1], med(h, n), med(g, n) }' "$TMP/rows"
done
