// keydiff (KeyDiff, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM
// Inference", 2025): keys that point where most keys point add little, so each stream keeps the
// B keys outside its recent window that are least similar to its anchor, the mean of the keys it
// holds: score_t = -cos(k_t, mean_k). No attention weights are needed (it runs beside flash
// attention kernels, no observation pass). It evicts block-wise as the cache fills: at every
// compression point (each prefill chunk, then the prompt's end) over the keys kept so far plus
// the new chunk's; tokens generated later are appended and kept (ScoredPolicy). Ada-KV and
// PyramidKV take its scores with score=keydiff.
//
// Cost per compression: 2 * num_keys * head_dim multiply-adds per stream, on the host, plus
// reading the stream's keys out of the cache (the model's read_keys).
#include <algorithm>
#include <cassert>
#include <cmath>

#include "sparsity/policy_scored.h"

namespace sieve::sparsity {

namespace {

const Param<KeyDiffSpec> kKeyDiffParams[] = {
    {"B", &KeyDiffSpec::budget, "the token budget", AtLeast(1), Presence::kRequired},
    {"W", &KeyDiffSpec::window, "the most recent W keys, always kept"},
};

class KeyDissimilarityScorer final : public KeyScorer {
 public:
  explicit KeyDissimilarityScorer(const KeyDiffSpec& spec) : spec_(spec) {}
  bool needs_keys() const override { return true; }
  std::vector<float> score(const CompressInput& in) const override {
    const int64_t n = in.num_keys;
    const int64_t d = in.head_dim;
    assert(d > 0 && std::ssize(in.keys) == n * d);
    std::vector<double> anchor(static_cast<size_t>(d), 0.0);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t c = 0; c < d; ++c) anchor[c] += in.keys[t * d + c];
    }
    double anchor_norm = 0.0;
    for (double& a : anchor) {
      a /= static_cast<double>(n);
      anchor_norm += a * a;
    }
    anchor_norm = std::sqrt(anchor_norm);
    std::vector<float> scores(static_cast<size_t>(std::max<int64_t>(n - spec_.window, 0)));
    for (size_t t = 0; t < scores.size(); ++t) {
      const float* key = in.keys.data() + static_cast<int64_t>(t) * d;
      double dot = 0.0, norm = 0.0;
      for (int64_t c = 0; c < d; ++c) {
        dot += key[c] * anchor[c];
        norm += double{key[c]} * key[c];
      }
      const double denominator = std::sqrt(norm) * anchor_norm;
      scores[t] = denominator > 0 ? static_cast<float>(-dot / denominator) : 0.0f;
    }
    return scores;
  }

 private:
  KeyDiffSpec spec_;
};

}  // namespace

std::string_view Scored<KeyDiffSpec>::name() { return "keydiff"; }
std::span<const Param<KeyDiffSpec>> Scored<KeyDiffSpec>::params() { return kKeyDiffParams; }
std::shared_ptr<const KeyScorer> Scored<KeyDiffSpec>::scorer(const KeyDiffSpec& spec) {
  return std::make_shared<KeyDissimilarityScorer>(spec);
}

const PolicyType& keydiff_policy_type() {
  static const LeafPolicy<KeyDiffSpec, ScoredPolicy> type("keydiff", kKeyDiffParams,
                                                          "keydiff:B={budget},W={window}");
  return type;
}

}  // namespace sieve::sparsity
