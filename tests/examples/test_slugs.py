#!/usr/bin/python3
"""examples/slugs end to end: the HTTP slug service in front of SQLite or
PostgreSQL, asking a Bloom filter over RESP; and the Node.js check.

usage: test_slugs.py SOURCE_DIR BUILD_DIR MODE     (MODE: sqlite, postgresql, node)

The filter server, first that applies:
  SLUGS_TEST_SERVER=redis://HOST:PORT    any server with BF.* commands (a
                                         bloomgrid RESP port, RedisBloom)
  SLUGS_TEST_REDISBLOOM=/path/redisbloom.so   a redis-server started here
                                         with that module
  otherwise                              a bloomgrid cluster started as
                                         `make run` starts it
                                         (deploy/local/start.sh), through its
                                         router's RESP port
Exit 77 (skipped) when the bloomgrid router has no RESP door, or (postgresql)
when PostgreSQL cannot be started here.

The service talks to the server through a relay of this test's own, which
can slow, hold or cut the traffic: so the test sees the order of the
service's steps, not only its answers.
"""
import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

SKIP = 77
src, build, mode = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
EX = os.path.join(src, "examples", "slugs")
sys.path.insert(0, EX)
import slugs  # noqa: E402  (the example's own database layer seeds the table)
sys.path.insert(0, os.path.join(src, "tests"))
import local_cluster  # noqa: E402

try:
    import redis  # Debian's python3-redis
except ImportError:
    sys.exit("FAIL: Python's redis module is missing (deploy/install-deps.sh installs python3-redis)")

tmp_root = os.environ.get("BLOOMGRID_TEST_TMP") or None
if tmp_root:
    os.makedirs(tmp_root, exist_ok=True)
work = tempfile.mkdtemp(prefix="slugs-%s." % mode, dir=tmp_root)
cleanups = []
procs = []


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    for name in ("first.err", "service.err", "redis.log"):
        p = os.path.join(work, name)
        if os.path.exists(p):
            print("--- last lines of %s:\n%s" % (name, "".join(open(p).readlines()[-20:])),
                  file=sys.stderr)
    raise SystemExit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(what, fn, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    fail("%s: not within %gs" % (what, timeout))


# ------------------------------------------------------------ the server

def start_redisbloom(module):
    for _ in range(5):
        port = free_port()
        log = os.path.join(work, "redis.log")
        p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                              "--save", "", "--appendonly", "no", "--loadmodule", module,
                              "--logfile", log], stdout=subprocess.DEVNULL, cwd=work)
        procs.append(p)
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                return "redis://127.0.0.1:%d" % port, "RedisBloom (%s)" % module
            except redis.ConnectionError:
                if p.poll() is not None:
                    break
                time.sleep(0.05)
    fail("redis-server with %s did not start (see %s)" % (module, log))


def router_resp_addr(state):
    """The RESP address of the cluster's first router: the file
    router1/resp_addr, or the line of its log that names it."""
    f = os.path.join(state, "router1", "resp_addr")
    if os.path.exists(f):
        return open(f).read().strip()
    log = os.path.join(state, "router1", "router.log")
    if os.path.exists(log):
        m = re.search(r"\bRESP\b[^\n]*?\bon\s+(?:redis://)?([0-9.]+:\d+)", open(log).read(), re.I)
        if m:
            return m.group(1)
    return None


def start_bloomgrid():
    router = os.path.join(build, "router", "bloomgrid-router")
    if not os.access(router, os.X_OK):
        fail("%s not built" % router)
    helptext = subprocess.run([router, "--help"], capture_output=True, text=True).stdout
    if not re.search(r"resp[_-]listen", helptext):
        print("SKIP: this bloomgrid-router has no RESP door (no resp_listen in its --help), "
              "so there is no bloomgrid to run the slug service against.  Run this test "
              "against RedisBloom meanwhile: SLUGS_TEST_REDISBLOOM=/path/to/redisbloom.so, "
              "or any server with BF.* commands: SLUGS_TEST_SERVER=redis://HOST:PORT")
        raise SystemExit(SKIP)
    root = os.path.join(work, "cluster")
    os.makedirs(root)
    for name in ("deploy",):
        os.symlink(os.path.join(src, name), os.path.join(root, name))
    os.symlink(build, os.path.join(root, "build"))
    state = os.path.join(root, "run")
    env = dict(os.environ, BLOOMGRID_STATE=state, BLOOMGRID_BUILD="build")
    cleanups.append(lambda: local_cluster.stop(root, env))
    local_cluster.start(root, env, 21000 + random.randrange(0, 200) * 37, 211)
    addr = router_resp_addr(state)
    check(addr, "the router knows resp_listen, but the cluster deploy/local/start.sh "
                "started names no RESP port (no router1/resp_addr, no RESP line in "
                "router1/router.log): `make run` must start the router with its door")
    return "redis://%s" % addr, "bloomgrid router at %s (deploy/local/start.sh)" % addr


