#!/usr/bin/env bash
# st.sh BUILD CMD [OUT]: syscalls per round trip of router and node under redis-benchmark -c 1 -P 32
set -u
B=$1 CMD=${2:-BF.EXISTS} OUT=${3:-/tmp/me2/st/out}
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
mkdir -p $OUT; W=$OUT/w; rm -rf $W; mkdir -p $W
wait_port() { for k in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; return 1; }
NA=$(port); GA=$(port); RR=$(port)
printf 'version = 1\n[group g]\ncopies = 127.0.0.1:%s\n' $NA > $W/topo.ini
$B/node/bloomgrid-node --listen 127.0.0.1:$NA --data-dir $W/node --durability none >$W/node.out 2>$W/node.log & NPID=$!
wait_port $NA
$B/router/bloomgrid-router --listen 127.0.0.1:$GA --resp-listen 127.0.0.1:$RR --topology $W/topo.ini ${RARGS:-} >$W/router.out 2>$W/router.log & RTPID=$!
wait_port $RR
trap "kill $NPID $RTPID 2>/dev/null" EXIT
redis-cli -p $RR BF.RESERVE slugs 0.01 20000000 NONSCALING
redis-benchmark -p $RR -c 4 -P 64 -n 300000 -q -r 2000000 BF.ADD slugs __rand_int__ >/dev/null
timeout 5 strace -c -f -p $RTPID -o $OUT/router.strace & S1=$!
timeout 5 strace -c -f -p $NPID -o $OUT/node.strace & S2=$!
sleep 0.5
redis-benchmark -p $RR -c 1 -P 32 -n 200000 -q -r 2000000 $CMD slugs __rand_int__ > $OUT/bench.txt 2>&1
wait $S1 $S2
# RedisBloom, the same load and the same count:
RB=${RB:-/work/peers/src/RedisBloom/redisbloom.so}
RP=$(port); redis-server --port $RP --save '' --appendonly no --loadmodule $RB --dir $W >$W/redis.log 2>&1 & RBPID=$!
wait_port $RP
trap "kill $NPID $RTPID $RBPID 2>/dev/null" EXIT
redis-cli -p $RP BF.RESERVE slugs 0.01 20000000 NONSCALING
redis-benchmark -p $RP -c 4 -P 64 -n 300000 -q -r 2000000 BF.ADD slugs __rand_int__ >/dev/null
timeout 5 strace -c -f -p $RBPID -o $OUT/redis.strace & S3=$!
sleep 0.5
redis-benchmark -p $RP -c 1 -P 32 -n 200000 -q -r 2000000 $CMD slugs __rand_int__ > $OUT/bench-redis.txt 2>&1
wait $S3
