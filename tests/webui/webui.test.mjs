// Browser tests of the page `sieve serve` serves at /: Debian's chromium, headless, driven by
// playwright-core, against real servers. Run by ctest (test "webui"); needs SIEVE_BIN,
// SIEVE_SHARED_DIR, SIEVE_CHROMIUM and SIEVE_WEBUI_SCREENSHOTS, and `npm ci` in this folder
// (scripts/test.sh does it).
//
// Two servers: stories260K (greedy answers to compare with the API), and a generated
// random-weight model with an 8192-token context, slow enough per token (a few milliseconds)
// that a request lives for seconds: long enough to be seen on the dashboard and stopped.
import { test, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { BIN, KEY, SHARED, execFileP, expectPoolEmpty, metrics, startServer } from '../server/e2e/lib.mjs';

const CHROMIUM = process.env.SIEVE_CHROMIUM;
const SHOTS = process.env.SIEVE_WEBUI_SCREENSHOTS;
assert.ok(CHROMIUM, 'SIEVE_CHROMIUM names the chromium binary');
assert.ok(SHOTS, 'SIEVE_WEBUI_SCREENSHOTS names the screenshot folder');
const AXE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');

let browser;
let stories;  // server of stories260K
let slow;  // server of the generated model
let dir;
const pages = [];  // every page opened by a test, with the console errors it logged

before(async () => {
  mkdirSync(SHOTS, { recursive: true });
  dir = mkdtempSync(join(tmpdir(), 'sieve-webui-'));
  const model = join(dir, 'slow.gguf');
  await execFileP(BIN, ['gen-model', '--dim', '256', '--layers', '4', '--heads', '8', '--kv-heads', '4', '--ffn', '768',
    '--ctx', '8192', '--type', 'f32', '--seed', '7', '--vocab', `${SHARED}/models/stories260K.gguf`, '-o', model]);
  [stories, slow, browser] = await Promise.all([
    startServer([]),
    // One thread: an answer of thousands of tokens must still be streaming when a test looks
    // at it (on two idle cores this model writes ~1,900 tokens/s).
    startServer(['--served-model-name', 'llama', '--threads', '1'], model),
    chromium.launch({ executablePath: CHROMIUM }),
  ]);
});

after(async () => {
  await browser?.close();
  for (const server of [stories, slow]) {
    if (!server) continue;
    const { code } = await server.stop();
    assert.equal(code, 0, `graceful exit:\n${server.log}`);
  }
  if (dir) rmSync(dir, { recursive: true, force: true });
});

// Each test's pages must have logged no console error and thrown nothing.
afterEach(async () => {
  const errors = pages.flatMap((p) => p.errors);
  for (const p of pages.splice(0)) await p.context.close();
  assert.deepEqual(errors, [], 'console errors');
});

// A page of `server` in a fresh browser context (its own localStorage), with the API key already
// kept unless `withKey` is false. `allowed` filters console errors the test expects.
async function openPage(server, { hash = '', withKey = true, allowed = () => false } = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  if (withKey) await context.addInitScript((key) => localStorage.setItem('sieve.apiKey', key), KEY);
  const page = await context.newPage();
  const entry = { context, page, errors: [] };
  page.on('console', (m) => {
    if (m.type() === 'error' && !allowed(m)) entry.errors.push(`${m.text()} (${m.location().url})`);
  });
  page.on('pageerror', (e) => entry.errors.push(`uncaught: ${e.message}`));
  pages.push(entry);
  await page.goto(`${server.base}/${hash}`);
  await page.locator('#model-status', { hasText: 'llama' }).waitFor();
  return page;
}

// axe-core in the page: no serious or critical violation of WCAG 2 A/AA or best practice.
async function audit(page, what) {
  await page.evaluate(AXE);
  const violations = await page.evaluate(async () => {
    const result = await window.axe.run(document);
    return result.violations
      .filter((v) => v.impact === 'serious' || v.impact === 'critical')
      .map((v) => `${v.id} (${v.impact}): ${v.help} at ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`);
  });
  assert.deepEqual(violations, [], `accessibility of ${what}`);
}

async function screenshot(page, name) {
  const path = join(SHOTS, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  console.log(`screenshot: ${path}`);
}

async function api(server, path, body) {
  const r = await fetch(`${server.base}${path}`, {
    method: 'POST',
    headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
    body: JSON.stringify(body),
  });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}

async function setField(page, id, value) {
  await page.fill(`#${id}`, String(value));
}

const lastAnswer = (page) => page.locator('#chat-log article[data-role="assistant"]').last();

test('--no-webui serves no page and the log names none', async () => {
  const server = await startServer(['--no-webui']);
  try {
    const r = await fetch(`${server.base}/`);
    assert.equal(r.status, 401, 'GET / is an API route like any other, behind the key');
    const withKey = await fetch(`${server.base}/`, { headers: { Authorization: `Bearer ${KEY}` } });
    assert.equal(withKey.status, 404);
    assert.doesNotMatch(server.log, /web page/);
    assert.match(stories.log, /web page \(chat, KV dashboard, compare\): http:\/\/127\.0\.0\.1:\d+\//);
  } finally {
    await server.stop();
  }
});

test('the API key is asked for once and kept', async () => {
  const context = await browser.newContext();
  const page = await context.newPage();
  const errors = [];
  page.on('console', (m) => {
    // The first calls' 401s are how the page learns that the server needs a key.
    if (m.type() === 'error' && !m.text().includes('status of 401')) errors.push(m.text());
  });
  page.on('pageerror', (e) => errors.push(e.message));
  pages.push({ context, page, errors });
  await page.goto(`${stories.base}/`);
  const dialog = page.getByRole('dialog', { name: 'API key' });
  await dialog.waitFor();
  await expectFocused(page, 'key-input');
  await page.keyboard.type(KEY);
  await page.keyboard.press('Enter');
  await page.locator('#model-status', { hasText: 'llama' }).waitFor();
  assert.equal(await page.evaluate(() => localStorage.getItem('sieve.apiKey')), KEY);
  await page.reload();
  await page.locator('#model-status', { hasText: 'llama' }).waitFor();
  assert.equal(await dialog.isVisible(), false, 'no dialog once the key is kept');
});

async function expectFocused(page, id) {
  // Playwright's own timeout, not a shorter one: on a loaded machine the focus moves late.
  await page.waitForFunction((want) => document.activeElement && document.activeElement.id === want, id)
    .catch(async () => {
      assert.fail(`focus on #${id}, not on ${await page.evaluate(() => document.activeElement?.outerHTML.slice(0, 120))}`);
    });
}

test('every view loads with no console error and no serious accessibility violation', async () => {
  const page = await openPage(stories);
  for (const view of ['chat', 'dashboard', 'compare']) {
    await page.click(`#nav-${view}`);
    await page.locator(`#view-${view}`).waitFor({ state: 'visible' });
    assert.equal(await page.getAttribute(`#nav-${view}`, 'aria-current'), 'page');
    await audit(page, `the empty ${view} view`);
  }
  // The page and its libraries are in the binary: no request left the server.
  const r = await fetch(`${stories.base}/webui/vendor/marked.esm.js`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/javascript/);
  assert.match(r.headers.get('content-security-policy'), /script-src 'self'/);
});

test('a chat answer streams and equals the same request over the API (greedy)', async () => {
  const page = await openPage(stories);
  await setField(page, 'set-temperature', 0);
  await setField(page, 'set-max-tokens', 64);
  await setField(page, 'set-kv-policy', 'full');
  const prompt = 'Tell me a story about a cat.';
  await page.fill('#chat-input', prompt);
  await page.click('#chat-send');
  await lastAnswer(page).and(page.locator('[data-finish]')).waitFor();
  const stored = await page.evaluate(() => JSON.parse(localStorage.getItem('sieve.conversations')));
  const answer = stored[0].messages[1];
  assert.equal(stored[0].messages[0].content, prompt);

  const expected = await api(stories, '/v1/chat/completions', {
    messages: [{ role: 'user', content: prompt }], temperature: 0, top_p: 1, max_tokens: 64, kv_policy: 'full',
  });
  assert.ok(expected.choices[0].message.content.length > 0);
  assert.equal(answer.content, expected.choices[0].message.content, 'streamed in the page = the API answer');
  assert.equal(answer.stats.completion_tokens, expected.usage.completion_tokens);
  // Shown as markdown: the same words (whitespace aside).
  const shown = await lastAnswer(page).locator('.body').innerText();
  const words = (s) => s.replace(/\s+/g, ' ').trim();
  assert.equal(words(shown), words(answer.content));
  const stats = await lastAnswer(page).locator('.stats').innerText();
  assert.match(stats, /TTFT \d+ ms/);
  assert.match(stats, /[\d.]+ tok\/s/);
  assert.match(stats, new RegExp(`${expected.usage.completion_tokens} tokens`));

  // Kept across a reload, with its settings.
  await page.reload();
  await lastAnswer(page).waitFor();
  assert.equal(await page.inputValue('#set-temperature'), '0');
  await audit(page, 'the chat with an answer');
  await screenshot(page, 'chat');
});

test('keyboard only: skip link, tab order, Enter sends, Shift+Enter adds a line', async () => {
  const page = await openPage(stories);
  await page.keyboard.press('Tab');
  await expectFocused(page, 'skip-to-message');
  await page.keyboard.press('Enter');
  await expectFocused(page, 'chat-input');
  await page.keyboard.type('Once upon');
  await page.keyboard.press('Shift+Enter');
  await page.keyboard.type('a time');
  assert.equal(await page.inputValue('#chat-input'), 'Once upon\na time');
  await page.keyboard.press('Enter');
  await lastAnswer(page).and(page.locator('[data-finish]')).waitFor();
  assert.equal(await page.inputValue('#chat-input'), '', 'sent');
  assert.equal(await page.locator('#chat-log article[data-role="user"]').innerText(), 'You\nOnce upon\na time');
  // From the message box on: send, then (stop is disabled) this conversation's settings in order.
  await page.focus('#chat-input');
  for (const id of ['chat-send', 'set-system', 'set-temperature', 'set-top-p', 'set-max-tokens', 'set-min-tokens',
    'set-seed', 'set-kv-policy']) {
    await page.keyboard.press('Tab');
    await expectFocused(page, id);
  }
  // Backwards from the message box: the messages (scrollable by keyboard), then the conversations.
  await page.focus('#chat-input');
  await page.keyboard.press('Shift+Tab');
  await expectFocused(page, 'chat-log');
  await page.keyboard.press('Shift+Tab');
  assert.match(await page.evaluate(() => document.activeElement.className), /conv-delete/);
});

test('stop cancels the answer and the pool returns to empty', async () => {
  const page = await openPage(slow);
  await setField(page, 'set-max-tokens', 8000);
  await setField(page, 'set-min-tokens', 8000);
  await page.fill('#chat-input', 'Say a lot.');
  await page.keyboard.press('Enter');  // the box keeps focus after fill
  // Tokens arrive, the request holds pages; then Stop.
  await page.waitForFunction(() => {
    const body = [...document.querySelectorAll('#chat-log article[data-role="assistant"] .body')].pop();
    return body && body.textContent.length > 20;
  });
  let m = await metrics(slow.base);
  assert.ok(m['sieve:kv_pages_used{model_name="llama"}'] > 0, 'the answer holds KV pages');
  assert.equal(await page.isEnabled('#chat-send'), false, 'no second message while one streams');
  await page.click('#chat-stop');
  await lastAnswer(page).and(page.locator('[data-finish="stopped"]')).waitFor();
  assert.match(await lastAnswer(page).locator('.stats').innerText(), /stopped/);
  m = await expectPoolEmpty(slow.base);
  assert.equal(await page.isEnabled('#chat-send'), true);
  assert.ok(await page.isDisabled('#chat-stop'));
});

// Streams a completion in the background; resolves `id` with the response id at its first chunk.
function background(server, body) {
  const controller = new AbortController();
  let resolveId;
  const id = new Promise((res) => { resolveId = res; });
  const done = (async () => {
    const r = await fetch(`${server.base}/v1/completions`, {
      method: 'POST', signal: controller.signal,
      headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ ...body, stream: true }),
    });
    assert.equal(r.status, 200);
    const decoder = new TextDecoder();
    for await (const bytes of r.body) {
      const m = decoder.decode(bytes).match(/"id":"([^"]+)"/);
      if (m) resolveId(m[1]);
    }
  })().catch((e) => { if (e.name !== 'AbortError') throw e; });
  return { id, done, stop: () => controller.abort() };
}

