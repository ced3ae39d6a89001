#!/usr/bin/env python3
"""Charts and tables for docs/benchmarks-convkv.md from `mnemo bench convkv --eval ... --json` runs.

  /usr/bin/python3 scripts/convkv_charts.py RUN.json... --out docs/img [--name convkv] [--label TEXT]

Each RUN is one evaluation set (e.g. eval.jsonl and make-more sets by scripts/recall_evalset.py).
Writes, standard library only:
  <name>_accuracy_<mode>.svg  accuracy against budget per method (mean over the runs, error bars
                              from the lowest to the highest run), the full-context accuracy as a
                              dashed line; one chart per mode (exact, reuse)
and prints a Markdown table: per method, budget and mode the mean over runs of accuracy, fact_kept,
prefill_fraction and the median TTFT and scoring cost, with the run-to-run range of accuracy.
"""
import argparse, json, os, sys
from collections import defaultdict

COLORS = {'3-factor': '#d62728', 'relevance': '#1f77b4', 'recency': '#2ca02c',
          'recent-only': '#9467bd', 'random': '#7f7f7f'}


def load(paths):
    runs = [json.load(open(p)) for p in paths]
    rows = defaultdict(list)  # (method, budget, mode) -> [row per run]
    for r in runs:
        for row in r['rows']:
            rows[(row['method'], row['budget'], row['mode'])].append(row)
    return runs, rows


def mean(v):
    return sum(v) / len(v)


def chart(rows, mode, path, label=''):
    W, H, L, R, T, B = 560, 360, 60, 130, 30, 45
    budgets = sorted({k[1] for k in rows if k[0] != 'full'})
    xs = lambda b: L + (b - 0.2) / (0.8 - 0.2) * (W - L - R)
    ys = lambda a: T + (1 - a) * (H - T - B)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">' % (W, H),
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="18" font-size="14">Answer accuracy against budget (%s mode%s)</text>' % (L, mode, label)]
    for a in [0, 0.2, 0.4, 0.6, 0.8, 1.0]:
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/>' % (L, W - R, ys(a), ys(a)))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.1f</text>' % (L - 6, ys(a) + 4, a))
    for b in budgets:
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%.1f</text>' % (xs(b), H - B + 16, b))
    out.append('<text x="%d" y="%d" text-anchor="middle">budget (share of history tokens)</text>' % ((L + W - R) // 2, H - 8))
    out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>' % (L, W - R, H - B, H - B))
    out.append('<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black"/>' % (L, L, T, H - B))
    full = rows.get(('full', 1.0, 'exact'))
    if full:
        a = mean([r['accuracy'] for r in full])
        out.append('<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="black" stroke-dasharray="5,4"/>' % (L, W - R, ys(a), ys(a)))
        out.append('<text x="%d" y="%.1f">full %.3f</text>' % (W - R + 6, ys(a) + 4, a))
    for i, (m, color) in enumerate(COLORS.items()):
        pts = []
        for b in budgets:
            rs = rows.get((m, b, mode))
            if not rs:
                continue
            acc = [r['accuracy'] for r in rs]
            pts.append((xs(b), ys(mean(acc)), ys(min(acc)), ys(max(acc))))
        if not pts:
            continue
        dx = (i - 2) * 3  # spread overlapping markers a little
        out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>' % (color, ' '.join('%.1f,%.1f' % (x + dx, y) for x, y, _, _ in pts)))
        for x, y, lo, hi in pts:
            out.append('<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s"/>' % (x + dx, x + dx, lo, hi, color))
            out.append('<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>' % (x + dx, y, color))
        out.append('<rect x="%d" y="%d" width="12" height="3" fill="%s"/><text x="%d" y="%d">%s</text>' % (W - R + 6, 60 + 18 * i, color, W - R + 22, 65 + 18 * i, m))
    out.append('</svg>')
    open(path, 'w').write('\n'.join(out) + '\n')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('runs', nargs='+')
    ap.add_argument('--out', required=True)
    ap.add_argument('--name', default='convkv', help='file name prefix of the charts')
    ap.add_argument('--label', default='', help="added to the title, e.g. 'geometric fact distance'")
    a = ap.parse_args()
    runs, rows = load(a.runs)
    os.makedirs(a.out, exist_ok=True)
    for mode in ['exact', 'reuse']:
        if any(k[2] == mode and k[0] != 'full' for k in rows):
            chart(rows, mode, os.path.join(a.out, '%s_accuracy_%s.svg' % (a.name, mode)),
                  ', ' + a.label if a.label else '')
    n = [r['conversations'] for r in runs]
    print('%d runs (%s conversations), keep_last %s, relevance %s\n' % (len(runs), '+'.join(map(str, n)), runs[0].get('keep_last'), runs[0].get('relevance')))
    print('| method | budget | mode | accuracy (mean) | range over runs | fact kept | prefill computed | selected | TTFT ms (median) | scoring ms/turn |')
    print('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')
    order = {m: i for i, m in enumerate(['full'] + list(COLORS))}
    for k in sorted(rows, key=lambda k: (k[1] if k[0] != 'full' else 0, order.get(k[0], 9), k[2])):
        rs = rows[k]
        acc = [r['accuracy'] for r in rs]
        print('| %s | %.1f | %s | %.3f | %.3f-%.3f | %.3f | %.3f | %.3f | %.2f | %.3f |' % (
            k[0], k[1], k[2], mean(acc), min(acc), max(acc), mean([r['fact_kept'] for r in rs]),
            mean([r['prefill_fraction'] for r in rs]), mean([r['selected_fraction'] for r in rs]),
            mean([r['ttft_ms_median'] for r in rs]), mean([r['scoring_ms_per_turn_median'] for r in rs])))


if __name__ == '__main__':
    main()
