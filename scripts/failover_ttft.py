#!/usr/bin/python3
"""TTFT of the first turn after a failover, its history's KV from Redis against recomputed (issue 14).

Each run: replica A (`mnemo serve --kv-remote`, SQLite store, no disk tier) serves a conversation
of TURNS Responses turns of about HISTORY tokens in all, waits (bounded) until its write-behind has
put the history's chunks to Redis, and is killed with SIGKILL. Then, on the same store, a fresh
replica with Redis and a fresh replica without it each serve the conversation's next turn (the same
branch: one previous_response_id, temperature 0), in alternating order; each turn's TTFT is the
time from sending the streamed request to its first text delta. Prints one JSON object: per run and
medians, with the cached and remote token counts of the Redis turns and whether outputs agreed.

  /usr/bin/python3 scripts/failover_ttft.py --model M.gguf [--runs 5] [--history 1500] [--turns 3]
      [--mnemo build/apps/mnemo] [--redis-server redis-server] [-- extra serve flags]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

WORDS = ("the little dog ran to the park with a red ball and the girl laughed while the sun was warm "
         "over the green hill near the old river where birds sang all day long").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def redis_command(port, *args):
    """One RESP command on a fresh connection; the first reply line."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        msg = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        s.sendall(msg.encode())
        return s.recv(4096).decode().split("\r\n")[0]


LIVE = []  # servers started and not yet killed (stopped on the way out, whatever happened)


class Server:
    """`mnemo serve` on a free port; its stderr goes to a log file."""

    def __init__(self, mnemo, flags, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen([mnemo, "serve", "--port", "0"] + flags, stderr=self.log, stdout=subprocess.DEVNULL)
        LIVE.append(self)
        deadline = time.time() + 60
        self.url = None
        while time.time() < deadline and self.url is None:
            m = re.search(r"mnemo serving .* on (http://127\.0\.0\.1:\d+)", open(log_path).read())
            if m:
                self.url = m.group(1)
            elif self.proc.poll() is not None:
                break
            time.sleep(0.05)
        if self.url is None:
            self.kill()
            raise RuntimeError("server did not start:\n" + open(log_path).read()[-2000:])

    def metric(self, name):
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            text = r.read().decode()
        m = re.search("^" + re.escape(name) + r" ([0-9.e+-]+)$", text, re.M)
        return float(m.group(1)) if m else -1.0

    def turn(self, text, previous=None, max_tokens=16):
        """A streamed Responses turn at temperature 0: (response id, text, TTFT seconds, usage)."""
        body = {"model": "m", "input": text, "max_output_tokens": max_tokens, "temperature": 0, "stream": True}
        if previous:
            body["previous_response_id"] = previous
        req = urllib.request.Request(self.url + "/v1/responses", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        ttft, out, rid, usage = None, "", None, {}
        try:
            r = urllib.request.urlopen(req, timeout=600)
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"turn refused: {e.code} {e.read().decode()}") from None
        with r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                ev = json.loads(line[6:])
                if ev.get("type") == "response.output_text.delta":
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    out += ev.get("delta", "")
                elif ev.get("type") in ("response.completed", "response.incomplete"):
                    rid = ev["response"]["id"]
                    usage = ev["response"].get("usage", {})
        return rid, out, ttft, usage

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        if self in LIVE:
            LIVE.remove(self)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--history", type=int, default=1500, help="words in the conversation before the failover")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--mnemo", default=os.path.join(os.path.dirname(__file__), "..", "build", "apps", "mnemo"))
    ap.add_argument("--redis-server", default=shutil.which("redis-server") or "/usr/bin/redis-server")
    ap.add_argument("extra", nargs="*", help="extra serve flags (after --)")
    a = ap.parse_args()

    work = tempfile.mkdtemp(prefix="mnemo-failover-")
    rport = free_port()
    redis = subprocess.Popen([a.redis_server, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", work, "--maxmemory", "2gb",
                              "--maxmemory-policy", "allkeys-lru"], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                if redis_command(rport, "PING") == "+PONG":
                    break
            except OSError:
                time.sleep(0.05)
        redis_url = f"redis://127.0.0.1:{rport}"
        runs = []
        for run in range(a.runs):
            redis_command(rport, "FLUSHALL")
            db = os.path.join(work, f"run{run}.db")
            base = ["--model", a.model, "--db", db, "--kv-disk-mb", "0"] + a.extra
            # A: the conversation, its chunks put by write-behind, then kill -9.
            srv = Server(a.mnemo, base + ["--kv-remote", redis_url], os.path.join(work, f"a{run}.log"))
            per_turn = max(1, a.history // a.turns)
            prev = None
            for t in range(a.turns):
                words = " ".join(WORDS[(t * 7 + i) % len(WORDS)] for i in range(per_turn))
                prev, _, _, usage = srv.turn(f"Part {t}: {words}", prev)
            history = usage.get("total_tokens", 0)
            want = (history - 1) // 32
            deadline = time.time() + 30
            while srv.metric('mnemo_remote_kv_puts_total{result="stored"}') < want and time.time() < deadline:
                time.sleep(0.05)
            puts = srv.metric('mnemo_remote_kv_puts_total{result="stored"}')
            srv.kill()
            # The next turn on a fresh replica, with Redis and without, alternating which goes first.
            result = {"history_tokens": history, "chunks_put": puts}
            order = ["redis", "recompute"] if run % 2 == 0 else ["recompute", "redis"]
            for kind in order:
                flags = base + (["--kv-remote", redis_url] if kind == "redis" else [])
                s = Server(a.mnemo, flags, os.path.join(work, f"{kind}{run}.log"))
                _, text, ttft, usage = s.turn("And then what happened next?", prev)
                details = usage.get("input_tokens_details", {})
                result[kind] = {"ttft_s": round(ttft, 4), "cached_tokens": details.get("cached_tokens", 0),
                                "remote_tokens": s.metric('mnemo_context_tokens_total{source="remote"}'),
                                "text": text}
                s.kill()
            result["same_output"] = result["redis"].pop("text") == result["recompute"].pop("text")
            runs.append(result)
        med = {k: statistics.median(r[k]["ttft_s"] for r in runs) for k in ("redis", "recompute")}
        print(json.dumps({"model": os.path.basename(a.model), "runs": runs, "median_ttft_s": med,
                          "speedup": round(med["recompute"] / med["redis"], 2) if med["redis"] > 0 else None},
                         indent=1))
    finally:
        for srv in list(LIVE):
            srv.kill()
        redis.kill()
        redis.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
