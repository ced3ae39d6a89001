// `mnemo bench serve` end to end: against a real mnemo serve (chat and responses APIs) and against
// a stand-in for llama-server's /completion stream (this file), checking the JSON and CSV it writes.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { env, startServer } from './server.mjs';

const { bin } = env();
// A small workload: 3 conversations of up to 4 turns, short messages, no think time.
const WORKLOAD = ['--conversations', '3', '--max-turns', '4', '--mean-turns', '3', '--input-median', '12',
  '--output-median', '8', '--system-tokens', '16', '--think-time', '0', '--users', '2'];

function bench(args) {
  return new Promise((resolve) => {
    execFile(bin, ['bench', 'serve', ...args], { timeout: 60000 }, (err, stdout, stderr) =>
      resolve({ code: err ? err.code : 0, stdout, stderr }));
  });
}

function readCsv(path) {
  const [head, ...rows] = readFileSync(path, 'utf8').trim().split('\n');
  const cols = head.split(',');
  return rows.map((r) => {
    const cells = r.split(',');
    return Object.fromEntries(cols.map((c, i) => [c, c === 'error' ? cells.slice(i).join(',') : Number(cells[i])]));
  });
}

// Checks shared by every API: no errors, forced lengths, growing prompts, consistent timings.
function checkRun(j, rows) {
  assert.equal(j.errors, 0, JSON.stringify(j.error_messages));
  assert.equal(j.requests, rows.length);
  assert.ok(j.requests >= 3, 'at least one request per conversation');
  assert.equal(j.requests_by_turn.reduce((a, b) => a + b, 0), j.requests);
  assert.equal(j.ttft_ms_p50_by_turn.length, j.requests_by_turn.length);
  assert.equal(j.output_tokens, rows.reduce((a, r) => a + r.completion_tokens, 0));
  assert.ok(j.throughput_output_tokens_per_s > 0);
  for (const r of rows) {
    assert.equal(r.error, '""');
    assert.equal(r.completion_tokens, r.planned_output_tokens, `forced length, conversation ${r.conversation}`);
    assert.ok(r.ttft_ms > 0 && r.ttft_ms <= r.latency_ms, `ttft ${r.ttft_ms} latency ${r.latency_ms}`);
  }
  for (const r of rows.filter((x) => x.turn > 0)) {
    const prev = rows.find((x) => x.conversation === r.conversation && x.turn === r.turn - 1);
    assert.ok(r.prompt_tokens > prev.prompt_tokens + prev.completion_tokens - 2,
      `turn ${r.turn} of ${r.conversation} carries the history: ${r.prompt_tokens} after ${prev.prompt_tokens}`);
  }
}

let server;
before(async () => { server = await startServer(); });
after(async () => { await server.stop(); });

for (const api of ['chat', 'responses']) {
  test(`${api} API against mnemo serve: later turns hit the cache`, async () => {
    const csv = join(server.dir, `${api}.csv`);
    const r = await bench(['--url', server.url, '--api', api, '--label', `mnemo ${api}`, '--json', '--csv', csv,
      '--seed', api === 'chat' ? '11' : '12', ...WORKLOAD]);
    assert.equal(r.code, 0, r.stderr);
    const j = JSON.parse(r.stdout);
    assert.equal(j.label, `mnemo ${api}`);
    assert.equal(j.api, api);
    const rows = readCsv(csv);
    checkRun(j, rows);
    for (const row of rows.filter((x) => x.turn > 0)) {
      const prev = rows.find((x) => x.conversation === row.conversation && x.turn === row.turn - 1);
      assert.ok(row.cached_tokens >= prev.prompt_tokens - 32,
        `turn ${row.turn} of ${row.conversation}: cached ${row.cached_tokens} of the previous ${prev.prompt_tokens}`);
    }
    if (api === 'chat') {
      const s = j.tokens_by_source;
      assert.equal(s.t0 + s.t1 + s.t2 + s.recomputed + s.new, j.prompt_tokens, 'sources add up to the context');
    }
  });
}

