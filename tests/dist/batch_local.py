#!/usr/bin/python3
"""The Hadoop Streaming and Spark recipes of deploy/batch/, run the way those
frameworks run them but without them: every script and program comes from
the make dist tarball, unpacked once as the framework localises an
--archives file (a task's working directory holds it as bg/, and the
template beside it).

Hadoop Streaming: hadoop-map.sh per map task, its split's lines on stdin,
mapreduce_task_partition and mapreduce_task_output_dir in its environment;
the attempts' work directories are then promoted into the output directory,
as the output committer does; reduce.sh counts the maps by their part-m-*
outputs, checks every partial, merges and imports through a router run from
the tarball.  The output directory is given as a file:// URI, so the
`hadoop fs` branch runs, against a stand-in `hadoop` on PATH that maps
file:// to the local disk.  Spark: spark_partials.build_partial per
partition in an executor's working directory, then driver_reduce.  What
is not run: Hadoop, YARN, Spark, HDFS themselves.

usage: batch_local.py SRC BUILD DISTDIR TMP
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

SRC, BUILD, DIST, TMP = [os.path.abspath(a) for a in sys.argv[1:5]]
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


def ok(msg):
    print("ok: " + msg)


shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP)
tarballs = glob.glob(os.path.join(DIST, "bloomgrid-*.tar.gz"))
if len(tarballs) != 1:
    print("FAIL: wanted one tarball in %s, found %s" % (DIST, tarballs))
    sys.exit(1)
HOME = os.path.join(TMP, "archive")          # the localised archive
with tarfile.open(tarballs[0]) as t:
    t.extractall(HOME)
BG = os.path.join(HOME, "bin", "bloomgrid")
BATCH = os.path.join(HOME, "share", "bloomgrid", "batch")

# A stand-in for `hadoop fs` on file:// URIs: the three calls the recipes make.
FAKEBIN = os.path.join(TMP, "fakebin")
os.makedirs(FAKEBIN)
with open(os.path.join(FAKEBIN, "hadoop"), "w") as f:
    f.write(r"""#!/bin/sh
# hadoop fs -mkdir -p URI | -put -f FILE... URI/ | -get 'URI/GLOB' DIR/
echo "$*" >> "$(dirname "$0")/calls"
[ "$1" = fs ] || exit 2
loc() { case $1 in file://*) echo "${1#file://}" ;; *) echo "hadoop: not file://: $1" >&2; exit 2 ;; esac; }
case $2 in
-mkdir) [ "$3" = -p ] && mkdir -p "$(loc "$4")" ;;
-put) [ "$3" = -f ] || exit 2; shift 3
      for last; do :; done; dst=$(loc "$last")
      while [ $# -gt 1 ]; do cp "$1" "$dst"; shift; done ;;
-get) src=$(loc "$3"); shift 3; for f in $src; do cp "$f" "$1"; done ;;
*) exit 2 ;;
esac
""")
os.chmod(os.path.join(FAKEBIN, "hadoop"), 0o755)
ENV = dict(os.environ, PATH=FAKEBIN + ":" + os.environ["PATH"])
for k in ("BLOOMGRID_SERVER", "FILTER", "PARTS", "RUN"):
    ENV.pop(k, None)


def bg(*args, **kw):
    return subprocess.run([BG] + list(args), capture_output=True, text=True, env=ENV,
                          timeout=120, **kw)


def start(prog, *args):
    """A server from the tarball on a free loopback port: (process, address)."""
    out = open(os.path.join(TMP, prog + ".out"), "w+")
    p = subprocess.Popen([os.path.join(HOME, "bin", prog), "--listen", "127.0.0.1:0"] + list(args),
                         stdout=out, stderr=subprocess.DEVNULL, env=ENV)
    for _ in range(400):
        out.seek(0)
        m = re.search(r"listening on (\S+)", out.read())
        if m:
            return p, m.group(1)
        if p.poll() is not None:
            break
        subprocess.run(["sleep", "0.05"])
    p.kill()
    raise SystemExit("FAIL: %s did not start" % prog)


procs = []


def keys_of(prefix, n):
    return ["%s-%d" % (prefix, k) for k in range(n)]


# The splits of each job: unique keys; keys repeated inside a split ("a, b,
# a") and taken from another split; none; and one far past the filters'
# capacity (CAPACITY), whose keys meet false positives as they are added.
# A partial's keys added are its split's lines; the bits it set are fewer.
CAPACITY = 4000


def splits_of(prefix):
    first = keys_of(prefix + "0", 120)
    again = [k for k in keys_of(prefix + "1", 40) for _ in range(2)] + first[:35]
    return [first, again, [], keys_of(prefix + "3", 3 * CAPACITY)]


def inspect(path):
    r = bg("inspect", path, "--json")
    return json.loads(r.stdout) if r.returncode == 0 else {}


def counts(path):
    """(keys added, inserts) of a bundle: the sums over its shards (keys
    added None when a shard has none)."""
    shards = inspect(path).get("shard_list", [])
    keys = [s.get("keys_added") for s in shards]
    return (None if None in keys else sum(keys), sum(s.get("inserts", 0) for s in shards))


def check_partials(what, paths, splits):
    """Each partial's keys added are its split's lines; repeats and the big
    split's false positives set no bit, so the test covers them."""
    good = True
    for i, (path, split) in enumerate(zip(paths, splits)):
        keys, inserts = counts(path)
        if keys != len(split):
            fail("%s partial %d: %s keys added, its split has %d lines" % (what, i, keys, len(split)))
            good = False
        if keys is None:
            continue
        if split and len(set(split)) < len(split) and not inserts < keys:
            fail("%s partial %d of repeated keys: %d inserts, %d keys" % (what, i, inserts, keys))
            good = False
        if len(split) > CAPACITY and not inserts < len(split):
            fail("%s partial %d past capacity: %d inserts of %d unique keys: no false positive"
                 % (what, i, inserts, len(split)))
            good = False
    if good:
        ok("%s partials: keys added = lines (%s), fewer bits set (%s)"
           % (what, [counts(p)[0] for p in paths], [counts(p)[1] for p in paths]))


