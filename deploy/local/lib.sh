# Shared settings and helpers of the local-cluster scripts (sourced).
#
# Settings (environment, or the flags of start.sh / stop.sh / status.sh):
#   BLOOMGRID_STATE    state directory               [./run/local]
#   BLOOMGRID_BUILD    CMake build directory         [./build]
#   BLOOMGRID_NODES    number of nodes               [3]
#   BLOOMGRID_COPIES   copies per shard group: the nodes form groups of
#                      this many (NODES a multiple of it)   [1]
#   BLOOMGRID_ROUTERS  number of routers             [1]
#   BLOOMGRID_PORT     first port: nodes listen on PORT+1.., routers on
#                      PORT+100.., the routers' Redis-protocol ports
#                      (RESP, docs/RESP.md) on PORT+200..   [7400]
#   BLOOMGRID_DURABILITY  fsync|none for the nodes   [fsync]
#   BLOOMGRID_STOP_TIMEOUT  seconds stop waits after SIGTERM before SIGKILL [15]
# Layout under the state directory:
#   topology.ini                 the topology every router reads
#   node<i>/{data/,node.log,pid,addr}
#   router<i>/{router.log,pid,addr,resp_addr}

STATE=${BLOOMGRID_STATE:-./run/local}
BUILD=${BLOOMGRID_BUILD:-./build}
NODES=${BLOOMGRID_NODES:-3}
COPIES=${BLOOMGRID_COPIES:-1}
ROUTERS=${BLOOMGRID_ROUTERS:-1}
PORT=${BLOOMGRID_PORT:-7400}
DURABILITY=${BLOOMGRID_DURABILITY:-fsync}
STOP_TIMEOUT=${BLOOMGRID_STOP_TIMEOUT:-15}

usage_common() {
  cat <<USAGE
options (each also an environment variable):
  --state DIR       state directory, one folder per process   [\$BLOOMGRID_STATE, ./run/local]
  --build DIR       build directory holding the binaries       [\$BLOOMGRID_BUILD, ./build]
  --nodes N         nodes                                      [\$BLOOMGRID_NODES, 3]
  --copies N        copies per shard group (groups of N nodes) [\$BLOOMGRID_COPIES, 1]
  --routers N       routers                                    [\$BLOOMGRID_ROUTERS, 1]
  --port P          nodes on P+1.., routers on P+100.., their
                    RESP ports on P+200..                      [\$BLOOMGRID_PORT, 7400]
  --durability M    fsync|none for the nodes                   [\$BLOOMGRID_DURABILITY, fsync]
  --timeout S       stop: seconds after SIGTERM before SIGKILL [\$BLOOMGRID_STOP_TIMEOUT, 15]
USAGE
}

parse_flags() {
  while [ $# -gt 0 ]; do
    case "$1" in
      --state) STATE=$2; shift 2 ;;
      --build) BUILD=$2; shift 2 ;;
      --nodes) NODES=$2; shift 2 ;;
      --copies) COPIES=$2; shift 2 ;;
      --routers) ROUTERS=$2; shift 2 ;;
      --port) PORT=$2; shift 2 ;;
      --durability) DURABILITY=$2; shift 2 ;;
      --timeout) STOP_TIMEOUT=$2; shift 2 ;;
      -h|--help) usage; exit 0 ;;
      *) echo "$(basename "$0"): unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
  done
  case "$NODES$COPIES$ROUTERS$PORT$STOP_TIMEOUT" in
    *[!0-9]*) echo "$(basename "$0"): --nodes, --copies, --routers, --port and --timeout take numbers" >&2; exit 2 ;;
  esac
  if [ "$NODES" -lt 1 ] || [ "$ROUTERS" -lt 0 ]; then
    echo "$(basename "$0"): need at least one node" >&2; exit 2
  fi
  if [ "$COPIES" -lt 1 ] || [ "$COPIES" -gt 8 ] || [ $((NODES % COPIES)) -ne 0 ]; then
    echo "$(basename "$0"): --copies must be 1..8 and divide --nodes ($NODES)" >&2; exit 2
  fi
  if [ "$COPIES" -gt 1 ] && [ "$DURABILITY" = none ]; then
    echo "$(basename "$0"): --durability none cannot serve groups of $COPIES copies (a copy would count towards the write quorum with writes a crash loses)" >&2; exit 2
  fi
}

node_port() { echo $((PORT + $1)); }
router_port() { echo $((PORT + 100 + $1)); }
router_resp_port() { echo $((PORT + 200 + $1)); }

# Is the process of pid file $1 alive and running binary $2?
alive() {
  local pidf=$1 bin=$2 pid
  [ -f "$pidf" ] || return 1
  pid=$(cat "$pidf" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$bin"
}

# Does something accept connections on 127.0.0.1:$1?
port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Every process directory of the state dir (routers first, for stopping).
proc_dirs() {
  local d
  for d in "$STATE"/router* "$STATE"/node*; do
    [ -d "$d" ] && echo "$d"
  done
}
