#pragma once
// Shared helpers for the kernel tests: random data, weight matrices in any dtype, and a
// fixture that runs a test once per SIMD target compiled in and supported by this CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

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
