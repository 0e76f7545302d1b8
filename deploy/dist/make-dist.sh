#!/bin/sh
# make dist: a relocatable tarball of the programs and every shared library
# they run with, for machines that have none of them (Hadoop and Spark
# workers, a bare root).  deploy/dist/README.md says what is in it and why.
#
# usage: deploy/dist/make-dist.sh BUILD [OUTDIR]
#   BUILD   a built CMake build directory
#   OUTDIR  where bloomgrid-VERSION-linux-ARCH.tar.gz goes (default BUILD)
# Prints the tarball's path as its last line on stdout; the rest goes to
# stderr.  Exit 1 on any failure (a library ldd cannot find, a program
# with an RPATH), writing no tarball.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 1 ] || { echo "usage: $0 BUILD [OUTDIR]" >&2; exit 2; }
build=$(cd "$1" && pwd)
out=$(cd "${2:-$1}" && pwd)
fail() { echo "make-dist: $*" >&2; exit 1; }

cache=$build/CMakeCache.txt
[ -f "$cache" ] || fail "$build is not a CMake build directory (no CMakeCache.txt)"
cmake=$(sed -n 's/^CMAKE_COMMAND:INTERNAL=//p' "$cache")
cc=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$cache")
: "${cmake:=cmake}" "${cc:=cc}"

stage=$(mktemp -d "${TMPDIR:-/tmp}/bloomgrid-dist.XXXXXX")
trap 'rm -rf "$stage"' EXIT
# The install rules, not the build tree: they are what a release ships, and
# CMake drops any build-tree RPATH on install.
"$cmake" --install "$build" --prefix "$stage/inst" >"$stage/install.log" 2>&1 ||
    fail "cmake --install failed: $(tail -5 "$stage/install.log")"

progs="bloomgrid bloomgrid-node bloomgrid-router bloomgrid-merger"
for p in $progs; do
    [ -x "$stage/inst/bin/$p" ] || fail "$p is not built in $build"
    if readelf -d "$stage/inst/bin/$p" | grep -Eq '\((RPATH|RUNPATH)\)'; then
        fail "$p has an RPATH or RUNPATH: $(readelf -d "$stage/inst/bin/$p" | grep -E 'R(UN)?PATH')"
    fi
done

