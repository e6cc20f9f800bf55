#!/usr/bin/env bash
# What the dashboard's GET /v1/kv/state costs, in one run against one `sieve serve`:
#   1. its latency idle and with 64 requests decoding (a keep-alive client polling at 100 Hz:
#      median and p99; the engine answers at its next step boundary, so this is about half a
#      step plus the JSON);
#   2. decode throughput (bench-serve, concurrency 64) with nobody polling, polling at 1 Hz and
#      at 10 Hz, interleaved ROUNDS times, with each polled rate's ratio to not polling.
#   bench/kv_state_cost.sh [MODEL.gguf] [extra serve args...]
# e.g. bench/kv_state_cost.sh ../shared/models/stories260K.gguf
# Env: SIEVE (binary, default build/sieve), ROUNDS (2), INPUT_LEN (64), OUTPUT_LEN (256),
# NUM_PROMPTS (256).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-../shared/models/stories260K.gguf}
shift || true
rounds=${ROUNDS:-2} input_len=${INPUT_LEN:-64} output_len=${OUTPUT_LEN:-256}
num_prompts=${NUM_PROMPTS:-256}
source bench/serve_lib.sh
start_server "$model" --max-num-seqs 64 "$@"
tmp=$(mktemp -d)
poller=
cleanup() {
  [ -n "$poller" ] && kill "$poller" 2> /dev/null || true
  stop_server
  rm -rf "$tmp"
}
trap cleanup EXIT
base="http://127.0.0.1:$port"
# field FILE PATH: a value of a JSON file (PATH like .runs[0].summary.output_throughput).
field() { node -e "const j = JSON.parse(require('fs').readFileSync(process.argv[1])); console.log(JSON.stringify(j${2}))" "$1"; }
state="$base/v1/kv/state"

load() {  # load OUT.json OUTPUT_LEN NUM_PROMPTS: streaming completions, 64 at a time
  "$sieve" bench-serve --base-url "$base" --tokenizer "$model" --input-len "$input_len" \
    --output-len "$2" --num-prompts "$3" --max-concurrency 64 --seed 1 --out "$1" > /dev/null 2>&1
}

echo "== GET /v1/kv/state latency (keep-alive client, 100 Hz)"
node bench/kv_state_poll.mjs "$state" 100 200 | sed 's/^/idle:        /'
# Long requests, so that all 64 decode while the poller samples.
load "$tmp/busy.json" $((512 - input_len - 8)) 64 &
busy=$!
for _ in $(seq 600); do
  curl -sf "$state" > "$tmp/state.json"
  running=$(field "$tmp/state.json" '.sequences.filter((s) => s.state === "decode").length')
  [ "$running" -ge 64 ] && break
  sleep 0.05
done
node bench/kv_state_poll.mjs "$state" 100 300 | sed 's/^/64 decoding: /'
wait "$busy"

echo "== decode throughput, concurrency 64, output $output_len tokens x $num_prompts requests"
load "$tmp/warmup.json" 32 64
declare -A tput tpot
for round in $(seq "$rounds"); do
  for hz in 0 1 10; do
    poller=
    if [ "$hz" != 0 ]; then
      node bench/kv_state_poll.mjs "$state" "$hz" > "$tmp/poll-$hz-$round.json" &
      poller=$!
    fi
    load "$tmp/run-$hz-$round.json" "$output_len" "$num_prompts"
    if [ -n "$poller" ]; then
      kill -TERM "$poller"
      wait "$poller" || true
      poller=
    fi
    t=$(field "$tmp/run-$hz-$round.json" '.runs[0].summary.output_throughput')
    p=$(field "$tmp/run-$hz-$round.json" '.runs[0].summary.tpot_ms.median')
    polls=-
    [ "$hz" != 0 ] && polls=$(cat "$tmp/poll-$hz-$round.json")
    printf 'round %d  %2s Hz  output %8.1f tok/s  TPOT median %6.3f ms  polls %s\n' \
      "$round" "$hz" "$t" "$p" "$polls"
    tput[$hz]="${tput[$hz]:-} $t"
    tpot[$hz]="${tpot[$hz]:-} $p"
  done
done
mean() { echo "$@" | tr ' ' '\n' | awk 'NF { s += $1; n++ } END { printf "%.2f", s / n }'; }
base_tput=$(mean ${tput[0]}) base_tpot=$(mean ${tpot[0]})
echo "== means over $rounds rounds (ratio to not polling)"
for hz in 0 1 10; do
  t=$(mean ${tput[$hz]}) p=$(mean ${tpot[$hz]})
  awk -v hz="$hz" -v t="$t" -v p="$p" -v bt="$base_tput" -v bp="$base_tpot" 'BEGIN {
    printf "%2s Hz  output %8.1f tok/s (%.3fx)  TPOT median %6.3f ms (%.3fx)\n", hz, t, t / bt, p, p / bp }'
done
