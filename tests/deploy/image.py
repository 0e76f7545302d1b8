#!/usr/bin/python3
"""Checks of the image (Dockerfile, deploy/image) without a container engine.

usage: image.py SRC BUILD TMP CHECK
  CHECK  dockerfile  EXPOSE lists exactly the ports the example settings and
                     the Kubernetes settings use (and every containerPort);
                     HEALTHCHECK runs the entry point's healthcheck, which
                     runs `bloomgrid health`; the user is numeric and the
                     one the manifests run as; test.sh refuses bad --ports
         health      the entry point's healthcheck and `bloomgrid health`
                     against real processes started through the entry point
                     (the programs of BUILD): the address found from a
                     --health-listen flag, a --config file, or listen;
                     liveness and readiness; a process gone; not a server

Runs with Debian's /usr/bin/python3 (python3-yaml).  Exit 0 pass, 1 fail.
"""
import configparser
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time

import yaml

SRC, BUILD, TMP, CHECK = [os.path.abspath(a) for a in sys.argv[1:4]] + sys.argv[4:5]
ENTRY = os.path.join(SRC, "deploy", "image", "entrypoint.sh")
K8S = os.path.join(SRC, "deploy", "kubernetes")
failures = []
procs = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def ini(text):
    p = configparser.ConfigParser(inline_comment_prefixes=(";", "#"),
                                  comment_prefixes=(";", "#"), strict=True)
    p.read_string(text)
    return p


LISTEN_KEYS = ("listen", "internal_listen", "health_listen", "metrics_listen")


def ports_of(text, prog):
    sec = ini(text)[prog]
    return {int(sec[k].rsplit(":", 1)[1]) for k in LISTEN_KEYS if sec.get(k)}


def final_stage(path):
    """The instructions of the Dockerfile's last stage: (KEYWORD, rest)."""
    with open(path) as f:
        text = re.sub(r"\\\n", " ", f.read())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        if word.upper() == "FROM":
            out = []
        out.append((word.upper(), rest.strip()))
    return out


