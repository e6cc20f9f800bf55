#!/usr/bin/env bash
# How many requests each KV policy runs at once in a fixed KV memory that fits 8 dense requests
# of LEN + OUT tokens, and the total throughput: N requests at concurrency N, peak
# vllm:num_requests_running polled from /metrics. Read the throughput ratios against the first
# policy (full).
#   bench/sparse_concurrency.sh MODEL.gguf [POLICIES]
#   default POLICIES="full streaming:S=4,W=1020 snapkv:B=992,W=32"; env LEN (8192), OUT (32), N (16)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
policies=${2:-"full streaming:S=4,W=1020 snapkv:B=992,W=32"}
len=${LEN:-8192}
out=${OUT:-32}
n=${N:-16}
page=16
kv_tokens=$((8 * ((len + out + page - 1) / page) * page))
source bench/serve_lib.sh
echo "KV memory: $kv_tokens tokens (8 dense requests of $len + $out); $n requests at concurrency $n"
for policy in $policies; do
  start_server "$model" --kv-tokens "$kv_tokens" --max-num-seqs 64 --kv-policy "$policy"
  peak_file=$(mktemp)
  echo 0 > "$peak_file"
  ( peak=0
    while kill -0 $server 2>/dev/null; do
      r=$(curl -s "http://127.0.0.1:$port/metrics" | sed -n 's/^vllm:num_requests_running{[^}]*} \([0-9]*\).*/\1/p')
      if [ -n "$r" ] && [ "$r" -gt "$peak" ]; then peak=$r; echo "$peak" > "$peak_file"; fi
      sleep 0.1
    done ) &
  poller=$!
  "$sieve" bench-serve --base-url "http://127.0.0.1:$port" --tokenizer "$model" --input-len "$len" --output-len "$out" \
    --num-prompts "$n" --max-concurrency "$n" --seed 3 --out /tmp/sparse_concurrency.json 2>/dev/null |
    grep -E "Total token throughput|Output token throughput|Benchmark duration"
  echo "$policy: peak running $(cat "$peak_file")"
  stop_server
  kill $poller 2>/dev/null || true
  rm -f "$peak_file"
done
