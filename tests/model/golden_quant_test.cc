// Every file of shared/golden/quant (see its README: llama.cpp's outputs for random-weight
// models in each weight type and architecture variant) against llama.cpp, with bounds per file
// (per weight type / architecture) set from what sieve measured, so that a regression in one
// type fails that type's case:
//   - perplexity (ctx 128, the first 20 chunks of tinystories_valid.txt): relative change;
//   - the logprobs of llama.cpp's top-5 ids at each compared step (|sieve - llama.cpp|): after
//     the prompt batch (step 0), at every step, and the mean over a file's steps;
//   - greedy tokens from each case's prompt equal llama.cpp's up to the case's first genuine
//     near-tie: a step whose recorded top-1 vs top-2 logit gap is below twice the type's
//     per-step bound (two logits that each moved by at most e swap only when their gap is below
//     2e). A flip there must also be explained by the error measured at that very step
//     (gap < 2 * error); the case is compared up to the flip.
// Both engines round activations to 8 bits for quantized weights with the same arithmetic
// (ggml's x86 quantizer, Q8_1 sums, RMSNorm), so the prompt step agrees to float noise (~1e-6).
// Float summation order differs (matmul tiles, attention), so now and then one 8-bit rounding
// during generation falls the other way and these random models amplify it: the steps after
// differ by up to ~0.2. Where no rounding falls the other way (Q3_K_S, Q4_K_M, Q5_K_S, Q5_K_M,
// IQ4_NL here) sieve reproduces llama.cpp to float noise at every step, and must keep doing so.
// F16 files: llama.cpp converts activations to F16, sieve keeps them F32 (~0.005 everywhere).
// The figures are deterministic for a build on a machine (the same on every run and thread
// count). The table below was measured on x86-64 with AVX-512 VNNI (AMD EPYC; the kernels' "AVX3"
// target and their VNNI tiles); other kernel paths sum in another order, so a CPU without them
// checks against the generic bounds instead (and says so). A kernel change that moves a type's
// figures must re-measure them (the test prints a "measured" line per file in the table's form)
// and say why. (2026-12-06: the perplexity column of the quantized types, after prefill
// attention began summing q·k with keys in lanes: its 128-token chunks round differently, and
// one 8-bit activation rounding falling the other way moves these random models' perplexity by
// up to ~0.3%; the other columns come from decode steps, which did not change.) The perplexity
// bound is also never tighter than twice what an F16 KV cache alone moves the file's
// perplexity: a change of arithmetic that moves it no more than that is noise, not a regression.
// TQ2_0 is not a type sieve runs: its case checks that loading fails naming the tensor, the type
// and the supported types.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <numeric>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unistd.h>

