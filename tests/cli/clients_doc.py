#!/usr/bin/env python3
"""One section of docs/CLIENTS.md run as a newcomer would paste it, from a
directory laid out like the repository root (build/, deploy/, proto/).

  python, node  a local cluster is started as `make run` does
                (deploy/local/start.sh, free ports of its own) and, for the
                TLS line, a node with TLS and a tokens file: ca.pem and
                app.token are put where that line reads them.
  go, java      the generator commands alone (nothing is compiled).

The section's blocks run in order in one bash: each ```sh line must exit 0
(or N where its comment says "exit N"); a ```python or ```js block is
saved under the file name the paragraph before it gives (`client.py`); a
```text block is what the ```sh block before it prints, and every later
line that runs the client must print it too.  A `sudo apt-get install`
line is not run: its packages must be installed (the test's own set in
deploy/install-deps.sh holds them).  Only addresses change, in the lines
and the programs: the router `make run` uses (127.0.0.1:7501) and the TLS
example's (localhost:7443) become the test's.

After the doc's lines, the client must fail cleanly (exit 1, the status on
stderr) with TLS and no token (UNAUTHENTICATED) and in plaintext against
the TLS port (UNAVAILABLE).

Usage: clients_doc.py SOURCE_DIR BUILD_DIR TMP_DIR python|node|go|java
"""
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import local_cluster  # noqa: E402

src, build, tmp = (os.path.abspath(a) for a in sys.argv[1:4])
section = sys.argv[4]
HEADINGS = {"python": "## Python", "node": "## Node.js", "go": "## Go", "java": "## Java"}
CODE_LANGS = {"python": "py", "js": "js", "java": "java"}
# Debian packages whose command may come from elsewhere (a Node.js build
# that bundles npm): installed when the command is there.
COMMAND_OF = {"nodejs": "node", "npm": "npm", "default-jdk-headless": "javac"}


def fail(msg):
    sys.exit("FAIL: " + msg)


doc = open(os.path.join(src, "docs", "CLIENTS.md")).read()
at = doc.index("\n" + HEADINGS[section] + "\n")
end = doc.find("\n## ", at + 1)
body = doc[at:end if end >= 0 else len(doc)]

# (language, text, paragraph before it) for every fenced block.
blocks = []
pos = 0
for m in re.finditer(r"^```(\w*)\n(.*?)^```$", body, re.S | re.M):
    blocks.append((m.group(1), m.group(2), body[pos:m.start()]))
    pos = m.end()
if not any(lang == "sh" for lang, _, _ in blocks):
    fail("no sh block under %s" % HEADINGS[section])


def wait_ready(addr):
    """Until the router's readiness is SERVING (as it is by the time a user
    has read `make run`'s output): grpc.health.v1 Check, by hand."""
    import grpc
    name = b"bloomgrid.v1.BloomGrid"
    req = b"\x0a" + bytes([len(name)]) + name
    with grpc.insecure_channel(addr) as ch:
        check = ch.unary_unary("/grpc.health.v1.Health/Check")
        for _ in range(300):
            try:
                if check(req, timeout=2) == b"\x08\x01":
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    fail("router %s never ready" % addr)


def start_tls_node(work, fixtures):
    """A node with TLS and a tokens file; its port."""
    subprocess.run(["sh", os.path.join(src, "tests", "tls", "gen-certs.sh"), fixtures],
                   check=True)
    with open(os.path.join(fixtures, "tokens"), "w") as tokens:
        subprocess.run([os.path.join(build, "cli", "bloomgrid"), "token", "new", "--role",
                        "admin", "--name", "app", "--out", os.path.join(fixtures, "app.token")],
                       check=True, stdout=tokens, stderr=subprocess.DEVNULL)
    out = os.path.join(work, "tls-node.out")
    proc = subprocess.Popen(
        [os.path.join(build, "node", "bloomgrid-node"), "--listen", "127.0.0.1:0",
         "--internal-listen", "127.0.0.1:0",
         "--data-dir", os.path.join(work, "tls-node"),
         "--tls-cert", os.path.join(fixtures, "node.pem"),
         "--tls-key", os.path.join(fixtures, "node.key"),
         "--tls-ca", os.path.join(fixtures, "ca.pem"),
         "--tokens-file", os.path.join(fixtures, "tokens")],
        stdout=open(out, "w"), stderr=open(os.path.join(work, "tls-node.log"), "w"))
    for _ in range(200):
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", open(out).read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            fail("TLS node exited %d: %s" % (proc.returncode,
                                              open(os.path.join(work, "tls-node.log")).read()))
        time.sleep(0.05)
    proc.kill()
    fail("TLS node: no 'listening on' line")


def installed(pkg):
    if pkg in COMMAND_OF and shutil.which(COMMAND_OF[pkg]):
        return True
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg],
                       capture_output=True, text=True)
    return "install ok installed" in r.stdout


def sq(s):
    return shlex.quote(s)


def check_output(out, want, what):
    """The script line comparing file out with the text want."""
    with open(out + ".want", "w") as f:
        f.write(want)
    return "diff -u %s %s >&2 || fail %s" % (
        sq(out + ".want"), sq(out), sq("output of '%s' differs from the doc's" % what))


os.makedirs(tmp, exist_ok=True)
work = tempfile.mkdtemp(prefix="clients-%s." % section, dir=tmp)
root = os.path.join(work, "repo")
os.makedirs(root)
for d in ("deploy", "proto"):
    os.symlink(os.path.join(src, d), os.path.join(root, d))
