#!/usr/bin/env bash
# Aggregate throughput of a local cluster (scripts/cluster.sh: HAProxy, PostgreSQL, Redis) with 1, 2,
# ... replicas of one kernel thread each, on the same closed-loop multi-turn workload (`mnemo bench
# serve`, Responses API), plus the balance and the share of later turns kept on their replica
# (issue 14). Each size runs REPEATS times in a fresh cluster; the sizes are interleaved.
#
#   scripts/bench_cluster.sh --model FILE [--sizes "1 2 3"] [--repeats 3] [--dir DIR] [--port P]
#                            [-- bench serve flags]
#
# Prints one line per run and writes DIR/results.jsonl (bench serve's JSON plus "replicas").
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mnemo=${MNEMO_BIN:-$root/build/apps/mnemo}
model= sizes="1 2 3" repeats=3 dir=/tmp/mnemo-bench-cluster port=18600
bench=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --model) model=${2:?}; shift 2 ;;
    --sizes) sizes=${2:?}; shift 2 ;;
    --repeats) repeats=${2:?}; shift 2 ;;
    --dir) dir=${2:?}; shift 2 ;;
    --port) port=${2:?}; shift 2 ;;
    --) shift; bench=("$@"); break ;;
    *) echo "bench_cluster.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -f $model ]] || { echo "bench_cluster.sh: --model FILE is required" >&2; exit 2; }
((${#bench[@]})) || bench=(--users 12 --conversations 400 --mean-turns 6 --max-turns 10 --input-median 80
                           --output-median 32 --think-time 0.2 --duration 40)
mkdir -p "$dir"
: >"$dir/results.jsonl"
for ((r = 1; r <= repeats; r++)); do
  for n in $sizes; do
    d=$dir/run-$n-$r
    rm -rf "$d"
    "$root/scripts/cluster.sh" up --replicas "$n" --model "$model" --port "$port" --dir "$d" --no-fsync \
      -- --threads 1 >/dev/null
    out=$("$mnemo" bench serve --url "http://127.0.0.1:$port" --api responses --json "${bench[@]}" || true)
    "$root/scripts/cluster.sh" down --dir "$d" >/dev/null
    [[ -n $out ]] || { echo "run $r, $n replicas: bench serve failed" >&2; continue; }
    echo "$out" | python3 -c "
import json, sys
j = json.load(sys.stdin); j['replicas'] = $n
print(json.dumps(j), file=open('$dir/results.jsonl', 'a'))
print(f\"run $r, $n replicas: {j['throughput_output_tokens_per_s']:.0f} tok/s, {j['requests']} turns, \"
      f\"{j['errors']} errors, TTFT p50 {j['ttft_ms']['p50']:.0f} ms, balance \"
      f\"{j.get('replica_balance_max_over_mean', 1):.2f}, later turns on their replica \"
      f\"{100 * j.get('later_turns_same_replica_share', 1):.1f}%\")"
  done
done
python3 - "$dir/results.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["replicas"], []).append(r)
base = statistics.median(r["throughput_output_tokens_per_s"] for r in by[min(by)])
print("\nreplicas | tok/s (median) | vs smallest | balance max/mean | later turns on their replica")
for n in sorted(by):
    t = statistics.median(r["throughput_output_tokens_per_s"] for r in by[n])
    b = statistics.median(r.get("replica_balance_max_over_mean", 1) for r in by[n])
    s = statistics.median(r.get("later_turns_same_replica_share", 1) for r in by[n])
    print(f"| {n} | {t:.0f} | {t / base:.2f} | {b:.2f} | {100 * s:.1f}% |")
EOF
