#!/usr/bin/env bash
# Router door rows: a node (durability none) behind a router with resp_listen;
# (1) peerbench gRPC against RESP on the same router, single key x 32 and
# 100 keys x 8, alternating, ROUNDS rounds; (2) resp_bench.sh --router.
set -euo pipefail
B=/work/main/build
OUT=${1:-/work/notes/rdoor}
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT"; D=$(mktemp -d /tmp/rdoor.XXXX)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
NP=$(port); RP=$(port); RR=$(port)
$B/node/bloomgrid-node --listen 127.0.0.1:$NP --data-dir $D/n --durability none --log-level warn >$D/node.log 2>&1 & NPID=$!
printf 'version = 1\n[group g]\ncopies = 127.0.0.1:%s\n' $NP >$D/topo.ini
$B/router/bloomgrid-router --listen 127.0.0.1:$RP --resp-listen 127.0.0.1:$RR --topology $D/topo.ini --log-level warn >$D/router.log 2>&1 & RPID=$!
trap 'kill $NPID $RPID 2>/dev/null; rm -rf $D' EXIT
sleep 2
PB=/work/peers/client/peerbench
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
for p in grpc resp; do
  a=127.0.0.1:$RP; [ $p = resp ] && a=127.0.0.1:$RR
  $PB --proto $p --addr $a --filter f$p --create --capacity 20000000 --error-rate 0.01 >/dev/null 2>&1 || $PB --proto $p --addr $a --filter f$p --create --capacity 20000000 --error-rate 0.01
  $PB --proto $p --addr $a --filter f$p --prefill 1000000 >/dev/null
done
for r in $(seq 1 $ROUNDS); do
  for wl in "query 1 32" "add 1 32" "query 100 8" "add 100 8"; do
    set -- $wl
    order="grpc resp"; [ $((r % 2)) = 0 ] && order="resp grpc"
    for p in $order; do
      a=127.0.0.1:$RP; [ $p = resp ] && a=127.0.0.1:$RR
      c0=$(( $(cpu $NPID) + $(cpu $RPID) ))
      res=$($PB --proto $p --addr $a --filter f$p --op $1 --batch $2 --depth $3 --duration 3 --seed $((r*10+7)) --prefill-count 1000000 2>&1 | tail -1)
      c1=$(( $(cpu $NPID) + $(cpu $RPID) ))
      echo "round=$r op=$1 batch=$2 depth=$3 proto=$p srv_ticks=$((c1-c0)) $res" | tee -a $OUT/rows.txt
    done
  done
done
echo "load: $(cat /proc/loadavg)" | tee -a $OUT/rows.txt
cd /work/main && bench/resp_bench.sh --router 127.0.0.1:$RR --router-pids "$RPID $NPID" --rounds ${ROUNDS} --rows "exists-c50 exists-p32 add-c50 add-p32 pb-add-1 pb-query-1 pb-add-100 pb-query-100" --out $OUT/resp_bench > $OUT/resp_bench.log 2>&1 || echo "resp_bench rc=$?" >> $OUT/resp_bench.log
