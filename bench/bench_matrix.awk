# The tables of bench_matrix.sh, from its results.tsv (one row per run:
# round, workload, system, keys/s, p50, p99, p999 µs, server cores or "-",
# client cores, fraction true, errors, seconds).  Portable awk (mawk).
#   -v part=table   per (workload, system): medians over the rounds
#   -v part=matrix  keys/s (p50 µs) with one column per system
#   -v part=spread  the lowest and highest keys/s of the rounds, the same way
#   -v part=cpu     server CPU µs per key (median), the same way
#   -v part=ratios  the targets, each ratio taken within a round
#   -v part=base    server CPU µs per key of each system against SYSTEM-base
#                   (bench_matrix.sh --base), each ratio taken within a round
# -v sys="a b c" orders the systems; -v dur: the run length (marks runs cut
# short by the capacity); -v depth1 / depthb: the in-flight depths.

function median(list,    a, n, i, j, t) {
    n = split(list, a, " ")
    for (i = 2; i <= n; i++) {
        t = a[i] + 0
        for (j = i - 1; j >= 1 && a[j] + 0 > t; j--)
            a[j + 1] = a[j]
        a[j + 1] = t
    }
    if (n == 0)
        return ""
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}

# Sets LO and HI to the extremes of a list; returns its length.
function extremes(list,    a, n, i) {
    n = split(list, a, " ")
    LO = HI = a[1] + 0
    for (i = 2; i <= n; i++) {
        if (a[i] + 0 < LO) LO = a[i] + 0
        if (a[i] + 0 > HI) HI = a[i] + 0
    }
    return n
}

function minmax(list) {
    return extremes(list) > 1 ? sprintf("%s–%s", big(LO), big(HI)) : ""
}

# 1234567 -> 1,234,567
function big(x,    s, out) {
    s = sprintf("%.0f", x)
    out = ""
    while (length(s) > 3) {
        out = "," substr(s, length(s) - 2) out
        s = substr(s, 1, length(s) - 3)
    }
    return s out
}

# The range of a list of keys/s, short: "12.2–60.7 k", "1.36–1.74 M".
function span(list) {
    extremes(list)
    if (HI >= 1e6) return sprintf("%.2f–%.2f M", LO / 1e6, HI / 1e6)
    if (HI >= 1e5) return sprintf("%.0f–%.0f k", LO / 1e3, HI / 1e3)
    if (HI >= 1e3) return sprintf("%.1f–%.1f k", LO / 1e3, HI / 1e3)
    return sprintf("%.0f–%.0f", LO, HI)
}

# One cell of the matrix-shaped tables.
function cell(id) {
    if (part == "cpu")
        return (id in uspk) ? sprintf("%.2f", median(uspk[id])) : "–"
    if (!(id in kps))
        return "–"
    return part == "spread" ? span(kps[id]) : sprintf("%s (%.0f)", big(median(kps[id])), median(p50[id]))
}

function add(arr, id, v) { arr[id] = (id in arr) ? arr[id] " " v : v }

BEGIN {
    ns = split(sys, S, " ")
}

{
    id = $2 SUBSEP $3
    if (!($2 in wseen)) { wseen[$2] = 1; W[++nw] = $2 }
    add(kps, id, $4); add(p50, id, $5); add(p99, id, $6); add(p999, id, $7)
    if ($8 != "-") { add(srv, id, $8); add(uspk, id, $4 > 0 ? $8 * 1e6 / $4 : 0) }
    add(tru, id, $10)
    if ($11 > 0) err[id] = 1
    if (dur && $12 < dur * 0.9) short[id] = 1
    if ($1 + 0 > maxr) maxr = $1 + 0
    v_kps[$1, $2, $3] = $4; v_p50[$1, $2, $3] = $5; v_p99[$1, $2, $3] = $6
    if ($8 != "-" && $4 > 0) v_uspk[$1, $2, $3] = $8 * 1e6 / $4
}

