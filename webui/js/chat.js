// Chat view: conversations with the served model over streaming /v1/chat/completions, each with
// its own sampling settings and kv_policy, kept in localStorage. Stop aborts the fetch: the
// server sees the connection close and cancels the request (its KV pages go back to the pool).
import { streamEvents } from './api.js';
import { renderMarkdown } from './markdown.js';
import { loadConversations, newConversation, saveConversations, DEFAULT_SETTINGS } from './store.js';

const $ = (id) => document.getElementById(id);

// "TTFT 12 ms · 340 tok/s · 64 tokens · KV 3 of 8 pages (38%)"
function statsText(stats) {
  const parts = [];
  if (stats.ttft_ms !== null) parts.push(`TTFT ${Math.round(stats.ttft_ms)} ms`);
  if (stats.tokens_per_s !== null) parts.push(`${stats.tokens_per_s.toFixed(1)} tok/s`);
  if (stats.completion_tokens !== null) parts.push(`${stats.completion_tokens} tokens`);
  const kv = stats.kv_cache;
  if (kv && kv.dense_pages > 0) {
    parts.push(`KV ${kv.pages} of ${kv.dense_pages} pages (${Math.round((100 * kv.pages) / kv.dense_pages)}%)`);
  }
  if (stats.finish) parts.push(stats.finish === 'stopped' ? 'stopped' : `finish: ${stats.finish}`);
  return parts.join(' · ');
}

// What the API gets: the system prompt, then every message (the stats stay here).
function requestBody(conversation) {
  const s = conversation.settings;
  const messages = s.system.trim() ? [{ role: 'system', content: s.system }] : [];
  for (const m of conversation.messages) messages.push({ role: m.role, content: m.content });
  const body = {
    messages,
    temperature: Number(s.temperature),
    top_p: Number(s.top_p),
    max_tokens: Number(s.max_tokens),
    stream_options: { include_usage: true },
  };
  if (Number(s.min_tokens) > 0) body.min_tokens = Number(s.min_tokens);
  if (String(s.seed).trim() !== '') body.seed = Number(s.seed);
  if (s.kv_policy.trim()) body.kv_policy = s.kv_policy.trim();
  return body;
}

