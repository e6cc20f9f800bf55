// streaming (StreamingLLM: attention sinks + a recent window): the first S keys and the last W;
// each decode step drops the key that left the window, so the stream never holds more than
// S + W.
#include "sparsity/policy_type.h"

namespace sieve::sparsity {

namespace {

const Param<StreamingSpec> kStreamingParams[] = {
    {"S", &StreamingSpec::num_sinks, "attention sinks: the first S tokens"},
    {"W", &StreamingSpec::window, "the most recent W tokens", AtLeast(1)},
};

class SinkWindowPolicy final : public CopyableStreamPolicy<SinkWindowPolicy> {
 public:
  explicit SinkWindowPolicy(const SinkWindowHead& head) : head_(head) {}
  std::optional<int64_t> max_kept_tokens(int64_t, int64_t) const override {
    return head_.num_sinks + head_.window;
  }
  CompressResult compress(const CompressInput& in) override {
    return {.keep = select_sink_window(in.num_keys, head_)};
  }
  StreamReport report() const override { return {.kind = "window"}; }
  bool acts_on_decode() const override { return true; }
  std::vector<int32_t> after_decode_step(const DecodeInput& in) override {
    std::vector<int32_t> dropped;
    const auto window_start = static_cast<int32_t>(in.num_keys - head_.window);
    for (auto j = static_cast<int32_t>(head_.num_sinks); j < window_start; ++j)
      dropped.push_back(j);
    return dropped;
  }

 private:
  SinkWindowHead head_;
};

}  // namespace

const PolicyType& streaming_policy_type() {
  static const LeafPolicy<StreamingSpec, SinkWindowPolicy> type("streaming", kStreamingParams,
                                                                "streaming:S=4,W={recent}");
  return type;
}

}  // namespace sieve::sparsity