#include "engine/generator.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "kernels/backend.h"
#include "kernels/ops.h"
#include "model/kv_cache.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "shared_data.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve {
namespace {

using nlohmann::json;

constexpr int64_t kContext = 128;
constexpr int64_t kChunks = 20;

// What sieve measured per file (step-0 and worst-step top-5 logprob |diff|, mean over the
// compared steps, |relative perplexity change|), rounded up to two significant figures.
struct Measured {
  double first_step;  // after the prompt batch, before any generated token
  double any_step;    // worst step, flips included
  double mean;        // mean over the compared steps of a file
  double perplexity;  // relative
};
// clang-format off
const std::map<std::string, Measured, std::less<>> kMeasured = {
    // type_or_arch           first    any      mean     perplexity
    {"F16",                  {2.3e-3, 6.5e-3, 2.8e-3, 4.0e-5}},
    {"Q4_0",                 {2.0e-6, 6.2e-2, 1.6e-3, 8.2e-4}},
    {"Q4_1",                 {2.0e-6, 8.8e-2, 1.7e-2, 7.2e-4}},
    {"Q5_0",                 {1.0e-6, 1.1e-1, 2.3e-2, 3.4e-4}},
    {"Q5_1",                 {1.0e-6, 8.7e-2, 1.3e-2, 2.1e-4}},
    {"Q8_0",                 {1.0e-6, 1.2e-1, 1.7e-2, 8.1e-4}},
    {"Q2_K",                 {2.0e-6, 6.9e-2, 3.3e-3, 1.9e-3}},
    {"Q3_K_S",               {2.0e-6, 4.0e-6, 1.0e-6, 2.9e-3}},
    {"Q3_K_M",               {2.0e-6, 2.2e-1, 1.4e-2, 7.1e-4}},
    {"Q3_K_L",               {1.0e-6, 1.4e-1, 1.6e-2, 1.0e-3}},
    {"Q4_K_S",               {1.0e-6, 1.8e-1, 1.7e-2, 1.6e-3}},
    {"Q4_K_M",               {2.0e-6, 3.0e-6, 1.0e-6, 9.9e-4}},
    {"Q5_K_S",               {2.0e-6, 3.0e-6, 1.0e-6, 1.1e-3}},
    {"Q5_K_M",               {1.0e-6, 4.0e-6, 1.0e-6, 5.4e-4}},
    {"Q6_K",                 {1.0e-6, 4.0e-2, 9.9e-4, 2.3e-4}},
    {"IQ4_NL",               {2.0e-6, 2.0e-6, 1.0e-6, 2.1e-3}},
    {"IQ4_XS",               {1.0e-6, 1.4e-1, 1.5e-2, 1.5e-3}},
    {"llama3rope-F16",       {2.8e-3, 7.1e-3, 3.2e-3, 1.4e-4}},
    {"llama-linrope-F16",    {4.9e-3, 8.0e-3, 3.0e-3, 7.6e-5}},
    {"qwen2-F16",            {8.1e-3, 1.1e-2, 5.2e-3, 9.1e-5}},
    {"qwen3-F16",            {3.1e-3, 5.2e-3, 2.5e-3, 1.3e-5}},
    {"phi3-F16",             {4.1e-3, 7.2e-3, 3.1e-3, 4.2e-5}},
    {"qwen2-Q4_K_M",         {1.0e-6, 6.2e-2, 8.6e-4, 1.9e-3}},
    {"llama3rope-Q4_K_M",    {1.0e-6, 2.2e-1, 1.9e-2, 1.5e-3}},
};
// clang-format on

// Bound = kMargin x measured, but never below kFloor (float noise: a log-softmax over 512 logits
// moves by ~1e-6 when a sum is reordered) and never above the generic bound it replaced (F16
// files 0.02 per step and 0.01 mean, quantized ones 0.02 at step 0, 0.3 per step, 0.03 mean;
// perplexity 0.5%), so where 2x would loosen that the margin is smaller (down to 1.3x).
constexpr double kMargin = 2.0;
constexpr double kFloor = 1e-4;
constexpr Measured kGenericF16{
    .first_step = 0.02, .any_step = 0.02, .mean = 0.01, .perplexity = 0.005};
constexpr Measured kGenericQuantized{
    .first_step = 0.02, .any_step = 0.3, .mean = 0.03, .perplexity = 0.005};

// Whether the kernels run the path kMeasured was measured on.
bool on_measured_path() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return kernels::active_target() == "AVX3" && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

double bound(double measured, double generic) {
  return std::min(std::max(kMargin * measured, kFloor), generic);
}

Measured bounds_for(const Measured& measured, bool quantized) {
  const Measured& generic = quantized ? kGenericQuantized : kGenericF16;
  return {.first_step = bound(measured.first_step, generic.first_step),
          .any_step = bound(measured.any_step, generic.any_step),
          .mean = bound(measured.mean, generic.mean),
          .perplexity = bound(measured.perplexity, generic.perplexity)};
}

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

  const auto measured = kMeasured.find(type);
  ASSERT_NE(measured, kMeasured.end())
      << "no measured bounds for " << type << ": run this case, add its \"measured\" line to "
      << "kMeasured";
  const bool quantized = !type.ends_with("F16");
  const bool measured_path = on_measured_path();
  const Measured tol = measured_path ? bounds_for(measured->second, quantized)
                       : quantized   ? kGenericQuantized
                                     : kGenericF16;

  model::LoadedModel loaded = model::load_model({path, ""});
  const model::Model& model = *loaded.model;
  EXPECT_EQ(model.config().architecture, entry["arch"].get<std::string>());

