// gen-model and quantize: deterministic, loadable files with sensible outputs.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "eval/compare.h"
#include "gguf/gguf.h"
#include "kernels/backend.h"
#include "model/loader.h"
#include "model/model_file.h"
#include "model/weights.h"
#include "error_of.h"
#include "shared_data.h"
#include "util/thread_pool.h"

namespace sieve {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("sieve_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

model::RandomModelSpec small_spec(kernels::DType dtype) {
  return {.dim = 128,
          .num_layers = 2,
          .num_heads = 4,
          .num_kv_heads = 2,
          .ffn_dim = 256,
          .context_length = 4096,
          .rope_base = 500000.0f,
          .dtype = dtype,
          .vocab_path = testing::shared_path("golden/tokenizer/ggml-vocab-llama-spm.gguf"),
          .seed = 7};
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

  eval::GreedyRun run = eval::run_greedy(*loaded.model, loaded.tokenizer->encode("Hello world"), 8);
  ASSERT_EQ(run.tokens.size(), 8u);
  // Logits far from uniform: the top two are separated by much more than rounding error.
  for (size_t step = 0; step < run.tokens.size(); ++step) {
    std::vector<float> row(run.logits.begin() + step * 32000,
                           run.logits.begin() + (step + 1) * 32000);
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
      {"f32", 0.0},   {"f16", 0.05},  {"bf16", 0.5},  {"q8_0", 1.5},   {"q4_0", 20.0},
      {"q4_1", 20.0}, {"q5_0", 20.0}, {"q5_1", 20.0}, {"iq4_nl", 20.0}};
  for (const auto& [type, max_error] : types) {
    SCOPED_TRACE(type);
    const std::string output = temp_path(std::string(type) + ".gguf");
    model::QuantizeReport report =
        model::quantize_model(input, output, *model::parse_quant_mix(type), pool);
    EXPECT_EQ(report.tensors.size(), 48u);
    model::LoadedModel candidate = model::load_model({output, ""});
    eval::ModelAgreement agreement =
        eval::compare_models(*reference.model, *candidate.model, prompts, 32);
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

// --quantize at load: the same weights `sieve quantize` writes, converted in memory, so the model
// computes the same logits as the written file's; a name it does not know, or a llama2.c
// checkpoint, is an error.
TEST(Quantize, AtLoadEqualsTheWrittenFile) {
  const std::string input = testing::shared_path("models/stories260K.gguf");
  const std::string output = temp_path("at-load-q8_0.gguf");
  ThreadPool pool(2);
  model::quantize_model(input, output, *model::parse_quant_mix("q8_0"), pool);
  model::LoadedModel written = model::load_model({output, ""});
  model::LoadOptions at_load{input, ""};
  at_load.quantize = "Q8_0";
  model::LoadedModel converted = model::load_model(at_load);
  const std::vector<std::vector<int32_t>> prompts = {written.tokenizer->encode("Once upon a time")};
  const eval::ModelAgreement agreement =
      eval::compare_models(*written.model, *converted.model, prompts, 16);
  EXPECT_EQ(agreement.max_abs_logit_error, 0.0);
  EXPECT_EQ(agreement.free_run_tokens, agreement.free_run_total);
  std::filesystem::remove(output);

  at_load.quantize = "q9_k";
  const std::string unknown = testing::error_of([&] { model::load_model(at_load); });
  EXPECT_NE(unknown.find("--quantize q9_k"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("Q4_K_M"), std::string::npos) << unknown;
  model::LoadOptions checkpoint{testing::shared_path("models/stories260K.bin"),
                                testing::shared_path("models/tok512.bin")};
  checkpoint.quantize = "q8_0";
  EXPECT_NE(testing::error_of([&] { model::load_model(checkpoint); }).find("llama2.c"),
            std::string::npos);
}

// --- the per-tensor plan of the mixes -------------------------------------------------------

model::QuantMix mix(const char* name) {
  std::optional<model::QuantMix> parsed = model::parse_quant_mix(name);
  if (!parsed) throw std::runtime_error(std::string("no mix ") + name);
  return *parsed;
}

std::string planned(const char* mix_name, const model::QuantModelInfo& info,
                    const std::string& name, std::vector<uint64_t> shape, bool pure = false) {
  return std::string(
      kernels::to_string(model::plan_tensor_type(mix(mix_name), info, name, shape, pure).dtype));
}

// The kernels' dtype table and the GGUF reader's type table name the same types: a type the
// reader calls supported maps to a dtype whose name and block layout it agrees with, and back.
TEST(DTypeTable, AgreesWithTheGgufTypeTable) {
  int num_supported = 0;
  for (uint32_t id = 0; id < 64; ++id) {
    const auto type = static_cast<gguf::TensorType>(id);
    const std::optional<kernels::DType> dtype = model::to_dtype(type);
    ASSERT_EQ(dtype.has_value(), gguf::is_supported(type)) << gguf::to_string(type);
    if (!dtype) continue;
    ++num_supported;
    EXPECT_EQ(model::to_tensor_type(*dtype), type);
    EXPECT_EQ(kernels::to_string(*dtype), gguf::to_string(type));
    EXPECT_EQ(static_cast<uint64_t>(kernels::block_elems(*dtype)), gguf::block_size(type));
    EXPECT_EQ(kernels::block_bytes(*dtype), gguf::type_size(type));
  }
  EXPECT_EQ(num_supported, std::ssize(kernels::kAllDTypes));
}

TEST(QuantPlan, ParsesLlamaQuantizeNamesAndFileTypes) {
  EXPECT_EQ(mix("q4_k_m").file_type, 15u);
  EXPECT_EQ(mix("Q5_K_M").file_type, 17u);
  EXPECT_EQ(mix("Q4_K").name, "Q4_K_M");  // llama-quantize's alias
  EXPECT_EQ(mix("q5_k").name, "Q5_K_M");
  EXPECT_EQ(mix("Q4_K_S").file_type, 14u);
  EXPECT_EQ(mix("Q6_K").file_type, 18u);
  EXPECT_EQ(mix("Q8_0").file_type, 7u);
  EXPECT_EQ(mix("bf16").file_type, 32u);
  EXPECT_EQ(mix("IQ4_XS").base, kernels::DType::kIQ4_XS);
  EXPECT_FALSE(model::parse_quant_mix("q4_k_x"));
  EXPECT_FALSE(model::parse_quant_mix("tq2_0"));
}

TEST(QuantPlan, MoreBitsLayersOfTheMMixes) {
  const model::QuantModelInfo info{
      .architecture = "llama", .num_layers = 32, .num_gqa = 4, .has_output = true};
  std::vector<int> q6_layers;
  for (int layer = 0; layer < 32; ++layer) {
    const std::string v =
        planned("Q4_K_M", info, "blk." + std::to_string(layer) + ".attn_v.weight", {4096, 1024});
    const std::string down =
        planned("Q4_K_M", info, "blk." + std::to_string(layer) + ".ffn_down.weight", {14336, 4096});
    EXPECT_EQ(v, down) << layer;
    if (v == "Q6_K") q6_layers.push_back(layer);
    EXPECT_EQ(
        planned("Q4_K_M", info, "blk." + std::to_string(layer) + ".attn_q.weight", {4096, 4096}),
        "Q4_K");
    EXPECT_EQ(
        planned("Q4_K_M", info, "blk." + std::to_string(layer) + ".ffn_up.weight", {4096, 14336}),
        "Q4_K");
  }
  // First and last eighth, and every third layer in between.
  EXPECT_EQ(q6_layers,
            (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31}));
  EXPECT_EQ(planned("Q5_K_M", info, "blk.5.attn_v.weight", {4096, 1024}), "Q5_K");
  EXPECT_EQ(planned("Q5_K_M", info, "blk.6.attn_v.weight", {4096, 1024}), "Q6_K");
  EXPECT_EQ(planned("Q4_K_S", info, "blk.3.attn_v.weight", {4096, 1024}), "Q5_K");
  EXPECT_EQ(planned("Q4_K_S", info, "blk.4.attn_v.weight", {4096, 1024}), "Q4_K");
  EXPECT_EQ(planned("Q4_K_M", info, "output.weight", {4096, 128256}), "Q6_K");
  EXPECT_EQ(planned("Q4_K_M", info, "token_embd.weight", {4096, 128256}), "Q4_K");
  EXPECT_EQ(planned("Q4_K_M", info, "blk.0.attn_norm.weight", {4096}), "F32");
  EXPECT_EQ(planned("Q4_K_M", info, "rope_freqs.weight", {64}), "F32");
  // Phi-3's fused matrices.
  EXPECT_EQ(planned("Q4_K_M", info, "blk.7.attn_qkv.weight", {3072, 9216}), "Q5_K");
  EXPECT_EQ(planned("Q5_K_M", info, "blk.7.attn_qkv.weight", {3072, 9216}), "Q6_K");
  // 70B Llama: attn_v everywhere at least Q5_K.
  const model::QuantModelInfo llama70b{
      .architecture = "llama", .num_layers = 80, .num_gqa = 8, .has_output = true};
  EXPECT_EQ(planned("Q4_K_M", llama70b, "blk.11.attn_v.weight", {8192, 1024}), "Q5_K");
  EXPECT_EQ(planned("Q4_K_M", llama70b, "blk.12.attn_v.weight", {8192, 1024}), "Q6_K");
}

TEST(QuantPlan, TiedEmbeddingsPureAndFloatTargets) {
  const model::QuantModelInfo tied{
      .architecture = "qwen2", .num_layers = 24, .num_gqa = 7, .has_output = false};
  EXPECT_EQ(planned("Q4_K_M", tied, "token_embd.weight", {896, 151936}, false),
            "Q8_0");  // 896 % 256 != 0
  EXPECT_EQ(planned("Q4_K_M", tied, "token_embd.weight", {1024, 151936}), "Q6_K");
  EXPECT_EQ(planned("Q8_0", tied, "token_embd.weight", {1024, 151936}), "Q8_0");
  EXPECT_EQ(planned("Q4_0", tied, "token_embd.weight", {1024, 151936}), "Q6_K");
  EXPECT_EQ(planned("Q4_K_M", tied, "token_embd.weight", {1024, 151936}, /*pure=*/true), "Q4_K");
  EXPECT_EQ(planned("Q4_K_M", tied, "blk.0.attn_v.weight", {1024, 128}, /*pure=*/true), "Q4_K");
  for (const char* float_type : {"F32", "F16", "BF16"}) {
    EXPECT_EQ(planned(float_type, tied, "token_embd.weight", {896, 151936}), float_type);
    EXPECT_EQ(planned(float_type, tied, "blk.0.ffn_down.weight", {4864, 896}), float_type);
    EXPECT_EQ(planned(float_type, tied, "blk.0.attn_norm.weight", {896}), "F32");
  }
}

TEST(QuantPlan, RowsThatAreNotWholeBlocksFallBackAsLlamaQuantize) {
  const model::QuantModelInfo info{
      .architecture = "llama", .num_layers = 6, .num_gqa = 1, .has_output = true};
  // stories15M: dim 288 (not a multiple of 256), ffn 768 (a multiple).
  EXPECT_EQ(planned("Q4_K_M", info, "blk.1.attn_q.weight", {288, 288}), "Q5_0");
  EXPECT_EQ(planned("Q4_K_M", info, "blk.1.ffn_down.weight", {768, 288}), "Q4_K");
  EXPECT_EQ(planned("Q4_K_M", info, "blk.5.ffn_down.weight", {768, 288}), "Q6_K");
  EXPECT_EQ(planned("Q4_K_M", info, "blk.5.attn_v.weight", {288, 288}), "Q8_0");  // Q6_K -> Q8_0
  EXPECT_EQ(planned("Q5_K_M", info, "blk.1.attn_q.weight", {288, 288}), "Q5_1");
  EXPECT_EQ(planned("Q3_K_S", info, "blk.1.attn_q.weight", {288, 288}), "IQ4_NL");
  EXPECT_EQ(planned("IQ4_XS", info, "blk.1.attn_q.weight", {288, 288}), "IQ4_NL");
  EXPECT_EQ(planned("Q4_K_M", info, "output.weight", {288, 32000}), "Q8_0");
  // Not even a multiple of 32: F16 (llama-quantize refuses such a file).
  const model::PlannedType odd = model::plan_tensor_type(mix("Q4_K_M"), info, "blk.0.attn_q.weight",
                                                         std::vector<uint64_t>{100, 100});
  EXPECT_EQ(odd.dtype, kernels::DType::kF16);
  EXPECT_NE(odd.note.find("row length 100"), std::string::npos) << odd.note;
  EXPECT_EQ(planned("Q8_0", info, "blk.0.attn_q.weight", {100, 100}), "F16");
  EXPECT_TRUE(model::plan_tensor_type(mix("Q4_K_M"), info, "blk.0.attn_q.weight",
                                      std::vector<uint64_t>{512, 512})
                  .note.empty());
}

nlohmann::json quant_golden() {
  std::ifstream in(testing::shared_path("golden/quant/golden.json"));
  return nlohmann::json::parse(in);
}

// The F16 file each llama.cpp-quantized golden file was made from.
std::string golden_source(const std::string& file) {
  if (file.starts_with("base-")) return "base-F16.gguf";
  return file.substr(0, file.rfind('-')) + "-F16.gguf";  // arch-qwen2-Q4_K_M -> arch-qwen2-F16
}

// Every quantized golden file whose mix sieve writes (all but TQ2_0), with its source and mix.
std::vector<std::pair<nlohmann::json, model::QuantMix>> golden_quantized_files() {
  std::vector<std::pair<nlohmann::json, model::QuantMix>> files;
  for (const nlohmann::json& entry : quant_golden()) {
    const std::string file = entry["file"];
    if (file.ends_with("-F16.gguf")) continue;
    const std::string type = file.substr(file.rfind('-') + 1, file.size() - file.rfind('-') - 6);
    if (type == "TQ2_0") continue;
    std::optional<model::QuantMix> mix = model::parse_quant_mix(type);
    if (!mix)
      throw std::runtime_error("golden file " + file + " has a mix sieve does not know: " + type);
    files.emplace_back(entry, *mix);
  }
  return files;
}

// The plan chooses what llama-quantize chose for every golden file (Q2_K ... Q6_K, IQ4_*,
// Q4_0 ... Q8_0 of the base model; Q4_K_M of tied-embedding Qwen2 and of Llama 3.1 RoPE).
TEST(QuantPlan, MatchesLlamaQuantizeOnEveryGoldenFile) {
  const auto files = golden_quantized_files();
  EXPECT_EQ(files.size(), 18u);
  for (const auto& [entry, quant_mix] : files) {
    SCOPED_TRACE(entry["file"].get<std::string>());
    EXPECT_EQ(quant_mix.file_type, entry["general_file_type"].get<uint32_t>());
    const gguf::File source =
        gguf::File::open(testing::shared_path("golden/quant/" + golden_source(entry["file"])));
    const model::QuantModelInfo info = model::quant_model_info(source);
    const nlohmann::json& want = entry["tensor_type_map"];
    EXPECT_EQ(want.size(), source.tensors().size());
    for (const gguf::TensorInfo& tensor : source.tensors()) {
      ASSERT_TRUE(want.contains(tensor.name)) << tensor.name;
      EXPECT_EQ(kernels::to_string(
                    model::plan_tensor_type(quant_mix, info, tensor.name, tensor.shape).dtype),
                want[tensor.name].get<std::string>())
          << tensor.name;
    }
  }
}

// End to end against llama-quantize, one case per golden file: sieve's output for the mix has
// llama.cpp's tensor types and general.file_type, and, as both use ggml's reference quantizers
// (no importance matrix), the same tensor bytes. Q8_0 passes with this branch alone; the others
// need the Q4_1/Q5_x/K-quant/IQ4 quantizers (kernels::quantize_row) of the kernel branches.
class LlamaQuantizeFile : public ::testing::TestWithParam<const char*> {};

TEST_P(LlamaQuantizeFile, WrittenByteForByte) {
  const std::string file = GetParam();
  std::optional<model::QuantMix> quant_mix;
  for (const auto& [entry, entry_mix] : golden_quantized_files()) {
    if (entry["file"] == file) quant_mix = entry_mix;
  }
  ASSERT_TRUE(quant_mix) << file << " is not in golden.json";
  ThreadPool pool(2);
  const std::string output = temp_path("golden-" + file);
  model::quantize_model(testing::shared_path("golden/quant/" + golden_source(file)), output,
                        *quant_mix, pool);
  const gguf::File ours = gguf::File::open(output);
  const gguf::File theirs = gguf::File::open(testing::shared_path("golden/quant/" + file));
  EXPECT_EQ(ours.get_u64("general.file_type"), theirs.get_u64("general.file_type"));
  ASSERT_EQ(ours.tensors().size(), theirs.tensors().size());
  for (const gguf::TensorInfo& tensor : theirs.tensors()) {
    const gguf::TensorInfo* mine = ours.find_tensor(tensor.name);
    ASSERT_NE(mine, nullptr) << tensor.name;
    EXPECT_EQ(gguf::to_string(mine->type), gguf::to_string(tensor.type)) << tensor.name;
    EXPECT_EQ(mine->shape, tensor.shape) << tensor.name;
    const std::span<const uint8_t> a = ours.tensor_data(*mine), b = theirs.tensor_data(tensor);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end()))
        << tensor.name << " bytes differ";
  }
  std::filesystem::remove(output);
}

INSTANTIATE_TEST_SUITE_P(
    Golden, LlamaQuantizeFile,
    ::testing::Values("base-Q8_0.gguf", "base-Q4_0.gguf", "base-Q4_1.gguf", "base-Q5_0.gguf",
                      "base-Q5_1.gguf", "base-Q2_K.gguf", "base-Q3_K_S.gguf", "base-Q3_K_M.gguf",
                      "base-Q3_K_L.gguf", "base-Q4_K_S.gguf", "base-Q4_K_M.gguf",
                      "base-Q5_K_S.gguf", "base-Q5_K_M.gguf", "base-Q6_K.gguf", "base-IQ4_NL.gguf",
                      "base-IQ4_XS.gguf", "arch-qwen2-Q4_K_M.gguf", "arch-llama3rope-Q4_K_M.gguf"),
    [](const auto& info) {
      std::string name = info.param;
      name = name.substr(0, name.size() - 5);
      std::replace(name.begin(), name.end(), '-', '_');
      return name;
    });

// --pure: every matrix in the base type, the output matrix included (no Q6_K), and the
// file still loads and follows its source. Runs on this build's Q4_0 quantizer.
TEST(Quantize, PureQ4_0KeepsEveryMatrixInTheBaseType) {
  const std::string input = testing::shared_path("golden/quant/base-F16.gguf");
  const std::string output = temp_path("base-Q4_0-pure.gguf");
  ThreadPool pool(2);
  model::QuantizeReport report =
      model::quantize_model(input, output, mix("q4_0"), pool, /*pure=*/true);
  std::map<std::string, int> counts;
  for (const auto& tensor : report.tensors) {
    ++counts[tensor.to_type];
    EXPECT_TRUE(tensor.note.empty()) << tensor.name << ": " << tensor.note;
  }
  EXPECT_EQ(counts, (std::map<std::string, int>{{"F32", 5}, {"Q4_0", 16}}));
  const gguf::File written = gguf::File::open(output);
  EXPECT_EQ(written.get_u64("general.file_type"), 2u);
  model::LoadedModel reference = model::load_model({input, ""});
  model::LoadedModel candidate = model::load_model({output, ""});
  std::vector<std::vector<int32_t>> prompts = {reference.tokenizer->encode("Once upon a time")};
  eval::ModelAgreement agreement =
      eval::compare_models(*reference.model, *candidate.model, prompts, 24);
  EXPECT_EQ(agreement.steps, 24);
  EXPECT_GT(agreement.max_abs_logit_error, 0.0);
  EXPECT_GT(agreement.top1_agreement(), 0.5);
  std::filesystem::remove(output);
}

// Q4_K_M of the 2-layer base model loads, every tensor has the planned type, and it follows
// the F16 model. Waits for the Q4_K and Q6_K quantizers and matmuls (kernel branches).
TEST(Quantize, Q4KMFollowsF16Model) {
  const std::string input = testing::shared_path("golden/quant/base-F16.gguf");
  const std::string output = temp_path("base-Q4_K_M.gguf");
  ThreadPool pool(2);
  model::QuantizeReport report = model::quantize_model(input, output, mix("Q4_K_M"), pool);
  const gguf::File source = gguf::File::open(input);
  const gguf::File written = gguf::File::open(output);
  EXPECT_EQ(written.get_u64("general.file_type"), 15u);
  const model::QuantModelInfo info = model::quant_model_info(source);
  std::map<std::string, int> counts;
  for (const gguf::TensorInfo& tensor : source.tensors()) {
    const gguf::TensorInfo* out = written.find_tensor(tensor.name);
    ASSERT_NE(out, nullptr) << tensor.name;
    const kernels::DType want =
        model::plan_tensor_type(mix("Q4_K_M"), info, tensor.name, tensor.shape).dtype;
    EXPECT_EQ(gguf::to_string(out->type), kernels::to_string(want)) << tensor.name;
    ++counts[std::string(gguf::to_string(out->type))];
  }
  EXPECT_EQ(counts, (std::map<std::string, int>{{"F32", 5}, {"Q4_K", 13}, {"Q6_K", 3}}));
  EXPECT_LT(report.bytes_out, report.bytes_in / 3);

  model::LoadedModel reference = model::load_model({input, ""});
  model::LoadedModel candidate = model::load_model({output, ""});
  std::vector<std::vector<int32_t>> prompts = {reference.tokenizer->encode("Once upon a time"),
                                               reference.tokenizer->encode("The little dog")};
  eval::ModelAgreement agreement =
      eval::compare_models(*reference.model, *candidate.model, prompts, 24);
  EXPECT_EQ(agreement.steps, 48);
  EXPECT_GT(agreement.max_abs_logit_error, 0.0);
  // About 4.8 bits per weight on a 256-wide random model: most top-1 choices survive.
  EXPECT_GT(agreement.top1_agreement(), 0.6);
  std::filesystem::remove(output);
}

}  // namespace
}  // namespace sieve
