#!/usr/bin/env bash
# split_ab.sh BUILD_A BUILD_B OUT ROUNDS N [ROWS]: RedisBloom vs router A (+ its node) vs router B
# (+ its node), redis-benchmark; user and system CPU per command from /proc; systems alternate.
set -u
BA=$1 BB=$2 OUT=$3 ROUNDS=${4:-5} N=${5:-1000000} ROWS=${6:-"exists-p32 add-p32"}
RB=/work/peers/src/RedisBloom/redisbloom.so
port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
mkdir -p $OUT; W=$OUT/w; rm -rf $W; mkdir -p $W
wait_port() { for k in $(seq 200); do (echo >/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.05; done; return 1; }
RP=$(port); redis-server --port $RP --save '' --appendonly no --loadmodule $RB --dir $W >$W/redis.log 2>&1 & RBPID=$!
wait_port $RP
start() { # BUILD TAG - NODEARGS
  local B=$1 T=$2 NA GA RR np rp; set -- "$1" "$2" "" "$3" "$4"
  NA=$(port); GA=$(port); RR=$(port)
  printf 'version = 1\n[group g]\ncopies = 127.0.0.1:%s\n' $NA > $W/topo-$T.ini
  $B/node/bloomgrid-node --listen 127.0.0.1:$NA --data-dir $W/node-$T --durability none $4 >$W/node-$T.out 2>$W/node-$T.log & np=$!
  wait_port $NA
  $B/router/bloomgrid-router --listen 127.0.0.1:$GA --resp-listen 127.0.0.1:$RR --topology $W/topo-$T.ini $5 >$W/router-$T.out 2>$W/router-$T.log & rp=$!
  wait_port $RR
  echo "$RR $rp $np"
}
read RA RPA NPA < <(start $BA a "${NA_A:-}" "${RA_A:-}")
read RB_ RPB NPB < <(start $BB b "${NA_B:-}" "${RA_B:-}")
trap "kill $RBPID $RPA $NPA $RPB $NPB 2>/dev/null" EXIT
for p in $RP $RA $RB_; do redis-cli -p $p BF.RESERVE slugs 0.01 20000000 NONSCALING >/dev/null; redis-benchmark -p $p -c 4 -P 64 -n 1000000 -q -r 2000000 BF.ADD slugs __rand_int__ >/dev/null; done
ticks() { local u=0 s=0; for p in "$@"; do read a b < <(sed "s/^.*) //" /proc/$p/stat | awk "{print \$12, \$13}"); echo -n "$a $b "; done; echo; }
declare -A PIDS=( [redisbloom]="$RBPID" [a]="$RPA $NPA" [b]="$RPB $NPB" )
declare -A PORT=( [redisbloom]=$RP [a]=$RA [b]=$RB_ )
SYS=(redisbloom a b)
echo "round row system cps user_us system_us total_us" >> $OUT/rows.txt
for r in $(seq $ROUNDS); do
 for row in $ROWS; do
  case $row in exists-p32) CMD="BF.EXISTS"; A="-c 1 -P 32";; add-p32) CMD="BF.ADD"; A="-c 1 -P 32";;
               exists-c50) CMD="BF.EXISTS"; A="-c 50 -P 1";; add-c50) CMD="BF.ADD"; A="-c 50 -P 1";; esac
  for i in 0 1 2; do
   s=${SYS[$(( (i + r) % 3 ))]}
   read -a T0 < <(ticks ${PIDS[$s]})
   cps=$(redis-benchmark -p ${PORT[$s]} $A -n $N -q -r 2000000 $CMD slugs __rand_int__ 2>/dev/null | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -1 | awk '{print $1}')
   read -a T1 < <(ticks ${PIDS[$s]})
   line="$r $row $s $cps"; for k in $(seq 0 $(( ${#T0[@]} - 1 ))); do line="$line $(awk -v a=${T0[$k]} -v b=${T1[$k]} -v n=$N 'BEGIN{printf "%.3f", (b-a)*1e4/n}')"; done
   echo "$line" | tee -a $OUT/rows.txt
  done
 done
done
echo "load: $(cat /proc/loadavg)" | tee -a $OUT/rows.txt
