#!/bin/sh
# Online commands against a real bloomgrid-node on a free loopback port with
# a temporary data directory: every command, exit statuses, the server's
# error messages, export/import round trips with the offline commands, and a
# 200k-key transfer through stdin.
set -eu
BG=$(realpath "$1")
NODE=$(realpath "$2")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"
TAB=$(printf '\t')

start_server node "$NODE" --data-dir "$WORK/data"
S=$ADDR
NODE_PID=$pid
unset BLOOMGRID_SERVER

# ---- help -----------------------------------------------------------------
expect_ok "$BG" help
for c in create drop list info add check remove export import query build status \
         resync; do
    grep -q "^  $c " out.txt || fail "help does not list $c"
done
for c in drop list info check export import status resync; do
    expect_ok "$BG" help $c
    grep -q "usage: bloomgrid .*$c" out.txt || fail "help $c: $(cat out.txt)"
    grep -q "example" out.txt || fail "help $c has no example"
done
expect_ok "$BG" help add
grep -q 'usage: bloomgrid add FILE' out.txt || fail "help add lacks the file form"
grep -q 'usage: bloomgrid --server HOST:PORT add NAME' out.txt ||
    fail "help add lacks the server form"
expect_ok "$BG" --server "$S" check --help
grep -q 'usage: bloomgrid .*check NAME' out.txt || fail "check --help"
# The usage line of each keys command names --batch and --inflight, which
# it takes (and its options list).
for c in add check remove; do
    expect_ok "$BG" --server "$S" $c --help
    sed -n '/usage: bloomgrid .*'$c' NAME/,/^$/p' out.txt > usage.txt
    for o in --batch --inflight; do
        grep -q -- "\[$o N\]" usage.txt || fail "$c: usage lacks $o: $(cat usage.txt)"
        grep -q -- "^  -.*$o N" out.txt || fail "$c: options lack $o"
    done
done

# ---- resync: refused without --accept-loss, and on a node of no group ------
expect_err 2 "refused without --accept-loss.*gone" "$BG" --server "$S" resync
expect_err 2 "FAILED_PRECONDITION: .*not a copy of a group of several copies" \
    "$BG" --server "$S" resync --accept-loss
expect_err 2 "resync: too many arguments" "$BG" --server "$S" resync --accept-loss x

# ---- catalog ----------------------------------------------------------------
expect_ok "$BG" --server "$S" list
[ ! -s out.txt ] || fail "empty list printed: $(cat out.txt)"
expect_ok "$BG" --server "$S" create users --capacity 1000 --error-rate 1e-9
grep -q '^name: *users$' out.txt || fail "create output: $(cat out.txt)"
grep -q '^kind: *blocked$' out.txt || fail "create kind: $(cat out.txt)"
expect_err 2 '^bloomgrid: server: ALREADY_EXISTS: .*users' \
    "$BG" --server "$S" create users -n 1000 -p 0.01
expect_err 2 '^bloomgrid: server: INVALID_ARGUMENT: .*capacity' \
    "$BG" --server "$S" create zero --capacity 0 --error-rate 0.01
expect_err 2 '^bloomgrid: server: INVALID_ARGUMENT: .*error_rate' \
    "$BG" --server "$S" create bad -n 10 -p 1.5
expect_err 2 'unknown kind' "$BG" --server "$S" create x -n 10 -p 0.1 -k nope
expect_err 2 'required' "$BG" --server "$S" create x -n 10
expect_ok "$BG" --server "$S" create sessions -n 1000 -p 1e-9 --kind counting --json
grep -q '"kind": "counting"' out.txt || fail "create --json: $(cat out.txt)"

expect_ok "$BG" --server "$S" list
[ "$(wc -l < out.txt)" -eq 3 ] || fail "list: $(cat out.txt)"
grep -q '^sessions  *counting ' out.txt || fail "list sessions: $(cat out.txt)"
grep -q '^users  *blocked ' out.txt || fail "list users: $(cat out.txt)"
expect_ok "$BG" --server "$S" list --json
grep -q '"name": "sessions"' out.txt || fail "list --json: $(cat out.txt)"

expect_ok "$BG" --server "$S" info users
for f in 'state: *ready' 'capacity: *1000' 'bits (m): *[1-9]' 'hashes (k): *[1-9]' \
         'fill: ' 'estimated keys: ' 'estimated FPR: ' 'version: ' 'shard 0 '; do
    grep -q "^$f" out.txt || fail "info lacks '$f': $(cat out.txt)"
done
expect_ok "$BG" --server "$S" info users --json
if command -v python3 >/dev/null; then
    python3 -c 'import json,sys; d=json.load(open("out.txt")); assert d["name"]=="users" and d["shard_info"][0]["state"]=="ready"' ||
        fail "info --json does not parse: $(cat out.txt)"
    "$BG" --server "$S" list --json | python3 -c 'import json,sys; assert len(json.load(sys.stdin))==2' ||
        fail "list --json does not parse"
