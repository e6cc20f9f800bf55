// llama.cpp (node-llama-cpp's prebuilt CPU build) on one GGUF, for bench/vs_llama_cpp.sh: a
// warm-up pass over the weights, then `rounds` rounds of a prompt of N tokens (timed) followed by
// M greedy decode steps (timed from the first generated token). Prints one JSON line with the
// medians of the rounds.
//   node bench.mjs MODEL.gguf [threads=2] [prompt=256] [decode=32] [rounds=3]
// The batches are dispatched at once (node-llama-cpp waits for the next event-loop cycle by
// default).
import {getLlama, LlamaLogLevel} from "node-llama-cpp";
const [modelPath, threadsArg, promptArg, decodeArg, roundsArg] = process.argv.slice(2);
const threads = Number(threadsArg ?? 2), promptTokens = Number(promptArg ?? 256);
const decodeTokens = Number(decodeArg ?? 32), rounds = Number(roundsArg ?? 3);
const llama = await getLlama({gpu: false, build: "never",
                              logLevel: process.env.NLC_LOG ? LlamaLogLevel.debug : LlamaLogLevel.error});
const model = await llama.loadModel({modelPath, gpuLayers: 0});
const context = await model.createContext({contextSize: promptTokens + decodeTokens + 64, threads,
                                           batchSize: Math.max(512, promptTokens), flashAttention: true,
                                           batching: {dispatchSchedule: (dispatch) => dispatch()}});
const seq = context.getSequence();
const text = model.tokenize("Once upon a time there was a little girl who lived in a village near the forest. ");
const prompt = Array.from({length: promptTokens}, (_, i) => text[i % text.length]);
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
