// Hostile clients against a real `sieve serve`: slow-loris connections, trickled requests, the
// connection limit, malformed and unusual HTTP, and clients that stop reading. Run by ctest
// (test "serve_hostile"); needs SIEVE_BIN and SIEVE_SHARED_DIR like serve.test.mjs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KEY, expectPoolEmpty, metrics, startServer } from './lib.mjs';

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

function connect(port) {
  return new Promise((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1', () => resolve(socket));
    socket.once('error', reject);
  });
}

// Everything the server sends until it closes the connection (or `ms` pass); `closed` says which.
function collect(socket, ms = 5000) {
  return new Promise((resolve) => {
    let data = '';
    const timer = setTimeout(() => { socket.destroy(); resolve({ data, closed: false }); }, ms);
    socket.on('data', (d) => { data += d.toString('latin1'); });
    socket.on('error', () => {});
    socket.on('close', () => { clearTimeout(timer); resolve({ data, closed: true }); });
  });
}

async function raw(port, bytes, ms = 5000) {
  const socket = await connect(port);
  const reply = collect(socket, ms);
  socket.write(bytes);
  return reply;
}

const statusOf = (data) => Number((data.match(/^HTTP\/1\.[01] (\d{3})/) || [])[1]);
const authLine = `Authorization: Bearer ${KEY}\r\n`;

function percentile(values, p) {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

async function timedFetch(url, init) {
  const start = performance.now();
  const r = await fetch(url, init);
  await r.text();
  return { status: r.status, ms: performance.now() - start };
}

async function openConnections(base) {
  return (await metrics(base))['sieve:http_connections_open'];
}

test('512 slow-loris connections (over 3 x the old 160-thread pool) starve nobody: /health and completions are served throughout', async () => {
  const server = await startServer();
  const slow = [];
  try {
    const head = `POST /v1/completions HTTP/1.1\r\nHost: x\r\n${authLine}Content-Type: application/json\r\n` +
      'Content-Length: 100000\r\n\r\n{';
    for (let i = 0; i < 512; ++i) {
      const socket = await connect(server.port);
      socket.on('error', () => {});
      socket.write(head);
      slow.push(socket);
    }
    for (let i = 0; i < 100 && (await openConnections(server.base)) < 512; ++i) await sleep(20);
    assert.ok((await openConnections(server.base)) >= 512, 'the slow connections are open');

    const health = [];
    const completions = [];
    for (let round = 0; round < 20; ++round) {
      const h = await timedFetch(`${server.base}/health`);
      assert.equal(h.status, 200);
      health.push(h.ms);
      const c = await timedFetch(`${server.base}/v1/completions`, {
        method: 'POST',
        headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
        body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 8, temperature: 0 }),
      });
      assert.equal(c.status, 200);
      completions.push(c.ms);
      for (const s of slow.slice(round * 25, round * 25 + 25)) s.write(' ');  // trickle a byte
    }
    console.log(`with 512 slow-loris connections open: /health p50 ${percentile(health, 0.5).toFixed(1)} ms, ` +
      `max ${Math.max(...health).toFixed(1)} ms; 8-token completion p50 ${percentile(completions, 0.5).toFixed(1)} ms, ` +
      `max ${Math.max(...completions).toFixed(1)} ms`);
    // Served alongside the slow clients, not by dropping them (no wall-clock bound: CI is noisy).
    assert.ok((await openConnections(server.base)) >= 512, 'the slow connections are still open');
  } finally {
    for (const s of slow) s.destroy();
    await expectPoolEmpty(server.base);
    assert.equal((await server.stop()).code, 0, server.log);
  }
});

