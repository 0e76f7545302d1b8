#!/usr/bin/env bash
# bench_matrix: the project's benchmark matrix in one run on loopback.
#
# Starts fresh servers from a build directory (every one on port 0, data in
# the results directory), then measures with bench/bloombench, one client
# connection per run:
#   add / query  x  1, 100, 1000 keys a call  x  sequential (1 call at a
#   time) and in flight (--depth1 calls for single keys, --depthb for
#   batches), unary calls (and, with --modes "unary stream", one
#   AddStream / MayContainStream with as many messages in flight).
# Every add run gets a fresh filter (created, filled, dropped) and stops at
# --capacity keys; queries run against a filter prefilled with --prefill
# keys, every other key of a query present.  Within each workload the
# systems take turns (the first one rotates), and every workload is run
# --rounds times, so drift of the machine hits every system alike.
#
# Systems:
#   node         one bloomgrid-node, durability fsync (its default)
#   node-none    one bloomgrid-node, durability none
#   router       --nodes nodes (fsync) behind one bloomgrid-router; filters of
#                the router's default shard count unless --shards
#   router-none  the same with nodes of durability none
#   copies1      one group of one copy (fsync) behind a router: N = 1, the
#                unreplicated case of the next two
#   copies3      one group of 3 copies (fsync) behind a router, W = 2, R = 2;
#                the nodes read the topology (group rules, anti-entropy)
#   copies3w3    the same with W = 3, R = 1
#   floor        bench/grpc_floor: the node's gRPC server with handlers that
#                touch no store (what the gRPC core alone costs here)
#   node-tls     node with TLS (and its internal listener), called over TLS
#   router-tls   router with TLS in front of --nodes nodes with TLS, called
#                over TLS, calling the nodes' internal listeners with mTLS
#                (certificates made at start by tests/tls/gen-certs.sh)
# and any server already running, named with --target NAME=HOST:PORT.
# With --base DIR every system is also started from the build in DIR (the
# commit before a change, say) as SYSTEM-base, and takes its turns beside
# the others; base.md then has each system's server CPU per key against
# its base's, round by round.
#
# Prints a line per run as it goes, then the tables (also written to the
# results directory): per workload and system the median over the rounds of
# keys/s (with the range), p50/p99/p999 latency, server CPU (cores, and µs
# per key); the keys/s (p50) matrix, and in the same layout the range of
# keys/s over the rounds and the server CPU per key; and the ratios of the
# project's targets, computed round by round (each from runs made one after
# the other).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

BUILD=build
ROUNDS=2
DURATION=2
DEPTH1=32
DEPTHB=8
BATCHES="1 100 1000"
OPS="add query"
MODES="unary"
SYSTEMS="node node-none router router-none floor"
QUERY_SYSTEMS="node router floor"
PREFILL=1000000
CAPACITY=10000000
NODES=3
SHARDS=0
OUT=
BASE=
NODE_ARGS=
ROUTER_ARGS=
TARGETS=()
KNOWN="node node-none router router-none copies1 copies3 copies3w3 floor node-tls router-tls"

