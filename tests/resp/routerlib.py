"""A cluster for the router's Redis door tests: shard groups of copies
(nodes reading a topology file, durability fsync, as a group of N > 1
needs) and routers with a RESP port, in a work directory of their own."""
import os
import subprocess
import time

import redis

import resplib


class Cluster:
    def __init__(self, node_bin, router_bin, work, groups=1, copies=3, routers=2,
                 node_env=None, router_flags=(), head=""):
        """node_env: {node index: {VAR: value}} added to that node's
        environment."""
        self.node_bin, self.router_bin, self.work = node_bin, router_bin, work
        self.node_env = node_env or {}
        self.router_flags = list(router_flags)
        self.n = groups * copies
        self.ports = []
        while len(self.ports) < self.n:
            p = resplib.free_port()
            if p not in self.ports:
                self.ports.append(p)
        self.topo = os.path.join(work, "topology.ini")
        with open(self.topo, "w") as f:
            f.write("; test topology\nversion = 1\n%s" % head)
            for g in range(groups):
                f.write("[group g%d]\ncopies = %s\n\n" % (g, " ".join(
                    "127.0.0.1:%d" % self.ports[i]
                    for i in range(g * copies, (g + 1) * copies))))
        self.nodes = [None] * self.n
        self.routers = []
        try:
            for i in range(self.n):
                self.start_node(i)
            for i in range(routers):
                self.routers.append(resplib.Server(
                    [router_bin, "--listen", "127.0.0.1:0", "--topology", self.topo,
                     "--resp-listen", "127.0.0.1:0", "--node-timeout-ms", "3000"]
                    + self.router_flags, "router%d" % i, work))
            self.wait_serving()
        except BaseException:
            self.stop()
            raise

    def start_node(self, i):
        env = dict(os.environ)
        env.update(self.node_env.get(i, {}))
        args = [self.node_bin, "--listen", "127.0.0.1:%d" % self.ports[i],
                "--data-dir", os.path.join(self.work, "node%d-data" % i),
                "--durability", "fsync", "--topology", self.topo,
                "--resp-listen", "127.0.0.1:0", "--threads", "4"]
        out = open(os.path.join(self.work, "node%d.out" % i), "a")
        err = open(os.path.join(self.work, "node%d.log" % i), "a")
        p = subprocess.Popen(args, stdout=out, stderr=err, cwd=self.work, env=env)
        self.nodes[i] = p
        for _ in range(400):
            if resplib.port_open(self.ports[i]):
                return
            if p.poll() is not None:
                raise RuntimeError("node %d exited %d: %s" % (
                    i, p.returncode, open(err.name).read()[-2000:]))
            time.sleep(0.05)
        raise RuntimeError("node %d does not listen" % i)

    def kill_node(self, i):
        p = self.nodes[i]
        if p and p.poll() is None:
            p.kill()
            p.wait()
        self.nodes[i] = None

    def client(self, r=0, **kw):
        s = self.routers[r]
        return redis.Redis(host=s.host, port=s.port, **kw)

    def wait_serving(self, timeout=60):
        """Until every router adds and reads a key of a filter of its own
        (every copy up and answering reads)."""
        deadline = time.time() + timeout
        for r in range(len(self.routers)):
            c = self.client(r)
            name = "warmup%d" % r
            last = None
            while True:
                try:
                    try:
                        c.execute_command("BF.RESERVE", name, 0.01, 1000, "NONSCALING")
                    except redis.ResponseError as e:
                        if "exists" not in str(e):
                            raise
                    c.execute_command("BF.ADD", name, "x")
                    if c.execute_command("BF.EXISTS", name, "x") == 1:
                        break
                except redis.RedisError as e:
                    last = e
                if time.time() > deadline:
                    raise RuntimeError("router %d does not serve: %s" % (r, last))
                time.sleep(0.2)
            c.close()

    def router_log(self, r):
        return self.routers[r].log()

    def stop(self):
        for s in self.routers:
            s.stop()
        for i, p in enumerate(self.nodes):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def mexists_all(c, filt, keys, chunk=500):
    """BF.MEXISTS of keys in chunks: the list of answers."""
    out = []
    for i in range(0, len(keys), chunk):
        out += c.execute_command("BF.MEXISTS", filt, *keys[i:i + chunk])
    return out