test('/health and /metrics answer while every compute thread is busy', async () => {
  const server = await startServer(['--metrics-port', '0']);
  try {
    const probePort = Number(server.log.match(/probes: http:\/\/127\.0\.0\.1:(\d+)/)[1]);
    let busyDone = false;
    const busy = Promise.all(Array.from({ length: 32 }, (_, i) => fetch(`${server.base}/v1/completions`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: `Once upon a time ${i}`, max_tokens: 300, ignore_eos: true, stream: true }),
    }).then((r) => r.text()))).then((texts) => { busyDone = true; return texts; });
    await sleep(200);
    const times = { health: [], metrics: [], probeHealth: [] };
    let firstRoundWhileBusy = false;
    for (let i = 0; i < 30; ++i) {
      let t = await timedFetch(`${server.base}/health`);
      assert.equal(t.status, 200);
      times.health.push(t.ms);
      t = await timedFetch(`${server.base}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } });
      assert.equal(t.status, 200);
      times.metrics.push(t.ms);
      t = await timedFetch(`http://127.0.0.1:${probePort}/health`);
      assert.equal(t.status, 200);
      times.probeHealth.push(t.ms);
      if (i === 0) firstRoundWhileBusy = !busyDone;
      await sleep(20);
    }
    const running = (await metrics(server.base))['vllm:num_requests_running{model_name="llama"}'];
    await busy;
    const line = (name) => `${name} p50 ${percentile(times[name], 0.5).toFixed(1)} ms, max ${Math.max(...times[name]).toFixed(1)} ms`;
    console.log(`while 32 streams decode (${running} still running at the end of probing): ${line('health')}; ` +
      `${line('metrics')}; --metrics-port ${line('probeHealth')}`);
    // The probes are answered while the streams still decode, not queued behind them (an
    // ordering, not a wall-clock bound: CI is noisy).
    assert.ok(firstRoundWhileBusy, `the first probes were answered before the 32 streams finished; ${line('health')}`);
    await expectPoolEmpty(server.base);
  } finally {
    assert.equal((await server.stop()).code, 0, server.log);
  }
});

