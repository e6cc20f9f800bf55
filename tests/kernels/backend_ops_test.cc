// Every op of every backend against the reference backend, as llama.cpp's test-backend-ops does:
// random shapes from several seeds (odd row counts, padded strides, GQA groups, F32 and F16 KV,
// float and quantized weights), inputs uploaded through each backend's own memory calls,
// outputs downloaded and compared with a tolerance per op. Outputs are compared whole,
// padding included, so an op that writes outside its rows fails too.
//
// A new backend is one line in backend_cases(); a new op is a check function and a line in
// kOps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels_test_util.h"
#include "paged_kv_test_util.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace sieve::kernels {
namespace {

// --- the backends under test ---

struct BackendCase {
  std::string name;
  std::string target;  // the SIMD target forced while it runs; empty: none
  std::function<std::unique_ptr<Backend>(ThreadPool&)> make;
};

void PrintTo(const BackendCase& c, std::ostream* os) { *os << c.name; }  // names in ctest

std::vector<BackendCase> backend_cases() {
  std::vector<BackendCase> cases;
  for (const std::string& target : available_targets())
    cases.push_back(
        {"cpu_" + target, target, [](ThreadPool& pool) { return make_cpu_backend(pool); }});
  // The reference against itself: checks the harness and the reference's determinism.
  cases.push_back({"reference", "", [](ThreadPool&) { return make_reference_backend(); }});
  return cases;
}

// --- helpers: host <-> backend, random shapes, comparisons ---

template <typename T>
DeviceBuffer to_device(Backend& backend, const std::vector<T>& host) {
  DeviceBuffer buffer = backend.allocate(host.size() * sizeof(T));
  backend.upload(buffer.data(), host.data(), host.size() * sizeof(T));
  return buffer;
}

template <typename T>
std::vector<T> to_host(Backend& backend, const DeviceBuffer& buffer) {
  std::vector<T> host(buffer.bytes() / sizeof(T));
  backend.download(host.data(), buffer.data(), buffer.bytes());
  return host;
}

int64_t uniform(std::mt19937& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}
int64_t odd(std::mt19937& rng, int64_t lo, int64_t hi) { return uniform(rng, lo, hi) | 1; }
template <typename T>
T pick(std::mt19937& rng, std::initializer_list<T> values) {
  return *(values.begin() + uniform(rng, 0, static_cast<int64_t>(values.size()) - 1));
}
uint32_t next_seed(std::mt19937& rng) { return static_cast<uint32_t>(rng()); }

// got[i] within tolerance(i) of want[i] for every i; NaN only where want has NaN.
void expect_near(std::span<const float> got, std::span<const float> want,
                 const std::function<double(size_t)>& tolerance, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    if (!(std::fabs(static_cast<double>(got[i]) - want[i]) <= tolerance(i))) {
      FAIL() << what << ": element " << i << " is " << got[i] << ", reference " << want[i]
             << " (tolerance " << tolerance(i) << ")";
    }
  }
}
// Within abs + rel * |want|.
void expect_near(std::span<const float> got, std::span<const float> want, double abs, double rel,
                 const std::string& what) {
  expect_near(
      got, want, [&](size_t i) { return abs + rel * std::fabs(want[i]); }, what);
}

// The K/V of a TestCache copied into a backend's memory; view() reads it there.
class DeviceKv {
 public:
  DeviceKv(Backend& backend, const TestCache& cache) : view_(cache.view()) {
    if (is_block_kv_dtype(view_.dtype)) {
      k_ = backend.allocate(cache.num_bytes());
      v_ = backend.allocate(cache.num_bytes());
      backend.upload(k_.data(), view_.k_q, cache.num_bytes());
      backend.upload(v_.data(), view_.v_q, cache.num_bytes());
      view_.k_q = k_.data();
      view_.v_q = v_.data();
      return;
    }
    const bool f16 = view_.dtype == DType::kF16;
    const size_t bytes = cache.num_elements() * (f16 ? sizeof(uint16_t) : sizeof(float));
    k_ = backend.allocate(bytes);
    v_ = backend.allocate(bytes);
    backend.upload(k_.data(), f16 ? static_cast<const void*>(view_.k_f16) : view_.k, bytes);
    backend.upload(v_.data(), f16 ? static_cast<const void*>(view_.v_f16) : view_.v, bytes);
    if (f16) {
      view_.k_f16 = k_.as<const uint16_t>();
      view_.v_f16 = v_.as<const uint16_t>();
    } else {
      view_.k = k_.as<const float>();
      view_.v = v_.as<const float>();
    }
  }
  const PagedKv& view() const { return view_; }

 private:
  DeviceBuffer k_, v_;
  PagedKv view_;
};

