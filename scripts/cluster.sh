#!/usr/bin/env bash
# A local mnemo cluster on 127.0.0.1 (issue 14; docs/deploy.md "A local cluster"): PostgreSQL, Redis
# (the shared KV tier), N `mnemo serve` replicas sharing them, and HAProxy in front configured by
# deploy/haproxy.cfg.
#
#   scripts/cluster.sh up --replicas N --model FILE --port P --dir DIR [--no-fsync] [--no-redis] [--redis-mb MB] [-- serve flags]
#   scripts/cluster.sh down --dir DIR
#
# up: PostgreSQL 15 with its own data directory DIR/pg/data (initdb on first use; reused by a later
# `up` on the same DIR, so conversations outlive a down/up), run as the user postgres when started
# as root (PostgreSQL refuses root; `nobody` when there is no postgres user); N replicas (--db
# postgresql://mnemo@127.0.0.1:PGPORT/mnemo, --port 0, --drain-s 1, --replica-id rI, plus the serve
# flags after `--`); HAProxy with DIR/haproxy.cfg (deploy/haproxy.cfg
# and one `server` line per replica) bound to 127.0.0.1:P. Writes DIR/replica-<i>.pid (i = 0..N-1),
# DIR/haproxy.pid, DIR/pg.url, DIR/front.url (http://127.0.0.1:P), DIR/replica-<i>.sh (starts
# replica i again on its port), HAProxy's stats socket DIR/haproxy.sock and logs (DIR/*.log,
# DIR/pg/server.log); returns once GET /ready through the front answers 200. Every wait is bounded
# (MNEMO_CLUSTER_WAIT_S, default 60 s); on a failure it says what failed, shows the log's tail and
# stops what it started.
# Redis 7 (unless --no-redis): redis-server on 127.0.0.1 at a random port, its directory DIR/redis,
# no persistence (--save '', no AOF: it is a cache, the raw token logs are in PostgreSQL), maxmemory
# --redis-mb (default 256) with allkeys-lru, so that it evicts rather than refuses puts; writes
# DIR/redis.pid and DIR/redis.url, and the replicas get --kv-remote with that URL.
# --no-fsync: PostgreSQL without fsync (tests: the data is disposable).
#
# down: stops the processes named by DIR's pid files (each checked to be the one `up` started: a
# stale pid file never kills an unrelated process), Redis after the replicas (a replica stopping
# offers its KV to it), and DIR's PostgreSQL, nothing else; keeps the data and logs.
#
# Binaries: MNEMO_BIN (default build/apps/mnemo under the repository), MNEMO_PG_BIN (default
# /usr/lib/postgresql/15/bin, as the tests' fixture), HAPROXY_BIN (default haproxy on PATH, else
# /usr/sbin/haproxy), MNEMO_REDIS_SERVER (default redis-server on PATH, as the tests' fixture).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mnemo=${MNEMO_BIN:-$root/build/apps/mnemo}
pg_bin=${MNEMO_PG_BIN:-/usr/lib/postgresql/15/bin}
haproxy=${HAPROXY_BIN:-$(command -v haproxy || echo /usr/sbin/haproxy)}
redis_server=${MNEMO_REDIS_SERVER:-$(command -v redis-server || echo /usr/bin/redis-server)}
wait_s=${MNEMO_CLUSTER_WAIT_S:-60}

die() {
  echo "cluster.sh: $*" >&2
  exit 1
}
usage() {
  sed -n '6,7p' "$0" | sed 's/^# *//' >&2
  exit 2
}

cmd=${1:-}
[[ $cmd == up || $cmd == down ]] || usage
shift
replicas= model= port= dir= fsync=on redis=1 redis_mb=256
serve_extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --replicas) replicas=${2:?}; shift 2 ;;
    --model) model=${2:?}; shift 2 ;;
    --port) port=${2:?}; shift 2 ;;
    --dir) dir=${2:?}; shift 2 ;;
    --no-fsync) fsync=off; shift ;;
    --no-redis) redis=0; shift ;;
    --redis-mb) redis_mb=${2:?}; shift 2 ;;
    --) shift; serve_extra=("$@"); break ;;
    *) usage ;;
  esac
