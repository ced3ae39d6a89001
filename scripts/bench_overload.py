#!/usr/bin/env python3
"""Overload: a running `mnemo serve` offered 1x, 2x and 10x a sustainable rate of one-turn chat
requests (open loop, Poisson arrivals, `mnemo bench serve --rate`), the multipliers interleaved and
repeated so that drift of a shared machine falls on all of them alike (issue 13).

Per run: requests answered, shed (429/503), other errors, p50/p99 TTFT of the admitted ones, how
long a shed client waited for its refusal, and goodput (output tokens of answered requests per
second of the run), the server's CPU per answered token (--server-pid) and the cores the load
generator itself took (it shares the machine). Printed per run and as medians per multiplier, with goodput relative to 1x.

  python3 scripts/bench_overload.py --bin build/apps/mnemo --url http://127.0.0.1:PORT \
      --rate 24 --multipliers 1,2,10 --repeats 3 --duration 30 [--json out.json]

Find the sustainable rate first: the highest open-loop rate at which nothing is shed and TTFT
stays near its idle value (try a few with --multipliers 1 and --repeats 1).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys


def server_cpu_s(pid):
    """User + system CPU seconds of a process so far (0 without a pid)."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_once(args, rate):
    cmd = [args.bin, "bench", "serve", "--url", args.url, "--api", "chat", "--rate", str(rate),
           "--conversations", str(int(rate * args.duration * 2) + 100), "--mean-turns", "1", "--max-turns", "1",
           "--input-median", str(args.input_median), "--output-median", str(args.output_median),
           "--duration", str(args.duration), "--timeout", "120", "--seed", str(args.seed), "--json"]
    s0, c0 = server_cpu_s(args.server_pid), client_cpu_s()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    s1, c1 = server_cpu_s(args.server_pid), client_cpu_s()
    j = json.loads(out)
    tokens = j["output_tokens"]
    return {
        # CPU the server spent per 1,000 answered tokens (shedding's own cost shows as a rise with
        # the multiplier), and the cores the load generator took from the same machine.
        "server_cpu_ms_per_ktok": 1e6 * (s1 - s0) / tokens if tokens and args.server_pid else 0,
        "client_cores": (c1 - c0) / j["wall_seconds"],
        "rate": rate,
        "answered": j["requests"],
        "shed": j["shed"],
        "errors": j["errors"],
        "shed_share": j["shed_share"],
        "ttft_p50_ms": j["ttft_ms"].get("p50", 0),
        "ttft_p99_ms": j["ttft_ms"].get("p99", 0),
        "shed_answer_p99_ms": j["shed_answer_ms"].get("p99", 0),
        "goodput_tok_s": j["throughput_output_tokens_per_s"],
        "wall_s": j["wall_seconds"],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default="build/apps/mnemo")
    p.add_argument("--url", required=True)
    p.add_argument("--rate", type=float, required=True, help="the sustainable rate (requests/s), 1x")
    p.add_argument("--multipliers", default="1,2,10")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--duration", type=float, default=30)
    p.add_argument("--input-median", type=float, default=200)
    p.add_argument("--output-median", type=float, default=64)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--server-pid", type=int, help="the server's pid: report its CPU per answered token")
    p.add_argument("--json", help="write every run here")
    args = p.parse_args()
    mults = [float(m) for m in args.multipliers.split(",")]

    runs = {m: [] for m in mults}
    for rep in range(args.repeats):
        for m in mults:
            r = run_once(args, args.rate * m)
            r["multiplier"] = m
            runs[m].append(r)
            print(f"run {rep + 1} x{m:g}: rate {r['rate']:g}/s answered {r['answered']} shed {r['shed']} "
                  f"({100 * r['shed_share']:.1f}%) errors {r['errors']} TTFT p50/p99 {r['ttft_p50_ms']:.0f}/"
                  f"{r['ttft_p99_ms']:.0f} ms shed answer p99 {r['shed_answer_p99_ms']:.0f} ms "
                  f"goodput {r['goodput_tok_s']:.0f} tok/s server {r['server_cpu_ms_per_ktok']:.0f} CPU-ms/ktok "
                  f"client {r['client_cores']:.2f} cores", flush=True)

    med = lambda m, k: statistics.median(r[k] for r in runs[m])
    base = med(mults[0], "goodput_tok_s")
    print("\nmedians | multiplier | rate/s | shed share | errors | TTFT p50 / p99 ms | shed answer p99 ms | "
          "goodput tok/s | vs first | server CPU-ms / 1k tokens | client cores")
    for m in mults:
        g = med(m, "goodput_tok_s")
        print(f"| {m:g}x | {args.rate * m:g} | {100 * med(m, 'shed_share'):.1f}% | {med(m, 'errors'):g} | "
              f"{med(m, 'ttft_p50_ms'):.0f} / {med(m, 'ttft_p99_ms'):.0f} | {med(m, 'shed_answer_p99_ms'):.0f} | "
              f"{g:.0f} | {g / base:.2f} | {med(m, 'server_cpu_ms_per_ktok'):.0f} | {med(m, 'client_cores'):.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
