// LangChain's ChatOpenAI (`@langchain/openai`) against mnemo serve, on chat completions and on
// Responses (`useResponsesApi`): a multi-turn conversation (one turn streamed), withStructuredOutput
// with a nested zod schema (JSON Schema and function calling), a tool round trip streamed and not,
// and regenerate without seed. stories260K knows no JSON: only the grammar makes these valid.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage, SystemMessage } from '@langchain/core/messages';
import { tool } from '@langchain/core/tools';
import { concat } from '@langchain/core/utils/stream';
import { z } from 'zod';
import { startServer } from './server.mjs';

let server;
const bodies = [];  // every request body LangChain sent, in order

before(async () => { server = await startServer(['--max-context', '2048']); });
after(async () => { await server.stop(); });

function chat(useResponsesApi, fields = {}) {
  const recording = (url, init) => {
    bodies.push(JSON.parse(init.body));
    return fetch(url, init);
  };
  return new ChatOpenAI({
    model: 'stories260K', apiKey: 'test-key', configuration: { baseURL: server.baseURL, fetch: recording },
    useResponsesApi, maxRetries: 0, ...fields,
  });
}

const cached = (message) => message.usage_metadata.input_token_details.cache_read;
const seen = (message) => message.usage_metadata.input_tokens + message.usage_metadata.output_tokens;

async function collect(stream) {
  let whole;
  for await (const chunk of stream) whole = whole === undefined ? chunk : concat(whole, chunk);
  return whole;
}

const Person = z.object({
  name: z.string().min(1).max(12),
  age: z.number().int().min(0).max(120),
  pets: z.array(z.enum(['cat', 'dog', 'fish'])).max(3),
  address: z.object({ city: z.string().max(8), zip: z.string().max(5).nullable() }),
  scores: z.record(z.string(), z.number().int().min(0).max(9)),  // JSON Schema propertyNames
});

const weatherInput = z.object({ city: z.string().min(1).max(10), unit: z.enum(['c', 'f']) });
const getWeather = tool(async (input) => JSON.stringify({ temp: 21, unit: input.unit }),
  { name: 'get_weather', description: 'Weather now', schema: weatherInput });

// A required tool call, its execution, and the next turn answering in text. On Responses,
// @langchain/openai 1.5.8 drops string tool choices ('required', 'none': only objects reach the
// request), so there the call is forced by naming the tool.
async function toolRoundTrip(useResponsesApi, call) {
  const history = [new HumanMessage('Weather in Paris?')];
  const choice = useResponsesApi ? 'get_weather' : 'required';
  const withCall = chat(useResponsesApi, { maxTokens: 120 }).bindTools([getWeather], { tool_choice: choice });
  const ai = await call(withCall, history);
  assert.ok(ai.tool_calls.length >= 1, JSON.stringify(ai.content));
  assert.equal(ai.invalid_tool_calls?.length ?? 0, 0);
  history.push(ai);
  for (const c of ai.tool_calls) {
    assert.equal(c.name, 'get_weather');
    assert.deepEqual(weatherInput.parse(c.args), c.args);
    const result = await getWeather.invoke(c);
    assert.equal(result.tool_call_id, c.id);
    history.push(result);
  }
  const next = await call(chat(useResponsesApi, { maxTokens: 8 }).bindTools([getWeather], { tool_choice: 'none' }), history);
  assert.equal(next.tool_calls.length, 0);
  assert.ok(next.text.length > 0);
  assert.ok(cached(next) >= seen(ai) - 1, `cached ${cached(next)} after ${seen(ai)}`);
}

for (const [api, useResponsesApi] of [['chat', false], ['responses', true]]) {
  test(`${api}: a 3-turn conversation, the middle turn streamed`, async () => {
    const model = chat(useResponsesApi, { maxTokens: 12, temperature: 0 });
    const history = [new SystemMessage('You tell stories.'), new HumanMessage('Once upon a time there was a dog.')];
    const a1 = await model.invoke(history);
    assert.ok(a1.text.length > 0);
    history.push(a1, new HumanMessage('What did the dog do next?'));
    const a2 = await collect(await model.stream(history));
    assert.ok(a2.text.length > 0);
    assert.ok(cached(a2) >= seen(a1) - 1, `turn 2 cached ${cached(a2)} after ${seen(a1)}`);
    history.push(a2, new HumanMessage('And then?'));
    const a3 = await model.invoke(history);
    assert.ok(cached(a3) >= seen(a2) - 1, `turn 3 cached ${cached(a3)} after ${seen(a2)}`);
    assert.equal(bodies.at(-1).model, 'stories260K');
    assert.ok(useResponsesApi ? 'input' in bodies.at(-1) : 'messages' in bodies.at(-1));
  });

  for (const method of ['jsonSchema', 'functionCalling']) {
    test(`${api}: withStructuredOutput (${method}) with a nested zod schema`, async () => {
      for (const seed of [1, 2]) {
        const model = chat(useResponsesApi, { maxTokens: 150, modelKwargs: { seed } });
        const value = await model.withStructuredOutput(Person, { name: 'person', method }).invoke('Describe a person.');
        assert.deepEqual(Person.parse(value), value);
        assert.equal(bodies.at(-1).seed, seed);
      }
    });
  }

  test(`${api}: required tool -> call -> tool result -> next turn`, async () => {
    await toolRoundTrip(useResponsesApi, (model, history) => model.invoke(history));
  });

  test(`${api}: the same tool round trip, streamed`, async () => {
    await toolRoundTrip(useResponsesApi, async (model, history) => {
      const message = await collect(await model.stream(history));
      assert.ok(message.tool_call_chunks.length >= message.tool_calls.length);
      return message;
    });
  });

  test(`${api}: regenerate without seed gives different text`, async () => {
    const model = chat(useResponsesApi, { maxTokens: 24, temperature: 1 });
    const texts = new Set(await Promise.all([1, 2, 3, 4].map(() => model.invoke('Once upon a time').then((m) => m.text))));
    assert.ok(texts.size >= 2, 'four unseeded draws were all the same');
  });
}
