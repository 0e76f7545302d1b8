#!/usr/bin/env bash
# Run the image as an operator would: every program's --version; a node and
# a router from the image on loopback (host network), each with a
# health_listen; the image's HEALTHCHECK in each container (liveness, and
# the router's readiness, which fails once its node is stopped); the
# image's CLI builds and queries a file, and creates, adds to and checks a
# filter through the router.  Exits non-zero on the first failure.
#
# usage: deploy/image/test.sh [--ports NODE[,NODE_HEALTH[,ROUTER[,ROUTER_HEALTH]]]] [IMAGE]
#   --ports LIST  the loopback ports the node and the router listen on, in
#                 that order (the node's public listener, its health_listen,
#                 the router's, its health_listen); those not given are
#                 free ports picked at start.  make image-test PORTS=LIST
#   IMAGE         the image to run                       [bloomgrid:latest]
# Exit status: 0 pass, 1 a check failed or no engine runs, 2 bad options.
set -euo pipefail
usage() { sed -n '9,15p' "$0" | sed 's/^# \{0,1\}//'; }
IMAGE=bloomgrid:latest
PORTS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --ports|--ports=*)
      if [ "$1" = --ports ]; then
        [ $# -ge 2 ] || { echo "test.sh: --ports needs a list (see --help)" >&2; exit 2; }
        list=$2; shift 2
      else
        list=${1#*=}; shift
      fi
      IFS=, read -r -a PORTS <<<"$list"
      [ ${#PORTS[@]} -ge 1 ] && [ ${#PORTS[@]} -le 4 ] ||
        { echo "test.sh: --ports takes 1 to 4 ports, got '$list'" >&2; exit 2; }
      for p in "${PORTS[@]}"; do
        [[ "$p" =~ ^[0-9]{1,5}$ ]] && [ "$p" -ge 1 ] && [ "$p" -le 65535 ] ||
          { echo "test.sh: --ports: '$p' is not a port from 1 to 65535" >&2; exit 2; }
      done
      [ "$(printf '%s\n' "${PORTS[@]}" | sort -u | wc -l)" -eq ${#PORTS[@]} ] ||
        { echo "test.sh: --ports: '$list' names a port twice" >&2; exit 2; }
      ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "test.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) IMAGE=$1; shift ;;
  esac
done

ENGINE=
for e in podman docker; do
  if command -v "$e" >/dev/null 2>&1 && "$e" info >/dev/null 2>&1; then ENGINE=$e; break; fi
done
[ -n "$ENGINE" ] || { echo "test.sh: neither podman nor docker can run here" >&2; exit 1; }
ARGS=()
if [ "$ENGINE" = podman ] && ! podman run --rm --network host "$IMAGE" --version >/dev/null 2>&1; then
  conf=$(mktemp)
  printf '[containers]\ndefault_ulimits = []\n' > "$conf"
  export CONTAINERS_CONF=$conf
  ARGS=(--runtime runc)
fi
ctr() { "$ENGINE" "${ARGS[@]}" "$@"; }
names=()
cleanup() { for n in "${names[@]}"; do ctr rm -f "$n" >/dev/null 2>&1 || true; done; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

out=$(ctr run --rm "$IMAGE" --version) || fail "--version"
for p in bloomgrid bloomgrid-node bloomgrid-router bloomgrid-merger; do
  grep -q "^$p [0-9]" <<<"$out" || fail "no version of $p in: $out"
done
echo "$out"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_port() {
  for _ in $(seq 1 100); do
    busy "$1" && return 0
    sleep 0.1
  done
  return 1
}
while [ ${#PORTS[@]} -lt 4 ]; do
  p=$(free_port)
  [[ " ${PORTS[*]} " == *" $p "* ]] || PORTS+=("$p")
done
np=${PORTS[0]} nh=${PORTS[1]} rp=${PORTS[2]} rh=${PORTS[3]}
for p in "${PORTS[@]}"; do
  ! busy "$p" || fail "port $p is in use: choose others with --ports"
done
echo "ports: node $np (health $nh), router $rp (health $rh)"

# The image carries the HEALTHCHECK (podman keeps it only in the docker
# format, which build.sh asks for).
inspect=$(ctr image inspect "$IMAGE") || fail "image inspect $IMAGE"
grep -q 'bloomgrid-entrypoint.*healthcheck' <<<"$inspect" ||
  fail "the image has no HEALTHCHECK running bloomgrid-entrypoint healthcheck"
# What the engine runs for HEALTHCHECK, run now rather than waiting for it.
healthcheck() { ctr exec "$@" /usr/bin/bloomgrid-entrypoint healthcheck; }

tag=bgtest-$$
names+=("$tag-node" "$tag-router")
ctr run -d --name "$tag-node" --network host "$IMAGE" node --listen "127.0.0.1:$np" \
  --health-listen "127.0.0.1:$nh" --data-dir /var/lib/bloomgrid/node >/dev/null
wait_port "$np" || fail "the node did not listen: $(ctr logs "$tag-node" 2>&1 | tail -5)"
topo=$(mktemp -d)
printf 'version = 1\n[group g0]\ncopies = 127.0.0.1:%s\n' "$np" > "$topo/topology.ini"
printf '[router]\nlisten = 127.0.0.1:%s\nhealth_listen = 127.0.0.1:%s\ntopology = /etc/bloomgrid/topology.ini\n' \
  "$rp" "$rh" > "$topo/router.ini"
chmod -R a+rX "$topo"
ctr run -d --name "$tag-router" --network host -v "$topo:/etc/bloomgrid:ro" "$IMAGE" router \
  --config /etc/bloomgrid/router.ini >/dev/null
wait_port "$rp" || fail "the router did not listen: $(ctr logs "$tag-router" 2>&1 | tail -5)"

# Liveness of both (the node's from its flag, the router's from its
# settings file), and the router's readiness once it sees its node.
healthcheck "$tag-node" || fail "the node's healthcheck"
healthcheck "$tag-router" || fail "the router's healthcheck"
ready=
for _ in $(seq 1 50); do
  if healthcheck -e BLOOMGRID_HEALTH_SERVICE=bloomgrid.v1.BloomGrid "$tag-router" >/dev/null; then
    ready=1; break
  fi
  sleep 0.2
done
[ -n "$ready" ] || fail "the router never became ready"

cli() { ctr run --rm -i --network host -e "BLOOMGRID_SERVER=127.0.0.1:$rp" "$IMAGE" bloomgrid "$@"; }
cli create slugs --capacity 10000 --error-rate 0.01 --shards 2 >/dev/null || fail "create"
printf 'alice\nbob\n' | cli add slugs >/dev/null || fail "add"
set +e
got=$(cli check slugs alice carol); rc=$?
set -e
[ "$rc" -eq 1 ] && [ "$got" = "$(printf 'maybe\talice\nno\tcarol')" ] || fail "check: exit $rc: $got"
got=$(ctr run --rm "$IMAGE" bloomgrid inspect /dev/null 2>&1) && fail "inspect of /dev/null succeeded"

# The node stopped: the router lives on but is no longer ready.
ctr stop -t 10 "$tag-node" >/dev/null
healthcheck "$tag-router" || fail "the router's liveness with its node stopped"
unready=
for _ in $(seq 1 50); do
  if ! healthcheck -e BLOOMGRID_HEALTH_SERVICE=bloomgrid.v1.BloomGrid "$tag-router" >/dev/null; then
    unready=1; break
  fi
  sleep 0.2
done
[ -n "$unready" ] || fail "the router stayed ready with its only node stopped"
size=$(ctr image inspect "$IMAGE" --format '{{.Size}}')
echo "image OK: $IMAGE, $((size / 1000000)) MB; node, router, HEALTHCHECK and CLI from the image answer"