CacheShape random_cache_shape(std::mt19937& rng, int64_t min_keys = 1) {
  CacheShape shape;
  shape.num_keys = uniform(rng, min_keys, 300);
  shape.num_kv_heads = pick<int64_t>(rng, {1, 2, 3});
  shape.dtype = pick(rng, {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_1});
  shape.head_dim = is_block_kv_dtype(shape.dtype) ? pick<int64_t>(rng, {32, 64, 128})
                                                  : pick<int64_t>(rng, {8, 64, 72, 128});
  shape.page_size = pick<int32_t>(rng, {1, 5, 16, 32});
  return shape;
}

std::string describe(const CacheShape& s, int64_t group, int64_t num_q) {
  return "keys=" + std::to_string(s.num_keys) + " kv_heads=" + std::to_string(s.num_kv_heads) +
         " head_dim=" + std::to_string(s.head_dim) + " page_size=" + std::to_string(s.page_size) +
         " " + std::string(to_string(s.dtype)) + " group=" + std::to_string(group) +
         " rows=" + std::to_string(num_q);
}

// Weight types for matmul and get_rows: the float ones, block quants, K-quants.
constexpr DType kWeightTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                                  DType::kQ4_0, DType::kQ4_K, DType::kQ6_K};

// --- one check per op: runs it on `tested` and `ref` with the same inputs, compares ---

using OpCheck = void (*)(Backend& tested, Backend& ref, std::mt19937& rng);

void check_memory(Backend& tested, Backend&, std::mt19937& rng) {
  const int64_t n = uniform(rng, 1, 5000);
  DeviceBuffer a = tested.allocate(n * sizeof(float));
  ASSERT_EQ(a.bytes(), n * sizeof(float));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u) << "not 64-byte aligned";
  EXPECT_EQ(to_host<float>(tested, a), std::vector<float>(n, 0.0f)) << "not zero-filled";
  const std::vector<float> values = random_floats(n, next_seed(rng));
  tested.upload(a.data(), values.data(), n * sizeof(float));
  DeviceBuffer b = tested.allocate(n * sizeof(float));
  const int64_t offset = uniform(rng, 0, n - 1);  // copy a's tail to b's head
  tested.copy(b.data(), a.as<float>() + offset, (n - offset) * sizeof(float));
  const int64_t zero_begin = uniform(rng, 0, n - 1);
  tested.fill_zero(a.as<float>() + zero_begin, (n - zero_begin) * sizeof(float));
  std::vector<float> want_a = values, want_b(n, 0.0f);
  std::copy(values.begin() + offset, values.end(), want_b.begin());
  std::fill(want_a.begin() + zero_begin, want_a.end(), 0.0f);
  EXPECT_EQ(to_host<float>(tested, a), want_a);
  EXPECT_EQ(to_host<float>(tested, b), want_b);
  DeviceBuffer moved = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(moved.bytes(), n * sizeof(float));
}

void check_get_rows(Backend& tested, Backend& ref, std::mt19937& rng) {
  const DType dtype = kWeightTypes[uniform(rng, 0, std::size(kWeightTypes) - 1)];
  const int64_t rows = uniform(rng, 3, 40), cols = 256 * pick<int64_t>(rng, {1, 2, 16});
  const TestMatrix table(dtype, rows, cols, next_seed(rng));
  std::vector<int32_t> ids(odd(rng, 1, 41));
  for (int32_t& id : ids) id = static_cast<int32_t>(uniform(rng, 0, rows - 1));
  // A table prepared for matmul() too (a tied embedding), or for get_rows() only.
  const auto run = [&](Backend& b, bool lookup_only) {
    DeviceBuffer out = b.allocate(ids.size() * cols * sizeof(float));
    b.get_rows(lookup_only ? b.prepare_lookup_table(table.view)
                           : b.prepare_weights(table.view, Backend::WeightSource::kHostMemory),
               ids, out.as<float>());
    return to_host<float>(b, out);
  };
  for (const bool lookup_only : {false, true}) {
    expect_near(run(tested, lookup_only), run(ref, lookup_only), 0.0, 1e-6,
                std::string(to_string(dtype)));
  }
}

