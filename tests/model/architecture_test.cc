// The architecture table and RoPE scaling as read from GGUF metadata: which keys and tensors
// each architecture takes, what it refuses, and YaRN against a reference derived from its
// formulas (no llama.cpp golden file has YaRN; linear and Llama 3 scaling are in golden/quant and
// compared to llama.cpp by golden_quant_test.cc).
#include "model/architecture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numbers>
#include <random>

#include "gguf/gguf.h"
#include "error_of.h"
#include "model/config.h"
#include "model/loader.h"
#include "shared_data.h"
#include "util/error.h"

namespace sieve {
namespace {

using testing::error_of;

// A copy of a shared GGUF file with its metadata and tensors edited, written to a temporary file.
class EditedModel {
 public:
  EditedModel(
      const std::string& shared_relative, const std::function<void(gguf::Writer&)>& edit,
      const std::function<bool(const std::string&)>& keep_tensor = [](const std::string&) {
        return true;
      }) {
    const gguf::File source = gguf::File::open(testing::shared_path(shared_relative));
    gguf::Writer writer;
    for (const gguf::KeyValue& kv : source.metadata()) writer.set(kv.key, kv.value);
    for (const gguf::TensorInfo& info : source.tensors()) {
      if (!keep_tensor(info.name)) continue;
      std::span<const uint8_t> data = source.tensor_data(info);
      writer.add_tensor(info.name, info.type, info.shape, {data.begin(), data.end()});
    }
    edit(writer);
    path_ =
        (std::filesystem::temp_directory_path() / ("sieve_arch_test_" + std::to_string(::getpid()) +
                                                   "_" + std::to_string(counter_++) + ".gguf"))
            .string();
    writer.write(path_);
  }
  ~EditedModel() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

gguf::Value string_value(std::string text) { return {std::move(text)}; }

TEST(Architecture, UnknownOneIsAnErrorListingTheSupported) {
  const std::string message = error_of([] { model::find_architecture("gpt2"); });
  EXPECT_NE(message.find("'gpt2'"), std::string::npos) << message;
  EXPECT_NE(message.find("llama, mistral, qwen2, qwen3, phi3"), std::string::npos) << message;

  EditedModel file("golden/quant/base-F16.gguf",
                   [](gguf::Writer& w) { w.set("general.architecture", string_value("falcon")); });
  const std::string load_message = error_of([&] { model::load_model({file.path(), ""}); });
  EXPECT_NE(load_message.find("'falcon'"), std::string::npos) << load_message;
  EXPECT_NE(load_message.find("qwen3"), std::string::npos) << load_message;
}

TEST(Architecture, DescribesEachVariantAsData) {
  using model::find_architecture;
  EXPECT_EQ(find_architecture("llama").rope_ordering, kernels::RopeOrdering::kNormal);
  EXPECT_EQ(find_architecture("qwen2").rope_ordering, kernels::RopeOrdering::kNeox);
  EXPECT_EQ(find_architecture("qwen2").qkv_bias, model::TensorPresence::kRequired);
  EXPECT_EQ(find_architecture("qwen3").qk_norm, model::TensorPresence::kRequired);
  EXPECT_EQ(find_architecture("phi3").qkv_layout, model::QkvLayout::kFused);
  EXPECT_EQ(find_architecture("phi3").ffn_layout, model::FfnLayout::kFusedGateUp);
  EXPECT_FALSE(find_architecture("phi3").honours_sliding_window);
  EXPECT_TRUE(find_architecture("mistral").honours_sliding_window);
}

TEST(Architecture, LoadsEachArchFileWithItsOptionalParts) {
  const auto load = [](const std::string& name) {
    return model::load_model({testing::shared_path("golden/quant/" + name), ""});
  };
  {
    model::LoadedModel qwen2 = load("arch-qwen2-F16.gguf");
    const model::LayerWeights& layer = qwen2.model->weights().layers[0];
    EXPECT_EQ(layer.bq.size(), 256u);
    EXPECT_EQ(layer.bk.size(), 64u);
    EXPECT_EQ(layer.bv.size(), 64u);
    EXPECT_TRUE(qwen2.model->weights().tied_output);
    EXPECT_EQ(qwen2.model->config().rope.ordering, kernels::RopeOrdering::kNeox);
  }
  {
    model::LoadedModel qwen3 = load("arch-qwen3-F16.gguf");
    const model::ModelConfig& c = qwen3.model->config();
    EXPECT_EQ(c.head_dim, 64);
    EXPECT_EQ(c.q_dim(), 2 * c.dim) << "Qwen3: n_head * head_dim != n_embd";
    const model::LayerWeights& layer = qwen3.model->weights().layers[1];
    EXPECT_EQ(layer.q_norm.size(), 64u);
    EXPECT_EQ(layer.k_norm.size(), 64u);
    EXPECT_TRUE(layer.bq.empty());
    EXPECT_EQ(layer.wq.rows, 512);
    EXPECT_EQ(layer.wo.cols, 512);
  }
  {
    model::LoadedModel phi3 = load("arch-phi3-F16.gguf");
    const model::LayerWeights& layer = phi3.model->weights().layers[0];
    ASSERT_TRUE(layer.wqkv.has_value());
    EXPECT_EQ(layer.wqkv->rows, 256 + 2 * 64);
    ASSERT_TRUE(layer.w_gate_up.has_value());
    EXPECT_EQ(layer.w_gate_up->rows, 2 * 512);
    EXPECT_EQ(layer.matrices().size(), 4u) << "fused: wqkv, wo, w_gate_up, w_down";
    EXPECT_FALSE(phi3.model->config().sliding_window.has_value())
        << "llama.cpp ignores phi3.attention.sliding_window (2047 in this file)";
  }
}

TEST(Architecture, MissingRequiredAndUnusedTensorsAreErrorsNamingThem) {
  EditedModel no_norm(
      "golden/quant/arch-qwen3-F16.gguf", [](gguf::Writer&) {},
      [](const std::string& name) { return name != "blk.1.attn_k_norm.weight"; });
  std::string message = error_of([&] { model::load_model({no_norm.path(), ""}); });
  EXPECT_NE(message.find("'blk.1.attn_k_norm.weight'"), std::string::npos) << message;

  // A Q bias on qwen3 (whose llama.cpp graph has none) would be silently ignored otherwise.
  EditedModel extra("golden/quant/arch-qwen3-F16.gguf", [](gguf::Writer& w) {
    w.add_tensor("blk.0.attn_q.bias", gguf::TensorType::kF32, {512},
                 std::vector<uint8_t>(512 * 4, 0));
  });
  message = error_of([&] { model::load_model({extra.path(), ""}); });
  EXPECT_NE(message.find("blk.0.attn_q.bias"), std::string::npos) << message;
  EXPECT_NE(message.find("qwen3"), std::string::npos) << message;
}

TEST(RopeScaling, LinearAndLlama3FromTheGoldenFiles) {
  model::LoadedModel linear =
      model::load_model({testing::shared_path("golden/quant/arch-llama-linrope-F16.gguf"), ""});
  EXPECT_EQ(linear.model->config().rope.scaling, model::RopeScaling::kLinear);
  EXPECT_FLOAT_EQ(linear.model->config().rope.freq_scale, 0.5f);

  model::LoadedModel llama3 =
      model::load_model({testing::shared_path("golden/quant/arch-llama3rope-F16.gguf"), ""});
  const model::RopeConfig& rope = llama3.model->config().rope;
  EXPECT_EQ(rope.scaling, model::RopeScaling::kNone)
      << "Llama 3.1 scaling is the rope_freqs tensor alone";
  ASSERT_EQ(rope.freq_factors.size(), 16u);
  EXPECT_FLOAT_EQ(rope.freq_factors[0], 1.0f);
  EXPECT_NEAR(rope.freq_factors[3], 1.179029f, 1e-6f);
  EXPECT_FLOAT_EQ(rope.freq_factors[15], 8.0f);
  // Divided, as llama.cpp does: pair i turns at position * base^(-2i/n) / factor[i].
  kernels::RopeParams params = rope.params(32);
  std::vector<float> x(32, 0.0f);
  x[15] = 1.0f;  // pair 15, first element (normal ordering: pairs (2i, 2i+1))
  x[30] = 1.0f;
  kernels::rope(params, 1000, x.data(), 1);
  const double theta = 1000.0 * std::pow(500000.0, -30.0 / 32.0) / 8.0;
  EXPECT_NEAR(x[30], std::cos(theta), 1e-5);
  EXPECT_NEAR(x[31], std::sin(theta), 1e-5);
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(float));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

TEST(RopeScaling, Phi3LongRopeUsesTheLongFactors) {
  std::vector<float> long_factors(16), short_factors(16, 1.0f);
  for (size_t i = 0; i < long_factors.size(); ++i) long_factors[i] = 1.0f + static_cast<float>(i);
  const auto add_factors = [&](gguf::Writer& w) {
    w.add_tensor("rope_factors_long.weight", gguf::TensorType::kF32, {16}, f32_bytes(long_factors));
    w.add_tensor("rope_factors_short.weight", gguf::TensorType::kF32, {16},
                 f32_bytes(short_factors));
  };
  EditedModel phi3("golden/quant/arch-phi3-F16.gguf", add_factors);
  model::LoadedModel loaded = model::load_model({phi3.path(), ""});
  EXPECT_EQ(loaded.model->config().rope.freq_factors, long_factors);

  // Only phi3 has them; elsewhere they are tensors the architecture does not use.
  EditedModel qwen2("golden/quant/arch-qwen2-F16.gguf", add_factors);
  const std::string message = error_of([&] { model::load_model({qwen2.path(), ""}); });
  EXPECT_NE(message.find("rope_factors_long.weight"), std::string::npos) << message;
}

TEST(RopeScaling, UnknownTypeIsAnErrorNamingIt) {
  EditedModel file("golden/quant/base-F16.gguf",
                   [](gguf::Writer& w) { w.set_string("llama.rope.scaling.type", "longrope"); });
  const std::string message = error_of([&] { model::load_model({file.path(), ""}); });
  EXPECT_NE(message.find("'longrope'"), std::string::npos) << message;
  EXPECT_NE(message.find("yarn"), std::string::npos) << message;
}

// YaRN, derived from its definition (arXiv 2309.00071, as ggml applies it), in double: pair i of
// frequency f_i = base^(-2i/n) turns L * f_i / (2 pi) times over the original context L. Pairs
// turning more than beta_fast times keep their angle (extrapolate), pairs turning fewer than
// beta_slow times are interpolated (angle / factor), with a linear ramp between the correction
// dims; every cos and sin is multiplied by attn_factor * (1 + 0.1 ln factor).
struct YarnReference {
  int64_t num_dims;
  double base, factor, attn_factor;
  int64_t original_context;
  double beta_fast = 32.0, beta_slow = 1.0;

