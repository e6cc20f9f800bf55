// End-to-end tests of `sieve serve` with real clients: curl and the official openai package.
// Run by ctest (test "serve_e2e"); needs SIEVE_BIN and SIEVE_SHARED_DIR, and `npm ci` in this
// folder (scripts/test.sh does it). Every server runs on a free loopback port and is stopped
// with SIGTERM at the end, which also checks the graceful exit code.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { writeFileSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import OpenAI from 'openai';
import { KEY, auth, curl, expectPoolEmpty, jsonHeaders, metrics, rng, startServer } from './lib.mjs';

function expectErrorShape(body, status, request = '') {
  const parsed = JSON.parse(body);
  assert.ok(parsed.error, `error object in ${body.slice(0, 300)} for ${String(request).slice(0, 300)}`);
  for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in parsed.error, `error.${k} in ${body}`);
  assert.equal(typeof parsed.error.message, 'string');
  assert.ok(status >= 400 && status < 500, `4xx status, got ${status}: ${body}`);
  return parsed.error;
}

let server;
let client;
before(async () => {
  server = await startServer(['--max-body', '1']);
  client = new OpenAI({ apiKey: KEY, baseURL: `${server.base}/v1`, maxRetries: 0 });
});
after(async () => {
  if (!server) return;
  const { code } = await server.stop();
  assert.equal(code, 0, `graceful exit:\n${server.log}`);
});

test('curl: every endpoint', async () => {
  const base = server.base;
  let r = await curl([`${base}/health`]);
  assert.equal(r.status, 200);

  r = await curl([...auth, `${base}/v1/models`]);
  assert.equal(r.status, 200);
  assert.equal(JSON.parse(r.body).data[0].id, 'llama');
  assert.equal(JSON.parse(r.body).data[0].max_model_len, 512);

  r = await curl([`${base}/v1/models`]);
  assert.equal(r.status, 401);
  assert.equal(expectErrorShape(r.body, r.status).code, 'invalid_api_key');
  r = await curl(['-H', 'Authorization: Bearer wrong', `${base}/metrics`]);
  assert.equal(r.status, 401);

  r = await curl([...auth, `${base}/metrics`]);
  assert.equal(r.status, 200);
  for (const name of ['vllm:num_requests_running', 'vllm:num_requests_waiting', 'vllm:kv_cache_usage_perc',
    'vllm:time_to_first_token_seconds_bucket', 'vllm:inter_token_latency_seconds_bucket',
    'vllm:e2e_request_latency_seconds_bucket', 'vllm:request_queue_time_seconds_bucket', 'vllm:prompt_tokens_total',
    'vllm:generation_tokens_total', 'vllm:prefix_cache_queries_total', 'vllm:prefix_cache_hits_total',
    'vllm:num_preemptions_total']) {
    assert.match(r.body, new RegExp(`^${name}\\{[^}]*model_name="llama"`, 'm'), name);
  }
  assert.match(r.body, /vllm:time_to_first_token_seconds_bucket\{(le="0.001",model_name="llama"|model_name="llama",le="0.001")\}/);

  r = await curl([...jsonHeaders, '-d', '{"prompt":"Once upon a time"}', `${base}/tokenize`]);
  assert.equal(r.status, 200);
  const tokens = JSON.parse(r.body).tokens;
  assert.equal(JSON.parse(r.body).count, tokens.length);
  assert.equal(tokens[0], 1, 'BOS first');
  r = await curl([...jsonHeaders, '-d', JSON.stringify({ tokens }), `${base}/detokenize`]);
  assert.equal(r.status, 200);
  assert.equal(JSON.parse(r.body).prompt, 'Once upon a time');

  r = await curl([...jsonHeaders, '-d', '{"model":"llama","prompt":"Once upon a time","max_tokens":12,"temperature":0}',
    `${base}/v1/completions`]);
  assert.equal(r.status, 200);
  const completion = JSON.parse(r.body);
  assert.equal(completion.object, 'text_completion');
  assert.equal(completion.choices[0].finish_reason, 'length');
  assert.equal(completion.usage.completion_tokens, 12);
  assert.equal(completion.usage.prompt_tokens, tokens.length);

  r = await curl(['-N', ...jsonHeaders, '-d',
    '{"prompt":"Once upon a time","max_tokens":12,"temperature":0,"stream":true}', `${base}/v1/completions`]);
  assert.equal(r.status, 200);
  const events = r.body.split('\n\n').filter(Boolean);
  assert.equal(events.at(-1), 'data: [DONE]');
  const streamed = events.slice(0, -1).map((e) => JSON.parse(e.replace(/^data: /, '')))
    .map((c) => c.choices[0].text).join('');
  assert.equal(streamed, completion.choices[0].text, 'stream and non-stream agree (greedy)');

  r = await curl([...jsonHeaders, '-d', '{"messages":[{"role":"user","content":"Hello"}],"max_tokens":5}',
    `${base}/v1/chat/completions`]);
  assert.equal(r.status, 200);
  assert.equal(JSON.parse(r.body).choices[0].message.role, 'assistant');

  r = await curl([...auth, `${base}/v1/nothing-here`]);
  assert.equal(r.status, 404);
  expectErrorShape(r.body, r.status);
  r = await curl([...jsonHeaders, '-d', '{"model":"gpt-4","prompt":"x"}', `${base}/v1/completions`]);
  assert.equal(r.status, 404);
  assert.equal(expectErrorShape(r.body, r.status).code, 'model_not_found');

  // 413: the server was started with --max-body 1 (MiB).
  const bigBody = join(tmpdir(), `sieve-e2e-big-${process.pid}.json`);
  writeFileSync(bigBody, `{"prompt":"${'a'.repeat(2 << 20)}"}`);
  r = await curl([...jsonHeaders, '--data-binary', `@${bigBody}`, `${base}/v1/completions`]);
  unlinkSync(bigBody);
  assert.equal(r.status, 413);
  expectErrorShape(r.body, r.status);

  // 400 context_length_exceeded, with the sizes in the message.
  r = await curl([...jsonHeaders, '-d', JSON.stringify({ prompt: Array(600).fill(100) }), `${base}/v1/completions`]);
  assert.equal(r.status, 400);
  let error = expectErrorShape(r.body, r.status);
  assert.equal(error.code, 'context_length_exceeded');
  assert.match(error.message, /512/);
  assert.match(error.message, /600/);
  r = await curl([...jsonHeaders, '-d', '{"prompt":"Once","max_tokens":600}', `${base}/v1/completions`]);
  assert.equal(r.status, 400);
  assert.equal(expectErrorShape(r.body, r.status).code, 'context_length_exceeded');
  r = await curl([...jsonHeaders, '-d', '{"prompt":"Once","top_p":0}', `${base}/v1/completions`]);
  assert.equal(r.status, 400);
  assert.equal(expectErrorShape(r.body, r.status).param, 'top_p');
});

