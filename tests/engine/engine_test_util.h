#pragma once
// What the engine tests share: the models they run (stories260K, a generated GQA model), prompts
// from the TinyStories text, and running requests through an engine to their outcomes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "shared_data.h"
#include "util/thread_pool.h"

namespace sieve::engine {

inline model::LoadedModel load_stories() {
  return model::load_model({testing::shared_path("models/stories260K.gguf"), ""});
}

// A generated GQA model (8 query heads / 2 KV heads) with the llama SPM vocabulary.
inline model::LoadedModel load_generated() {
  static const std::string path = [] {
    std::string p = (std::filesystem::temp_directory_path() /
                     ("sieve_engine_test_" + std::to_string(::getpid()) + ".gguf"))
                        .string();
    ThreadPool pool(2);
    model::write_random_model(
        {.dim = 128,
         .num_layers = 2,
         .num_heads = 8,
         .num_kv_heads = 2,
         .ffn_dim = 256,
         .context_length = 2048,
         .rope_base = 500000.0f,
         .dtype = kernels::DType::kQ8_0,
         .vocab_path = testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf"),
         .seed = 3},
        p, pool);
    return p;
  }();
  return model::load_model({path, ""});
}

// 32 prompts of different lengths: sentence starts from the TinyStories text.
inline std::vector<std::vector<TokenId>> prompts(const tok::Tokenizer& tokenizer,
                                                 size_t count = 32) {
  std::ifstream in(testing::shared_path("golden/stories260K/tinystories_valid.txt"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();
  std::vector<std::vector<TokenId>> out;
  size_t start = 0;
  for (size_t i = 0; out.size() < count; ++i) {
    size_t end = text.find('.', start);
    std::string sentence = text.substr(start, std::min<size_t>(end - start, 20 + 7 * (i % 9)));
    start = end + 2;
    out.push_back(tokenizer.encode(sentence));
  }
  return out;
}

struct Outcome {
  std::vector<TokenId> tokens;
  std::vector<float> logprobs;  // each token's, where the request asked for them (else 1)
  std::string text;
  std::optional<Finish> finish;
  std::optional<std::string> error;
  Usage usage;
};

// Runs requests through one engine; outcomes keyed by (request index, sample index).
inline std::map<std::pair<size_t, int>, Outcome> run(Engine& engine,
                                                     const std::vector<Request>& requests) {
  std::map<std::pair<size_t, int>, Outcome> outcomes;
  std::map<RequestId, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto submitted = engine.submit(requests[i], [&outcomes, &index](const RequestEvent& event) {
      Outcome& o = outcomes[{index.at(event.request_id), event.sample_idx}];
      o.tokens.insert(o.tokens.end(), event.tokens.begin(), event.tokens.end());
      for (const SampleResult& r : event.logprobs) o.logprobs.push_back(r.logprob.value_or(1.0f));
      o.text += event.text;
      if (event.finish) {
        o.finish = event.finish;
        o.usage = event.usage;
      }
      if (event.error) o.error = event.error;
    });
    EXPECT_TRUE(std::holds_alternative<RequestId>(submitted));
    index[std::get<RequestId>(submitted)] = i;
  }
  engine.run_until_idle();
  return outcomes;
}

inline Request greedy(std::vector<TokenId> prompt, int32_t max_tokens) {
  Request request{.prompt = std::move(prompt)};
  request.params.max_tokens = max_tokens;
  request.params.ignore_eos = true;
  return request;
}

inline EngineConfig config(int32_t num_pages, int32_t max_batch_tokens = 256,
                           bool prefix_caching = true,
                           kernels::DType kv_dtype = model::kKvDefaultDType) {
  return {.num_kv_pages = num_pages,
          .page_size = 16,
          .max_batch_tokens = max_batch_tokens,
          .max_num_seqs = 64,
          .max_queued = 256,
          .enable_prefix_caching = prefix_caching,
          .kv_dtype = kv_dtype};
}

inline void expect_all_pages_free(const Engine& engine) {
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.kv.num_free_pages, stats.kv.num_pages) << "KV pages leaked";
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.num_waiting, 0);
}

}  // namespace sieve::engine
