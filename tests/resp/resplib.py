"""What the tests of the Redis door share: a bloomgrid node (or RedisBloom
for the comparison runs) with a RESP port, in a work directory of its own
under BLOOMGRID_TEST_TMP, redis-cli, and a bare RESP connection (Conn) for
tests that pipeline by hand."""
import os
import re
import select
import socket
import subprocess
import sys
import tempfile
import time


class Server:
    """A process that prints "... listening on ADDR ... resp HOST:PORT"."""

    def __init__(self, args, tag, work):
        self.out = open(os.path.join(work, tag + ".out"), "w")
        self.err = open(os.path.join(work, tag + ".log"), "w")
        self.p = subprocess.Popen(args, stdout=self.out, stderr=self.err, cwd=work)
        self.host = self.port = self.addr = None
        for _ in range(400):
            text = open(self.out.name).read()
            m = re.search(r" listening on (\S+).* resp (\S+):(\d+)", text)
            if m:
                self.addr = m.group(1)
                self.host, self.port = m.group(2), int(m.group(3))
                return
            if self.p.poll() is not None:
                raise RuntimeError("%s exited %d: %s" % (tag, self.p.returncode,
                                                         open(self.err.name).read()))
            time.sleep(0.05)
        raise RuntimeError("%s did not start: %s" % (tag, open(self.err.name).read()))

    def log(self):
        return open(self.err.name).read()

    def stop(self):
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()


def workdir(prefix):
    tmp = os.environ.get("BLOOMGRID_TEST_TMP") or None
    if tmp:
        os.makedirs(tmp, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=tmp)


def start_node(node_bin, work, extra=(), tag="node"):
    """A node with a RESP port, once its data directory is open (before,
    it answers UNAVAILABLE)."""
    args = [node_bin, "--listen", "127.0.0.1:0", "--data-dir",
            os.path.join(work, tag + "-data"), "--durability", "none",
            "--resp-listen", "127.0.0.1:0"] + list(extra)
    s = Server(args, tag, work)
    for _ in range(400):
        if re.search(r"data directory \S+ open;", s.log()):
            return s
        time.sleep(0.05)
    raise RuntimeError("%s did not open its data directory: %s" % (tag, s.log()))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def port_open(port, host="127.0.0.1"):
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


class Redis:
    """redis-server with a module loaded, no persistence, on a free port."""

    def __init__(self, module, work):
        self.port = free_port()
        self.host = "127.0.0.1"
        self.p = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "no", "--dir", work,
             "--loadmodule", module], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        for _ in range(200):
            if subprocess.run(["redis-cli", "-p", str(self.port), "PING"],
                              capture_output=True, text=True).stdout.strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self):
        self.p.terminate()
        self.p.wait(10)


def cli(port, lines, resp3=False, extra=()):
    """Run lines (one connection) through redis-cli --no-raw; its output."""
    args = ["redis-cli", "--no-raw", "-p", str(port)] + list(extra)
    if resp3:
        args.append("-3")
    r = subprocess.run(args, input="\n".join(lines) + "\n", capture_output=True,
                       text=True, timeout=30)
    return r.stdout + r.stderr


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def cmd(*args):
    """One command as a RESP array of bulk strings."""
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


class Conn:
    """A bare connection: send bytes, read replies (':1', '-ERR ...', or a
    list of them for an array)."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def send(self, data):
        self.s.sendall(data)

    def quiet_for(self, secs):
        """True when nothing arrives for secs."""
        if self.buf:
            return False
        r, _, _ = select.select([self.s], [], [], secs)
        return not r

    def line(self):
        while b"\r\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                fail("connection closed")
            self.buf += d
        ln, self.buf = self.buf.split(b"\r\n", 1)
        return ln.decode()

    def reply(self):
        ln = self.line()
        if ln.startswith("*"):
            return [self.reply() for _ in range(int(ln[1:]))]
        return ln