os.symlink(build, os.path.join(root, "build"))
outdir = os.path.join(work, "out")
os.makedirs(outdir)
fixtures = os.path.join(work, "fixtures")

# The router's address is known once the cluster is up (a port found free
# may be taken by another process before start.sh binds it): the script
# names it ROUTER_ADDR until then.
router = "@ROUTER_ADDR@"
env = dict(os.environ, BLOOMGRID_STATE=os.path.join(work, "run"),
           BLOOMGRID_BUILD="build", TMPDIR=work, npm_config_prefer_offline="true",
           npm_config_update_notifier="false")
# Debian's python3 and node, as on a machine with nothing else.
env["PATH"] = "/usr/bin:" + env.get("PATH", "")
for v in ("BLOOMGRID_SERVER", "BLOOMGRID_TLS_CA", "BLOOMGRID_TOKEN", "PYTHONPATH",
          "NODE_PATH"):
    env.pop(v, None)

# The bash script: the section's lines, each checked.
script = ["set -u", 'fail() { echo "FAIL: $*" >&2; exit 1; }']
needs_cluster = needs_tls = False
expected = None      # the last ```text block
run_cmd = None       # the line that runs the client, without variables
n = 0
for i, (lang, text, para) in enumerate(blocks):
    if lang == "sh":
        after = blocks[i + 1] if i + 1 < len(blocks) else None
        shows = after[1] if after and after[0] == "text" else None
        if "ca.pem" in text or "app.token" in text:
            needs_tls = True
            script.append("cp %s %s ." % (sq(os.path.join(fixtures, "ca.pem")),
                                          sq(os.path.join(fixtures, "app.token"))))
        for line in re.sub(r"\\\n\s*", " ", text).splitlines():
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = re.match(r"sudo apt-get install (.*)", line)
            if m:
                missing = [p for p in m.group(1).split() if not installed(p)]
                if missing:
                    fail("%s: not installed: %s (deploy/install-deps.sh)" % (line, " ".join(missing)))
                continue
            m = re.search(r"#.*\bexit (\d+)", line)
            want = int(m.group(1)) if m else 0
            runs_client = re.search(r"(\bclient\.(py|js)|\sClient)$", line) is not None
            if runs_client:
                needs_cluster = True
                if "=" not in line.split()[0]:
                    run_cmd = line
            line = line.replace("127.0.0.1:7501", router)
            # A block followed by ```text prints it; a later line running
            # the client prints the last one shown.
            compare = None if shows is not None else (expected if runs_client else None)
            n += 1
            out = os.path.join(outdir, "%d.out" % n)
            if shows is not None:
                out = os.path.join(outdir, "block%d.out" % i)
            if shows is not None or compare is not None:
                script.append("{ %s\n} >>%s" % (line, sq(out)))
            else:
                script.append(line)
            script.append("rc=$?; [ $rc -eq %d ] || fail %s" % (
                want, sq("exit $rc, want %d: %s" % (want, line)).replace("$rc", "'$rc'")))
            if compare is not None:
                script.append(check_output(out, compare, line))
        if shows is not None:
            script.append(check_output(os.path.join(outdir, "block%d.out" % i), shows,
                                       text.strip().splitlines()[-1]))
            expected = shows
    elif lang in CODE_LANGS:
        names = re.findall(r"`([\w./-]+\.%s)`" % CODE_LANGS[lang], para)
        if not names:
            fail("a %s block with no file name before it" % lang)
        script.append("cat >%s <<'__CLIENTS_DOC_EOF__'\n%s__CLIENTS_DOC_EOF__" % (
            sq(names[-1]), text.replace("127.0.0.1:7501", router)))
if needs_cluster and not run_cmd:
    fail("no line runs the client without settings")

tls_proc = None
if needs_tls:
    os.makedirs(fixtures)
    tls_proc, tls_port = start_tls_node(work, fixtures)
    tls_addr = "localhost:%d" % tls_port
    script = [l.replace("localhost:7443", tls_addr) for l in script]
    # The client's own errors: exit 1 and the status on stderr.
    err = sq(os.path.join(outdir, "err"))
    for envs, code in (("BLOOMGRID_TLS_CA=ca.pem", "UNAUTHENTICATED"),
                       ("", "UNAVAILABLE")):
        script.append("BLOOMGRID_SERVER=%s %s %s >/dev/null 2>%s" % (tls_addr, envs, run_cmd, err))
        script.append("rc=$?; [ $rc -eq 1 ] || fail %s" % sq(
            "%s %s against the TLS node: exit $rc, want 1" % (envs, run_cmd)).replace("$rc", "'$rc'"))
        script.append("grep -q ': %s: ' %s || fail %s" % (
            code, err, sq("%s %s: no %s on stderr" % (envs, run_cmd, code))))
script.append("echo docs/CLIENTS.md %s OK" % HEADINGS[section][3:])


rc = 1
started = False
try:
    if needs_cluster:
        started = True
        router = "127.0.0.1:%d" % (local_cluster.start(root, env, 23000 + 197 * random.randrange(40), 197) + 101)
        wait_ready(router)
    script = [l.replace("@ROUTER_ADDR@", router) for l in script]
    with open(os.path.join(work, "script.sh"), "w") as f:
        f.write("\n".join(script) + "\n")
    rc = subprocess.run(["bash", os.path.join(work, "script.sh")], cwd=root, env=env).returncode
finally:
    if tls_proc:
        tls_proc.terminate()
        tls_proc.wait()
    if started:
        local_cluster.stop(root, env)
if rc == 0:
    shutil.rmtree(work, ignore_errors=True)
sys.exit(rc)