void check_matmul(Backend& tested, Backend& ref, std::mt19937& rng) {
  const DType dtype = kWeightTypes[uniform(rng, 0, std::size(kWeightTypes) - 1)];
  const int64_t rows = odd(rng, 1, 67), cols = 256 * uniform(rng, 1, 2);
  const int64_t num_x = pick<int64_t>(rng, {1, 2, 3, 5, 17});
  const TestMatrix w(dtype, rows, cols, next_seed(rng));
  const std::vector<float> x = random_floats(num_x * cols, next_seed(rng));
  const auto run = [&](Backend& b) {
    const DeviceBuffer x_dev = to_device(b, x);
    DeviceBuffer y = b.allocate(num_x * rows * sizeof(float));
    b.matmul(b.prepare_weights(w.view, Backend::WeightSource::kHostMemory), x_dev.as<const float>(),
             num_x, y.as<float>());
    return to_host<float>(b, y);
  };
  // The rounding a correct kernel may make scales with sum_c |w[r][c] * x[i][c]|.
  std::vector<double> magnitudes(num_x * rows);
  std::vector<float> w_row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(dtype, static_cast<const uint8_t*>(w.view.data) + r * row_bytes(dtype, cols),
                   w_row.data(), cols);
    for (int64_t i = 0; i < num_x; ++i) {
      for (int64_t c = 0; c < cols; ++c)
        magnitudes[i * rows + r] += std::fabs(static_cast<double>(w_row[c]) * x[i * cols + c]);
    }
  }
  expect_near(
      run(tested), run(ref), [&](size_t k) { return 2e-5 * magnitudes[k] + 1e-6; },
      std::string(to_string(dtype)) + " rows=" + std::to_string(rows) +
          " cols=" + std::to_string(cols) + " num_x=" + std::to_string(num_x));
}

void check_rmsnorm(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t num_rows = odd(rng, 1, 41), n = pick<int64_t>(rng, {1, 7, 64, 129, 4096});
  const float eps = pick(rng, {1e-5f, 1e-6f});
  const std::vector<float> x = random_floats(num_rows * n, next_seed(rng), -3.0f, 3.0f);
  const std::vector<float> weight = random_floats(n, next_seed(rng), 0.5f, 1.5f);
  for (const bool in_place : {false, true}) {
    const auto run = [&](Backend& b) {
      const DeviceBuffer w_dev = to_device(b, weight);
      DeviceBuffer x_dev = to_device(b, x);
      DeviceBuffer out = in_place ? DeviceBuffer() : b.allocate(x.size() * sizeof(float));
      float* out_ptr = in_place ? x_dev.as<float>() : out.as<float>();
      b.rmsnorm(x_dev.as<const float>(), w_dev.as<const float>(), eps, out_ptr, num_rows, n);
      return to_host<float>(b, in_place ? x_dev : out);
    };
    expect_near(run(tested), run(ref), 1e-6, 1e-5,
                "rows=" + std::to_string(num_rows) + " n=" + std::to_string(n) +
                    (in_place ? " in place" : ""));
  }
}

void check_add(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t n = pick<int64_t>(rng, {1, 17, 1000, 70001});
  const std::vector<float> x = random_floats(n, next_seed(rng)),
                           y = random_floats(n, next_seed(rng));
  const auto run = [&](Backend& b) {
    const DeviceBuffer x_dev = to_device(b, x);
    DeviceBuffer y_dev = to_device(b, y);
    b.add(x_dev.as<const float>(), y_dev.as<float>(), n);
    return to_host<float>(b, y_dev);
  };
  expect_near(run(tested), run(ref), 0.0, 1e-7, "n=" + std::to_string(n));
}

void check_add_bias(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t num_rows = odd(rng, 1, 41), n = uniform(rng, 1, pick<int64_t>(rng, {600, 4096}));
  const int64_t stride = n + uniform(rng, 0, 5);
  const std::vector<float> x = random_floats(num_rows * stride, next_seed(rng)),
                           bias = random_floats(n, next_seed(rng));
  const auto run = [&](Backend& b) {
    const DeviceBuffer bias_dev = to_device(b, bias);
    DeviceBuffer x_dev = to_device(b, x);
    b.add_bias(bias_dev.as<const float>(), {x_dev.as<float>(), stride}, num_rows, n);
    return to_host<float>(b, x_dev);
  };
  expect_near(run(tested), run(ref), 0.0, 1e-7,
              "rows=" + std::to_string(num_rows) + " n=" + std::to_string(n));
}

// Gate and up side by side in rows of a fused output ([gate | up | padding]), as the fused
// gate-up matmul writes them; the result in place over gate or in rows of its own.
void check_silu_mul(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t num_rows = odd(rng, 1, 41), n = pick<int64_t>(rng, {1, 9, 64, 1000, 2048});
  const int64_t stride = 2 * n + uniform(rng, 0, 3);
  const std::vector<float> fused = random_floats(num_rows * stride, next_seed(rng), -12.0f, 12.0f);
  for (const bool in_place : {false, true}) {
    const auto run = [&](Backend& b) {
      DeviceBuffer fused_dev = to_device(b, fused);
      DeviceBuffer out = in_place ? DeviceBuffer() : b.allocate(num_rows * n * sizeof(float));
      const Rows<float> gate{fused_dev.as<float>(), stride};
      const Rows<const float> up{fused_dev.as<const float>() + n, stride};
      b.silu_mul(gate, up, in_place ? gate : Rows<float>{out.as<float>(), n}, num_rows, n);
      return to_host<float>(b, in_place ? fused_dev : out);
    };
    expect_near(run(tested), run(ref), 1e-6, 1e-5,
                "rows=" + std::to_string(num_rows) + " n=" + std::to_string(n) +
                    (in_place ? " in place" : ""));
  }
}

