#!/bin/sh
# Tokens from the tool's side: `bloomgrid token new` makes a token and its
# tokens-file line; online commands send it (--token-file before or after
# the command name, or BLOOMGRID_TOKEN) to a node with a tokens file, which
# refuses missing, unknown and too weak tokens; a line removed and SIGHUP
# stops the token.
set -eu
BG=$(realpath "$1")
NODE=$(realpath "$2")
. "$CLI_TEST_LIB"
. "$(dirname "$CLI_TEST_LIB")/online_lib.sh"
unset BLOOMGRID_TOKEN

# ---- token new ----------------------------------------------------------------
expect_ok "$BG" token new --role write --name ci
[ "$(wc -l < out.txt)" -eq 2 ] || fail "token new printed: $(cat out.txt)"
TOKEN=$(sed -n 1p out.txt)
echo "$TOKEN" | grep -Eq '^bgt_[0-9a-f]{64}$' || fail "token: $TOKEN"
HASH=$(printf '%s' "$TOKEN" | sha256sum | cut -d' ' -f1)
[ "$(sed -n 2p out.txt)" = "write ci $HASH" ] || fail "line: $(sed -n 2p out.txt)"
expect_ok "$BG" token new --role write --name ci
[ "$(sed -n 1p out.txt)" != "$TOKEN" ] || fail "the same token twice"

expect_ok "$BG" token new --role read --name reader --out read.tok
[ "$(wc -l < out.txt)" -eq 1 ] || fail "--out printed the token: $(cat out.txt)"
grep -q '^read reader [0-9a-f]\{64\}$' out.txt || fail "line: $(cat out.txt)"
cat out.txt > tokens
[ "$(stat -c %a read.tok)" = 600 ] || fail "read.tok mode $(stat -c %a read.tok)"
[ "$(printf '%s' "$(cat read.tok)" | sha256sum | cut -d' ' -f1)" = \
  "$(cut -d' ' -f3 tokens)" ] || fail "read.tok does not match its line"
expect_err 2 'read.tok exists' "$BG" token new --role read --name x --out read.tok
expect_ok "$BG" token new --role write --name writer --out write.tok
cat out.txt >> tokens
expect_ok "$BG" token new --role admin --name ops --out admin.tok
cat out.txt >> tokens
expect_err 2 'role must be read, write or admin' "$BG" token new --role root --name x
expect_err 2 'name must be 1 to 64' "$BG" token new --role read --name 'a b'
expect_err 2 'name must be' "$BG" token new --role read
expect_ok "$BG" help token
grep -q 'usage: bloomgrid token new' out.txt || fail "help token: $(cat out.txt)"
expect_ok "$BG" help add
grep -q -- '--token-file FILE' out.txt || fail "help add lacks --token-file"
grep -q 'BLOOMGRID_TOKEN' out.txt || fail "help add lacks BLOOMGRID_TOKEN"
expect_ok "$BG" --help
grep -q -- '--token-file FILE' out.txt || fail "--help lacks --token-file"

# ---- against a node with a tokens file -------------------------------------
start_server node "$NODE" --data-dir "$WORK/data" --tokens-file "$WORK/tokens"
S=$ADDR
NODE_PID=$pid

expect_err 2 'UNAUTHENTICATED: .*needs a token' "$BG" --server "$S" list
BLOOMGRID_TOKEN=bgt_nobody expect_err 2 'UNAUTHENTICATED: unknown token' \
    "$BG" --server "$S" list
BLOOMGRID_TOKEN=$(cat read.tok) expect_ok "$BG" --server "$S" list
BLOOMGRID_TOKEN=$(cat read.tok) expect_err 2 \
    'PERMISSION_DENIED: token "reader" has role read; .*CreateFilter needs role admin' \
    "$BG" --server "$S" create users -n 1000 -p 0.01
expect_ok "$BG" --server "$S" --token-file admin.tok create users -n 1000 -p 0.01
expect_err 2 'ALREADY_EXISTS' "$BG" --server "$S" create users -n 1000 -p 0.01 \
    --token-file admin.tok
# --token-file wins over the environment.
BLOOMGRID_TOKEN=$(cat read.tok) expect_ok "$BG" --server "$S" --token-file admin.tok \
    drop users
BLOOMGRID_TOKEN=$(cat admin.tok) expect_ok "$BG" --server "$S" create users -n 1000 -p 0.01

printf 'alice\nbob\n' > keys.txt
BLOOMGRID_TOKEN=$(cat read.tok) expect_err 2 'PERMISSION_DENIED' \
    "$BG" --server "$S" add users < keys.txt
expect_ok "$BG" --server "$S" add users --token-file write.tok < keys.txt
BLOOMGRID_TOKEN=$(cat read.tok) expect_ok "$BG" --server "$S" check users alice bob
[ "$(cat out.txt)" = "$(printf 'maybe\talice\nmaybe\tbob')" ] || fail "check: $(cat out.txt)"
expect_err 2 'PERMISSION_DENIED' "$BG" --server "$S" --token-file write.tok \
    export users users.bf
[ ! -e users.bf ] || fail "a refused export left a file"
expect_ok "$BG" --server "$S" --token-file admin.tok export users users.bf
expect_err 2 '^bloomgrid: --token-file: .*nothing.tok' "$BG" --server "$S" \
    --token-file nothing.tok list
printf 'two words\n' > bad.tok
expect_err 2 'without spaces' "$BG" --server "$S" --token-file bad.tok list

# The writer's line removed: refused once the node has re-read the file.
grep -v ' writer ' tokens > tokens.new
mv tokens.new tokens
kill -HUP "$NODE_PID"
n=0
while :; do
    run "$BG" --server "$S" --token-file write.tok add users carol
    [ "$rc" -ne 0 ] && break
    n=$((n + 1))
    [ $n -lt 200 ] || fail "the removed token still works"
    sleep 0.05
done
grep -q 'UNAUTHENTICATED: unknown token' err.txt || fail "after removal: $(cat err.txt)"
BLOOMGRID_TOKEN=$(cat read.tok) expect_ok "$BG" --server "$S" list
all_alive
echo ok