fi
expect_err 2 '^bloomgrid: server: NOT_FOUND: .*nope' "$BG" --server "$S" info nope
expect_err 2 '^bloomgrid: server: NOT_FOUND: ' "$BG" --server "$S" drop nope

# ---- keys -------------------------------------------------------------------
expect_ok "$BG" --server "$S" add users alice bob "with space"
[ ! -s out.txt ] || fail "add printed: $(cat out.txt)"
expect_ok "$BG" --server "$S" add --verbose users alice carol
printf 'present\talice\nadded\tcarol\n' > want.txt
cmp -s out.txt want.txt || fail "add --verbose: $(cat out.txt)"

expect_ok "$BG" --server "$S" check users alice bob "with space"
printf 'maybe\talice\nmaybe\tbob\nmaybe\twith space\n' > want.txt
cmp -s out.txt want.txt || fail "check output: $(cat out.txt)"
run "$BG" --server "$S" check users alice dave bob
[ "$rc" -eq 1 ] || fail "check with an absent key exited $rc"
printf 'maybe\talice\nno\tdave\nmaybe\tbob\n' > want.txt
cmp -s out.txt want.txt || fail "check absent output: $(cat out.txt)"
[ ! -s err.txt ] || fail "check printed on stderr: $(cat err.txt)"
run "$BG" --server "$S" check --count users alice dave erin bob
[ "$rc" -eq 1 ] || fail "check --count exit $rc"
printf 'maybe 2\nno 2\n' > want.txt
cmp -s out.txt want.txt || fail "check --count: $(cat out.txt)"

# stdin: CRLF, last line without newline; the same answers in small batches.
printf 'alice\r\ndave\nwith space' > in.txt
run "$BG" --server "$S" check users --batch 1 --inflight 2 < in.txt
[ "$rc" -eq 1 ] || fail "stdin check exit $rc"
printf 'maybe\talice\nno\tdave\nmaybe\twith space\n' > want.txt
cmp -s out.txt want.txt || fail "stdin check output: $(cat out.txt)"

# Empty keys are refused (exit 2), from arguments and from stdin.
expect_err 2 'empty key' "$BG" --server "$S" add users x ""
expect_err 2 'empty key' "$BG" --server "$S" check users ""
printf 'x\n\ny\n' > in.txt
expect_err 2 '<stdin>:2: empty key' "$BG" --server "$S" add users < in.txt
expect_err 2 '^bloomgrid: server: NOT_FOUND: .*nope' "$BG" --server "$S" check nope a
expect_err 2 '^bloomgrid: server: NOT_FOUND: .*nope' "$BG" --server "$S" add nope a
seq 1 100001 > many.txt
expect_err 2 '^bloomgrid: server: RESOURCE_EXHAUSTED: ' \
    "$BG" --server "$S" check users --batch 200000 < many.txt
expect_err 2 '--batch must be' "$BG" --server "$S" add users --batch 0 a
expect_err 2 'unknown option' "$BG" --server "$S" add users --count a

# remove: counting filters only.
expect_err 2 '^bloomgrid: server: FAILED_PRECONDITION: .*COUNTING' \
    "$BG" --server "$S" remove users alice
expect_ok "$BG" --server "$S" add sessions s1 s2
run "$BG" --server "$S" remove sessions s1 zzz
[ "$rc" -eq 1 ] || fail "remove with an absent key exited $rc"
printf 'removed\ts1\nno\tzzz\n' > want.txt
cmp -s out.txt want.txt || fail "remove output: $(cat out.txt)"
run "$BG" --server "$S" check sessions s1 s2
[ "$rc" -eq 1 ] && [ "$(head -1 out.txt)" = "no${TAB}s1" ] || fail "s1 not removed"
expect_ok "$BG" --server "$S" remove sessions s2
[ "$(cat out.txt)" = "removed${TAB}s2" ] || fail "remove s2: $(cat out.txt)"

# ---- server selection, deadline, unreachable server ------------------------------
BLOOMGRID_SERVER=$S expect_ok "$BG" check users alice
expect_ok "$BG" check --server "$S" users alice
expect_ok "$BG" --server="$S" --deadline 5000 check users alice
expect_ok "$BG" check --deadline=5000 --server="$S" users alice
expect_err 2 'no server' "$BG" check users alice
expect_err 2 '--deadline must be' "$BG" --server "$S" --deadline 0 list
expect_err 2 'HOST:PORT' "$BG" --server nonsense list
expect_err 2 'port from 1 to 65535' "$BG" --server 127.0.0.1:99999 list
expect_err 2 '^bloomgrid: cannot reach server 127\.0\.0\.1:1: ' \
    "$BG" --server 127.0.0.1:1 check users alice
