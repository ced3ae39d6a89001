#!/usr/bin/env bash
# The tests' PostgreSQL 15 server, as a ctest fixture: `start DIR` runs initdb into DIR/data and
# postgres on 127.0.0.1 at a free port, and writes its URL (without a database) to DIR/url;
# `stop DIR` stops it and removes DIR. One server serves every test of a ctest run (a few seconds
# of start-up in all); each test makes its own databases on it (tests/store/pg_server.h).
# Without the binaries nothing is started (exit 0) and the tests skip with the reason.
# PostgreSQL refuses to run as root: as root (CI), the server runs as the user nobody.
set -euo pipefail
cmd=${1:?start|stop} dir=${2:?directory}
bin=${MNEMO_PG_BIN:-/usr/lib/postgresql/15/bin}
as=()
if [[ $(id -u) == 0 ]]; then
  as=(setpriv --reuid="$(id -u nobody)" --regid="$(id -g nobody)" --clear-groups)
fi
stop() {
  if [[ -f $dir/data/postmaster.pid ]]; then
    "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -m immediate -w -t 10 stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}
case $cmd in
  start)
    stop  # a server a killed run left behind
    if [[ ! -x $bin/initdb || ! -x $bin/postgres ]]; then
      echo "PostgreSQL binaries not found in $bin: the PostgreSQL tests will skip"
      exit 0
    fi
    mkdir -p "$dir"
    [[ $(id -u) == 0 ]] && chown nobody "$dir"
    cd "$dir"  # the server user must be able to enter the working directory
    "${as[@]}" "$bin/initdb" -D "$dir/data" -U mnemo --auth=trust --no-sync -E UTF8 --no-locale \
      --no-instructions >"$dir/initdb.log" 2>&1
    for attempt in 1 2 3 4 5; do  # a random port in the ephemeral range; another on a clash
      port=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
      if "${as[@]}" "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 -o \
        "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=16MB -c max_connections=200" \
        start >/dev/null; then
        echo "postgresql://mnemo@127.0.0.1:$port" >"$dir/url"
        echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port ($dir)"
        exit 0
      fi
    done
    tail -20 "$dir/server.log" >&2
    exit 1
    ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
