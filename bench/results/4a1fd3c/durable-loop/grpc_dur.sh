#!/usr/bin/env bash
# gRPC durable adds (peerbench --proto grpc, 1 key a call, DEPTH in flight) on
# two node builds with durability fsync, alternating rounds.
set -euo pipefail
NEW=$1 BASE=$2 ROUNDS=${3:-5} DEPTH=${4:-32} DUR=${5:-5}
PB=${PEERBENCH:-/work/peers/client/peerbench}
W=$(mktemp -d "${TMPDIR:-/tmp}/grpcdur.XXXXXX")
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill $p 2>/dev/null; done; wait; rm -rf $W' EXIT
start() {  # name bin
    mkdir -p $W/$1
    "$2" --listen 127.0.0.1:0 --data-dir $W/$1/data --durability fsync --resp-listen 127.0.0.1:0 --log-level warn > $W/$1/out 2>&1 &
    PIDS+=($!)
    eval "PID_$1=$!"
    for _ in $(seq 1 200); do grep -q 'listening on' $W/$1/out && break; sleep 0.1; done
    eval "ADDR_$1=$(sed -n 's/.*listening on \([0-9.:]*\).*/\1/p' $W/$1/out | head -1)"
}
start new "$NEW"; start base "$BASE"
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
for s in new base; do a=ADDR_$s; $PB --proto grpc --addr ${!a} --filter g --create --capacity 20000000 --error-rate 0.01 >/dev/null; done
for r in $(seq 1 $ROUNDS); do
    order="new base"; [ $((r % 2)) = 0 ] && order="base new"
    for s in $order; do
        a=ADDR_$s
        line=$($PB --proto grpc --addr ${!a} --filter g --op add --batch 1 --depth $DEPTH --duration $DUR --seed $((r*10)) --max-keys 20000000 | grep '^RESULT')
        echo "round $r $s $line load $(cut -d' ' -f1 /proc/loadavg)"
    done
done