// A fused QKV output's split, or one GQA group's query heads gathered out of the q rows.
void check_copy_rows_2d(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t num_rows = odd(rng, 1, 41), n = uniform(rng, 1, pick<int64_t>(rng, {300, 2048}));
  const int64_t src_stride = n + uniform(rng, 0, 200), dst_stride = n + uniform(rng, 0, 3);
  const int64_t src_offset = src_stride - n;  // the last n floats of each source row
  const std::vector<float> src = random_floats(num_rows * src_stride, next_seed(rng));
  const std::vector<float> dst = random_floats(num_rows * dst_stride, next_seed(rng));
  const auto run = [&](Backend& b) {
    const DeviceBuffer src_dev = to_device(b, src);
    DeviceBuffer dst_dev = to_device(b, dst);
    b.copy_rows_2d({src_dev.as<const float>() + src_offset, src_stride},
                   {dst_dev.as<float>(), dst_stride}, num_rows, n);
    return to_host<float>(b, dst_dev);
  };
  expect_near(run(tested), run(ref), 0.0, 0.0,
              "rows=" + std::to_string(num_rows) + " n=" + std::to_string(n));
}

void check_gather_rows(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t num_src = uniform(rng, 1, 40), n = uniform(rng, 1, pick<int64_t>(rng, {600, 4096}));
  const int64_t src_stride = n + uniform(rng, 0, 3);
  std::vector<int32_t> ids(odd(rng, 1, 19));
  for (int32_t& id : ids) id = static_cast<int32_t>(uniform(rng, 0, num_src - 1));
  const std::vector<float> src = random_floats(num_src * src_stride, next_seed(rng));
  const auto run = [&](Backend& b) {
    const DeviceBuffer src_dev = to_device(b, src);
    DeviceBuffer dst = b.allocate(ids.size() * n * sizeof(float));
    b.gather_rows({src_dev.as<const float>(), src_stride}, ids, {dst.as<float>(), n}, n);
    return to_host<float>(b, dst);
  };
  expect_near(run(tested), run(ref), 0.0, 0.0, "n=" + std::to_string(n));
}

void check_rope(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t head_dim = pick<int64_t>(rng, {8, 64, 80, 128});
  const int64_t num_heads = pick<int64_t>(rng, {1, 4, 7}), num_rows = odd(rng, 1, 65);
  const int64_t stride = num_heads * head_dim + uniform(rng, 0, 5);
  RopeParams params{.ordering = pick(rng, {RopeOrdering::kNormal, RopeOrdering::kNeox}),
                    .head_dim = head_dim,
                    .num_dims = pick<int64_t>(rng, {head_dim, head_dim / 2}),
                    .freq_base = pick(rng, {10000.0f, 1e6f})};
  std::vector<float> freq_factors;
  if (uniform(rng, 0, 1)) {
    freq_factors = random_floats(params.num_dims / 2, next_seed(rng), 1.0f, 8.0f);
    params.freq_factors = freq_factors;
  }
  if (uniform(rng, 0, 1)) {  // YaRN
    params.freq_scale = 0.25f;
    params.yarn = {.ext_factor = 1.0f, .original_context = 4096};
  }
  std::vector<int32_t> positions(num_rows);
  for (int32_t& p : positions) p = static_cast<int32_t>(uniform(rng, 0, 5000));
  const std::vector<float> x = random_floats(num_rows * stride, next_seed(rng));
  const auto run = [&](Backend& b) {
    DeviceBuffer x_dev = to_device(b, x);
    b.rope(params, positions, {x_dev.as<float>(), stride}, num_heads);
    return to_host<float>(b, x_dev);
  };
  expect_near(run(tested), run(ref), 1e-5, 1e-5,
              "head_dim=" + std::to_string(head_dim) + " dims=" + std::to_string(params.num_dims));
}