  double ppl_change = 0.0;  // relative to llama.cpp's
  double ppl_bound = 0.0;   // the bound it was held to
  {
    SCOPED_TRACE("perplexity");
    std::vector<int32_t> tokens = tinystories_tokens(*loaded.tokenizer);
    ASSERT_GE(static_cast<int64_t>(tokens.size()), kContext * kChunks);
    tokens.resize(kContext * kChunks);  // llama-perplexity --chunks 20
    const eval::PerplexityResult result = eval::perplexity(model, tokens, 1, kContext);
    const json& want = entry["perplexity"];
    ASSERT_EQ(want["ctx"].get<int64_t>(), kContext);
    ASSERT_EQ(want["chunks"].get<int64_t>(), kChunks);
    EXPECT_EQ(result.num_chunks, kChunks);
    const double want_ppl = want["value"].get<double>();
    // How far this file's perplexity moves under a change of arithmetic alone: sieve's own run
    // with an F16 KV cache (llama-perplexity's default). On these random models one 8-bit
    // activation rounding falling the other way moves it by up to ~0.3%, and any change of
    // summation order in prefill does that; the bound is never tighter than twice this.
    const double noise = std::abs(
        eval::perplexity(model, tokens, 1, kContext, {}, kernels::DType::kF16).ppl / result.ppl -
        1.0);
    const double generic = (quantized ? kGenericQuantized : kGenericF16).perplexity;
    ppl_bound = std::min(generic, std::max(tol.perplexity, 2 * noise));
    EXPECT_NEAR(result.ppl, want_ppl, ppl_bound * want_ppl)
        << "bound " << ppl_bound << " (measured " << tol.perplexity << ", arithmetic noise "
        << noise << ")";
    ppl_change = result.ppl / want_ppl - 1.0;
  }

  // Per step, the largest |logprob difference| over llama.cpp's top-5 ids.
  std::vector<double> step_errors;
  double first_step_error = 0.0;
  int greedy_equal = 0, greedy_total = 0, greedy_before_near_tie = 0;
  for (const json& c : entry["cases"]) {
    SCOPED_TRACE(c["prompt"].get<std::string>());
    const auto prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
    EXPECT_EQ(loaded.tokenizer->encode(c["prompt"].get<std::string>()), prompt);
    const auto want_tokens = c["tokens"].get<std::vector<int32_t>>();
    const json& want_top = c["top_logprobs"];
    const auto gaps = c["top2_logit_gap"].get<std::vector<double>>();
    ASSERT_EQ(want_top.size(), want_tokens.size());
    ASSERT_EQ(gaps.size(), want_tokens.size());
    greedy_total += static_cast<int>(want_tokens.size());
    // The steps before the first one that this type's error bounds could flip must all agree.
    int must_agree = 0;
    while (must_agree < static_cast<int>(gaps.size()) &&
           gaps[must_agree] >= 2 * (must_agree == 0 ? tol.first_step : tol.any_step)) {
      ++must_agree;
    }
    greedy_before_near_tie += must_agree;

    size_t step = 0;
    engine::generate(
        model, prompt,
        {.max_tokens = static_cast<int32_t>(want_tokens.size()), .sampling = {.temperature = 0.0f}},
        [&](int32_t token, std::span<const float> logits) {
          double error = 0.0;
          for (const json& top : want_top[step]) {
            error =
                std::max(error, std::abs(engine::token_logprob(logits, top["id"].get<int32_t>()) -
                                         top["logprob"].get<double>()));
          }
          step_errors.push_back(error);
          if (step == 0) first_step_error = std::max(first_step_error, error);
          // The prompt's step has no generated token in its KV: no earlier rounding can differ.
          EXPECT_LE(error, step == 0 ? tol.first_step : tol.any_step) << "step " << step;
          if (token != want_tokens[step]) {
            // Two logits that each moved by up to `error` can swap only when their gap is below
            // 2 error.
            EXPECT_LT(gaps[step], 2 * error)
                << "step " << step << ": sieve chose " << token << ", llama.cpp "
                << want_tokens[step] << " with a top-2 gap of " << gaps[step];
            return false;  // the rest of the case follows another prefix
          }
          ++greedy_equal;
          ++step;
          return step < want_tokens.size();
        });
    EXPECT_GE(static_cast<int>(step), must_agree)
        << "greedy tokens must equal llama.cpp's up to the first top-2 gap that this type's "
        << "bounds could swap (step " << must_agree << ")";
  }
  ASSERT_GE(step_errors.size(), 3u) << "every case compares at least its first step";
  const double mean =
      std::accumulate(step_errors.begin(), step_errors.end(), 0.0) / step_errors.size();
  const double max = *std::max_element(step_errors.begin(), step_errors.end());
  EXPECT_LE(mean, tol.mean);
  EXPECT_GE(greedy_equal, greedy_before_near_tie);
  std::printf(
      "golden %s: perplexity %+.4f%%, greedy %d/%d equal (%d before a near-tie must), top-5 "
      "logprob |diff| step 0 %.2e, max %.2e, mean %.2e; %s bounds %.1e %.1e %.1e, perplexity "
      "%.1e (with the arithmetic noise)\n",
      file.c_str(), 100.0 * ppl_change, greedy_equal, greedy_total, greedy_before_near_tie,
      first_step_error, max, mean, measured_path ? "measured" : "generic (another kernel path)",
      tol.first_step, tol.any_step, tol.mean, ppl_bound);
  // The line to put in kMeasured after a change that moves this type's figures on purpose.
  std::printf("measured {\"%s\", {%.1e, %.1e, %.1e, %.1e}},\n", type.c_str(), first_step_error, max,
              mean, std::abs(ppl_change));
}

