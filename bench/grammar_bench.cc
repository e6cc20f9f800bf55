// Token-mask cost of the grammar engine (src/grammar) on real vocabularies, and schema compile
// time. Prints timings; asserts nothing.
//
//   build/bench/grammar_bench [shared_dir]     (default: SIEVE_SHARED_DIR or ../shared)
//
// A "generation" follows a fixed JSON document through a json_schema grammar: each step takes the
// longest allowed token that the document continues with (as a model writing it might), after
// timing fill_mask. Three passes over the same steps:
//   cold:  a new TokenMasker (nothing cached: each new key walks the vocabulary trie)
//   keys:  the same masker, whole-state cache off (masks assembled from cached key tables)
//   warm:  the same masker with its whole-state cache (a repeat of a state is a copy)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "grammar/grammar_cache.h"
#include "grammar/json_schema.h"
#include "grammar/token_masker.h"
#include "order_schema.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace sieve::grammar;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

const char* const kSchema = sieve::bench::kOrderSchema;

const char* const kDocument =
    R"({"id": 48213, "customer": {"name": "Ada Lovelace", "email": "ada@example.com", )"
    R"("tier": "pro"}, "items": [{"sku": "BK-1843-NOTES", "qty": 2, "price": 19.99, )"
    R"("note": "gift wrap, please"}, {"sku": "PEN-FOUNTAIN", "qty": 1, "price": 120.5, )"
    R"("note": null}, {"sku": "INK-BLUE", "qty": 3, "price": 7.25}], "paid": true, )"
    R"("tags": ["priority", "returning customer", "ships today"]})";

struct Pass {
  std::vector<double> ms;
  void report(const char* name) const {
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    double total = 0;
    for (double x : ms) total += x;
    std::printf(
        "    %-5s steps %3zu  mean %8.4f ms  p50 %8.4f  p90 %8.4f  max %8.3f  total %8.2f ms\n",
        name, ms.size(), total / ms.size(), sorted[sorted.size() / 2],
        sorted[sorted.size() * 9 / 10], sorted.back(), total);
  }
};

// Picks the steps once (with the cold masker), then replays them.
std::vector<TokenId> plan_and_time(const TokenMasker& masker, Pass& pass) {
  const Vocabulary& v = masker.vocabulary();
  const std::string doc = kDocument;
  GrammarState state = masker.new_state();
  std::vector<TokenId> steps;
  TokenBitset mask;
  size_t pos = 0;
  while (true) {
    const auto start = Clock::now();
    masker.fill_mask(state, mask);
    pass.ms.push_back(ms_since(start));
    if (pos == doc.size()) break;
    TokenId best = -1;
    size_t best_len = 0;
    for (size_t id = 0; id < v.size(); ++id) {
      if (!mask.test(id) || v.is_eog(static_cast<TokenId>(id))) continue;
      const std::string_view bytes = v.token_bytes(static_cast<TokenId>(id));
      if (bytes.size() > best_len && doc.compare(pos, bytes.size(), bytes) == 0) {
        best = static_cast<TokenId>(id);
        best_len = bytes.size();
      }
    }
    if (best < 0) {
      std::printf("    no allowed token continues the document at byte %zu\n", pos);
      std::exit(1);
    }
    masker.accept_token(state, best);
    steps.push_back(best);
    pos += best_len;
  }
  if (!state.can_end()) std::printf("    grammar cannot end after the document?\n");
  return steps;
}

void replay(const TokenMasker& masker, const std::vector<TokenId>& steps, Pass& pass) {
  GrammarState state = masker.new_state();
  TokenBitset mask;
  for (size_t i = 0; i <= steps.size(); ++i) {
    const auto start = Clock::now();
    masker.fill_mask(state, mask);
    pass.ms.push_back(ms_since(start));
    if (i < steps.size()) masker.accept_token(state, steps[i]);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string shared = argc > 1 ? argv[1] : "";
  if (shared.empty())
    shared = std::getenv("SIEVE_SHARED_DIR") ? std::getenv("SIEVE_SHARED_DIR") : "../shared";

  // Schema compile: JSON Schema -> GBNF -> parsed, checked, flattened.
  const int num_compiles = 200;
  auto start = Clock::now();
  size_t num_elements = 0;
  for (int i = 0; i < num_compiles; ++i) {
    num_elements += CompiledGrammar::from_gbnf(json_schema_to_gbnf(kSchema))->num_elements();
  }
  std::printf("schema compile (JSON Schema -> GBNF -> automaton, %zu elements): %.3f ms\n",
              num_elements / num_compiles, ms_since(start) / num_compiles);

  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm"}) {
    const std::string path = shared + "/golden/tokenizer/ggml-vocab-" + std::string(name) + ".gguf";
    const auto tokenizer =
        sieve::tok::Tokenizer::create(sieve::tok::load_vocab(sieve::gguf::File::open(path)));
    start = Clock::now();
    const auto vocab = Vocabulary::from_tokenizer(*tokenizer);
    std::printf("%s: %zu tokens, %zu trie nodes; Vocabulary built in %.1f ms\n", name,
                vocab->size(), vocab->trie().size(), ms_since(start));
    const auto grammar = CompiledGrammar::from_gbnf(json_schema_to_gbnf(kSchema));
    Pass cold, keys, warm;
    TokenMasker masker(grammar, vocab, MaskerOptions{.max_cached_states = 0});
    const std::vector<TokenId> steps = plan_and_time(masker, cold);
    const size_t num_keys = masker.stats().num_keys;
    replay(masker, steps, keys);
    TokenMasker cached(grammar, vocab);
    replay(cached, steps, warm);  // fills both caches
    warm.ms.clear();
    replay(cached, steps, warm);
    std::printf("  %zu steps, %zu distinct keys walked (context_depth 3)\n", steps.size(),
                num_keys);
    cold.report("cold");
    keys.report("keys");
    warm.report("warm");
  }
  return 0;
}