usage() {
  cat <<EOF
usage: bench/bench_matrix.sh [options]

Start a node, a node without durability, two routers (each with its own
nodes, fsync and none) and the gRPC floor on loopback, and run the
add/query x 1/100/1000 keys x sequential/in-flight matrix against them with
bench/bloombench, systems alternating; print keys/s, latency, server CPU and
the target ratios.  About 4 minutes with the defaults.

options:
  --build DIR           build directory with node/, router/, bench/ [build]
  --rounds N            run every workload N times [$ROUNDS]
  --duration S          seconds per run [$DURATION]
  --depth1 N            calls in flight for single keys [$DEPTH1]
  --depthb N            calls in flight for batches [$DEPTHB]
  --batches "N ..."     keys per call [$BATCHES]
  --ops "add query"     which operations [$OPS]
  --modes "unary stream"
                        unary calls and/or one stream with the same number
                        of messages in flight [$MODES]
  --systems "..."       systems started and measured for adds
                        [$SYSTEMS]
  --query-systems "..." systems measured for queries (each is prefilled)
                        [$QUERY_SYSTEMS]
  --prefill N           keys in the query filter [$PREFILL]
  --capacity N          filter capacity (p = 1 %); an add run stops there [$CAPACITY]
  --nodes N             nodes behind each router [$NODES]
  --shards N            shards of the filters created through a router
                        (0: the router's default) [$SHARDS]
  --node-args "..."     extra flags for every node started (e.g. "--threads 16")
  --router-args "..."   extra flags for every router started
  --target NAME=ADDR    also measure a server that is already running (its
                        filters are created and dropped; no CPU figure);
                        repeatable; NAME joins both system lists
  --base DIR            also start every system from the build in DIR (e.g.
                        the commit before a change) as SYSTEM-base, measured
                        in turn with the others (same client, bloombench of
                        --build); base.md: server CPU per key against it
  --out DIR             keep results.tsv, table.md, matrix.md, spread.md,
                        cpu.md, ratios.md (base.md) and the servers' logs in
                        DIR (default: a temporary directory, removed at the
                        end)
  -h, --help            this text
Systems: $KNOWN (see the top of this file).
EOF
}

die() { echo "bench_matrix: $*" >&2; exit 2; }
need_num() { [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge "${3:-1}" ] || die "$1 takes a whole number >= ${3:-1}, not \"$2\""; }

while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || case $1 in -h|--help) ;; *) die "$1 needs a value (see --help)" ;; esac
  case $1 in
    --build) BUILD=$2 ;;
    --rounds) need_num "$1" "$2"; ROUNDS=$2 ;;
    --duration) [[ $2 =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v d="$2" 'BEGIN { exit !(d >= 0.05 && d <= 600) }' \
                  || die "--duration takes seconds from 0.05 to 600, not \"$2\""; DURATION=$2 ;;
    --depth1) need_num "$1" "$2"; DEPTH1=$2 ;;
    --depthb) need_num "$1" "$2"; DEPTHB=$2 ;;
    --batches) for b in $2; do need_num "$1" "$b"; done; BATCHES=$2 ;;
    --ops) for x in $2; do [[ $x == add || $x == query ]] || die "--ops takes add and/or query, not \"$x\""; done; OPS=$2 ;;
    --modes) for x in $2; do [[ $x == unary || $x == stream ]] || die "--modes takes unary and/or stream, not \"$x\""; done; MODES=$2 ;;
    --systems) SYSTEMS=$2 ;;
    --query-systems) QUERY_SYSTEMS=$2 ;;
    --prefill) need_num "$1" "$2" 0; PREFILL=$2 ;;
    --capacity) need_num "$1" "$2"; CAPACITY=$2 ;;
    --nodes) need_num "$1" "$2"; NODES=$2 ;;
    --shards) need_num "$1" "$2" 0; SHARDS=$2 ;;
    --node-args) NODE_ARGS=$2 ;;
    --router-args) ROUTER_ARGS=$2 ;;
    --target) [[ $2 =~ ^[A-Za-z0-9_.-]+=[^=]+:[0-9]+$ ]] || die "--target takes NAME=HOST:PORT, not \"$2\""
              TARGETS+=("$2") ;;
    --out) OUT=$2 ;;
    --base) BASE=$2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
  shift 2
done
for s in $SYSTEMS $QUERY_SYSTEMS; do
  [[ " $KNOWN " == *" $s "* ]] || die "unknown system \"$s\" (known: $KNOWN; others with --target)"
