#include "speculative/self_sparse_view.h"

#include <algorithm>
#include <variant>

#include "sparsity/selection.h"
#include "util/error.h"

namespace sieve::speculative {

void check_draft_policy(const sparsity::PolicySpec& policy) {
  if (const auto* quest = std::get_if<sparsity::QuestSpec>(&policy.policy)) {
    if (quest->reuse_steps != 1) {
      fail(
          "self_sparse's quest draft view chooses its pages at every draft row: kv_policy '{}' "
          "must have R=1",
          sparsity::to_string(policy));
    }
    return;
  }
  if (!std::holds_alternative<sparsity::StreamingSpec>(policy.policy)) {
    fail(
        "self_sparse drafts read a sink + window view (streaming:S=..,W=..) or a Quest page "
        "selection (quest:K=..) of the sequence's pages, not '{}'",
        sparsity::to_string(policy));
  }
}

namespace {

DraftView streaming_view(const sparsity::StreamingSpec& streaming, int32_t position,
                         int32_t page_size) {
  const int32_t own_block = position / page_size;
  const auto sink_blocks = static_cast<int32_t>(
      std::min<int64_t>((streaming.num_sinks + page_size - 1) / page_size, own_block));
  const auto window_first = static_cast<int32_t>(
      std::max<int64_t>(sink_blocks, (position - streaming.window + 1) / page_size));
  DraftView view;
  view.blocks.reserve(static_cast<size_t>(sink_blocks + own_block - window_first + 1));
  for (int32_t b = 0; b < sink_blocks; ++b) view.blocks.push_back(b);
  for (int32_t b = std::max(window_first, 0); b <= own_block; ++b) view.blocks.push_back(b);
  return view;
}

DraftView quest_view(const sparsity::QuestSpec& quest, int32_t position, int32_t page_size) {
  DraftView view;
  view.blocks.resize(static_cast<size_t>(position / page_size + 1));
  for (size_t b = 0; b < view.blocks.size(); ++b) view.blocks[b] = static_cast<int32_t>(b);
  view.choice =
      DraftPageChoice{.top_k = static_cast<int32_t>(quest.top_k_pages),
                      .forced = sparsity::forced_pages(int64_t{position} + 1, page_size, quest)};
  return view;
}

}  // namespace

DraftView draft_view(const sparsity::PolicySpec& policy, int32_t position, int32_t page_size) {
  if (const auto* quest = std::get_if<sparsity::QuestSpec>(&policy.policy))
    return quest_view(*quest, position, page_size);
  return streaming_view(std::get<sparsity::StreamingSpec>(policy.policy), position, page_size);
}

}  // namespace sieve::speculative
