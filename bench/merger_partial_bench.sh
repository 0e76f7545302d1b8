#!/usr/bin/env bash
# The merger's peak memory (VmHWM, from GNU time's maximum RSS) while it
# merges a partial file of one shard, for one or more builds side by side:
# a node with one unsharded filter (CAPACITY keys at 1 %), a partial built
# with 'bloomgrid build --like' from the node's export with keys in every
# 64 KiB page, and one 'bloomgrid-merger --once' round that merges the
# partial and pushes it to the node.  A merger that loads the partial whole
# holds it beside the shard's snapshot (two shards); one that reads it a
# piece at a time holds the snapshot and a 1 MiB piece.  Builds alternate,
# ROUNDS times each; the medians are printed with the range.
#
# usage: bench/merger_partial_bench.sh BUILD_DIR [BUILD_DIR...]
# Environment: CAPACITY (default 100000000: 120 MB of bits), ROUNDS
#              (default 3).  Needs about 4 x the filter's bytes of RAM
#              (node, merger, the build of the partial) and 3 x of disk.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,16p "$0"; exit 2; }
case "$1" in -h|--help) sed -n 2,16p "$0"; exit 0 ;; esac
CAP=${CAPACITY:-100000000}
ROUNDS=${ROUNDS:-3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/bloomgrid-partial-bench.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

run() {   # BUILD TAG: prints "peak_kib bytes_pushed"
  local b=$1 d=$TMP/$2
  mkdir -p "$d"
  "$b/node/bloomgrid-node" --data-dir "$d/node" --durability none \
    --listen 127.0.0.1:0 >"$d/node.out" 2>"$d/node.log" &
  local npid=$!
  PIDS+=($npid)
  for _ in $(seq 200); do grep -q 'listening on ' "$d/node.out" && break; sleep 0.05; done
  local addr
  addr=$(sed -n 's/.*listening on //p' "$d/node.out")
  "$b/cli/bloomgrid" --server "$addr" create f -n "$CAP" -p 0.01 >/dev/null
  "$b/cli/bloomgrid" --server "$addr" export f "$d/tmpl.bf" >/dev/null 2>&1
  local bytes pages
  bytes=$(stat -c %s "$d/tmpl.bf")
  pages=$((bytes / 65536 + 1))
  seq -f "p-%.0f" 1 $((pages * 40)) |
    "$b/cli/bloomgrid" build "$d/part.bf" --like "$d/tmpl.bf" - 2>/dev/null
  rm -f "$d/tmpl.bf"
  printf '[filter f]\ndatacenter = a %s\npartial = %s\n' "$addr" "$d/part.bf" > "$d/sources.ini"
  printf '[merger]\nlisten = 127.0.0.1:0\nstate_dir = %s\nsources = %s\nworkers = 1\n' "$d/state" "$d/sources.ini" > "$d/merger.ini"
  local out
  out=$(/usr/bin/time -o "$d/peak" -f 'peak %M' "$b/merger/bloomgrid-merger" \
          --config "$d/merger.ini" --once 2>>"$d/merger.log" | head -1)
  out="$out $(cat "$d/peak")"
  kill "$npid"; wait "$npid" 2>/dev/null || true
  local peak pushed
  peak=$(sed -n 's/.*peak \([0-9]*\).*/\1/p' <<<"$out")
  pushed=$(sed -n 's/.*bytes_pushed \([0-9]*\).*/\1/p' <<<"$out")
  rm -rf "$d"
  echo "$peak ${pushed:-?} $bytes"
}

declare -A PEAKS
for r in $(seq "$ROUNDS"); do
  i=0
  for b in "$@"; do
    res=$(run "$(realpath "$b")" "r$r-$i")
    read -r peak pushed bytes <<<"$res"
    echo "round $r build $b: merger VmHWM $((peak / 1024)) MiB, pushed $pushed bytes, shard $bytes bytes" >&2
    PEAKS[$i]="${PEAKS[$i]:-} $peak"
    SHARD=$bytes
    i=$((i + 1))
  done
done
echo "partial of one shard of $SHARD bytes ($((SHARD / 1048576)) MiB), workers 1, $ROUNDS rounds; load: $(cut -d' ' -f1-3 /proc/loadavg)"
i=0
for b in "$@"; do
  sort -n <<<"$(tr ' ' '\n' <<<"${PEAKS[$i]}" | sed '/^$/d')" |
    awk -v b="$b" -v s="$SHARD" '{ v[NR] = $1 } END {
      m = v[int((NR + 1) / 2)];
      printf "%-40s VmHWM median %d MiB (%d-%d), %.2f shards\n", b, m / 1024, v[1] / 1024, v[NR] / 1024, m * 1024 / s }'
  i=$((i + 1))
done
