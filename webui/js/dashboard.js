// KV dashboard: polls GET /v1/kv/state and /metrics twice a second while shown. The pool's pages
// over the last minute, each live sequence's pages held against its dense size (the first
// MAX_ROWS unless expanded), the last finished ones (a chat answer takes a fraction of a second:
// between two polls), what each (layer, KV head) of a chosen sequence keeps, and the latency
// histograms.
import { ApiError, getJson, getText } from './api.js';
import { barChart, lineChart } from './charts.js';
import { histogram, metricValue, parseMetrics } from './prometheus.js';

const $ = (id) => document.getElementById(id);
const POLL_MS = 500;
const HISTORY = 120;  // samples kept for the pool chart: a minute at POLL_MS
const MAX_ROWS = 20;  // running sequences listed before the table collapses

const ms = (seconds) => (seconds < 1 ? `${Math.round(seconds * 1000)} ms` : `${seconds} s`);

function cell(row, text, className) {
  const td = document.createElement('td');
  td.textContent = text;
  if (className) td.className = className;
  row.append(td);
  return td;
}

// "3 / 8 (38%)" beside a bar of the share.
function pagesCell(row, held, dense) {
  const pages = cell(row, '', 'pages');
  const share = dense > 0 ? held / dense : 0;
  const bar = document.createElement('span');
  bar.className = 'bar-track';
  bar.setAttribute('aria-hidden', 'true');
  const fill = document.createElement('span');
  fill.className = 'bar-fill';
  fill.style.width = `${Math.min(100, share * 100)}%`;
  bar.append(fill);
  const text = document.createElement('span');
  text.className = 'pages-text';
  text.textContent = `${held} / ${dense}` + (dense > 0 ? ` (${Math.round(share * 100)}%)` : '');
  pages.append(bar, text);
}

const recoveryText = (r) => (r === null || r === undefined ? '–' : `${(r * 100).toFixed(1)}%`);
const requestName = (s) => `${s.id}${s.index ? ` #${s.index}` : ''}`;

// "fastgen:special+punct" -> a CSS class of its family: full, window, heavy, fastgen, quest.
function kindClass(kind) {
  if (kind === 'full' || kind === 'fastgen:full') return 'kind-full';
  if (kind === 'window') return 'kind-window';
  if (kind === 'quest') return 'kind-quest';
  if (kind.startsWith('fastgen')) return 'kind-fastgen';
  return 'kind-heavy';  // snapkv, adakv, heavy_hitters: keys chosen by attention scores
}