test('the dashboard shows running requests\' pages, fewer once snapkv compresses, and each head', async () => {
  // No 404 is allowed: a request that finishes between the overview that lists it and the ask
  // for its heads (a step later) still answers, with its heads at its end.
  const page = await openPage(slow, { hash: '#dashboard' });
  // A 1500-token prompt (token ids), then up to 6500 tokens (the context is 8192): both run for
  // seconds.
  const prompt = Array.from({ length: 1500 }, (_, i) => 3 + ((i * 37) % 500));
  const common = { prompt, max_tokens: 6500, ignore_eos: true, temperature: 0 };
  const dense = background(slow, { ...common, kv_policy: 'full' });
  const sparse = background(slow, { ...common, kv_policy: 'snapkv:B=64' });
  const [denseId, sparseId] = await Promise.all([dense.id, sparse.id]);
  try {
    const row = (id) => page.locator(`#seq-body tr[data-id="${id}"]`);
    await row(denseId).waitFor();
    await row(sparseId).waitFor();
    // The snapkv request holds fewer pages than dense once compressed; the full one holds its dense size.
    // Both are waited for in one snapshot: on a loaded machine the dense request can arrive after the
    // sparse one has been compressed, and shows 0 pages while it waits for its prefill.
    await page.waitForFunction(([sparse, dense]) => {
      const held = (id) => {
        const r = document.querySelector(`#seq-body tr[data-id="${id}"]`);
        return r ? [Number(r.dataset.pagesHeld), Number(r.dataset.pagesDense)] : [0, 0];
      };
      const [s, sDense] = held(sparse), [d] = held(dense);
      return s > 0 && s < sDense && d > 0;
    }, [sparseId, denseId]);
    const d = await row(denseId).evaluate((r) => [Number(r.dataset.pagesHeld), Number(r.dataset.pagesDense)]);
    assert.ok(d[0] > 0 && d[0] === d[1], `the dense request holds its dense size: ${d}`);
    assert.match(await row(sparseId).innerText(), /snapkv:B=64/);
    assert.equal(await page.innerText('#dash-running'), '2');
    // Its heads: layers x KV heads, each keeping what snapkv chose.
    await row(sparseId).getByRole('button').click();
    const map = page.locator('#heads-map table');
    await map.waitFor();
    assert.equal(await map.locator('tbody tr').count(), 4, 'one row per layer');
    assert.equal(await map.locator('tbody tr').first().locator('td').count(), 4, 'one cell per KV head');
    assert.match(await map.locator('td').first().innerText(), /snapkv[\s\S]*\d+ keys/);
    await page.locator('#ttft-chart svg').waitFor();
    await audit(page, 'the dashboard with running requests');
    await screenshot(page, 'dashboard');
  } finally {
    dense.stop();
    sparse.stop();
    await Promise.all([dense.done, sparse.done]);
  }
  await expectPoolEmpty(slow.base);
  await page.locator('#seq-body tr').first().waitFor({ state: 'detached' });
  await page.locator('#dash-used', { hasText: /^0$/ }).waitFor();
  // The chosen request's heads stay, as they stood when it was stopped.
  await page.locator('#heads-info', { hasText: /has finished/ }).waitFor();
  // (cancelled, or on a fast machine "length": 6500 tokens at a few milliseconds each)
  assert.match(await page.innerText('#heads-info'), new RegExp(`^${sparseId} has finished \\((cancelled|length)\\); at its end, 4 layers`));
  assert.match(await page.locator('#heads-map td').first().innerText(), /snapkv[\s\S]*\d+ keys/);
});

