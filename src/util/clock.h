#pragma once
// Time between two steady-clock readings, as the metrics and reports give it.
#include <chrono>

namespace sieve {

inline double seconds_between(std::chrono::steady_clock::time_point from,
                              std::chrono::steady_clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace sieve
