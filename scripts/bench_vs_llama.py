#!/usr/bin/env python3
"""Prefill and decode throughput of mnemo against llama.cpp's llama-bench on the same GGUF files.

    scripts/bench_vs_llama.py --llama-bench PATH/llama-bench [--mnemo build/apps/mnemo]
        [--threads 2] [--rounds 3] [--prompt 512] [--depth 512] [--gen 64] [--json OUT] FILE.gguf...

For each round and file, runs the two engines back to back (alternating which goes first), each
measuring prefill of --prompt tokens from an empty context and --gen decode steps at batch 1 after
--depth tokens of context (llama-bench: `-p P -n 0` and `-p 0 -n G -d D`; mnemo: `bench engine
--prompts P --batches 1 --decode-context D --decode-steps G`). Prints a Markdown table of medians over
rounds with the range of the per-round ratios. Standard library only. llama.cpp is not part of this
repository: build it elsewhere and pass its llama-bench.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def llama_bench(args, path):
    base = [args.llama_bench, "-m", path, "-t", str(args.threads), "-r", "1", "-o", "json"]
    pp = run_json(base + ["-p", str(args.prompt), "-n", "0"])
    tg = run_json(base + ["-p", "0", "-n", str(args.gen), "-d", str(args.depth)])
    return pp[0]["avg_ts"], tg[0]["avg_ts"]


def mnemo_bench(args, path):
    j = run_json([args.mnemo, "bench", "engine", "--model", path, "--threads", str(args.threads),
                  "--prompts", str(args.prompt), "--batches", "1", "--decode-context", str(args.depth),
                  "--decode-steps", str(args.gen), "--repeats", "1", "--json"])
    return j["prefill_tokens_per_s"][str(args.prompt)], j["decode_tokens_per_s"]["1"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--mnemo", default="build/apps/mnemo")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--depth", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()

    runs = {f: {"mnemo": [], "llama": []} for f in args.files}
    for r in range(args.rounds):
        for f in args.files:
            order = ["mnemo", "llama"] if r % 2 == 0 else ["llama", "mnemo"]
            for who in order:
                fn = mnemo_bench if who == "mnemo" else llama_bench
                runs[f][who].append(fn(args, f))
            m, l = runs[f]["mnemo"][-1], runs[f]["llama"][-1]
            print(f"round {r + 1} {os.path.basename(f)}: prefill {m[0]:.1f} vs {l[0]:.1f}, "
                  f"decode {m[1]:.2f} vs {l[1]:.2f}", file=sys.stderr, flush=True)

    print(f"| file | mnemo prefill {args.prompt} (tok/s) | llama.cpp pp{args.prompt} | ratio (range) "
          f"| mnemo decode @{args.depth} | llama.cpp tg{args.gen} @ d{args.depth} | ratio (range) |")
    print("|---|---|---|---|---|---|---|")
    for f in args.files:
        m, l = runs[f]["mnemo"], runs[f]["llama"]
        cells = [os.path.basename(f)]
        for k in (0, 1):
            ratios = [a[k] / b[k] for a, b in zip(m, l)]
            cells += [f"{statistics.median(a[k] for a in m):.1f}", f"{statistics.median(b[k] for b in l):.1f}",
                      f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"threads": args.threads, "prompt": args.prompt, "depth": args.depth, "gen": args.gen,
                       "runs": runs}, out, indent=1)


if __name__ == "__main__":
    main()
