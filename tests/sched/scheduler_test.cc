// Table-driven scheduler simulations with a fake model runner: each step's exact schedule
// ("A8+8*" = sequence A computes 8 tokens from position 8 and samples), preemptions, and the
// pool back to all pages free at the end.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace sieve::sched {
namespace {

class Simulation {
 public:
  Simulation(SchedulerConfig config, kv::KvConfig kv_config)
      : kv_(kv_config), scheduler_(config, kv_) {}

  void add(char name, std::vector<int32_t> prompt, int32_t max_new, int32_t chunk_boundary = 0) {
    add(name, std::move(prompt), max_new, {.chunk_boundary = chunk_boundary});
  }
  void add(char name, std::vector<int32_t> prompt, int32_t max_new,
           const Scheduler::SequenceOptions& options) {
    max_new_[name] = max_new;
    scheduler_.add(id(name), std::move(prompt), max_new, options);
  }
  void add(char name, int32_t prompt_len, int32_t max_new) {
    std::vector<int32_t> prompt(prompt_len);
    std::iota(prompt.begin(), prompt.end(), 1000 * (name - 'A' + 1));
    add(name, std::move(prompt), max_new);
  }

  // One engine step with a fake runner: every sampling sequence gets token 7; a sequence with
  // max_new outputs finishes. "^N": the step's first N tokens want prompt logits.
  std::string step() {
    ScheduleOutput out = scheduler_.schedule();
    std::string text;
    for (const ScheduledSequence& s : out.scheduled) {
      if (!text.empty()) text += ' ';
      text += name(s.seq_id) + std::to_string(s.num_computed_before) + "+" +
              std::to_string(s.num_new_tokens) + (s.samples ? "*" : "") +
              (s.num_prompt_logits > 0 ? "^" + std::to_string(s.num_prompt_logits) : "");
      EXPECT_EQ(static_cast<int32_t>(kv_.block_table(s.seq_id).size()),
                kv_.num_pages_for(s.num_computed_before + s.num_new_tokens));
    }
    for (SeqId seq : out.preempted) text += " | pre " + name(seq);
    scheduler_.on_step_done(out);
    for (const ScheduledSequence& s : out.scheduled) {
      if (!s.samples) continue;
      scheduler_.append_token(s.seq_id, 7);
      if (scheduler_.num_output_tokens(s.seq_id) == max_new_[name(s.seq_id)[0]])
        scheduler_.finish(s.seq_id);
    }
    EXPECT_EQ(kv_.invariant_violation(), std::nullopt);
    return text;
  }

  std::vector<std::string> run_until_idle(int max_steps = 100) {
    std::vector<std::string> steps;
    while (!scheduler_.idle() && max_steps-- > 0) steps.push_back(step());
    return steps;
  }

  Scheduler& scheduler() { return scheduler_; }
  kv::KvManager& kv() { return kv_; }

