// Vercel's AI SDK (`ai` with `@ai-sdk/openai`) against mnemo serve, on chat completions
// (`openai.chat(...)`) and on Responses (`openai(...)`, the provider's default): the
// `messages.push(...result.response.messages)` loop (which sends earlier replies back as
// `item_reference` items on Responses), generateObject with a nested zod schema, a tool round trip
// streamed and not, and regenerate without seed. stories260K knows no JSON: only the grammar makes
// objects and calls valid.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createOpenAI } from '@ai-sdk/openai';
import { generateObject, generateText, stepCountIs, streamObject, streamText, tool } from 'ai';
import { z } from 'zod';
import { startServer } from './server.mjs';

let server;
let openai;
const bodies = [];  // every request body the SDK sent, in order

before(async () => {
  server = await startServer(['--max-context', '2048']);
  const recording = (url, init) => {
    bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  };
  openai = createOpenAI({ apiKey: 'test-key', baseURL: server.baseURL, fetch: recording });
});
after(async () => { await server.stop(); });

// name, model, whether the SDK sends `seed` (OpenAI's Responses API has none)
const apis = [
  ['chat', () => openai.chat('stories260K'), true],
  ['responses', () => openai('stories260K'), false],
];

const cached = (usage) => usage.inputTokenDetails.cacheReadTokens;

const Person = z.object({
  name: z.string().min(1).max(12),
  age: z.number().int().min(0).max(120),
  pets: z.array(z.enum(['cat', 'dog', 'fish'])).max(3),
  address: z.object({ city: z.string().max(8), zip: z.string().max(5).nullable() }),
  scores: z.record(z.string(), z.number().int().min(0).max(9)),  // JSON Schema propertyNames
});

const weatherInput = z.object({ city: z.string().min(1).max(10), unit: z.enum(['c', 'f']) });

// A tool whose executions are recorded: the SDK runs it with the parsed, validated input.
function weatherTool(executed) {
  return tool({
    description: 'Weather now',
    inputSchema: weatherInput,
    execute: async (input) => {
      executed.push(input);
      return { temp: 21, unit: input.unit };
    },
  });
}

// Step 0 must call the tool; step 1 (after the tool result) must answer in text.
const toolLoop = (model, executed, messages, seed) => ({
  model, messages, tools: { get_weather: weatherTool(executed) }, toolChoice: 'required',
  stopWhen: stepCountIs(2), prepareStep: ({ stepNumber }) => (stepNumber === 1 ? { toolChoice: 'none' } : {}),
  maxOutputTokens: 120, ...seed,
});

function checkToolLoop(steps, executed) {
  assert.equal(steps.length, 2);
  const [first, second] = steps;
  assert.equal(first.finishReason, 'tool-calls');
  assert.equal(first.toolCalls.length, executed.length);
  assert.ok(executed.length >= 1);
  first.toolCalls.forEach((call, k) => {
    assert.equal(call.toolName, 'get_weather');
    assert.deepEqual(weatherInput.parse(call.input), executed[k]);
    assert.deepEqual(first.toolResults[k].output, { temp: 21, unit: executed[k].unit });
  });
  assert.equal(second.toolCalls.length, 0);
  assert.ok(['stop', 'length'].includes(second.finishReason), second.finishReason);
  assert.ok(second.text.length > 0);
  // The next turn continues the session that made the call: the call's turn is cached.
  assert.ok(cached(second.usage) >= first.usage.inputTokens + first.usage.outputTokens - 1,
    `cached ${cached(second.usage)} after ${first.usage.inputTokens} + ${first.usage.outputTokens}`);
}

