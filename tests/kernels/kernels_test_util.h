#pragma once
// Shared helpers for the kernel tests: random data, weight matrices in any dtype, and a
// fixture that runs a test once per SIMD target compiled in and supported by this CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/pack.h"
#include "kernels/ops.h"
#include "util/thread_pool.h"

namespace sieve::kernels {

inline std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

// A [rows][cols] weight matrix quantized from random floats; owns its bytes.
struct TestMatrix {
  std::vector<uint8_t> bytes;
  MatrixView view;

  TestMatrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed)
      : bytes(row_bytes(dtype, cols) * static_cast<size_t>(rows)) {
    const std::vector<float> values = random_floats(rows * cols, seed);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(dtype, values.data() + r * cols, bytes.data() + r * row_bytes(dtype, cols),
                   cols);
    }
    view = MatrixView{dtype, bytes.data(), rows, cols};
  }
};

// magnitude[i][r] of matmul's output (x row i, weight row r): the scale of the rounding error a
// correct kernel may make; each weight format's test says how it is computed.
using MagnitudesFn = std::vector<double> (*)(const MatrixView& w, const float* x, int64_t num_x);

// Runs matmul and ref::matmul on random x (from seed) and compares every output within
// tolerance times its magnitude; also checks nothing is written past y[num_x * rows).
inline void expect_matmul_matches_ref(const MatrixView& w, int64_t num_x, ThreadPool& pool,
                                      uint32_t seed, MagnitudesFn magnitudes,
                                      double tolerance = 1e-5) {
  const std::vector<float> x = random_floats(num_x * w.cols, seed);
  constexpr float kSentinel = 12345.0f;
  std::vector<float> y(num_x * w.rows + 1, kSentinel), y_ref(num_x * w.rows, kSentinel);
  matmul(w, x.data(), num_x, y.data(), pool);
  ref::matmul(w, x.data(), num_x, y_ref.data());
  const std::vector<double> mags = magnitudes(w, x.data(), num_x);
  for (int64_t k = 0; k < num_x * w.rows; ++k) {
    ASSERT_NEAR(y[k], y_ref[k], tolerance * mags[k] + 1e-30)
        << to_string(w.dtype) << " rows=" << w.rows << " cols=" << w.cols << " num_x=" << num_x
        << " threads=" << pool.num_threads() << " x_row=" << k / w.rows << " w_row=" << k % w.rows;
  }
  EXPECT_EQ(y[num_x * w.rows], kSentinel) << "wrote past the end";
}

// w packed by pack_for_matmul(): matmul on the packed copy equals the reference on w's bytes,
// for each num_x, with 1 and 3 threads; the packed size is expected_packed_bytes. Where the
// packing is used (packed_matmul_supported and the AVX3 target), the view's own bytes are zero
// blocks, so the result can only come from the packed copy (no vacuous pass).
inline void expect_packed_matmul_matches_ref(const MatrixView& w, size_t expected_packed_bytes,
                                             std::initializer_list<int64_t> num_x_list,
                                             uint32_t& seed, MagnitudesFn magnitudes,
                                             double tolerance) {
  ThreadPool pool1(1), pool3(3);
  const PackedBytes packed = pack_for_matmul(w);
  ASSERT_EQ(packed.size(), expected_packed_bytes);
  const std::vector<uint8_t> zero_blocks(row_bytes(w.dtype, w.cols) * w.rows, 0);
  MatrixView packed_view = w;
  attach_packed(packed_view, packed);
  if (packed_matmul_supported(w.dtype) && active_target() == "AVX3")
    packed_view.data = zero_blocks.data();
  for (int64_t num_x : num_x_list) {
    const std::vector<float> x = random_floats(num_x * w.cols, ++seed);
    std::vector<float> y_ref(num_x * w.rows);
    ref::matmul(w, x.data(), num_x, y_ref.data());
    const std::vector<double> mags = magnitudes(w, x.data(), num_x);
    for (ThreadPool* pool : {&pool1, &pool3}) {
      std::vector<float> y(num_x * w.rows + 1, 12345.0f);
      matmul(packed_view, x.data(), num_x, y.data(), *pool);
      for (int64_t k = 0; k < num_x * w.rows; ++k) {
        ASSERT_NEAR(y[k], y_ref[k], tolerance * mags[k] + 1e-30)
            << to_string(w.dtype) << " rows=" << w.rows << " cols=" << w.cols << " num_x=" << num_x
            << " threads=" << pool->num_threads() << " k=" << k;
      }
      EXPECT_EQ(y[num_x * w.rows], 12345.0f) << "wrote past the end";
    }
  }
}

// expect_matmul_matches_ref for each dtype and cols, random weight matrices of 1 / 3 / 64 / 67
// rows (cutting every tile and vector width), num_x 1 / 2 / 3 / 5 / 17, 1 and 3 threads; seed
// goes up by one per matrix and per call.
inline void expect_matmul_matches_ref_any_shape(std::span<const DType> dtypes,
                                                std::span<const int64_t> cols_list, uint32_t seed,
                                                MagnitudesFn magnitudes) {
  ThreadPool pool1(1), pool3(3);
  for (DType dtype : dtypes) {
    for (int64_t cols : cols_list) {
      for (int64_t rows : {1, 3, 64, 67}) {
        const TestMatrix w(dtype, rows, cols, ++seed);
        for (int64_t num_x : {1, 2, 3, 5, 17}) {
          for (ThreadPool* pool : {&pool1, &pool3})
            expect_matmul_matches_ref(w.view, num_x, *pool, ++seed, magnitudes);
        }
      }
    }
  }
}

// Runs each TEST_P once per target in available_targets(), forced for the test's duration.
class PerTargetTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(force_target_for_testing(GetParam()));
    ASSERT_EQ(active_target(), GetParam());
  }
  void TearDown() override { force_target_for_testing(""); }
};

inline std::string target_test_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

}  // namespace sieve::kernels
