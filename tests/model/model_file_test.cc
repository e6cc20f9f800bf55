// gen-model and quantize: deterministic, loadable files with sensible outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "eval/compare.h"
#include "gguf/gguf.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "shared_data.h"
#include "util/thread_pool.h"

namespace sieve {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("sieve_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

model::RandomModelSpec small_spec(kernels::DType dtype) {
  return {.dim = 128, .num_layers = 2, .num_heads = 4, .num_kv_heads = 2, .ffn_dim = 256,
          .context_length = 4096, .rope_base = 500000.0f, .dtype = dtype,
          .vocab_path = testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf"), .seed = 7};
}

TEST(GenModel, DeterministicWhateverTheThreadCount) {
  const std::string a = temp_path("a.gguf"), b = temp_path("b.gguf");
  ThreadPool one(1), three(3);
  model::write_random_model(small_spec(kernels::DType::kQ8_0), a, one);
  model::write_random_model(small_spec(kernels::DType::kQ8_0), b, three);
  EXPECT_EQ(read_bytes(a), read_bytes(b));
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

TEST(GenModel, LoadsWithRealVocabularyAndPeakedLogits) {
  const std::string path = temp_path("gen.gguf");
  ThreadPool pool(2);
  model::write_random_model(small_spec(kernels::DType::kF16), path, pool);
  model::LoadedModel loaded = model::load_model({path, ""});
  const model::ModelConfig& config = loaded.model->config();
  EXPECT_EQ(config.dim, 128);
  EXPECT_EQ(config.num_kv_heads, 2);
  EXPECT_EQ(config.context_length, 4096);
  EXPECT_FLOAT_EQ(config.rope.freq_base, 500000.0f);
  EXPECT_EQ(config.vocab_size, 32000);
  EXPECT_EQ(loaded.tokenizer->encode("Hello world"),
            (std::vector<int32_t>{1, 15043, 3186}));  // the llama SPM vocabulary, copied

  eval::GreedyRun run = eval::run_greedy(*loaded.model, loaded.tokenizer->encode("Hello world"), 8, pool);
  ASSERT_EQ(run.tokens.size(), 8u);
  // Logits far from uniform: the top two are separated by much more than rounding error.
  for (size_t step = 0; step < run.tokens.size(); ++step) {
    std::vector<float> row(run.logits.begin() + step * 32000, run.logits.begin() + (step + 1) * 32000);
    std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
    double mean = 0, sq = 0;
    for (float l : row) mean += l / row.size();
    for (float l : row) sq += (l - mean) * (l - mean) / row.size();
    EXPECT_GT(std::sqrt(sq), 1.0) << "logits nearly uniform at step " << step;
    EXPECT_GT(row[0] - row[1], 1e-3) << "greedy hinges on rounding at step " << step;
  }
  std::filesystem::remove(path);
}

TEST(Quantize, EveryTypeLoadsAndTracksF32) {
  const std::string input = testing::shared_path("models/stories260K.gguf");
  model::LoadedModel reference = model::load_model({input, ""});
  ThreadPool pool(2);
  std::vector<std::vector<int32_t>> prompts = {reference.tokenizer->encode("Once upon a time"),
                                               reference.tokenizer->encode("The little dog")};
  // Loose bounds on the error each type's rounding allows on this tiny (dim 64) model; the
  // measured figures are printed by `sieve quantize --compare`.
  const std::vector<std::pair<const char*, double>> types = {
      {"f32", 0.0}, {"f16", 0.05}, {"bf16", 0.5}, {"q8_0", 1.5}, {"q4_0", 20.0}};
  for (const auto& [type, max_error] : types) {
    SCOPED_TRACE(type);
    const std::string output = temp_path(std::string(type) + ".gguf");
    model::QuantizeReport report = model::quantize_model(input, output, *model::parse_dtype(type), pool);
    EXPECT_EQ(report.tensors.size(), 48u);
    model::LoadedModel candidate = model::load_model({output, ""});
    eval::ModelAgreement agreement = eval::compare_models(*reference.model, *candidate.model, prompts, 32, pool);
    EXPECT_EQ(agreement.steps, 64);
    if (std::string(type) == "f32") {
      // Same weights; only the attention kernel's summation order differs between the
      // reference's token-by-token decode and the candidate's one-batch prefill.
      EXPECT_LT(agreement.max_abs_logit_error, 1e-4);
      EXPECT_EQ(agreement.free_run_tokens, agreement.free_run_total);
    } else {
      EXPECT_GT(agreement.max_abs_logit_error, 0.0);
      EXPECT_LT(agreement.max_abs_logit_error, max_error);
      EXPECT_GT(agreement.top1_agreement(), 0.5);
    }
    // Converting back to F32 gives a loadable file with the same number of tensors.
    gguf::File file = gguf::File::open(output);
    EXPECT_EQ(file.tensors().size(), 48u);
    std::filesystem::remove(output);
  }
}

}  // namespace
}  // namespace sieve
