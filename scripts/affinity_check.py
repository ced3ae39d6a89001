#!/usr/bin/python3
"""Counts conversations that HAProxy split across replicas (docs/deploy.md, the nbthread choice).

Sends N conversations one after another through a front running deploy/haproxy.cfg, each TURNS
Responses API turns chained by previous_response_id (and N chat completions conversations resending
their history), and reads X-Mnemo-Served-By on every answer. A conversation is split when not all of
its turns were answered by one replica. Prints one JSON object.

  /usr/bin/python3 scripts/affinity_check.py --url http://127.0.0.1:8080 [--conversations 100] [--turns 3]
"""
import argparse
import collections
import json
import urllib.request


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.headers.get("X-Mnemo-Served-By", ""), json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--conversations", type=int, default=100)
    ap.add_argument("--turns", type=int, default=3)
    a = ap.parse_args()
    split = {"responses": 0, "chat": 0}
    per_replica = collections.Counter()
    for i in range(a.conversations):
        served, prev = set(), None
        for t in range(a.turns):
            body = {"model": "m", "input": f"Conversation {i}, turn {t}: tell me more.", "max_output_tokens": 4,
                    "temperature": 0}
            if prev:
                body["previous_response_id"] = prev
            s, r = post(a.url, "/v1/responses", body)
            served.add(s)
            per_replica[s] += 1
            prev = r["id"]
        split["responses"] += len(served) > 1
        served, messages = set(), [{"role": "user", "content": f"Conversation {i}: once upon a time"}]
        for t in range(a.turns):
            s, r = post(a.url, "/v1/chat/completions", {"model": "m", "messages": messages, "max_tokens": 4,
                                                        "temperature": 0})
            served.add(s)
            per_replica[s] += 1
            messages += [r["choices"][0]["message"], {"role": "user", "content": f"turn {t}: and then?"}]
        split["chat"] += len(served) > 1
    print(json.dumps({"conversations": a.conversations, "turns": a.turns, "split": split,
                      "turns_per_replica": dict(sorted(per_replica.items()))}))


if __name__ == "__main__":
    main()
