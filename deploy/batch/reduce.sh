#!/bin/sh
# The reduce of a batch load (README.md): nothing is merged, and nothing
# imported, unless all PARTS partials are there and each is a partial of the
# template (the same shards, by fingerprint) holding as many inserts as its
# mapper read keys.  Any miss ends with status 1 and a line naming the
# partial.  Used by the Kubernetes reduce Job, and after a Hadoop Streaming
# or Spark job; installed as share/bloomgrid/batch/reduce.sh (the image, the
# make dist tarball).
#
# Settings, in the environment:
#   PARTS_DIR  the partials part-0.bundle .. part-(PARTS-1).bundle: a
#              directory, or a Hadoop FS URI (hdfs://..., s3a://...) fetched
#              with `hadoop fs -get` (default $SHARED/runs/$RUN/parts)
#   PARTS      how many; unset, the number of Hadoop map outputs part-m-*
#              in PARTS_DIR (one per map task, whatever its output), which
#              must then hold the job's _SUCCESS
#   TEMPLATE   the template they were built --like ($SHARED/template.bundle)
#   OUT        the merge ($SHARED/runs/$RUN/global.bundle)
#   INPUT      the input splits, split-I for partial I ($SHARED/input);
#              without split-I, partial I's count of keys is the number in
#              PARTS_DIR/part-I.keys (written by the Hadoop and Spark
#              mappers); without either, its inserts are not checked
#   WAIT_S     seconds to wait for partials still missing from a directory
#              (default 0: none)
#   FILTER     import the merge into this filter through $BLOOMGRID_SERVER
#              (with TOKEN_FILE's token, BLOOMGRID_TLS_CA...); unset: no import
#   BLOOMGRID  the tool (default: bloomgrid on PATH)
set -eu
shared=${SHARED:-/shared}
run_dir=$shared/runs/${RUN:-}
[ -n "${RUN:-}" ] || { [ -n "${PARTS_DIR:-}" ] && [ -n "${OUT:-}" ]; } || {
    echo "reduce: set RUN (and SHARED), or PARTS_DIR and OUT" >&2
    exit 2
}
bg=${BLOOMGRID:-bloomgrid}
dir=${PARTS_DIR:-$run_dir/parts}
out=${OUT:-$run_dir/global.bundle}
template=${TEMPLATE:-$shared/template.bundle}
input=${INPUT:-$shared/input}
wait_s=${WAIT_S:-0}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "reduce: $*" >&2; exit 1; }

# 0. Partials on a Hadoop file system come here first.
from=$dir
case $dir in
*://*)
    mkdir "$tmp/fetched"
    hadoop fs -get "$dir/part-*" "$tmp/fetched/" || fail "cannot fetch $dir/part-*"
    hadoop fs -get "$dir/_SUCCESS" "$tmp/fetched/" 2>/dev/null || true
    dir=$tmp/fetched ;;
esac
# Counted from the map outputs, the set is only whole if the job committed:
# a failed job may leave some tasks' outputs behind, but no _SUCCESS.
if [ -z "${PARTS:-}" ]; then
    [ -f "$dir/_SUCCESS" ] ||
        fail "PARTS unset and $from has no _SUCCESS: the job did not succeed: nothing merged"
    PARTS=$(find "$dir" -maxdepth 1 -name 'part-m-*' | grep -c . || true)
    [ "$PARTS" -gt 0 ] || fail "PARTS unset and no map outputs (part-m-*) in $from"
fi

# 1. Every partial, waiting (WAIT_S) for the last mappers.  build writes
#    atomically, and so do the mappers' copies: a partial that is there is
#    whole.
missing() {
    i=0
    while [ "$i" -lt "$PARTS" ]; do
        [ -f "$dir/part-$i.bundle" ] || printf ' %s' "$i"
        i=$((i + 1))
    done
}
deadline=$(($(date +%s) + wait_s))
while m=$(missing) && [ -n "$m" ]; do
    [ "$(date +%s)" -lt "$deadline" ] ||
        fail "partials missing after ${wait_s}s (${RUN:+run $RUN, }$from, indexes:$m): nothing merged"
    sleep 10
done

# shards FILE OUT: "INDEX FINGERPRINT INSERTS" per shard of a bundle (or of
# a single filter file), from inspect --json, which also verifies the
# file's checksum.
shards() {
    "$bg" inspect "$1" --json > "$tmp/json" || fail "$1: unreadable or corrupt"
    if grep -q '"shard_list"' "$tmp/json"; then
        sed -n 's/.*"index": \([0-9]*\),.*"inserts": \([0-9]*\), "fingerprint": "\([0-9a-f]*\)".*/\1 \3 \2/p' \
            "$tmp/json" > "$2"
    else
        idx=$(sed -n 's/^  "shard_index": \([0-9]*\),$/\1/p' "$tmp/json")
        ins=$(sed -n 's/^  "inserts": \([0-9]*\),$/\1/p' "$tmp/json")
        fp=$(sed -n 's/^  "fingerprint": "\([0-9a-f]*\)",$/\1/p' "$tmp/json")
        echo "$idx $fp $ins" > "$2"
    fi
    [ -s "$2" ] || fail "$1: no shard in inspect's answer"
}
sum() { awk '{ s += $3 } END { printf "%d\n", s }' "$1"; }

# 2. Each partial: the template's shards, and its mapper's keys.
shards "$template" "$tmp/template"
cut -d' ' -f1,2 "$tmp/template" > "$tmp/want"
total=0
set --
i=0
while [ "$i" -lt "$PARTS" ]; do
    p=$dir/part-$i.bundle
    shards "$p" "$tmp/part"
    cut -d' ' -f1,2 "$tmp/part" | cmp -s - "$tmp/want" ||
        fail "$p: not a partial of $template (other shards or secret): nothing merged"
    n=$(sum "$tmp/part")
    keys=""
    if [ -f "$input/split-$i" ]; then
        keys=$(grep -c '' "$input/split-$i" || true)
    elif [ -f "$dir/part-$i.keys" ]; then
        keys=$(cat "$dir/part-$i.keys")
        case $keys in '' | *[!0-9]*) fail "$dir/part-$i.keys: not a count of keys: nothing merged" ;; esac
    fi
    [ -z "$keys" ] || [ "$n" -eq "$keys" ] ||
        fail "$p: $n inserts, its mapper read $keys keys: nothing merged"
    total=$((total + n))
    set -- "$@" "$p"
    i=$((i + 1))
done

# 3. Merge, check the sum, import through the router.
"$bg" merge --force "$out" "$@" || fail "merge failed: nothing imported"
shards "$out" "$tmp/global"
n=$(sum "$tmp/global")
[ "$n" -eq "$total" ] || fail "$out: $n inserts, the partials $total: nothing imported"
if [ -n "${FILTER:-}" ]; then
    "$bg" import ${TOKEN_FILE:+--token-file "$TOKEN_FILE"} "$FILTER" "$out" ||
        fail "import of $out into $FILTER failed"
    echo "reduce: ${RUN:+run $RUN: }$PARTS partials, $total inserts, imported into $FILTER"
else
    echo "reduce: ${RUN:+run $RUN: }$PARTS partials, $total inserts, merged into $out"
fi
