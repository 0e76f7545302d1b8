#!/bin/bash
# restart_bench.sh: a node's restart on a saved data directory, timed until
# it answers, for one or more builds in turn (side by side on the same
# data), --rounds times.
#
#   bench/restart_bench.sh --data DIR [--rounds N] [--filter NAME]
#                          [--work DIR] BUILD [BUILD...]
#
# DIR is a data directory as a kill -9 left it (bench/ckpt_bench.sh
# --restart --save DIR).  Each run copies DIR to a fresh directory (which
# also leaves its files in the page cache: warm), starts BUILD/node/
# bloomgrid-node on it (durability fsync, ports 0), and queries the filter
# (default "bench") with BUILD/bench/bloombench until it answers.  One line
# per run:
#   RESTART build=B seconds=S node_cpu_seconds=C user=U sys=Y vmhwm_kb=H
#           load=L1 L5 L15
# where C is the node's user + system CPU to then and H its peak resident
# memory (VmHWM); then the medians per build with their range.  The copies
# go under --work (default $TMPDIR) and are removed after each run.
# Bounded: one node at a time, one copy of DIR on disk.
set -euo pipefail

DATA= ROUNDS=3 FILTER=bench WORK=${TMPDIR:-/tmp}
BUILDS=()
while [ $# -gt 0 ]; do
  case $1 in
    --data) DATA=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --filter) FILTER=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "restart_bench: unknown option $1" >&2; exit 2 ;;
    *) BUILDS+=("$1"); shift ;;
  esac
done
[ -d "$DATA" ] || { echo "restart_bench: --data DIR (a saved data directory) is required" >&2; exit 2; }
[ ${#BUILDS[@]} -gt 0 ] || { echo "restart_bench: name at least one build directory" >&2; exit 2; }
for b in "${BUILDS[@]}"; do
  for f in "$b/node/bloomgrid-node" "$b/bench/bloombench"; do
    [ -x "$f" ] || { echo "restart_bench: $f is missing (build first)" >&2; exit 2; }
  done
done
W=$(mktemp -d "$WORK/restart-bench.XXXXXX")
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT
OUT=$W/results

run() {  # build
  local b=$1 t0 t1 addr=
  rm -rf "$W/data"
  cp -a "$DATA" "$W/data"
  rm -f "$W/stdout" "$W/log"
  t0=$(date +%s.%N)
  "$b/node/bloomgrid-node" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 \
    --data-dir "$W/data" --durability fsync --log-level warn \
    >"$W/stdout" 2>"$W/log" </dev/null &
  PID=$!
  while [ -z "$addr" ]; do
    addr=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$W/stdout" | head -n 1)
    if ! kill -0 "$PID" 2>/dev/null; then
      echo "restart_bench: the node of $b exited:" >&2; tail -n 5 "$W/log" >&2; exit 1
    fi
    sleep 0.01
  done
  until "$b/bench/bloombench" --target "$addr" --filter "$FILTER" --op query --batch 1 \
      --max-keys 1 --duration 0.01 >/dev/null 2>&1; do
    sleep 0.01
  done
  t1=$(date +%s.%N)
  local hz; hz=$(getconf CLK_TCK)
  local cpu; cpu=$(awk -v hz="$hz" '{ printf "%.2f %.2f", $14 / hz, $15 / hz }' "/proc/$PID/stat")
  local hwm; hwm=$(awk '$1 == "VmHWM:" { print $2 }' "/proc/$PID/status")
  kill -9 "$PID"; wait "$PID" 2>/dev/null || true
  PID=
  read -r u s <<<"$cpu"
  awk -v b="$b" -v a="$t0" -v z="$t1" -v u="$u" -v s="$s" -v h="$hwm" \
    -v l="$(cut -d' ' -f1-3 /proc/loadavg)" 'BEGIN {
    printf "RESTART build=%s seconds=%.2f node_cpu_seconds=%.2f user=%s sys=%s vmhwm_kb=%d load=%s\n",
      b, z - a, u + s, u, s, h, l }' | tee -a "$OUT"
  rm -rf "$W/data"
}

echo "# data=$DATA ($(du -sh "$DATA" | cut -f1)) rounds=$ROUNDS builds=${BUILDS[*]} (page cache warm: each run's copy was just written)"
for r in $(seq 1 "$ROUNDS"); do
  for b in "${BUILDS[@]}"; do run "$b"; done
done
for b in "${BUILDS[@]}"; do
  grep -F "build=$b " "$OUT" | awk -v b="$b" '
    function med(v, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
      return n % 2 ? v[(n+1)/2] : (v[n/2] + v[n/2+1]) / 2 }
    { for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "seconds") s[NR] = kv[2]; if (kv[1] == "node_cpu_seconds") c[NR] = kv[2] }
      smin = NR == 1 || s[NR] < smin ? s[NR] : smin; smax = s[NR] > smax ? s[NR] : smax
      cmin = NR == 1 || c[NR] < cmin ? c[NR] : cmin; cmax = c[NR] > cmax ? c[NR] : cmax }
    END { printf "MEDIAN build=%s seconds=%.2f (%.2f-%.2f) node_cpu_seconds=%.2f (%.2f-%.2f) runs=%d\n", b, med(s, NR), smin, smax, med(c, NR), cmin, cmax, NR }'
done
