// Reference renderings for sieve's chat-template expectations (tests/server/chat_template_cases.h,
// checked by tests/server/chat_template_reference_test.cc): each case's template rendered by
// @huggingface/jinja on its context (its raise_exception throws the template's message).
//
// Usage: node render_cases.mjs CASES.json, where the file holds [{"name", "source", "context"}].
// Prints [{"name", "rendered"} or {"name", "error"}], in the same order.
import fs from 'node:fs';

let Template;
try {
  ({ Template } = await import('@huggingface/jinja'));
} catch (error) {
  throw new Error(`@huggingface/jinja is missing: run npm ci --prefix tests/hf/reference (${error.message})`);
}

const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const results = cases.map(({ name, source, context }) => {
  try {
    return { name, rendered: new Template(source).render(context) };
  } catch (error) {
    return { name, error: error.message };
  }
});
process.stdout.write(JSON.stringify(results));
