#!/usr/bin/env bash
# Run the image as an operator would: every program's --version; a node and
# a router from the image on loopback (host network); the image's CLI builds
# and queries a file, and creates, adds to and checks a filter through the
# router.  Exits non-zero on the first failure.
#
# usage: deploy/image/test.sh [IMAGE]   (default bloomgrid:latest)
set -euo pipefail
IMAGE=${1:-bloomgrid:latest}
ENGINE=podman
command -v podman >/dev/null 2>&1 || ENGINE=docker
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
wait_port() {
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
np=$(free_port) rp=$(free_port)
tag=bgtest-$$
names+=("$tag-node" "$tag-router")
ctr run -d --name "$tag-node" --network host "$IMAGE" node --listen "127.0.0.1:$np" \
  --data-dir /var/lib/bloomgrid/node >/dev/null
wait_port "$np" || fail "the node did not listen: $(ctr logs "$tag-node" 2>&1 | tail -5)"
topo=$(mktemp -d)
printf 'version = 1\n[group g0]\ncopies = 127.0.0.1:%s\n' "$np" > "$topo/topology.ini"
chmod -R a+rX "$topo"
ctr run -d --name "$tag-router" --network host -v "$topo:/etc/bloomgrid:ro" "$IMAGE" router \
  --listen "127.0.0.1:$rp" --topology /etc/bloomgrid/topology.ini >/dev/null
wait_port "$rp" || fail "the router did not listen: $(ctr logs "$tag-router" 2>&1 | tail -5)"

cli() { ctr run --rm -i --network host -e "BLOOMGRID_SERVER=127.0.0.1:$rp" "$IMAGE" bloomgrid "$@"; }
cli create slugs --capacity 10000 --error-rate 0.01 --shards 2 >/dev/null || fail "create"
printf 'alice\nbob\n' | cli add slugs >/dev/null || fail "add"
set +e
got=$(cli check slugs alice carol); rc=$?
set -e
[ "$rc" -eq 1 ] && [ "$got" = "$(printf 'maybe\talice\nno\tcarol')" ] || fail "check: exit $rc: $got"
got=$(ctr run --rm "$IMAGE" bloomgrid inspect /dev/null 2>&1) && fail "inspect of /dev/null succeeded"
size=$(ctr image inspect "$IMAGE" --format '{{.Size}}')
echo "image OK: $IMAGE, $((size / 1000000)) MB; node, router and CLI from the image answer"
