// The page's entry: the three views behind hash routes (#chat, #dashboard, #compare), the API
// key dialog, and the model's name in the header.
import { getJson, setKeyPrompt } from './api.js';
import { mountChat } from './chat.js';
import { mountCompare } from './compare.js';
import { mountDashboard } from './dashboard.js';

const $ = (id) => document.getElementById(id);

// Resolves to the key typed, or null when the dialog is cancelled.
function askForKey(reason) {
  const dialog = $('key-dialog');
  const input = $('key-input');
  $('key-reason').textContent = `This server needs an API key (${reason}).`;
  input.value = '';
  return new Promise((resolve) => {
    const done = (key) => {
      dialog.removeEventListener('close', onClose);
      $('key-cancel').removeEventListener('click', onCancel);
      resolve(key);
    };
    const onClose = () => done(dialog.returnValue === 'save' && input.value ? input.value : null);
    const onCancel = () => {
      dialog.returnValue = 'cancel';
      dialog.close();
    };
    dialog.addEventListener('close', onClose);
    $('key-cancel').addEventListener('click', onCancel);
    dialog.returnValue = '';
    dialog.showModal();
  });
}

async function showModel() {
  const status = $('model-status');
  try {
    const models = await getJson('/v1/models');
    const card = models.data[0];
    status.textContent = `${card.id} · context ${card.max_model_len} tokens`;
  } catch (e) {
    status.textContent = `not connected: ${e.message}`;
  }
}

const views = {
  chat: { section: $('view-chat'), link: $('nav-chat'), view: mountChat() },
  dashboard: { section: $('view-dashboard'), link: $('nav-dashboard'), view: mountDashboard() },
  compare: { section: $('view-compare'), link: $('nav-compare'), view: mountCompare() },
};

function route() {
  const name = location.hash.slice(1);
  const shown = views[name] ? name : 'chat';
  for (const [key, v] of Object.entries(views)) {
    const on = key === shown;
    v.section.hidden = !on;
    if (on) v.link.setAttribute('aria-current', 'page');
    else v.link.removeAttribute('aria-current');
    if (on) v.view.show();
    else v.view.hide();
  }
  // The skip link leads to the chat's message box only where there is one.
  $('skip-to-message').hidden = shown !== 'chat';
}

setKeyPrompt(askForKey);
// "#chat-input" (the skip link) is not a view: keep the chat shown and focus the box.
window.addEventListener('hashchange', () => {
  if (location.hash === '#chat-input') {
    history.replaceState(null, '', '#chat');
    $('chat-input').focus();
  }
  route();
});
route();
showModel();
