#!/bin/bash
# ckpt_bench.sh: what a node writes to disk against what its log holds, its
# peak memory against its filter's bits, and its restart time, under one
# load shape on one filter (docs/STORAGE.md, "Checkpoints and the log's
# bound").  One node on loopback, durability fsync, one blocked filter.
#
#   bench/ckpt_bench.sh [--build DIR] [--dir DIR] [--capacity N]
#                       [--shape steady|sparse|bursty|quiet] [--seconds S]
#                       [--exports N] [--pullers N] [--pull-mode changed|full]
#                       [--restart] [--save DIR] [--keep] [--node-args "..."]
#                       [--sparse-batch N] [--warm-log S]
#
# Shapes (adds through bloombench, one connection):
#   steady  1000-key batches, 8 in flight, for --seconds (default 240)
#   sparse  one 100-key call a second, for --seconds (default 120);
#           --sparse-batch N: N keys a call instead of 100
#   bursty  5 s of steady, then 25 s of nothing, for --seconds (default 180)
#   quiet   nothing at all for --seconds (default 60) after the creation
# --warm-log S: before the filter is made and anything is counted, S
#   seconds of steady adds into another filter, then dropped, so that the
#   log has gone round (its segments made over spares, as on a node that
#   has run a while) instead of writing a new segment's zeros.
# --exports N: N Exports of the filter at once, half way through (RSS).
# --pullers N: N pullers (bench/pagepull, each its own connection) pull the
#   filter's pages from the node for the whole load, one pull after the
#   other, as a copy's anti-entropy and the merger do (the internal
#   PullPages; --pull-mode changed, the default: the pages changed since
#   the puller's last pull; full: every non-empty page each time).
# --restart: at the end, kill -9 the node and time its restart until it
#   answers (the page cache is warm: the files were just written), with
#   the node's CPU seconds to then and the load average.
# --save DIR: with --restart, copy the data directory as the kill left it
#   to DIR before the restart (bench/restart_bench.sh restarts from it).
#
# Prints one line per second (log bytes, checkpoint bytes, bytes the node
# wrote as /proc/PID/io write_bytes counts them, RSS) and a summary:
#   write_amp = node write_bytes / log record bytes written
#   ckpt_amp  = checkpoint file bytes / log record bytes written
#   hwm       = VmHWM against the filter's bits (+ 64 MiB)
# where "log record bytes" is bloomgrid_wal_written_bytes_total minus
# bloomgrid_wal_padding_bytes_total (the records as framed in the log).
# The data directory (--dir, default under $TMPDIR) is removed at the end
# (--keep: left, with the node's log in DIR/log).
# Bounded: one node, one filter (--capacity 800000000 at 1 % is 0.96 GB of
# bits), a few GB of disk.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BUILD=$HERE/../build
DIR=
CAP=800000000
SHAPE=steady
SECS=
EXPORTS=0
PULLERS=0
PULL_MODE=changed
RESTART=0
KEEP=0
SAVE=
NODE_ARGS=
SPARSE_BATCH=100
WARM=0

while [ $# -gt 0 ]; do
  case $1 in
    --build) BUILD=$2; shift 2 ;;
    --dir) DIR=$2; shift 2 ;;
    --capacity) CAP=$2; shift 2 ;;
    --shape) SHAPE=$2; shift 2 ;;
    --seconds) SECS=$2; shift 2 ;;
    --exports) EXPORTS=$2; shift 2 ;;
    --pullers) PULLERS=$2; shift 2 ;;
    --pull-mode) PULL_MODE=$2; shift 2 ;;
    --restart) RESTART=1; shift ;;
    --save) SAVE=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --node-args) NODE_ARGS=$2; shift 2 ;;
    --sparse-batch) SPARSE_BATCH=$2; shift 2 ;;
    --warm-log) WARM=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "ckpt_bench: unknown option $1" >&2; exit 2 ;;
  esac
done
case $SHAPE in
  steady) SECS=${SECS:-240} ;;
  sparse) SECS=${SECS:-120} ;;
  bursty) SECS=${SECS:-180} ;;
  quiet) SECS=${SECS:-60} ;;
  *) echo "ckpt_bench: --shape steady|sparse|bursty|quiet" >&2; exit 2 ;;
esac
NODE=$BUILD/node/bloomgrid-node
BB=$BUILD/bench/bloombench
CLI=$BUILD/cli/bloomgrid
PP=$BUILD/bench/pagepull
case $PULLERS in ''|*[!0-9]*) echo "ckpt_bench: --pullers takes a number" >&2; exit 2 ;; esac
case $SPARSE_BATCH in ''|0|*[!0-9]*) echo "ckpt_bench: --sparse-batch takes a number > 0" >&2; exit 2 ;; esac
case $WARM in ''|*[!0-9]*) echo "ckpt_bench: --warm-log takes seconds" >&2; exit 2 ;; esac
case $PULL_MODE in changed|full) ;; *) echo "ckpt_bench: --pull-mode changed|full" >&2; exit 2 ;; esac
for f in "$NODE" "$BB" "$CLI" "$PP"; do
  [ -x "$f" ] || { echo "ckpt_bench: $f is missing (build first)" >&2; exit 2; }