  // The pair index at which a pair turns `turns` times over the original context.
  double dim_turning(double turns) const {
    return num_dims * std::log(original_context / (turns * 2.0 * std::numbers::pi)) /
           (2.0 * std::log(base));
  }
  double angle(int64_t pair, int64_t position) const {
    const double low = std::max(0.0, std::floor(dim_turning(beta_fast)));
    const double high =
        std::min(static_cast<double>(num_dims - 1), std::ceil(dim_turning(beta_slow)));
    const double extrapolated = position * std::pow(base, -2.0 * pair / num_dims);
    const double interpolated = extrapolated / factor;
    const double keep = 1.0 - std::clamp((pair - low) / std::max(0.001, high - low), 0.0, 1.0);
    return interpolated * (1.0 - keep) + extrapolated * keep;
  }
  double magnitude() const { return attn_factor * (1.0 + 0.1 * std::log(factor)); }
};

TEST(RopeScaling, YarnFromMetadataMatchesTheFormulas) {
  // A Qwen2.5-style YaRN file: factor 4 over an original context of 32768 (from base-F16's
  // weights; only the metadata matters here).
  EditedModel file("golden/quant/base-F16.gguf", [](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "yarn");
    w.set_f32("llama.rope.scaling.factor", 4.0f);
    w.set_u32("llama.rope.scaling.original_context_length", 512);
    w.set_f32("llama.rope.scaling.attn_factor", 1.25f);
  });
  model::LoadedModel loaded = model::load_model({file.path(), ""});
  const model::ModelConfig& config = loaded.model->config();
  ASSERT_EQ(config.rope.scaling, model::RopeScaling::kYarn);
  EXPECT_FLOAT_EQ(config.rope.freq_scale, 0.25f);
  EXPECT_EQ(config.rope.yarn.original_context, 512);
  EXPECT_EQ(config.rope.yarn.ext_factor, 1.0f);
  EXPECT_EQ(config.rope.yarn.beta_fast, 32.0f);
  EXPECT_EQ(config.rope.yarn.beta_slow, 1.0f);

