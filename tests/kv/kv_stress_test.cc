// Randomized simulation of a scheduler and a model runner driving KvManager. Besides the
// manager's own invariants it checks, after every operation, against an independent model:
//   - block tables: the test predicts every table (new pages are the head of the free queue,
//     copies replace exactly one entry) and ref count == occurrences in the predicted tables;
//   - K/V contents: a fake model runner writes into page slots a fingerprint of the whole
//     prefix up to that position (what real K/V depends on) and performs every PageCopy. Every
//     computed position of every live sequence, and every prefix hit, must read back the
//     fingerprint of that sequence's own prefix: sharing, eviction and copy-on-write never
//     let one sequence see another's data.
// It ends with every sequence freed and every page free.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>

#include "kv/kv_manager.h"
#include "kv_test_util.h"

namespace sieve::kv {
namespace {

using test::Snap;

constexpr int32_t kPageSize = 4;
constexpr int32_t kNumPages = 48;
constexpr int32_t kMaxTokens = 60;  // a sequence finishes here
constexpr int32_t kMaxSeqs = 12;

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 33);
}

struct SimSeq {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> fingerprints;  // [tokens.size()]: the prefix up to and including i
  int32_t num_computed = 0;
  uint64_t extra_key = 0;
  std::vector<PageId> table;  // predicted block table

  void push(int32_t token) {
    uint64_t prev = fingerprints.empty() ? Mix(0x5EEDull, extra_key) : fingerprints.back();
    tokens.push_back(token);
    fingerprints.push_back(Mix(prev, static_cast<uint32_t>(token)));
  }
};

struct Counters {
  int num_admitted = 0, num_admit_failed = 0, num_allocate_failed = 0, num_copies = 0;
  int num_write_failed = 0, num_forks = 0, num_frees = 0, num_resets = 0;
};

