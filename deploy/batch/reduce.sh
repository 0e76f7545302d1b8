#!/bin/sh
# The reduce of a batch load (README.md): nothing is merged, and nothing
# imported, unless all PARTS partials are there and each is a partial of the
# template (the same shards, by fingerprint) built from as many keys as its
# mapper read: the "keys added" a partial records count every key `build`
# read, repeats and false positives included (file format 2: a partial
# written by an older bloomgrid records none, and is refused when there is
# a count to check).  Any miss ends with status 1 and a line naming the
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
#              mappers); without either, its keys are not checked
#   WAIT_S     seconds to wait for partials still missing from a directory
#              (default 0: none)
#   FILTER     import the merge into this filter through $BLOOMGRID_SERVER
#              (with TOKEN_FILE's token, BLOOMGRID_TLS_CA...); unset: no import
#   BLOOMGRID  the tool (default: bloomgrid on PATH)
#   JQ         the jq that reads `bloomgrid inspect --json` (default: jq on
#              PATH); without one (or with JQ empty), python3's json module
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

# inspect's JSON is read by a JSON parser: jq (Debian's jq, in the image),
# or python3 where there is no jq (a Spark driver, a Hadoop client).
jq=${JQ-jq}
if [ -n "$jq" ] && command -v "$jq" >/dev/null 2>&1; then
    json=jq
elif command -v python3 >/dev/null 2>&1; then
    json=python3
else
    echo "reduce: reading 'bloomgrid inspect --json' needs jq or python3; neither is on PATH" >&2
    exit 2
fi

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

# shards FILE OUT: "INDEX FINGERPRINT KEYS" per shard of a bundle (or of
# a single filter file), KEYS its keys added or "-" when the file records
# none; from inspect --json, which also verifies the file's checksum.
shards() {
    "$bg" inspect "$1" --json > "$tmp/json" || fail "$1: unreadable or corrupt"
    if [ "$json" = jq ]; then
        "$jq" -r '(if has("shard_list") then .shard_list[]
                   else {index: .shard_index, fingerprint, keys_added} end)
                  | "\(.index) \(.fingerprint) \(.keys_added // "-")"' "$tmp/json" > "$2"
    else
        python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for s in d.get("shard_list") or [dict(d, index=d.get("shard_index"))]:
    k = s.get("keys_added")
    print(s.get("index"), s.get("fingerprint"), "-" if k is None else k)
' "$tmp/json" > "$2"
    fi || fail "$1: inspect's answer is not the JSON expected"
    [ -s "$2" ] || fail "$1: no shard in inspect's answer"
    ! grep -Evq '^[0-9]+ [0-9a-f]+ ([0-9]+|-)$' "$2" ||
        fail "$1: inspect's answer is not the JSON expected: $(grep -Ev '^[0-9]+ [0-9a-f]+ ([0-9]+|-)$' "$2" | head -1)"
}
# keys FILE: the sum of the shards' keys added, or "-" if one has none.
keys() {
    t=0
    while read -r _ _ k; do
        [ "$k" != - ] || { echo -; return 0; }
        t=$((t + k))
    done < "$1"
    echo "$t"
}

# 2. Each partial: the template's shards, and its mapper's keys.
shards "$template" "$tmp/template"
cut -d' ' -f1,2 "$tmp/template" > "$tmp/want"
total=0    # the partials' keys added; "-" once one records none
set --
i=0
while [ "$i" -lt "$PARTS" ]; do
    p=$dir/part-$i.bundle
    shards "$p" "$tmp/part"
    cut -d' ' -f1,2 "$tmp/part" | cmp -s - "$tmp/want" ||
        fail "$p: not a partial of $template (other shards or secret): nothing merged"
    n=$(keys "$tmp/part")
    want=""    # the keys its mapper read
    if [ -f "$input/split-$i" ]; then
        want=$(grep -c '' "$input/split-$i" || true)
    elif [ -f "$dir/part-$i.keys" ]; then
        want=$(cat "$dir/part-$i.keys")
        case $want in '' | *[!0-9]*) fail "$dir/part-$i.keys: not a count of keys: nothing merged" ;; esac
    fi
    if [ -n "$want" ]; then
        [ "$n" != - ] ||
            fail "$p records no count of keys added (a filter file of format version 1, from an older bloomgrid): rebuild it: nothing merged"
        [ "$n" -eq "$want" ] ||
            fail "$p: built from $n keys, its mapper read $want: nothing merged"
    fi
    if [ "$n" = - ] || [ "$total" = - ]; then total=-; else total=$((total + n)); fi
    set -- "$@" "$p"
    i=$((i + 1))
done

# 3. Merge, check the sum (a merge adds the keys added of its inputs),
#    import through the router.
"$bg" merge --force "$out" "$@" || fail "merge failed: nothing imported"
shards "$out" "$tmp/global"
n=$(keys "$tmp/global")
[ "$n" = "$total" ] || fail "$out: $n keys added, the partials $total: nothing imported"
[ "$total" != - ] || total="an uncounted number of"
if [ -n "${FILTER:-}" ]; then
    "$bg" import ${TOKEN_FILE:+--token-file "$TOKEN_FILE"} "$FILTER" "$out" ||
        fail "import of $out into $FILTER failed"
    echo "reduce: ${RUN:+run $RUN: }$PARTS partials, $total keys, imported into $FILTER"
else
    echo "reduce: ${RUN:+run $RUN: }$PARTS partials, $total keys, merged into $out"
fi
