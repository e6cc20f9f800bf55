#pragma once
// KV sparsity policies: what a request asks for (PolicySpec, parsed from a string or JSON) and
// what that means for each (layer, KV head) of a model (SparsityPlan, from resolve()).
//
// Policies decide *which* tokens or pages to keep from scores they are given (selection.h);
// the KV manager decides *where* kept KV lives. Nothing here touches KV memory.
//
// String grammar (whitespace is not allowed; keys are case-sensitive):
//
//   policy   := NAME [':' item (',' item)*]
//   item     := KEY '=' VALUE            a parameter
//             | 'rest=' policy           a sub-policy; must be the last item and takes the rest
//                                        of the string (commas included), or is parenthesized
//             | group '@' SELECTOR       in heads:/layers: only
//   group    := NAME | '(' policy ')'    a policy with parameters needs the parentheses
//
//   full                                     dense (no sparsity)
//   streaming:S=4,W=256                      S attention sinks + recent window W
//   h2o:B=256,W=32                           heavy hitters B by accumulated attention + recent W
//   snapkv:B=512,W=32,P=7,pool=max           top-B prompt tokens by observation-window score
//                                            (1-D pooling, kernel P, max|avg) + the window W
//   pyramidkv:B=512,W=32,P=7,pool=max,beta=20  snapkv with per-layer budgets B_l shrinking from
//                                            the lowest layer to the top (B_top = B / beta),
//                                            summing to num_layers * B
//   adakv:B=512,W=32,P=7,pool=max,alpha=0.2  Ada-KV: snapkv whose budget is shared by a layer's
//                                            KV heads (num_kv_heads * B, the best pooled scores
//                                            of all of them), each head keeping at least alpha * B
//   keydiff:B=512,W=32                       KeyDiff: the top-B keys least similar (cosine) to
//                                            the mean key of the stream, plus the last W; needs
//                                            no attention scores
//   adakv:B=512,W=32,alpha=0.2,score=keydiff pyramidkv and adakv over KeyDiff's scores
//                                            (score=NAME: any scored policy; default snapkv)
//   layerwise:L=3,rest=snapkv:B=512          the first L layers dense, the others `rest`
//   fastgen:T=0.05,W=64,F=0.1                per head the cheapest FastGen policy recovering
//                                            >= 1 - T of the attention; local window W tokens,
//                                            frequent set F * prompt length
//   quest:K=64,R=1,S=4,W=32                  every head keeps all pages and each decode step
//                                            reads the top-K pages by a q·k upper bound (pages
//                                            holding the first S and last W tokens always), the
//                                            choice reused for R steps
//   lserve:K=64,R=4,S=4,W=32,f=0.5,t=0.5     the fraction f of KV heads that a calibration
//                                            profile rates most streaming-like keep S sinks + W
//                                            window (only those scoring >= t); the others are
//                                            quest heads (R defaults to 4 here, f to 0.5, t to 0)
//   heads:(streaming:S=4,W=64)@profile=0.5,rest=snapkv:B=256
//   heads:streaming@kv=0+2-3,rest=full       per KV head: a group takes the fraction of heads a
//                                            calibration profile rates most streaming-like
//                                            (profile=F) or the listed KV head indices of every
//                                            layer (kv=LIST, LIST := N or N-M, joined by '+');
//                                            groups claim heads in order; the rest get `rest`
//                                            (default full)
//   layers:full@0-1,(h2o:B=64)@5+7,rest=snapkv:B=256   per layer lists, the same way
//
// Parameters may be omitted where a default is listed in the structs below. JSON form: an
// object with "name" and the same keys (numbers as JSON numbers, pool as a string); "rest" and a
// group's "policy" are a nested object or a policy string; heads/layers take
// "groups": [{"policy": ..., "profile": 0.5} | {"policy": ..., "kv": [0, 2, 3]}] (layers:
// "layers": [...] instead of "kv"). E.g.
//   {"name": "layerwise", "L": 3, "rest": {"name": "snapkv", "B": 512}}
//
// to_string() prints the canonical string: every parameter, in the order above, groups always
// parenthesized; parse_policy(to_string(s)) == s. Invalid input throws sieve::Error naming the
// policy, the parameter and what is wrong (the server turns it into a 400).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace sieve::sparsity {

