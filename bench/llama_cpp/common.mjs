// Shared by bench.mjs and serve.mjs: node-llama-cpp's prebuilt CPU build (never built here), a
// model on the CPU and one context with flash attention whose batches are dispatched at once
// (node-llama-cpp's default waits for the next event-loop cycle). NLC_LOG=1 prints llama.cpp's
// log, e.g. which libggml-cpu-*.so its loader picked.
import {getLlama, LlamaLogLevel} from "node-llama-cpp";

export async function openContext(modelPath, {threads, contextSize, sequences = 1, batchSize = 512}) {
  const llama = await getLlama({gpu: false, build: "never",
                                logLevel: process.env.NLC_LOG ? LlamaLogLevel.debug : LlamaLogLevel.error});
  const model = await llama.loadModel({modelPath, gpuLayers: 0});
  const context = await model.createContext({contextSize, sequences, threads, batchSize, flashAttention: true,
                                             batching: {dispatchSchedule: (dispatch) => dispatch()}});
  return {model, context};
}

// n prompt tokens cut from a short text; `seed` gives each request of a batch its own order.
export function promptOf(model, n, seed = 0) {
  const text = model.tokenize("Once upon a time there was a little girl who lived in a village near the forest. " +
                              "She liked to walk to the river with her dog and count the boats. ");
  return Array.from({length: n}, (_, i) => text[(i * (seed + 1) + seed) % text.length]);
}
