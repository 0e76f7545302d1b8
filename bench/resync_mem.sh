#!/usr/bin/env bash
# Memory of a re-syncing copy, two node binaries side by side: one group of
# 3 copies (write and read quorum 2, durability fsync) holds one filter of
# SIZE_MB MiB of bits in SHARDS shards, filled by an offline build
# ('bloomgrid build --like' an export of the filter) and an Import through
# a router.  Then, ROUNDS times and alternating between NODE_A and NODE_B,
# copy 3 is killed (kill -9), its data directory removed, and it is started
# again with that binary; it re-syncs (pulls every shard in full from both
# other copies) until its health says SERVING.  About every 100 ms (less
# often on a loaded machine) its VmRSS, VmHWM, RssAnon, RssFile and its
# allocator's bytes (bloomgrid_process_malloc_held_bytes,
# bloomgrid_process_malloc_free_bytes) are sampled.  Per re-sync: the peak
# VmHWM against its filter bytes (bits) and against the target
# 1.10 x bits + 64 MiB, the allocator's free bytes at the sample of the
# highest VmRSS, and the time until SERVING.  Copies 1 and 2 and the router
# run BUILD's binaries throughout, and so does the merger (MERGER=1).
# Prints a markdown report on stdout; raw output (the samples of every
# re-sync, the nodes' logs, the report) goes to OUT.
#
# usage: bench/resync_mem.sh [--help]
# Environment (bounded defaults: about 1.3 GB of RAM at the peak of the
# fill, 3 x SIZE_MB of disk; about 10 minutes on 2 shared cores):
#   SIZE_MB   MiB of filter bits (each copy holds all of them)       [256]
#   SHARDS    shards of the filter                                    [8]
#   FILL      keys built, as a fraction of the filter's capacity      [0.25]
#   ROUNDS    re-syncs per binary                                     [3]
#   MERGER    1: the merger runs (its rounds push the re-syncing copy
#             every page it lacks, as in a cluster that runs one); 0: not [1]
#   ROUND_S   the merger's interval_s                                 [2]
#   WRITES    1: 100 keys added through the router every ~0.3 s during
#             each re-sync (the merger's rounds then push to every copy) [1]
#   BUILD     build directory (CLI, router, copies 1 and 2)           [./build]
#   NODE_A    node binary A (e.g. a copy of main's)  [BUILD/node/bloomgrid-node]
#   NODE_B    node binary B                          [BUILD/node/bloomgrid-node]
#   WORK      where data directories go                     [$TMPDIR or /tmp]
#   OUT       raw output directory   [bench/results/<commit>/resync-mem]
#   PORT      first port (nodes PORT+1..3, router PORT+11, merger PORT+12, metrics
#             PORT+21..23)                              [random 20000-50000]
# Every process it starts is killed on exit (trap); WORK's data is removed.
set -euo pipefail

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
[ $# -eq 0 ] || { echo "resync_mem.sh: no arguments (see --help); settings are environment variables" >&2; exit 2; }

cd "$(dirname "$0")/.."
ROOT=$(pwd)
SIZE_MB=${SIZE_MB:-256}
SHARDS=${SHARDS:-8}
FILL=${FILL:-0.25}
ROUNDS=${ROUNDS:-3}
MERGER=${MERGER:-1}
WRITES=${WRITES:-1}
ROUND_S=${ROUND_S:-2}
BUILD=$(realpath "${BUILD:-build}")
NODE_A=$(realpath "${NODE_A:-$BUILD/node/bloomgrid-node}")
NODE_B=$(realpath "${NODE_B:-$BUILD/node/bloomgrid-node}")
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${OUT:-$ROOT/bench/results/$COMMIT/resync-mem}
PORT=${PORT:-$((20000 + RANDOM % 30000))}
for v in SIZE_MB SHARDS ROUNDS MERGER WRITES ROUND_S PORT; do
  case ${!v} in ''|*[!0-9]*) echo "resync_mem.sh: $v must be a number" >&2; exit 2 ;; esac
done
BG=$BUILD/cli/bloomgrid NODE=$BUILD/node/bloomgrid-node ROUTER=$BUILD/router/bloomgrid-router
for b in "$BG" "$NODE" "$ROUTER" "$NODE_A" "$NODE_B"; do
  [ -x "$b" ] || { echo "resync_mem.sh: $b missing: build first" >&2; exit 1; }