// K rows of several tokens and KV heads into scattered slots of F32, F16, Q8_0 or Q4_1 storage.
void check_store_kv_rows(Backend& tested, Backend& ref, std::mt19937& rng) {
  const DType dtype = pick(rng, {DType::kF32, DType::kF16, DType::kQ8_0, DType::kQ4_1});
  const int64_t head_dim = is_block_kv_dtype(dtype) ? pick<int64_t>(rng, {32, 64, 128})
                                                    : pick<int64_t>(rng, {8, 64, 72, 128});
  const int64_t num_rows = odd(rng, 1, pick<int64_t>(rng, {19, 301}));
  const int64_t num_slots = num_rows + uniform(rng, 0, 200);
  const int64_t src_stride = head_dim + uniform(rng, 0, 3);
  std::vector<int64_t> slots(num_slots);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  std::vector<int64_t> offsets(num_rows);
  for (int64_t r = 0; r < num_rows; ++r) offsets[r] = slots[r] * head_dim;
  const std::vector<float> src = random_floats(num_rows * src_stride, next_seed(rng));
  const size_t storage_bytes = row_bytes(dtype, num_slots * head_dim);
  const auto run = [&](Backend& b) {
    const DeviceBuffer src_dev = to_device(b, src);
    DeviceBuffer storage = b.allocate(storage_bytes);
    b.store_kv_rows({src_dev.as<const float>(), src_stride}, head_dim, dtype, storage.data(),
                    offsets);
    return to_host<uint8_t>(b, storage);
  };
  // Bitwise; the reference against the rows converted here.
  std::vector<uint8_t> want(storage_bytes, 0);
  if (is_block_kv_dtype(dtype)) {  // each row's own blocks, at byte row_bytes(dtype, offset)
    for (int64_t r = 0; r < num_rows; ++r)
      quantize_row(dtype, &src[r * src_stride], &want[row_bytes(dtype, offsets[r])], head_dim);
    EXPECT_EQ(run(ref), want) << to_string(dtype) << " head_dim=" << head_dim << ": reference";
    EXPECT_EQ(run(tested), want) << to_string(dtype) << " head_dim=" << head_dim;
    return;
  }
  const size_t element_bytes = dtype == DType::kF16 ? 2 : 4;
  for (int64_t r = 0; r < num_rows; ++r) {
    for (int64_t d = 0; d < head_dim; ++d) {
      const float value = src[r * src_stride + d];
      const uint16_t half = f32_to_f16(value);
      std::memcpy(&want[(offsets[r] + d) * element_bytes],
                  dtype == DType::kF16 ? static_cast<const void*>(&half) : &value, element_bytes);
    }
  }
  EXPECT_EQ(run(ref), want) << to_string(dtype) << " head_dim=" << head_dim << ": reference";
  EXPECT_EQ(run(tested), want) << to_string(dtype) << " head_dim=" << head_dim;
}

// Random queries for a cache: the last num_q positions (a prefill chunk, or one decode row),
// sometimes with a sliding window. key_offset: the oldest keys dropped, for callers that set it
// on their view (the queries' positions leave room for it).
struct RandomAttention {
  std::vector<float> q;
  std::vector<int32_t> positions;
  int64_t num_heads = 0;
  std::optional<int32_t> window;
  int32_t key_offset = 0;

  RandomAttention(const CacheShape& shape, int64_t group, int64_t max_rows, std::mt19937& rng) {
    if (shape.num_keys > 3 && uniform(rng, 0, 3) == 0)
      key_offset = static_cast<int32_t>(uniform(rng, 1, 3));
    const int64_t num_keys = shape.num_keys - key_offset;
    const int64_t num_q = uniform(rng, 1, std::min(num_keys, max_rows));
    positions = position_range(num_keys - num_q, num_keys);
    num_heads = shape.num_kv_heads * group;
    if (uniform(rng, 0, 3) == 0) window = static_cast<int32_t>(uniform(rng, 1, 64));
    q = random_floats(num_q * num_heads * shape.head_dim, next_seed(rng));
  }
  int64_t num_q() const { return std::ssize(positions); }
  // The query, reading q at `q_dev`.
  AttentionQuery on(const float* q_dev, int64_t head_dim) const {
    return {.q = q_dev,
            .positions = positions,
            .num_heads = num_heads,
            .scale = 1.0f / std::sqrt(static_cast<float>(head_dim)),
            .window = window};
  }
};

// out, row_max and row_lse of one attention, in one buffer of a backend.
struct DeviceAttentionOutput {
  DeviceBuffer buffer;
  AttentionOutput view;
  DeviceAttentionOutput(Backend& b, int64_t num_q, int64_t num_heads, int64_t head_dim)
      : buffer(b.allocate(num_q * num_heads * (head_dim + 2) * sizeof(float))) {
    float* p = buffer.as<float>();
    view = {.out = p,
            .row_max = p + num_q * num_heads * head_dim,
            .row_lse = p + num_q * num_heads * (head_dim + 1)};
  }
};

// out within 1e-5 (V is in [-1, 1], outputs are averages of it); row max and lse (the tail of
// the buffer) within 1e-5 * (1 + |value|).
void expect_attention_near(std::span<const float> got, std::span<const float> want,
                           const std::string& what) {
  expect_near(got, want, 1e-5, 1e-5, what);
}

