// llama.cpp (node-llama-cpp's prebuilt CPU build) on one GGUF, for bench/vs_llama_cpp.sh: a
// warm-up pass over the weights, then `rounds` rounds of a prompt of N tokens (timed) followed by
// M greedy decode steps (timed from the first generated token). Prints one JSON line with the
// medians of the rounds.
//   node bench.mjs MODEL.gguf [threads=2] [prompt=256] [decode=32] [rounds=3]
import {openContext, promptOf} from "./common.mjs";
const [modelPath, threadsArg, promptArg, decodeArg, roundsArg] = process.argv.slice(2);
const threads = Number(threadsArg ?? 2), promptTokens = Number(promptArg ?? 256);
const decodeTokens = Number(decodeArg ?? 32), rounds = Number(roundsArg ?? 3);
const {model, context} = await openContext(modelPath, {threads, contextSize: promptTokens + decodeTokens + 64,
                                                       batchSize: Math.max(512, promptTokens)});
const seq = context.getSequence();
const prompt = promptOf(model, promptTokens);
await seq.evaluateWithoutGeneratingNewTokens(prompt.slice(0, 8));  // touch every weight once
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];
const prefill = [], decode = [];
for (let r = 0; r < rounds; ++r) {
  await seq.clearHistory();
  let t0 = performance.now();
  await seq.evaluateWithoutGeneratingNewTokens(prompt);
  prefill.push(promptTokens / ((performance.now() - t0) / 1000));
  let n = 0, tFirst = 0;
  for await (const _ of seq.evaluate([prompt[0]], {temperature: 0})) {
    if (n === 0) tFirst = performance.now();
    if (++n > decodeTokens) break;
  }
  decode.push(decodeTokens / ((performance.now() - tFirst) / 1000));
}
console.log(JSON.stringify({model: modelPath.split("/").pop(), threads, prompt_tokens: promptTokens,
                            prompt_tok_s: median(prefill), decode_tok_s: median(decode),
                            prefill_rounds: prefill.map((x) => +x.toFixed(2)), decode_rounds: decode.map((x) => +x.toFixed(2))}));
process.exit(0);