test('a client that trickles a request is dropped when the request deadline expires; idle keep-alive connections close', async () => {
  const server = await startServer(['--request-timeout', '1', '--keep-alive-timeout', '1']);
  try {
    const socket = await connect(server.port);
    const reply = collect(socket, 10000);
    const start = performance.now();
    const text = `GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ${'a'.repeat(200)}\r\n\r\n`;
    let i = 0;
    const timer = setInterval(() => { if (i < text.length && !socket.destroyed) socket.write(text[i++]); }, 50);
    const { closed } = await reply;
    clearInterval(timer);
    const seconds = (performance.now() - start) / 1000;
    assert.ok(closed, 'the server closed the connection');
    // Not before the deadline; and it fired: the trickle (10 s) had not finished.
    assert.ok(seconds > 0.8, `dropped after ${seconds.toFixed(2)} s (deadline 1 s)`);
    assert.ok(i < text.length, 'before the request was complete');
    // The server counts the timeout in the handler that runs after the deadline closed the
    // socket, so the client may see the close first: wait for the count (up to 5 s).
    let timedOut = 0;
    for (let k = 0; k < 100 && timedOut < 1; ++k) {
      timedOut = (await metrics(server.base))['sieve:http_requests_timed_out_total'];
      if (timedOut < 1) await new Promise((res) => setTimeout(res, 50));
    }
    assert.ok(timedOut >= 1, `timed-out requests counted: ${timedOut}`);

    // Keep-alive: a served connection left idle is closed after --keep-alive-timeout.
    const idle = await connect(server.port);
    const idleReply = collect(idle, 10000);
    const idleStart = performance.now();
    idle.write('GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    const { data, closed: idleClosed } = await idleReply;
    const idleSeconds = (performance.now() - idleStart) / 1000;
    assert.equal(statusOf(data), 200);
    // Closed, not before the timeout, and within the 10 s the client waits.
    assert.ok(idleClosed && idleSeconds > 0.8, `idle close after ${idleSeconds.toFixed(2)} s`);
  } finally {
    assert.equal((await server.stop()).code, 0, server.log);
  }
});

test('over the connection limit: a fast 503, /health and /metrics still answer; over the reserve: refused', async () => {
  const server = await startServer(['--max-connections', '4', '--metrics-port', '0']);
  const held = [];
  try {
    const probePort = Number(server.log.match(/probes: http:\/\/127\.0\.0\.1:(\d+)/)[1]);
    const probes = `http://127.0.0.1:${probePort}`;
    for (let i = 0; i < 4; ++i) {
      const s = await connect(server.port);
      s.on('error', () => {});
      held.push(s);
    }
    for (let i = 0; i < 100 && (await openConnections(probes)) < 4; ++i) await sleep(20);

    // The held connections never close: a server that queued this one would never answer.
    let reply = await raw(server.port, `GET /v1/models HTTP/1.1\r\nHost: x\r\n${authLine}\r\n`);
    assert.equal(statusOf(reply.data), 503);
    assert.match(reply.data, /too many open connections/);
    const start = performance.now();
    reply = await raw(server.port, 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n');
    assert.equal(statusOf(reply.data), 200, '/health is served from the reserve');
    console.log(`at the connection limit: /health answered in ${(performance.now() - start).toFixed(1)} ms`);
    reply = await raw(server.port, `GET /metrics HTTP/1.1\r\nHost: x\r\n${authLine}\r\n`);
    assert.equal(statusOf(reply.data), 200, '/metrics is served from the reserve');

    // Fill the reserve (64) too: the next connection is closed at once.
    for (let i = 0; i < 64; ++i) {
      const s = await connect(server.port);
      s.on('error', () => {});
      held.push(s);
    }
    for (let i = 0; i < 100 && (await openConnections(probes)) < 68; ++i) await sleep(10);
    reply = await raw(server.port, 'GET /health HTTP/1.1\r\nHost: x\r\n\r\n', 3000);
    assert.ok(reply.closed && reply.data === '', 'refused');
    const m = await metrics(probes);
    assert.ok(m['sieve:http_connections_refused_total'] >= 1);
    assert.ok(m['sieve:http_connections_limited_total'] >= 1);
    assert.equal((await fetch(`${probes}/health`)).status, 200, 'the metrics port answers throughout');
  } finally {
    for (const s of held) s.destroy();
    assert.equal((await server.stop()).code, 0, server.log);
  }
});

test('hostile HTTP: each request gets a correct response or a clean close, and nothing leaks', async () => {
  const server = await startServer(['--max-body', '1']);
  const port = server.port;
  try {
    // Pipelined: two requests in one write, two responses in order.
    let r = await raw(port, 'GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    assert.equal((r.data.match(/HTTP\/1\.1 200/g) || []).length, 2, r.data);

    // Chunked request body.
    const body = '{"prompt":"Once upon a time"}';
    r = await raw(port, `POST /tokenize HTTP/1.1\r\nHost: x\r\n${authLine}Content-Type: application/json\r\n` +
      `Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n${(10).toString(16)}\r\n${body.slice(0, 10)}\r\n` +
      `${(body.length - 10).toString(16)}\r\n${body.slice(10)}\r\n0\r\n\r\n`);
    assert.equal(statusOf(r.data), 200, r.data);
    assert.match(r.data, /"tokens":\[1,/);

    // Expect: 100-continue: the body is sent after the interim response.
    let socket = await connect(port);
    let reply = collect(socket);
    socket.write(`POST /tokenize HTTP/1.1\r\nHost: x\r\n${authLine}Content-Type: application/json\r\n` +
      `Content-Length: ${body.length}\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n`);
    await new Promise((res) => socket.once('data', (d) => { assert.match(d.toString(), /^HTTP\/1\.1 100/); res(); }));
    socket.write(body);
    r = await reply;
    assert.match(r.data, /HTTP\/1\.1 200/);
    // ... and a body over the limit is refused before it is sent.
    r = await raw(port, `POST /tokenize HTTP/1.1\r\nHost: x\r\n${authLine}Content-Length: ${4 << 20}\r\n` +
      'Expect: 100-continue\r\n\r\n');
    assert.equal(statusOf(r.data), 413, r.data);

    // Absurd sizes: a 20 kB header line, a 1 MB request line, 200 header lines.
    r = await raw(port, `GET /health HTTP/1.1\r\nHost: x\r\nX-Long: ${'a'.repeat(20000)}\r\n\r\n`);
    assert.equal(statusOf(r.data), 431);
    r = await raw(port, `GET /${'a'.repeat(1 << 20)} HTTP/1.1\r\nHost: x\r\n\r\n`);
    assert.ok(statusOf(r.data) === 431 || (r.closed && r.data === ''), r.data.slice(0, 200));
    r = await raw(port, `GET /health HTTP/1.1\r\nHost: x\r\n${Array.from({ length: 200 }, (_, i) => `X-${i}: v\r\n`).join('')}\r\n`);
    assert.equal(statusOf(r.data), 431);

    // Invalid methods and targets, unknown methods, garbage.
    r = await raw(port, 'G@T /health HTTP/1.1\r\nHost: x\r\n\r\n');
    assert.equal(statusOf(r.data), 400);
    r = await raw(port, 'GET health HTTP/1.1\r\nHost: x\r\n\r\n');
    assert.equal(statusOf(r.data), 400);
    r = await raw(port, 'BREW /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
    assert.equal(statusOf(r.data), 405);
    r = await raw(port, `BREW /v1/nothing HTTP/1.1\r\nHost: x\r\n${authLine}Connection: close\r\n\r\n`);
    assert.equal(statusOf(r.data), 404);
    r = await raw(port, Buffer.from([0, 1, 2, 3, 255, 13, 10, 13, 10]));
    assert.ok(statusOf(r.data) === 400 || (r.closed && r.data === ''));

    // HTTP/1.0: answered as 1.0 and closed; a stream is sent unchunked until the close.
    r = await raw(port, 'GET /health HTTP/1.0\r\n\r\n');
    assert.match(r.data, /^HTTP\/1\.0 200/);
    assert.ok(r.closed);
    const stream = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 6, temperature: 0, stream: true });
    r = await raw(port, `POST /v1/completions HTTP/1.0\r\n${authLine}Content-Type: application/json\r\n` +
      `Content-Length: ${stream.length}\r\n\r\n${stream}`);
    assert.match(r.data, /^HTTP\/1\.0 200/);
    assert.doesNotMatch(r.data, /Transfer-Encoding/i);
    assert.match(r.data, /data: \[DONE\]\n\n$/);
    assert.ok(r.closed);

    // A client that closes after the headers, and one that resets mid-stream.
    socket = await connect(port);
    socket.on('error', () => {});
    socket.end(`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${authLine}Content-Length: 50\r\n\r\n`);
    const long = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true, stream: true });
    socket = await connect(port);
    socket.on('error', () => {});
    socket.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${authLine}Content-Type: application/json\r\n` +
      `Content-Length: ${long.length}\r\n\r\n${long}`);
    await new Promise((res) => socket.once('data', res));
    socket.resetAndDestroy();

    await expectPoolEmpty(server.base);
    assert.equal((await fetch(`${server.base}/health`)).status, 200);
    const ok = await fetch(`${server.base}/v1/completions`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once', max_tokens: 4 }),
    });
    assert.equal(ok.status, 200);
  } finally {
    assert.equal((await server.stop()).code, 0, server.log);
  }
});

// What walks a request recursively (the JSON Schema compiler, the GBNF parser and automaton, the
// chat template's context, copies and dumps of JSON) meets nesting and chains as deep as a body
// of a few MB can make them: each such request gets a 400 that says why, or its answer, and the
// server stays up. Each of the first four crashed the server (a stack overflow) before.
test('hostile JSON and grammars: deep nesting and long chains get a 400 or an answer, never a crash', async () => {
  const template = join(tmpdir(), `sieve-e2e-hostile-${process.pid}.jinja`);
  writeFileSync(template, '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n' +
    '{% endfor %}{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}' +
    '<|im_start|>assistant\n');
  const server = await startServer(['--chat-template', template, '--tool-call-parser', 'hermes']);
  const post = async (path, body) => {
    const r = await fetch(`${server.base}${path}`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      body,
    });
    return { status: r.status, json: await r.json() };
  };
  const chat = (extra) => `{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,${extra}}`;
  const nestedSchema = (depth) => '{"type":"array","items":'.repeat(depth) + '{"type":"string"}' + '}'.repeat(depth);
  try {
    let r = await post('/v1/chat/completions', chat(
      `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":${nestedSchema(10000)}}}`));
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.equal(r.json.error.param, 'body');
    assert.match(r.json.error.message, /nests arrays and objects deeper than 128 levels/);

    r = await post('/v1/chat/completions', chat(`"tools":[{"type":"function","function":{"name":"f","parameters":` +
      '{"type":"object","properties":{"a":'.repeat(100000) + '{"type":"string"}' + '}}'.repeat(100000) + '}}]'));
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.equal(r.json.error.param, 'body');

    r = await post('/v1/completions', JSON.stringify({
      prompt: 'hi', max_tokens: 3, grammar: `root ::= ${'('.repeat(100000)}"a"${')'.repeat(100000)}` }));
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.equal(r.json.error.param, 'grammar');
    assert.match(r.json.error.message, /groups nest deeper than 256 levels/);

    // 10^5 rules, each naming the next: fine, and answered.
    let chain = 'root ::= r0\n';
    for (let i = 0; i < 100000; ++i) chain += `r${i} ::= r${i + 1}\n`;
    chain += 'r100000 ::= "a"\n';
    r = await post('/v1/completions', JSON.stringify({ prompt: 'hi', max_tokens: 3, grammar: chain }));
    assert.equal(r.status, 200, JSON.stringify(r.json));
    assert.equal(r.json.choices[0].text, 'a');

    // 10^5 $defs, each a $ref to the next: one object of 10^5 keys (parsed in linear time), and
    // a chain of $refs deeper than the compiler follows.
    const defs = {};
    for (let i = 0; i < 100000; ++i) defs[`d${i}`] = { $ref: `#/$defs/d${i + 1}` };
    defs.d100000 = { type: 'string' };
    r = await post('/v1/chat/completions', chat(`"response_format":{"type":"json_schema","json_schema":{"name":"x",` +
      `"schema":${JSON.stringify({ $defs: defs, $ref: '#/$defs/d0' })}}}`));
    assert.equal(r.status, 400, JSON.stringify(r.json));
    assert.equal(r.json.error.param, 'response_format');
    assert.match(r.json.error.message, /schemas nest deeper than 256 levels/);

    await expectPoolEmpty(server.base);
    r = await post('/v1/chat/completions', chat(
      `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":${nestedSchema(100)}}}`));
    assert.equal(r.status, 200, JSON.stringify(r.json));
  } finally {
    assert.equal((await server.stop()).code, 0, server.log);
  }
});

test('a client that stops reading its stream is dropped and its pages return to the pool', async () => {
  const server = await startServer(['--max-stream-buffer', '65536', '--write-timeout', '3']);
  try {
    const before = (await metrics(server.base))['sieve:http_responses_aborted_total'];
    const body = JSON.stringify({ prompt: 'Once upon a time', max_tokens: 480, ignore_eos: true, stream: true,
      n: 16, logprobs: 20, temperature: 1 });  // ~11 MB of chunks: more than the kernel's buffers
    const socket = await connect(server.port);
    socket.on('error', () => {});
    socket.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\n${authLine}Content-Type: application/json\r\n` +
      `Content-Length: ${body.length}\r\n\r\n${body}`);
    socket.pause();  // never read: the kernel buffers fill, then the server's
    let m;
    for (let i = 0; i < 300; ++i) {
      m = await metrics(server.base);
      if (m['sieve:http_responses_aborted_total'] > before) break;
      await sleep(100);
    }
    assert.ok(m['sieve:http_responses_aborted_total'] > before, 'the slow reader was dropped');
    await expectPoolEmpty(server.base);
    socket.destroy();
  } finally {
    assert.equal((await server.stop()).code, 0, server.log);
  }
});

test('CORS is off by default; --allowed-origins answers preflight requests and marks responses', async () => {
  const preflight = (base, origin) => fetch(`${base}/v1/completions`, {
    method: 'OPTIONS',
    headers: { Origin: origin, 'Access-Control-Request-Method': 'POST',
      'Access-Control-Request-Headers': 'authorization,content-type' },
  });
  const plain = await startServer();
  try {
    const r = await preflight(plain.base, 'https://chat.example.com');
    assert.equal(r.headers.get('access-control-allow-origin'), null);
  } finally {
    assert.equal((await plain.stop()).code, 0, plain.log);
  }
  const server = await startServer(['--allowed-origins', 'https://chat.example.com,https://b.example.com']);
  try {
    let r = await preflight(server.base, 'https://chat.example.com');
    assert.equal(r.status, 204);
    assert.equal(r.headers.get('access-control-allow-origin'), 'https://chat.example.com');
    assert.match(r.headers.get('access-control-allow-methods'), /POST/);
    assert.match(r.headers.get('access-control-allow-headers'), /Authorization/);
    r = await preflight(server.base, 'https://evil.example.com');
    assert.equal(r.headers.get('access-control-allow-origin'), null);
    r = await fetch(`${server.base}/v1/models`, { headers: { Origin: 'https://b.example.com', Authorization: `Bearer ${KEY}` } });
    assert.equal(r.status, 200);
    assert.equal(r.headers.get('access-control-allow-origin'), 'https://b.example.com');
    r = await fetch(`${server.base}/v1/completions`, {
      method: 'POST',
      headers: { Origin: 'https://b.example.com', Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' },
      body: JSON.stringify({ prompt: 'Once', max_tokens: 3, stream: true }),
    });
    assert.equal(r.headers.get('access-control-allow-origin'), 'https://b.example.com');
    assert.match(await r.text(), /\[DONE\]/);
  } finally {
    assert.equal((await server.stop()).code, 0, server.log);
  }
});
