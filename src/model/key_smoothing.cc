#include "model/key_smoothing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "kernels/ops.h"
#include "util/error.h"

namespace sieve::model {

namespace {

// The candidate transforms of a kv head; the last, smoothing then rotation, is the default.
struct Candidate {
  bool smooth, rotate;
};
constexpr std::array<Candidate, 4> kCandidates = {
    {{false, false}, {true, false}, {false, true}, {true, true}}};

// How much cheaper than smoothing and rotation another transform must be to be chosen.
constexpr double kSwitchRatio = 0.05;

// A kv head is kept in f16 as well (KeySmoothing::precise_streams) when its keys, smoothed and
// rotated, cost its attention at least this many times the median head's, on the calibration
// pass; at most one stream in kMaxPreciseShare (the costliest first), which bounds the extra
// memory at (1 / kMaxPreciseShare) * 4 / 2.125 (q8) or 4 / 1.25 (q4) of the cache's bytes.
// Per-query cost (the score error's variance under the attention), eval-32k: the wired
// induction head 0.008 at q8 and 1.81 at q4, against medians of 6e-5 and 0.011 (130x and 160x);
// copy-lm's heads at most 4.6x their median at q8 and 5.5x at q4; the generated 57M model's
// (random weights) within 1.2x.
constexpr double kPreciseRatio = 20.0;
constexpr int64_t kMaxPreciseShare = 8;

}  // namespace

KeySmoothing::Builder::Builder(const Shape& shape, kernels::DType dtype)
    : shape_(shape), dtype_(dtype) {
  const int64_t kv_dim = shape.num_kv_heads * shape.head_dim,
                q_dim = shape.num_heads * shape.head_dim, per_layer = 2 * kv_dim + q_dim;
  host_.assign(static_cast<size_t>(shape.num_layers * per_layer), 1.0f);
  for (int64_t l = 0; l < shape.num_layers; ++l)
    std::fill_n(host_.begin() + l * per_layer, kv_dim, 0.0f);
  rotate_.assign(static_cast<size_t>(shape.num_layers * shape.num_kv_heads), 0);
  default_cost_.assign(rotate_.size(), 0.0);
}

void KeySmoothing::Builder::measure_layer(int64_t layer, std::span<const float> q,
                                          std::span<const float> k, int64_t n) {
  const int64_t head_dim = shape_.head_dim, nkv = shape_.num_kv_heads,
                group = shape_.num_heads / shape_.num_kv_heads;
  const int64_t kv_dim = nkv * head_dim, q_dim = shape_.num_heads * head_dim;
  if (n < 2) return;  // nothing to measure on: the identity
  const int64_t per_layer = 2 * kv_dim + q_dim;
  float* shift = host_.data() + layer * per_layer;
  float* key_scale = shift + kv_dim;
  float* query_scale = key_scale + kv_dim;
  const int64_t rotation = rotation_group(head_dim);
  for (int64_t h = 0; h < nkv; ++h) {
    // Per channel: the keys' mean and sd, the group's queries' rms; each shared by a RoPE pair
    // (RoPE mixes the two channels of a pair, so only a common scale commutes with it).
    std::vector<double> mean(static_cast<size_t>(head_dim)), sd(mean.size()), rms(mean.size());
    for (int64_t i = 0; i < head_dim; ++i) {
      double sum = 0.0, sq = 0.0, q_ms = 0.0;
      for (int64_t t = 0; t < n; ++t) {
        const double x = k[static_cast<size_t>(t * kv_dim + h * head_dim + i)];
        sum += x;
        sq += x * x;
        for (int64_t g = 0; g < group; ++g) {
          const double y = q[static_cast<size_t>(t * q_dim + (h * group + g) * head_dim + i)];
          q_ms += y * y;
        }
      }
      const auto ui = static_cast<size_t>(i);
      mean[ui] = sum / static_cast<double>(n);
      sd[ui] = std::max(0.0, sq / static_cast<double>(n) - mean[ui] * mean[ui]);
      rms[ui] = q_ms / static_cast<double>(n * group);
    }
    const int64_t rotated = shape_.rope_dims, half = rotated / 2;
    for (int64_t i = 0; i < head_dim; ++i) {  // the (mean squares of) each pair, averaged
      const int64_t j = i >= rotated       ? i
                        : shape_.rope_neox ? (i < half ? i + half : i - half)
                                           : (i ^ 1);
      if (j < i) continue;
      const auto ui = static_cast<size_t>(i), uj = static_cast<size_t>(j);
      sd[ui] = sd[uj] = std::sqrt((sd[ui] + sd[uj]) / 2);
      rms[ui] = rms[uj] = std::sqrt((rms[ui] + rms[uj]) / 2);
    }
    double max_sd = 0.0, max_rms = 0.0;
    for (int64_t i = 0; i < head_dim; ++i) {
      max_sd = std::max(max_sd, sd[static_cast<size_t>(i)]);
      max_rms = std::max(max_rms, rms[static_cast<size_t>(i)]);
    }
    // s_c = sqrt(sd(k_c) / rms(q_c)), normalised to geometric mean 1; floors keep dead
    // channels from getting extreme scales.
    std::vector<double> s(static_cast<size_t>(head_dim));
    double log_sum = 0.0;
    for (int64_t i = 0; i < head_dim; ++i) {
      const auto ui = static_cast<size_t>(i);
      s[ui] = std::sqrt(std::max(sd[ui], 1e-3 * max_sd + 1e-30) /
                        std::max(rms[ui], 1e-3 * max_rms + 1e-30));
      log_sum += std::log(s[ui]);
    }
    const double norm = std::exp(-log_sum / static_cast<double>(head_dim));
    for (double& si : s) si *= norm;

    // Each candidate's cost: keys transformed and rounded as the cache stores them, error
    // e = k' - Q(k'), scored by every query of the group transformed alike, delta = scale q'·e;
    // summed over queries, the variance of delta under the query's attention p over its keys
    // (causal): twice the KL divergence it adds to that attention, to second order. Errors on
    // keys a query barely attends to cost little, a uniform shift nothing.
    std::vector<std::vector<float>> errors(kCandidates.size(),
                                           std::vector<float>(static_cast<size_t>(n * head_dim)));
    {
      std::vector<float> kt(static_cast<size_t>(head_dim)), back(kt.size());
      std::vector<uint8_t> packed(kernels::row_bytes(dtype_, head_dim));
      for (size_t c = 0; c < kCandidates.size(); ++c) {
        for (int64_t t = 0; t < n; ++t) {
          const float* x = k.data() + t * kv_dim + h * head_dim;
          for (int64_t i = 0; i < head_dim; ++i) {
            const auto ui = static_cast<size_t>(i);
            kt[ui] = kCandidates[c].smooth ? static_cast<float>((x[i] - mean[ui]) / s[ui]) : x[i];
          }
          // The model's own rotation of what it stores (kernels::rotate_heads, in float).
          if (kCandidates[c].rotate)
            kernels::rotate_heads(kt.data(), 1, head_dim / rotation, rotation);
          kernels::quantize_row(dtype_, kt.data(), packed.data(), head_dim);
          kernels::dequantize_row(dtype_, packed.data(), back.data(), head_dim);
          for (int64_t i = 0; i < head_dim; ++i)
            errors[c][static_cast<size_t>(t * head_dim + i)] =
                kt[static_cast<size_t>(i)] - back[static_cast<size_t>(i)];
        }
      }
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
    std::vector<double> cost(kCandidates.size(), 0.0), p(static_cast<size_t>(n));
    std::vector<float> qt(static_cast<size_t>(head_dim));
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t g = 0; g < group; ++g) {
        const float* y = q.data() + t * q_dim + (h * group + g) * head_dim;
        double max = -std::numeric_limits<double>::infinity(), sum = 0.0;
        for (int64_t u = 0; u <= t; ++u) {
          const double score =
              scale * kernels::dot(y, k.data() + u * kv_dim + h * head_dim, head_dim);
          p[static_cast<size_t>(u)] = score;
          max = std::max(max, score);
        }
        for (int64_t u = 0; u <= t; ++u)
          sum += p[static_cast<size_t>(u)] = std::exp(p[static_cast<size_t>(u)] - max);
        for (int64_t u = 0; u <= t; ++u) p[static_cast<size_t>(u)] /= sum;
        for (size_t c = 0; c < kCandidates.size(); ++c) {
          for (int64_t i = 0; i < head_dim; ++i)
            qt[static_cast<size_t>(i)] =
                kCandidates[c].smooth ? static_cast<float>(y[i] * s[static_cast<size_t>(i)]) : y[i];
          if (kCandidates[c].rotate)
            kernels::rotate_heads(qt.data(), 1, head_dim / rotation, rotation);
          double mean_delta = 0.0, mean_sq = 0.0;
          for (int64_t u = 0; u <= t; ++u) {
            const double delta =
                scale * kernels::dot(qt.data(), errors[c].data() + u * head_dim, head_dim);
            mean_delta += p[static_cast<size_t>(u)] * delta;
            mean_sq += p[static_cast<size_t>(u)] * delta * delta;
          }
          cost[c] += mean_sq - mean_delta * mean_delta;
        }
      }
    }
    // Smoothed and rotated unless another transform costs 20 times less: the pass runs on
    // pseudo-random tokens at positions [0, n), so only large differences carry over to text
    // at long context. eval-32k's wired induction head (plain costs 700x less at q4, 14x at
    // q8), measured (top-1 / perplexity change against f32, 4k and 16k prompts): plain at q4
    // 0.855 -> 0.942 / +22% -> +2.5% at 4k, 0.797 -> 0.812 / +32% -> +17% at 16k; plain at q8
    // 0.945 -> 0.954 but +0.9% -> +1.9% at 4k and 0.951 -> 0.943 / +1.7% -> +2.4% at 16k, so
    // q8 keeps the default. copy-lm's heads differ by < 3x and keep it too.
    const size_t fallback = kCandidates.size() - 1;
    default_cost_[static_cast<size_t>(layer * nkv + h)] =
        cost[fallback] / static_cast<double>(n * group);
    size_t chosen = fallback;
    for (size_t c = 0; c < kCandidates.size(); ++c)
      if (cost[c] < cost[chosen] && cost[c] < kSwitchRatio * cost[fallback]) chosen = c;
    const Candidate best = kCandidates[chosen];

    rotate_[static_cast<size_t>(layer * nkv + h)] = best.rotate ? 1 : 0;
    for (int64_t i = 0; i < head_dim; ++i) {
      const auto ui = static_cast<size_t>(i);
      shift[h * head_dim + i] = best.smooth ? static_cast<float>(-mean[ui]) : 0.0f;
      key_scale[h * head_dim + i] = best.smooth ? static_cast<float>(1.0 / s[ui]) : 1.0f;
      for (int64_t g = 0; g < group; ++g)
        query_scale[(h * group + g) * head_dim + i] =
            best.smooth ? static_cast<float>(s[ui]) : 1.0f;
    }
  }
}

