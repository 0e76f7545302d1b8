#!/usr/bin/env bash
# ppollcount.sh C N: the node's ppoll calls (the loop's waits) during N BF.ADD from C connections
set -uo pipefail
C=$1; N=$2; BIN=${BIN:-build/node/bloomgrid-node}
D=$(mktemp -d)
$BIN --listen 127.0.0.1:0 --resp-listen 127.0.0.1:0 --data-dir $D/data --durability fsync --log-level warn >$D/log 2>&1 & PID=$!
for i in $(seq 100); do grep -q 'listening on' $D/log && break; sleep 0.1; done
P=$(sed -n 's/.* resp 127\.0\.0\.1:\([0-9]*\).*/\1/p' $D/log | head -1)
redis-cli -p $P BF.RESERVE slugs 0.01 20000000 NONSCALING >/dev/null
perf stat -x, -o $D/perf.txt -e syscalls:sys_enter_ppoll,syscalls:sys_enter_fdatasync,syscalls:sys_enter_epoll_wait -p $PID >/dev/null 2>&1 & PP=$!
sleep 0.3
redis-benchmark -p $P -c $C -n $N -r 20000000 -q BF.ADD slugs __rand_int__ > $D/rb.txt 2>&1
kill -INT $PP; wait $PP
echo "c=$C n=$N: $(tr '\r' '\n' < $D/rb.txt | grep -o '[0-9.]* requests per second' | tail -1); $(awk -F, '/syscalls/ {printf "%s %s; ", $3, $1}' $D/perf.txt)"
kill $PID; wait $PID 2>/dev/null; rm -rf $D
