#include "sparsity/controller.h"

#include <algorithm>
#include <cassert>

namespace sieve::sparsity {

namespace {

std::vector<PolicyGroup> clone_groups(const std::vector<PolicyGroup>& groups) {
  std::vector<PolicyGroup> copy;
  for (const PolicyGroup& g : groups) copy.push_back({g.policy->clone(), g.streams});
  return copy;
}

}  // namespace

SparsityController::SparsityController(SparsityPlan plan) : plan_(std::move(plan)) { restart(); }

SparsityController::SparsityController(const SparsityController& other)
    : plan_(other.plan_),
      groups_(clone_groups(other.groups_)),
      stream_recovery_(other.stream_recovery_),
      compressed_through_(other.compressed_through_),
      prompt_compressed_(other.prompt_compressed_),
      decode_positions_(other.decode_positions_) {}

void SparsityController::restart() {
  groups_ = make_policy_groups(plan_);
  stream_recovery_.assign(num_streams(), std::nullopt);
  compressed_through_ = 0;
  prompt_compressed_ = false;
  decode_positions_ = 0;
}

template <typename Fn>
bool SparsityController::any_group(Fn&& fn) const {
  return std::any_of(groups_.begin(), groups_.end(),
                     [&](const PolicyGroup& g) { return fn(*g.policy); });
}

bool SparsityController::is_dense() const {
  return !any_group([](const GroupPolicy& p) { return !p.is_dense(); });
}

int32_t SparsityController::observation_rows() const {
  int64_t rows = 0;
  for (const PolicyGroup& g : groups_) rows = std::max(rows, g.policy->observation_rows());
  return static_cast<int32_t>(rows);
}

bool SparsityController::needs_token_classes() const {
  return any_group([](const GroupPolicy& p) { return p.needs_token_classes(); });
}

bool SparsityController::needs_keys() const {
  return any_group([](const GroupPolicy& p) { return p.needs_keys(); });
}

bool SparsityController::selects_pages() const {
  for (const PolicyGroup& g : groups_) {
    for (size_t m = 0; m < g.streams.size(); ++m)
      if (g.policy->selects_pages(m)) return true;
  }
  return false;
}

std::vector<std::optional<int64_t>> SparsityController::max_kept_tokens(
    int64_t prompt_tokens, int64_t max_new_tokens) const {
  std::vector<std::optional<int64_t>> bounds(num_streams());
  for (const PolicyGroup& g : groups_) {
    for (size_t m = 0; m < g.streams.size(); ++m)
      bounds[g.streams[m]] = g.policy->max_kept_tokens(m, prompt_tokens, max_new_tokens);
  }
  return bounds;
}

SparsityController::Compression SparsityController::propose(const CompressPoint& point) const {
  Compression out;
  out.num_positions = point.num_positions;
  out.prompt_done = point.prompt_done;
  out.keep.resize(num_streams());
  out.stream_recovery.resize(num_streams());
  out.next = clone_groups(groups_);
  double recovery = 0.0;
  int num_scored = 0;
  std::vector<CompressInput> in;
  std::vector<CompressResult> results;
  for (PolicyGroup& group : out.next) {
    in.clear();
    // A policy that acts on decode saw each decoded position as it came (a conversation's next
    // turn compresses after decode steps); the others see them first here.
    const int32_t first_new = group.policy->acts_on_decode()
                                  ? std::max(compressed_through_, decode_positions_)
                                  : compressed_through_;
    for (int32_t s : group.streams) {
      in.push_back({.prompt_done = point.prompt_done,
                    .num_positions = point.num_positions,
                    .first_new_position = first_new,
                    .num_keys = point.num_keys[s],
                    .scores = static_cast<size_t>(s) < point.scores.size()
                                  ? point.scores[s]
                                  : std::span<const float>(),
                    .classes = point.classes,
                    .keys = static_cast<size_t>(s) < point.keys.size() ? point.keys[s]
                                                                       : std::span<const float>(),
                    .head_dim = point.head_dim});
    }
    results.assign(in.size(), CompressResult{});
    group.policy->compress(in, results);
    for (size_t m = 0; m < results.size(); ++m) {
      if (results[m].recovery) {
        recovery += *results[m].recovery;
        ++num_scored;
        out.stream_recovery[group.streams[m]] = static_cast<float>(*results[m].recovery);
      }
      out.changes_layout = out.changes_layout || results[m].keep.has_value();
      out.keep[group.streams[m]] = std::move(results[m].keep);
    }
  }
  // Page selection reads per-stream slices, so a Quest stream turns the sequence sparse.
  out.changes_layout = out.changes_layout || selects_pages();
  if (num_scored > 0) out.attention_recovery = static_cast<float>(recovery / num_scored);
  return out;
}

void SparsityController::commit(Compression&& compression) {
  groups_ = std::move(compression.next);
  stream_recovery_ = std::move(compression.stream_recovery);
  compressed_through_ = compression.num_positions;
  if (compression.prompt_done) {
    prompt_compressed_ = true;
    decode_positions_ = compression.num_positions;
  }
}

std::vector<std::optional<PageReads>> SparsityController::decode_reads(
    std::span<const int32_t> num_keys, int32_t page_size) const {
  std::vector<std::optional<PageReads>> reads(num_streams());
  if (!prompt_compressed_) return reads;
  for (const PolicyGroup& g : groups_) {
    for (size_t m = 0; m < g.streams.size(); ++m) {
      const int32_t s = g.streams[m];
      reads[s] = g.policy->decode_reads(m, num_keys[s], page_size);
    }
  }
  return reads;
}

std::vector<uint8_t> SparsityController::decode_attention_streams() const {
  std::vector<uint8_t> wanted(num_streams());
  bool any = false;
  for (const PolicyGroup& g : groups_) {
    for (size_t m = 0; m < g.streams.size(); ++m) {
      wanted[g.streams[m]] = g.policy->wants_decode_attention(m) ? 1 : 0;
      any = any || wanted[g.streams[m]];
    }
  }
  if (!any) wanted.clear();
  return wanted;
}

bool SparsityController::acts_on_decode() const {
  return prompt_compressed_ && any_group([](const GroupPolicy& p) { return p.acts_on_decode(); });
}

std::vector<SparsityController::StreamState> SparsityController::report() const {
  std::vector<StreamState> states(num_streams());
  for (const PolicyGroup& g : groups_) {
    for (size_t m = 0; m < g.streams.size(); ++m) states[g.streams[m]].report = g.policy->report(m);
  }
  for (size_t s = 0; s < states.size(); ++s) states[s].recovery = stream_recovery_[s];
  return states;
}

DropPerStream SparsityController::after_decode_step(int32_t num_positions,
                                                    std::span<const int32_t> num_keys,
                                                    std::span<const std::vector<float>> attention,
                                                    std::span<const std::vector<int32_t>> chosen,
                                                    TokenClass new_class) {
  DropPerStream drops(num_streams());
  // Once per new position: not on the step that compressed the prompt.
  if (!prompt_compressed_ || num_positions <= decode_positions_) return drops;
  assert(num_positions == decode_positions_ + 1);  // decode adds one position a step
  decode_positions_ = num_positions;
  std::vector<DecodeInput> in;
  std::vector<std::vector<int32_t>> out;
  for (PolicyGroup& group : groups_) {
    if (!group.policy->acts_on_decode()) continue;
    in.clear();
    for (int32_t s : group.streams) {
      in.push_back({.new_position = num_positions - 1,
                    .new_class = new_class,
                    .num_keys = num_keys[s],
                    .attention = static_cast<size_t>(s) < attention.size()
                                     ? std::span<const float>(attention[s])
                                     : std::span<const float>(),
                    .chosen_slices = static_cast<size_t>(s) < chosen.size()
                                         ? std::span<const int32_t>(chosen[s])
                                         : std::span<const int32_t>()});
    }
    out.assign(in.size(), {});
    group.policy->after_decode_step(in, out);
    for (size_t m = 0; m < out.size(); ++m) drops[group.streams[m]] = std::move(out[m]);
  }
  return drops;
}

}  // namespace sieve::sparsity