 private:
  static SeqId id(char name) { return SeqId{static_cast<uint64_t>(name)}; }
  static std::string name(SeqId seq) { return std::string(1, static_cast<char>(seq.value)); }
  kv::KvManager kv_;
  Scheduler scheduler_;
  std::map<char, int32_t> max_new_;
};

SchedulerConfig config(int32_t budget, int32_t max_seqs = 8) {
  return {.max_batch_tokens = budget, .max_num_seqs = max_seqs, .max_model_len = 1024};
}
kv::KvConfig pool(int32_t pages, bool prefix_caching = false) {
  return {.num_pages = pages, .page_size = 4, .enable_prefix_caching = prefix_caching};
}

TEST(Scheduler, ChunkedPrefillThenDecode) {
  Simulation sim(config(8), pool(16));
  sim.add('A', 20, 2);
  EXPECT_EQ(sim.run_until_idle(), (std::vector<std::string>{"A0+8", "A8+8", "A16+4*", "A20+1*"}));
  EXPECT_EQ(sim.kv().num_free_pages(), 16);
}

TEST(Scheduler, DecodesFirstThenPrefillChunksThenNewRequests) {
  Simulation sim(config(8), pool(16));
  sim.add('A', 3, 3);
  EXPECT_EQ(sim.step(), "A0+3*");
  sim.add('B', 10, 1);
  sim.add('C', 2, 1);
  EXPECT_EQ(sim.step(), "A3+1* B0+7");
  // A decodes, B finishes its prompt, C is admitted with what is left of the budget.
  EXPECT_EQ(sim.step(), "A4+1* B7+3* C0+2*");
  EXPECT_TRUE(sim.scheduler().idle());
  EXPECT_EQ(sim.kv().num_free_pages(), 16);
}

TEST(Scheduler, PreemptsTheMostRecentAndRecomputesIt) {
  // 4 pages of 4 tokens: A and B each need 3 pages at their longest.
  Simulation sim(config(16), pool(4));
  sim.add('A', 6, 6);
  sim.add('B', 6, 6);
  EXPECT_EQ(sim.run_until_idle(),
            (std::vector<std::string>{
                "A0+6* B0+6*",
                "A6+1* B6+1*",
                "A7+1* B7+1*",
                "A8+1* | pre B",  // position 8 needs A's third page: B gives up its two
                "A9+1*",          // B waits: 1 page free, it needs 3 for 9 tokens
                "A10+1*",
                "B0+9*",  // recomputes prompt + its 3 outputs
                "B9+1*",
                "B10+1*",
            }));
  EXPECT_EQ(sim.scheduler().stats().num_preemptions, 1);
  EXPECT_EQ(sim.kv().num_free_pages(), 4);
}

TEST(Scheduler, RandomWorkloadsAlwaysFinishAndFreeEveryPage) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    Simulation sim(config(1 + rng() % 32, 1 + rng() % 6), pool(8 + rng() % 16, rng() % 2 == 0));
    int next = 0;
    int steps = 0;
    for (; steps < 2000; ++steps) {
      if (next < 24 && rng() % 3 == 0) {
        const char name = static_cast<char>('A' + next++);
        // Shared prefixes between some requests exercise the prefix cache.
        std::vector<int32_t> prompt(1 + rng() % 20);
        for (size_t i = 0; i < prompt.size(); ++i)
          prompt[i] = i < 8 ? static_cast<int32_t>(i) : name;
        sim.add(name, std::move(prompt), 1 + rng() % 12);
      }
      if (next == 24 && sim.scheduler().idle()) break;
      sim.step();
    }
    EXPECT_LT(steps, 2000) << "seed " << seed << ": did not finish";
    EXPECT_EQ(sim.kv().num_free_pages(), sim.kv().num_pages()) << "seed " << seed;
  }
}

TEST(Scheduler, PrefixCacheHitSkipsComputedBlocks) {
  Simulation sim(config(64), pool(16, /*prefix_caching=*/true));
  std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  sim.add('A', prompt, 1);
  EXPECT_EQ(sim.step(), "A0+10*");
  sim.add('B', prompt, 1);
  EXPECT_EQ(sim.step(), "B8+2*");  // two full cached blocks; the last 2 tokens are computed
  kv::KvStats stats = sim.kv().stats();
  EXPECT_EQ(stats.num_prefix_query_requests, 2);
  EXPECT_EQ(stats.num_prefix_hit_requests, 1);
  EXPECT_EQ(stats.num_prefix_hit_tokens, 8);
  EXPECT_EQ(sim.kv().num_free_pages(), 16);
}

TEST(Scheduler, ChunkBoundariesCutPrefillStepsAndPrefixHits) {
  // Budget 10 per step, boundaries every 8 positions: a step never computes across 8, 16, ...
  Simulation sim(config(10), pool(32, /*prefix_caching=*/true));
  std::vector<int32_t> prompt(21);
  std::iota(prompt.begin(), prompt.end(), 1);
  sim.add('A', prompt, 2, /*chunk_boundary=*/8);
  EXPECT_EQ(sim.run_until_idle(), (std::vector<std::string>{"A0+8", "A8+8", "A16+5*", "A21+1*"}));
  // The same prompt again: 20 tokens are cached, but a hit covers the first chunk less a page,
  // so that B's first step still ends on the boundary (where the engine compresses).
  sim.add('B', prompt, 1, /*chunk_boundary=*/8);
  sim.add('C', prompt, 1);
  EXPECT_EQ(sim.run_until_idle(), (std::vector<std::string>{"B4+4 C20+1*", "B8+8", "B16+5*"}));
  EXPECT_EQ(sim.kv().num_free_pages(), 32);
}