// Teacher-forced logits, decoded as generate() does (the prompt as one batch, then one token at a
// time) over `tokens` whatever the model would pick: step i's logits see prompt + tokens[0, i).
std::vector<std::vector<float>> forced_logits(const model::Model& model,
                                              std::span<const int32_t> prompt,
                                              std::span<const int32_t> tokens) {
  auto [cache, block_table] = model::KvCache::for_one_sequence(
      model.backend(), model.config(), static_cast<int32_t>(prompt.size() + tokens.size()));
  model::ForwardScratch scratch;
  std::vector<std::vector<float>> steps;
  std::vector<float> logits;
  model::Batch batch;
  batch.begin_sequence(block_table);
  for (size_t j = 0; j < prompt.size(); ++j)
    batch.add(prompt[j], static_cast<int32_t>(j), j + 1 == prompt.size());
  model.forward(batch, cache, scratch, logits);
  steps.push_back(logits);
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    model::Batch next;
    next.begin_sequence(block_table);
    next.add(tokens[i], static_cast<int32_t>(prompt.size() + i), true);
    model.forward(next, cache, scratch, logits);
    steps.push_back(logits);
  }
  return steps;
}

// How far each engine's outputs are from an f32 reference: the same file with every weight
// dequantized to F32, run with f32 activations and an f32 KV cache, so that what is left is the
// engines' own arithmetic (activation rounding, KV dtype, summation order), not the weights'.
struct Exactness {
  std::string file;
  bool quantized;                 // activations rounded to 8 bits (Q8_0 / Q8_1 / Q8_K)
  double sieve_top5, llama_top5;  // mean over steps of the largest top-5 logprob |diff|
  double sieve_ppl, sieve_f16_ppl, llama_ppl;  // perplexity / reference - 1
};

Exactness measure_exactness(const json& entry) {
  const std::string file = entry["file"].get<std::string>();
  const std::string type = entry["type_or_arch"].get<std::string>();
  const std::string path = testing::shared_path("golden/quant/" + file);
  const std::string reference_path =
      (std::filesystem::temp_directory_path() /
       ("sieve_f32_reference_" + std::to_string(::getpid()) + "_" + file))
          .string();
  {
    ThreadPool pool(2);
    model::quantize_model(path, reference_path, *model::parse_quant_mix("F32"), pool);
  }
  model::LoadedModel reference = model::load_model({reference_path, ""});
  std::filesystem::remove(reference_path);
  model::LoadedModel loaded = model::load_model({path, ""});

  Exactness result{.file = file, .quantized = !type.ends_with("F16")};
  int64_t steps = 0;
  for (const json& c : entry["cases"]) {
    const auto prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
    const auto tokens = c["tokens"].get<std::vector<int32_t>>();
    const json& recorded = c["top_logprobs"];
    const auto want = forced_logits(*reference.model, prompt, tokens);
    const auto got = forced_logits(*loaded.model, prompt, tokens);
    for (size_t step = 0; step < tokens.size(); ++step, ++steps) {
      double sieve_error = 0.0, llama_error = 0.0;
      for (const json& top : recorded[step]) {
        const int32_t id = top["id"].get<int32_t>();
        const double exact = engine::token_logprob(want[step], id);
        sieve_error = std::max(sieve_error, std::abs(engine::token_logprob(got[step], id) - exact));
        llama_error = std::max(llama_error, std::abs(top["logprob"].get<double>() - exact));
      }
      result.sieve_top5 += sieve_error;
      result.llama_top5 += llama_error;
    }
  }
  result.sieve_top5 /= static_cast<double>(steps);
  result.llama_top5 /= static_cast<double>(steps);

  std::vector<int32_t> tokens = tinystories_tokens(*loaded.tokenizer);
  tokens.resize(kContext * kChunks);
  const double reference_ppl = eval::perplexity(*reference.model, tokens, 1, kContext).ppl;
  result.sieve_ppl = eval::perplexity(*loaded.model, tokens, 1, kContext).ppl / reference_ppl - 1;
  result.sieve_f16_ppl =
      eval::perplexity(*loaded.model, tokens, 1, kContext, {}, kernels::DType::kF16).ppl /
          reference_ppl -
      1;
  result.llama_ppl = entry["perplexity"]["value"].get<double>() / reference_ppl - 1;
  return result;
}

