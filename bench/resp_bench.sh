#!/usr/bin/env bash
# resp_bench: the node's Redis door (RESP) beside RedisBloom, in one run on
# loopback, driven by clients no one here wrote.
#
# Starts four servers, each on a loopback port picked here (data in the
# results directory):
#   redisbloom      Debian's redis-server with the RedisBloom module, no
#                   persistence (--save '' --appendonly no)
#   node            bloomgrid-node, durability none, resp_listen on
#   redisbloom-aof  redis-server + RedisBloom, appendonly yes, appendfsync
#                   always (AOF rewrites off, so none runs during a round)
#   node-fsync      bloomgrid-node, durability fsync (its default)
#   node-fsync-base with --base-build: that build's bloomgrid-node, durability
#                   fsync (e.g. main's, beside this one's in the durable row)
# and, with --router, a router's Redis door already running (system
# "router"; its CPU only with --router-pids).  Every server gets the same
# filter, BF.RESERVE slugs ERROR CAPACITY NONSCALING, prefilled (BF.MADD of
# 1000 keys, through redis-cli --pipe) with the keys 0 .. PREFILL-1 written
# as redis-benchmark writes __rand_int__ (12 digits), so that with
# -r KEYSPACE and PREFILL = KEYSPACE / 2 about half the queried keys are
# present.
#
# Rows (--rows), each run once per round on every system of the row, the
# systems taking turns (the first one rotates from round to round):
#   exists-c50   redis-benchmark -c 50 -P 1  BF.EXISTS slugs __rand_int__
#   exists-p32   redis-benchmark -c 1  -P 32 BF.EXISTS ...
#   add-c50      redis-benchmark -c 50 -P 1  BF.ADD slugs __rand_int__
#   add-p32      redis-benchmark -c 1  -P 32 BF.ADD ...
#     (systems: redisbloom, node, router, router-b)
#   durable-add-c50  redis-benchmark -c 50 BF.ADD (redisbloom-aof, node-fsync,
#                    and node-fsync-base with --base-build)
#   pb-add-1, pb-add-100, pb-query-1, pb-query-100
#                peerbench --proto resp (the peer kit's client): one
#                connection, 1 key a call (BF.ADD/EXISTS) --depth1 in
#                flight, 100 keys a call (BF.MADD/MEXISTS) --depthb in
#                flight; adds into a fresh filter per run (same parameters,
#                dropped after), queries on a filter prefilled with
#                --pb-prefill keys of which every other queried key is one
#                (systems: redisbloom, node, router)
#
# Measured per run: commands/s and p50/p99 from the client; the server's CPU
# (utime + stime of /proc/PID/stat before and after, all its threads); the
# client's CPU (/usr/bin/time for redis-benchmark, peerbench's own ccpu);
# for the durable row the fsync/fdatasync calls of the server during the
# run (perf stat counting the syscalls:sys_enter_fdatasync and
# sys_enter_fsync tracepoints of the server's threads: a count in the
# kernel, nothing stops the server; strace, which stops the server at each
# call, slowed the node 2-4x under a loaded machine; the node's own
# bloomgrid_wal_fsync_duration_seconds_count is recorded beside it).
# Errors: redis-benchmark counts an error reply as a reply, so each
# system's error replies (redis: INFO's total_error_replies; node: the sum
# of bloomgrid_resp_errors_total) are read before and after every run and
# any error fails the run.
#
# Prints a line per run, then a markdown table (also written to the
# results directory with the raw rows, results.tsv): per row and system the
# median over the rounds of commands/s with the lowest and highest round,
# the ratio to RedisBloom taken within each round (median, lowest,
# highest), server CPU per command (µs) and its ratio, the cores of the
# client, and for the durable row commands per fdatasync; then the node's
# targets, each marked met or not by the medians.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

BUILD=build
ROUNDS=5
KEYSPACE=20000000
PREFILL=
CAPACITY=20000000
ERROR_RATE=0.01
N50=100000
NP32=1000000
NDUR=30000
PB_DURATION=3
PB_PREFILL=1000000
DEPTH1=32
DEPTHB=8
ROWS="exists-c50 exists-p32 add-c50 add-p32 durable-add-c50 pb-add-1 pb-add-100 pb-query-1 pb-query-100"
PEERS=${PEERS:-/work/peers}
REDISBLOOM=
PEERBENCH=
ROUTER=
ROUTER_PIDS=
ROUTER_B=
ROUTER_B_PIDS=
NODE_ARGS=
BASE_BUILD=
BASE_ARGS=
FSYNC_COUNT=1
OUT=