void check_paged_attention(Backend& tested, Backend& ref, std::mt19937& rng) {
  const CacheShape shape = random_cache_shape(rng);
  const int64_t group = pick<int64_t>(rng, {1, 2, 4, 7});
  const TestCache cache(shape, next_seed(rng));
  const RandomAttention a(shape, group, 40, rng);
  const auto run = [&](Backend& b) {
    const DeviceKv kv(b, cache);
    PagedKv view = kv.view();
    view.key_offset = a.key_offset;
    const DeviceBuffer q = to_device(b, a.q);
    DeviceAttentionOutput out(b, a.num_q(), a.num_heads, shape.head_dim);
    b.paged_attention(view, a.on(q.as<const float>(), shape.head_dim), out.view);
    return to_host<float>(b, out.buffer);
  };
  expect_attention_near(run(tested), run(ref), describe(shape, group, a.num_q()));
}

// Many jobs at once, short (decode rows) and long (chunks), some with observation scores:
// the backend chooses how to spread them, the results must not depend on it.
void check_paged_attention_batch(Backend& tested, Backend& ref, std::mt19937& rng) {
  struct Job {
    CacheShape shape;
    int64_t group;
    std::unique_ptr<TestCache> cache;
    std::unique_ptr<RandomAttention> attention;
    bool observe;
  };
  std::vector<Job> jobs(uniform(rng, 1, 12));
  for (Job& job : jobs) {
    job.shape = random_cache_shape(rng);
    job.group = pick<int64_t>(rng, {1, 4});
    job.cache = std::make_unique<TestCache>(job.shape, next_seed(rng));
    job.attention =
        std::make_unique<RandomAttention>(job.shape, job.group, uniform(rng, 0, 2) ? 1 : 20, rng);
    job.observe = uniform(rng, 0, 2) == 0;
  }
  const auto run = [&](Backend& b) {
    std::vector<DeviceKv> kvs;
    std::vector<DeviceBuffer> qs;
    std::vector<DeviceAttentionOutput> outs;
    std::vector<DeviceBuffer> scores;
    std::vector<ObservationOutput> observations(jobs.size());
    std::vector<AttentionJob> batch;
    kvs.reserve(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) {
      const Job& job = jobs[i];
      const int64_t num_keys = job.attention->positions.back() + 1;
      kvs.emplace_back(b, *job.cache);
      qs.push_back(to_device(b, job.attention->q));
      outs.emplace_back(b, job.attention->num_q(), job.attention->num_heads, job.shape.head_dim);
      scores.push_back(b.allocate(job.shape.num_kv_heads * num_keys * sizeof(float)));
      observations[i] = {.num_keys = num_keys, .scores = scores.back().as<float>()};
      batch.push_back({.kv = kvs.back().view(),
                       .query = job.attention->on(qs.back().as<const float>(), job.shape.head_dim),
                       .out = outs.back().view,
                       .observations = std::span<const ObservationOutput>(&observations[i],
                                                                          job.observe ? 1 : 0)});
    }
    b.paged_attention_batch(batch);
    std::vector<std::vector<float>> results;
    for (size_t i = 0; i < jobs.size(); ++i) {
      results.push_back(to_host<float>(b, outs[i].buffer));
      results.push_back(to_host<float>(b, scores[i]));
    }
    return results;
  };
  const std::vector<std::vector<float>> got = run(tested), want = run(ref);
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string what = "job " + std::to_string(i) + " of " + std::to_string(jobs.size()) +
                             ": " +
                             describe(jobs[i].shape, jobs[i].group, jobs[i].attention->num_q());
    expect_attention_near(got[2 * i], want[2 * i], what);
    expect_near(got[2 * i + 1], want[2 * i + 1], 1e-5, 1e-5, what + " scores");
  }
}

void check_observation_scores(Backend& tested, Backend& ref, std::mt19937& rng) {
  const CacheShape shape = random_cache_shape(rng);
  const int64_t group = pick<int64_t>(rng, {1, 2, 4});
  const TestCache cache(shape, next_seed(rng));
  const RandomAttention a(shape, group, 8, rng);  // the observation window: the last α rows
  const int64_t num_keys = a.positions.back() + 1;
  // Both backends get the reference's log-sum-exp of the window rows.
  std::vector<float> lse;
  {
    const DeviceKv kv(ref, cache);
    const DeviceBuffer q = to_device(ref, a.q);
    DeviceAttentionOutput out(ref, a.num_q(), a.num_heads, shape.head_dim);
    ref.paged_attention(kv.view(), a.on(q.as<const float>(), shape.head_dim), out.view);
    const std::vector<float> all = to_host<float>(ref, out.buffer);
    lse.assign(all.end() - a.num_q() * a.num_heads, all.end());
  }
  const auto run = [&](Backend& b) {
    const DeviceKv kv(b, cache);
    const DeviceBuffer q = to_device(b, a.q), lse_dev = to_device(b, lse);
    DeviceBuffer scores = b.allocate(shape.num_kv_heads * num_keys * sizeof(float));
    b.observation_scores(kv.view(), a.on(q.as<const float>(), shape.head_dim),
                         lse_dev.as<const float>(), num_keys, scores.as<float>());
    return to_host<float>(b, scores);
  };
  expect_near(run(tested), run(ref), 1e-5, 1e-5, describe(shape, group, a.num_q()));
}

