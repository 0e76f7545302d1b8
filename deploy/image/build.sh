#!/usr/bin/env bash
# Build the bloomgrid image with podman or docker (whichever works here).
#
# usage: deploy/image/build.sh [--tag NAME] [--base IMAGE]
#   --tag NAME    the image to build                        [bloomgrid:latest]
#   --base IMAGE  a Debian 12 image for both stages          [debian:12]
# When the base image is neither present nor pullable (no registry), a base
# is made from a debootstrap'ed Debian 12 root (package debootstrap; it
# needs a Debian mirror, as apt-get does) and imported as bloomgrid-base:12.
# Environment: BLOOMGRID_ROOTFS (where debootstrap writes,
# [/var/tmp/bloomgrid-rootfs]), BLOOMGRID_MIRROR [http://deb.debian.org/debian].
set -euo pipefail
cd "$(dirname "$0")/../.."
TAG=bloomgrid:latest
BASE=debian:12
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) TAG=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

ENGINE=
for e in podman docker; do
  if command -v "$e" >/dev/null 2>&1 && "$e" info >/dev/null 2>&1; then ENGINE=$e; break; fi
done
[ -n "$ENGINE" ] || { echo "build.sh: neither podman nor docker can run here" >&2; exit 1; }

if ! "$ENGINE" image exists "$BASE" 2>/dev/null && ! "$ENGINE" image inspect "$BASE" >/dev/null 2>&1; then
  if ! "$ENGINE" pull -q "$BASE" >/dev/null 2>&1; then
    echo "build.sh: $BASE cannot be pulled; making bloomgrid-base:12 with debootstrap" >&2
    ROOTFS=${BLOOMGRID_ROOTFS:-/var/tmp/bloomgrid-rootfs}
    if [ ! -x "$ROOTFS/bin/sh" ]; then
      command -v debootstrap >/dev/null 2>&1 || { echo "build.sh: install debootstrap" >&2; exit 1; }
      debootstrap --variant=minbase bookworm "$ROOTFS" "${BLOOMGRID_MIRROR:-http://deb.debian.org/debian}" >&2
    fi
    tar -C "$ROOTFS" -c . | "$ENGINE" import - bloomgrid-base:12 >/dev/null
    BASE=bloomgrid-base:12
  fi
fi
# Some machines (containers themselves) refuse the resource limits podman
# sets by default, or crun's cgroup handling: fall back to runc with no
# default limits when a trivial container does not start.
RUNTIME_ARGS=()
if [ "$ENGINE" = podman ] && ! podman run --rm --network host "$BASE" true >/dev/null 2>&1; then
  conf=$(mktemp)
  trap 'rm -f "$conf"' EXIT
  printf '[containers]\ndefault_ulimits = []\n' > "$conf"
  export CONTAINERS_CONF=$conf
  RUNTIME_ARGS=(--runtime runc)
  podman "${RUNTIME_ARGS[@]}" run --rm --network host "$BASE" true >/dev/null ||
    { echo "build.sh: podman cannot start a container here (tried crun and runc)" >&2; exit 1; }
  echo "build.sh: podman with runc and no default limits" >&2
fi
DESCRIBE=$(git describe --always --dirty --abbrev=12 2>/dev/null || true)
# podman writes OCI images by default, which have no HEALTHCHECK: ask for
# the docker format, which keeps it.
FORMAT_ARGS=()
[ "$ENGINE" = podman ] && FORMAT_ARGS=(--format docker)
"$ENGINE" "${RUNTIME_ARGS[@]}" build "${FORMAT_ARGS[@]}" --network host --build-arg "BASE=$BASE" \
  --build-arg "DESCRIBE=$DESCRIBE" -t "$TAG" .
echo "built $TAG (base $BASE) with $ENGINE"
