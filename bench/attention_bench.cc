// Microbenchmarks of paged attention (Google Benchmark). Shapes of a Llama-3-8B layer:
// 32 query heads, 8 kv heads (GQA group 4), head_dim 128, pages of 16 tokens, block tables
// shuffled over the pool.
//
//   MemBandwidth/threads:T                   sum of a 1 GiB buffer: the DRAM roofline
//   Decode/<target>/ctx:C/threads:T          one query row at position C - 1: GB/s of K+V read
//                                            (C * 8 heads * 128 * 4 bytes * 2). Iterations
//                                            cycle over enough layers (>= 256 MiB of K+V) that
//                                            each layer's K/V comes from DRAM, as in a forward
//                                            pass; ctx:2048 is 16 MiB per layer.
//   DecodeL3/<target>/ctx:2048/threads:T     the same on one layer that stays in L3 (16 MiB)
//   DecodeL2/<target>/ctx:64/threads:1       ... and in L2 (512 KiB): the kernel's compute speed
//   Prefill/<target>/n:N/threads:T           causal prompt of N tokens: GFLOP/s (4 * head_dim
//                                            * heads * N(N+1)/2 per call)
//   FmaPeak/threads:T                        f32 FMAs from registers (kernels::fma_chains):
//                                            the peak the GFLOP/s figures compare against
//   EnginePrefillChunk/<target>/<f32|f16>[/bf16-pv|/bf16]/ctx:C/threads:T
//                                            one 512-row prefill chunk at the end of a C-key
//                                            context on bench-engine's model (head_dim 64, 8
//                                            heads, 2 kv heads): GFLOP/s over the visible keys
//   RefDecode/ctx:2048                       the double-precision reference, for scale
//   Observation/<target>/n:N/threads:T       observation_scores() of the last 32 rows of an
//                                            N-token prompt (SnapKV's window): GFLOP/s of q·k
//                                            (2 * head_dim * heads * 32 * N per call); compare
//                                            its time with Prefill/n:N
//   PageBounds/<target>/ctx:C                page_upper_bounds() of one decode row over C / 16
//                                            pages (Quest)
//   EngineDecode/<target>/<f32|f16|q8|q4>/<layout>/ctx:{16384,8192,2048,1024}/threads:T
//                                            bench-engine's model at depth 16k: 8 layers, 8 heads,
//                                            2 kv heads, head_dim 64, one sequence on pages
//                                            0, 1, 2, ... of a pool laid out layer-major (as
//                                            model::KvCache) or page-major (every layer of a page
//                                            together); each call runs the next layer. GB/s of K+V
//                                            per CPU second of the calling thread (threads:1 is
//                                            then little disturbed by other load); q8 / q4 are
//                                            Q8_0 / Q4_1 rows (68 / 40 bytes per token per kv
//                                            head, f16: 128), B/token/head counts K+V
//
//   EngineDecodePerHead/<target>/f32/layer-major/ctx:C/threads:1
//                                            the same as one call per KV head (a compressed
//                                            sequence's streams): the cost of a call
//
//   attention_bench --benchmark_filter='Decode/AVX3'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/ops.h"
#include "kernels/attention_scores.h"
#include "kernels/paged_attention.h"
#include "util/thread_pool.h"

namespace sieve::kernels {
namespace {

constexpr int64_t kKvHeads = 8, kHeads = 32, kHeadDim = 128;
constexpr int32_t kPageSize = 16;
constexpr size_t kColdBytes = size_t{256} << 20;

std::vector<float> random_floats(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& f : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    f = static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / (1 << 23);
  }
  return v;
}

// `num_layers` layers of one sequence of `num_keys` tokens, each layer in its own page pool
// with a shuffled block table.
struct Cache {
  std::vector<std::vector<float>> k, v;
  std::vector<std::vector<int32_t>> block_tables;
  int64_t num_keys = 0;