test('openai client: chat and completions, streaming and not, usage and errors', async () => {
  const chat = await client.chat.completions.create({
    model: 'llama', messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'A cat' }],
    max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 3,
  });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.equal(chat.usage.completion_tokens, 16);
  assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + 16);
  assert.equal(chat.choices[0].logprobs.content.length, 16);
  assert.equal(chat.choices[0].logprobs.content[0].top_logprobs.length, 3);

  const stream = await client.chat.completions.create({
    model: 'llama', messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'A cat' }],
    max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true },
  });
  let text = '';
  let role = null;
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    ++chunks;
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length === 0) continue;
    if (chunks === 1) role = chunk.choices[0].delta.role;
    text += chunk.choices[0].delta.content ?? '';
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(role, 'assistant', 'the first chunk carries the role');
  assert.equal(finish, 'length');
  assert.equal(text, chat.choices[0].message.content, 'greedy stream equals non-stream');
  assert.equal(usage.completion_tokens, 16);
  assert.equal(usage.prompt_tokens, chat.usage.prompt_tokens);

  const completion = await client.completions.create({
    model: 'llama', prompt: ['Once upon a time', 'The dog'], max_tokens: 10, temperature: 0.8, seed: 7, n: 2,
  });
  assert.equal(completion.choices.length, 4);
  assert.deepEqual(completion.choices.map((c) => c.index), [0, 1, 2, 3]);
  const again = await client.completions.create({
    model: 'llama', prompt: ['Once upon a time', 'The dog'], max_tokens: 10, temperature: 0.8, seed: 7, n: 2,
  });
  assert.deepEqual(again.choices.map((c) => c.text), completion.choices.map((c) => c.text), 'same seed, same text');

  const cstream = await client.completions.create({
    model: 'llama', prompt: 'Once upon a time', max_tokens: 10, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let ctext = '';
  let cusage = null;
  for await (const chunk of cstream) {
    if (chunk.usage) cusage = chunk.usage;
    for (const c of chunk.choices) ctext += c.text;
  }
  assert.ok(ctext.length > 0);
  assert.equal(cusage.completion_tokens, 10);

  // Stop strings end the text before the match.
  const stopped = await client.completions.create({
    model: 'llama', prompt: 'Once upon a time', max_tokens: 40, temperature: 0, stop: ['Lily'],
  });
  assert.equal(stopped.choices[0].finish_reason, 'stop');
  assert.ok(!stopped.choices[0].text.includes('Lily'));

  await assert.rejects(client.completions.create({ model: 'llama', prompt: 'x', temperature: -1 }), (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError);
    assert.equal(e.status, 400);
    assert.equal(e.error.param, 'temperature');
    return true;
  });
  await assert.rejects(client.chat.completions.create({ model: 'nope', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError);
  const wrongKey = new OpenAI({ apiKey: 'wrong', baseURL: `${server.base}/v1`, maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (e) => e instanceof OpenAI.AuthenticationError);
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'llama');
});

// Completions logprobs whose text_offset points where each token's text starts in `text`: ascending,
// and each token's span is its string (less a leading space the tokenizer's decode strips; BOS
// spans nothing).
function expectOffsetsMatchText(text, logprobs) {
  const { tokens, text_offset: offsets } = logprobs;
  assert.equal(offsets.length, tokens.length);
  for (let i = 0; i < tokens.length; ++i) {
    const end = i + 1 < tokens.length ? offsets[i + 1] : text.length;
    assert.ok(offsets[i] <= end, `offsets ascend at ${i}: ${offsets}`);
    const span = text.slice(offsets[i], end);
    assert.ok(span === tokens[i] || ` ${span}` === tokens[i] || (tokens[i] === '<s>' && span === ''),
      `token ${i} '${tokens[i]}' spans '${span}' of '${text}'`);
  }
}

test('echo on completions: the prompt first, with its logprobs; max_tokens 0 scores it; stream and n = 2', async () => {
  const prompt = 'Once upon a time, there was a little dog';
  const greedy = { model: 'llama', prompt, max_tokens: 8, temperature: 0 };
  const plain = await client.completions.create({ ...greedy, logprobs: 2 });
  const echoed = await client.completions.create({ ...greedy, echo: true });
  assert.equal(echoed.choices[0].text, prompt + plain.choices[0].text);
  assert.equal(echoed.choices[0].logprobs, null);
  assert.equal(echoed.usage.completion_tokens, 8);
  assert.equal(echoed.usage.prompt_tokens, plain.usage.prompt_tokens);

  const scored = await client.completions.create({ ...greedy, echo: true, logprobs: 2 });
  const n = scored.usage.prompt_tokens;
  const lp = scored.choices[0].logprobs;
  assert.equal(scored.choices[0].text, echoed.choices[0].text);
  assert.equal(lp.tokens.length, n + 8);
  assert.equal(lp.token_logprobs[0], null, 'nothing comes before the first prompt token');
  assert.equal(lp.top_logprobs[0], null);
  for (let i = 1; i < n; ++i) {
    assert.ok(lp.token_logprobs[i] <= 0, `prompt token ${i}: ${lp.token_logprobs[i]}`);
    const top = lp.top_logprobs[i];
    assert.ok(Object.keys(top).length >= 2 && Object.keys(top).length <= 3, JSON.stringify(top));
    assert.equal(top[lp.tokens[i]], lp.token_logprobs[i], 'the token is among its top_logprobs');
  }
  expectOffsetsMatchText(scored.choices[0].text, lp);
  // The completion's part is the request's without echo.
  assert.deepEqual(lp.tokens.slice(n), plain.choices[0].logprobs.tokens);
  assert.deepEqual(lp.token_logprobs.slice(n), plain.choices[0].logprobs.token_logprobs);
  assert.deepEqual(lp.text_offset.slice(n), plain.choices[0].logprobs.text_offset.map((o) => o + prompt.length));

  // max_tokens 0 scores the prompt alone (lm-eval-harness's loglikelihood request).
  const only = await client.completions.create({ ...greedy, max_tokens: 0, echo: true, logprobs: 2 });
  assert.equal(only.choices[0].text, prompt);
  assert.equal(only.choices[0].finish_reason, 'length');
  assert.equal(only.usage.completion_tokens, 0);
  assert.equal(only.usage.prompt_tokens, n);
  assert.deepEqual(only.choices[0].logprobs.tokens, lp.tokens.slice(0, n));
  assert.deepEqual(only.choices[0].logprobs.token_logprobs, lp.token_logprobs.slice(0, n));
  await assert.rejects(client.completions.create({ ...greedy, max_tokens: 0 }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.error.param, 'max_tokens');
    return true;
  });

  // A prompt of token ids is echoed as its text.
  const r = await curl([...jsonHeaders, '-d', JSON.stringify({ prompt }), `${server.base}/tokenize`]);
  const ids = JSON.parse(r.body).tokens;
  const byIds = await client.completions.create({ ...greedy, prompt: ids, max_tokens: 0, echo: true, logprobs: 2 });
  assert.equal(byIds.choices[0].text, prompt);
  assert.deepEqual(byIds.choices[0].logprobs, only.choices[0].logprobs);

  // n = 2 over two prompts, streamed: each choice's first chunk carries its own prompt and its
  // logprobs; the chunks put together equal the same request not streamed.
  const both = { model: 'llama', prompt: [prompt, 'The cat sat'], max_tokens: 6, temperature: 0.8, seed: 11, n: 2, echo: true, logprobs: 1 };
  const whole = await client.completions.create(both);
  assert.equal(whole.choices.length, 4);
  const stream = await client.completions.create({ ...both, stream: true, stream_options: { include_usage: true } });
  const got = Array.from({ length: 4 }, () => ({ text: '', chunks: 0, logprobs: { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] } }));
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      const g = got[c.index];
      if (g.chunks++ === 0) assert.ok(c.text.startsWith(both.prompt[Math.floor(c.index / 2)]), `first chunk of ${c.index}: ${c.text}`);
      g.text += c.text;
      for (const k of Object.keys(g.logprobs)) g.logprobs[k].push(...(c.logprobs?.[k] ?? []));
    }
  }
  for (let i = 0; i < 4; ++i) {
    const want = whole.choices[i];
    assert.ok(want.text.startsWith(both.prompt[Math.floor(i / 2)]), want.text);
    assert.equal(got[i].text, want.text, `choice ${i}`);
    assert.deepEqual(got[i].logprobs, want.logprobs, `choice ${i}`);
    expectOffsetsMatchText(want.text, want.logprobs);
  }
  assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  assert.equal(usage.prompt_tokens, whole.usage.prompt_tokens);

  // Streamed with max_tokens 0: one chunk per choice, the prompt with its logprobs.
  const scoreStream = await client.completions.create({ ...greedy, max_tokens: 0, echo: true, logprobs: 2, stream: true });
  const chunks = [];
  for await (const chunk of scoreStream) chunks.push(...chunk.choices);
  assert.equal(chunks.length, 1);
  assert.equal(chunks[0].text, prompt);
  assert.equal(chunks[0].finish_reason, 'length');
  assert.deepEqual(chunks[0].logprobs.token_logprobs, only.choices[0].logprobs.token_logprobs);
  await expectPoolEmpty(server.base);
});