// Prompt logprobs: every prompt position but the last (which samples) yields a logits row, chunk
// by chunk; the prompt is computed whole despite a cached prefix, and published for others.
TEST(Scheduler, PromptLogitsCoverEveryPromptPositionAndSkipCachedPrefixes) {
  Simulation sim(config(8), pool(16, /*prefix_caching=*/true));
  std::vector<int32_t> prompt(18);
  std::iota(prompt.begin(), prompt.end(), 1);
  sim.add('A', prompt, 2);
  EXPECT_EQ(sim.run_until_idle(), (std::vector<std::string>{"A0+8", "A8+8", "A16+2*", "A18+1*"}));
  sim.add('B', prompt, 2, {.prompt_logits = true});
  EXPECT_EQ(sim.run_until_idle(),
            (std::vector<std::string>{"B0+8^8", "B8+8^8", "B16+2*^1", "B18+1*"}));
  sim.add('C', prompt, 1);
  EXPECT_EQ(sim.run_until_idle(), (std::vector<std::string>{"C16+2*"}));
  EXPECT_EQ(sim.kv().num_free_pages(), 16);
}

// A recompute after the first sampled token wants no prompt logits (they went out already).
TEST(Scheduler, PromptLogitsAreNotRecomputedAfterTheFirstToken) {
  Simulation sim(config(16), pool(4));
  sim.add('A', 6, 6);
  std::vector<int32_t> prompt(6);
  std::iota(prompt.begin(), prompt.end(), 2000);
  sim.add('B', prompt, 6, {.prompt_logits = true});
  const std::vector<std::string> steps = sim.run_until_idle();
  EXPECT_EQ(steps.front(), "A0+6* B0+6*^5");
  EXPECT_NE(std::find(steps.begin(), steps.end(), "B0+9*"), steps.end());
  EXPECT_EQ(sim.scheduler().stats().num_preemptions, 1);
}

TEST(Scheduler, SequenceLimitHoldsNewRequests) {
  Simulation sim(config(64, /*max_seqs=*/2), pool(16));
  sim.add('A', 2, 2);
  sim.add('B', 2, 1);
  sim.add('C', 2, 1);
  EXPECT_EQ(sim.run_until_idle(), (std::vector<std::string>{"A0+2* B0+2*", "A2+1* C0+2*"}));
}

TEST(Scheduler, FinishWhileWaitingOrRunningFreesEverything) {
  Simulation sim(config(4), pool(8));
  sim.add('A', 12, 4);
  sim.add('B', 4, 4);
  EXPECT_EQ(sim.step(), "A0+4");
  sim.scheduler().finish(SeqId{'B'});  // cancelled while waiting
  sim.scheduler().finish(SeqId{'A'});  // cancelled mid-prefill
  EXPECT_TRUE(sim.scheduler().idle());
  EXPECT_EQ(sim.kv().num_free_pages(), 8);
}

// Streaming requests (sinks 2 + window 6 in each of 2 layers x 2 KV heads) that an engine
// compresses after every step: the scheduler then appends to their streams instead of growing
// block tables. Dense, each would need 13 pages of a 6-page pool; compressed, it fits.
class StreamingEngine {
 public:
  static constexpr int32_t kSinks = 2, kWindow = 6, kStreams = 4;

  StreamingEngine(int32_t num_pages)
      : kv_(kv::KvConfig{.num_pages = num_pages,
                         .page_size = 4,
                         .enable_prefix_caching = true,
                         .num_layers = 2,
                         .num_kv_heads = 2}),
        scheduler_(config(8), kv_) {}

