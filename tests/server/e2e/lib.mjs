// Helpers shared by the end-to-end tests: start a `sieve serve` on a free port, scrape /metrics,
// wait for the KV pool to empty.
import assert from 'node:assert/strict';
import { spawn, execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { promisify } from 'node:util';

export const execFileP = promisify(execFile);
export const BIN = process.env.SIEVE_BIN;
export const SHARED = process.env.SIEVE_SHARED_DIR;
export const MODEL = `${SHARED}/models/stories260K.gguf`;
export const KEY = 'e2e-secret';

for (const [what, path] of [['SIEVE_BIN', BIN], ['the stories260K model (SIEVE_SHARED_DIR)', MODEL]]) {
  if (!path || !existsSync(path)) throw new Error(`missing ${what}: ${path}`);
}

// Deterministic pseudo-random numbers (mulberry32), so failures can be replayed.
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export async function startServer(extraArgs = [], model = MODEL) {
  const child = spawn(BIN, ['serve', '-m', model, '--port', '0', '--api-key', KEY, '--shutdown-grace', '2',
    '--kv-memory', '64', ...extraArgs], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 30000);
    child.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    child.on('exit', (code) => reject(new Error(`server exited with ${code}:\n${log}`)));
  });
  const base = `http://127.0.0.1:${port}`;
  for (let i = 0; ; ++i) {
    const r = await fetch(`${base}/health`).catch(() => null);
    if (r && r.status === 200) break;
    if (r) assert.equal(r.status, 503, '/health answers 503 while loading');
    if (i > 600) throw new Error(`server not ready:\n${log}`);
    await new Promise((res) => setTimeout(res, 50));
  }
  const server = { child, base, port, get log() { return log; } };
  server.stop = async () => {
    const exited = new Promise((res) => child.once('exit', (code, signal) => res({ code, signal })));
    child.kill('SIGTERM');
    return exited;
  };
  return server;
}

export async function curl(args) {
  // -w appends the status code on its own line after the body.
  const { stdout } = await execFileP('curl', ['-sS', '-w', '\n%{http_code}', ...args], { maxBuffer: 64 << 20 });
  const cut = stdout.lastIndexOf('\n');
  return { status: Number(stdout.slice(cut + 1)), body: stdout.slice(0, cut) };
}

export const auth = ['-H', `Authorization: Bearer ${KEY}`];
export const jsonHeaders = [...auth, '-H', 'Content-Type: application/json'];

// A GET, sent once more if the connection fails under it: fetch reuses idle keep-alive
// connections, and a server may close one (its --keep-alive-timeout) just as a request goes out
// on it, the race RFC 9112 (9.3.1) lets clients retry idempotent requests after.
export async function get(url, init = {}) {
  try {
    return await fetch(url, init);
  } catch (e) {
    if (!(e instanceof TypeError)) throw e;  // fetch's network error
    return fetch(url, init);
  }
}

export async function metrics(base) {
  const r = await get(`${base}/metrics`, { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(r.status, 200);
  const values = {};
  for (const line of (await r.text()).split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const cut = line.lastIndexOf(' ');
    values[line.slice(0, cut)] = Number(line.slice(cut + 1));
  }
  return values;
}

// Waits until no request runs or waits and no KV page is referenced; fails with the metrics.
export async function expectPoolEmpty(base) {
  let m;
  for (let i = 0; i < 200; ++i) {
    m = await metrics(base);
    if (m['sieve:kv_pages_used{model_name="llama"}'] === 0 && m['vllm:num_requests_running{model_name="llama"}'] === 0 &&
        m['vllm:num_requests_waiting{model_name="llama"}'] === 0) {
      assert.equal(m['vllm:kv_cache_usage_perc{model_name="llama"}'], 0);
      return m;
    }
    await new Promise((res) => setTimeout(res, 50));
  }
  assert.fail(`KV pages still in use: ${JSON.stringify(m)}`);
}

