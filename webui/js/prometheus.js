// Prometheus text exposition (what /metrics serves), read into samples.

// [{name, labels: {k: v}, value}] for every sample line.
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = line.match(/^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return samples;
}

// The first sample of a metric (gauges and counters here carry only model_name).
export function metricValue(samples, name) {
  const s = samples.find((x) => x.name === name);
  return s ? s.value : null;
}

// A histogram: per-bucket counts (not cumulative) with their upper bounds, plus count and sum.
export function histogram(samples, name) {
  const cumulative = samples
    .filter((s) => s.name === `${name}_bucket`)
    .map((s) => ({ le: s.labels.le === '+Inf' ? Infinity : Number(s.labels.le), total: s.value }))
    .sort((a, b) => a.le - b.le);
  let before = 0;
  const buckets = cumulative.map(({ le, total }) => {
    const count = total - before;
    before = total;
    return { le, count };
  });
  return { buckets, count: metricValue(samples, `${name}_count`) ?? 0, sum: metricValue(samples, `${name}_sum`) ?? 0 };
}
