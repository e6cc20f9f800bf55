// Replicas behind HAProxy, restarted one by one under load without losing a request: three
// `sieve serve` of stories260K on loopback behind deploy/haproxy/haproxy.cfg, streaming load from
// `sieve bench-serve` through HAProxy, and each replica in turn gets SIGTERM (its /ready turns
// 503, HAProxy stops sending to it, its running streams finish, it exits 0) and is replaced by a
// new one on the same port. No request may fail, and every greedy output must equal the one a
// single server gives for the same prompt. Fails, rather than skips, without haproxy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BIN, MODEL, execFileP } from './lib.mjs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../../..');
const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

async function freePort() {
  const server = createServer();
  await new Promise((res) => server.listen(0, '127.0.0.1', res));
  const { port } = server.address();
  await new Promise((res) => server.close(res));
  return port;
}

function startReplica(port) {
  const child = spawn(BIN, ['serve', '-m', MODEL, '--port', String(port), '--shutdown-grace', '20',
    '--kv-memory', '64'], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr.on('data', (d) => { log += d.toString(); });
  const exited = new Promise((res) => child.once('exit', (code, signal) => res({ code, signal })));
  return { child, port, exited, get log() { return log; } };
}

async function waitFor(url, status, what, ms = 30000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const r = await fetch(url).catch(() => null);
    if (r && r.status === status) return;
    if (Date.now() > deadline) throw new Error(`${what}: ${url} did not answer ${status}`);
    await sleep(20);
  }
}

// vllm:num_requests_running of the server on `port` (0 when it does not answer).
async function runningRequests(port) {
  const text = await fetch(`http://127.0.0.1:${port}/metrics`).then((r) => r.text()).catch(() => '');
  const m = text.match(/^vllm:num_requests_running(?:\{[^}]*\})? (\S+)/m);
  return m ? Number(m[1]) : 0;
}

// The same prompts (seeded) and greedy decoding, so runs can be compared request by request.
function benchServe(base, out, extra = []) {
  const args = ['bench-serve', '--base-url', base, '--dataset', 'random', '--tokenizer', MODEL,
    '--input-len', '24', '--output-len', '256', '--num-prompts', '150', '--seed', '18',
    '--timeout', '60', '--out', out, ...extra];
  return execFileP(BIN, args, { maxBuffer: 16 << 20 }).then(() => JSON.parse(readFileSync(out, 'utf8')).runs[0]);
}

test('3 replicas behind HAProxy: a rolling restart under streaming load loses no request and changes no output', async () => {
  try {
    await execFileP('haproxy', ['-v']);
  } catch {
    assert.fail('haproxy is not installed: scripts/install-deps.sh installs it (Debian package haproxy)');
  }
  const dir = mkdtempSync(join(tmpdir(), 'sieve-replicas-'));
  const ports = [await freePort(), await freePort(), await freePort()];
  const lbPort = await freePort();
  const replicas = ports.map(startReplica);
  let haproxy = null;
  let haproxyLog = '';
  try {
    await Promise.all(ports.map((p) => waitFor(`http://127.0.0.1:${p}/ready`, 200, 'replica start')));

    // A single server's outputs: the reference.
    const reference = await benchServe(`http://127.0.0.1:${ports[0]}`, join(dir, 'single.json'), ['--max-concurrency', '8']);
    assert.equal(reference.summary.failed, 0);

    const template = readFileSync(join(ROOT, 'deploy/haproxy/haproxy.cfg'), 'utf8');
    const servers = ports.map((p, i) => `    server replica-${i + 1} 127.0.0.1:${p}`).join('\n');
    const cfg = join(dir, 'haproxy.cfg');
    // The shipped configuration, with each request logged (printed if a request fails).
    writeFileSync(cfg, template.replace(/^@SERVERS@$/m, servers).replace('local0 notice', 'local0 info')
      .replace('mode http\n', 'mode http\n    option httplog\n'));
    const env = { ...process.env, SIEVE_LB_ADDR: '127.0.0.1', SIEVE_LB_PORT: String(lbPort), SIEVE_CHECK_INTER: '100ms' };
    haproxy = spawn('haproxy', ['-W', '-db', '-f', cfg], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    haproxy.stdout.on('data', (d) => { haproxyLog += d.toString(); });
    haproxy.stderr.on('data', (d) => { haproxyLog += d.toString(); });
    const lb = `http://127.0.0.1:${lbPort}`;
    await waitFor(`${lb}/ready`, 200, `haproxy start\n${haproxyLog}`, 10000);

    const start = performance.now();
    const load = benchServe(lb, join(dir, 'balanced.json'), ['--max-concurrency', '6', '--request-rate', '30']);
    const restarts = [];
    for (let i = 0; i < replicas.length; ++i) {
      await sleep(400);
      const old = replicas[i];
      // On a loaded machine the load can still be starting, or between requests on this replica:
      // wait (up to ~2 s) until it runs one, so that its drain has something to finish.
      for (let k = 0; k < 200 && (await runningRequests(old.port)) === 0; ++k) await sleep(10);
      const t0 = performance.now();
      old.child.kill('SIGTERM');
      let ready = 200;  // until the signal is handled
      for (let k = 0; k < 200 && ready === 200; ++k) {
        ready = await fetch(`http://127.0.0.1:${old.port}/ready`).then((r) => r.status).catch(() => 'gone');
        if (ready === 200) await sleep(5);
      }
      const { code } = await old.exited;
      assert.equal(code, 0, `replica ${i + 1} exits 0 after its drain:\n${old.log}`);
      assert.doesNotMatch(old.log, /cancelling/, 'every in-flight request finished within the grace');
      const drained = old.log.match(/shutting down: [^;]*; (\d+) request\(s\) in flight/);
      replicas[i] = startReplica(old.port);
      await waitFor(`http://127.0.0.1:${old.port}/ready`, 200, 'replacement start');
      restarts.push({ replica: i + 1, ready_after_sigterm: ready, in_flight: drained ? Number(drained[1]) : null,
        replaced_ms: Math.round(performance.now() - t0) });
    }
    const restartsDone = performance.now() - start;
    const balanced = await load;
    const elapsed = performance.now() - start;
    console.log(`restarts: ${JSON.stringify(restarts)}; done after ${restartsDone.toFixed(0)} ms of a ` +
      `${elapsed.toFixed(0)} ms run; ${balanced.summary.completed} requests, ${balanced.summary.failed} failed`);
    assert.ok(restartsDone < elapsed, 'every restart happened while the load ran');
    assert.ok(restarts.some((r) => r.in_flight > 0), 'some replica drained running requests');
    for (const r of restarts) {
      if (r.in_flight > 0) assert.equal(r.ready_after_sigterm, 503, `replica ${r.replica}: /ready is 503 while it drains`);
    }
    if (balanced.summary.failed) console.log(`HAProxy's log but 200s:\n${haproxyLog.split('\n').filter((l) => !/ 200 /.test(l)).join('\n')}`);
    assert.equal(balanced.summary.failed, 0, JSON.stringify(balanced.summary.errors));
    assert.equal(balanced.requests.length, reference.requests.length);
    for (const r of balanced.requests) {
      const want = reference.requests.find((q) => q.index === r.index);
      assert.ok(r.ok, `request ${r.index}: ${r.error}`);
      assert.equal(r.generated_text, want.generated_text, `request ${r.index}: the same greedy output as one server`);
    }
  } finally {
    if (haproxy) haproxy.kill('SIGTERM');
    for (const r of replicas) r.child.kill('SIGTERM');
    await Promise.all(replicas.map((r) => r.exited));
    rmSync(dir, { recursive: true, force: true });
  }
});
