// Tool calls with the official OpenAI client: a required tool -> call -> tool result -> next turn
// round trip on chat (streamed and not) and on Responses. stories260K knows no tools: only the
// grammar makes the calls valid. The next turn reuses the session's KV (cached tokens).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './server.mjs';

let server;
let client;
const model = 'stories260K';

before(async () => {
  server = await startServer(['--max-context', '2048']);
  client = new OpenAI({ apiKey: 'test-key', baseURL: server.baseURL, maxRetries: 0 });
});
after(async () => { await server.stop(); });

const parameters = {
  type: 'object',
  properties: { city: { type: 'string', minLength: 1, maxLength: 10 }, unit: { type: 'string', enum: ['c', 'f'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};

function checkArgs(text) {
  const a = JSON.parse(text);
  assert.deepEqual(Object.keys(a), ['city', 'unit']);
  assert.ok([...a.city].length >= 1 && [...a.city].length <= 10, a.city);
  assert.ok(['c', 'f'].includes(a.unit), a.unit);
}

const chatTools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather now', parameters } }];

test('chat: required tool -> call -> tool result -> next turn', async () => {
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const r = await client.chat.completions.create({ model, messages, tools: chatTools, tool_choice: 'required', max_tokens: 120, seed: 4 });
  const choice = r.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  const call = choice.message.tool_calls[0];
  assert.match(call.id, /^call_/);
  assert.equal(call.function.name, 'get_weather');
  checkArgs(call.function.arguments);
  messages.push(choice.message, { role: 'tool', tool_call_id: call.id, content: '{"temp": 21}' });
  const r2 = await client.chat.completions.create({ model, messages, tools: chatTools, max_tokens: 8 });
  assert.equal(typeof r2.choices[0].message.content, 'string');
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens >= r.usage.prompt_tokens + r.usage.completion_tokens - 1,
    JSON.stringify(r2.usage));
});

test('chat: streamed tool call deltas reassemble to the call', async () => {
  const messages = [{ role: 'user', content: 'Weather in Rome?' }];
  const body = { model, messages, tools: chatTools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 120, seed: 9 };
  const whole = await client.chat.completions.create(body);
  const stream = await client.chat.completions.create({ ...body, stream: true });
  const calls = [];
  let finish = null;
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.finish_reason) finish = c.finish_reason;
    for (const d of c.delta.tool_calls ?? []) {
      if (!calls[d.index]) calls[d.index] = { id: d.id, name: d.function.name, arguments: '' };
      calls[d.index].arguments += d.function.arguments ?? '';
    }
  }
  assert.equal(finish, 'tool_calls');
  const want = whole.choices[0].message.tool_calls;
  assert.equal(calls.length, want.length);
  calls.forEach((c, k) => {
    assert.equal(c.name, want[k].function.name);
    assert.equal(c.arguments, want[k].function.arguments);
    checkArgs(c.arguments);
  });
  // The streamed call continues too.
  messages.push({ role: 'assistant', content: null, tool_calls: calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })) });
  messages.push({ role: 'tool', tool_call_id: calls[0].id, content: 'rain' });
  const r2 = await client.chat.completions.create({ model, messages, tools: chatTools, max_tokens: 8 });
  assert.ok(r2.usage.prompt_tokens_details.cached_tokens > 0);
});

test('responses: function_call -> function_call_output with previous_response_id', async () => {
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather now', parameters, strict: true }];
  const r = await client.responses.create({ model, input: 'Weather in Oslo?', tools, tool_choice: 'required', max_output_tokens: 120, seed: 2 });
  const calls = r.output.filter((o) => o.type === 'function_call');
  assert.ok(calls.length >= 1, JSON.stringify(r.output));
  for (const c of calls) checkArgs(c.arguments);
  const r2 = await client.responses.create({
    model, previous_response_id: r.id, tools, max_output_tokens: 8,
    input: calls.map((c) => ({ type: 'function_call_output', call_id: c.call_id, output: 'sunny' })),
  });
  assert.equal(r2.status === 'completed' || r2.status === 'incomplete', true);
  assert.ok(r2.usage.input_tokens_details.cached_tokens >= r.usage.input_tokens + r.usage.output_tokens - 1,
    JSON.stringify(r2.usage));
});
