#!/usr/bin/env python3
"""Replays selective-context selection offline on `mnemo bench convkv --eval ... --dump-turns FILE` dumps.

Each dump line holds a conversation's fact turn and every turn's tokens and scores (recency, the
linear keyword share as relevance when dumped with --relevance-temperature 0, information). This
re-runs context::SelectTurns (system prompt and the newest keep_last turns kept, the rest first-fit
in the order of a ranking key, ties to the newer turn) for a few ways of combining the three
factors, and prints, per budget, the share of conversations whose fact turn each keeps, minus
relevance-only's, with the conversations only one of them kept it for, and how many partial
matches (turns with at least half the best share) each keeps besides the fact. A proxy for accuracy (the
recall model answers about 80% of conversations whose fact turn is kept, 7% of the others): used
to discard combinations before serving them (docs/benchmarks-convkv.md, "Combining the factors").

  ./build/apps/mnemo bench convkv --model M --eval SET.jsonl --methods 3-factor --modes exact \\
      --budgets 0.5 --relevance-temperature 0 --dump-turns /tmp/dump.jsonl --json > /dev/null
  /usr/bin/python3 scripts/convkv_replay.py /tmp/dump*.jsonl
"""
import json, math, statistics, sys

WEIGHTS = (0.4, 0.4, 0.2)  # recency, relevance, information: the default preset
FACTORS = ('recency', 'relevance', 'information')


def select(conv, key, budget, keep_last=1):
    toks = conv['turn_tokens']
    n = len(toks)
    left = int(math.floor(budget * sum(toks)))
    keep = [i == 0 or i >= n - keep_last for i in range(n)]
    left -= sum(t for t, k in zip(toks, keep) if k)
    if left < 0:
        return keep
    cand = [i for i in range(n) if not keep[i]]
    k = key(conv, cand)
    for i in sorted(cand, key=lambda i: (-k[i], -i)):
        if toks[i] <= left:
            keep[i] = True
            left -= toks[i]
    return keep


def sharpen(x, t):
    return math.exp((x - 1) / t) * -math.expm1(-x / t) / -math.expm1(-1 / t)


def per_factor(norm):
    """A key that rescales each factor over the candidates with `norm` before the weighted sum."""
    def key(conv, cand):
        out = dict.fromkeys(cand, 0.0)
        for w, f in zip(WEIGHTS, FACTORS):
            v = norm({i: conv['scores'][i][f] for i in cand})
            for i in cand:
                out[i] += w * v[i]
        return out
    return key


def minmax(v):
    lo, hi = min(v.values()), max(v.values())
    return {i: (x - lo) / (hi - lo) if hi > lo else 0.0 for i, x in v.items()}


def zscore(v):
    m, sd = statistics.mean(v.values()), statistics.pstdev(v.values())
    return {i: (x - m) / sd if sd > 0 else 0.0 for i, x in v.items()}


def ranks(v):
    xs = sorted(v.values())
    n = len(xs)
    return {i: (xs.index(x) + n - 1 - xs[::-1].index(x)) / 2 / (n - 1) if n > 1 else 1.0 for i, x in v.items()}


def median_spread(v):
    med, hi = statistics.median(v.values()), max(v.values())
    return {i: max(0.0, (x - med) / (hi - med)) if hi > med else 0.0 for i, x in v.items()}


def sharpened(t):
    def key(conv, cand):
        s = conv['scores']
        return {i: WEIGHTS[0] * s[i]['recency'] + WEIGHTS[1] * sharpen(s[i]['relevance'], t) +
                WEIGHTS[2] * s[i]['information'] for i in cand}
    return key


KEYS = {
    'linear (t = 0)': per_factor(lambda v: v),
    'min-max per factor': per_factor(minmax),
    'z-score per factor': per_factor(zscore),
    'rank per factor': per_factor(ranks),
    '(x - median) / (max - median)': per_factor(median_spread),
    'sharpened t = 0.1': sharpened(0.1),
    'sharpened t = 0.2': sharpened(0.2),
    'sharpened t = 0.3': sharpened(0.3),
}
RELEVANCE_ONLY = lambda conv, cand: {i: conv['scores'][i]['relevance'] for i in cand}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    convs = [json.loads(line) for p in sys.argv[1:] for line in open(p) if line.strip()]
    print('%d conversations; fact turn kept, minus relevance-only (only this / only relevance-only)' % len(convs))
    for name, key in KEYS.items():
        cells = []
        for b in (0.3, 0.5, 0.7):
            a = [select(c, key, b)[c['fact_turn']] for c in convs]
            r = [select(c, RELEVANCE_ONLY, b)[c['fact_turn']] for c in convs]
            cells.append('%.1f %+.3f (%d / %d)' % (b, (sum(a) - sum(r)) / len(convs),
                                                   sum(x and not y for x, y in zip(a, r)),
                                                   sum(y and not x for x, y in zip(a, r))))
        print('%-32s %s' % (name, '  '.join(cells)))
    # Besides the fact: turns holding at least half the best turn's share (partial matches, which
    # may distract the model), kept per conversation that kept the fact (newest turn not counted).
    print('partial matches kept besides the fact, per conversation that kept it')
    for name, key in [('relevance-only', RELEVANCE_ONLY)] + list(KEYS.items()):
        cells = []
        for b in (0.3, 0.5, 0.7):
            n_conv = n_partial = 0
            for c in convs:
                keep = select(c, key, b)
                if not keep[c['fact_turn']]:
                    continue
                n_conv += 1
                n_partial += sum(1 for i in range(1, len(keep) - 1)
                                 if keep[i] and i != c['fact_turn'] and c['scores'][i]['relevance'] >= 0.5)
            cells.append('%.1f %.2f' % (b, n_partial / max(1, n_conv)))
        print('%-32s %s' % (name, '  '.join(cells)))


if __name__ == '__main__':
    main()
