#include "engine/draft_model.h"

#include <algorithm>

#include <fmt/format.h>

#include "engine/sampler.h"
#include "model/loader.h"
#include "util/error.h"

namespace sieve::engine {

// One sequence's drafting in one propose() call.
struct DraftModelProposer::Drafting {
  sched::SeqId seq;
  std::vector<int32_t> tokens;  // known tokens, then the drafts so far
  int32_t max_drafts = 0;
  std::vector<int32_t> drafts;
  bool prefill = false;  // computes every token (a prompt chunk), drafts none
  bool stopped = false;  // the pool is short
};

bool DraftModelProposer::done(const Drafting& d) const {
  if (d.stopped) return true;
  if (!d.prefill) return static_cast<int32_t>(d.drafts.size()) >= d.max_drafts;
  auto it = computed_.find(d.seq);
  return it != computed_.end() && it->second.size() >= d.tokens.size();
}

kernels::DType DraftModelProposer::kv_dtype_for(const model::ModelConfig& draft,
                                                kernels::DType wanted) {
  try {
    model::KvCache::check_dtype(draft, wanted);
    return wanted;
  } catch (const Error&) {
    return kernels::DType::kF32;
  }
}

DraftModelProposer::DraftModelProposer(std::shared_ptr<const model::Model> model,
                                       const DraftModelConfig& config)
    : model_(std::move(model)),
      config_(config),
      kv_(kv::KvConfig{.num_pages = config.num_pages,
                       .page_size = config.page_size,
                       .enable_prefix_caching = config.enable_prefix_caching,
                       .num_layers = static_cast<int32_t>(model_->config().num_layers),
                       .num_kv_heads = static_cast<int32_t>(model_->config().num_kv_heads)}),
      cache_(model_->backend(), model_->config(), config.num_pages, config.page_size,
             kv_dtype_for(model_->config(), config.kv_dtype)),
      runner_(*model_, cache_, kv_) {
  model_->prepare_cache(cache_);
  bytes_per_page_ = static_cast<int64_t>(
      model::KvCache::bytes_per_page(model_->config(), config.page_size, cache_.dtype()));
}

std::shared_ptr<const model::Model> DraftModelProposer::load(const std::string& draft_path,
                                                             const model::Model& target,
                                                             const tok::Tokenizer& target_tokenizer,
                                                             const std::string& target_path) {
  const std::string target_name = target_path.empty() ? fmt::format("'{}'", target.config().name)
                                                      : fmt::format("'{}'", target_path);
  model::LoadedModel draft;
  try {
    draft =
        model::load_model({.model_path = draft_path, .shared_backend = target.shared_backend()});
  } catch (const Error& e) {
    fail("draft model '{}': {}", draft_path, e.what());
  }
  const std::vector<std::string>& mine = draft.tokenizer->vocab().tokens;
  const std::vector<std::string>& theirs = target_tokenizer.vocab().tokens;
  if (mine.size() != theirs.size() ||
      draft.model->config().vocab_size != target.config().vocab_size) {
    fail(
        "draft model '{}' has a vocabulary of {} tokens but the target model {} has {}: "
        "draft_model needs a draft with the target's vocabulary (the same tokenizer)",
        draft_path, mine.size(), target_name, theirs.size());
  }
  const auto differs = std::mismatch(mine.begin(), mine.end(), theirs.begin());
  if (differs.first != mine.end()) {
    fail(
        "draft model '{}' and the target model {} have different vocabularies (token {} is "
        "'{}' in the draft, '{}' in the target): draft_model needs a draft with the target's "
        "vocabulary (the same tokenizer)",
        draft_path, target_name, differs.first - mine.begin(), *differs.first, *differs.second);
  }
  return draft.model;
}

std::optional<sched::ScheduledSequence> DraftModelProposer::schedule(
    sched::SeqId seq, std::span<const int32_t> tokens, int32_t budget, sched::ScheduleOutput& out) {
  std::vector<int32_t>& computed = computed_[seq];
  const auto num_tokens = static_cast<int32_t>(tokens.size());
  int32_t before = static_cast<int32_t>(computed.size());
  int32_t n = 0;
  if (!kv_.contains(seq)) {
    const kv::PrefixMatch match = kv_.lookup_prefix(tokens);
    before = match.num_cached_tokens;
    n = std::min(num_tokens - before, budget);
    if (!kv_.admit(seq, match, before + n)) return std::nullopt;
    computed.assign(tokens.begin(), tokens.begin() + before);
  } else {
    n = std::min(num_tokens - before, budget);
    const std::optional<kv::StepSlots> slots = kv_.reserve(seq, before, before + n);
    if (!slots) return std::nullopt;
    if (slots->page_copy) out.page_copies.push_back({seq, *slots->page_copy});
  }
  return sched::ScheduledSequence{.seq_id = seq,
                                  .num_computed_before = before,
                                  .num_new_tokens = n,
                                  .samples = before + n == num_tokens};
}

std::vector<int32_t> DraftModelProposer::run(const sched::ScheduleOutput& out,
                                             std::span<Drafting*> by_seq) {
  const auto find = [&](sched::SeqId seq) -> Drafting& {
    return **std::find_if(by_seq.begin(), by_seq.end(),
                          [&](const Drafting* d) { return d->seq == seq; });
  };
  runner_.copy_pages(out);
  const std::vector<float>& logits = runner_.run(
      out, [&](sched::SeqId seq) { return std::span<const int32_t>(find(seq).tokens); });
  const auto vocab = static_cast<size_t>(model_->config().vocab_size);
  std::vector<int32_t> argmaxes;
  for (const sched::ScheduledSequence& s : out.scheduled) {
    std::vector<int32_t>& computed = computed_.at(s.seq_id);
    const std::vector<int32_t>& tokens = find(s.seq_id).tokens;
    computed.insert(computed.end(), tokens.begin() + s.num_computed_before,
                    tokens.begin() + s.num_computed_before + s.num_new_tokens);
    // Any computed block is right for its tokens, accepted or not: publish it.
    if (config_.enable_prefix_caching)
      kv_.commit_full_blocks(s.seq_id, computed, static_cast<int32_t>(computed.size()));
    if (s.samples) {
      const std::span<const float> row(&logits[argmaxes.size() * vocab], vocab);
      argmaxes.push_back(argmax(row));
    }
  }
  return argmaxes;
}

std::vector<std::vector<int32_t>> DraftModelProposer::propose(std::span<const Want> wants) {
  const auto context = static_cast<int32_t>(model_->config().context_length);
  std::vector<Drafting> drafting;
  drafting.reserve(wants.size());
  for (const Want& want : wants) {
    Drafting& d = drafting.emplace_back(Drafting{.seq = want.seq,
                                                 .tokens = {want.tokens.begin(), want.tokens.end()},
                                                 .max_drafts = want.max_drafts});
    // The draft computes positions up to tokens + max_drafts - 2: within its context.
    d.max_drafts = std::min(d.max_drafts, context + 1 - static_cast<int32_t>(d.tokens.size()));
  }
  run_passes(drafting);
  std::vector<std::vector<int32_t>> drafts;
  drafts.reserve(drafting.size());
  for (Drafting& d : drafting) drafts.push_back(std::move(d.drafts));
  return drafts;
}

void DraftModelProposer::prefill(std::span<const Prefill> chunks) {
  const auto context = static_cast<size_t>(model_->config().context_length);
  std::vector<Drafting> drafting;
  for (const Prefill& chunk : chunks) {
    if (chunk.tokens.size() > context) continue;  // a draft with a shorter context never drafts
    drafting.push_back(Drafting{
        .seq = chunk.seq, .tokens = {chunk.tokens.begin(), chunk.tokens.end()}, .prefill = true});
  }
  run_passes(drafting);
}

void DraftModelProposer::run_passes(std::vector<Drafting>& drafting) {
  for (Drafting& d : drafting) {
    // Keep the draft K/V's longest prefix that is still the sequence's (rejected drafts and
    // drafts the scheduler cut go); a drafting sequence computes its last token again at least,
    // for its logits.
    auto it = computed_.find(d.seq);
    if (it == computed_.end() || !kv_.contains(d.seq)) continue;
    std::vector<int32_t>& computed = it->second;
    const size_t limit = std::min(computed.size(), d.tokens.size() - (d.prefill ? 0 : 1));
    const auto common = static_cast<size_t>(
        std::mismatch(computed.begin(), computed.begin() + static_cast<std::ptrdiff_t>(limit),
                      d.tokens.begin())
            .first -
        computed.begin());
    if (common < computed.size()) {
      kv_.truncate(d.seq, static_cast<int32_t>(common));
      computed.resize(common);
    }
  }
  // Each pass: every sequence not done computes what it lacks, up to the pass's token budget
  // (catch-up chunks), or its newest draft token; a drafting sequence's last token's logits give
  // its next draft token.
  for (;;) {
    sched::ScheduleOutput out;
    std::vector<Drafting*> in_pass;
    int32_t budget = config_.max_batch_tokens;
    for (Drafting& d : drafting) {
      if (done(d) || budget == 0) continue;
      std::optional<sched::ScheduledSequence> scheduled = schedule(d.seq, d.tokens, budget, out);
      if (!scheduled) {
        d.stopped = true;
        continue;
      }
      const int32_t n = scheduled->num_new_tokens;
      out.scheduled.push_back(*std::move(scheduled));
      budget -= n;
      in_pass.push_back(&d);
    }
    if (out.empty()) return;
    const std::vector<int32_t> next = run(out, in_pass);
    size_t row = 0;
    for (const sched::ScheduledSequence& s : out.scheduled) {
      if (!s.samples) continue;
      Drafting& d = **std::find_if(in_pass.begin(), in_pass.end(),
                                   [&](const Drafting* x) { return x->seq == s.seq_id; });
      const int32_t token = next[row++];
      if (d.prefill) continue;
      d.drafts.push_back(token);
      d.tokens.push_back(token);
    }
  }
}

void DraftModelProposer::release(sched::SeqId seq) {
  if (kv_.contains(seq)) kv_.free(seq);
  computed_.erase(seq);
}

}  // namespace sieve::engine