usage() {
    cat <<EOF
usage: bench/resp_bench.sh [options]

The node's Redis door beside RedisBloom 2.4.23 (redis-server 7.0.15), side
by side in one run: redis-benchmark (50 connections one command each, and
1 connection 32 pipelined; BF.EXISTS and BF.ADD with random keys), a durable
BF.ADD row (node fsync against redis appendfsync always), and peerbench
--proto resp.  Defaults take about 10 minutes (a minute of it the prefill)
and ~300 MiB of memory.

  --build DIR          build directory holding node/bloomgrid-node      [$BUILD]
  --rounds N           rounds; every row runs once per round per system  [$ROUNDS]
  --rows "..."         rows to run (see the top of this script)
                       [$ROWS]
  --keyspace N         redis-benchmark -r N: keys are 0..N-1, 12 digits  [$KEYSPACE]
  --prefill N          keys 0..N-1 added before the rounds   [keyspace / 2]
  --capacity N         the filter's capacity (BF.RESERVE ... NONSCALING) [$CAPACITY]
  --error-rate P       the filter's error rate                           [$ERROR_RATE]
  --n50 N              requests of a 50-connection row                   [$N50]
  --np32 N             requests of a pipelined row                       [$NP32]
  --ndur N             requests of the durable row                       [$NDUR]
  --pb-duration S      seconds of a peerbench row                        [$PB_DURATION]
  --pb-prefill N       keys in peerbench's query filter                  [$PB_PREFILL]
  --depth1 N / --depthb N   peerbench calls in flight, 1 key / 100 keys  [$DEPTH1 / $DEPTHB]
  --peers DIR          the peer kit's build (src/RedisBloom/redisbloom.so,
                       client/peerbench)                                 [$PEERS]
  --redisbloom FILE    the module                [PEERS/src/RedisBloom/redisbloom.so]
  --peerbench FILE     the client ("" skips the pb-* rows) [PEERS/client/peerbench]
  --router HOST:PORT   also measure a router's Redis door already running
                       (system "router"; the script drops and recreates
                       its filter slugs through it: admin role, no tokens)
  --router-pids "P.."  the router's (and its nodes') PIDs, for its CPU
  --router-b HOST:PORT, --router-b-pids "P.."
                       a second router measured the same way (system
                       "router-b"), e.g. another build in front of a node
                       of its own, in the same rounds: every row takes
                       turns over all systems
  --node-args "..."    extra flags for both nodes
  --base-build DIR     also run DIR/node/bloomgrid-node (durability fsync) in
                       the durable row, as system node-fsync-base: another
                       build (e.g. main's) side by side in the same rounds
  --base-args "..."    extra flags for that node (not --node-args: an older
                       build may not know this one's flags)
  --no-fsync-count     do not count fdatasync calls with perf stat (the
                       node's own metric still counts its log's)
  --out DIR            keep results, logs and data there [a temporary
                       directory, removed at the end]
  -h, --help           this text

Exits 1 when a run failed or any server answered an error, 2 on bad usage
or a failed set-up.
EOF
}

die2() { echo "resp_bench: $*" >&2; exit 2; }
need() { [ $# -ge 2 ] || die2 "$1 needs a value"; }
while [ $# -gt 0 ]; do
    case $1 in
        --build) need "$@"; BUILD=$2; shift 2 ;;
        --rounds) need "$@"; ROUNDS=$2; shift 2 ;;
        --rows) need "$@"; ROWS=$2; shift 2 ;;
        --keyspace) need "$@"; KEYSPACE=$2; shift 2 ;;
        --prefill) need "$@"; PREFILL=$2; shift 2 ;;
        --capacity) need "$@"; CAPACITY=$2; shift 2 ;;
        --error-rate) need "$@"; ERROR_RATE=$2; shift 2 ;;
        --n50) need "$@"; N50=$2; shift 2 ;;
        --np32) need "$@"; NP32=$2; shift 2 ;;
        --ndur) need "$@"; NDUR=$2; shift 2 ;;
        --pb-duration) need "$@"; PB_DURATION=$2; shift 2 ;;
        --pb-prefill) need "$@"; PB_PREFILL=$2; shift 2 ;;
        --depth1) need "$@"; DEPTH1=$2; shift 2 ;;
        --depthb) need "$@"; DEPTHB=$2; shift 2 ;;
        --peers) need "$@"; PEERS=$2; shift 2 ;;
        --redisbloom) need "$@"; REDISBLOOM=$2; shift 2 ;;
        --peerbench) need "$@"; PEERBENCH=$2; PEERBENCH_SET=1; shift 2 ;;
        --router) need "$@"; ROUTER=$2; shift 2 ;;
        --router-pids) need "$@"; ROUTER_PIDS=$2; shift 2 ;;
        --router-b) need "$@"; ROUTER_B=$2; shift 2 ;;
        --router-b-pids) need "$@"; ROUTER_B_PIDS=$2; shift 2 ;;
        --node-args) need "$@"; NODE_ARGS=$2; shift 2 ;;
        --base-build) need "$@"; BASE_BUILD=$2; shift 2 ;;
        --base-args) need "$@"; BASE_ARGS=$2; shift 2 ;;
        --no-fsync-count) FSYNC_COUNT=0; shift ;;
        --out) need "$@"; OUT=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die2 "unknown option $1" ;;
    esac
