#!/usr/bin/env bash
# Install every Debian package that bloomgrid's build, tests and benchmarks
# need.  Idempotent: does nothing when everything is already installed.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config
  libxxhash-dev check libsubunit-dev
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev libinih-dev
  libbloom-dev redis-server help2man
  libmicrohttpd-dev python3-prometheus-client
  protobuf-compiler libprotobuf-dev grpc-proto
  protoc-gen-go python3-grpcio python3-protobuf
)
# Node.js runs the independent client test.  Some machines carry a Node.js
# build that bundles npm (and conflicts with Debian's npm package), so these
# two are wanted only when their commands are missing.
command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
command -v npm >/dev/null 2>&1 || PKGS+=(npm)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install-deps: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
