// The official OpenAI Node client against mnemo serve: existing clients must work unchanged.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

let server;
let client;
const model = 'stories260K';

before(async () => {
  server = await startServer();
  client = new OpenAI({ apiKey: 'test-key', baseURL: server.baseURL, maxRetries: 0 });
});
after(async () => { await server.stop(); });

test('chat completion, not streamed', async () => {
  const r = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 16, temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.equal(typeof r.choices[0].message.content, 'string');
  assert.ok(r.choices[0].message.content.length > 0);
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  assert.ok(r.usage.prompt_tokens > 0);
  assert.equal(typeof r.usage.prompt_tokens_details.cached_tokens, 'number');
});

test('chat completion, streamed with usage', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Lily and Tom' }], max_tokens: 16, temperature: 0,
    stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length > 0) {
      text += chunk.choices[0].delta.content ?? '';
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.ok(text.length > 0);
  assert.ok(['stop', 'length'].includes(finish));
  assert.ok(usage && usage.completion_tokens > 0);
  assert.equal(typeof usage.prompt_tokens_details.cached_tokens, 'number');
});

test('a stateless chat continues a stored session: the history is cached', async () => {
  const first = [{ role: 'user', content: 'The little dog ran to the park.' }];
  const r1 = await client.chat.completions.create({ model, messages: first, max_tokens: 12, temperature: 0 });
  const second = [...first, { role: 'assistant', content: r1.choices[0].message.content },
    { role: 'user', content: 'What happened next?' }];
  const r2 = await client.chat.completions.create({ model, messages: second, max_tokens: 12, temperature: 0 });
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r1.usage.prompt_tokens - 1,
    `cached ${r2.usage.prompt_tokens_details.cached_tokens} of ${r1.usage.prompt_tokens}`);
});

test('a 3-turn Responses conversation via previous_response_id', async () => {
  const r1 = await client.responses.create({ model, input: 'Once upon a time, there was a big cat named Max.', max_output_tokens: 16, temperature: 0 });
  assert.equal(r1.object, 'response');
  assert.ok(r1.output_text.length > 0);
  const r2 = await client.responses.create({ model, previous_response_id: r1.id, input: 'What did Max do?', max_output_tokens: 16, temperature: 0 });
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens,
    `turn 2 cached ${r2.usage.input_tokens_details.cached_tokens} < ${r1.usage.input_tokens}`);
  const r3 = await client.responses.create({ model, previous_response_id: r2.id, input: 'And then?', max_output_tokens: 16, temperature: 0 });
  assert.ok(r3.usage.input_tokens_details.cached_tokens >= r2.usage.input_tokens,
    `turn 3 cached ${r3.usage.input_tokens_details.cached_tokens} < ${r2.usage.input_tokens}`);
  assert.ok(r3.usage.input_tokens > r2.usage.input_tokens);
  const got = await client.responses.retrieve(r2.id);
  assert.equal(got.id, r2.id);
  assert.equal(got.output_text, r2.output_text);
  const items = await client.responses.inputItems.list(r2.id);
  assert.equal(items.data.length, 1);
  await client.responses.delete(r3.id);
  await assert.rejects(client.responses.retrieve(r3.id), OpenAI.NotFoundError);
});

test('a streamed response has the standard event sequence', async () => {
  const stream = await client.responses.create({ model, input: 'The sun was shining.', max_output_tokens: 12, temperature: 0, stream: true });
  const types = [];
  let text = '';
  let final = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  assert.equal(types[0], 'response.created');
  assert.ok(types.includes('response.output_text.delta'));
  assert.ok(types.includes('response.output_text.done'));
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)));
  assert.equal(final.output_text, text);
});

test('a conversation object collects the turns', async () => {
  const conv = await client.conversations.create({ metadata: { topic: 'stories' }, items: [{ type: 'message', role: 'user', content: 'Hello.' }] });
  assert.equal(conv.object, 'conversation');
  const r1 = await client.responses.create({ model, conversation: conv.id, input: 'Tell me about a frog.', max_output_tokens: 10, temperature: 0 });
  const r2 = await client.responses.create({ model, conversation: conv.id, input: 'And a bird?', max_output_tokens: 10, temperature: 0 });
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= r1.usage.input_tokens);
  const items = await client.conversations.items.list(conv.id, { order: 'asc' });
  assert.equal(items.data.length, 5);
  assert.equal(items.data[0].role, 'user');
  assert.equal(items.data[2].role, 'assistant');
  const got = await client.conversations.retrieve(conv.id);
  assert.deepEqual(got.metadata, { topic: 'stories' });
  await client.conversations.update(conv.id, { metadata: { topic: 'animals' } });
  assert.deepEqual((await client.conversations.retrieve(conv.id)).metadata, { topic: 'animals' });
  await client.conversations.delete(conv.id);
  await assert.rejects(client.conversations.retrieve(conv.id), OpenAI.NotFoundError);
});

test('errors surface as the client\'s typed errors', async () => {
  const bad = new OpenAI({ apiKey: 'wrong', baseURL: server.baseURL, maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }] }), OpenAI.AuthenticationError);
  await assert.rejects(client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], temperature: 9 }), OpenAI.BadRequestError);
  // As OpenAI answers it: 400 previous_response_not_found (Codex-style clients resend the history on it).
  await assert.rejects(client.responses.create({ model, input: 'x', previous_response_id: 'resp_0123456789abcdef0123456789abcdef' }),
    (e) => e instanceof OpenAI.BadRequestError && e.code === 'previous_response_not_found' && e.param === 'previous_response_id');
  const models = await client.models.list();
  assert.ok(models.data.length === 1);
});

test('models.retrieve and a regenerate without seed', async () => {
  const m = await client.models.retrieve(model);
  assert.equal(m.id, model);
  await assert.rejects(client.models.retrieve('no-such-model'), (e) => e.status === 404);
  const ask = () => client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 24, temperature: 1,
  }).then((r) => r.choices[0].message.content);
  const texts = new Set([await ask(), await ask(), await ask(), await ask()]);
  assert.ok(texts.size >= 2, 'four unseeded draws were all the same');
});

test('n: 3 choices with logprobs, streamed and not', async () => {
  const messages = [{ role: 'user', content: 'Once upon a time' }];
  const r = await client.chat.completions.create({
    model, messages, n: 3, max_tokens: 12, temperature: 1, seed: 9, logprobs: true, top_logprobs: 2,
  });
  assert.equal(r.choices.length, 3);
  assert.ok(r.system_fingerprint.startsWith('fp_'));
  for (const [i, c] of r.choices.entries()) {
    assert.equal(c.index, i);
    const content = c.logprobs.content;
    assert.equal(content.map((e) => e.token).join(''), c.message.content);
    for (const e of content) {
      assert.ok(e.logprob <= 0 && e.top_logprobs.length === 2);
      assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob);
      assert.ok(Math.exp(e.top_logprobs[0].logprob) + Math.exp(e.top_logprobs[1].logprob) <= 1 + 1e-6);
    }
  }
  const stream = await client.chat.completions.create({ model, messages, n: 3, max_tokens: 12, temperature: 1, seed: 9, stream: true });
  const texts = ['', '', ''];
  for await (const chunk of stream) {
    for (const c of chunk.choices) texts[c.index] += c.delta.content ?? '';
  }
  assert.deepEqual(texts, r.choices.map((c) => c.message.content));
});
