#pragma once
// The contract of a KV policy object: what one (layer, KV head) stream keeps, with the state it
// carries from step to step. One class per policy (policy_*.cc); SparsityController
// (controller.h) owns a request's objects and turns their answers into the plain keep / drop
// sets the engine hands to the KV manager. Policies see numbers only: key counts, scores,
// attention weights, token classes. Where kept keys live is the KV manager's business.
//
// A stream's keys are its kept positions in position order; a "key index" is an index into
// them. Every answer lists key indices, ascending.
//
// Most policies decide per stream (StreamPolicy). A policy that decides for several streams at
// once (Ada-KV shares one budget among a layer's KV heads) implements GroupPolicy; the
// controller runs every policy as a GroupPolicy (a StreamPolicy is a group of one).
//
// To add a policy: its spec struct in policy_spec.h (with its PolicySpec entry, and its
// HeadPolicy entry when resolve() assigns it to streams), and one policy_<name>.cc declaring its
// parameters and implementing StreamPolicy or GroupPolicy (policy_type.h says how).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "sparsity/policy_spec.h"
#include "sparsity/selection.h"

namespace sieve::sparsity {

// A compression point: a prefill chunk boundary, or the step that completed the prompt.
struct CompressInput {
  bool prompt_done = false;             // the whole prompt is computed: decode-time state starts
  int32_t num_positions = 0;            // positions computed so far
  int32_t first_new_position = 0;       // positions [first_new_position, num_positions) are new
  int32_t num_keys = 0;                 // keys held now: those kept so far, then the new positions
  std::span<const float> scores;        // observation scores over those keys (empty: none asked)
  std::span<const TokenClass> classes;  // of positions [0, num_positions), when asked for
  // The stream's keys as the cache holds them (post-RoPE; smoothed and rotated in a q8 / q4
  // cache), [num_keys][head_dim] in key order, when asked for (needs_keys); else empty.
  std::span<const float> keys;
  int32_t head_dim = 0;
};

struct CompressResult {
  std::optional<std::vector<int32_t>> keep;  // key indices to keep; nullopt: keep every key
  std::optional<double> recovery;            // attention mass of the kept keys / all, when scored
};

// One decode step, after the new token's K/V was written and attended.
struct DecodeInput {
  int32_t new_position = 0;  // the position this step added (the stream's last key)
  TokenClass new_class = TokenClass::kOther;
  int32_t num_keys = 0;                    // keys held, the new one included
  std::span<const float> attention;        // this step's weights over them, if asked (else empty)
  std::span<const int32_t> chosen_slices;  // the slices the row chose (PageReads::choose)
};

// Quest: which of a stream's slices one decode row reads. The stream holds every key, so slice b
// holds keys [b * page_size, (b + 1) * page_size) and is one Quest page.
struct PageReads {
  // Choose by the q·k upper bounds of the slices' key summaries: `forced` plus the best others,
  // top_k in all (model::top_slices). The row reports its choice back (DecodeInput).
  bool choose = false;
  int32_t top_k = 0;
  bool key_halves = false;      // the summaries carry key halves (QuestSpec::key_bits)
  std::vector<int32_t> forced;  // ascending
  std::vector<int32_t> reuse;   // !choose: read these (ascending, the newest slice included)
  bool operator==(const PageReads&) const = default;
};

// What a stream's policy does now, for reports (GET /v1/kv/state's per-head view). Read from
// the state the policy keeps anyway; describing it computes nothing.
struct StreamReport {
  // "full", "window" (sinks + recent window), "snapkv" / "keydiff" (those, and pyramidkv over
  // them), "adakv",
  // "heavy_hitters" (h2o), "quest" (quest, lserve's dynamic heads), "fastgen:<choice>" (the
  // choice made at the prompt's end, e.g. "fastgen:special+punct+local"; "fastgen:pending"
  // before it).
  std::string kind;
  // Quest: the slices (pages) its latest selection chose for a decode row, forced sink and
  // window pages included; between selections (R > 1) rows also read slices started since.
  // nullopt: its rows read every key it keeps (every other kind), or no selection yet.
  std::optional<int32_t> pages_read;
  bool operator==(const StreamReport&) const = default;
};

class StreamPolicy {
 public:
  virtual ~StreamPolicy() = default;
  // A copy with the same state: a forked sample continues from its parent's.
  virtual std::unique_ptr<StreamPolicy> clone() const = 0;