const WORDS = ['dog', 'cat', 'ball', 'park', 'tree', 'sun', 'girl', 'boy', 'bird', 'car', 'cake', 'fish', 'moon', 'box'];
function prompts(count, seed) {
  const next = rng(seed);
  return Array.from({ length: count }, (_, i) => {
    const words = Array.from({ length: 3 + (i % 5) }, () => WORDS[Math.floor(next() * WORDS.length)]);
    return `Once upon a time, the ${words.join(' and the ')}`;
  });
}

test('64 concurrent greedy streams equal the same requests served alone; the pool ends empty', async () => {
  const list = prompts(64, 1);
  const request = (prompt) => ({ model: 'llama', prompt, max_tokens: 48, temperature: 0, ignore_eos: true });
  const alone = [];
  for (const prompt of list) alone.push((await client.completions.create(request(prompt))).choices[0].text);
  const before = await metrics(server.base);
  const together = await Promise.all(list.map(async (prompt) => {
    const stream = await client.completions.create({ ...request(prompt), stream: true });
    let text = '';
    let finish = null;
    for await (const chunk of stream) {
      text += chunk.choices[0].text;
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    assert.equal(finish, 'length');
    return text;
  }));
  for (let i = 0; i < list.length; ++i) assert.equal(together[i], alone[i], `prompt ${i}: ${list[i]}`);
  const m = await expectPoolEmpty(server.base);
  const done = (x) => x['vllm:request_success_total{finished_reason="length",model_name="llama"}'];
  assert.equal(done(m) - done(before), 64);
});

test('random disconnects while streaming leak nothing and the server stays healthy', async () => {
  const next = rng(2);
  const list = prompts(48, 3);
  // Compressed requests too: their sparse pages and per-request policy state must go as well.
  const policies = [undefined, 'streaming:S=4,W=24', 'snapkv:B=24,W=8', 'h2o:B=16,W=8', 'fastgen:T=0.3,W=8',
    'quest:K=3,R=2,S=4,W=16'];
  const before = await metrics(server.base);
  let aborted = 0;
  await Promise.all(list.map(async (prompt, i) => {
    const controller = new AbortController();
    const stopAfter = 1 + Math.floor(next() * 20);
    const streaming = i % 4 !== 3;
    try {
      if (streaming) {
        const stream = await client.completions.create(
          { model: 'llama', prompt, max_tokens: 400, temperature: 0.7, ignore_eos: true, stream: true,
            kv_policy: policies[i % policies.length] },
          { signal: controller.signal });
        let chunks = 0;
        for await (const chunk of stream) {
          assert.ok(chunk.choices);
          if (++chunks === stopAfter) controller.abort();
        }
      } else {
        setTimeout(() => controller.abort(), stopAfter);
        await client.completions.create({ model: 'llama', prompt, max_tokens: 400, ignore_eos: true,
          kv_policy: policies[i % policies.length] },
          { signal: controller.signal });
      }
    } catch (e) {
      assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
      ++aborted;
    }
  }));
  assert.ok(aborted > 0, 'some requests were cut off');
  const m = await expectPoolEmpty(server.base);
  const abortedCount = (x) => x['vllm:request_success_total{finished_reason="abort",model_name="llama"}'];
  assert.ok(abortedCount(m) > abortedCount(before), 'the server counted aborted sequences');
  const ok = await client.completions.create({ model: 'llama', prompt: 'Once', max_tokens: 4 });
  assert.equal(ok.choices[0].text.length > 0, true);
  assert.equal((await fetch(`${server.base}/health`)).status, 200);
});

test('kv_policy per request: mixed policies together equal each alone; usage and metrics show the pages kept', async () => {
  const policies = ['full', 'streaming:S=4,W=24', 'snapkv:B=24,W=8', 'layerwise:L=2,rest=snapkv:B=24,W=8', 'fastgen:T=0.5,W=8',
    'quest:K=3,R=2,S=4,W=16'];
  const long = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. '
    + 'One day, she saw a big red ball on the ground. She picked it up and threw it to her friend Tom. Tom caught the ball and laughed. ';
  const list = prompts(16, 5).map((p, i) => ({ prompt: long + p, kv_policy: policies[i % policies.length] }));
  const request = ({ prompt, kv_policy }) => ({ model: 'llama', prompt, max_tokens: 40, temperature: 0, ignore_eos: true, kv_policy });
  const alone = [];
  for (const item of list) alone.push(await client.completions.create(request(item)));
  const before = await metrics(server.base);
  const together = await Promise.all(list.map((item) => client.completions.create(request(item))));
  for (let i = 0; i < list.length; ++i) {
    assert.equal(together[i].choices[0].text, alone[i].choices[0].text, `${list[i].kv_policy}: ${i}`);
    const kv = together[i].usage.kv_cache;
    if (list[i].kv_policy === 'full') assert.equal(kv.pages, kv.dense_pages);
    else if (list[i].kv_policy.startsWith('quest')) assert.ok(kv.pages >= kv.dense_pages, `quest frees no memory: ${JSON.stringify(kv)}`);
    else assert.ok(kv.pages < kv.dense_pages, `${list[i].kv_policy} keeps fewer pages: ${JSON.stringify(kv)}`);
    // fastgen's heads each recover >= 1 - T of the prompt's attention
    if (list[i].kv_policy.startsWith('fastgen')) assert.ok(kv.attention_recovery >= 0.5, JSON.stringify(kv));
  }
  const m = await expectPoolEmpty(server.base);
  const kept = (x) => x['sieve:kv_pages_kept_total{model_name="llama"}'];
  const dense = (x) => x['sieve:kv_pages_dense_total{model_name="llama"}'];
  assert.ok(kept(m) - kept(before) < dense(m) - dense(before));
  await assert.rejects(client.completions.create({ model: 'llama', prompt: 'x', kv_policy: 'snapkv:B=' }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.error.param, 'kv_policy');
    return true;
  });
  // lserve picks its streaming heads from a calibration profile this server was not given
  await assert.rejects(client.completions.create({ model: 'llama', prompt: 'x', kv_policy: 'lserve:K=4' }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.error.param, 'kv_policy');
    assert.match(e.error.message, /--calibration/);
    return true;
  });
});

