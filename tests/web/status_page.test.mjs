// The live status page of mnemo serve in a real browser (headless Debian Chromium driven by
// playwright-core): it loads with its charts and no console errors, and its numbers move while
// a small chat load runs against the same server. The server has a --replica-id, which the page
// shows, and, when the ctest Redis fixture runs (MNEMO_REDIS_URL_FILE), a remote KV tier, whose
// figures the page shows.
//
// Run directly with node (ctest does): exits 77 (ctest: skipped) with a message when Chromium or
// node_modules is missing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startServer } from './server.mjs';

const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';

function skip(why) {
  console.log(`SKIPPED: ${why}`);
  process.exit(77);
}
if (!existsSync(CHROMIUM)) skip(`no Chromium at ${CHROMIUM} (apt-get install chromium, or set CHROMIUM_BIN)`);
let chromium;
try {
  ({ chromium } = await import('playwright-core'));
} catch {
  skip('playwright-core is not installed: run `npm ci` in tests/web');
}

// Multi-turn chats in a loop until stopped: each turn resends the history, so the cache is used.
function startLoad(url) {
  let stopped = false;
  let requests = 0;
  const errors = [];
  const user = async (u) => {
    for (let conv = 0; !stopped; conv++) {
      const messages = [{ role: 'system', content: 'You tell short stories.' }];
      for (let turn = 0; turn < 4 && !stopped; turn++) {
        messages.push({ role: 'user', content: `Story ${u}.${conv}.${turn}: Lily went to the park and` });
        const r = await fetch(url + '/v1/chat/completions', {
          method: 'POST', headers: { 'Content-Type': 'application/json' },
          body: JSON.stringify({ model: 'stories260K', messages, max_tokens: 24, temperature: 0, ignore_eos: true }),
        });
        const j = await r.json();
        if (!r.ok) { errors.push(JSON.stringify(j)); return; }
        messages.push({ role: 'assistant', content: j.choices[0].message.content });
        requests++;
      }
    }
  };
  // A failed request ends that user's loop; the test reports it.
  const users = [0, 1].map((u) => user(u).catch((e) => { errors.push(String(e)); }));
  return {
    stats: () => ({ requests, errors }),
    async stop() { stopped = true; await Promise.all(users); },
  };
}

// The fixture's Redis (tests/kv/redis_test_server.sh), database 5 (other tests keep to theirs); ''
// without one.
function redisUrl() {
  const file = process.env.MNEMO_REDIS_URL_FILE;
  if (!file || !existsSync(file)) return '';
  const url = readFileSync(file, 'utf8').trim();
  return url ? url + '/5' : '';
}
const REDIS = redisUrl();
const REPLICA = 'status-page-test';

let server, load, context, page;
const consoleErrors = [];

before(async () => {
  server = await startServer(['--kv-t0-mb', '1', '--kv-t1-mb', '4', '--kv-disk-mb', '0', '--replica-id', REPLICA,
    ...(REDIS ? ['--kv-remote', REDIS] : [])]);
  load = startLoad(server.url);
  context = await chromium.launchPersistentContext(join(server.dir, 'chromium-profile'), {  // a fresh profile
    executablePath: CHROMIUM,
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking', '--disable-component-update',
      '--disable-sync', '--no-first-run'],
    viewport: { width: 1280, height: 1000 },
  });
  page = context.pages()[0] || await context.newPage();
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
});

after(async () => {
  try {
    if (load) await load.stop();
  } finally {
    try {
      if (context) await context.close();
    } finally {
      if (server) await server.stop();
    }
  }
});

const kpi = (id) => page.$eval('#' + id, (el) => Number(el.dataset.value));

test('the page and its assets are served', async () => {
  for (const [path, type] of [['/', 'text/html'], ['/uPlot.iife.min.js', 'text/javascript'], ['/uPlot.min.css', 'text/css']]) {
    const r = await fetch(server.url + path);
    assert.equal(r.status, 200, path);
    assert.match(r.headers.get('content-type'), new RegExp('^' + type), path);
    assert.ok((await r.text()).length > 100, path);
  }
});

