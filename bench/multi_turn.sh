#!/usr/bin/env bash
# Conversations on a compressed cache: USERS simulated users each send TURNS turns (the
# conversation so far + NEW new tokens, OUT tokens answered), one turn after the previous answer,
# against `sieve serve` with each policy in the same KV memory. Prints, per policy, the median
# TTFT of each turn, the share of prompt tokens served from cache, and the throughput; read turn
# 8 against turn 2, and sparse against full.
#   bench/multi_turn.sh MODEL.gguf [POLICIES]
#   default POLICIES="full snapkv:B=1024,W=32 streaming:S=4,W=1020"; env TURNS (8), NEW (2048),
#   FIRST (the first turn's tokens, NEW), OUT (64), USERS (1), KV_TOKENS (the pool: TURNS * (NEW +
#   OUT) tokens per user, rounded up to pages), SEED (3), SERVE_ARGS (more `sieve serve` options,
#   e.g. "--remembered-answers 0")
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
policies=${2:-"full snapkv:B=1024,W=32 streaming:S=4,W=1020"}
turns=${TURNS:-8}
new=${NEW:-2048}
first=${FIRST:-$new}
out=${OUT:-64}
users=${USERS:-1}
kv_tokens=${KV_TOKENS:-$((users * (first + (turns - 1) * new + turns * out + 16 * turns)))}
source bench/serve_lib.sh
echo "$users user(s) x $turns turns: $first tokens, then $new new tokens a turn, $out answered; KV pool $kv_tokens tokens"
for policy in $policies; do
  # shellcheck disable=SC2086 # SERVE_ARGS is a list of options
  start_server "$model" --kv-tokens "$kv_tokens" --max-num-seqs 256 --kv-policy "$policy" ${SERVE_ARGS:-}
  echo "== $policy"
  "$sieve" bench-serve --base-url "http://127.0.0.1:$port" --tokenizer "$model" \
    --input-len "$first" --turn-input-len "$new" --output-len "$out" --multi-turn "$turns" \
    --num-prompts "$users" --max-concurrency "$users" --seed "${SEED:-3}" \
    --out "/tmp/multi_turn_${policy%%:*}.json" 2>/dev/null |
    sed -n -e '/Output token throughput/p' -e '/Benchmark duration/p' -e '/Multi-turn/,/^====/p'
  curl -s "http://127.0.0.1:$port/metrics" |
    grep -E '^sieve:(continued_requests_total|parked_evictions_total)|^vllm:num_preemptions_total' || true
  stop_server
done