done
isnum() { [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -gt 0 ] || die2 "$1 must be a positive integer (got '$2')"; }
for v in ROUNDS KEYSPACE CAPACITY N50 NP32 NDUR PB_DURATION PB_PREFILL DEPTH1 DEPTHB; do
    isnum "--${v,,}" "${!v}"
done
[ -n "$PREFILL" ] || PREFILL=$((KEYSPACE / 2))
[[ $PREFILL =~ ^[0-9]+$ ]] || die2 "--prefill must be a number"
[ "$PREFILL" -le "$CAPACITY" ] || die2 "--prefill $PREFILL is more than --capacity $CAPACITY"
[ "$KEYSPACE" -lt 1000000000000 ] || die2 "--keyspace must be below 10^12 (12 digits)"
for r in $ROWS; do
    case $r in
        exists-c50|exists-p32|add-c50|add-p32|durable-add-c50|pb-add-1|pb-add-100|pb-query-1|pb-query-100) ;;
        *) die2 "unknown row $r (see --help)" ;;
    esac
done
[ -n "$REDISBLOOM" ] || REDISBLOOM=$PEERS/src/RedisBloom/redisbloom.so
[ -n "${PEERBENCH_SET:-}" ] || PEERBENCH=$PEERS/client/peerbench
NODE=$BUILD/node/bloomgrid-node
[ -x "$NODE" ] || die2 "$NODE missing: build first (cmake --build $BUILD)"
[ -r "$REDISBLOOM" ] || die2 "$REDISBLOOM missing: build the peer kit (its README) or pass --redisbloom"
for t in redis-server redis-cli redis-benchmark; do
    command -v $t >/dev/null || die2 "$t not installed (Debian: redis-server, redis-tools)"
done
[ -x /usr/bin/time ] || die2 "/usr/bin/time not installed (Debian: time)"
if [ "$FSYNC_COUNT" = 1 ] && ! perf stat -e syscalls:sys_enter_fdatasync true >/dev/null 2>&1; then
    echo "resp_bench: perf cannot count syscalls:sys_enter_fdatasync here (Debian: linux-perf;" \
         "tracefs and perf_event_paranoid): no fdatasync count for redis" >&2
    FSYNC_COUNT=0
fi
if [ -z "$PEERBENCH" ] || [ ! -x "$PEERBENCH" ]; then
    [ -n "$PEERBENCH" ] && echo "resp_bench: $PEERBENCH missing: the pb-* rows are skipped" >&2
    ROWS=$(printf '%s\n' $ROWS | grep -v '^pb-' | tr '\n' ' ')
fi
NODE=$(cd "$(dirname "$NODE")" && pwd)/$(basename "$NODE")
BASE_NODE=
if [ -n "$BASE_BUILD" ]; then
    BASE_NODE=$BASE_BUILD/node/bloomgrid-node
    [ -x "$BASE_NODE" ] || die2 "$BASE_NODE missing (--base-build)"
    BASE_NODE=$(cd "$(dirname "$BASE_NODE")" && pwd)/$(basename "$BASE_NODE")
fi

KEEP=1
if [ -z "$OUT" ]; then OUT=$(mktemp -d "${TMPDIR:-/tmp}/resp_bench.XXXXXX"); KEEP=0; fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ST=$OUT/state
rm -rf "$ST"; mkdir -p "$ST"
RES=$OUT/results.tsv
: > "$RES"

PIDS=()
cleanup() {
    set +e
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
    for p in "${PIDS[@]}"; do
        for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    [ -n "$PERF_PID" ] && kill -INT "$PERF_PID" 2>/dev/null
    rm -rf "$ST"/*/data "$ST"/*/aof
    [ "$KEEP" = 1 ] || rm -rf "$OUT"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
free_port() {
    local p
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 40000))
        port_open "$p" || { echo "$p"; return; }
    done
    die2 "no free port found"
}
start_redis() {  # name, extra redis-server args...
    local name=$1; shift
    local port
    mkdir -p "$ST/$name"
    for _ in 1 2 3; do
        port=$(free_port)
        redis-server --port "$port" --bind 127.0.0.1 --save '' --daemonize no \
            --dir "$ST/$name" --loadmodule "$REDISBLOOM" "$@" >"$ST/$name/log" 2>&1 &
        local pid=$!
        for _ in $(seq 1 100); do
            redis-cli -p "$port" PING 2>/dev/null | grep -q PONG && break
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if redis-cli -p "$port" PING 2>/dev/null | grep -q PONG; then
            PIDS+=("$pid")
            eval "PORT_${name//-/_}=$port PID_${name//-/_}=$pid"
            return 0
        fi
        kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    done
    die2 "$name did not start: $(tail -3 "$ST/$name/log")"
}

