#!/usr/bin/env bash
# Install the Debian packages bloomgrid needs, by purpose.  Idempotent: does
# nothing when everything is already installed.
#
# usage: deploy/install-deps.sh [runtime|build|test|image]   (default: test)
#   runtime  what the image's run stage holds: the shared libraries the
#            four programs load, and jq for the batch reduce (reduce.sh)
#   build    what `make build` needs: compiler, CMake, headers, code
#            generators, help2man for the manual pages
#   test     build, plus what the test suite and the benchmarks run against:
#            libbloom and redis (benchmarks), Node.js and npm (the grpc-js
#            client tests), Python's prometheus, grpc, protobuf and yaml modules,
#            redis-tools and python3-redis (the Redis door's tests), clang
#            with libFuzzer (the RESP parser's fuzz target),
#            gRPC's generators and Java jars (docs/CLIENTS.md), openssl,
#            jq (the batch reduce), Python's redis and psycopg2 modules and
#            PostgreSQL (examples/slugs)
#   image    what `make image` needs to build the image here: podman with
#            runc, and debootstrap for a base where no registry serves one
set -euo pipefail

what=${1:-test}
RUNTIME=(libgrpc29 libprotobuf-c1 libxxhash0 libinih1 libmicrohttpd12 libssl3 libsystemd0 libuv1 jq)
BUILD=(
  build-essential cmake pkg-config
  libxxhash-dev check libsubunit-dev
  libgrpc-dev protobuf-c-compiler libprotobuf-c-dev libinih-dev uthash-dev
  libmicrohttpd-dev protobuf-compiler libprotobuf-dev grpc-proto libsystemd-dev
  libuv1-dev libssl-dev
  help2man
)
# prometheus: its promtool checks and tests the alert rules (the server it
# also installs is not started here).
TEST=(
  libbloom-dev redis-server openssl prometheus
  python3-prometheus-client python3-grpcio python3-protobuf python3-yaml protoc-gen-go
  protobuf-compiler-grpc protoc-gen-go-grpc protobuf-compiler-grpc-java-plugin
  libgrpc-java libprotobuf-java libnetty-java libperfmark-java libguava-java
  libgeronimo-annotation-1.3-spec-java jq
  redis-tools python3-redis clang libclang-rt-dev python3-psycopg2 postgresql
)
case "$what" in
  runtime) PKGS=("${RUNTIME[@]}") ;;
  build) PKGS=("${BUILD[@]}") ;;
  test)
    PKGS=("${BUILD[@]}" "${TEST[@]}")
    # Node.js runs the independent client tests.  Some machines carry a
    # Node.js build that bundles npm (and conflicts with Debian's npm
    # package), so these two are wanted only when their commands are missing.
    command -v node >/dev/null 2>&1 || PKGS+=(nodejs)
    command -v npm >/dev/null 2>&1 || PKGS+=(npm)
    # A JDK compiles the Java client of docs/CLIENTS.md (any JDK will do).
    command -v javac >/dev/null 2>&1 || PKGS+=(default-jdk-headless)
    ;;
  image) PKGS=(podman runc debootstrap) ;;
  -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "install-deps: unknown set '$what' (runtime, build, test or image)" >&2; exit 2 ;;
esac

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