  PagedKv layer(size_t i) const {
    return PagedKv{k[i].data(),
                   v[i].data(),
                   kKvHeads * kPageSize * kHeadDim,
                   kPageSize * kHeadDim,
                   kPageSize,
                   kHeadDim,
                   kKvHeads,
                   block_tables[i]};
  }
  size_t bytes_per_layer() const {
    return static_cast<size_t>(num_keys * kKvHeads * kHeadDim * 2) * sizeof(float);
  }
};

const Cache& cache_of(int64_t num_keys, bool cold) {
  static std::map<std::pair<int64_t, bool>, std::unique_ptr<Cache>> caches;
  auto& entry = caches[{num_keys, cold}];
  if (!entry) {
    entry = std::make_unique<Cache>();
    entry->num_keys = num_keys;
    const size_t num_layers =
        cold ? std::max<size_t>(
                   2, (kColdBytes + entry->bytes_per_layer() - 1) / entry->bytes_per_layer())
             : 1;
    const int64_t num_pages = (num_keys + kPageSize - 1) / kPageSize;
    const int64_t page_floats = kKvHeads * kPageSize * kHeadDim;
    for (size_t l = 0; l < num_layers; ++l) {
      entry->k.push_back(random_floats(num_pages * page_floats, 2 * l + 1));
      entry->v.push_back(random_floats(num_pages * page_floats, 2 * l + 2));
      std::vector<int32_t> table(static_cast<size_t>(num_pages));
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), std::mt19937(static_cast<uint32_t>(l)));
      entry->block_tables.push_back(std::move(table));
    }
  }
  return *entry;
}

ThreadPool& pool_of(int num_threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[num_threads];
  if (!pool) pool = std::make_unique<ThreadPool>(num_threads);
  return *pool;
}