expect_err 2 '^bloomgrid: cannot reach server ' "$BG" --server 127.0.0.1:1 list
expect_err 2 '^bloomgrid: cannot reach server ' "$BG" --server 127.0.0.1:1 export users gone.bf
[ ! -e gone.bf ] && ! ls gone.bf.tmp.* 2>/dev/null || fail "export to nowhere left files"
expect_err 2 '^bloomgrid: cannot reach server ' "$BG" --server 127.0.0.1:1 import users in.txt
# A server that does not answer: the deadline ends the call.
kill -STOP $NODE_PID
set +e
"$BG" --server "$S" --deadline 300 check users alice >out.txt 2>err.txt
rc1=$?
"$BG" --server "$S" --deadline 300 export users stopped.bf >out2.txt 2>err2.txt
rc2=$?
set -e
kill -CONT $NODE_PID
[ "$rc1" -eq 2 ] && grep -q '^bloomgrid: server: DEADLINE_EXCEEDED: .*300 ms' err.txt ||
    fail "deadline: exit $rc1: $(cat err.txt)"
[ "$rc2" -eq 2 ] && grep -q '^bloomgrid: .*300 ms' err2.txt ||
    fail "export deadline: exit $rc2: $(cat err2.txt)"
[ ! -e stopped.bf ] && ! ls stopped.bf.tmp.* 2>/dev/null || fail "export left files"
# A signal during an export removes its temp file and leaves FILE as it was.
echo keep > sig.bf
SIG=$(sum sig.bf)
kill -STOP $NODE_PID
"$BG" --server "$S" --deadline 60000 export --force users sig.bf >/dev/null 2>&1 &
EXP=$!
n=0
while ! ls sig.bf.tmp.* >/dev/null 2>&1; do
    n=$((n + 1))
    [ $n -lt 400 ] || { kill -CONT $NODE_PID; fail "export made no temp file"; }
    sleep 0.05
done
kill -TERM $EXP
set +e
wait $EXP
rc3=$?
set -e
kill -CONT $NODE_PID
[ "$rc3" -ne 0 ] || fail "export survived SIGTERM"
! ls sig.bf.tmp.* 2>/dev/null || fail "a signalled export left its temp file"
same_file sig.bf "$SIG"
expect_ok "$BG" --server "$S" check users alice
# Without a server, create/add/remove stay offline commands on files.
expect_ok "$BG" create local.bf -n 100 -p 0.01
[ -f local.bf ] || fail "offline create made no file"

# ---- export, offline query, import -----------------------------------------
seq -f 'k%g' 1 3000 > added.txt
seq -f 'k%g' 2001 6000 > probe.txt
expect_ok "$BG" --server "$S" create nums -n 10000 -p 0.01
expect_ok "$BG" --server "$S" add nums < added.txt
expect_ok "$BG" --server "$S" export nums nums.bf
expect_ok "$BG" inspect nums.bf
ins=$(sed -n 's/^new-bit adds: *\([0-9]*\) .*/\1/p' out.txt)
[ "$ins" -le 3000 ] && [ "$ins" -ge 2990 ] || fail "exported inserts: $(cat out.txt)"
grep -q '^keys added: *3000$' out.txt || fail "exported keys added: $(cat out.txt)"
ls nums.bf.tmp.* 2>/dev/null && fail "export left a temp file"
run "$BG" query nums.bf < probe.txt
cp out.txt offline.txt
offline_rc=$rc
run "$BG" --server "$S" check nums < probe.txt
[ "$rc" -eq "$offline_rc" ] || fail "online check exit $rc, offline $offline_rc"
cmp -s out.txt offline.txt || fail "online check differs from offline query of the export"
grep -q "^no${TAB}" out.txt || fail "no absent keys among the probes"

SUM=$(sum nums.bf)
expect_err 2 'already exists' "$BG" --server "$S" export nums nums.bf
expect_err 2 '^bloomgrid: server: NOT_FOUND: ' "$BG" --server "$S" export nope nums.bf --force
same_file nums.bf "$SUM"
expect_err 2 '^bloomgrid: server: NOT_FOUND: ' "$BG" --server "$S" export nope new.bf
[ ! -e new.bf ] || fail "failed export created the file"
ls ./*.tmp.* 2>/dev/null && fail "failed export left a temp file"
expect_ok "$BG" --server "$S" export --force nums nums.bf

# A partial built offline like the export, imported: its keys are present.
seq -f 'new%g' 1 2000 > new.txt
run "$BG" --server "$S" check nums --count < new.txt
[ "$rc" -eq 1 ] || fail "new keys already present"
expect_ok "$BG" build part.bf --like nums.bf < new.txt
expect_ok "$BG" --server "$S" info nums
ins_before=$(sed -n 's/^new-bit adds: *\([0-9]*\) .*/\1/p' out.txt)
expect_ok "$BG" inspect part.bf
ins_part=$(sed -n 's/^new-bit adds: *\([0-9]*\) .*/\1/p' out.txt)
expect_ok "$BG" --server "$S" import nums part.bf
grep -q '^import: part.bf into nums: [0-9]* bytes, projected fill' err.txt ||
    fail "import report: $(cat err.txt)"
