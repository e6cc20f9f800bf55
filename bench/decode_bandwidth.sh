#!/usr/bin/env bash
# Decode bandwidth utilisation (issue 2): generates a ~1 GB F16 and a ~0.5 GB Q8_0 random-weight
# model (2048-dim, 8 layers, 16 heads / 4 KV heads, ffn 5632, llama SPM vocabulary) and runs
# `sieve bench` on both, in one run, against the measured memory read bandwidth.
#   bench/decode_bandwidth.sh [OUT_DIR] [extra sieve bench args...]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/sieve-bench-models}
shift || true
shared=${SIEVE_SHARED_DIR:-../shared}
mkdir -p "$out"
for type in f16 q8_0; do
  model="$out/r2048-$type.gguf"
  [ -f "$model" ] || build/sieve gen-model --dim 2048 --layers 8 --heads 16 --kv-heads 4 --ffn 5632 \
    --ctx 32768 --rope-base 500000 --type "$type" --seed 1 \
    --vocab "$shared/golden/tokenizer/ggml-vocab-llama-spm.gguf" -o "$model"
done
build/sieve bench -m "$out/r2048-f16.gguf" -m "$out/r2048-q8_0.gguf" --prompt-tokens 128 --decode-tokens 32 "$@"
