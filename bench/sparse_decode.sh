#!/usr/bin/env bash
# Decode speed of KV sparsity policies against full, one request at a time at several context
# depths, from a client in another process (`sieve bench-serve`, one --extra-body per policy).
#   bench/sparse_decode.sh MODEL.gguf [DEPTHS] [POLICIES]
#   defaults: DEPTHS="2048 8192 16384", POLICIES="full streaming:S=4,W=1020 snapkv:B=992,W=32
#   quest:K=64,R=4,S=4,W=32" (quest: 64 pages of 16 = 1024 keys read per decode step, all kept)
# Read ITL p50 per variant (v0 = the first policy); the compression step is inside TPOT, not ITL.
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
depths=${2:-"2048 8192 16384"}
policies=${3:-"full streaming:S=4,W=1020 snapkv:B=992,W=32 quest:K=64,R=4,S=4,W=32"}
source bench/serve_lib.sh
start_server "$model" --kv-memory 2048
trap stop_server EXIT
bodies=()
for p in $policies; do bodies+=(--extra-body "{\"kv_policy\":\"$p\"}"); done
for depth in $depths; do
  echo "== context $depth: $policies"
  "$sieve" bench-serve --base-url "http://127.0.0.1:$port" --tokenizer "$model" --input-len "$depth" \
    --output-len 64 --num-prompts "$([ "$depth" -ge 16384 ] && echo 2 || echo 3)" --max-concurrency 1 --seed 7 \
    "${bodies[@]}" --out "/tmp/sparse_decode_$depth.json" 2>/dev/null | grep -E "^(point|v[0-9])"
done