// One page's summary into a pool of summaries indexed by page id, or (one kv head) into a
// caller's buffer with page_stride 0.
void check_summarize_page_keys(Backend& tested, Backend& ref, std::mt19937& rng) {
  const CacheShape shape = random_cache_shape(rng);
  const TestCache cache(shape, next_seed(rng));
  const PagedKv host_view = cache.view();
  const int64_t num_blocks = (shape.num_keys + shape.page_size - 1) / shape.page_size;
  const int64_t block = uniform(rng, 0, num_blocks - 1);
  const int64_t num_filled =
      uniform(rng, 1, std::min<int64_t>(shape.page_size, shape.num_keys - block * shape.page_size));
  const bool shared = shape.num_kv_heads == 1 && uniform(rng, 0, 1);
  const int64_t page_stride = shared ? 0 : shape.num_kv_heads * 2 * shape.head_dim + 3;
  const int64_t max_page =
      *std::max_element(host_view.block_table.begin(), host_view.block_table.end());
  const int64_t floats = shared ? 2 * shape.head_dim : (max_page + 1) * page_stride;
  const auto run = [&](Backend& b) {
    const DeviceKv kv(b, cache);
    DeviceBuffer summaries = b.allocate(floats * sizeof(float));
    b.summarize_page_keys(kv.view(), block, num_filled,
                          {.data = summaries.as<float>(), .page_stride = page_stride});
    return to_host<float>(b, summaries);
  };
  expect_near(run(tested), run(ref), 0.0, 0.0, describe(shape, 1, num_filled));
}

void check_page_upper_bounds_of(Backend& tested, Backend& ref, std::mt19937& rng,
                                const CacheShape& shape, int64_t group) {
  const TestCache cache(shape, next_seed(rng));
  const int64_t num_blocks = shape.num_keys / shape.page_size;  // the full ones
  const int64_t page_stride = shape.num_kv_heads * 2 * shape.head_dim;
  const int64_t max_page =
      *std::max_element(cache.view().block_table.begin(), cache.view().block_table.end());
  // The reference's summaries, given to both.
  std::vector<float> summaries((max_page + 1) * page_stride, 0.0f);
  for (int64_t b = 0; b < num_blocks; ++b) {
    ref::summarize_page_keys(cache.view(), b, shape.page_size,
                             {.data = summaries.data(), .page_stride = page_stride});
  }
  const std::vector<float> q =
      random_floats(shape.num_kv_heads * group * shape.head_dim, next_seed(rng));
  const auto run = [&](Backend& b) {
    const DeviceKv kv(b, cache);
    const DeviceBuffer q_dev = to_device(b, q), summaries_dev = to_device(b, summaries);
    DeviceBuffer bounds = b.allocate(shape.num_kv_heads * num_blocks * sizeof(float));
    b.page_upper_bounds(kv.view(), {.data = summaries_dev.as<float>(), .page_stride = page_stride},
                        q_dev.as<const float>(), shape.num_kv_heads * group, num_blocks,
                        bounds.as<float>());
    return to_host<float>(b, bounds);
  };
  expect_near(run(tested), run(ref), 1e-4, 1e-4, describe(shape, group, 1));
}

void check_page_upper_bounds(Backend& tested, Backend& ref, std::mt19937& rng) {
  check_page_upper_bounds_of(tested, ref, rng, random_cache_shape(rng, 32),
                             pick<int64_t>(rng, {1, 2, 4}));
  // One KV head with many blocks (a Quest stream at a long context): the CPU backend splits
  // the blocks over its threads.
  CacheShape long_stream = random_cache_shape(rng, 32);
  long_stream.num_kv_heads = 1;
  long_stream.num_keys = 4096;
  long_stream.page_size = 16;
  long_stream.head_dim = 64;
  check_page_upper_bounds_of(tested, ref, rng, long_stream, pick<int64_t>(rng, {2, 4}));
}

