#pragma once
#include <cstdint>

namespace sieve {

// Whole units of `size` that hold `n` (n >= 0, size > 0): pages for tokens, slices for slots.
constexpr int64_t ceil_div(int64_t n, int64_t size) { return (n + size - 1) / size; }

}  // namespace sieve