start_node() {  # name durability [binary extra-args]
    local name=$1 dur=$2 bin=${3:-$NODE} args=${4-$NODE_ARGS} line=""
    mkdir -p "$ST/$name/data"
    # shellcheck disable=SC2086
    "$bin" --listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 \
        --metrics-listen 127.0.0.1:0 --data-dir "$ST/$name/data" --durability "$dur" \
        --log-level warn $args >"$ST/$name/log" 2>&1 &
    local pid=$!
    PIDS+=("$pid")
    for _ in $(seq 1 200); do
        line=$(grep -m1 'listening on' "$ST/$name/log" || true)
        [ -n "$line" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    [ -n "$line" ] || die2 "$name did not start: $(tail -3 "$ST/$name/log")"
    local port mport
    port=$(sed -n 's/.* resp 127\.0\.0\.1:\([0-9]*\).*/\1/p' <<<"$line")
    mport=$(sed -n 's/.* metrics on 127\.0\.0\.1:\([0-9]*\)$/\1/p' "$ST/$name/log" | head -1)
    [ -n "$port" ] || die2 "$name: no resp port in \"$line\""
    eval "PORT_${name//-/_}=$port PID_${name//-/_}=$pid MPORT_${name//-/_}=${mport:-}"
}

[ -n "$BASE_NODE" ] && echo "resp_bench: node-fsync-base is $BASE_NODE ($("$BASE_NODE" --version 2>/dev/null)) with \"$BASE_ARGS\""
echo "resp_bench: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at start; $ROUNDS rounds; results in $OUT"
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)

HAVE_DUR=0
for r in $ROWS; do [ "$r" = durable-add-c50 ] && HAVE_DUR=1; done
FAST_SYS="redisbloom node"
[ -n "$ROUTER" ] && FAST_SYS="$FAST_SYS router"
[ -n "$ROUTER_B" ] && FAST_SYS="$FAST_SYS router-b"
DUR_SYS="redisbloom-aof node-fsync"
[ -n "$BASE_NODE" ] && DUR_SYS="$DUR_SYS node-fsync-base"

start_redis redisbloom --appendonly no
start_node node none
if [ "$HAVE_DUR" = 1 ]; then
    start_redis redisbloom-aof --appendonly yes --appendfsync always --appenddirname aof \
        --auto-aof-rewrite-percentage 0
    start_node node-fsync fsync
    [ -n "$BASE_NODE" ] && start_node node-fsync-base fsync "$BASE_NODE" "$BASE_ARGS"
fi
if [ -n "$ROUTER" ]; then
    PORT_router=${ROUTER##*:}; HOST_router=${ROUTER%:*}
    PID_router=$ROUTER_PIDS
fi
if [ -n "$ROUTER_B" ]; then
    PORT_router_b=${ROUTER_B##*:}; HOST_router_b=${ROUTER_B%:*}
    PID_router_b=$ROUTER_B_PIDS
fi

host_of() { local v="HOST_${1//-/_}"; echo "${!v:-127.0.0.1}"; }
port_of() { local v="PORT_${1//-/_}"; echo "${!v}"; }
pids_of() { local v="PID_${1//-/_}"; echo "${!v:-}"; }
rcli() { local s=$1; shift; redis-cli -h "$(host_of "$s")" -p "$(port_of "$s")" "$@"; }

HZ=$(getconf CLK_TCK)
cpu_ticks() {
    local t=0 p v
    for p in "$@"; do
        v=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{print $12 + $13}') || v=0
        t=$((t + ${v:-0}))
    done
    echo $t
}
errors_of() {  # error replies a server has sent so far ("" when unknown)
    case $1 in
        # BF.* commands only: redis-benchmark's CONFIG GET at its start is
        # an unknown command on the node.
        redisbloom*) rcli "$1" INFO commandstats | tr -d '\r' |
            awk -F'[:,=]' '/^cmdstat_bf\./ { for (i = 2; i < NF; i += 2) if ($i ~ /^(failed|rejected)_calls$/) s += $(i + 1) }
                           END { printf "%d\n", s }' ;;
        node*)
            local m; m=$(eval echo "\${MPORT_${1//-/_}:-}")
            if [ -n "$m" ]; then
                curl -s "http://127.0.0.1:$m/metrics" |
                    awk '/^bloomgrid_resp_errors_total\{command="bf\./ { s += $NF } END { printf "%d\n", s }'
            fi ;;
        *) echo "" ;;
    esac
}
PERF_PID=
fsync_count_start() {  # system: count its fsync/fdatasync calls from now
    PERF_PID=
    [ "$FSYNC_COUNT" = 1 ] || return 0
    case $1 in redisbloom-aof|node-fsync|node-fsync-base) ;; *) return 0 ;; esac
    perf stat -x, -o "$ST/perf.txt" -e syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync \
        -p "$(pids_of "$1")" >/dev/null 2>&1 &
    PERF_PID=$!
    sleep 0.3   # attached before the run starts
}
FS=
fsync_count_stop() {  # FS: the count since fsync_count_start, "" without
    FS=
    [ -n "$PERF_PID" ] || return 0
    kill -INT "$PERF_PID" 2>/dev/null || true
    wait "$PERF_PID" 2>/dev/null || true
    PERF_PID=
    FS=$(awk -F, '/syscalls:sys_enter_f/ { s += $1; n++ } END { if (n) printf "%d\n", s }' "$ST/perf.txt" 2>/dev/null || true)
}
node_fsyncs_of() {  # the node's own count of log fdatasyncs
    local m; m=$(eval echo "\${MPORT_${1//-/_}:-}")
    if [ -n "$m" ]; then
        curl -s "http://127.0.0.1:$m/metrics" |
            awk '/^bloomgrid_wal_fsync_duration_seconds_count/ { s += $NF } END { printf "%d\n", s }'
    fi
}