  int64_t peak_pages(int32_t total_tokens) const {
    const std::vector<std::optional<int64_t>> bounds(kStreams, kSinks + kWindow);
    return kv::sparse_peak_pages({.shape = kv_.slice_shape(),
                                  .max_kept_tokens = bounds,
                                  .chunk_size = 8,
                                  .max_total_tokens = total_tokens,
                                  .dense_tokens_at_first_compression = 8});
  }
  void add(char name, int32_t prompt_len, int32_t max_new, bool with_peak = true) {
    std::vector<int32_t> prompt(prompt_len);
    std::iota(prompt.begin(), prompt.end(), 1000 * (name - 'A' + 1));
    max_new_[name] = max_new;
    scheduler_.add(
        SeqId{static_cast<uint64_t>(name)}, std::move(prompt), max_new,
        {.max_pages =
             with_peak ? std::optional<int64_t>(peak_pages(prompt_len + max_new)) : std::nullopt});
  }

  std::string step() {
    ScheduleOutput out = scheduler_.schedule();
    std::string text;
    for (const ScheduledSequence& s : out.scheduled) {
      if (!text.empty()) text += ' ';
      text.push_back(static_cast<char>(s.seq_id.value));
      text += std::to_string(s.num_computed_before);
      text += '+';
      text += std::to_string(s.num_new_tokens);
      if (s.samples) text += '*';
      if (s.stream_slots) text += 's';
      EXPECT_EQ(s.stream_slots.has_value(), kv_.is_sparse(s.seq_id));
    }
    for (SeqId seq : out.preempted) {
      text += " | pre ";
      text.push_back(static_cast<char>(seq.value));
    }
    scheduler_.on_step_done(out);
    for (const ScheduledSequence& s : out.scheduled) {
      if (!scheduler_.contains(s.seq_id) || !kv_.contains(s.seq_id)) continue;
      // The policy: sinks + window of each stream, compressed after every step.
      const int32_t num_computed = scheduler_.num_computed(s.seq_id);
      kv::KeepSets keep(kStreams);
      for (int32_t stream = 0; stream < kStreams; ++stream) {
        const int32_t n = kv_.is_sparse(s.seq_id)
                              ? kv_.sparse_layout(s.seq_id).streams[stream].num_tokens
                              : num_computed;
        if (n <= kSinks + kWindow) continue;
        std::vector<int32_t> kept = {0, 1};
        for (int32_t i = n - kWindow; i < n; ++i) kept.push_back(i);
        keep[stream] = kept;
      }
      // The plan would run here. Leaving shared dense pages needs the new ones first; without
      // them the sequence stays dense this step.
      if (!kv_.compress(s.seq_id, num_computed, keep)) {
        ++num_compress_failed_;
        continue;
      }
      max_owned_ = std::max(max_owned_, kv_.owned_pages(s.seq_id).size());
    }
    for (const ScheduledSequence& s : out.scheduled) {
      if (!s.samples || !scheduler_.contains(s.seq_id)) continue;
      scheduler_.append_token(s.seq_id, 7);
      if (scheduler_.num_output_tokens(s.seq_id) == max_new_[static_cast<char>(s.seq_id.value)]) {
        scheduler_.finish(s.seq_id);
      }
    }
    EXPECT_EQ(kv_.invariant_violation(), std::nullopt);
    return text;
  }

  kv::CompactionPlan fork(char parent, char child) {
    max_new_[child] = max_new_[parent];
    return scheduler_.fork(SeqId{static_cast<uint64_t>(parent)},
                           SeqId{static_cast<uint64_t>(child)});
  }

  Scheduler& scheduler() { return scheduler_; }
  kv::KvManager& kv() { return kv_; }
  size_t max_owned() const { return max_owned_; }
  int num_compress_failed() const { return num_compress_failed_; }

 private:
  kv::KvManager kv_;
  Scheduler scheduler_;
  std::map<char, int32_t> max_new_;
  size_t max_owned_ = 0;
  int num_compress_failed_ = 0;
};