class Simulation {
 public:
  explicit Simulation(uint32_t seed)
      : rng_(seed),
        kv_(KvConfig{.num_pages = kNumPages, .page_size = kPageSize, .hash_seed = seed}),
        contents_(kNumPages, std::vector<uint64_t>(kPageSize, 0)) {
    // A few shared prompt heads so that prefix hits happen; tokens from a small alphabet.
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> head;
      for (int t = 0; t < 3 * kPageSize + 2; ++t) head.push_back(Uniform(0, 5));
      heads_.push_back(head);
    }
  }

  void Run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int kind = Uniform(0, 99);
      if (kind < 25) {
        NewRequest();
      } else if (kind < 80) {
        if (!seqs_.empty()) Step(RandomSeq());
      } else if (kind < 87) {
        if (!seqs_.empty() && static_cast<int>(seqs_.size()) < kMaxSeqs) Fork(RandomSeq());
      } else if (kind < 99) {
        if (!seqs_.empty()) Free(RandomSeq());
      } else {
        Reset();
      }
      Check();
      if (HasFatalFailure() || HasFailure()) {
        ADD_FAILURE() << "after op " << op;
        return;
      }
    }
    while (!seqs_.empty()) {
      Free(seqs_.begin()->first);
      Check();
    }
    EXPECT_EQ(kv_.num_free_pages(), kNumPages);
    EXPECT_EQ(kv_.invariant_violation(), std::nullopt);
  }

  const Counters& counters() const { return counters_; }
  const KvManager& kv() const { return kv_; }

 private:
  static bool HasFailure() { return ::testing::Test::HasFailure(); }
  static bool HasFatalFailure() { return ::testing::Test::HasFatalFailure(); }
  // Not std::uniform_int_distribution: its output differs between standard libraries, and the
  // coverage counts below should not.
  int Uniform(int lo, int hi) {
    return lo + static_cast<int>(rng_() % static_cast<uint32_t>(hi - lo + 1));
  }
  SeqId RandomSeq() {
    auto it = seqs_.begin();
    std::advance(it, Uniform(0, static_cast<int>(seqs_.size()) - 1));
    return it->first;
  }
  std::vector<SeqId> Live() const {
    std::vector<SeqId> live;
    for (const auto& [id, s] : seqs_) live.push_back(id);
    return live;
  }

  void NewRequest() {
    if (static_cast<int>(seqs_.size()) >= kMaxSeqs) return;
    SimSeq s;
    s.extra_key = Uniform(0, 9) == 0 ? 1 : 0;
    const std::vector<int32_t>& head = heads_[Uniform(0, 3)];
    const int num_head = Uniform(0, static_cast<int>(head.size()));
    for (int i = 0; i < num_head; ++i) s.push(head[i]);
    const int num_tail = Uniform(1, 10);
    for (int i = 0; i < num_tail; ++i) s.push(Uniform(0, 5));

    const PrefixMatch match = kv_.lookup_prefix(s.tokens, s.extra_key);
    const int32_t num_prompt = static_cast<int32_t>(s.tokens.size());
    ASSERT_EQ(match.num_prompt_tokens, num_prompt);
    ASSERT_EQ(match.num_cached_tokens, static_cast<int32_t>(match.pages.size()) * kPageSize);
    ASSERT_LT(match.num_cached_tokens, num_prompt);
    // Every hit must hold exactly this prompt's K/V.
    for (int32_t t = 0; t < match.num_cached_tokens; ++t) {
      ASSERT_EQ(contents_[match.pages[t / kPageSize].value][t % kPageSize], s.fingerprints[t])
          << "prefix hit with foreign data at position " << t;
    }
    const int32_t num_tokens =
        match.num_cached_tokens + Uniform(1, num_prompt - match.num_cached_tokens);
    const int32_t num_needed = kv_.num_pages_needed(match, num_tokens);
    const SeqId id{next_id_++};
    const std::vector<PageId> queue = kv_.pool().free_queue();
    const test::Snapshot before = Snap(kv_, Live());
    const std::optional<Allocation> allocation = kv_.admit(id, match, num_tokens);
    if (!allocation) {
      ASSERT_GT(num_needed, static_cast<int32_t>(queue.size()));
      ASSERT_EQ(Snap(kv_, Live()), before);
      ASSERT_FALSE(kv_.contains(id));
      ++counters_.num_admit_failed;
      return;
    }
    ASSERT_LE(num_needed, static_cast<int32_t>(queue.size()));
    ++counters_.num_admitted;
    // Predicted table: the hits, then the head of the free queue without the hits.
    s.table = match.pages;
    std::vector<PageId> rest;
    for (PageId p : queue) {
      if (std::find(match.pages.begin(), match.pages.end(), p) == match.pages.end())
        rest.push_back(p);
    }
    const int32_t num_new =
        kv_.num_pages_for(num_tokens) - static_cast<int32_t>(match.pages.size());
    ASSERT_EQ(*allocation, (Allocation{static_cast<int32_t>(match.pages.size()), num_new}));
    s.table.insert(s.table.end(), rest.begin(), rest.begin() + num_new);
    s.num_computed = match.num_cached_tokens;
    seqs_[id] = s;
    Compute(id, num_tokens);
  }

  // One scheduler step for a running sequence: sample if everything known is computed, then
  // schedule a chunk.
  void Step(SeqId id) {
    SimSeq& s = seqs_[id];
    if (s.num_computed == static_cast<int32_t>(s.tokens.size())) {
      if (s.num_computed >= kMaxTokens) {
        Free(id);  // finished
        return;
      }
      s.push(Uniform(0, 5));
    }
    const int32_t remaining = static_cast<int32_t>(s.tokens.size()) - s.num_computed;
    const int32_t num_tokens = s.num_computed + Uniform(1, std::min(remaining, 9));
    const int32_t num_needed = kv_.num_pages_needed(id, num_tokens);
    const std::vector<PageId> queue = kv_.pool().free_queue();
    const test::Snapshot before = Snap(kv_, Live());
    const std::optional<Allocation> allocation = kv_.allocate(id, num_tokens);
    if (!allocation) {
      ASSERT_GT(num_needed, static_cast<int32_t>(queue.size()));
      ASSERT_EQ(Snap(kv_, Live()), before);
      ++counters_.num_allocate_failed;
      return;
    }
    ASSERT_EQ(*allocation, (Allocation{static_cast<int32_t>(s.table.size()), num_needed}));
    s.table.insert(s.table.end(), queue.begin(), queue.begin() + num_needed);
    Compute(id, num_tokens);
  }

  // prepare_write for every page in [num_computed, num_tokens), then the fake forward pass
  // writes the fingerprints, then commit.
  void Compute(SeqId id, int32_t num_tokens) {
    SimSeq& s = seqs_[id];
    for (int32_t t = s.num_computed; t < num_tokens; ++t) {
      if (t != s.num_computed && t % kPageSize != 0) continue;
      const PageId page = s.table[t / kPageSize];
      const bool must_copy = kv_.pool().ref_count(page) > 1 || kv_.pool().block_hash(page);
      const std::vector<PageId> queue = kv_.pool().free_queue();
      const test::Snapshot before = Snap(kv_, Live());
      const WritePlan plan = kv_.prepare_write(id, t);
      if (std::holds_alternative<NoFreePage>(plan)) {
        ASSERT_TRUE(must_copy);
        ASSERT_TRUE(queue.empty());
        ASSERT_EQ(Snap(kv_, Live()), before);
        ++counters_.num_write_failed;
        return;  // not scheduled this step; copies already made stay valid
      }
      if (const PageCopy* copy = std::get_if<PageCopy>(&plan)) {
        ASSERT_TRUE(must_copy);
        ASSERT_EQ(*copy, (PageCopy{.src = page, .dst = queue.front(), .block_idx = t / kPageSize}));
        contents_[copy->dst.value] = contents_[copy->src.value];
        s.table[t / kPageSize] = copy->dst;
        ++counters_.num_copies;
      } else {
        ASSERT_FALSE(must_copy);
      }
    }
    for (int32_t t = s.num_computed; t < num_tokens; ++t) {
      contents_[s.table[t / kPageSize].value][t % kPageSize] = s.fingerprints[t];
    }
    s.num_computed = num_tokens;
    kv_.commit_full_blocks(id, s.tokens, s.num_computed);
  }

  void Fork(SeqId parent) {
    const SeqId child{next_id_++};
    kv_.fork(parent, child);
    seqs_[child] = seqs_[parent];
    ++counters_.num_forks;
  }

  void Free(SeqId id) {
    kv_.free(id);
    seqs_.erase(id);
    ++counters_.num_frees;
  }

  // Sometimes everything finishes first (then nothing may leak); resetting is refused while
  // any page is in use.
  void Reset() {
    if (Uniform(0, 4) == 0) {
      while (!seqs_.empty()) Free(seqs_.begin()->first);
      ASSERT_EQ(kv_.num_free_pages(), kNumPages);
    }
    const bool idle = kv_.num_free_pages() == kNumPages;
    ASSERT_EQ(kv_.reset_prefix_cache(), idle);
    if (idle) {
      ASSERT_EQ(kv_.stats().num_cached_blocks, 0);
      ++counters_.num_resets;
    }
  }

  void Check() {
    ASSERT_EQ(kv_.invariant_violation(), std::nullopt);
    ASSERT_EQ(kv_.num_seqs(), static_cast<int32_t>(seqs_.size()));
    std::vector<int32_t> uses(kNumPages, 0);
    for (const auto& [id, s] : seqs_) {
      ASSERT_EQ(test::Table(kv_, id), s.table) << "seq " << id.value;
      ASSERT_GE(static_cast<int32_t>(s.table.size()), kv_.num_pages_for(s.num_computed));
      for (PageId p : s.table) ++uses[p.value];
      for (int32_t t = 0; t < s.num_computed; ++t) {
        ASSERT_EQ(contents_[s.table[t / kPageSize].value][t % kPageSize], s.fingerprints[t])
            << "seq " << id.value << " position " << t;
      }
    }
    int32_t num_free = 0;
    for (int32_t p = 0; p < kNumPages; ++p) {
      ASSERT_EQ(kv_.pool().ref_count(PageId{p}), uses[p]) << "page " << p;
      if (uses[p] == 0) ++num_free;
    }
    ASSERT_EQ(kv_.num_free_pages(), num_free);
  }

  std::mt19937 rng_;
  KvManager kv_;
  std::vector<std::vector<uint64_t>> contents_;  // [page][slot]: fingerprint written there
  std::vector<std::vector<int32_t>> heads_;
  std::map<SeqId, SimSeq> seqs_;
  uint64_t next_id_ = 1;
  Counters counters_;
};

