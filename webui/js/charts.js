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

// Counts past 9999 written short ("12.3k", "457k", "1.2M"): the text alternative keeps them exact.
function shortCount(n) {
  if (n < 10000) return String(n);
  const [value, unit] = n < 1e6 ? [n / 1e3, 'k'] : [n / 1e6, 'M'];
  return `${value < 100 ? value.toFixed(1) : Math.round(value)}${unit}`;
}

// About how wide a label is, in SVG units: 0.65 em a character is a digit's width with room to
// spare (a rough, safe side: a label judged too wide is only turned upright).
const textWidth = (text, fontSize) => text.length * 0.65 * fontSize;

// A histogram's buckets as bars: [{le, count}], `format` writing each upper bound. Labels run
// across where every one fits its bar's slot, else upright (a line of text is narrower than a
// slot), so that neighbours never overlap however many digits they have.
export function barChart(container, { buckets, label, format }) {
  const width = 440;
  const left = 8;
  const plotH = 110;
  const countFont = 11;  // .axis
  const boundFont = 10;  // .axis.small
  const shown = buckets.filter((b) => b.le !== Infinity || b.count > 0);
  const max = Math.max(1, ...shown.map((b) => b.count));
  const slot = (width - left) / Math.max(1, shown.length);
  const counts = shown.map((b) => (b.count > 0 ? shortCount(b.count) : ''));
  const bounds = shown.map((b) => `≤${b.le === Infinity ? '∞' : format(b.le)}`);
  const longest = (texts, font) => Math.max(0, ...texts.map((t) => textWidth(t, font)));
  const countsUpright = longest(counts, countFont) > slot - 2;
  const boundsUpright = longest(bounds, boundFont) > slot - 2;
  const top = 6 + (countsUpright ? longest(counts, countFont) : countFont);
  const bottom = 8 + (boundsUpright ? longest(bounds, boundFont) : boundFont + 4);
  const height = Math.ceil(top + plotH + bottom);
  const base = top + plotH;  // the bars' foot
  const svg = frame(container, label, width, height);
  if (shown.every((b) => b.count === 0)) {
    svg.append(el('text', { x: width / 2, y: top + plotH / 2, class: 'axis', 'text-anchor': 'middle' },
      'no requests measured yet'));
  }
  // Upright text turned about its anchor: its glyphs stand left of the anchor by about 0.7 em,
  // so the anchor sits that far right of the slot's middle.
  const upright = (x, y, font, anchor, text, className) => {
    const ax = x + 0.35 * font;
    return el('text', { x: ax, y, class: className, 'text-anchor': anchor, transform: `rotate(-90 ${ax} ${y})` }, text);
  };
  shown.forEach((b, i) => {
    const h = (plotH * b.count) / max;
    const x = left + i * slot;
    const middle = x + slot / 2;
    svg.append(el('rect', { x: x + 2, y: base - h, width: Math.max(1, slot - 4), height: h, class: 'bar' }));
    if (b.count > 0) {
      svg.append(countsUpright
        ? upright(middle, base - h - 3, countFont, 'start', counts[i], 'axis')
        : el('text', { x: middle, y: base - h - 3, class: 'axis', 'text-anchor': 'middle' }, counts[i]));
    }
    svg.append(boundsUpright
      ? upright(middle, base + 4, boundFont, 'end', bounds[i], 'axis small')
      : el('text', { x: middle, y: base + 4 + boundFont, class: 'axis small', 'text-anchor': 'middle' }, bounds[i]));
  });
}