TEST(Scheduler, CompressedRequestsAppendToStreamsAndFitTheirPeak) {
  StreamingEngine engine(6);
  EXPECT_EQ(engine.kv().num_pages_for(50), 13);  // dense, it could never run
  EXPECT_EQ(engine.peak_pages(50), 6);
  engine.add('A', 20, 30);
  std::vector<std::string> steps;
  while (!engine.scheduler().idle() && steps.size() < 100) steps.push_back(engine.step());
  ASSERT_EQ(steps.size(), 32u);
  EXPECT_EQ(steps[0], "A0+8");   // dense first chunk, then compressed (copied: published pages)
  EXPECT_EQ(steps[1], "A8+8s");  // appended to the streams
  EXPECT_EQ(steps[2], "A16+4*s");
  EXPECT_EQ(steps[3], "A20+1*s");
  EXPECT_EQ(steps[31], "A48+1*s");
  EXPECT_LE(static_cast<int64_t>(engine.max_owned()), engine.peak_pages(50));
  EXPECT_EQ(engine.scheduler().stats().num_preemptions, 0);
  EXPECT_EQ(engine.num_compress_failed(), 0);
  EXPECT_EQ(engine.kv().num_free_pages(), 6);
}

TEST(Scheduler, CompressedRequestsArePreemptedAndRecomputed) {
  StreamingEngine engine(7);
  for (char name = 'A'; name < 'E'; ++name) {
    engine.add(name, 12 + 3 * (name - 'A'), 20);
  }
  int steps = 0;
  while (!engine.scheduler().idle() && steps < 500) {
    engine.step();
    ++steps;
  }
  EXPECT_LT(steps, 500);
  EXPECT_GT(engine.scheduler().stats().num_preemptions, 0);
  EXPECT_EQ(engine.kv().num_free_pages(), 7);
  EXPECT_EQ(engine.kv().num_seqs(), 0);
}

TEST(Scheduler, ForkOfACompressedSequenceCopiesItsSlicesOrWaits) {
  StreamingEngine engine(6);
  engine.add('A', 10, 3, /*with_peak=*/false);  // 4 pages dense
  EXPECT_EQ(engine.step(), "A0+8");
  // The parent samples; the step's compression keeps 8 of 10 keys per stream: 2 pages.
  ScheduleOutput out = engine.scheduler().schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  ASSERT_TRUE(out.scheduled[0].samples);
  engine.scheduler().on_step_done(out);
  const SeqId a{'A'};
  kv::KeepSets keep(4, std::vector<int32_t>{0, 1, 4, 5, 6, 7, 8, 9});
  ASSERT_TRUE(engine.kv().compress(a, 10, keep));
  ASSERT_EQ(engine.kv().owned_pages(a).size(), 2u);

  kv::CompactionPlan copies = engine.fork('A', 'F');
  EXPECT_EQ(copies.slice_moves.size(), 8u);  // every used slice
  EXPECT_TRUE(engine.kv().is_sparse(SeqId{'F'}));
  // Someone else holds the last two pages: a second child waits, to be recomputed.
  const SeqId other{'Z'};
  ASSERT_TRUE(engine.kv().admit(other, engine.kv().lookup_prefix(std::vector<int32_t>{1}), 8));
  EXPECT_EQ(engine.fork('A', 'G'), kv::CompactionPlan{});
  EXPECT_FALSE(engine.kv().contains(SeqId{'G'}));
  EXPECT_EQ(engine.scheduler().stats().num_waiting, 1);
  engine.kv().free(other);
  for (SeqId seq : {a, SeqId{'F'}, SeqId{'G'}}) engine.scheduler().append_token(seq, 7);
  std::vector<std::string> steps;
  while (!engine.scheduler().idle() && steps.size() < 50) steps.push_back(engine.step());
  EXPECT_EQ(steps, (std::vector<std::string>{
                       "A10+1*s F10+1*s",  // both decode from their own streams, a page each
                       "A11+1*s F11+1*s",  // and finish
                       "G0+8",             // the waiting child: recomputed, dense at first
                       "G8+3*s",
                       "G11+1*s",
                   }));
  EXPECT_EQ(engine.kv().num_free_pages(), 6);
  EXPECT_EQ(engine.kv().num_seqs(), 0);
}