  const int64_t head_dim = config.head_dim;  // 32, all rotated
  const YarnReference ref{.num_dims = head_dim,
                          .base = config.rope.freq_base,
                          .factor = 4.0,
                          .attn_factor = 1.25,
                          .original_context = 512};
  // The ramp must be neither empty nor everything for this check to mean anything.
  ASSERT_GT(ref.dim_turning(32.0), 1.0);
  ASSERT_LT(ref.dim_turning(1.0), head_dim / 2 - 1.0);

  const kernels::RopeParams params = config.rope.params(head_dim);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t position : {0, 1, 17, 300, 1999}) {
    std::vector<float> x(static_cast<size_t>(2 * head_dim));
    for (float& value : x) value = dist(rng);
    std::vector<float> y = x;
    kernels::rope(params, position, y.data(), 2);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < head_dim / 2; ++i) {
        const double theta = ref.angle(i, position), m = ref.magnitude();
        const double a = x[h * head_dim + 2 * i], b = x[h * head_dim + 2 * i + 1];
        // Angles up to ~2000 rad in float: allow for their rounding (2000 * 2^-24 ~ 1.2e-4).
        EXPECT_NEAR(y[h * head_dim + 2 * i], m * (a * std::cos(theta) - b * std::sin(theta)), 5e-4)
            << "position " << position << " pair " << i;
        EXPECT_NEAR(y[h * head_dim + 2 * i + 1], m * (a * std::sin(theta) + b * std::cos(theta)),
                    5e-4)
            << "position " << position << " pair " << i;
      }
    }
  }
}

