// Model output as HTML: markdown by marked, then sanitized by DOMPurify (the model's text is
// untrusted: it may contain HTML).
import { marked } from '/webui/vendor/marked.esm.js';
import DOMPurify from '/webui/vendor/purify.es.mjs';

marked.setOptions({ gfm: true, breaks: true });

export function renderMarkdown(element, text) {
  element.innerHTML = DOMPurify.sanitize(marked.parse(text));
}
