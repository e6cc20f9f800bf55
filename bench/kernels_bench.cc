// Microbenchmarks of the matmul kernels (Google Benchmark).
//
//   MemBandwidth/threads:T          sum of a 1 GiB buffer: the DRAM roofline for decode
//   Decode/<target>/<dtype>/RxC/threads:T   y = W x, one x row: GB/s of weights streamed
//                                           (4096x4096 Q8_0/Q4_0 fit the 32 MiB L3 here)
//   Prefill/<target>/<dtype>/RxC/xN         N = 64 (and 256 for quantized weights) x rows:
//                                           GFLOP/s (2 * rows * cols * N per call)
//   Ref{Decode,Prefill}/<dtype>/...         the scalar reference, for scale
//   Ceiling/Vnni/{dpbusd,tile}              the packed prefill tiles' instruction mix in
//                                           registers only (one thread): what this CPU allows
//   SuperBlocks/DecodeStep/<dtype>          one decode step's matmuls of a 2048-dim 8-layer
//                                           model, each matrix its own copy: GB/s streamed
//   Small/<target>/Q8_0/RxC[/packed]/xN              the bench-engine model's shapes (512-dim, ffn
//   1536,
//                                           32000 vocab) for N = 1..512 rows, one thread, CPU
//                                           time (less disturbed by other load on the machine)
//
// Weights are random values quantized to each dtype. Filter with --benchmark_filter, e.g.
//   kernels_bench --benchmark_filter='Decode/AVX3'
#include <benchmark/benchmark.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/cpu/pack.h"
#include "kernels/ops.h"
#include "util/thread_pool.h"

