#!/usr/bin/env python3
"""Connection-scale benchmark of `mnemo serve` (issue 13): threads, RSS and small-request latency
with N idle connections, then with M concurrent SSE streams. Standard library only.

  ulimit -n 65536; python3 scripts/bench_connections.py --bin build/apps/mnemo \
      --model ../shared/models/stories260K/stories260K.gguf --idle 10000 --streams 1000

Prints one JSON object: for each phase the server's threads (/proc/PID/task) and RSS (VmRSS), and
the latency of GET /health (p50/p99 over --probes requests, each on a new connection).
"""
import argparse
import json
import os
import re
import resource
import selectors
import socket
import subprocess
import sys
import time


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def server_cpu_s(pid):
    """User + system CPU seconds the process has used."""
    return sum(int(x) for x in open(f"/proc/{pid}/stat").read().split()[13:15]) / os.sysconf("SC_CLK_TCK")


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def probe(port, n):
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        if not data.startswith(b"HTTP/1.1 200"):
            raise RuntimeError("probe failed: %r" % data[:200])
        lat.append((time.perf_counter() - t0) * 1000)
    lat.sort()
    return {"p50_ms": round(lat[len(lat) // 2], 2), "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
            "max_ms": round(lat[-1], 2)}


def turn_probe(port, n):
    """Time to the first SSE event (ms) of n streamed 4-token chat turns, one after another."""
    body = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
                       "stream": True}).encode()
    lat, statuses = [], {}
    for _ in range(n):
        t0 = time.perf_counter()
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        data, first = b"", None
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            if first is None and (b"data: " in data or not data.startswith(b"HTTP/1.1 200")) and b"\r\n\r\n" in data:
                first = (time.perf_counter() - t0) * 1000
        s.close()
        code = data[9:12].decode(errors="replace")
        statuses[code] = statuses.get(code, 0) + 1
        if code == "200" and first is not None:
            lat.append(first)
    lat.sort()
    out = {"statuses": statuses}
    if lat:
        out.update({"ttfb_p50_ms": round(lat[len(lat) // 2], 1),
                    "ttfb_p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 1),
                    "ttfb_max_ms": round(lat[-1], 1)})
    return out


def state(pid, port, probes):
    return {"threads": threads(pid), "rss_mb": round(rss_kb(pid) / 1024, 1), "health": probe(port, probes)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/apps/mnemo")
    ap.add_argument("--model", required=True)
    ap.add_argument("--idle", type=int, default=10000)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--turn-probes", type=int, default=20, help="4-token streamed turns timed once every stream is open")
    ap.add_argument("--max-running", type=int, default=0, help="engine batch (0: streams + turn probes)")
    ap.add_argument("--max-queue-ms", type=int, default=600000)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    n = max(a.idle, a.streams) + 1000
    args = [a.bin, "serve", "--model", a.model, "--port", "0", "--max-context", "512", "--kv-t0-mb", "512",
            "--max-connections", str(n), "--max-connections-per-address", str(n),
            "--max-running", str(a.max_running or a.streams + a.turn_probes), "--max-waiting", str(a.streams + a.turn_probes),
            "--max-queue-ms", str(a.max_queue_ms)]
    srv = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    port = None
    for line in srv.stderr:
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    if port is None:
        raise SystemExit("the server did not start")
    # Keep reading its log so it never blocks on a full pipe.
    import threading
    threading.Thread(target=lambda: [None for _ in srv.stderr], daemon=True).start()
    out = {"idle_connections": a.idle, "streams": a.streams}
    try:
        out["baseline"] = state(srv.pid, port, a.probes)
        idle = []
        t0 = time.time()
        for _ in range(a.idle):
            s = socket.socket()
            s.setblocking(True)
            s.connect(("127.0.0.1", port))
            idle.append(s)
        out["open_idle_s"] = round(time.time() - t0, 2)
        time.sleep(1)
        out["with_idle"] = state(srv.pid, port, a.probes)
        out["with_idle"]["rss_added_kb_per_connection"] = round(
            (out["with_idle"]["rss_mb"] - out["baseline"]["rss_mb"]) * 1024 / max(1, a.idle), 2)
        for s in idle:
            s.close()
        idle = []
        time.sleep(1)
        # Streams: send every request, then read all of them concurrently with a selector.
        sel = selectors.DefaultSelector()
        got_head = 0
        events = 0
        conns = []
        for i in range(a.streams):
            body = json.dumps({"messages": [{"role": "user", "content": "Story %d" % i}],
                               "max_tokens": a.max_tokens, "ignore_eos": True, "stream": True}).encode()
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            s.setblocking(False)
            conns.append(s)
            sel.register(s, selectors.EVENT_READ, {"head": False, "buf": b""})
        t0 = time.time()
        cpu0 = server_cpu_s(srv.pid)
        sample = None
        load = None
        last_sample = time.time()
        prev_cpu = prev_t = None
        while time.time() - t0 < 300:
            for key, _ in sel.select(timeout=0.2):
                d = key.data
                try:
                    chunk = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                events += chunk.count(b"data: ")
                if not d["head"]:
                    d["buf"] += chunk
                    if b"\r\n\r\n" in d["buf"]:
                        d["head"] = d["buf"].startswith(b"HTTP/1.1 200")
                        got_head += d["head"]
                        if not d["head"] and "refused" not in out:
                            out["refused"] = d["buf"][:400].decode(errors="replace")
                        d["buf"] = b""
            # Every 2 s: the streams open now (connected, not finished: streaming, or parked waiting
            # for admission) and the server's state; the sample with the most open streams is kept.
            if time.time() - last_sample > 2:
                last_sample = time.time()
                open_now = len(sel.get_map())
                cpu = server_cpu_s(srv.pid)
                st = state(srv.pid, port, a.probes)
                st["open_streams"] = open_now
                st["streams_with_head_so_far"] = got_head
                st["loadavg"] = open("/proc/loadavg").read().split()[:3]
                if prev_cpu is not None:
                    st["server_cpu_cores"] = round((cpu - prev_cpu) / (time.time() - prev_t), 2)
                prev_cpu, prev_t = cpu, time.time()
                if sample is None or open_now > sample["open_streams"] or (
                        open_now == sample["open_streams"] and "server_cpu_cores" not in sample):
                    sample = st
            if "turn_probe" not in out and (got_head >= a.streams or time.time() - t0 > 120) and a.turn_probes:
                st = {"open_streams": len(sel.get_map()), "streams_with_head_so_far": got_head,
                      "threads": threads(srv.pid), "rss_mb": round(rss_kb(srv.pid) / 1024, 1),
                      "at_s": round(time.time() - t0, 1)}
                out["turn_probe"] = st
                # On its own thread: this one goes on reading the streams meanwhile.
                prober = threading.Thread(target=lambda st=st: st.update(turn_probe(port, a.turn_probes)))
                prober.start()
            if not sel.get_map():
                break
        if "turn_probe" in out:
            prober.join()
        out["with_streams"] = sample
        out["streams_with_head"] = got_head
        out["streams_s"] = round(time.time() - t0, 1)
        out["sse_events_read"] = events
        # The server's CPU (user + system) over the whole streaming phase, per stream and per event.
        cpu_s = server_cpu_s(srv.pid) - cpu0
        out["streams_server_cpu_s"] = round(cpu_s, 2)
        out["server_cpu_ms_per_stream"] = round(cpu_s * 1000 / max(1, a.streams), 1)
        out["server_cpu_us_per_event"] = round(cpu_s * 1e6 / max(1, events), 1)
        out["rss_added_kb_per_stream"] = round((sample["rss_mb"] - out["baseline"]["rss_mb"]) * 1024 / max(1, a.streams), 1)
        for s in conns:
            s.close()
    finally:
        srv.terminate()
        srv.wait(timeout=60)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
