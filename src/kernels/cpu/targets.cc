// SIMD target selection: which Highway targets are compiled in (HWY_TARGETS, the same in
// every translation unit of this library) and supported by the CPU, and forcing one.
#include "kernels/cpu/targets.h"

#include <string>
#include <vector>

#include "hwy/highway.h"
#include "hwy/targets.h"
#include "kernels/ops.h"

namespace sieve::kernels {

namespace {

// The CPU's real target set, even while a forced one is in effect (which is restored).
int64_t cpu_targets() {
  const int64_t current = hwy::SupportedTargets();
  hwy::SetSupportedTargetsForTest(0);
  const int64_t detected = hwy::SupportedTargets();
  if (current != detected) hwy::SetSupportedTargetsForTest(current);
  return detected;
}

// Compiled-in targets the CPU supports, best (lowest bit) first.
std::vector<int64_t> usable_targets() {
  std::vector<int64_t> targets;
  for (int64_t mask = cpu_targets() & HWY_TARGETS; mask != 0; mask &= mask - 1) {
    targets.push_back(mask & -mask);
  }
  return targets;
}

}  // namespace

int64_t packed_float_prefetch_bytes() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int64_t bytes = __builtin_cpu_is("intel") ? 8192 : 0;
  return bytes;
#else
  return 0;
#endif
}

bool packed_block_prefetch() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool prefetch = __builtin_cpu_is("intel");
  return prefetch;
#else
  return false;
#endif
}

bool one_head_kv_prefetch() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool prefetch = !__builtin_cpu_is("intel");
  return prefetch;
#else
  return true;
#endif
}

std::vector<std::string> available_targets() {
  std::vector<std::string> names;
  for (int64_t target : usable_targets()) names.emplace_back(hwy::TargetName(target));
  return names;
}

std::string_view active_target() { return matmul_target_name(); }

bool force_target_for_testing(std::string_view target_name) {
  if (target_name.empty()) {
    hwy::SetSupportedTargetsForTest(0);  // the next dispatch re-detects
    return true;
  }
  for (int64_t target : usable_targets()) {
    if (target_name == hwy::TargetName(target)) {
      hwy::SetSupportedTargetsForTest(target);  // the next dispatch picks it
      return true;
    }
  }
  return false;
}

}  // namespace sieve::kernels