// Speculative decoding: a draft rides on the decode (A6+4*: the last real token and 3 drafts,
// logits for all 4), is never split by the budget, and what is rejected leaves the tokens, the
// computed count and the pages; a preempted sequence loses its draft.
TEST(Scheduler, DraftsAreVerifiedInOneDecodeAndRejectedOnesGiveBackTheirPages) {
  kv::KvManager kv(pool(8));
  Scheduler scheduler(config(16), kv);
  const SeqId a{1};
  scheduler.add(a, {1, 2, 3, 4, 5}, 20);
  ScheduleOutput out = scheduler.schedule();
  scheduler.on_step_done(out);
  scheduler.append_token(a, 6);  // 6 tokens, 5 computed: pages for 5
  EXPECT_EQ(kv.block_table(a).size(), 2u);

  scheduler.set_draft(a, std::vector<int32_t>{7, 8, 9});
  EXPECT_EQ(scheduler.num_draft_tokens(a), 3);
  out = scheduler.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_computed_before, 5);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 4);
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 3);
  EXPECT_TRUE(out.scheduled[0].samples);
  EXPECT_EQ(kv.block_table(a).size(), 3u);  // positions up to 8 (drafts included)
  scheduler.on_step_done(out);
  scheduler.resolve_draft(a, 1);  // 7 accepted, 8 and 9 rejected
  EXPECT_EQ(std::vector<int32_t>(scheduler.tokens(a).begin(), scheduler.tokens(a).end()),
            (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(scheduler.num_computed(a), 7);
  EXPECT_EQ(kv.block_table(a).size(), 2u);  // the page drafts 8, 9 took is back
  EXPECT_EQ(kv.num_free_pages(), 6);
  scheduler.append_token(a, 10);

  // A budget too small for the draft drops the part that does not fit.
  Scheduler small(config(2), kv);
  const SeqId b{2};
  small.add(b, {1, 2}, 20);
  out = small.schedule();
  small.on_step_done(out);
  small.append_token(b, 3);
  small.set_draft(b, std::vector<int32_t>{4, 5, 6});
  out = small.schedule();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].num_new_tokens, 2);
  EXPECT_EQ(out.scheduled[0].num_draft_tokens, 1);
  EXPECT_EQ(small.tokens(b).size(), 4u);
  small.on_step_done(out);
  small.resolve_draft(b, 1);
  EXPECT_EQ(small.num_computed(b), 4);
  small.finish(b);

  // Drafts are capped by max_new_tokens: the accepted drafts and one more token must fit.
  EXPECT_EQ(scheduler.max_draft_tokens(a), 5 + 20 - 8 - 1);
  scheduler.finish(a);
  EXPECT_EQ(kv.num_free_pages(), 8);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

TEST(Scheduler, APreemptedOrUnscheduledSequenceLosesItsDraft) {
  kv::KvManager kv(pool(3));  // 12 tokens
  Scheduler scheduler(config(16), kv);
  const SeqId a{1};
  const SeqId b{2};
  scheduler.add(a, {1, 2, 3}, 8);
  scheduler.add(b, {1, 2, 3}, 8);
  ScheduleOutput out = scheduler.schedule();
  scheduler.on_step_done(out);
  scheduler.append_token(a, 4);
  scheduler.append_token(b, 4);
  scheduler.set_draft(b, std::vector<int32_t>{5, 6, 7, 8, 9});  // needs a third page: none left
  scheduler.set_draft(a, std::vector<int32_t>{5, 6, 7, 8, 9});
  out = scheduler.schedule();
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], b);
  EXPECT_EQ(scheduler.num_draft_tokens(b), 0);
  EXPECT_EQ(scheduler.tokens(b).size(), 4u);
  scheduler.on_step_done(out);
  scheduler.resolve_draft(a, 0);
  EXPECT_EQ(scheduler.tokens(a).size(), 4u);
  EXPECT_EQ(scheduler.num_computed(a), 4);
  scheduler.finish(a);
  scheduler.finish(b);
  EXPECT_EQ(kv.num_free_pages(), 3);
  EXPECT_EQ(kv.invariant_violation(), std::nullopt);
}

}  // namespace
}  // namespace sieve::sched