done
[[ -n $dir ]] || usage
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

# The user PostgreSQL runs as, and how to run a command as it.
as=()
pg_user=$(id -un)
if [[ $(id -u) == 0 ]]; then
  pg_user=postgres
  id -u postgres >/dev/null 2>&1 || pg_user=nobody
  as=(setpriv --reuid="$(id -u "$pg_user")" --regid="$(id -g "$pg_user")" --clear-groups)
fi

# The cmdline of pid with NULs as spaces ("" when it is gone).
cmdline() { { tr '\0' ' ' <"/proc/$1/cmdline"; } 2>/dev/null || true; }

# Stops the process in pid file $1 if its cmdline contains $2: SIGTERM (twice: a replica's second
# signal ends its drain), SIGKILL after 10 s.
stop_pid() {
  local file=$1 marker=$2 pid
  [[ -f $file ]] || return 0
  pid=$(<"$file")
  if [[ $pid =~ ^[0-9]+$ ]] && [[ $(cmdline "$pid") == *"$marker"* ]]; then
    kill -TERM "$pid" 2>/dev/null || true
    sleep 0.1
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      [[ $(cmdline "$pid") == *"$marker"* ]] || break
      sleep 0.1
    done
    if [[ $(cmdline "$pid") == *"$marker"* ]]; then
      echo "cluster.sh: $file: pid $pid did not stop within 10 s; killing it" >&2
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$file"
}

down() {
  local pg_url="" redis_url="" f
  [[ -f $dir/pg.url ]] && pg_url=$(<"$dir/pg.url")
  [[ -f $dir/redis.url ]] && redis_url=$(<"$dir/redis.url")
  stop_pid "$dir/haproxy.pid" "$dir/haproxy.cfg"
  for f in "$dir"/replica-*.pid; do
    [[ -e $f ]] || continue
    # A replica of this cluster is `mnemo serve` on this cluster's database.
    stop_pid "$f" "--db ${pg_url:-postgresql://}"
  done
  # Redis titles its process "redis-server HOST:PORT": the one at this cluster's URL.
  [[ -n $redis_url ]] && stop_pid "$dir/redis.pid" "redis-server ${redis_url#redis://}"
  rm -f "$dir/redis.url"
  if [[ -f $dir/pg/data/postmaster.pid ]]; then
    "${as[@]}" "$pg_bin/pg_ctl" -D "$dir/pg/data" -m fast -w -t 10 stop >/dev/null 2>&1 ||
      echo "cluster.sh: PostgreSQL in $dir/pg/data did not stop cleanly" >&2
  fi
  rm -f "$dir/front.url"
}

if [[ $cmd == down ]]; then
  down
  exit 0
fi

# ---- up ----
[[ $replicas =~ ^[1-9][0-9]*$ ]] || die "--replicas must be a positive integer"
[[ $port =~ ^[0-9]+$ && $port -gt 0 && $port -lt 65536 ]] || die "--port must be a TCP port (1..65535)"
[[ -f $model ]] || die "model file '$model' not found"
model=$(cd "$(dirname "$model")" && pwd)/$(basename "$model")
[[ -x $mnemo ]] || die "mnemo binary '$mnemo' not found (build it, or set MNEMO_BIN)"
[[ -x $pg_bin/initdb && -x $pg_bin/pg_ctl && -x $pg_bin/createdb ]] ||
  die "PostgreSQL binaries not found in $pg_bin (install postgresql-15, or set MNEMO_PG_BIN)"
[[ -x $haproxy ]] || die "haproxy not found (install haproxy, or set HAPROXY_BIN)"
[[ -f $root/deploy/haproxy.cfg ]] || die "$root/deploy/haproxy.cfg not found"
if ((redis)); then
  [[ -x $redis_server ]] || die "redis-server not found (install redis-server, set MNEMO_REDIS_SERVER, or pass --no-redis)"
  [[ $redis_mb =~ ^[1-9][0-9]*$ ]] || die "--redis-mb must be a positive integer"
