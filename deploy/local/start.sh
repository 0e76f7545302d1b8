#!/usr/bin/env bash
# Start a bloomgrid cluster on loopback: N nodes and M routers (default 3 and
# 1), each with its own directory and log under the state directory; with
# --copies C, the nodes form shard groups of C copies each (nodes 1..C the
# first group, and so on).  Idempotent: processes already running are left
# alone; a changed topology is written with a higher version and running
# nodes and routers re-read it (SIGHUP).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

usage() {
  echo "usage: $(basename "$0") [options]"
  echo
  echo "Start (or complete) the local cluster; print the router addresses."
  usage_common
}
parse_flags "$@"

NODE_BIN=$BUILD/node/bloomgrid-node
ROUTER_BIN=$BUILD/router/bloomgrid-router
for b in "$NODE_BIN" "$ROUTER_BIN"; do
  [ -x "$b" ] || { echo "start: $b not found: build first (make build) or pass --build DIR" >&2; exit 1; }
done
NODE_BIN=$(cd "$(dirname "$NODE_BIN")" && pwd)/bloomgrid-node
ROUTER_BIN=$(cd "$(dirname "$ROUTER_BIN")" && pwd)/bloomgrid-router
mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)

# Wait until the process of pid file $1 listens on port $2 (or died).
wait_listening() {
  local pidf=$1 port=$2 log=$3 i
  for i in $(seq 1 200); do
    if port_open "$port"; then return 0; fi
    if ! kill -0 "$(cat "$pidf")" 2>/dev/null; then
      echo "start: process died; last lines of $log:" >&2
      tail -n 20 "$log" >&2
      rm -f "$pidf"
      return 1
    fi
    sleep 0.05
  done
  echo "start: nothing listens on port $port after 10 s (see $log)" >&2
  return 1
}

# Topology: groups of COPIES nodes, written before the nodes start (they
# read it too).  The version rises whenever the groups change.
new=$(mktemp)
{
  echo "; local cluster: $((NODES / COPIES)) shard groups of $COPIES copies (written by deploy/local/start.sh)"
  for g in $(seq 1 $((NODES / COPIES))); do
    printf '[group g%d]\ncopies =' "$g"
    for c in $(seq 1 "$COPIES"); do
      printf ' 127.0.0.1:%d' "$(node_port $(( (g - 1) * COPIES + c )))"
    done
    printf '\n\n'
  done
} > "$new"
changed=0
old_version=0
if [ -f "$STATE/topology.ini" ]; then
  old_version=$(sed -n 's/^version = \([0-9]*\)$/\1/p' "$STATE/topology.ini" | head -1)
fi
if ! grep -v '^version = ' "$STATE/topology.ini" 2>/dev/null | cmp -s "$new" -; then
  { echo "version = $(( ${old_version:-0} + 1 ))"; cat "$new"; } > "$STATE/topology.ini"
  changed=1
fi
rm -f "$new"

# Nodes.
for i in $(seq 1 "$NODES"); do
  d=$STATE/node$i
  p=$(node_port "$i")
  mkdir -p "$d/data"
  if alive "$d/pid" bloomgrid-node; then
    if [ $changed = 1 ]; then
      kill -HUP "$(cat "$d/pid")"
      echo "node $i re-reads the changed topology (SIGHUP)"
    fi
    echo "node $i already running (pid $(cat "$d/pid"), 127.0.0.1:$p)"
    continue
  fi
  if port_open "$p"; then
    echo "start: port $p is taken by another process; choose --port" >&2
    exit 1
  fi
  setsid "$NODE_BIN" --listen "127.0.0.1:$p" --data-dir "$d/data" \
    --durability "$DURABILITY" --topology "$STATE/topology.ini" \
    >>"$d/node.log" 2>&1 < /dev/null &
  echo $! > "$d/pid"
  echo "127.0.0.1:$p" > "$d/addr"
  wait_listening "$d/pid" "$p" "$d/node.log"
  echo "node $i started (pid $(cat "$d/pid"), 127.0.0.1:$p, data $d/data)"
done

# Routers.
for i in $(seq 1 "$ROUTERS"); do
  d=$STATE/router$i
  p=$(router_port "$i")
  mkdir -p "$d"
  if alive "$d/pid" bloomgrid-router; then
    if [ $changed = 1 ]; then
      kill -HUP "$(cat "$d/pid")"
      echo "router $i re-reads the changed topology (SIGHUP)"
    fi
    echo "router $i already running (pid $(cat "$d/pid"), 127.0.0.1:$p)"
    continue
  fi
  rp=$(router_resp_port "$i")
  for q in "$p" "$rp"; do
    if port_open "$q"; then
      echo "start: port $q is taken by another process; choose --port" >&2
      exit 1
    fi
  done
  # The Redis door (docs/RESP.md) on a port of its own: redis-cli -p $rp.
  setsid "$ROUTER_BIN" --listen "127.0.0.1:$p" --topology "$STATE/topology.ini" \
    --resp-listen "127.0.0.1:$rp" >>"$d/router.log" 2>&1 < /dev/null &
  echo $! > "$d/pid"
  echo "127.0.0.1:$p" > "$d/addr"
  echo "127.0.0.1:$rp" > "$d/resp_addr"
  wait_listening "$d/pid" "$p" "$d/router.log"
  echo "router $i started (pid $(cat "$d/pid"), 127.0.0.1:$p, RESP 127.0.0.1:$rp)"
done
echo "state: $STATE (topology $STATE/topology.ini)"