  // Admission: the most keys the stream holds once its policy applies (chunks not compressed
  // yet come on top); nullopt: it grows with the sequence.
  virtual std::optional<int64_t> max_kept_tokens(int64_t prompt_tokens,
                                                 int64_t max_new_tokens) const = 0;
  // The last prompt rows whose attention compress() wants scored (0: none).
  virtual int64_t observation_rows() const { return 0; }
  virtual bool needs_token_classes() const { return false; }
  virtual bool needs_keys() const { return false; }  // compress() reads CompressInput::keys
  // True for a policy that never drops a key nor changes what a row reads (full).
  virtual bool is_dense() const { return false; }
  // Quest: decode rows read only some slices (kept keys are all of them): decode_reads() says
  // which, before each decode step that brings the stream to num_keys keys.
  virtual bool selects_pages() const { return false; }
  virtual std::optional<PageReads> decode_reads(int32_t num_keys, int32_t page_size) const {
    return std::nullopt;
  }

  virtual CompressResult compress(const CompressInput& in) = 0;
  virtual StreamReport report() const = 0;

  // After the prompt's compression: whether decode steps call after_decode_step, and whether
  // they must return this stream's attention weights for it.
  virtual bool acts_on_decode() const { return false; }
  virtual bool wants_decode_attention() const { return false; }
  // Key indices to drop now (before the step, i.e. of in.num_keys keys).
  virtual std::vector<int32_t> after_decode_step(const DecodeInput& in) { return {}; }
};

// The policies derive from this: clone() copies the policy, state included.
template <typename Derived>
class CopyableStreamPolicy : public StreamPolicy {
 public:
  std::unique_ptr<StreamPolicy> clone() const final {
    return std::make_unique<Derived>(static_cast<const Derived&>(*this));
  }
};

// A policy deciding for a group of streams at once; members are in stream order.
class GroupPolicy {
 public:
  virtual ~GroupPolicy() = default;
  virtual std::unique_ptr<GroupPolicy> clone() const = 0;
  virtual size_t num_members() const = 0;
  virtual std::optional<int64_t> max_kept_tokens(size_t member, int64_t prompt_tokens,
                                                 int64_t max_new_tokens) const = 0;
  virtual int64_t observation_rows() const { return 0; }
  virtual bool needs_token_classes() const { return false; }
  virtual bool needs_keys() const { return false; }
  virtual bool is_dense() const { return false; }
  virtual bool selects_pages(size_t member) const { return false; }
  virtual std::optional<PageReads> decode_reads(size_t member, int32_t num_keys,
                                                int32_t page_size) const {
    return std::nullopt;
  }
  // in / out: one per member.
  virtual void compress(std::span<const CompressInput> in, std::span<CompressResult> out) = 0;
  virtual StreamReport report(size_t member) const = 0;
  virtual bool acts_on_decode() const { return false; }
  virtual bool wants_decode_attention(size_t member) const { return false; }
  virtual void after_decode_step(std::span<const DecodeInput> in,
                                 std::span<std::vector<int32_t>> drops) {}
};

// A resolved plan as policy objects: which streams each group covers (every stream once).
struct PolicyGroup {
  std::unique_ptr<GroupPolicy> policy;
  std::vector<int32_t> streams;  // ascending; policy->num_members() of them
};
std::vector<PolicyGroup> make_policy_groups(const SparsityPlan& plan);

// Shared by policies that track kept positions: the key indices, before a step, of the
// positions `dropped` (ascending) from a stream whose keys were `kept_after` ∪ `dropped`.
std::vector<int32_t> key_indices_of_dropped(std::span<const int32_t> kept_after,
                                            std::span<const int32_t> dropped);

}  // namespace sieve::sparsity
