#!/usr/bin/env bash
# The tests' Redis 7 server, as a ctest fixture: `start DIR` runs redis-server on 127.0.0.1 at a
# free port (no persistence: --save '' --appendonly no; its files in DIR) and writes its URL to
# DIR/url; `stop DIR` stops it and removes DIR. One server serves every test of a ctest run that
# needs one (FIXTURES_REQUIRED mnemo_redis); each test keeps to keys of its own (tests/kv/redis_server.h).
# Without redis-server nothing is started (exit 0) and the tests skip with the reason.
set -euo pipefail
cmd=${1:?start|stop} dir=${2:?directory}
bin=${MNEMO_REDIS_SERVER:-redis-server}
stop() {
  if [[ -f $dir/redis.pid ]]; then
    kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$(cat "$dir/redis.pid")" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$dir"
}
case $cmd in
  start)
    stop  # a server a killed run left behind
    if ! command -v "$bin" >/dev/null; then
      echo "redis-server not found: the Redis tests will skip"
      exit 0
    fi
    mkdir -p "$dir"
    for attempt in 1 2 3 4 5; do  # a random port in the ephemeral range; another on a clash
      port=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
      rm -f "$dir/redis.pid"
      "$bin" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" --daemonize yes \
        --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" --maxmemory 256mb --maxmemory-policy allkeys-lru
      for _ in $(seq 50); do
        if redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
          echo "redis://127.0.0.1:$port" >"$dir/url"
          echo "Redis $("$bin" --version | awk '{print $3}') on 127.0.0.1:$port ($dir)"
          exit 0
        fi
        sleep 0.05
      done
      [[ -f $dir/redis.pid ]] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
    done
    tail -20 "$dir/redis.log" >&2 || true
    exit 1
    ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop DIR" >&2; exit 2 ;;
esac