// A heap-allocated value with value semantics (deep copy, deep ==), for the recursive specs.
template <typename T>
class Box {
 public:
  Box() : ptr_(std::make_unique<T>()) {}
  Box(T value) : ptr_(std::make_unique<T>(std::move(value))) {}  // NOLINT: implicit by design
  Box(const Box& other) : ptr_(std::make_unique<T>(*other.ptr_)) {}
  Box(Box&&) noexcept = default;
  Box& operator=(const Box& other) {
    if (this != &other) ptr_ = std::make_unique<T>(*other.ptr_);
    return *this;
  }
  Box& operator=(Box&&) noexcept = default;
  ~Box() = default;
  const T& operator*() const { return *ptr_; }
  const T* operator->() const { return ptr_.get(); }
  T& operator*() { return *ptr_; }
  T* operator->() { return ptr_.get(); }
  friend bool operator==(const Box& a, const Box& b) { return *a.ptr_ == *b.ptr_; }

 private:
  std::unique_ptr<T> ptr_;  // never null (moved-from boxes excepted)
};

enum class Pooling : uint8_t { kMax, kAvg };

// --- leaf policies (token counts are per KV head) ---
struct FullSpec {
  friend bool operator==(const FullSpec&, const FullSpec&) = default;
};
struct StreamingSpec {
  int64_t num_sinks = 4;  // S: the first S tokens
  int64_t window = 256;   // W: the most recent W tokens, >= 1
  friend bool operator==(const StreamingSpec&, const StreamingSpec&) = default;
};
struct H2OSpec {
  int64_t heavy_budget = 0;  // B: heavy hitters kept besides the window (required, >= 1)
  int64_t window = 32;       // W: the most recent W tokens are never evicted
  friend bool operator==(const H2OSpec&, const H2OSpec&) = default;
};
struct SnapKvSpec {
  int64_t budget = 0;       // B: prompt tokens kept outside the window (required, >= 1)
  int64_t window = 32;      // W: observation window = the last W prompt tokens, always kept
  int64_t pool_kernel = 7;  // P: odd, >= 1 (1 = no pooling)
  Pooling pooling = Pooling::kMax;
  // G: each selected key brings the G prompt tokens after it (within the budget). A question at
  // the prompt's end attends where its answer *starts* (an induction head looks at the token
  // after the match); the answer is the text that follows, which the window's attention never
  // touches. 0: plain SnapKV.
  int64_t follow = 0;
  friend bool operator==(const SnapKvSpec&, const SnapKvSpec&) = default;
};
struct KeyDiffSpec {
  int64_t budget = 0;   // B: keys kept outside the window (required, >= 1)
  int64_t window = 32;  // W: the most recent W keys, always kept
  friend bool operator==(const KeyDiffSpec&, const KeyDiffSpec&) = default;
};

// The policies above that keep a budget of keys outside a recent window, ranked by a per-key
// score: what Ada-KV and PyramidKV wrap (their `score=` parameter names it; snapkv by default).
using ScoredSpec = std::variant<SnapKvSpec, KeyDiffSpec>;