done

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
WORK=$(mktemp -d "${WORK:-${TMPDIR:-/tmp}}/bloomgrid-resyncmem.XXXXXX")
mkdir -p "$OUT"
declare -A PID_OF
cleanup() {
  set +e
  [ -s "$WORK/writer.pid" ] && kill "$(cat "$WORK/writer.pid")" 2>/dev/null
  for p in "${PID_OF[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${PID_OF[@]}"; do wait "$p" 2>/dev/null; done
  mkdir -p "$OUT/logs" && cp "$WORK"/*.log "$OUT/logs/" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
node_port() { echo $((PORT + $1)); }
metrics_port() { echo $((PORT + 20 + $1)); }
for p in $(node_port 1) $(node_port 2) $(node_port 3) $((PORT + 11)) $((PORT + 12)) $(metrics_port 1) $(metrics_port 2) $(metrics_port 3); do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "resync_mem.sh: port $p is taken; choose PORT" >&2; exit 1
  fi
done

TOPO=$WORK/topology.ini
printf 'version = 1\nwrite_quorum = 2\nread_quorum = 2\n[group g1]\ncopies = 127.0.0.1:%d 127.0.0.1:%d 127.0.0.1:%d\n' \
  "$(node_port 1)" "$(node_port 2)" "$(node_port 3)" > "$TOPO"

start_node() {   # I BINARY
  local i=$1
  mkdir -p "$WORK/node$i"
  "$2" --listen "127.0.0.1:$(node_port "$i")" --data-dir "$WORK/node$i/data" \
    --durability fsync --topology "$TOPO" --max-memory-mb $((4 * SIZE_MB + 256)) \
    --metrics-listen "127.0.0.1:$(metrics_port "$i")" --threads 4 \
    >>"$WORK/node$i.log" 2>&1 </dev/null &
  PID_OF[n$i]=$!
}
health() { "$BG" health "$1" --service "$2" --quiet --deadline 1000 >/dev/null 2>&1; }
wait_health() {   # ADDR SERVICE TIMEOUT_S
  local end=$(( $(date +%s) + $3 ))
  until health "$1" "$2"; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.1
  done
}
metric() {   # PORT NAME: the sum of every series of that metric
  curl -s --max-time 2 "http://127.0.0.1:$1/metrics" | awk -v n="$2" '
    $1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.0f", s }'
}

log "work $WORK, out $OUT, ports from $PORT, ${SIZE_MB} MiB of bits in $SHARDS shards"
for i in 1 2 3; do start_node "$i" "$NODE"; done
for i in 1 2 3; do
  wait_health "127.0.0.1:$(node_port "$i")" "" 60 || { echo "node $i did not start: $(tail -5 "$WORK/node$i.log")" >&2; exit 1; }
done
R=127.0.0.1:$((PORT + 11))
"$ROUTER" --listen "$R" --topology "$TOPO" --node-timeout-ms 60000 \
  --max-memory-mb $((3 * SIZE_MB + 512)) >>"$WORK/router.log" 2>&1 </dev/null &
PID_OF[router]=$!
wait_health "$R" bloomgrid.v1.BloomGrid 60 || { echo "router not ready" >&2; exit 1; }

CAP=$(awk -v m="$SIZE_MB" 'BEGIN { printf "%.0f", m * 1048576 * 8 / 9.5851 }')
"$BG" --server "$R" --deadline 300000 create f -n "$CAP" -p 0.01 --shards "$SHARDS" >/dev/null
NFILL=$(awk -v c="$CAP" -v f="$FILL" 'BEGIN { printf "%.0f", c * f }')
"$BG" --server "$R" --deadline 3600000 export f "$WORK/template.bundle" >/dev/null
log "building $NFILL keys"
seq 1 "$NFILL" | "$BG" build "$WORK/fill.bundle" --like "$WORK/template.bundle" 2>"$WORK/build.log"
rm -f "$WORK/template.bundle"
"$BG" --server "$R" --deadline 3600000 import f "$WORK/fill.bundle" 2>"$WORK/import.log"
rm -f "$WORK/fill.bundle"
"$BG" --server "$R" info f > "$OUT/info.txt"
log "filled: $(grep -E '^(bytes|fill):' "$OUT/info.txt" | tr '\n' ' ')"
sleep 5   # the copies' anti-entropy after the Import

# The merger (one datacenter), its rounds every ROUND_S s: a round during a
# re-sync pushes the wiped copy every page it lacks (it pulls the in-sync
# copies and pushes every copy).
if [ "$MERGER" = 1 ]; then
  mkdir -p "$WORK/merger"
  printf '[filter f]\ndatacenter = dc1 %s\n' "$TOPO" > "$WORK/merger/sources.ini"
  printf '[merger]\nlisten = 127.0.0.1:%d\nstate_dir = %s\nsources = %s\ninterval_s = %d\nnode_timeout_ms = 30000\n' \
    $((PORT + 12)) "$WORK/merger/state" "$WORK/merger/sources.ini" "$ROUND_S" > "$WORK/merger/merger.ini"
  "$BUILD/merger/bloomgrid-merger" --config "$WORK/merger/merger.ini" >>"$WORK/merger.log" 2>&1 </dev/null &
  PID_OF[merger]=$!
  for _ in $(seq 1 600); do
    grep -q 'merger: round' "$WORK/merger.log" && break
    sleep 1
  done
  log "merger: first round done"
fi

# One re-sync of copy 3 with BINARY; samples into OUT/samples-TAG.txt:
# ms since start, VmRSS KiB, VmHWM KiB, RssAnon KiB, RssFile KiB, malloc
# held, malloc free (bytes).
resync() {   # TAG BINARY
  local tag=$1 bin=$2 pid t0 now ms rss hwm mp done_ms="" end_ms k=0
  # Writes during the re-sync: a few keys through the router every ~0.3 s,
  # so the merger's rounds have pages to push to every copy (its push to
  # the wiped copy before it re-created a shard meets NOT_FOUND, and the
  # merger then pushes it every page of that shard).
  if [ "$WRITES" = 1 ]; then
    ( i=0
      while :; do
        seq -f "w$tag-$i-%.0f" 1 100 | "$BG" --server "$R" add f >/dev/null 2>&1 || true
        i=$((i + 1)); sleep 0.3
      done ) &
    echo $! > "$WORK/writer.pid"
  fi
  kill -9 "${PID_OF[n3]}"; wait "${PID_OF[n3]}" 2>/dev/null || true
  rm -rf "$WORK/node3/data"
  : > "$WORK/node3.log"
  t0=$(date +%s%N)
  start_node 3 "$bin"
  pid=${PID_OF[n3]} mp=$(metrics_port 3)
  : > "$OUT/samples-$tag.txt"
  while :; do
    now=$(date +%s%N) ms=$(( (now - t0) / 1000000 ))
    rss=$(awk '$1 == "VmRSS:" { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
    hwm=$(awk '$1 == "VmHWM:" { print $2 }' "/proc/$pid/status" 2>/dev/null || echo 0)
    echo "$ms $rss $hwm $(awk '$1 == "RssAnon:" { a = $2 } $1 == "RssFile:" { f = $2 }
      END { printf "%d %d", a, f }' "/proc/$pid/status" 2>/dev/null || echo 0 0) $(curl -s --max-time 2 "http://127.0.0.1:$mp/metrics" | awk '
      $1 == "bloomgrid_process_malloc_held_bytes" { h = $NF }
      $1 == "bloomgrid_process_malloc_free_bytes" { f = $NF }
      END { printf "%.0f %.0f", h, f }')" >> "$OUT/samples-$tag.txt"
    if [ -z "$done_ms" ]; then
      # Health every 4th sample (the samples stay ~100 ms apart).
      if [ $((++k % 4)) = 0 ] && health "127.0.0.1:$(node_port 3)" bloomgrid.v1.BloomGrid; then
        done_ms=$ms end_ms=$((ms + 3000))
      fi
    elif [ "$ms" -ge "$end_ms" ]; then
      break
    fi
    [ "$ms" -lt 1200000 ] || { done_ms=timeout; break; }
    sleep 0.1
  done
  if [ -s "$WORK/writer.pid" ]; then
    kill "$(cat "$WORK/writer.pid")" 2>/dev/null; wait "$(cat "$WORK/writer.pid")" 2>/dev/null || true
    : > "$WORK/writer.pid"
  fi
  local bits; bits=$(metric "$mp" bloomgrid_filter_bytes)
  cp "$WORK/node3.log" "$OUT/logs-node3-$tag.log" 2>/dev/null || true
  awk -v tag="$tag" -v bits="$bits" -v done_ms="$done_ms" '
    { if ($3 > hwm) hwm = $3; if ($2 > rss) { rss = $2; free = $7; held = $6 } }
    END {
      target = 1.10 * bits + 64 * 1048576
      printf "%s hwm_mib %.1f bits_mib %.1f hwm_per_bits %.3f hwm_per_target %.3f " \
             "free_at_peak_mib %.1f held_at_peak_mib %.1f resync_s %s\n",
             tag, hwm / 1024, bits / 1048576, hwm * 1024 / bits, hwm * 1024 / target,
             free / 1048576, held / 1048576, done_ms == "timeout" ? "timeout" : sprintf("%.1f", done_ms / 1000)
    }' "$OUT/samples-$tag.txt"
}

: > "$OUT/rounds.txt"
for r in $(seq 1 "$ROUNDS"); do
  for ab in A B; do
    bin=NODE_$ab
    resync "$ab$r" "${!bin}" > "$WORK/line"
    echo "$(cat "$WORK/line") load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/rounds.txt" >&2
  done
done
LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)

med() {   # FIELD AB: "median (min-max)" of that field over the rounds of AB
  awk -v f="$1" -v ab="$2" '
    substr($1, 1, 1) == ab { for (i = 2; i < NF; i++) if ($i == f) v[n++] = $(i + 1) }
    END {
      for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      if (n) printf "%s (%s-%s)", v[int((n - 1) / 2)], v[0], v[n - 1]
    }' "$OUT/rounds.txt"
}
{
  echo "re-sync of a wiped copy (merger running: $MERGER, every ${ROUND_S} s; writes during it: $WRITES), ${SIZE_MB} MiB of bits in $SHARDS shards ($(grep '^fill:' "$OUT/info.txt")), $ROUNDS rounds each, load $LOAD_START -> $LOAD_END"
  echo "A: $NODE_A"
  echo "B: $NODE_B"
  echo
  echo "| binary | VmHWM / bits | VmHWM / (1.10 x bits + 64 MiB) | allocator free at peak RSS, MiB | re-sync s |"
  echo "|---|---:|---:|---:|---:|"
  for ab in A B; do
    echo "| $ab | $(med hwm_per_bits $ab) | $(med hwm_per_target $ab) | $(med free_at_peak_mib $ab) | $(med resync_s $ab) |"
  done
} | tee "$OUT/report.md"
