#pragma once
// Shared helpers for the kernel tests: random data, weight matrices in any dtype, and a
// fixture that runs a test once per SIMD target compiled in and supported by this CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"

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
