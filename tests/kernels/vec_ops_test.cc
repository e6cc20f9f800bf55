// Vector ops against their scalar references, on every SIMD target, at sizes around and
// between multiples of every vector width (tails).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/ops.h"
#include "kernels_test_util.h"

namespace sieve::kernels {
namespace {

constexpr int64_t kSizes[] = {0,  1,  2,  3,  4,  5,  7,   8,   9,   15,   16,  17,
                              31, 32, 33, 63, 64, 65, 100, 127, 129, 1000, 4099};

class VecOps : public PerTargetTest {};

TEST_P(VecOps, Dot) {
  for (int64_t n : kSizes) {
    const auto a = random_floats(n, 1);
    const auto b = random_floats(n, 2);
    double magnitude = 0.0;
    for (int64_t i = 0; i < n; ++i) magnitude += std::fabs(a[i] * b[i]);
    EXPECT_NEAR(dot(a.data(), b.data(), n), ref::dot(a.data(), b.data(), n),
                1e-6 * magnitude + 1e-30)
        << "n=" << n;
  }
}

TEST_P(VecOps, Axpy) {
  for (int64_t n : kSizes) {
    const auto x = random_floats(n, 3);
    auto y = random_floats(n + 1, 4);  // +1: a sentinel that must stay untouched
    auto y_ref = y;
    axpy(0.75f, x.data(), y.data(), n);
    ref::axpy(0.75f, x.data(), y_ref.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(y[i], y_ref[i], 1e-6 * (std::fabs(0.75f * x[i]) + std::fabs(y_ref[i])))
          << n << " " << i;
    }
    EXPECT_EQ(y[n], y_ref[n]) << "wrote past the end, n=" << n;
  }
}

TEST_P(VecOps, SumWordsWrapsAsUnsignedAddition) {
  for (int64_t n : kSizes) {
    std::vector<uint64_t> words(n);
    uint64_t expected = 0, state = 0x9E3779B97F4A7C15ull;
    for (uint64_t& w : words) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      w = state;  // large values: the sum wraps
      expected += w;
    }
    EXPECT_EQ(sum_words(words.data(), n), expected) << "n=" << n;
  }
}

// The FMA peak probe does the work it counts: its chains' sum equals a scalar replay of them,
// and its flops are 2 x 12 chains x lanes x iterations.
TEST_P(VecOps, FmaChainsComputeTheChainsTheyCount) {
  for (int64_t iterations : {0, 1, 1000}) {
    double flops = -1.0;
    const float sum = fma_chains(iterations, &flops);
    float chains[12];
    for (int i = 0; i < 12; ++i) {
      chains[i] = static_cast<float>(i) / 1024;
      for (int64_t k = 0; k < iterations; ++k) chains[i] = std::fma(chains[i], 0.9999f, 1e-6f);
    }
    float expected = chains[0];
    for (int i = 1; i < 12; ++i) expected += chains[i];
    // Targets without a fused multiply-add round the product too: a few ulp over 1000 steps.
    EXPECT_NEAR(sum, expected, 1e-5f * std::fabs(expected)) << "iterations " << iterations;
    const double per_lane = 2.0 * 12 * static_cast<double>(iterations);
    if (iterations == 0) {
      EXPECT_EQ(flops, 0.0);
    } else {
      const double lanes = flops / per_lane;
      EXPECT_EQ(lanes, std::round(lanes)) << flops;
      EXPECT_GE(lanes, 1.0);
      EXPECT_LE(lanes, 64.0);
    }
  }
}

TEST_P(VecOps, RmsNorm) {
  for (int64_t n : kSizes) {
    if (n == 0) continue;
    const auto x = random_floats(n, 5, -3.0f, 3.0f);
    const auto weight = random_floats(n, 6, 0.5f, 1.5f);
    std::vector<float> out(n + 1, 42.0f), out_ref(n + 1, 42.0f);
    rmsnorm(x.data(), weight.data(), 1e-5f, out.data(), n);
    ref::rmsnorm(x.data(), weight.data(), 1e-5f, out_ref.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_NEAR(out[i], out_ref[i], 2e-6 * (1 + std::fabs(out_ref[i]))) << n;
    EXPECT_EQ(out[n], 42.0f) << "wrote past the end, n=" << n;
  }
}

TEST_P(VecOps, SiluMul) {
  for (int64_t n : kSizes) {
    auto gate = random_floats(n + 1, 7, -12.0f, 12.0f);
    const auto up = random_floats(n, 8);
    if (n >= 4) {  // saturated inputs: exp(-g) overflows or underflows
      gate[0] = -100.0f;
      gate[1] = 100.0f;
      gate[2] = -88.5f;
      gate[3] = 0.0f;
    }
    auto gate_ref = gate;
    silu_mul(gate.data(), up.data(), n);
    ref::silu_mul(gate_ref.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_NEAR(gate[i], gate_ref[i], 4e-6 * (1 + std::fabs(gate_ref[i])))
          << "n=" << n << " i=" << i;
    }
    EXPECT_EQ(gate[n], gate_ref[n]) << "wrote past the end, n=" << n;
  }
}

TEST_P(VecOps, Softmax) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int64_t n : kSizes) {
    if (n == 0) continue;
    auto x = random_floats(n + 1, 9, -20.0f, 20.0f);
    if (n >= 3) x[n / 2] = kNegInf;  // masked positions
    if (n >= 2) x[n - 1] = 35.0f;    // the max in the tail
    const auto x_in = x;
    auto x_ref = x;
    const float max = softmax(x.data(), n);
    const float max_ref = ref::softmax(x_ref.data(), n);
    EXPECT_EQ(max, max_ref) << "n=" << n;
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      // exp(x - max) in f32: x - max carries an error of ~ulp(|x - max|), so relative to
      // the result the tolerance grows with |x - max|.
      if (std::isinf(x_in[i])) {
        ASSERT_EQ(x[i], 0.0f);
        continue;
      }
      const double tolerance = 4e-7 * (1 + std::fabs(x_in[i] - max)) * x_ref[i] + 1e-38;
      ASSERT_NEAR(x[i], x_ref[i], tolerance) << "n=" << n << " i=" << i;
      sum += x[i];
    }
    EXPECT_NEAR(sum, 1.0, 1e-5);
    EXPECT_EQ(x[n], x_ref[n]) << "wrote past the end, n=" << n;
  }
  // n == 0 writes nothing and reports -inf.
  float untouched = 1.0f;
  EXPECT_EQ(softmax(&untouched, 0), kNegInf);
  EXPECT_EQ(untouched, 1.0f);
}

