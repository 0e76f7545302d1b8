#!/usr/bin/env python3
"""The Redis door of a node through redis-py (Debian's python3-redis 4.3,
RESP2): its bf() API, pipeline() with and without MULTI/EXEC, errors as
redis-py raises them, a password (a token), many keys, and a pool of
connections used from threads.

usage: test_resp_redis_py.py NODE_BIN"""
import hashlib
import os
import sys
import threading

import redis
from redis.commands.bf import BFBloom

import resplib

NODE = sys.argv[1]
work = resplib.workdir("resp-redis-py-")


def check(cond, msg):
    if not cond:
        resplib.fail(msg)


def expect_error(fn, text):
    try:
        fn()
    except redis.ResponseError as e:
        check(text in str(e), "error %r does not say %r" % (str(e), text))
        return
    resplib.fail("no error; expected one saying %r" % text)


tf = os.path.join(work, "tokens")
with open(tf, "w") as f:
    f.write("admin boss %s\n" % hashlib.sha256(b"s3cret").hexdigest())
    f.write("read viewer %s\n" % hashlib.sha256(b"look").hexdigest())
node = resplib.start_node(NODE, work, ["--tokens-file", tf])
try:
    r = redis.Redis(host=node.host, port=node.port, password="s3cret",
                    client_name="test-py", decode_responses=True)
    check(r.ping() is True, "PING")
    check(r.client_getname() == "test-py", "CLIENT GETNAME")
    bf = r.bf()
    check(bf.create("users", 0.01, 100000, noScale=True), "BF.RESERVE")
    check(bf.add("users", "alice") == 1, "BF.ADD new")
    check(bf.add("users", "alice") == 0, "BF.ADD again")
    check(bf.madd("users", "bob", "carol") == [1, 1], "BF.MADD")
    check(bf.exists("users", "alice") == 1, "BF.EXISTS present")
    check(bf.exists("users", "zed") == 0, "BF.EXISTS absent")
    check(bf.mexists("users", "bob", "zed", "carol") == [1, 0, 1], "BF.MEXISTS")
    check(bf.insert("users", ["dave"], noCreate=True) == [1], "BF.INSERT NOCREATE")
    check(bf.insert("grown", ["x", "y"], capacity=1000, error=0.001) == [1, 1],
          "BF.INSERT creating")
    info = bf.info("users")
    check(info.capacity == 100000 and info.filterNum == 1 and info.insertedNum == 4
          and info.expansionRate is None and info.size > 0,
          "BF.INFO: %s" % vars(info))
    check(bf.info("grown").expansionRate == 2, "BF.INFO of a scaling filter")
    check(r.execute_command("BF.CARD", "users") == 4, "BF.CARD")
    expect_error(lambda: bf.exists("nosuch", "a"), "not found")
    expect_error(lambda: bf.create("users", 0.01, 10), "item exists")
    expect_error(lambda: bf.create("bad", 2, 10), "error rate")
    # 10 000 keys in one command, then the same read back.
    keys = ["k%d" % i for i in range(10000)]
    check(bf.madd("many", *keys) == [1] * 10000, "BF.MADD of 10 000 keys")
    check(bf.mexists("many", *keys) == [1] * 10000, "BF.MEXISTS of 10 000 keys")

    # pipeline(): MULTI/EXEC by default; an add then a read of the same key
    # on one connection never reads 0.
    pipe = r.pipeline()
    pb = BFBloom(pipe)
    for i in range(50):
        pb.add("piped", "p%d" % i)
        pb.exists("piped", "p%d" % i)
    res = pipe.execute()
    check(res == [1, 1] * 50, "pipeline(transaction=True): %s" % res[:10])
    pipe = r.pipeline(transaction=False)
    for i in range(50):
        pipe.execute_command("BF.ADD", "piped2", "q%d" % i)
        pipe.execute_command("BF.EXISTS", "piped2", "q%d" % i)
    res = pipe.execute()
    check(res == [1, 1] * 50, "pipeline(transaction=False): %s" % res[:10])
    # An error inside a pipeline is that command's error only.
    pipe = r.pipeline(transaction=False)
    pipe.execute_command("BF.EXISTS", "piped", "p1")
    pipe.execute_command("BF.EXISTS", "nosuch", "p1")
    res = pipe.execute(raise_on_error=False)
    check(res[0] == 1 and isinstance(res[1], redis.ResponseError), "pipeline error: %s" % res)

    # Roles: a read token reads and may not write.
    ro = redis.Redis(host=node.host, port=node.port, password="look",
                     decode_responses=True)
    check(ro.bf().exists("users", "alice") == 1, "read token reads")
    try:
        ro.bf().add("users", "eve")
        resplib.fail("a read token added a key")
    except redis.exceptions.NoPermissionError:
        pass
    try:
        redis.Redis(host=node.host, port=node.port, password="wrong").ping()
        resplib.fail("a wrong password was taken")
    except redis.ResponseError as e:   # redis-py 4.3 raises WRONGPASS as is
        check("WRONGPASS" in str(e), str(e))
    try:
        redis.Redis(host=node.host, port=node.port).ping()
        resplib.fail("no password was taken")
    except redis.exceptions.AuthenticationError:
        pass

    # A pool of connections from 8 threads.
    pool = redis.ConnectionPool(host=node.host, port=node.port, password="s3cret",
                                max_connections=8)
    errors = []

    def worker(t):
        c = redis.Redis(connection_pool=pool)
        for i in range(200):
            k = "t%d-%d" % (t, i)
            if c.bf().add("users", k) not in (0, 1) or c.bf().exists("users", k) != 1:
                errors.append(k)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    check(not errors, "threads: %d keys read 0 after their add" % len(errors))
finally:
    node.stop()
print("1 passed, 0 failed")
