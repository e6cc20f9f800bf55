// Structured output end to end: the official openai client asks `sieve serve` for json_object and
// json_schema responses at temperature 1, and every answer must parse and validate against its
// schema with Ajv (an independent JSON Schema validator). Two models: stories260K (a 512-token
// SentencePiece vocabulary) and a generated random-weight model with DeepSeek LLM's 102,400-token
// byte-level BPE vocabulary (the largest in ../shared; Llama 3's 128k is not there), whose
// outputs are whatever the grammar lets through. Run by ctest (test "serve_structured").
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Ajv from 'ajv';
import OpenAI from 'openai';
import { BIN, KEY, SHARED, curl, execFileP, expectPoolEmpty, jsonHeaders, startServer } from './lib.mjs';

const str = (max) => ({ type: 'string', maxLength: max });
const obj = (properties, required = Object.keys(properties), extra = {}) =>
  ({ type: 'object', properties, required, additionalProperties: false, ...extra });

// Strings and arrays are bounded so that a random-weight model also finishes its documents.
const SCHEMAS = {
  flat: obj({ name: str(12), age: { type: 'integer' }, ok: { type: 'boolean' } }),
  optional_fields: obj({ id: { type: 'integer' }, note: str(8), score: { type: 'number' } }, ['id']),
  nested: obj({ user: obj({ name: str(10), address: obj({ city: str(10), zip: str(6) }) }) }),
  array_of_strings: obj({ tags: { type: 'array', items: str(6), maxItems: 4 } }),
  array_bounds: obj({ xs: { type: 'array', items: { type: 'integer' }, minItems: 2, maxItems: 3 } }),
  array_of_objects: obj({
    items: { type: 'array', maxItems: 3, items: obj({ sku: str(6), qty: { type: 'integer' } }) },
  }),
  string_enum: obj({ color: { enum: ['red', 'green', 'blue'] } }),
  mixed_enum: obj({ v: { enum: [1, 'two', null, true, 3.5] } }),
  const_value: obj({ version: { const: 'v1' }, kind: { const: 7 } }),
  nullable_type: obj({ maybe: { type: ['string', 'null'], maxLength: 5 } }),
  nullable_keyword: obj({ n: { type: 'integer', nullable: true } }),
  any_of: obj({ v: { anyOf: [{ type: 'integer' }, str(5), { type: 'boolean' }] } }),
  one_of_objects: obj({
    shape: {
      oneOf: [obj({ kind: { const: 'circle' }, r: { type: 'number' } }),
        obj({ kind: { const: 'square' }, side: { type: 'integer' } })],
    },
  }),
  ref_defs: {
    ...obj({ home: { $ref: '#/$defs/place' }, work: { $ref: '#/$defs/place' } }),
    $defs: { place: obj({ city: str(8), floor: { type: 'integer' } }) },
  },
  ref_definitions: {
    ...obj({ a: { $ref: '#/definitions/pt' } }),
    definitions: { pt: obj({ x: { type: 'number' }, y: { type: 'number' } }) },
  },
  recursive_tree: {
    $defs: {
      node: obj({ v: { type: 'integer' }, kids: { type: 'array', maxItems: 2, items: { $ref: '#/$defs/node' } } }),
    },
    ...obj({ root: { $ref: '#/$defs/node' } }),
  },
  string_lengths: obj({ code: { type: 'string', minLength: 3, maxLength: 3 }, memo: str(4) }),
  top_level_array: { type: 'array', items: { type: 'integer' }, minItems: 1, maxItems: 5 },
  top_level_enum: { enum: ['yes', 'no', 'maybe'] },
  free_additional: {
    type: 'object', properties: { id: { type: 'integer' } }, required: ['id'],
    additionalProperties: { type: 'integer' },
  },
  numbers: obj({ i: { type: 'integer' }, f: { type: 'number' }, neg: { type: 'integer' } }),
  deep: obj({ a: obj({ b: obj({ c: obj({ d: { type: 'array', items: { type: 'boolean' }, maxItems: 3 } }) }) }) }),
  with_annotations: {
    title: 'Person', description: 'annotations change nothing', $schema: 'http://json-schema.org/draft-07/schema#',
    ...obj({ name: { ...str(6), description: 'a name', examples: ['Ann'] } }),
  },
};

const ajv = new Ajv({ strict: false, allErrors: true });
const validators = Object.fromEntries(Object.entries(SCHEMAS).map(([k, s]) => [k, ajv.compile(s)]));

// No bound on length: a recursive schema's depth, extra keys' names. At temperature 1 a model
// (a random-weight one above all) may go on until max_tokens; complete answers must validate.
const UNBOUNDED = new Set(['recursive_tree', 'free_additional']);

