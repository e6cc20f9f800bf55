#!/usr/bin/env bash
# Constrained decoding's cost, in one run: decode tok/s with a json_schema constraint against
# the same decode unconstrained, at batch 1 and 16, on two generated random-weight models (1024
# dim, 8 layers, Q8_0) that differ only in their vocabulary: llama SPM (32,000 tokens) and
# DeepSeek LLM's byte-level BPE (102,400 tokens; the largest vocabulary in ../shared — Llama 3's
# 128k is not there). Also prints the schema's compile time.
#   bench/constrained_decode.sh [OUT_DIR]
# Environment: SIEVE (build/sieve), ROUNDS (3), OUTPUT_TOKENS (64), BATCHES ("1,16"),
# TEMPERATURE (1; 0 is greedy, which shows the mask's own cost), THREADS.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/sieve-constrained-models}
shared=${SIEVE_SHARED_DIR:-../shared}
sieve=${SIEVE:-build/sieve}
mkdir -p "$out"
models=()
for vocab in llama-spm deepseek-llm; do
  model="$out/c1024-$vocab-q8_0.gguf"
  if [ ! -f "$model" ]; then
    "$sieve" gen-model --dim 1024 --layers 8 --heads 16 --kv-heads 4 --ffn 2816 --ctx 4096 \
      --type q8_0 --seed 5 --vocab "$shared/golden/tokenizer/ggml-vocab-$vocab.gguf" -o "$model"
  fi
  models+=("$model")
done
cmake --build build --target constrained_decode_bench >/dev/null
build/bench/constrained_decode_bench "${models[@]}"
