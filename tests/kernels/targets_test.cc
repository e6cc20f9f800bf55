// Target selection: forcing a target must switch every dispatch table.
#include "kernels/cpu/targets.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/ops.h"

namespace sieve::kernels {
namespace {

TEST(Targets, AvailableTargetsListBestFirstAndIncludeTheBaseline) {
  const std::vector<std::string> targets = available_targets();
  ASSERT_FALSE(targets.empty());
  // The portable baseline (EMU128, or SCALAR with GCC < 12.3) always runs, and is worst.
  EXPECT_TRUE(targets.back() == "EMU128" || targets.back() == "SCALAR") << targets.back();
  // Unforced, the best one is active.
  EXPECT_EQ(active_target(), targets.front());
  for (const std::string& name : targets)
    std::printf("  compiled-in and supported: %s\n", name.c_str());
}

TEST(Targets, ForcingSwitchesEveryDispatchTable) {
  for (const std::string& name : available_targets()) {
    ASSERT_TRUE(force_target_for_testing(name)) << name;
    EXPECT_EQ(active_target(), name);
    EXPECT_EQ(matmul_target_name(), name);
    EXPECT_EQ(vec_ops_target_name(), name);
    EXPECT_EQ(attention_scores_target_name(), name);
  }
  ASSERT_TRUE(force_target_for_testing(""));
  EXPECT_EQ(active_target(), available_targets().front());
  EXPECT_EQ(vec_ops_target_name(), available_targets().front());
  EXPECT_EQ(attention_scores_target_name(), available_targets().front());
}

TEST(Targets, UnknownTargetIsRefusedAndChangesNothing) {
  const std::string before(active_target());
  EXPECT_FALSE(force_target_for_testing("NOT_A_TARGET"));
  EXPECT_EQ(active_target(), before);
  // available_targets() while forced still reports the CPU's real set, and keeps the forcing.
  const std::vector<std::string> all = available_targets();
  ASSERT_TRUE(force_target_for_testing(all.back()));
  EXPECT_EQ(available_targets(), all);
  EXPECT_EQ(active_target(), all.back());
  force_target_for_testing("");
}

}  // namespace
}  // namespace sieve::kernels
