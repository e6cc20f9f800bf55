#!/usr/bin/env bash
# How many requests each KV policy (and KV dtype) runs at once in a fixed KV memory that fits
# DENSE dense requests of LEN + OUT tokens in the first dtype, and the total throughput: N
# requests at concurrency N, peak vllm:num_requests_running polled from /metrics. Read the
# ratios against the first line (full, first dtype).
#   bench/sparse_concurrency.sh MODEL.gguf [POLICIES]
#   default POLICIES="full streaming:S=4,W=1020 snapkv:B=992,W=32"; env LEN (8192), OUT (32),
#   N (16), DENSE (8), KV_DTYPES (f32; e.g. "f16 q8 q4": the memory is DENSE requests in the
#   first one, in bytes, so a smaller dtype fits more pages), SERVE_ARGS (more `sieve serve`
#   flags for every measured server, e.g. --no-precise-kv-heads)
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
policies=${2:-"full streaming:S=4,W=1020 snapkv:B=992,W=32"}
len=${LEN:-8192}
out=${OUT:-32}
n=${N:-16}
dense=${DENSE:-8}
dtypes=${KV_DTYPES:-f32}
page=16
kv_tokens=$((dense * ((len + out + page - 1) / page) * page))
source bench/serve_lib.sh
first_dtype=${dtypes%% *}
# The pool's bytes: DENSE dense requests in the first dtype (as the server sizes --kv-tokens),
# rounded up to whole MiB; every dtype then gets that many bytes (--kv-memory).
start_server "$model" --kv-tokens "$kv_tokens" --kv-dtype "$first_dtype"
kv_mib=$(sed -n 's/.*tokens, \([0-9.]*\) MiB of.*/\1/p' "$server_log" | head -1)
stop_server
kv_mib=$(awk -v m="$kv_mib" 'BEGIN { print int(m) + (m > int(m)) }')
echo "KV memory: $kv_mib MiB ($dense dense requests of $len + $out in $first_dtype); $n requests at concurrency $n"
for dtype in $dtypes; do
for policy in $policies; do
  # shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
  start_server "$model" --kv-memory "$kv_mib" --max-num-seqs 256 --kv-policy "$policy" --kv-dtype "$dtype" ${SERVE_ARGS:-}
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
  echo "$dtype $policy: peak running $(cat "$peak_file")"
  stop_server
  kill $poller 2>/dev/null || true
  rm -f "$peak_file"
done
done