// Heads of rows with a padded stride rotated in place (the padding must stay as it is).
void check_rotate_heads(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t head_dim = pick<int64_t>(rng, {1, 2, 8, 32, 64, 128, 256});
  const int64_t num_heads = pick<int64_t>(rng, {1, 4, 7}), num_rows = odd(rng, 1, 65);
  const int64_t stride = num_heads * head_dim + uniform(rng, 0, 5);
  const std::vector<float> x = random_floats(num_rows * stride, next_seed(rng));
  const auto run = [&](Backend& b) {
    DeviceBuffer x_dev = to_device(b, x);
    b.rotate_heads({x_dev.as<float>(), stride}, num_rows, num_heads, head_dim);
    return to_host<float>(b, x_dev);
  };
  expect_near(run(tested), run(ref), 1e-5, 1e-5, "head_dim=" + std::to_string(head_dim));
}

void check_scale_columns(Backend& tested, Backend& ref, std::mt19937& rng) {
  const int64_t num_rows = odd(rng, 1, 41), n = uniform(rng, 1, pick<int64_t>(rng, {600, 4096}));
  const int64_t stride = n + uniform(rng, 0, 5);
  const std::vector<float> x = random_floats(num_rows * stride, next_seed(rng)),
                           scale = random_floats(n, next_seed(rng));
  const auto run = [&](Backend& b) {
    const DeviceBuffer scale_dev = to_device(b, scale);
    DeviceBuffer x_dev = to_device(b, x);
    b.scale_columns(scale_dev.as<const float>(), {x_dev.as<float>(), stride}, num_rows, n);
    return to_host<float>(b, x_dev);
  };
  expect_near(run(tested), run(ref), 0.0, 0.0,
              "rows=" + std::to_string(num_rows) + " n=" + std::to_string(n));
}

struct OpCase {
  const char* name;
  OpCheck check;
};
// Every Backend call, in the order of backend.h.
constexpr OpCase kOps[] = {
    {"memory", check_memory},  // allocate, upload, download, copy, fill_zero
    {"get_rows", check_get_rows},
    {"matmul", check_matmul},  // with prepare_weights, as get_rows
    {"rmsnorm", check_rmsnorm},
    {"add", check_add},
    {"add_bias", check_add_bias},
    {"silu_mul", check_silu_mul},
    {"copy_rows_2d", check_copy_rows_2d},
    {"gather_rows", check_gather_rows},
    {"rope", check_rope},
    {"store_kv_rows", check_store_kv_rows},
    {"paged_attention", check_paged_attention},
    {"paged_attention_batch", check_paged_attention_batch},
    {"observation_scores", check_observation_scores},
    {"summarize_page_keys", check_summarize_page_keys},
    {"page_upper_bounds", check_page_upper_bounds},
    {"rotate_heads", check_rotate_heads},
    {"scale_columns", check_scale_columns},
};
constexpr uint32_t kNumSeeds = 10;

class BackendOps : public ::testing::TestWithParam<BackendCase> {
 protected:
  void TearDown() override { force_target_for_testing(""); }
};

TEST_P(BackendOps, EveryOpMatchesReference) {
  const BackendCase& c = GetParam();
  if (!c.target.empty()) {
    ASSERT_TRUE(force_target_for_testing(c.target));
  }
  ThreadPool pool(3);  // more threads than cores is fine: the splits are what is tested
  const std::unique_ptr<Backend> tested = c.make(pool);
  const std::unique_ptr<Backend> ref = make_reference_backend();
  for (const OpCase& op : kOps) {
    for (uint32_t seed = 1; seed <= kNumSeeds; ++seed) {
      SCOPED_TRACE(std::string(op.name) + " seed " + std::to_string(seed));
      std::mt19937 rng(seed);
      op.check(*tested, *ref, rng);
      if (HasFatalFailure()) return;
    }
  }
}

// KV storage a backend cannot write is a user-facing error (the KV dtype is a server option):
// dtypes other than F32 / F16 / Q8_0 / Q4_1, and block dtypes with a head_dim that is not a
// multiple of 32.
TEST(BackendKvStorage, UnsupportedDtypesAndHeadDimsFailWithAMessage) {
  ThreadPool pool(1);
  for (const std::unique_ptr<Backend>& b : {make_cpu_backend(pool), make_reference_backend()}) {
    std::vector<float> row(72, 1.0f);
    std::vector<uint8_t> storage(1024);
    const std::vector<int64_t> offsets = {0};
    const auto store = [&](DType dtype, int64_t head_dim) {
      b->store_kv_rows({row.data(), head_dim}, head_dim, dtype, storage.data(), offsets);
    };
    EXPECT_THROW(store(DType::kQ8_0, 72), Error) << b->name();
    EXPECT_THROW(store(DType::kQ4_1, 8), Error) << b->name();
    EXPECT_THROW(store(DType::kQ4_0, 64), Error) << b->name();
    EXPECT_NO_THROW(store(DType::kQ4_1, 64)) << b->name();
  }
}

INSTANTIATE_TEST_SUITE_P(AllBackends, BackendOps, ::testing::ValuesIn(backend_cases()),
                         [](const ::testing::TestParamInfo<BackendCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace sieve::kernels
