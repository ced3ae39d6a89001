#!/bin/bash
# Pensieve against LRU over a grid of workloads: think time x T0 share of the live KV x host tier
# x conversation length, each point run RUNS times (`mnemo bench multiturn --modes lru pensieve`,
# the two modes in alternating order from run to run so that drift in machine load cancels), then
# one markdown table of medians: recompute_ms, recomputed positions and attention pairs (Pensieve /
# LRU: median and min-max of the per-run ratios), the spread of each mode (max / min positions over
# the runs), TTFT p50 / p90 at turns >= 5 for both.
#
#   scripts/sweep_policy.sh --model FILE [--out DIR] [--runs 3] [--think "0 0.5 2 10"]
#       [--t0 "0.1 0.25 0.5"] [--t1 "off on"] [--length "short long"] [-- extra bench flags]
#
# The defaults are the full grid (96 points x 3 runs x 2 modes). "on" gives T1 a quarter of the
# live KV (so T0 + T1 still hold less than all of it and something is dropped); "off" none.
# short: ~6 turns of ~50-token messages and ~64-token replies; long: ~12 turns of ~150 / ~120,
# contexts up to the model's context length (conversations that outgrow it end there).
# Needs build/apps/mnemo and /usr/bin/python3 (for the summary); re-running with the same --out
# reuses the runs already there, so an interrupted sweep resumes.
set -euo pipefail

MNEMO=${MNEMO:-build/apps/mnemo}
PY=/usr/bin/python3
model= out=sweep_policy runs=3
think="0 0.5 2 10" t0s="0.1 0.25 0.5" t1s="off on" lengths="short long"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --think) think=$2; shift 2 ;;
    --t0) t0s=$2; shift 2 ;;
    --t1) t1s=$2; shift 2 ;;
    --length) lengths=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "usage: $0 --model FILE [...]" >&2; exit 2; }
mkdir -p "$out"

length_flags() {
  case "$1" in
    short) echo "--conversations 16 --users 8 --mean-turns 6 --max-turns 8 --input-median 48 --output-median 64" ;;
    long) echo "--conversations 12 --users 6 --mean-turns 12 --max-turns 20 --input-median 150 --output-median 120" ;;
    *) echo "unknown length $1" >&2; exit 2 ;;
  esac
}

for len in $lengths; do
  for th in $think; do
    for t0 in $t0s; do
      for t1 in $t1s; do
        t1share=0
        [ "$t1" = on ] && t1share=0.25
        for r in $(seq 1 "$runs"); do
          f="$out/${len}_think${th}_t0${t0}_t1${t1}_run${r}.json"
          [ -s "$f" ] && continue
          modes="lru pensieve"
          [ $((r % 2)) -eq 0 ] && modes="pensieve lru"
          # shellcheck disable=SC2046
          "$MNEMO" bench multiturn --model "$model" $(length_flags "$len") --think-time "$th" \
            --kv-t0-live "$t0" --kv-t1-live "$t1share" --modes $modes --json "${extra[@]}" \
            > "$f.tmp" 2> "$out/last.err"
          mv "$f.tmp" "$f"
          echo "$(date -u +%H:%M:%S) $f" >&2
        done
      done
    done
  done
done

"$PY" - "$out" <<'EOF'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
points = {}
for f in sorted(glob.glob(os.path.join(out, "*_run*.json"))):
    m = re.match(r"(.*)_run(\d+)\.json$", os.path.basename(f))
    runs = {r["mode"]: r for r in json.load(open(f))["runs"]}
    points.setdefault(m.group(1), []).append(runs)
med = statistics.median
def ratio(a, b):
    return a / b if b > 0 else (1.0 if a == 0 else float("inf"))
def per_run(L, P, k):
    xs = [ratio(b[k], a[k]) for a, b in zip(L, P)]
    return "%.2f (%.2f-%.2f)" % (med(xs), min(xs), max(xs))
def spread(xs, k):
    return max(x[k] for x in xs) / max(1, min(x[k] for x in xs))
print("| point | T0 share | recompute_ms lru / pens | ratio (min-max) | recomputed positions lru / pens | ratio (min-max) "
      "| attention pairs ratio (min-max) | spread lru / pens | TTFT p50 t>=5 lru / pens | TTFT p90 t>=5 lru / pens | runs |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for p, rs in points.items():
    L = [r["lru"] for r in rs]; P = [r["pensieve"] for r in rs]
    g = lambda xs, q: med([x["ttft_ms_turns_5_plus"][q] for x in xs])
    print("| %s | %.2f | %.0f / %.0f | %s | %.0f / %.0f | %s | %s | %.2f / %.2f | %.0f / %.0f | %.0f / %.0f | %d |" % (
        p, med([x["t0_live_fraction"] for x in L]),
        med([x["recompute_ms"] for x in L]), med([x["recompute_ms"] for x in P]), per_run(L, P, "recompute_ms"),
        med([x["recomputed_positions"] for x in L]), med([x["recomputed_positions"] for x in P]),
        per_run(L, P, "recomputed_positions"), per_run(L, P, "recomputed_attention_pairs"),
        spread(L, "recomputed_positions"), spread(P, "recomputed_positions"),
        g(L, "p50"), g(P, "p50"), g(L, "p90"), g(P, "p90"), len(rs)))
EOF