std::vector<int32_t> KeySmoothing::Builder::precise_streams() const {
  std::vector<double> sorted = default_cost_;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted.empty() ? 0.0 : sorted[sorted.size() / 2];
  std::vector<int32_t> streams;
  for (size_t s = 0; s < default_cost_.size(); ++s) {
    if (default_cost_[s] > 0.0 && default_cost_[s] >= kPreciseRatio * median)
      streams.push_back(static_cast<int32_t>(s));
  }
  std::sort(streams.begin(), streams.end(), [&](int32_t a, int32_t b) {
    return default_cost_[static_cast<size_t>(a)] > default_cost_[static_cast<size_t>(b)];
  });
  const auto most =
      static_cast<size_t>((std::ssize(default_cost_) + kMaxPreciseShare - 1) / kMaxPreciseShare);
  if (streams.size() > most) streams.resize(most);
  std::sort(streams.begin(), streams.end());
  return streams;
}

std::shared_ptr<const KeySmoothing> KeySmoothing::Builder::make(kernels::Backend& backend) const {
  return std::make_shared<const KeySmoothing>(backend, shape_, host_, rotate_, precise_streams());
}

KeySmoothing::KeySmoothing(kernels::Backend& backend, const Shape& shape,
                           std::span<const float> host, std::vector<uint8_t> rotate,
                           std::vector<int32_t> precise_streams)
    : kv_dim_(shape.num_kv_heads * shape.head_dim),
      q_dim_(shape.num_heads * shape.head_dim),
      num_kv_heads_(shape.num_kv_heads),
      rotate_(std::move(rotate)),
      precise_streams_(std::move(precise_streams)) {
  const auto floats = static_cast<size_t>(shape.num_layers * (2 * kv_dim_ + q_dim_));
  if (host.size() != floats)
    fail("key smoothing: {} values for {} layers, not {}", host.size(), shape.num_layers, floats);
  if (rotate_.size() != static_cast<size_t>(shape.num_layers * shape.num_kv_heads))
    fail("key smoothing: {} rotation flags for {} layers of {} kv heads", rotate_.size(),
         shape.num_layers, shape.num_kv_heads);
  buffer_ = backend.allocate(floats * sizeof(float));
  backend.upload(buffer_.data(), host.data(), floats * sizeof(float));
}

}  // namespace sieve::model
