#!/usr/bin/env python3
"""Paired statistics for the selection-method ordering of `mnemo bench convkv --eval --json`.

Every method answers the same conversations, so the gap between two methods is measured on pairs:
per conversation, method A right and B wrong (b), A wrong and B right (c). For each gap (A vs B),
budget and mode this prints
  - the accuracy difference A - B per set and over all sets (conversations pooled),
  - a 95% paired bootstrap interval of the pooled difference (conversations resampled with
    replacement within each set, 20,000 resamples, fixed seed: reruns give the same interval),
  - the exact two-sided sign (McNemar) test on the pooled discordant pairs: p = P(min(b, c) or
    fewer of b + c fair coin flips land on one side) * 2.
"A > B beyond the spread" = the interval lies above 0 and the sign test gives p < 0.05 (beside
it: the difference per set; "A < B" is the mirror case). The bench itself is deterministic
(greedy decoding; `random`'s choice is seeded), so a rerun of one set gives the same answers: the
run-to-run spread is the spread over conversations, which the bootstrap measures, and the spread
over sets, which the per-set column shows.
"A >= B" (the target's 3-factor >= relevance-only) is read as non-inferiority: the interval's lower
end is above -0.01 (one answer in a hundred, the margin the issue grants reuse against exact mode).

  /usr/bin/python3 scripts/convkv_stats.py docs/results/convkv/recall_k1_seed*.json
  /usr/bin/python3 scripts/convkv_stats.py A.json B.json --extra F.json --json-out stats.json

--extra FILE (repeatable): a run with other 3-factor weights on the same eval set (matched by its
`eval` path); its 3-factor rows join as method `3-factor/<preset>` (`3-factor/<preset>/t<T>` when
the run records its relevance_temperature), so gaps such as 3-factor/factual vs relevance, or
3-factor vs 3-factor/default/t0 (the linear keyword share), can be asked for with --gap.
Needs numpy (/usr/bin/python3 has it).
"""
import argparse, json, math, sys

import numpy as np

DEFAULT_GAPS = [('3-factor', 'relevance'), ('relevance', 'recency'), ('recency', 'random')]


def load(paths, extras):
    sets = []
    for p in paths:
        d = json.load(open(p))
        rows = {}
        for r in d['rows']:
            if 'correct_per_conversation' not in r:
                sys.exit('error: %s has no per-conversation outcomes (rerun the bench)' % p)
            rows[(r['method'], r['budget'], r['mode'])] = np.frombuffer(
                r['correct_per_conversation'].encode(), dtype=np.uint8) - ord('0')
        sets.append(dict(path=p, eval=d['eval'], n=d['conversations'], rows=rows))
    for p in extras:
        d = json.load(open(p))
        match = [s for s in sets if s['eval'] == d['eval'] and s['n'] == d['conversations']]
        if len(match) != 1:
            sys.exit('error: --extra %s: no single main file evaluates %s' % (p, d['eval']))
        name = '3-factor/' + d['preset']
        if 'relevance_temperature' in d:  # runs since 2026-12-03 say how keyword relevance was sharpened
            name += '/t%g' % d['relevance_temperature']
        for r in d['rows']:
            if r['method'] == '3-factor':
                key = (name, r['budget'], r['mode'])
                match[0]['rows'][key] = np.frombuffer(r['correct_per_conversation'].encode(),
                                                      dtype=np.uint8) - ord('0')
    return sets


def sign_test_p(b, c):
    """Exact two-sided binomial test of b successes in b + c fair trials (McNemar, exact)."""
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2 * tail)


def gap(sets, a, b, budget, mode, rng, resamples):
    diffs = []  # per set: [n] of -1 / 0 / +1
    for s in sets:
        ka, kb = (a, budget, mode), (b, budget, mode)
        if ka not in s['rows'] or kb not in s['rows']:
            return None
        diffs.append(s['rows'][ka].astype(np.int32) - s['rows'][kb].astype(np.int32))
    pooled = np.concatenate(diffs)
    boot = np.zeros(resamples)
    total = len(pooled)
    for d in diffs:  # stratified: each set resampled within itself
        idx = rng.integers(0, len(d), size=(resamples, len(d)))
        boot += d[idx].sum(axis=1)
    boot /= total
    lo, hi = np.percentile(boot, [2.5, 97.5])
    nb, nc = int((pooled == 1).sum()), int((pooled == -1).sum())
    per_set = [float(d.mean()) for d in diffs]
    return dict(a=a, b=b, budget=budget, mode=mode, diff=float(pooled.mean()), ci95=[float(lo), float(hi)],
                a_only=nb, b_only=nc, sign_test_p=sign_test_p(nb, nc), per_set=per_set,
                sets_same_sign=sum(1 for x in per_set if x > 0) if pooled.mean() > 0 else
                sum(1 for x in per_set if x < 0),
                beyond_spread=bool(lo > 0 and sign_test_p(nb, nc) < 0.05),
                below_beyond_spread=bool(hi < 0 and sign_test_p(nb, nc) < 0.05),
                at_least=bool(lo > -0.01))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('files', nargs='+')
    ap.add_argument('--extra', action='append', default=[])
    ap.add_argument('--gap', action='append', default=[], help='A:B (default: the ordering gaps)')
    ap.add_argument('--modes', nargs='+', default=['exact', 'reuse'])
    ap.add_argument('--resamples', type=int, default=20000)
    ap.add_argument('--json-out')
    a = ap.parse_args()
    sets = load(a.files, a.extra)
    gaps = [tuple(g.split(':', 1)) for g in a.gap] or DEFAULT_GAPS
    budgets = sorted({k[1] for s in sets for k in s['rows'] if k[0] != 'full'})
    rng = np.random.default_rng(20261202)
    out = []
    print('%d sets, %s conversations' % (len(sets), '+'.join(str(s['n']) for s in sets)))
    print('| gap | budget | mode | difference (pooled) | 95% bootstrap interval | A only / B only right '
          '| sign test p | per set | beyond spread | A >= B (lower end > -0.01) |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    for mode in a.modes:
        for budget in budgets:
            for ga, gb in gaps:
                g = gap(sets, ga, gb, budget, mode, rng, a.resamples)
                if g is None:
                    continue
                out.append(g)
                print('| %s vs %s | %.1f | %s | %+.3f | [%+.3f, %+.3f] | %d / %d | %.2g | %s | %s | %s |' % (
                    ga, gb, budget, mode, g['diff'], g['ci95'][0], g['ci95'][1], g['a_only'], g['b_only'],
                    g['sign_test_p'], ' '.join('%+.3f' % x for x in g['per_set']),
                    'A > B' if g['beyond_spread'] else 'A < B' if g['below_beyond_spread'] else 'no',
                    'yes' if g['at_least'] else 'no'))
    if a.json_out:
        with open(a.json_out, 'w') as fh:
            json.dump(dict(files=a.files, extra=a.extra, resamples=a.resamples, gaps=out), fh, indent=1)
            fh.write('\n')


if __name__ == '__main__':
    main()