// Issue 40's exactness target: for every weight type, sieve's outputs are no further from the f32
// reference than llama.cpp's recorded ones.
//   - top-5 logprobs at each of llama.cpp's greedy steps (every engine fed llama.cpp's tokens;
//     llama.cpp's were recorded with an F32 KV cache, as sieve runs here): per file, sieve's mean
//     distance within 1.1x llama.cpp's + 1e-3. Both round activations to 8 bits for quantized
//     weights with the same arithmetic (2026-12-06: 0.0980 / 0.0982 averaged over the 18
//     quantized files); F16 files separate them: llama.cpp rounds activations to F16, sieve keeps
//     them F32 (2e-3 to 5e-3 / ~6e-6).
//   - perplexity (ctx 128, 20 chunks): on these random models one 8-bit rounding that falls the
//     other way moves a chunk's log-likelihood by ~0.1, so a file's figure moves by up to 0.3%
//     with any change of arithmetic (sieve's own f32 -> f16 KV: -0.29% -> -0.06% on Q3_K_S;
//     prefill attention's summation order: +0.56% -> +0.29% on qwen2-Q4_K_M) and one file
//     cannot rank the engines. Over the quantized
//     files, sieve's mean |distance| with llama-perplexity's F16 KV cache must stay within 1.5x
//     llama.cpp's (2026-12-06: 0.162% against 0.125%; f32 KV 0.138%).
TEST(GoldenQuantSet, NoFurtherFromAnF32ReferenceThanLlamaCpp) {
  double sieve_ppl_sum = 0.0, llama_ppl_sum = 0.0;
  int quantized_files = 0;
  for (const json& entry : golden()) {
    if (entry["type_or_arch"] == "TQ2_0") continue;  // does not load (MatchesLlamaCpp checks that)
    const Exactness e = measure_exactness(entry);
    SCOPED_TRACE(e.file);
    std::printf(
        "exactness %-28s top-5 logprob |diff| sieve %.2e llama.cpp %.2e; perplexity sieve "
        "%+.4f%% (f16 KV %+.4f%%) llama.cpp %+.4f%%\n",
        e.file.c_str(), e.sieve_top5, e.llama_top5, 100 * e.sieve_ppl, 100 * e.sieve_f16_ppl,
        100 * e.llama_ppl);
    if (e.quantized) {
      EXPECT_LE(e.sieve_top5, 1.1 * e.llama_top5 + 1e-3);
      sieve_ppl_sum += std::abs(e.sieve_f16_ppl);
      llama_ppl_sum += std::abs(e.llama_ppl);
      ++quantized_files;
    } else {
      EXPECT_LT(e.sieve_top5, 0.1 * e.llama_top5);
      EXPECT_LT(std::abs(e.sieve_ppl), 1e-5);
    }
  }
  ASSERT_EQ(quantized_files, 18);
  std::printf(
      "exactness over %d quantized files: mean |perplexity - reference| sieve %.4f%% (f16 "
      "KV) llama.cpp %.4f%%\n",
      quantized_files, 100 * sieve_ppl_sum / quantized_files,
      100 * llama_ppl_sum / quantized_files);
  EXPECT_LE(sieve_ppl_sum, 1.5 * llama_ppl_sum);
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