def server():
    if os.environ.get("SLUGS_TEST_SERVER"):
        return os.environ["SLUGS_TEST_SERVER"], "SLUGS_TEST_SERVER"
    if os.environ.get("SLUGS_TEST_REDISBLOOM"):
        return start_redisbloom(os.environ["SLUGS_TEST_REDISBLOOM"])
    return start_bloomgrid()


# ------------------------------------------------------------- the relay

class Relay:
    """TCP relay between the service and the server.  delay: seconds each
    service->server chunk waits; down: every connection cut and new ones
    closed; hold(): the next chunk that carries a BF.ADD is held until
    release()."""

    def __init__(self, upstream):
        self.upstream = upstream
        self.delay = 0.0
        self.down = False
        self.armed = False
        self.holding = threading.Event()
        self.released = threading.Event()
        self.lock = threading.Lock()
        self.socks = []
        self.ls = socket.socket()
        self.ls.bind(("127.0.0.1", 0))
        self.ls.listen(64)
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
            except OSError:
                return
            if self.down:
                c.close()
                continue
            try:
                u = socket.create_connection(self.upstream, timeout=5)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            with self.lock:
                self.socks += [c, u]
            threading.Thread(target=self._pump, args=(c, u, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(u, c, False), daemon=True).start()

    def _pump(self, a, b, to_server):
        try:
            while True:
                data = a.recv(65536)
                if not data:
                    break
                if to_server:
                    if self.delay:
                        time.sleep(self.delay)
                    if self.armed and b"BF.ADD" in data:
                        self.armed = False
                        self.holding.set()
                        self.released.wait(30)
                if self.down:
                    break
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def hold(self):
        self.holding.clear()
        self.released.clear()
        self.armed = True

    def release(self):
        self.released.set()

    def set_down(self, down):
        self.down = down
        if down:
            with self.lock:
                socks, self.socks = self.socks, []
            for s in socks:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# ----------------------------------------------------------- the service

def start_service(bloom_url, db_spec, filter_name, extra=(), tag="service"):
    """Start slugs.py; return (its base URL, its process)."""
    out = open(os.path.join(work, tag + ".out"), "w")
    err = open(os.path.join(work, tag + ".err"), "w")
    p = subprocess.Popen(["/usr/bin/python3", os.path.join(EX, "slugs.py"),
                          "--listen", "127.0.0.1:0", "--bloom", bloom_url,
                          "--filter", filter_name, "--capacity", "20000",
                          "--db", db_spec] + list(extra),
                         stdout=out, stderr=err, cwd=work)
    procs.append(p)
    for _ in range(200):
        m = re.search(r"listening on (http://\S+)", open(out.name).read())
        if m:
            return m.group(1), p
        if p.poll() is not None:
            fail("slugs.py exited %d: %s" % (p.returncode, open(err.name).read()))
        time.sleep(0.05)
    fail("slugs.py did not start: %s" % open(err.name).read())


def http(base, method, path):
    req = urllib.request.Request(base + path, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            return e.code, json.loads(body or b"{}")
        except ValueError:
            return e.code, {"raw": body.decode(errors="replace")}


def filter_state(base):
    return http(base, "GET", "/healthz")[1].get("filter")


def in_filter(r, name, keys):
    out = []
    for i in range(0, len(keys), 500):
        out += r.execute_command("BF.MEXISTS", name, *keys[i:i + 500])
    return out


# ---------------------------------------------------------------- checks

def service_checks(url, direct, db_spec, db):
    name = "slugs-test-%d-%x" % (os.getpid(), random.getrandbits(32))
    cleanups.append(lambda: direct.delete(name))
    host, port = url[len("redis://"):].rsplit(":", 1)
    relay = Relay((host, int(port)))
    # A first run fills the filter and leaves its marker; then, while no
    # service runs, rows come into the table around it (a restore, a
    # migration): the filter lacks them.
    first, p = start_service("redis://127.0.0.1:%d" % relay.port, db_spec, name, tag="first")
    wait_for("the first run's filter trusted", lambda: filter_state(first) == "trusted")
    p.terminate()
    p.wait(10)
    prefill = ["pre-%04d" % i for i in range(300)]
    for s in prefill:
        check(db.insert(s), "seeding the table: %s" % s)
    check(not any(in_filter(direct, name, prefill)), "the seeded rows are not in the filter yet")
    relay.delay = 0.05  # a slow backfill: 60 batches of 5, 50 ms each
    base, _ = start_service("redis://127.0.0.1:%d" % relay.port, db_spec, name,
                            ["--backfill-batch", "5", "--bloom-timeout", "3"])

    # 1. Before the backfill has finished, no "definitely not" is trusted
    # (though the filter is there, with the first run's marker): every slug
    # of the table reads taken, the last filled first.
    check(filter_state(base) == "filling",
          "the backfill should still run (50 ms a batch of 5 of 300): %s" % filter_state(base))
    for s in reversed(prefill):
        st, body = http(base, "GET", "/slugs/" + s)
        check(st == 200 and body["free"] is False and body["answered_by"] == "database",
              "during the backfill, %s (in the table) answered %d %s" % (s, st, body))
    relay.delay = 0.0
    wait_for("the filter trusted after the backfill", lambda: filter_state(base) == "trusted")
    check(all(v == 1 for v in in_filter(direct, name, prefill)),
          "after the backfill every slug of the table is in the filter")
    print("ok: backfill; no slug of the table read free before it finished")

    # 2. Answers after the backfill.
    st, body = http(base, "GET", "/slugs/pre-0000")
    check(st == 200 and body == {"slug": "pre-0000", "free": False, "answered_by": "database"},
          "GET a taken slug: %d %s" % (st, body))
    st, body = http(base, "GET", "/slugs/fresh-one")
    check(st == 200 and body == {"slug": "fresh-one", "free": True, "answered_by": "filter"},
          "GET a new slug: %d %s" % (st, body))
    st, body = http(base, "POST", "/slugs/new-one")
    check(st == 201 and body.get("created") is True, "POST a new slug: %d %s" % (st, body))
    check(db.exists("new-one") and direct.execute_command("BF.EXISTS", name, "new-one") == 1,
          "a created slug is in the table and in the filter")
    st, body = http(base, "POST", "/slugs/new-one")
    check(st == 409 and body.get("error") == "taken", "POST it again: %d %s" % (st, body))
    st, body = http(base, "GET", "/slugs/new-one")
    check(st == 200 and body["free"] is False, "GET the created slug: %d %s" % (st, body))
    st, body = http(base, "POST", "/slugs/pre-0005")
    check(st == 409, "POST a slug of the table: %d %s" % (st, body))
    for method, path, want in (("GET", "/slugs/Bad_Slug", 400), ("POST", "/slugs/", 400),
                               ("GET", "/slugs/-x", 400), ("POST", "/slugs/" + "a" * 64, 400),
                               ("GET", "/nope", 404), ("DELETE", "/slugs/new-one", 405)):
        st, _ = http(base, method, path)
        check(st == want, "%s %s answered %d, want %d" % (method, path, st, want))
    print("ok: answers, creates, refusals and bad requests")

    # 3. BF.ADD is acknowledged before the insert commits: while the
    # service's BF.ADD is held, the row is not in the table.
    relay.hold()
    res = {}
    t = threading.Thread(target=lambda: res.update(r=http(base, "POST", "/slugs/held-slug")))
    t.start()
    check(relay.holding.wait(10), "the create sent no BF.ADD")
    time.sleep(0.3)
    check(not db.exists("held-slug") and t.is_alive(),
          "the row was inserted before the filter acknowledged BF.ADD")
    relay.release()
    t.join(30)
    check(res.get("r", (0,))[0] == 201, "the held create: %s" % (res,))
    check(db.exists("held-slug") and direct.execute_command("BF.EXISTS", name, "held-slug") == 1,
          "after the acknowledged BF.ADD the row is committed")
    print("ok: BF.ADD acknowledged before the insert")

    # 4. Two requests that both hear "definitely not": UNIQUE lets one in.
    for i in range(4):
        slug = "race-%d" % i
        barrier = threading.Barrier(12)
        codes = []

        def racer():
            barrier.wait()
            codes.append(http(base, "POST", "/slugs/" + slug)[0])
        ts = [threading.Thread(target=racer) for _ in range(12)]
        for x in ts:
            x.start()
        for x in ts:
            x.join(60)
        check(sorted(codes) == [201] + [409] * 11,
              "12 concurrent creates of %s: %s (want one 201, eleven 409)" % (slug, sorted(codes)))
    print("ok: concurrent creates of one slug: one created, the others refused")

    # 5. The filter unreachable: the database answers, never "free" unasked.
    relay.set_down(True)
    st, body = http(base, "GET", "/slugs/pre-0001")
    check(st == 200 and body["free"] is False and body["answered_by"] == "database",
          "filter down, a taken slug: %d %s" % (st, body))
    st, body = http(base, "GET", "/slugs/fresh-during-outage")
    check(st == 200 and body["free"] is True and body["answered_by"] == "database",
          "filter down, a new slug: %d %s" % (st, body))
    st, _ = http(base, "POST", "/slugs/made-in-outage")
    check(st == 201, "filter down, a create goes to the database: %d" % st)
    st, _ = http(base, "POST", "/slugs/pre-0002")
    check(st == 409, "filter down, a taken slug refused: %d" % st)
    check(filter_state(base) != "trusted", "filter down, yet the service still trusts it")
    relay.set_down(False)
    wait_for("the filter trusted again after the outage", lambda: filter_state(base) == "trusted")
    check(direct.execute_command("BF.EXISTS", name, "made-in-outage") == 1,
          "the slug created while the filter was down is in it after the refill")
    st, body = http(base, "GET", "/slugs/made-in-outage")
    check(st == 200 and body["free"] is False, "GET made-in-outage: %s" % body)
    print("ok: filter down: database answers; filled again when it is back")

    # 6. The filter dropped (RedisBloom then reads 0, bloomgrid an error):
    # never "free"; created and filled again.
    direct.delete(name)
    st, body = http(base, "GET", "/slugs/pre-0003")
    check(st == 200 and body["free"] is False, "filter dropped, a taken slug: %d %s" % (st, body))
    def refilled():
        st, body = http(base, "GET", "/slugs/pre-0004")
        check(st == 200 and body["free"] is False,
              "filter dropped, a taken slug: %d %s" % (st, body))
        if filter_state(base) != "trusted":
            return False
        try:  # bloomgrid answers an error for a missing filter, RedisBloom 0s
            return all(v == 1 for v in in_filter(direct, name, prefill + [slugs.MARKER]))
        except redis.ResponseError:
            return False
    wait_for("the filter filled again after it was dropped", refilled)
    print("ok: filter dropped: database answers; created and filled again")

    # 7. The load script's mix: every answer right, reads avoided.
    r = subprocess.run(["/usr/bin/python3", os.path.join(EX, "load.py"), "--url", base,
                        "--signups", "300", "--warmup", "30", "--concurrency", "4",
                        "--json"], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, "load.py exited %d: %s %s" % (r.returncode, r.stdout, r.stderr))
    res = json.loads(r.stdout)
    o = res["outcomes"]
    check(o["unexpected"] == 0 and o["created"] + o["refused_taken"] + o["refused_retry"] == 300
          and o["created"] > 200 and o["taken"] > 0,
          "load.py outcomes: %s" % o)
    check(0 < res["db_reads_avoided"] <= res["questions"] and res["db_reads"] > 0,
          "load.py: reads avoided %s of %s" % (res["db_reads_avoided"], res["questions"]))
    print("ok: load.py: %d signups, %d of %d database reads avoided, p50 %.2f ms"
          % (res["signups"], res["db_reads_avoided"], res["questions"], res["p50_ms"]))

    # 8. What it all rests on: every slug in the table is in the filter.
    rows, last = [], ""
    while True:
        page = db.page_after(last, 1000)
        if not page:
            break
        rows += page
        last = page[-1]
    missing = [s for s, v in zip(rows, in_filter(direct, name, rows)) if v != 1]
    check(not missing, "slugs in the table but not in the filter: %s" % missing[:10])
    print("ok: all %d slugs of the table are in the filter" % len(rows))


def readme_snippets_match():
    """The README's Node, Go and Java snippets are taken from the files."""
    readme = open(os.path.join(EX, "README.md")).read()
    files = {"js": "clients/node/check.js", "go": "clients/go/check.go",
             "java": "clients/java/Check.java"}
    for lang, path in files.items():
        blocks = re.findall(r"```%s\n(.*?)```" % lang, readme, re.S)
        check(blocks, "README.md shows no %s snippet" % lang)
        text = open(os.path.join(EX, path)).read()
        for b in blocks:
            check(b in text, "README.md's %s snippet is not in %s:\n%s" % (lang, path, b))


def node_checks(url, direct, db):
    readme_snippets_match()
    name = "slugs-test-node-%d-%x" % (os.getpid(), random.getrandbits(32))
    cleanups.append(lambda: direct.delete(name))
    base, _ = start_service(url, "sqlite:" + os.path.join(work, "slugs.db"), name)
    wait_for("the filter trusted", lambda: filter_state(base) == "trusted")
    taken = ["node-taken-%d" % i for i in range(5)]
    for s in taken:
        check(http(base, "POST", "/slugs/" + s)[0] == 201, "create %s" % s)
    fresh = ["node-fresh-%d" % i for i in range(5)]

    nwork = os.path.join(build, "tests", "examples", "node")
    os.makedirs(nwork, exist_ok=True)
    for f in ("check.js", "package.json", "package-lock.json"):
        shutil.copy(os.path.join(EX, "clients", "node", f), nwork)
    if not os.path.isdir(os.path.join(nwork, "node_modules", "@redis", "bloom")):
        r = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=nwork, capture_output=True, text=True, timeout=300)
        check(r.returncode == 0, "npm ci (node-redis from npm): %s" % r.stderr)
    for resp in ("2", "3"):
        r = subprocess.run(["node", "check.js", url, name] + taken + fresh, cwd=nwork,
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, RESP=resp))
        check(r.returncode == 0, "node check.js (RESP%s) exited %d: %s"
              % (resp, r.returncode, r.stderr))
        want = "".join("%s\task the database\n" % s for s in taken) + \
               "".join("%s\tfree\n" % s for s in fresh)
        check(r.stdout == want, "node check.js (RESP%s) printed:\n%s\nwant:\n%s"
              % (resp, r.stdout, want))
    # No server: never "free".
    r = subprocess.run(["node", "check.js", "redis://127.0.0.1:%d" % free_port(), name] + fresh,
                       cwd=nwork, capture_output=True, text=True, timeout=60)
    check(r.returncode == 0 and r.stdout == "".join("%s\task the database\n" % s for s in fresh),
          "node check.js without a server printed: %s %s" % (r.stdout, r.stderr))
    print("ok: node-redis check (RESP2 and RESP3): taken ask the database, new ones free, "
          "no server never free")


