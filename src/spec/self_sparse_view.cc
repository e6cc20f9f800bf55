#include "spec/self_sparse_view.h"

#include <algorithm>
#include <variant>

#include "util/error.h"

namespace sieve::spec {

void check_draft_policy(const sparsity::PolicySpec& policy) {
  if (!std::holds_alternative<sparsity::StreamingSpec>(policy.policy)) {
    fail(
        "self_sparse drafts read a sink + window view of the sequence's pages: kv_policy must be "
        "streaming:S=..,W=.., not '{}'",
        sparsity::to_string(policy));
  }
}

std::vector<int32_t> draft_view_blocks(const sparsity::PolicySpec& policy, int32_t position,
                                       int32_t page_size) {
  const auto& streaming = std::get<sparsity::StreamingSpec>(policy.policy);
  const int32_t own_block = position / page_size;
  const auto sink_blocks = static_cast<int32_t>(
      std::min<int64_t>((streaming.num_sinks + page_size - 1) / page_size, own_block));
  const auto window_first = static_cast<int32_t>(
      std::max<int64_t>(sink_blocks, (position - streaming.window + 1) / page_size));
  std::vector<int32_t> blocks;
  blocks.reserve(static_cast<size_t>(sink_blocks + own_block - window_first + 1));
  for (int32_t b = 0; b < sink_blocks; ++b) blocks.push_back(b);
  for (int32_t b = std::max(window_first, 0); b <= own_block; ++b) blocks.push_back(b);
  return blocks;
}

}  // namespace sieve::spec
