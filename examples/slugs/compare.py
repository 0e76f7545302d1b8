#!/usr/bin/python3
"""compare: the slug service with the filter and without it, side by side.

  compare.py --bloom redis://HOST:PORT [--db sqlite|postgresql]
             [--delay-ms MS] [--rounds 5] [--signups 2000] [--concurrency 8]

Starts two databases of the same kind (SQLite files, or two throw-away
PostgreSQL servers from pg.sh), two services (one asking the filter at
--bloom, one with --bloom none), and runs load.py against both in
alternating rounds: one table of signups/s and p50/p99 (median and spread),
database reads avoided and false positives.  --delay-ms puts netdelay.py
between each service and its database: DELAY ms each way, a database in
another zone or a managed one.  Everything it started is stopped at the end.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable or "/usr/bin/python3"


def started(p, out, pattern, what):
    for _ in range(600):
        m = re.search(pattern, open(out).read())
        if m:
            return m.group(1)
        if p.poll() is not None:
            sys.exit("compare: %s exited %d" % (what, p.returncode))
        time.sleep(0.05)
    sys.exit("compare: %s did not start" % what)


def main():
    p = argparse.ArgumentParser(prog="compare.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--bloom", required=True, help="the filter server, redis://HOST:PORT")
    p.add_argument("--db", choices=("sqlite", "postgresql"), default="sqlite")
    p.add_argument("--delay-ms", type=float, default=0.0,
                   help="added each way between service and database (default 0)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--signups", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--filter", default="slugs-compare-%d" % os.getpid(),
                   help="filter name (default a new one, dropped at the end)")
    a = p.parse_args()

    work = tempfile.mkdtemp(prefix="slugs-compare.")
    procs, pgdirs = [], []
    try:
        specs = []
        for i in range(2):
            if a.db == "sqlite":
                specs.append("sqlite:" + os.path.join(work, "slugs-%d.db" % i))
                continue
            r = subprocess.run([os.path.join(HERE, "pg.sh"), "start"], capture_output=True,
                               text=True)
            if r.returncode:
                sys.exit("compare: pg.sh: %s" % r.stderr)
            pgdirs.append(re.search(r"PostgreSQL in (\S+)", r.stderr).group(1))
            specs.append(r.stdout.strip())
        if a.delay_ms > 0:
            for i, spec in enumerate(specs):
                if a.db == "sqlite":
                    sys.exit("compare: --delay-ms needs --db postgresql (SQLite is a file)")
                m = re.match(r"(postgresql://[^@]*@)([^:/]+):(\d+)(/.*)", spec)
                out = os.path.join(work, "netdelay-%d.out" % i)
                pr = subprocess.Popen([PY, os.path.join(HERE, "netdelay.py"), "--to",
                                       "%s:%s" % (m.group(2), m.group(3)),
                                       "--delay-ms", str(a.delay_ms)],
                                      stdout=open(out, "w"), stderr=subprocess.STDOUT)
                procs.append(pr)
                addr = started(pr, out, r"listening on (\S+)", "netdelay.py")
                specs[i] = m.group(1) + addr + m.group(4)
        urls = []
        for i, (bloom, spec) in enumerate(((a.bloom, specs[0]), ("none", specs[1]))):
            out = os.path.join(work, "service-%d.out" % i)
            pr = subprocess.Popen([PY, os.path.join(HERE, "slugs.py"), "--listen",
                                   "127.0.0.1:0", "--bloom", bloom, "--filter", a.filter,
                                   "--db", spec],
                                  stdout=open(out, "w"),
                                  stderr=open(os.path.join(work, "service-%d.err" % i), "w"))
            procs.append(pr)
            urls.append(started(pr, out, r"listening on (http://\S+)", "slugs.py"))
        print("database: %s%s; filter: %s; service with the filter %s, without %s"
              % (a.db, ", %g ms each way" % a.delay_ms if a.delay_ms else "", a.bloom,
                 urls[0], urls[1]), flush=True)
        r = subprocess.run([PY, os.path.join(HERE, "load.py"), "--url",
                            "filter, then database=" + urls[0], "--url",
                            "database only=" + urls[1], "--rounds", str(a.rounds), "--signups", str(a.signups),
                            "--concurrency", str(a.concurrency)])
        return r.returncode
    finally:
        for pr in procs:
            pr.terminate()
            pr.wait()
        for d in pgdirs:
            subprocess.run([os.path.join(HERE, "pg.sh"), "stop", d])
        if a.filter == "slugs-compare-%d" % os.getpid():  # ours: drop it
            try:
                import redis
                redis.Redis.from_url(a.bloom, socket_timeout=5).delete(a.filter)
            except Exception:
                pass
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
