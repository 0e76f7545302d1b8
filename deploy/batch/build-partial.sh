#!/bin/sh
# Hadoop Streaming mapper: build one partial bundle from the keys on stdin
# (one per line) and upload it to HDFS under this task's id.
set -eu
OUT_DIR=${BLOOMGRID_PARTIALS:-/tmp/users-partials}
TASK=${mapreduce_task_id:-task-$$}
./bloomgrid build "part-$TASK.bundle" --force --like template.bundle -
hdfs dfs -mkdir -p "$OUT_DIR"
hdfs dfs -put -f "part-$TASK.bundle" "$OUT_DIR/part-$TASK.bundle"
echo "$TASK built"
