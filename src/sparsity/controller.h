#pragma once
// A request's KV sparsity: the policy objects of its (layer, KV head) streams, with their
// state, built from the resolved plan (one per stream, or one per group of streams that decide
// together). The engine asks it two questions and gets plain sets
// back for the KV manager:
//   at a compression point (a prefill chunk boundary, the prompt's end): which keys each
//     stream keeps (propose), then, once the KV manager has moved them, commit;
//   after each decode step: which keys each stream drops.
// and reads what the model must do for the sequence (score the last rows, return decode
// attention weights, select pages). A forked sample copies its parent's controller; a
// preempted one restarts.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "sparsity/policy_spec.h"
#include "sparsity/stream_policy.h"

namespace sieve::sparsity {

// Per stream: key indices (ascending); nullopt keeps every key.
using KeepPerStream = std::vector<std::optional<std::vector<int32_t>>>;
using DropPerStream = std::vector<std::vector<int32_t>>;

class SparsityController {
 public:
  explicit SparsityController(SparsityPlan plan);
  SparsityController(const SparsityController& other);  // a deep copy, state included
  SparsityController& operator=(const SparsityController&) = delete;

  const SparsityPlan& plan() const { return plan_; }
  size_t num_streams() const { return plan_.heads.size(); }
  bool is_dense() const;             // every stream keeps everything and reads everything
  int32_t observation_rows() const;  // the most any stream needs scored (0: none)
  bool needs_token_classes() const;  // compress / after_decode_step want TokenClass inputs
  bool needs_keys() const;           // compress wants the streams' keys (CompressPoint::keys)
  bool selects_pages() const;        // some stream's decode rows read only some slices
  // Admission: per stream, the most keys it holds once compressed (nullopt: unbounded).
  std::vector<std::optional<int64_t>> max_kept_tokens(int64_t prompt_tokens,
                                                      int64_t max_new_tokens) const;

  // Positions the last committed compression covered, and whether it was the prompt's last
  // (from then on the decode-time policies run).
  int32_t compressed_through() const { return compressed_through_; }
  bool prompt_compressed() const { return prompt_compressed_; }
  // From the start again (the sequence's KV is dense again: recomputed after preemption).
  void restart();
  // More prompt follows what the sequence holds (a conversation's next turn continuing from its
  // compressed state): compressions are the prompt's again until the next prompt_done one,
  // which starts the decode-time policies anew; the policies keep their state.
  void begin_prompt() { prompt_compressed_ = false; }

  struct CompressPoint {
    bool prompt_done = false;
    int32_t num_positions = 0;
    std::span<const int32_t> num_keys;               // [stream] keys held now
    std::span<const std::span<const float>> scores;  // [stream] observation scores, or empty
    std::span<const TokenClass> classes;  // positions [0, num_positions), if needs_token_classes
    std::span<const std::span<const float>> keys;  // [stream] [num_keys][head_dim], if needs_keys
    int32_t head_dim = 0;
  };
  struct Compression {
    KeepPerStream keep;
    // False: every stream keeps every key and none selects pages, so the KV stays as it is.
    bool changes_layout = false;
    std::optional<float> attention_recovery;  // mean over the scored streams
   private:
    friend class SparsityController;
    std::vector<PolicyGroup> next;                      // the policies' states once committed
    std::vector<std::optional<float>> stream_recovery;  // [stream], where scored
    int32_t num_positions = 0;
    bool prompt_done = false;
  };
  // What each stream keeps; changes nothing until commit() (the KV manager may not manage it).
  Compression propose(const CompressPoint& point) const;
  void commit(Compression&& compression);

  // After the prompt's compression, before a decode step that brings stream s to num_keys[s]
  // keys: per stream, which slices its row reads (nullopt: all); and whether decode steps
  // return its attention weights.
  std::vector<std::optional<PageReads>> decode_reads(std::span<const int32_t> num_keys,
                                                     int32_t page_size) const;
  std::vector<uint8_t> decode_attention_streams() const;  // empty when no stream wants them
  bool acts_on_decode() const;

  // For reports: what each stream's policy does now and, where the last committed compression
  // scored it, the attention mass its kept keys received from the observation rows over all
  // keys (nullopt: never scored, e.g. window, quest, full). [stream]. O(streams), no math.
  struct StreamState {
    StreamReport report;
    std::optional<float> recovery;
  };
  std::vector<StreamState> report() const;

  // After a step that added position num_positions - 1 to every stream: the keys each stream
  // drops. attention: [stream] this step's weights; chosen: [stream] the slices a choosing row
  // read (empty span or entries: none).
  DropPerStream after_decode_step(int32_t num_positions, std::span<const int32_t> num_keys,
                                  std::span<const std::vector<float>> attention,
                                  std::span<const std::vector<int32_t>> chosen,
                                  TokenClass new_class);

 private:
  SparsityPlan plan_;
  template <typename Fn>
  bool any_group(Fn&& fn) const;

  std::vector<PolicyGroup> groups_;
  std::vector<std::optional<float>> stream_recovery_;  // [stream], of the last commit
  int32_t compressed_through_ = 0;
  bool prompt_compressed_ = false;
  int32_t decode_positions_ = 0;  // positions the decode-time policies have seen
};

}  // namespace sieve::sparsity
