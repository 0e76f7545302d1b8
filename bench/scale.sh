#!/usr/bin/env bash
# Scale benchmark on loopback: what a node's costs follow when it holds a
# large filter.  9 nodes (3 groups x 3 copies, write and read quorum 2),
# max_memory_mb set on each, two routers, the merger running; one filter of
# SIZE_MB MiB of bits filled to >= 50 % of its bits by an offline build
# ('bloomgrid build --like' an export of the filter) and an Import through
# a router; then live adds and queries through both routers.  Measured:
#   * throughput of adds and queries (bloombench, 1000-key calls, 8 in
#     flight, one client per router and operation);
#   * memory per node (VmRSS, VmHWM) against the filter bytes it holds,
#     and the peak of each phase (Import, the merger's first round, live,
#     quiet, sparse changes, restart, re-sync): each node's VmHWM is reset
#     at a phase's start (/proc/PID/clear_refs) and read at its end, beside
#     what the node charges to max_memory_mb and what its allocator holds
#     (bloomgrid_process_malloc_*); a 1 s trace of every node's VmRSS
#     goes to OUT/rss-trace.txt;
#   * bytes written per minute per node (/proc/PID/io write_bytes) and of
#     those the checkpoints' (bloomgrid_checkpoint_bytes_total) and the
#     log's (bloomgrid_wal_written_bytes_total), live and quiet;
#   * anti-entropy bytes (bloomgrid_antientropy_bytes_total) live and quiet,
#     and the merger's rounds (pages pulled, changed, pushed, bytes) live
#     and quiet, beside the filter's size; then batches of 0, 100, 1000 and
#     10000 keys, each followed by two merger intervals: the bytes of the
#     merger and of anti-entropy against the pages the keys changed;
#   * restart of a node after kill -9 until it answers health (liveness,
#     then readiness), with the page cache warm;
#   * re-sync of a wiped copy (kill -9, data directory removed, started
#     again) until it leaves SYNCING (readiness SERVING, and 'bloomgrid
#     status --topology' showing it serving).
# Prints one markdown report on stdout; raw output (metrics, logs of the
# measurements, the report) goes to OUT.
#
# usage: bench/scale.sh [--help]
# Environment (bounded defaults: about 3 GB of RAM and 2 GB of disk at the
# default size, about 6 minutes on 2 cores):
#   SIZE_MB     MiB of filter bits (the size knob)                  [256]
#   SHARDS      shards of the filter (multiple of 3 balances groups) [24]
#   LIVE_S      seconds of live adds and queries                     [60]
#   QUIET_S     seconds of the quiet phase (no writes)               [30]
#   ROUND_S     the merger's interval_s                              [10]
#   BUILD       build directory                                      [./build]
#   WORK        where data directories go (needs ~6 x SIZE_MB free)  [$TMPDIR or /tmp]
#   OUT         raw output directory            [bench/results/<commit>/scale-<SIZE_MB>]
#   PORT        first port (nodes PORT+1.., routers PORT+101.., metrics
#               PORT+201.., merger PORT+300)                         [random 20000-50000]
#   FORCE=1     run although MemAvailable looks too small
# Every process it starts is killed on exit (trap); WORK's data is removed,
# the processes' logs kept in OUT/logs.
set -euo pipefail

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 0
fi
[ $# -eq 0 ] || { echo "scale.sh: no arguments (see --help); settings are environment variables" >&2; exit 2; }

cd "$(dirname "$0")/.."
ROOT=$(pwd)
SIZE_MB=${SIZE_MB:-256}
SHARDS=${SHARDS:-24}
LIVE_S=${LIVE_S:-60}
QUIET_S=${QUIET_S:-30}
ROUND_S=${ROUND_S:-10}
BUILD=$(realpath "${BUILD:-build}")
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${OUT:-$ROOT/bench/results/$COMMIT/scale-$SIZE_MB}
PORT_GIVEN=${PORT:-}
PORT=${PORT:-$((20000 + RANDOM % 30000))}
for v in SIZE_MB SHARDS LIVE_S QUIET_S ROUND_S PORT; do
  case ${!v} in ''|*[!0-9]*) echo "scale.sh: $v must be a number" >&2; exit 2 ;; esac
