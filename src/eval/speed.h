#pragma once
// Speed measurements for `sieve bench`: the machine's memory read bandwidth and a model's
// prompt-processing and decode throughput, so decode can be reported as a fraction of the
// bandwidth it could use (decode of a large model is bound by reading every weight once per token).
#include <cstdint>
#include <vector>

#include "model/model.h"

namespace sieve {
class ThreadPool;
}

namespace sieve::eval {

struct BandwidthResult {
  uint64_t bytes = 0;
  int repetitions = 0;
  double best_gb_per_s = 0.0;  // 1 GB = 1e9 bytes
  double mean_gb_per_s = 0.0;
};
// STREAM-style "sum": every thread sums its share of one buffer of `bytes`, allocated and
// touched once; each pass() reads all of it (kernels::sum_words: full-width loads, prefetched as
// decode's weights are) and returns GB/s.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(ThreadPool& pool, uint64_t bytes);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;
  uint64_t bytes() const { return num_words_ * sizeof(uint64_t); }
  double pass();

 private:
  // fn(t, lo, hi) on thread t's share [lo, hi) of the buffer's words, on the pool's threads.
  template <class Fn>
  void for_each_share(const Fn& fn);

  ThreadPool& pool_;
  uint64_t num_words_;
  uint64_t* buffer_;
};
// Best and mean of N passes of the probe.
BandwidthResult measure_read_bandwidth(ReadBandwidthProbe& probe, int repetitions);

// The f32 FMA peak: every thread of the pool runs kernels::fma_chains (12 chains of the widest
// vector FMAs, from registers) for `iterations` steps; pass() returns GFLOP/s. Like the read
// bandwidth, this kind of VM's peak moves between runs (a second vCPU shared with other work), so
// prefill is set against passes taken right around it (measure_model_speed).
class FmaPeakProbe {
 public:
  explicit FmaPeakProbe(ThreadPool& pool, int64_t iterations = int64_t{1} << 21);
  double pass();
  // The best of `passes` passes (at least one): a pass of a few milliseconds can lose the core to
  // other work, and the peak is what the core can do, not what one pass got.
  double best_pass(int passes);

 private:
  ThreadPool& pool_;
  int64_t iterations_;
};

struct ModelSpeed {
  int64_t prompt_tokens = 0;
  double prompt_tokens_per_s = 0.0;
  int64_t decode_tokens = 0;
  double decode_tokens_per_s = 0.0;
  uint64_t bytes_per_token = 0;  // weights read per decoded token
  double decode_gb_per_s = 0.0;  // bytes_per_token * decode_tokens_per_s / 1e9
  // Weights every prompt token is multiplied by: q, k, v, o, gate, up, down of every layer.
  // Not counted: the embedding table (a row lookup), the output matrix (prefill applies it to
  // the last prompt token only) and attention's q·k / p·v products (they grow with position).
  uint64_t matmul_params_per_token = 0;
  double prompt_gflop_per_s =
      0.0;  // 2 * matmul_params_per_token * prompt_tokens / prompt time / 1e9
  // With an FMA peak probe: the mean of its best passes just before and right after the prompt,
  // and prompt_gflop_per_s as a fraction of it.
  double prompt_fma_peak_gflop_per_s = 0.0;
  double prompt_peak_fraction = 0.0;
  // With a bandwidth probe (measure_model_speed): decode in rounds, the probe's pass before each
  // round and after the last, so each round's decode GB/s is set against the bandwidth the
  // machine gave at that time (this kind of VM's read bandwidth moves up to 2x within minutes).
  std::vector<double> round_utilisation;  // round GB/s / mean of the passes around it
  double median_utilisation = 0.0;
};
// Parameters of the matrices each token passes through in every layer (see ModelSpeed).
uint64_t layer_matmul_params(const model::Weights& weights);
// One prompt of `prompt_tokens` tokens in a single batch, then `decode_tokens` single-token
// steps (greedy). Prompt ids are drawn deterministically from the vocabulary. With `probe`, the
// decode steps run in `rounds` rounds between probe passes (not counted in the decode time);
// with `fma_probe`, the prompt between two of its passes.
ModelSpeed measure_model_speed(const model::Model& model, int64_t prompt_tokens,
                               int64_t decode_tokens, ReadBandwidthProbe* probe = nullptr,
                               int rounds = 1, FmaPeakProbe* fma_probe = nullptr);

}  // namespace sieve::eval
