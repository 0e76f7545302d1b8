#!/usr/bin/env bash
# Stop every process of the local cluster: SIGTERM (routers first, then
# nodes, which snapshot their filters), then SIGKILL after the timeout.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

usage() {
  echo "usage: $(basename "$0") [options]"
  echo
  echo "Stop the local cluster started by start.sh (data directories stay)."
  usage_common
}
parse_flags "$@"

if [ ! -d "$STATE" ]; then
  echo "no cluster state in $STATE"
  exit 0
fi
pids=()
names=()
for d in $(proc_dirs); do
  name=$(basename "$d")
  bin=bloomgrid-node
  case "$name" in router*) bin=bloomgrid-router ;; esac
  if alive "$d/pid" "$bin"; then
    pid=$(cat "$d/pid")
    kill -TERM "$pid"
    pids+=("$pid")
    names+=("$name")
  fi
  rm -f "$d/pid"
done
if [ ${#pids[@]} -eq 0 ]; then
  echo "nothing running in $STATE"
  exit 0
fi
deadline=$((SECONDS + STOP_TIMEOUT))
for k in "${!pids[@]}"; do
  while kill -0 "${pids[$k]}" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
    sleep 0.1
  done
  if kill -0 "${pids[$k]}" 2>/dev/null; then
    echo "${names[$k]} (pid ${pids[$k]}) still running after ${STOP_TIMEOUT}s: SIGKILL"
    kill -KILL "${pids[$k]}" 2>/dev/null || true
  else
    echo "${names[$k]} stopped"
  fi
done
