#include "loadgen/arrivals.h"

#include <cmath>
#include <random>

#include "util/error.h"

namespace sieve::loadgen {

std::vector<double> arrival_times(const ArrivalProcess& process, int64_t num_requests) {
  std::vector<double> times(static_cast<size_t>(std::max<int64_t>(num_requests, 0)), 0.0);
  if (!process.request_rate || std::isinf(*process.request_rate)) return times;
  const double rate = *process.request_rate;
  if (!(rate > 0)) fail("--request-rate must be positive (got {})", rate);
  if (!(process.burstiness > 0)) fail("--burstiness must be positive (got {})", process.burstiness);
  std::mt19937_64 rng(process.seed);
  std::gamma_distribution<double> gap(process.burstiness, 1.0 / (rate * process.burstiness));
  double t = 0.0;
  for (size_t i = 1; i < times.size(); ++i) {
    t += gap(rng);
    times[i] = t;
  }
  return times;
}

}  // namespace sieve::loadgen
