// Small SVG charts, redrawn whole on each update (a few hundred elements at most). Each is an
// image with a text alternative that states the current numbers.
const SVG = 'http://www.w3.org/2000/svg';

function el(name, attributes = {}, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attributes)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function frame(container, label, width, height) {
  const svg = el('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', 'aria-label': label });
  container.replaceChildren(svg);
  return svg;
}

// Lines over time: series [{name, className, values}] (oldest first, same length), y from 0 to
// max; `samples` is how many values the x axis spans.
export function lineChart(container, { series, max, samples, label }) {
  const width = 600;
  const height = 180;
  const left = 40;
  const bottom = 20;
  const plotW = width - left - 10;
  const plotH = height - bottom - 10;
  const svg = frame(container, label, width, height);
  const y = (v) => 10 + plotH - (plotH * v) / Math.max(1, max);
  for (const t of [0, 0.5, 1]) {
    const v = Math.round(max * t);
    svg.append(el('line', { x1: left, x2: width - 10, y1: y(v), y2: y(v), class: 'grid' }));
    svg.append(el('text', { x: left - 4, y: y(v) + 4, class: 'axis', 'text-anchor': 'end' }, String(v)));
  }
  svg.append(el('text', { x: left, y: height - 4, class: 'axis' }, 'older'));
  svg.append(el('text', { x: width - 10, y: height - 4, class: 'axis', 'text-anchor': 'end' }, 'now'));
  for (const s of series) {
    const n = s.values.length;
    if (n === 0) continue;
    const x = (i) => left + (plotW * (samples - n + i)) / Math.max(1, samples - 1);
    const points = s.values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(' ');
    svg.append(el('polyline', { points, class: `series ${s.className}` }));
  }
}

// A histogram's buckets as bars: [{le, count}], `format` writing each upper bound.
export function barChart(container, { buckets, label, format }) {
  const width = 440;
  const height = 160;
  const left = 36;  // room for the first bound's label, which is rotated leftwards
  const bottom = 34;
  const top = 14;
  const svg = frame(container, label, width, height);
  const shown = buckets.filter((b) => b.le !== Infinity || b.count > 0);
  const max = Math.max(1, ...shown.map((b) => b.count));
  const slot = (width - left) / Math.max(1, shown.length);
  if (shown.every((b) => b.count === 0)) {
    svg.append(el('text', { x: width / 2, y: (height - bottom) / 2, class: 'axis', 'text-anchor': 'middle' },
      'no requests measured yet'));
  }
  shown.forEach((b, i) => {
    const h = ((height - bottom - top) * b.count) / max;
    const x = left + i * slot;
    svg.append(el('rect', { x: x + 2, y: height - bottom - h, width: Math.max(1, slot - 4), height: h, class: 'bar' }));
    if (b.count > 0) {
      svg.append(el('text', { x: x + slot / 2, y: height - bottom - h - 2, class: 'axis', 'text-anchor': 'middle' }, String(b.count)));
    }
    const bound = b.le === Infinity ? '∞' : format(b.le);
    svg.append(el('text', {
      x: x + slot / 2, y: height - bottom + 12, class: 'axis small', 'text-anchor': 'end',
      transform: `rotate(-35 ${x + slot / 2} ${height - bottom + 12})`,
    }, `≤${bound}`));
  });
}