done
if [ -n "$BASE" ]; then
  for f in node/bloomgrid-node router/bloomgrid-router bench/grpc_floor; do
    [ -x "$BASE/$f" ] || die "--base: $BASE/$f not found: build the base first"
  done
  SYSTEMS="$SYSTEMS $(for s in $SYSTEMS; do printf '%s-base ' "$s"; done)"
  QUERY_SYSTEMS="$QUERY_SYSTEMS $(for s in $QUERY_SYSTEMS; do printf '%s-base ' "$s"; done)"
fi
for t in "${TARGETS[@]}"; do
  n=${t%%=*}
  [[ " $KNOWN " != *" $n "* ]] || die "--target $n: that name is a system this script starts"
  SYSTEMS="$SYSTEMS $n"; QUERY_SYSTEMS="$QUERY_SYSTEMS $n"
done
read -r -a SYS <<<"$SYSTEMS"
read -r -a QSYS <<<"$QUERY_SYSTEMS"
[[ " $OPS " != *" add "* ]] && SYS=()
[[ " $OPS " != *" query "* ]] && QSYS=()
[ ${#SYS[@]} -gt 0 ] || [ ${#QSYS[@]} -gt 0 ] || die "nothing to measure (--systems, --query-systems, --ops)"

BB=$BUILD/bench/bloombench
FLOOR=$BUILD/bench/grpc_floor
NODE_BIN=$BUILD/node/bloomgrid-node
ROUTER_BIN=$BUILD/router/bloomgrid-router
for f in "$BB" "$FLOOR" "$NODE_BIN" "$ROUTER_BIN"; do
  [ -x "$f" ] || die "$f not found: build first (cmake --build $BUILD) or pass --build DIR"
done

KEEP=1
if [ -z "$OUT" ]; then
  OUT=$(mktemp -d "${TMPDIR:-/tmp}/bench-matrix.XXXXXX")
  KEEP=0
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ST=$OUT/state
rm -rf "$ST"
mkdir -p "$ST"
RES=$OUT/results.tsv
: >"$RES"

declare -A ADDR PIDS BBTLS
STARTED=()     # every process this script started
cleanup() {
  set +e
  local p
  for p in "${STARTED[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${STARTED[@]}"; do
    for _ in $(seq 1 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  if [ $KEEP = 1 ]; then
    rm -rf "$ST"/*/data "$ST"/*/node*/data     # keep the logs, not the filters
  else
    rm -rf "$OUT"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Start a server that prints "... listening on HOST:PORT"; sets LAST_PID and
# LAST_ADDR.  dir holds its stdout, log and data.
start_server() {
  local what=$1 dir=$2 i
  shift 2
  mkdir -p "$dir"
  "$@" >"$dir/stdout" 2>"$dir/log" </dev/null &
  LAST_PID=$!
  STARTED+=("$LAST_PID")
  for i in $(seq 1 400); do
    # The server's shell may not have made its stdout file yet.
    LAST_ADDR=$(sed -n 's/.*listening on \([^ ]*\).*/\1/p' "$dir/stdout" 2>/dev/null | head -n 1 || true)
    [ -n "$LAST_ADDR" ] && return 0
    kill -0 "$LAST_PID" 2>/dev/null || break
    sleep 0.05
  done
  echo "bench_matrix: $what did not start; last lines of $dir/log:" >&2
  tail -n 5 "$dir/log" >&2
  exit 1
}

# TLS systems: the test certificates (CA, node, router) and the flags.
CERTS=$ST/certs
tls_flags() {  # name: TLS flags of a node or router with certificate NAME
  [ -f "$CERTS/ca.pem" ] || sh "$HERE/../tests/tls/gen-certs.sh" "$CERTS" >/dev/null
  echo "--tls-cert $CERTS/$1.pem --tls-key $CERTS/$1.key --tls-ca $CERTS/ca.pem"
}

start_node() {  # dir durability [extra flags]
  # shellcheck disable=SC2086  # NODE_ARGS is a list of flags
  start_server "node $1" "$1" "$NODE_BIN" --listen 127.0.0.1:0 --data-dir "$1/data" \
    --durability "$2" --log-level warn ${3:-} $NODE_ARGS
  # What routers call: the internal listener when there is one.
  LAST_IADDR=$(sed -n 's/.*listening on [^ ]* internal \([^ ]*\).*/\1/p' "$1/stdout")
  LAST_IADDR=${LAST_IADDR:-$LAST_ADDR}
}

start_router() {  # name durability [tls]
  local d=$ST/$1 i pids= nflags= rflags=
  mkdir -p "$d"
  if [ -n "${3:-}" ]; then
    nflags="$(tls_flags node) --internal-listen 127.0.0.1:0"
    rflags=$(tls_flags router)
  fi
  echo "version = 1" >"$d/topology.ini"
  for i in $(seq 1 "$NODES"); do
    start_node "$d/node$i" "$2" "$nflags"
    pids="$pids $LAST_PID"
    printf '[group node%d]\ncopies = %s\n\n' "$i" "$LAST_IADDR" >>"$d/topology.ini"
  done
  # shellcheck disable=SC2086
  start_server "router $1" "$d/router" "$ROUTER_BIN" --listen 127.0.0.1:0 \
    --topology "$d/topology.ini" --log-level warn $rflags $ROUTER_ARGS
  ADDR[$1]=$LAST_ADDR
  PIDS[$1]="$LAST_PID$pids"
}

free_port() {  # a port free on loopback now (the node binds it a moment later)
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

start_copies() {  # name copies write_quorum read_quorum
  local d=$ST/$1 i pids= addrs=() ports=()
  mkdir -p "$d"
  for i in $(seq 1 "$2"); do
    ports+=("$(free_port)")
    addrs+=("127.0.0.1:${ports[-1]}")
  done
  printf 'version = 1\n[group g]\ncopies = %s\nwrite_quorum = %s\nread_quorum = %s\n' \
    "${addrs[*]}" "$3" "$4" >"$d/topology.ini"
  for i in $(seq 1 "$2"); do
    # shellcheck disable=SC2086
    start_server "node $d/node$i" "$d/node$i" "$NODE_BIN" --listen "${addrs[$((i - 1))]}" \
      --data-dir "$d/node$i/data" --durability fsync --topology "$d/topology.ini" \
      --log-level warn $NODE_ARGS
    pids="$pids $LAST_PID"
  done
  # shellcheck disable=SC2086
  start_server "router $1" "$d/router" "$ROUTER_BIN" --listen 127.0.0.1:0 \
    --topology "$d/topology.ini" --log-level warn $ROUTER_ARGS
  ADDR[$1]=$LAST_ADDR
  PIDS[$1]="$LAST_PID$pids"
}

for s in $(printf '%s\n' "${SYS[@]}" "${QSYS[@]}" | awk '!seen[$0]++'); do
  # SYSTEM-base: the same system from the --base build.
  b=$BUILD
  [ -n "$BASE" ] && [ "${s%-base}" != "$s" ] && b=$BASE
  NODE_BIN=$b/node/bloomgrid-node; ROUTER_BIN=$b/router/bloomgrid-router
  FLOOR=$b/bench/grpc_floor
  case ${s%-base} in
    node|node-none)
      start_node "$ST/$s" "$([ "${s%-base}" = node ] && echo fsync || echo none)"
      ADDR[$s]=$LAST_ADDR; PIDS[$s]=$LAST_PID ;;
    router) start_router "$s" fsync ;;
    router-none) start_router "$s" none ;;
    copies1) start_copies "$s" 1 1 1 ;;
    copies3) start_copies "$s" 3 2 2 ;;
    copies3w3) start_copies "$s" 3 3 1 ;;
    floor)
      start_server "$s" "$ST/$s" "$FLOOR" --listen 127.0.0.1:0
      ADDR[$s]=$LAST_ADDR; PIDS[$s]=$LAST_PID ;;
    node-tls)
      start_node "$ST/$s" fsync "$(tls_flags node) --internal-listen 127.0.0.1:0"
      ADDR[$s]=$LAST_ADDR; PIDS[$s]=$LAST_PID; BBTLS[$s]="--tls-ca $CERTS/ca.pem" ;;
    router-tls)
      start_router "$s" fsync tls
      BBTLS[$s]="--tls-ca $CERTS/ca.pem" ;;
  esac