for (const [api, model, seedable] of apis) {
  const seed = (value) => (seedable ? { seed: value } : {});

  test(`${api}: a 3-turn conversation through result.response.messages`, async () => {
    const system = 'You tell stories.';
    const messages = [{ role: 'user', content: 'Once upon a time there was a cat.' }];
    const sent = bodies.length;
    const r1 = await generateText({ model: model(), system, messages, maxOutputTokens: 12, temperature: 0 });
    assert.ok(r1.text.length > 0);
    messages.push(...r1.response.messages, { role: 'user', content: 'What did the cat do next?' });
    const r2 = streamText({ model: model(), system, messages, maxOutputTokens: 12, temperature: 0 });
    let streamed = '';
    for await (const piece of r2.textStream) streamed += piece;
    assert.equal(streamed, await r2.text);
    const u2 = await r2.usage;
    assert.ok(cached(u2) >= r1.usage.inputTokens + r1.usage.outputTokens - 1,
      `turn 2 cached ${cached(u2)} after ${r1.usage.inputTokens} + ${r1.usage.outputTokens}`);
    messages.push(...(await r2.response).messages, { role: 'user', content: 'And then?' });
    const r3 = await generateText({ model: model(), system, messages, maxOutputTokens: 12, temperature: 0 });
    assert.ok(cached(r3.usage) >= u2.inputTokens + u2.outputTokens - 1,
      `turn 3 cached ${cached(r3.usage)} after ${u2.inputTokens} + ${u2.outputTokens}`);
    assert.equal(bodies.length, sent + 3);
    if (api === 'responses') {
      // The SDK refers to its stored replies instead of resending them.
      const refs = bodies.at(-1).input.filter((item) => item.type === 'item_reference');
      assert.equal(refs.length, 2, JSON.stringify(bodies.at(-1).input));
      assert.equal(refs[0].id, r1.response.messages[0].content[0].providerOptions.openai.itemId);
    }
  });

  test(`${api}: generateObject with a nested zod schema`, async () => {
    for (const value of [1, 2]) {
      const { object, finishReason } = await generateObject({
        model: model(), schema: Person, schemaName: 'person', prompt: 'Describe a person.', maxOutputTokens: 150, ...seed(value),
      });
      assert.equal(finishReason, 'stop');
      assert.deepEqual(Person.parse(object), object);
    }
    const sent = bodies.at(-1);
    const format = api === 'chat' ? sent.response_format : sent.text.format;
    assert.equal(format.type, 'json_schema');
  });

  test(`${api}: streamObject yields partial objects that end in a valid one`, async () => {
    const result = streamObject({ model: model(), schema: Person, prompt: 'Describe a person.', maxOutputTokens: 150, ...seed(7) });
    let partials = 0;
    for await (const partial of result.partialObjectStream) {
      assert.equal(typeof partial, 'object');
      partials++;
    }
    const object = await result.object;
    assert.ok(partials > 1);
    assert.deepEqual(Person.parse(object), object);
  });

  test(`${api}: required tool -> call -> tool result -> next turn`, async () => {
    const executed = [];
    const messages = [{ role: 'user', content: 'Weather in Paris?' }];
    const result = await generateText(toolLoop(model(), executed, messages, seed(5)));
    checkToolLoop(result.steps, executed);
    assert.equal(result.text, result.steps[1].text);
    // The agent's next user turn sends the call, its result and the reply back (the reply as an
    // item_reference on Responses): all of it is cached.
    messages.push(...result.response.messages, { role: 'user', content: 'And tomorrow?' });
    const next = await generateText({ model: model(), messages, tools: { get_weather: weatherTool(executed) }, toolChoice: 'none', maxOutputTokens: 8 });
    const last = result.steps[1].usage;
    assert.ok(cached(next.usage) >= last.inputTokens + last.outputTokens - 1,
      `cached ${cached(next.usage)} after ${last.inputTokens} + ${last.outputTokens}`);
    const input = bodies.at(-1).input ?? bodies.at(-1).messages;
    if (api === 'responses') assert.ok(input.some((item) => item.type === 'item_reference'), JSON.stringify(input));
  });

  test(`${api}: the same tool round trip, streamed`, async () => {
    const executed = [];
    const result = streamText(toolLoop(model(), executed, [{ role: 'user', content: 'Weather in Rome?' }], seed(6)));
    const inputDeltas = new Map();  // tool call id -> its streamed input
    const kinds = new Set();
    for await (const part of result.fullStream) {
      kinds.add(part.type);
      if (part.type === 'tool-input-delta') inputDeltas.set(part.id, (inputDeltas.get(part.id) ?? '') + part.delta);
      if (part.type === 'error') throw part.error;
    }
    const steps = await result.steps;
    checkToolLoop(steps, executed);
    assert.ok(kinds.has('tool-input-delta') && kinds.has('tool-result') && kinds.has('text-delta'), [...kinds].join(' '));
    for (const call of steps[0].toolCalls) assert.deepEqual(JSON.parse(inputDeltas.get(call.toolCallId)), call.input);
  });

  test(`${api}: regenerate without seed gives different text`, async () => {
    const ask = () => generateText({ model: model(), prompt: 'Once upon a time', maxOutputTokens: 24, temperature: 1 }).then((r) => r.text);
    const texts = new Set(await Promise.all([ask(), ask(), ask(), ask()]));
    assert.ok(texts.size >= 2, 'four unseeded draws were all the same');
  });
}
