#!/bin/sh
# A throw-away PostgreSQL for the slugs example, in a temporary directory of
# its own, from Debian's postgresql package (initdb and pg_ctl; no system
# cluster is touched).
#
# usage: pg.sh start [--no-fsync] [DIR]   start one; print its URI on stdout
#        pg.sh stop DIR                   stop it and remove DIR
#        pg.sh --help
#
# start makes DIR (default: a new directory under ${TMPDIR:-/tmp}), runs
# initdb there with a database "slugs" and a role "slugs" with a random
# password (scram-sha-256), listens on 127.0.0.1 on a free port and on a Unix
# socket in DIR, and prints
#     postgresql://slugs:PASSWORD@127.0.0.1:PORT/slugs
# (also written to DIR/uri).  PostgreSQL refuses to run as root: run as root,
# the server runs as the user "postgres" (made by Debian's package).
# --no-fsync turns off fsync and synchronous commits: for tests, never data
# you keep.  The log is DIR/postgres.log.
set -eu

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }
die() { echo "pg.sh: $*" >&2; exit 1; }

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bindir" ] && [ -x "$bindir/initdb" ] ||
  die "PostgreSQL's initdb not found under /usr/lib/postgresql/*/bin: apt-get install postgresql"

# as_owner CMD...: run CMD as the user the server runs as.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

start() {
  fsync=on
  if [ "${1:-}" = "--no-fsync" ]; then fsync=off; shift; fi
  [ $# -le 1 ] || { usage >&2; exit 2; }
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 ||
      die "running as root, but there is no user 'postgres' to run the server as (apt-get install postgresql)"
  fi
  if [ $# -eq 1 ]; then
    dir=$1
    mkdir -p "$dir"
  else
    dir=$(mktemp -d "${TMPDIR:-/tmp}/slugs-pg.XXXXXX")
  fi
  dir=$(cd "$dir" && pwd)
  [ ! -e "$dir/data" ] || die "$dir/data exists: a server was started there already"
  [ "$(id -u)" -ne 0 ] || chown postgres "$dir"
  as_owner test -w "$dir" ||
    die "the server's user cannot write $dir (is a parent directory closed to it?)"

  password=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  printf '%s\n' "$password" > "$dir/pwfile"
  [ "$(id -u)" -ne 0 ] || chown postgres "$dir/pwfile"
  chmod 600 "$dir/pwfile"
  nosync=""
  [ $fsync = on ] || nosync=--no-sync
  as_owner "$bindir/initdb" $nosync -D "$dir/data" -U slugs --pwfile="$dir/pwfile" \
    --auth=scram-sha-256 -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 ||
    die "initdb failed: $(tail -n 5 "$dir/initdb.log")"
  rm -f "$dir/pwfile"

  # A free port: PostgreSQL cannot be given port 0, so try a few.
  tries=0
  while :; do
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
      -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir -c fsync=$fsync -c synchronous_commit=$fsync -c full_page_writes=$fsync" \
      start >/dev/null 2>&1 && break
    tries=$((tries + 1))
    [ $tries -lt 5 ] || die "the server did not start: $(tail -n 5 "$dir/postgres.log")"
  done
  PGPASSWORD=$password "$bindir/createdb" -h "$dir" -p "$port" -U slugs slugs ||
    die "createdb failed"
  uri="postgresql://slugs:$password@127.0.0.1:$port/slugs"
  printf '%s\n' "$uri" > "$dir/uri"
  chmod 600 "$dir/uri"
  echo "pg.sh: PostgreSQL in $dir on 127.0.0.1:$port (stop: $0 stop $dir)" >&2
  printf '%s\n' "$uri"
}

stop() {
  [ $# -eq 1 ] || { usage >&2; exit 2; }
  dir=$1
  [ -f "$dir/data/PG_VERSION" ] || die "$dir holds no server started by pg.sh"
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w -t 60 stop >/dev/null ||
      die "pg_ctl stop failed (see $dir/postgres.log)"
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
