// Conversations kept in localStorage ("sieve.conversations"): a list, newest first, each with its
// messages and its own sampling settings.
const STORAGE = 'sieve.conversations';

export const DEFAULT_SETTINGS = {
  system: '', temperature: 0.7, top_p: 1, max_tokens: 256, min_tokens: 0, seed: '', kv_policy: '',
};

export function loadConversations() {
  try {
    const list = JSON.parse(localStorage.getItem(STORAGE) || '[]');
    return Array.isArray(list) ? list : [];
  } catch {
    return [];  // unreadable (edited by hand): start afresh rather than fail to load
  }
}

export function saveConversations(list) {
  localStorage.setItem(STORAGE, JSON.stringify(list));
}

export function newConversation() {
  return {
    id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`,
    title: 'New conversation',
    settings: { ...DEFAULT_SETTINGS },
    // {role, content} as the API takes them; an assistant message also keeps `stats`
    // ({id, ttft_ms, tokens_per_s, completion_tokens, kv_cache, finish, max_tokens,
    // context_tokens, context_window}) for display. `left_out`: kept here, no longer sent.
    messages: [],
  };
}
