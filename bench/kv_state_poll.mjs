// Polls GET /v1/kv/state like a dashboard: one keep-alive connection, HZ polls a second (0: back
// to back), until COUNT polls or SIGTERM; then prints one JSON line: polls, latency median / p99 /
// max in ms, response bytes (median) and the fewest running sequences any answer showed.
//   node bench/kv_state_poll.mjs URL HZ [COUNT]
import http from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';

const [url, hzArg, countArg] = process.argv.slice(2);
const hz = Number(hzArg ?? 1);
const count = countArg ? Number(countArg) : Infinity;
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
let stopping = false;
process.on('SIGTERM', () => { stopping = true; });

function get() {
  return new Promise((resolve, reject) => {
    const start = process.hrtime.bigint();
    http.get(url, { agent }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({
        status: res.statusCode,
        ms: Number(process.hrtime.bigint() - start) / 1e6,
        body: Buffer.concat(chunks),
      }));
    }).on('error', reject);
  });
}

const latencies = [], sizes = [];
let minRunning = Infinity;
let next = performance.now();
while (!stopping && latencies.length < count) {
  const r = await get();
  if (r.status !== 200) {
    console.error(`GET ${url}: ${r.status} ${r.body}`);
    process.exit(1);
  }
  latencies.push(r.ms);
  sizes.push(r.body.length);
  minRunning = Math.min(minRunning, JSON.parse(r.body).requests.running);
  if (hz > 0) {
    next += 1000 / hz;
    const wait = next - performance.now();
    if (wait > 0) await sleep(wait);
  }
}
const quantile = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? s[Math.min(s.length - 1, Math.floor(q * s.length))] : null;
};
console.log(JSON.stringify({
  polls: latencies.length,
  median_ms: quantile(latencies, 0.5),
  p99_ms: quantile(latencies, 0.99),
  max_ms: quantile(latencies, 1),
  bytes: quantile(sizes, 0.5),
  min_running: latencies.length ? minRunning : null,
}));
agent.destroy();
