#!/bin/sh
# Run the node-redis test: installs its npm dependencies (pinned by the lock
# file) into WORK the first time.
# usage: run.sh SRC_DIR WORK_DIR NODE_BIN
set -eu
src=$1 work=$2 node_bin=$3
command -v node >/dev/null && command -v npm >/dev/null || { echo "node or npm missing: skipped"; exit 77; }
mkdir -p "$work"
cp "$src/package.json" "$src/package-lock.json" "$src/test_node_redis.js" "$work/"
if [ ! -d "$work/node_modules/@redis/bloom" ]; then
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
mkdir -p "${BLOOMGRID_TEST_TMP:-/tmp}"
data=$(mktemp -d "${BLOOMGRID_TEST_TMP:-/tmp}/resp-js-XXXXXX")
cd "$work"
exec node test_node_redis.js "$node_bin" "$data"