struct PyramidKvSpec {
  ScoredSpec scored;   // budget = the mean per-layer budget
  double beta = 20.0;  // top layer budget = B / beta; >= 1 (1 = uniform)
  friend bool operator==(const PyramidKvSpec&, const PyramidKvSpec&) = default;
};
struct AdaKvSpec {
  ScoredSpec scored;   // budget = the mean per-head budget of a layer
  double alpha = 0.2;  // each head keeps at least floor(alpha * B) of its best; [0, 1]
  friend bool operator==(const AdaKvSpec&, const AdaKvSpec&) = default;
};
struct FastGenSpec {
  double threshold = 0.05;          // T: choose a policy recovering >= 1 - T; [0, 1)
  int64_t local_window = 64;        // W: local window in tokens, also the profiling rows; >= 1
  double frequent_fraction = 0.10;  // F: frequent set size as a fraction of the prompt; [0, 1]
  friend bool operator==(const FastGenSpec&, const FastGenSpec&) = default;
};
struct QuestSpec {
  int64_t top_k_pages = 0;  // K: pages read per decode step (required, >= 1)
  int64_t reuse_steps = 1;  // R: decode steps one selection is used for; >= 1
  int64_t num_sinks = 4;    // S: pages holding the first S tokens are always read
  int64_t window = 32;      // W: pages holding the last W tokens are always read
  // B: 0: a page's bound from its keys' per-channel min/max (Quest); 1: also one bit per key
  // and channel (which half of the page's range), so each key is bounded and the page takes
  // the largest (kernels/attention_scores.h: key halves).
  int64_t key_bits = 0;
  friend bool operator==(const QuestSpec&, const QuestSpec&) = default;
};
struct LServeSpec {
  // The dynamic heads; S and W are also the streaming heads' sinks and window. LServe reuses a
  // page selection for 4 decode steps by default.
  QuestSpec quest = {.reuse_steps = 4};
  double streaming_fraction = 0.5;  // f: [0, 1]; needs a calibration profile when > 0
  // t: [0, 1]; of those, only heads whose calibrated streaming score is at least t stream: a
  // fraction alone can make a retrieval head (little attention near its sinks and window)
  // streaming when a model has few streaming-like heads, and it then loses what it retrieves.
  double min_streaming_score = 0.0;
  // w: the quest heads' window in tokens; -1: W. A budget that gives the streaming heads a long
  // window (W) must not force that window on the quest heads too: their K pages would all go
  // to it, and none to the pages the query chooses.
  int64_t dynamic_window = -1;
  friend bool operator==(const LServeSpec&, const LServeSpec&) = default;
};

// --- compositions ---
struct PolicySpec;

struct LayerwiseSpec {
  int64_t num_full_layers = 0;  // L
  Box<PolicySpec> rest;
  friend bool operator==(const LayerwiseSpec&, const LayerwiseSpec&) = default;
};

// Which KV heads (of every layer in scope) or which layers a group claims.
struct ProfileFraction {
  double fraction = 0.0;  // of the cells in scope, the most streaming-like by the profile
  friend bool operator==(const ProfileFraction&, const ProfileFraction&) = default;
};
struct IndexList {
  std::vector<int64_t> indices;  // sorted, distinct
  friend bool operator==(const IndexList&, const IndexList&) = default;
};

struct HeadGroup {
  Box<PolicySpec> policy;
  std::variant<ProfileFraction, IndexList> selector;
  friend bool operator==(const HeadGroup&, const HeadGroup&) = default;
};
struct HeadsSpec {
  std::vector<HeadGroup> groups;  // at least one
  Box<PolicySpec> rest;           // default full
  friend bool operator==(const HeadsSpec&, const HeadsSpec&) = default;
};

struct LayerGroup {
  Box<PolicySpec> policy;
  IndexList layers;
  friend bool operator==(const LayerGroup&, const LayerGroup&) = default;
};
struct LayersSpec {
  std::vector<LayerGroup> groups;  // at least one
  Box<PolicySpec> rest;            // default full
  friend bool operator==(const LayersSpec&, const LayersSpec&) = default;
};

struct PolicySpec {
  std::variant<FullSpec, StreamingSpec, H2OSpec, SnapKvSpec, PyramidKvSpec, AdaKvSpec, FastGenSpec,
               QuestSpec, LServeSpec, LayerwiseSpec, HeadsSpec, LayersSpec, KeyDiffSpec>
      policy;
  friend bool operator==(const PolicySpec&, const PolicySpec&) = default;
};

