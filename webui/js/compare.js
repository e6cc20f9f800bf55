// Compare view: one prompt sent under several kv_policy values at once (streaming
// /v1/completions), the answers side by side with the KV each kept and its speed, and each
// answer's top-1 agreement with the dense model: the answer is read back teacher-forced under the
// dense cache (echo + prompt logprobs, max_tokens 0, kv_policy "full") and a position agrees
// when the dense model's most likely token there is the answer's token.
import { postJson, streamEvents } from './api.js';

const $ = (id) => document.getElementById(id);
const DEFAULT_POLICIES = ['full', 'snapkv:B=64', 'streaming:S=4,W=60'];

// The most likely token of a top_logprobs object ({token: logprob}; the server adds the actual
// token to it, so with logprobs 1 it holds the top-1 and, where they differ, the actual one).
function topToken(top) {
  let best = null;
  for (const [token, logprob] of Object.entries(top)) {
    if (best === null || logprob > best[1]) best = [token, logprob];
  }
  return best && best[0];
}

// Positions of `answer` (its tokens as generated) where the dense top-1 is the answer's token,
// from the dense read-back of prompt + answer text. The read-back tokenizes the text again;
// where that splits it differently from how it was generated, only the tokens before the first
// difference are compared (and the result says so).
export function agreement(answerTokens, promptTokens, echoed) {
  const tokens = echoed.tokens.slice(promptTokens);
  const top = echoed.top_logprobs.slice(promptTokens);
  let compared = 0;
  let agreed = 0;
  for (; compared < answerTokens.length && compared < tokens.length; ++compared) {
    if (tokens[compared] !== answerTokens[compared]) break;
    if (top[compared] && topToken(top[compared]) === answerTokens[compared]) ++agreed;
  }
  return { agreed, compared, total: answerTokens.length };
}

function figure(list, term, value) {
  const div = document.createElement('div');
  const dt = document.createElement('dt');
  dt.textContent = term;
  const dd = document.createElement('dd');
  dd.textContent = value;
  div.append(dt, dd);
  list.append(div);
  return dd;
}

function card(policy) {
  const article = document.createElement('article');
  article.className = 'compare-card';
  article.dataset.policy = policy;
  article.dataset.state = 'running';
  const heading = document.createElement('h3');
  heading.textContent = policy;
  const status = document.createElement('p');
  status.className = 'status';
  status.textContent = 'generating…';
  const answer = document.createElement('pre');
  answer.className = 'answer';
  answer.tabIndex = 0;  // scrollable: reachable by keyboard
  answer.setAttribute('aria-label', `Answer under ${policy}`);
  const figures = document.createElement('dl');
  figures.className = 'figures small';
  article.append(heading, status, answer, figures);
  return { article, status, answer, figures };
}

// One policy's answer, streamed: text, generated tokens (pieces) and timings.
async function generate(base, policy, view) {
  const start = performance.now();
  let first = null;
  let last = null;
  let usage = null;
  const tokens = [];
  let text = '';
  for await (const chunk of streamEvents('/v1/completions', { ...base, kv_policy: policy })) {
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices && chunk.choices[0];
    if (!choice) continue;
    if (choice.text) {
      last = performance.now();
      first ??= last;
      text += choice.text;
      view.answer.textContent = text;
    }
    if (choice.logprobs) tokens.push(...choice.logprobs.tokens);
  }
  const n = usage ? usage.completion_tokens : tokens.length;
  return {
    text, tokens, usage,
    ttft_ms: first === null ? null : first - start,
    tokens_per_s: n > 1 && last > first ? ((n - 1) * 1000) / (last - first) : null,
  };
}

