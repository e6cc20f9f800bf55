#!/usr/bin/env bash
# Replicas behind HAProxy (deploy/haproxy), on the generated ~57M-parameter model of
# bench/engine_throughput.sh, with every configuration behind the same HAProxy and the same
# client, interleaved over ROUNDS rounds:
#   1. Scaling: streaming output throughput of one replica with 2 threads (cores 0-1) against one
#      and two replicas pinned to one core each (`-t 1`, `taskset`). Ratios against the 2-thread
#      replica of the same round.
#   2. Prefix affinity: two 1-core replicas with small KV pools, NUM_PREFIXES groups of requests
#      whose prompts share a SHARED_PREFIX-token system prompt, balanced by leastconn against
#      --prefix-affinity: the prefix-cache hit rate summed over the replicas' /metrics
#      (vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total, in tokens) and TTFT.
#   bench/replicas_scaling.sh [OUT_DIR]    (OUT_DIR: /tmp/sieve-bench-models; results go there too)
# Environment: ROUNDS (2), PROMPTS (64 per scaling point), AFFINITY_PROMPTS (128), NUM_PREFIXES
# (16), SHARED_PREFIX (1024), SIEVE (build/sieve). HAProxy and the client share the
# two cores with the replicas in every configuration.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/sieve-bench-models}
rounds=${ROUNDS:-2}
prompts=${PROMPTS:-64}
num_prefixes=${NUM_PREFIXES:-16}
affinity_prompts=${AFFINITY_PROMPTS:-128}
shared_prefix=${SHARED_PREFIX:-1024}
shared=${SIEVE_SHARED_DIR:-../shared}
sieve=${SIEVE:-build/sieve}
command -v haproxy > /dev/null || { echo "$0: haproxy is not installed (scripts/install-deps.sh)" >&2; exit 1; }
mkdir -p "$out"
model="$out/r512-q8_0.gguf"
[ -f "$model" ] || "$sieve" gen-model --dim 512 --layers 8 --heads 8 --kv-heads 2 --ffn 1536 \
  --ctx 32768 --rope-base 500000 --type q8_0 --seed 1 \
  --vocab "$shared/golden/tokenizer/ggml-vocab-llama-spm.gguf" -o "$model"

free_port() { node -e 'const s=require("net").createServer();s.listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})'; }
wait_ready() {
  for _ in $(seq 600); do curl -sf "$1/ready" > /dev/null && return 0; sleep 0.1; done
  echo "$0: $1 never became ready" >&2; return 1
}
pids=()
replica_urls=()
# start_replica CORES THREADS [serve args...]
start_replica() {
  local cores=$1 threads=$2 port
  shift 2
  port=$(free_port)
  taskset -c "$cores" "$sieve" serve -m "$model" --port "$port" -t "$threads" --kv-dtype f16 "$@" \
    2>> "$out/replicas.log" &
  pids+=($!)
  replica_urls+=("http://127.0.0.1:$port")
  wait_ready "http://127.0.0.1:$port"
}
# start_balancer [--prefix-affinity]: HAProxy in front of the replicas started so far.
start_balancer() {
  local addresses=() url
  for url in "${replica_urls[@]}"; do addresses+=("${url#http://}"); done
  deploy/haproxy/render-config.sh "$@" "${addresses[@]}" > "$out/haproxy.cfg"
  lb_port=$(free_port)
  SIEVE_LB_ADDR=127.0.0.1 SIEVE_LB_PORT=$lb_port SIEVE_CHECK_INTER=1s \
    haproxy -W -db -f "$out/haproxy.cfg" >> "$out/haproxy.log" 2>&1 &
  pids+=($!)
  wait_ready "http://127.0.0.1:$lb_port"
}
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2> /dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2> /dev/null || true; done
  pids=()
  replica_urls=()
}
trap stop_all EXIT
# json FILE EXPRESSION: a value from bench-serve's result (r = its first run's summary).
json() { node -e "const r=require('$1').runs[0].summary; console.log($2)"; }
# Sums a counter over the replicas' /metrics.
metric_sum() {
  local url total=0 v
  for url in "${replica_urls[@]}"; do
    v=$(curl -sf "$url/metrics" | awk -v m="$1" '{ split($1, name, "{") } name[1] == m { print $2 }')
    total=$(node -e "console.log($total + ${v:-0})")
  done
  echo "$total"
}

load() {  # load NAME NUM_PROMPTS [bench-serve args...]
  local name=$1 num_prompts=$2
  shift 2
  "$sieve" bench-serve --base-url "http://127.0.0.1:$lb_port" --tokenizer "$model" \
    --num-prompts "$num_prompts" --seed 7 --out "$out/$name.json" "$@" > /dev/null 2>> "$out/bench-serve.log"
}

echo "== scaling: output tok/s (ratio to one 2-thread replica in the same round)"
scaling_load=(--input-len 128 --output-len 128 --max-concurrency 16 --warmup 4)
for round in $(seq "$rounds"); do
  start_replica 0,1 2
  start_balancer
  load one-2t "$prompts" "${scaling_load[@]}"
  stop_all
  start_replica 0 1
  start_balancer
  load one-1t "$prompts" "${scaling_load[@]}"
  stop_all
  start_replica 0 1
  start_replica 1 1
  start_balancer
  load two-1t "$prompts" "${scaling_load[@]}"
  stop_all
  base=$(json "$out/one-2t.json" r.output_throughput)
  for c in one-2t one-1t two-1t; do
    tps=$(json "$out/$c.json" r.output_throughput)
    printf 'round %d  %-7s %8.1f tok/s  %5.2fx  (TTFT median %6.0f ms, failed %s)\n' "$round" "$c" "$tps" \
      "$(node -e "console.log($tps / $base)")" "$(json "$out/$c.json" r.ttft_ms.median)" \
      "$(json "$out/$c.json" r.failed)"
  done
done

echo "== prefix affinity: $num_prefixes groups sharing a $shared_prefix-token prefix, 2 replicas (-t 1, 48 MiB KV each)"
affinity_load=(--input-len $((shared_prefix + 64)) --shared-prefix-len "$shared_prefix"
  --num-prefixes "$num_prefixes" --output-len 16 --max-concurrency 4)
for round in $(seq "$rounds"); do
  for mode in leastconn prefix-affinity; do
    start_replica 0 1 --kv-memory 48
    start_replica 1 1 --kv-memory 48
    if [ "$mode" = prefix-affinity ]; then start_balancer --prefix-affinity; else start_balancer; fi
    load "affinity-$mode" "$affinity_prompts" "${affinity_load[@]}"
    hits=$(metric_sum vllm:prefix_cache_hits_total)
    queries=$(metric_sum vllm:prefix_cache_queries_total)
    stop_all
    f="$out/affinity-$mode.json"
    printf 'round %d  %-15s prefix-cache hits %5.1f%% of prompt tokens   TTFT median %6.0f ms  p90 %6.0f ms   %6.2f req/s  (failed %s)\n' \
      "$round" "$mode" "$(node -e "console.log(100 * $hits / Math.max(1, $queries))")" \
      "$(json "$f" r.ttft_ms.median)" "$(json "$f" r.ttft_ms.p90)" "$(json "$f" r.request_throughput)" \
      "$(json "$f" r.failed)"
  done
done