# VERSION as --version reports it: "bloomgrid 0.1.0 (DESCRIBE) ..." gives
# 0.1.0-DESCRIBE, a build without git describe just 0.1.0.
version=$("$stage/inst/bin/bloomgrid" --version | awk 'NR == 1 {
    v = $2
    if ($3 ~ /^\(/ && $3 != "(file") { d = $3; gsub(/[()]/, "", d); v = v "-" d }
    print v }')
[ -n "$version" ] || fail "no version from bloomgrid --version"
arch=$(uname -m)
name=bloomgrid-$version-linux-$arch
tree=$stage/$name
mkdir -p "$tree/bin" "$tree/lib" "$tree/libexec/bloomgrid" "$tree/share/doc/bloomgrid/licenses"

# Every library of every program (their union), and the loader.
for p in $progs; do
    cp "$stage/inst/bin/$p" "$tree/libexec/bloomgrid/$p"
    ldd "$stage/inst/bin/$p" > "$stage/ldd" || fail "ldd $p failed"
    if grep -q 'not found' "$stage/ldd"; then
        fail "$p: libraries not found: $(grep 'not found' "$stage/ldd" | tr -s ' \t' ' ')"
    fi
    cat "$stage/ldd" >> "$stage/ldd.all"
done
# "SONAME => PATH (addr)" lines, and the loader's "PATH (addr)" line.
awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' "$stage/ldd.all" | sort -u > "$stage/libs"
loader=$(awk '$1 ~ /^\// && $2 ~ /^\(/ { print $1 }' "$stage/ldd.all" | sort -u)
[ "$(printf '%s\n' "$loader" | grep -c .)" -eq 1 ] || fail "not one dynamic loader: $loader"
echo "$(basename "$loader") $loader" >> "$stage/libs"
while read -r so path; do
    cp -L "$path" "$tree/lib/$so"
done < "$stage/libs"

# The launcher, statically linked, under each program's name, and the
# loader under it too (a relative symlink: the name ps shows).
"$cc" -static -O2 -Wall -Wextra -Werror -o "$stage/launch" "$here/launch.c" 2>"$stage/cc.log" ||
    fail "cannot link the launcher statically (libc6-dev's libc.a): $(cat "$stage/cc.log")"
mkdir -p "$tree/libexec/bloomgrid/loader"
for p in $progs; do
    cp "$stage/launch" "$tree/bin/$p"
    ln -s "../../../lib/$(basename "$loader")" "$tree/libexec/bloomgrid/loader/$p"
done

# The batch scripts the install carries (deploy/batch/).
if [ -d "$stage/inst/share/bloomgrid/batch" ]; then
    mkdir -p "$tree/share/bloomgrid"
    cp -R "$stage/inst/share/bloomgrid/batch" "$tree/share/bloomgrid/"
fi

# The Debian package of each library, with one dpkg -S for them all: dpkg
# knows a file under the name its package ships, which usrmerge may have
# moved between /lib and /usr/lib, so each is asked for under every name.
: > "$stage/owners"
if command -v dpkg >/dev/null 2>&1; then
    while read -r so path; do
        for f in "$path" "$(readlink -f "$path")"; do
            printf '%s\n%s\n%s\n' "$f" "/usr$f" "${f#/usr}"
        done
    done < "$stage/libs" | sort -u > "$stage/names"
    # "PACKAGE[, PACKAGE...]: PATH" per known name.
    xargs dpkg -S < "$stage/names" 2>/dev/null | sed 's/, .*:/:/' > "$stage/owners" || true
fi
notice=$tree/share/doc/bloomgrid/NOTICE
{
    echo "bloomgrid $version for Linux $arch: the programs, and the shared libraries"
    echo "they run with, copied from the build machine"
    if [ -r /etc/os-release ]; then
        echo "($(. /etc/os-release && echo "${PRETTY_NAME:-$ID}")), with the loader"
    else
        echo "with the loader"
    fi
    echo "that runs them (bin/ holds launchers; libexec/bloomgrid/ the programs)."
    echo "Each library's Debian package and version follow; the package's"
    echo "copyright file, with its licence terms, is licenses/PACKAGE beside this file."
    echo "Sources: apt-get source PACKAGE=VERSION, or https://sources.debian.org/."
    echo
    printf '%-50s %-36s %s\n' "FILE" "PACKAGE" "VERSION"
} > "$notice"
sort "$stage/libs" | while read -r so path; do
    pkg=""
    for f in "$path" "/usr$path" "${path#/usr}" "$(readlink -f "$path")" \
             "/usr$(readlink -f "$path")" "$(readlink -f "$path" | sed 's|^/usr||')"; do
        pkg=$(awk -v f="$f" '{ p = $1; sub(/:$/, "", p) } $2 == f { print p; exit }' "$stage/owners")
        [ -z "$pkg" ] || break
    done
    if [ -n "$pkg" ]; then
        ver=$(dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null || echo "?")
        base=${pkg%%:*}
        [ -r "/usr/share/doc/$base/copyright" ] &&
            cp -L "/usr/share/doc/$base/copyright" "$tree/share/doc/bloomgrid/licenses/$base"
        printf '%-50s %-36s %s\n' "lib/$so" "$pkg" "$ver"
    else
        printf '%-50s %-36s %s\n' "lib/$so" "(no Debian package: $path)" "?"
    fi
done >> "$notice"
grep -q '(no Debian package' "$notice" &&
    echo "make-dist: warning: some libraries are from no Debian package (see NOTICE)" >&2
cp "$here/README.md" "$tree/share/doc/bloomgrid/README.dist.md"

# No top-level directory, as conda-pack does: `--archives X.tar.gz#bg`
# (Hadoop, Spark) unpacks it as bg/bin/bloomgrid.  Unpack by hand into a
# directory of its own.
tarball=$out/$name.tar.gz
tar -C "$tree" --sort=name --owner=0 --group=0 --numeric-owner -cf "$stage/dist.tar" \
    bin lib libexec share
gzip -n -c "$stage/dist.tar" > "$tarball.tmp"
mv "$tarball.tmp" "$tarball"
echo "make-dist: $(grep -c . "$stage/libs") libraries, $(du -k "$tarball" | cut -f1) KiB" >&2
echo "$tarball"