export function mountCompare() {
  const list = $('cmp-policies');
  const errorBox = $('cmp-error');
  const results = $('cmp-results');
  let running = false;

  function addPolicy(value) {
    const n = list.children.length + 1;
    const item = document.createElement('li');
    const id = `cmp-policy-${Date.now().toString(36)}-${n}`;
    const label = document.createElement('label');
    label.htmlFor = id;
    label.className = 'visually-hidden';
    label.textContent = `Policy ${n}`;
    const input = document.createElement('input');
    input.id = id;
    input.type = 'text';
    input.value = value;
    input.required = true;
    input.spellcheck = false;
    input.autocomplete = 'off';
    input.setAttribute('list', 'kv-policy-examples');
    input.className = 'policy mono';
    const remove = document.createElement('button');
    remove.type = 'button';
    remove.textContent = 'Remove';
    remove.addEventListener('click', () => {
      item.remove();
      relabel();
    });
    item.append(label, input, remove);
    list.append(item);
    relabel();
  }

  // Labels and remove buttons name the policy's place in the list.
  function relabel() {
    [...list.children].forEach((item, i) => {
      item.querySelector('label').textContent = i === 0 ? 'Policy 1 (reference)' : `Policy ${i + 1}`;
      item.querySelector('button').setAttribute('aria-label', `Remove policy ${i + 1}`);
    });
  }

  async function run() {
    if (running) return;
    const policies = [...list.querySelectorAll('input')].map((i) => i.value.trim()).filter(Boolean);
    const prompt = $('cmp-prompt').value;
    errorBox.textContent = '';
    if (policies.length < 2) {
      errorBox.textContent = 'Give at least two policies.';
      return;
    }
    running = true;
    $('cmp-run').disabled = true;
    const base = {
      prompt,
      max_tokens: Number($('cmp-max-tokens').value),
      temperature: Number($('cmp-temperature').value),
      logprobs: 1,  // for the generated tokens, to align them with the read-back
      stream_options: { include_usage: true },
    };
    if ($('cmp-seed').value.trim() !== '') base.seed = Number($('cmp-seed').value);
    const views = policies.map(card);
    results.replaceChildren(...views.map((v) => v.article));

    // All at once: they run in the same engine batches.
    const outcomes = await Promise.allSettled(policies.map((p, i) => generate(base, p, views[i])));
    const reference = outcomes[0].status === 'fulfilled' ? outcomes[0].value : null;
    await Promise.all(outcomes.map(async (outcome, i) => {
      const view = views[i];
      if (outcome.status === 'rejected') {
        view.status.textContent = `failed: ${outcome.reason.message}`;
        view.article.dataset.state = 'failed';
        return;
      }
      const r = outcome.value;
      const kv = r.usage ? r.usage.kv_cache : null;
      if (kv) {
        const share = kv.dense_pages > 0 ? ` (${Math.round((100 * kv.pages) / kv.dense_pages)}%)` : '';
        figure(view.figures, 'KV kept', `${kv.pages} of ${kv.dense_pages} pages${share}`).dataset.kvPages = kv.pages;
        figure(view.figures, 'KV bytes', `${(kv.bytes / 1024).toFixed(1)} of ${(kv.dense_bytes / 1024).toFixed(1)} KiB`);
        if (kv.attention_recovery !== undefined) {
          figure(view.figures, 'Attention recovery', `${(kv.attention_recovery * 100).toFixed(1)}%`);
        }
      }
      figure(view.figures, 'Tokens', r.usage ? r.usage.completion_tokens : r.tokens.length);
      figure(view.figures, 'TTFT', r.ttft_ms === null ? '–' : `${Math.round(r.ttft_ms)} ms`);
      figure(view.figures, 'Speed', r.tokens_per_s === null ? '–' : `${r.tokens_per_s.toFixed(1)} tok/s`);
      if (reference && i > 0) {
        let same = 0;
        while (same < r.tokens.length && same < reference.tokens.length && r.tokens[same] === reference.tokens[same]) ++same;
        figure(view.figures, `Same as ${policies[0]}`, same === r.tokens.length && same === reference.tokens.length
          ? 'every token' : `the first ${same} tokens`);
      }
      view.status.textContent = 'scoring against the dense cache…';
      try {
        const echoed = await postJson('/v1/completions', {
          prompt: prompt + r.text, echo: true, max_tokens: 0, logprobs: 1, kv_policy: 'full', temperature: 0,
        });
        const a = agreement(r.tokens, r.usage.prompt_tokens, echoed.choices[0].logprobs);
        const dd = figure(view.figures, 'Dense top-1 agreement', a.total === 0 ? '–'
          : `${a.agreed} of ${a.compared} tokens (${((100 * a.agreed) / Math.max(1, a.compared)).toFixed(1)}%)` +
            (a.compared < a.total ? `; the read-back tokenizes the text differently after ${a.compared} of ${a.total}` : ''));
        dd.dataset.agreed = a.agreed;
        dd.dataset.compared = a.compared;
        view.status.textContent = 'done';
      } catch (e) {
        view.status.textContent = `scoring failed: ${e.message}`;
      }
      view.article.dataset.state = 'done';
    }));
    running = false;
    $('cmp-run').disabled = false;
  }

  DEFAULT_POLICIES.forEach(addPolicy);
  $('cmp-add').addEventListener('click', () => {
    addPolicy('');
    list.lastElementChild.querySelector('input').focus();
  });
  $('compare-form').addEventListener('submit', (event) => {
    event.preventDefault();
    run();
  });
  return { show() {}, hide() {} };
}
