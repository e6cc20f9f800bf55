// llama.cpp (node-llama-cpp's prebuilt CPU build) serving N requests at once, for comparison with
// `sieve bench-engine --concurrency N`: one context of N sequences (node-llama-cpp batches their
// steps into one llama_decode), each request a distinct prompt of P tokens and G greedy tokens.
// Prints one JSON line: wall seconds, generated tokens/s, mean TTFT.
//   node serve.mjs MODEL.gguf [threads=2] [concurrency=16] [prompt=4000] [generate=500]
import {openContext, promptOf} from "./common.mjs";
const [modelPath, threadsArg, concurrencyArg, promptArg, generateArg] = process.argv.slice(2);
const threads = Number(threadsArg ?? 2), concurrency = Number(concurrencyArg ?? 16);
const promptTokens = Number(promptArg ?? 4000), generateTokens = Number(generateArg ?? 500);
const {model, context} = await openContext(modelPath, {
  threads, contextSize: concurrency * (promptTokens + generateTokens + 16), sequences: concurrency});
const start = performance.now();
const ttft = [];
let generated = 0;
await Promise.all(Array.from({length: concurrency}, async (_, r) => {
  const seq = context.getSequence();
  const prompt = promptOf(model, promptTokens, r);
  let n = 0;
  for await (const _ of seq.evaluate(prompt, {temperature: 0})) {
    if (n === 0) ttft.push((performance.now() - start) / 1000);
    ++generated;
    if (++n >= generateTokens) break;
  }
}));
const wall = (performance.now() - start) / 1000;
console.log(JSON.stringify({model: modelPath.split("/").pop(), threads, concurrency, prompt_tokens: promptTokens,
                            generate_tokens: generateTokens, wall_s: wall, gen_tok_s: generated / wall,
                            ttft_mean_s: ttft.reduce((a, b) => a + b, 0) / ttft.length}));
process.exit(0);