test('compare shows each policy\'s answer, KV kept and agreement with the dense model', async () => {
  const page = await openPage(stories, { hash: '#compare' });
  const prompt = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her ' +
    'friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog came and took the ball. ' +
    'Lily was sad and she cried. Her mom came and gave her a hug. They went home and ate cookies together.';
  await page.fill('#cmp-prompt', prompt);
  await setField(page, 'cmp-max-tokens', 48);
  // Two policies: full (the reference) and snapkv; the third default removed.
  await page.getByRole('button', { name: 'Remove policy 3' }).click();
  assert.equal(await page.locator('#cmp-policies input').count(), 2);
  await page.click('#cmp-run');
  const cards = page.locator('#cmp-results article');
  await page.waitForFunction(() => [...document.querySelectorAll('#cmp-results article')]
    .every((a) => a.dataset.state === 'done') && document.querySelectorAll('#cmp-results article').length === 2);
  assert.equal(await cards.count(), 2);
  const figures = async (policy) => page.locator(`#cmp-results article[data-policy="${policy}"]`).evaluate((a) => ({
    answer: a.querySelector('.answer').textContent,
    pages: Number(a.querySelector('[data-kv-pages]').dataset.kvPages),
    kept: a.querySelector('[data-kv-pages]').textContent,
    agreed: Number(a.querySelector('[data-agreed]').dataset.agreed),
    compared: Number(a.querySelector('[data-compared]').dataset.compared),
  }));
  const full = await figures('full');
  const snap = await figures('snapkv:B=64');
  // The dense answer equals the API's and agrees with itself read back under the dense cache.
  const expected = await api(stories, '/v1/completions', { prompt, max_tokens: 48, temperature: 0, seed: 1, kv_policy: 'full' });
  assert.equal(full.answer, expected.choices[0].text);
  const dense = expected.usage.kv_cache;
  assert.equal(full.kept, `${dense.pages} of ${dense.dense_pages} pages (100%)`);
  assert.ok(full.compared > 40, `compared ${full.compared} tokens`);
  assert.equal(full.agreed, full.compared, 'greedy dense tokens are the dense top-1');
  // snapkv kept fewer pages; its agreement is a count over its tokens.
  assert.ok(snap.pages < full.pages, `snapkv kept ${snap.pages} pages, dense ${full.pages}`);
  assert.ok(snap.compared > 0 && snap.agreed <= snap.compared);
  await audit(page, 'the compare view with results');
  await screenshot(page, 'compare');
});