export function mountChat() {
  const log = $('chat-log');
  const input = $('chat-input');
  const form = $('chat-form');
  const sendButton = $('chat-send');
  const stopButton = $('chat-stop');
  const list = $('chat-list');
  const settingsForm = $('chat-settings');
  const errorBox = $('chat-error');

  let conversations = loadConversations();
  if (conversations.length === 0) conversations.push(newConversation());
  let current = conversations[0];
  let running = null;  // {controller} while an answer streams

  const save = () => saveConversations(conversations);

  function renderList() {
    list.replaceChildren(...conversations.map((c) => {
      const item = document.createElement('li');
      const open = document.createElement('button');
      open.type = 'button';
      open.className = 'conv-open';
      open.textContent = c.title;
      if (c === current) open.setAttribute('aria-current', 'true');
      open.addEventListener('click', () => select(c));
      const remove = document.createElement('button');
      remove.type = 'button';
      remove.className = 'conv-delete';
      remove.textContent = '×';
      remove.setAttribute('aria-label', `Delete conversation “${c.title}”`);
      remove.addEventListener('click', () => removeConversation(c));
      item.append(open, remove);
      return item;
    }));
  }

  function messageElement(message) {
    const article = document.createElement('article');
    article.className = `message ${message.role}`;
    article.dataset.role = message.role;
    const who = document.createElement('h4');
    who.className = 'who';
    who.textContent = message.role === 'user' ? 'You' : 'Model';
    const body = document.createElement('div');
    body.className = 'body';
    const stats = document.createElement('p');
    stats.className = 'stats';
    article.append(who, body, stats);
    updateMessage(article, message);
    return article;
  }

  function updateMessage(article, message) {
    const body = article.querySelector('.body');
    if (message.role === 'assistant') {
      renderMarkdown(body, message.content);
    } else {
      body.textContent = message.content;
    }
    if (message.stats) {
      article.querySelector('.stats').textContent = statsText(message.stats);
      article.dataset.finish = message.stats.finish || '';
    }
  }

  function renderMessages() {
    log.replaceChildren(...current.messages.map(messageElement));
    log.scrollTop = log.scrollHeight;
  }

  function fillSettings() {
    const s = { ...DEFAULT_SETTINGS, ...current.settings };
    current.settings = s;
    for (const field of settingsForm.elements) {
      if (field.name in s) field.value = s[field.name];
    }
  }

  function select(conversation) {
    current = conversation;
    renderList();
    renderMessages();
    fillSettings();
    errorBox.textContent = '';
  }

  function removeConversation(conversation) {
    if (running && running.conversation === conversation) running.controller.abort();
    conversations = conversations.filter((c) => c !== conversation);
    if (conversations.length === 0) conversations.push(newConversation());
    save();
    select(conversation === current ? conversations[0] : current);
  }

  function setRunning(value) {
    running = value;
    sendButton.disabled = Boolean(value);
    stopButton.disabled = !value;
    log.setAttribute('aria-busy', value ? 'true' : 'false');
  }

  async function send() {
    const text = input.value.trim();
    if (!text || running) return;
    errorBox.textContent = '';
    const conversation = current;
    conversation.messages.push({ role: 'user', content: text });
    if (conversation.messages.length === 1) conversation.title = text.slice(0, 48);
    const body = requestBody(conversation);
    const answer = { role: 'assistant', content: '', stats: null };
    conversation.messages.push(answer);
    input.value = '';
    save();
    renderList();
    renderMessages();
    const article = log.lastElementChild;

    const controller = new AbortController();
    setRunning({ controller, conversation });
    // Markdown is re-rendered at most once a frame, however fast tokens come.
    let frame = 0;
    const redraw = () => {
      frame = 0;
      updateMessage(article, answer);
      log.scrollTop = log.scrollHeight;
    };
    const start = performance.now();
    let first = null;
    let last = null;
    let usage = null;
    let finish = null;
    let failure = null;
    try {
      for await (const chunk of streamEvents('/v1/chat/completions', body, controller.signal)) {
        if (chunk.usage) usage = chunk.usage;
        const choice = chunk.choices && chunk.choices[0];
        if (!choice) continue;
        const delta = choice.delta && choice.delta.content;
        if (delta) {
          last = performance.now();
          first ??= last;
          answer.content += delta;
          frame ||= requestAnimationFrame(redraw);
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
    } catch (e) {
      if (e.name === 'AbortError') finish = 'stopped';
      else failure = e;
    }
    if (frame) cancelAnimationFrame(frame);
    if (failure && answer.content === '') {
      // Nothing came (e.g. a kv_policy the server refuses): take the message back to fix and resend.
      conversation.messages.splice(-2, 2);
      if (conversation === current) input.value = text;
      errorBox.textContent = failure.message;
    } else {
      if (failure) errorBox.textContent = failure.message;
      const tokens = usage ? usage.completion_tokens : null;
      answer.stats = {
        ttft_ms: first === null ? null : first - start,
        // Decode speed: tokens after the first over the time after it.
        tokens_per_s: tokens > 1 && last > first ? ((tokens - 1) * 1000) / (last - first) : null,
        completion_tokens: tokens,
        kv_cache: usage ? usage.kv_cache : null,
        finish: failure ? 'error' : (finish || 'stopped'),
      };
    }
    save();
    setRunning(null);
    if (conversation === current) renderMessages();
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    send();
  });
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    } else if (event.key === 'Escape' && running) {
      running.controller.abort();
    }
  });
  stopButton.addEventListener('click', () => running && running.controller.abort());
  $('chat-new').addEventListener('click', () => {
    const conversation = newConversation();
    // A new conversation starts from the current one's settings: they are usually what one tunes.
    conversation.settings = { ...current.settings };
    conversations.unshift(conversation);
    save();
    select(conversation);
    input.focus();
  });
  settingsForm.addEventListener('input', () => {
    for (const field of settingsForm.elements) {
      if (field.name) current.settings[field.name] = field.value;
    }
    save();
  });
  settingsForm.addEventListener('submit', (event) => event.preventDefault());

  select(current);
  return {
    show() {},
    hide() {},
  };
}
