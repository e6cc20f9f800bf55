#!/usr/bin/env bash
# sieve beside llama.cpp on the same GGUF files, in one run on this machine: prompt (prefill) and
# decode tokens/s of each model, sieve / llama.cpp / llama.cpp / sieve per round, medians and the
# ratio sieve / llama.cpp.
#   bench/vs_llama_cpp.sh MODEL.gguf [MODEL.gguf ...]
# llama.cpp is node-llama-cpp's prebuilt CPU build for Linux x64 (npm; bench/llama_cpp/bench.mjs
# drives it), installed into bench/llama_cpp/node_modules on first use. Its loader picks the CPU
# variant (the libggml-cpu-*.so it loads: NLC_LOG=1 prints it); flash attention on.
# Environment:
#   THREADS  threads for both engines, default 2
#   PROMPT   prompt tokens, default 256
#   DECODE   decode tokens, default 32
#   ROUNDS   round pairs (sieve, llama.cpp, llama.cpp, sieve), default 1
#   SIEVE    the sieve binary, default build/sieve
#   SIEVE_ARGS  more `sieve bench` options, e.g. "--prefill-attention bf16"
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-2}
prompt=${PROMPT:-256}
decode=${DECODE:-32}
rounds=${ROUNDS:-1}
sieve=${SIEVE:-build/sieve}
read -r -a sieve_args <<<"${SIEVE_ARGS:-}"
[ $# -gt 0 ] || { echo "usage: $0 MODEL.gguf [MODEL.gguf ...]" >&2; exit 2; }
if [ ! -d bench/llama_cpp/node_modules/node-llama-cpp ]; then
  # npm 11's `ci` refuses a lock file without node-llama-cpp's optional platform packages, which
  # a registry mirror may not carry at all: then install the same pinned versions without it.
  npm ci --prefix bench/llama_cpp --omit=optional --ignore-scripts --no-audit --no-fund >&2 ||
    npm install --prefix bench/llama_cpp --omit=optional --ignore-scripts --no-audit --no-fund \
      --no-save >&2
fi

run_sieve() {
  "$sieve" bench -m "$1" --prompt-tokens "$prompt" --decode-tokens "$decode" -t "$threads" \
    --bandwidth-mib 64 --reps 1 --rounds 1 "${sieve_args[@]}" --json |
    python3 -c 'import json,sys; m=json.load(sys.stdin)["models"][0]; print(m["prompt_tokens_per_s"], m["decode_tokens_per_s"])'
}
run_llama() {
  node bench/llama_cpp/bench.mjs "$1" "$threads" "$prompt" "$decode" 1 |
    python3 -c 'import json,sys; m=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(m["prompt_tok_s"], m["decode_tok_s"])'
}

printf '%-28s %12s %12s %8s %12s %12s %8s\n' model "sieve pp/s" "llama pp/s" ratio \
  "sieve tg/s" "llama tg/s" ratio
for model in "$@"; do
  s_pp=() s_tg=() l_pp=() l_tg=()
  for ((r = 0; r < rounds; ++r)); do
    for engine in sieve llama llama sieve; do
      read -r pp tg < <(run_$engine "$model")
      if [ "$engine" = sieve ]; then s_pp+=("$pp") s_tg+=("$tg"); else l_pp+=("$pp") l_tg+=("$tg"); fi
    done
  done
  python3 - "$(basename "$model")" "${s_pp[*]}" "${l_pp[*]}" "${s_tg[*]}" "${l_tg[*]}" <<'EOF'
import statistics, sys
name, *cols = sys.argv[1:]
s_pp, l_pp, s_tg, l_tg = ([float(v) for v in c.split()] for c in cols)
med = statistics.median
print(f"{name:<28} {med(s_pp):12.1f} {med(l_pp):12.1f} {med(s_pp) / med(l_pp):7.2f}x "
      f"{med(s_tg):12.2f} {med(l_tg):12.2f} {med(s_tg) / med(l_tg):7.2f}x")
EOF
done
echo "pp = prompt tokens/s ($prompt tokens), tg = decode tokens/s ($decode tokens), $threads threads;" \
  "medians of $((2 * rounds)) runs each, interleaved${SIEVE_ARGS:+; sieve with $SIEVE_ARGS}"