// Every /v1/chat/completions request the page sends, with its response's status.
function recordChats(page) {
  const chats = [];
  page.on('response', (r) => {
    if (r.url().endsWith('/v1/chat/completions')) chats.push({ body: r.request().postDataJSON(), status: r.status() });
  });
  return chats;
}

// The prompt tokens of a chat request's messages, as the server counts them.
async function promptTokens(server, messages) {
  return (await api(server, '/tokenize', { messages })).count;
}

const answered = (page, n) => page.waitForFunction((want) =>
  document.querySelectorAll('#chat-log article[data-role="assistant"][data-finish]').length >= want, n);

// A user turn of ~70 tokens and answers of at least 200 (min_tokens): the second turn's
// conversation, 340 to 400 tokens, leaves less than the default Max tokens (256) of the 512-token
// context, and the third has no room left.
const SHORT_TURN = 'Once upon a time there was a little girl named Lily who loved to play in the park with her ' +
  'friends, and every day she ran to the big tree, climbed it, and looked at the birds and the sky.';
// ~116 tokens.
const LONG_TURN = 'Once upon a time there was a little girl named Lily who loved to play in the park with her ' +
  'friends, and every day she ran to the big tree, climbed it, and looked at the birds and the sky. One day ' +
  'she saw a small dog under the tree. The dog was sad because it was lost, so Lily gave it some bread.';

