#include "util/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace sieve {
namespace {

TEST(ThreadPool, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 3, 4, 5, 17, 1000, 100003}) {
    for (int64_t grain : {0, 1, 7, 1 << 20}) {
      std::vector<std::atomic<int>> hits(n);
      pool.parallel_for(
          n,
          [&](int64_t begin, int64_t end) {
            for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
          },
          grain);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ThreadPool, ManyBackToBackLoops) {
  ThreadPool pool(3);
  std::atomic<int64_t> total{0};
  for (int round = 0; round < 2000; ++round) {
    pool.parallel_for(
        10, [&](int64_t begin, int64_t end) { total.fetch_add(end - begin); }, 1);
  }
  EXPECT_EQ(total.load(), 20000);
}

TEST(ThreadPool, SingleThreadRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.num_threads(), 1);
  int64_t sum = 0;
  pool.parallel_for(100, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) sum += i;
  });
  EXPECT_EQ(sum, 4950);
}

}  // namespace
}  // namespace sieve
