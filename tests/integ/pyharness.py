"""What the Python integration tests share: a work directory (under
BLOOMGRID_TEST_TMP when set), the processes a test started (killed when it
fails), and starting a server that prints the addresses it listens on."""
import os
import subprocess
import sys
import tempfile
import time


class Run:
    def __init__(self, prefix):
        tmp = os.environ.get("BLOOMGRID_TEST_TMP") or None
        if tmp:
            os.makedirs(tmp, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix=prefix, dir=tmp)
        self.procs = []

    def fail(self, msg):
        print("FAIL: " + msg, file=sys.stderr)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        sys.exit(1)

    def start_server(self, tag, args, metrics="127.0.0.1:0", preexec_fn=None):
        """Start args with --listen 127.0.0.1:0 and --metrics-listen metrics;
        wait for both addresses in its output; return (process, address,
        metrics address).  Output and log go to TAG.out and TAG.log."""
        out = open(os.path.join(self.work, tag + ".out"), "w")
        err = open(os.path.join(self.work, tag + ".log"), "w")
        p = subprocess.Popen(list(args) + ["--listen", "127.0.0.1:0",
                                           "--metrics-listen", metrics],
                             stdout=out, stderr=err, cwd=self.work,
                             preexec_fn=preexec_fn)
        self.procs.append(p)
        for _ in range(400):
            addr = maddr = None
            with open(out.name) as f:
                for line in f:
                    if " listening on " in line:
                        addr = line.split(" listening on ")[1].split()[0]
                    if " metrics on " in line:
                        maddr = line.split(" metrics on ")[1].split()[0]
            if addr and maddr:
                return p, addr, maddr
            if p.poll() is not None:
                self.fail("%s exited %d: %s" % (tag, p.returncode, open(err.name).read()))
            time.sleep(0.05)
        self.fail("%s did not start: %s" % (tag, open(err.name).read()))