// Returns whether the output was validated (false: an unbounded schema's output cut at length).
function check(name, content, finish) {
  if (finish === 'length' && UNBOUNDED.has(name)) return false;
  assert.equal(finish, 'stop', `${name}: the grammar ends the output (got ${finish}): ${content}`);
  let doc;
  try {
    doc = JSON.parse(content);
  } catch (e) {
    assert.fail(`${name}: not JSON: ${JSON.stringify(content)} (${e.message})`);
  }
  const validate = validators[name];
  assert.ok(validate(doc), `${name}: ${JSON.stringify(doc)} fails its schema: ${ajv.errorsText(validate.errors)}`);
  return true;
}

// Unbounded outputs rarely end by themselves (stories260K closed no json_object in 200 tokens
// nor a free_additional object in 440; the deepseek-vocabulary model no streamed
// recursive_tree), and only complete ones are validated: such requests get a logit bias towards
// the tokens holding '}' or ']' (applied before the grammar's mask, so they still come only where
// the grammar allows them), and each test counts what it validated.
const CLOSING_BIAS = 10;
async function closingBias(base) {
  const r = await curl([...jsonHeaders, '-d', JSON.stringify({ prompt: '} }} "} ]} 1} {} ] ]] "] 1] [] }]' }), `${base}/tokenize`]);
  assert.equal(r.status, 200, r.body);
  const bias = {};
  for (const id of new Set(JSON.parse(r.body).tokens)) {
    const piece = await curl([...jsonHeaders, '-d', JSON.stringify({ tokens: [id] }), `${base}/detokenize`]);
    assert.equal(piece.status, 200, piece.body);
    if (/[}\]]/.test(JSON.parse(piece.body).prompt)) bias[id] = CLOSING_BIAS;
  }
  assert.ok(Object.keys(bias).length > 0, 'no token holds a } or a ]');
  return bias;
}

