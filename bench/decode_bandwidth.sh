#!/usr/bin/env bash
# Decode bandwidth utilisation and prefill GFLOP/s per weight type: generates one ~1 GB F16
# random-weight model (2048-dim, 8 layers, 16 heads / 4 KV heads, ffn 5632, llama SPM
# vocabulary), makes every type of TYPES from it with `sieve quantize` (llama-quantize's
# mixes for the _K_M / _K_S names), and runs `sieve bench` on all of them in one run, against
# the measured memory read bandwidth.
#   bench/decode_bandwidth.sh [OUT_DIR] [extra sieve bench args...]
# Environment:
#   TYPES    weight types, default "f16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k_m q5_k_m q6_k iq4_xs"
#   MODEL    F16 GGUF to start from instead of the generated one (e.g. a shared tiny model to
#            check the script quickly: MODEL=../shared/golden/quant/base-F16.gguf TYPES="f16
#            q8_0" bench/decode_bandwidth.sh /tmp/x --bandwidth-mib 64); its quantized files go
#            to OUT_DIR too
#   SIEVE    the sieve binary, default build/sieve
#   DIM LAYERS HEADS KV_HEADS FFN   the generated model's shape (default 2048 8 16 4 5632, ~1 GB
#            in F16). On a machine whose L3 holds most of that (a 260 MiB one does), decode is
#            served partly from cache: DIM=4096 LAYERS=6 HEADS=32 KV_HEADS=8 FFN=11008 (2.65 GB)
#            reads from DRAM (docs/performance.md, "Decode from DRAM")
# A type this build cannot write (its quantizer is missing) is reported and left out.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/sieve-bench-models}
shift || true
shared=${SIEVE_SHARED_DIR:-../shared}
sieve=${SIEVE:-build/sieve}
types=${TYPES:-f16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k_m q5_k_m q6_k iq4_xs}
mkdir -p "$out"

dim=${DIM:-2048}
source_model=${MODEL:-$out/r$dim-f16.gguf}
if [ -z "${MODEL:-}" ] && [ ! -f "$source_model" ]; then
  "$sieve" gen-model --dim "$dim" --layers "${LAYERS:-8}" --heads "${HEADS:-16}" \
    --kv-heads "${KV_HEADS:-4}" --ffn "${FFN:-5632}" \
    --ctx 32768 --rope-base 500000 --type f16 --seed 1 \
    --vocab "$shared/golden/tokenizer/ggml-vocab-llama-spm.gguf" -o "$source_model"
fi
stem=$(basename "$source_model" .gguf)
stem=${stem%-f16}
stem=${stem%-F16}

bench_args=()
skipped=()
for type in $types; do
  model="$out/$stem-$type.gguf"
  if [ "$type" = f16 ]; then
    model=$source_model  # the starting point is F16 already
  elif [ ! -f "$model" ]; then
    if ! log=$("$sieve" quantize "$source_model" "$model.tmp" "$type" 2>&1); then
      rm -f "$model.tmp"
      skipped+=("$type: ${log##*$'\n'}")
      continue
    fi
    mv "$model.tmp" "$model"
  fi
  bench_args+=(-m "$model")
done
for line in "${skipped[@]+"${skipped[@]}"}"; do echo "skipped $line" >&2; done
[ ${#bench_args[@]} -gt 0 ] || { echo "no model to benchmark" >&2; exit 1; }
"$sieve" bench "${bench_args[@]}" --prompt-tokens 128 --decode-tokens 32 "$@"