done
BG=$BUILD/cli/bloomgrid NODE=$BUILD/node/bloomgrid-node
ROUTER=$BUILD/router/bloomgrid-router MERGER=$BUILD/merger/bloomgrid-merger
LOAD=$BUILD/bench/bloombench
for b in "$BG" "$NODE" "$ROUTER" "$MERGER" "$LOAD"; do
  [ -x "$b" ] || { echo "scale.sh: $b missing: build first (cmake --build $BUILD)" >&2; exit 1; }
done

NGROUPS=3 COPIES=3 NNODES=9
NODE_BYTES=$((SIZE_MB * 1048576 / NGROUPS))
# A blocked filter counts its bits three times in the budget (docs/SECURITY.md)
# and an Import's bytes while held: room for that and a margin.
MAXMEM_MB=$((3 * SIZE_MB / NGROUPS + SIZE_MB / SHARDS * 2 + 256))
# Each node peaks at about 1.1-1.2 times its bits (measured at 4 GB:
# bench/README.md, "At 4 GB"), the offline build holds the whole filter and
# the Export of its template a second time: refuse to start when the
# machine cannot.
NEED_MB=$((NNODES * 5 * SIZE_MB / NGROUPS / 4 + 2 * SIZE_MB + 2048))
AVAIL_MB=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
if [ "$AVAIL_MB" -lt "$NEED_MB" ] && [ "${FORCE:-0}" != 1 ]; then
  echo "scale.sh: SIZE_MB=$SIZE_MB may need $NEED_MB MiB of RAM, $AVAIL_MB available (FORCE=1 to try)" >&2
  exit 1
