// Every file of shared/golden/quant (see its README: llama.cpp's outputs for random-weight
// models in each weight type and architecture variant) against llama.cpp:
//   - perplexity (ctx 128, the first 20 chunks of tinystories_valid.txt) within 0.5%;
//   - greedy tokens from each case's prompt equal llama.cpp's; a step whose recorded top-1 vs
//     top-2 logit gap is under 0.05 may flip the token, and the case is compared up to there;
//   - at every compared step, the logprob of each of llama.cpp's top-5 ids within 0.02 (F16
//     files) or 0.15 (quantized files). Both engines round activations to 8 bits for quantized
//     weights; float-level differences upstream (summation order) flip an occasional rounding,
//     and these random models amplify it: base-Q8_0 matches llama.cpp to 1e-4 on most steps but
//     by 0.111 at one step after such a flip (llama.cpp itself moves by up to 0.06 between batch
//     and token-by-token evaluation of the same prefix, see the README).
// TQ2_0 is not a type sieve runs: its case checks that loading fails naming the tensor, the type
// and the supported types.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/generator.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "model/loader.h"
#include "shared_data.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve {
namespace {

using nlohmann::json;

constexpr int64_t kContext = 128;
constexpr int64_t kChunks = 20;
constexpr double kMaxPerplexityError = 0.005;  // relative
constexpr double kFlipGap = 0.05;  // top-1 minus top-2 logit below which a flip is allowed
constexpr double kF16LogprobTolerance = 0.02;
constexpr double kQuantizedLogprobTolerance = 0.15;

const json& golden() {
  static const json all = [] {
    std::ifstream in(testing::shared_path("golden/quant/golden.json"));
    return json::parse(in);
  }();
  return all;
}

// The files, read when the test cases are made (a missing golden.json gives one case that fails).
std::vector<std::string> golden_files() {
  try {
    std::vector<std::string> files;
    for (const json& entry : golden()) files.push_back(entry["file"].get<std::string>());
    return files;
  } catch (const std::exception&) {
    return {"golden.json is missing"};
  }
}

const json& entry_for(const std::string& file) {
  for (const json& entry : golden()) {
    if (entry["file"] == file) return entry;
  }
  throw std::runtime_error("no golden.json entry for " + file);
}

std::vector<int32_t> tinystories_tokens(const tok::Tokenizer& tokenizer) {
  std::ifstream in(testing::shared_path("golden/stories260K/tinystories_valid.txt"),
                   std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string text = buffer.str();
  text.pop_back();  // exactly one trailing newline removed, as llama.cpp's -f does
  return tokenizer.encode(text, {.add_special = true, .parse_special = false});
}

class GoldenQuant : public ::testing::TestWithParam<std::string> {};

TEST_P(GoldenQuant, MatchesLlamaCpp) {
  const std::string& file = GetParam();
  const json& entry = entry_for(file);
  const std::string path = testing::shared_path("golden/quant/" + file);
  const std::string type = entry["type_or_arch"].get<std::string>();

  if (type == "TQ2_0") {
    try {
      model::load_model({path, ""});
      FAIL() << "loading a TQ2_0 model must fail: sieve has no TQ2_0 kernels";
    } catch (const Error& error) {
      const std::string message = error.what();
      bool names_a_tq2_tensor = false;
      for (const auto& [name, tensor_type] : entry["tensor_type_map"].items()) {
        names_a_tq2_tensor |=
            tensor_type == "TQ2_0" && message.find("'" + name + "'") != std::string::npos;
      }
      EXPECT_TRUE(names_a_tq2_tensor) << message;
      EXPECT_NE(message.find("TQ2_0"), std::string::npos) << message;
      EXPECT_NE(message.find("supported"), std::string::npos) << message;
      for (const char* listed : {"F16", "Q8_0", "Q4_0"})
        EXPECT_NE(message.find(listed), std::string::npos) << message;
    }
    return;
  }

  model::LoadedModel loaded = model::load_model({path, ""});
  const model::LlamaModel& model = *loaded.model;
  EXPECT_EQ(model.config().architecture, entry["arch"].get<std::string>());
  ThreadPool pool(2);

  {
    SCOPED_TRACE("perplexity");
    std::vector<int32_t> tokens = tinystories_tokens(*loaded.tokenizer);
    ASSERT_GE(static_cast<int64_t>(tokens.size()), kContext * kChunks);
    tokens.resize(kContext * kChunks);  // llama-perplexity --chunks 20
    const eval::PerplexityResult result = eval::perplexity(model, tokens, 1, kContext, pool);
    const json& want = entry["perplexity"];
    ASSERT_EQ(want["ctx"].get<int64_t>(), kContext);
    ASSERT_EQ(want["chunks"].get<int64_t>(), kChunks);
    EXPECT_EQ(result.num_chunks, kChunks);
    const double want_ppl = want["value"].get<double>();
    EXPECT_NEAR(result.ppl, want_ppl, kMaxPerplexityError * want_ppl);
  }

  const bool quantized = !type.ends_with("F16");
  const double tolerance = quantized ? kQuantizedLogprobTolerance : kF16LogprobTolerance;
  int compared_steps = 0;
  for (const json& c : entry["cases"]) {
    SCOPED_TRACE(c["prompt"].get<std::string>());
    const auto prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(loaded.tokenizer->encode(c["prompt"].get<std::string>()), prompt);
    const auto want_tokens = c["tokens"].get<std::vector<int32_t>>();
    const json& want_top = c["top_logprobs"];
    const auto gaps = c["top2_logit_gap"].get<std::vector<double>>();
    ASSERT_EQ(want_top.size(), want_tokens.size());
    ASSERT_EQ(gaps.size(), want_tokens.size());

    size_t step = 0;
    engine::generate(
        model, prompt,
        {.max_tokens = static_cast<int32_t>(want_tokens.size()), .sampling = {.temperature = 0.0f}},
        pool, [&](int32_t token, std::span<const float> logits) {
          for (const json& top : want_top[step]) {
            EXPECT_NEAR(engine::token_logprob(logits, top["id"].get<int32_t>()),
                        top["logprob"].get<double>(), tolerance)
                << "step " << step << " id " << top["id"];
          }
          ++compared_steps;
          if (token != want_tokens[step]) {
            EXPECT_LT(gaps[step], kFlipGap)
                << "step " << step << ": sieve chose " << token << ", llama.cpp "
                << want_tokens[step] << " with a top-2 gap of " << gaps[step];
            return false;  // the rest of the case follows another prefix
          }
          ++step;
          return step < want_tokens.size();
        });
  }
  EXPECT_GE(compared_steps, 3) << "every case compares at least its first step";
}

INSTANTIATE_TEST_SUITE_P(
    SharedSet, GoldenQuant, ::testing::ValuesIn(golden_files()), [](const auto& info) {
      std::string name = info.param;
      if (name.ends_with(".gguf")) name.resize(name.size() - 5);
      std::replace_if(
          name.begin(), name.end(),
          [](char ch) { return !std::isalnum(static_cast<unsigned char>(ch)); }, '_');
      return name;
    });

TEST(GoldenQuantSet, HasEveryFileOfTheReadme) { EXPECT_EQ(golden().size(), 25u); }

}  // namespace
}  // namespace sieve
