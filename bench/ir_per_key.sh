#!/usr/bin/env bash
# ir_per_key: instructions a server spends per key, counted by valgrind's
# callgrind, for one or more builds side by side.  CPU time per key on a
# shared machine moves by 20 % and more from run to run; an instruction
# count of the same work moves by well under 1 %, so a change that should
# cost nothing (moving code between files and libraries) can be checked to
# within a few percent.
#
# For each build: a node (durability none) under callgrind, then a router
# under callgrind in front of a node of the same build run natively.  Each
# is given a filter of 10 M keys (p = 1 %) with 100 000 keys in it, then
# the workloads below, one after the other; before each the counts are
# zeroed and after it dumped (callgrind_control), so each row is the whole
# process's instructions (every thread) for that workload's keys.
#
# usage: bench/ir_per_key.sh OUT_DIR BUILD_DIR [BUILD_DIR ...]
#   OUT_DIR    the callgrind files and rows.txt (label keys ir ir_per_key)
#   BUILD_DIR  a build with node/, router/ and bench/bloombench; its parent
#              folder's name labels its rows
# About 4 minutes per build.  Needs valgrind (Debian package valgrind).
set -euo pipefail
if [ $# -lt 2 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
  [ $# -ge 2 ] || exit 2
  exit 0
fi
command -v valgrind >/dev/null || { echo "ir_per_key: valgrind is not installed" >&2; exit 2; }
OUT=$1; shift
mkdir -p "$OUT"
BB=$1/bench/bloombench
WORKLOADS=("add 1000 8 400000" "query 1000 8 400000" "add 1 32 4000" "query 1 32 4000"
           "add 100 8 100000" "query 100 8 100000")
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() {  # label pid addr op batch depth keys
  local label=$1 pid=$2 addr=$3 op=$4 b=$5 d=$6 n=$7 r f keys ir
  callgrind_control -z "$pid" >/dev/null
  r=$("$BB" --target "$addr" --filter f --op "$op" --batch "$b" --depth "$d" \
        --duration 600 --max-keys "$n" --prefill-count 100000 2>&1 | grep -E "RESULT|failed" || true)
  callgrind_control -d "$label" "$pid" >/dev/null
  sleep 1
  f=$(ls -t "$OUT"/cg.*."$pid".* | head -1)
  keys=$(sed -n 's/.*keys=\([0-9]*\).*/\1/p' <<<"$r")
  ir=$(grep -h '^summary:\|^totals:' "$f" | tail -1 | awk '{print $2}')
  if grep -q failed <<<"$r"; then echo "$label: $(grep failed <<<"$r" | head -1)" >&2; fi
  echo "$label keys=$keys ir=$ir ir_per_key=$(awk -v a="$ir" -v k="${keys:-0}" \
        'BEGIN { if (k > 0) printf "%.0f", a / k; else print "-" }')" | tee -a "$OUT/rows.txt"
}

for build in "$@"; do
  tag=$(basename "$(dirname "$(cd "$build" && pwd)")")
  for mode in node router; do
    d=$(mktemp -d "${TMPDIR:-/tmp}/ir_per_key.XXXXXX")
    np=$(port)
    native=
    if [ "$mode" = node ]; then
      valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$tag.$mode.%p" \
        "$build/node/bloomgrid-node" --listen "127.0.0.1:$np" --data-dir "$d/n" \
        --durability none --log-level warn >"$d/log" 2>&1 &
      vpid=$!; addr=127.0.0.1:$np
    else
      "$build/node/bloomgrid-node" --listen "127.0.0.1:$np" --data-dir "$d/n" \
        --durability none --log-level warn >"$d/nlog" 2>&1 &
      native=$!; PIDS+=("$native")
      printf 'version = 1\n[group g]\ncopies = 127.0.0.1:%s\n' "$np" >"$d/topo.ini"
      rp=$(port)
      valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$tag.$mode.%p" \
        "$build/router/bloomgrid-router" --listen "127.0.0.1:$rp" --topology "$d/topo.ini" \
        --log-level warn >"$d/log" 2>&1 &
      vpid=$!; addr=127.0.0.1:$rp
    fi
    PIDS+=("$vpid")
    "$BB" --target "$addr" --filter f --create --capacity 10000000 --wait 300 >/dev/null
    "$BB" --target "$addr" --filter f --prefill 100000 >/dev/null
    for wl in "${WORKLOADS[@]}"; do
      read -r op b dp n <<<"$wl"
      run "$tag.$mode.$op.b$b.d$dp" "$vpid" "$addr" "$op" "$b" "$dp" "$n"
    done
    kill "$vpid" $native 2>/dev/null || true
    wait "$vpid" $native 2>/dev/null || true
    rm -rf "$d"
  done
done
