#!/bin/sh
# Run one grpc-js client test.  Installs its npm dependencies into WORK (in
# the build tree) the first time.
# usage: run.sh SRC_DIR WORK_DIR SCRIPT ARGS...   (the script gets ARGS and,
# last, a fresh data directory)
set -eu
src=$1 work=$2 script=$3
shift 3
mkdir -p "$work"
cp "$src/package.json" "$src/package-lock.json" "$src/$script" "$work/"
if [ ! -d "$work/node_modules/@grpc/grpc-js" ] || [ ! -d "$work/node_modules/@grpc/proto-loader" ]; then
  # The lock file pins the exact versions the test was written against.
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
mkdir -p "${BLOOMGRID_TEST_TMP:-/tmp}"
data=$(mktemp -d "${BLOOMGRID_TEST_TMP:-/tmp}/integ-js-XXXXXX")
cd "$work"
node "$script" "$@" "$data/data"
