// Structured outputs with the official OpenAI client: response_format json_schema on chat and
// text.format on Responses; stories260K knows no JSON, so only the grammar makes these parse.
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

const schema = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 12 },
    age: { type: 'integer', minimum: 0, maximum: 120 },
    pets: { type: 'array', items: { type: 'string', enum: ['cat', 'dog', 'fish'] }, maxItems: 3 },
    address: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 8 }, zip: { type: ['string', 'null'], maxLength: 5 } },
      required: ['city', 'zip'], additionalProperties: false,
    },
  },
  required: ['name', 'age', 'pets', 'address'],
  additionalProperties: false,
  $schema: 'http://json-schema.org/draft-07/schema#',
};

function check(value) {
  assert.equal(typeof value.name, 'string');
  assert.ok([...value.name].length >= 1 && [...value.name].length <= 12, value.name);
  assert.ok(Number.isInteger(value.age) && value.age >= 0 && value.age <= 120, String(value.age));
  assert.ok(Array.isArray(value.pets) && value.pets.length <= 3);
  for (const p of value.pets) assert.ok(['cat', 'dog', 'fish'].includes(p), p);
  assert.equal(typeof value.address.city, 'string');
  assert.ok(value.address.zip === null || typeof value.address.zip === 'string');
  assert.deepEqual(Object.keys(value).sort(), ['address', 'age', 'name', 'pets']);
}

test('chat response_format json_schema: every seed parses and validates', async () => {
  for (let seed = 1; seed <= 5; seed++) {
    const r = await client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Describe a person.' }], max_tokens: 150, seed,
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
    });
    check(JSON.parse(r.choices[0].message.content));
  }
});

test('chat response_format json_object, streamed', async () => {
  const stream = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 80, seed: 3, stream: true,
    response_format: { type: 'json_object' },
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  const v = JSON.parse(text);
  assert.equal(typeof v, 'object');
  assert.ok(v !== null && !Array.isArray(v));
});

test('responses text.format json_schema', async () => {
  const r = await client.responses.create({
    model, input: 'Describe a person.', max_output_tokens: 150, seed: 2,
    text: { format: { type: 'json_schema', name: 'person', strict: true, schema } },
  });
  check(JSON.parse(r.output_text));
  assert.equal(r.text.format.type, 'json_schema');
});

test('an unsupported schema is a 400 naming the parameter', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model, messages: [{ role: 'user', content: 'Hi' }],
      // A backreference: not in the pattern subset the compiler supports.
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: '(a)\\1' } } },
    }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'response_format.json_schema.schema',
  );
});
