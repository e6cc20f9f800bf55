// Randomized simulation of dense and sparse sequences sharing one pool: prefix hits, chunked
// steps with copy-on-write, forks, compressions (in place and leaving shared pages), sparse
// appends (some streams skipping a token), drops and frees. A fake runner (sparse_test_util.h)
// writes a tag per row (a fingerprint of the sequence's prefix up to that position, and the
// stream) and performs every copy and plan; it refuses writes into pages that are shared or
// published. After every operation the manager's invariants hold and every live sequence reads
// back exactly its own kept tags, in order, from its f16 copies too where two streams are
// precise (with few spare areas, so that some streams drop their copy). It ends with every page
// and spare area free.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "kv/kv_manager.h"
#include "kv_test_util.h"
#include "sparse_test_util.h"

namespace sieve::kv {
namespace {

constexpr int32_t kPageSize = 4;
constexpr int32_t kNumPages = 40;
constexpr int32_t kStreams = 4;  // 2 layers x 2 KV heads
constexpr int32_t kMaxTokens = 60;
constexpr int32_t kMaxSeqs = 10;

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
  h *= 0xFF51AFD7ED558CCDull;
  return h ^ (h >> 33);
}

struct SimSeq {
  std::vector<int32_t> tokens;
  std::vector<uint64_t> fingerprints;  // [tokens.size()]
  int32_t num_computed = 0;
  uint64_t extra_key = 0;
  bool sparse = false;
  std::vector<std::vector<uint64_t>> kept;  // sparse: [stream] expected tags, in order

  void push(int32_t token) {
    uint64_t prev = fingerprints.empty() ? Mix(0x5EEDull, extra_key) : fingerprints.back();
    tokens.push_back(token);
    fingerprints.push_back(Mix(prev, static_cast<uint32_t>(token)));
  }
  uint64_t tag(int32_t stream, int32_t position) const {
    return Mix(fingerprints[static_cast<size_t>(position)], static_cast<uint64_t>(stream));
  }
};

struct Counters {
  int admitted = 0, started_sparse = 0, dense_steps = 0, sparse_steps = 0, skipping_appends = 0;
  int append_failed = 0, compress_in_place = 0, compress_copy = 0, compress_failed = 0;
  int compress_sparse = 0, drops = 0, slice_moves = 0, pages_freed = 0, forks = 0, sparse_forks = 0,
      frees = 0, area_row_moves = 0, area_moves = 0;
};

constexpr int32_t kSpareAreas = 6;

class SparseSimulation {
 public:
  SparseSimulation(uint32_t seed, bool precise)
      : rng_(seed),
        kv_(KvConfig{
            .num_pages = kNumPages,
            .page_size = kPageSize,
            .hash_seed = seed,
            .num_layers = 2,
            .num_kv_heads = 2,
            .precise_streams = precise ? std::vector<int32_t>{1, 2} : std::vector<int32_t>{},
            .num_spare_areas = precise ? kSpareAreas : 0}),
        runner_(kv_) {
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> head;
      for (int t = 0; t < 3 * kPageSize + 1; ++t) head.push_back(Uniform(0, 4));
      heads_.push_back(head);
    }
  }

