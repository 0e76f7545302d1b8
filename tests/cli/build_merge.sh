#!/bin/sh
# Partial filters built with --like and merged answer exactly like one filter
# built from the union; incompatible merges are refused naming the field.
set -eu
BG=$1
. "$CLI_TEST_LIB"

seq 1 30000 | sed 's/^/user-/' > all.txt
sed -n '1,10000p' all.txt > part1.txt
sed -n '10001,20000p' all.txt > part2.txt
sed -n '20001,30000p' all.txt > part3.txt
seq 1 60000 | sed 's/^/probe-/' > probes.txt
cat all.txt probes.txt > queries.txt

for kind in blocked classic counting scalable; do
    cap=30000
    [ "$kind" = scalable ] && cap=5000   # several layers
    expect_ok "$BG" create "t-$kind.bf" --kind "$kind" -n $cap -p 0.01
    T=$(sum "t-$kind.bf")
    for i in 1 2 3; do
        expect_ok "$BG" build "p$i-$kind.bf" --like "t-$kind.bf" "part$i.txt"
    done
    expect_ok "$BG" build "u-$kind.bf" --like "t-$kind.bf" all.txt
    same_file "t-$kind.bf" "$T"

    expect_ok "$BG" merge "m-$kind.bf" "p1-$kind.bf" "p2-$kind.bf" "p3-$kind.bf"
    grep -q 'projected fill' err.txt || fail "$kind: no projection: $(cat err.txt)"
    [ "$(grep -c 'projected fill' err.txt)" -eq 2 ] || fail "$kind: projections"

    # inserts of the merge: the sum of the partials'.
    want=0
    for i in 1 2 3; do
        n=$("$BG" inspect --json "p$i-$kind.bf" | python3 -c \
            'import json,sys; print(json.load(sys.stdin)["inserts"])')
        [ "$n" -gt 9000 ] || fail "$kind: partial $i inserts $n"
        want=$((want + n))
    done
    got=$("$BG" inspect --json "m-$kind.bf" | python3 -c \
        'import json,sys; print(json.load(sys.stdin)["inserts"])')
    [ "$got" -eq "$want" ] || fail "$kind: merged inserts $got, want $want (the partials' sum)"
    run "$BG" query "m-$kind.bf" < queries.txt
    [ "$rc" -eq 1 ] || fail "$kind: merged query exit $rc"
    mv out.txt merged.txt
    [ "$(grep -c '^maybe	user-' merged.txt)" -eq 30000 ] \
        || fail "$kind: merged filter lost keys"
    # Scalable layers fill in arrival order, so partials fill layer 0 each
    # and the merge is a superset of the union, not equal to it.
    [ "$kind" = scalable ] && continue
    run "$BG" query "u-$kind.bf" < queries.txt
    [ "$rc" -eq 1 ] || fail "$kind: union query exit $rc"
    cmp -s out.txt merged.txt || fail "$kind: merged filter answers differently"
    # Same secret, same geometry, same keys: the same bits.
    "$BG" inspect --json "m-$kind.bf" | python3 -c \
        'import json,sys; d=json.load(sys.stdin); print(d["fill"], d["m"], d["fingerprint"])' > a
    "$BG" inspect --json "u-$kind.bf" | python3 -c \
        'import json,sys; d=json.load(sys.stdin); print(d["fill"], d["m"], d["fingerprint"])' > b
    cmp -s a b || fail "$kind: merged and union differ: $(cat a) vs $(cat b)"
done

# OUT may be one of the inputs; the first input grows in place.
P=$(sum p2-blocked.bf)
expect_ok "$BG" merge p1-blocked.bf p1-blocked.bf p2-blocked.bf
expect_ok "$BG" query --count p1-blocked.bf < part2.txt
same_file p2-blocked.bf "$P"

# Another existing file is not replaced without --force.
expect_ok "$BG" create other.bf -n 100 -p 0.1
O=$(sum other.bf)
expect_err 2 "other.bf already exists and is not one of the inputs" \
    "$BG" merge other.bf p2-blocked.bf p3-blocked.bf
same_file other.bf "$O"
expect_ok "$BG" merge --force other.bf p2-blocked.bf p3-blocked.bf
expect_ok "$BG" query --count other.bf < part3.txt

# Incompatible filters are refused, naming the field, and nothing is written.
expect_ok "$BG" create fresh.bf --kind blocked -n 30000 -p 0.01   # new secret
expect_ok "$BG" create small.bf --like fresh.bf
expect_ok "$BG" create classic.bf --kind classic -n 30000 -p 0.01
expect_ok "$BG" create bigger.bf -n 60000 -p 0.01
M=$(sum m-blocked.bf)
expect_err 2 "fresh.bf cannot be merged into m-blocked.bf: different secret" \
    "$BG" merge m-blocked.bf m-blocked.bf fresh.bf
expect_err 2 "different kind" "$BG" merge x.bf m-blocked.bf m-classic.bf
expect_err 2 "different kind" "$BG" merge x.bf classic.bf fresh.bf
expect_err 2 "different (bits|secret)" "$BG" merge x.bf fresh.bf bigger.bf
same_file m-blocked.bf "$M"
[ ! -e x.bf ] || fail "a refused merge wrote its output"

echo "build_merge: ok"
