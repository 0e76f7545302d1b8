#!/bin/sh
# Every bad input: exit status 2, one "bloomgrid: " line naming the problem,
# and no existing file modified.
set -eu
BG=$1
. "$CLI_TEST_LIB"

expect_ok "$BG" create f.bf --capacity 1000 --error-rate 0.01
F=$(sum f.bf)

# Capacity.
for bad in 0 abc -5 1.5 10X "" 1e-3 1e30 0x10; do
    expect_err 2 "--capacity must be a positive whole number.*'$bad'" \
        "$BG" create f.bf --force --capacity "$bad" --error-rate 0.01
done
same_file f.bf "$F"
for good in 1e3 2.5k 1M; do
    expect_ok "$BG" create "cap-$good.bf" --capacity "$good" --error-rate 0.1
done
expect_ok "$BG" inspect --json cap-2.5k.bf
grep -q '"capacity": 2500,' out.txt || fail "2.5k is not 2500: $(cat out.txt)"

# Error rate outside (0, 1).
for bad in 0 1 1.5 -0.1 abc 0.01x nan inf 100%; do
    expect_err 2 "--error-rate must be a number between 0 and 1.*'$bad'" \
        "$BG" create f.bf --force --capacity 100 --error-rate "$bad"
done
same_file f.bf "$F"

# Kind, options, arguments.
expect_err 2 "unknown kind 'bogus'" \
    "$BG" create f.bf --force -n 100 -p 0.01 --kind bogus
expect_err 2 "unknown option '--bogus'" "$BG" create f.bf --bogus
expect_err 2 "unknown option '-z'" "$BG" query f.bf -z
expect_err 2 "unknown option '--count'" "$BG" add f.bf --count
expect_err 2 "option '--capacity' needs a value" "$BG" create g.bf --capacity
expect_err 2 "--capacity is required" "$BG" create g.bf --error-rate 0.01
expect_err 2 "--error-rate is required" "$BG" create g.bf --capacity 10
expect_err 2 "missing FILE" "$BG" create --capacity 10 --error-rate 0.1
expect_err 2 "--like copies kind" "$BG" create g.bf --like f.bf -n 10
expect_err 2 "unknown command 'frobnicate'" "$BG" frobnicate
expect_err 2 "unknown command 'frobnicate'" "$BG" help frobnicate
expect_err 2 "need OUT and at least one IN" "$BG" merge out.bf
expect_err 2 "need exactly one FILE" "$BG" inspect
[ ! -e g.bf ] || fail "g.bf created by a failed command"
same_file f.bf "$F"

# Existing files are not replaced without --force.
expect_err 2 "f.bf already exists \(use --force" \
    "$BG" create f.bf -n 100 -p 0.1
echo x | { expect_err 2 "f.bf already exists" "$BG" build f.bf -n 10 -p 0.1; }
same_file f.bf "$F"

# Missing files.
for cmd in query add remove; do
    expect_err 2 "nope.bf: cannot open: No such file" "$BG" $cmd nope.bf k
    [ ! -e nope.bf ] || fail "$cmd created nope.bf"
done
expect_err 2 "nope.bf: cannot open: No such file" "$BG" inspect nope.bf
expect_err 2 "nope.bf: cannot open" "$BG" merge out.bf f.bf nope.bf
expect_err 2 "nope.bf: cannot open" "$BG" create g.bf --like nope.bf
[ ! -e out.bf ] && [ ! -e g.bf ] || fail "output written after an error"

# Unreadable input.
expect_err 2 "no-such-input.txt: cannot open input: No such file" \
    "$BG" build g.bf -n 100 -p 0.01 no-such-input.txt
mkdir adir
expect_err 2 "adir: cannot read" "$BG" build g.bf -n 100 -p 0.01 adir
[ ! -e g.bf ] || fail "build wrote a file from unreadable input"

# Empty keys: from arguments, stdin and files, nothing saved.
expect_err 2 "empty key \(argument 2\)" "$BG" add f.bf a "" c
printf 'a\nb\n\nc\n' > empty3.txt
expect_err 2 "<stdin>:3: empty key" sh -c "\"$BG\" add f.bf < empty3.txt"
expect_err 2 "empty3.txt:3: empty key" "$BG" build g.bf -n 10 -p 0.1 empty3.txt
printf 'a\r\n\r\n' > crlf.txt
expect_err 2 "crlf.txt:2: empty key" "$BG" build g.bf -n 10 -p 0.1 crlf.txt
expect_err 2 "empty key" "$BG" query f.bf ""
same_file f.bf "$F"
[ ! -e g.bf ] || fail "build wrote a file despite an empty key"

# Corrupt and truncated files are refused by every command.
expect_ok "$BG" add f.bf k1 k2 k3
cp f.bf bad.bf
flip_byte bad.bf 700
B=$(sum bad.bf)
for cmd in "query bad.bf k1" "add bad.bf k1" "inspect bad.bf" \
           "inspect --json bad.bf"; do
    expect_err 2 "bad.bf: checksum mismatch" "$BG" $cmd
done
expect_err 2 "bad.bf: checksum mismatch" "$BG" merge out.bf f.bf bad.bf
same_file bad.bf "$B"
head -c 1000 f.bf > short.bf
S=$(sum short.bf)
expect_err 2 "short.bf: truncated" "$BG" inspect short.bf
expect_err 2 "short.bf: truncated" "$BG" add short.bf k
same_file short.bf "$S"
echo "not a filter file, just some text that is long enough to be a header.." \
    "and then some more text to pass one hundred and twenty-eight bytes total" \
    > text.bf
expect_err 2 "text.bf: bad magic" "$BG" query text.bf k

# remove needs a counting filter.
F=$(sum f.bf)
expect_err 2 "f.bf is a blocked filter; only counting filters support remove" \
    "$BG" remove f.bf k1
same_file f.bf "$F"

# Help and version work and exit 0.
for args in "--help" "help" "help build" "build --help" "query -h" \
            "merge --help" "inspect --help" "remove --help" "create --help" \
            "add --help" "--version"; do
    expect_ok "$BG" $args
    [ -s out.txt ] || fail "'$args' printed nothing"
done
expect_ok "$BG" help query
grep -q 'Exit status: 0 when every key' out.txt || fail "query help lacks exit status"
grep -q 'example' out.txt || fail "query help lacks examples"
run "$BG"
[ "$rc" -eq 2 ] || fail "no arguments should exit 2"

echo "errors: ok"