const servers = {};
let dir;
before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sieve-structured-'));
  const big = join(dir, 'deepseek-vocab.gguf');
  await execFileP(BIN, ['gen-model', '--dim', '64', '--layers', '2', '--heads', '4', '--kv-heads', '2', '--ffn', '128',
    '--ctx', '2048', '--type', 'f16', '--seed', '11', '--vocab', `${SHARED}/golden/tokenizer/ggml-vocab-deepseek-llm.gguf`,
    '-o', big]);
  servers.stories = await startServer([]);
  servers.deepseek = await startServer(['--served-model-name', 'llama'], big);
  for (const s of Object.values(servers)) s.closingBias = await closingBias(s.base);
});
after(async () => {
  for (const s of Object.values(servers)) {
    const { code } = await s.stop();
    assert.equal(code, 0, `graceful exit:\n${s.log}`);
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

// stories260K's context is 512 tokens; the generated model's 2048.
const MAX_TOKENS = { stories: 440, deepseek: 1500 };

for (const model of ['stories', 'deepseek']) {
  test(`${model}: ${Object.keys(SCHEMAS).length} json_schema responses validate (n=2, temperature 1)`, async () => {
    const client = new OpenAI({ apiKey: KEY, baseURL: `${servers[model].base}/v1`, maxRetries: 0 });
    const names = Object.keys(SCHEMAS);
    const answers = await Promise.all(names.map((name, i) => client.chat.completions.create({
      model: 'llama', messages: [{ role: 'user', content: `Describe ${name} as JSON.` }],
      response_format: { type: 'json_schema', json_schema: { name, schema: SCHEMAS[name] } },
      temperature: 1, seed: 1000 + i, n: 2, max_tokens: MAX_TOKENS[model],
      ...(UNBOUNDED.has(name) ? { logit_bias: servers[model].closingBias } : {}),
    })));
    const validated = Object.fromEntries(names.map((name) => [name, 0]));
    answers.forEach((answer, i) => {
      assert.equal(answer.choices.length, 2);
      for (const choice of answer.choices) validated[names[i]] += check(names[i], choice.message.content, choice.finish_reason);
    });
    console.log(`${model}: validated per schema ${JSON.stringify(validated)}`);
    // Bounded schemas always validate (check fails otherwise); each unbounded one at least once.
    for (const name of UNBOUNDED) assert.ok(validated[name] >= 1, `${name}: no output complete to validate`);
    await expectPoolEmpty(servers[model].base);
  });

  // Issue 42: a document's keys come in the order its schema declares them (as OpenAI and vLLM
  // answer), not sorted: the body is read with its key order.
  test(`${model}: json_schema keys come in the declared order, streamed and not`, async () => {
    const client = new OpenAI({ apiKey: KEY, baseURL: `${servers[model].base}/v1`, maxRetries: 0 });
    const schema = obj({
      name: str(8), age: { type: 'integer' }, friends: { type: 'array', items: str(6), maxItems: 2 },
      has_pet: { type: 'boolean' }, mood: { enum: ['happy', 'sad'] },
    });
    const declared = ['name', 'age', 'friends', 'has_pet', 'mood'];
    const request = {
      model: 'llama', messages: [{ role: 'user', content: 'A person as JSON.' }],
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
      temperature: 1, seed: 42, max_tokens: MAX_TOKENS[model],
    };
    const answer = await client.chat.completions.create({ ...request, n: 2 });
    for (const choice of answer.choices) {
      assert.equal(choice.finish_reason, 'stop', choice.message.content);
      assert.deepEqual(Object.keys(JSON.parse(choice.message.content)), declared, choice.message.content);
    }
    const stream = await client.chat.completions.create({ ...request, stream: true });
    let content = '';
    for await (const chunk of stream) content += chunk.choices[0]?.delta?.content ?? '';
    assert.deepEqual(Object.keys(JSON.parse(content)), declared, content);
    await expectPoolEmpty(servers[model].base);
  });

  test(`${model}: json_object and streamed json_schema`, async () => {
    const client = new OpenAI({ apiKey: KEY, baseURL: `${servers[model].base}/v1`, maxRetries: 0 });
    let objects = 0;
    for (let seed = 0; seed < 4; ++seed) {
      const answer = await client.chat.completions.create({
        model: 'llama', messages: [{ role: 'user', content: 'Any JSON object.' }],
        response_format: { type: 'json_object' }, temperature: 1, seed, max_tokens: MAX_TOKENS[model],
        logit_bias: servers[model].closingBias,
      });
      const { content } = answer.choices[0].message;
      // An unbounded object may run out of tokens; whatever came back is a prefix of an object.
      assert.equal(content.trimStart()[0], '{', content);
      if (answer.choices[0].finish_reason === 'stop') {
        const doc = JSON.parse(content);
        assert.ok(doc !== null && typeof doc === 'object' && !Array.isArray(doc), content);
        ++objects;
      }
    }
    console.log(`${model}: ${objects} of 4 json_object answers complete`);
    assert.ok(objects >= 2, `${model}: ${objects} of 4 json_object answers complete: too few to validate`);
    let streamed = 0;
    for (const name of ['nested', 'one_of_objects', 'recursive_tree']) {
      const stream = await client.chat.completions.create({
        model: 'llama', messages: [{ role: 'user', content: 'JSON please.' }], stream: true,
        response_format: { type: 'json_schema', json_schema: { name, schema: SCHEMAS[name] } },
        temperature: 1, seed: 5, max_tokens: MAX_TOKENS[model],
        ...(UNBOUNDED.has(name) ? { logit_bias: servers[model].closingBias } : {}),
      });
      let content = '';
      let finish = null;
      for await (const chunk of stream) {
        for (const c of chunk.choices) {
          content += c.delta?.content ?? '';
          finish = c.finish_reason ?? finish;
        }
      }
      streamed += check(name, content, finish);
    }
    assert.equal(streamed, 3, `${model}: every streamed schema answer complete and validated`);
    await expectPoolEmpty(servers[model].base);
  });
}

test('completions: grammar (GBNF), logprobs of the allowed tokens, and errors that name the field', async () => {
  const { base } = servers.stories;
  let r = await curl([...jsonHeaders, `${base}/v1/completions`, '-d', JSON.stringify({
    model: 'llama', prompt: 'Once upon a time', grammar: 'root ::= ("yes" | "no") ("," ("yes" | "no")){2}',
    temperature: 1, seed: 3, max_tokens: 50, logprobs: 3,
  })]);
  assert.equal(r.status, 200, r.body);
  const choice = JSON.parse(r.body).choices[0];
  assert.match(choice.text, /^(yes|no)(,(yes|no)){2}$/);
  assert.equal(choice.finish_reason, 'stop');
  for (const top of choice.logprobs.top_logprobs) {
    for (const token of Object.keys(top)) {
      assert.ok(/^[yesno,]*$/.test(token) || token === '</s>', `a refused token has a logprob: ${JSON.stringify(token)}`);
    }
  }

  const bad = [
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'string', pattern: 'a+' } } } },
      'response_format', /pattern/],
    [{ response_format: { type: 'json_schema', json_schema: { name: 'x', strict: true, schema: { type: 'object', properties: { a: { type: 'string' } } } } } },
      'response_format', /additionalProperties/],
    [{ response_format: { type: 'yaml' } }, 'response_format', /yaml/],
    [{ grammar: 'root ::= undefined-rule' }, 'grammar', /undefined-rule/],
  ];
  for (const [fields, param, message] of bad) {
    r = await curl([...jsonHeaders, `${base}/v1/chat/completions`, '-d', JSON.stringify({
      model: 'llama', messages: [{ role: 'user', content: 'x' }], ...fields,
    })]);
    assert.equal(r.status, 400, r.body);
    const { error } = JSON.parse(r.body);
    assert.equal(error.param, param, r.body);
    assert.match(error.message, message);
  }
  await expectPoolEmpty(base);
});