# --- the filter on every system, prefilled ---
madd_stream() {  # filter first count: BF.MADD of 1000 keys, RESP
    awk -v f="$1" -v a="$2" -v n="$3" 'BEGIN {
        for (i = a; i < a + n; i += 1000) {
            m = (a + n - i < 1000) ? a + n - i : 1000
            printf "*%d\r\n$7\r\nBF.MADD\r\n$%d\r\n%s\r\n", m + 2, length(f), f
            for (j = 0; j < m; j++) printf "$12\r\n%012d\r\n", i + j
        }
    }'
}
sample_present() {  # fraction of 1000 random keys of the keyspace present
    local keys
    keys=$(awk -v k="$KEYSPACE" -v s="$2" 'BEGIN { srand(s); for (i = 0; i < 1000; i++) printf "%012d ", int(rand() * k) }')
    # shellcheck disable=SC2086
    rcli "$1" BF.MEXISTS slugs $keys | awk '{ n++; s += ($1 == "1" || $1 == "(integer) 1") } END { printf "%.3f", n ? s / n : 0 }'
}
SETUP_SYS="$FAST_SYS"
[ "$HAVE_DUR" = 1 ] && SETUP_SYS="$SETUP_SYS $DUR_SYS"
for s in $SETUP_SYS; do
    case $s in router*) rcli "$s" DEL slugs >/dev/null || true ;; esac
    r=$(rcli "$s" BF.RESERVE slugs "$ERROR_RATE" "$CAPACITY" NONSCALING)
    [ "$r" = OK ] || die2 "$s: BF.RESERVE answered: $r"
    t0=$(date +%s.%N)
    if [ "$PREFILL" -gt 0 ]; then
        out=$(madd_stream slugs 0 "$PREFILL" | redis-cli -h "$(host_of "$s")" -p "$(port_of "$s")" --pipe 2>&1 | tail -1)
        case $out in *"errors: 0,"*) ;; *) die2 "$s: prefill: $out" ;; esac
    fi
    t1=$(date +%s.%N)
    # The commands the rows send, answered as RedisBloom answers them.
    a=$(rcli "$s" BF.EXISTS slugs 000000000000) b=$(rcli "$s" BF.ADD slugs 000000000000)
    [ "$PREFILL" -eq 0 ] || [ "$a $b" = "1 0" ] || die2 "$s: BF.EXISTS/BF.ADD of a prefilled key answered $a $b"
    echo "  $s: filter slugs prefilled with $PREFILL keys in $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s;" \
         "present in a sample of the keyspace: $(sample_present "$s" 1)"
done

if [[ " $ROWS " == *" pb-query-"* ]]; then
    for s in $FAST_SYS; do
        case $s in router*) rcli "$s" DEL pbq >/dev/null || true ;; esac
        r=$(rcli "$s" BF.RESERVE pbq "$ERROR_RATE" "$CAPACITY" NONSCALING)
        [ "$r" = OK ] || die2 "$s: BF.RESERVE pbq answered: $r"
        "$PEERBENCH" --proto resp --addr "$(host_of "$s"):$(port_of "$s")" --filter pbq \
            --prefill "$PB_PREFILL" --prefill-seed 7 >/dev/null || die2 "$s: peerbench prefill failed"
    done
fi