expect_ok "$BG" --server "$S" check nums --count < new.txt
[ "$(cat out.txt)" = "$(printf 'maybe 2000\nno 0')" ] || fail "imported keys: $(cat out.txt)"
expect_ok "$BG" --server "$S" info nums
ins_after=$(sed -n 's/^new-bit adds: *\([0-9]*\) .*/\1/p' out.txt)
[ "$ins_after" -eq $((ins_before + ins_part)) ] ||
    fail "inserts after import $ins_after, want $ins_before + $ins_part"
expect_ok "$BG" --server "$S" check nums --count < added.txt

# Incompatible, corrupt and truncated files are refused; nothing changes.
expect_ok "$BG" --server "$S" info nums --json
grep '"version"' out.txt | head -1 > version.before
expect_ok "$BG" create other.bf -n 10000 -p 0.01
expect_err 2 '^bloomgrid: server: FAILED_PRECONDITION: .*(kind|hash|bits|hashes|secret|shard)' \
    "$BG" --server "$S" import nums other.bf
expect_ok "$BG" --server "$S" export sessions counting.bf
expect_err 2 '^bloomgrid: server: FAILED_PRECONDITION: .*"kind"' \
    "$BG" --server "$S" import nums counting.bf
cp part.bf corrupt.bf
flip_byte corrupt.bf 1000
expect_err 2 '^bloomgrid: server: INVALID_ARGUMENT: .*checksum' \
    "$BG" --server "$S" import nums corrupt.bf
head -c 2000 part.bf > trunc.bf
expect_err 2 '^bloomgrid: server: INVALID_ARGUMENT: .*truncated' \
    "$BG" --server "$S" import nums trunc.bf
expect_err 2 '^bloomgrid: server: NOT_FOUND: ' "$BG" --server "$S" import nope part.bf
expect_err 2 'cannot open' "$BG" --server "$S" import nums missing.bf
expect_ok "$BG" --server "$S" info nums --json
grep '"version"' out.txt | head -1 | cmp -s - version.before ||
    fail "a refused import changed the filter"

# ---- 200k keys through stdin -------------------------------------------------
seq -f 'bulk-%09g' 1 200000 > bulk.txt
expect_ok "$BG" --server "$S" create bulk -n 400000 -p 0.001
expect_ok "$BG" --server "$S" add bulk < bulk.txt
[ ! -s err.txt ] || fail "add wrote on stderr that is not a terminal: $(cat err.txt)"
expect_ok "$BG" --server "$S" check bulk --count < bulk.txt
[ "$(cat out.txt)" = "$(printf 'maybe 200000\nno 0')" ] || fail "bulk check: $(cat out.txt)"
expect_ok "$BG" --server "$S" check bulk < bulk.txt
[ "$(wc -l < out.txt)" -eq 200000 ] || fail "bulk check lines"
cut -f2 out.txt | cmp -s - bulk.txt || fail "bulk check out of order"
expect_ok "$BG" --server "$S" info bulk
# A key whose bits were all set already (a false positive while adding)
# does not count as an insert: a few of 200000 may be missing.
ins=$(sed -n 's/^new-bit adds: *\([0-9]*\) .*/\1/p' out.txt)
[ "$ins" -le 200000 ] && [ "$ins" -ge 199000 ] || fail "bulk inserts: $(cat out.txt)"

# On a terminal, a progress line is drawn on stderr.
if command -v script >/dev/null; then
    expect_ok "$BG" --server "$S" create tty -n 400000 -p 0.01
    script -qec "'$BG' --server '$S' add tty < bulk.txt" /dev/null > tty.txt ||
        fail "add on a terminal: $(cat tty.txt)"
    grep -q '200000 keys .*M keys/s' tty.txt || fail "no progress line: $(cat tty.txt)"
    script -qec "'$BG' --server '$S' export tty tty.bf" /dev/null > tty.txt ||
        fail "export on a terminal: $(cat tty.txt)"
    grep -q 'MiB/s' tty.txt || fail "no export progress line: $(cat tty.txt)"
fi

# ---- drop --------------------------------------------------------------------
expect_ok "$BG" --server "$S" drop bulk
expect_err 2 '^bloomgrid: server: NOT_FOUND: ' "$BG" --server "$S" info bulk
all_alive
echo "online: ok"
