// Chat view: conversations with the served model over streaming /v1/chat/completions, each with
// its own sampling settings and kv_policy, kept in localStorage. Stop aborts the fetch: the
// server sees the connection close and cancels the request (its KV pages go back to the pool).
//
// Before each turn the conversation is measured (POST /tokenize with the messages, which also
// gives the model's context): Max tokens is lowered to the room left, and when the history leaves
// no room the message is not sent and the oldest turns can be left out (kept on the page, marked,
// but no longer sent), as the server would refuse the request with a 400.
import { ApiError, postJson, streamEvents } from './api.js';
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

// What the model reads: the system prompt, then every message not left out (the stats stay
// here). `extra`: a message not yet in the conversation.
function requestMessages(conversation, extra) {
  const s = conversation.settings;
  const messages = s.system.trim() ? [{ role: 'system', content: s.system }] : [];
  for (const m of conversation.messages) {
    if (!m.left_out) messages.push({ role: m.role, content: m.content });
  }
  if (extra) messages.push(extra);
  return messages;
}

// {count, context}: the messages' prompt tokens and the model's context; null where the server
// cannot tell (no /tokenize): the request then goes as it is and the server has the last word.
async function measure(messages) {
  try {
    const r = await postJson('/tokenize', { messages });
    return { count: r.count, context: r.max_model_len };
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) return null;
    throw e;
  }
}

// The oldest turn still sent: its user message and the answers after it (indices).
function oldestTurn(conversation) {
  const start = conversation.messages.findIndex((m) => !m.left_out);
  if (start < 0) return [];
  const turn = [start];
  for (let i = start + 1; i < conversation.messages.length && conversation.messages[i].role !== 'user'; ++i) {
    turn.push(i);
  }
  return turn;
}