def check_live(router, name, keys):
    """Every key maybe present through the router."""
    r = bg("--server", router, "check", name, "--count", input="".join(k + "\n" for k in keys))
    return r.returncode == 0 and r.stdout == "maybe %d\nno 0\n" % len(keys), r.stdout + r.stderr


def reduce(env_extra):
    env = dict(ENV, BLOOMGRID=BG, **env_extra)
    return subprocess.run(["sh", os.path.join(BATCH, "reduce.sh")], capture_output=True,
                          text=True, env=env, timeout=120)


def hadoop(router, template):
    root = os.path.join(TMP, "hadoop")
    out_dir = os.path.join(root, "out")                      # the job's -output
    splits = splits_of("h")
    for i, split in enumerate(splits):
        cwd = os.path.join(root, "task-%d" % i)              # the container's cwd
        os.makedirs(cwd)
        os.symlink(HOME, os.path.join(cwd, "bg"))
        os.symlink(template, os.path.join(cwd, "template.bundle"))
        os.symlink(os.path.join(BATCH, "hadoop-map.sh"), os.path.join(cwd, "hadoop-map.sh"))
        attempt = os.path.join(out_dir, "_temporary", "1", "_temporary", "attempt_m_%06d_0" % i)
        env = dict(ENV, mapreduce_task_partition=str(i), mapreduce_task_id="task_m_%06d" % i,
                   mapreduce_task_output_dir="file://" + attempt)
        r = subprocess.run(["./hadoop-map.sh"], cwd=cwd, env=env, capture_output=True,
                           input="".join(k + "\n" for k in split), text=True, timeout=120)
        if r.returncode != 0 or r.stdout != "part-%d.bundle\t%d\n" % (i, len(split)):
            fail("map %d: exit %d, stdout %r: %s" % (i, r.returncode, r.stdout, r.stderr))
            continue
        left = [f for f in os.listdir(cwd) if f not in ("bg", "template.bundle", "hadoop-map.sh")]
        if left:
            fail("map %d left %s in its working directory" % (i, left))
        # The attempt's map output, and the committer's promotion.
        with open(os.path.join(attempt, "part-m-%05d" % i), "w") as f:
            f.write(r.stdout)
        for name in os.listdir(attempt):
            os.rename(os.path.join(attempt, name), os.path.join(out_dir, name))
    shutil.rmtree(os.path.join(out_dir, "_temporary"), ignore_errors=True)
    open(os.path.join(out_dir, "_SUCCESS"), "w").close()       # the job's commit
    calls = open(os.path.join(FAKEBIN, "calls")).read()
    if "fs -put -f" not in calls:
        fail("the mappers did not put their partials with hadoop fs: %s" % calls)
    else:
        ok("4 Hadoop Streaming maps built their partials (one of an empty split)")
    check_partials("Hadoop", [os.path.join(out_dir, "part-%d.bundle" % i) for i in range(4)],
                   splits)

    # A map whose split holds an empty line fails, naming it, and puts nothing.
    cwd = os.path.join(root, "task-0")
    bad = os.path.join(root, "bad-attempt")
    r = subprocess.run(["./hadoop-map.sh"], cwd=cwd, capture_output=True, text=True,
                       input="a\n\nb\n", timeout=60,
                       env=dict(ENV, mapreduce_task_partition="7",
                                mapreduce_task_output_dir="file://" + bad))
    if r.returncode == 0 or "empty" not in r.stderr or os.path.exists(bad):
        fail("a map of an empty key: exit %d, stderr %r, output %s"
             % (r.returncode, r.stderr, os.path.exists(bad)))
    else:
        ok("a map of an empty key fails and puts nothing: %s" % r.stderr.strip().splitlines()[-1])

    uri = "file://" + out_dir
    total = sum(len(s) for s in splits)

    # Refusals first: the live filter must not change.
    gone = os.path.join(root, "out-missing")
    shutil.copytree(out_dir, gone)
    os.unlink(os.path.join(gone, "part-1.bundle"))
    r = reduce({"PARTS_DIR": "file://" + gone, "TEMPLATE": template,
                "OUT": os.path.join(root, "g-missing.bundle"), "FILTER": "users"})
    if r.returncode != 1 or "indexes: 1" not in r.stderr or \
            os.path.exists(os.path.join(root, "g-missing.bundle")):
        fail("reduce without partial 1: exit %d: %s" % (r.returncode, r.stderr))
    else:
        ok("reduce without a partial refuses, nothing merged: %s" % r.stderr.strip())
    failed = os.path.join(root, "out-failed")
    shutil.copytree(out_dir, failed)
    os.unlink(os.path.join(failed, "_SUCCESS"))
    os.unlink(os.path.join(failed, "part-m-00002"))
    os.unlink(os.path.join(failed, "part-2.bundle"))
    r = reduce({"PARTS_DIR": "file://" + failed, "TEMPLATE": template,
                "OUT": os.path.join(root, "g-failed.bundle"), "FILTER": "users"})
    if r.returncode != 1 or "_SUCCESS" not in r.stderr:
        fail("reduce of a failed job's outputs: exit %d: %s" % (r.returncode, r.stderr))
    else:
        ok("reduce of a job without _SUCCESS refuses: %s" % r.stderr.strip())
    short = os.path.join(root, "out-short")
    shutil.copytree(out_dir, short)
    with open(os.path.join(short, "part-3.keys"), "w") as f:
        f.write("%d\n" % (len(splits[3]) + 1))
    r = reduce({"PARTS_DIR": short, "TEMPLATE": template,
                "OUT": os.path.join(root, "g-short.bundle"), "FILTER": "users"})
    if r.returncode != 1 or "part-3.bundle: built from %d keys, its mapper read %d" % (
            len(splits[3]), len(splits[3]) + 1) not in r.stderr:
        fail("reduce of a partial short of its keys: exit %d: %s" % (r.returncode, r.stderr))
    else:
        ok("reduce of a partial short of its mapper's keys refuses: %s" % r.stderr.strip())
    info = bg("--server", router, "info", "users", "--json")
    if '"inserts": 0' not in info.stdout:
        fail("a refused reduce changed the live filter: %s" % info.stdout)

    # The whole set: PARTS from the map outputs, fetched, merged, imported.
    g = os.path.join(root, "global.bundle")
    r = reduce({"PARTS_DIR": uri, "TEMPLATE": template, "OUT": g, "FILTER": "users",
                "BLOOMGRID_SERVER": router})
    if r.returncode != 0 or "4 partials, %d keys, imported into users" % total not in r.stdout:
        fail("reduce of the Hadoop outputs: exit %d: %s %s" % (r.returncode, r.stdout, r.stderr))
        return
    keys, inserts = counts(g)
    if keys != total:
        fail("the Hadoop merge holds %s keys added, the splits %d lines" % (keys, total))
    good, got = check_live(router, "users", [k for s in splits for k in s])
    if not good:
        fail("after the Hadoop reduce, the live filter answers: %s" % got)
    else:
        ok("Hadoop reduce: %s; every key present through the router" % r.stdout.strip())
    info = bg("--server", router, "info", "users", "--json")
    if '"inserts": %d' % inserts not in info.stdout:
        fail("inserts after the import is not the merge's %d: %s" % (inserts, info.stdout))