done
DIR=${DIR:-$(mktemp -d "${TMPDIR:-/tmp}/ckpt-bench.XXXXXX")}
mkdir -p "$DIR"
PID=
cleanup() {
  [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null || true
  [ -n "${PULLPID:-}" ] && kill "$PULLPID" 2>/dev/null || true
  wait 2>/dev/null || true
  if [ $KEEP = 1 ]; then echo "# kept $DIR" >&2; else rm -rf "$DIR"; fi
}
trap cleanup EXIT

start_node() {
  # shellcheck disable=SC2086
  "$NODE" --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir "$DIR/data" \
    --durability fsync --log-level warn $NODE_ARGS >"$DIR/stdout" 2>>"$DIR/log" </dev/null &
  PID=$!
  ADDR= MADDR=
  for _ in $(seq 1 6000); do
    ADDR=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$DIR/stdout" | head -n 1)
    MADDR=$(sed -n 's/.*metrics on \([^ ]*\).*/\1/p' "$DIR/stdout" | head -n 1)
    [ -n "$ADDR" ] && [ -n "$MADDR" ] && return 0
    kill -0 "$PID" 2>/dev/null || break
    sleep 0.01
  done
  echo "ckpt_bench: the node did not start:" >&2
  tail -n 5 "$DIR/log" >&2
  exit 1
}

metric() {  # name: its value summed over labels
  curl -s "http://$MADDR/metrics" |
    awk -v n="$1" '$1 == n || index($1, n "{") == 1 { s += $2 } END { printf "%.0f\n", s }'
}
io_write() { awk '/^write_bytes/ { print $2 }' "/proc/$PID/io"; }
status_kb() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$PID/status"; }

sample() {  # prints: log_rec ckpt write rss_kb
  local w p
  w=$(metric bloomgrid_wal_written_bytes_total)
  p=$(metric bloomgrid_wal_padding_bytes_total)
  echo "$((w - p)) $(metric bloomgrid_checkpoint_bytes_total) $(io_write) $(status_kb VmRSS)"
}

start_node
if [ "$WARM" -gt 0 ]; then
  "$CLI" --server "$ADDR" create warm --capacity 10000000 --error-rate 0.01 >/dev/null
  "$BB" --target "$ADDR" --filter warm --op add --batch 1000 --depth 8 \
    --duration "$WARM" --max-keys 100000000000 --seed 7 >/dev/null
  "$CLI" --server "$ADDR" drop warm >/dev/null
  sleep 3   # its segments removed (made spares)
  echo "# warm-log: $WARM s of steady adds into filter warm, then dropped"
fi
"$CLI" --server "$ADDR" create bench --capacity "$CAP" --error-rate 0.01 --deadline 300000 >/dev/null
BITS=$(metric bloomgrid_filter_bytes)
read -r L0 C0 W0 _ <<<"$(sample)"
N0=$(metric bloomgrid_checkpoint_duration_seconds_count)   # --warm-log's own
F0=$(metric bloomgrid_checkpoint_folds_total)
echo "# shape=$SHAPE seconds=$SECS capacity=$CAP bits=$BITS exports=$EXPORTS pullers=$PULLERS pull_mode=$PULL_MODE node_args=$NODE_ARGS dir=$DIR"
echo "# t log_record_bytes ckpt_bytes node_write_bytes rss_kb"

load() {
  case $SHAPE in
    steady)
      "$BB" --target "$ADDR" --filter bench --op add --batch 1000 --depth 8 \
        --duration "$SECS" --max-keys 100000000000 --seed 11 >"$DIR/load.out" ;;
    sparse)
      local i=0 end=$((SECONDS + SECS))
      while [ $SECONDS -lt $end ]; do
        "$BB" --target "$ADDR" --filter bench --op add --batch "$SPARSE_BATCH" \
          --max-keys "$SPARSE_BATCH" \
          --seed $((1000 + i)) --duration 1 --no-warmup >/dev/null
        i=$((i + 1)); sleep 1
      done ;;
    bursty)
      local i=0 end=$((SECONDS + SECS))
      while [ $SECONDS -lt $end ]; do
        "$BB" --target "$ADDR" --filter bench --op add --batch 1000 --depth 8 \
          --duration 5 --max-keys 100000000000 --seed $((2000 + i)) >/dev/null
        i=$((i + 1)); sleep 25
      done ;;
    quiet) sleep "$SECS" ;;
  esac
}