fi
if [[ -f $dir/front.url ]]; then
  die "$dir holds a running cluster ($(<"$dir/front.url")): run 'scripts/cluster.sh down --dir $dir' first"
fi

# From here on a failure stops what was started.
fail() {
  echo "cluster.sh: $1" >&2
  if [[ -n ${2:-} && -f $2 ]]; then
    echo "--- last lines of $2:" >&2
    tail -n 20 "$2" >&2
  fi
  down
  exit 1
}

# 1. PostgreSQL.
mkdir -p "$dir/pg"
[[ $(id -u) == 0 ]] && chown "$pg_user" "$dir/pg"
"${as[@]}" test -w "$dir/pg" || fail "the user $pg_user cannot write $dir/pg (a parent directory it cannot enter?)"
if [[ ! -f $dir/pg/data/PG_VERSION ]]; then
  (cd "$dir/pg" && "${as[@]}" "$pg_bin/initdb" -D "$dir/pg/data" -U mnemo --auth=trust --no-sync -E UTF8 \
    --no-locale --no-instructions >"$dir/pg/initdb.log" 2>&1) || fail "initdb failed" "$dir/pg/initdb.log"
fi
pg_opts="-k $dir/pg -c listen_addresses=127.0.0.1 -c max_connections=200"
[[ $fsync == off ]] && pg_opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
pg_port=
for _ in 1 2 3 4 5; do  # a random port; another one when it is taken
  p=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
  if (cd "$dir/pg" && "${as[@]}" "$pg_bin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/server.log" -w -t "$wait_s" \
    -o "-p $p $pg_opts" start >/dev/null 2>&1); then
    pg_port=$p
    break
  fi
done
[[ -n $pg_port ]] || fail "PostgreSQL did not start" "$dir/pg/server.log"
"$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U mnemo mnemo 2>/dev/null ||
  "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -U mnemo -d mnemo -c 'SELECT 1' >/dev/null 2>&1 ||
  fail "cannot create the database 'mnemo'" "$dir/pg/server.log"
pg_url="postgresql://mnemo@127.0.0.1:$pg_port/mnemo"
echo "$pg_url" >"$dir/pg.url"

# 2. Redis, the shared KV tier (docs/deploy.md "Sharing KV through Redis"): a cache, so no
# persistence; maxmemory with allkeys-lru, so a full Redis evicts old chunks instead of refusing puts.
replica_flags=()
if ((redis)); then
  mkdir -p "$dir/redis"
  rm -f "$dir/redis.url"
  redis_port=
  deadline=$((SECONDS + wait_s))
  for _ in 1 2 3 4 5; do  # a random port; another one when it is taken (the server then exits)
    p=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
    setsid "$redis_server" --port "$p" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir/redis" \
      --logfile "$dir/redis/redis.log" --maxmemory "${redis_mb}mb" --maxmemory-policy allkeys-lru \
      >/dev/null 2>&1 </dev/null &
    echo $! >"$dir/redis.pid"
    echo "redis://127.0.0.1:$p" >"$dir/redis.url"  # before the wait: a failure's `down` stops it
    # PING over bash's /dev/tcp (no client needed) until +PONG, the server exits, or time runs out.
    while kill -0 "$(<"$dir/redis.pid")" 2>/dev/null && [[ $(cmdline "$(<"$dir/redis.pid")") == *redis-server* ]]; do
      if { exec 3<>"/dev/tcp/127.0.0.1/$p"; } 2>/dev/null; then
        printf 'PING\r\n' >&3
        reply=
        read -r -t 2 reply <&3 || true
        exec 3<&-
        if [[ $reply == +PONG* ]]; then
          redis_port=$p
          break 2
        fi
      fi
      ((SECONDS < deadline)) || fail "Redis did not answer within $wait_s s" "$dir/redis/redis.log"
      sleep 0.05
    done
  done
  [[ -n $redis_port ]] || fail "Redis did not start" "$dir/redis/redis.log"
  replica_flags+=(--kv-remote "redis://127.0.0.1:$redis_port")
fi

