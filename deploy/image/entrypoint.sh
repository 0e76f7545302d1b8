#!/bin/sh
# The image's entry point: the first argument names the program.
#   node|router|merger ARGS...   bloomgrid-node, -router, -merger
#   bloomgrid|cli ARGS...        the command-line tool
#   --help | help                this text
#   --version                    every program's version
set -eu
usage() {
    cat <<'TXT'
usage: (docker|podman) run IMAGE PROGRAM [ARGS...]
  node ARGS      bloomgrid-node   (node --help lists every setting)
  router ARGS    bloomgrid-router
  merger ARGS    bloomgrid-merger
  bloomgrid ARGS the command-line tool (also: cli ARGS)
Settings files go under /etc/bloomgrid (mount them), data under
/var/lib/bloomgrid (a volume).  Manual pages: man bloomgrid-node, ...
TXT
}
[ $# -gt 0 ] || { usage; exit 2; }
prog=$1
shift
case "$prog" in
    node|router|merger) exec "/usr/bin/bloomgrid-$prog" "$@" ;;
    bloomgrid|cli) exec /usr/bin/bloomgrid "$@" ;;
    bloomgrid-node|bloomgrid-router|bloomgrid-merger) exec "/usr/bin/$prog" "$@" ;;
    --version)
        for p in bloomgrid bloomgrid-node bloomgrid-router bloomgrid-merger; do "/usr/bin/$p" --version; done ;;
    -h|--help|help) usage ;;
    *) echo "bloomgrid image: unknown program '$prog'" >&2; usage >&2; exit 2 ;;
esac