# --- one run ---
FAILED=0
record() {  # round row system calls keys secs rate p50us p99us dticks clis fsyncs nodefsyncs errors
    local line
    line=$(awk -v hz="$HZ" 'BEGIN {
        r = ARGV[1]; w = ARGV[2]; s = ARGV[3]; c = ARGV[4]; k = ARGV[5]; secs = ARGV[6]
        srv = (ARGV[10] == "") ? "" : sprintf("%.3f", ARGV[10] / hz)
        printf "%s\t%s\t%s\t%d\t%d\t%.3f\t%.0f\t%.1f\t%.1f\t%s\t%.3f\t%s\t%s\t%s\t%s\n",
            r, w, s, c, k, secs, ARGV[7], ARGV[8], ARGV[9], srv, ARGV[11], ARGV[12], ARGV[13], ARGV[14],
            ARGV[15]
        exit }' "$@" "$(cut -d' ' -f1 /proc/loadavg)")
    echo "$line" >> "$RES"
    awk -F'\t' '{ printf "  %-16s %-15s %10s cmd/s  p50 %7s us  srv %6s s  cli %6s s%s%s\n", $2, $3, $7, $8, $10, $11,
                  ($12 != "" ? "  fsyncs " $12 : ""), ($14 > 0 ? "  ERRORS " $14 : "") }' <<<"$line"
}

run_rb() {  # round row system n redis-benchmark args...
    local r=$1 w=$2 s=$3 n=$4; shift 4
    local pids t0 t1 e0 e1 g0 g1 csv rps p50 p99 cli
    pids=$(pids_of "$s")
    e0=$(errors_of "$s"); g0=$(node_fsyncs_of "$s")
    fsync_count_start "$s"
    t0=$(cpu_ticks $pids)
    csv=$(/usr/bin/time -f '%U %S' -o "$ST/time.txt" redis-benchmark -h "$(host_of "$s")" -p "$(port_of "$s")" \
          -n "$n" -r "$KEYSPACE" --csv "$@" </dev/null 2>"$ST/rb.err" | tail -1) || true
    t1=$(cpu_ticks $pids)
    fsync_count_stop
    e1=$(errors_of "$s"); g1=$(node_fsyncs_of "$s")
    IFS=, read -r _ rps _ _ p50 _ p99 _ <<<"$(tr -d '"' <<<"$csv")"
    if ! [[ ${rps:-} =~ ^[0-9.]+$ ]] || [ "$(awk -v x="$rps" 'BEGIN { print (x > 0) }')" != 1 ]; then
        echo "  [$s $w] redis-benchmark failed: $(tr '\r' '\n' < "$ST/rb.err" | grep -v '^ *$' | tail -2)" >&2
        FAILED=1; rps=0; p50=0; p99=0
    fi
    cli=$(awk '{ print $1 + $2 }' "$ST/time.txt" 2>/dev/null || echo 0)
    local errs=0
    [ -n "$e0" ] && [ -n "$e1" ] && errs=$((e1 - e0))
    [ "$errs" -gt 0 ] && FAILED=1
    local dt=""; [ -n "$pids" ] && dt=$((t1 - t0))
    local secs; secs=$(awk -v n="$n" -v x="$rps" 'BEGIN { printf "%.3f", (x > 0 ? n / x : 0) }')
    record "$r" "$w" "$s" "$n" "$n" "$secs" "$rps" "$(awk -v x="$p50" 'BEGIN { print x * 1000 }')" \
        "$(awk -v x="$p99" 'BEGIN { print x * 1000 }')" "$dt" "$cli" \
        "$FS" "$([ -n "$g0" ] && echo $((g1 - g0)))" "$errs"
}

