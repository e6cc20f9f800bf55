#!/usr/bin/env bash
# Engine throughput (continuous batching over the paged KV cache): generates a ~57M-parameter
# Q8_0 random-weight model (512-dim, 8 layers, 8 heads / 2 KV heads, ffn 1536, 32k context,
# llama SPM vocabulary of 32000 tokens) and runs `sieve bench-engine` on it: generated tokens/s
# against concurrency, and single-sequence decode speed against context depth.
#   bench/engine_throughput.sh [OUT_DIR] [extra sieve bench-engine args...]   (OUT_DIR: /tmp/sieve-bench-models)
# e.g. bench/engine_throughput.sh /tmp/sieve-bench-models --concurrency 1,4 --output-tokens 16 --depths 0,2048
# SIEVE=path/to/sieve picks another binary (default build/sieve).
set -euo pipefail
cd "$(dirname "$0")/.."
out=/tmp/sieve-bench-models
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then out=$1; shift; fi
shared=${SIEVE_SHARED_DIR:-../shared}
sieve=${SIEVE:-build/sieve}
mkdir -p "$out"
model="$out/r512-q8_0.gguf"
[ -f "$model" ] || "$sieve" gen-model --dim 512 --layers 8 --heads 8 --kv-heads 2 --ffn 1536 \
  --ctx 32768 --rope-base 500000 --type q8_0 --seed 1 \
  --vocab "$shared/golden/tokenizer/ggml-vocab-llama-spm.gguf" -o "$model"
"$sieve" bench-engine -m "$model" "$@"