  void Run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      const int kind = Uniform(0, 99);
      if (kind < 14) {
        if (static_cast<int>(seqs_.size()) < kMaxSeqs) NewSequence();
      } else if (kind < 60) {
        if (!seqs_.empty()) Step(RandomSeq());
      } else if (kind < 72) {
        if (!seqs_.empty()) Compress(RandomSeq());
      } else if (kind < 84) {
        if (!seqs_.empty()) Drop(RandomSeq());
      } else if (kind < 90) {
        if (!seqs_.empty() && static_cast<int>(seqs_.size()) < kMaxSeqs) Fork(RandomSeq());
      } else {
        if (!seqs_.empty()) Free(RandomSeq());
      }
      std::optional<std::string> violation = kv_.invariant_violation();
      ASSERT_EQ(violation, std::nullopt) << "op " << op;
      ASSERT_NO_FATAL_FAILURE(CheckContents()) << "op " << op;
    }
    while (!seqs_.empty()) Free(seqs_.begin()->first);
    EXPECT_EQ(kv_.num_free_pages(), kNumPages);
    EXPECT_EQ(kv_.stats().num_free_spare_areas, kv_.config().num_spare_areas);
    EXPECT_EQ(kv_.num_seqs(), 0);
    EXPECT_EQ(kv_.invariant_violation(), std::nullopt);
  }

  const Counters& counters() const { return counters_; }
  const KvManager& kv() const { return kv_; }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  SeqId RandomSeq() {
    auto it = seqs_.begin();
    std::advance(it, Uniform(0, static_cast<int>(seqs_.size()) - 1));
    return it->first;
  }

  void NewSequence() {
    const SeqId id{next_id_++};
    SimSeq seq;
    seq.extra_key = static_cast<uint64_t>(Uniform(0, 1));
    const std::vector<int32_t>& head = heads_[static_cast<size_t>(Uniform(0, 2))];
    const int prompt_len = Uniform(1, 24);
    for (int t = 0; t < prompt_len; ++t) {
      seq.push(t < static_cast<int>(head.size()) && Uniform(0, 5) > 0 ? head[t] : Uniform(0, 4));
    }
    if (Uniform(0, 3) == 0) {
      kv_.start_sparse(id);
      seq.sparse = true;
      seq.kept.assign(kStreams, {});
      seqs_.emplace(id, std::move(seq));
      ++counters_.started_sparse;
      Step(id);
      return;
    }
    PrefixMatch match = kv_.lookup_prefix(seq.tokens, seq.extra_key);
    const int32_t n = Uniform(1, seq.tokens.size() - match.num_cached_tokens);
    if (!kv_.admit(id, match, match.num_cached_tokens + n)) return;
    seq.num_computed = match.num_cached_tokens;
    ++counters_.admitted;
    WriteDense(id, seq, n);
    seqs_.emplace(id, std::move(seq));
  }

  void WriteDense(SeqId id, SimSeq& seq, int32_t n) {
    for (int32_t p = seq.num_computed; p < seq.num_computed + n; ++p) {
      for (int32_t s = 0; s < kStreams; ++s) {
        runner_.write_dense(kv_.block_table(id), s, p, seq.tag(s, p));
      }
    }
    seq.num_computed += n;
    kv_.commit_full_blocks(id, seq.tokens, seq.num_computed);
  }

  void Step(SeqId id) {
    SimSeq& seq = seqs_.at(id);
    if (seq.num_computed >= kMaxTokens) {
      Free(id);
      return;
    }
    int32_t n = std::min(Uniform(1, 6), kMaxTokens - seq.num_computed);
    while (static_cast<int32_t>(seq.tokens.size()) < seq.num_computed + n) seq.push(Uniform(0, 4));
    if (!seq.sparse) {
      if (!kv_.allocate(id, seq.num_computed + n)) return;
      for (int32_t p = seq.num_computed; p < seq.num_computed + n; ++p) {
        if (p != seq.num_computed && p % kPageSize != 0) continue;
        WritePlan plan = kv_.prepare_write(id, p);
        if (std::holds_alternative<NoFreePage>(plan)) return;
        if (const auto* copy = std::get_if<PageCopy>(&plan))
          runner_.copy_page(copy->src, copy->dst);
      }
      ++counters_.dense_steps;
      WriteDense(id, seq, n);
      return;
    }
    std::vector<uint8_t> stores;
    if (n == 1 && Uniform(0, 2) == 0) {
      for (int32_t s = 0; s < kStreams; ++s) stores.push_back(static_cast<uint8_t>(Uniform(0, 1)));
    }
    std::optional<SparseAppend> append = kv_.append_sparse(id, n, stores);
    if (!append) {
      ++counters_.append_failed;
      return;
    }
    const SparseLayout& layout = kv_.sparse_layout(id);
    for (int32_t s = 0; s < kStreams; ++s) {
      if (!append->first_index[s]) continue;
      EXPECT_EQ(layout.address(s, *append->first_index[s]), append->first_slot[s]);
      for (int32_t i = 0; i < n; ++i) {
        const int32_t p = seq.num_computed + i;
        runner_.write_sparse(layout, s, *append->first_index[s] + i, seq.tag(s, p));
        seq.kept[s].push_back(seq.tag(s, p));
      }
    }
    if (!stores.empty()) ++counters_.skipping_appends;
    ++counters_.sparse_steps;
    seq.num_computed += n;
    EXPECT_EQ(layout.num_positions, seq.num_computed);
  }

  // A random subset of [0, n), ascending.
  std::vector<int32_t> Subset(int32_t n) {
    std::vector<int32_t> picked;
    const int keep_percent = Uniform(0, 100);
    for (int32_t i = 0; i < n; ++i) {
      if (Uniform(0, 99) < keep_percent) picked.push_back(i);
    }
    return picked;
  }

  void Compress(SeqId id) {
    SimSeq& seq = seqs_.at(id);
    KeepSets keep(kStreams);
    std::vector<std::vector<uint64_t>> before = seq.kept;
    if (!seq.sparse) {
      before.assign(kStreams, {});
      for (int32_t s = 0; s < kStreams; ++s) {
        for (int32_t p = 0; p < seq.num_computed; ++p) before[s].push_back(seq.tag(s, p));
      }
    }
    for (int32_t s = 0; s < kStreams; ++s) {
      if (Uniform(0, 3) > 0) keep[s] = Subset(static_cast<int32_t>(before[s].size()));
    }
    std::optional<CompactionPlan> plan = kv_.compress(id, seq.num_computed, keep);
    if (!plan) {
      ASSERT_FALSE(seq.sparse) << "compacting a sparse sequence never needs pages";
      ++counters_.compress_failed;
      return;
    }
    if (seq.sparse) {
      ++counters_.compress_sparse;
    } else if (plan->new_pages.empty()) {
      ++counters_.compress_in_place;
    } else {
      ++counters_.compress_copy;
    }
    RunPlan(*plan);
    seq.sparse = true;
    seq.kept.assign(kStreams, {});
    for (int32_t s = 0; s < kStreams; ++s) {
      if (!keep[s]) {
        seq.kept[s] = before[s];
        continue;
      }
      for (int32_t i : *keep[s]) seq.kept[s].push_back(before[s][static_cast<size_t>(i)]);
    }
  }

  void Drop(SeqId id) {
    SimSeq& seq = seqs_.at(id);
    if (!seq.sparse) return;
    DropSets drops(kStreams);
    for (int32_t s = 0; s < kStreams; ++s) {
      const int32_t n = static_cast<int32_t>(seq.kept[s].size());
      if (n == 0 || Uniform(0, 2) == 0) continue;
      switch (Uniform(0, 2)) {
        case 0:  // one key, like a streaming window or H2O
          drops[s] = {Uniform(0, n - 1)};
          break;
        case 1:  // a run from the front
          for (int32_t i = 0; i < Uniform(1, n); ++i) drops[s].push_back(i);
          break;
        default:
          drops[s] = Subset(n);
          if (static_cast<int32_t>(drops[s].size()) == n && Uniform(0, 1)) drops[s].pop_back();
      }
    }
    RunPlan(kv_.drop_tokens(id, drops));
    ++counters_.drops;
    for (int32_t s = 0; s < kStreams; ++s) {
      for (auto i = drops[s].rbegin(); i != drops[s].rend(); ++i) {
        seq.kept[s].erase(seq.kept[s].begin() + *i);
      }
    }
  }

  void RunPlan(const CompactionPlan& plan) {
    runner_.run(plan);
    counters_.slice_moves += static_cast<int>(plan.slice_moves.size());
    counters_.area_row_moves += static_cast<int>(plan.area_row_moves.size());
    counters_.area_moves += static_cast<int>(plan.area_moves.size());
    counters_.pages_freed += static_cast<int>(plan.freed_pages.size());
  }

  void Fork(SeqId parent) {
    const SeqId child{next_id_++};
    SimSeq copy = seqs_.at(parent);
    if (copy.sparse) {
      std::optional<CompactionPlan> copies = kv_.fork(parent, child);
      if (!copies) return;
      runner_.run_copies(*copies);
      ++counters_.sparse_forks;
    } else {
      ASSERT_EQ(kv_.fork(parent, child), CompactionPlan{});  // shares every page
      ++counters_.forks;
    }
    seqs_.emplace(child, std::move(copy));
  }

  void Free(SeqId id) {
    kv_.free(id);
    seqs_.erase(id);
    ++counters_.frees;
  }

  void CheckContents() const {
    for (const auto& [id, seq] : seqs_) {
      ASSERT_EQ(kv_.is_sparse(id), seq.sparse) << "seq " << id.value;
      if (!seq.sparse) {
        for (int32_t s = 0; s < kStreams; ++s) {
          for (int32_t p = 0; p < seq.num_computed; ++p) {
            ASSERT_EQ(runner_.row(runner_.dense_address(kv_.block_table(id), s, p)), seq.tag(s, p))
                << "dense seq " << id.value << " stream " << s << " position " << p;
            if (auto area = runner_.dense_area(kv_.block_table(id), s, p)) {
              ASSERT_EQ(runner_.area_row(*area), seq.tag(s, p))
                  << "dense seq " << id.value << " f16 copy of stream " << s << " position " << p;
            }
          }
        }
        continue;
      }
      const SparseLayout& layout = kv_.sparse_layout(id);
      ASSERT_EQ(layout.num_positions, seq.num_computed);
      for (int32_t s = 0; s < kStreams; ++s) {
        ASSERT_EQ(runner_.read_stream(layout, s), seq.kept[s])
            << "sparse seq " << id.value << " stream " << s;
        if (layout.streams[static_cast<size_t>(s)].f16_copy) {
          ASSERT_EQ(runner_.read_copy(layout, s), seq.kept[s])
              << "sparse seq " << id.value << " f16 copy of stream " << s;
        }
      }
    }
  }

  std::mt19937 rng_;
  KvManager kv_;
  test::FakeRunner runner_;
  std::vector<std::vector<int32_t>> heads_;
  std::map<SeqId, SimSeq> seqs_;
  uint64_t next_id_ = 1;
  Counters counters_;
};

