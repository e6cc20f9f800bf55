// RoPE against the direct formula.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/rope.h"

namespace sieve::kernels {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(Rope, NormalOrderingRotatesAdjacentPairs) {
  const int64_t head_dim = 8, heads = 3, pos = 17;
  RopeParams params{.ordering = RopeOrdering::kNormal,
                    .head_dim = head_dim,
                    .num_dims = head_dim,
                    .freq_base = 10000.0f};
  std::vector<float> x = random_vector(head_dim * heads, 1), y = x;
  rope(params, pos, y.data(), heads);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < head_dim / 2; ++i) {
      const double theta = pos * std::pow(10000.0, -2.0 * i / head_dim);
      const float a = x[h * head_dim + 2 * i], b = x[h * head_dim + 2 * i + 1];
      EXPECT_NEAR(y[h * head_dim + 2 * i], a * std::cos(theta) - b * std::sin(theta), 1e-5);
      EXPECT_NEAR(y[h * head_dim + 2 * i + 1], a * std::sin(theta) + b * std::cos(theta), 1e-5);
    }
  }
}

TEST(Rope, NeoxPartialRotationLeavesTheTailAndScales) {
  const int64_t head_dim = 12, dims = 8, pos = 5;
  std::vector<float> factors = {1.0f, 2.0f, 4.0f, 8.0f};
  RopeParams params{.ordering = RopeOrdering::kNeox,
                    .head_dim = head_dim,
                    .num_dims = dims,
                    .freq_base = 500000.0f,
                    .freq_scale = 0.5f,
                    .freq_factors = factors};
  std::vector<float> x = random_vector(head_dim, 2), y = x;
  rope(params, pos, y.data(), 1);
  for (int64_t i = 0; i < dims / 2; ++i) {
    const double theta = pos * 0.5 * std::pow(500000.0, -2.0 * i / dims) / factors[i];
    EXPECT_NEAR(y[i], x[i] * std::cos(theta) - x[i + dims / 2] * std::sin(theta), 1e-5);
    EXPECT_NEAR(y[i + dims / 2], x[i] * std::sin(theta) + x[i + dims / 2] * std::cos(theta), 1e-5);
  }
  for (int64_t i = dims; i < head_dim; ++i) EXPECT_EQ(y[i], x[i]);
}

TEST(Rope, PositionZeroIsIdentity) {
  RopeParams params{.head_dim = 16, .num_dims = 16};
  std::vector<float> x = random_vector(32, 3), y = x;
  rope(params, 0, y.data(), 2);
  EXPECT_EQ(x, y);
}

}  // namespace
}  // namespace sieve::kernels
