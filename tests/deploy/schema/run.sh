#!/bin/sh
# Validate every manifest of deploy/kubernetes and deploy/batch against the
# Kubernetes API schemas (kubernetes-models, from npm, installed into WORK
# the first time, at the versions of package-lock.json).
# usage: run.sh SRC_DIR WORK_DIR ROOT
set -eu
src=$1 work=$2 root=$3
mkdir -p "$work"
cp "$src/package.json" "$src/package-lock.json" "$src/validate.mjs" "$work/"
if [ ! -d "$work/node_modules/kubernetes-models" ]; then
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
# YAML to JSON with Debian's python3-yaml (what the other deploy tests use).
/usr/bin/python3 - "$root" "$work/docs.json" <<'PY'
import glob, json, os, sys
import yaml
root, out = sys.argv[1:3]
docs = []
for d in ("deploy/kubernetes", "deploy/batch"):
    for path in sorted(glob.glob(os.path.join(root, d, "*.yaml"))):
        with open(path) as f:
            docs += [{"file": os.path.relpath(path, root), "doc": doc}
                     for doc in yaml.safe_load_all(f) if doc]
with open(out, "w") as f:
    json.dump(docs, f)
PY
cd "$work"
node validate.mjs docs.json