test('the status page renders its charts without errors', async () => {
  const resp = await page.goto(server.url + '/');
  assert.equal(resp.status(), 200);
  await page.waitForFunction(() => window.mnemoStatus && window.mnemoStatus.updates >= 2, null, { timeout: 15000 });
  assert.equal(await page.locator('.uplot').count(), 5, 'five uPlot charts');
  assert.ok(await page.locator('.uplot canvas').count() >= 5, 'charts draw on canvases');
  const rows = await page.$$eval('#tiers tbody tr', (trs) => trs.map((tr) => [...tr.cells].map((c) => c.textContent)));
  assert.deepEqual(rows.map((r) => r[0]), ['T0', 'T1', 'T2']);
  assert.ok(Number(rows[0][2].replace(/,/g, '')) > 0, `T0 has a capacity: ${rows[0]}`);
  assert.equal(rows[2][2], 'off', 'no disk tier configured');
  assert.match(await page.textContent('#conn'), /live/);
  assert.deepEqual(consoleErrors, []);
});

test('its numbers move while requests are served', async () => {
  // Wait for the load to have finished a few turns, then read the counters twice.
  await page.waitForFunction(() => Number(document.getElementById('kpi-turns').dataset.value) >= 2, null,
    { timeout: 20000 });
  const tokens1 = await kpi('kpi-output-tokens');
  const updates1 = await page.evaluate(() => window.mnemoStatus.updates);
  await page.waitForFunction((t) => Number(document.getElementById('kpi-output-tokens').dataset.value) > t, tokens1,
    { timeout: 20000 });
  const tokens2 = await kpi('kpi-output-tokens');
  assert.ok(tokens2 > tokens1, `tokens generated ${tokens1} -> ${tokens2}`);
  assert.ok(await page.evaluate(() => window.mnemoStatus.updates) > updates1, 'the page keeps polling');
  // The page's counter agrees with the server's own /metrics (which only grows).
  const metrics = await (await fetch(server.url + '/metrics')).text();
  const served = Number(metrics.match(/^mnemo_completion_tokens_total (\d+)/m)[1]);
  assert.ok(served >= tokens2, `metrics ${served} >= page ${tokens2}`);
  // Later turns resend their history: some context came from the cache.
  await page.waitForFunction(() => Number(document.getElementById('kpi-hit').dataset.value) > 0, null, { timeout: 20000 });
  assert.ok(await kpi('kpi-sessions') >= 1);
  // The policy's fitted cost (the FLOP prior until steps are timed) and the recompute time.
  assert.ok(await kpi('kpi-cost') > 0);
  assert.ok(await kpi('kpi-recompute') >= 0);
  const { errors } = load.stats();
  assert.deepEqual(errors, []);
  assert.deepEqual(consoleErrors, []);
  if (process.env.MNEMO_WEB_SCREENSHOT) await page.screenshot({ path: process.env.MNEMO_WEB_SCREENSHOT, fullPage: true });
});

test('it names the replica and shows the remote KV tier', async () => {
  const r = await fetch(server.url + '/health');
  assert.equal(r.headers.get('x-mnemo-replica'), REPLICA, 'X-Mnemo-Replica on responses');
  assert.equal((await r.json()).replica, REPLICA);
  await page.waitForFunction((id) => window.mnemoStatus.last && window.mnemoStatus.last.replica === id, REPLICA,
    { timeout: 15000 });
  assert.equal(await page.textContent('#replica'), 'replica ' + REPLICA);
  if (!REDIS) {
    console.log('no Redis fixture (MNEMO_REDIS_URL_FILE): the remote tier panel is checked hidden only');
    assert.equal(await page.isVisible('#remote'), false, 'no remote tier, no panel');
    return;
  }
  // The turns' full chunks are put soon after each turn (write-behind).
  await page.waitForFunction(() => Number(document.getElementById('remote-puts').dataset.value) > 0, null,
    { timeout: 20000 });
  assert.equal(await page.isVisible('#remote'), true);
  assert.equal(await kpi('remote-up'), 1);
  assert.ok(await kpi('remote-written') > 0);
  assert.ok(await kpi('remote-gets') >= 0 && await kpi('remote-hits') >= 0);
  assert.deepEqual(consoleErrors, []);
});