TEST(KvStress, RandomOpsKeepInvariantsAndDataAndEndWithAllPagesFree) {
  Counters total;
  int64_t num_hit_tokens = 0, num_evictions = 0;
  for (uint32_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Simulation sim(seed);
    sim.Run(4000);
    if (HasFailure()) return;
    const Counters& c = sim.counters();
    total.num_admitted += c.num_admitted;
    total.num_admit_failed += c.num_admit_failed;
    total.num_allocate_failed += c.num_allocate_failed;
    total.num_copies += c.num_copies;
    total.num_write_failed += c.num_write_failed;
    total.num_forks += c.num_forks;
    total.num_resets += c.num_resets;
    num_hit_tokens += sim.kv().stats().num_prefix_hit_tokens;
    num_evictions += sim.kv().stats().num_evictions;
  }
  // The simulation must actually exercise every path.
  EXPECT_GT(total.num_admitted, 1000);
  EXPECT_GT(total.num_admit_failed, 0);
  EXPECT_GT(total.num_allocate_failed, 0);
  EXPECT_GT(total.num_copies, 0);
  EXPECT_GT(total.num_write_failed, 0);
  EXPECT_GT(total.num_forks, 0);
  EXPECT_GT(total.num_resets, 0);
  EXPECT_GT(num_hit_tokens, 0);
  EXPECT_GT(num_evictions, 0);
  std::printf(
      "admitted %d, admit failed %d, allocate failed %d, copies %d, write failed %d, "
      "forks %d, resets %d, hit tokens %lld, evictions %lld\n",
      total.num_admitted, total.num_admit_failed, total.num_allocate_failed, total.num_copies,
      total.num_write_failed, total.num_forks, total.num_resets,
      static_cast<long long>(num_hit_tokens), static_cast<long long>(num_evictions));
}

}  // namespace
}  // namespace sieve::kv
