#!/bin/sh
# Hadoop Streaming mapper: build this map task's partial bundle from the keys
# on stdin (one per line: TextInputFormat hands the mapper its split's lines)
# --like the template, and put it, with the number of keys it read, where
# the reduce (reduce.sh) finds them: part-I.bundle and part-I.keys, I being
# the task's partition (mapreduce_task_partition, 0 .. maps-1).
#
#   -archives bloomgrid-VERSION-linux-ARCH.tar.gz#bg   (make dist: bg/bin/bloomgrid)
#   -files template.bundle,hadoop-map.sh  -mapper hadoop-map.sh
#
# By default the files go to the task attempt's work directory of the output
# committer (mapreduce_task_output_dir): Hadoop moves them into the job's
# output directory when, and only when, the attempt commits, so a failed or
# speculative attempt leaves nothing behind.  BLOOMGRID_PARTS names another
# destination (any Hadoop FS URI, or a directory).  Prints one line,
# "part-I.bundle<TAB>KEYS": the map's output, which makes part-m-I, by
# which the reduce counts the maps.
set -eu
i=${mapreduce_task_partition:?not run by Hadoop Streaming: no mapreduce_task_partition}
dest=${BLOOMGRID_PARTS:-${mapreduce_task_output_dir:?no mapreduce_task_output_dir; set BLOOMGRID_PARTS}}
bg=${BLOOMGRID:-bg/bin/bloomgrid}
template=${BLOOMGRID_TEMPLATE:-template.bundle}
case $i in '' | *[!0-9]*) echo "hadoop-map: partition '$i' is not a number" >&2; exit 2 ;; esac

# In the task's working directory (its local disks, cleaned by YARN too).
work=$(mktemp -d ./bloomgrid-map.XXXXXX)
trap 'rm -rf "$work"' EXIT
cat > "$work/input"
keys=$(grep -c '' "$work/input" || true)
"$bg" build "$work/part-$i.bundle" --like "$template" "$work/input"
echo "$keys" > "$work/part-$i.keys"

case $dest in
*://*)
    hadoop fs -mkdir -p "$dest"
    hadoop fs -put -f "$work/part-$i.keys" "$work/part-$i.bundle" "$dest/" ;;
*)
    # A directory (a shared file system): each file whole or not at all.
    mkdir -p "$dest"
    for f in "part-$i.keys" "part-$i.bundle"; do
        cp "$work/$f" "$dest/.$f.tmp"
        mv -f "$dest/.$f.tmp" "$dest/$f"
    done ;;
esac
printf 'part-%s.bundle\t%s\n' "$i" "$keys"
