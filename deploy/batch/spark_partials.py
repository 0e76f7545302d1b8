#!/usr/bin/env python3
"""PySpark: a partial bundle per partition, built by the bloomgrid of the
make dist tarball, then the reduce (reduce.sh) on the driver.

  spark-submit --master yarn --deploy-mode cluster \\
      --archives bloomgrid-VERSION-linux-ARCH.tar.gz#bg --files template.bundle \\
      spark_partials.py --input hdfs:///data/users/ \\
      --parts hdfs:///tmp/users-partials/run-1 --out global.bundle \\
      [--filter users --server router:7500 --token-file batch.token]

Partition I (mapPartitionsWithIndex) writes its keys to a local file,
counting them, runs `bg/bin/bloomgrid build part-I.bundle --like
template.bundle` on it and puts part-I.keys and part-I.bundle under --parts
(`hdfs dfs -put` for a URI; copy and rename for a directory every executor
and the driver see).  A retried or speculative task rewrites the same
partial: OR is idempotent.  The driver then checks that every partition
answered and runs share/bloomgrid/batch/reduce.sh from the tarball with
PARTS = the number of partitions: every partial verified (the template's
shards by fingerprint, built from as many keys as its task read), merged into
--out, imported into --filter when given.  In client mode the driver has no
bg/: give it an unpacked tarball with --driver-home.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile


def resolve(path):
    """PATH as a task sees it: in its working directory (YARN, Kubernetes
    localise --files and --archives there), else where SparkFiles put it."""
    if os.path.exists(path) or os.path.isabs(path):
        return path
    try:
        from pyspark import SparkFiles
        return SparkFiles.get(path)
    except Exception:
        return path


def put(local, dest):
    """Copy LOCAL into DEST (a Hadoop FS URI or a directory), whole or not
    at all under its own name."""
    name = os.path.basename(local)
    if "://" in dest:
        subprocess.run(["hdfs", "dfs", "-mkdir", "-p", dest], check=True)
        subprocess.run(["hdfs", "dfs", "-put", "-f", local, dest + "/" + name], check=True)
        return
    os.makedirs(dest, exist_ok=True)
    tmp = os.path.join(dest, "." + name + ".tmp")
    shutil.copyfile(local, tmp)
    os.replace(tmp, os.path.join(dest, name))


def build_partial(index, keys, home, template, dest):
    """The map: one partial of partition INDEX from KEYS (str or bytes, one
    key each).  Yields (INDEX, number of keys read)."""
    tool = os.path.join(resolve(home), "bin", "bloomgrid")
    work = tempfile.mkdtemp(prefix="bloomgrid-part-", dir=".")
    try:
        src = os.path.join(work, "input")
        n = 0
        with open(src, "wb") as f:
            for k in keys:
                f.write((k.encode() if isinstance(k, str) else k) + b"\n")
                n += 1
        part = os.path.join(work, "part-%d.bundle" % index)
        r = subprocess.run([tool, "build", part, "--like", resolve(template), src],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("partition %d: bloomgrid build failed (exit %d): %s"
                               % (index, r.returncode, r.stderr.strip()))
        count = os.path.join(work, "part-%d.keys" % index)
        with open(count, "w") as f:
            f.write("%d\n" % n)
        put(count, dest)
        put(part, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    yield (index, n)


def driver_reduce(partitions, answers, home, template, dest, out, filter_name=None,
                  server=None, token_file=None):
    """The reduce on the driver: every partition answered once, then
    reduce.sh over the PARTITIONS partials.  Returns reduce.sh's status."""
    got = sorted(i for i, _ in answers)
    if got != list(range(partitions)):
        missing = sorted(set(range(partitions)) - set(got))
        print("spark_partials: partitions without a partial: %s" % missing, file=sys.stderr)
        return 1
    env = dict(os.environ, PARTS=str(partitions), PARTS_DIR=dest, TEMPLATE=template,
               OUT=out, BLOOMGRID=os.path.join(home, "bin", "bloomgrid"))
    env.pop("FILTER", None)
    if filter_name:
        env["FILTER"] = filter_name
    if server:
        env["BLOOMGRID_SERVER"] = server
    if token_file:
        env["TOKEN_FILE"] = token_file
    script = os.path.join(home, "share", "bloomgrid", "batch", "reduce.sh")
    return subprocess.run(["sh", script], env=env).returncode


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", required=True, help="text input, one key per line")
    ap.add_argument("--parts", required=True, help="where the partials go (URI or directory)")
    ap.add_argument("--out", required=True, help="the merge, on the driver")
    ap.add_argument("--template", default="template.bundle")
    ap.add_argument("--home", default="bg", help="the unpacked tarball on the executors")
    ap.add_argument("--driver-home", help="the unpacked tarball on the driver (default --home)")
    ap.add_argument("--filter", help="import the merge into this filter")
    ap.add_argument("--server", help="the router (default $BLOOMGRID_SERVER)")
    ap.add_argument("--token-file")
    a = ap.parse_args(argv)

    from pyspark.sql import SparkSession
    spark = SparkSession.builder.appName("bloomgrid-partials").getOrCreate()
    keys = spark.read.text(a.input).rdd.map(lambda row: row.value)
    n = keys.getNumPartitions()
    home, template, dest = a.home, a.template, a.parts
    answers = keys.mapPartitionsWithIndex(
        lambda i, it: build_partial(i, it, home, template, dest)).collect()
    spark.stop()
    driver_home = a.driver_home or resolve(a.home)
    return driver_reduce(n, answers, driver_home, resolve(a.template), a.parts, a.out,
                         a.filter, a.server, a.token_file)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