test('chat turns on the 512-token model with the default Max tokens never get a 400: Max tokens is lowered to the room left', async () => {
  const page = await openPage(stories);
  assert.equal(await page.inputValue('#set-max-tokens'), '256', 'the default Max tokens');
  await setField(page, 'set-min-tokens', 200);
  await setField(page, 'set-seed', 5);
  const chats = recordChats(page);
  let lowered = 0;
  for (let turn = 1; turn <= 4; ++turn) {
    await page.fill('#chat-input', `${SHORT_TURN} Turn ${turn}.`);
    await page.keyboard.press('Enter');
    // Either answered (perhaps with Max tokens lowered), or not sent: the history leaves no room.
    await page.waitForFunction((want) =>
      document.querySelectorAll('#chat-log article[data-role="assistant"][data-finish]').length >= want ||
      document.querySelector('#chat-room').dataset.kind === 'full', turn);
    const kind = await page.getAttribute('#chat-room', 'data-kind');
    if (kind === 'full') {
      assert.match(await page.innerText('#chat-room-text'), /Not sent: this conversation takes \d+ of the model's 512 tokens/);
      assert.equal(await page.inputValue('#chat-input'), `${SHORT_TURN} Turn ${turn}.`, 'the message stays in the box');
      await page.click('#chat-drop');  // leaves out the oldest turns and sends
      await answered(page, turn);
    }
    if (await page.getAttribute('#chat-room', 'data-kind') === 'lowered') {
      ++lowered;
      assert.match(await page.innerText('#chat-room-text'),
        /Max tokens lowered from 256 to \d+ for this answer: the conversation takes \d+ of the model's 512 tokens/);
    }
    assert.match(await page.innerText('#chat-context'), /This conversation: \d+ of 512 tokens of context/);
  }
  assert.ok(lowered > 0, 'some turn had Max tokens lowered');
  assert.equal(chats.length, 4, 'one request a turn');
  for (const chat of chats) {
    assert.equal(chat.status, 200, JSON.stringify(chat.body).slice(0, 200));
    const n = await promptTokens(stories, chat.body.messages);
    assert.ok(n + chat.body.max_tokens <= 512, `${n} prompt tokens + max_tokens ${chat.body.max_tokens} fit the context`);
    assert.ok(chat.body.min_tokens <= chat.body.max_tokens);
  }
  assert.ok(chats.some((c) => c.body.max_tokens < 256));
  await audit(page, 'the chat with Max tokens lowered');
  await screenshot(page, 'chat-context-lowered');
});

test('a chat whose history fills the context offers to leave out the oldest turns, and then answers', async () => {
  const page = await openPage(stories);
  // A conversation of six turns, ~650 tokens: more than the context.
  const old = [];
  for (let i = 1; i <= 6; ++i) {
    old.push({ role: 'user', content: `${LONG_TURN} Part ${i}.` });
    old.push({ role: 'assistant', content: `The end of part ${i}. Lily and the dog went home and were happy.` });
  }
  assert.ok(await promptTokens(stories, old) > 512);
  await page.evaluate((messages) => localStorage.setItem('sieve.conversations', JSON.stringify([{
    id: 'cfull', title: 'A long story', settings: { system: '', temperature: 0, top_p: 1, max_tokens: 256, min_tokens: 0, seed: '', kv_policy: '' },
    messages,
  }])), old);
  await page.reload();
  await page.locator('#chat-log article').nth(11).waitFor();
  const chats = recordChats(page);
  await page.fill('#chat-input', 'What happened next?');
  await page.keyboard.press('Enter');
  await page.locator('#chat-room[data-kind="full"]').waitFor();
  assert.match(await page.innerText('#chat-room-text'), /Not sent: this conversation takes \d+ of the model's 512 tokens of context, which leaves no room for an answer/);
  assert.equal(await page.inputValue('#chat-input'), 'What happened next?');
  assert.equal(chats.length, 0, 'nothing sent that the server would refuse');
  await screenshot(page, 'chat-context-full');
  await page.getByRole('button', { name: 'Drop the oldest turns' }).click();
  await answered(page, 1);  // the stored answers have no stats: the new one is the first finished
  assert.equal(chats.length, 1);
  assert.equal(chats[0].status, 200);
  // The oldest turns are kept on the page and in storage, marked, and no longer sent.
  const stored = await page.evaluate(() => JSON.parse(localStorage.getItem('sieve.conversations'))[0].messages);
  assert.equal(stored.length, 14);
  const leftOut = stored.filter((m) => m.left_out);
  assert.ok(leftOut.length >= 2 && leftOut.length % 2 === 0, `whole turns left out: ${leftOut.length}`);
  assert.deepEqual(stored.slice(0, leftOut.length).map((m) => Boolean(m.left_out)), leftOut.map(() => true), 'the oldest ones');
  assert.equal(await page.locator('#chat-log article[data-left-out="true"]').count(), leftOut.length);
  assert.match(await page.locator('#chat-log article[data-left-out="true"] .who').first().innerText(), /left out/);
  const sent = chats[0].body.messages;
  assert.equal(sent.length, 14 - leftOut.length - 1, 'the request has every message but those left out');
  assert.equal(sent[sent.length - 1].content, 'What happened next?');
  assert.equal(chats[0].body.max_tokens, 256, 'room made for the whole Max tokens');
  assert.ok(await promptTokens(stories, sent) + 256 <= 512);
  assert.match(await page.innerText('#chat-room-text'), new RegExp(`Left out the ${leftOut.length} oldest messages`));
  await audit(page, 'the chat with turns left out');
  await screenshot(page, 'chat-context-dropped');
});

test('a finished compressed answer is parked for its next turn, and the dashboard shows it', async () => {
  const prompt = SHORT_TURN;
  const first = await api(stories, '/v1/completions',
    { prompt, max_tokens: 16, temperature: 0, kv_policy: 'streaming:S=4,W=16' });
  const page = await openPage(stories);
  await page.click('#nav-dashboard');
  await page.waitForFunction(() => Number(document.querySelector('#dash-parked').textContent) > 0);
  const state = await (await fetch(`${stories.base}/v1/kv/state`, { headers: { Authorization: `Bearer ${KEY}` } })).json();
  assert.ok(state.pool.parked_sequences >= 1);
  assert.match(await page.innerText('#dash-parked-seqs'), /^\d+ conversations?$/);
  // The next turn resends the answer as text and continues from the parked K/V.
  const next = await api(stories, '/v1/completions',
    { prompt: prompt + first.choices[0].text + ' Then she went home.', max_tokens: 4, temperature: 0,
      kv_policy: 'streaming:S=4,W=16' });
  assert.equal(next.usage.prompt_tokens_details.cached_tokens,
    first.usage.prompt_tokens + first.usage.completion_tokens - 1);
  await audit(page, 'the dashboard with a parked conversation');
});

test('a finished chat answer stays on the KV dashboard with its policy and the pages it kept', async () => {
  const page = await openPage(stories);
  await setField(page, 'set-max-tokens', 32);
  await setField(page, 'set-kv-policy', 'full');
  await page.fill('#chat-input', 'Tell me about a dog.');
  await page.keyboard.press('Enter');
  await answered(page, 1);
  const stats = await page.evaluate(() => JSON.parse(localStorage.getItem('sieve.conversations'))[0].messages[1].stats);
  assert.match(stats.id, /^chatcmpl-/);
  await page.click('#nav-dashboard');
  const row = page.locator(`#fin-body tr[data-id="${stats.id}"]`);
  await row.waitFor();
  const text = await row.innerText();
  assert.match(text, /\bfull\b/);
  assert.match(text, /(stop|length), \d+ s ago/);
  assert.equal(await row.getAttribute('data-pages-held'), String(stats.kv_cache.pages));
  assert.equal(await row.getAttribute('data-pages-dense'), String(stats.kv_cache.dense_pages));
  assert.match(text, new RegExp(`${stats.kv_cache.pages} / ${stats.kv_cache.dense_pages}`));
  assert.equal(await page.isVisible('#fin-empty'), false);
  assert.match(await page.innerText('#dash-cached-info'), /free/);
  assert.match(await page.innerText('#dash-cached-free'), /^\d+$/);
  // Its heads, as they stood at its end: a click on its name, which keeps the focus across polls.
  const pick = row.getByRole('button');
  await pick.click();
  await page.locator('#heads-map table').waitFor();
  assert.match(await page.innerText('#heads-info'), new RegExp(`^${stats.id} has finished \\((stop|length)\\); at its end, 5 layers`));
  assert.equal(await page.locator('#heads-map tbody tr').count(), 5, 'one row per layer');
  assert.match(await page.locator('#heads-map td').first().innerText(), /full[\s\S]*\d+ keys/);
  assert.equal(await pick.getAttribute('aria-pressed'), 'true');
  await page.waitForTimeout(1500);  // polls go by
  assert.equal(await pick.evaluate((b) => b === document.activeElement), true, 'the focus stays');
  await audit(page, 'the dashboard with a finished request');
  await screenshot(page, 'dashboard-finished');
  await pick.click();  // and a second click puts the map away
  await page.locator('#heads-map table').waitFor({ state: 'detached' });
  assert.equal(await pick.getAttribute('aria-pressed'), 'false');
});

test('25 running requests: the table lists 20 and expands to all', async () => {
  const page = await openPage(slow, { hash: '#dashboard' });
  const load = Array.from({ length: 25 }, (_, i) => background(slow, {
    prompt: `Request ${i} once upon a time`, max_tokens: 4000, ignore_eos: true, temperature: 0,
  }));
  await Promise.all(load.map((l) => l.id));
  try {
    await page.locator('#seq-more-text', { hasText: 'The first 20 of 25 sequences.' }).waitFor();
    assert.equal(await page.locator('#seq-body tr').count(), 20);
    const more = page.locator('#seq-more');
    assert.equal(await more.getAttribute('aria-expanded'), 'false');
    await more.click();
    await page.locator('#seq-body tr').nth(24).waitFor();
    assert.equal(await page.locator('#seq-body tr').count(), 25);
    assert.equal(await more.getAttribute('aria-expanded'), 'true');
    await audit(page, 'the dashboard with 25 requests');
    await screenshot(page, 'dashboard-25-expanded');
    await more.click();
    await page.waitForFunction(() => document.querySelectorAll('#seq-body tr').length === 20);
    await screenshot(page, 'dashboard-25-collapsed');
  } finally {
    for (const l of load) l.stop();
    await Promise.all(load.map((l) => l.done));
  }
  await expectPoolEmpty(slow.base);
  // Stopped, they are the recently finished: the last 16 of them.
  await page.locator('#seq-more-line').waitFor({ state: 'hidden' });
  await page.waitForFunction(() => document.querySelectorAll('#fin-body tr').length === 16);
  assert.match(await page.locator('#fin-body tr').first().innerText(), /cancelled/);
});

// Every text label of the chart in `selector` lies inside it and overlaps no other (their boxes,
// as the browser lays them out).
async function expectLabelsApart(page, selector) {
  const boxes = await page.locator(`${selector} svg`).evaluate((svg) => {
    const box = (r) => ({ left: r.left, top: r.top, right: r.right, bottom: r.bottom });
    return {
      frame: box(svg.getBoundingClientRect()),
      labels: [...svg.querySelectorAll('text')].map((t) => ({ text: t.textContent, ...box(t.getBoundingClientRect()) })),
    };
  });
  assert.ok(boxes.labels.length > 10, `${selector} has its labels`);
  for (const a of boxes.labels) {
    assert.ok(a.left >= boxes.frame.left - 0.5 && a.right <= boxes.frame.right + 0.5 &&
      a.top >= boxes.frame.top - 0.5 && a.bottom <= boxes.frame.bottom + 0.5, `${selector}: '${a.text}' lies inside the chart`);
  }
  for (let i = 0; i < boxes.labels.length; ++i) {
    for (let j = i + 1; j < boxes.labels.length; ++j) {
      const [a, b] = [boxes.labels[i], boxes.labels[j]];
      const overlap = Math.min(a.right, b.right) - Math.max(a.left, b.left) > 0.5 &&
        Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top) > 0.5;
      assert.ok(!overlap, `${selector}: '${a.text}' and '${b.text}' overlap`);
    }
  }
  return boxes.labels.map((l) => l.text);
}

test('histogram labels do not overlap, with 5-digit counts', async () => {
  // Some traffic, so that the live charts have bars.
  await Promise.all(Array.from({ length: 8 }, (_, i) => api(stories, '/v1/completions', {
    prompt: `Story ${i}:`, max_tokens: 64, ignore_eos: true, temperature: 0,
  })));
  const page = await openPage(stories, { hash: '#dashboard' });
  await page.locator('#itl-chart svg rect').first().waitFor();
  await expectLabelsApart(page, '#ttft-chart');
  await expectLabelsApart(page, '#itl-chart');
  // The worst case, which timing alone cannot be made to give: every bucket of the server's own
  // histograms counting 5 and 6 digits, drawn by the page's chart code beside the live charts.
  await page.evaluate(async () => {
    const { barChart } = await import('/webui/js/charts.js');
    const { histogram, parseMetrics } = await import('/webui/js/prometheus.js');
    const key = localStorage.getItem('sieve.apiKey');
    const samples = parseMetrics(await (await fetch('/metrics', { headers: { Authorization: `Bearer ${key}` } })).text());
    const ms = (seconds) => (seconds < 1 ? `${Math.round(seconds * 1000)} ms` : `${seconds} s`);
    for (const [name, digits] of [['vllm:time_to_first_token_seconds', 5], ['vllm:inter_token_latency_seconds', 6]]) {
      const figure = document.createElement('figure');
      figure.className = 'chart-box';
      figure.innerHTML = `<figcaption>${name}, ${digits}-digit counts</figcaption><div class="chart" id="worst-${digits}"></div>`;
      document.querySelector('.histograms').append(figure);
      const buckets = histogram(samples, name).buckets.map((b, i) => ({ le: b.le, count: 10 ** (digits - 1) + 7919 * i }));
      barChart(figure.querySelector('.chart'), { buckets, format: ms, label: `${name} with ${digits}-digit counts` });
    }
  });
  const five = await expectLabelsApart(page, '#worst-5');
  assert.ok(five.includes('10.0k'), `5-digit counts written short: ${five.join(' ')}`);
  await expectLabelsApart(page, '#worst-6');
  await page.locator('.histograms').screenshot({ path: join(SHOTS, 'dashboard-histograms.png') });
  console.log(`screenshot: ${join(SHOTS, 'dashboard-histograms.png')}`);
});
