#pragma once
// When each request is sent: a Poisson process at a given rate, a gamma process of the same
// mean rate and a chosen burstiness, or all at once (a concurrency limit then paces them).
#include <cstdint>
#include <optional>
#include <vector>

namespace sieve::loadgen {

struct ArrivalProcess {
  std::optional<double> request_rate;  // requests per second; none or inf: all at once
  // Shape of the gamma distribution of gaps: 1 is Poisson, < 1 burstier, > 1 more regular.
  double burstiness = 1.0;
  uint64_t seed = 0;
};

// Send times in seconds from the start, non-decreasing, the first at 0. Gaps are gamma with
// shape b and scale 1 / (rate * b), so their mean is 1 / rate for every b.
std::vector<double> arrival_times(const ArrivalProcess& process, int64_t num_requests);

}  // namespace sieve::loadgen