def spark(router, template):
    sys.path.insert(0, BATCH)
    import spark_partials as sp
    root = os.path.join(TMP, "spark")
    dest = os.path.join(root, "parts")
    cwd = os.path.join(root, "executor")                     # an executor's cwd
    os.makedirs(cwd)
    os.symlink(HOME, os.path.join(cwd, "bg"))
    os.symlink(template, os.path.join(cwd, "template.bundle"))
    here = os.getcwd()
    os.chdir(cwd)
    try:
        parts = splits_of("s")
        answers = []
        for i, p in enumerate(parts):
            keys = iter(p if i != 1 else [k.encode() for k in p])   # str and bytes rows
            answers += list(sp.build_partial(i, keys, "bg", "template.bundle", dest))
        if answers != [(i, len(p)) for i, p in enumerate(parts)]:
            fail("spark partitions answered %s" % answers)
        left = [f for f in os.listdir(cwd) if f not in ("bg", "template.bundle")]
        if left:
            fail("partitions left %s in the executor's directory" % left)
        try:
            list(sp.build_partial(5, iter(["x", ""]), "bg", "template.bundle", dest))
            fail("a partition with an empty key built a partial")
        except RuntimeError as e:
            if "partition 5" not in str(e) or os.path.exists(os.path.join(dest, "part-5.bundle")):
                fail("a partition with an empty key: %s" % e)
            else:
                ok("a partition with an empty key fails, naming it: %s" % e)
        g = os.path.join(root, "global.bundle")
        check_partials("Spark", [os.path.join(dest, "part-%d.bundle" % i) for i in range(4)],
                       parts)
        if sp.driver_reduce(5, answers, HOME, template, dest, g, "events") != 1 or \
                os.path.exists(g):
            fail("driver_reduce with a partition unanswered went on")
        # The driver without jq: reduce.sh reads inspect's JSON with python3.
        os.environ["JQ"] = ""
        try:
            rc = sp.driver_reduce(4, answers, HOME, template, dest, g, "events", router)
        finally:
            del os.environ["JQ"]
    finally:
        os.chdir(here)
    if rc != 0:
        fail("driver_reduce: exit %d" % rc)
        return
    good, got = check_live(router, "events", [k for p in parts for k in p])
    if not good:
        fail("after the Spark reduce, the live filter answers: %s" % got)
    else:
        ok("Spark: 4 partitions built, verified, merged and imported (read without jq); "
           "every key present")


try:
    node, naddr = start("bloomgrid-node", "--data-dir", os.path.join(TMP, "node"),
                        "--max-memory-mb", "256")
    procs.append(node)
    topo = os.path.join(TMP, "topology.ini")
    with open(topo, "w") as f:
        f.write("version = 1\n[group g0]\ncopies = %s\n" % naddr)
    router, raddr = start("bloomgrid-router", "--topology", topo)
    procs.append(router)
    for name in ("users", "events"):
        r = bg("--server", raddr, "create", name, "-n", str(CAPACITY), "-p", "0.01", "--shards", "4")
        if r.returncode != 0:
            raise SystemExit("FAIL: create %s: %s" % (name, r.stderr))
        r = bg("--server", raddr, "export", name, os.path.join(TMP, name + ".template.bundle"))
        if r.returncode != 0:
            raise SystemExit("FAIL: export %s: %s" % (name, r.stderr))
    hadoop(raddr, os.path.join(TMP, "users.template.bundle"))
    spark(raddr, os.path.join(TMP, "events.template.bundle"))
    for p in procs:
        if p.poll() is not None:
            fail("a server exited (status %d)" % p.returncode)
finally:
    for p in procs:
        p.terminate()
        p.wait(timeout=30)

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