done
for t in "${TARGETS[@]}"; do ADDR[${t%%=*}]=${t#*=}; PIDS[${t%%=*}]=; done

HZ=$(getconf CLK_TCK)
cpu_ticks() {  # sum of user+system ticks of the pids
  local t=0 p v
  for p in "$@"; do
    v=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }') || v=0
    t=$((t + ${v:-0}))
  done
  echo "$t"
}

TMO=$(awk -v d="$DURATION" 'BEGIN { printf "%d", d + 90 }')
bb() {  # system, then bloombench arguments
  local s=$1
  shift
  # shellcheck disable=SC2086  # BBTLS holds flags
  timeout "$TMO" "$BB" --target "${ADDR[$s]}" ${BBTLS[$s]:-} "$@"
}

echo "bench_matrix: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at start;" \
     "commit $(git -C "$HERE" rev-parse --short HEAD 2>/dev/null || echo unknown);" \
     "${DURATION}s per run, $ROUNDS rounds; depth $DEPTH1 (single keys) / $DEPTHB (batches); results in $OUT$([ $KEEP = 1 ] || echo " (removed at the end: keep them with --out)")"
for s in "${!ADDR[@]}"; do echo "  $s: ${ADDR[$s]}"; done

# One measured run; appends a row to results.tsv and prints it.
run() {  # round workload system filter bloombench-args...
  local r=$1 w=$2 s=$3 f=$4 line t0 t1
  shift 4
  t0=$(cpu_ticks ${PIDS[$s]})
  if ! line=$(bb "$s" --filter "$f" --duration "$DURATION" "$@" 2>"$ST/err.txt" | grep '^RESULT'); then
    line="RESULT keys=0 calls=0 secs=1 kps=0 cps=0 p50=0 p99=0 p999=0 true=0 errors=1 ccpu=0"
  fi
  t1=$(cpu_ticks ${PIDS[$s]})
  [ -s "$ST/err.txt" ] && sed "s/^/  [$s $w] /" "$ST/err.txt" | head -n 3 >&2
  echo "$line" | awk -v r="$r" -v w="$w" -v s="$s" -v dt=$((t1 - t0)) -v hz="$HZ" \
                     -v cpu="${PIDS[$s]:+1}" '{
      for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "%s\t%s\t%s\t%.0f\t%.1f\t%.1f\t%.1f\t%s\t%.2f\t%.4f\t%d\t%.2f\n", r, w, s, v["kps"],
             v["p50"], v["p99"], v["p999"], cpu ? sprintf("%.2f", dt / hz / v["secs"]) : "-",
             v["ccpu"] / v["secs"], v["true"], v["errors"], v["secs"]
    }' | tee -a "$RES" | awk -F'\t' '{ printf "  %-22s %-12s %11s keys/s  p50 %8s  p99 %9s us  srv %s cli %s cores%s\n",
        $2, $3, $4, $5, $6, $8, $9, ($11 > 0 ? "  ERRORS" : "") }'
}

