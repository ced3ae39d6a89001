#!/usr/bin/env python3
"""Pensieve against LRU over the issue-11 grid on the virtual clock (`mnemo bench policy`).

Usage: scripts/sweep_policy_sim.py [--mnemo build/apps/mnemo] [--seeds 5] [--cost llama-25m|llama-110m]
                                   [-- extra bench-policy flags]
Prints a markdown table: per point, each policy's median recompute time over the seeds, the
per-seed ratio (median, min-max), recomputed positions and attention pairs ratios, TTFT at
turns >= 5 (p50, p90 ratios) and suspensions. Deterministic: the same inputs give the same table.
"""
import argparse
import json
import statistics
import subprocess
import sys

# Step-cost models measured on the real engine (bf16, 2 threads; docs/benchmarks.md §3d):
# per forward step, per query token, per attention pair.
COSTS = {
    "llama-25m": ["--per-step-us", "3000", "--per-token-us", "57", "--per-pair-ns", "14"],
    "llama-110m": ["--per-step-us", "8500", "--per-token-us", "700", "--per-pair-ns", "350"],
}
LENGTHS = {
    # short: ~6 turns of ~50-token messages and ~64-token replies; long: ~12 turns of ~150 / ~120,
    # contexts reaching 4-8 k tokens. Users scaled so that T0 at 10% of the live KV still admits
    # the longest context.
    "short": ["--conversations", "64", "--users", "32", "--mean-turns", "6", "--max-turns", "12",
              "--input-median", "48", "--output-median", "64"],
    "long": ["--conversations", "48", "--users", "24", "--mean-turns", "12", "--max-turns", "24",
             "--input-median", "150", "--output-median", "120"],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mnemo", default="build/apps/mnemo")
    ap.add_argument("--seeds", default="5")
    ap.add_argument("--cost", default="llama-25m", choices=sorted(COSTS))
    ap.add_argument("--think", default="0 0.5 2 10")
    ap.add_argument("--t0", default="0.1 0.25 0.5")
    ap.add_argument("--t1", default="0 0.25")
    ap.add_argument("--length", default="short long")
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    print("| length | think (s) | T0 share | T1 share | recompute ms lru / pens | ratio (min-max) | positions ratio "
          "| pairs ratio | TTFT t>=5 p50 lru / pens | p90 lru / pens | TTFT ratio p50 | p90 | suspensions lru / pens |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    ttft = {"ttft_p50_5plus": [], "ttft_p90_5plus": []}
    for length in a.length.split():
        for think in a.think.split():
            for t0 in a.t0.split():
                for t1 in a.t1.split():
                    cmd = [a.mnemo, "bench", "policy", "--json", "--seeds", a.seeds, "--think-time", think,
                           "--kv-t0-live", t0, "--kv-t1-live", t1] + LENGTHS[length] + COSTS[a.cost] + a.extra
                    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                    s = j["summary"]
                    r = s["ratio"]
                    l, p = s["lru"], s["pensieve"]
                    rm = r["recompute_ms"]
                    ratios.append(rm["median"])
                    for k in ttft:
                        ttft[k].append(r[k]["median"])
                    print(f"| {length} | {think} | {s['t0_live_fraction']:.2f} | {t1} | {l['recompute_ms']:.0f} / "
                          f"{p['recompute_ms']:.0f} | {rm['median']:.2f} ({rm['min']:.2f}-{rm['max']:.2f}) | "
                          f"{r['recomputed_positions']['median']:.2f} | {r['recomputed_pairs']['median']:.2f} | "
                          f"{l['ttft_p50_5plus']:.0f} / {p['ttft_p50_5plus']:.0f} | "
                          f"{l['ttft_p90_5plus']:.0f} / {p['ttft_p90_5plus']:.0f} | "
                          f"{r['ttft_p50_5plus']['median']:.2f} | {r['ttft_p90_5plus']['median']:.2f} | "
                          f"{l['suspensions']:.0f} / {p['suspensions']:.0f} |", flush=True)
    print(f"\nrecompute_ms ratio pensieve / lru over the {len(ratios)} points: median "
          f"{statistics.median(ratios):.2f}, max {max(ratios):.2f}, min {min(ratios):.2f}")
    for k, v in ttft.items():
        print(f"{k} ratio pensieve / lru (median over seeds per point) over the points: median "
              f"{statistics.median(v):.2f}, max {max(v):.2f}, min {min(v):.2f}; "
              f"above 1.05 at {sum(x > 1.05 for x in v)} of {len(v)}")


if __name__ == "__main__":
    sys.exit(main())
