#!/usr/bin/env bash
# The main job (`make run`): start a local bloomgrid cluster on loopback
# (3 nodes + 1 router by default, see deploy/local/) from the binaries in
# BUILD_DIR and print how to talk to it and how to stop it.
#
# usage: deploy/run.sh [BUILD_DIR] [start.sh options...]
# Environment: BLOOMGRID_STATE, BLOOMGRID_NODES, BLOOMGRID_ROUTERS,
# BLOOMGRID_PORT, BLOOMGRID_DURABILITY (deploy/local/lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
[ $# -gt 0 ] && shift
export BLOOMGRID_BUILD=$BUILD
. deploy/local/lib.sh
usage() { echo "usage: deploy/run.sh [BUILD_DIR] [options]"; usage_common; }
parse_flags "$@"
export BLOOMGRID_STATE=$STATE BLOOMGRID_NODES=$NODES BLOOMGRID_ROUTERS=$ROUTERS \
  BLOOMGRID_PORT=$PORT BLOOMGRID_DURABILITY=$DURABILITY BLOOMGRID_BUILD=$BUILD

./deploy/local/start.sh
echo
./deploy/local/status.sh || true

router=$(cat "$BLOOMGRID_STATE/router1/addr" 2>/dev/null || echo 127.0.0.1:7501)
resp=$(cat "$BLOOMGRID_STATE/router1/resp_addr" 2>/dev/null || echo 127.0.0.1:7601)
node=$(cat "$BLOOMGRID_STATE/node1/addr" 2>/dev/null || echo 127.0.0.1:7401)
cat <<EOT

The cluster is up.  Clients talk gRPC (service bloomgrid.v1.BloomGrid,
proto/bloomgrid/v1/bloomgrid.proto) to the router at $router; every filter
created there is split into 64 shards over the nodes (docs/TOPOLOGY.md).

Try it with the bloomgrid tool:
  export BLOOMGRID_SERVER=$router
  $BUILD/cli/bloomgrid create slugs --capacity 1M --error-rate 0.01
  $BUILD/cli/bloomgrid add slugs alice bob
  $BUILD/cli/bloomgrid check slugs alice carol     # maybe alice, no carol (exit 1)
  seq 100000 | $BUILD/cli/bloomgrid add slugs --batch 10000
  $BUILD/cli/bloomgrid info slugs
  $BUILD/cli/bloomgrid help                        # every command, offline and online

Or with any Redis client: the router speaks RedisBloom's BF.* commands on
$resp (RESP port ${resp##*:}; docs/RESP.md):
  redis-cli -p ${resp##*:} BF.RESERVE users 0.01 1000000 NONSCALING
  redis-cli -p ${resp##*:} BF.ADD users alice                # 1: added
  redis-cli -p ${resp##*:} BF.MEXISTS users alice carol      # 1 maybe, 0 definitely not
  python3 -c 'import redis; print(redis.Redis(port=${resp##*:}).bf().exists("users", "alice"))'

Or with other clients (a client of your own in Python, Node.js, Go or Java:
docs/CLIENTS.md):
  # load: add/query x 1/100/1000 keys a call x sequential/in flight through
  # the router (filters of its own, dropped after), with a latency table
  bench/bench_matrix.sh --build $BUILD --systems "" --query-systems "" --target local=$router --rounds 1 --duration 1

  # with grpcurl, grpcui or Postman (if installed): every process serves gRPC
  # reflection, so no .proto file is needed:
  grpcurl -plaintext $router list
  grpcurl -plaintext $router describe bloomgrid.v1.BloomGrid.MayContain
  grpcurl -plaintext -d '{"name":"slugs","capacity":1000000,"error_rate":0.01}' $router bloomgrid.v1.BloomGrid/CreateFilter
  grpcurl -plaintext -d '{"filter":"slugs","keys":["YWxpY2U=","Ym9i"]}' $router bloomgrid.v1.BloomGrid/Add
  grpcurl -plaintext -d '{"filter":"slugs","keys":["YWxpY2U=","Y2Fyb2w="]}' $router bloomgrid.v1.BloomGrid/MayContain
  grpcurl -plaintext -d '{"name":"slugs"}' $router bloomgrid.v1.BloomGrid/GetFilter
  (keys are bytes: base64 in JSON; "YWxpY2U=" is "alice")

  # health of the router (and of any node, e.g. $node):
  grpcurl -plaintext $router grpc.health.v1.Health/Check

Logs and data:  $BLOOMGRID_STATE/{node*,router*}/  (status: deploy/local/status.sh)
Reload the topology after editing $BLOOMGRID_STATE/topology.ini:
  kill -HUP \$(cat $BLOOMGRID_STATE/router1/pid)
Stop the cluster (SIGTERM, nodes snapshot their filters; data stays):
  BLOOMGRID_STATE=$BLOOMGRID_STATE deploy/local/stop.sh
EOT
if grep -q '^stop:' Makefile 2>/dev/null; then
  echo "  (or: make stop)"
fi