test('llamacpp API: full prompts with cache_prompt and slots, stream parsed', async () => {
  // A stand-in for llama-server's POST /completion: checks the request, streams n_predict tokens.
  const bodies = [];
  const fake = createServer((req, res) => {
    let data = '';
    req.on('data', (d) => { data += d; });
    req.on('end', () => {
      const b = JSON.parse(data);
      bodies.push(b);
      res.writeHead(200, { 'Content-Type': 'text/event-stream' });
      const words = b.prompt.split(/\s+/).length;
      for (let i = 0; i < b.n_predict; i++) res.write(`data: ${JSON.stringify({ content: ' tok', stop: false })}\n\n`);
      res.end(`data: ${JSON.stringify({ content: '', stop: true, tokens_predicted: b.n_predict, tokens_evaluated: words,
        timings: { cache_n: words - 5, prompt_n: 5 } })}\n\n`);
    });
  });
  await new Promise((r) => fake.listen(0, '127.0.0.1', r));
  try {
    const csv = join(server.dir, 'llamacpp.csv');
    const r = await bench(['--url', `http://127.0.0.1:${fake.address().port}`, '--api', 'llamacpp', '--slots', '2',
      '--json', '--csv', csv, ...WORKLOAD]);
    assert.equal(r.code, 0, r.stderr);
    const j = JSON.parse(r.stdout);
    checkRun(j, readCsv(csv));
    for (const b of bodies) {
      assert.equal(b.cache_prompt, true);
      assert.equal(b.ignore_eos, true);
      assert.equal(b.stream, true);
      assert.ok(b.id_slot === 0 || b.id_slot === 1, `slot ${b.id_slot}`);
      assert.match(b.prompt, /^System: .*\n\nUser: [^]*\n\nAssistant:$/);
    }
    // The second turn's prompt is the first one plus the reply and the new message.
    const second = bodies.find((b) => (b.prompt.match(/\n\nUser: /g) || []).length === 2);
    assert.ok(second, 'some conversation reached a second turn');
    assert.match(second.prompt, /Assistant:( tok)+\n\nUser: /);
    assert.ok(j.cached_tokens > 0 && j.cache_hit_rate > 0 && j.cache_hit_rate < 1);
  } finally {
    fake.close();
  }
});

test('odd but well-formed stream events are tolerated', async () => {
  // A chat server stand-in whose events miss or mistype every optional field.
  const fake = createServer((req, res) => {
    let data = '';
    req.on('data', (d) => { data += d; });
    req.on('end', () => {
      const b = JSON.parse(data);
      res.writeHead(200, { 'Content-Type': 'text/event-stream' });
      const events = [{ choices: [{ delta: { role: 'assistant' } }] }, { choices: [5] }, { choices: 'x' }, { usage: 7 },
        { choices: [{ delta: null }] }, { choices: [{ delta: { content: 3 } }] }, { other: true }];
      for (let i = 0; i < b.max_tokens; i++) events.push({ choices: [{ delta: { content: ' w' } }] });
      events.push({ choices: [{ delta: {}, finish_reason: 'length' }] });
      events.push({ choices: [], usage: { prompt_tokens: 'many', prompt_tokens_details: 4, mnemo_tokens_by_source: [] } });
      for (const e of events) res.write(`data: ${JSON.stringify(e)}\r\n\r\n`);
      res.end('data: [DONE]\n\n');
    });
  });
  await new Promise((r) => fake.listen(0, '127.0.0.1', r));
  try {
    const r = await bench(['--url', `http://127.0.0.1:${fake.address().port}`, '--api', 'chat', '--model-name', 'm',
      '--json', ...WORKLOAD]);
    assert.equal(r.code, 0, r.stderr);
    const j = JSON.parse(r.stdout);
    assert.equal(j.errors, 0, JSON.stringify(j.error_messages));
    assert.ok(j.requests >= 3);
    assert.equal(j.prompt_tokens, 0, 'no usable usage was reported');
    assert.equal(j.tokens_by_source, undefined);
  } finally {
    fake.close();
  }
});

test('refuses a server that is not on this machine', async () => {
  const r = await bench(['--url', 'http://192.0.2.1:8080', '--conversations', '1']);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /refused: bench serve only targets a server on this machine/);
});
