#!/usr/bin/env bash
# Draws PNG charts from benchmark results with gnuplot (Debian: gnuplot-nox) and Node (JSON reading).
#
#   scripts/plot.sh RESULTS.json... --out DIR [--title TEXT] [--users N] [--think S] [--min-samples K] [--log]
#
# RESULTS are `mnemo bench serve --json` or `mnemo bench multiturn --json` outputs (one object, or
# {"runs": [...]} for several modes). A run is named by its "label" (bench serve), else its "mode"
# (bench multiturn), else the file name; runs with the same name, users and think time are repeats
# and are merged by their median. Charts written to DIR (each only when the inputs have its data):
#   ttft_by_turn.png        TTFT p50 by turn index, one line per system
#   throughput_vs_users.png output tokens/s against concurrent users, one line per system (and think time)
#   tier_sources.png        where context tokens came from (t0/t1/t2/recomputed/new), stacked, per run
#   summary.md              a Markdown table: medians over repeats (and their range) per system, users, think
# --users N / --think S keep only runs with that concurrency / mean think time; --min-samples K drops
# turn indices fewer than K requests reached (default 3); --log draws TTFT on a log scale.
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
out="" title="" users="" think="" min_samples=3 log=0
files=()
while (($#)); do
  case "$1" in
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --title) title="${2?}"; shift 2 ;;
    --users) users="${2:?}"; shift 2 ;;
    --think) think="${2:?}"; shift 2 ;;
    --min-samples) min_samples="${2:?}"; shift 2 ;;
    --log) log=1; shift ;;
    -h|--help) usage ;;
    -*) echo "plot.sh: unknown option $1" >&2; usage ;;
    *) files+=("$1"); shift ;;
  esac
