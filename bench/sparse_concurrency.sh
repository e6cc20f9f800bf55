#!/usr/bin/env bash
# How many requests each KV policy runs at once in a fixed KV memory that fits 8 dense requests
# of 2048 + 64 tokens, and the total throughput: 24 requests at concurrency 24, peak
# vllm:num_requests_running polled from /metrics.
#   bench/sparse_concurrency.sh MODEL.gguf [POLICIES]
#   default POLICIES="full streaming:S=4,W=252 snapkv:B=224,W=32"
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
policies=${2:-"full streaming:S=4,W=252 snapkv:B=224,W=32"}
source bench/serve_lib.sh
for policy in $policies; do
  start_server "$model" --kv-tokens 16896 --max-num-seqs 64 --kv-policy "$policy"
  peak_file=$(mktemp)
  echo 0 > "$peak_file"
  ( peak=0
    while kill -0 $server 2>/dev/null; do
      r=$(curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^vllm:num_requests_running{[^}]*} \([0-9]*\).*/\1/p')
      if [ -n "$r" ] && [ "$r" -gt "$peak" ]; then peak=$r; echo "$peak" > "$peak_file"; fi
      sleep 0.1
    done ) &
  poller=$!
  "$sieve" bench-serve --base-url "http://127.0.0.1:$port" --tokenizer "$model" --input-len 2048 --output-len 64 \
    --num-prompts 24 --max-concurrency 24 --seed 3 --out /tmp/sparse_concurrency.json 2>/dev/null |
    grep -E "Total token throughput|Output token throughput"
  echo "$policy: peak running $(cat "$peak_file")"
  stop_server
  kill $poller 2>/dev/null || true
  rm -f "$peak_file"
done
