#!/usr/bin/env bash
# Serving figures from a client in another process: starts `sieve serve` on a free loopback
# port, runs `sieve bench-serve` (streaming completions, exact input/output lengths) at
# concurrency 1, 8 and 32, and stops the server.
#   bench/serve_throughput.sh MODEL.gguf INPUT_LEN OUTPUT_LEN NUM_PROMPTS OUT_PREFIX [extra serve args...]
# e.g. bench/serve_throughput.sh ../shared/models/stories260K.gguf 128 128 64 /tmp/s260k
# Writes OUT_PREFIX.json (every request) and OUT_PREFIX.svg. SIEVE=path/to/sieve picks the binary.
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1 input_len=$2 output_len=$3 num_prompts=$4 out=$5
shift 5
source bench/serve_lib.sh
start_server "$model" "$@"
trap stop_server EXIT
"$sieve" bench-serve --base-url "http://127.0.0.1:$port" --tokenizer "$model" \
  --input-len "$input_len" --output-len "$output_len" --num-prompts "$num_prompts" \
  --sweep-concurrency 1,8,32 --warmup 8 --seed 1 --out "$out.json" --plot "$out.svg"