PBSEED=100
run_pb() {  # round row system filter peerbench-args...
    local r=$1 w=$2 s=$3 f=$4; shift 4
    local pids t0 t1 e0 e1 line
    pids=$(pids_of "$s")
    e0=$(errors_of "$s")
    t0=$(cpu_ticks $pids)
    line=$(timeout $((PB_DURATION + 60)) "$PEERBENCH" --proto resp --addr "$(host_of "$s"):$(port_of "$s")" \
           --filter "$f" --duration "$PB_DURATION" "$@" 2>"$ST/pb.err" | grep '^RESULT') ||
        line="RESULT keys=0 calls=0 secs=1 kps=0 cps=0 p50=0 p99=0 p999=0 true=0 errors=1 ccpu=0"
    t1=$(cpu_ticks $pids)
    e1=$(errors_of "$s")
    [ -s "$ST/pb.err" ] && sed "s/^/  [$s $w] /" "$ST/pb.err" | head -3 >&2
    local kv; kv=$(awk '{ for (i = 2; i <= NF; i++) { split($i, a, "="); printf "%s=%s ", a[1], a[2] } }' <<<"$line")
    local keys calls secs kps p50 p99 ccpu perr
    keys=$(grep -o 'keys=[^ ]*' <<<"$kv" | cut -d= -f2); calls=$(grep -o 'calls=[^ ]*' <<<"$kv" | cut -d= -f2)
    secs=$(grep -o ' secs=[^ ]*' <<<" $kv" | cut -d= -f2); kps=$(grep -o 'kps=[^ ]*' <<<"$kv" | cut -d= -f2)
    p50=$(grep -o 'p50=[^ ]*' <<<"$kv" | cut -d= -f2); p99=$(grep -o 'p99=[^ ]*' <<<"$kv" | cut -d= -f2)
    ccpu=$(grep -o 'ccpu=[^ ]*' <<<"$kv" | cut -d= -f2); perr=$(grep -o 'errors=[^ ]*' <<<"$kv" | cut -d= -f2)
    local errs=$perr
    [ -n "$e0" ] && [ -n "$e1" ] && errs=$((perr + e1 - e0))
    [ "$errs" -gt 0 ] && FAILED=1
    local dt=""; [ -n "$pids" ] && dt=$((t1 - t0))
    # rate column: keys/s (a batch row's commands carry 100 keys each)
    record "$r" "$w" "$s" "$calls" "$keys" "$secs" "$kps" "$p50" "$p99" "$dt" "$ccpu" "" "" "$errs"
}

run_row() {  # round row system
    local r=$1 w=$2 s=$3
    case $w in
        exists-c50) run_rb "$r" "$w" "$s" "$N50" -c 50 -P 1 BF.EXISTS slugs __rand_int__ ;;
        exists-p32) run_rb "$r" "$w" "$s" "$NP32" -c 1 -P 32 BF.EXISTS slugs __rand_int__ ;;
        add-c50|durable-add-c50) run_rb "$r" "$w" "$s" "$([ "$w" = add-c50 ] && echo "$N50" || echo "$NDUR")" \
                                     -c 50 -P 1 BF.ADD slugs __rand_int__ ;;
        add-p32) run_rb "$r" "$w" "$s" "$NP32" -c 1 -P 32 BF.ADD slugs __rand_int__ ;;
        pb-add-1|pb-add-100)
            local b=${w#pb-add-} d=$DEPTH1
            [ "$b" = 1 ] || d=$DEPTHB
            PBSEED=$((PBSEED + 1))
            case $s in router*) rcli "$s" DEL pba >/dev/null || true ;; esac
            rcli "$s" BF.RESERVE pba "$ERROR_RATE" "$CAPACITY" NONSCALING >/dev/null
            run_pb "$r" "$w" "$s" pba --op add --batch "$b" --depth "$d" --seed "$PBSEED" --max-keys "$CAPACITY"
            rcli "$s" DEL pba >/dev/null ;;
        pb-query-1|pb-query-100)
            local b=${w#pb-query-} d=$DEPTH1
            [ "$b" = 1 ] || d=$DEPTHB
            PBSEED=$((PBSEED + 1))
            run_pb "$r" "$w" "$s" pbq --op query --batch "$b" --depth "$d" --seed "$PBSEED" \
                --prefill-seed 7 --prefill-count "$PB_PREFILL" --max-keys 1000000000000 ;;
    esac
}

# --- the rounds ---
i=0
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    for w in $ROWS; do
        sys=$FAST_SYS
        [ "$w" = durable-add-c50 ] && sys=$DUR_SYS
        read -r -a S <<<"$sys"
        n=${#S[@]}
        for k in $(seq 0 $((n - 1))); do
            run_row "$round" "$w" "${S[$(((k + i) % n))]}"
        done
        i=$((i + 1))
    done
done

LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)
echo
echo "load average at start $LOAD0, at end $LOAD1; present in a sample of the keyspace at the end:" \
     "$(for s in $SETUP_SYS; do printf '%s %s  ' "$s" "$(sample_present "$s" 2)"; done)"
echo
{
echo "load average $LOAD0 at start, $LOAD1 at end; $ROUNDS rounds; keyspace $KEYSPACE, prefill $PREFILL"
echo
awk -F'\t' -v rows="$ROWS" -v fast="$FAST_SYS" -v dur="$DUR_SYS" '
function med(s,   a, n, i, j, t) {   # median of a space-separated list
    n = split(s, a, " ")
    for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > t + 0; j--) a[j + 1] = a[j]; a[j + 1] = t }
    if (n == 0) return ""
    return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function lo(s,   a, n, i, m) { n = split(s, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 < m + 0) m = a[i]; return m }