// rotate_heads against the O(n^2) definition, for every power of two up to 512; and its
// properties: applied twice it gives x back, and dot products of rotated heads are unchanged.
TEST_P(VecOps, RotateHeads) {
  for (int64_t head_dim = 1; head_dim <= 512; head_dim *= 2) {
    for (int64_t num_heads : {1, 3}) {
      const int64_t n = 2 * num_heads * head_dim;  // 2 rows
      auto x = random_floats(n + 1, 11);           // +1: a sentinel that must stay untouched
      auto y = random_floats(n, 12);
      const auto x0 = x, y0 = y;
      auto x_ref = x;
      rotate_heads(x.data(), 2, num_heads, head_dim);
      ref::rotate_heads(x_ref.data(), 2, num_heads, head_dim);
      ASSERT_EQ(x[n], x0[n]) << "wrote past the rows";
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(x[i], x_ref[i], 1e-5) << "head_dim=" << head_dim << " i=" << i;
      rotate_heads(y.data(), 2, num_heads, head_dim);
      for (int64_t h = 0; h < 2 * num_heads; ++h) {
        const int64_t at = h * head_dim;
        EXPECT_NEAR(ref::dot(x.data() + at, y.data() + at, head_dim),
                    ref::dot(x0.data() + at, y0.data() + at, head_dim), 1e-4)
            << "head_dim=" << head_dim << " head " << h;
      }
      rotate_heads(x.data(), 2, num_heads, head_dim);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(x[i], x0[i], 1e-5) << "twice: head_dim=" << head_dim << " i=" << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTargets, VecOps, ::testing::ValuesIn(available_targets()),
                         target_test_name);

}  // namespace
}  // namespace sieve::kernels