def main():
    if mode not in ("sqlite", "postgresql", "node"):
        sys.exit("usage: test_slugs.py SOURCE_DIR BUILD_DIR sqlite|postgresql|node")
    if mode == "node" and not (shutil.which("node") and shutil.which("npm")):
        fail("node and npm are needed (deploy/install-deps.sh installs them)")
    url, what = server()
    db_spec = "sqlite:" + os.path.join(work, "slugs.db")
    if mode == "postgresql":
        pg = subprocess.run([os.path.join(EX, "pg.sh"), "start", "--no-fsync"],
                            capture_output=True, text=True, env=dict(os.environ, TMPDIR="/tmp"))
        if pg.returncode != 0:
            print("SKIP: PostgreSQL could not be started here: %s" % pg.stderr.strip())
            raise SystemExit(SKIP)
        pgdir = re.search(r"PostgreSQL in (\S+)", pg.stderr).group(1)
        cleanups.append(lambda: subprocess.run([os.path.join(EX, "pg.sh"), "stop", pgdir]))
        db_spec = pg.stdout.strip()
    print("filter server: %s (%s); database: %s" % (url, what, mode if mode != "node" else "sqlite"))
    direct = redis.Redis.from_url(url, socket_timeout=10)
    db = slugs.Database(db_spec, 2, 10.0)
    if mode == "node":
        node_checks(url, direct, db)
    else:
        service_checks(url, direct, db_spec, db)
    print("examples/slugs %s: all checks passed" % mode)


if __name__ == "__main__":
    rc = 0
    try:
        main()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int) and e.code:
            print(e.code, file=sys.stderr)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for c in reversed(cleanups):
            try:
                c()
            except Exception:
                pass
    if rc == 0:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(rc)
