#!/bin/sh
# The image's entry point: the first argument names the program.
#   node|router|merger ARGS...   bloomgrid-node, -router, -merger
#   bloomgrid|cli ARGS...        the command-line tool
#   healthcheck                  the image's HEALTHCHECK (below)
#   --help | help                this text
#   --version                    every program's version
#
# healthcheck asks the server of this container `bloomgrid health` (a
# grpc.health.v1 Check): exit 0 SERVING, else 1.  The server is the
# bloomgrid-node, -router or -merger process of the container (PID 1, or
# the first found when an init runs first); the address asked is its
# health_listen (the --health-listen flag, else the health_listen line of
# its --config file), or without one its listen address in plaintext.  A
# wildcard host (0.0.0.0, ::) is asked on loopback.  Environment:
#   BLOOMGRID_HEALTH_ADDR     ask HOST:PORT instead
#   BLOOMGRID_HEALTH_SERVICE  the service asked: "" (default, liveness:
#                             SERVING while a copy is SYNCING) or
#                             bloomgrid.v1.BloomGrid (readiness)
#   BLOOMGRID_HEALTH_PID      the server's process id (default: found)
#   BLOOMGRID_BIN_DIR         where the programs are [/usr/bin]
set -eu
BIN=${BLOOMGRID_BIN_DIR:-/usr/bin}
usage() {
    cat <<'TXT'
usage: (docker|podman) run IMAGE PROGRAM [ARGS...]
  node ARGS      bloomgrid-node   (node --help lists every setting)
  router ARGS    bloomgrid-router
  merger ARGS    bloomgrid-merger
  bloomgrid ARGS the command-line tool (also: cli ARGS)
  healthcheck    the image's HEALTHCHECK: bloomgrid health on the server's
                 health_listen (deploy/image/README.md)
Settings files go under /etc/bloomgrid (mount them), data under
/var/lib/bloomgrid (a volume).  Manual pages: man bloomgrid-node, ...
TXT
}

# The server process: $BLOOMGRID_HEALTH_PID, PID 1, or the first
# bloomgrid-node/-router/-merger found.  Prints its pid, or nothing.
server_pid() {
    if [ -n "${BLOOMGRID_HEALTH_PID:-}" ]; then
        echo "$BLOOMGRID_HEALTH_PID"
        return
    fi
    for p in 1 $(ls /proc | grep -E '^[0-9]+$' | sort -n); do
        case "$(basename "$(tr '\0' '\n' < "/proc/$p/cmdline" 2>/dev/null | head -n 1)")" in
            bloomgrid-node|bloomgrid-router|bloomgrid-merger) echo "$p"; return ;;
        esac
    done
}

# The value of setting $2 in ini file $1 (the last line that sets it).
ini_get() {
    sed -n "s/^[[:space:]]*$2[[:space:]]*=[[:space:]]*//p" "$1" 2>/dev/null |
        sed 's/[[:space:]]*[;#].*$//; s/[[:space:]]*$//' | tail -n 1
}

# The address to ask, from the server's command line and settings file.
health_addr() {
    pid=$1
    args=$(tr '\0' '\n' < "/proc/$pid/cmdline")
    health= listen= conf= prev=
    while IFS= read -r a; do
        case "$prev" in
            --health-listen) health=$a ;;
            --listen) listen=$a ;;
            --config) conf=$a ;;
        esac
        case "$a" in
            --health-listen=*) health=${a#*=} ;;
            --listen=*) listen=${a#*=} ;;
            --config=*) conf=${a#*=} ;;
        esac
        prev=$a
    done <<ARGS
$args
ARGS
    if [ -n "$conf" ]; then
        case "$conf" in /*) ;; *) conf=/proc/$pid/cwd/$conf ;; esac
        [ -n "$health" ] || health=$(ini_get "$conf" health_listen)
        [ -n "$listen" ] || listen=$(ini_get "$conf" listen)
    fi
    addr=${health:-$listen}
    [ -n "$addr" ] || return 0
    host=${addr%:*} port=${addr##*:}
    case "$host" in
        ""|0.0.0.0|"*") host=127.0.0.1 ;;
        "[::]"|"::") host="[::1]" ;;
    esac
    echo "$host:$port"
}

health_check() {
    addr=${BLOOMGRID_HEALTH_ADDR:-}
    if [ -z "$addr" ]; then
        pid=$(server_pid)
        if [ -z "$pid" ]; then
            echo "healthcheck: no bloomgrid-node, -router or -merger in this container: nothing to check"
            exit 0
        fi
        if [ ! -r "/proc/$pid/cmdline" ]; then
            echo "healthcheck: process $pid is gone" >&2
            exit 1
        fi
        case "$(basename "$(tr '\0' '\n' < "/proc/$pid/cmdline" | head -n 1)")" in
            bloomgrid-node|bloomgrid-router|bloomgrid-merger) ;;
            *) echo "healthcheck: process $pid is not a bloomgrid server: nothing to check"
               exit 0 ;;
        esac
        addr=$(health_addr "$pid")
        if [ -z "$addr" ]; then
            echo "healthcheck: process $pid has neither health_listen nor listen set" >&2
            exit 1
        fi
    fi
    "$BIN/bloomgrid" health "$addr" --service "${BLOOMGRID_HEALTH_SERVICE:-}" && exit 0
    exit 1
}

[ $# -gt 0 ] || { usage; exit 2; }
prog=$1
shift
case "$prog" in
    node|router|merger) exec "$BIN/bloomgrid-$prog" "$@" ;;
    bloomgrid|cli) exec "$BIN/bloomgrid" "$@" ;;
    bloomgrid-node|bloomgrid-router|bloomgrid-merger) exec "$BIN/$prog" "$@" ;;
    healthcheck) health_check ;;
    --version)
        for p in bloomgrid bloomgrid-node bloomgrid-router bloomgrid-merger; do "$BIN/$p" --version; done ;;
    -h|--help|help) usage ;;
    *) echo "bloomgrid image: unknown program '$prog'" >&2; usage >&2; exit 2 ;;
esac
