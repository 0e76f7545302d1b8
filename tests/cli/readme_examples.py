#!/usr/bin/env python3
"""The README's offline and online examples, run as a newcomer would paste
them: from a directory laid out like the repository root (build/ and deploy/),
after starting a local cluster with deploy/local/start.sh (what `make run`
does).  Only the router's ports change: the README names those `make run`
uses (7501, and 7601 for RESP); here the cluster gets free ports of its own.

Every line must exit 0, except lines whose comment says "exit N".  The
examples write their files into a temporary directory of their own (the
offline block starts with `cd "$(mktemp -d)"`, under TMPDIR, which the test
points into TMP_DIR): nothing is left in the repository root.

Usage: readme_examples.py SOURCE_DIR BUILD_DIR TMP_DIR
"""
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import local_cluster  # noqa: E402

src, build, tmp = (os.path.abspath(a) for a in sys.argv[1:4])
readme = open(os.path.join(src, "README.md")).read()


def block_after(heading):
    at = readme.index(heading)
    m = re.compile(r"```sh\n(.*?)```", re.S).search(readme, at)
    return m.group(1).splitlines()


os.makedirs(tmp, exist_ok=True)
root = tempfile.mkdtemp(prefix="readme.", dir=tmp)
os.symlink(build, os.path.join(root, "build"))
os.symlink(os.path.join(src, "deploy"), os.path.join(root, "deploy"))
scratch = tempfile.mkdtemp(prefix="readme-tmpdir.", dir=tmp)
env = dict(os.environ, BLOOMGRID_STATE=os.path.join(root, "run"),
           BLOOMGRID_BUILD="build", TMPDIR=scratch)
env.pop("BLOOMGRID_SERVER", None)

# What the README's redis-cli lines answer (redis-cli prints arrays one
# element a line when its output is not a terminal).
RESP_EXPECT = {"PING": "PONG", "BF.RESERVE": "OK", "BF.ADD": "1", "BF.MADD": "1\n1",
               "BF.MEXISTS": "1\n0", "BF.INFO": "Number of items inserted\n3",
               "BF.EXISTS": "ERR not found", "DEL": "1"}

lines = (block_after("## The offline tool") + block_after("## The online commands")
         + block_after("## Any Redis client"))
script = ["set -u"]
for i, line in enumerate(lines):
    if not line.strip() or line.lstrip().startswith("#"):
        continue
    m = re.search(r"#.*\bexit (\d+)", line)
    want = int(m.group(1)) if m else 0
    # The router's ports, known once the cluster is up.
    line = line.replace("127.0.0.1:7501", "127.0.0.1:@ROUTER_PORT@")
    line = line.replace("-p 7601 ", "-p @RESP_PORT@ ")
    if line.startswith("redis-cli "):
        # The Redis door's block: each reply as its comment says.
        cmd = line.split()[3]
        expect = RESP_EXPECT[cmd]
        script.append("out=$(%s 2>&1)" % line.split("#")[0].strip())
        script.append('case "$out" in *%s*) ;; *) echo "FAIL: %s answered: $out" >&2; '
                      'exit 1;; esac' % (shlex.quote(expect), cmd))
        continue
    script.append(line)
    script.append('rc=$?; if [ $rc -ne %d ]; then echo "FAIL: exit $rc, want %d: %s" >&2; exit 1; fi'
                  % (want, want, line.replace('"', '\\"').replace("$", "\\$").replace("`", "\\`")))
script.append("echo README examples OK")

rc = 1
try:
    base = local_cluster.start(root, env, 21000 + 211 * random.randrange(50), 211)
    text = "\n".join(script).replace("@ROUTER_PORT@", str(base + 101))
    r = subprocess.run(["bash", "-c", text.replace("@RESP_PORT@", str(base + 201))],
                       cwd=root, env=env)
    rc = r.returncode
finally:
    local_cluster.stop(root, env)
if rc == 0:
    # The root as it was: the two links and the cluster's state.
    left = sorted(set(os.listdir(root)) - {"build", "deploy", "run"})
    if left:
        print("FAIL: the examples left files in the repository root: %s" % left)
        rc = 1
    dirs = os.listdir(scratch)
    if len(dirs) != 1 or not os.path.exists(os.path.join(scratch, dirs[0], "nums.bf")):
        print("FAIL: the examples did not work in one temporary directory: %s" % dirs)
        rc = 1
if rc == 0:
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(scratch, ignore_errors=True)
sys.exit(rc)