class SparseStressTest : public ::testing::TestWithParam<std::tuple<uint32_t, bool>> {};

TEST_P(SparseStressTest, DenseAndSparseSequencesShareThePool) {
  const auto [seed, precise] = GetParam();
  SparseSimulation sim(seed, precise);
  ASSERT_NO_FATAL_FAILURE(sim.Run(3000));
  const Counters& c = sim.counters();
  // Every path was taken.
  EXPECT_GT(c.admitted, 20);
  EXPECT_GT(c.started_sparse, 10);
  EXPECT_GT(c.dense_steps, 50);
  EXPECT_GT(c.sparse_steps, 100);
  EXPECT_GT(c.skipping_appends, 10);
  EXPECT_GT(c.compress_in_place, 5);
  EXPECT_GT(c.compress_copy, 5);
  EXPECT_GT(c.compress_sparse, 20);
  EXPECT_GT(c.drops, 50);
  EXPECT_GT(c.slice_moves, 10);
  EXPECT_GT(c.pages_freed, 20);
  EXPECT_GT(c.forks, 5);
  EXPECT_GT(c.sparse_forks, 5);
  const KvStats stats = sim.kv().stats();
  if (precise) {
    EXPECT_GT(c.area_row_moves, 50);
    EXPECT_GT(c.area_moves, 5);                  // areas left pages going back to the pool
    EXPECT_GT(stats.num_dropped_f16_copies, 0);  // a stream found no area
  } else {
    EXPECT_EQ(c.area_row_moves + c.area_moves, 0);
    EXPECT_EQ(stats.num_dropped_f16_copies, 0);
  }
  std::printf("precise streams: %s; area row moves %d, area moves %d, f16 copies dropped %lld\n",
              precise ? "1, 2" : "none", c.area_row_moves, c.area_moves,
              static_cast<long long>(stats.num_dropped_f16_copies));
  std::printf(
      "counters: admitted %d, sparse starts %d, dense steps %d, sparse steps %d "
      "(%d skipping, %d refused), compress in place %d / copy %d / failed %d / sparse %d, "
      "drops %d, slice moves %d, pages freed %d, forks %d + %d sparse, frees %d\n",
      c.admitted, c.started_sparse, c.dense_steps, c.sparse_steps, c.skipping_appends,
      c.append_failed, c.compress_in_place, c.compress_copy, c.compress_failed, c.compress_sparse,
      c.drops, c.slice_moves, c.pages_freed, c.forks, c.sparse_forks, c.frees);
}

INSTANTIATE_TEST_SUITE_P(Seeds, SparseStressTest,
                         ::testing::Combine(::testing::Values(1u, 2u, 3u, 4u), ::testing::Bool()));

}  // namespace
}  // namespace sieve::kv
