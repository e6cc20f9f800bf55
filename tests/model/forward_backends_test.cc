// The forward pass gives the same numbers on every backend: the CPU backend against the scalar
// reference (kernels/backend.h), through each path of Model::forward and observe (LlamaModel) —
// prefill and decode rows, sequences batched together, block tables and streams of their own,
// attention weights handed back, Quest's slice choice, observation scores. The reference is slow:
// tiny model, few tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "model/loader.h"
#include "shared_data.h"
#include "util/error.h"

namespace sieve {
namespace {

constexpr int32_t kPageSize = 4;

struct Outputs {
  std::vector<float> logits;                  // both steps, row after row
  std::vector<std::vector<float>> attention;  // decode step, every stream of every sequence
  std::vector<std::vector<int32_t>> chosen;   // decode step, sequence 1's streams
  std::vector<float> scores;                  // observe() on sequence 1 after the steps
};

// Two steps on a model loaded onto `backend`: a prefill of three sequences (the second with
// streams of its own: each stream reads its own slice table), then one decode row each, with
// attention weights asked of some streams and a Quest choice on one; then sequence 1's
// observation scores.
Outputs run_on(const kernels::BackendOptions& backend) {
  const model::LoadedModel loaded = model::load_model(
      {.model_path = testing::shared_path("models/stories260K.gguf"), .backend = backend});
  const model::Model& m = *loaded.model;
  model::KvCache cache(m.backend(), m.config(), 12, kPageSize);
  const kv::SliceShape shape = cache.slice_shape();
  const std::vector<std::vector<int32_t>> prompts = {
      loaded.tokenizer->encode("Once upon a time"),
      loaded.tokenizer->encode("The dog ran to the big red ball"),
      loaded.tokenizer->encode("Sara")};
  const std::vector<std::vector<int32_t>> tables = {{9, 2, 5}, {0, 7, 3, 11}, {6, 1}};
  const int32_t own = 1;  // the sequence with streams of its own
  const size_t num_streams = static_cast<size_t>(shape.num_streams());

  Outputs result;
  model::ForwardScratch scratch;
  std::vector<float> logits;
  std::vector<model::StreamOutputs> outputs;
  std::vector<std::vector<float>> summaries(num_streams);
  model::SequenceKv own_kv;
  for (int step = 0; step < 2; ++step) {
    model::Batch batch;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto len = static_cast<int32_t>(prompts[i].size());
      EXPECT_LE(len + 1, std::ssize(tables[i]) * kPageSize);
      const int32_t first = step == 0 ? 0 : len, end = step == 0 ? len : len + 1;
      model::SequenceKv kv;
      if (static_cast<int32_t>(i) != own) {
        kv.block_table = tables[i];
      } else {
        for (int32_t s = 0; s < shape.num_streams(); ++s) {
          model::KvStream& stream = kv.streams.emplace_back();
          // Each stream its own order of the pages: slices of one stream are not one page's.
          const int32_t num_slices = (end + kPageSize - 1) / kPageSize;
          for (size_t b = 0; b < static_cast<size_t>(num_slices); ++b) {
            const int32_t page = tables[i][(b + static_cast<size_t>(s)) % tables[i].size()];
            stream.slices.push_back(
                static_cast<int32_t>(shape.dense_slice(kv::PageId{page}, s).value));
          }
          stream.num_keys = end;
          for (int32_t p = first; p < end; ++p) {
            stream.new_rows.emplace_back(stream.slices[static_cast<size_t>(p / kPageSize)],
                                         p % kPageSize);
          }
        }
      }
      if (step == 1) {
        kv.want_attention.assign(num_streams, 0);
        for (size_t s = i % 2; s < num_streams; s += 3) kv.want_attention[s] = 1;
        if (static_cast<int32_t>(i) == own) {
          // Quest on stream 2: the full slices summarized, the best one of them plus the newest.
          model::KvStream& stream = kv.streams[2];
          const int32_t num_full = len / kPageSize;
          summaries[2].resize(static_cast<size_t>(num_full * 2 * m.config().head_dim));
          cache.summarize_slices(2, stream.slices, {}, 0, num_full, /*key_halves=*/false,
                                 summaries[2].data());
          stream.selection = model::SliceSelection{.choose = true,
                                                   .summaries = summaries[2].data(),
                                                   .num_summarized = num_full,
                                                   .top_k = 2};
        }
      }
      batch.begin_sequence(kv);
      for (int32_t p = first; p < end; ++p) {
        const int32_t token = step == 0 ? prompts[i][static_cast<size_t>(p)] : prompts[i][0];
        batch.add(token, p, true);
      }
      if (static_cast<int32_t>(i) == own) own_kv = kv;
    }
    m.forward(batch, cache, scratch, logits, &outputs);
    result.logits.insert(result.logits.end(), logits.begin(), logits.end());
  }
  for (const model::StreamOutputs& o : outputs) {
    result.attention.insert(result.attention.end(), o.attention.begin(), o.attention.end());
  }
  result.chosen = outputs[own].chosen_slices;

  const auto len = static_cast<int32_t>(prompts[own].size());
  const std::vector<int32_t> window_tokens = {prompts[own][len - 2], prompts[own][len - 1],
                                              prompts[own][0]};
  const std::vector<int32_t> window_positions = {len - 2, len - 1, len};
  own_kv.want_attention.clear();
  for (model::KvStream& stream : own_kv.streams) {
    stream.new_rows.clear();
    stream.selection.reset();
  }
  m.observe(window_tokens, window_positions, own_kv, cache, scratch, result.scores);
  return result;
}

void expect_near(const std::vector<float>& got, const std::vector<float>& want, float tolerance,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
  EXPECT_LE(worst, tolerance) << what;
}

TEST(ForwardBackends, CpuMatchesTheReference) {
  const Outputs cpu = run_on({.device = "cpu", .threads = 2});
  const Outputs ref = run_on({.device = "reference"});
  ASSERT_FALSE(cpu.logits.empty());
  expect_near(cpu.logits, ref.logits, 1e-3f, "logits");
  ASSERT_EQ(cpu.attention.size(), ref.attention.size());
  int num_weights = 0;
  for (size_t s = 0; s < cpu.attention.size(); ++s) {
    expect_near(cpu.attention[s], ref.attention[s], 1e-4f,
                "attention of stream " + std::to_string(s));
    num_weights += !cpu.attention[s].empty();
  }
  EXPECT_GT(num_weights, 10);
  EXPECT_EQ(cpu.chosen, ref.chosen);
  ASSERT_EQ(cpu.chosen[2].size(), 2u);  // Quest read 2 of the stream's slices
  expect_near(cpu.scores, ref.scores, 1e-4f, "observation scores");
}

// The device is chosen once, at load; an unknown one is refused there, naming the valid ones.
TEST(ForwardBackends, UnknownDeviceIsRefusedAtLoad) {
  try {
    model::load_model({.model_path = testing::shared_path("models/stories260K.gguf"),
                       .backend = {.device = "cuda"}});
    FAIL() << "an unknown device loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown device 'cuda'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(kernels::kBackendDevices), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sieve