void run_decode(benchmark::State& state, const std::string& target, int64_t ctx, int threads,
                bool cold) {
  const bool reference = target.empty();
  if (!reference && !force_target_for_testing(target)) {
    state.SkipWithError("target not available");
    return;
  }
  const Cache& cache = cache_of(ctx, cold);
  const std::vector<float> q = random_floats(kHeads * kHeadDim, 7);
  const std::vector<int32_t> positions = {static_cast<int32_t>(ctx - 1)};
  const AttentionQuery query{q.data(), positions, kHeads, 0.088f};
  std::vector<float> out(kHeads * kHeadDim), row_max(kHeads), row_lse(kHeads);
  const AttentionOutput output{out.data(), row_max.data(), row_lse.data()};
  ThreadPool& pool = pool_of(threads);
  size_t layer = 0;
  for (auto _ : state) {
    if (reference) {
      ref::paged_attention(cache.layer(0), query, output);
    } else {
      paged_attention(cache.layer(layer), query, output, pool);
      layer = (layer + 1) % cache.k.size();
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(static_cast<double>(cache.bytes_per_layer()) * state.iterations() / 1e9,
                         benchmark::Counter::kIsRate);
  force_target_for_testing("");
}

void run_prefill(benchmark::State& state, const std::string& target, int64_t n, int threads) {
  if (!force_target_for_testing(target)) {
    state.SkipWithError("target not available");
    return;
  }
  const Cache& cache = cache_of(n, /*cold=*/false);
  const std::vector<float> q = random_floats(n * kHeads * kHeadDim, 8);
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), 0);
  const AttentionQuery query{q.data(), positions, kHeads, 0.088f};
  std::vector<float> out(n * kHeads * kHeadDim), row_max(n * kHeads), row_lse(n * kHeads);
  ThreadPool& pool = pool_of(threads);
  for (auto _ : state) {
    paged_attention(cache.layer(0), query, {out.data(), row_max.data(), row_lse.data()}, pool);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const double flops = 4.0 * kHeadDim * kHeads * static_cast<double>(n * (n + 1) / 2);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  force_target_for_testing("");
}

// The bench-engine model's KV pool for one sequence of `num_keys` tokens.
struct EngineCache {
  static constexpr int64_t kLayers = 8, kKv = 2, kHeadsQ = 8, kDim = 64;
  std::vector<float> k, v;
  std::vector<uint16_t> k16, v16;
  std::vector<uint8_t> kq, vq;  // Q8_0 / Q4_1: row-local blocks (paged_attention.h)
  std::vector<int32_t> table;
  int64_t num_keys, page_stride, layer_stride;
  DType dtype;
  bool f16;

  EngineCache(int64_t keys, DType type, bool layer_major)
      : num_keys(keys), dtype(type), f16(type == DType::kF16) {
    const int64_t num_pages = (keys + kPageSize - 1) / kPageSize;
    const int64_t page_block = kKv * kPageSize * kDim;  // one layer of one page
    page_stride = layer_major ? page_block : kLayers * page_block;
    layer_stride = layer_major ? num_pages * page_block : page_block;
    const int64_t total = kLayers * num_pages * page_block;
    if (is_block_kv_dtype(dtype)) {  // rows of whole blocks: one long row quantizes the same
      kq.resize(row_bytes(dtype, total));
      vq.resize(kq.size());
      quantize_row(dtype, random_floats(total, 3).data(), kq.data(), total);
      quantize_row(dtype, random_floats(total, 4).data(), vq.data(), total);
    } else if (f16) {
      const std::vector<float> values = random_floats(total, 3);
      for (float f : values) k16.push_back(f32_to_f16(f));
      v16 = k16;
    } else {
      k = random_floats(total, 3);
      v = random_floats(total, 4);
    }
    table.resize(static_cast<size_t>(num_pages));
    std::iota(table.begin(), table.end(), 0);
  }
  PagedKv layer(int64_t l) const {
    PagedKv kv{.page_stride = page_stride,
               .head_stride = kPageSize * kDim,
               .page_size = kPageSize,
               .head_dim = kDim,
               .num_kv_heads = kKv,
               .block_table = table,
               .dtype = dtype};
    if (is_block_kv_dtype(dtype)) {
      kv.k_q = kq.data() + row_bytes(dtype, l * layer_stride);
      kv.v_q = vq.data() + row_bytes(dtype, l * layer_stride);
    } else if (f16) {
      kv.k_f16 = k16.data() + l * layer_stride;
      kv.v_f16 = v16.data() + l * layer_stride;
    } else {
      kv.k = k.data() + l * layer_stride;
      kv.v = v.data() + l * layer_stride;
    }
    return kv;
  }
  double bytes_per_layer() const {
    return 2.0 * static_cast<double>(num_keys * kKv * row_bytes(dtype, kDim));
  }
};

// per_head: one call per KV head (what a compressed sequence's per-(layer, KV head) streams
// do) instead of one per layer.
void run_engine_decode(benchmark::State& state, const std::string& target, DType dtype,
                       bool layer_major, int64_t ctx, int threads, bool per_head) {
  if (!force_target_for_testing(target)) {
    state.SkipWithError("target not available");
    return;
  }
  const EngineCache cache(ctx, dtype, layer_major);
  const std::vector<float> q = random_floats(EngineCache::kHeadsQ * EngineCache::kDim, 7);
  const std::vector<int32_t> positions = {static_cast<int32_t>(ctx - 1)};
  const AttentionQuery query{q.data(), positions, EngineCache::kHeadsQ, 0.125f};
  std::vector<float> out(EngineCache::kHeadsQ * EngineCache::kDim);
  ThreadPool& pool = pool_of(threads);
  int64_t layer = 0;
  constexpr int64_t kGroup = EngineCache::kHeadsQ / EngineCache::kKv;
  for (auto _ : state) {
    if (!per_head) {
      paged_attention(cache.layer(layer), query, {out.data(), nullptr, nullptr}, pool);
    } else {
      for (int64_t h = 0; h < EngineCache::kKv; ++h) {
        PagedKv kv = cache.layer(layer);
        kv.num_kv_heads = 1;
        kv.k += h * kv.head_stride;
        kv.v += h * kv.head_stride;
        const AttentionQuery head_query{q.data() + h * kGroup * EngineCache::kDim, positions,
                                        kGroup, 0.125f};
        paged_attention(kv, head_query,
                        {out.data() + h * kGroup * EngineCache::kDim, nullptr, nullptr}, pool);
      }
    }
    layer = (layer + 1) % EngineCache::kLayers;
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(cache.bytes_per_layer() * state.iterations() / 1e9,
                                              benchmark::Counter::kIsRate);
  // K+V bytes per token and kv head, and keys (per kv head) attended per second.
  state.counters["B/token/head"] = 2.0 * static_cast<double>(row_bytes(dtype, EngineCache::kDim));
  state.counters["keys/s"] = benchmark::Counter(static_cast<double>(ctx) * state.iterations(),
                                                benchmark::Counter::kIsRate);
  force_target_for_testing("");
}

// One prefill chunk of kChunk rows at the end of a ctx-key context on the bench-engine model's
// pool (how `sieve bench-engine` prefills a long prompt: chunks of 512 rows, each against all
// the keys before it); each call runs the next layer. GFLOP/s of q·k and p·v over the visible
// keys (4 * head_dim * heads per visible key and row).
void run_engine_prefill_chunk(benchmark::State& state, const std::string& target, DType dtype,
                              int64_t ctx, int threads, PrefillDots dots) {
  if (!force_target_for_testing(target)) {
    state.SkipWithError("target not available");
    return;
  }
  constexpr int64_t kChunk = 512;
  const EngineCache cache(ctx, dtype, /*layer_major=*/true);
  const std::vector<float> q = random_floats(kChunk * EngineCache::kHeadsQ * EngineCache::kDim, 7);
  std::vector<int32_t> positions(static_cast<size_t>(kChunk));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(ctx - kChunk));
  const AttentionQuery query{.q = q.data(),
                             .positions = positions,
                             .num_heads = EngineCache::kHeadsQ,
                             .scale = 0.125f,
                             .prefill_dots = dots};
  std::vector<float> out(kChunk * EngineCache::kHeadsQ * EngineCache::kDim),
      row_lse(kChunk * EngineCache::kHeadsQ);
  ThreadPool& pool = pool_of(threads);
  int64_t layer = 0;
  for (auto _ : state) {
    paged_attention(cache.layer(layer), query, {out.data(), nullptr, row_lse.data()}, pool);
    layer = (layer + 1) % EngineCache::kLayers;
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  double visible = 0.0;
  for (int32_t p : positions) visible += p + 1.0;
  const double flops = 4.0 * EngineCache::kDim * EngineCache::kHeadsQ * visible;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  force_target_for_testing("");
}

// The f32 FMA peak the attention's GFLOP/s compare against: kernels::fma_chains (12 independent
// chains of the widest vector FMAs, from registers) on each thread, as `sieve bench` probes it.
void run_fma_peak(benchmark::State& state, int threads) {
  constexpr int64_t kIterations = 1 << 22;
  ThreadPool& pool = pool_of(threads);
  std::vector<float> sink(static_cast<size_t>(threads));
  std::vector<double> flops(static_cast<size_t>(threads));
  for (auto _ : state) {
    pool.parallel_for(
        threads,
        [&](int64_t begin, int64_t end) {
          for (int64_t t = begin; t < end; ++t) {
            sink[static_cast<size_t>(t)] = fma_chains(kIterations, &flops[static_cast<size_t>(t)]);
          }
        },
        1);
    benchmark::DoNotOptimize(sink.data());
  }
  double total = 0.0;
  for (double f : flops) total += f;
  state.counters["GFLOP/s"] =
      benchmark::Counter(total * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// Sums a 1 GiB buffer with all threads: the read bandwidth decode can hope for.
void run_observation(benchmark::State& state, const std::string& target, int64_t n, int threads) {
  if (!force_target_for_testing(target)) {
    state.SkipWithError("target not available");
    return;
  }
  constexpr int64_t kWindow = 32;
  const Cache& cache = cache_of(n, /*cold=*/false);
  const std::vector<float> q = random_floats(kWindow * kHeads * kHeadDim, 9);
  std::vector<int32_t> positions(static_cast<size_t>(kWindow));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(n - kWindow));
  const AttentionQuery window{q.data(), positions, kHeads, 0.088f};
  std::vector<float> out(kWindow * kHeads * kHeadDim), row_lse(kWindow * kHeads);
  ThreadPool& pool = pool_of(threads);
  paged_attention(cache.layer(0), window, {out.data(), nullptr, row_lse.data()}, pool);
  std::vector<float> scores(static_cast<size_t>(kKvHeads * n));
  for (auto _ : state) {
    observation_scores(cache.layer(0), window, row_lse.data(), n, scores.data(), pool);
    benchmark::DoNotOptimize(scores.data());
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * kHeadDim * kHeads * kWindow * static_cast<double>(n);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  force_target_for_testing("");
}

void run_page_bounds(benchmark::State& state, const std::string& target, int64_t ctx) {
  if (!force_target_for_testing(target)) {
    state.SkipWithError("target not available");
    return;
  }
  const Cache& cache = cache_of(ctx, /*cold=*/false);
  const PagedKv kv = cache.layer(0);
  const int64_t num_blocks = static_cast<int64_t>(kv.block_table.size());
  std::vector<float> summary_data(static_cast<size_t>(num_blocks * kKvHeads * 2 * kHeadDim));
  const KeySummaries summaries{summary_data.data(), kKvHeads * 2 * kHeadDim};
  for (int64_t b = 0; b < num_blocks; ++b) summarize_page_keys(kv, b, kPageSize, summaries);
  const std::vector<float> q = random_floats(kHeads * kHeadDim, 10);
  std::vector<float> bounds(static_cast<size_t>(kKvHeads * num_blocks));
  for (auto _ : state) {
    page_upper_bounds(kv, summaries, q.data(), kHeads, num_blocks, bounds.data());
    benchmark::DoNotOptimize(bounds.data());
    benchmark::ClobberMemory();
  }
  force_target_for_testing("");
}

// Sums a 1 GiB buffer with all threads: the read bandwidth decode can hope for.
void run_mem_bandwidth(benchmark::State& state, int threads) {
  constexpr size_t kBytes = size_t{1} << 30;
  static std::vector<uint64_t> buffer = [] {
    std::vector<uint64_t> b(kBytes / sizeof(uint64_t));
    std::iota(b.begin(), b.end(), uint64_t{0});
    return b;
  }();
  ThreadPool& pool = pool_of(threads);
  constexpr int64_t kChunk = (1 << 20) / sizeof(uint64_t);
  const int64_t num_chunks = static_cast<int64_t>(buffer.size()) / kChunk;
  for (auto _ : state) {
    std::vector<uint64_t> sums(num_chunks);
    pool.parallel_for(
        num_chunks,
        [&](int64_t begin, int64_t end) {
          for (int64_t chunk = begin; chunk < end; ++chunk) {
            const uint64_t* p = buffer.data() + chunk * kChunk;
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (int64_t i = 0; i < kChunk; i += 4) {
              s0 += p[i];
              s1 += p[i + 1];
              s2 += p[i + 2];
              s3 += p[i + 3];
            }
            sums[chunk] = s0 + s1 + s2 + s3;
          }
        },
        1);
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(kBytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

std::string kv_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return "f16";
    case DType::kQ8_0:
      return "q8";
    case DType::kQ4_1:
      return "q4";
    default:
      return "f32";
  }
}

void register_all() {
  const int max_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<int> thread_counts = {1};
  if (max_threads > 1) thread_counts.push_back(max_threads);
  for (const std::string& target : available_targets()) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_1}) {
      for (bool layer_major : {true, false}) {
        for (int threads : thread_counts) {
          for (int64_t ctx : {16384, 8192, 2048, 1024}) {  // 1024: 2 MiB f32 in all, from L2/L3
            const std::string name = "EngineDecode/" + target + "/" + kv_dtype_name(dtype) +
                                     (layer_major ? "/layer-major" : "/page-major") +
                                     "/ctx:" + std::to_string(ctx) +
                                     "/threads:" + std::to_string(threads);
            benchmark::RegisterBenchmark(name.c_str(), run_engine_decode, target, dtype,
                                         layer_major, ctx, threads, false)
                ->Unit(benchmark::kMillisecond);
          }
        }
      }
    }
  }
  for (const std::string& target : available_targets()) {
    for (int64_t ctx : {1024, 16384}) {
      const std::string name = "EngineDecodePerHead/" + target +
                               "/f32/layer-major/ctx:" + std::to_string(ctx) + "/threads:1";
      benchmark::RegisterBenchmark(name.c_str(), run_engine_decode, target, DType::kF32, true, ctx,
                                   1, true)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (int threads : thread_counts) {
    benchmark::RegisterBenchmark(("MemBandwidth/threads:" + std::to_string(threads)).c_str(),
                                 run_mem_bandwidth, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const std::string& target : available_targets()) {
    for (int64_t ctx : {2048, 8192, 16384}) {
      for (int threads : thread_counts) {
        const std::string name = "Decode/" + target + "/ctx:" + std::to_string(ctx) +
                                 "/threads:" + std::to_string(threads);
        benchmark::RegisterBenchmark(name.c_str(), run_decode, target, ctx, threads, true)
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
    for (int threads : thread_counts) {
      const std::string name =
          "DecodeL3/" + target + "/ctx:2048/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), run_decode, target, int64_t{2048}, threads, false)
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
    const std::string hot = "DecodeL2/" + target + "/ctx:64/threads:1";
    benchmark::RegisterBenchmark(hot.c_str(), run_decode, target, int64_t{64}, 1, false)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
    for (int64_t n : {512, 2048}) {
      const std::string name = "Prefill/" + target + "/n:" + std::to_string(n) +
                               "/threads:" + std::to_string(max_threads);
      benchmark::RegisterBenchmark(name.c_str(), run_prefill, target, n, max_threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (int threads : thread_counts) {
    const std::string name = "FmaPeak/threads:" + std::to_string(threads);
    benchmark::RegisterBenchmark(name.c_str(), run_fma_peak, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const std::string& target : available_targets()) {
    for (DType dtype : {DType::kF32, DType::kF16}) {
      for (PrefillDots dots : {PrefillDots::kF32, PrefillDots::kBf16Pv, PrefillDots::kBf16}) {
        for (int64_t ctx : {4096, 16384, 32768}) {
          const std::string name =
              "EnginePrefillChunk/" + target + "/" +
              std::string(dtype == DType::kF16 ? "f16" : "f32") +
              (dots == PrefillDots::kF32 ? "" : "/" + std::string(prefill_dots_name(dots))) +
              "/ctx:" + std::to_string(ctx) + "/threads:" + std::to_string(max_threads);
          benchmark::RegisterBenchmark(name.c_str(), run_engine_prefill_chunk, target, dtype, ctx,
                                       max_threads, dots)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  benchmark::RegisterBenchmark("RefDecode/ctx:2048", run_decode, std::string(), int64_t{2048}, 1,
                               false)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  for (const std::string& target : available_targets()) {
    for (int64_t n : {2048, 16384}) {
      const std::string name = "Observation/" + target + "/n:" + std::to_string(n) +
                               "/threads:" + std::to_string(max_threads);
      benchmark::RegisterBenchmark(name.c_str(), run_observation, target, n, max_threads)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
    const std::string bounds = "PageBounds/" + target + "/ctx:16384";
    benchmark::RegisterBenchmark(bounds.c_str(), run_page_bounds, target, int64_t{16384})
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  }
}

}  // namespace
}  // namespace sieve::kernels

int main(int argc, char** argv) {
  sieve::kernels::register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
