"""deploy/local/start.sh on free loopback ports, for the tests that run the
local cluster as a user would (the README's examples, docs/CLIENTS.md,
examples/slugs).

A base port P is free when P+1..P+3 (nodes), P+101 (the router) and P+201
(its RESP port) all bind.  Another test's process may take one of them
between that check and start.sh binding it (start.sh then says "is taken
by another process"): what started is stopped, its state wiped and the
next free base tried, a few times.  Tests that may run at once start
their search at different bases (a random one in a range)."""
import shutil
import socket
import subprocess
import sys

PORT_OFFSETS = (1, 2, 3, 101, 201)


def free_base(first, step, last=60000):
    """The first base from `first` (by `step`) whose ports all bind."""
    for base in range(first, last, step):
        ok = True
        for off in PORT_OFFSETS:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", base + off))
            except OSError:
                ok = False
            finally:
                s.close()
            if not ok:
                break
        if ok:
            return base
    sys.exit("FAIL: no free ports from %d" % first)


def start(root, env, first, step, attempts=5):
    """Start the cluster from directory `root` with `env` (its
    BLOOMGRID_STATE; BLOOMGRID_PORT is set here); the base port used.
    Exits the test with start.sh's stderr when it fails otherwise."""
    base = first - step
    err = ""
    for _ in range(attempts):
        base = free_base(base + step, step)
        env["BLOOMGRID_PORT"] = str(base)
        r = subprocess.run(["deploy/local/start.sh"], cwd=root, env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode == 0:
            return base
        err = r.stderr
        sys.stderr.write(err)
        stop(root, env)
        # Found free, then taken before the cluster bound it: start.sh saw
        # it taken, or a process it started could not bind it.
        if "is taken by another process" not in err and "address is in use" not in err:
            break
        shutil.rmtree(env["BLOOMGRID_STATE"], ignore_errors=True)
    sys.exit("FAIL: deploy/local/start.sh exited %d: %s" % (r.returncode, err.strip()))


def stop(root, env):
    subprocess.run(["deploy/local/stop.sh"], cwd=root, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