// The settings' Max tokens, lowered to the room `fit` found (and Min tokens with it).
function requestBody(conversation, messages, maxTokens) {
  const s = conversation.settings;
  const body = {
    messages,
    temperature: Number(s.temperature),
    top_p: Number(s.top_p),
    max_tokens: maxTokens,
    stream_options: { include_usage: true },
  };
  if (Number(s.min_tokens) > 0) body.min_tokens = Math.min(Number(s.min_tokens), maxTokens);
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
  const contextLine = $('chat-context');
  const roomNote = $('chat-room');
  const roomText = $('chat-room-text');
  const dropButton = $('chat-drop');

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
    article.className = `message ${message.role}${message.left_out ? ' left-out' : ''}`;
    article.dataset.role = message.role;
    if (message.left_out) article.dataset.leftOut = 'true';
    const who = document.createElement('h4');
    who.className = 'who';
    who.textContent = (message.role === 'user' ? 'You' : 'Model') +
      (message.left_out ? ' · left out: the model no longer reads this' : '');
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
    showRoom(null);
    showContext();
  }

  // "This conversation: 400 of 512 tokens", from the last answer's usage.
  function showContext() {
    const last = [...current.messages].reverse().find((m) => m.stats && m.stats.context_tokens);
    contextLine.textContent = last
      ? `This conversation: ${last.stats.context_tokens} of ${last.stats.context_window} tokens of context.`
      : '';
  }

  // The note under the message box: why Max tokens was lowered or the message not sent, with
  // the offer to leave out the oldest turns (null: none).
  function showRoom(note) {
    roomNote.hidden = !note;
    roomNote.dataset.kind = note ? note.kind : '';
    roomText.textContent = note ? note.text : '';
    dropButton.hidden = !note || !note.canDrop;
  }

  // Leaves out the oldest turns until the conversation (with `pending`, the message to send)
  // leaves room for Max tokens, or nothing older is left. Returns the turns' messages left out.
  async function dropOldest(conversation, pending) {
    const wanted = Number(conversation.settings.max_tokens);
    let numLeftOut = 0;
    for (;;) {
      const size = await measure(requestMessages(conversation, pending));
      if (!size || size.context - size.count >= wanted) break;
      const turn = oldestTurn(conversation);
      if (turn.length === 0) break;
      for (const i of turn) conversation.messages[i].left_out = true;
      numLeftOut += turn.length;
    }
    save();
    renderMessages();
    return numLeftOut;
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

  // {maxTokens, context}: Max tokens for the next turn, lowered to the room left (and the note
  // saying so), and the model's context (null: unknown); null when the history leaves no room
  // (the note offers to leave out the oldest turns).
  async function fit(conversation, pending) {
    const size = await measure(requestMessages(conversation, pending));
    // An empty Max tokens: as many as fit (the server's default for chat).
    const wanted = Number(conversation.settings.max_tokens) >= 1 ? Number(conversation.settings.max_tokens)
      : (size ? size.context - size.count : undefined);
    if (!size) return { maxTokens: wanted, context: null };
    const room = size.context - size.count;
    const hasOlder = conversation.messages.some((m) => !m.left_out);
    if (room < 1) {
      showRoom({
        kind: 'full',
        canDrop: hasOlder,
        text: hasOlder
          ? `Not sent: this conversation takes ${size.count} of the model's ${size.context} tokens of context, which leaves no room for an answer.`
          : `Not sent: this message takes ${size.count} of the model's ${size.context} tokens of context, which leaves no room for an answer. Shorten it.`,
      });
      return null;
    }
    if (room < wanted) {
      showRoom({
        kind: 'lowered',
        canDrop: hasOlder,
        text: `Max tokens lowered from ${wanted} to ${room} for this answer: the conversation takes ${size.count} of the model's ${size.context} tokens of context.`,
      });
      return { maxTokens: room, context: size.context };
    }
    showRoom(null);
    return { maxTokens: wanted, context: size.context };
  }

  async function send() {
    const text = input.value.trim();
    if (!text || running) return;
    errorBox.textContent = '';
    const conversation = current;
    const message = { role: 'user', content: text };
    let room = null;
    setRunning({ controller: new AbortController(), conversation });  // no second send meanwhile
    try {
      room = await fit(conversation, message);
    } catch (e) {
      errorBox.textContent = e.message;
    }
    setRunning(null);
    if (room === null) return;  // the message stays in the box
    const { maxTokens, context: contextWindow } = room;
    conversation.messages.push(message);
    if (conversation.messages.length === 1) conversation.title = text.slice(0, 48);
    const body = requestBody(conversation, requestMessages(conversation), maxTokens);
    if (maxTokens === undefined) delete body.max_tokens;
    const answer = { role: 'assistant', content: '', stats: null };
    conversation.messages.push(answer);
    if (input.value.trim() === text) input.value = '';
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
    let responseId = null;  // the response's id: the request's name on the KV dashboard
    let finish = null;
    let failure = null;
    try {
      for await (const chunk of streamEvents('/v1/chat/completions', body, controller.signal)) {
        if (chunk.usage) usage = chunk.usage;
        responseId ??= chunk.id;
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
        id: responseId,
        ttft_ms: first === null ? null : first - start,
        // Decode speed: tokens after the first over the time after it.
        tokens_per_s: tokens > 1 && last > first ? ((tokens - 1) * 1000) / (last - first) : null,
        completion_tokens: tokens,
        kv_cache: usage ? usage.kv_cache : null,
        finish: failure ? 'error' : (finish || 'stopped'),
        max_tokens: maxTokens,
        context_tokens: usage ? usage.prompt_tokens + usage.completion_tokens : null,
        context_window: contextWindow,
      };
    }
    save();
    setRunning(null);
    if (conversation === current) {
      renderMessages();
      showContext();
    }
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
  dropButton.addEventListener('click', async () => {
    if (running) return;
    const conversation = current;
    const pending = input.value.trim() ? { role: 'user', content: input.value.trim() } : null;
    const wasFull = roomNote.dataset.kind === 'full';
    dropButton.disabled = true;
    try {
      const numLeftOut = await dropOldest(conversation, pending);
      const dropped = {
        kind: 'dropped',
        canDrop: false,
        text: numLeftOut > 0
          ? `Left out the ${numLeftOut} oldest messages: they stay here, but the model no longer reads them.`
          : 'There is no older turn to leave out.',
      };
      showRoom(dropped);
      if (wasFull && pending) {
        await send();
        if (roomNote.hidden) showRoom(dropped);  // the answer had all the room it wanted
      }
    } catch (e) {
      errorBox.textContent = e.message;
    }
    dropButton.disabled = false;
  });
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