TEST(RopeScaling, YarnWithoutAnOriginalContextUsesTheTrainingContext) {
  EditedModel file("golden/quant/base-F16.gguf", [](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "yarn");
    w.set_f32("llama.rope.scaling.factor", 2.0f);
  });
  model::LoadedModel loaded = model::load_model({file.path(), ""});
  EXPECT_EQ(loaded.model->config().rope.yarn.original_context,
            loaded.model->config().context_length);
}

// --ctx-size / --rope-scaling / --rope-scale / --yarn-orig-ctx give the model what a file with
// those metadata keys would: the same RoPE (so the same forward pass) and the served context.
TEST(RopeScaling, LoadOverridesEqualTheSameMetadataInTheFile) {
  EditedModel file("golden/quant/base-F16.gguf", [](gguf::Writer& w) {
    w.set_string("llama.rope.scaling.type", "yarn");
    w.set_f32("llama.rope.scaling.factor", 4.0f);
    w.set_u32("llama.rope.scaling.original_context_length", 512);
    w.set_u32("llama.context_length", 2048);
  });
  const model::ModelConfig from_file = model::load_model({file.path(), ""}).model->config();
  model::LoadOptions options{.model_path = testing::shared_path("golden/quant/base-F16.gguf")};
  options.context = {.context_length = 2048,
                     .rope_scaling = model::RopeScaling::kYarn,
                     .rope_scale = 4.0f,
                     .yarn_original_context = 512};
  const model::ModelConfig overridden = model::load_model(options).model->config();
  EXPECT_EQ(overridden.context_length, 2048);
  EXPECT_EQ(overridden.rope.scaling, from_file.rope.scaling);
  EXPECT_EQ(overridden.rope.freq_scale, from_file.rope.freq_scale);
  EXPECT_EQ(overridden.rope.yarn.ext_factor, from_file.rope.yarn.ext_factor);
  EXPECT_EQ(overridden.rope.yarn.beta_fast, from_file.rope.yarn.beta_fast);
  EXPECT_EQ(overridden.rope.yarn.beta_slow, from_file.rope.yarn.beta_slow);
  EXPECT_EQ(overridden.rope.yarn.original_context, from_file.rope.yarn.original_context);

  // YaRN's original context defaults to the file's training context, not the served one.
  model::LoadOptions stretched{.model_path = testing::shared_path("golden/quant/base-F16.gguf")};
  const int64_t trained = model::load_model(stretched).model->config().context_length;
  stretched.context = {
      .context_length = 4 * trained, .rope_scaling = model::RopeScaling::kYarn, .rope_scale = 4.0f};
  const model::ModelConfig yarn = model::load_model(stretched).model->config();
  EXPECT_EQ(yarn.context_length, 4 * trained);
  EXPECT_EQ(yarn.rope.yarn.original_context, trained);

  // A factor alone stretches linearly; "none" undoes the file's scaling.
  stretched.context = {.rope_scale = 2.0f};
  const model::ModelConfig linear = model::load_model(stretched).model->config();
  EXPECT_EQ(linear.rope.scaling, model::RopeScaling::kLinear);
  EXPECT_FLOAT_EQ(linear.rope.freq_scale, 0.5f);
  model::LoadOptions unscaled{.model_path = file.path()};
  unscaled.context = {.rope_scaling = model::RopeScaling::kNone};
  const model::ModelConfig none = model::load_model(unscaled).model->config();
  EXPECT_EQ(none.rope.freq_scale, 1.0f);
  EXPECT_EQ(none.rope.yarn.ext_factor, 0.0f);
}

TEST(RopeScaling, BadLoadOverridesAreErrorsNamingThem) {
  model::LoadOptions options{.model_path = testing::shared_path("golden/quant/base-F16.gguf")};
  options.context = {.rope_scale = 0.5f};
  EXPECT_NE(error_of([&] { model::load_model(options); }).find("RoPE scale"), std::string::npos);
  options.context = {.rope_scaling = model::RopeScaling::kLinear, .yarn_original_context = 512};
  EXPECT_NE(error_of([&] { model::load_model(options); }).find("--yarn-orig-ctx"),
            std::string::npos);
  options.context = {.context_length = 0};
  EXPECT_NE(error_of([&] { model::load_model(options); }).find("context length"),
            std::string::npos);
}

TEST(SlidingWindow, ReadForArchitecturesThatHonourIt) {
  EditedModel file("golden/quant/base-F16.gguf",
                   [](gguf::Writer& w) { w.set_u32("llama.attention.sliding_window", 4096); });
  model::LoadedModel loaded = model::load_model({file.path(), ""});
  ASSERT_TRUE(loaded.model->config().sliding_window.has_value());
  EXPECT_EQ(*loaded.model->config().sliding_window, 4096);
}

}  // namespace
}  // namespace sieve
