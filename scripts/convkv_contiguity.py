#!/usr/bin/env python3
"""Does recency differ from random only by which turns hold the fact? (docs/benchmarks-convkv.md)

Recency keeps a nearly contiguous run of the newest turns, random a scattered subset. From the
per-conversation outcomes of `mnemo bench convkv --eval --json` runs (`correct_per_conversation`,
`fact_kept_per_conversation`) this prints, per budget (exact mode, conversations pooled over the
runs): how often each kept the fact turn (with the exact sign test on the conversations only one
of them kept it for), accuracy when the fact turn was kept (recency, recent-only, random), and, on
the conversations where both recency and random kept it, how many only one of them answered. If a
contiguous history helped the model, recency would answer more of those.

  /usr/bin/python3 scripts/convkv_contiguity.py docs/results/convkv/recall_k1_seed{12345,1,2,3}.json
"""
import json, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from convkv_stats import sign_test_p  # noqa: E402


def outcomes(path, mode):
    out = {}
    for r in json.load(open(path))['rows']:
        if r['mode'] == mode:
            bits = lambda s: [c == '1' for c in s]
            out[(r['method'], r['budget'])] = (bits(r['correct_per_conversation']),
                                               bits(r['fact_kept_per_conversation']))
    return out


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    runs = [outcomes(p, 'exact') for p in sys.argv[1:]]
    budgets = sorted({b for r in runs for (m, b) in r if m == 'recency'})
    print('| budget | fact kept: recency / random (only rec / only rand, p) | accuracy when kept: recency / '
          'recent-only / random | both kept: only recency right / only random right (p) | accuracy when dropped: '
          'recency / random |')
    print('| --- | --- | --- | --- | --- |')
    for b in budgets:
        def pooled(m):
            c, k = [], []
            for r in runs:
                c += r[(m, b)][0]
                k += r[(m, b)][1]
            return c, k
        rc, rk = pooled('recency')
        oc, ok = pooled('recent-only')
        xc, xk = pooled('random')
        acc = lambda c, k, want: sum(x for x, y in zip(c, k) if y == want) / max(1, sum(1 for y in k if y == want))
        only_rk = sum(a and not b_ for a, b_ in zip(rk, xk))
        only_xk = sum(b_ and not a for a, b_ in zip(rk, xk))
        both = [i for i in range(len(rk)) if rk[i] and xk[i]]
        only_rc = sum(1 for i in both if rc[i] and not xc[i])
        only_xc = sum(1 for i in both if xc[i] and not rc[i])
        n = len(rk)
        print('| %.1f | %.3f / %.3f (%d / %d, p %.2g) | %.3f / %.3f / %.3f | %d / %d of %d (p %.2g) | %.3f / %.3f |' % (
            b, sum(rk) / n, sum(xk) / n, only_rk, only_xk, sign_test_p(only_rk, only_xk),
            acc(rc, rk, True), acc(oc, ok, True), acc(xc, xk, True), only_rc, only_xc, len(both),
            sign_test_p(only_rc, only_xc), acc(rc, rk, False), acc(xc, xk, False)))


if __name__ == '__main__':
    main()