export function mountDashboard() {
  const history = [];  // {used, cached, free}
  let timer = 0;
  let shown = false;
  let selected = null;  // {id, index} of the sequence whose heads are mapped
  let finishedNote = '';  // said in place of the map once the chosen sequence has finished
  let finishedHeads = null;  // its heads at its end, shown until another request is chosen
  let hasKvState = true;  // false on a server without /v1/kv/state: /metrics only
  let busy = false;  // a poll is in flight
  let showAll = false;  // the running table lists every sequence, not the first MAX_ROWS
  let again = false;  // and another was asked for meanwhile (a click): run it right after

  function renderFigures({ running, waiting, usage, pool }) {
    $('dash-running').textContent = running ?? '–';
    $('dash-waiting').textContent = waiting ?? '–';
    $('dash-usage').textContent = usage === null ? '–' : `${(usage * 100).toFixed(1)}%`;
    $('dash-used').textContent = pool.used ?? '–';
    $('dash-cached').textContent = pool.cached ?? '–';
    $('dash-cached-free').textContent = pool.cachedFree ?? '–';
    $('dash-free').textContent = pool.free ?? '–';
    $('dash-parked').textContent = pool.parked ?? '–';
    $('dash-parked-seqs').textContent = pool.parkedSeqs === undefined || pool.parkedSeqs === null
      ? '–' : `${pool.parkedSeqs} conversation${pool.parkedSeqs === 1 ? '' : 's'}`;
  }

  function renderPoolChart(total) {
    const last = history[history.length - 1];
    lineChart($('pool-chart'), {
      series: [
        { className: 'used', values: history.map((h) => h.used) },
        { className: 'cached', values: history.map((h) => h.cached ?? 0) },
        { className: 'free', values: history.map((h) => h.free) },
      ],
      max: total,
      samples: HISTORY,
      label: `Pool pages over the last minute; now ${last.used} used, ${last.cached ?? 0} cached, ${last.free} free of ${total}`,
    });
  }

  // One row of the running or the finished table, kept across polls (updateSequenceRow /
  // updateFinishedRow fill it): a row and its button stay the same elements while their sequence
  // is listed, so that a click or the focus on them survives the twice-a-second refresh.
  function sequenceRow(s) {
    const row = document.createElement('tr');
    row.dataset.id = s.id;
    row.dataset.index = s.index ?? 0;
    const first = document.createElement('td');
    const pick = document.createElement('button');
    pick.type = 'button';
    pick.className = 'link';
    pick.textContent = requestName(s);
    pick.title = 'Show what each KV head of this request keeps';
    pick.addEventListener('click', () => {
      const id = row.dataset.id, index = Number(row.dataset.index);
      selected = headsShown(id, index) ? null : { id, index };
      finishedNote = '';
      finishedHeads = null;
      poll();
    });
    first.append(pick);
    row.append(first);
    return row;
  }

  // Rows of `body` matched by sequence (id, index) to `list`: a listed sequence keeps its row, a
  // new one gets one, the rest go; `update` fills each.
  function syncRows(body, list, update) {
    const key = (id, index) => `${id}#${index}`;
    const rows = new Map([...body.rows].map((r) => [key(r.dataset.id, r.dataset.index), r]));
    const wanted = list.map((s) => {
      const k = key(s.id, s.index ?? 0);
      const row = rows.get(k) ?? sequenceRow(s);
      rows.delete(k);
      update(row, s);
      return row;
    });
    for (const gone of rows.values()) gone.remove();
    // In the list's order; moving only rows out of place (a row moved loses the focus it holds).
    wanted.forEach((row, i) => {
      if (body.rows[i] !== row) body.insertBefore(row, body.rows[i] ?? null);
    });
  }

  // Whether the map shows (or is asked for) sequence (id, index): chosen live, or kept from its end.
  function headsShown(id, index) {
    return Boolean((selected && selected.id === id && selected.index === index) ||
      (finishedHeads && finishedHeads.request === id && finishedHeads.index === index));
  }

  // The pick button's state: pressed while its sequence's heads are shown.
  function markPicked(row, s) {
    row.querySelector('button').setAttribute('aria-pressed', headsShown(s.id, s.index ?? 0) ? 'true' : 'false');
  }

  function updateSequenceRow(row, s) {
    markPicked(row, s);
    row.dataset.pagesHeld = s.pages_held;
    row.dataset.pagesDense = s.pages_dense;
    // The cells after the first, rebuilt: plain text, no element anyone holds on to.
    while (row.cells.length > 1) row.lastElementChild.remove();
    cell(row, s.policy, 'mono');
    cell(row, s.state);
    cell(row, s.prompt_tokens, 'num');
    cell(row, s.generated_tokens, 'num');
    cell(row, s.context_tokens, 'num');
    pagesCell(row, s.pages_held, s.pages_dense);
    cell(row, recoveryText(s.attention_recovery), 'num');
  }

  function renderSequences(all) {
    const body = $('seq-body');
    const collapsed = all.length > MAX_ROWS && !showAll;
    const sequences = collapsed ? all.slice(0, MAX_ROWS) : all;
    $('seq-more-line').hidden = all.length <= MAX_ROWS;
    $('seq-more-text').textContent = collapsed ? `The first ${MAX_ROWS} of ${all.length} sequences.` : `All ${all.length} sequences.`;
    $('seq-more').textContent = collapsed ? `Show all ${all.length}` : `Show the first ${MAX_ROWS} only`;
    $('seq-more').setAttribute('aria-expanded', collapsed ? 'false' : 'true');
    syncRows(body, sequences, updateSequenceRow);  // in admission order
    $('seq-empty').hidden = all.length > 0;
  }

  function updateFinishedRow(row, s, now) {
    markPicked(row, s);
    row.dataset.pagesHeld = s.pages_held;
    row.dataset.pagesDense = s.pages_dense;
    while (row.cells.length > 1) row.lastElementChild.remove();
    cell(row, s.policy, 'mono');
    cell(row, `${s.finish_reason}, ${Math.max(0, Math.round(now - s.finished_at))} s ago`);
    cell(row, s.prompt_tokens, 'num');
    cell(row, s.generated_tokens, 'num');
    pagesCell(row, s.pages_held, s.pages_dense);
    cell(row, recoveryText(s.attention_recovery), 'num');
  }

  // The last sequences to finish, newest first; `now`: the snapshot's time (unix seconds). Their
  // heads, which the server keeps while it lists them, are a click away as the running ones' are.
  function renderFinished(finished, now) {
    syncRows($('fin-body'), finished, (row, s) => updateFinishedRow(row, s, now));
    $('fin-empty').hidden = finished.length > 0;
  }

  function renderHeads(liveHeads) {
    const map = $('heads-map');
    const heads = liveHeads || finishedHeads;
    if (!heads) {
      map.replaceChildren();
      $('heads-info').textContent = finishedNote || 'Choose a request above to see its heads.';
      return;
    }
    const who = `${heads.request}${heads.index ? ` #${heads.index}` : ''}`;
    $('heads-info').textContent =
      (heads.finish_reason ? `${who} has finished (${heads.finish_reason}); at its end, ` : `${who}: `) +
      `${heads.layers} layers × ${heads.kv_heads} KV heads. ` +
      'Each cell: what the head keeps, its keys, and for Quest heads the pages read per step.';
    const table = document.createElement('table');
    table.className = 'heads';
    const caption = document.createElement('caption');
    caption.textContent = `KV heads of ${heads.request}`;
    const head = document.createElement('tr');
    head.append(Object.assign(document.createElement('th'), { scope: 'col', textContent: 'Layer' }));
    for (let h = 0; h < heads.kv_heads; ++h) {
      head.append(Object.assign(document.createElement('th'), { scope: 'col', textContent: `KV head ${h}` }));
    }
    const thead = document.createElement('thead');
    thead.append(head);
    const tbody = document.createElement('tbody');
    heads.kept.forEach((layer, l) => {
      const row = document.createElement('tr');
      row.append(Object.assign(document.createElement('th'), { scope: 'row', textContent: String(l) }));
      for (const k of layer) {
        const td = cell(row, '', `head ${kindClass(k.kind)}`);
        const kind = document.createElement('span');
        kind.className = 'kind';
        kind.textContent = k.kind;
        const detail = document.createElement('span');
        detail.className = 'detail';
        detail.textContent = `${k.tokens} keys` +
          (k.pages_read !== null && k.pages_read !== undefined ? ` · reads ${k.pages_read} pages` : '') +
          (k.recovery !== null && k.recovery !== undefined ? ` · ${(k.recovery * 100).toFixed(0)}% attn` : '');
        td.append(kind, detail);
      }
      tbody.append(row);
    });
    table.append(caption, thead, tbody);
    map.replaceChildren(table);
  }

  function renderHistograms(samples) {
    for (const [name, id, label] of [
      ['vllm:time_to_first_token_seconds', 'ttft-chart', 'Time to first token'],
      ['vllm:inter_token_latency_seconds', 'itl-chart', 'Inter-token latency'],
    ]) {
      const h = histogram(samples, name);
      const mean = h.count > 0 ? ` (mean ${ms(Number((h.sum / h.count).toFixed(4)))})` : '';
      barChart($(id), {
        buckets: h.buckets,
        format: ms,
        label: `${label}: ${h.count} observations${mean}, per bucket: ` +
          h.buckets.filter((b) => b.count > 0).map((b) => `${b.count} at most ${b.le === Infinity ? 'infinity' : ms(b.le)}`).join(', '),
      });
    }
  }

  // The state, with the chosen sequence's heads while it lives: asking only for a sequence the
  // plain state still lists keeps a finished one from answering 404 on every poll.
  async function fetchState() {
    if (!hasKvState) return null;
    let state;
    try {
      state = await getJson('/v1/kv/state');
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404) throw e;
      hasKvState = false;  // a server without the endpoint
      $('dash-pool-info').textContent = 'This server has no /v1/kv/state: pool figures come from /metrics, per-request figures are not shown.';
      return null;
    }
    const listed = (list) => list && list.some((s) => s.id === selected.id && (s.index ?? 0) === selected.index);
    // A request that finished since it was chosen is asked for once more: the server keeps its
    // heads as they stood at its end while `finished` lists it.
    if (!selected || !(listed(state.sequences) || listed(state.finished))) {
      if (selected) finishedNote = `${selected.id} has finished.`;
      selected = null;
      return state;
    }
    const asked = selected;
    try {
      const withHeads = await getJson(`/v1/kv/state?request=${encodeURIComponent(asked.id)}&index=${asked.index}`);
      const heads = withHeads.heads;
      if (heads && heads.finish_reason && selected === asked) {
        finishedNote = `${asked.id} has finished.`;
        finishedHeads = heads;
        selected = null;
      }
      return withHeads;
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 404) throw e;
      // Gone from the server's finished list too: said now, and not asked for again.
      if (selected === asked) {
        finishedNote = `${asked.id} has finished.`;
        selected = null;
      }
      return state;
    }
  }

  async function poll() {
    if (busy) {
      again = true;
      return;
    }
    busy = true;
    clearTimeout(timer);
    try {
      const [state, metricsText] = await Promise.all([fetchState(), getText('/metrics')]);
      const samples = parseMetrics(metricsText);
      const pool = state
        ? {
          used: state.pool.pages_used, free: state.pool.pages_free, cached: state.pool.pages_cached,
          cachedFree: state.pool.pages_cached_free, total: state.pool.pages_total,
          parked: state.pool.pages_parked, parkedSeqs: state.pool.parked_sequences,
        }
        : (() => {
          const used = metricValue(samples, 'sieve:kv_pages_used');
          const free = metricValue(samples, 'sieve:kv_pages_free');
          return { used, free, cached: null, cachedFree: null, total: used + free };
        })();
      renderFigures({
        running: state ? state.requests.running : metricValue(samples, 'vllm:num_requests_running'),
        waiting: state ? state.requests.waiting : metricValue(samples, 'vllm:num_requests_waiting'),
        usage: metricValue(samples, 'vllm:kv_cache_usage_perc'),
        pool,
      });
      if (state) {
        $('dash-pool-info').textContent =
          `${state.pool.pages_total} pages of ${state.page_tokens} tokens, ${(state.bytes_per_page / 1024).toFixed(1)} KiB each (${state.kv_dtype}).`;
      }
      history.push(pool);
      if (history.length > HISTORY) history.shift();
      renderPoolChart(pool.total);
      renderSequences(state ? state.sequences : []);
      // A server from before the list has no `finished`.
      renderFinished(state && state.finished ? state.finished : [], state ? state.time : 0);
      renderHeads(state ? state.heads : null);
      renderHistograms(samples);
      $('dash-error').textContent = '';
    } catch (e) {
      $('dash-error').textContent = `Cannot read the server's state: ${e.message}`;
    }
    busy = false;
    if (again) {
      again = false;
      poll();
      return;
    }
    if (shown && !document.hidden) timer = setTimeout(poll, POLL_MS);
  }

  $('seq-more').addEventListener('click', () => {
    showAll = !showAll;
    poll();
  });
  document.addEventListener('visibilitychange', () => {
    if (shown && !document.hidden) poll();
  });
  return {
    show() {
      if (shown) return;
      shown = true;
      poll();
    },
    hide() {
      shown = false;
      clearTimeout(timer);
    },
  };
}