// Throws sieve::Error naming the problem.
PolicySpec parse_policy(std::string_view text);
// A JSON object (see above) or a JSON string holding a policy string.
PolicySpec parse_policy_json(std::string_view json_text);
std::string to_string(const PolicySpec& spec);  // canonical
std::string to_json(const PolicySpec& spec);    // canonical, compact
// Checks the parameter ranges (parse_* call it; for specs built in code). Throws sieve::Error.
void validate(const PolicySpec& spec);

// =============================================================================================
// Resolution: what each (layer, KV head) does.

// A head's policy is its leaf spec, with the parameters resolve() gave that head (pyramidkv's
// per-layer budgets, lserve's split into streaming and quest heads):
using DenseHead = FullSpec;  // keep everything
// Keep the first num_sinks and the last window tokens; drop tokens as they leave the window.
using SinkWindowHead = StreamingSpec;
// At the end of (each chunk of) prefill: the last `window` tokens are the observation window;
// keep the top `budget` others by pooled window score (select_snapkv) plus the window. Decode
// tokens are appended.
using ObservationTopHead = SnapKvSpec;
// Heavy hitters by attention accumulated over the decode steps (HeavyHitterState), seeded at
// the end of prefill with the observation scores of the last max(window, 1) prompt rows.
using HeavyHitterHead = H2OSpec;
// Dense until the end of prefill, then select_fastgen() on the last local_window rows' scores
// decides the head's policy.
using FastGenPendingHead = FastGenSpec;
// All KV kept; each decode step reads select_pages() of the page bounds (memory is not freed).
using PageSelectHead = QuestSpec;
// Ada-KV: the heads of a layer holding the same SharedBudgetHead share num_heads * budget
// prompt keys outside their windows, by pooled observation score (policy_adakv.cc).
using SharedBudgetHead = AdaKvSpec;

// KeyDiff: at each compression point the `budget` keys outside the window least similar (by
// cosine) to the mean of the stream's keys, plus the window; decode tokens are appended.
using KeyDissimilarHead = KeyDiffSpec;

using HeadPolicy =
    std::variant<DenseHead, SinkWindowHead, ObservationTopHead, HeavyHitterHead, FastGenPendingHead,
                 PageSelectHead, SharedBudgetHead, KeyDissimilarHead>;

struct ModelShape {
  int64_t num_layers = 0;
  int64_t num_kv_heads = 0;
};

struct CalibrationProfile;  // calibration.h

// heads[layer * num_kv_heads + kv_head].
struct SparsityPlan {
  ModelShape shape;
  std::vector<HeadPolicy> heads;

  const HeadPolicy& at(int64_t layer, int64_t kv_head) const {
    return heads[static_cast<size_t>(layer * shape.num_kv_heads + kv_head)];
  }
  bool is_dense() const;  // every head dense
};

// Per-(layer, KV head) plan. `profile` (may be null) is needed by profile selectors and lserve
// with f > 0, and must have the model's shape. Profile selectors rank the cells in their scope
// by streaming score, highest first, ties to the lower (layer, kv head); a fraction f of n cells
// takes round(f * n) of them (halves away from zero). pyramidkv's schedule spans the layers its
// cells are in, lowest first: B_l for l = 0..n-1 linear from 2B - B/beta down to B/beta, rounded
// so that they sum to n * B exactly (largest remainders, ties to the lower layer).
// Throws sieve::Error (missing/mismatched profile, kv/layer index out of range, a head claimed
// by two groups).
SparsityPlan resolve(const PolicySpec& spec, const ModelShape& shape,
                     const CalibrationProfile* profile = nullptr);

// sieve eval's budget sweep: the policy string of policy `name` keeping about keep_tokens keys
// per KV head, with this observation / recent window (tokens) and KV page size. Throws
// sieve::Error for a policy that takes no budget.
struct TokenBudget {
  int64_t keep_tokens = 0;
  int64_t window = 0;
  int32_t page_size = 0;
};
std::string policy_for_budget(std::string_view name, const TokenBudget& budget);

// PyramidKV's per-layer budgets for n layers (see resolve()); exposed for tests and reports.
std::vector<int64_t> pyramid_budgets(int64_t mean_budget, double beta, int64_t num_layers);

}  // namespace sieve::sparsity