fi

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
WORK=$(mktemp -d "${WORK:-${TMPDIR:-/tmp}}/bloomgrid-scale.XXXXXX")
mkdir -p "$OUT"
PIDS=()
declare -A PID_OF
cleanup() {
  set +e
  for p in "${PIDS[@]}" "${PID_OF[@]}"; do kill -9 "$p" 2>/dev/null; done
  for p in "${PIDS[@]}" "${PID_OF[@]}"; do wait "$p" 2>/dev/null; done
  # The processes' own logs (a process that died says why there).
  mkdir -p "$OUT/logs" && cp "$WORK"/*.log "$WORK"/*.out "$OUT/logs/" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log() { echo "[$(date -u +%H:%M:%S)] $*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

node_port() { echo $((PORT + $1)); }
metrics_port() { echo $((PORT + 200 + $1)); }   # nodes 1..9, routers 11, 12
router_port() { echo $((PORT + 100 + $1)); }

ports_free() {
  local i p
  for i in $(seq 1 $NNODES) 11 12; do
    for p in $(node_port "$i") $(metrics_port "$i") $(router_port "$i") $((PORT + 300)) $((PORT + 301)); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then return 1; fi
    done
  done
}
for try in $(seq 1 20); do
  ports_free && break
  [ -z "${PORT_GIVEN:-}" ] || { echo "scale.sh: a port from $PORT is taken; choose PORT" >&2; exit 1; }
  [ "$try" -lt 20 ] || { echo "scale.sh: no free range of ports found" >&2; exit 1; }
  PORT=$((20000 + RANDOM % 30000))
done

TOPO=$WORK/topology.ini
{
  echo "version = 1"
  echo "write_quorum = 2"
  echo "read_quorum = 2"
  for g in $(seq 1 $NGROUPS); do
    printf '[group g%d]\ncopies =' "$g"
    for c in $(seq 1 $COPIES); do printf ' 127.0.0.1:%d' "$(node_port $(((g - 1) * COPIES + c)))"; done
    printf '\n'
  done
} > "$TOPO"

start_node() {   # I
  local i=$1
  mkdir -p "$WORK/node$i"
  "$NODE" --listen "127.0.0.1:$(node_port "$i")" --data-dir "$WORK/node$i/data" \
    --durability fsync --topology "$TOPO" --max-memory-mb "$MAXMEM_MB" \
    --metrics-listen "127.0.0.1:$(metrics_port "$i")" --threads 4 \
    >>"$WORK/node$i.out" 2>>"$WORK/node$i.log" </dev/null &
  PID_OF[n$i]=$!
}
health() {   # ADDR SERVICE: 0 when SERVING
  "$BG" health "$1" --service "$2" --quiet --deadline 1000 >/dev/null 2>&1
}
wait_health() {   # ADDR SERVICE TIMEOUT_S
  local end=$(( $(date +%s) + $3 ))
  until health "$1" "$2"; do
    [ "$(date +%s)" -lt "$end" ] || return 1
    sleep 0.05
  done
}
metric() {   # PORT NAME: the sum of every series of that metric
  curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '
    $1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.0f", s }'
}
proc_field() {   # PID FIELD (KiB from /proc/PID/status)
  awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"
}
io_write() { awk '$1 == "write_bytes:" { print $2 }' "/proc/$1/io"; }

# Peak memory per phase: every node's VmHWM reset when a phase starts
# (writing 5 to clear_refs sets it to the current VmRSS), read when it ends.
PHASE=start
phase_begin() {   # NAME
  local i
  PHASE=$1
  echo "$PHASE" > "$WORK/phase"
  for i in $(seq 1 $NNODES); do
    echo 5 > "/proc/${PID_OF[n$i]}/clear_refs" 2>/dev/null || true
  done
}
phase_end() {   # one line per node into OUT/phases.txt
  local i pid mp
  for i in $(seq 1 $NNODES); do
    pid=${PID_OF[n$i]} mp=$(metrics_port "$i")
    echo "$PHASE node$i hwm_kib $(proc_field "$pid" VmHWM) rss_kib $(proc_field "$pid" VmRSS)" \
      "filter_bytes $(metric "$mp" bloomgrid_filter_bytes)" \
      "charged $(metric "$mp" bloomgrid_node_memory_charged_bytes)" \
      "malloc_held $(metric "$mp" bloomgrid_process_malloc_held_bytes)" \
      "malloc_free $(metric "$mp" bloomgrid_process_malloc_free_bytes)" >> "$OUT/phases.txt"
  done
}
trace_rss() {   # every second: time, phase, each node's VmRSS in KiB
  local i line
  while :; do
    line="$(date +%s) $(cat "$WORK/phase" 2>/dev/null)"
    for i in $(seq 1 $NNODES); do
      line="$line $(proc_field "${PID_OF[n$i]}" VmRSS 2>/dev/null || echo 0)"
    done
    echo "$line" >> "$OUT/rss-trace.txt"
    sleep 1
  done
}

log "work $WORK, out $OUT, ports from $PORT, filter ${SIZE_MB} MiB in $SHARDS shards, max_memory_mb $MAXMEM_MB per node"
for i in $(seq 1 $NNODES); do start_node "$i"; done
for i in $(seq 1 $NNODES); do
  wait_health "127.0.0.1:$(node_port "$i")" "" 60 || { echo "node $i did not start: $(tail -5 "$WORK/node$i.log")" >&2; exit 1; }
done
for r in 1 2; do
  # A busy shared machine may take seconds per fsync: generous deadlines.
  "$ROUTER" --listen "127.0.0.1:$(router_port "$r")" --topology "$TOPO" --node-timeout-ms 60000 --max-memory-mb $((3 * SIZE_MB + 512)) \
    --metrics-listen "127.0.0.1:$(metrics_port $((10 + r)))" \
    >>"$WORK/router$r.out" 2>>"$WORK/router$r.log" </dev/null &
  PIDS+=($!)
done
R1=127.0.0.1:$(router_port 1) R2=127.0.0.1:$(router_port 2)
for r in "$R1" "$R2"; do
  wait_health "$r" bloomgrid.v1.BloomGrid 60 || { echo "router $r not ready" >&2; exit 1; }
done

# Each node's memory before it holds anything.
declare -A BASE_KIB
for i in $(seq 1 $NNODES); do BASE_KIB[$i]=$(proc_field "${PID_OF[n$i]}" VmRSS); done
for i in $(seq 1 $NNODES); do echo "node$i base_kib ${BASE_KIB[$i]}"; done > "$OUT/base.txt"
: > "$OUT/phases.txt"
: > "$OUT/rss-trace.txt"
echo start > "$WORK/phase"
trace_rss &
PIDS+=($!)

# The filter: capacity for SIZE_MB MiB of bits at 1 % (9.585 bits a key).
CAP=$(awk -v m="$SIZE_MB" 'BEGIN { printf "%.0f", m * 1048576 * 8 / 9.5851 }')
"$BG" --server "$R1" --deadline 300000 create f -n "$CAP" -p 0.01 --shards "$SHARDS" >/dev/null
BYTES=$("$BG" --server "$R1" info f | awk '/^bytes:/ {print $2}')
log "filter f: capacity $CAP, $BYTES bytes of bits"

# Offline fill: the capacity in keys sets about half the bits (optimal k).
NFILL=$(awk -v c="$CAP" 'BEGIN { printf "%.0f", c * 1.02 }')
t0=$(now)
fail() { echo "scale.sh: $1 failed: $(tail -5 "$2")" >&2; exit 1; }
"$BG" --server "$R1" --deadline 3600000 export f "$WORK/template.bundle" >/dev/null 2>"$OUT/export.log" ||
  fail export "$OUT/export.log"
seq 1 "$NFILL" | "$BG" build "$WORK/fill.bundle" --like "$WORK/template.bundle" 2>"$OUT/build.log" ||
  fail build "$OUT/build.log"
BUILD_S=$(since "$t0")
rm -f "$WORK/template.bundle"
phase_begin import
t0=$(now)
"$BG" --server "$R1" --deadline 3600000 import f "$WORK/fill.bundle" 2>"$OUT/import.log" ||
  fail import "$OUT/import.log"
IMPORT_S=$(since "$t0")
sleep 3   # anti-entropy's pulls of what the Import changed
phase_end
rm -f "$WORK/fill.bundle"
"$BG" --server "$R1" info f > "$OUT/info-after-import.txt"
FILL=$(awk '/^fill:/ {print $2}' "$OUT/info-after-import.txt")
log "built $NFILL keys in ${BUILD_S}s, imported in ${IMPORT_S}s, fill $FILL"

# The merger (one datacenter: pulls R in-sync copies, pushes every copy).
mkdir -p "$WORK/merger"
printf '[filter f]\ndatacenter = dc1 %s\n' "$TOPO" > "$WORK/merger/sources.ini"
printf '[merger]\nlisten = 127.0.0.1:%d\nstate_dir = %s\nsources = %s\ninterval_s = %d\nmetrics_listen = 127.0.0.1:%d\nnode_timeout_ms = 30000\n' \
  $((PORT + 300)) "$WORK/merger/state" "$WORK/merger/sources.ini" "$ROUND_S" $((PORT + 301)) > "$WORK/merger/merger.ini"
"$MERGER" --config "$WORK/merger/merger.ini" >>"$WORK/merger.out" 2>>"$WORK/merger.log" </dev/null &
PID_OF[merger]=$!
MP=$((PORT + 301))
phase_begin merger-first
# Its first round pulls every page once: wait for it before measuring.
for _ in $(seq 1 600); do
  [ "$(metric $MP bloomgrid_merger_rounds_total)" -ge 1 ] 2>/dev/null && break
  sleep 1
done
log "merger: first round done"
phase_end

sample() {   # TAG: one line per node and the merger into OUT/samples.txt
  local tag=$1 i pid
  for i in $(seq 1 $NNODES); do
    pid=${PID_OF[n$i]}
    echo "$tag node$i rss_kib $(proc_field "$pid" VmRSS) hwm_kib $(proc_field "$pid" VmHWM)" \
      "write_bytes $(io_write "$pid")" \
      "ckpt_bytes $(metric "$(metrics_port "$i")" bloomgrid_checkpoint_bytes_total)" \
      "wal_bytes $(metric "$(metrics_port "$i")" bloomgrid_wal_written_bytes_total)" \
      "ae_bytes $(metric "$(metrics_port "$i")" bloomgrid_antientropy_bytes_total)" \
      "ae_pages $(metric "$(metrics_port "$i")" bloomgrid_antientropy_pages_total)" \
      "filter_bytes $(metric "$(metrics_port "$i")" bloomgrid_filter_bytes)"
  done
  pid=${PID_OF[merger]}
  echo "$tag merger rss_kib $(proc_field "$pid" VmRSS) hwm_kib $(proc_field "$pid" VmHWM)" \
    "write_bytes $(io_write "$pid")" \
    "pulled $(metric $MP bloomgrid_merger_pulled_bytes_total)" \
    "pushed $(metric $MP bloomgrid_merger_pushed_bytes_total)" \
    "rounds $(metric $MP bloomgrid_merger_rounds_total)"
}
: > "$OUT/samples.txt"
sample start >> "$OUT/samples.txt"
MLINES0=$(grep -c 'merger: round' "$WORK/merger.log" || true)

# Live: adds and queries through both routers at once.
log "live phase: ${LIVE_S}s"
phase_begin live
t0=$(now)
for r in 1 2; do
  addr=127.0.0.1:$(router_port "$r")
  "$LOAD" --target "$addr" --filter f --op add --batch 1000 --depth 8 \
    --duration "$LIVE_S" --seed $((100 + r)) --max-keys 1000000000 > "$WORK/add$r.txt" 2>&1 &
  PIDS+=($!)
  "$LOAD" --target "$addr" --filter f --op query --batch 1000 --depth 8 \
    --duration "$LIVE_S" --seed $((200 + r)) > "$WORK/query$r.txt" 2>&1 &
  PIDS+=($!)
done
wait "${PIDS[@]: -4}" || true
LIVE_REAL=$(since "$t0")
sample live >> "$OUT/samples.txt"
phase_end
phase_begin quiet
MLINES1=$(grep -c 'merger: round' "$WORK/merger.log" || true)
log "quiet phase: ${QUIET_S}s"
sleep "$QUIET_S"
sample quiet >> "$OUT/samples.txt"
phase_end
phase_begin sparse
MLINES2=$(grep -c 'merger: round' "$WORK/merger.log" || true)
cat "$WORK"/add*.txt "$WORK"/query*.txt > "$OUT/load.txt"

# Sparse changes: a few keys, then two merger intervals.
AE_SUM() { local i s=0; for i in $(seq 1 $NNODES); do s=$((s + $(metric "$(metrics_port "$i")" bloomgrid_antientropy_bytes_total))); done; echo $s; }
: > "$OUT/sparse.txt"
next=1
for k in 0 100 1000 10000; do
  m0=$(grep -c 'merger: round' "$WORK/merger.log" || true)
  a0=$(AE_SUM); p0=$(metric $MP bloomgrid_merger_pulled_bytes_total); q0=$(metric $MP bloomgrid_merger_pushed_bytes_total)
  if [ "$k" -gt 0 ]; then
    # (add exits 1 when a key may have been present already)
    seq -f "sparse-%.0f" "$next" $((next + k - 1)) | "$BG" --server "$R1" add f >/dev/null 2>>"$WORK/sparse.log" || true
    next=$((next + k))
  fi
  sleep $((2 * ROUND_S + 1))
  m1=$(grep -c 'merger: round' "$WORK/merger.log" || true)
  ch=$( (grep 'merger: round' "$WORK/merger.log" || true) | sed -n "$((m0 + 1)),${m1}p" | sed -n 's/.* \([0-9]*\) pages changed.*/\1/p' | awk '{s += $1} END {print s + 0}')
  echo "$k $((m1 - m0)) $ch $(( $(metric $MP bloomgrid_merger_pulled_bytes_total) - p0 )) $(( $(metric $MP bloomgrid_merger_pushed_bytes_total) - q0 )) $(( $(AE_SUM) - a0 ))" >> "$OUT/sparse.txt"
  log "sparse: $k keys: $(tail -1 "$OUT/sparse.txt")"
done
MLINES3=$(grep -c 'merger: round' "$WORK/merger.log" || true)
grep 'merger: round' "$WORK/merger.log" > "$OUT/merger-rounds.txt" || true
phase_end

# Restart of a node after kill -9 (node 1), page cache warm.
log "restart of node 1 after kill -9"
kill -9 "${PID_OF[n1]}"; wait "${PID_OF[n1]}" 2>/dev/null || true
t0=$(now); start_node 1
phase_begin restart
wait_health "127.0.0.1:$(node_port 1)" "" 300 && RESTART_LIVE=$(since "$t0") || RESTART_LIVE=timeout
wait_health "127.0.0.1:$(node_port 1)" bloomgrid.v1.BloomGrid 600 && RESTART_READY=$(since "$t0") || RESTART_READY=timeout
log "restart: live ${RESTART_LIVE}s, ready ${RESTART_READY}s"
sleep 3
phase_end

# Re-sync of a wiped copy (node 2): until it leaves SYNCING.
log "re-sync of node 2, data directory wiped"
kill -9 "${PID_OF[n2]}"; wait "${PID_OF[n2]}" 2>/dev/null || true
rm -rf "$WORK/node2/data"
t0=$(now); start_node 2
phase_begin resync
RESYNC=timeout
for _ in $(seq 1 12000); do
  if health "127.0.0.1:$(node_port 2)" bloomgrid.v1.BloomGrid; then RESYNC=$(since "$t0"); break; fi
  sleep 0.1
done
"$BG" status --topology "$TOPO" > "$OUT/status-after-resync.txt" 2>&1 || true
STATUS_LINE=$(grep "127.0.0.1:$(node_port 2)" "$OUT/status-after-resync.txt" | head -1 | sed 's/^ *//')
log "re-sync: ${RESYNC}s ($STATUS_LINE)"
sleep 3
phase_end
sample end >> "$OUT/samples.txt"
for i in $(seq 1 $NNODES); do cp "$WORK/node$i.log" "$OUT/node$i.log" 2>/dev/null || true; done
cp "$WORK/merger.log" "$OUT/merger.log"

# ---- the report ----
kps() { awk '/^RESULT/ { for (i = 1; i <= NF; i++) if ($i ~ /^kps=/) { sub("kps=", "", $i); s += $i } } END { printf "%.0f", s }' "$@"; }
field() {   # TAG NODE KEY
  awk -v t="$1" -v n="$2" -v k="$3" '$1 == t && $2 == n { for (i = 3; i < NF; i += 2) if ($i == k) print $(i + 1) }' "$OUT/samples.txt"
}
{
echo "## Scale benchmark: ${SIZE_MB} MiB filter, $NNODES nodes ($NGROUPS groups x $COPIES copies), 2 routers, merger"
echo
echo "commit $COMMIT, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo) RAM (shared machine: load average $LOAD_START at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end)."
echo "Command: \`SIZE_MB=$SIZE_MB SHARDS=$SHARDS LIVE_S=$LIVE_S QUIET_S=$QUIET_S ROUND_S=$ROUND_S bench/scale.sh\`"
echo
echo "* filter \`f\`: $SHARDS shards, capacity $CAP at 1 %, $BYTES bytes of bits ($((BYTES / 1048576)) MiB; $((BYTES / NGROUPS / 1048576)) MiB per node), durability fsync, max_memory_mb $MAXMEM_MB per node"
echo "* offline fill: $NFILL keys by \`bloomgrid build --like\` in ${BUILD_S} s, Import through a router in ${IMPORT_S} s: fill ratio $FILL"
echo "* live: ${LIVE_REAL} s of 1000-key calls, 8 in flight, one add and one query client per router; then ${QUIET_S} s quiet; merger interval_s $ROUND_S"
echo
echo "| throughput | keys/s |"
echo "|---|---|"
echo "| adds (both routers) | $(kps "$WORK"/add*.txt) |"
echo "| queries (both routers) | $(kps "$WORK"/query*.txt) |"
echo
echo "### Per node"
echo
echo "Memory: VmRSS after the live phase, VmHWM (peak) by the end of the quiet phase; \"base\" is the node's VmRSS before it held anything (the process, its threads and buffers)."
echo
echo "| node | filter MiB | base MiB | VmRSS MiB | VmHWM MiB | (HWM - base) / filter | written MiB/min live | of it checkpoints | of it log | written MiB/min quiet | anti-entropy MiB live | anti-entropy MiB quiet |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for i in $(seq 1 $NNODES); do
  n=node$i
  fb=$(field live $n filter_bytes); rss=$(field live $n rss_kib); hwm=$(field quiet $n hwm_kib)
  awk -v n=$n -v fb="$fb" -v base="${BASE_KIB[$i]}" -v rss="$rss" -v hwm="$hwm" -v ls="$LIVE_REAL" -v qs="$QUIET_S" \
      -v w0="$(field start $n write_bytes)" -v w1="$(field live $n write_bytes)" -v w2="$(field quiet $n write_bytes)" \
      -v c0="$(field start $n ckpt_bytes)" -v c1="$(field live $n ckpt_bytes)" \
      -v l0="$(field start $n wal_bytes)" -v l1="$(field live $n wal_bytes)" \
      -v a0="$(field start $n ae_bytes)" -v a1="$(field live $n ae_bytes)" -v a2="$(field quiet $n ae_bytes)" '
    BEGIN { M = 1048576
      printf "| %s | %.0f | %.0f | %.0f | %.0f | %.2f | %.0f | %.0f | %.0f | %.1f | %.1f | %.1f |\n", n, fb / M, base / 1024, rss / 1024, hwm / 1024,
        (fb > 0 ? (hwm - base) * 1024 / fb : 0), (w1 - w0) / M / (ls / 60), (c1 - c0) / M / (ls / 60), (l1 - l0) / M / (ls / 60),
        (w2 - w1) / M / (qs / 60), (a1 - a0) / M, (a2 - a1) / M }'
done
echo
echo "### Peak memory per phase"
echo
echo "Each node's VmHWM is reset when a phase starts and read when it ends: the peak of that phase alone, as (VmHWM - base) / filter bytes (its range over the 9 nodes, and the node of the largest), beside the largest node's charge to max_memory_mb and what its allocator held (in use and free) at the phase's end."
echo
echo "| phase | (HWM - base) / filter, min | median | max | node of max | its VmHWM MiB | its charged MiB | its malloc held MiB | of it free MiB | largest VmHWM / (1.10 x filter + 64 MiB) |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for ph in import merger-first live quiet sparse restart resync; do
  awk -v ph="$ph" -v bases="$(for i in $(seq 1 $NNODES); do printf '%s ' "${BASE_KIB[$i]}"; done)" '
    BEGIN { split(bases, base, " ") }
    $1 == ph { n = substr($2, 5) + 0; for (i = 3; i < NF; i += 2) v[$i] = $(i + 1)
      if (v["filter_bytes"] <= 0) next
      r = (v["hwm_kib"] - base[n]) * 1024 / v["filter_bytes"]; k++; rs[k] = r
      t = v["hwm_kib"] * 1024 / (1.10 * v["filter_bytes"] + 64 * 1048576); if (t > tmax) tmax = t
      if (k == 1 || r > best) { best = r; bn = $2; bh = v["hwm_kib"]; bc = v["charged"]; bm = v["malloc_held"]; bf = v["malloc_free"] } }
    END { if (!k) exit
      for (i = 2; i <= k; i++) { x = rs[i]; for (j = i - 1; j >= 1 && rs[j] > x; j--) rs[j + 1] = rs[j]; rs[j + 1] = x }
      M = 1048576
      printf "| %s | %.2f | %.2f | %.2f | %s | %.0f | %.0f | %.0f | %.0f | %.2f |\n", ph, rs[1], rs[int((k + 1) / 2)], rs[k], bn, bh / 1024, bc / M, bm / M, bf / M, tmax }' "$OUT/phases.txt"
done
echo
echo "### Merger"
echo
echo "Merger VmHWM $(( $(field quiet merger hwm_kib) / 1024 )) MiB (largest shard $((BYTES / SHARDS / 1048576)) MiB, 4 workers) for a filter of $((BYTES / 1048576)) MiB. Rounds (from its log; the first, which pulls every page once, before the live phase):"
echo
echo "| round | phase | ms | pages pulled | keys pulled | bytes pulled | pages changed | pages pushed | keys pushed | bytes pushed | pulled / filter |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
awk -v a="$MLINES0" -v b="$MLINES1" -v c="$MLINES2" -v d="$MLINES3" -v fb="$BYTES" '
  # "pulled|pushed N pages [and K keys] (B bytes)": pages, keys ("-" when
  # the merger does not say), bytes
  function pk(what, o,   s, t, n) {
    o["p"] = o["k"] = o["b"] = "-"
    if (!match($0, what " [0-9]+ pages( and [0-9]+ keys)? \\([0-9]+ bytes\\)")) return
    s = substr($0, RSTART, RLENGTH); n = split(s, t, /[^0-9]+/)
    o["p"] = t[2]; o["b"] = t[n - 1]; if (s ~ / keys /) o["k"] = t[3] }
  { n++; ph = n <= a ? "before" : n <= b ? "live" : n <= c ? "quiet" : n <= d ? "sparse" : "restart/re-sync"
    match($0, /round [0-9]+: [0-9]+ ms/); split(substr($0, RSTART, RLENGTH), r, /[ :]+/)
    pk("pulled", p); pk("pushed", q)
    match($0, /[0-9]+ pages changed/); split(substr($0, RSTART, RLENGTH), ch, " ")
    printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %.4f |\n", r[2], ph, r[3], p["p"], p["k"], p["b"], ch[1], q["p"], q["k"], q["b"], (fb > 0 && p["b"] != "-" ? p["b"] / fb : 0) }' \
  "$OUT/merger-rounds.txt"
echo
echo "### Bytes against change"
echo
echo "Keys added through a router in one batch, then two merger intervals ($((2 * ROUND_S + 1)) s): the merger's rounds and the nodes' anti-entropy pulls (all 9 nodes summed) in that window. A blocked filter puts a key in one 64 KiB page; the filter has $((BYTES / 65536)) pages."
echo
echo "| keys added | merger rounds | pages changed | merger bytes pulled | merger bytes pushed | anti-entropy bytes | anti-entropy / filter |"
echo "|---|---|---|---|---|---|---|"
awk -v fb="$BYTES" '{ printf "| %s | %s | %s | %s | %s | %s | %.4f |\n", $1, $2, $3, $4, $5, $6, (fb > 0 ? $6 / fb : 0) }' "$OUT/sparse.txt"
echo
echo "### Recovery"
echo
echo "| what | seconds |"
echo "|---|---|"
echo "| node restart after kill -9, until liveness health SERVING (page cache warm) | $RESTART_LIVE |"
echo "| ... until readiness (bloomgrid.v1.BloomGrid) SERVING | $RESTART_READY |"
echo "| wiped copy (kill -9, data removed, started again) until it leaves SYNCING | $RESYNC |"
echo
echo "\`bloomgrid status --topology\` after the re-sync: \`$STATUS_LINE\`"
} | tee "$OUT/report.md"