done
[[ -n "$out" && ${#files[@]} -gt 0 ]] || usage
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 1; }
command -v node >/dev/null || { echo "plot.sh: node not found (apt-get install nodejs)" >&2; exit 1; }
for f in "${files[@]}"; do [[ -r "$f" ]] || { echo "plot.sh: cannot read $f" >&2; exit 1; }; done
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Step 1 (Node): read the results, filter, merge repeats, write gnuplot data blocks and a manifest.
node - "$tmp" "$users" "$think" "$min_samples" "${files[@]}" <<'JS'
const fs = require('fs');
const path = require('path');
const [dir, wantUsers, wantThink, minSamples, ...files] = process.argv.slice(2);
const median = (v) => {
  const s = v.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (!s.length) return NaN;
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};
const runs = [];
for (const f of files) {
  let j;
  if (fs.statSync(f).size === 0) { console.error(`plot.sh: skipping empty ${f}`); continue; }
  try { j = JSON.parse(fs.readFileSync(f, 'utf8').trim().split('\n').pop()); } catch (e) {
    console.error(`plot.sh: ${f} is not a JSON result (${e.message})`); process.exit(1);
  }
  const list = Array.isArray(j.runs) ? j.runs : [j];
  const base = path.basename(f).replace(/\.json$/, '');
  for (const r of list) {
    runs.push({
      name: r.label || (r.mode ? (list.length > 1 || !j.label ? r.mode : j.label) : base),
      users: Number(r.users ?? 0),
      think: Number(r.think_time_s ?? r.think_time ?? NaN),
      r,
    });
  }
}
const kept = runs.filter((x) => (wantUsers === '' || x.users === Number(wantUsers)) &&
                                (wantThink === '' || x.think === Number(wantThink)));
if (!kept.length) { console.error('plot.sh: no run matches the filters'); process.exit(1); }
const distinct = (k) => new Set(kept.map((x) => x[k])).size;
const multiUsers = distinct('users') > 1;
const multiThink = distinct('think') > 1 && kept.every((x) => Number.isFinite(x.think));
const key = (x, withUsers) => x.name + (withUsers && multiUsers ? `, ${x.users} user${x.users === 1 ? '' : 's'}` : '') +
                             (multiThink ? `, think ${x.think} s` : '');
const group = (withUsers) => {
  const m = new Map();
  for (const x of kept) {
    const k = key(x, withUsers);
    if (!m.has(k)) m.set(k, []);
    m.get(k).push(x);
  }
  return m;
};
const q = (s) => '"' + s.replace(/"/g, "'") + '"';
const manifest = {};

// TTFT p50 by turn index (x = turn number, 1 = first turn).
let blocks = [];
for (const [k, xs] of group(true)) {
  const withData = xs.filter((x) => Array.isArray(x.r.ttft_ms_p50_by_turn));
  if (!withData.length) continue;
  const n = Math.max(...withData.map((x) => x.r.ttft_ms_p50_by_turn.length));
  const lines = [];
  for (let t = 0; t < n; t++) {
    const counts = withData.map((x) => (x.r.requests_by_turn || x.r.turns_by_turn_index || [])[t] ?? Infinity);
    if (median(counts) < Number(minSamples)) continue;
    const v = median(withData.map((x) => x.r.ttft_ms_p50_by_turn[t]));
    if (Number.isFinite(v) && v > 0) lines.push(`${t + 1} ${v}`);
  }
  if (lines.length) blocks.push(`${q(k)} ${q('')}\n` + lines.join('\n'));
}
if (blocks.length) {
  fs.writeFileSync(path.join(dir, 'ttft.dat'), blocks.join('\n\n\n') + '\n');
  manifest.ttft = blocks.length;
}

// Output throughput against users (closed-loop runs only), one line per system and think time.
const series = new Map();
for (const x of kept) {
  if (!(x.users > 0) || !Number.isFinite(x.r.throughput_output_tokens_per_s)) continue;
  const k = key(x, false);
  if (!series.has(k)) series.set(k, new Map());
  const byU = series.get(k);
  if (!byU.has(x.users)) byU.set(x.users, []);
  byU.get(x.users).push(x.r.throughput_output_tokens_per_s);
}
blocks = [];
for (const [k, byU] of series) {
  if (byU.size < 2) continue;
  const lines = [...byU.entries()].sort((a, b) => a[0] - b[0]).map(([u, v]) => `${u} ${median(v)}`);
  blocks.push(`${q(k)} ${q('')}\n` + lines.join('\n'));
}
if (blocks.length) {
  fs.writeFileSync(path.join(dir, 'throughput.dat'), blocks.join('\n\n\n') + '\n');
  manifest.throughput = blocks.length;
}

// Context tokens by source, summed over repeats, as % of all context tokens.
const SRC = ['t0', 't1', 't2', 'recomputed', 'new'];
const rows = [];
for (const [k, xs] of group(true)) {
  const withSrc = xs.filter((x) => x.r.tokens_by_source && typeof x.r.tokens_by_source === 'object');
  if (!withSrc.length) continue;
  const sum = SRC.map((s) => withSrc.reduce((a, x) => a + Number(x.r.tokens_by_source[s] || 0), 0));
  const total = sum.reduce((a, b) => a + b, 0);
  if (total > 0) rows.push(`${q(k)} ` + sum.map((v) => ((100 * v) / total).toFixed(3)).join(' '));
}
if (rows.length) {
  fs.writeFileSync(path.join(dir, 'sources.dat'), '"run" "T0 hit" "T1 hit" "T2 hit" "recomputed" "new"\n' + rows.join('\n') + '\n');
  manifest.sources = rows.length;
}
// A Markdown table of the headline figures: median over repeats, with the range (min-max).
const fmt = (v, d) => (Number.isFinite(v) ? v.toFixed(d) : '-');
const cell = (xs, f, d) => {
  const v = xs.map(f).filter(Number.isFinite);
  if (!v.length) return '-';
  const lo = Math.min(...v), hi = Math.max(...v);
  return fmt(median(v), d) + (v.length > 1 ? ` (${fmt(lo, d)}-${fmt(hi, d)})` : '');
};
const table = ['| system | users | think (s) | runs | output tok/s | TTFT p50 (ms) | TTFT p90 (ms) | ITL p50 (ms) | cached % | errors | load avg |',
               '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |'];
const byConfig = new Map();
for (const x of kept) {
  const k = JSON.stringify([x.name, x.users, x.think]);
  if (!byConfig.has(k)) byConfig.set(k, []);
  byConfig.get(k).push(x);
}
const sorted = [...byConfig.entries()].sort((a, b) => {
  const [na, ua, ta] = JSON.parse(a[0]), [nb, ub, tb] = JSON.parse(b[0]);
  return ta - tb || ua - ub || na.localeCompare(nb);
});
for (const [k, xs] of sorted) {
  const [name, u, t] = JSON.parse(k);
  const load = xs.flatMap((x) => (x.r.load_average ? [x.r.load_average.start, x.r.load_average.end] : []));
  table.push(`| ${name} | ${u} | ${Number.isFinite(t) ? t : '-'} | ${xs.length} | ` +
    `${cell(xs, (x) => x.r.throughput_output_tokens_per_s, 1)} | ${cell(xs, (x) => x.r.ttft_ms?.p50, 0)} | ` +
    `${cell(xs, (x) => x.r.ttft_ms?.p90, 0)} | ${cell(xs, (x) => x.r.itl_ms?.p50, 1)} | ` +
    `${cell(xs, (x) => 100 * (x.r.cache_hit_rate ?? NaN), 1)} | ${xs.reduce((a, x) => a + Number(x.r.errors || 0), 0)} | ` +
    `${load.length ? fmt(median(load), 2) : '-'} |`);
}
fs.writeFileSync(path.join(dir, 'summary.md'), table.join('\n') + '\n');
fs.writeFileSync(path.join(dir, 'manifest'), Object.entries(manifest).map(([k, v]) => `${k}=${v}`).join('\n') + '\n');
JS

# Step 2 (gnuplot): one PNG per chart the manifest lists.
declare -A have=()
while IFS='=' read -r k v; do [[ -n "$k" ]] && have[$k]=$v; done < "$tmp/manifest"
prefix="${title:+$title: }"
common="set terminal pngcairo size 1000,600 font 'DejaVu Sans,11' noenhanced
set grid lc rgb '#dddddd'
set key outside right top box opaque width 2
set border lc rgb '#555555'
set linetype 1 lc rgb '#2563eb' lw 2 pt 7 ps 0.8
set linetype 2 lc rgb '#dc2626' lw 2 pt 5 ps 0.8
set linetype 3 lc rgb '#16a34a' lw 2 pt 9 ps 0.9
set linetype 4 lc rgb '#d97706' lw 2 pt 11 ps 0.9
set linetype 5 lc rgb '#9333ea' lw 2 pt 13 ps 0.9
set linetype 6 lc rgb '#0891b2' lw 2 pt 4 ps 0.8
set linetype 7 lc rgb '#4b5563' lw 2 pt 6 ps 0.8
set linetype 8 lc rgb '#db2777' lw 2 pt 8 ps 0.8
set linetype cycle 8"
written=()

if [[ -n "${have[ttft]:-}" ]]; then
  gnuplot <<EOF
$common
set output '$out/ttft_by_turn.png'
set title '${prefix}time to first token by turn (median of p50 over repeats)'
set xlabel 'turn of the conversation (1 = first)'
set ylabel 'TTFT p50 (ms)'
set xtics 1
set yrange [0:*]
$( ((log)) && echo "set logscale y; set yrange [*:*]" )
plot for [i=0:${have[ttft]}-1] '$tmp/ttft.dat' index i using 1:2 with linespoints title columnheader(1)
EOF
  written+=("$out/ttft_by_turn.png")
fi

if [[ -n "${have[throughput]:-}" ]]; then
  gnuplot <<EOF
$common
set output '$out/throughput_vs_users.png'
set title '${prefix}output throughput against concurrency (median over repeats)'
set xlabel 'concurrent users (closed loop)'
set ylabel 'output tokens/s'
set yrange [0:*]
set logscale x 2
plot for [i=0:${have[throughput]}-1] '$tmp/throughput.dat' index i using 1:2 with linespoints title columnheader(1)
EOF
  written+=("$out/throughput_vs_users.png")
fi

if [[ -n "${have[sources]:-}" ]]; then
  gnuplot <<EOF
$common
set output '$out/tier_sources.png'
set title '${prefix}where context tokens came from'
set ylabel '% of context tokens'
set yrange [0:100]
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border lc rgb '#ffffff'
set boxwidth 0.6
set xtics rotate by 25 right
set bmargin 7
set key outside right top box opaque reverse Left invert
set linetype 1 lc rgb '#2563eb'
set linetype 2 lc rgb '#16a34a'
set linetype 3 lc rgb '#d97706'
set linetype 4 lc rgb '#dc2626'
set linetype 5 lc rgb '#9ca3af'
plot for [c=2:6] '$tmp/sources.dat' using c:xtic(1) title columnheader(c)
EOF
  written+=("$out/tier_sources.png")
fi

cp "$tmp/summary.md" "$out/summary.md"
if ((${#written[@]} == 0)); then
  echo "plot.sh: the inputs have nothing to plot (need ttft_ms_p50_by_turn, several users values, or tokens_by_source)" >&2
  exit 1
fi
printf '%s\n' "${written[@]}" "$out/summary.md"