# Readiness: a create/drop round trip on every system.
for s in $(printf '%s\n' "${SYS[@]}" "${QSYS[@]}" | awk '!seen[$0]++'); do
  { bb "$s" --filter ready --create --capacity 1000 >/dev/null && bb "$s" --filter ready --drop >/dev/null; } \
    || die "$s (${ADDR[$s]}) is not answering"
done

# Workloads: "batch depth" pairs.
WL=()
for b in $BATCHES; do
  WL+=("$b 1" "$b $([ "$b" = 1 ] && echo "$DEPTH1" || echo "$DEPTHB")")
done
wname() {  # op mode batch depth
  echo "$1$([ "$2" = stream ] && echo " stream") b$3 d$4"
}

# Every workload of one operation in one round, the systems taking turns
# (the first one rotates from workload to workload).
workloads() {  # round op systems...
  local round=$1 op=$2 mode wl b d w n k s args
  shift 2
  local sys=("$@")
  for mode in $MODES; do
    for wl in "${WL[@]}"; do
      read -r b d <<<"$wl"
      w=$(wname "$op" "$mode" "$b" "$d")
      echo "== round $round: $w"
      n=${#sys[@]}
      for k in $(seq 0 $((n - 1))); do
        s=${sys[$(((k + i) % n))]}
        seed=$((seed + 1))
        args=(--batch "$b" --depth "$d" --seed "$seed")
        [ "$mode" = stream ] && args+=(--stream)
        if [ "$op" = add ]; then    # a fresh filter for every add run
          bb "$s" --filter "a$i" --create --capacity "$CAPACITY" --shards "$SHARDS" >/dev/null
          run "$round" "$w" "$s" "a$i" --op add "${args[@]}" --max-keys "$CAPACITY"
          bb "$s" --filter "a$i" --drop >/dev/null
        else
          run "$round" "$w" "$s" q --op query "${args[@]}" --prefill-seed 7 \
            --prefill-count "$PREFILL"
        fi
      done
      i=$((i + 1))
    done
  done
}

i=0
seed=100
for round in $(seq 1 "$ROUNDS"); do
  if [ ${#SYS[@]} -gt 0 ]; then workloads "$round" add "${SYS[@]}"; fi
  if [ ${#QSYS[@]} -gt 0 ]; then
    if [ "$round" = 1 ]; then
      echo "== prefill $PREFILL keys"
      for s in "${QSYS[@]}"; do
        bb "$s" --filter q --create --capacity "$CAPACITY" --shards "$SHARDS" >/dev/null
        bb "$s" --filter q --prefill "$PREFILL" --prefill-seed 7 | sed "s/^/  $s: /"
      done
    fi
    workloads "$round" query "${QSYS[@]}"
  fi
done
for s in "${QSYS[@]}"; do bb "$s" --filter q --drop >/dev/null || true; done

echo
echo "load average at end $(cut -d' ' -f1-3 /proc/loadavg)"
echo
ALL=$(printf '%s\n' "${SYS[@]}" "${QSYS[@]}" | awk '!seen[$0]++' | tr '\n' ' ')
# Medians over the rounds, per (workload, system).
awk -F'\t' -v dur="$DURATION" -v sys="$ALL" -f "$HERE/bench_matrix.awk" -v part=table "$RES" | tee "$OUT/table.md"
echo
awk -F'\t' -v sys="$ALL" -f "$HERE/bench_matrix.awk" -v part=matrix "$RES" | tee "$OUT/matrix.md"
echo
awk -F'\t' -v sys="$ALL" -f "$HERE/bench_matrix.awk" -v part=spread "$RES" | tee "$OUT/spread.md"
echo
awk -F'\t' -v sys="$ALL" -f "$HERE/bench_matrix.awk" -v part=cpu "$RES" | tee "$OUT/cpu.md"
echo
awk -F'\t' -v part=ratios -v depth1="$DEPTH1" -v depthb="$DEPTHB" -f "$HERE/bench_matrix.awk" "$RES" \
  | tee "$OUT/ratios.md"
if [ -n "$BASE" ]; then
  echo
  awk -F'\t' -v sys="$ALL" -f "$HERE/bench_matrix.awk" -v part=base "$RES" | tee "$OUT/base.md"
fi
if awk -F'\t' '$11 > 0 { bad = 1 } END { exit !bad }' "$RES"; then
  echo "bench_matrix: some runs had errors (see above)" >&2
  exit 1
fi