namespace sieve::kernels {
namespace {

constexpr DType kDTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,  DType::kQ4_0,
                             DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kIQ4_NL};

// Deterministic floats in [-1, 1) (xorshift; fast enough for 45 M values).
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

struct Weights {
  std::vector<uint8_t> bytes;
  MatrixView view;
};

// One matrix per (dtype, shape), built on first use and shared by all targets.
const Weights& weights(DType dtype, int64_t rows, int64_t cols) {
  static std::map<std::tuple<DType, int64_t, int64_t>, std::unique_ptr<Weights>> cache;
  auto& entry = cache[{dtype, rows, cols}];
  if (!entry) {
    entry = std::make_unique<Weights>();
    const size_t bytes_per_row = row_bytes(dtype, cols);
    entry->bytes.resize(bytes_per_row * rows);
    for (int64_t r = 0; r < rows; r += 256) {
      const int64_t n = std::min<int64_t>(256, rows - r);
      const std::vector<float> values = random_floats(n * cols, r + 1);
      for (int64_t k = 0; k < n; ++k) {
        quantize_row(dtype, values.data() + k * cols, entry->bytes.data() + (r + k) * bytes_per_row,
                     cols);
      }
    }
    entry->view = MatrixView{dtype, entry->bytes.data(), rows, cols};
  }
  return *entry;
}

ThreadPool& pool_of(int num_threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[num_threads];
  if (!pool) pool = std::make_unique<ThreadPool>(num_threads);
  return *pool;
}

int hardware_threads() {
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

struct MatmulCase {
  std::string target;  // empty: the scalar reference
  DType dtype;
  int64_t rows, cols, num_x;
  int threads;
  bool packed = false;  // attach pack_for_matmul() (Q8_0, Q4_0, ...)
};

void run_matmul(benchmark::State& state, const MatmulCase& c) {
  const bool reference = c.target.empty();
  if (!reference && !force_target_for_testing(c.target)) {
    state.SkipWithError("target not available");
    return;
  }
  const Weights& weights_of_case = weights(c.dtype, c.rows, c.cols);
  Weights w{{}, weights_of_case.view};
  PackedBytes packed;
  if (c.packed) {
    packed = pack_for_matmul(w.view);
    attach_packed(w.view, packed);
  }
  const std::vector<float> x = random_floats(c.num_x * c.cols, 99);
  std::vector<float> y(static_cast<size_t>(c.num_x * c.rows));
  ThreadPool& pool = pool_of(c.threads);
  for (auto _ : state) {
    if (reference) {
      ref::matmul(w.view, x.data(), c.num_x, y.data());
    } else {
      matmul(w.view, x.data(), c.num_x, y.data(), pool);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  const double iterations = static_cast<double>(state.iterations());
  const double weight_bytes = static_cast<double>(row_bytes(c.dtype, c.cols)) * c.rows;
  state.counters["GB/s"] =
      benchmark::Counter(weight_bytes * iterations / 1e9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * c.rows * c.cols * c.num_x * iterations / 1e9,
                                                 benchmark::Counter::kIsRate);
  force_target_for_testing("");
}

// Sums a 1 GiB buffer of uint64 with all threads: the read bandwidth decode can hope for.
void run_mem_bandwidth(benchmark::State& state, int threads) {
  constexpr size_t kBytes = size_t{1} << 30;
  static std::vector<uint64_t> buffer = [] {
    std::vector<uint64_t> b(kBytes / sizeof(uint64_t));
    for (size_t i = 0; i < b.size(); ++i) b[i] = i;
    return b;
  }();
  ThreadPool& pool = pool_of(threads);
  constexpr int64_t kChunk = (1 << 20) / sizeof(uint64_t);  // 1 MiB per task
  const int64_t num_chunks = static_cast<int64_t>(buffer.size()) / kChunk;
  for (auto _ : state) {
    std::vector<uint64_t> sums(num_chunks);
    pool.parallel_for(
        num_chunks,
        [&](int64_t begin, int64_t end) {
          for (int64_t chunk = begin; chunk < end; ++chunk)
            sums[chunk] = sum_words(buffer.data() + chunk * kChunk, kChunk);
        },
        1);
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["GB/s"] = benchmark::Counter(
      static_cast<double>(kBytes) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

std::string shape_name(const MatmulCase& c) {
  return std::string(to_string(c.dtype)) + "/" + std::to_string(c.rows) + "x" +
         std::to_string(c.cols);
}

void register_all() {
  const int max_threads = hardware_threads();
  std::vector<int> thread_counts = {1};
  if (max_threads > 1) thread_counts.push_back(max_threads);

  for (int threads : thread_counts) {
    benchmark::RegisterBenchmark(("MemBandwidth/threads:" + std::to_string(threads)).c_str(),
                                 run_mem_bandwidth, threads)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  const auto add = [](const std::string& name, const MatmulCase& c) {
    benchmark::RegisterBenchmark(name.c_str(), run_matmul, c)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  for (const std::string& target : available_targets()) {
    for (DType dtype : kDTypes) {
      for (auto [rows, cols] :
           {std::pair<int64_t, int64_t>{4096, 4096}, {11008, 4096}, {4096, 11008}}) {
        for (int threads : thread_counts) {
          const MatmulCase c{target, dtype, rows, cols, 1, threads};
          add("Decode/" + target + "/" + shape_name(c) + "/threads:" + std::to_string(threads), c);
        }
      }
      for (int64_t num_x : {64, 256}) {
        if (num_x == 256 && !is_quantized(dtype)) continue;
        const MatmulCase c{target, dtype, 4096, 4096, num_x, max_threads};
        add("Prefill/" + target + "/" + shape_name(c) + "/x" + std::to_string(num_x), c);
      }
    }
  }
  for (const std::string& target : available_targets()) {
    for (auto [rows, cols] :
         {std::pair<int64_t, int64_t>{512, 512}, {1536, 512}, {512, 1536}, {32000, 512}}) {
      for (int64_t num_x : {1, 4, 16, 64, 512}) {
        if (rows == 32000 && num_x > 64) continue;
        for (bool packed : {false, true}) {
          const MatmulCase c{target, DType::kQ8_0, rows, cols, num_x, 1, packed};
          benchmark::RegisterBenchmark(("Small/" + target + "/" + shape_name(c) +
                                        (packed ? "/packed" : "") + "/x" + std::to_string(num_x))
                                           .c_str(),
                                       run_matmul, c)
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  for (DType dtype : kDTypes) {
    const MatmulCase decode{"", dtype, 4096, 4096, 1, 1};
    add("RefDecode/" + shape_name(decode), decode);
    const MatmulCase prefill{"", dtype, 1024, 4096, 64, 1};
    add("RefPrefill/" + shape_name(prefill) + "/x64", prefill);
  }
}

// The super-block types (K-quants, IQ4_XS) against F16, Q8_0 and Q4_0 in the same run, on the best
// target with all threads, each also with its packed copy (/packed) where the CPU packs it:
//   SuperBlocks/Decode/<dtype>/RxC[/packed]  GB/s of weights streamed (32000x4096 exceeds the L3;
//                                         4096x4096/threads:1: from L3, per CPU second;
//                                         32000x4096/threads:1: from DRAM on one core;
//                                         256x2048/threads:1: from L2, the compute ceiling)
//   SuperBlocks/Prefill/<dtype>/RxC/x256/threads:T  GFLOP/s (T = 1: per CPU second)
void register_super_blocks() {
  const int threads = hardware_threads();
  const std::string target = available_targets().front();
  const DType dtypes[] = {DType::kF16,  DType::kBF16, DType::kQ8_0, DType::kQ4_0, DType::kQ2_K,
                          DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS};
  const auto add = [](const std::string& name, const MatmulCase& c) {
    benchmark::RegisterBenchmark(name.c_str(), run_matmul, c)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  for (DType dtype : dtypes) {
    for (bool packed : {false, true}) {
      if (packed && !packed_matmul_supported(dtype)) continue;
      const std::string suffix = packed ? "/packed" : "";
      for (auto [rows, cols] : {std::pair<int64_t, int64_t>{4096, 4096}, {32000, 4096}}) {
        const MatmulCase c{target, dtype, rows, cols, 1, threads, packed};
        add("SuperBlocks/Decode/" + shape_name(c) + suffix, c);
      }
      // From L3 on one thread, in CPU time: the kernel's own speed, without DRAM or other load.
      const MatmulCase c{target, dtype, 4096, 4096, 1, 1, packed};
      benchmark::RegisterBenchmark(
          ("SuperBlocks/Decode/" + shape_name(c) + suffix + "/threads:1").c_str(), run_matmul, c)
          ->Unit(benchmark::kMillisecond);
      // From L2 on one thread (at most 1 MiB of weights): the kernel's compute ceiling, what it
      // would stream if memory were never the bound.
      const MatmulCase l2{target, dtype, 256, 2048, 1, 1, packed};
      benchmark::RegisterBenchmark(
          ("SuperBlocks/Decode/" + shape_name(l2) + suffix + "/threads:1").c_str(), run_matmul, l2)
          ->Unit(benchmark::kMicrosecond);
      // From DRAM on one thread: what one core's streams (the prefetchers, the misses it keeps in
      // flight) draw, apart from the compute.
      const MatmulCase dram{target, dtype, 32000, 4096, 1, 1, packed};
      add("SuperBlocks/Decode/" + shape_name(dram) + suffix + "/threads:1", dram);
    }
  }
  // Prefill also on one thread, timed in CPU time (less disturbed by other load on the machine).
  for (int num_threads : {threads, 1}) {
    for (DType dtype : dtypes) {
      for (bool packed : {false, true}) {
        if (packed && !packed_matmul_supported(dtype)) continue;
        const MatmulCase c{target, dtype, 4096, 4096, 256, num_threads, packed};
        const std::string name = "SuperBlocks/Prefill/" + shape_name(c) +
                                 (packed ? "/packed" : "") +
                                 "/x256/threads:" + std::to_string(num_threads);
        auto* bench = benchmark::RegisterBenchmark(name.c_str(), run_matmul, c)
                          ->Unit(benchmark::kMillisecond);
        if (num_threads > 1) bench->UseRealTime();
      }
    }
  }
  // Small batches (batched decode), one thread: where the VNNI tiles start to pay (Q4_0, Q5_1:
  // the 16-row group tiles of cpu/matmul_vnni_small_blocks.cc).
  for (DType dtype : {DType::kF16, DType::kQ4_0, DType::kQ5_1, DType::kQ4_K, DType::kQ6_K}) {
    for (bool packed : {false, true}) {
      if (packed && (dtype != DType::kF16 || !packed_matmul_supported(dtype))) continue;
      for (int64_t num_x : {2, 3, 4, 8, 16, 64}) {
        const MatmulCase c{target, dtype, 4096, 4096, num_x, 1, packed};
        benchmark::RegisterBenchmark(
            ("SuperBlocks/Batch/" + shape_name(c) + (packed ? "/packed" : "") + "/x" +
             std::to_string(num_x) + "/threads:1")
                .c_str(),
            run_matmul, c)
            ->Unit(benchmark::kMillisecond);
      }
    }
  }
}
const bool kSuperBlocksRegistered = (register_super_blocks(), true);

// One decode step's matmuls of the 2048-dim model of bench/decode_bandwidth.sh (8 layers of q, k,
// v, o, gate, up, down, then the 32000-row output), every matrix its own packed copy, one
// activation row, all threads: GB/s of weights streamed. Unlike one 32000x4096 matrix read over
// and over, this is what a model's decode reads (dozens of 1-23 MB matrices a step): it showed the
// K-quants' packed layouts drawing 65-78% of the read bandwidth where the kernels alone did not.
//   SuperBlocks/DecodeStep/<dtype>
void run_decode_step(benchmark::State& state, DType dtype) {
  if (!force_target_for_testing(available_targets().front())) {
    state.SkipWithError("target not available");
    return;
  }
  constexpr int64_t kDim = 2048, kKvRows = 512, kFfn = 5632, kVocab = 32000, kLayers = 8;
  const std::pair<int64_t, int64_t> layer_shapes[] = {
      {kDim, kDim}, {kKvRows, kDim}, {kKvRows, kDim}, {kDim, kDim},
      {kFfn, kDim}, {kFfn, kDim},    {kDim, kFfn}};
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (int64_t layer = 0; layer < kLayers; ++layer)
    shapes.insert(shapes.end(), std::begin(layer_shapes), std::end(layer_shapes));
  shapes.push_back({kVocab, kDim});
  std::vector<MatrixView> views;
  std::vector<PackedBytes> packed;  // one copy per matrix: each read from its own memory
  views.reserve(shapes.size());
  packed.reserve(shapes.size());
  double step_bytes = 0.0;
  for (auto [rows, cols] : shapes) {
    views.push_back(weights(dtype, rows, cols).view);
    if (packed_matmul_supported(dtype)) {
      packed.push_back(pack_for_matmul(views.back()));
      attach_packed(views.back(), packed.back());
    }
    step_bytes += static_cast<double>(row_bytes(dtype, cols)) * rows;
  }
  const std::vector<float> x = random_floats(kFfn, 99);
  std::vector<float> y(kVocab);
  ThreadPool& pool = pool_of(hardware_threads());
  for (auto _ : state) {
    for (const MatrixView& w : views) matmul(w, x.data(), 1, y.data(), pool);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(step_bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  force_target_for_testing("");
}

const bool kDecodeStepRegistered = [] {
  for (DType dtype : {DType::kF16, DType::kQ8_0, DType::kQ4_0, DType::kQ3_K, DType::kQ4_K,
                      DType::kQ5_K, DType::kQ6_K, DType::kIQ4_XS}) {
    benchmark::RegisterBenchmark(
        ("SuperBlocks/DecodeStep/" + std::string(to_string(dtype))).c_str(), run_decode_step, dtype)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  return true;
}();

// The ceiling of the packed prefill tiles (cpu/matmul_vnni*.cc): per 16 weight rows x 32
// columns x one activation row they issue 8 vpdpbusd, then an integer add, a conversion, a
// multiply (d_w x d_x) and an FMA. The same instructions in registers only, with enough
// independent chains that latency does not bound them, measure what the vector pipes allow:
// "tile" against "dpbusd" (the 8 vpdpbusd alone) shows what the float work costs beside them
// (on Zen 4 the multiply and the FMA each take a cycle of the pipes vpdpbusd runs on). GFLOP/s
// counts 2 x 512 multiply-adds per row and block, as the Prefill rows do.
#if defined(__x86_64__) && defined(__GNUC__)
#define SIEVE_CEILING_DPBUSD(acc) asm volatile("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(x))
__attribute__((target("avx512f,avx512vnni"))) void run_vnni_ceiling(benchmark::State& state,
                                                                    bool with_scales) {
  if (!__builtin_cpu_supports("avx512vnni")) {
    state.SkipWithError("no AVX-512 VNNI");
    return;
  }
  constexpr int64_t kRowBlocksPerRound = 2;
  constexpr int64_t kRounds = 1 << 16;
  __m512i a0 = _mm512_set1_epi32(1), a1 = a0, a2 = a0, a3 = a0;
  const __m512i u = _mm512_set1_epi32(3), x = _mm512_set1_epi32(5);
  __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
  const __m512 dw = _mm512_set1_ps(1.0f), dx = _mm512_set1_ps(0.5f);
  for (auto _ : state) {
    for (int64_t i = 0; i < kRounds; ++i) {
      // Two activation rows, each a block's 8 vpdpbusd in two chains (as the tiles' low and
      // high nibbles).
      for (int k = 0; k < 4; ++k) {
        SIEVE_CEILING_DPBUSD(a0);
        SIEVE_CEILING_DPBUSD(a1);
        SIEVE_CEILING_DPBUSD(a2);
        SIEVE_CEILING_DPBUSD(a3);
      }
      if (with_scales) {
        __m512i dot0, dot1;
        __m512 f0, f1, s0, s1;
        asm volatile("vpaddd %2, %1, %0" : "=v"(dot0) : "v"(a0), "v"(a1));
        asm volatile("vpaddd %2, %1, %0" : "=v"(dot1) : "v"(a2), "v"(a3));
        asm volatile("vcvtdq2ps %1, %0" : "=v"(f0) : "v"(dot0));
        asm volatile("vcvtdq2ps %1, %0" : "=v"(f1) : "v"(dot1));
        asm volatile("vmulps %2, %1, %0" : "=v"(s0) : "v"(dw), "v"(dx));
        asm volatile("vmulps %2, %1, %0" : "=v"(s1) : "v"(dw), "v"(dx));
        asm volatile("vfmadd231ps %2, %1, %0" : "+v"(acc0) : "v"(f0), "v"(s0));
        asm volatile("vfmadd231ps %2, %1, %0" : "+v"(acc1) : "v"(f1), "v"(s1));
      }
    }
  }
  benchmark::DoNotOptimize(acc0);
  benchmark::DoNotOptimize(acc1);
  benchmark::DoNotOptimize(a0);
  const double flops = 2.0 * 512 * kRowBlocksPerRound * kRounds;
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * static_cast<double>(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
}
#undef SIEVE_CEILING_DPBUSD
const bool kCeilingRegistered = [] {
  benchmark::RegisterBenchmark("Ceiling/Vnni/dpbusd",
                               [](benchmark::State& state) { run_vnni_ceiling(state, false); });
  benchmark::RegisterBenchmark("Ceiling/Vnni/tile",
                               [](benchmark::State& state) { run_vnni_ceiling(state, true); });
  return true;
}();
#endif

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
