#!/usr/bin/env bash
# Show every process of the local cluster: running or not, pid, address,
# whether its port accepts connections, and its log.  Exit 0 when every
# process is running, 1 otherwise.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib.sh"

usage() {
  echo "usage: $(basename "$0") [options]"
  echo
  echo "Show the state of the local cluster."
  usage_common
}
parse_flags "$@"

if [ ! -d "$STATE" ]; then
  echo "no cluster state in $STATE (start it with deploy/local/start.sh)"
  exit 1
fi
rc=0
printf '%-10s %-8s %-8s %-18s %-6s %s\n' PROCESS STATE PID ADDRESS PORT LOG
for d in $(proc_dirs); do
  name=$(basename "$d")
  n=${name#node}; n=${n#router}
  limit=$NODES; case "$name" in router*) limit=$ROUTERS ;; esac
  # Folders of an earlier, larger cluster: shown only while still running.
  if [ "$n" -gt "$limit" ] && ! alive "$d/pid" bloomgrid-; then continue; fi
  bin=bloomgrid-node
  log=$d/node.log
  case "$name" in router*) bin=bloomgrid-router; log=$d/router.log ;; esac
  addr=$(cat "$d/addr" 2>/dev/null || echo "?")
  if alive "$d/pid" "$bin"; then
    state=running
    pid=$(cat "$d/pid")
  else
    state=stopped
    pid=-
    rc=1
  fi
  port=closed
  if [ "$addr" != "?" ] && port_open "${addr##*:}"; then port=open; fi
  printf '%-10s %-8s %-8s %-18s %-6s %s\n' "$name" "$state" "$pid" "$addr" "$port" "$log"
  # A router's Redis-protocol port (docs/RESP.md), on a row of its own.
  if [ -f "$d/resp_addr" ]; then
    raddr=$(cat "$d/resp_addr")
    rport=closed
    if port_open "${raddr##*:}"; then rport=open; fi
    printf '%-10s %-8s %-8s %-18s %-6s %s\n' "  RESP" "$state" "$pid" "$raddr" "$rport" "$log"
  fi
done
exit $rc
