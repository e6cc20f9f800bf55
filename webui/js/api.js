// The server's HTTP API as the page uses it: the API key (asked for once, kept in localStorage),
// JSON requests, and SSE streams read from fetch (so that aborting the fetch closes the
// connection, which cancels the request on the server).
const KEY_STORAGE = 'sieve.apiKey';

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

// Set by main.js: shows the key dialog, resolves to the key typed or null (cancelled).
let askForKey = null;
let pendingAsk = null;  // one dialog for every request that got a 401 at the same time
export function setKeyPrompt(fn) { askForKey = fn; }

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  const key = localStorage.getItem(KEY_STORAGE);
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorOf(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) return new ApiError(response.status, body.error.message);
  } catch { /* not JSON: the text itself */ }
  return new ApiError(response.status, `HTTP ${response.status}`);  // not the server's error shape: no body worth showing
}

// fetch with the API key; a 401 asks for the key and tries again, until the user cancels.
export async function request(path, { method = 'GET', body, signal } = {}) {
  for (;;) {
    const response = await fetch(path, {
      method, signal, headers: headers(body !== undefined),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status !== 401 || !askForKey) return response;
    const reason = (await errorOf(response)).message;
    pendingAsk ??= askForKey(reason).finally(() => { pendingAsk = null; });
    const key = await pendingAsk;
    if (key === null) return new Response(JSON.stringify({ error: { message: reason } }), { status: 401 });
    localStorage.setItem(KEY_STORAGE, key);
  }
}

export async function getJson(path, options) {
  const response = await request(path, options);
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

export async function getText(path, options) {
  const response = await request(path, options);
  if (!response.ok) throw await errorOf(response);
  return response.text();
}

export async function postJson(path, body, options = {}) {
  return getJson(path, { ...options, method: 'POST', body });
}

// POSTs a streaming request and yields each SSE event's JSON until `data: [DONE]`. An error
// event (the server's error shape) is thrown as an ApiError.
export async function* streamEvents(path, body, signal) {
  const response = await request(path, { method: 'POST', body: { ...body, stream: true }, signal });
  if (!response.ok) throw await errorOf(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(chunk.error.code || 500, chunk.error.message);
        yield chunk;
      }
    }
  }
}