load &
LOADPID=$!
PULLPID=
if [ "$PULLERS" -gt 0 ]; then
  "$PP" --target "$ADDR" --filter bench --pullers "$PULLERS" --mode "$PULL_MODE" \
    --duration "$SECS" >"$DIR/pull.out" 2>&1 &
  PULLPID=$!
fi
T0=$SECONDS
EXPORTED=0
XPIDS=
while kill -0 "$LOADPID" 2>/dev/null; do
  sleep 1
  echo "$((SECONDS - T0)) $(sample)"
  if [ "$EXPORTS" -gt 0 ] && [ $EXPORTED = 0 ] && [ $((SECONDS - T0)) -ge $((SECS / 2)) ]; then
    EXPORTED=1
    for i in $(seq 1 "$EXPORTS"); do
      "$CLI" --server "$ADDR" export bench "$DIR/export-$i.bf" --force >/dev/null &
      XPIDS="$XPIDS $!"
    done
  fi
done
wait "$LOADPID"
for p in $XPIDS; do wait "$p"; done
if [ -n "$PULLPID" ]; then
  wait "$PULLPID" || echo "# pagepull reported errors: $(tail -n 3 "$DIR/pull.out" | tr '\n' ' ')"
fi
rm -f "$DIR"/export-*.bf
sleep 2   # a checkpoint that just started ends
read -r L1 C1 W1 RSS <<<"$(sample)"
HWM=$(status_kb VmHWM)
LOG=$((L1 - L0)); CK=$((C1 - C0)); WR=$((W1 - W0))
[ -f "$DIR/load.out" ] && grep RESULT "$DIR/load.out" | sed 's/^/# /'
[ -f "$DIR/pull.out" ] && grep RESULT "$DIR/pull.out" | sed 's/^/# pull /'
awk -v pl="$PULLERS" -v l=$LOG -v c=$CK -v w=$WR -v h=$HWM -v b=$BITS -v s=$SHAPE -v f="$(( $(metric bloomgrid_checkpoint_folds_total) - F0 ))" \
  -v n="$(( $(metric bloomgrid_checkpoint_duration_seconds_count) - N0 ))" 'BEGIN {
  printf "SUMMARY shape=%s pullers=%d log_record_bytes=%.0f ckpt_bytes=%.0f node_write_bytes=%.0f checkpoints=%d folds=%d", s, pl, l, c, w, n, f
  if (l > 0) printf " ckpt_amp=%.2f write_amp=%.2f", c / l, w / l
  printf " vmhwm_kb=%d bits=%.0f hwm_over_bits=%.3f hwm_bound_kb=%d\n", h, b, h * 1024 / b, (1.10 * b + 64 * 1048576) / 1024
}'
if [ $RESTART = 1 ]; then
  # Just before a checkpoint is due: adds until the log holds 90 % of the
  # filter's checkpoint point (checkpoint_log_percent, default 50, of its
  # bits), then kill -9.
  PCT=$(echo " $NODE_ARGS " | sed -n 's/.*--checkpoint-log-percent \([0-9]*\).*/\1/p')
  DUE=$((BITS / 100 * ${PCT:-50} * 9 / 10))
  "$BB" --target "$ADDR" --filter bench --op add --batch 1000 --depth 8 \
    --duration 3600 --max-keys 100000000000 --seed 99 >/dev/null 2>&1 &
  LP=$!
  while [ "$(metric bloomgrid_wal_bytes)" -lt $DUE ]; do sleep 0.2; done
  LOGB=$(metric bloomgrid_wal_bytes)
  kill -9 "$PID"; wait "$PID" 2>/dev/null || true
  kill "$LP" 2>/dev/null || true; wait "$LP" 2>/dev/null || true
  if [ -n "$SAVE" ]; then
    rm -rf "$SAVE"; cp -a "$DIR/data" "$SAVE"
    echo "# saved the data directory at the kill in $SAVE:" \
      "$(cd "$SAVE" && find . -name '*.bg?' -printf '%f:%s ' | sort)"
  fi
  t0=$(date +%s.%N)
  start_node
  until "$BB" --target "$ADDR" --filter bench --op query --batch 1 --max-keys 1 \
      --duration 0.01 >/dev/null 2>&1; do
    sleep 0.01
  done
  t1=$(date +%s.%N)
  # The node's CPU time to then (user + system), steadier than the wall
  # time on a shared machine; and the load average.
  CPUT=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$PID/stat")
  awk -v a="$t0" -v b="$t1" -v l="$LOGB" -v c="$CPUT" -v la="$(cut -d' ' -f1 /proc/loadavg)" 'BEGIN { printf "RESTART seconds=%.2f node_cpu_seconds=%s log_bytes_at_kill=%d load=%s (kill -9, page cache warm: the log was just written)\n", b - a, c, l, la }'
fi