def check_dockerfile():
    stage = final_stage(os.path.join(SRC, "Dockerfile"))
    expose = set()
    for w, rest in stage:
        if w == "EXPOSE":
            expose |= {int(p.split("/")[0]) for p in rest.split()}

    # The ports the settings use: the examples and the Kubernetes ConfigMaps.
    used = {}
    for prog in ("node", "router", "merger"):
        with open(os.path.join(SRC, "deploy", "examples", prog + ".ini")) as f:
            used["deploy/examples/%s.ini" % prog] = ports_of(f.read(), prog)
    with open(os.path.join(K8S, "config.yaml")) as f:
        cms = {d["metadata"]["name"]: d for d in yaml.safe_load_all(f) if d}
    for prog in ("node", "router", "merger"):
        text = cms["bloomgrid-%s-config" % prog]["data"][prog + ".ini"]
        used["deploy/kubernetes/config.yaml %s.ini" % prog] = ports_of(text, prog)
    container = set()
    for name in ("node.yaml", "router.yaml", "merger.yaml"):
        with open(os.path.join(K8S, name)) as f:
            for d in yaml.safe_load_all(f):
                if d and d["kind"] in ("StatefulSet", "Deployment"):
                    for c in d["spec"]["template"]["spec"]["containers"]:
                        container |= {p["containerPort"] for p in c.get("ports", [])}
    all_used = set().union(*used.values())
    if expose != all_used:
        fail("Dockerfile EXPOSE %s; the settings use %s (missing %s, extra %s)"
             % (sorted(expose), sorted(all_used), sorted(all_used - expose),
                sorted(expose - all_used)))
    elif not container <= expose:
        fail("containerPorts %s are not all exposed" % sorted(container - expose))
    else:
        print("ok: EXPOSE %s = every port of %d settings files, every containerPort"
              % (" ".join(map(str, sorted(expose))), len(used)))

    # HEALTHCHECK: one, in exec form, the entry point's healthcheck.
    hcs = [rest for w, rest in stage if w == "HEALTHCHECK"]
    copies = {rest.split()[-1]: rest.split()[-2] for w, rest in stage
              if w == "COPY" and not rest.startswith("--from")}
    entry_in_image = [dst for dst, src in copies.items() if src == "deploy/image/entrypoint.sh"]
    if len(hcs) != 1:
        fail("Dockerfile: %d HEALTHCHECK instructions in the final stage" % len(hcs))
    else:
        m = re.search(r"\bCMD\s+(\[.*\])\s*$", hcs[0])
        cmd = yaml.safe_load(m.group(1)) if m else None
        if not entry_in_image or cmd != [entry_in_image[0], "healthcheck"]:
            fail("HEALTHCHECK %r does not run the entry point (%s) with healthcheck"
                 % (hcs[0], entry_in_image))
        else:
            opts = dict(re.findall(r"--([a-z-]+)=(\S+)", hcs[0]))
            if not {"interval", "timeout", "start-period", "retries"} <= set(opts):
                fail("HEALTHCHECK %r: set interval, timeout, start-period and retries" % hcs[0])
            else:
                print("ok: HEALTHCHECK runs %s healthcheck (%s)" % (cmd[0], opts))
    with open(ENTRY) as f:
        entry = f.read()
    if not re.search(r'^\s*healthcheck\) health_check ;;', entry, re.M) or \
            not re.search(r'"\$BIN/bloomgrid" health ', entry):
        fail("entrypoint.sh: healthcheck does not run bloomgrid health")
    ep = [rest for w, rest in stage if w == "ENTRYPOINT"]
    if not ep or yaml.safe_load(ep[-1]) != [entry_in_image[0]]:
        fail("ENTRYPOINT %r is not the entry point copied in (%s)" % (ep, entry_in_image))

    # The user: numeric (runAsNonRoot can verify it), the manifests' uid.
    users = [rest for w, rest in stage if w == "USER"]
    if not users or not re.fullmatch(r"\d+(:\d+)?", users[-1]):
        fail("Dockerfile USER %r is not numeric" % users)
    else:
        uid = int(users[-1].split(":")[0])
        if uid == 0:
            fail("the image runs as root")
        for name in ("node.yaml", "router.yaml", "merger.yaml"):
            with open(os.path.join(K8S, name)) as f:
                for d in yaml.safe_load_all(f):
                    if d and d["kind"] in ("StatefulSet", "Deployment"):
                        sc = d["spec"]["template"]["spec"].get("securityContext", {})
                        if sc.get("runAsUser") != uid:
                            fail("%s: runAsUser %r, the image's user is %d"
                                 % (name, sc.get("runAsUser"), uid))
        print("ok: USER %s, the manifests' runAsUser" % users[-1])

    # make image-test's port option: refused with exit 2 before any engine
    # is looked for.
    test_sh = os.path.join(SRC, "deploy", "image", "test.sh")
    for args, why in ((["--ports", "17400,x"], "'x' is not a port"),
                      (["--ports", "17400,17400"], "names a port twice"),
                      (["--ports=1,2,3,4,5"], "1 to 4 ports"),
                      (["--ports", "70000"], "'70000' is not a port"),
                      (["--ports"], "needs a list")):
        r = subprocess.run(["bash", test_sh] + args, capture_output=True, text=True, timeout=60)
        if r.returncode != 2 or why not in r.stderr:
            fail("test.sh %s: exit %d, %r" % (" ".join(args), r.returncode, r.stderr))
    r = subprocess.run(["bash", test_sh, "--help"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 or "--ports" not in r.stdout:
        fail("test.sh --help: exit %d: %r" % (r.returncode, r.stdout))
    with open(os.path.join(SRC, "Makefile")) as f:
        if not re.search(r"test\.sh \$\(if \$\(PORTS\),--ports \$\(PORTS\)\)", f.read()):
            fail("make image-test does not pass PORTS to test.sh --ports")
    print("ok: test.sh checks its --ports; make image-test PORTS=... passes them")


# ---- health ----------------------------------------------------------------

BIN = os.path.join(TMP, "bin")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start(tag, args, want):
    """Start the entry point with args (it execs the program); wait for the
    output line holding want; return the process."""
    out = open(os.path.join(TMP, tag + ".out"), "w")
    err = open(os.path.join(TMP, tag + ".log"), "w")
    p = subprocess.Popen(["sh", ENTRY] + args, stdout=out, stderr=err, cwd=TMP,
                         env=dict(os.environ, BLOOMGRID_BIN_DIR=BIN))
    procs.append(p)
    for _ in range(400):
        with open(out.name) as f:
            if want in f.read():
                return p
        if p.poll() is not None:
            return p
        time.sleep(0.05)
    return p


def start_retry(tag, make_args, want):
    """start() with fresh free ports until one binds (another process may
    take a port between its pick and the bind)."""
    for _ in range(5):
        args = make_args()
        p = start(tag, args, want)
        if p.poll() is None:
            return p
    fail("%s did not start: %s" % (tag, open(os.path.join(TMP, tag + ".log")).read()))
    return None


def healthcheck(pid=None, service=None, addr=None):
    env = dict(os.environ, BLOOMGRID_BIN_DIR=BIN)
    for k in ("BLOOMGRID_HEALTH_PID", "BLOOMGRID_HEALTH_SERVICE", "BLOOMGRID_HEALTH_ADDR"):
        env.pop(k, None)
    if pid is not None:
        env["BLOOMGRID_HEALTH_PID"] = str(pid)
    if service is not None:
        env["BLOOMGRID_HEALTH_SERVICE"] = service
    if addr is not None:
        env["BLOOMGRID_HEALTH_ADDR"] = addr
    return subprocess.run(["sh", ENTRY, "healthcheck"], env=env, capture_output=True,
                          text=True, timeout=60)


def expect(r, code, text, what):
    if r.returncode != code or text not in r.stdout + r.stderr:
        fail("%s: exit %d (expected %d), output %r (expected %r)"
             % (what, r.returncode, code, r.stdout + r.stderr, text))
    else:
        print("ok: %s: exit %d, %s" % (what, code, (r.stdout + r.stderr).strip()))


def wait_health(pid, service, code, what):
    for _ in range(100):
        r = healthcheck(pid, service)
        if r.returncode == code:
            break
        time.sleep(0.1)
    return r


def check_health():
    shutil.rmtree(TMP, ignore_errors=True)
    os.makedirs(BIN)
    for prog, rel in (("bloomgrid", "cli/bloomgrid"), ("bloomgrid-node", "node/bloomgrid-node"),
                      ("bloomgrid-router", "router/bloomgrid-router"),
                      ("bloomgrid-merger", "merger/bloomgrid-merger")):
        os.symlink(os.path.join(BUILD, rel), os.path.join(BIN, prog))

    # A node whose health_listen is in its settings file, on the wildcard
    # address (asked on loopback), with a comment after it.
    ports = {}

    def node_args():
        ports["node"], ports["nh"] = free_port(), free_port()
        with open(os.path.join(TMP, "node.ini"), "w") as f:
            f.write("[node]\nlisten = 127.0.0.1:%d\nhealth_listen = 0.0.0.0:%d ; probes\n"
                    "data_dir = data\n" % (ports["node"], ports["nh"]))
        return ["node", "--config", "node.ini"]
    node = start_retry("node", node_args, " listening on ")
    if not node:
        return
    expect(wait_health(node.pid, None, 0, "node"), 0, '127.0.0.1:%d "": SERVING' % ports["nh"],
           "node liveness, health_listen from --config")
    expect(healthcheck(node.pid, "bloomgrid.v1.BloomGrid"), 0, "SERVING", "node readiness")
    expect(healthcheck(node.pid, "no.such.Service"), 1, "NOT_FOUND", "an unknown service")

    # A router given --health-listen=ADDR as a flag, over the node, then over
    # no node: alive, not ready.
    topo = os.path.join(TMP, "topo.ini")
    with open(topo, "w") as f:
        f.write("version = 1\n[group g0]\ncopies = 127.0.0.1:%d\n" % ports["node"])

    def router_args():
        ports["router"], ports["rh"] = free_port(), free_port()
        return ["router", "--listen", "127.0.0.1:%d" % ports["router"],
                "--health-listen=127.0.0.1:%d" % ports["rh"], "--topology", topo,
                "--health-probe-ms", "100"]
    router = start_retry("router", router_args, " listening on ")
    if not router:
        return
    expect(wait_health(router.pid, "bloomgrid.v1.BloomGrid", 0, "router"), 0,
           '127.0.0.1:%d "bloomgrid.v1.BloomGrid": SERVING' % ports["rh"],
           "router readiness, --health-listen= flag")
    node.terminate()
    node.wait()
    expect(wait_health(router.pid, "bloomgrid.v1.BloomGrid", 1, "router"), 1, "NOT_SERVING",
           "router readiness with its node stopped")
    expect(healthcheck(router.pid), 0, "SERVING", "router liveness with its node stopped")
    expect(healthcheck(node.pid), 1, "is gone", "a server process gone")

    # Without health_listen: its listen address, in plaintext.
    def merger_args():
        ports["merger"] = free_port()
        with open(os.path.join(TMP, "sources.ini"), "w") as f:
            f.write("[filter f]\ndatacenter = dc1 %s\n" % topo)
        return ["merger", "--listen", "127.0.0.1:%d" % ports["merger"], "--sources",
                "sources.ini", "--state-dir", "mstate", "--interval-s", "3600"]
    merger = start_retry("merger", merger_args, " listening on ")
    if merger:
        expect(wait_health(merger.pid, None, 0, "merger"), 0,
               '127.0.0.1:%d "": SERVING' % ports["merger"], "merger liveness on its listen")

    # Not a server: nothing to check; an address given: asked as is.
    sleeper = subprocess.Popen(["sleep", "60"])
    procs.append(sleeper)
    expect(healthcheck(sleeper.pid), 0, "nothing to check", "a process that is not a server")
    expect(healthcheck(addr="127.0.0.1:%d" % ports["rh"]), 0, "SERVING",
           "BLOOMGRID_HEALTH_ADDR")
    # bloomgrid health itself: nothing listening is exit 2, as the help says.
    r = subprocess.run([os.path.join(BIN, "bloomgrid"), "health",
                        "127.0.0.1:%d" % ports["nh"]], capture_output=True, text=True)
    expect(r, 2, "cannot reach server", "bloomgrid health of a stopped node")
    r = subprocess.run([os.path.join(BIN, "bloomgrid"), "health", "-q",
                        "127.0.0.1:%d" % ports["rh"]], capture_output=True, text=True)
    if r.returncode != 0 or r.stdout:
        fail("bloomgrid health -q: exit %d, %r" % (r.returncode, r.stdout))


os.makedirs(TMP, exist_ok=True)
try:
    {"dockerfile": check_dockerfile, "health": check_health}[CHECK]()
finally:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.wait()
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