test('speculative per request: ngram drafts keep greedy text, streamed or not; usage and metrics count them', async () => {
  const prompt = 'Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom had a red ball. Tom';
  const speculative = { method: 'ngram', num_speculative_tokens: 4 };
  const request = { model: 'llama', prompt, max_tokens: 48, temperature: 0, ignore_eos: true };
  const plain = await client.completions.create(request);
  assert.equal(plain.usage.speculative, undefined, 'no speculation on this server by default');
  const before = await metrics(server.base);
  const spec = await client.completions.create({ ...request, speculative });
  assert.equal(spec.choices[0].text, plain.choices[0].text);
  const counted = spec.usage.speculative;
  assert.ok(counted.accepted_tokens > 0 && counted.draft_tokens >= counted.accepted_tokens, JSON.stringify(spec.usage));

  // Streamed, one chunk per engine event (several tokens when drafts were accepted).
  const stream = await client.completions.create({ ...request, speculative, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let chunks = 0;
  let usage;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    if (chunk.choices.length && chunk.choices[0].text) { text += chunk.choices[0].text; ++chunks; }
  }
  assert.equal(text, plain.choices[0].text);
  assert.ok(chunks < 48, `${chunks} chunks for 48 tokens`);
  assert.deepEqual(usage.speculative, counted);

  const chat = { model: 'llama', messages: [{ role: 'user', content: prompt }], max_tokens: 32, temperature: 0, ignore_eos: true };
  const chatPlain = await client.chat.completions.create(chat);
  const chatSpec = await client.chat.completions.create({ ...chat, speculative });
  assert.equal(chatSpec.choices[0].message.content, chatPlain.choices[0].message.content);
  assert.ok(chatSpec.usage.speculative, JSON.stringify(chatSpec.usage));

  const m = await expectPoolEmpty(server.base);
  const delta = (series) => (m[series] ?? 0) - (before[series] ?? 0);
  const label = '{model_name="llama"}';
  const accepted = 2 * counted.accepted_tokens + chatSpec.usage.speculative.accepted_tokens;
  assert.equal(delta(`vllm:spec_decode_num_draft_tokens_total${label}`), 2 * counted.draft_tokens + chatSpec.usage.speculative.draft_tokens);
  assert.equal(delta(`vllm:spec_decode_num_accepted_tokens_total${label}`), accepted);
  const drafts = delta(`vllm:spec_decode_num_drafts_total${label}`);
  assert.ok(drafts > 0);
  const perPosition = [0, 1, 2, 3].map((i) => delta(`vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="llama",position="${i}"}`));
  assert.equal(perPosition.reduce((a, b) => a + b, 0), accepted);
  assert.ok(perPosition.every((x, i) => x <= (i === 0 ? drafts : perPosition[i - 1])), JSON.stringify(perPosition));

  await assert.rejects(client.completions.create({ ...request, speculative: { method: 'ngram' } }), (e) => {
    assert.equal(e.status, 400);
    assert.equal(e.error.param, 'speculative');
    assert.match(e.error.message, /num_speculative_tokens/);
    return true;
  });
});

// Bodies that must all be refused with a 4xx and the error shape.
function malformedBodies(count, seed) {
  const next = rng(seed);
  const pick = (xs) => xs[Math.floor(next() * xs.length)];
  const bad = [
    '"hot"', 'true', '[]', '{}', '-1', '1e400', '-1e400', '1e30', '-1e30', '99999999999999999999999', '1.5', 'null',
    '"' + 'x'.repeat(10000) + '"', '[1,2,"x"]', '{"a":1}',
  ];
  const numericParams = {
    temperature: ['"hot"', '-0.5', '1e400', '101', 'true', '[]'],
    top_p: ['0', '-1', '1.01', '"x"', '{}'],
    top_k: ['-2', '1.5', '"x"', '1e30'],
    min_p: ['-0.1', '2', '"x"'],
    presence_penalty: ['3', '-3', '"x"'],
    frequency_penalty: ['2.5', '-9', '[]'],
    repetition_penalty: ['0', '-1', '1000', '"x"'],
    n: ['0', '-1', '1000', '1.5', '"2"'],
    max_tokens: ['0', '-5', '1e30', '"x"', '600', '99999999999999999999999'],
    max_completion_tokens: ['0', '-1', '"x"'],
    min_tokens: ['-1', '"x"', '100000'],
    seed: ['"x"', '1.5', '[]'],
    logprobs: ['-1', '21', '"x"', '1e30'],
    stop: ['1', '[1]', '[""]', '""', '{}'],
    stream: ['"yes"', '1', '[]'],
    logit_bias: ['[]', '{"x":1}', '{"99999":1}', '{"5":1000}', '{"5":"x"}', '{"-1":1}'],
    user: ['1', '[]'],
    ignore_eos: ['"x"', '2'],
  };
  const bodies = [];
  while (bodies.length < count) {
    const kind = Math.floor(next() * 9);
    const chat = next() < 0.5;
    const path = chat ? '/v1/chat/completions' : '/v1/completions';
    const base = chat ? '"messages":[{"role":"user","content":"hi"}]' : '"prompt":"Once"';
    switch (kind) {
      case 0: {  // broken JSON
        const valid = `{${base},"max_tokens":3}`;
        const cut = Math.floor(next() * (valid.length - 1));
        bodies.push({ path, body: pick([valid.slice(0, cut), valid.replace(':', ''), `${valid}}`, `{${base},}`, '', 'nul', '{"prompt":"a"\u0000}']) });
        break;
      }
      case 1: {  // a wrong type or out-of-range value for one parameter
        const param = pick(Object.keys(numericParams));
        bodies.push({ path, body: `{${base},"${param}":${pick(numericParams[param])}}`, param });
        break;
      }
      case 2:  // the prompt / messages themselves of the wrong shape
        bodies.push(chat
          ? { path, body: `{"messages":${pick(['[]', '{}', '"hi"', '[1]', '[{"content":"x"}]', '[{"role":1,"content":"x"}]', '[{"role":"user","content":5}]', '[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]', 'null'])}}` }
          : { path, body: `{"prompt":${pick(['[]', '{}', '1', 'true', '[[]]', '[-1]', '[1e30]', '[1.5]', '[99999]', '[[1,2],"x",3]', 'null', '""' /* BOS only is valid */].filter((p) => p !== '""'))}}` });
        break;
      case 3:  // not an object
        bodies.push({ path, body: pick(bad) });
        break;
      case 4: {  // invalid UTF-8 inside a string
        const bytes = Buffer.concat([Buffer.from(`{${chat ? '"messages":[{"role":"user","content":"' : '"prompt":"'}`),
          // Never valid: a 0xff byte, a lone continuation byte, an overlong '/', a surrogate, a cut sequence.
          Buffer.from(pick([[0xff], [0x80], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xe2, 0x28, 0xa1], [0xf0, 0x9f]])),
          Buffer.from(chat ? '"}]}' : '"}')]);
        bodies.push({ path, body: bytes });
        break;
      }
      case 5:  // enormous numbers and deep nesting
        bodies.push({ path, body: pick([`{${base},"max_tokens":${'9'.repeat(400)}}`, `{${base},"n":${'['.repeat(5000)}${']'.repeat(5000)}}`,
          `${'['.repeat(100000)}${']'.repeat(100000)}`, `{${base},"temperature":1e-400000}`.replace('1e-400000', '"nan"')]) });
        break;
      case 6:  // an enormous prompt (past the context)
        bodies.push({ path, body: chat ? `{"messages":[{"role":"user","content":"${'dog '.repeat(2000)}"}]}` : `{"prompt":"${'dog '.repeat(2000)}"}` });
        break;
      case 7:  // unknown model, unsupported features
        bodies.push({ path, body: `{${base},${pick(['"model":"gpt-9"', '"model":5', '"response_format":{"type":"yaml"}', '"stream_options":{"include_usage":true}', '"best_of":3', chat ? '"top_logprobs":3' : '"suffix":"x"'])}}` });
        break;
      default:  // negative or huge counts for the chat extensions
        bodies.push({ path, body: `{${base},${pick(['"min_tokens":-3', '"stop_token_ids":[-1]', '"stop_token_ids":"x"', '"stream_options":5',
          ...(chat ? ['"top_logprobs":-1', '"top_logprobs":50', '"add_generation_prompt":"x"', '"logprobs":true,"top_logprobs":21'] : ['"logprobs":true'])])}}` });
    }
  }
  return bodies;
}