function hi(s,   a, n, i, m) { n = split(s, a, " "); m = a[1]; for (i = 2; i <= n; i++) if (a[i] + 0 > m + 0) m = a[i]; return m }
function add(arr, key, v) { arr[key] = (key in arr) ? arr[key] " " v : v }
function fmt(x) { return x == "" ? "–" : (x >= 100000 ? sprintf("%.0f k", x / 1000) : (x >= 10000 ? sprintf("%.1f k", x / 1000) : sprintf("%.0f", x))) }
{
    r = $1; w = $2; s = $3
    rate[w, s, r] = $7; add(rates, w SUBSEP s, $7); add(p50s, w SUBSEP s, $8)
    if ($10 != "" && $5 > 0) { us = $10 * 1e6 / ($2 ~ /^pb-/ ? $4 : $5); cpu[w, s, r] = us; add(cpus, w SUBSEP s, us) }
    if ($6 > 0) add(clis, w SUBSEP s, $11 / $6)
    if ($12 != "" && $12 > 0) add(cpf, w SUBSEP s, $5 / $12)
    if ($13 != "" && $13 > 0) add(ncpf, w SUBSEP s, $5 / $13)
    if ($14 > 0) err[w, s] += $14
    seen[w, s] = 1; rounds[r] = 1
}
END {
    print "| row | system | cmd/s (keys/s for pb-*) median | lowest–highest | ratio to RedisBloom median (lowest–highest) | p50 µs | server CPU µs/cmd | CPU ratio (lowest–highest) | client cores | cmds per fdatasync |"
    print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    nw = split(rows, W, " ")
    for (k = 1; k <= nw; k++) {
        w = W[k]; sl = (w == "durable-add-c50") ? dur : fast
        ns = split(sl, S, " "); ref = S[1]
        for (j = 1; j <= ns; j++) {
            s = S[j]; id = w SUBSEP s
            if (!((w, s) in seen)) continue
            rr = ""; cr = ""
            if (s != ref) for (r in rounds) {
                if ((w, s, r) in rate && (w, ref, r) in rate && rate[w, ref, r] > 0) add(rl, id, rate[w, s, r] / rate[w, ref, r])
                if ((w, s, r) in cpu && (w, ref, r) in cpu && cpu[w, ref, r] > 0) add(cl, id, cpu[w, s, r] / cpu[w, ref, r])
            }
            ratio = (id in rl) ? sprintf("%.2f (%.2f–%.2f)", med(rl[id]), lo(rl[id]), hi(rl[id])) : "–"
            cratio = (id in cl) ? sprintf("%.2f (%.2f–%.2f)", med(cl[id]), lo(cl[id]), hi(cl[id])) : "–"
            f = (id in cpf) ? sprintf("%.1f", med(cpf[id])) : ((id in ncpf) ? "" : "–")
            if (id in ncpf) f = f (f == "" ? "" : "; ") sprintf("node metric %.1f", med(ncpf[id]))
            if (w != "durable-add-c50") f = "–"
            printf "| %s | %s | %s | %s–%s | %s | %s | %s | %s | %s | %s |%s\n", w, s, fmt(med(rates[id])),
                fmt(lo(rates[id])), fmt(hi(rates[id])), ratio, sprintf("%.0f", med(p50s[id])),
                (id in cpus) ? sprintf("%.2f", med(cpus[id])) : "–", cratio,
                (id in clis) ? sprintf("%.2f", med(clis[id])) : "–", f, ((w, s) in err) ? " ERRORS" : ""
            if (s == "node" || s == "node-fsync") {
                tgt = ""; ct = ""
                if (w ~ /-p32$/) tgt = 1.0; else if (w ~ /-c50$/) tgt = 0.9
                if (w ~ /^exists-/) ct = 1.0; else if (w ~ /^add-/) ct = 1.5
                if (tgt != "" && (id in rl)) T[++nt] = sprintf("| %s throughput ≥ %.1f× | %.2f× | %s |", w, tgt, med(rl[id]), med(rl[id]) >= tgt ? "met" : "not met")
                if (ct != "" && (id in cl)) T[++nt] = sprintf("| %s server CPU/cmd ≤ %.1f× | %.2f× | %s |", w, ct, med(cl[id]), med(cl[id]) <= ct ? "met" : "not met")
                if (w == "durable-add-c50" && (id in cpf) && ((w, ref) in seen) && ((ref2 = w SUBSEP ref) in cpf))
                    T[++nt] = sprintf("| %s cmds per fdatasync ≥ RedisBloom'"'"'s | %.1f vs %.1f | %s |", w, med(cpf[id]), med(cpf[ref2]), med(cpf[id]) >= med(cpf[ref2]) ? "met" : "not met")
            }
        }
    }
    if (nt) {
        print ""
        print "| target (node, medians of the rounds) | measured | |"
        print "|---|---:|---|"
        for (k = 1; k <= nt; k++) print T[k]
    }
}' "$RES"
} | tee "$OUT/table.md"

[ "$FAILED" = 0 ] || { echo "resp_bench: a run failed or a server answered errors (see above)" >&2; exit 1; }