END {
    if (part == "table") {
        print "| workload | system | keys/s (median) | keys/s range | p50 µs | p99 µs | p999 µs | server cores | server µs/key | true | notes |"
        print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        for (k = 1; k <= nw; k++)
            for (j = 1; j <= ns; j++) {
                id = W[k] SUBSEP S[j]
                if (!(id in kps))
                    continue
                note = (id in err) ? "ERRORS" : ((id in short) ? "capacity reached early" : "")
                printf "| %s | %s | %s | %s | %.1f | %.1f | %.1f | %s | %s | %.3f | %s |\n", W[k], S[j],
                       big(median(kps[id])), minmax(kps[id]), median(p50[id]), median(p99[id]),
                       median(p999[id]), (id in srv) ? sprintf("%.2f", median(srv[id])) : "-",
                       (id in uspk) ? sprintf("%.2f", median(uspk[id])) : "-", median(tru[id]), note
            }
    } else if (part == "matrix" || part == "spread" || part == "cpu") {
        printf "| %s |", part == "matrix" ? "keys/s (p50 µs)" : part == "cpu" ? "server CPU µs per key" \
                                                              : "keys/s, lowest–highest round"
        for (j = 1; j <= ns; j++) printf " %s |", S[j]
        printf "\n|---|"
        for (j = 1; j <= ns; j++) printf "---:|"
        printf "\n"
        for (k = 1; k <= nw; k++) {
            printf "| %s |", W[k]
            for (j = 1; j <= ns; j++)
                printf " %s |", cell(W[k] SUBSEP S[j])
            printf "\n"
        }
    } else if (part == "ratios") {
        # target | workload A | system A | workload B | system B | metric | bound:
        # the ratio A / B of the metric, round by round.  The RedisBloom rows
        # appear when the results of ../shared/peers/compare.sh or of a
        # durable run are fed in (bench/README.md, "Node and router beside
        # RedisBloom"; durable rows: bench/results/HISTORY.md, "How to
        # reproduce").
        d1 = " b1 d" depth1; b100 = " b100 d" depthb; b1000 = " b1000 d" depthb
        n = 0
        T[++n] = "Router Add, 100 keys, " depthb " in flight, fsync: router / direct node|add" b100 "|router|add" b100 "|node|kps|>=|0.5"
        T[++n] = "Router MayContain, 1 key, " depth1 " in flight: router / direct node|query" d1 "|router|query" d1 "|node|kps|>=|0.8"
        T[++n] = "Router single-key MayContain p50 (sequential): router / direct|query b1 d1|router|query b1 d1|node|p50|<=|2"
        T[++n] = "Router single-key MayContain p99 (sequential): router / direct|query b1 d1|router|query b1 d1|node|p99|<=|3"
        T[++n] = "Router single-key MayContain p50, " depth1 " in flight: router / direct|query" d1 "|router|query" d1 "|node|p50|<=|2"
        T[++n] = "Router single-key MayContain p99, " depth1 " in flight: router / direct|query" d1 "|router|query" d1 "|node|p99|<=|3"
        T[++n] = "Node durable Add, 1 key, " depth1 " in flight: fsync / durability none|add" d1 "|node|add" d1 "|node-none|kps|>=|0.8"
        T[++n] = "Node durable Add, 1 key, " depth1 " in flight: node / gRPC floor|add" d1 "|node|add" d1 "|floor|kps|>=|0.8"
        T[++n] = "Node AddStream, 1-key messages, " depth1 " in flight, fsync / redis + RedisBloom appendfsync always, 1 key " depth1 " in flight|add stream" d1 "|node|add" d1 "|redis-aof-always|kps|>=|1"
        T[++n] = "Node MayContain, 100 keys, " depthb " in flight: node / RedisBloom|query" b100 "|node|query" b100 "|redisbloom|kps|>=|1.2"
        T[++n] = "Node MayContain, 1000 keys, " depthb " in flight: node / RedisBloom|query" b1000 "|node|query" b1000 "|redisbloom|kps|>=|3"
        T[++n] = "Node single-key MayContain (sequential): node / gRPC floor|query b1 d1|node|query b1 d1|floor|kps|>=|0.9"
        T[++n] = "Node single-key MayContain, " depth1 " in flight: node / gRPC floor|query" d1 "|node|query" d1 "|floor|kps|>=|0.9"
        T[++n] = "TLS: node Add, 1000 keys, " depthb " in flight: TLS / plaintext|add" b1000 "|node-tls|add" b1000 "|node|kps|>=|0.85"
        T[++n] = "TLS: node MayContain, 1000 keys, " depthb " in flight: TLS / plaintext|query" b1000 "|node-tls|query" b1000 "|node|kps|>=|0.85"
        T[++n] = "TLS: router Add, 1000 keys, " depthb " in flight: TLS / plaintext|add" b1000 "|router-tls|add" b1000 "|router|kps|>=|0.85"
        T[++n] = "TLS: router MayContain, 1000 keys, " depthb " in flight: TLS / plaintext|query" b1000 "|router-tls|query" b1000 "|router|kps|>=|0.85"
        rows = 0
        for (t = 1; t <= n; t++) {
            split(T[t], f, "|")
            list = ""
            for (r = 1; r <= maxr; r++) {
                a = r SUBSEP f[2] SUBSEP f[3]
                b = r SUBSEP f[4] SUBSEP f[5]
                if (f[6] == "kps") { if (!(a in v_kps) || !(b in v_kps) || v_kps[b] == 0) continue; x = v_kps[a] / v_kps[b] }
                else if (f[6] == "p50") { if (!(a in v_p50) || !(b in v_p50) || v_p50[b] == 0) continue; x = v_p50[a] / v_p50[b] }
                else { if (!(a in v_p99) || !(b in v_p99) || v_p99[b] == 0) continue; x = v_p99[a] / v_p99[b] }
                list = list (list == "" ? "" : " ") sprintf("%.2f", x)
            }
            if (list == "")
                continue
            m = median(list)
            met = (f[7] == ">=") ? (m >= f[8]) : (m <= f[8])
            if (!rows++) {
                print "| target | bound | today (median of the rounds) | each round |"
                print "|---|---:|---:|---|"
            }
            printf "| %s | %s %s× | %.2f× (%s) | %s |\n", f[1], (f[7] == ">=" ? "≥" : "≤"), f[8], m,
                   met ? "met" : "not met", list
        }
        if (!rows)
            print "(no target ratio: each needs two of node, node-none, router, floor in one run)"
    } else if (part == "base") {
        # Each system beside its -base: CPU per key, and this / base taken
        # within each round (the two runs were made one after the other).
        print "| workload | system | server µs/key | base µs/key | this / base, median | lowest–highest round | each round |"
        print "|---|---|---:|---:|---:|---:|---|"
        for (k = 1; k <= nw; k++)
            for (j = 1; j <= ns; j++) {
                id = W[k] SUBSEP S[j]
                bid = W[k] SUBSEP S[j] "-base"
                if (S[j] ~ /-base$/ || !(id in uspk) || !(bid in uspk))
                    continue
                list = ""
                for (r = 1; r <= maxr; r++) {
                    a = r SUBSEP W[k] SUBSEP S[j]
                    b = r SUBSEP W[k] SUBSEP S[j] "-base"
                    if (!(a in v_uspk) || !(b in v_uspk) || v_uspk[b] == 0)
                        continue
                    list = list (list == "" ? "" : " ") sprintf("%.3f", v_uspk[a] / v_uspk[b])
                }
                if (list == "")
                    continue
                extremes(list)
                printf "| %s | %s | %.2f | %.2f | %.3f | %.3f–%.3f | %s |\n", W[k], S[j],
                       median(uspk[id]), median(uspk[bid]), median(list), LO, HI, list
            }
    }
}