test('1200 malformed bodies all get a 4xx with the error shape; the server still serves', async () => {
  const bodies = malformedBodies(1200, 4);
  const statuses = {};
  for (let i = 0; i < bodies.length; i += 8) {
    await Promise.all(bodies.slice(i, i + 8).map(async ({ path, body, param }) => {
      const r = await fetch(`${server.base}${path}`, {
        method: 'POST', body, headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      });
      const text = await r.text();
      statuses[r.status] = (statuses[r.status] ?? 0) + 1;
      const error = expectErrorShape(text, r.status, body);
      if (param && r.status === 400) {
        // Values JSON itself cannot hold (1e400) are refused as unparsable bodies.
        assert.ok(error.param === param || error.param === 'body' || error.message.includes(param), `names ${param}: ${text}`);
      }
    }));
  }
  assert.equal(Object.values(statuses).reduce((a, b) => a + b, 0), 1200);
  const ok = await client.chat.completions.create({ model: 'llama', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
  assert.equal(ok.usage.completion_tokens, 3);
  await expectPoolEmpty(server.base);
});

test('a full queue sheds load with 503; the server recovers', async () => {
  const small = await startServer(['--max-num-seqs', '1', '--max-queued', '1']);
  try {
    const c = new OpenAI({ apiKey: KEY, baseURL: `${small.base}/v1`, maxRetries: 0 });
    const results = await Promise.allSettled(Array.from({ length: 12 }, () =>
      c.completions.create({ model: 'llama', prompt: 'Once', max_tokens: 300, ignore_eos: true })));
    const shed = results.filter((r) => r.status === 'rejected');
    assert.ok(shed.length > 0, 'some requests were shed');
    for (const r of shed) {
      assert.equal(r.reason.status, 503, String(r.reason));
      assert.ok(r.reason.error.message.length > 0);
    }
    assert.ok(results.some((r) => r.status === 'fulfilled'), 'some requests were served');
    await expectPoolEmpty(small.base);
  } finally {
    const { code } = await small.stop();
    assert.equal(code, 0);
  }
});

test('SIGTERM lets a running stream finish within the grace period and exits 0', async () => {
  const s = await startServer([]);
  const c = new OpenAI({ apiKey: KEY, baseURL: `${s.base}/v1`, maxRetries: 0 });
  const stream = await c.completions.create({ model: 'llama', prompt: 'Once', max_tokens: 200, ignore_eos: true, stream: true });
  const exited = new Promise((res) => s.child.once('exit', (code) => res(code)));
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    if (++chunks === 2) s.child.kill('SIGTERM');
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'length', 'the in-flight stream completed');
  assert.equal(await exited, 0);
  assert.match(s.log, /shutting down/);
});

// A streamed chat answer put together: its content, its tool calls (by index) and finish reason.
async function readChatStream(stream) {
  const calls = [];
  let content = '';
  let finish = null;
  for await (const chunk of stream) {
    const delta = chunk.choices[0]?.delta ?? {};
    content += delta.content ?? '';
    for (const t of delta.tool_calls ?? []) {
      calls[t.index] ??= { id: '', type: '', function: { name: '', arguments: '' } };
      const call = calls[t.index];
      if (t.id) call.id = t.id;
      if (t.type) call.type = t.type;
      if (t.function?.name) call.function.name += t.function.name;
      if (t.function?.arguments) call.function.arguments += t.function.arguments;
    }
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  return { content, calls, finish };
}

// A small Hermes (Qwen) style template: the tools' names, the calls of earlier turns.
const HERMES_TEMPLATE = '{%- if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}' +
  '</tools><|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}' +
  '{% for c in m.tool_calls or [] %}<tool_call>\n{"name": "{{ c.function.name }}", "arguments": ' +
  '{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}' +
  '{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';

// Tool calls: a small template of each family (stories260K's context is 512 tokens), the family
// given by --tool-call-parser or detected from the template. tool_choice "required" or a named
// function constrains the output with a grammar, so even this tiny model returns parsed calls
// whose arguments fit the schema, streamed or not.
test('tools: tool_choice required / named returns parsed tool_calls for each family, streamed and not', async () => {
  const families = [
    { parser: 'hermes', detect: true, idPattern: /^call_[A-Za-z0-9]{24}$/, template: HERMES_TEMPLATE },
    { parser: 'llama3_json', idPattern: /^call_[A-Za-z0-9]{24}$/,
      template: '{% if tools %}Environment: ipython{% endif %}{% for m in messages %}<|start_header_id|>' +
        '{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}' +
        '<|start_header_id|>assistant<|end_header_id|>\n\n' },
    { parser: 'mistral', idPattern: /^[A-Za-z0-9]{9}$/,
      template: '{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS] {% for t in tools %}{{ t.function.name }} ' +
        '{% endfor %}[/AVAILABLE_TOOLS]{% endif %}{% for m in messages %}[INST] {{ m.content }}[/INST]{% endfor %}' },
  ];
  const tools = [
    { type: 'function', function: { name: 'get_weather', description: 'Weather of a city',
      parameters: { type: 'object', properties: { city: { enum: ['Paris', 'Rome'] }, unit: { enum: ['c', 'f'] } },
        required: ['city', 'unit'] } } },
    { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
  ];
  const checkCall = (call, names, family, where) => {
    assert.equal(call.type, 'function', where);
    assert.match(call.id, family.idPattern, where);
    assert.ok(names.includes(call.function.name), `${where}: ${call.function.name}`);
    const args = JSON.parse(call.function.arguments);
    if (call.function.name === 'get_weather') {
      assert.ok(['Paris', 'Rome'].includes(args.city) && ['c', 'f'].includes(args.unit), `${where}: ${call.function.arguments}`);
    } else {
      assert.deepEqual(args, {}, where);
    }
  };
  for (const family of families) {
    const file = join(tmpdir(), `sieve-e2e-tools-${process.pid}-${family.parser}.jinja`);
    writeFileSync(file, family.template);
    const s = await startServer(['--chat-template', file, ...(family.detect ? [] : ['--tool-call-parser', family.parser])]);
    try {
      assert.match(s.log, new RegExp(`tool calls: ${family.parser}`));
      const c = new OpenAI({ apiKey: KEY, baseURL: `${s.base}/v1`, maxRetries: 0 });
      const choices = [
        { tool_choice: 'required', parallel_tool_calls: false, names: ['get_weather', 'get_time'] },
        { tool_choice: { type: 'function', function: { name: 'get_weather' } }, names: ['get_weather'] },
      ];
      for (const choice of choices) {
        const request = { model: 'llama', messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
          tools, tool_choice: choice.tool_choice, max_tokens: 400, temperature: 0 };
        if (choice.parallel_tool_calls !== undefined) request.parallel_tool_calls = choice.parallel_tool_calls;
        const where = `${family.parser} ${JSON.stringify(choice.tool_choice)}`;

        const r = await c.chat.completions.create(request);
        const message = r.choices[0].message;
        assert.equal(r.choices[0].finish_reason, 'tool_calls', `${where}: ${JSON.stringify(r.choices[0])}`);
        assert.equal(message.content, null, where);
        assert.equal(message.tool_calls.length, 1, where);
        checkCall(message.tool_calls[0], choice.names, family, where);

        // Streamed: the name first, then the arguments, accumulated by index.
        const { content, calls, finish } = await readChatStream(await c.chat.completions.create({ ...request, stream: true }));
        assert.equal(finish, 'tool_calls', where);
        assert.equal(content, '', where);
        assert.equal(calls.length, 1, where);
        checkCall(calls[0], choice.names, family, `${where} (stream)`);
        // Greedy: the same call either way.
        assert.equal(calls[0].function.arguments, message.tool_calls[0].function.arguments, where);
      }
      // Issue 42: the arguments' keys come in the order the tool declares its parameters.
      const alarm = { type: 'function', function: { name: 'set_alarm', parameters: { type: 'object',
        properties: { minute: { type: 'integer' }, hour: { type: 'integer' }, label: { enum: ['wake', 'nap'] } },
        required: ['minute', 'hour', 'label'], additionalProperties: false } } };
      const set = await c.chat.completions.create({ model: 'llama', messages: [{ role: 'user', content: 'Wake me.' }],
        tools: [alarm], tool_choice: { type: 'function', function: { name: 'set_alarm' } }, max_tokens: 200, temperature: 0 });
      const [alarmCall] = set.choices[0].message.tool_calls;
      assert.deepEqual(Object.keys(JSON.parse(alarmCall.function.arguments)), ['minute', 'hour', 'label'],
        `${family.parser}: ${alarmCall.function.arguments}`);
      // The call goes back through the template for the next turn.
      const next = await c.chat.completions.create({ model: 'llama', max_tokens: 4, tools, messages: [
        { role: 'user', content: 'Weather?' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'abcDEF123', type: 'function',
          function: { name: 'get_weather', arguments: '{"city": "Paris", "unit": "c"}' } }] },
        { role: 'tool', tool_call_id: 'abcDEF123', content: 'sunny' }] });
      assert.ok(next.choices[0].finish_reason);
      // A named function that is not offered is a 400.
      await assert.rejects(c.chat.completions.create({ model: 'llama', messages: [{ role: 'user', content: 'x' }],
        tools, tool_choice: { type: 'function', function: { name: 'nope' } } }),
      (e) => e.status === 400 && e.param === 'tool_choice');
    } finally {
      unlinkSync(file);
      const { code } = await s.stop();
      assert.equal(code, 0, `graceful exit:\n${s.log}`);
    }
  }
});

// Issue 42: stories260K under tool_choice "required" (parallel calls allowed) writes call after
// call until max_tokens. Wherever the limit cuts, finish_reason is "length" (as OpenAI reports
// it), the complete calls are in tool_calls and the cut-off one is dropped, never content;
// streamed the same.
test('tools: output cut off by max_tokens says length and keeps only complete calls', async () => {
  const file = join(tmpdir(), `sieve-e2e-cutoff-${process.pid}.jinja`);
  writeFileSync(file, HERMES_TEMPLATE);
  const s = await startServer(['--chat-template', file]);
  try {
    const c = new OpenAI({ apiKey: KEY, baseURL: `${s.base}/v1`, maxRetries: 0 });
    const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object',
      properties: { city: { enum: ['Paris', 'Rome'] }, unit: { enum: ['c', 'f'] } }, required: ['city', 'unit'] } } }];
    const base = { model: 'llama', messages: [{ role: 'user', content: 'Weather in Paris and Rome?' }], tools,
      tool_choice: 'required', temperature: 0 };
    let cutInFirst = 0;
    let cutAfterACall = 0;
    let previous = 0;
    for (let max = 4; max <= 100; max += 6) {
      const where = `max_tokens ${max}`;
      const r = await c.chat.completions.create({ ...base, max_tokens: max });
      const [choice] = r.choices;
      const calls = choice.message.tool_calls ?? [];
      for (const call of calls) {
        const args = JSON.parse(call.function.arguments);
        assert.ok(['Paris', 'Rome'].includes(args.city) && ['c', 'f'].includes(args.unit), `${where}: ${call.function.arguments}`);
      }
      // No text but calls: null with calls, empty without (the cut-off call is not content).
      assert.equal(choice.message.content, calls.length > 0 ? null : '', `${where}: ${JSON.stringify(choice.message)}`);
      assert.ok(calls.length >= previous, `${where}: greedy outputs grow with max_tokens`);
      previous = calls.length;
      if (choice.finish_reason === 'length') {
        assert.equal(r.usage.completion_tokens, max, where);
        if (calls.length === 0) ++cutInFirst; else ++cutAfterACall;
      } else {
        assert.equal(choice.finish_reason, 'tool_calls', where);
        assert.ok(calls.length > 0, where);
      }

      const streamed = await readChatStream(await c.chat.completions.create({ ...base, max_tokens: max, stream: true }));
      assert.equal(streamed.content, '', `${where} (stream)`);
      assert.equal(streamed.finish, choice.finish_reason, `${where} (stream)`);
      assert.deepEqual(streamed.calls.map((call) => call.function), calls.map((call) => call.function), `${where} (stream)`);
    }
    assert.ok(cutInFirst > 0, 'some limit cut the first call');
    assert.ok(cutAfterACall > 0, 'some limit cut a later call');
    await expectPoolEmpty(s.base);
  } finally {
    unlinkSync(file);
    const { code } = await s.stop();
    assert.equal(code, 0, `graceful exit:\n${s.log}`);
  }
});