# 3. The replicas, all started at once (they migrate the schema one at a time: an advisory lock).
for ((i = 0; i < replicas; i++)); do
  # Named as its HAProxy server line below: X-Mnemo-Replica then equals X-Mnemo-Served-By.
  args=(serve --model "$model" --db "$pg_url" --host 127.0.0.1 --port 0 --drain-s 1 --replica-id "r$i")
  setsid "$mnemo" "${args[@]}" "${replica_flags[@]}" "${serve_extra[@]}" >"$dir/replica-$i.log" 2>&1 </dev/null &
  echo $! >"$dir/replica-$i.pid"
done
ports=()
deadline=$((SECONDS + wait_s))
for ((i = 0; i < replicas; i++)); do
  log=$dir/replica-$i.log
  while :; do
    line=$(grep -m1 -o 'serving .* on https\?://127\.0\.0\.1:[0-9]*' "$log" 2>/dev/null || true)
    if [[ -n $line ]]; then
      ports+=("${line##*:}")
      break
    fi
    kill -0 "$(<"$dir/replica-$i.pid")" 2>/dev/null || fail "replica $i exited" "$log"
    ((SECONDS < deadline)) || fail "replica $i did not start within $wait_s s" "$log"
    sleep 0.1
  done
done

# A script per replica that starts it again on its port (`bench serve --fault restart:I@S`, or by
# hand after a kill): the same flags, the log appended, the pid file rewritten.
for ((i = 0; i < replicas; i++)); do
  args=(serve --model "$model" --db "$pg_url" --host 127.0.0.1 --port "${ports[$i]}" --drain-s 1 --replica-id "r$i")
  {
    echo "#!/usr/bin/env bash"
    echo "# Starts replica $i of the cluster in $dir again (written by scripts/cluster.sh up)."
    printf 'setsid %q' "$mnemo"
    printf ' %q' "${args[@]}" "${replica_flags[@]}" "${serve_extra[@]}"
    printf ' >>%q 2>&1 </dev/null &\n' "$dir/replica-$i.log"
    printf 'echo $! >%q\n' "$dir/replica-$i.pid"
  } >"$dir/replica-$i.sh"
done

# 4. HAProxy: the deployed configuration plus one server line per replica, and a stats socket
# (`show stat`: each server's UP/DOWN, what `bench serve --fault` times a kill's mark-down by).
{
  cat "$root/deploy/haproxy.cfg"
  for ((i = 0; i < replicas; i++)); do echo "    server r$i 127.0.0.1:${ports[$i]}"; done
  echo "global"
  echo "    stats socket $dir/haproxy.sock mode 600 level user"
} >"$dir/haproxy.cfg"
MNEMO_FRONT=127.0.0.1:$port "$haproxy" -c -q -f "$dir/haproxy.cfg" >"$dir/haproxy.log" 2>&1 ||
  fail "the generated HAProxy configuration is invalid" "$dir/haproxy.log"
MNEMO_FRONT=127.0.0.1:$port setsid "$haproxy" -db -f "$dir/haproxy.cfg" >>"$dir/haproxy.log" 2>&1 </dev/null &
echo $! >"$dir/haproxy.pid"

# 5. Wait until the front answers GET /ready with 200 (bash's /dev/tcp: no client needed).
ready() {
  local code=""
  { exec 3<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || return 1
  printf 'GET /ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  read -r -t 2 _ code _ <&3 || true
  exec 3<&-
  [[ $code == 200 ]]
}
until ready; do
  kill -0 "$(<"$dir/haproxy.pid")" 2>/dev/null || fail "HAProxy exited (is port $port free?)" "$dir/haproxy.log"
  ((SECONDS < deadline)) || fail "the front on 127.0.0.1:$port did not answer /ready within $wait_s s" "$dir/haproxy.log"
  sleep 0.1
done
echo "http://127.0.0.1:$port" >"$dir/front.url"
redis_note=", no Redis"
((redis)) && redis_note=", $(<"$dir/redis.url")"
echo "cluster up: front http://127.0.0.1:$port, $replicas replicas (ports ${ports[*]}), $pg_url$redis_note, logs in $dir"
